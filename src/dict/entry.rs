//! One shared-dict entry, and the seqlock that lets readers copy it while a writer in
//! another process rewrites it.
//!
//! An entry is a run of words in the mapping:
//!
//! ```text
//! word  field
//!    0  seq       even: stable; odd: a write is in progress
//!    1  meta      bit 0 used · bits 1-2 kind · bits 8-23 key length · bits 32-63 value length
//!    2  hash      seeded xxh3-64 of the key (a cheap filter; keys are compared in full)
//!    3  deadline  table clock, ns; u64::MAX never expires
//!    4  flags     the user's 32 flag bits
//!    5  used_at   when it was last read or written (LRU hint, outside the seqlock)
//!    6  reach     home word: farthest distance at which a key of this home was placed
//!    7  -         zero
//!    8  key bytes, then value bytes, little-endian packed, each padded to whole words
//! ```
//!
//! Writers are serialized by the dict's writer lock, so `seq` needs no CAS: a writer makes
//! it odd, writes, and makes it even again. A reader copies the words between two reads of
//! `seq` and keeps the copy only if both are the same even number. A writer that dies in the
//! middle leaves `seq` odd; [`Entry::repair`], run by whoever takes the writer lock from the
//! dead, frees such an entry, so it reads as absent, never as a mix of two values.
//!
//! Every word is an atomic: other processes write the same memory.

use crate::primitive::{crash_point, fence, AtomicU64, Ordering};

const SEQ: usize = 0;
const META: usize = 1;
const HASH: usize = 2;
const DEADLINE: usize = 3;
const FLAGS: usize = 4;
const USED_AT: usize = 5;
const REACH: usize = 6;
/// Words before the key bytes.
pub(crate) const HEAD_WORDS: usize = 8;

/// What kind of value an entry holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Bytes = 0,
    /// An `i64`, little-endian, 8 bytes: what `incr` works on.
    Int = 1,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Meta(u64);

impl Meta {
    const FREE: Meta = Meta(0);

    fn used(kind: Kind, key_len: usize, value_len: usize) -> Meta {
        Meta(1 | (kind as u64) << 1 | (key_len as u64) << 8 | (value_len as u64) << 32)
    }
    fn is_used(self) -> bool {
        self.0 & 1 == 1
    }
    fn kind(self) -> Kind {
        if (self.0 >> 1) & 3 == 1 {
            Kind::Int
        } else {
            Kind::Bytes
        }
    }
    fn key_len(self) -> usize {
        ((self.0 >> 8) & 0xffff) as usize
    }
    fn value_len(self) -> usize {
        (self.0 >> 32) as usize
    }
}

/// A key with its hash, read the way entries store it: as little-endian words.
pub(crate) struct PackedKey<'k> {
    pub hash: u64,
    pub len: usize,
    key: &'k [u8],
}

impl<'k> PackedKey<'k> {
    pub(crate) fn new(key: &'k [u8], hash: u64) -> PackedKey<'k> {
        PackedKey {
            hash,
            len: key.len(),
            key,
        }
    }

    fn words(&self) -> impl Iterator<Item = u64> + 'k {
        packed(self.key)
    }
}

/// Bytes as little-endian words, the last one zero-padded (no allocation: the lookup path
/// runs this for every key it compares).
fn packed(bytes: &[u8]) -> impl Iterator<Item = u64> + '_ {
    bytes.chunks(8).map(|c| match <[u8; 8]>::try_from(c) {
        Ok(whole) => u64::from_le_bytes(whole),
        Err(_) => {
            let mut b = [0u8; 8];
            b[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(b)
        }
    })
}

fn words_for(len: usize) -> usize {
    len.div_ceil(8)
}

/// A value copied out of an entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Copied {
    pub kind: Kind,
    pub flags: u32,
    pub deadline: u64,
    pub value: Vec<u8>,
}

/// What a reader found in an entry.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Look {
    /// No entry.
    Free,
    /// An entry of another key.
    Other,
    /// A writer is in the middle of this entry.
    Busy,
    /// The entry changed while it was read: look again.
    Changed,
    /// The key's entry (`value` empty when the value was not asked for).
    Found(Copied),
}

/// Where the parts of an entry are, for one dict's key and value limits.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Geometry {
    /// Words of one entry (a whole number of cache lines in a file).
    pub entry_words: usize,
    pub max_key: usize,
    pub max_value: usize,
}

impl Geometry {
    pub(crate) fn new(entry_words: usize, max_key: usize, max_value: usize) -> Geometry {
        assert!(HEAD_WORDS + words_for(max_key) + words_for(max_value) <= entry_words);
        Geometry {
            entry_words,
            max_key,
            max_value,
        }
    }

    fn value_at(self) -> usize {
        HEAD_WORDS + words_for(self.max_key)
    }
}

/// One entry's words.
#[derive(Clone, Copy)]
pub(crate) struct Entry<'a> {
    w: &'a [AtomicU64],
    g: Geometry,
}

