//! One entry of the lock table: its hot line, its cold line and its control word.
//!
//! The hot slot is one cache line: everything the claim path reads and writes (control
//! word, key hash, deadline, lease) and the per-home words (`fence`, the overflow of
//! `reach`) that belong to the keys whose home is this slot, whatever the slot
//! itself holds. An uncontended lock and unlock of a key at its home touch this one line.
//! What only inspection reads (key preview, fencing token shown) lives in a cold slot of
//! a side array, written when a key first moves into the slot and when a token is taken,
//! with the mark waiters leave on an entry that stands still.
//!
//! Every field is atomic: other processes read and write the same memory.

use crate::shm::primitive::{AtomicU32, AtomicU64, Ordering};
use crate::shm::registry::OwnerId;

/// Bytes of the key kept for inspection.
pub(crate) const PREVIEW_LEN: usize = 32;
const PREVIEW_WORDS: usize = PREVIEW_LEN / 8;

/// A lock-table entry's hot line. See the module docs of [`crate::shm::table`] for the protocol.
#[repr(C, align(64))]
#[derive(Default)]
pub(crate) struct Slot {
    /// The [`Word`] that decides who owns the slot.
    pub control: AtomicU64,
    /// 128-bit seeded xxh3 of the key held (valid in HELD and EXTENDING).
    pub hash_lo: AtomicU64,
    pub hash_hi: AtomicU64,
    /// Lease deadline on the table clock (ns); `u64::MAX` = never expires.
    pub deadline: AtomicU64,
    /// The holding thread's id within its process, so a holder tells its own holds from
    /// those of its process's other threads, even across a `gen` wrap.
    pub lease: AtomicU64,
    /// When the current hold began (table clock, ns): for inspection, but free to write
    /// here, in the line the claim writes anyway.
    pub acquired_at: AtomicU64,
    /// Home word: the claim count of the keys whose home is this slot, counted by every
    /// claim that scans (see `table/claim.rs`), and their fencing counter.
    pub fence: AtomicU64,
    /// Home word: the reach of this home when it does not fit the control word's 4 bits.
    pub reach: AtomicU32,
    /// A shared entry's limit (valid with `hash_*`): 0 for a read hold, N for one of a
    /// semaphore's N permits. Meaningless in an exclusive entry (left as it was).
    pub limit: AtomicU32,
}

/// What only inspection reads of a slot.
#[repr(C, align(64))]
#[derive(Default)]
pub(crate) struct Cold {
    /// Fencing token of the hold whose lease id is in `token_of` (shown only while that
    /// hold is the slot's).
    pub token: AtomicU64,
    pub token_of: AtomicU64,
    /// Full length of the key whose preview this is.
    pub key_len: AtomicU64,
    /// Written by waiters, never by the slot's owner: which transitional word (hash of it)
    /// was first seen here and when (table clock, ms), so that any process can tell how
    /// long a claim or renewal has stood still (see `Env::stalled`).
    pub seen: AtomicU64,
    /// The first [`PREVIEW_LEN`] bytes of the key, little-endian packed.
    pub preview: [AtomicU64; PREVIEW_WORDS],
}

#[cfg(not(loom))]
const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(size_of::<Slot>() == crate::shm::format::SLOT_SIZE);
    assert!(size_of::<Cold>() == crate::shm::format::COLD_SIZE);
    assert!(align_of::<Slot>() == 64 && align_of::<Cold>() == 64);
    assert!(offset_of!(Slot, control) == 0);
    assert!(offset_of!(Slot, reach) == 56);
    assert!(offset_of!(Slot, limit) == 60);
    assert!(offset_of!(Cold, preview) == 32);
};

impl Cold {
    /// Asks for this line in a writable state ahead of a [`write_preview`](Self::write_preview):
    /// the claim's locked operations wait for every earlier store to land, and a store to a
    /// line not in the cache would hold them for a whole fetch.
    #[inline(always)]
    pub(crate) fn prefetch_for_write(&self) {
        #[cfg(all(target_arch = "x86_64", not(loom)))]
        // SAFETY: a prefetch is a hint: it reads nothing into the program and faults on no
        // address; `self` is a live line of the mapping anyway.
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_ET0};
            _mm_prefetch::<_MM_HINT_ET0>((self as *const Cold).cast::<i8>());
        }
    }

    /// Copies the key's first bytes into the preview words.
    pub(crate) fn write_preview(&self, key: &[u8]) {
        self.key_len.store(key.len() as u64, Ordering::Relaxed);
        let mut chunks = key.chunks(8);
        for word in &self.preview {
            let mut buf = [0u8; 8];
            if let Some(chunk) = chunks.next() {
                buf[..chunk.len()].copy_from_slice(chunk);
            }
            word.store(u64::from_le_bytes(buf), Ordering::Relaxed);
        }
    }

    /// Reads the preview back: at most [`PREVIEW_LEN`] bytes, however long the key was.
    /// The length comes from the file, so it is clamped before use.
    pub(crate) fn read_preview(&self) -> (u64, Vec<u8>) {
        let len = self.key_len.load(Ordering::Relaxed);
        let shown = (len.min(PREVIEW_LEN as u64)) as usize;
        let mut out = Vec::with_capacity(PREVIEW_LEN);
        for word in &self.preview {
            out.extend_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
        }
        out.truncate(shown);
        (len, out)
    }
}

