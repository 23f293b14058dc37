//! Idle shared entries: a reader's (or a permit holder's) entry kept after its release, so
//! that the same process takes the key again with a CAS on that entry alone.
//!
//! A shared hold taken by the general claim reads the home's claim count, scans the key's
//! range twice and counts itself at the home: every reader of a key writes the home's
//! line, and two processes reading one key take it from each other at every hold. So a
//! shared hold released with nobody waiting (no waiters bit, no writer's mark) is not
//! freed but goes IDLE: the word keeps its owner and mark, the fields their key. The
//! process remembers the slot (`LockTable`'s idle cache) and its next hold of the key
//! moves IDLE to HELD (or CLAIMING, then HELD, when the fields need writing): one line,
//! its own.
//!
//! # Why a re-entry needs no scan
//!
//! An IDLE entry is nobody's hold, and anyone may take it back with a CAS: a claim that
//! must not stand beside it once it is a hold again (a writer; a permit beside a reader or
//! a reader beside a permit; every permit claim, which counts) frees each IDLE entry of
//! its key that its scans meet, before it goes on, and every other claim may claim it as
//! a free slot. The owner's re-entry is a CAS from the IDLE word, so of the two CASes on
//! that word one comes first: a re-entry after the take-back fails (and the owner makes a
//! general claim), and a claimer that looks after the re-entry sees a claim or a hold of
//! the key there, as it would any other. An IDLE entry only comes from a hold, which lies
//! within the key's reach, so every scan of the key covers it; and no IDLE entry of the
//! key can appear behind a claimer's scan without a hold that the claimer would have seen
//! or whose claim counted after it (and so looked at its claim). So a re-entry is as good
//! as a general claim that found the key's range as the last hold left it.
//!
//! A writer waiting for readers takes back the IDLE entries of the key when it marks the
//! holds (see `wait.rs`), so that no reader comes back without seeing its mark. An IDLE
//! entry whose owner died is freed like any of a dead owner, and a table with no free slot
//! left takes IDLE entries as free ones: an IDLE entry never makes a claim fail.
//!
//! # The key kept for a writer (a reservation)
//!
//! A reader's hold that a writer marked (and still waits for: its mark is fresh) is not
//! freed at its release but left IDLE with the writer's bit: the key stays with an entry
//! that readers defer to, where a free slot would let the readers woken by the same
//! release race the writer. A reader's claim that meets it waits, asleep on its word; a
//! writer's claim takes it as its slot, in place (the CAS from the reservation is the
//! claim's, counted and rescanned as any), and wakes the readers asleep on it, who then
//! wait for the writer's hold. Its reader never re-enters it (the release does not give it
//! to the idle cache, and a re-entry refuses the writer's bit), a waiting writer does not
//! take it back, a writer that gives up takes it back (see `Table::writer_withdraws`), and
//! it stands only while the writer is active (it refreshed its mark within 300 ms: a
//! waiting writer does every 100 ms, and is woken by the release; one that died or is
//! stopped is not); then it is an IDLE entry like any. It is a preference,
//! never a guard of exclusion: that rests on the claims alone, which is why a claim of
//! another key with no free slot in its range may still take it as an idle slot.
//!
//! # The key kept for readers
//!
//! The other way round: readers that wait for a writer's hold mark it (the writer-waits
//! bit, which on an exclusive hold means that readers wait, and a mark in the slot's
//! cold line that they refresh every 100 ms as a writer does), and the hold's release,
//! while they are active (one refreshed within 300 ms), leaves the slot IDLE with the
//! writer's (exclusive) mark instead of free: an entry writers defer to (a writer's claim
//! that meets it waits, asleep on its word, looking again every 100 ms), which the first
//! reader's claim takes as its slot, in place (counted and rescanned as any claim), waking
//! the writers asleep on it; the readers woken by the same release join that reader
//! beside it before a writer, woken twice (by the release, then by that claim), has marked
//! it. So a writer's hold that readers wait for is followed by readers, never by another
//! writer that won a race with them: without it, six looping writers kept a reader
//! waiting for up to 41 holds (median 3). Only a reader's claim takes it in place; a
//! permit's claim, and any claim once the readers stopped saying that they wait (they gave
//! up, died or were stopped 300 ms), take it back as any idle entry, and a reader that
//! gives up ages the readers' mark (see `Table::readers_withdraw`). Like the writer's, it
//! is a preference, never a guard of exclusion.

use super::{Env, Held, KeyHash, Mode, Request, Seen, Slots, Table};
use crate::broken::{broken, Broken};
use crate::shm::clock::deadline;
use crate::shm::primitive::{crash_point, Ordering};
use crate::shm::slot::{State, Word};

