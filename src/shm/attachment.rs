//! This process's attachment to one table file: its registration (taken anew in a forked
//! child), its judgement of other owners, and the stall bound.

use std::fs::File;
use std::os::fd::{BorrowedFd, IntoRawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, TryLockError};
use std::time::Duration;

use crate::error::Error;
use crate::per_process::PerProcess;
use crate::shm::anchor::Anchor;
use crate::shm::clock::{raw_now, Clock, Monotonic};
use crate::shm::deleted::Gone;
use crate::shm::file::Pin;
use crate::shm::mapping::Mapping;
use crate::shm::process::fork_epoch;
use crate::shm::registry::{self, FileId, FileLocks, Identity, OwnerId};

/// How long an entry in a transitional state (a claim, an extension, the dict's writer
/// lock) must look exactly the same before a waiter may break it. Such states last
/// microseconds; a process stopped or descheduled for this long is not making progress,
/// and breaking it costs it only a retry (or, past its lease, the lease it already lost).
pub(crate) const STALL_BOUND: Duration = Duration::from_millis(500);

/// The least time between two liveness checks of one owner from this process: a waiter's
/// loop must not turn into a loop of system calls.
const RECHECK_NS: u64 = 1_000_000;

const GATES: usize = 64;

/// How often (at most) a process's slow paths look whether the table's path still leads to
/// its file: the bound on how long a process goes on with a table deleted or replaced
/// under it (for a process that waits, renews or checks a hold).
pub(crate) const LOOK_AT_PATH_EVERY: Duration = Duration::from_millis(100);

pub(crate) struct Attachment {
    pub map: Arc<Mapping>,
    /// The probe: a descriptor of the file that holds no lock of ours, to test others'
    /// through (see `probe`). No mutex: a forked child must never find it held by a
    /// thread its parent had.
    probe: AtomicI32,
    id: FileId,
    path: PathBuf,
    /// `false`: leave dead holders' keys to their leases (`OpenOptions::liveness`).
    judge: bool,
    read_only: bool,
    /// This process's registration, what keeps it, and the fork epoch it was made in. Per
    /// process: a forked child gets a mutex of its own, never one that a thread of its
    /// parent held at the fork (that one would stay locked in the child for good).
    reg: PerProcess<Mutex<Option<(OwnerId, Anchor, u64)>>>,
    /// A lazy handle's mark of this process attached (`OpenOptions::register_lazily`):
    /// kept for the handle's life, so that no reset of the table starts under it.
    _attached: Option<Anchor>,
    /// `fork epoch << 32 | owner bits` of the registration in use; 0 before any.
    cached: AtomicU64,
    /// The same, kept when `cached` is dropped (a table gone): what tells this process's
    /// holds from others' (see `is_ours`).
    mine: AtomicU64,
    /// The full registry generation of that registration (stored before `cached`).
    generation: AtomicU64,
    /// `map.id()`, beside `cached`: what the fast path's counts name (see `counters.rs`).
    map_id: u64,
    /// Per owner entry (mod 64): `owner << 40 | ms` of its last "alive" verdict.
    alive_at: [AtomicU64; GATES],
    /// The path made absolute when opened (a later `chdir` changes nothing).
    abs_path: PathBuf,
    /// The path no longer leads to the file, once seen: 1 deleted, 2 replaced (0: it does).
    gone: AtomicU8,
    /// The clock (ns) before which the path is not looked at again.
    next_look: AtomicU64,
}

/// Whether a `fork epoch << 32 | owner bits` word (`cached`, `mine`) names a registration
/// made in this process, not in a parent it was forked from (0: none).
#[inline(always)]
fn of_this_process(c: u64) -> bool {
    c != 0 && c >> 32 == fork_epoch() & 0xffff_ffff
}

