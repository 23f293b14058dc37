//! Freeing what others left: holds past their deadline or whose owner is dead, claims and
//! renewals that stalled, and keys broken by force.
//!
//! # Dead and stalled owners
//!
//! A process can die or stop at any instruction. What it leaves behind is one entry of its
//! own key (CLAIMING, HELD, EXTENDING or BROKEN), recorded with its
//! [`OwnerId`](crate::shm::registry::OwnerId). A waiter reaps it when the registry says the
//! owner is dead (see `registry.rs`), expiry reaps a HELD entry anyway, and a CLAIMING
//! entry (or an EXTENDING one past its deadline) that stays unchanged for the stall bound
//! is broken, so no key stays busy longer than max(its lease, the bound) after its owner
//! stops making progress. No state of one key blocks another key: `reach` and the home
//! words are single atomic updates.
//!
//! # Why a steal takes two steps
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

use super::{Busy, Entry, Env, KeyHash, Seen, Slots, Table, WaitFor};
use crate::shm::primitive::{crash_point, fence, spin, Ordering, SETTLE_ROUNDS};
use crate::shm::slot::{Slot, State, Word};

impl<S: Slots, E: Env> Table<S, E> {
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
    pub(super) fn resolve_steal(&self, i: usize, frozen: Word) -> bool {
        let slot = &self.slots()[i];
        let deadline = slot.deadline.load(Ordering::Relaxed);
        let lease = slot.lease.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        if Word(slot.control.load(Ordering::SeqCst)).ident() != frozen.ident() {
            return false; // ended by someone else
        }
        let home = frozen.is_shared().then(|| self.home_of(i));
        let expired = deadline <= self.now();
        let doomed = expired
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
                    if doomed {
                        self.env.took_over(expired);
                        if cur.has_waiters() {
                            self.wake_left(i, cur, home);
                        }
                    }
                    return doomed;
                }
                Err(now) if Word(now).ident() == frozen.ident() => cur = Word(now),
                Err(_) => return false,
            }
        }
    }

    /// The waiter's look at the entry that made an attempt busy: frees it if its owner is
    /// dead, breaks it if it stalled. `true` when the entry is gone or changed, so
    /// retrying is worthwhile now.
    pub(crate) fn recover(&self, b: &Busy) -> bool {
        if b.wait != WaitFor::Entry {
            // Any of the shared holds may be the one that died or ran out.
            let mut freed = false;
            self.for_shared_holds(b.hash, |i, c, expired| {
                let slot = &self.slots()[i];
                freed |= match c.state() {
                    // a renewal that stalled past its deadline, or whose owner died
                    State::Extending => self.unstick(i, c),
                    _ if expired
                        || (self.env.reaps_dead_holders() && self.holder_dead(slot, c)) =>
                    {
                        self.steal(i, c)
                    }
                    _ => false,
                };
            });
            if freed {
                return true;
            }
        }
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
            // (a reservation stands for its writer or readers: nothing to recover)
            State::Idle => !self.kept(b.slot, c),
            State::Free | State::Broken => true,
        }
    }

    /// Waits a bounded time for a CLAIMING word to move on, then frees it if its owner is
    /// dead or breaks it if it stalled. `None`: still there, owner alive and not stalled.
    pub(super) fn settle(&self, i: usize, c: Word) -> Option<Word> {
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

    /// Whether the owner of the HELD or EXTENDING entry `c` of `slot` is dead, judged with
    /// the hold's lease. `false` if the entry moved on meanwhile (nothing to free then).
    pub(super) fn holder_dead(&self, slot: &Slot, c: Word) -> bool {
        let lease = slot.lease.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        Word(slot.control.load(Ordering::Relaxed)).ident() == c.ident()
            && self.env.is_holder_dead(c.owner(), lease)
    }

    /// Moves entry `c` of slot `i` to `to` (the reach and waiters bits as they are now,
    /// but waiters are woken and cleared). `false` if the entry moved on meanwhile.
    fn replace(&self, i: usize, c: Word, to: Word) -> bool {
        let slot = &self.slots()[i];
        let home = c.is_shared().then(|| self.home_of(i));
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
                        self.wake_left(i, cur, home);
                    }
                    return true;
                }
                Err(now) if Word(now).ident() == c.ident() => cur = Word(now),
                Err(_) => return false,
            }
        }
    }

    /// Frees an entry that is no longer its owner's to keep (dead owner, forced).
    pub(super) fn force_release(&self, i: usize, c: Word) -> bool {
        self.replace(i, c, c.freed())
    }

    /// Our CLAIMING or EXTENDING entry `mine` was broken as stalled: the BROKEN slot is
    /// still ours (nobody reuses it while we live), so free it now that we write no more.
    #[cold]
    pub(super) fn back_out(&self, slot: &Slot, mine: Word) {
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

    /// Breaks whatever keeps a key busy, whoever owns it: its live entries (each holder's
    /// next unlock or renewal gets `Lost`), and any claim of it in progress. An entry its
    /// owner may still be writing (CLAIMING, EXTENDING) becomes BROKEN unless the owner is
    /// dead. Returns the live entry as it was and whether its owner was dead, or `None` if
    /// the key was not held (a shared key's first holder: see [`break_holds`](Self::break_holds)).
    pub(crate) fn break_hold(&self, hash: KeyHash) -> Option<(Entry, bool)> {
        self.break_holds(hash, |_| true).into_iter().next()
    }

    /// [`break_hold`](Self::break_hold) of the live entries `which` picks (every claim in
    /// progress is broken whatever it says: a claim's fields are not yet its own); each
    /// one broken, as it was, and whether its owner was dead.
    pub(crate) fn break_holds(
        &self,
        hash: KeyHash,
        which: impl Fn(&Entry) -> bool,
    ) -> Vec<(Entry, bool)> {
        let slots = self.slots();
        let home = hash.home(slots.len());
        let now = self.now();
        let mut found = Vec::new();
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
                // The key kept for a writer or readers (no hold: not reported), which
                // others would wait behind until those it is kept for stop waiting.
                Seen::Idle { ours: true } if self.kept(i, c) => {
                    self.force_release(i, c);
                    continue;
                }
                _ => {
                    d += 1;
                    continue;
                }
            };
            let snapshot = self.entry(i);
            if live && !snapshot.as_ref().is_some_and(&which) {
                d += 1;
                continue;
            }
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
            if let (true, Some(e)) = (live, snapshot) {
                found.push((e, dead));
            }
            d += 1;
        }
        found
    }

    /// The table has no free slot: reap one expired or dead entry of any key (expired ones
    /// first: they cost no system call).
    #[cold]
    pub(super) fn reap_any(&self, now: u64) -> bool {
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
}
