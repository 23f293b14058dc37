//! The slot protocol: how a key is claimed, held, extended, released, stolen and broken.
//!
//! The table is a fixed array of [`Slot`]s, open-addressed by a 128-bit seeded hash of the
//! key, with four times as many slots as the capacity asked for (so it is at most a quarter full
//! and probes stay short). A key's *home* is `hash * len >> 64`; its entry lives at some
//! distance `d` from home, with `d <= reach(home)`, where `reach` is a per-home high-water
//! mark, kept in the home's control word, that only grows and is raised *before* an entry
//! is published at a new distance.
//!
//! # States and transitions
//!
//! ```text
//!            claim CAS                 promote CAS (owner)
//!   FREE ─────────────────▶ CLAIMING ─────────────────▶ HELD ◀──────────────┐
//!    ▲ ▲ ◀── withdraw CAS (owner) ─┤                     │  │ begin CAS      │ end CAS
//!    │ │ ◀── reap CAS (owner dead) ┤                     │  └──▶ EXTENDING ─┘ (owner)
//!    │ │                           │ break CAS (stalled)  │          │ break CAS (stalled
//!    │ │                           ▼                      │          │ past its deadline)
//!    │ └── back out CAS (owner) ─ BROKEN ◀────────────────┼──────────┘
//!    │     or reap CAS (owner dead)                       │  ▲
//!    ├──── release CAS (owner) ───────────────────────────┘  │ restore CAS (still live)
//!    │                                steal CAS (expired,    ▼
//!    └──── free CAS (doomed) ─────── STEALING ◀──────── or owner dead)
//! ```
//!
//! Freeing someone else's HELD entry takes two steps (STEALING, then FREE or HELD again):
//! `recover.rs` says why.
//!
//! A shared hold released with nobody waiting goes to IDLE instead of FREE (release CAS,
//! owner), and its owner takes it again from there (re-entry CAS, to HELD or CLAIMING);
//! anyone frees an IDLE entry (take-back CAS), and a claim may claim it as a free slot:
//! `idle.rs` says why that is safe. A hold released while a writer waits for it (a
//! reader's), or readers wait for it (a writer's), goes IDLE too, keeping the key for them
//! (`idle.rs`: the key kept for a writer, for readers).
//!
//! Ownership is decided by CAS on the control [`Word`] alone, and every transition an
//! owner makes is a CAS from the exact entry it owns ([`Word::ident`]: the waiters and
//! reach bits may change under it), so an owner that was stopped, or broken, finds its
//! CAS failing when it resumes and touches nothing of anyone else's.
//!
//! The other fields of a slot are written only by the owner of a CLAIMING or EXTENDING
//! word. Those two states are never freed under a live owner: when one stalls past the
//! bound (its owner stopped, or descheduled for that long), a waiter breaks it into
//! BROKEN, which is nobody's entry (its key is free to be claimed elsewhere) and is not
//! reused until its owner backs out (frees it when its own CAS fails) or dies. So late
//! writes of a resumed owner land only in its own broken slot. HELD entries are published
//! with a CAS after their fields, so a scanner that acquires a HELD word sees the key
//! hash, lease and deadline of that very hold.
//!
//! # Where each part lives
//!
//! - `claim`: taking a key, on the fast path (a free home of reach 0: one CAS) and by the
//!   general claim (two scans of the key's range), with the argument that two live entries
//!   of one key cannot exist, and what loom proves of it and what it cannot.
//! - `hold`: what a holder does with its hold: release, extend, give up to its lease, fence.
//! - `idle`: a shared entry kept after its release for its process to take again with
//!   one CAS, and why that needs no scan.
//! - `recover`: freeing what others left: holds past their deadline or of dead owners
//!   (stolen in two steps), claims and renewals that stalled (broken), reaping, and
//!   breaking a key by force.
//! - `wait`: how a waiter flags a hold, and the word it sleeps on.
//! - `inspect`: finding a key's live entry, and snapshots of the slots.
//!
//! The loom models of the protocol are in `shm/loom_tests.rs`; `tests` holds unit tests.

