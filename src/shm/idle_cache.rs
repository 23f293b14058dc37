//! Where this process's idle shared entries are (see `table/idle.rs`): for each of a few
//! ways, chosen by the key's home slot, the slot of the last one released and its home.
//! A hint, not a record: the re-entry checks the slot's key and CASes its word. Keyed by
//! the home, which a hold carries, so that a release reads nothing of the slot for it.

use std::sync::atomic::{AtomicU64, Ordering};

/// Idle entries a handle keeps at most (a way replaced lets go of its entry).
const WAYS: usize = 64;

pub(crate) struct IdleCache {
    /// `slot + 1` in the low half (0: empty), the home in the high half.
    ways: [AtomicU64; WAYS],
}

impl IdleCache {
    pub(crate) fn new() -> IdleCache {
        IdleCache {
            ways: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    #[inline(always)]
    fn way(&self, home: usize) -> &AtomicU64 {
        &self.ways[home % WAYS]
    }

    /// The slot of the idle entry of a key of `home`, as last recorded (slot numbers and
    /// homes are below 2^32: see `Table::new`).
    #[inline(always)]
    pub(crate) fn get(&self, home: usize) -> Option<usize> {
        let v = self.way(home).load(Ordering::Relaxed);
        let slot = v & 0xffff_ffff;
        (slot != 0 && v >> 32 == home as u64).then(|| slot as usize - 1)
    }

    /// Forgets that `slot` holds an idle entry of a key of `home` (it did not, or no
    /// longer: a re-entry there failed), if the way still says so.
    #[cold]
    pub(crate) fn forget(&self, home: usize, slot: usize) {
        let v = (home as u64) << 32 | (slot as u64 + 1);
        let _ = self
            .way(home)
            .compare_exchange(v, 0, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Records that `slot` holds an idle entry of a key of `home`; returns the slot the
    /// way held before, if another, which the caller lets go.
    #[inline(always)]
    pub(crate) fn put(&self, home: usize, slot: usize) -> Option<usize> {
        let v = (home as u64) << 32 | (slot as u64 + 1);
        let way = self.way(home);
        if way.load(Ordering::Relaxed) == v {
            return None;
        }
        let old = way.swap(v, Ordering::Relaxed) & 0xffff_ffff;
        (old != 0 && old != slot as u64 + 1).then(|| old as usize - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_way_keeps_the_last_slot_of_its_key() {
        let c = IdleCache::new();
        let (a, b) = (3, 3 + WAYS);
        assert_eq!(c.get(a), None);
        assert_eq!(c.put(a, 0), None);
        assert_eq!(c.get(a), Some(0));
        assert_eq!(c.put(a, 0), None);
        // another key of the same way replaces it, and the old slot is let go
        assert_eq!(c.put(b, 7), Some(0));
        assert_eq!(c.get(a), None);
        assert_eq!(c.get(b), Some(7));
        assert_eq!(c.put(b, 9), Some(7));
        c.forget(b, 7); // not what the way says: kept
        assert_eq!(c.get(b), Some(9));
        c.forget(b, 9);
        assert_eq!(c.get(b), None);
    }
}
