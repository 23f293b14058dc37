#!/usr/bin/env bash
# Makes sure the tools the process tests drive are installed (Debian packages): gdb, which
# tests/adversarial.rs uses to stop a process at one exact instruction.
set -euo pipefail
command -v gdb >/dev/null 2>&1 && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "missing: gdb: install it (Debian/Ubuntu: apt-get install gdb)" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends gdb >/dev/null
command -v gdb >/dev/null
