//! A waiter's side of a busy key: the flag it sets on the hold before it sleeps (see
//! [`prepare_wait`](Table::prepare_wait) for why no wake-up is lost), the word it sleeps
//! on, and the looks that tell it the key may be free.

use std::time::Duration;

use super::{Busy, Env, KeyHash, Prepared, Seen, Slots, Table, WaitFor};
use crate::shm::primitive::{crash_point, AtomicU64, Ordering};
use crate::shm::slot::{State, Word, WAITERS};

impl<S: Slots, E: Env> Table<S, E> {
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
    ///
    /// A writer waiting for readers first marks every shared hold of the key as waited
    /// for by a writer, so that no new reader joins them, then sleeps on one of them as
    /// above (and again on the next, until none is left). A waiter for a semaphore's
    /// permits flags every permit's hold and sleeps on the home's claim count, read
    /// before: the release of any flagged permit moves the count, then wakes.
    pub(crate) fn prepare_wait(&self, b: &Busy) -> Prepared {
        match b.wait {
            WaitFor::Entry => {}
            // (marked before the waiters bit: a release that wakes this reader keeps the
            // key for it)
            WaitFor::Writer => self.mark_for_readers(b.slot, b.word),
            WaitFor::Readers => {
                // Idle entries taken back before the marks and after them: a reader that
                // left in between (idle, unmarked) does not come back unmarked.
                self.take_back_idle(b.hash);
                self.for_shared_holds(b.hash, |i, c, _| self.mark_for_writer(i, c));
                self.take_back_idle(b.hash);
                crash_point();
            }
            WaitFor::Permits { limit } => {
                let count = self.slots()[b.home].fence.load(Ordering::SeqCst);
                let (mut taken, mut moving) = (0, false);
                self.for_shared_holds(b.hash, |i, c, expired| {
                    // only permits, and only the very holds seen: a slot taken by another
                    // key meanwhile is not counted (nor flagged)
                    if c.is_permit() && !expired && self.flag(i, c, WAITERS) {
                        taken += 1;
                        moving |= c.state() != State::Held;
                    }
                });
                crash_point();
                return match (taken >= limit, moving) {
                    (false, _) => Prepared::Changed,
                    // a renewal in progress wakes nobody when it ends: look again soon
                    (true, true) => Prepared::Poll,
                    (true, false) => Prepared::Sleep(count as u32),
                };
            }
        }
        let slot = &self.slots()[b.slot];
        slot.control.fetch_or(WAITERS, Ordering::SeqCst);
        crash_point();
        let c = Word(slot.control.load(Ordering::SeqCst));
        match c.state() {
            State::Held => {}
            // The key kept for a writer, or for readers: slept on while it stands (the
            // claim of it, or anyone's take-back, wakes the sleepers); once those it is
            // kept for stopped saying that they wait, anyone takes it as an idle entry.
            State::Idle if c.ident() == b.word.ident() && self.kept(b.slot, c) => {
                return if c.has_waiters() {
                    Prepared::Sleep(c.0 as u32)
                } else {
                    Prepared::Changed
                };
            }
            // A claim, a renewal or a check in progress: look again soon.
            State::Claiming | State::Extending | State::Stealing => return Prepared::Poll,
            State::Free | State::Broken | State::Idle => return Prepared::Changed,
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

    /// Whether `b` is a reader's wait on a shared hold that a writer marked: the release
    /// of that hold wakes the writer and such readers at once (see
    /// [`WRITER_HEAD_START`](super::WRITER_HEAD_START)).
    pub(crate) fn behind_a_writer(&self, b: &Busy) -> bool {
        b.wait == WaitFor::Entry && b.word.is_shared() && b.word.writer_waits()
    }

    /// Whether the key may be free now: the busy slot no longer holds a hold of it (one
    /// read, no write). A holder that released and took the key again counts as holding.
    #[inline]
    pub(crate) fn moved_on(&self, b: &Busy) -> bool {
        if let WaitFor::Permits { .. } = b.wait {
            return true; // any permit may have been given back: only an attempt tells
        }
        let w = self.word(b.slot, Ordering::Relaxed);
        if b.word.state() == State::Idle {
            // a reservation: until it moves (or those it is kept for stop waiting)
            return w.ident() != b.word.ident() || !self.kept(b.slot, w);
        }
        w.state() != State::Held || w.tag() != b.word.tag()
    }

    /// How long the busy entry's lease has left on the table clock (`None`: it never
    /// expires): a sleeper need not sleep past it, as nobody wakes anyone at expiry. For a
    /// reader behind a writer's mark, no longer than the mark has left.
    pub(crate) fn lease_left(&self, b: &Busy) -> Option<Duration> {
        if b.word.state() == State::Idle {
            // the key kept for a writer or readers: no lease (its fields are its last
            // holder's), and its end (their claim, a take-back) wakes the sleepers
            return None;
        }
        let mut deadline = self.slots()[b.slot].deadline.load(Ordering::Relaxed);
        if let WaitFor::Permits { .. } = b.wait {
            // the first permit whose lease runs out frees one
            self.for_shared_holds(b.hash, |i, _, _| {
                deadline = deadline.min(self.slots()[i].deadline.load(Ordering::Relaxed));
            });
        }
        let lease = (deadline != u64::MAX)
            .then(|| Duration::from_nanos(deadline.saturating_sub(self.now())));
        if !self.behind_a_writer(b) {
            return lease;
        }
        // A reader behind a writer's mark: no later than the mark lapses (a writer that
        // gave up aged it, and its lapse wakes nobody).
        let mark = self
            .env
            .writer_mark_left(&self.cold(b.slot).seen, self.hold_id(b.slot, b.word));
        match (lease, mark) {
            (Some(l), Some(m)) => Some(l.min(m)),
            (l, m) => l.or(m),
        }
    }

    /// The word a waiter for `b` sleeps on (see [`Prepared::Sleep`]): the busy slot's
    /// control word, or for a semaphore's permits the home's claim count.
    pub(crate) fn wait_word(&self, b: &Busy) -> &AtomicU64 {
        match b.wait {
            WaitFor::Permits { .. } => &self.slots()[b.home].fence,
            _ => &self.slots()[b.slot].control,
        }
    }

    /// Sets `bit` (waiters, writer waits) on the entry `c` of slot `i` if it is still that
    /// entry, with a CAS from the word as it is (the bits may change under it, the entry
    /// may not): a slot that moved on to another hold, maybe of another key, is left alone.
    /// `true` if the entry is still `c`'s, flagged.
    ///
    /// Out of line (only waiters call it): the attack tests stop a waiter here with gdb,
    /// between its look at the entry and its flag.
    #[inline(never)]
    pub(super) fn flag(&self, i: usize, c: Word, bit: u64) -> bool {
        let word = &self.slots()[i].control;
        let mut cur = Word(word.load(Ordering::SeqCst));
        loop {
            if cur.ident() != c.ident() {
                return false;
            }
            if cur.0 & bit != 0 {
                return true;
            }
            match word.compare_exchange(cur.0, cur.0 | bit, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return true,
                Err(now) => cur = Word(now),
            }
        }
    }

    /// Calls `f` with each shared hold of `b`'s key in its range (slot, word, and whether
    /// its lease ran out), as found in one pass; a check of a hold in progress is ended
    /// first, as anyone may.
    pub(super) fn for_shared_holds(&self, hash: KeyHash, mut f: impl FnMut(usize, Word, bool)) {
        self.walk_range(hash, |i, c, seen| match seen {
            Seen::Stealing if c.is_shared() => {
                self.resolve_steal(i, c);
                false
            }
            Seen::Key if c.is_shared() => {
                f(i, c, false);
                true
            }
            Seen::Expired if c.is_shared() => {
                f(i, c, true);
                true
            }
            _ => true,
        });
    }

    /// Looks at each slot of `hash`'s range once, as `examine` finds it; `f` returns
    /// `false` to look at the same slot again (it changed it). A word that moved while it
    /// was read is looked at again.
    pub(super) fn walk_range(&self, hash: KeyHash, mut f: impl FnMut(usize, Word, Seen) -> bool) {
        let slots = self.slots();
        let now = self.now();
        let home = hash.home(slots.len());
        let reach = self.reach(home, Ordering::Acquire);
        let mut d = 0;
        while d <= reach {
            let i = self.at(home, d);
            let c = self.word(i, Ordering::SeqCst);
            let next = match self.examine(&slots[i], c, hash, now) {
                Seen::Changed => false,
                seen => f(i, c, seen),
            };
            d += usize::from(next);
        }
    }
}
