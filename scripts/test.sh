#!/usr/bin/env bash
# The whole test suite: unit, integration (multi-process) and doc tests.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --all-features
