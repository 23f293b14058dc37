//! The home filter: one word for each home that says which keys of that home may be
//! stored, so that a lookup of an absent key reads one word instead of every entry within
//! the reach. The words are an array of their own after the undo copies, eight homes to a
//! cache line, so that they stay in cache when the entries do not: a miss on a dict of 4096
//! entries of 384 bytes reads a 32 KiB array, not a 1.5 MiB one.
//!
//! ```text
//! bits  0-31  one bit per key of the home: bit (hash & 31); set before the key is stored
//! bits 32-63  generation: +1 at every change of the word
//! ```
//!
//! The rule readers rely on: **a key of this home that a lock-free reader could find (in
//! an entry, or in an undo copy that covers one) has its bit set.** A bit that is clear
//! proves the key absent; a bit that is set proves nothing (other keys share it, or the
//! key went), and the lookup reads the entries as before.
//!
//! - A writer placing a key of this home adds its bit with a CAS that also moves the
//!   generation on, before it writes the entry, so a reader that finds the key finds the bit.
//! - Bits are only ever cleared by a rebuild, under the writer lock, after a key of the home
//!   went: it reads the word, computes the bits of the keys still there (giving up if an
//!   entry of the reach is mid-write or out of use, or an undo copy is in use), checks that
//!   the lock is still its own, and CASes from the word it read. A writer that was taken over
//!   in the middle of a rebuild cannot clear the bit of a key its successor placed: the
//!   lock check (a read-modify-write of the lock word) comes before the successor's
//!   takeover, so the successor's add comes after the word the rebuild read, and changed
//!   its generation, and the CAS fails. It fails even when the bit was already set: that is
//!   why an add moves the generation on whatever the bits.
//! - A stale writer's late add only sets a bit: at worst a lookup reads the entries.
//!
//! The generation has 32 bits: a rebuild that read the word, then stalled (and was taken
//! over) while the word changed exactly 2^32 times, to come back to the same bits, could
//! clear a bit it should not. A rebuild runs only when its home's filter has
//! [`REBUILD_AT`] bits or more, after a removal, so removals of other homes' keys do not
//! pay for it.

use super::writer::Writing;
use crate::broken::{broken, Broken};
use crate::shm::primitive::{AtomicU64, Ordering};

const BITS: u64 = 0xffff_ffff;
const GENERATION_ONE: u64 = 1 << 32;
/// A home's filter is rebuilt after a removal once it has this many bits set: with fewer,
/// a miss reads the entries at most one time in eight.
pub(crate) const REBUILD_AT: u32 = 4;

/// The filter bit of a key's hash. The home comes from the hash's high bits (see
/// `SharedDict::home`); these are its low ones.
#[inline]
pub(crate) fn bit(hash: u64) -> u64 {
    1 << (hash & 31)
}

/// One home's filter word.
#[derive(Clone, Copy)]
pub(crate) struct Filter<'a>(pub &'a AtomicU64);

impl Filter<'_> {
    /// Whether a key of this hash may be stored: `false` proves it absent (lock-free).
    #[inline]
    pub(crate) fn may_hold(self, hash: u64) -> bool {
        self.0.load(Ordering::Acquire) & bit(hash) != 0
    }

    /// Adds a key's bit (and moves the generation on), before the key is stored.
    pub(crate) fn add(self, hash: u64) {
        let mut cur = self.0.load(Ordering::Relaxed);
        loop {
            if broken(Broken::Protocol) && cur & bit(hash) != 0 {
                return; // the broken build skips an add that changes no bit: a model must catch it
            }
            let next = (cur | bit(hash)).wrapping_add(GENERATION_ONE);
            match self
                .0
                .compare_exchange_weak(cur, next, Ordering::SeqCst, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(seen) => cur = seen,
            }
        }
    }

    /// Clears the bits of keys that went, if the filter has [`REBUILD_AT`] bits or more:
    /// `scan` gives the bits of the keys of the home still stored, or `None` if it cannot
    /// tell (an entry mid-write or out of use, an undo copy in use). Called under the
    /// writer lock, with no write of the caller's in progress.
    pub(crate) fn rebuild(self, w: &Writing<'_>, scan: impl FnOnce() -> Option<u64>) {
        let old = self.0.load(Ordering::SeqCst);
        if ((old & BITS) as u32).count_ones() < REBUILD_AT {
            return;
        }
        let Some(bits) = scan() else {
            return;
        };
        // A successor's add comes after this check in the lock word's order, hence after
        // the load of `old`, and changes the word: the CAS then fails.
        if !w.still_mine() {
            return;
        }
        let next = (old & !BITS).wrapping_add(GENERATION_ONE) | (bits & BITS);
        let _ = self
            .0
            .compare_exchange(old, next, Ordering::SeqCst, Ordering::Relaxed);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::atomic::AtomicU32;

    use super::*;
    use crate::dict::writer::{WriterEnv, WriterLock};
    use crate::shm::registry::OwnerId;

    struct Env;

    impl WriterEnv for Env {
        fn owner(&self) -> OwnerId {
            OwnerId::new(1, 1)
        }
        fn is_dead(&self, _: OwnerId) -> bool {
            false
        }
        fn stalled(&self, _: u64) -> bool {
            false
        }
        fn sleep(&self, _: &AtomicU32, _: u32) {}
    }

    #[test]
    fn adds_set_bits_and_rebuilds_clear_the_bits_of_keys_that_went() {
        let word = AtomicU64::new(0);
        let f = Filter(&word);
        assert!(!f.may_hold(3));
        f.add(3);
        assert!(f.may_hold(3) && f.may_hold(3 + 32) && !f.may_hold(4));
        let before = word.load(Ordering::Relaxed);
        f.add(3); // the same bit: the word still changes
        assert_ne!(word.load(Ordering::Relaxed), before);
        assert_eq!(word.load(Ordering::Relaxed) & BITS, 1 << 3);

        let (lock, wait, turn) = (AtomicU64::new(0), AtomicU32::new(0), AtomicU32::new(0));
        let lock = WriterLock {
            word: &lock,
            wait: &wait,
            turn: &turn,
        };
        let (w, _) = lock.lock(&Env);
        // fewer than REBUILD_AT bits: left as it is, the scan not even made
        f.rebuild(&w, || panic!("scanned"));
        for h in [5, 6, 7] {
            f.add(h);
        }
        // a scan that cannot tell changes nothing
        let before = word.load(Ordering::Relaxed);
        f.rebuild(&w, || None);
        assert_eq!(word.load(Ordering::Relaxed), before);
        // keys 3 and 6 are still stored
        f.rebuild(&w, || Some(bit(3) | bit(6)));
        assert!(f.may_hold(3) && f.may_hold(6) && !f.may_hold(5) && !f.may_hold(7));
        assert_ne!(word.load(Ordering::Relaxed) >> 32, before >> 32);
        // taken over (the lock word moved on): a rebuild clears nothing
        for h in [8, 9] {
            f.add(h);
        }
        lock.word.fetch_add(1 << 26, Ordering::SeqCst);
        let before = word.load(Ordering::Relaxed);
        f.rebuild(&w, || Some(0));
        assert_eq!(word.load(Ordering::Relaxed), before);
        std::mem::forget(w);
    }
}