/// Slot states (the low three bits of a [`Word`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// Nobody owns the slot.
    Free = 0,
    /// A claimer owns the slot, is writing its fields and checking that its key has no
    /// other entry.
    Claiming = 1,
    /// The key is held.
    Held = 2,
    /// The holder is moving its deadline; the entry is held and not stealable by expiry.
    Extending = 3,
    /// A claim or an extension that stalled past the bound, broken by someone else: no
    /// longer an entry of its key, but its owner may still write the fields, so the slot
    /// stays out of use until the owner backs out or dies.
    Broken = 4,
    /// A HELD entry someone found expired (or its owner dead), frozen while that is
    /// checked again: then FREE, or HELD exactly as it was. The word is the HELD one with
    /// only the state changed, so the holder's own word comes back if the hold stays.
    Stealing = 5,
    /// A shared hold its owner released with nobody waiting, kept for the owner to take
    /// again with one CAS (see `table/idle.rs`): no hold, and anyone's to take back. A
    /// claim of the key that a reader must not stand beside (a writer, a permit) frees it
    /// first; any other claim may claim it as it would a free slot.
    Idle = 6,
}

/// The control word of a slot:
///
/// ```text
///  63   61 60        39 38    32 31                 9   8    7     4    3      2   0
/// +-------+------------+--------+--------------------+----+----------+-------+-------+
/// |gen hi |  owner (22)|mark (7)|    gen low (23)    | ww | reach (4)|waiters| state |
/// +-------+------------+--------+--------------------+----+----------+-------+-------+
///
///  mark: bit 38 shared, bit 37 permit, bits 32-36 tag (5); ww: writer waits
/// ```
///
/// * `gen` (26 bits: 23 low, 3 high) grows on every transition of the entry, so a CAS from
///   a value read earlier fails if anything happened in between.
/// * `owner` is the [`OwnerId`] (registry entry and generation) of the process that owns a
///   CLAIMING, HELD, EXTENDING or BROKEN entry.
/// * `reach` belongs to the slot as a *home*, not to its entry: the greatest distance from
///   here at which a key of this home was ever placed (15: see [`Slot::reach`]). Keeping
///   it in the home's control word makes raising it and claiming the home one location,
///   so a claim at home and a raise are ordered by the word itself. It survives every
///   transition of the entry.
/// * `tag` is 5 bits of the key hash, so a scanner can skip most foreign entries without
///   reading their hash, and recognise a CLAIMING entry whose hash may not be written yet.
/// * `shared` marks an entry of a shared hold (a reader, or one permit of a semaphore)
///   from its claim on; the other entries are exclusive. Two shared entries of one key may
///   stand side by side; an exclusive one stands alone. `permit` tells a semaphore's
///   permit (whose count is in [`Slot::limit`]) from a reader, also while it is claimed.
/// * `ww` (writer waits) is set on a shared hold by a writer waiting for it to end: new
///   shared claims of the key defer to it (writer preference). On an exclusive hold it
///   is set by readers waiting for it ([`READERS_WAIT`]): its release keeps the key for
///   them (see `table/idle.rs`). Like the waiters bit it is
///   not part of the entry's identity (which is then masked by one sign-extended 32-bit
///   immediate, as it was before shared holds), a renewal keeps it and a new hold never
///   starts with it.
/// * `waiters` is set by a waiter about to sleep on this word: a futex on its low half,
///   which holds the state, the waiters bit and the generation's low bits, so that any
///   transition of the entry changes it (a waiter late to its sleep is refused it, even
///   if the slot holds another hold of the same tag and owner by then). Whoever moves a
///   flagged entry off its key wakes them; a renewal or a check that keeps the hold keeps
///   the bit.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Word(pub u64);

