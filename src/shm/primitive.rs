//! The atomics and spin hints the table protocol is written against.
//!
//! Under `cfg(loom)` these are loom's model-checked types, so the loom suite runs the very
//! source that production runs; otherwise they are the std types over the shared mapping.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU32, AtomicU64};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU32, AtomicU64};

pub(crate) use std::sync::atomic::Ordering;

/// One round of a bounded wait for another process's transitional state to resolve.
///
/// Spins first, then yields the CPU: the other party is usually a few instructions from
/// done, but on a busy machine it may be descheduled.
#[inline]
pub(crate) fn spin(round: u32) {
    #[cfg(loom)]
    {
        let _ = round;
        loom::thread::yield_now();
    }
    #[cfg(not(loom))]
    {
        if round < 6 {
            for _ in 0..(1u32 << round) {
                std::hint::spin_loop();
            }
        } else {
            std::thread::yield_now();
        }
    }
}

/// How many [`spin`] rounds a claimer waits for a CLAIMING/EXTENDING entry before it
/// treats the key as busy. Loom keeps it tiny: each round multiplies the state space.
#[cfg(loom)]
pub(crate) const SETTLE_ROUNDS: u32 = 2;
#[cfg(not(loom))]
pub(crate) const SETTLE_ROUNDS: u32 = 64;

/// Where a process may die in the middle of a protocol step: after each write to shared
/// memory. A no-op in real builds; under loom a model can make a thread stop for good at
/// its k-th crash point (see `crash`), which is how the loom suite kills "processes" at
/// every step of claim, release, extend and steal.
#[cfg(not(loom))]
#[inline(always)]
pub(crate) fn crash_point() {}

#[cfg(loom)]
pub(crate) fn crash_point() {
    crash::point();
}

#[cfg(loom)]
pub(crate) mod crash {
    use std::cell::Cell;

    loom::thread_local! {
        static BUDGET: Cell<Option<u32>> = Cell::new(None);
    }

    /// The payload a crashed thread unwinds with.
    pub(crate) struct Crashed;

    /// The calling thread dies at its `steps`-th crash point from now (0: the next one).
    pub(crate) fn arm(steps: u32) {
        BUDGET.with(|b| b.set(Some(steps)));
    }

    /// The calling thread no longer dies at a crash point.
    pub(crate) fn disarm() {
        BUDGET.with(|b| b.set(None));
    }

    pub(crate) fn point() {
        BUDGET.with(|b| match b.get() {
            Some(0) => std::panic::resume_unwind(Box::new(Crashed)),
            Some(n) => b.set(Some(n - 1)),
            None => {}
        });
    }
}
