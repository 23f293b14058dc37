//! One shared-dict entry, and the seqlock that lets readers copy it while a writer in
//! another process rewrites it.
//!
//! An entry is a run of words in the mapping:
//!
//! ```text
//! word  field
//!    0  seq       state (2 bits) · count (38 bits) · owner of a write in progress (24 bits)
//!    1  meta      bit 0 used · bits 1-3 kind (bytes, i64, f64, bool, list) · bit 4 the value is
//!                 in the heap · bits 8-23 key length · bits 32-63 value length
//!    2  hash      seeded xxh3-64 of the key (a cheap filter; keys are compared in full)
//!    3  deadline  table clock, ns; u64::MAX never expires
//!    4  flags     the user's 32 flag bits
//!    5  used_at   LRU stamp of its last read or write (see `recency`; outside the seqlock)
//!    6  reach     home word: farthest distance at which a key of this home was placed
//!    7  count     a list kept in the heap: its elements (else meaningless)
//!    8  key bytes, then value bytes, little-endian packed, each padded to whole words
//!       (a value in the heap: its chain's first block and skip, in the value's first
//!       word)
//! ```
//!
//! A value longer than the entry's room is kept in the dict's block heap
//! ([`heap`](super::heap)): the entry names its chain, and a reader copies the chain
//! between its two reads of `seq` like any other bytes of the entry.
//!
//! `seq` states: STABLE (readable), WRITING (by the owner in the word), QUARANTINED (a
//! write by a writer whose lock was taken over: absent, out of use) and DONE (quarantined,
//! and its writer has stopped writing: ready to be emptied).
//!
//! A writer holding the dict's writer lock moves `seq` from STABLE to WRITING with a CAS
//! that records its owner id, checks that the lock is still its own, writes, and moves it
//! back to STABLE with a CAS from the exact word it wrote. A reader copies the words
//! between two reads of `seq` and keeps the copy only if both are the same STABLE word.
//!
//! Whoever takes the writer lock over (its owner dead or stalled) looks at every entry: a
//! WRITING one whose writer is dead is emptied; one whose writer is alive (stopped, and
//! may yet resume and write) is quarantined with a CAS, so its late writes land only
//! there, and its own final CAS fails; it then marks the entry DONE, and the next writer
//! empties it. An interrupted write therefore never reads as a mix of two values, and
//! never lands in an entry someone else is using. A write over a key's value is covered
//! by an undo copy ([`journal`](super::journal)): the dead writer's entry gets the copy
//! back instead of being emptied, and a quarantined one's key is read from the copy until
//! it is stored elsewhere, so the key keeps its previous value.
//!
//! Every word is an atomic: other processes write the same memory.

use super::heap::{Chain, Heap};
use super::recency;
use super::words::{copy_words, store_packed, tail_word, words_for};
use super::writer::Writing;
use crate::broken::{broken, Broken};
use crate::shm::primitive::{crash_point, fence, AtomicU64, Ordering};
use crate::shm::registry::OwnerId;

const SEQ: usize = 0;
const META: usize = 1;
const HASH: usize = 2;
const DEADLINE: usize = 3;
const FLAGS: usize = 4;
const USED_AT: usize = 5;
const REACH: usize = 6;
const COUNT: usize = 7;
/// Words before the key bytes.
pub(crate) const HEAD_WORDS: usize = 8;

pub(crate) const STABLE: u64 = 0;
const WRITING: u64 = 1;
const QUARANTINED: u64 = 2;
const DONE: u64 = 3;
const COUNT_SHIFT: u32 = 2;
const COUNT_MASK: u64 = (1 << 38) - 1;
const OWNER_SHIFT: u32 = 40;

/// A `seq` word's state, count and owner.
pub(crate) fn seq_parts(word: u64) -> (u64, u64, OwnerId) {
    let s = Seq(word);
    (s.state(), s.count(), s.owner())
}

/// The `seq` word: state, count, owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Seq(u64);

impl Seq {
    fn new(state: u64, count: u64, owner: OwnerId) -> Seq {
        Seq(state | (count & COUNT_MASK) << COUNT_SHIFT | u64::from(owner.bits()) << OWNER_SHIFT)
    }
    fn state(self) -> u64 {
        self.0 & 3
    }
    fn count(self) -> u64 {
        (self.0 >> COUNT_SHIFT) & COUNT_MASK
    }
    fn owner(self) -> OwnerId {
        OwnerId::from_bits((self.0 >> OWNER_SHIFT) as u32)
    }
    fn with_state(self, state: u64) -> Seq {
        Seq(self.0 & !3 | state)
    }
    /// Stable again, one count later, nobody's.
    fn settled(self) -> Seq {
        Seq::new(STABLE, self.count() + 1, OwnerId::from_bits(0))
    }
}

/// A write was not made (or not kept): the writer lock is no longer this writer's, or the
/// entry is in someone else's hands. The caller looks again under the lock, or gives up.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Aborted {
    /// The lock was taken over: this writer must stop.
    TakenOver,
    /// The entry is not stable (a stale writer marked it): clean it and try again.
    NotStable,
}

/// What kind of value an entry holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Bytes = 0,
    /// An `i64`, little-endian, 8 bytes.
    Int = 1,
    /// An `f64`'s bits, little-endian, 8 bytes.
    Float = 2,
    /// One byte, 0 or 1.
    Bool = 3,
    /// A list: its elements one after the other (see `value.rs`).
    List = 4,
}