use crate::broken::{broken, Broken};
use crate::shm::primitive::{fence, AtomicU64, Ordering};
use crate::shm::registry::OwnerId;
use crate::shm::slot::{
    Cold, Slot, State, Word, PERMIT, REACH_OVERFLOW, READERS_WAIT, SHARED, WRITER_WAITS,
};

mod claim;
mod hold;
mod idle;
mod inspect;
mod recover;
#[cfg(all(test, not(loom)))]
mod tests;
mod wait;

/// A key's 128-bit seeded xxh3.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KeyHash {
    pub lo: u64,
    pub hi: u64,
}

impl KeyHash {
    pub(crate) fn of(key: &[u8], seed: u64) -> KeyHash {
        let h = xxhash_rust::xxh3::xxh3_128_with_seed(key, seed);
        KeyHash {
            lo: h as u64,
            hi: (h >> 64) as u64,
        }
    }

    /// 5 bits of the hash, as control words carry them.
    pub(crate) fn tag(self) -> u8 {
        (self.hi >> 59) as u8
    }

    /// The home slot, by multiply-shift range reduction (any table length works).
    pub(crate) fn home(self, len: usize) -> usize {
        ((u128::from(self.lo) * len as u128) >> 64) as usize
    }
}

/// Where the slots live: hot lines and their cold side array, of one length.
pub(crate) trait Slots {
    fn hot(&self) -> &[Slot];
    fn cold(&self) -> &[Cold];
}

/// What the protocol needs from the world: time, the owners' liveness, wake-ups, and a
/// memory of how long an entry has looked the same.
pub(crate) trait Env {
    /// The table clock (ns).
    fn now(&self) -> u64;
    /// Whether the owner is gone for good: only on the kernel's word (see `registry.rs`).
    fn is_dead(&self, owner: OwnerId) -> bool;
    /// [`is_dead`](Self::is_dead) for the owner of a published hold, whose `lease` says
    /// more about it (the registry generation it held, in the lock table).
    fn is_holder_dead(&self, owner: OwnerId, lease: u64) -> bool {
        let _ = lease;
        self.is_dead(owner)
    }
    /// Wakes the processes asleep on a slot's control word (a futex on the half of it
    /// that holds the state and the waiters bit).
    fn wake_all(&self, word: &AtomicU64);
    /// Whether a held key whose holder died is taken before its lease ends (the default;
    /// `OpenOptions::liveness(false)` waits for the lease). Entries a dead owner left in
    /// between states are freed either way: nothing else ever frees them.
    fn reaps_dead_holders(&self) -> bool {
        true
    }
    /// Notes in `seen` (a slot's stall mark, shared by every process) that the slot reads
    /// `word` now; `true` once that very word has been seen there, by anyone, for at least
    /// the stall bound.
    fn stalled(&self, seen: &AtomicU64, word: Word) -> bool;
    /// Times a hold released to waiters (the holds someone waited for are timed: a clock
    /// read at every release would cost half an uncontended lock and unlock).
    fn released_to_waiters(&self, acquired_at: u64) {
        let _ = acquired_at;
    }
    /// Counts a held key freed from under its holder: its lease had run out (`expired`),
    /// or its owner was dead.
    fn took_over(&self, expired: bool) {
        let _ = expired;
    }
    /// A writer waiting for the shared hold `hold` (see [`Table::hold_id`]) notes in `seen`
    /// (the slot's mark) that it still waits; it does so at every look, at least every
    /// [`WRITER_REFRESH`] while it sleeps.
    fn writer_waits_still(&self, seen: &AtomicU64, hold: u64) {
        let _ = (seen, hold);
    }
    /// Whether no writer has said lately that it waits for the shared hold `hold`: its
    /// writer gave up or died (a waiting one says so far more often).
    fn writer_gone(&self, seen: &AtomicU64, hold: u64) -> bool {
        let _ = (seen, hold);
        false
    }
    /// Whether a writer has said very lately (within a few of its refreshes) that it
    /// waits for the shared hold `hold`: the hold's end then keeps the key for it.
    fn writer_active(&self, seen: &AtomicU64, hold: u64) -> bool {
        !self.writer_gone(seen, hold)
    }
    /// A writer that gave up waiting for the shared hold `hold` ages its mark in `seen`
    /// (if the mark is still a writer's for that hold): no longer active, not yet gone.
    fn writer_withdraws(&self, seen: &AtomicU64, hold: u64) {
        let _ = (seen, hold);
    }
    /// How long the writer's mark on the shared hold `hold` keeps new readers out unless
    /// it is refreshed (`None`: no such mark, or time is not modelled).
    fn writer_mark_left(&self, seen: &AtomicU64, hold: u64) -> Option<std::time::Duration> {
        let _ = (seen, hold);
        None
    }
    /// A reader waiting for the exclusive hold `hold` notes in `seen` that it still waits
    /// (as [`writer_waits_still`](Self::writer_waits_still) for a writer).
    fn readers_wait_still(&self, seen: &AtomicU64, hold: u64) {
        let _ = (seen, hold);
    }
    /// Whether a reader has said very lately that it waits for the exclusive hold `hold`:
    /// the hold's end then keeps the key for readers.
    fn readers_active(&self, seen: &AtomicU64, hold: u64) -> bool {
        let _ = (seen, hold);
        true
    }
    /// A reader that gave up waiting for the exclusive hold `hold` ages the readers' mark
    /// in `seen`: no longer active.
    fn readers_withdraw(&self, seen: &AtomicU64, hold: u64) {
        let _ = (seen, hold);
    }
}

