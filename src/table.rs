//! The slot protocol: how a key is claimed, held, extended, released and stolen.
//!
//! The table is a fixed array of [`Slot`]s, open-addressed by a 128-bit seeded hash of the
//! key. A key's *home* is `hash * len >> 64`; its entry lives at some distance `d` from
//! home, with `d <= reach(home)`, where `reach` is a per-home high-water mark that only
//! grows and is raised *before* an entry is published at a new distance.
//!
//! # States and transitions
//!
//! ```text
//!            claim CAS                 promote (owner)
//!   FREE ─────────────────▶ CLAIMING ─────────────────▶ HELD ◀──┐
//!    ▲  ◀── withdraw (owner) ──┘ │                        │ │    │ end extend (owner)
//!    │  ◀── reap (owner dead) ───┘                        │ └─▶ EXTENDING
//!    │                                                    │   begin extend CAS (owner)
//!    └──── release CAS (owner) / steal CAS (expired or dead owner) ──┘
//! ```
//!
//! Ownership is decided by CAS on the control [`Word`] alone. Every other field of a slot
//! is written only by the process that owns the word in CLAIMING or EXTENDING, and those
//! two states are taken from their owner only when the owner is dead, so a slow (even
//! stopped) process can never scribble over an entry it lost. HELD entries are published
//! with a release store after their fields, so a scanner that acquires a HELD word sees the
//! key hash, lease and deadline of that very hold.
//!
//! # Why two live entries of one key cannot exist
//!
//! A claimer first publishes a CLAIMING entry (SeqCst CAS), then rescans the key's whole
//! range (SeqCst loads), so of two concurrent claimers of a key at least one sees the other
//! (the store-load pattern of Dekker's algorithm). A freed slot earlier in the range (the
//! "release hole") changes nothing: nobody stops at the first free slot when looking for
//! the key. Conflicts resolve by distance from home: a claimer that sees a CLAIMING entry
//! of its key (by tag) nearer home withdraws; one that sees it farther away waits for it to
//! resolve; one that sees a live HELD entry of its key withdraws. Waits only point away
//! from home, so they cannot form a cycle, and a claimer that cannot wait any longer
//! withdraws, which is always safe.
//!
//! # Dead processes
//!
//! A process can die at any instruction. What it leaves behind is one entry of its own key
//! (CLAIMING, HELD or EXTENDING, with its pid in the word), which a waiter reaps once the
//! owner is seen dead, and which expiry reaps anyway for HELD entries. No state of one key
//! blocks another key: `reach` and the home words are single atomic updates.

use crate::clock::{deadline, Clock};
use crate::primitive::{crash_point, fence, spin, AtomicU32, Ordering, SETTLE_ROUNDS};
use crate::process::{Liveness, Owner};
use crate::slot::{OwnerField, Slot, State, Word, WAITERS};

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

    pub(crate) fn tag(self) -> u8 {
        (self.hi >> 56) as u8
    }

    /// The home slot, by multiply-shift range reduction (any table length works).
    pub(crate) fn home(self, len: usize) -> usize {
        ((u128::from(self.lo) * len as u128) >> 64) as usize
    }
}

/// One acquisition attempt.
pub(crate) struct Request<'k> {
    pub key: &'k [u8],
    pub hash: KeyHash,
    pub owner: Owner,
    /// Unique per acquisition within the owner process.
    pub lease: u64,
    /// Lease length in ns; 0 = never expires.
    pub exptime: u64,
}

/// A hold won by [`Table::try_acquire`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Held {
    pub slot: usize,
    pub home: usize,
    pub word: Word,
    pub lease: u64,
}

/// The entry that kept a key from being acquired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Busy {
    pub slot: usize,
    pub home: usize,
    pub word: Word,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Attempt {
    Acquired(Held),
    Busy(Busy),
}

/// No free slot, even after reaping expired and dead entries.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct TableFull;

/// The hold is gone: it was stolen after expiry or death, or broken by force.
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
    pub token: u64,
    pub key_len: u64,
    pub preview: Vec<u8>,
}

/// What a scanner concluded about one slot.
enum Seen {
    /// Free, or an entry of another key.
    Free,
    Other,
    /// The control word moved while the slot was read: look again.
    Changed,
    /// A CLAIMING entry whose tag matches: maybe our key, hash not yet trustworthy.
    Claiming,
    /// A live HELD/EXTENDING entry of our key.
    Key,
    /// A HELD entry of our key past its deadline.
    Expired,
}

