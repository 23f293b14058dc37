#!/usr/bin/env bash
# Makes sure what the Redis backend's tests start is installed (Debian packages):
# redis-server (also for the Cluster, and with TLS), redis-sentinel, redis-cli (to create
# the Cluster) and openssl (to make the TLS test's self-signed certificate).
set -euo pipefail
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-sentinel >/dev/null 2>&1 || missing+=(redis-sentinel)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
if [ ${#missing[@]} = 0 ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "missing: ${missing[*]}: install them (Debian/Ubuntu: apt-get install ${missing[*]})" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# The packages may start system instances on 6379 and 26379; the tests start their own.
(service redis-server stop || true) >/dev/null 2>&1
(service redis-sentinel stop || true) >/dev/null 2>&1
command -v redis-server >/dev/null && command -v redis-sentinel >/dev/null &&
    command -v redis-cli >/dev/null && command -v openssl >/dev/null
