//! Where this process's idle shared entries away from their home are (see
//! `table/idle.rs`; one at its home is found there): for each of a few ways, chosen by the
//! key's hash, the slot of the last one released and 32 more bits of that hash, so that
//! keys of one home do not share a way. A hint, not a record: the re-entry checks the
//! slot's key and CASes its word.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::shm::table::KeyHash;

/// Idle entries away from home a handle remembers at most (a way replaced lets go of its
/// entry).
const WAYS: usize = 64;

pub(crate) struct IdleCache {
    /// `slot + 1` in the low half (0: empty), the key's check bits in the high half.
    ways: [AtomicU64; WAYS],
}

/// A way and the check bits, both from the high word of the key's hash (the home comes
/// from the low word, the tag from the top 5 bits).
#[inline(always)]
fn place(hi: u64) -> (usize, u64) {
    ((hi as usize) % WAYS, (hi >> 6) & 0xffff_ffff)
}

impl IdleCache {
    pub(crate) fn new() -> IdleCache {
        IdleCache {
            ways: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// The slot of this key's idle entry, as last recorded (slot numbers are below 2^32:
    /// see `Table::new`).
    #[inline(always)]
    pub(crate) fn get(&self, hash: KeyHash) -> Option<usize> {
        let (way, check) = place(hash.hi);
        let v = self.ways[way].load(Ordering::Relaxed);
        let slot = v & 0xffff_ffff;
        (slot != 0 && v >> 32 == check).then(|| slot as usize - 1)
    }

    /// Forgets that `slot` holds this key's idle entry (a re-entry there failed), if the
    /// way still says so.
    #[cold]
    pub(crate) fn forget(&self, hash: KeyHash, slot: usize) {
        let (way, check) = place(hash.hi);
        let v = check << 32 | (slot as u64 + 1);
        let _ = self.ways[way].compare_exchange(v, 0, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Records that `slot` holds an idle entry of the key whose hash's high word is `hi`;
    /// returns the slot the way held before, if another, which the caller lets go.
    #[inline(always)]
    pub(crate) fn put(&self, hi: u64, slot: usize) -> Option<usize> {
        let (way, check) = place(hi);
        let v = check << 32 | (slot as u64 + 1);
        let way = &self.ways[way];
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
        // two keys of one way (and of one home: the home comes from `lo`)
        let a = KeyHash { lo: 5, hi: 3 };
        let b = KeyHash {
            lo: 5,
            hi: 3 + WAYS as u64,
        };
        assert_eq!(c.get(a), None);
        assert_eq!(c.put(a.hi, 0), None);
        assert_eq!(c.get(a), Some(0));
        assert_eq!(c.get(b), None, "another key's check bits");
        assert_eq!(c.put(a.hi, 0), None);
        // another key of the same way replaces it, and the old slot is let go
        assert_eq!(c.put(b.hi, 7), Some(0));
        assert_eq!(c.get(a), None);
        assert_eq!(c.get(b), Some(7));
        assert_eq!(c.put(b.hi, 9), Some(7));
        c.forget(b, 7); // not what the way says: kept
        assert_eq!(c.get(b), Some(9));
        c.forget(a, 9); // another key's: kept
        assert_eq!(c.get(b), Some(9));
        c.forget(b, 9);
        assert_eq!(c.get(b), None);
        // keys of one home in different ways keep their own slots
        let d = KeyHash { lo: 5, hi: 4 };
        assert_eq!(c.put(a.hi, 1), None);
        assert_eq!(c.put(d.hi, 2), None);
        assert_eq!((c.get(a), c.get(d)), (Some(1), Some(2)));
    }
}