const STATE_MASK: u64 = 0b111;
pub(crate) const WAITERS: u64 = 1 << 3;
const REACH_SHIFT: u32 = 4;
const REACH_MASK: u64 = 0xf << REACH_SHIFT;
/// A reach this large or more is kept in [`Slot::reach`].
pub(crate) const REACH_OVERFLOW: u32 = 15;
pub(crate) const WRITER_WAITS: u64 = 1 << 8;
/// The same bit on an exclusive hold: readers wait for it.
pub(crate) const READERS_WAIT: u64 = WRITER_WAITS;
const GEN_LOW_SHIFT: u32 = 9;
const GEN_LOW_BITS: u32 = 23;
const GEN_LOW_MASK: u64 = (1 << GEN_LOW_BITS) - 1;
const TAG_SHIFT: u32 = 32;
const TAG_MASK: u64 = 0x1f;
/// The mark: tag, permit and shared bits, carried together by [`Word::next`].
const MARK_MASK: u64 = 0x7f;
pub(crate) const PERMIT: u64 = 1 << 37;
pub(crate) const SHARED: u64 = 1 << 38;
const OWNER_SHIFT: u32 = 39;
const OWNER_MASK: u64 = (1 << 22) - 1;
const GEN_HIGH_SHIFT: u32 = 61;
const GEN_MASK: u64 = (1 << 26) - 1;

impl Word {
    /// An entry word; `reach` is carried over from the word it replaces. `mark` is the
    /// tag with the permit and shared bits ([`Word::mark`]).
    pub(crate) fn new(state: State, mark: u8, owner: OwnerId, gen: u64, reach: Word) -> Word {
        let gen = gen & GEN_MASK;
        Word(
            state as u64
                | (reach.0 & REACH_MASK)
                | ((gen & GEN_LOW_MASK) << GEN_LOW_SHIFT)
                | ((u64::from(mark) & MARK_MASK) << TAG_SHIFT)
                | ((u64::from(owner.bits()) & OWNER_MASK) << OWNER_SHIFT)
                | ((gen >> GEN_LOW_BITS) << GEN_HIGH_SHIFT),
        )
    }

    pub(crate) fn state(self) -> State {
        match self.0 & STATE_MASK {
            0 => State::Free,
            1 => State::Claiming,
            2 => State::Held,
            3 => State::Extending,
            5 => State::Stealing,
            6 => State::Idle,
            // 4, and the values no version writes (a damaged file): nobody's entry, out
            // of use until its owner is seen dead.
            _ => State::Broken,
        }
    }

    pub(crate) fn tag(self) -> u8 {
        ((self.0 >> TAG_SHIFT) & TAG_MASK) as u8
    }

    /// The tag with the permit and shared bits, as [`Word::new`] takes it.
    pub(crate) fn mark(self) -> u8 {
        ((self.0 >> TAG_SHIFT) & MARK_MASK) as u8
    }

    /// The entry is a shared hold (or a claim of one).
    #[inline]
    pub(crate) fn is_shared(self) -> bool {
        self.0 & SHARED != 0
    }

    /// The entry is one of a semaphore's permits (or a claim of one).
    #[inline]
    pub(crate) fn is_permit(self) -> bool {
        self.0 & PERMIT != 0
    }

    /// A writer waits for this shared hold to end.
    #[inline]
    pub(crate) fn writer_waits(self) -> bool {
        self.0 & WRITER_WAITS != 0
    }

    /// Readers wait for this exclusive hold.
    #[inline]
    pub(crate) fn readers_wait(self) -> bool {
        self.0 & (SHARED | READERS_WAIT) == READERS_WAIT
    }

    /// The reach bits (see [`REACH_OVERFLOW`]).
    pub(crate) fn reach(self) -> u32 {
        ((self.0 & REACH_MASK) >> REACH_SHIFT) as u32
    }

    /// The same word with the reach bits set to `r` (at most [`REACH_OVERFLOW`]).
    pub(crate) fn with_reach(self, r: u32) -> Word {
        Word(self.0 & !REACH_MASK | u64::from(r.min(REACH_OVERFLOW)) << REACH_SHIFT)
    }

    pub(crate) fn owner(self) -> OwnerId {
        OwnerId::from_bits(((self.0 >> OWNER_SHIFT) & OWNER_MASK) as u32)
    }

    pub(crate) fn gen(self) -> u64 {
        (self.0 >> GEN_LOW_SHIFT) & GEN_LOW_MASK | (self.0 >> GEN_HIGH_SHIFT) << GEN_LOW_BITS
    }

    pub(crate) fn has_waiters(self) -> bool {
        self.0 & WAITERS != 0
    }

    /// The word without the waiters, writer-waits and reach bits: what identifies one
    /// state of one entry. An owner's transitions are CASes from the word whose ident it
    /// owns.
    pub(crate) fn ident(self) -> u64 {
        self.0 & !(WAITERS | WRITER_WAITS | REACH_MASK)
    }

