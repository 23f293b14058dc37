//! The undo copy: an entry copied aside before a writer rewrites it, so that a writer
//! killed (or stalled past the bound) in the middle of rewriting a key leaves the key's
//! previous value instead of nothing.
//!
//! Writes take the dict's one writer lock, so one write is in progress at a time; a
//! dict has two copies all the same, so that one a writer taken over was filling (and may
//! still be: see QUARANTINED) leaves the other for its successors. Each lives in a slot
//! after the last entry (an entry's words, never looked up), with two words of the control
//! page:
//!
//! ```text
//! JOURNAL  state (3 bits) · generation (37 bits) · owner (24 bits)
//! AT       the `seq` count of the write the copy is for (38 bits) · the entry's index (26 bits)
//! ```
//!
//! | state | meaning |
//! |---|---|
//! | IDLE | nothing kept |
//! | FILLING | `owner` is copying an entry in |
//! | READY | the copy is what entry `AT` held just before its write of count `AT` |
//! | RESTORING | the copy is being written back into that entry (by whoever holds the lock) |
//! | QUARANTINED | a writer taken over while FILLING may still store into the copy: out of use until it stops (it sets IDLE) or dies |
//!
//! Every claim (IDLE → FILLING) takes the next generation, so no two copies share a word:
//! a party that read the word of a copy since dropped (a writer taken over, resuming) finds
//! its CAS failing on any later one.
//!
//! A writer about to rewrite an entry that holds the key claims a copy, copies the entry,
//! checks that the entry's `seq` word did not move meanwhile (so the copy is the entry as
//! it stood, stable, at count c − 1), publishes READY with a CAS, makes its write (count
//! c), and drops the copy (IDLE) once the entry is stable again. Counts only grow, and a
//! stable entry is left only by one CAS, so the copy is the value before exactly one
//! write: the one at count c, whoever makes it. Only FILLING's owner stores into the copy,
//! and a FILLING copy of a live writer that lost the lock is quarantined, never reused
//! under it: a copy that reads READY or RESTORING is whole, and stays as it is until the
//! word moves on.
//!
//! Whoever finds an entry whose write the copy covers (see [`Journal::covers`]) in the
//! hands of a dead writer writes the copy back (RESTORING first, then the entry marked as
//! its own, as any write; a restorer that dies is followed by the next, which finds the
//! copy still covering the entry one count on); one whose writer is alive but was taken
//! over (quarantined, or done) cannot be reused yet, so the copy goes into another entry
//! of the key's window (the dict does that, see `SharedDict::restore_elsewhere`). A reader
//! that meets an entry the copy covers reads the copy: the value before a write that has
//! not ended.

use super::entry::{
    seq_parts, Aborted, Entry, Geometry, Kept, Look, Out, PackedKey, Undo, STABLE as SEQ_STABLE,
};
use super::writer::Writing;
use crate::shm::primitive::{crash_point, fence, AtomicU64, Ordering};
use crate::shm::registry::OwnerId;

/// Undo copies per dict: writes go without one only while as many writers taken over in
/// the middle of filling one are stopped.
pub(crate) const JOURNALS: usize = 2;

const IDLE: u64 = 0;
const FILLING: u64 = 1;
const READY: u64 = 2;
const RESTORING: u64 = 3;
const QUARANTINED: u64 = 4;
const TAG_SHIFT: u32 = 3;
const TAG_MASK: u64 = (1 << 37) - 1;
const OWNER_SHIFT: u32 = 40;
/// `AT`: the entry's index in the low bits, the write's `seq` count above.
const INDEX_BITS: u32 = 26;
const COUNT_MASK: u64 = (1 << 38) - 1;
/// How many counts past its write a restore may have gone (one per restorer that died).
const RESTORERS: u64 = 1 << 20;

const _: () = assert!(crate::shm::format::MAX_CAPACITY < 1 << INDEX_BITS);

/// The journal's word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct JWord(pub u64);

impl JWord {
    fn new(state: u64, generation: u64, owner: OwnerId) -> JWord {
        JWord(state | (generation & TAG_MASK) << TAG_SHIFT | u64::from(owner.bits()) << OWNER_SHIFT)
    }
    fn state(self) -> u64 {
        self.0 & 7
    }
    fn generation(self) -> u64 {
        (self.0 >> TAG_SHIFT) & TAG_MASK
    }
    /// Who filled the copy.
    pub(crate) fn owner(self) -> OwnerId {
        OwnerId::from_bits((self.0 >> OWNER_SHIFT) as u32)
    }
    fn with_state(self, state: u64) -> JWord {
        JWord(self.0 & !7 | state)
    }
    /// IDLE, keeping the generation (the next claim takes the one after).
    fn idle(self) -> JWord {
        JWord::new(IDLE, self.generation(), OwnerId::from_bits(0))
    }
}