/// How often, at least, a writer waiting for readers refreshes its mark on their holds
/// (its sleeps are cut to this); a mark unrefreshed for the stall bound has lapsed.
pub(crate) const WRITER_REFRESH: std::time::Duration = std::time::Duration::from_millis(100);

/// How long a reader woken by the release of a hold a writer marked waits before it tries
/// again: the writer, woken by the same release, takes the key meanwhile, and the reader
/// then waits for it. Without it the woken readers raced the writer, and a reader that
/// won started a hold the writer had to wait out too (with 6 readers looping on one key,
/// most writer waits lasted several holds). The release now keeps the key for the writer
/// (see `idle.rs`), so a reader that tries at once waits anyway; the head start is left
/// for the key not kept (the writer not active: stopped, or its marks aged by another
/// writer's give-up; or another key's claim took the slot in a full range), and costs
/// nothing else: the writer holds the key by then.
pub(crate) const WRITER_HEAD_START: std::time::Duration = std::time::Duration::from_millis(2);

/// How a claim holds its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Alone: no other entry of the key stands beside it.
    Exclusive,
    /// Beside other shared holds of the key: a reader (`limit` 0), or one of a semaphore's
    /// `limit` permits (at most `limit` such holds at once).
    Shared { limit: u32 },
}

impl Mode {
    /// The mark a claim in this mode puts in its control word (see [`Word::mark`]).
    #[inline(always)]
    pub(crate) fn mark(self, hash: KeyHash) -> u8 {
        match self {
            Mode::Exclusive => hash.tag(),
            Mode::Shared { limit: 0 } => hash.tag() | (SHARED >> 32) as u8,
            Mode::Shared { .. } => hash.tag() | ((SHARED | PERMIT) >> 32) as u8,
        }
    }

    /// What the claim writes in [`Slot::limit`].
    #[inline(always)]
    pub(crate) fn limit(self) -> u32 {
        match self {
            Mode::Exclusive => 0,
            Mode::Shared { limit } => limit,
        }
    }
}

/// One acquisition attempt.
pub(crate) struct Request<'k> {
    pub key: &'k [u8],
    pub hash: KeyHash,
    pub owner: OwnerId,
    /// The holding thread's id within the owner process (see `Slot::lease`).
    pub lease: u64,
    /// Lease length in ns; 0 = never expires.
    pub exptime: u64,
    pub mode: Mode,
}