impl Attachment {
    pub(crate) fn new(
        map: Arc<Mapping>,
        file: File,
        id: FileId,
        path: PathBuf,
        pin: Pin,
        judge: bool,
    ) -> Attachment {
        let read_only = matches!(pin, Pin::None);
        let (registered, attached) = match pin {
            Pin::Registered(anchor, owner) => (Some((anchor, owner)), None),
            Pin::Attached(anchor) => (None, Some(anchor)),
            Pin::None => (None, None),
        };
        // The registration belongs to the process image that made its anchor (a child
        // forked since, by a signal handler say, runs on from here with its parent's).
        let made = registered
            .as_ref()
            .map(|(anchor, owner)| (*owner, anchor.epoch()));
        let cached = made.map_or(0, |(owner, epoch)| epoch << 32 | u64::from(owner.bits()));
        let generation = made.map_or(0, |(owner, _)| map.registry().generation(owner));
        let abs_path = crate::shm::deleted::absolute(&path).unwrap_or_else(|| path.clone());
        let map_id = map.id();
        Attachment {
            map,
            probe: AtomicI32::new(file.into_raw_fd()),
            id,
            path,
            judge,
            read_only,
            reg: PerProcess::with(Mutex::new(registered.map(|(anchor, owner)| {
                let epoch = anchor.epoch();
                (owner, anchor, epoch)
            }))),
            _attached: attached,
            cached: AtomicU64::new(cached),
            mine: AtomicU64::new(cached),
            generation: AtomicU64::new(u64::from(generation)),
            map_id,
            alive_at: std::array::from_fn(|_| AtomicU64::new(0)),
            abs_path,
            gone: AtomicU8::new(0),
            next_look: AtomicU64::new(0),
        }
    }

    /// Whether the table's path still leads to this file, looked at no more often than
    /// [`LOOK_AT_PATH_EVERY`] (`now`: the table's clock, ns). Once it does not, every later
    /// call and every acquisition of this process says so ([`Error::TableGone`]): the
    /// cached registration is dropped, so that even the fast path goes the cold way.
    #[inline(always)]
    pub(crate) fn look_at_path(&self, now: u64) -> Result<(), Error> {
        if self.gone.load(Ordering::Relaxed) == 0 && now < self.next_look.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.look_at_path_now(now)
    }

    #[cold]
    #[inline(never)]
    fn look_at_path_now(&self, now: u64) -> Result<(), Error> {
        if self.gone.load(Ordering::Relaxed) == 0 {
            if now < self.next_look.load(Ordering::Relaxed) {
                return Ok(());
            }
            let every = LOOK_AT_PATH_EVERY.as_nanos() as u64;
            self.next_look
                .store(now.saturating_add(every), Ordering::Relaxed);
            match crate::shm::deleted::left(&self.abs_path, self.probe(), self.id) {
                None => return Ok(()),
                Some(Gone::Deleted) => self.gone.store(1, Ordering::Relaxed),
                Some(Gone::Replaced) => self.gone.store(2, Ordering::Relaxed),
            }
        }
        self.cached.store(0, Ordering::Release);
        Err(self.gone_error())
    }

    fn gone_error(&self) -> Error {
        let how = match self.gone.load(Ordering::Relaxed) {
            1 => Gone::Deleted,
            _ => Gone::Replaced,
        };
        Error::TableGone {
            path: self.path.clone(),
            how: how.as_str(),
        }
    }

    /// The mapping's number in this process (see `Mapping::id`).
    #[inline(always)]
    pub(crate) fn map_id(&self) -> u64 {
        self.map_id
    }

    pub(crate) fn read_only(&self) -> bool {
        self.read_only
    }

    /// Whether dead holders' keys are taken before their leases end.
    pub(crate) fn judges(&self) -> bool {
        self.judge
    }

    /// The owner id this process's entries carry.
    #[inline]
    pub(crate) fn owner(&self) -> Result<OwnerId, Error> {
        self.registration().map(|(owner, _)| owner)
    }

    /// The owner id and the full registry generation of this process's registration.
    #[inline]
    pub(crate) fn registration(&self) -> Result<(OwnerId, u32), Error> {
        let c = self.cached.load(Ordering::Acquire);
        let owner = if of_this_process(c) {
            OwnerId::from_bits(c as u32)
        } else {
            self.reregister()?
        };
        Ok((owner, self.generation.load(Ordering::Relaxed) as u32))
    }

