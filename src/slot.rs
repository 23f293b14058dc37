//! One entry of the lock table and its control word.
//!
//! A slot is two cache lines. The first holds everything the claim protocol reads while
//! scanning (control word, key hash) and the per-home words (`fence`, `reach`, `wait`)
//! that belong to the keys whose home is this slot, whatever the slot itself holds. The
//! second holds what only inspection reads (age, token, key preview).
//!
//! Every field is atomic: other processes read and write the same memory.

use crate::primitive::{AtomicU32, AtomicU64, Ordering};

/// Bytes of the key kept in the slot for inspection.
pub(crate) const PREVIEW_LEN: usize = 40;
const PREVIEW_WORDS: usize = PREVIEW_LEN / 8;

/// A lock-table entry. See the module docs of [`crate::table`] for the protocol.
#[repr(C, align(64))]
#[derive(Default)]
pub(crate) struct Slot {
    /// The [`Word`] that decides who owns the slot.
    pub control: AtomicU64,
    /// 128-bit seeded xxh3 of the key held (valid in CLAIMING once written, and in HELD).
    pub hash_lo: AtomicU64,
    pub hash_hi: AtomicU64,
    /// Per-acquisition id, so a holder recognises its own hold even across `gen` wrap.
    pub lease: AtomicU64,
    /// Lease deadline on the table clock (ns); `u64::MAX` = never expires.
    pub deadline: AtomicU64,
    /// Start time of the owning process (`/proc/<pid>/stat` field 22, for pid-reuse checks),
    /// packed with the generation of the claim that wrote it: see [`OwnerField`].
    pub owner_start: AtomicU64,
    /// Home word: fencing counter of the keys whose home is this slot.
    pub fence: AtomicU64,
    /// Home word: greatest distance from this home at which one of its keys was ever placed.
    pub reach: AtomicU32,
    /// Home word: futex word the waiters of this home's keys sleep on.
    pub wait: AtomicU32,
    /// When the current hold began (table clock, ns).
    pub acquired_at: AtomicU64,
    /// Fencing token of the current hold, 0 until the holder asks for one.
    pub token: AtomicU64,
    /// Full length of the key held.
    pub key_len: AtomicU64,
    /// The first [`PREVIEW_LEN`] bytes of the key, little-endian packed.
    pub preview: [AtomicU64; PREVIEW_WORDS],
}

#[cfg(not(loom))]
const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(size_of::<Slot>() == 128);
    assert!(align_of::<Slot>() == 64);
    assert!(offset_of!(Slot, control) == 0);
    assert!(offset_of!(Slot, wait) == 60);
    assert!(offset_of!(Slot, acquired_at) == 64);
    assert!(offset_of!(Slot, preview) == 88);
};

impl Slot {
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

/// The `owner_start` field: the owner's start time in the high 40 bits (clock ticks after
/// boot: centuries), and the low 24 bits of the generation of the CLAIMING word whose owner
/// wrote it. A claimer writes it first thing after its claim CAS; a reader trusts the start
/// time of a CLAIMING entry only when the generations agree (otherwise it may still be the
/// previous occupant's), and that of a HELD entry always (it was published with the word).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OwnerField(pub u64);

const OWNER_GEN_BITS: u32 = 24;
const OWNER_GEN_MASK: u64 = (1 << OWNER_GEN_BITS) - 1;

impl OwnerField {
    pub(crate) fn new(start: u64, claim: Word) -> OwnerField {
        OwnerField((start << OWNER_GEN_BITS) | (claim.gen() & OWNER_GEN_MASK))
    }

    pub(crate) fn start(self) -> u64 {
        self.0 >> OWNER_GEN_BITS
    }

    /// Whether this was written by the owner of `claim`.
    pub(crate) fn written_by(self, claim: Word) -> bool {
        self.0 & OWNER_GEN_MASK == claim.gen() & OWNER_GEN_MASK
    }
}

/// Slot states (the low two bits of a [`Word`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// Nobody owns the slot.
    Free = 0,
    /// A claimer owns the slot and is checking that its key has no other entry.
    Claiming = 1,
    /// The key is held.
    Held = 2,
    /// The holder is moving its deadline; the entry is held and not stealable by expiry.
    Extending = 3,
}

