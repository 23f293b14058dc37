//! Taking a key: the fast path (a free home of reach 0, one CAS) and the general claim.
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
//! exactly "free, reach 0", and needs neither count nor scan: a rival that must place the
//! key farther out raises the reach with an RMW of that same word first, so either our CAS
//! fails or the rival's raise reads our CLAIMING entry (RMWs of one word are totally
//! ordered, each reading the one before) and its rescan (a claimer that raised the reach
//! always rescans) defers to it. When the free home's fields already hold exactly what the
//! claim would write (the same thread took the same key there within the same clock tick:
//! hash, lease, deadline), the claim goes from FREE to HELD in that one CAS: a free slot's
//! fields change only under an owner, so they cannot change between the reads and a CAS
//! that finds the slot still free.
//!
//! # What loom proves here, and what it cannot
//!
//! Loom checks every interleaving and every value an acquire/release execution allows, and
//! it models `SeqCst` fences, but it models `SeqCst` accesses as `AcqRel` (it has no single
//! total order of them). The argument above therefore rests only on RMWs of one location
//! and acquire/release, all of which loom models; the `SeqCst` accesses in the code are
//! belt and braces. Loom does not model time (the clock is driven by the models), the
//! kernel's locks (a fake registry lock table), or processes (threads stand in, a "crash"
//! unwinds a thread at a chosen step and never runs it again).

use super::idle::takes_back;
use super::{
    busy, claims_conflict, Attempt, Busy, Conflict, Env, Held, KeyHash, Lost, Mode, Request, Seen,
    Slots, Table, TableFull, WaitFor,
};
use crate::broken::{broken, Broken};
use crate::shm::clock::deadline;
use crate::shm::primitive::{crash_point, Ordering};
use crate::shm::slot::{Slot, State, Word, REACH_OVERFLOW, WRITER_WAITS};

/// How many times a claim restarts after yielding to a rival before it reports the key busy.
const MAX_RESTARTS: u32 = 16;

/// What pass 1 found in a key's range.
enum Scan {
    /// The key is held here, or claimed here by a rival still at it (alive, not stalled).
    Busy(Busy),
    /// The key is held in shared mode with another limit.
    Mismatch(u32),
    /// The key is not held: the slot to claim is at this distance, with this word (this
    /// process's idle entry of the key, else the nearest free slot, else an idle entry).
    Free(usize, Word),
    /// The key is not held, and there is no free slot.
    Full,
}

/// What pass 2 found in a key's range.
enum Rescan {
    /// Nothing stands in the claim's way: publish it.
    Clear,
    /// The key is held, or claimed by a rival still at it (alive, not stalled): our claim
    /// was taken back.
    Busy(Busy),
    /// A rival nearer home was claiming the key: our claim was taken back to let it finish,
    /// and it did; start over (at most [`MAX_RESTARTS`] times, then report the key busy
    /// here).
    Yield(Busy),
    /// The key is held in shared mode with another limit: our claim was taken back.
    Mismatch(u32),
}

/// The permits of a semaphore counted in a scan of its key's range.
struct Permits {
    limit: u32,
    taken: u32,
    /// The nearest one, which a waiter reports as the holder.
    first: Option<(usize, Word)>,
}

impl Permits {
    fn new(mode: Mode) -> Permits {
        Permits {
            limit: mode.limit(),
            taken: 0,
            first: None,
        }
    }

    fn count(&mut self, i: usize, c: Word) {
        self.taken += 1;
        self.first.get_or_insert((i, c));
    }

    /// All taken: the busy a waiter sleeps on.
    fn exhausted(&self, home: usize, hash: KeyHash) -> Option<Busy> {
        if self.limit == 0 || self.taken < self.limit {
            return None;
        }
        let (i, c) = self.first?;
        Some(Busy {
            wait: WaitFor::Permits { limit: self.limit },
            ..busy(i, home, c, hash)
        })
    }
}

/// The busy of a live entry that stands in the way of a claim in `mode`: a writer waits
/// for readers, and a reader for a writer, in their own ways.
fn blocked(i: usize, home: usize, c: Word, hash: KeyHash, mode: Mode) -> Busy {
    let wait = match mode {
        Mode::Exclusive if c.is_shared() => WaitFor::Readers,
        Mode::Shared { limit: 0 } if !c.is_shared() => WaitFor::Writer,
        _ => WaitFor::Entry,
    };
    Busy {
        wait,
        ..busy(i, home, c, hash)
    }
}