    /// In a forked child: takes an entry of our own (the parent's is the parent's).
    #[cold]
    fn reregister(&self) -> Result<OwnerId, Error> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        if self.gone.load(Ordering::Relaxed) != 0 {
            return Err(self.gone_error());
        }
        loop {
            // This process's own mutex, so no thread of a parent holds it. (A child made by
            // a raw `clone` may share its parent's: do not wait for that one forever.)
            let cell = self.reg.get(|| Mutex::new(None));
            let mut guard = None;
            for _ in 0..1000 {
                match cell.try_lock() {
                    Ok(g) => {
                        guard = Some(g);
                        break;
                    }
                    Err(TryLockError::Poisoned(p)) => {
                        guard = Some(p.into_inner());
                        break;
                    }
                    Err(TryLockError::WouldBlock) => std::thread::sleep(Duration::from_millis(1)),
                }
            }
            let mut reg = guard.ok_or_else(|| {
                Error::io(
                    &self.path,
                    std::io::Error::other("could not register this forked process"),
                )
            })?;
            if let Some(&(owner, _, epoch)) = reg.as_ref().filter(|r| r.2 == fork_epoch()) {
                self.remember(owner, epoch);
                return Ok(owner);
            }
            // The parent's registration is the parent's to leave (its anchor was not
            // inherited, and its copy here unmaps nothing).
            *reg = None;
            let (anchor, owner) = self.register_again()?;
            // A signal handler that forked during the registration runs on here in its
            // child, which must keep neither what it finds: its parent's registration (an
            // anchor made before the fork: the parent keeps it, its copy here unmaps
            // nothing), nor one of its own in the parent's cell (whose mutex it holds, and
            // which its drop would never look at). It registers anew, in its own cell.
            if anchor.epoch() != fork_epoch() {
                drop(anchor);
                continue;
            }
            if !std::ptr::eq(cell, self.reg.get(|| Mutex::new(None))) {
                self.map.registry().unregister(owner);
                drop(anchor);
                continue;
            }
            let epoch = anchor.epoch();
            *reg = Some((owner, anchor, epoch));
            self.remember(owner, epoch);
            return Ok(owner);
        }
    }

    /// Makes `owner`, registered in fork epoch `epoch`, the one the fast path uses. The
    /// registration's epoch, not the current one: a child forked (by a signal handler)
    /// between the registration and here finds an epoch not its own, and registers anew.
    fn remember(&self, owner: OwnerId, epoch: u64) {
        self.generation.store(
            u64::from(self.map.registry().generation(owner)),
            Ordering::Relaxed,
        );
        let c = epoch << 32 | u64::from(owner.bits());
        self.mine.store(c, Ordering::Release);
        self.cached.store(c, Ordering::Release);
    }

    /// Whether a hold claimed by `owner` with registry generation `generation` (where it
    /// is known) is this process's: claimed under its own registration, not its parent's
    /// (a child forked in the middle of its parent's acquisition, by a signal handler, may
    /// come out with either), nor a dead holder's whose entry came round 64 times to our
    /// owner bits. Registers nothing.
    #[inline(always)]
    pub(crate) fn is_ours(&self, owner: OwnerId, generation: Option<u32>) -> bool {
        // (Acquire: `generation` is stored before `mine`, by `remember`)
        let m = self.mine.load(Ordering::Acquire);
        of_this_process(m)
            && m as u32 == owner.bits()
            && generation.is_none_or(|g| self.generation.load(Ordering::Relaxed) as u32 == g)
    }

    /// Registers this forked child, through an anchor of its own.
    fn register_again(&self) -> Result<(Anchor, OwnerId), Error> {
        let probe = self.probe();
        let (anchor, _, owner) =
            crate::shm::file::pin_registration(&self.path, probe, self.id, &self.map, None, true)?;
        Ok((anchor, owner.expect("an entry was asked for")))
    }

    /// The probe: the number this attachment keeps, while it names the table's file through
    /// a description marked as a probe (`registry::mark_probe`); else a new probe of its
    /// own. A number that fails the check was closed behind the library's back and is the
    /// program's now: it is left alone, never closed.
    fn probe(&self) -> BorrowedFd<'_> {
        let fd = self.probe.load(Ordering::Acquire);
        // SAFETY: a number this attachment keeps open for its lifetime (it closes none it
        // replaced), or one the program reused: only inspected and tested through here.
        let current = unsafe { BorrowedFd::borrow_raw(fd) };
        if self.id.names(current) && registry::is_probe(current) {
            return current;
        }
        let Ok(fresh) = registry::reopen(current, &self.path, self.id, registry::Access::Probe)
        else {
            // Cannot open one: lock tests go through this number, and the checks around
            // each test refuse a verdict given through anything but a probe.
            return current;
        };
        let new = fresh.into_raw_fd();
        if self
            .probe
            .compare_exchange(fd, new, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            // Another thread put a probe of its own in first: use that one.
            // SAFETY: `new` was just opened here and given to nobody.
            unsafe { libc::close(new) };
        }
        let fd = self.probe.load(Ordering::Acquire);
        // SAFETY: as above.
        unsafe { BorrowedFd::borrow_raw(fd) }
    }

    /// Whether `owner` is gone for good, by the registry (at most one system call per
    /// owner and millisecond from this process; "alive" in between). A verdict "dead" is
    /// only given through a descriptor checked to name the table's file.
    pub(crate) fn is_dead(&self, owner: OwnerId) -> bool {
        self.is_dead_at(owner, None)
    }

    /// [`is_dead`](Self::is_dead) for an owner whose full registry generation is known
    /// (a hold's lease records it).
    pub(crate) fn is_dead_at(&self, owner: OwnerId, generation: Option<u32>) -> bool {
        self.is_dead_asking(owner, generation, true)
    }

    /// [`is_dead_at`](Self::is_dead_at) asked of the registry now, not answered "alive"
    /// from a check of the last millisecond: for a rare pass (the dict's heap sweep) that
    /// a just-killed owner would otherwise put off, where no loop waits on the answer.
    pub(crate) fn is_dead_now(&self, owner: OwnerId, generation: Option<u32>) -> bool {
        self.is_dead_asking(owner, generation, false)
    }

    /// `cached`: an "alive" answered within the last millisecond stands.
    fn is_dead_asking(&self, owner: OwnerId, generation: Option<u32>, cached: bool) -> bool {
        if owner.is_unknown() || self.is_ours(owner, generation) {
            return false;
        }
        // Moved on past the holder's generation: no system call needed, nor any gate.
        if generation.is_some_and(|g| {
            let reg = self.map.registry();
            let i = owner.entry() as usize;
            i < reg.len() && reg.generation(owner) != g
        }) {
            return true;
        }
        let gate = &self.alive_at[owner.entry() as usize % GATES];
        let now = raw_now() / RECHECK_NS;
        let g = gate.load(Ordering::Relaxed);
        if cached && g >> 40 == u64::from(owner.bits()) && now.wrapping_sub(g) & ((1 << 40) - 1) < 1
        {
            return false;
        }
        let file = self.probe();
        let locks = FileLocks {
            take: None,
            probe: file,
        };
        // Asked twice around a check of the descriptor: a "nobody holds it" through a
        // number that names another file (or holds a lock of ours) by the time we look
        // means nothing.
        let dead = self.map.registry().is_dead(&locks, owner, generation)
            && self.id.names(file)
            && registry::is_probe(file);
        if !dead {
            gate.store(
                u64::from(owner.bits()) << 40 | (now & ((1 << 40) - 1)),
                Ordering::Relaxed,
            );
        }
        dead
    }

    /// Pid, start time and pid namespace of an owner, as the registry has them (checked
    /// against its full registry generation where it is known).
    pub(crate) fn identity(&self, owner: OwnerId, generation: Option<u32>) -> Option<Identity> {
        self.map.registry().identity(owner, generation)
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        // this thread's counting cell in the file is free for another thread
        crate::shm::counters::leave(self.map_id, &self.map);
        // (a parent's, in a child that never registered, is left alone: see `PerProcess`)
        let reg = self
            .reg
            .get_mut()
            .and_then(|m| m.get_mut().unwrap_or_else(|p| p.into_inner()).take());
        if let Some((owner, anchor, epoch)) = reg {
            if epoch == fork_epoch() {
                self.map.registry().unregister(owner);
            }
            drop(anchor); // unmapping it drops the locks
        }
        let fd = *self.probe.get_mut();
        // SAFETY: only inspecting the number.
        let current = unsafe { BorrowedFd::borrow_raw(fd) };
        if self.id.names(current) && registry::is_probe(current) {
            // SAFETY: the probe this attachment opened (or inherited), closed once.
            unsafe { libc::close(fd) };
        }
        // Otherwise closed behind our back and the number reused: the program's now.
    }
}