/// What a waiter should do after [`Table::prepare_wait`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Prepared {
    /// Sleep on the home's wait word while it still reads this value: whoever frees the
    /// entry will change it and wake the sleepers.
    Sleep(u32),
    /// The entry is no longer the one that was busy: try again now.
    Changed,
    /// The entry is between states (CLAIMING/EXTENDING) and cannot be flagged: sleep the
    /// step out without a wake-up.
    Poll,
}

/// How many times a claim restarts after yielding to a rival before it reports the key busy.
const MAX_RESTARTS: u32 = 16;

/// Wakes the processes sleeping on a home's wait word.
pub(crate) trait Notify {
    fn wake_all(&self, word: &AtomicU32);
}

/// The lock table over some slots, a clock, a liveness oracle and a waker.
pub(crate) struct Table<S, C, L, N> {
    slots: S,
    clock: C,
    liveness: L,
    notify: N,
}

impl<S, C, L, N> Table<S, C, L, N>
where
    S: AsRef<[Slot]>,
    C: Clock,
    L: Liveness,
    N: Notify,
{
    pub(crate) fn new(slots: S, clock: C, liveness: L, notify: N) -> Self {
        assert!(!slots.as_ref().is_empty() && slots.as_ref().len() <= u32::MAX as usize);
        Table {
            slots,
            clock,
            liveness,
            notify,
        }
    }

    #[inline]
    pub(crate) fn slots(&self) -> &[Slot] {
        self.slots.as_ref()
    }

    #[inline]
    pub(crate) fn now(&self) -> u64 {
        self.clock.now()
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

    /// The reach of a home, clamped: the file may have been written by anyone.
    #[inline]
    fn reach(&self, home: usize, order: Ordering) -> usize {
        let r = self.slots()[home].reach.load(order) as usize;
        r.min(self.slots().len() - 1)
    }

    /// Reads the key hash of an occupied slot and checks the word did not move meanwhile.
    #[inline]
    fn hash_of(&self, slot: &Slot, c: Word) -> Option<KeyHash> {
        let lo = slot.hash_lo.load(Ordering::Relaxed);
        let hi = slot.hash_hi.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        if slot.control.load(Ordering::Relaxed) != c.0 {
            return None;
        }
        Some(KeyHash { lo, hi })
    }

    #[inline]
    fn examine(&self, slot: &Slot, c: Word, hash: KeyHash, now: u64) -> Seen {
        match c.state() {
            State::Free => Seen::Free,
            _ if c.tag() != hash.tag() => Seen::Other,
            State::Claiming => Seen::Claiming,
            State::Held | State::Extending => match self.hash_of(slot, c) {
                None => Seen::Changed,
                Some(h) if h != hash => Seen::Other,
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

    /// Waits a bounded time for a CLAIMING/EXTENDING word to move on. Reaps it if its
    /// owner is dead. `None`: still there, owner alive.
    fn settle(&self, i: usize, c: Word) -> Option<Word> {
        let slot = &self.slots()[i];
        for round in 0..SETTLE_ROUNDS {
            let now = Word(slot.control.load(Ordering::SeqCst));
            if now != c {
                return Some(now);
            }
            spin(round);
        }
        // A CLAIMING entry's start time may not be written yet, so only the pid counts.
        if self.liveness.is_dead(c.pid(), None) {
            let _ = slot.control.compare_exchange(
                c.0,
                c.freed().0,
                Ordering::SeqCst,
                Ordering::Relaxed,
            );
            crash_point();
            return Some(Word(slot.control.load(Ordering::SeqCst)));
        }
        None
    }

    /// Frees an entry that is no longer its owner's to keep. Fails if it moved.
    fn force_release(&self, i: usize, c: Word, home: usize) -> bool {
        let ok = self.slots()[i]
            .control
            .compare_exchange(c.0, c.freed().0, Ordering::SeqCst, Ordering::Relaxed)
            .is_ok();
        crash_point();
        if ok && c.has_waiters() {
            self.wake(home);
        }
        ok
    }

    fn wake(&self, home: usize) {
        let word = &self.slots()[home].wait;
        word.fetch_add(1, Ordering::SeqCst);
        crash_point();
        self.notify.wake_all(word);
    }

    /// One attempt to take `req.key`, without waiting for a holder.
    pub(crate) fn try_acquire(&self, req: &Request<'_>) -> Result<Attempt, TableFull> {
        match self.try_acquire_fast(req) {
            Some(held) => Ok(Attempt::Acquired(held)),
            None => self.try_acquire_slow(req),
        }
    }

    /// The common case: the key's whole range is its home slot (reach 0), and that slot is
    /// free. This is the general algorithm with both scans reduced to that one slot. `None`
    /// means "not that case", not "busy": go on with [`try_acquire_slow`](Self::try_acquire_slow).
    #[inline(always)]
    pub(crate) fn try_acquire_fast(&self, req: &Request<'_>) -> Option<Held> {
        let slots = self.slots();
        let home = req.hash.home(slots.len());
        let slot = &slots[home];
        if slot.reach.load(Ordering::Acquire) != 0 {
            return None;
        }
        let c = Word(slot.control.load(Ordering::Relaxed));
        if c.state() != State::Free {
            return None;
        }
        let claiming = Word::new(
            State::Claiming,
            req.hash.tag(),
            req.owner.pid,
            c.gen().wrapping_add(1),
        );
        slot.control
            .compare_exchange(c.0, claiming.0, Ordering::SeqCst, Ordering::Relaxed)
            .ok()?;
        crash_point();
        self.fill(slot, req, self.now(), claiming);
        if slot.reach.load(Ordering::SeqCst) != 0 {
            // A rival raised the reach meanwhile: step back and scan like everyone else.
            self.withdraw(slot, claiming);
            return None;
        }
        Some(self.promote(slot, claiming, home, home, req))
    }

    #[inline]
    fn promote(
        &self,
        slot: &Slot,
        claiming: Word,
        i: usize,
        home: usize,
        req: &Request<'_>,
    ) -> Held {
        // Only the owner moves its own CLAIMING word (waiters flag HELD words only), so a
        // plain release store publishes the filled fields.
        let held = claiming.next(State::Held);
        slot.control.store(held.0, Ordering::Release);
        crash_point();
        Held {
            slot: i,
            home,
            word: held,
            lease: req.lease,
        }
    }

    /// The general claim: two scans of the key's range, with rivals and stale entries.
    #[inline(never)]
    pub(crate) fn try_acquire_slow(&self, req: &Request<'_>) -> Result<Attempt, TableFull> {
        let slots = self.slots();
        let n = slots.len();
        let hash = req.hash;
        let home = hash.home(n);
        let now = self.now();
        let mut restarts = 0;
        'restart: loop {
            // Pass 1 (advisory): is the key held, and where is the first free slot?
            let reach = self.reach(home, Ordering::Acquire);
            let mut free = None;
            let mut d = 0;
            while d < n {
                if d > reach && free.is_some() {
                    break;
                }
                let i = self.at(home, d);
                let c = Word(slots[i].control.load(Ordering::SeqCst));
                match self.examine(&slots[i], c, hash, now) {
                    Seen::Free => {
                        if free.is_none() {
                            free = Some((d, c));
                            // The classic mistake the protocol exists to avoid: stop at the
                            // first free slot, as if the key could not be further on.
                            #[cfg(shmlock_broken)]
                            break;
                        }
                    }
                    Seen::Changed => continue,
                    // Beyond the reach read above, an entry of the key can only belong to a
                    // claimer that published after that read; pass 2 sees it.
                    _ if d > reach => {}
                    Seen::Other => {}
                    Seen::Claiming => match self.settle(i, c) {
                        Some(_) => continue,
                        None => return Ok(Attempt::Busy(busy(i, home, c))),
                    },
                    Seen::Key => return Ok(Attempt::Busy(busy(i, home, c))),
                    Seen::Expired => {
                        self.force_release(i, c, home);
                        continue;
                    }
                }
                d += 1;
            }
            let Some((fd, fc)) = free else {
                if self.reap_any(now) {
                    continue 'restart;
                }
                return Err(TableFull);
            };

            // Claim: make room in the reach first, so every later scan covers our slot.
            if fd > reach {
                slots[home].reach.fetch_max(fd as u32, Ordering::SeqCst);
                crash_point();
            }
            let fi = self.at(home, fd);
            let slot = &slots[fi];
            let claiming = Word::new(
                State::Claiming,
                hash.tag(),
                req.owner.pid,
                fc.gen().wrapping_add(1),
            );
            if slot
                .control
                .compare_exchange(fc.0, claiming.0, Ordering::SeqCst, Ordering::Relaxed)
                .is_err()
            {
                continue 'restart;
            }
            crash_point();
            self.fill(slot, req, now, claiming);

            // Pass 2 (decisive): after publishing, look at the whole range again.
            let range = self.reach(home, Ordering::SeqCst).max(fd);
            // The broken variant trusts pass 1 and skips the rescan.
            #[cfg(shmlock_broken)]
            let range = {
                let _ = range;
                0
            };
            let mut d = 0;
            while d <= range {
                if d == fd {
                    d += 1;
                    continue;
                }
                let i = self.at(home, d);
                let c = Word(slots[i].control.load(Ordering::SeqCst));
                match self.examine(&slots[i], c, hash, now) {
                    Seen::Free | Seen::Other => {}
                    Seen::Changed => continue,
                    Seen::Expired => {
                        self.force_release(i, c, home);
                        continue;
                    }
                    Seen::Key => {
                        self.withdraw(slot, claiming);
                        return Ok(Attempt::Busy(busy(i, home, c)));
                    }
                    Seen::Claiming if d < fd => {
                        // A rival nearer home has priority: step aside, let it finish.
                        self.withdraw(slot, claiming);
                        let settled = self.settle(i, c);
                        restarts += 1;
                        if settled.is_none() || restarts > MAX_RESTARTS {
                            return Ok(Attempt::Busy(busy(i, home, c)));
                        }
                        continue 'restart;
                    }
                    Seen::Claiming => match self.settle(i, c) {
                        Some(_) => continue,
                        None => {
                            // The rival farther out may not have seen us: we cannot proceed.
                            self.withdraw(slot, claiming);
                            return Ok(Attempt::Busy(busy(i, home, c)));
                        }
                    },
                }
                d += 1;
            }

            return Ok(Attempt::Acquired(
                self.promote(slot, claiming, fi, home, req),
            ));
        }
    }

    /// Writes the fields of a freshly claimed slot (owner-only, before promotion). The
    /// owner's identity goes first: a claimer that dies after this store is judged by pid
    /// and start time, so a reused pid cannot keep its claim alive.
    #[inline]
    fn fill(&self, slot: &Slot, req: &Request<'_>, now: u64, claiming: Word) {
        slot.owner_start.store(
            OwnerField::new(req.owner.start, claiming).0,
            Ordering::Relaxed,
        );
        crash_point();
        // The same key in the same slot again is the common case: skip rewriting its name.
        if slot.hash_lo.load(Ordering::Relaxed) != req.hash.lo
            || slot.hash_hi.load(Ordering::Relaxed) != req.hash.hi
        {
            slot.hash_lo.store(req.hash.lo, Ordering::Relaxed);
            slot.hash_hi.store(req.hash.hi, Ordering::Relaxed);
            crash_point();
            slot.write_preview(req.key);
        }
        slot.lease.store(req.lease, Ordering::Relaxed);
        slot.deadline
            .store(deadline(now, req.exptime), Ordering::Relaxed);
        slot.acquired_at.store(now, Ordering::Relaxed);
        slot.token.store(0, Ordering::Relaxed);
        crash_point();
    }

    fn withdraw(&self, slot: &Slot, claiming: Word) {
        slot.control.store(claiming.freed().0, Ordering::Release);
        crash_point();
    }

    /// The table has no free slot: reap one expired or dead entry of any key (expired ones
    /// first: they cost no system call).
    #[cold]
    fn reap_any(&self, now: u64) -> bool {
        let n = self.slots().len();
        (0..n).any(|i| self.reap_slot(i, now, false))
            || (0..n).any(|i| self.reap_slot(i, now, true))
    }

    /// Frees every entry past its deadline or whose owner is dead; returns how many.
    pub(crate) fn reap_all(&self) -> usize {
        let now = self.now();
        (0..self.slots().len())
            .filter(|&i| self.reap_slot(i, now, true))
            .count()
    }

    /// Frees slot `i` if it holds an expired entry or (with `check_owner`) one whose owner
    /// is dead. The home to wake is computed from the entry's own hash.
    fn reap_slot(&self, i: usize, now: u64, check_owner: bool) -> bool {
        let slots = self.slots();
        let slot = &slots[i];
        let c = Word(slot.control.load(Ordering::SeqCst));
        let expired = c.state() == State::Held && slot.deadline.load(Ordering::Relaxed) <= now;
        if c.state() == State::Free || !(expired || check_owner && self.owner_dead(slot, c)) {
            return false;
        }
        // Only HELD words carry the waiters bit, and their hash is published with them.
        let home = self.hash_of(slot, c).map_or(i, |h| h.home(slots.len()));
        self.force_release(i, c, home)
    }

    fn owner_dead(&self, slot: &Slot, c: Word) -> bool {
        if c.state() == State::Free {
            return false;
        }
        let owner = OwnerField(slot.owner_start.load(Ordering::Relaxed));
        fence(Ordering::Acquire);
        if slot.control.load(Ordering::Relaxed) != c.0 {
            return false; // moved on: not this owner's entry any more
        }
        // A HELD/EXTENDING entry published its owner with the word; a CLAIMING one only
        // once the generations agree (before that the field may be the last occupant's).
        let start = match c.state() {
            State::Claiming if !owner.written_by(c) => None,
            _ => Some(owner.start()),
        };
        self.liveness.is_dead(c.pid(), start)
    }

    /// Checks the owner of the entry that made an attempt busy; reaps the entry if the owner
    /// is dead. `true` when the entry is gone or changed, so retrying is worthwhile now.
    pub(crate) fn reap_if_dead(&self, b: &Busy) -> bool {
        let slot = &self.slots()[b.slot];
        let c = Word(slot.control.load(Ordering::Acquire));
        if c.ident() != b.word.ident() {
            return true;
        }
        if self.owner_dead(slot, c) {
            self.force_release(b.slot, c, b.home);
            return true;
        }
        false
    }

    /// Before sleeping on a busy key: flags the entry as waited on and returns the wait-word
    /// value to sleep on. The value is read before the flag is checked or set, so a release
    /// after the flag changes it, and the kernel refuses the sleep or ends it: no lost
    /// wake-up. (A release before the flag makes the flagging CAS fail: `Changed`.)
    pub(crate) fn prepare_wait(&self, b: &Busy) -> Prepared {
        let slots = self.slots();
        let seen = slots[b.home].wait.load(Ordering::SeqCst);
        let slot = &slots[b.slot];
        let c = Word(slot.control.load(Ordering::SeqCst));
        if c.ident() != b.word.ident() {
            return Prepared::Changed;
        }
        if c.state() != State::Held {
            return Prepared::Poll;
        }
        if !c.has_waiters()
            && slot
                .control
                .compare_exchange(c.0, c.0 | WAITERS, Ordering::SeqCst, Ordering::Relaxed)
                .is_err()
        {
            return Prepared::Changed;
        }
        crash_point();
        Prepared::Sleep(seen)
    }

    /// The wait word of a home (what [`Prepared::Sleep`] refers to).
    pub(crate) fn wait_word(&self, home: usize) -> &AtomicU32 {
        &self.slots()[home].wait
    }

    /// Whether `held` is still this holder's: same word (but for the waiters bit) and lease.
    #[inline]
    fn owns(&self, slot: &Slot, c: Word, held: &Held) -> bool {
        c.ident() == held.word.ident() && slot.lease.load(Ordering::Relaxed) == held.lease
    }

    /// Releases a hold. `Err(Lost)` if it was taken from us; the new owner is untouched.
    #[inline]
    pub(crate) fn release(&self, held: &Held) -> Result<(), Lost> {
        let slot = &self.slots()[held.slot];
        loop {
            let c = Word(slot.control.load(Ordering::Acquire));
            if !self.owns(slot, c, held) {
                return Err(Lost);
            }
            if slot
                .control
                .compare_exchange(c.0, c.freed().0, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
            {
                crash_point();
                if c.has_waiters() {
                    self.wake(held.home);
                }
                return Ok(());
            }
            // Only the waiters bit can have changed under a live hold: retry.
        }
    }

    /// Moves the deadline of a hold to `now + exptime` (0 = never). A lease already past
    /// its deadline cannot be renewed: it is released and reported lost.
    pub(crate) fn extend(&self, held: &mut Held, exptime: u64) -> Result<(), Lost> {
        let slot = &self.slots()[held.slot];
        let now = self.now();
        loop {
            let c = Word(slot.control.load(Ordering::Acquire));
            if !self.owns(slot, c, held) {
                return Err(Lost);
            }
            if slot.deadline.load(Ordering::Relaxed) <= now {
                if self.force_release(held.slot, c, held.home) {
                    return Err(Lost);
                }
                continue;
            }
            let waiters = c.0 & WAITERS;
            let extending = Word(c.next(State::Extending).0 | waiters);
            if slot
                .control
                .compare_exchange(c.0, extending.0, Ordering::SeqCst, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            crash_point();
            slot.deadline
                .store(deadline(now, exptime), Ordering::Relaxed);
            crash_point();
            // Nobody sets the waiters bit on an EXTENDING word, so `waiters` is current.
            let back = Word(extending.next(State::Held).0 | waiters);
            slot.control.store(back.0, Ordering::Release);
            crash_point();
            held.word = back;
            return Ok(());
        }
    }

    /// A fencing token for `held`: greater than the token of every earlier holder of the
    /// key. Taken from the home's counter, then checked against the hold, so a holder that
    /// lost its lease before asking gets `None`, never a token that outranks its successor.
    pub(crate) fn token(&self, held: &Held) -> Option<u64> {
        let slots = self.slots();
        let t = slots[held.home]
            .fence
            .fetch_add(1, Ordering::SeqCst)
            .wrapping_add(1);
        crash_point();
        let slot = &slots[held.slot];
        let c = Word(slot.control.load(Ordering::SeqCst));
        if !self.owns(slot, c, held) {
            return None;
        }
        slot.token.store(t, Ordering::Relaxed);
        Some(t)
    }

    /// The live entry of a key, if any (no side effects).
    pub(crate) fn find(&self, hash: KeyHash) -> Option<Busy> {
        let slots = self.slots();
        let home = hash.home(slots.len());
        let now = self.now();
        let reach = self.reach(home, Ordering::Acquire);
        let mut d = 0;
        while d <= reach {
            let i = self.at(home, d);
            let c = Word(slots[i].control.load(Ordering::Acquire));
            match self.examine(&slots[i], c, hash, now) {
                Seen::Changed => continue,
                Seen::Key => return Some(busy(i, home, c)),
                _ => {}
            }
            d += 1;
        }
        None
    }

    /// Breaks the live entry of a key, whoever holds it (its holder's next unlock or renewal
    /// gets `Lost`). Returns the entry as it was and whether its owner was dead, or `None`
    /// if the key was not held.
    pub(crate) fn break_hold(&self, hash: KeyHash) -> Option<(Entry, bool)> {
        loop {
            let b = self.find(hash)?;
            let Some(snapshot) = self.entry(b.slot) else {
                continue; // moved meanwhile: look again
            };
            let dead = self.is_owner_dead(&snapshot);
            if snapshot.word == b.word && self.force_release(b.slot, b.word, b.home) {
                return Some((snapshot, dead));
            }
        }
    }

    /// Whether the owner recorded in an entry is dead, as the liveness oracle judges it.
    pub(crate) fn is_owner_dead(&self, e: &Entry) -> bool {
        self.owner_dead(&self.slots()[e.slot as usize], e.word)
    }

    /// Snapshots every occupied slot (for inspection; consistent per slot).
    pub(crate) fn entries(&self) -> Vec<Entry> {
        (0..self.slots().len())
            .filter_map(|i| self.entry(i))
            .collect()
    }

    /// A consistent snapshot of slot `i`, if it is occupied.
    fn entry(&self, i: usize) -> Option<Entry> {
        let slot = &self.slots()[i];
        let c = Word(slot.control.load(Ordering::Acquire));
        if c.state() == State::Free {
            return None;
        }
        let hash = KeyHash {
            lo: slot.hash_lo.load(Ordering::Relaxed),
            hi: slot.hash_hi.load(Ordering::Relaxed),
        };
        let deadline = slot.deadline.load(Ordering::Relaxed);
        let acquired_at = slot.acquired_at.load(Ordering::Relaxed);
        let token = slot.token.load(Ordering::Relaxed);
        let (key_len, preview) = slot.read_preview();
        fence(Ordering::Acquire);
        if slot.control.load(Ordering::Relaxed) != c.0 {
            return None; // moved while read: not a consistent snapshot
        }
        Some(Entry {
            slot: i as u32,
            word: c,
            hash,
            deadline,
            acquired_at,
            token,
            key_len,
            preview,
        })
    }
}

fn busy(slot: usize, home: usize, word: Word) -> Busy {
    Busy { slot, home, word }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::clock::Monotonic;
    use crate::process::{self, Kernel};

    struct Quiet;
    impl Notify for Quiet {
        fn wake_all(&self, _: &AtomicU32) {}
    }

    fn table() -> Table<Vec<Slot>, Monotonic, Kernel, Quiet> {
        let slots = (0..8).map(|_| Slot::default()).collect();
        Table::new(slots, Monotonic, Kernel { judge: true }, Quiet)
    }

    fn request(hash: KeyHash, owner: Owner, lease: u64) -> Request<'static> {
        Request {
            key: b"k",
            hash,
            owner,
            lease,
            exptime: 60_000_000_000,
        }
    }

    #[test]
    fn a_live_pid_with_another_start_time_is_a_dead_owner() {
        let t = table();
        let me = process::current();
        let hash = KeyHash::of(b"reused", 1);
        // an entry that claims our pid, but a process started at another time: the pid
        // was reused after its owner died
        let impostor = Owner {
            pid: me.pid,
            start: me.start + 1,
        };
        let Ok(Attempt::Acquired(_)) = t.try_acquire(&request(hash, impostor, 1)) else {
            panic!()
        };
        let Ok(Attempt::Busy(b)) = t.try_acquire(&request(hash, me, 2)) else {
            panic!()
        };
        assert!(t.reap_if_dead(&b));
        let Ok(Attempt::Acquired(h)) = t.try_acquire(&request(hash, me, 3)) else {
            panic!("not reclaimed")
        };
        // our own entry, with the right start time, is alive
        let Ok(Attempt::Busy(b)) = t.try_acquire(&request(hash, me, 4)) else {
            panic!()
        };
        assert!(!t.reap_if_dead(&b));
        assert_eq!(t.reap_all(), 0);
        t.release(&h).unwrap();
    }

    #[test]
    fn a_claim_is_judged_by_start_time_once_its_owner_wrote_it() {
        let t = table();
        let me = process::current();
        let slot = &t.slots()[0];
        let claim = Word::new(State::Claiming, 0, me.pid, 5);
        slot.control.store(claim.0, Ordering::SeqCst);
        // the field is still the previous occupant's (generation 4): only the pid counts
        let earlier = Word::new(State::Claiming, 0, me.pid, 4);
        slot.owner_start
            .store(OwnerField::new(me.start + 1, earlier).0, Ordering::SeqCst);
        assert!(!t.owner_dead(slot, claim));
        // written by this claim, with another start time: the claimer died, its pid reused
        slot.owner_start
            .store(OwnerField::new(me.start + 1, claim).0, Ordering::SeqCst);
        assert!(t.owner_dead(slot, claim));
        slot.owner_start
            .store(OwnerField::new(me.start, claim).0, Ordering::SeqCst);
        assert!(!t.owner_dead(slot, claim));
    }

    #[test]
    fn reap_all_frees_expired_and_dead_entries_only() {
        let t = table();
        let me = process::current();
        let dead = Owner {
            pid: me.pid,
            start: me.start + 1,
        };
        let mut expiring = request(KeyHash::of(b"expiring", 1), me, 1);
        expiring.exptime = 1;
        for r in [
            expiring,
            request(KeyHash::of(b"dead", 1), dead, 2),
            request(KeyHash::of(b"live", 1), me, 3),
        ] {
            assert!(matches!(t.try_acquire(&r), Ok(Attempt::Acquired(_))));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        assert_eq!(t.entries().len(), 3);
        assert_eq!(t.reap_all(), 2);
        let left = t.entries();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].hash, KeyHash::of(b"live", 1));
    }
}