impl<'a> Entry<'a> {
    pub(crate) fn new(w: &'a [AtomicU64], g: Geometry) -> Entry<'a> {
        debug_assert_eq!(w.len(), g.entry_words);
        Entry { w, g }
    }

    /// The home word of the keys whose home is this entry.
    pub(crate) fn reach(&self) -> &'a AtomicU64 {
        &self.w[REACH]
    }

    /// When the entry was last used (process-local clock of the table, ns).
    pub(crate) fn used_at(&self) -> u64 {
        self.w[USED_AT].load(Ordering::Relaxed)
    }

    /// Marks the entry used now; skips the store (and the cache-line write) when the
    /// coarse clock has not moved.
    pub(crate) fn touch(&self, now: u64) {
        if self.w[USED_AT].load(Ordering::Relaxed) != now {
            self.w[USED_AT].store(now, Ordering::Relaxed);
        }
    }

    /// Reads the entry if it holds `key`: lock-free, safe against any concurrent writer.
    /// The lengths come from the file, so they are clamped before use.
    pub(crate) fn read(&self, key: &PackedKey, want_value: bool) -> Look {
        let s1 = self.w[SEQ].load(Ordering::Acquire);
        if s1 & 1 == 1 {
            return Look::Busy;
        }
        let look = self.copy(key, want_value);
        if self.validate(s1) {
            look
        } else {
            Look::Changed
        }
    }

    /// The reads between the two loads of `seq`. Their results mean nothing until
    /// validated: they may mix two writes.
    fn copy(&self, key: &PackedKey, want_value: bool) -> Look {
        let meta = Meta(self.w[META].load(Ordering::Relaxed));
        if !meta.is_used() {
            return Look::Free;
        }
        if meta.key_len() != key.len || self.w[HASH].load(Ordering::Relaxed) != key.hash {
            return Look::Other;
        }
        for (word, want) in self.w[HEAD_WORDS..].iter().zip(key.words()) {
            if word.load(Ordering::Relaxed) != want {
                return Look::Other;
            }
        }
        let deadline = self.w[DEADLINE].load(Ordering::Relaxed);
        let flags = self.w[FLAGS].load(Ordering::Relaxed) as u32;
        let len = meta.value_len().min(self.g.max_value);
        let mut value = Vec::new();
        if want_value {
            value.reserve_exact(words_for(len) * 8);
            let at = self.g.value_at();
            for word in &self.w[at..at + words_for(len)] {
                value.extend_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
            }
            value.truncate(len);
        }
        Look::Found(Copied {
            kind: meta.kind(),
            flags,
            deadline,
            value,
        })
    }

    /// Whether nothing was written since `seq` read `s1`.
    #[inline]
    fn validate(&self, s1: u64) -> bool {
        if cfg!(shmlock_broken) {
            return true; // the broken build trusts its copy: the loom models must catch it
        }
        // Orders the copy's loads before the second read of `seq`: if any of them saw a
        // write made after `s1`, this load sees the odd `seq` that preceded that write.
        fence(Ordering::Acquire);
        self.w[SEQ].load(Ordering::Relaxed) == s1
    }

    /// The key held, for listing keys: lock-free like [`read`](Self::read). `None` if the
    /// entry is free; `Err` if it changed or is being written.
    pub(crate) fn read_key(&self) -> Result<Option<(Vec<u8>, u64)>, Look> {
        let s1 = self.w[SEQ].load(Ordering::Acquire);
        if s1 & 1 == 1 {
            return Err(Look::Busy);
        }
        let meta = Meta(self.w[META].load(Ordering::Relaxed));
        let mut out = None;
        if meta.is_used() {
            let len = meta.key_len().min(self.g.max_key);
            let mut key = Vec::with_capacity(words_for(len) * 8);
            for word in &self.w[HEAD_WORDS..HEAD_WORDS + words_for(len)] {
                key.extend_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
            }
            key.truncate(len);
            out = Some((key, self.w[DEADLINE].load(Ordering::Relaxed)));
        }
        if self.validate(s1) {
            Ok(out)
        } else {
            Err(Look::Changed)
        }
    }

    /// Whether the entry holds a key. Exact for a caller that holds the writer lock.
    pub(crate) fn is_used(&self) -> bool {
        Meta(self.w[META].load(Ordering::Relaxed)).is_used()
    }

    /// The deadline of the entry. Exact for a caller that holds the writer lock.
    pub(crate) fn deadline(&self) -> u64 {
        self.w[DEADLINE].load(Ordering::Relaxed)
    }

    /// Runs one write: `seq` odd, the writes, `seq` even. Caller holds the writer lock.
    fn write(&self, body: impl FnOnce(&[AtomicU64])) {
        // Even unless the file was damaged; `| 1` and `+ 1` leave it even either way.
        let s = self.w[SEQ].load(Ordering::Relaxed);
        self.w[SEQ].store(s | 1, Ordering::Relaxed);
        // Orders the odd `seq` before every write that follows (see `validate`).
        fence(Ordering::Release);
        crash_point();
        body(self.w);
        self.w[SEQ].store((s | 1).wrapping_add(1), Ordering::Release);
        crash_point();
    }