/// Notes in a slot's stall mark that it reads the entry `ident` now, and says whether
/// that very entry has been seen there, by any process, for [`STALL_BOUND`]. The mark is
/// a hash of the entry and the time it was first seen (host clock, ms): every process
/// reads the same clock, so a string of short-lived pollers adds up as one waiter would.
/// (Two entries whose hashes agree could cut a wait short; breaking a claim early costs
/// its owner only a retry.)
pub(crate) fn stalled(seen: &AtomicU64, ident: u64) -> bool {
    stood(seen, mark_hash(ident))
}

/// The hash a writer's mark on the hold `ident` is kept under: another than the stall
/// mark's of the same entry, so that neither passes for the other.
fn writer_hash(ident: u64) -> u64 {
    mark_hash(ident ^ 0x5752_4954_4552_2121) // "WRITER!!"
}

/// How long a writer's mark on a shared hold counts without being refreshed (a waiting
/// writer refreshes it every `WRITER_REFRESH` while it sleeps, and at every look while it
/// polls, whose steps are at most half a second by default).
const WRITER_LAPSE_MS: u64 = 1_000;

/// A writer waiting for the shared hold `hold` (its acquisition time and owner: what a
/// renewal keeps) says so in its slot's mark (see [`writer_gone`]).
pub(crate) fn writer_waits_still(seen: &AtomicU64, hold: u64) {
    say(seen, writer_hash(hold));
}

