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

# The models must be able to catch a bug. The loom build holds four deliberately broken
# variants of the protocols (`src/broken.rs`; SHMLOCK_BROKEN picks one at run time, none
# when unset), and each must fail every model listed for it. Only those run: the others
# pass against it, which proves nothing. The same build then runs every model with none.
broken_protocol=(
    dict::loom_tests::dict_a_stalled_writer_leaves_the_old_value_readable
    dict::loom_tests::dict_a_taken_over_filter_rebuild_never_clears_a_placed_key
    dict::loom_tests::dict_eviction_never_gives_a_key_another_keys_value
    dict::loom_tests::dict_reader_never_accepts_a_torn_value
    dict::loom_tests::dict_writer_death_leaves_the_old_value_or_the_new
    dict::loom_tests::heap_two_writers_never_take_one_block
    dict::loom_tests::heap_a_sweeper_taken_over_frees_nothing_its_successor_names
    shm::loom_tests::a_stalled_claim_is_broken_and_its_owner_backs_out
    shm::loom_tests::fast_claim_versus_slow_claim_that_raises_reach
    shm::loom_tests::release_hole
    shm::loom_tests::two_claimers_in_a_raised_reach
    shm::loom_tests::two_claimers_one_key
    shm::loom_tests::shared::a_dead_readers_share_is_taken_back
    shm::loom_tests::shared::a_key_kept_for_readers_never_lets_a_writer_beside_them
    shm::loom_tests::shared::a_reader_and_a_writer_never_both_win
    shm::loom_tests::shared::a_semaphore_never_lets_in_more_than_its_count
    shm::loom_tests::shared::readers_share_while_a_writer_claims
    shm::loom_tests::idle::a_permits_reentry_never_exceeds_the_count
    shm::loom_tests::idle::a_readers_reentry_and_a_writer_never_both_win
)
# (idle::a_waiting_writer_keeps_idle_readers_out caught this variant too while the marked
# reader's release freed its slot, where the broken scan stopped; the release now keeps
# the key for the writer, and the idle variant below is the one that model is for.)
broken_shared=(
    shm::loom_tests::shared::a_key_kept_for_readers_never_lets_a_writer_beside_them
    shm::loom_tests::shared::a_reader_and_a_writer_never_both_win
    shm::loom_tests::shared::a_semaphore_never_lets_in_more_than_its_count
    shm::loom_tests::shared::readers_share_while_a_writer_claims
)
broken_idle=(
    shm::loom_tests::idle::a_permits_reentry_never_exceeds_the_count
    shm::loom_tests::idle::a_readers_reentry_and_a_writer_never_both_win
    shm::loom_tests::idle::a_waiting_writer_keeps_idle_readers_out
)
broken_reserve=(
    shm::loom_tests::shared::a_key_kept_for_a_writer_goes_to_the_writer
    shm::loom_tests::shared::the_last_marked_readers_release_keeps_the_key_for_the_writer
    shm::loom_tests::shared::a_writers_release_keeps_the_key_for_waiting_readers
)
must_fail() {
    local variant=$1 log=target/loom-broken-$1.log
    shift
    SHMLOCK_BROKEN=$variant LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}" RUSTFLAGS="--cfg loom" \
        cargo test --release --lib --target-dir target/loom -- --exact "$@" > "$log" 2>&1 || true
    local failed
    failed=$(grep -c '\.\.\. FAILED$' "$log" || true)
    if [ "$failed" -ne $# ]; then
        echo "loom: the deliberately broken $variant variant failed $failed of the $# models it must fail (see $log)"
        exit 1
    fi
    echo "loom: the deliberately broken $variant variant fails the $# models listed for it, as it must"
}
must_fail protocol "${broken_protocol[@]}"
must_fail shared "${broken_shared[@]}"
must_fail idle "${broken_idle[@]}"
must_fail reserve "${broken_reserve[@]}"

started=$SECONDS
env -u SHMLOCK_BROKEN LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}" RUSTFLAGS="--cfg loom" \
    cargo test --release --lib --target-dir target/loom "${MODELS:-loom}"
echo "loom: models passed in $((SECONDS - started)) s (LOOM_MAX_PREEMPTIONS=${LOOM_MAX_PREEMPTIONS:-3})"
# A CI clone builds each configuration once: free the loom build's space for the rest.
if [ -n "${CI:-}" ]; then
    rm -rf target/loom
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
