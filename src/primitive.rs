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