    /// Stores `key` with its value. Caller holds the writer lock and has checked lengths.
    pub(crate) fn store(
        &self,
        key: &PackedKey,
        kind: Kind,
        value: &[u8],
        flags: u32,
        deadline: u64,
        now: u64,
    ) {
        debug_assert!(key.len <= self.g.max_key && value.len() <= self.g.max_value);
        let at = self.g.value_at();
        self.write(|w| {
            w[META].store(Meta::used(kind, key.len, value.len()).0, Ordering::Relaxed);
            crash_point();
            w[HASH].store(key.hash, Ordering::Relaxed);
            w[DEADLINE].store(deadline, Ordering::Relaxed);
            w[FLAGS].store(u64::from(flags), Ordering::Relaxed);
            for (word, k) in w[HEAD_WORDS..].iter().zip(key.words()) {
                word.store(k, Ordering::Relaxed);
            }
            for (word, v) in w[at..].iter().zip(packed(value)) {
                word.store(v, Ordering::Relaxed);
                crash_point();
            }
        });
        self.w[USED_AT].store(now, Ordering::Relaxed);
    }

    /// Moves the deadline of the entry. Caller holds the writer lock.
    pub(crate) fn set_deadline(&self, deadline: u64) {
        self.write(|w| w[DEADLINE].store(deadline, Ordering::Relaxed));
    }

    /// Empties the entry. Caller holds the writer lock.
    pub(crate) fn free(&self) {
        self.write(|w| w[META].store(Meta::FREE.0, Ordering::Relaxed));
    }

    /// After a writer died holding the writer lock: if it died inside this entry, empty it
    /// and make `seq` even. Caller holds the writer lock. Returns whether it did.
    pub(crate) fn repair(&self) -> bool {
        let s = self.w[SEQ].load(Ordering::Relaxed);
        if s & 1 == 0 {
            return false;
        }
        self.w[META].store(Meta::FREE.0, Ordering::Relaxed);
        self.w[SEQ].store(s.wrapping_add(1), Ordering::Release);
        true
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn entry_words(g: Geometry) -> Vec<AtomicU64> {
        (0..g.entry_words).map(|_| AtomicU64::new(0)).collect()
    }

    #[test]
    fn stores_reads_and_frees() {
        let g = Geometry::new(16, 12, 20);
        let words = entry_words(g);
        let e = Entry::new(&words, g);
        let k = PackedKey::new(b"user:42 long", 7);
        assert_eq!(e.read(&k, true), Look::Free);
        e.store(&k, Kind::Bytes, b"twenty bytes of data", 5, 99, 1);
        let Look::Found(c) = e.read(&k, true) else {
            panic!("not found")
        };
        assert_eq!(
            c,
            Copied {
                kind: Kind::Bytes,
                flags: 5,
                deadline: 99,
                value: b"twenty bytes of data".to_vec()
            }
        );
        assert_eq!(e.read_key(), Ok(Some((b"user:42 long".to_vec(), 99))));
        // same hash and length, other bytes: another key
        assert_eq!(
            e.read(&PackedKey::new(b"user:42 lonG", 7), true),
            Look::Other
        );
        e.free();
        assert_eq!(e.read(&k, true), Look::Free);
        assert_eq!(words[SEQ].load(Ordering::Relaxed), 4);
    }

    #[test]
    fn an_odd_seq_is_busy_until_repaired_and_then_absent() {
        let g = Geometry::new(16, 8, 8);
        let words = entry_words(g);
        let e = Entry::new(&words, g);
        let k = PackedKey::new(b"k", 1);
        e.store(&k, Kind::Int, &5i64.to_le_bytes(), 0, u64::MAX, 1);
        words[SEQ].fetch_add(1, Ordering::Relaxed); // a writer died here
        assert_eq!(e.read(&k, true), Look::Busy);
        assert!(e.repair());
        assert!(!e.repair());
        assert_eq!(e.read(&k, true), Look::Free);
    }

    #[test]
    fn hostile_lengths_never_read_past_the_entry() {
        let g = Geometry::new(16, 8, 8);
        let words = entry_words(g);
        let e = Entry::new(&words, g);
        words[META].store(u64::MAX, Ordering::Relaxed);
        assert_eq!(e.read_key().unwrap().unwrap().0.len(), 8);
        words[META].store(
            Meta::used(Kind::Bytes, 1, u32::MAX as usize).0,
            Ordering::Relaxed,
        );
        words[HASH].store(3, Ordering::Relaxed);
        words[HEAD_WORDS].store(u64::from(b'k'), Ordering::Relaxed);
        let Look::Found(c) = e.read(&PackedKey::new(b"k", 3), true) else {
            panic!("not found")
        };
        assert_eq!(c.value.len(), 8);
    }
}