    /// The same entry one transition later, in `state`, keeping mark, owner and reach.
    pub(crate) fn next(self, state: State) -> Word {
        Word::new(
            state,
            self.mark(),
            self.owner(),
            self.gen().wrapping_add(1),
            self,
        )
    }

    /// The same word in `state`, nothing else changed (the step into and out of
    /// [`State::Stealing`]).
    pub(crate) fn with_state(self, state: State) -> Word {
        Word(self.0 & !STATE_MASK | state as u64)
    }

    /// A free slot one transition later (the reach stays: it is the home's).
    pub(crate) fn freed(self) -> Word {
        Word::new(
            State::Free,
            0,
            OwnerId::from_bits(0),
            self.gen().wrapping_add(1),
            self,
        )
    }
}

impl std::fmt::Debug for Word {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Word")
            .field("state", &self.state())
            .field("waiters", &self.has_waiters())
            .field("tag", &self.tag())
            .field("shared", &self.is_shared())
            .field("writer_waits", &self.writer_waits())
            .field("reach", &self.reach())
            .field("owner", &self.owner())
            .field("gen", &self.gen())
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn word_fields_round_trip() {
        let owner = OwnerId::new(0xfffe, 0x1ab);
        assert_eq!(owner.entry(), 0xfffe);
        let base = Word(0).with_reach(13);
        let w = Word::new(State::Held, 0x1b, owner, GEN_MASK, base);
        assert_eq!(w.state(), State::Held);
        assert_eq!(w.tag(), 0x1b);
        assert!(!w.is_shared());
        let s = Word::new(State::Held, 0x1b | 0x40, owner, 5, base);
        assert!(s.is_shared() && !s.writer_waits() && !s.is_permit());
        assert_eq!(s.tag(), 0x1b);
        assert!(Word::new(State::Claiming, 0x1b | 0x60, owner, 5, base).is_permit());
        assert!(s.next(State::Extending).is_shared());
        let flagged = Word(s.0 | WRITER_WAITS);
        assert!(flagged.writer_waits());
        assert_eq!(flagged.ident(), s.ident());
        assert!(!s.freed().is_shared());
        assert_eq!(w.owner(), owner);
        assert_eq!(w.reach(), 13);
        assert_eq!(w.gen(), GEN_MASK);
        assert!(!w.has_waiters());
        let flagged = Word(w.0 | WAITERS);
        assert!(flagged.has_waiters());
        assert_eq!(flagged.ident(), w.ident());
        assert_eq!(w.with_reach(3).ident(), w.ident());
        // gen wraps instead of spilling into other fields; the reach stays
        let n = w.next(State::Free);
        assert_eq!(n.gen(), 0);
        assert_eq!(n.state(), State::Free);
        assert_eq!(n.reach(), 13);
        assert_eq!(w.freed().reach(), 13);
        assert_eq!(w.freed().owner(), OwnerId::from_bits(0));
        assert_eq!(Word(0).with_reach(1000).reach(), REACH_OVERFLOW);
        // states no version writes are out of use, not free
        assert_eq!(Word(7).state(), State::Broken);
        assert_eq!(Word(6).state(), State::Idle);
        // the generation carries across its two parts
        let low_end = Word::new(State::Held, 1, owner, GEN_LOW_MASK, base);
        assert_eq!(low_end.next(State::Held).gen(), GEN_LOW_MASK + 1);
        assert_eq!(low_end.next(State::Held).owner(), owner);
    }

    /// What the futex relies on: the low half changes with every transition, so a waiter
    /// late to its sleep never sleeps on a later hold of the same tag and owner.
    #[test]
    fn every_transition_changes_the_low_half() {
        let owner = OwnerId::new(3, 1);
        let mut w = Word::new(State::Held, 0x12, owner, 7, Word(0)).with_reach(2);
        for _ in 0..1000 {
            let flagged = w.0 | WAITERS;
            let freed = w.freed();
            let again = Word::new(State::Held, 0x12, owner, freed.gen() + 1, freed);
            assert_ne!(flagged as u32, again.0 as u32 | WAITERS as u32);
            assert_ne!(w.0 as u32, freed.0 as u32);
            w = again;
        }
    }

    #[test]
    fn preview_clamps_length_read_from_file() {
        let s = Cold::default();
        s.write_preview(b"user:42");
        assert_eq!(s.read_preview(), (7, b"user:42".to_vec()));
        let long = vec![b'x'; 100];
        s.write_preview(&long);
        assert_eq!(s.read_preview(), (100, vec![b'x'; PREVIEW_LEN]));
        // a hostile length never reads past the preview
        s.key_len.store(u64::MAX, Ordering::Relaxed);
        assert_eq!(s.read_preview().1.len(), PREVIEW_LEN);
    }
}
