//! The dict's writer lock: one per dict, as ngx's shared dicts have one mutex per zone.
//! Readers never take it; writers hold it for one entry's copy.
//!
//! ```text
//!  63                 26 25            2      1        0
//! +---------------------+---------------+-------+--------+
//! |      epoch (38)     |  owner (24)   |waiters| locked |
//! +---------------------+---------------+-------+--------+
//! ```
//!
//! The word records its owner (an [`OwnerId`] of the registry) and an epoch that grows
//! with every acquisition, so that no two holds share a word. It is taken over, without
//! waiting for its owner, when the registry says the owner is dead, or when this process
//! has seen the very same word for the stall bound (the owner stopped, or descheduled that
//! long). Release is a CAS from the exact word the owner took: an owner that was taken
//! over finds it failing.
//!
//! **A turn for a writer that waited.** A writer that comes while the lock is free takes
//! it at once, even with others asleep on it: a holder that writes again and again would
//! take it back at every release before the sleeper it woke could run (up to hundreds of
//! holds while it woke). So a
//! writer that slept once and still finds the lock held asks for a turn (the `turn`
//! word: its owner id), and a release that wakes sleepers leaves the free word *reserved*
//! for it: the owner field of a free word names the writer that alone may take it. The
//! others wait; a reservation lapses when its writer is dead, or for a writer that saw
//! the same reserved word before and after a whole sleep (its writer stopped, or gone on
//! without it). A free word of a file made before reservations has no owner: the same
//! rule. (A process of a build without reservations takes a reserved word as a free one:
//! unfair, never unsafe. Every hold is a CAS from a free word, reserved or not.)
//!
//! A writer that was taken over may resume and go on writing. What it can reach is
//! contained by the entries' protocol (see [`entry`](super::entry)): every entry write
//! begins with a CAS that marks the entry as being written by its owner, then checks —
//! with a read-modify-write of this word — that the lock is still its own; whoever takes
//! the lock over then quarantines any entry such a writer marked, and a quarantined entry
//! is out of use until its writer says it is done or dies.

use crate::shm::primitive::{spin, AtomicU32, AtomicU64, Ordering, SETTLE_ROUNDS};
use crate::shm::registry::OwnerId;

const LOCKED: u64 = 1;
const WAITERS: u64 = 2;
const OWNER_SHIFT: u32 = 2;
const EPOCH_SHIFT: u32 = 26;
/// The owner field (24 bits, an [`OwnerId`]'s 22 and a mark).
const OWNER_MASK: u64 = ((1 << (EPOCH_SHIFT - OWNER_SHIFT)) - 1) << OWNER_SHIFT;
/// Marks an owner id in a free word's owner field (a reservation) and in the `turn` word,
/// so that neither is zero for owner id 0.
const NAMED: u32 = 1 << 22;

/// What the writer lock needs from the world.
pub(crate) trait WriterEnv {
    /// The owner id this process's holds carry.
    fn owner(&self) -> OwnerId;
    /// Whether `owner` is gone for good (only on the kernel's word).
    fn is_dead(&self, owner: OwnerId) -> bool;
    /// Notes that the lock reads `word` now; `true` once this process has seen that same
    /// word for the stall bound.
    fn stalled(&self, word: u64) -> bool;
    /// Sleeps a little while `wait` still reads `seen` (woken by a release).
    fn sleep(&self, wait: &AtomicU32, seen: u32);
}

/// Wakes every writer asleep on the lock.
fn wake(wait: &AtomicU32) {
    wait.fetch_add(1, Ordering::SeqCst);
    #[cfg(not(loom))]
    crate::shm::futex::wake_all(wait);
}

/// The writer lock's words in the control page.
#[derive(Clone, Copy)]
pub(crate) struct WriterLock<'a> {
    pub word: &'a AtomicU64,
    pub wait: &'a AtomicU32,
    /// The writer that asked for a turn ([`NAMED`] | its owner id), or 0.
    pub turn: &'a AtomicU32,
}

/// The writer lock, held. Release it with [`release`](Writing::release) (or drop it).
pub(crate) struct Writing<'a> {
    lock: WriterLock<'a>,
    /// The word this hold took (or moved on to, see `heartbeat`), without the waiters bit.
    /// It names the owner too: a `Writing` of whole words only, so that moving one (into
    /// the dict's `Locked`) copies what its stores wrote, without a store-forwarding stall.
    mine: std::cell::Cell<u64>,
}

/// The hold was taken over: the writer stalled past the bound (or was judged dead).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct TakenOver;

fn owner_of(word: u64) -> OwnerId {
    OwnerId::from_bits((word >> OWNER_SHIFT) as u32)
}

fn next_hold(cur: u64, owner: OwnerId) -> u64 {
    let epoch = (cur >> EPOCH_SHIFT).wrapping_add(1);
    LOCKED | u64::from(owner.bits()) << OWNER_SHIFT | epoch << EPOCH_SHIFT
}

