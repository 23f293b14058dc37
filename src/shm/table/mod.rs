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
//! Freeing someone else's HELD entry takes two steps. One CAS from the word a look found
//! expired (or its owner dead) would free a later, live hold if the looker stopped
//! between its look and its CAS for as long as the slot took to bring its 26-bit
//! generation round to the same word. So the steal CAS only freezes the entry (STEALING
//! is the HELD word with its state changed, nothing else), and the look is made again at
//! the fields that are really there, which nobody writes while the word is STEALING;
//! then FREE, or the HELD word exactly as it was. Anyone who meets a STEALING word ends
//! it the same way (the holder does before it releases, renews or fences), so a steal
//! stopped halfway blocks nobody. What remains is a second-order wrap: a looker stopped
//! between its second look and its final CAS, while the word comes round and *another*
//! steal of the same word is in progress at the moment it resumes.
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
//! # Why two live entries of one key cannot exist
//!
//! A claimer reads its home's claim count (the home's `fence` word), scans the key's
//! whole range (pass 1), publishes a CLAIMING entry (or a HELD one, below), and then counts
//! its claim with an RMW of that same word. RMWs of one location are totally ordered and
//! each reads the one before, so of two claimers of a key the later count reads the
//! earlier (release/acquire): the earlier claim happened before the later claimer's
//! look after its count. A claimer whose count finds the word as it read it before pass 1
//! had no rival in flight (a rival that counted earlier published before that read, so
//! pass 1 saw it; one that counts later reads this count, and looks again); otherwise it
//! rescans the range (pass 2) and defers to what it finds. A freed slot earlier in the
//! range (the "release hole") changes nothing: nobody stops at the first free slot when
//! looking for the key. Conflicts resolve by distance from home: a claimer that sees
//! a CLAIMING entry of its key (by tag) nearer home withdraws; one that sees it farther
//! away waits for it to resolve; one that sees a live HELD entry of its key withdraws.
//! Waits only point away from home, so they cannot form a cycle, and a claimer that cannot
//! wait any longer withdraws, which is always safe. The count is 64 bits and never wraps;
//! fencing tokens are taken from the same word (they only grow, and skip what claims
//! counted).
//!
//! The common case, a key whose home is free and has reach 0, claims the home word from
//! exactly "free, reach 0", and needs neither count nor scan: a rival that must place
//! the key farther out raises the reach with an RMW of that same word first, so either our
//! CAS fails or the rival's raise reads our CLAIMING entry (RMWs of one word are totally
//! ordered, each reading the one before) and its rescan (a claimer that raised the reach
//! always rescans) defers to it. When the free
//! home's fields already hold exactly what the claim would write (the same thread took
//! the same key there within the same clock tick: hash, lease, deadline), the claim goes
//! from FREE to HELD in that one CAS: a free slot's fields change only under an owner, so
//! they cannot change between the reads and a CAS that finds the slot still free.
//!
//! What loom proves here and what it cannot: loom checks every interleaving and every
//! value an acquire/release execution allows, and it models `SeqCst` fences, but it
//! models `SeqCst` accesses as `AcqRel` (it has no single total order of them). The
//! argument above therefore rests only on RMWs of one location and acquire/release, all
//! of which loom models; the `SeqCst` accesses in the code are belt and braces. Loom does not model time (the clock is driven by the models), the kernel's locks
//! (a fake registry lock table), or processes (threads stand in, a "crash" unwinds a
//! thread at a chosen step and never runs it again).
//!
//! # Dead and stalled owners
//!
//! A process can die or stop at any instruction. What it leaves behind is one entry of
//! its own key (CLAIMING, HELD, EXTENDING or BROKEN), recorded with its [`OwnerId`]. A
//! waiter reaps it when the registry says the owner is dead (see `registry.rs`), expiry
//! reaps a HELD entry anyway, and a CLAIMING entry (or an EXTENDING one past its
//! deadline) that stays unchanged for the stall bound is broken, so no key stays busy
//! longer than max(its lease, the bound) after its owner stops making progress. No state
//! of one key blocks another key: `reach` and the home words are single atomic updates.

use std::time::Duration;