/// What the journal's word says, for the dict's bookkeeping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    Idle,
    /// A writer is copying in (or one taken over while doing so may still be).
    Filling {
        quarantined: bool,
    },
    /// A whole copy of entry `at`, for its write of count `count` (READY), or being
    /// written back into it (RESTORING).
    Kept {
        at: usize,
        count: u64,
        restoring: bool,
    },
}

/// What [`Journal::settle`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Settled {
    /// Nothing kept (any more).
    Idle,
    /// Out of use for now: a writer taken over while filling it may still store into it.
    InUse,
    /// The copy (word `word`) covers the write now in entry `at`: cleaning that entry
    /// writes it back, or leaves it to be stored elsewhere.
    Covers { at: usize, word: JWord },
}

/// The undo copy of one dict: its word, the `AT` word and the copy's words.
#[derive(Clone, Copy)]
pub(crate) struct Journal<'a> {
    pub word: &'a AtomicU64,
    pub at: &'a AtomicU64,
    pub copy: Entry<'a>,
}

/// Why a copy could not be made for a write.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum NotKept {
    /// The entry moved while it was copied: the write must look again.
    Moved,
    /// The writer was taken over while it was filling the copy.
    LostLock,
}

impl<'a> Journal<'a> {
    /// The word now.
    pub(crate) fn load(&self) -> JWord {
        JWord(self.word.load(Ordering::Acquire))
    }

    /// What the word `j` says (with `AT` as it is: exact for READY and RESTORING, which
    /// keep it).
    pub(crate) fn state(&self, j: JWord) -> State {
        let (at, count) = unpack(self.at.load(Ordering::Relaxed));
        match j.state() {
            IDLE => State::Idle,
            FILLING => State::Filling { quarantined: false },
            READY | RESTORING => State::Kept {
                at,
                count,
                restoring: j.state() == RESTORING,
            },
            _ => State::Filling { quarantined: true },
        }
    }

    /// Whether the copy (journal word `j`) is the value of entry `at` before the write
    /// whose `seq` word the entry holds now (`seq`, not stable): the write it was made
    /// for, or, while it is being written back, any write-back of it.
    pub(crate) fn covers(&self, j: JWord, at: usize, seq: u64) -> bool {
        let (state, count, _) = seq_parts(seq);
        if state == SEQ_STABLE {
            return false;
        }
        let (kept_at, kept_count) = unpack(self.at.load(Ordering::Relaxed));
        if kept_at != at {
            return false;
        }
        match j.state() {
            READY => count == kept_count,
            // Each restorer that died moved the entry one count on.
            RESTORING => count.wrapping_sub(kept_count) & COUNT_MASK < RESTORERS,
            _ => false,
        }
    }

    /// What the holder of the writer lock does with the copy before it writes anything:
    /// drops it if its write was made, or undone, or never began (and if that write could
    /// still begin, from a writer taken over between its copy and its mark, makes the
    /// entry's count skip it first); drops a dead filler's; quarantines a live filler's
    /// that lost the lock. `entry` gives the entry at an index (`None` past the end).
    pub(crate) fn settle(
        &self,
        entry: impl Fn(usize) -> Option<Entry<'a>>,
        is_dead: impl Fn(OwnerId) -> bool,
    ) -> Settled {
        for _ in 0..8 {
            let word = self.load();
            match self.state(word) {
                State::Idle => return Settled::Idle,
                State::Filling { quarantined } => {
                    if is_dead(word.owner()) {
                        self.release(word);
                        continue;
                    }
                    if !quarantined {
                        self.quarantine(word);
                    }
                    return Settled::InUse;
                }
                State::Kept { at, count, .. } => {
                    let Some(e) = entry(at) else {
                        self.release(word); // a damaged file
                        continue;
                    };
                    let seq = e.seq();
                    if self.covers(word, at, seq) {
                        return Settled::Covers { at, word };
                    }
                    if e.seq_count_is(seq, count.wrapping_sub(1)) && !e.skip_write(seq) {
                        continue; // its writer marked the entry meanwhile: covered now
                    }
                    self.release(word);
                }
            }
        }
        Settled::InUse // the word kept moving: writers taken over, resuming
    }