/// Whether no writer has said, within [`WRITER_LAPSE_MS`], that it waits for the shared
/// hold `hold`: its writer gave up or died (or the mark was overwritten meanwhile by the
/// watch of a renewal, which costs a writer's preference until its next refresh, never
/// more).
pub(crate) fn writer_gone(seen: &AtomicU64, hold: u64) -> bool {
    age(seen, writer_hash(hold)).is_none_or(|a| a >= WRITER_LAPSE_MS)
}

/// How long the writer's mark on the shared hold `hold` keeps new readers out if nobody
/// refreshes it (`None`: no writer's mark for that hold). A reader waiting behind the mark
/// sleeps no longer: nothing wakes it when the mark lapses (a writer that gave up aged it).
pub(crate) fn writer_mark_left(seen: &AtomicU64, hold: u64) -> Option<std::time::Duration> {
    let age = age(seen, writer_hash(hold))?;
    Some(std::time::Duration::from_millis(
        WRITER_LAPSE_MS.saturating_sub(age),
    ))
}

/// How recently a writer must have said that it waits for the shared hold `hold` for the
/// hold's end to keep the key for it, and for that key to stay kept (see `idle.rs`): a
/// waiting writer says so at least every `WRITER_REFRESH` (100 ms), and is woken by the
/// release it waits for.
const WRITER_ACTIVE_MS: u64 = 300;

/// Whether a writer has said, within [`WRITER_ACTIVE_MS`], that it waits for the shared
/// hold `hold`.
pub(crate) fn writer_active(seen: &AtomicU64, hold: u64) -> bool {
    age(seen, writer_hash(hold)).is_some_and(|a| a < WRITER_ACTIVE_MS)
}

/// The hash readers' mark on the exclusive hold `ident` is kept under (see
/// [`readers_wait_still`]): another than the stall mark's and a writer's.
fn readers_hash(ident: u64) -> u64 {
    mark_hash(ident ^ 0x5245_4144_4552_5321) // "READERS!"
}

/// A reader waiting for the exclusive hold `hold` says so in its slot's mark, as a writer
/// does for a reader's hold: the hold's end then keeps the key for readers (see
/// `idle.rs`), while a reader said so within [`WRITER_ACTIVE_MS`].
pub(crate) fn readers_wait_still(seen: &AtomicU64, hold: u64) {
    say(seen, readers_hash(hold));
}

/// Whether a reader has said, within [`WRITER_ACTIVE_MS`], that it waits for the
/// exclusive hold `hold`.
pub(crate) fn readers_active(seen: &AtomicU64, hold: u64) -> bool {
    age(seen, readers_hash(hold)).is_some_and(|a| a < WRITER_ACTIVE_MS)
}

