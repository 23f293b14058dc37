#!/usr/bin/env bash
# Makes sure redis-server is installed (Debian package), for the Redis backend's tests.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "redis-server is missing: install it (Debian/Ubuntu: apt-get install redis-server)" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends redis-server >/dev/null
# The package may start a system instance on 6379; the tests start their own.
(service redis-server stop || true) >/dev/null 2>&1
command -v redis-server >/dev/null