/// A hold won by [`Table::try_acquire`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Held {
    pub slot: usize,
    pub home: usize,
    pub word: Word,
    pub lease: u64,
    /// When the hold was taken: with the word and the lease, what tells this hold from a
    /// later one of the same thread whose word came round to the same value (the word's
    /// generation wraps after 2^26 transitions; acquisition times do not repeat).
    pub acquired_at: u64,
}

/// The entry that kept a key from being acquired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Busy {
    pub slot: usize,
    pub home: usize,
    pub word: Word,
    /// The key that was busy.
    pub hash: KeyHash,
    /// What a waiter waits for.
    pub wait: WaitFor,
}

/// What a waiter for a busy key waits for, and so where it sleeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitFor {
    /// The entry at `slot` to leave the key: sleeps on its word.
    Entry,
    /// A writer, for the shared holds of the key: it marks them all as waited for by a
    /// writer (so that no new reader joins them) and sleeps on the one at `slot`.
    Readers,
    /// A reader, for an exclusive hold: it marks the hold as waited for by readers (so
    /// that its release keeps the key for them) and sleeps on it.
    Writer,
    /// One of a semaphore's `limit` permits, all taken: sleeps on the home's claim count,
    /// which the release of any of them moves.
    Permits { limit: u32 },
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Attempt {
    Acquired(Held),
    Busy(Busy),
    /// The key is held in shared mode with another limit (a semaphore of `limit` permits,
    /// or readers for 0) than the claim's.
    Mismatch {
        limit: u32,
    },
}

/// No free slot, even after reaping expired and dead entries.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct TableFull;

/// The hold is gone: it was stolen after expiry or death, or broken by force or as
/// stalled.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Lost;

/// A snapshot of one occupied slot, for inspection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub slot: u32,
    pub word: Word,
    pub hash: KeyHash,
    pub deadline: u64,
    pub acquired_at: u64,
    /// The holder's lease (its thread, and in the lock table its registry generation).
    pub lease: u64,
    /// The counter's value the holder took as its token, if it took one (and the cold
    /// line still shows it). A reader's can be 0: no exclusive hold of its home yet.
    pub token: Option<u64>,
    /// The shared entry's limit (see [`Slot::limit`]).
    pub limit: u32,
    pub key_len: u64,
    pub preview: Vec<u8>,
}

/// What a scanner concluded about one slot.
enum Seen {
    Free,
    /// An entry of another key, or a broken one.
    Other,
    /// The control word moved while the slot was read: look again.
    Changed,
    /// A CLAIMING entry whose tag matches: maybe our key, hash not yet trustworthy.
    Claiming,
    /// A live HELD/EXTENDING entry of our key.
    Key,
    /// A HELD entry of our key past its deadline.
    Expired,
    /// A HELD entry of our key being checked again by someone about to free it.
    Stealing,
    /// An IDLE entry (see `idle.rs`), of our key or not: no hold, free to be taken back.
    Idle {
        ours: bool,
    },
}

/// What a waiter should do after [`Table::prepare_wait`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Prepared {
    /// Sleep on the busy slot's control word while its low half (state, waiters bit, tag,
    /// owner) still reads this value: whoever moves the flagged entry off the key wakes
    /// the sleepers.
    Sleep(u32),
    /// The entry is no longer the one that was busy: try again now.
    Changed,
    /// The entry is between states (CLAIMING/EXTENDING) and cannot be flagged: sleep the
    /// step out without a wake-up.
    Poll,
}

/// The lock table over some slots and an environment.
pub(crate) struct Table<S, E> {
    slots: S,
    env: E,
}

impl<S: Slots, E: Env> Table<S, E> {
    pub(crate) fn new(slots: S, env: E) -> Self {
        let n = slots.hot().len();
        assert!(n > 0 && n <= u32::MAX as usize && slots.cold().len() == n);
        Table { slots, env }
    }

    #[inline]
    pub(crate) fn slots(&self) -> &[Slot] {
        self.slots.hot()
    }

    #[inline]
    fn cold(&self, i: usize) -> &Cold {
        &self.slots.cold()[i]
    }

    pub(crate) fn env(&self) -> &E {
        &self.env
    }