use crate::shm::clock::{deadline, TICK_NS};
use crate::shm::primitive::{crash_point, fence, spin, AtomicU64, Ordering, SETTLE_ROUNDS};
use crate::shm::registry::OwnerId;
use crate::shm::slot::{Cold, Slot, State, Word, REACH_OVERFLOW, WAITERS};

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

    /// 7 bits of the hash, as control words carry them.
    pub(crate) fn tag(self) -> u8 {
        (self.hi >> 57) as u8
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
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Attempt {
    Acquired(Held),
    Busy(Busy),
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
    /// 0 unless the holder took a token (and the cold line still shows it).
    pub token: u64,
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

/// How many times a claim restarts after yielding to a rival before it reports the key busy.
const MAX_RESTARTS: u32 = 16;

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

    /// Raises a home's reach to at least `d`, before an entry is published there.
    fn raise_reach(&self, home: usize, d: usize) {
        let slot = &self.slots()[home];
        let d = d.min(u32::MAX as usize) as u32;
        if d >= REACH_OVERFLOW {
            slot.reach.fetch_max(d, Ordering::SeqCst);
            crash_point();
        }
        let mut c = Word(slot.control.load(Ordering::SeqCst));
        while c.reach() < d.min(REACH_OVERFLOW) {
            match slot.control.compare_exchange(
                c.0,
                c.with_reach(d).0,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => break,
                Err(now) => c = Word(now),
            }
        }
        crash_point();
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

    /// Whether the owner of the HELD or EXTENDING entry `c` of `slot` is dead, judged with
    /// the hold's lease. `false` if the entry moved on meanwhile (nothing to free then).
    fn holder_dead(&self, slot: &Slot, c: Word) -> bool {
        let lease = slot.lease.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        Word(slot.control.load(Ordering::Relaxed)).ident() == c.ident()
            && self.env.is_holder_dead(c.owner(), lease)
    }

    #[inline]
    fn examine(&self, slot: &Slot, c: Word, hash: KeyHash, now: u64) -> Seen {
        match c.state() {
            State::Free => Seen::Free,
            State::Broken => Seen::Other,
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

    /// Waits a bounded time for a CLAIMING word to move on, then frees it if its owner is
    /// dead or breaks it if it stalled. `None`: still there, owner alive and not stalled.
    fn settle(&self, i: usize, c: Word) -> Option<Word> {
        let slot = &self.slots()[i];
        // A claim this process has watched for the whole bound is not worth a spin.
        if !self.env.stalled(&self.cold(i).seen, c) {
            for round in 0..SETTLE_ROUNDS {
                let now = Word(slot.control.load(Ordering::SeqCst));
                if now.ident() != c.ident() {
                    return Some(now);
                }
                spin(round);
            }
        }
        if self.unstick(i, c) {
            return Some(self.word(i, Ordering::SeqCst));
        }
        None
    }

    /// Frees a CLAIMING or EXTENDING entry whose owner is dead, or breaks one that stalled
    /// (an EXTENDING one only once its deadline passed: its holder's lease still counts).
    /// `true` if the entry changed (by us or anyone).
    fn unstick(&self, i: usize, c: Word) -> bool {
        let slot = &self.slots()[i];
        let stalled = self.env.stalled(&self.cold(i).seen, c)
            && (c.state() == State::Claiming
                || slot.deadline.load(Ordering::Relaxed) <= self.now());
        // An EXTENDING entry is a published hold: its lease names its owner's whole
        // registry generation (a CLAIMING one's fields may still be the last occupant's).
        let dead = if c.state() == State::Extending {
            self.holder_dead(slot, c)
        } else {
            self.env.is_dead(c.owner())
        };
        let to = if dead {
            c.freed()
        } else if stalled {
            c.next(State::Broken)
        } else {
            return Word(slot.control.load(Ordering::SeqCst)).ident() != c.ident();
        };
        self.replace(i, c, to);
        true
    }

    /// Moves entry `c` of slot `i` to `to` (the reach and waiters bits as they are now,
    /// but waiters are woken and cleared). `false` if the entry moved on meanwhile.
    fn replace(&self, i: usize, c: Word, to: Word) -> bool {
        let slot = &self.slots()[i];
        let mut cur = c;
        loop {
            let new = to.with_reach(cur.reach());
            match slot
                .control
                .compare_exchange(cur.0, new.0, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => {
                    crash_point();
                    if cur.has_waiters() {
                        self.wake(i);
                    }
                    return true;
                }
                Err(now) if Word(now).ident() == c.ident() => cur = Word(now),
                Err(_) => return false,
            }
        }
    }

    /// Frees an entry that is no longer its owner's to keep (dead owner, forced).
    fn force_release(&self, i: usize, c: Word) -> bool {
        self.replace(i, c, c.freed())
    }

    /// Frees the HELD entry `c` of slot `i`, found past its deadline or with its owner
    /// dead, in two steps: STEALING, then the same look again, then FREE (or back to `c`).
    /// One CAS from `c` would free a later, live hold if this thread stopped after its
    /// look for as long as the slot took to bring its 26-bit generation round to the same
    /// word; in STEALING the fields cannot change (the holder ends the check before it
    /// acts), so the second look is at the hold that is really there. `true` if freed.
    pub(crate) fn steal(&self, i: usize, c: Word) -> bool {
        let slot = &self.slots()[i];
        let mut cur = c;
        let frozen = loop {
            let frozen = cur.with_state(State::Stealing);
            match slot
                .control
                .compare_exchange(cur.0, frozen.0, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => break frozen,
                Err(now) if Word(now).ident() == c.ident() => cur = Word(now),
                Err(_) => return false,
            }
        };
        crash_point();
        self.resolve_steal(i, frozen)
    }

    /// Ends the check `frozen` (a STEALING word) of slot `i`, which anyone may do, and
    /// with the same outcome: FREE if the frozen hold is past its deadline or its owner is
    /// dead, else HELD as it was. `true` if this call freed it.
    fn resolve_steal(&self, i: usize, frozen: Word) -> bool {
        let slot = &self.slots()[i];
        let deadline = slot.deadline.load(Ordering::Relaxed);
        let lease = slot.lease.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        if Word(slot.control.load(Ordering::SeqCst)).ident() != frozen.ident() {
            return false; // ended by someone else
        }
        let doomed = deadline <= self.now()
            || (self.env.reaps_dead_holders() && self.env.is_holder_dead(frozen.owner(), lease));
        let mut cur = frozen;
        loop {
            let to = if doomed {
                cur.freed()
            } else {
                cur.with_state(State::Held)
            };
            match slot
                .control
                .compare_exchange(cur.0, to.0, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => {
                    crash_point();
                    if doomed && cur.has_waiters() {
                        self.wake(i);
                    }
                    return doomed;
                }
                Err(now) if Word(now).ident() == frozen.ident() => cur = Word(now),
                Err(_) => return false,
            }
        }
    }

    /// Wakes the processes asleep on slot `i`'s control word (they flagged the entry that
    /// just left it).
    fn wake(&self, i: usize) {
        self.env.wake_all(&self.slots()[i].control);
    }

    /// One attempt to take `req.key`, without waiting for a holder.
    pub(crate) fn try_acquire(&self, req: &Request<'_>) -> Result<Attempt, TableFull> {
        match self.try_acquire_fast(req) {
            Some(held) => Ok(Attempt::Acquired(held)),
            None => self.try_acquire_slow(req),
        }
    }

    /// The common case: the key's home is free and its reach is 0, so the home is the
    /// key's whole range. `None` means "not that case", not "busy": go on with
    /// [`try_acquire_slow`](Self::try_acquire_slow).
    #[inline(always)]
    pub(crate) fn try_acquire_fast(&self, req: &Request<'_>) -> Option<Held> {
        let slots = self.slots();
        let home = req.hash.home(slots.len());
        let slot = &slots[home];
        let c = Word(slot.control.load(Ordering::Acquire));
        if c.state() != State::Free || c.reach() != 0 {
            return None;
        }
        let now = self.now();
        let until = deadline(now, req.exptime);
        let held = |word| Held {
            slot: home,
            home,
            word,
            lease: req.lease,
            acquired_at: now,
        };
        // Only from "free, reach 0": a rival that raised the reach first makes the CAS
        // fail. A free slot's fields change only under an owner, so if they already say
        // what this hold would write (this thread took this key here within this clock
        // tick), the hold is published by the one CAS.
        if Self::fields_say(slot, req, now, until) {
            let word = Word::new(
                State::Held,
                req.hash.tag(),
                req.owner,
                c.gen().wrapping_add(1),
                c,
            );
            slot.control
                .compare_exchange(c.0, word.0, Ordering::SeqCst, Ordering::Relaxed)
                .ok()?;
            crash_point();
            // The fields are ours to keep now, but were they still the ones checked when
            // the CAS succeeded? A claimer stopped between the check and the CAS while the
            // free word came round to the same value would publish someone else's.
            if !Self::fields_say(slot, req, now, until) {
                self.withdraw(slot, word);
                return None;
            }
            return Some(held(word));
        }
        if slot.hash_lo.load(Ordering::Relaxed) != req.hash.lo {
            // another key's slot: `fill` will write this key's preview on the cold line
            self.cold(home).prefetch_for_write();
        }
        let claiming = Word::new(
            State::Claiming,
            req.hash.tag(),
            req.owner,
            c.gen().wrapping_add(1),
            c,
        );
        slot.control
            .compare_exchange(c.0, claiming.0, Ordering::SeqCst, Ordering::Relaxed)
            .ok()?;
        crash_point();
        self.fill(home, req, now);
        self.promote(slot, claiming).ok().map(held)
    }

    /// Whether a free slot's fields already say what a claim of `req` would write (this
    /// thread took this key there within this clock tick), so the hold can be published as
    /// HELD by the claim's CAS itself.
    #[inline(always)]
    fn fields_say(slot: &Slot, req: &Request<'_>, now: u64, until: u64) -> bool {
        slot.hash_lo.load(Ordering::Relaxed) == req.hash.lo
            && slot.hash_hi.load(Ordering::Relaxed) == req.hash.hi
            && slot.lease.load(Ordering::Relaxed) == req.lease
            && slot.deadline.load(Ordering::Relaxed) == until
            && slot.acquired_at.load(Ordering::Relaxed) == now
    }

    /// CLAIMING → HELD, keeping the reach bits a rival may have raised meanwhile. `Err`:
    /// the claim was broken as stalled (and has been backed out of).
    #[inline]
    fn promote(&self, slot: &Slot, claiming: Word) -> Result<Word, Lost> {
        let mut cur = claiming;
        loop {
            let held = cur.next(State::Held);
            match slot
                .control
                .compare_exchange(cur.0, held.0, Ordering::SeqCst, Ordering::Relaxed)
            {
                Ok(_) => {
                    crash_point();
                    return Ok(held);
                }
                Err(now) if Word(now).ident() == claiming.ident() => cur = Word(now),
                Err(_) => {
                    self.back_out(slot, claiming);
                    return Err(Lost);
                }
            }
        }
    }

    /// Takes back a claim that lost to a rival: CLAIMING (or a HELD published directly)
    /// → FREE by its owner, waking anyone who flagged it; backs out if the claim was
    /// broken meanwhile.
    fn withdraw(&self, slot: &Slot, claim: Word) {
        let mut cur = claim;
        loop {
            match slot.control.compare_exchange(
                cur.0,
                cur.freed().0,
                Ordering::SeqCst,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    crash_point();
                    if cur.has_waiters() {
                        let i = self.index_of(slot);
                        self.wake(i);
                    }
                    return;
                }
                Err(now) if Word(now).ident() == claim.ident() => cur = Word(now),
                Err(_) => {
                    if claim.state() == State::Claiming {
                        self.back_out(slot, claim);
                    }
                    // A HELD claim taken by someone else (forced): nothing of ours is left.
                    return;
                }
            }
        }
    }

    /// The index of a slot of this table.
    fn index_of(&self, slot: &Slot) -> usize {
        let base = self.slots().as_ptr() as usize;
        (slot as *const Slot as usize - base) / std::mem::size_of::<Slot>()
    }

    /// Our CLAIMING or EXTENDING entry `mine` was broken as stalled: the BROKEN slot is
    /// still ours (nobody reuses it while we live), so free it now that we write no more.
    #[cold]
    fn back_out(&self, slot: &Slot, mine: Word) {
        let broken = mine.next(State::Broken);
        let mut cur = Word(slot.control.load(Ordering::SeqCst));
        while cur.ident() == broken.ident() {
            match slot.control.compare_exchange(
                cur.0,
                cur.freed().0,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => break,
                Err(now) => cur = Word(now),
            }
        }
        crash_point();
    }

    /// The general claim: two scans of the key's range, with rivals and stale entries.
    #[inline(never)]
    pub(crate) fn try_acquire_slow(&self, req: &Request<'_>) -> Result<Attempt, TableFull> {
        let slots = self.slots();
        let n = slots.len();
        let hash = req.hash;
        let home = hash.home(n);
        let now = self.now();
        // The key held at its home, as a waiter finds it again and again: say so after
        // one look at the home's line (what pass 1 would find there first).
        let hc = self.word(home, Ordering::Acquire);
        if hc.state() == State::Held && hc.tag() == hash.tag() {
            if let Seen::Key = self.examine(&slots[home], hc, hash, now) {
                return Ok(Attempt::Busy(busy(home, home, hc, hash)));
            }
        }
        let mut restarts = 0;
        'restart: loop {
            // The home's claim count, read before anything else: a claimer of one of this
            // home's keys that counted its claim before this read published it before,
            // so pass 1 sees it (see "Why two live entries of one key cannot exist").
            let claims = slots[home].fence.load(Ordering::SeqCst);
            let reach = self.reach(home, Ordering::Acquire);
            let mut free = None;
            // A free home is the nearest place there is.
            let hc = self.word(home, Ordering::SeqCst);
            if hc.state() == State::Free && !cfg!(shmlock_broken) {
                free = Some((0, hc));
            }
            // Pass 1: is the key held anywhere in its range, and where is the first free
            // slot?
            let mut d = 0;
            while d < n {
                if d > reach && free.is_some() {
                    break;
                }
                let i = self.at(home, d);
                let c = self.word(i, Ordering::SeqCst);
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
                    // claimer that published after that read: its count moves the home's
                    // claim count, and pass 2 sees it.
                    _ if d > reach => {}
                    Seen::Other => {}
                    Seen::Claiming => match self.settle(i, c) {
                        Some(_) => continue,
                        None => return Ok(Attempt::Busy(busy(i, home, c, hash))),
                    },
                    Seen::Key => return Ok(Attempt::Busy(busy(i, home, c, hash))),
                    Seen::Expired => {
                        self.steal(i, c);
                        continue;
                    }
                    Seen::Stealing => {
                        self.resolve_steal(i, c);
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
            let raised = fd > reach;
            if raised {
                self.raise_reach(home, fd);
            }
            let fi = self.at(home, fd);
            let slot = &slots[fi];
            // With the fields already right the claim is published as HELD (and taken back
            // like any claim if the rescan finds a conflict); else CLAIMING, then filled.
            let until = deadline(now, req.exptime);
            let direct = Self::fields_say(slot, req, now, until);
            let state = if direct { State::Held } else { State::Claiming };
            let claiming = Word::new(state, hash.tag(), req.owner, fc.gen().wrapping_add(1), fc);
            if slot
                .control
                .compare_exchange(fc.0, claiming.0, Ordering::SeqCst, Ordering::Relaxed)
                .is_err()
            {
                continue 'restart;
            }
            crash_point();
            // Count the claim at the home (an RMW of one word every slow claim of this
            // home's keys makes: they are totally ordered, and each reads the one before).
            // Of two claimers of a key, the later count reads the earlier, so its rescan
            // sees the earlier claim. A count that finds no claim since this claimer's pass
            // 1 began means no rival was in flight: pass 1 was decisive. A raised reach
            // may have met a claim at the home on the fast path, which counts nothing.
            let rivals = slots[home].fence.fetch_add(1, Ordering::SeqCst) != claims || raised;
            crash_point();
            if !direct {
                self.fill(fi, req, now);
            }

            // Pass 2 (decisive when a rival was in flight): look at the whole range again.
            let range = if rivals {
                self.reach(home, Ordering::SeqCst).max(fd)
            } else {
                0
            };
            // The broken variant trusts pass 1 and skips the rescan.
            #[cfg(shmlock_broken)]
            let range = {
                let _ = range;
                0
            };
            let mut d = 0;
            while rivals && d <= range {
                if d == fd {
                    d += 1;
                    continue;
                }
                let i = self.at(home, d);
                let c = self.word(i, Ordering::SeqCst);
                match self.examine(&slots[i], c, hash, now) {
                    Seen::Free | Seen::Other => {}
                    Seen::Changed => continue,
                    Seen::Expired => {
                        self.steal(i, c);
                        continue;
                    }
                    Seen::Stealing => {
                        self.resolve_steal(i, c);
                        continue;
                    }
                    Seen::Key => {
                        self.withdraw(slot, claiming);
                        return Ok(Attempt::Busy(busy(i, home, c, hash)));
                    }
                    Seen::Claiming if d < fd => {
                        // A rival nearer home has priority: step aside, let it finish.
                        self.withdraw(slot, claiming);
                        let settled = self.settle(i, c);
                        restarts += 1;
                        if settled.is_none() || restarts > MAX_RESTARTS {
                            return Ok(Attempt::Busy(busy(i, home, c, hash)));
                        }
                        continue 'restart;
                    }
                    Seen::Claiming => match self.settle(i, c) {
                        Some(_) => continue,
                        None => {
                            // The rival farther out may not have seen us: we cannot proceed.
                            self.withdraw(slot, claiming);
                            return Ok(Attempt::Busy(busy(i, home, c, hash)));
                        }
                    },
                }
                d += 1;
            }

            let promoted = if direct && !Self::fields_say(slot, req, now, until) {
                // Fields changed between the check and the CAS (see try_acquire_fast).
                self.withdraw(slot, claiming);
                restarts += 1;
                if restarts > MAX_RESTARTS {
                    return Ok(Attempt::Busy(busy(fi, home, claiming, hash)));
                }
                continue 'restart;
            } else if direct {
                Ok(claiming)
            } else {
                self.promote(slot, claiming)
            };
            match promoted {
                Ok(word) => {
                    return Ok(Attempt::Acquired(Held {
                        slot: fi,
                        home,
                        word,
                        lease: req.lease,
                        acquired_at: now,
                    }))
                }
                // Broken as stalled while we scanned: start over.
                Err(Lost) => {
                    restarts += 1;
                    if restarts > MAX_RESTARTS {
                        return Ok(Attempt::Busy(busy(fi, home, claiming, hash)));
                    }
                    continue 'restart;
                }
            }
        }
    }

    /// Writes the fields of slot `i`, freshly claimed (owner-only, before promotion).
    #[inline]
    fn fill(&self, i: usize, req: &Request<'_>, now: u64) {
        let slot = &self.slots()[i];
        // The same key in the same slot again is the common case: skip rewriting its name.
        if slot.hash_lo.load(Ordering::Relaxed) != req.hash.lo
            || slot.hash_hi.load(Ordering::Relaxed) != req.hash.hi
        {
            slot.hash_lo.store(req.hash.lo, Ordering::Relaxed);
            slot.hash_hi.store(req.hash.hi, Ordering::Relaxed);
            crash_point();
            self.cold(i).write_preview(req.key);
        }
        slot.lease.store(req.lease, Ordering::Relaxed);
        slot.deadline
            .store(deadline(now, req.exptime), Ordering::Relaxed);
        slot.acquired_at.store(now, Ordering::Relaxed);
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
    /// is dead.
    fn reap_slot(&self, i: usize, now: u64, check_owner: bool) -> bool {
        let slot = &self.slots()[i];
        let c = Word(slot.control.load(Ordering::SeqCst));
        if c.state() == State::Stealing {
            return self.resolve_steal(i, c);
        }
        let expired = c.state() == State::Held && slot.deadline.load(Ordering::Relaxed) <= now;
        let judged = check_owner
            && match c.state() {
                State::Held => self.env.reaps_dead_holders() && self.holder_dead(slot, c),
                _ => self.env.is_dead(c.owner()),
            };
        if c.state() == State::Free || !(expired || judged) {
            return false;
        }
        if c.state() == State::Held {
            self.steal(i, c)
        } else {
            self.force_release(i, c)
        }
    }

    /// The waiter's look at the entry that made an attempt busy: frees it if its owner is
    /// dead, breaks it if it stalled. `true` when the entry is gone or changed, so
    /// retrying is worthwhile now.
    pub(crate) fn recover(&self, b: &Busy) -> bool {
        let c = self.word(b.slot, Ordering::Acquire);
        if c.ident() != b.word.ident() {
            return true;
        }
        match c.state() {
            State::Held => {
                // Freed by us, or changed meanwhile: either way worth a retry.
                self.env.reaps_dead_holders() && self.holder_dead(&self.slots()[b.slot], c) && {
                    self.steal(b.slot, c);
                    true
                }
            }
            State::Claiming | State::Extending => self.unstick(b.slot, c),
            State::Stealing => {
                self.resolve_steal(b.slot, c);
                true
            }
            State::Free | State::Broken => true,
        }
    }

    /// Before sleeping on a busy key: flags the busy slot's word as waited on, and says
    /// what to do. The flag is set by one RMW on whatever the word is now (`lock or` on
    /// x86: no load first, no CAS to fail while the holder cycles), then the word is read
    /// back; only a hold of this key is slept on: the slot's control word while its low
    /// half (state, waiters bit, tag, reach, the owner's low bits) still reads as it does
    /// now. Whoever moves a flagged entry off its key wakes the sleepers on that word, and
    /// a move before the sleep changes the low half, so the kernel refuses the sleep: no
    /// lost wake-up. A bit left on a word that is not a hold (free, claimed, being
    /// checked) is harmless: claims, promotions and frees drop it, and it costs at most a
    /// wake-up nobody waits for.
    pub(crate) fn prepare_wait(&self, b: &Busy) -> Prepared {
        let slot = &self.slots()[b.slot];
        slot.control.fetch_or(WAITERS, Ordering::SeqCst);
        crash_point();
        let c = Word(slot.control.load(Ordering::SeqCst));
        match c.state() {
            State::Held => {}
            // A claim, a renewal or a check in progress: look again soon.
            State::Claiming | State::Extending | State::Stealing => return Prepared::Poll,
            State::Free | State::Broken => return Prepared::Changed,
        }
        if c.ident() != b.word.ident() {
            // Another hold: wait on it only if it is a hold of this very key (its holder
            // took it again meanwhile).
            if c.tag() != b.word.tag() || self.hash_of(slot, c) != Some(b.hash) {
                return Prepared::Changed;
            }
        }
        if !c.has_waiters() {
            return Prepared::Changed; // moved on between the flag and the read
        }
        Prepared::Sleep(c.0 as u32)
    }

    /// Whether the key may be free now: the busy slot no longer holds a hold of it (one
    /// read, no write). A holder that released and took the key again counts as holding.
    #[inline]
    pub(crate) fn moved_on(&self, b: &Busy) -> bool {
        let w = self.word(b.slot, Ordering::Relaxed);
        w.state() != State::Held || w.tag() != b.word.tag()
    }

    /// How long the busy entry's lease has left on the table clock (`None`: it never
    /// expires): a sleeper need not sleep past it, as nobody wakes anyone at expiry.
    pub(crate) fn lease_left(&self, b: &Busy) -> Option<Duration> {
        let deadline = self.slots()[b.slot].deadline.load(Ordering::Relaxed);
        (deadline != u64::MAX).then(|| Duration::from_nanos(deadline.saturating_sub(self.now())))
    }

    /// The control word a waiter on slot `i` sleeps on (see [`Prepared::Sleep`]).
    pub(crate) fn wait_word(&self, i: usize) -> &AtomicU64 {
        &self.slots()[i].control
    }

    /// The slot word as the holder of `held` may act on it: a check of this very hold in
    /// progress (someone about to free it, see [`steal`](Self::steal)) is ended first,
    /// as that check would end it: the hold comes back unless its lease ran out.
    #[inline]
    fn holder_word(&self, slot: &Slot, held: &Held) -> Word {
        let c = Word(slot.control.load(Ordering::SeqCst));
        if c.state() == State::Stealing && c.with_state(State::Held).ident() == held.word.ident() {
            self.resolve_steal(held.slot, c);
            return Word(slot.control.load(Ordering::SeqCst));
        }
        c
    }

    /// Whether `held` is still this holder's: same entry, lease and acquisition time.
    #[inline]
    fn owns(&self, slot: &Slot, c: Word, held: &Held) -> bool {
        c.ident() == held.word.ident()
            && slot.lease.load(Ordering::Relaxed) == held.lease
            && slot.acquired_at.load(Ordering::Relaxed) == held.acquired_at
    }

    /// Releases a hold. `Err(Lost)` if it was taken from us; the new owner is untouched.
    #[inline]
    pub(crate) fn release(&self, held: &Held) -> Result<(), Lost> {
        let slot = &self.slots()[held.slot];
        loop {
            let c = self.holder_word(slot, held);
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
                    self.wake(held.slot);
                }
                return Ok(());
            }
            // Only the waiters and reach bits can change under a live hold: retry.
        }
    }

    /// Moves the deadline of a hold to `now + exptime` (0 = never). A lease already past
    /// its deadline cannot be renewed: it is released and reported lost.
    pub(crate) fn extend(&self, held: &mut Held, exptime: u64) -> Result<(), Lost> {
        let slot = &self.slots()[held.slot];
        let now = self.now();
        loop {
            let c = self.holder_word(slot, held);
            if !self.owns(slot, c, held) {
                return Err(Lost);
            }
            if slot.deadline.load(Ordering::Relaxed) <= now {
                if self.force_release(held.slot, c) {
                    return Err(Lost);
                }
                continue;
            }
            let extending = Word(c.next(State::Extending).0 | (c.0 & WAITERS));
            if slot
                .control
                .compare_exchange(c.0, extending.0, Ordering::SeqCst, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            crash_point();
            let until = deadline(now, exptime);
            // Moved earlier by more than a tick: a sleeper's step ends by the old end and a
            // tick, so less is seen in time anyway (and a holder renewing towards a fixed
            // end moves it back and forth within a tick of the coarse clock, each time).
            let shortened = until.saturating_add(TICK_NS) < slot.deadline.load(Ordering::Relaxed);
            slot.deadline.store(until, Ordering::Relaxed);
            crash_point();
            // Nobody flags an EXTENDING word; only the reach may change meanwhile.
            let mut cur = extending;
            loop {
                let back = Word(cur.next(State::Held).0 | (cur.0 & WAITERS));
                match slot.control.compare_exchange(
                    cur.0,
                    back.0,
                    Ordering::SeqCst,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        crash_point();
                        held.word = back;
                        // A sleeper's step was cut to the old lease end: it looks again
                        // and sleeps to the new one (an expiry wakes nobody).
                        if shortened && back.has_waiters() {
                            self.wake(held.slot);
                        }
                        return Ok(());
                    }
                    Err(now) if Word(now).ident() == extending.ident() => cur = Word(now),
                    Err(_) => {
                        self.back_out(slot, extending);
                        return Err(Lost);
                    }
                }
            }
        }
    }

    /// Gives a hold up to its lease: it stays HELD until its deadline (or for good with
    /// none), but no longer names its owner, so the owner's death does not free it. Does
    /// nothing if the hold was lost already.
    pub(crate) fn disown(&self, held: &Held) {
        let slot = &self.slots()[held.slot];
        loop {
            let c = self.holder_word(slot, held);
            if !self.owns(slot, c, held) {
                return;
            }
            let nobody = Word::new(
                State::Held,
                c.tag(),
                OwnerId::UNKNOWN,
                c.gen().wrapping_add(1),
                c,
            );
            let nobody = Word(nobody.0 | (c.0 & WAITERS));
            if slot
                .control
                .compare_exchange(c.0, nobody.0, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
            {
                crash_point();
                return;
            }
        }
    }

    /// A fencing token for `held`: greater than the token of every earlier holder of the
    /// key. Taken from the home's counter, then checked against the hold, so a holder that
    /// lost its lease before asking gets `None`, never a token that outranks its successor.
    /// The caller adds the file's token base.
    pub(crate) fn token(&self, held: &Held) -> Option<u64> {
        let slots = self.slots();
        let t = slots[held.home]
            .fence
            .fetch_add(1, Ordering::SeqCst)
            .wrapping_add(1);
        crash_point();
        let slot = &slots[held.slot];
        let c = self.holder_word(slot, held);
        if !self.owns(slot, c, held) {
            return None;
        }
        // For inspection only: shown while the hold it names is the slot's.
        let cold = self.cold(held.slot);
        cold.token.store(t, Ordering::Relaxed);
        cold.token_of.store(
            token_label(c, held.lease, held.acquired_at),
            Ordering::Release,
        );
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
            let c = self.word(i, Ordering::Acquire);
            match self.examine(&slots[i], c, hash, now) {
                Seen::Changed => continue,
                // held until the check ends, and most likely after it
                Seen::Key | Seen::Stealing => return Some(busy(i, home, c, hash)),
                _ => {}
            }
            d += 1;
        }
        None
    }

    /// Breaks whatever keeps a key busy, whoever owns it: its live entry (its holder's
    /// next unlock or renewal gets `Lost`), and any claim of it in progress. An entry its
    /// owner may still be writing (CLAIMING, EXTENDING) becomes BROKEN unless the owner is
    /// dead. Returns the live entry as it was and whether its owner was dead, or `None` if
    /// the key was not held.
    pub(crate) fn break_hold(&self, hash: KeyHash) -> Option<(Entry, bool)> {
        let slots = self.slots();
        let home = hash.home(slots.len());
        let now = self.now();
        let mut found = None;
        let mut d = 0;
        while d <= self.reach(home, Ordering::Acquire) {
            let i = self.at(home, d);
            let c = self.word(i, Ordering::Acquire);
            let live = match self.examine(&slots[i], c, hash, now) {
                Seen::Changed => continue,
                Seen::Stealing => {
                    self.resolve_steal(i, c);
                    continue;
                }
                Seen::Key => true,
                // A claim that may be of this key (by tag): breaking it is always safe.
                Seen::Claiming => false,
                _ => {
                    d += 1;
                    continue;
                }
            };
            let snapshot = self.entry(i);
            let dead = match c.state() {
                State::Held | State::Extending | State::Stealing => self.holder_dead(&slots[i], c),
                _ => self.env.is_dead(c.owner()),
            };
            let to = if dead || c.state() == State::Held {
                c.freed()
            } else {
                c.next(State::Broken)
            };
            if !self.replace(i, c, to) {
                continue; // moved meanwhile: look again
            }
            if live && found.is_none() {
                found = snapshot.map(|e| (e, dead));
            }
            d += 1;
        }
        found
    }

    /// Whether the owner recorded in an entry is dead, as the registry judges it.
    pub(crate) fn is_owner_dead(&self, e: &Entry) -> bool {
        match e.word.state() {
            State::Free => false,
            State::Held | State::Extending | State::Stealing => {
                self.env.is_holder_dead(e.word.owner(), e.lease)
            }
            _ => self.env.is_dead(e.word.owner()),
        }
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
        let cold = self.cold(i);
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
        let lease = slot.lease.load(Ordering::Relaxed);
        let token_of = cold.token_of.load(Ordering::Acquire);
        let token = cold.token.load(Ordering::Relaxed);
        let (key_len, preview) = cold.read_preview();
        fence(Ordering::Acquire);
        if Word(slot.control.load(Ordering::Relaxed)).ident() != c.ident() {
            return None; // moved while read: not a consistent snapshot
        }
        Some(Entry {
            slot: i as u32,
            word: c,
            hash,
            deadline,
            acquired_at,
            lease,
            token: if token_of == token_label(c, lease, acquired_at) {
                token
            } else {
                0
            },
            key_len,
            preview,
        })
    }
}

/// What a slot's cold line records of the hold whose token it shows: a hash of its owner,
/// its lease (the owner's registry generation and thread) and when it began, which no
/// other hold shares (short of a 64-bit hash collision).
fn token_label(c: Word, lease: u64, acquired_at: u64) -> u64 {
    let mut bytes = [0u8; 20];
    bytes[..4].copy_from_slice(&c.owner().bits().to_le_bytes());
    bytes[4..12].copy_from_slice(&lease.to_le_bytes());
    bytes[12..].copy_from_slice(&acquired_at.to_le_bytes());
    xxhash_rust::xxh3::xxh3_64(&bytes)
}

fn busy(slot: usize, home: usize, word: Word, hash: KeyHash) -> Busy {
    Busy {
        slot,
        home,
        word,
        hash,
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::collections::HashSet;
    use std::sync::Mutex;

    /// Heap slots, a settable clock, dead owners by hand, stalls on demand.
    #[derive(Default)]
    struct TestEnv {
        now: Cell<u64>,
        dead: Mutex<HashSet<OwnerId>>,
        stalled: Cell<bool>,
    }

    impl Env for TestEnv {
        fn now(&self) -> u64 {
            self.now.get()
        }
        fn is_dead(&self, owner: OwnerId) -> bool {
            self.dead.lock().unwrap().contains(&owner)
        }
        fn wake_all(&self, _: &AtomicU64) {}
        fn stalled(&self, _: &AtomicU64, _: Word) -> bool {
            self.stalled.get()
        }
    }

    struct Heap(Vec<Slot>, Vec<Cold>);
    impl Slots for Heap {
        fn hot(&self) -> &[Slot] {
            &self.0
        }
        fn cold(&self) -> &[Cold] {
            &self.1
        }
    }

    fn table(n: usize) -> Table<Heap, TestEnv> {
        let heap = Heap(
            (0..n).map(|_| Slot::default()).collect(),
            (0..n).map(|_| Cold::default()).collect(),
        );
        let env = TestEnv::default();
        env.now.set(1000);
        Table::new(heap, env)
    }

    fn request(hash: KeyHash, owner: OwnerId, lease: u64) -> Request<'static> {
        Request {
            key: b"k",
            hash,
            owner,
            lease,
            exptime: 60_000,
        }
    }

    fn held(a: Result<Attempt, TableFull>) -> Held {
        match a {
            Ok(Attempt::Acquired(h)) => h,
            other => panic!("not acquired: {other:?}"),
        }
    }

    fn busy_of(a: Result<Attempt, TableFull>) -> Busy {
        match a {
            Ok(Attempt::Busy(b)) => b,
            other => panic!("not busy: {other:?}"),
        }
    }

    const A: OwnerId = OwnerId::UNKNOWN;

    #[test]
    fn a_dead_owner_is_reaped_and_a_live_one_is_not() {
        let t = table(8);
        let me = OwnerId::new(1, 1);
        let other = OwnerId::new(2, 1);
        let hash = KeyHash::of(b"k", 1);
        held(t.try_acquire(&request(hash, other, 1)));
        let b = busy_of(t.try_acquire(&request(hash, me, 2)));
        assert!(!t.recover(&b), "a live owner's hold was taken");
        t.env().dead.lock().unwrap().insert(other);
        assert!(t.recover(&b));
        let h = held(t.try_acquire(&request(hash, me, 3)));
        assert_eq!(t.reap_all(), 0);
        t.release(&h).unwrap();
    }

    #[test]
    fn an_unknown_owner_is_never_judged_and_expiry_still_works() {
        let t = table(8);
        let hash = KeyHash::of(b"k", 1);
        let h = held(t.try_acquire(&request(hash, A, 1)));
        let b = busy_of(t.try_acquire(&request(hash, OwnerId::new(1, 1), 2)));
        assert!(!t.recover(&b));
        t.env().now.set(1000 + 60_000);
        held(t.try_acquire(&request(hash, OwnerId::new(1, 1), 3)));
        assert_eq!(t.release(&h), Err(Lost));
    }

    #[test]
    fn a_stalled_claim_is_broken_and_its_owner_backs_out() {
        let t = table(8);
        let hash = KeyHash::of(b"k", 1);
        let home = hash.home(8);
        let slot = &t.slots()[home];
        // a claimer that stopped right after its claim CAS
        let c = Word(slot.control.load(Ordering::Relaxed));
        let claiming = Word::new(State::Claiming, hash.tag(), A, c.gen() + 1, c);
        slot.control.store(claiming.0, Ordering::Relaxed);
        let b = busy_of(t.try_acquire(&request(hash, OwnerId::new(1, 1), 2)));
        assert!(!t.recover(&b), "broken before the bound");
        t.env().stalled.set(true);
        assert!(t.recover(&b));
        assert_eq!(t.word(home, Ordering::Relaxed).state(), State::Broken);
        // the key is free again (elsewhere), the broken slot is out of use
        let h = held(t.try_acquire(&request(hash, OwnerId::new(1, 1), 3)));
        assert_ne!(h.slot, home);
        // the stopped claimer resumes: its promote fails and it frees its own slot
        assert_eq!(t.promote(slot, claiming), Err(Lost));
        assert_eq!(t.word(home, Ordering::Relaxed).state(), State::Free);
        assert_eq!(t.entries().len(), 1);
        t.release(&h).unwrap();
    }

    #[test]
    fn an_extension_is_broken_only_past_its_deadline() {
        let t = table(8);
        let hash = KeyHash::of(b"k", 1);
        let h = held(t.try_acquire(&request(hash, A, 1)));
        let slot = &t.slots()[h.slot];
        let ext = h.word.next(State::Extending);
        slot.control.store(ext.0, Ordering::Relaxed);
        t.env().stalled.set(true);
        let b = busy_of(t.try_acquire(&request(hash, OwnerId::new(1, 1), 2)));
        assert!(!t.recover(&b), "a lease still running was broken");
        t.env().now.set(1000 + 60_000);
        assert!(t.recover(&b));
        assert_eq!(t.word(h.slot, Ordering::Relaxed).state(), State::Broken);
    }

    #[test]
    fn force_unlock_breaks_a_claim_in_progress() {
        let t = table(8);
        let hash = KeyHash::of(b"k", 1);
        let home = hash.home(8);
        let slot = &t.slots()[home];
        let c = Word(slot.control.load(Ordering::Relaxed));
        let claiming = Word::new(
            State::Claiming,
            hash.tag(),
            OwnerId::new(3, 1),
            c.gen() + 1,
            c,
        );
        slot.control.store(claiming.0, Ordering::Relaxed);
        assert_eq!(t.break_hold(hash), None); // not held: nothing to report
        assert_eq!(t.word(home, Ordering::Relaxed).state(), State::Broken);
        held(t.try_acquire(&request(hash, OwnerId::new(1, 1), 3)));
    }

    #[test]
    fn reach_survives_transitions_and_overflows_into_the_home_word() {
        let t = table(64);
        t.raise_reach(5, 3);
        assert_eq!(t.reach(5, Ordering::Relaxed), 3);
        t.raise_reach(5, 2);
        assert_eq!(t.reach(5, Ordering::Relaxed), 3);
        t.raise_reach(5, 40);
        assert_eq!(t.reach(5, Ordering::Relaxed), 40);
        // a claim and release of slot 5 itself keep its reach
        let slot = &t.slots()[5];
        let c = Word(slot.control.load(Ordering::Relaxed));
        assert_eq!(c.freed().reach(), REACH_OVERFLOW);
        assert_eq!(t.reach(5, Ordering::Relaxed), 40);
    }
}