impl Kind {
    /// The kind a stored number names (what a damaged file has besides: the last).
    pub(crate) fn of(n: u64) -> Kind {
        match n {
            0 => Kind::Bytes,
            1 => Kind::Int,
            2 => Kind::Float,
            3 => Kind::Bool,
            _ => Kind::List,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Meta(u64);

const IN_HEAP: u64 = 1 << 4;

impl Meta {
    const FREE: Meta = Meta(0);

    fn used(kind: Kind, key_len: usize, value_len: usize) -> Meta {
        Meta(1 | (kind as u64) << 1 | (key_len as u64) << 8 | (value_len as u64) << 32)
    }
    fn in_heap(self) -> bool {
        self.0 & IN_HEAP != 0
    }
    fn is_used(self) -> bool {
        self.0 & 1 == 1
    }
    fn kind(self) -> Kind {
        Kind::of((self.0 >> 1) & 7)
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
    /// The key's first bytes, for an error that names it.
    pub(crate) fn preview(&self) -> crate::error::KeyPreview {
        crate::error::KeyPreview::new(self.key)
    }

    pub(crate) fn new(key: &'k [u8], hash: u64) -> PackedKey<'k> {
        PackedKey {
            hash,
            len: key.len(),
            key,
        }
    }

    /// Whether `words` (at least as many as the key fills) hold this key: whole words
    /// compared as words, the tail shifted in (see [`tail_word`]).
    #[inline(always)]
    fn matches(&self, words: &[AtomicU64]) -> bool {
        let Some(words) = words.get(..words_for(self.key.len())) else {
            return false;
        };
        let whole = self.key.chunks_exact(8);
        let tail = whole.remainder();
        let mut words = words.iter();
        for (chunk, word) in whole.zip(words.by_ref()) {
            let want = u64::from_le_bytes(chunk.try_into().expect("8-byte chunk"));
            if word.load(Ordering::Relaxed) != want {
                return false;
            }
        }
        tail.is_empty()
            || words
                .next()
                .is_some_and(|w| w.load(Ordering::Relaxed) == tail_word(self.key))
    }
}

/// What a read found besides the value's bytes (those go to the caller's buffer, so that a
/// read moves no more than these few words up the lookup's frames).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Copied {
    pub kind: Kind,
    pub flags: u32,
    pub deadline: u64,
}

impl Copied {
    /// Before a read: nothing found.
    pub(crate) const NONE: Copied = Copied {
        kind: Kind::Bytes,
        flags: 0,
        deadline: 0,
    };
}

/// Where a read puts the value's bytes: `None` when the value is not wanted.
pub(crate) type Out<'b> = Option<&'b mut Vec<u8>>;

/// What a reader found in an entry.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Look {
    /// No entry.
    Free,
    /// An entry of another key.
    Other,
    /// A writer is in the middle of this entry.
    Busy,
    /// The entry is out of use: its writer was taken over in the middle of a write (the
    /// [`journal`](super::journal) may hold the key's value).
    Parked,
    /// The entry changed while it was read: look again.
    Changed,
    /// The entry is stable, but the heap chain it names runs out of the heap or short: a
    /// damaged file (a chain is freed only after its entry moved on). For a lock-free
    /// reader, the same as `Changed` until it validates.
    Damaged,
    /// The key's entry (its value in the caller's buffer, when it was asked for).
    Found(Copied),
}

/// Where the parts of an entry are, for one dict's key and value limits, and where its
/// heap is. Entries hold it by reference (it lives as long as the dict's handle).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Geometry {
    /// Words of one entry (a whole number of cache lines in a file).
    pub entry_words: usize,
    pub max_key: usize,
    /// The longest value kept in the entry itself.
    pub max_value: usize,
    /// The longest value kept in the heap (0: the dict has none).
    pub max_heap: usize,
    /// The heap's map and blocks: where they start in the mapping's words, and how many
    /// blocks (0: none).
    pub heap_map: usize,
    pub heap_data: usize,
    pub heap_blocks: usize,
}

impl Geometry {
    pub(crate) const fn new(entry_words: usize, max_key: usize, max_value: usize) -> Geometry {
        assert!(HEAD_WORDS + words_for(max_key) + words_for(max_value) <= entry_words);
        Geometry {
            entry_words,
            max_key,
            max_value,
            max_heap: 0,
            heap_map: 0,
            heap_data: 0,
            heap_blocks: 0,
        }
    }

    /// With a heap of `blocks` blocks whose map starts at word `map` of the mapping and
    /// its blocks at word `data`, for values of up to `max_heap` bytes.
    pub(crate) fn with_heap(
        self,
        max_heap: usize,
        map: usize,
        data: usize,
        blocks: usize,
    ) -> Geometry {
        Geometry {
            max_heap,
            heap_map: map,
            heap_data: data,
            heap_blocks: blocks,
            ..self
        }
    }

    /// The heap in `words` (the whole mapping): empty for a dict without one.
    #[inline]
    pub(crate) fn heap<'a>(&self, words: &'a [AtomicU64]) -> Heap<'a> {
        if self.heap_blocks == 0 {
            return Heap::NONE;
        }
        let end = self.heap_data + self.heap_blocks * super::heap::BLOCK_WORDS;
        Heap::new(
            &words[self.heap_map..self.heap_data],
            &words[self.heap_data..end],
        )
    }