    #[inline]
    pub(crate) fn now(&self) -> u64 {
        self.env.now()
    }

    #[inline]
    fn at(&self, home: usize, dist: usize) -> usize {
        let n = self.slots().len();
        let i = home + dist;
        if i >= n {
            i - n
        } else {
            i
        }
    }

    #[inline]
    fn word(&self, i: usize, order: Ordering) -> Word {
        Word(self.slots()[i].control.load(order))
    }

    /// The reach of a home, clamped: the file may have been written by anyone.
    #[inline]
    fn reach(&self, home: usize, order: Ordering) -> usize {
        let r = self.word(home, order).reach();
        let r = if r < REACH_OVERFLOW {
            r
        } else {
            self.slots()[home].reach.load(order).max(REACH_OVERFLOW)
        };
        (r as usize).min(self.slots().len() - 1)
    }

    /// Reads the key hash of an occupied slot and checks the word did not move meanwhile.
    #[inline]
    fn hash_of(&self, slot: &Slot, c: Word) -> Option<KeyHash> {
        let lo = slot.hash_lo.load(Ordering::Relaxed);
        let hi = slot.hash_hi.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        if Word(slot.control.load(Ordering::Relaxed)).ident() != c.ident() {
            return None;
        }
        Some(KeyHash { lo, hi })
    }

    #[inline]
    fn examine(&self, slot: &Slot, c: Word, hash: KeyHash, now: u64) -> Seen {
        match c.state() {
            State::Free => Seen::Free,
            State::Broken => Seen::Other,
            State::Idle if c.tag() != hash.tag() => Seen::Idle { ours: false },
            State::Idle => match self.hash_of(slot, c) {
                None => Seen::Changed,
                Some(h) => Seen::Idle { ours: h == hash },
            },
            _ if c.tag() != hash.tag() => Seen::Other,
            State::Claiming => Seen::Claiming,
            State::Held | State::Extending | State::Stealing => match self.hash_of(slot, c) {
                None => Seen::Changed,
                Some(h) if h != hash => Seen::Other,
                Some(_) if c.state() == State::Stealing => Seen::Stealing,
                Some(_) => {
                    if c.state() == State::Held && slot.deadline.load(Ordering::Relaxed) <= now {
                        Seen::Expired
                    } else {
                        Seen::Key
                    }
                }
            },
        }
    }

    /// The limit of the shared entry `c` of `slot`, checked against the word like
    /// [`hash_of`](Self::hash_of).
    #[inline]
    fn limit_of(&self, slot: &Slot, c: Word) -> Option<u32> {
        let limit = slot.limit.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        (Word(slot.control.load(Ordering::Relaxed)).ident() == c.ident()).then_some(limit)
    }

    /// What the live entry `c` of slot `i`, of our key (a [`Seen::Key`]), means to a claim
    /// in `mode`.
    #[inline]
    fn conflict(&self, i: usize, c: Word, mode: Mode) -> Conflict {
        let Mode::Shared { limit } = mode else {
            return Conflict::Busy;
        };
        if !c.is_shared() {
            return Conflict::Busy;
        }
        match self.limit_of(&self.slots()[i], c) {
            None => Conflict::Changed,
            Some(l) if l != limit => Conflict::Mismatch(l),
            // a writer waits for this hold: new shared holds defer to it, while its mark is
            // kept fresh (a writer that gave up or died leaves a mark that lapses)
            Some(_) if c.writer_waits() && !self.writer_gone(i, c) => Conflict::Busy,
            Some(0) => Conflict::Beside,
            Some(_) => Conflict::Permit,
        }
    }

    /// What tells one hold from another across its renewals (which move its word): when
    /// it was taken, and by whom. A writer's mark on a hold is kept under it.
    pub(super) fn hold_id(&self, i: usize, c: Word) -> u64 {
        self.slots()[i].acquired_at.load(Ordering::Relaxed) ^ u64::from(c.owner().bits()) << 40
    }