impl<'a> WriterLock<'a> {
    /// Takes the lock. The flag says it was taken over from a dead or stalled owner: the
    /// caller must recover (see `SharedDict::recover`) before writing.
    #[inline]
    pub(crate) fn lock(self, env: &impl WriterEnv) -> (Writing<'a>, bool) {
        // The uncontended case inline: a result built in the caller's registers, not
        // returned through memory (whose reload stalled on store forwarding).
        let cur = self.word.load(Ordering::Acquire);
        // (free, and reserved for nobody: one mask)
        if cur & (LOCKED | WAITERS | OWNER_MASK) == 0 {
            let mine = next_hold(cur, env.owner());
            if self
                .word
                .compare_exchange(cur, mine, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
            {
                return (self.held(mine), false);
            }
        }
        self.lock_slow(env)
    }

    #[cold]
    #[inline(never)]
    fn lock_slow(self, env: &impl WriterEnv) -> (Writing<'a>, bool) {
        let owner = env.owner();
        let me = NAMED | owner.bits();
        let mut round = 0;
        let mut sleeps = 0u32;
        // The reserved free word seen before the last sleep.
        let mut before_sleep = None;
        loop {
            let cur = self.word.load(Ordering::Acquire);
            if cur & LOCKED == 0 {
                let named = ((cur & OWNER_MASK) >> OWNER_SHIFT) as u32;
                let may = named == 0
                    || named == me
                    || before_sleep == Some(cur)
                    || env.is_dead(OwnerId::from_bits(named));
                if may {
                    let mine = next_hold(cur, owner);
                    // (sleepers on a reserved word are woken by this hold's release)
                    let next = mine | (cur & WAITERS);
                    if self
                        .word
                        .compare_exchange(cur, next, Ordering::SeqCst, Ordering::Relaxed)
                        .is_ok()
                    {
                        self.no_turn(sleeps, me);
                        return (self.held(mine), false);
                    }
                    continue;
                }
                // Reserved for another writer: wait for it to take it, or to lapse.
            } else {
                // A holder this process has watched for the whole bound is not worth a
                // spin; one that may just be busy for a moment is, before a system call.
                let stalled = env.stalled(cur & !WAITERS);
                if !stalled && round < SETTLE_ROUNDS {
                    spin(round);
                    round += 1;
                    continue;
                }
                if stalled || env.is_dead(owner_of(cur)) {
                    let mine = next_hold(cur, owner);
                    if self
                        .word
                        .compare_exchange(cur, mine, Ordering::SeqCst, Ordering::Relaxed)
                        .is_ok()
                    {
                        if cur & WAITERS != 0 {
                            // The old owner's sleepers would otherwise sleep out their step.
                            wake(self.wait);
                        }
                        self.no_turn(sleeps, me);
                        return (self.held(mine), true);
                    }
                    continue;
                }
                if sleeps > 0 {
                    self.ask_turn(env, me);
                }
            }
            // The lost-wakeup guard: `seen` is read before the waiters bit is set (or, when
            // it is set already, before the word is read again), and the releaser changes
            // the word before it bumps `wait`, so a release after our CAS (or our second
            // read) changes `wait` and the sleep returns at once, and a release before it
            // fails the CAS (or shows in the read). Without the second read, a release
            // between the first and `seen` cost a whole sleep of a free lock.
            let seen = self.wait.load(Ordering::SeqCst);
            let unchanged = if cur & WAITERS == 0 {
                self.word
                    .compare_exchange(cur, cur | WAITERS, Ordering::SeqCst, Ordering::Relaxed)
                    .is_ok()
            } else {
                self.word.load(Ordering::SeqCst) == cur
            };
            if !unchanged {
                continue;
            }
            before_sleep = (cur & LOCKED == 0).then_some(cur | WAITERS);
            env.sleep(self.wait, seen);
            sleeps += 1;
        }
    }

    /// Withdraws the turn this writer may have asked for (`me`), once it holds the lock.
    fn no_turn(&self, sleeps: u32, me: u32) {
        if sleeps > 0 {
            let _ = self
                .turn
                .compare_exchange(me, 0, Ordering::SeqCst, Ordering::Relaxed);
        }
    }

    /// Asks for the next turn (`me`), unless another writer that lives asked first.
    fn ask_turn(&self, env: &impl WriterEnv, me: u32) {
        let asked = self.turn.load(Ordering::SeqCst);
        if asked == me || (asked != 0 && !env.is_dead(OwnerId::from_bits(asked))) {
            return;
        }
        let _ = self
            .turn
            .compare_exchange(asked, me, Ordering::SeqCst, Ordering::Relaxed);
    }

    /// What a writer `owner` that slept on the lock and asked for a turn leaves: the
    /// waiters bit on the held word, and the turn. (For a model that needs that state
    /// without a holder that waits for the sleeper.)
    #[cfg(loom)]
    pub(crate) fn asked_by(&self, owner: OwnerId) {
        self.word.fetch_or(WAITERS, Ordering::SeqCst);
        self.turn.store(NAMED | owner.bits(), Ordering::SeqCst);
    }

    fn held(self, mine: u64) -> Writing<'a> {
        Writing {
            lock: self,
            mine: std::cell::Cell::new(mine),
        }
    }