    fn value_at(self) -> usize {
        HEAD_WORDS + words_for(self.max_key)
    }
}

/// Where a value goes in an entry: into its own room, or named there as a chain of the
/// heap that the writer wrote first.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ValueAt<'v> {
    Inline(&'v [u8]),
    /// A chain (its first block, its value's length and its skip, see [`Chain`]) and, for
    /// a list, its elements (else 0).
    Heap {
        first: u32,
        len: usize,
        skip: usize,
        count: u32,
    },
}

/// The word an entry names its heap chain with: the first block (low 32 bits) and the
/// skip (high 32 bits: bytes of the first index block's data before the value).
pub(crate) fn chain_word(first: u32, skip: usize) -> u64 {
    u64::from(first) | (skip as u64) << 32
}

/// A chain word's first block and skip.
pub(crate) fn chain_parts(word: u64) -> (u32, usize) {
    (word as u32, (word >> 32) as usize)
}

/// One entry's words.
#[derive(Clone, Copy)]
pub(crate) struct Entry<'a> {
    w: &'a [AtomicU64],
    g: &'a Geometry,
    /// The whole mapping, where the heap is (empty for a dict without one).
    all: &'a [AtomicU64],
}

impl<'a> Entry<'a> {
    /// An entry of a dict without a heap.
    #[cfg(any(test, loom))]
    pub(crate) fn new(w: &'a [AtomicU64], g: &'a Geometry) -> Entry<'a> {
        Entry::with_heap(w, g, &[])
    }

    /// An entry of the mapping `all`, whose values longer than its room are in the heap
    /// `g` places there.
    #[inline(always)]
    pub(crate) fn with_heap(
        w: &'a [AtomicU64],
        g: &'a Geometry,
        all: &'a [AtomicU64],
    ) -> Entry<'a> {
        debug_assert_eq!(w.len(), g.entry_words);
        Entry { w, g, all }
    }

    /// The home word of the keys whose home is this entry.
    pub(crate) fn reach(&self) -> &'a AtomicU64 {
        &self.w[REACH]
    }

    /// The hash of the key the entry holds (`Some(None)`: none), read as a reader would:
    /// `None` if the entry is mid-write or out of use, or changed while it was read.
    pub(crate) fn stable_hash(&self) -> Option<Option<u64>> {
        let s1 = self.w[SEQ].load(Ordering::Acquire);
        if Seq(s1).state() != STABLE {
            return None;
        }
        let meta = Meta(self.w[META].load(Ordering::Relaxed));
        let hash = self.w[HASH].load(Ordering::Relaxed);
        self.validate(s1).then_some(meta.is_used().then_some(hash))
    }

    /// The LRU stamp of the entry's last use (see [`recency`](super::recency)): the
    /// least is the least recently used.
    pub(crate) fn used_at(&self) -> u64 {
        self.w[USED_AT].load(Ordering::Relaxed)
    }

    /// Marks the entry used, with `stamp`: skips the store (and the cache-line write)
    /// unless it ranks the entry later, or the entry's stamp is from the future (damage,
    /// which would keep the key from ever being evicted).
    pub(crate) fn touch(&self, stamp: u64) {
        let old = self.w[USED_AT].load(Ordering::Relaxed);
        if old < stamp || recency::from_the_future(old, stamp) {
            self.w[USED_AT].store(stamp, Ordering::Relaxed);
        }
    }

    /// Reads the entry if it holds `key`: lock-free, safe against any concurrent writer.
    /// The lengths come from the file, so they are clamped before use.
    #[inline(always)]
    pub(crate) fn read(&self, key: &PackedKey, value: Out<'_>) -> Look {
        let s1 = self.w[SEQ].load(Ordering::Acquire);
        match Seq(s1).state() {
            STABLE => {}
            WRITING => return Look::Busy,
            _ => return Look::Parked,
        }
        let look = self.peek(key, value);
        if self.validate(s1) {
            look
        } else {
            Look::Changed
        }
    }

    /// The elements of `key`'s list if the entry keeps it in the heap (its eighth word
    /// counts them), lock-free like [`read`](Self::read): `Found` with `Some(count)`, or with
    /// `None` for any other value (a list in the entry itself is short: its reader walks
    /// it).
    pub(crate) fn read_count(&self, key: &PackedKey) -> (Look, Option<u32>) {
        let s1 = self.w[SEQ].load(Ordering::Acquire);
        match Seq(s1).state() {
            STABLE => {}
            WRITING => return (Look::Busy, None),
            _ => return (Look::Parked, None),
        }
        let look = self.peek(key, None);
        let meta = Meta(self.w[META].load(Ordering::Relaxed));
        let count = (meta.in_heap() && meta.kind() == Kind::List)
            .then(|| self.w[COUNT].load(Ordering::Relaxed) as u32);
        if self.validate(s1) {
            (look, count)
        } else {
            (Look::Changed, None)
        }
    }

    /// The reads between the two loads of `seq` (or of the journal's word, for the undo
    /// copy). Their results mean nothing until validated: they may mix two writes.
    /// The value's bytes go to `value` (replacing what it held), when it is given.
    #[inline(always)]
    pub(crate) fn peek(&self, key: &PackedKey, value: Out<'_>) -> Look {
        let meta = Meta(self.w[META].load(Ordering::Relaxed));
        if !meta.is_used() {
            return Look::Free;
        }
        if meta.key_len() != key.len || self.w[HASH].load(Ordering::Relaxed) != key.hash {
            return Look::Other;
        }
        if !key.matches(&self.w[HEAD_WORDS..]) {
            return Look::Other;
        }
        let deadline = self.w[DEADLINE].load(Ordering::Relaxed);
        let flags = self.w[FLAGS].load(Ordering::Relaxed) as u32;
        if let Some(out) = value {
            let at = self.g.value_at();
            if meta.in_heap() {
                let (first, skip) = chain_parts(self.w[at].load(Ordering::Relaxed));
                let chain = Chain {
                    first,
                    len: meta.value_len().min(self.g.max_heap),
                    owner: key.hash as u32,
                    skip,
                };
                if self.g.heap(self.all).read(chain, out).is_err() {
                    return Look::Damaged; // moved on under us, unless `seq` did not
                }
            } else {
                let len = meta.value_len().min(self.g.max_value);
                copy_words(&self.w[at..], len, out);
            }
        }
        Look::Found(Copied {
            kind: meta.kind(),
            flags,
            deadline,
        })
    }

    /// Whether nothing was written since `seq` read `s1`.
    #[inline]
    fn validate(&self, s1: u64) -> bool {
        if broken(Broken::Protocol) {
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
        match Seq(s1).state() {
            STABLE => {}
            WRITING => return Err(Look::Busy),
            _ => return Ok(None),
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

    /// Bytes of key and value the entry holds (a snapshot, for the counters).
    pub(crate) fn stored_bytes(&self) -> u64 {
        let meta = Meta(self.w[META].load(Ordering::Relaxed));
        if meta.is_used() {
            (meta.key_len().min(self.g.max_key) + self.value_len(meta)) as u64
        } else {
            0
        }
    }

    /// The value's length, within the limits of where it is kept.
    fn value_len(&self, meta: Meta) -> usize {
        meta.value_len().min(self.room(meta))
    }

    /// The longest value where `meta` says the value is kept: the heap, or the entry.
    fn room(&self, meta: Meta) -> usize {
        if meta.in_heap() {
            self.g.max_heap
        } else {
            self.g.max_value
        }
    }

    /// The heap chain the entry names, if it holds a value kept in the heap. Exact for a
    /// caller that holds the writer lock and has cleaned the entry; for a sweep, any
    /// entry's (a damaged or half-written one's names garbage, which only keeps blocks
    /// taken).
    pub(crate) fn heap_value(&self) -> Option<Chain> {
        let meta = Meta(self.w[META].load(Ordering::Relaxed));
        (meta.is_used() && meta.in_heap()).then(|| {
            let (first, skip) = chain_parts(self.w[self.g.value_at()].load(Ordering::Relaxed));
            Chain {
                first,
                len: self.value_len(meta),
                owner: self.w[HASH].load(Ordering::Relaxed) as u32,
                skip,
            }
        })
    }

    /// The elements of the list the entry keeps in the heap, as the entry counts them.
    /// Exact for a caller that holds the writer lock.
    pub(crate) fn heap_count(&self) -> u32 {
        self.w[COUNT].load(Ordering::Relaxed) as u32
    }

    /// Whether the entry holds a list. Exact for a caller that holds the writer lock.
    pub(crate) fn is_list(&self) -> bool {
        let meta = Meta(self.w[META].load(Ordering::Relaxed));
        meta.is_used() && meta.kind() == Kind::List
    }

    /// The hash of the key held (meaningful with a used entry).
    pub(crate) fn hash(&self) -> u64 {
        self.w[HASH].load(Ordering::Relaxed)
    }

    /// Whether the entry holds a key. Exact for a caller that holds the writer lock.
    pub(crate) fn is_used(&self) -> bool {
        Meta(self.w[META].load(Ordering::Relaxed)).is_used()
    }

    /// The deadline of the entry. Exact for a caller that holds the writer lock.
    pub(crate) fn deadline(&self) -> u64 {
        self.w[DEADLINE].load(Ordering::Relaxed)
    }

    /// Whether the entry is stable (not being written, not quarantined). Exact for a
    /// caller that holds the writer lock and has cleaned it.
    pub(crate) fn is_stable(&self) -> bool {
        Seq(self.w[SEQ].load(Ordering::Acquire)).state() == STABLE
    }

    /// Whether the lengths in the meta word fit the dict's limits (or the entry is free):
    /// not so only in a damaged file.
    pub(crate) fn lengths_fit(&self) -> bool {
        let m = Meta(self.w[META].load(Ordering::Relaxed));
        !m.is_used() || (m.key_len() <= self.g.max_key && m.value_len() <= self.room(m))
    }

    /// The `seq` word now.
    pub(crate) fn seq(&self) -> u64 {
        self.w[SEQ].load(Ordering::Acquire)
    }

    /// The `seq` word, for a validation after an acquire fence.
    pub(crate) fn seq_relaxed(&self) -> u64 {
        self.w[SEQ].load(Ordering::Relaxed)
    }

    /// Marks the entry, whose `seq` word is `seq` (a dead writer's), as being written by
    /// `w`: the start of a write-back. The marked word, or `None` if it moved.
    pub(crate) fn mark_write_back(&self, w: &Writing<'_>, seq: u64) -> Option<u64> {
        let mine = Seq::new(WRITING, Seq(seq).count() + 1, w.owner());
        self.w[SEQ]
            .compare_exchange(seq, mine.0, Ordering::AcqRel, Ordering::Relaxed)
            .ok()?;
        // Orders the mark before the copy's stores (see `validate`).
        fence(Ordering::Release);
        crash_point();
        Some(mine.0)
    }

    /// Ends a write-back begun with [`mark_write_back`](Self::mark_write_back): `true` if
    /// the entry is stable again (not quarantined meanwhile).
    pub(crate) fn end_write_back(&self, mine: u64) -> bool {
        self.finish(Seq(mine))
    }

    /// Whether `seq` is a stable word of count `count` (modulo the count's width).
    pub(crate) fn seq_count_is(&self, seq: u64, count: u64) -> bool {
        let s = Seq(seq);
        s.state() == STABLE && s.count() == count & COUNT_MASK
    }

    /// Moves a stable entry's `seq` word on by two counts, its contents untouched, if it
    /// still reads `stable`: a write that was to begin from `stable` (its undo copy made,
    /// its writer taken over before it marked the entry) now never can. Caller holds the
    /// writer lock.
    pub(crate) fn skip_write(&self, stable: u64) -> bool {
        let s = Seq(stable);
        let next = Seq::new(STABLE, s.count() + 2, OwnerId::from_bits(0));
        let done = s.state() == STABLE
            && self.w[SEQ]
                .compare_exchange(s.0, next.0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok();
        crash_point();
        done
    }

    /// Copies what the entry holds (kind, lengths, hash, deadline, flags, a heap list's
    /// count, key and value)
    /// into `dst`, an entry of the same geometry: the undo copy and its write-back, with
    /// the LRU stamp (an interrupted write leaves the key its previous value's rank). The
    /// home words (`reach`) stay where they are. Caller holds the writer lock and has
    /// marked `dst` (or holds the journal's FILLING word).
    pub(crate) fn copy_to(&self, dst: &Entry<'_>) {
        let meta = Meta(self.w[META].load(Ordering::Relaxed));
        for word in [META, HASH, DEADLINE, FLAGS, USED_AT, COUNT] {
            dst.w[word].store(self.w[word].load(Ordering::Relaxed), Ordering::Relaxed);
        }
        let key = HEAD_WORDS..HEAD_WORDS + words_for(meta.key_len().min(self.g.max_key));
        let at = self.g.value_at();
        let value_words = if meta.in_heap() {
            1 // the chain's first block: the chain stays where it is
        } else {
            words_for(meta.value_len().min(self.g.max_value))
        };
        // (two loops over slices, not one over a chain of ranges: a chained range checks
        // which half it is in and indexes both entries at every word)
        for range in [key, at..at + value_words] {
            for (d, s) in dst.w[range.clone()].iter().zip(&self.w[range]) {
                d.store(s.load(Ordering::Relaxed), Ordering::Relaxed);
                crash_point();
            }
        }
    }

    /// Runs one write: `seq` STABLE → WRITING (with our owner id), a check that the lock
    /// is still ours, the writes, WRITING → STABLE. With `keep`, an entry that holds a
    /// value is first copied into the journal, and the copy dropped once the entry is
    /// stable again. Caller holds the writer lock.
    fn write(
        &self,
        w: &Writing<'_>,
        keep: Option<&dyn Undo>,
        body: impl FnOnce(&[AtomicU64]),
    ) -> Result<(), Aborted> {
        // Acquire: an undo copy made from here on sees the write that left `s`.
        let s = Seq(self.w[SEQ].load(Ordering::Acquire));
        if s.state() != STABLE {
            return Err(Aborted::NotStable);
        }
        let writing = Seq::new(WRITING, s.count() + 1, w.owner());
        let kept = match keep {
            Some(undo) => undo.keep(w, self, s.0, writing.0)?,
            None => None,
        };
        let drop_kept = |kept: Option<Kept>| {
            if let (Some(undo), Some(kept)) = (keep, kept) {
                undo.drop_kept(kept);
            }
        };
        if self.w[SEQ]
            .compare_exchange(s.0, writing.0, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            drop_kept(kept);
            return Err(Aborted::NotStable);
        }
        // Orders the marked `seq` before every write that follows (see `validate`).
        fence(Ordering::Release);
        crash_point();
        if !w.still_mine() {
            // Taken over before we wrote anything: the entry is as it was (or quarantined,
            // and then the copy is the taker's to deal with).
            if self.finish(writing) {
                drop_kept(kept);
            }
            return Err(Aborted::TakenOver);
        }
        crash_point();
        body(self.w);
        if self.finish(writing) {
            drop_kept(kept);
            Ok(())
        } else {
            Err(Aborted::TakenOver)
        }
    }

    /// Ends our write: WRITING → STABLE, or, if whoever took the lock over quarantined the
    /// entry meanwhile, QUARANTINED → DONE (we write no more). `true` for the former.
    fn finish(&self, writing: Seq) -> bool {
        let ok = self.w[SEQ]
            .compare_exchange(
                writing.0,
                writing.settled().0,
                Ordering::Release,
                Ordering::Relaxed,
            )
            .is_ok();
        if !ok {
            let _ = self.w[SEQ].compare_exchange(
                writing.with_state(QUARANTINED).0,
                writing.with_state(DONE).0,
                Ordering::Release,
                Ordering::Relaxed,
            );
        }
        crash_point();
        ok
    }

    /// Stores `key` with its value. Caller holds the writer lock and has checked lengths.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn store(
        &self,
        w: &Writing<'_>,
        keep: Option<&dyn Undo>,
        key: &PackedKey,
        kind: Kind,
        value: ValueAt<'_>,
        flags: u32,
        deadline: u64,
        stamp: u64,
    ) -> Result<(), Aborted> {
        let (meta_word, inline) = match value {
            ValueAt::Inline(bytes) => {
                debug_assert!(bytes.len() <= self.g.max_value);
                (Meta::used(kind, key.len, bytes.len()).0, bytes)
            }
            ValueAt::Heap { len, .. } => {
                debug_assert!(len <= self.g.max_heap);
                (Meta::used(kind, key.len, len).0 | IN_HEAP, &[][..])
            }
        };
        debug_assert!(key.len <= self.g.max_key);
        let at = self.g.value_at();
        // Only the key's own value is worth keeping: an entry given to another key (an
        // eviction, an expired entry reused) is gone either way.
        let meta = Meta(self.w[META].load(Ordering::Relaxed));
        let same_key = meta.is_used()
            && meta.key_len() == key.len
            && self.w[HASH].load(Ordering::Relaxed) == key.hash;
        let keep = keep.filter(|_| same_key);
        self.write(w, keep, |w| {
            w[META].store(meta_word, Ordering::Relaxed);
            crash_point();
            w[HASH].store(key.hash, Ordering::Relaxed);
            w[DEADLINE].store(deadline, Ordering::Relaxed);
            w[FLAGS].store(u64::from(flags), Ordering::Relaxed);
            // (inside the write: a writer stopped after it has the key's rank or none, and
            // one taken over writes its rank into a quarantined entry, as its other words)
            w[USED_AT].store(stamp, Ordering::Relaxed);
            store_packed(&w[HEAD_WORDS..], key.key, || {});
            if let ValueAt::Heap {
                first, skip, count, ..
            } = value
            {
                w[at].store(chain_word(first, skip), Ordering::Relaxed);
                w[COUNT].store(u64::from(count), Ordering::Relaxed);
            }
            store_packed(&w[at..], inline, crash_point);
        })?;
        Ok(())
    }

    /// Moves the deadline of the entry. Caller holds the writer lock.
    pub(crate) fn set_deadline(
        &self,
        w: &Writing<'_>,
        keep: Option<&dyn Undo>,
        deadline: u64,
    ) -> Result<(), Aborted> {
        let keep = keep.filter(|_| self.is_used());
        self.write(w, keep, |e| e[DEADLINE].store(deadline, Ordering::Relaxed))
    }

    /// Empties the entry. Caller holds the writer lock. With `keep`, the value is copied
    /// first, so that a deleter taken over (which reports `Stalled`: not done) leaves it.
    pub(crate) fn free(&self, w: &Writing<'_>, keep: Option<&dyn Undo>) -> Result<(), Aborted> {
        let keep = keep.filter(|_| self.is_used());
        self.write(w, keep, |e| e[META].store(Meta::FREE.0, Ordering::Relaxed))
    }

    /// Deals with a write this holder of the lock did not start (its writer was taken
    /// over): quarantines the entry if that writer may still write; if the writer is dead
    /// or done, writes the undo copy back when it covers that write (`keep`), else empties
    /// the entry. Caller holds the writer lock `w`.
    ///
    /// Writing back and emptying are themselves writes under our own mark (a CAS to
    /// WRITING by us first), so a cleaner that is taken over in the middle touches only
    /// the entry it marked, never one its successor has filled since.
    pub(crate) fn clean(
        &self,
        w: &Writing<'_>,
        is_dead: impl Fn(OwnerId) -> bool,
        keep: Option<&dyn Undo>,
    ) -> Cleaned {
        let mut emptied = 0;
        loop {
            let s = Seq(self.w[SEQ].load(Ordering::Acquire));
            let covered = keep.is_some_and(|undo| undo.covers(s.0));
            match s.state() {
                STABLE => {
                    return Cleaned {
                        usable: true,
                        emptied,
                        orphan: false,
                    }
                }
                WRITING if !is_dead(s.owner()) => {
                    // A cleaner that lost the lock (it stalled, and resumed) must not
                    // quarantine the write of the one that holds it now.
                    if !w.still_mine() {
                        return Cleaned {
                            usable: false,
                            emptied,
                            orphan: false,
                        };
                    }
                    let _ = self.w[SEQ].compare_exchange(
                        s.0,
                        s.with_state(QUARANTINED).0,
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    );
                    crash_point();
                }
                QUARANTINED if !is_dead(s.owner()) => {
                    return Cleaned {
                        usable: false,
                        emptied,
                        orphan: covered,
                    }
                }
                // A dead writer's, with the value it was rewriting in the copy: back.
                WRITING if covered => {
                    if let Some(undo) = keep {
                        undo.write_back(w, self, s.0);
                    }
                }
                // Out of use, its writer dead or done, its key's value in the copy: the
                // caller stores that elsewhere first (the key may have been given another
                // entry since the quarantine).
                _ if covered => {
                    return Cleaned {
                        usable: false,
                        emptied,
                        orphan: true,
                    }
                }
                // A dead writer's, or one that is done: nobody writes here any more.
                _ => {
                    let mine = Seq::new(WRITING, s.count() + 1, w.owner());
                    if self.w[SEQ]
                        .compare_exchange(s.0, mine.0, Ordering::AcqRel, Ordering::Relaxed)
                        .is_err()
                    {
                        continue;
                    }
                    fence(Ordering::Release);
                    crash_point();
                    let was_used = self.is_used();
                    self.w[META].store(Meta::FREE.0, Ordering::Relaxed);
                    crash_point();
                    if self.finish(mine) {
                        emptied += u64::from(was_used);
                    }
                }
            }
        }
    }
}

/// Where an entry's value is copied before it is rewritten, and from where it comes back
/// (the dict's undo copies: `journal.rs`).
pub(crate) trait Undo {
    /// Copies `entry` (stable at `seq` word `stable`) before `w` rewrites it with the `seq`
    /// word `writing`: `Ok(None)` when no copy is free (the write goes without one).
    /// Caller holds the writer lock.
    fn keep(
        &self,
        w: &Writing<'_>,
        entry: &Entry<'_>,
        stable: u64,
        writing: u64,
    ) -> Result<Option<Kept>, Aborted>;
    /// Drops a copy whose write is over (made, or not begun).
    fn drop_kept(&self, kept: Kept);
    /// Whether a copy is the entry's value before the write whose `seq` word it holds.
    fn covers(&self, seq: u64) -> bool;
    /// Writes the copy that covers the entry's write `seq` (its writer dead) back into it,
    /// as a write of `w`'s own.
    fn write_back(&self, w: &Writing<'_>, entry: &Entry<'_>, seq: u64);
}

/// A copy made for one write: which copy, and its word.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Kept {
    pub copy: usize,
    pub word: u64,
}

/// What [`Entry::clean`] came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Cleaned {
    /// The entry is stable: usable.
    pub usable: bool,
    /// Used entries it emptied (0 or 1).
    pub emptied: u64,
    /// The entry is out of use and the undo copy holds its key's value: store the copy
    /// elsewhere (then clean again).
    pub orphan: bool,
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::super::writer::{WriterEnv, WriterLock};
    use super::*;
    use crate::shm::primitive::AtomicU32;

    fn entry_words(g: &Geometry) -> Vec<AtomicU64> {
        (0..g.entry_words).map(|_| AtomicU64::new(0)).collect()
    }

    #[test]
    fn stored_words_are_the_bytes_little_endian_zero_padded() {
        let bytes: Vec<u8> = (0..40u8)
            .map(|b| b.wrapping_mul(37).wrapping_add(11))
            .collect();
        for len in 0..=bytes.len() {
            let b = &bytes[..len];
            let want: Vec<u64> = b
                .chunks(8)
                .map(|c| {
                    let mut w = [0u8; 8];
                    w[..c.len()].copy_from_slice(c);
                    u64::from_le_bytes(w)
                })
                .collect();
            // stored over words that held something (one more than the bytes fill: kept)
            let stored: Vec<AtomicU64> = (0..=want.len()).map(|_| AtomicU64::new(!0)).collect();
            let calls = std::cell::Cell::new(0);
            store_packed(&stored, b, || calls.set(calls.get() + 1));
            let mut got: Vec<u64> = stored.iter().map(|w| w.load(Ordering::Relaxed)).collect();
            assert_eq!(got.pop(), Some(!0), "{len} bytes: a word past them written");
            assert_eq!(
                (got, calls.get()),
                (want.clone(), want.len()),
                "{len} bytes"
            );
            let words: Vec<AtomicU64> = want.iter().map(|&w| AtomicU64::new(w)).collect();
            assert!(PackedKey::new(b, 0).matches(&words), "{len} bytes");
            if let Some(last) = words.last() {
                last.fetch_xor(1 << 7, Ordering::Relaxed);
                assert!(
                    !PackedKey::new(b, 0).matches(&words),
                    "{len} bytes, last changed"
                );
            }
        }
    }

    /// One writer, never taken over; `dead` says who is dead.
    struct Env {
        me: OwnerId,
    }

    impl WriterEnv for Env {
        fn owner(&self) -> OwnerId {
            self.me
        }
        fn is_dead(&self, _: OwnerId) -> bool {
            false
        }
        fn stalled(&self, _: u64) -> bool {
            false
        }
        fn sleep(&self, _: &AtomicU32, _: u32) {}
    }

    /// Runs `f` holding a writer lock of its own as owner `me`.
    fn locked<R>(me: OwnerId, f: impl FnOnce(&Writing<'_>) -> R) -> R {
        let (word, wait, turn) = (AtomicU64::new(0), AtomicU32::new(0), AtomicU32::new(0));
        let (w, took_over) = WriterLock {
            word: &word,
            wait: &wait,
            turn: &turn,
        }
        .lock(&Env { me });
        assert!(!took_over);
        f(&w)
    }

    const ME: OwnerId = OwnerId::UNKNOWN;

    fn cleaned(usable: bool, emptied: u64) -> Cleaned {
        Cleaned {
            usable,
            emptied,
            orphan: false,
        }
    }

    #[test]
    fn stores_reads_and_frees() {
        let g = Geometry::new(16, 12, 20);
        let words = entry_words(&g);
        let e = Entry::new(&words, &g);
        let k = PackedKey::new(b"user:42 long", 7);
        assert_eq!(e.read(&k, None), Look::Free);
        locked(ME, |w| {
            e.store(
                w,
                None,
                &k,
                Kind::Bytes,
                ValueAt::Inline(b"twenty bytes of data"),
                5,
                99,
                1,
            )
        })
        .unwrap();
        let mut value = vec![1, 2, 3];
        let Look::Found(c) = e.read(&k, Some(&mut value)) else {
            panic!("not found")
        };
        assert_eq!(
            c,
            Copied {
                kind: Kind::Bytes,
                flags: 5,
                deadline: 99,
            }
        );
        assert_eq!(value, b"twenty bytes of data");
        assert_eq!(e.read_key(), Ok(Some((b"user:42 long".to_vec(), 99))));
        // same hash and length, other bytes: another key
        assert_eq!(
            e.read(&PackedKey::new(b"user:42 lonG", 7), None),
            Look::Other
        );
        locked(ME, |w| e.free(w, None)).unwrap();
        assert_eq!(e.read(&k, None), Look::Free);
        assert_eq!(
            Seq(words[SEQ].load(Ordering::Relaxed)),
            Seq::new(STABLE, 4, OwnerId::from_bits(0))
        );
    }

    #[test]
    fn an_interrupted_write_is_busy_then_quarantined_or_emptied() {
        let g = Geometry::new(16, 8, 8);
        let words = entry_words(&g);
        let e = Entry::new(&words, &g);
        let k = PackedKey::new(b"k", 1);
        locked(ME, |w| {
            e.store(
                w,
                None,
                &k,
                Kind::Int,
                ValueAt::Inline(&5i64.to_le_bytes()),
                0,
                u64::MAX,
                1,
            )
        })
        .unwrap();
        let stale = OwnerId::new(3, 1);
        // a writer (owner 3) was here when it was taken over
        let writing = Seq::new(WRITING, 3, stale);
        words[SEQ].store(writing.0, Ordering::Relaxed);
        assert_eq!(e.read(&k, None), Look::Busy);
        // alive: quarantined, absent, out of use
        assert_eq!(
            locked(ME, |w| e.clean(w, |_| false, None)),
            cleaned(false, 0)
        );
        assert_eq!(e.read(&k, None), Look::Parked);
        assert!(!e.is_stable());
        // it resumes and ends its write: the CAS fails, it says it is done
        assert!(!e.finish(writing));
        assert_eq!(
            locked(ME, |w| e.clean(w, |_| false, None)),
            cleaned(true, 1)
        );
        assert_eq!(e.read(&k, None), Look::Free);
        assert!(e.is_stable() && !e.is_used());
        // a dead writer's entry is emptied at once
        locked(ME, |w| {
            e.store(
                w,
                None,
                &k,
                Kind::Int,
                ValueAt::Inline(&5i64.to_le_bytes()),
                0,
                u64::MAX,
                1,
            )
        })
        .unwrap();
        let s = Seq(words[SEQ].load(Ordering::Relaxed));
        words[SEQ].store(Seq::new(WRITING, s.count() + 1, stale).0, Ordering::Relaxed);
        assert_eq!(
            locked(ME, |w| e.clean(w, |o| o == stale, None)),
            cleaned(true, 1)
        );
        assert_eq!(e.read(&k, None), Look::Free);
    }

    #[test]
    fn a_writer_taken_over_before_it_wrote_leaves_the_entry_as_it_was() {
        let g = Geometry::new(16, 8, 8);
        let words = entry_words(&g);
        let e = Entry::new(&words, &g);
        let k = PackedKey::new(b"k", 1);
        let (word, wait, turn) = (AtomicU64::new(0), AtomicU32::new(0), AtomicU32::new(0));
        let lock = WriterLock {
            word: &word,
            wait: &wait,
            turn: &turn,
        };
        let (w, _) = lock.lock(&Env { me: ME });
        e.store(
            &w,
            None,
            &k,
            Kind::Int,
            ValueAt::Inline(&5i64.to_le_bytes()),
            0,
            u64::MAX,
            1,
        )
        .unwrap();
        // someone takes the lock over (the word changes under us)
        word.fetch_add(1 << 26, Ordering::SeqCst);
        assert_eq!(
            e.store(
                &w,
                None,
                &k,
                Kind::Int,
                ValueAt::Inline(&6i64.to_le_bytes()),
                0,
                u64::MAX,
                1
            ),
            Err(Aborted::TakenOver)
        );
        let mut value = Vec::new();
        assert!(matches!(e.read(&k, Some(&mut value)), Look::Found(_)));
        assert_eq!(value, 5i64.to_le_bytes());
        assert!(w.release().is_err());
    }

    #[test]
    fn hostile_lengths_never_read_past_the_entry() {
        let g = Geometry::new(16, 8, 8);
        let words = entry_words(&g);
        let e = Entry::new(&words, &g);
        words[META].store(u64::MAX, Ordering::Relaxed);
        assert_eq!(e.read_key().unwrap().unwrap().0.len(), 8);
        words[META].store(
            Meta::used(Kind::Bytes, 1, u32::MAX as usize).0,
            Ordering::Relaxed,
        );
        words[HASH].store(3, Ordering::Relaxed);
        words[HEAD_WORDS].store(u64::from(b'k'), Ordering::Relaxed);
        let mut value = Vec::new();
        let look = e.read(&PackedKey::new(b"k", 3), Some(&mut value));
        assert!(matches!(look, Look::Found(_)));
        assert_eq!(value.len(), 8);
    }
}