impl<S: Slots, E: Env> Table<S, E> {
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
                req.mode.mark(req.hash),
                req.owner,
                c.gen().wrapping_add(1),
                c,
            );
            return self.claim_direct(slot, c, word, req, now, until).map(held);
        }
        if slot.hash_lo.load(Ordering::Relaxed) != req.hash.lo {
            // another key's slot: `fill` will write this key's preview on the cold line
            self.cold(home).prefetch_for_write();
        }
        let claiming = Word::new(
            State::Claiming,
            req.mode.mark(req.hash),
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

    /// The one-CAS claim: `c` (free, or this process's idle entry) to the HELD `word`,
    /// when the slot's fields already say what the claim would write. `None` if the word
    /// moved, or the fields changed before the CAS.
    #[inline(always)]
    pub(super) fn claim_direct(
        &self,
        slot: &Slot,
        c: Word,
        word: Word,
        req: &Request<'_>,
        now: u64,
        until: u64,
    ) -> Option<Word> {
        slot.control
            .compare_exchange(c.0, word.0, Ordering::SeqCst, Ordering::Relaxed)
            .ok()?;
        crash_point();
        // The fields are ours to keep now, but were they still the ones checked when the
        // CAS succeeded? A claimer stopped between the check and the CAS while the word came
        // round to the same value would publish someone else's.
        if !Self::fields_say(slot, req, now, until) {
            self.withdraw(slot, word);
            return None;
        }
        Some(word)
    }

    /// Whether a free slot's fields already say what a claim of `req` would write (this
    /// thread took this key there within this clock tick), so the hold can be published as
    /// HELD by the claim's CAS itself.
    #[inline(always)]
    pub(super) fn fields_say(slot: &Slot, req: &Request<'_>, now: u64, until: u64) -> bool {
        slot.hash_lo.load(Ordering::Relaxed) == req.hash.lo
            && slot.hash_hi.load(Ordering::Relaxed) == req.hash.hi
            && slot.lease.load(Ordering::Relaxed) == req.lease
            && slot.deadline.load(Ordering::Relaxed) == until
            && slot.acquired_at.load(Ordering::Relaxed) == now
            // (an exclusive entry's limit means nothing: not looked at)
            && (req.mode == Mode::Exclusive
                || slot.limit.load(Ordering::Relaxed) == req.mode.limit())
    }

    /// CLAIMING → HELD, keeping the reach bits a rival may have raised meanwhile. `Err`:
    /// the claim was broken as stalled (and has been backed out of).
    #[inline]
    pub(super) fn promote(&self, slot: &Slot, claiming: Word) -> Result<Word, Lost> {
        let mut cur = claiming;
        loop {
            // (a writer's mark belongs to a hold it saw; none is this new one's)
            let held = Word(cur.next(State::Held).0 & !WRITER_WAITS);
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
    pub(super) fn withdraw(&self, slot: &Slot, claim: Word) {
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
                        let home = cur.is_shared().then(|| self.home_of(i));
                        self.wake_left(i, cur, home);
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

    /// The general claim: two scans of the key's range, with rivals and stale entries.
    /// Each round reads the home's claim count, scans the range (pass 1), claims the
    /// nearest free slot, counts the claim, scans again if a rival was in flight (pass 2)
    /// and publishes the hold; a round that loses a race starts over.
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
                if self.conflict(home, hc, req.mode) == Conflict::Busy {
                    return Ok(Attempt::Busy(blocked(home, home, hc, hash, req.mode)));
                }
            }
        }
        let mut restarts = 0;
        'restart: loop {
            // The home's claim count, read before anything else: a claimer of one of this
            // home's keys that counted its claim before this read published it before,
            // so pass 1 sees it (see "Why two live entries of one key cannot exist").
            let claims = slots[home].fence.load(Ordering::SeqCst);
            let reach = self.reach(home, Ordering::Acquire);
            let (fd, fc) = match self.scan(home, reach, req, now) {
                Scan::Free(d, c) => (d, c),
                Scan::Busy(b) => return Ok(Attempt::Busy(b)),
                Scan::Mismatch(limit) => return Ok(Attempt::Mismatch { limit }),
                Scan::Full => {
                    if self.reap_any(now) {
                        continue 'restart;
                    }
                    return Err(TableFull);
                }
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
            let mark = req.mode.mark(hash);
            let claiming = Word::new(state, mark, req.owner, fc.gen().wrapping_add(1), fc);
            if slot
                .control
                .compare_exchange(fc.0, claiming.0, Ordering::SeqCst, Ordering::Relaxed)
                .is_err()
            {
                continue 'restart;
            }
            crash_point();
            if fc.state() == State::Idle && fc.has_waiters() {
                // asleep on the reservation this claim took (readers behind a writer's,
                // writers behind readers'): they wait for it now
                self.wake(fi);
            }
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
            if rivals {
                match self.rescan(home, fd, slot, claiming, hash, req.mode, now) {
                    Rescan::Clear => {}
                    Rescan::Busy(b) => return Ok(Attempt::Busy(b)),
                    Rescan::Mismatch(limit) => return Ok(Attempt::Mismatch { limit }),
                    Rescan::Yield(b) => {
                        restarts += 1;
                        if restarts > MAX_RESTARTS {
                            return Ok(Attempt::Busy(b));
                        }
                        continue 'restart;
                    }
                }
            }

            match self.publish(slot, claiming, direct, req, now, until) {
                Ok(word) => {
                    return Ok(Attempt::Acquired(Held {
                        slot: fi,
                        home,
                        word,
                        lease: req.lease,
                        acquired_at: now,
                    }))
                }
                // Broken as stalled while we scanned (or taken back, its fields changed):
                // start over.
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

    /// Publishes a claim that nothing stands in the way of: a CLAIMING one is promoted; one
    /// made directly as HELD stands if its fields still say what its claim checked, and is
    /// taken back otherwise. `Err(Lost)`: taken back, or broken as stalled meanwhile.
    #[inline(always)]
    fn publish(
        &self,
        slot: &Slot,
        claiming: Word,
        direct: bool,
        req: &Request<'_>,
        now: u64,
        until: u64,
    ) -> Result<Word, Lost> {
        if direct && !Self::fields_say(slot, req, now, until) {
            // Fields changed between the check and the CAS (see try_acquire_fast).
            self.withdraw(slot, claiming);
            Err(Lost)
        } else if direct {
            Ok(claiming)
        } else {
            self.promote(slot, claiming)
        }
    }

    /// Pass 1: is the key held anywhere in its range, and where is the first free slot?
    #[inline(always)]
    fn scan(&self, home: usize, reach: usize, req: &Request<'_>, now: u64) -> Scan {
        let (hash, mode) = (req.hash, req.mode);
        let slots = self.slots();
        let n = slots.len();
        let mut free = None;
        let mut permits = Permits::new(mode);
        // A free home is the nearest place there is.
        let hc = self.word(home, Ordering::SeqCst);
        if hc.state() == State::Free && !broken(Broken::Protocol) {
            free = Some((0, hc));
        }
        let (mut own, mut idle) = (None, None);
        let mut d = 0;
        while d < n {
            if d > reach && (free.is_some() || idle.is_some() || own.is_some()) {
                break;
            }
            let i = self.at(home, d);
            let c = self.word(i, Ordering::SeqCst);
            match self.examine(&slots[i], c, hash, now) {
                // The key kept for a writer: a writer claims it as its slot (the key is
                // never without an entry readers defer to), a reader waits for it. (A
                // permit's claim takes it back below, as any idle entry of its key.)
                Seen::Idle { ours: true }
                    if match mode {
                        Mode::Exclusive => own.is_none(),
                        Mode::Shared { limit } => limit == 0,
                    } && self.reserved(i, c) =>
                {
                    if mode == Mode::Exclusive {
                        own = Some((d, c));
                    } else {
                        return Scan::Busy(busy(i, home, c, hash));
                    }
                }
                // The key kept for readers: a reader claims it as its slot (the key is
                // never without an entry writers defer to, and the readers woken with it
                // join that reader), a writer waits for it. (A permit's claim takes it
                // back below, as any idle entry of its key.)
                Seen::Idle { ours: true }
                    if !c.is_shared()
                        && match mode {
                            Mode::Exclusive => true,
                            Mode::Shared { limit } => limit == 0 && own.is_none(),
                        }
                        && self.kept_for_readers(i, c) =>
                {
                    if mode == Mode::Exclusive {
                        return Scan::Busy(busy(i, home, c, hash));
                    }
                    own = Some((d, c));
                }
                // (before the reach test: an idle entry of the key may be re-entered)
                Seen::Idle { ours: true } if takes_back(c, mode) => {
                    self.take_back(i, c);
                    continue;
                }
                // this process's own idle entry of the key (its cache forgot it): as good
                // as a free slot, and better taken again than left beside a new one
                Seen::Idle { ours: true } if c.owner() == req.owner => {
                    own.get_or_insert((d, c));
                }
                // nobody's hold: claimed as a free slot is (the claim's CAS takes it back),
                // if the range has no free slot (its owner would rather take it again)
                Seen::Idle { .. } => {
                    idle.get_or_insert((d, c));
                }
                Seen::Free => {
                    if free.is_none() {
                        free = Some((d, c));
                        // The classic mistake the protocol exists to avoid: stop at the
                        // first free slot, as if the key could not be further on.
                        if broken(Broken::Protocol) {
                            break;
                        }
                    }
                }
                Seen::Changed => continue,
                // Beyond the reach read above, an entry of the key can only belong to a
                // claimer that published after that read: its count moves the home's
                // claim count, and pass 2 sees it.
                _ if d > reach => {}
                Seen::Other => {}
                Seen::Claiming if !claims_conflict(c, mode) => {}
                Seen::Claiming => match self.settle(i, c) {
                    Some(_) => continue,
                    None => return Scan::Busy(busy(i, home, c, hash)),
                },
                Seen::Key => match self.conflict(i, c, mode) {
                    Conflict::Busy => return Scan::Busy(blocked(i, home, c, hash, mode)),
                    // a dead holder's count is nobody's: take its hold back first
                    Conflict::Mismatch(_) if self.reap_dead_shared(i, c) => continue,
                    Conflict::Mismatch(l) => return Scan::Mismatch(l),
                    Conflict::Changed => continue,
                    Conflict::Permit => permits.count(i, c),
                    Conflict::Beside => {}
                },
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
        if let Some(b) = permits.exhausted(home, hash) {
            return Scan::Busy(b);
        }
        match own.or(free).or(idle) {
            Some((d, c)) => Scan::Free(d, c),
            None => Scan::Full,
        }
    }

    /// Pass 2, made when a rival was in flight: the whole range again but for our claim
    /// (`claiming`, at distance `fd`), and what it finds decides.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn rescan(
        &self,
        home: usize,
        fd: usize,
        slot: &Slot,
        claiming: Word,
        hash: KeyHash,
        mode: Mode,
        now: u64,
    ) -> Rescan {
        let slots = self.slots();
        let mut permits = Permits::new(mode);
        let range = self.reach(home, Ordering::SeqCst).max(fd);
        // The broken variant trusts pass 1 and skips the rescan.
        let range = if broken(Broken::Protocol) { 0 } else { range };
        let mut d = 0;
        while d <= range {
            if d == fd {
                d += 1;
                continue;
            }
            let i = self.at(home, d);
            let c = self.word(i, Ordering::SeqCst);
            match self.examine(&slots[i], c, hash, now) {
                Seen::Idle { ours: true } if takes_back(c, mode) => {
                    self.take_back(i, c);
                    continue;
                }
                Seen::Free | Seen::Other | Seen::Idle { .. } => {}
                Seen::Changed => continue,
                Seen::Expired => {
                    self.steal(i, c);
                    continue;
                }
                Seen::Stealing => {
                    self.resolve_steal(i, c);
                    continue;
                }
                Seen::Key => match self.conflict(i, c, mode) {
                    Conflict::Busy => {
                        self.withdraw(slot, claiming);
                        return Rescan::Busy(blocked(i, home, c, hash, mode));
                    }
                    Conflict::Mismatch(_) if self.reap_dead_shared(i, c) => continue,
                    Conflict::Mismatch(l) => {
                        self.withdraw(slot, claiming);
                        return Rescan::Mismatch(l);
                    }
                    Conflict::Changed => continue,
                    Conflict::Permit => permits.count(i, c),
                    Conflict::Beside => {}
                },
                Seen::Claiming if !claims_conflict(c, mode) => {}
                Seen::Claiming if d < fd => {
                    // A rival nearer home has priority: step aside, let it finish.
                    self.withdraw(slot, claiming);
                    let b = busy(i, home, c, hash);
                    return match self.settle(i, c) {
                        Some(_) => Rescan::Yield(b),
                        None => Rescan::Busy(b),
                    };
                }
                Seen::Claiming => match self.settle(i, c) {
                    Some(_) => continue,
                    None => {
                        // The rival farther out may not have seen us: we cannot proceed.
                        self.withdraw(slot, claiming);
                        return Rescan::Busy(busy(i, home, c, hash));
                    }
                },
            }
            d += 1;
        }
        if let Some(b) = permits.exhausted(home, hash) {
            self.withdraw(slot, claiming);
            return Rescan::Busy(b);
        }
        Rescan::Clear
    }

    /// Writes the fields of slot `i`, freshly claimed (owner-only, before promotion).
    #[inline]
    pub(super) fn fill(&self, i: usize, req: &Request<'_>, now: u64) {
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
        if let Mode::Shared { limit } = req.mode {
            slot.limit.store(limit, Ordering::Relaxed);
        }
        crash_point();
    }

    /// Raises a home's reach to at least `d`, before an entry is published there.
    pub(super) fn raise_reach(&self, home: usize, d: usize) {
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
}
