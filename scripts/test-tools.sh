#!/usr/bin/env bash
# Makes sure the tools the process tests drive are installed (Debian packages): gdb, which
# stops a process at one exact instruction or system call (tests/stalls.rs,
# generation_wraps.rs, wakeups.rs, dict_writer.rs), and strace, which counts a process's
# system calls (tests/wakeups.rs) and holds one back (tests/files.rs); and (PyPI) the
# Prometheus client's parser, which reads `shmlock stats --prometheus` (tests/stats.rs).
set -euo pipefail
if ! python3 -c 'import prometheus_client.parser' >/dev/null 2>&1; then
    python3 -m pip install --quiet --disable-pip-version-check prometheus-client >/dev/null 2>&1 \
        || { echo "missing: the Python package prometheus-client (pip install prometheus-client)" >&2; exit 1; }
fi
missing=()
for tool in gdb strace; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "missing: ${missing[*]}: install them (Debian/Ubuntu: apt-get install ${missing[*]})" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
for tool in "${missing[@]}"; do
    command -v "$tool" >/dev/null
done