/// Whether a claim in `mode` must take back the IDLE entry `c` of its key before it goes
/// on: all but a reader's claim beside a reader's idle entry.
#[inline]
pub(super) fn takes_back(c: Word, mode: Mode) -> bool {
    // The broken variant lets every claim pass an idle entry of its key.
    if broken(Broken::Idle) {
        return false;
    }
    mode != (Mode::Shared { limit: 0 }) || c.is_permit()
}

impl<S: Slots, E: Env> Table<S, E> {
    /// Takes `req.key` (of `home`) again in the IDLE entry that slot `i` held for this
    /// process, if it still does: one CAS (two when the lease's fields must be written).
    /// `None`: the entry was taken back or is another's; make a general claim.
    #[inline(always)]
    pub(crate) fn try_reenter(&self, req: &Request<'_>, i: usize, home: usize) -> Option<Held> {
        let slot = self.slots().get(i)?;
        let c = Word(slot.control.load(Ordering::Acquire));
        // (a process forked since keeps its parent's slot numbers, not its entries)
        if c.state() != State::Idle
            || c.owner() != req.owner
            || c.mark() != req.mode.mark(req.hash)
            || c.writer_waits()
        {
            return None;
        }
        let now = self.now();
        let until = deadline(now, req.exptime);
        let word = if Self::fields_say(slot, req, now, until) {
            self.claim_direct(slot, c, c.next(State::Held), req, now, until)?
        } else {
            // The key's fields, as the entry was left (the lease's are rewritten below).
            if !self.holds_key_of(slot, req) {
                return None;
            }
            self.claim_idle(req, i, c, now)?
        };
        Some(Held {
            slot: i,
            home,
            word,
            lease: req.lease,
            acquired_at: now,
        })
    }

    /// IDLE → CLAIMING, the lease's fields, HELD: the re-entry of the idle entry `c` of
    /// slot `i`, `req.key`'s when it was looked at, at `now`. Returns the HELD word.
    #[inline(always)]
    pub(super) fn claim_idle(
        &self,
        req: &Request<'_>,
        i: usize,
        c: Word,
        now: u64,
    ) -> Option<Word> {
        let slot = &self.slots()[i];
        let claiming = c.next(State::Claiming);
        slot.control
            .compare_exchange(c.0, claiming.0, Ordering::SeqCst, Ordering::Relaxed)
            .ok()?;
        crash_point();
        // The fields again, which nobody writes under our CLAIMING word: they are those of
        // the IDLE entry the CAS took. A thread stopped between its look and its CAS while
        // the slot's generation came round could have taken another key's idle entry of
        // the same tag (this process's), which no claim of this key had to take back.
        if !self.holds_key_of(slot, req) {
            self.withdraw(slot, claiming);
            return None;
        }
        self.fill(i, req, now);
        self.promote(slot, claiming).ok()
    }

    /// Whether the slot's key fields are `req`'s: its key, and its limit.
    #[inline(always)]
    fn holds_key_of(&self, slot: &crate::shm::slot::Slot, req: &Request<'_>) -> bool {
        slot.hash_lo.load(Ordering::Relaxed) == req.hash.lo
            && slot.hash_hi.load(Ordering::Relaxed) == req.hash.hi
            && slot.limit.load(Ordering::Relaxed) == req.mode.limit()
    }

    /// Takes back the IDLE entry `c` of slot `i` (anyone may). `false` if it moved on.
    pub(super) fn take_back(&self, i: usize, c: Word) -> bool {
        self.force_release(i, c)
    }

    /// Takes back this process's IDLE entry in slot `i`, if it is still one: the idle
    /// cache let go of it.
    pub(crate) fn let_go(&self, i: usize, owner: crate::shm::registry::OwnerId) {
        let Some(slot) = self.slots().get(i) else {
            return;
        };
        let c = Word(slot.control.load(Ordering::Acquire));
        // (a reservation is the writer's, or the readers', not this process's idle entry)
        if c.state() == State::Idle && c.owner() == owner && c.is_shared() && !c.writer_waits() {
            self.take_back(i, c);
        }
    }

    /// Takes back every IDLE entry of `hash` in its range (a writer about to wait for the
    /// key's readers: none comes back without seeing its mark).
    pub(super) fn take_back_idle(&self, hash: KeyHash) {
        // The broken variant leaves them.
        if broken(Broken::Idle) {
            return;
        }
        self.walk_range(hash, |i, c, seen| match seen {
            // (a reservation is left for the writer, who takes it as its slot)
            Seen::Idle { ours: true } if self.reserved(i, c) => true,
            // (look again: free now, or moved on)
            Seen::Idle { ours: true } => {
                self.take_back(i, c);
                false
            }
            _ => true,
        });
    }
}