    /// The epoch of the last hold (this one's, if it is held), as
    /// [`Writing::epoch`] gives it.
    pub(crate) fn epoch(&self) -> u32 {
        (self.word.load(Ordering::Relaxed) >> EPOCH_SHIFT) as u32
    }

    /// The owner in the word, if it is locked.
    pub(crate) fn holder(&self) -> Option<OwnerId> {
        let cur = self.word.load(Ordering::Relaxed);
        (cur & LOCKED != 0).then_some(owner_of(cur))
    }
}

impl Writing<'_> {
    /// The low 32 bits of the lock epoch this hold took: a later hold's (a successor's,
    /// after a takeover) is greater, wrapping.
    pub(crate) fn epoch(&self) -> u32 {
        (self.mine.get() >> EPOCH_SHIFT) as u32
    }

    /// The owner id this hold's entry writes carry.
    pub(crate) fn owner(&self) -> OwnerId {
        owner_of(self.mine.get())
    }

    /// Whether the lock is still this hold's. A read-modify-write, not a load: of an entry
    /// writer's check and a takeover, the later one in the word's order sees the earlier
    /// (so a takeover's recovery sees the entry this writer marked, or the writer sees it
    /// lost the lock).
    pub(crate) fn still_mine(&self) -> bool {
        self.lock.word.fetch_or(0, Ordering::SeqCst) & !WAITERS == self.mine.get()
    }

    /// Moves the lock's word on to a new epoch, still ours: a holder that works long under
    /// the lock (a recovery over a big dict) shows it is not stalled. `false` if the lock
    /// was taken over meanwhile.
    pub(crate) fn heartbeat(&self) -> bool {
        let mine = self.mine.get();
        let mut cur = mine;
        loop {
            let next = next_hold(mine, owner_of(mine)) | (cur & WAITERS);
            match self
                .lock
                .word
                .compare_exchange(cur, next, Ordering::SeqCst, Ordering::Relaxed)
            {
                Ok(_) => {
                    self.mine.set(next & !WAITERS);
                    return true;
                }
                Err(now) if now & !WAITERS == mine => cur = now,
                Err(_) => return false,
            }
        }
    }

    /// Releases the lock: a CAS from the word this hold took. `Err` if it was taken over.
    #[inline(always)]
    pub(crate) fn release(self) -> Result<(), TakenOver> {
        let this = std::mem::ManuallyDrop::new(self);
        this.unlock()
    }

    // (out of line: it takes `&self`, so a call moves nothing; and the tests stop writers
    // at it with gdb, which needs its symbol)
    #[inline(never)]
    fn unlock(&self) -> Result<(), TakenOver> {
        let mine = self.mine.get();
        // Unlocked, with the epoch kept: the next hold's word is new.
        let free = mine & !((1 << EPOCH_SHIFT) - 1);
        match self
            .lock
            .word
            .compare_exchange(mine, free, Ordering::SeqCst, Ordering::Relaxed)
        {
            Ok(_) => Ok(()),
            Err(now) if now == mine | WAITERS => self.unlock_to_sleepers(free),
            Err(_) => Err(TakenOver),
        }
    }

    /// [`unlock`](Self::unlock) with writers asleep on the lock: the free word reserved
    /// for the writer that asked for a turn, if one did, and the sleepers woken.
    #[cold]
    fn unlock_to_sleepers(&self, free: u64) -> Result<(), TakenOver> {
        let mine = self.mine.get();
        let turn = self.lock.turn.load(Ordering::SeqCst);
        let mut next = free;
        if turn != 0 && turn != NAMED | owner_of(mine).bits() {
            next |= u64::from(turn) << OWNER_SHIFT;
        }
        match self.lock.word.compare_exchange(
            mine | WAITERS,
            next,
            Ordering::SeqCst,
            Ordering::Relaxed,
        ) {
            Ok(_) => {
                if turn != 0 {
                    // (given, or this writer's own: asked no more)
                    let _ = self.lock.turn.compare_exchange(
                        turn,
                        0,
                        Ordering::SeqCst,
                        Ordering::Relaxed,
                    );
                }
                wake(self.lock.wait);
                Ok(())
            }
            Err(_) => Err(TakenOver),
        }
    }
}

/// Releases on drop, for a writer that unwinds; whether it was taken over is then moot.
impl Drop for Writing<'_> {
    fn drop(&mut self) {
        let _ = self.unlock();
    }
}
