#!/usr/bin/env bash
# Makes sure the tools the process tests drive are installed (Debian packages): gdb, which
# stops a process at one exact instruction or system call (tests/stalls.rs,
# generation_wraps.rs, wakeups.rs, dict_writer.rs), and strace, which counts a process's
# system calls (tests/wakeups.rs) and holds one back (tests/files.rs); and two readers of
# `shmlock stats --prometheus` (tests/stats.rs): Prometheus's own `promtool check metrics`
# (from Debian's prometheus package, unpacked into target/tools/bin: installing the package
# would also start a server) and the Prometheus client's parser (PyPI).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v promtool >/dev/null 2>&1 && [ ! -x target/tools/bin/promtool ]; then
    dl=$(mktemp -d)
    trap 'rm -rf "$dl"' EXIT
    fetch() { (cd "$dl" && apt-get download prometheus >/dev/null 2>&1); }
    fetch || { [ "$(id -u)" = 0 ] && apt-get update -qq >/dev/null 2>&1 && fetch; } \
        || { echo "missing: promtool (Debian: apt-get install prometheus)" >&2; exit 1; }
    dpkg-deb -x "$dl"/prometheus_*.deb "$dl/x"
    mkdir -p target/tools/bin
    cp "$dl/x/usr/bin/promtool" target/tools/bin/promtool
fi
if ! python3 -c 'import prometheus_client.parser' >/dev/null 2>&1; then
    python3 -m pip install --quiet --disable-pip-version-check prometheus-client >/dev/null 2>&1 \
        || { echo "missing: the Python package prometheus-client (pip install prometheus-client)" >&2; exit 1; }
fi
missing=()
for tool in gdb strace; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
# nm finds the library's functions for gdb by their mangled names (tests/dict_writer.rs)
command -v nm >/dev/null 2>&1 || missing+=(binutils)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "missing: ${missing[*]}: install them (Debian/Ubuntu: apt-get install ${missing[*]})" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
for tool in "${missing[@]}"; do
    [ "$tool" = binutils ] && tool=nm
    command -v "$tool" >/dev/null
done