/// A reader that gave up waiting for the exclusive hold `hold` ages the readers' mark to
/// [`WRITER_ACTIVE_MS`]: the hold's end keeps the key for nobody, unless another reader
/// still waiting says so again first (within 100 ms). A readers' mark keeps nobody out
/// while the hold stands, so nothing is gained by aging it less.
pub(crate) fn readers_withdraw(seen: &AtomicU64, hold: u64) {
    age_to(seen, readers_hash(hold), WRITER_ACTIVE_MS);
}

/// How old a writer that gives up makes its marks: two refresh periods
/// ([`WRITER_REFRESH`](crate::shm::table::WRITER_REFRESH), 100 ms) short of lapsing.
/// Another writer still waiting for the hold refreshes it within that (so it keeps its
/// preference, which a cleared mark took from it, even if one refresh comes late); with
/// none, new readers come in 200 ms after the give-up (waiting readers wake when the mark
/// lapses: see [`writer_mark_left`]). Dated only [`WRITER_ACTIVE_MS`] back, a mark kept
/// new readers out for 700 ms more, and a writer that tried again within that (a 5 ms
/// `lock` every 500 ms) kept them out for as long as one reader held the key; one refresh
/// period short, the waiting writer's next refresh (100 ms, plus a clock tick and its
/// wake-up) came after the lapse often enough to let readers in beside it (a review's
/// run: 89 reader holds in 30 s, 172 give-ups).
const WITHDRAWN_MS: u64 =
    WRITER_LAPSE_MS - 2 * crate::shm::table::WRITER_REFRESH.as_millis() as u64;

/// A writer that gave up ages its mark for the shared hold `hold` (see
/// `Table::writer_withdraws`) to [`WITHDRAWN_MS`]: past [`WRITER_ACTIVE_MS`], so that the
/// hold's end keeps the key for nobody, and 200 ms from lapsing, so that new readers defer
/// to the hold only until then, or for as long as another writer waiting for it refreshes
/// it. Only a writer's mark for that very hold, not the stall watch of a renewal in
/// progress, and never made younger.
pub(crate) fn writer_withdraws(seen: &AtomicU64, hold: u64) {
    age_to(seen, writer_hash(hold), WITHDRAWN_MS);
}

/// The clock marks are dated by: host monotonic milliseconds, 32 bits (every process
/// reads the same clock; ages are taken with a wrapping subtraction).
fn mark_now() -> u64 {
    (Monotonic.now() / 1_000_000) & 0xffff_ffff
}

/// Dates the mark `hash` in `seen` now.
fn say(seen: &AtomicU64, hash: u64) {
    seen.store(hash << 32 | mark_now(), Ordering::Relaxed);
}

/// How old the mark `hash` in `seen` is, in ms (`None`: another mark, or none, is there).
fn age(seen: &AtomicU64, hash: u64) -> Option<u64> {
    let c = seen.load(Ordering::Relaxed);
    (c >> 32 == hash).then(|| mark_now().wrapping_sub(c & 0xffff_ffff) & 0xffff_ffff)
}

/// Makes the mark `hash` in `seen` `ms` old, if it is younger (never younger, and only
/// that mark: another one there is left alone).
fn age_to(seen: &AtomicU64, hash: u64, ms: u64) {
    let now = mark_now();
    let c = seen.load(Ordering::Relaxed);
    let age = now.wrapping_sub(c & 0xffff_ffff) & 0xffff_ffff;
    if c >> 32 == hash && age < ms {
        let aged = now.wrapping_sub(ms) & 0xffff_ffff;
        let _ = seen.compare_exchange(c, hash << 32 | aged, Ordering::Relaxed, Ordering::Relaxed);
    }
}

fn mark_hash(ident: u64) -> u64 {
    xxhash_rust::xxh3::xxh3_64(&ident.to_le_bytes()) >> 32 | 1
}

/// Whether the mark `hash` has stood in `seen` for the stall bound; starts it if another
/// mark (or none) is there.
fn stood(seen: &AtomicU64, hash: u64) -> bool {
    let c = seen.load(Ordering::Relaxed);
    if c >> 32 == hash {
        let since = mark_now().wrapping_sub(c & 0xffff_ffff) & 0xffff_ffff;
        return since >= STALL_BOUND.as_millis() as u64;
    }
    let _ = seen.compare_exchange(
        c,
        hash << 32 | mark_now(),
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    false
}
