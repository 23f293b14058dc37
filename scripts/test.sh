#!/usr/bin/env bash
# The whole test suite: the loom models of the slot protocol, then unit, integration
# (multi-process, CLI, Redis against a real redis-server) and doc tests.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p target
# The Redis backend's tests start their own servers: make sure they are installed; so are
# the tools the process tests drive.
bash scripts/redis-server.sh
bash scripts/test-tools.sh

loom() {
    LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}" RUSTFLAGS="--cfg loom $*" \
        cargo test --release --lib --target-dir "target/loom$(echo "$*" | tr -d ' -')" "${MODELS:-loom}"
}

# The models must be able to catch a bug: the naive first-free-slot claim has to fail them.
if loom --cfg shmlock_broken > target/loom-broken.log 2>&1; then
    echo "loom: the deliberately broken protocol passed the models (see target/loom-broken.log)"
    exit 1
fi
echo "loom: the deliberately broken protocol fails $(grep -c '\.\.\. FAILED' target/loom-broken.log) models, as it must"
# And shared claims that pass a writer's claim in progress have to fail the shared models.
if MODELS=loom_tests::shared loom --cfg shmlock_broken_shared > target/loom-broken-shared.log 2>&1; then
    echo "loom: the deliberately broken shared protocol passed the models (see target/loom-broken-shared.log)"
    exit 1
fi
echo "loom: the deliberately broken shared protocol fails $(grep -c '\.\.\. FAILED' target/loom-broken-shared.log) models, as it must"
# And claims that pass an idle shared entry of their key by have to fail the idle models.
if MODELS=loom_tests::idle loom --cfg shmlock_broken_idle > target/loom-broken-idle.log 2>&1; then
    echo "loom: the deliberately broken idle entries passed the models (see target/loom-broken-idle.log)"
    exit 1
fi
echo "loom: the deliberately broken idle entries fail $(grep -c '\.\.\. FAILED' target/loom-broken-idle.log) models, as they must"

started=$SECONDS
loom
echo "loom: models passed in $((SECONDS - started)) s (LOOM_MAX_PREEMPTIONS=${LOOM_MAX_PREEMPTIONS:-3})"
# A CI clone builds each configuration once: free the loom builds' 0.5 GB for the rest.
if [ -n "${CI:-}" ]; then
    rm -rf target/loom target/loomcfgshmlock_broken target/loomcfgshmlock_broken_shared \
        target/loomcfgshmlock_broken_idle
fi

# Tests that need root (namespaces, mounts, uid switches) are ignored unless asked for; as
# root (as CI runs) they run too, elsewhere they say why not.
if [ "$(id -u)" -eq 0 ]; then
    cargo test --all-features -- --include-ignored
else
    cargo test --all-features
fi

# The generation-wrap tests need tens of millions of lock operations: a release build
# runs them (the debug run above lists them as needing one).
cargo test --release --test generation_wraps