    /// Copies `entry` (index `at`, stable `seq` word `stable`) in before `w` rewrites it
    /// with the `seq` word `writing`. `Ok(None)` when this copy is in use (by a writer
    /// taken over, or left for the lock's holder to settle): the caller tries the other.
    /// The caller holds the writer lock.
    pub(crate) fn keep(
        &self,
        w: &Writing<'_>,
        entry: &Entry<'_>,
        at: usize,
        stable: u64,
        writing: u64,
    ) -> Result<Option<JWord>, NotKept> {
        let cur = JWord(self.word.load(Ordering::Relaxed));
        if cur.state() != IDLE {
            return Ok(None);
        }
        let filling = JWord::new(FILLING, cur.generation() + 1, w.owner());
        if self
            .word
            .compare_exchange(cur.0, filling.0, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return Ok(None);
        }
        // Orders FILLING before the copy's stores: a reader whose look at the copy saw one
        // of them sees the word moved on when it checks it again (see `still`).
        fence(Ordering::Release);
        crash_point();
        let (_, count, _) = seq_parts(writing);
        self.at.store(pack(at, count), Ordering::Relaxed);
        entry.copy_to(&self.copy);
        crash_point();
        // The copy is the entry at `stable` only if nothing wrote it meanwhile (a writer
        // taken over, resuming): the loads before this one, as a reader's validation.
        fence(Ordering::Acquire);
        if entry.seq_relaxed() != stable {
            self.release(filling);
            return Err(NotKept::Moved);
        }
        let ready = filling.with_state(READY);
        // Release: the copy's stores before the word that says it is whole.
        if self
            .word
            .compare_exchange(filling.0, ready.0, Ordering::Release, Ordering::Relaxed)
            .is_ok()
        {
            crash_point();
            return Ok(Some(ready));
        }
        // Quarantined by whoever took the lock over: we store no more, say so.
        let q = filling.with_state(QUARANTINED);
        let _ = self
            .word
            .compare_exchange(q.0, q.idle().0, Ordering::Release, Ordering::Relaxed);
        crash_point();
        Err(NotKept::LostLock)
    }

    /// IDLE again, if the word is still `j`.
    pub(crate) fn release(&self, j: JWord) -> bool {
        let done = self
            .word
            .compare_exchange(j.0, j.idle().0, Ordering::Release, Ordering::Relaxed)
            .is_ok();
        crash_point();
        done
    }

    /// Quarantines a FILLING word of a writer that was taken over (`j`, read by the
    /// holder of the lock): it may still store into the copy.
    pub(crate) fn quarantine(&self, j: JWord) {
        if j.state() == FILLING {
            let _ = self.word.compare_exchange(
                j.0,
                j.with_state(QUARANTINED).0,
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
            crash_point();
        }
    }

    /// Marks the copy (word `j`) as being written back into its entry. `None` if the word
    /// moved on.
    pub(crate) fn begin_restore(&self, j: JWord) -> Option<JWord> {
        if j.state() == RESTORING {
            return Some(j);
        }
        let restoring = j.with_state(RESTORING);
        let ok = self
            .word
            .compare_exchange(j.0, restoring.0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok();
        crash_point();
        ok.then_some(restoring)
    }

    /// Whether the word is still `j` after reads of the copy: they are then of a whole
    /// copy (see `Entry::validate`).
    pub(crate) fn still(&self, j: JWord) -> bool {
        fence(Ordering::Acquire);
        self.word.load(Ordering::Relaxed) == j.0
    }

    /// A lock-free reader's look at the copy, for entry `at` whose `seq` word it read as
    /// `seq` (not stable): the key's value before the write in progress (or interrupted)
    /// there, if the copy covers that write. `None` if it does not, or changed meanwhile.
    pub(crate) fn read(
        &self,
        at: usize,
        seq: u64,
        key: &PackedKey<'_>,
        value: Out<'_>,
    ) -> Option<Look> {
        let j = self.load();
        if !self.covers(j, at, seq) {
            return None;
        }
        let look = self.copy.peek(key, value);
        self.still(j).then_some(look)
    }
}

fn pack(at: usize, count: u64) -> u64 {
    (count & COUNT_MASK) << INDEX_BITS | at as u64
}

fn unpack(word: u64) -> (usize, u64) {
    (
        (word & ((1 << INDEX_BITS) - 1)) as usize,
        word >> INDEX_BITS,
    )
}

/// A dict's undo copies, where they live: made into a [`Journal`] only when one is used,
/// so that the paths that need none stay as cheap as they were.
#[derive(Clone, Copy)]
pub(crate) struct Journals<'a> {
    /// For each copy, its word and its `AT` word.
    pub control: &'a [AtomicU64],
    /// The copies' entries, one after the other.
    pub copies: &'a [AtomicU64],
    pub geometry: &'a Geometry,
    /// The whole mapping, where the heap holds the copies' values longer than an entry's
    /// room (the chain the entry named).
    pub all: &'a [AtomicU64],
}

impl<'a> Journals<'a> {
    /// Copy `n`.
    pub(crate) fn get(&self, n: usize) -> Journal<'a> {
        let words = self.geometry.entry_words;
        Journal {
            word: &self.control[2 * n],
            at: &self.control[2 * n + 1],
            copy: Entry::with_heap(
                &self.copies[n * words..(n + 1) * words],
                self.geometry,
                self.all,
            ),
        }
    }