    /// Whether the writer's mark on the shared hold `c` of slot `i` has lapsed. A renewal
    /// in progress keeps it (the renewal's own watch may have overwritten the mark).
    pub(super) fn writer_gone(&self, i: usize, c: Word) -> bool {
        c.state() == State::Held && self.env.writer_gone(&self.cold(i).seen, self.hold_id(i, c))
    }

    /// Whether the IDLE entry `c` of slot `i` is a reservation: the last hold of a reader
    /// that a writer waited for, left for the writer (see `idle.rs`), while the writer is
    /// active (it said lately that it waits: see `Env::writer_active`).
    pub(super) fn reserved(&self, i: usize, c: Word) -> bool {
        c.state() == State::Idle
            && c.writer_waits()
            && self
                .env
                .writer_active(&self.cold(i).seen, self.hold_id(i, c))
    }

    /// Whether the IDLE entry `c` of slot `i` is kept for readers: the end of an exclusive
    /// hold that readers waited for (see `idle.rs`), while they are active (one said
    /// lately that it waits: see `Env::readers_active`).
    pub(super) fn kept_for_readers(&self, i: usize, c: Word) -> bool {
        c.state() == State::Idle && !c.is_shared() && self.readers_active(i, c)
    }

    /// Whether a reader said lately that it waits for the writer's hold `c` of slot `i`
    /// (kept under the hold, so also under the IDLE entry its release left).
    pub(super) fn readers_active(&self, i: usize, c: Word) -> bool {
        self.env
            .readers_active(&self.cold(i).seen, self.hold_id(i, c))
    }

    /// Whether the IDLE entry `c` of slot `i` keeps its key for someone: a writer
    /// ([`reserved`](Self::reserved)) or readers
    /// ([`kept_for_readers`](Self::kept_for_readers)).
    pub(super) fn kept(&self, i: usize, c: Word) -> bool {
        self.reserved(i, c) || self.kept_for_readers(i, c)
    }

    /// Whether the release of the exclusive hold `c` of slot `i`, which readers marked,
    /// keeps the key for them: they are waiting now.
    #[cold]
    pub(super) fn keeps_for_readers(&self, i: usize, c: Word) -> bool {
        !broken(Broken::Reserve) && self.readers_active(i, c)
    }

    /// A reader waiting for the exclusive hold `c` of slot `i`: marks it (if it is still
    /// that hold) and says it still waits.
    pub(super) fn mark_for_readers(&self, i: usize, c: Word) {
        if self.flag(i, c, READERS_WAIT) && c.state() == State::Held {
            self.env
                .readers_wait_still(&self.cold(i).seen, self.hold_id(i, c));
        }
    }

    /// A reader that gave up waiting for `hash`'s exclusive holder: the readers' mark on
    /// the hold is aged so that its end keeps nothing for them (another reader still
    /// waiting says so again within [`WRITER_REFRESH`]), and a key already kept for
    /// readers is taken back (its sleepers, writers, woken).
    pub(crate) fn readers_withdraw(&self, hash: KeyHash) {
        self.walk_range(hash, |i, c, seen| match seen {
            Seen::Key | Seen::Expired if c.readers_wait() => {
                self.env
                    .readers_withdraw(&self.cold(i).seen, self.hold_id(i, c));
                true
            }
            Seen::Idle { ours: true } if !c.is_shared() => {
                self.take_back(i, c);
                false
            }
            _ => true,
        });
    }

    /// Whether the release of the hold `c` of slot `i` leaves a reservation: a reader's
    /// hold (not a permit's) that a writer marked and is waiting for now.
    #[cold]
    pub(super) fn keeps_for_writer(&self, i: usize, c: Word) -> bool {
        c.is_shared()
            && !c.is_permit()
            && !broken(Broken::Reserve)
            && self
                .env
                .writer_active(&self.cold(i).seen, self.hold_id(i, c))
    }

