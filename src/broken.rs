//! The deliberately broken variants of the protocols, which the loom models must catch
//! (`scripts/test.sh` checks that each fails the models listed for it). Only a loom build
//! (`--cfg loom`) has them, and there the variable `SHMLOCK_BROKEN` picks the one that
//! runs (none when it is unset), so that one build serves the models and every check of
//! them; in every other build [`broken`] is `false` and the variants compile away.

/// Which variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Broken {
    /// `SHMLOCK_BROKEN=protocol`: a claim takes the first free slot and skips its rescan,
    /// a dict reader trusts its copy, a dict filter add skips an already-set bit, a heap
    /// take keeps the bits another writer set first.
    Protocol,
    /// `SHMLOCK_BROKEN=shared`: shared claims pass every claim in progress, a writer's too.
    Shared,
    /// `SHMLOCK_BROKEN=idle`: claims pass idle entries of their key by, and a waiting
    /// writer leaves them.
    Idle,
    /// `SHMLOCK_BROKEN=reserve`: the release of the last hold a writer waits for frees
    /// its slot instead of keeping the key for the writer.
    Reserve,
}

/// Whether this build runs the variant `which`. Without `SHMLOCK_BROKEN`, or with a name
/// it does not know, none: the models then pass, and the check that they fail says so (a
/// panic here would fail every model, and pass that check).
#[cfg(loom)]
pub(crate) fn broken(which: Broken) -> bool {
    static CHOSEN: std::sync::OnceLock<Option<Broken>> = std::sync::OnceLock::new();
    *CHOSEN.get_or_init(|| match std::env::var("SHMLOCK_BROKEN").as_deref() {
        Ok("protocol") => Some(Broken::Protocol),
        Ok("shared") => Some(Broken::Shared),
        Ok("idle") => Some(Broken::Idle),
        Ok("reserve") => Some(Broken::Reserve),
        _ => None,
    }) == Some(which)
}

/// Whether this build runs the variant `which`: never.
#[cfg(not(loom))]
#[inline(always)]
pub(crate) const fn broken(_which: Broken) -> bool {
    false
}