/// The control word of a slot:
///
/// ```text
///  63          33 32        11 10     3   2      1   0
/// +--------------+------------+--------+-------+-------+
/// |   gen (31)   |  pid (22)  | tag(8) |waiters| state |
/// +--------------+------------+--------+-------+-------+
/// ```
///
/// * `gen` grows on every transition, so a CAS from a value read earlier fails if anything
///   happened in between (no ABA within 2^31 transitions of one slot).
/// * `pid` is the process that owns a CLAIMING, HELD or EXTENDING entry (for liveness checks).
/// * `tag` is 8 bits of the key hash, so a scanner can skip most foreign CLAIMING entries
///   whose full hash may not be written yet.
/// * `waiters` is set by a waiter about to sleep on the home's futex word; whoever frees
///   the entry wakes them.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Word(pub u64);

const STATE_MASK: u64 = 0b11;
pub(crate) const WAITERS: u64 = 1 << 2;
const TAG_SHIFT: u32 = 3;
const PID_SHIFT: u32 = 11;
const PID_BITS: u32 = 22;
const GEN_SHIFT: u32 = 33;

/// The largest pid a word can carry (Linux's `PID_MAX_LIMIT` is 2^22).
pub(crate) const MAX_PID: u32 = (1 << PID_BITS) - 1;

impl Word {
    pub(crate) fn new(state: State, tag: u8, pid: u32, gen: u64) -> Word {
        debug_assert!(pid <= MAX_PID);
        Word(
            state as u64
                | (u64::from(tag) << TAG_SHIFT)
                | (u64::from(pid & MAX_PID) << PID_SHIFT)
                | (gen << GEN_SHIFT),
        )
    }

    pub(crate) fn state(self) -> State {
        match self.0 & STATE_MASK {
            0 => State::Free,
            1 => State::Claiming,
            2 => State::Held,
            _ => State::Extending,
        }
    }

    pub(crate) fn tag(self) -> u8 {
        (self.0 >> TAG_SHIFT) as u8
    }

    pub(crate) fn pid(self) -> u32 {
        ((self.0 >> PID_SHIFT) as u32) & MAX_PID
    }

    pub(crate) fn gen(self) -> u64 {
        self.0 >> GEN_SHIFT
    }

    pub(crate) fn has_waiters(self) -> bool {
        self.0 & WAITERS != 0
    }

    /// The word without the waiters bit: what identifies one hold.
    pub(crate) fn ident(self) -> u64 {
        self.0 & !WAITERS
    }

    /// The same entry one transition later, in `state`, keeping tag and pid.
    pub(crate) fn next(self, state: State) -> Word {
        Word::new(state, self.tag(), self.pid(), self.gen().wrapping_add(1))
    }

    /// A free slot one transition later.
    pub(crate) fn freed(self) -> Word {
        Word::new(State::Free, 0, 0, self.gen().wrapping_add(1))
    }
}

impl std::fmt::Debug for Word {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Word")
            .field("state", &self.state())
            .field("waiters", &self.has_waiters())
            .field("tag", &self.tag())
            .field("pid", &self.pid())
            .field("gen", &self.gen())
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn word_fields_round_trip() {
        let w = Word::new(State::Held, 0xab, MAX_PID, (1 << 31) - 1);
        assert_eq!(w.state(), State::Held);
        assert_eq!(w.tag(), 0xab);
        assert_eq!(w.pid(), MAX_PID);
        assert_eq!(w.gen(), (1 << 31) - 1);
        assert!(!w.has_waiters());
        let flagged = Word(w.0 | WAITERS);
        assert!(flagged.has_waiters());
        assert_eq!(flagged.ident(), w.ident());
        // gen wraps instead of spilling into other fields
        let n = w.next(State::Free);
        assert_eq!(n.gen(), 0);
        assert_eq!(n.state(), State::Free);
    }

    #[test]
    fn preview_clamps_length_read_from_file() {
        let s = Slot::default();
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