    /// A writer that gave up waiting for `hash`'s readers (its timeout ran out, its
    /// future was dropped) takes back the keys kept for it: its marks on the readers'
    /// holds are aged so that their ends keep nothing (they still keep new readers out
    /// while they stand, until they lapse: a mark is no writer's in particular, and
    /// another writer waiting for the same readers keeps it fresh), and the keys already
    /// kept are taken back (their sleepers woken). Another writer waiting meanwhile has
    /// its holds' ends keep the key for it again from its next look (within
    /// [`WRITER_REFRESH`]); until then, it races the readers for the key as before
    /// reservations.
    pub(crate) fn writer_withdraws(&self, hash: KeyHash) {
        self.walk_range(hash, |i, c, seen| match seen {
            Seen::Key | Seen::Expired if c.is_shared() && c.writer_waits() => {
                self.env
                    .writer_withdraws(&self.cold(i).seen, self.hold_id(i, c));
                true
            }
            Seen::Idle { ours: true } if c.writer_waits() => {
                self.take_back(i, c);
                false
            }
            _ => true,
        });
    }

    /// A writer waiting for the shared hold `c` of slot `i`: marks it (if it is still
    /// that hold) and says it still waits.
    pub(super) fn mark_for_writer(&self, i: usize, c: Word) {
        if self.flag(i, c, WRITER_WAITS) && c.state() == State::Held {
            self.env
                .writer_waits_still(&self.cold(i).seen, self.hold_id(i, c));
        }
    }

    /// Frees the shared hold `c` of slot `i` if its owner is dead (a count that does not
    /// match is no one's then). `true` if it is gone.
    fn reap_dead_shared(&self, i: usize, c: Word) -> bool {
        c.state() == State::Held
            && self.env.reaps_dead_holders()
            && self.holder_dead(&self.slots()[i], c)
            && {
                self.steal(i, c);
                true
            }
    }

    /// Wakes the processes asleep on slot `i`'s control word (they flagged the entry that
    /// just left it).
    fn wake(&self, i: usize) {
        self.env.wake_all(&self.slots()[i].control);
    }

    /// Wakes whoever waits for the flagged entry `c` of slot `i`, which just left it: the
    /// sleepers on its word and, for a shared entry, a semaphore's waiters asleep on the
    /// claim count of `home` (moved first, so that none of them sleeps past it). Out of
    /// line: only a release someone waits for comes here (a system call anyway).
    #[cold]
    #[inline(never)]
    fn wake_left(&self, i: usize, c: Word, home: Option<usize>) {
        self.wake(i);
        if let (true, Some(home)) = (c.is_shared(), home) {
            let count = &self.slots()[home].fence;
            count.fetch_add(1, Ordering::SeqCst);
            self.env.wake_all(count);
        }
    }

    /// The home of the key an occupied slot holds (read before it is freed).
    fn home_of(&self, i: usize) -> usize {
        let slot = &self.slots()[i];
        KeyHash {
            lo: slot.hash_lo.load(Ordering::Relaxed),
            hi: 0,
        }
        .home(self.slots().len())
    }
}

/// What a live entry of a key means to a claim of it.
#[derive(Debug, PartialEq, Eq)]
enum Conflict {
    /// It stands in the way.
    Busy,
    /// A shared hold the claim may stand beside.
    Beside,
    /// One of the semaphore's permits: the claim may stand beside it if one is left.
    Permit,
    /// A shared hold of another limit.
    Mismatch(u32),
    /// The word moved while it was read: look again.
    Changed,
}

/// Whether a CLAIMING entry whose tag is our key's must be settled (waited for or yielded
/// to) before a claim in `mode` goes on: always, but between two reader claims, which
/// never stand in each other's way (a permit's claim is settled: a reader beside it is a
/// mismatch to report).
#[inline]
fn claims_conflict(c: Word, mode: Mode) -> bool {
    // The broken variant lets shared claims pass every claim in progress, a writer's too.
    if broken(Broken::Shared) && mode != Mode::Exclusive {
        return false;
    }
    !(mode == Mode::Shared { limit: 0 } && c.is_shared() && !c.is_permit())
}

fn busy(slot: usize, home: usize, word: Word, hash: KeyHash) -> Busy {
    Busy {
        slot,
        home,
        word,
        hash,
        wait: WaitFor::Entry,
    }
}
