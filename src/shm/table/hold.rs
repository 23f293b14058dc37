//! What a holder does with its hold: release it, extend its lease, give it up to its lease
//! (disown), take a fencing token. Each acts on the slot's word as the holder may act on it
//! (a check of the hold in progress is ended first) and by a CAS from the exact entry it
//! owns, so a holder whose hold was taken touches nothing of the new owner's.

use super::{Env, Held, Lost, Slots, Table};
use crate::shm::clock::{deadline, TICK_NS};
use crate::shm::primitive::{crash_point, Ordering};
use crate::shm::registry::OwnerId;
use crate::shm::slot::{Slot, State, Word, SHARED, WAITERS, WRITER_WAITS};

/// The bits a waiter sets on a hold, which its holder's own moves keep.
const FLAGS: u64 = WAITERS | WRITER_WAITS;

impl<S: Slots, E: Env> Table<S, E> {
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

    /// Takes back what inspection shows of `held`'s token, before its holder lets it go:
    /// the next hold of the slot by the same thread within one tick of the coarse clock
    /// would have the same label (owner, lease, acquisition time), and be shown a token it
    /// never took. Only while the hold is still ours: a hold broken under us (`force_unlock`)
    /// may have been followed by the same thread's next within the same tick, which has the
    /// same label, and whose token must stay shown; ours, nobody else can take the slot
    /// before we let it go.
    pub(crate) fn forget_token(&self, held: &Held) {
        let slot = &self.slots()[held.slot];
        if !self.owns(slot, self.holder_word(slot, held), held) {
            return;
        }
        let mine = token_label(held.word, held.lease, held.acquired_at);
        let _ = self.cold(held.slot).token_of.compare_exchange(
            mine,
            0,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// Releases a hold. `Err(Lost)` if it was taken from us; the new owner is untouched.
    /// `Ok(true)`: a shared hold nobody waited for, kept IDLE for this process to take
    /// again (see `idle.rs`).
    #[inline]
    pub(crate) fn release(&self, held: &Held) -> Result<bool, Lost> {
        self.release_to(held, true)
    }

    /// [`release`](Self::release) of a hold known to be exclusive, which is never kept
    /// idle: the exclusive lock's release, with nothing of the idle entries in its way.
    #[inline]
    pub(crate) fn release_exclusive(&self, held: &Held) -> Result<(), Lost> {
        self.release_to(held, false).map(drop)
    }

    #[inline(always)]
    fn release_to(&self, held: &Held, may_idle: bool) -> Result<bool, Lost> {
        let slot = &self.slots()[held.slot];
        loop {
            let c = self.holder_word(slot, held);
            if !self.owns(slot, c, held) {
                return Err(Lost);
            }
            if c.0 & FLAGS != 0 {
                return self.release_flagged(held, may_idle);
            }
            // Nobody waits: a shared hold is kept idle for its process (see `idle.rs`).
            let idle = may_idle && c.is_shared();
            let to = if idle { c.next(State::Idle) } else { c.freed() };
            if slot
                .control
                .compare_exchange(c.0, to.0, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
            {
                crash_point();
                return Ok(idle);
            }
            // Only the waiters and reach bits can change under a live hold: retry.
        }
    }

    /// [`release_to`](Self::release_to) of a hold someone waited for (flagged or
    /// marked): the key is kept for a writer or readers waiting now, else freed, and the
    /// sleepers are woken. Out of line (a whole release of its own), so that the
    /// uncontended release keeps nothing for it.
    #[cold]
    #[inline(never)]
    fn release_flagged(&self, held: &Held, may_idle: bool) -> Result<bool, Lost> {
        let slot = &self.slots()[held.slot];
        loop {
            let c = self.holder_word(slot, held);
            if !self.owns(slot, c, held) {
                return Err(Lost);
            }
            // A reader's hold a writer waits for: the key is kept for the writer (an IDLE
            // entry marked as the hold was, which new readers defer to). A writer's hold
            // readers wait for: the key is kept for them (an IDLE entry with the writer's
            // mark, which writers defer to and a reader claims). See `idle.rs`.
            let to = if may_idle && c.writer_waits() && self.keeps_for_writer(held.slot, c) {
                Word(c.next(State::Idle).0 | WRITER_WAITS)
            } else if c.readers_wait() && self.keeps_for_readers(held.slot, c) {
                c.next(State::Idle)
            } else {
                c.freed()
            };
            if slot
                .control
                .compare_exchange(c.0, to.0, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
            {
                crash_point();
                if c.has_waiters() {
                    self.released_to_waiters(held, c);
                }
                return Ok(false);
            }
        }
    }

    /// After the release of `held` (its word `c` flagged): wakes its waiters and times the
    /// hold. Out of line, so that the uncontended release keeps nothing for it.
    #[cold]
    #[inline(never)]
    fn released_to_waiters(&self, held: &Held, c: Word) {
        self.wake_left(held.slot, c, Some(held.home));
        self.env.released_to_waiters(held.acquired_at);
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
            let extending = Word(c.next(State::Extending).0 | (c.0 & FLAGS));
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
            return self.end_extension(slot, held, extending, shortened);
        }
    }

    /// Ends the renewal `extending` of `held`: EXTENDING → HELD, with the waiters and reach
    /// bits as they are now; backs out if the renewal was broken as stalled meanwhile.
    /// `shortened`: the deadline moved earlier, and sleepers are woken to look again.
    #[inline]
    fn end_extension(
        &self,
        slot: &Slot,
        held: &mut Held,
        extending: Word,
        shortened: bool,
    ) -> Result<(), Lost> {
        // Waiters may flag an EXTENDING word meanwhile (the flags are carried over), and a
        // claim may raise the reach: anything but the entry itself.
        let mut cur = extending;
        loop {
            let back = Word(cur.next(State::Held).0 | (cur.0 & FLAGS));
            match slot
                .control
                .compare_exchange(cur.0, back.0, Ordering::SeqCst, Ordering::Relaxed)
            {
                Ok(_) => {
                    crash_point();
                    held.word = back;
                    // A sleeper's step was cut to the old lease end: it looks again and
                    // sleeps to the new one (an expiry wakes nobody).
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
                c.mark(),
                OwnerId::UNKNOWN,
                c.gen().wrapping_add(1),
                c,
            );
            let nobody = Word(nobody.0 | (c.0 & FLAGS));
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
    ///
    /// A shared hold gets no token of its own: it reads the counter, which is at least the
    /// token of every exclusive hold before it and less than that of any after it (no
    /// exclusive hold stands beside it), so a reader can tell which write it read.
    pub(crate) fn token(&self, held: &Held) -> Option<u64> {
        let slots = self.slots();
        let counter = &slots[held.home].fence;
        let t = if held.word.is_shared() {
            counter.load(Ordering::SeqCst)
        } else {
            counter.fetch_add(1, Ordering::SeqCst).wrapping_add(1)
        };
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

    /// Turns an exclusive hold into a shared one (a reader's) in one CAS: no other holder
    /// can come between, and the readers waiting for it are woken. `Err(Lost)` if the hold
    /// was taken from us, or if its lease has run out: a writer may take the key at any
    /// moment, so the caller does not hold it as a reader either (as `check` says).
    pub(crate) fn downgrade(&self, held: &mut Held) -> Result<(), Lost> {
        let slot = &self.slots()[held.slot];
        loop {
            let c = self.holder_word(slot, held);
            if !self.owns(slot, c, held) || slot.deadline.load(Ordering::Relaxed) <= self.now() {
                return Err(Lost);
            }
            if c.is_shared() {
                return Ok(());
            }
            // An exclusive entry's limit is whatever the slot last held: a reader's is 0.
            // (Written before the CAS that makes the entry shared, so that whoever reads the
            // shared word reads this limit; readers of the exclusive word ignore it.)
            if slot.limit.load(Ordering::Relaxed) != 0 {
                slot.limit.store(0, Ordering::Relaxed);
            }
            let shared = Word(c.next(State::Held).0 | SHARED);
            if slot
                .control
                .compare_exchange(c.0, shared.0, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
            {
                crash_point();
                held.word = shared;
                if c.has_waiters() {
                    self.wake(held.slot);
                }
                return Ok(());
            }
        }
    }

    /// Whether `held` is still this holder's and its lease has not run out. A check of this
    /// very hold in progress is ended first, as for any act of the holder.
    pub(crate) fn check(&self, held: &Held) -> Result<(), Lost> {
        let slot = &self.slots()[held.slot];
        let c = self.holder_word(slot, held);
        if self.owns(slot, c, held) && slot.deadline.load(Ordering::Relaxed) > self.now() {
            Ok(())
        } else {
            Err(Lost)
        }
    }
}

/// What a slot's cold line records of the hold whose token it shows: a hash of its owner,
/// its lease (the owner's registry generation and thread) and when it began, which no
/// other hold shares (short of a 64-bit hash collision).
pub(super) fn token_label(c: Word, lease: u64, acquired_at: u64) -> u64 {
    let mut bytes = [0u8; 20];
    bytes[..4].copy_from_slice(&c.owner().bits().to_le_bytes());
    bytes[4..12].copy_from_slice(&lease.to_le_bytes());
    bytes[12..].copy_from_slice(&acquired_at.to_le_bytes());
    xxhash_rust::xxh3::xxh3_64(&bytes)
}