    /// Whether any copy is in some other state than IDLE (a cheap look: one load each).
    pub(crate) fn any_busy(&self) -> bool {
        (0..JOURNALS).any(|n| JWord(self.control[2 * n].load(Ordering::Relaxed)).state() != IDLE)
    }

    /// The copy that covers the write in entry `at` whose `seq` word is `seq`, with its
    /// word (see [`Journal::covers`]).
    pub(crate) fn covering(&self, at: usize, seq: u64) -> Option<(Journal<'a>, JWord)> {
        (0..JOURNALS).find_map(|n| {
            let j = self.get(n);
            let word = j.load();
            j.covers(word, at, seq).then_some((j, word))
        })
    }

    /// A reader's look at whichever copy covers entry `at`'s write (see [`Journal::read`]).
    pub(crate) fn read(
        &self,
        at: usize,
        seq: u64,
        key: &PackedKey<'_>,
        mut value: Out<'_>,
    ) -> Option<Look> {
        (0..JOURNALS).find_map(|n| self.get(n).read(at, seq, key, value.as_deref_mut()))
    }
}

/// Where an entry's undo copy may be: the dict's copies, and the entry's index.
#[derive(Clone, Copy)]
pub(crate) struct Keep<'a> {
    pub journals: Journals<'a>,
    pub at: usize,
}

impl<'a> Keep<'a> {
    /// The copy that covers the write whose `seq` word is `seq`, with its word.
    pub(crate) fn covering(&self, seq: u64) -> Option<(Journal<'a>, JWord)> {
        self.journals.covering(self.at, seq)
    }
}

impl Undo for Keep<'_> {
    fn keep(
        &self,
        w: &Writing<'_>,
        entry: &Entry<'_>,
        stable: u64,
        writing: u64,
    ) -> Result<Option<Kept>, Aborted> {
        for copy in 0..JOURNALS {
            match self
                .journals
                .get(copy)
                .keep(w, entry, self.at, stable, writing)
            {
                Ok(None) => continue, // in use: try the other
                Ok(Some(word)) => return Ok(Some(Kept { copy, word: word.0 })),
                Err(NotKept::Moved) => return Err(Aborted::NotStable),
                Err(NotKept::LostLock) => return Err(Aborted::TakenOver),
            }
        }
        Ok(None)
    }

    fn drop_kept(&self, kept: Kept) {
        self.journals.get(kept.copy).release(JWord(kept.word));
    }

    fn covers(&self, seq: u64) -> bool {
        // A copy whose lengths do not fit the dict's is damage: nothing to write back.
        self.covering(seq)
            .is_some_and(|(j, _)| j.copy.lengths_fit())
    }

    fn write_back(&self, w: &Writing<'_>, entry: &Entry<'_>, seq: u64) {
        let Some((j, word)) = self.covering(seq) else {
            return;
        };
        let Some(restoring) = j.begin_restore(word) else {
            return;
        };
        let Some(mine) = entry.mark_write_back(w, seq) else {
            return;
        };
        j.copy.copy_to(entry);
        if entry.end_write_back(mine) {
            j.release(restoring);
        }
    }
}
