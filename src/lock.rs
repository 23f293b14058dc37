//! The public API: [`LockTable`], the resty-style [`Lock`] object and the RAII [`LockGuard`].

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_utils::Backoff;

use crate::clock::{Clock, Monotonic};
use crate::error::Error;
use crate::file::{self, MappedSlots, OpenSpec};
use crate::format::Header;
use crate::futex::{self, Futex};
use crate::options::{LockOptions, Resolved};
use crate::process::{self, Kernel, Owner};
use crate::slot::State;
use crate::table::{Attempt, Busy, Entry, Held, KeyHash, Prepared, Request, Table};
use crate::wait::Schedule;
use crate::MAX_KEY_LEN;

type Slots = Table<MappedSlots, Monotonic, Kernel, Futex>;

/// A lock table in a memory-mapped file, shared by every process that opens the same path
/// (and by forked children of a process that opened it).
///
/// A cheap `Clone` handle: clones share one mapping. `Send + Sync`.
///
/// ```
/// use shmlock::{LockOptions, LockTable};
/// use std::time::Duration;
///
/// # let dir = tempdir();
/// let table = LockTable::open(dir.join("locks"), 1024)?;
/// let guard = table.lock("user:42", &LockOptions::default())?;
/// assert!(table.try_lock("user:42", Duration::from_secs(30))?.is_none());
/// drop(guard);
/// assert!(table.try_lock("user:42", Duration::from_secs(30))?.is_some());
/// # fn tempdir() -> std::path::PathBuf {
/// #     let d = std::env::temp_dir().join(format!("shmlock-doc-{}-{}", std::process::id(), line!()));
/// #     let _ = std::fs::remove_dir_all(&d);
/// #     std::fs::create_dir_all(&d).unwrap();
/// #     d
/// # }
/// # Ok::<(), shmlock::Error>(())
/// ```
#[derive(Clone)]
pub struct LockTable {
    inner: Arc<Inner>,
}

struct Inner {
    table: Slots,
    header: Header,
    path: PathBuf,
    created: bool,
    /// This process is in another pid namespace than the table's creator: its pid means
    /// nothing to the others, so its entries carry pid 0 (judged by expiry alone).
    foreign_pid_ns: bool,
    /// Process-local memory of when each slot's owner was last checked for liveness, so
    /// a `try_lock` loop does not turn into a loop of system calls.
    checked: [AtomicU64; LIVENESS_GATES],
}

const LIVENESS_GATES: usize = 64;
/// Rounds of exponential spinning (crossbeam's `Backoff::spin`) before a waiter sleeps:
/// about 1 µs in all. Spinning longer, or yielding, only steals the cache line from a
/// holder that is about to release it.
const SPINS: u32 = 4;
/// The least time between two liveness checks of one slot from this process.
const LIVENESS_INTERVAL_NS: u64 = 1_000_000;

/// How to open a [`LockTable`]: capacity and permissions of a table this call creates.
///
/// ```
/// # let path = std::env::temp_dir().join(format!("shmlock-doc-opts-{}", std::process::id()));
/// # let _ = std::fs::remove_file(&path);
/// use shmlock::LockTable;
/// let table = LockTable::options().capacity(64).mode(0o660).open(&path)?;
/// assert_eq!(table.capacity(), 64);
/// // Attaching uses the file's own layout, whatever capacity is asked for.
/// assert_eq!(LockTable::open(&path, 8)?.capacity(), 64);
/// # std::fs::remove_file(&path).unwrap();
/// # Ok::<(), shmlock::Error>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct OpenOptions {
    spec: OpenSpec,
    liveness: Option<bool>,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            spec: OpenSpec {
                capacity: 1024,
                mode: 0o600,
                create: true,
            },
            liveness: None,
        }
    }
}

impl OpenOptions {
    /// How many keys can be held at once in a table this call creates (default 1024).
    pub fn capacity(mut self, capacity: usize) -> Self {
        self.spec.capacity = capacity as u64;
        self
    }

    /// Permission bits of a table this call creates (default `0o600`).
    pub fn mode(mut self, mode: u32) -> Self {
        self.spec.mode = mode;
        self
    }

    /// Whether a missing file is created (default) or an error.
    pub fn create(mut self, create: bool) -> Self {
        self.spec.create = create;
        self
    }

    /// Whether this process reclaims the keys of holders it sees dead (by pid and start
    /// time). Default: yes when it shares the pid namespace of the table's creator, no
    /// otherwise (pids of another namespace mean nothing here); expiry works either way.
    pub fn liveness(mut self, judge: bool) -> Self {
        self.liveness = Some(judge);
        self
    }

    /// Opens (and maybe creates) the table at `path`.
    pub fn open(self, path: impl AsRef<Path>) -> Result<LockTable, Error> {
        LockTable::with_options(path.as_ref(), self)
    }
}

impl LockTable {
    /// Attaches to the table at `path`, creating it with room for `capacity` simultaneous
    /// holders if it does not exist. Creation is atomic: of many processes opening a new
    /// path at once, all end up on one table.
    pub fn open(path: impl AsRef<Path>, capacity: usize) -> Result<LockTable, Error> {
        LockTable::options().capacity(capacity).open(path)
    }

    /// Options for opening a table.
    pub fn options() -> OpenOptions {
        OpenOptions::default()
    }

    fn with_options(path: &Path, options: OpenOptions) -> Result<LockTable, Error> {
        let opened = file::open(path, options.spec)?;
        let same_pid_ns = opened.header.pid_ns == process::pid_namespace();
        let judge = options.liveness.unwrap_or(same_pid_ns);
        Ok(LockTable {
            inner: Arc::new(Inner {
                table: Table::new(opened.slots, Monotonic, Kernel { judge }, Futex),
                header: opened.header,
                path: path.to_path_buf(),
                created: opened.created,
                foreign_pid_ns: !same_pid_ns,
                checked: std::array::from_fn(|_| AtomicU64::new(0)),
            }),
        })
    }

    /// How many keys can be held at once (fixed when the file was created).
    pub fn capacity(&self) -> usize {
        self.inner.header.slot_count as usize
    }

    /// The file this table lives in.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Whether this handle's `open` created the file.
    pub fn created(&self) -> bool {
        self.inner.created
    }

    /// Takes `key`, waiting as `opts` says; released when the guard drops.
    pub fn lock(&self, key: impl AsRef<[u8]>, opts: &LockOptions) -> Result<LockGuard<'_>, Error> {
        let resolved = opts.resolve()?;
        let req = self.request(key.as_ref(), resolved.exptime_ns)?;
        let (hold, elapsed) = match self.inner.table.try_acquire_fast(&req) {
            Some(held) => (Hold::new(held), Duration::ZERO),
            None => self.acquire_slow(&req, &resolved, Some(opts.timeout))?,
        };
        Ok(LockGuard {
            table: self,
            hold,
            elapsed,
            exptime_ns: resolved.exptime_ns,
        })
    }

    /// Takes `key` if nobody holds it, without waiting. `Ok(None)` if it is held.
    /// `exptime` is the lease length (zero: never expires).
    pub fn try_lock(
        &self,
        key: impl AsRef<[u8]>,
        exptime: Duration,
    ) -> Result<Option<LockGuard<'_>>, Error> {
        let opts = LockOptions {
            exptime,
            timeout: Duration::ZERO,
            ..LockOptions::default()
        }
        .resolve()?;
        let req = self.request(key.as_ref(), opts.exptime_ns)?;
        let acquired = match self.inner.table.try_acquire_fast(&req) {
            Some(held) => Ok((Hold::new(held), Duration::ZERO)),
            None => self.acquire_slow(&req, &opts, None),
        };
        match acquired {
            Ok((hold, elapsed)) => Ok(Some(LockGuard {
                table: self,
                hold,
                elapsed,
                exptime_ns: opts.exptime_ns,
            })),
            Err(Error::Timeout) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Whether someone holds `key` right now (a snapshot: it may change at once).
    pub fn is_locked(&self, key: impl AsRef<[u8]>) -> Result<bool, Error> {
        let key = check_key(key.as_ref())?;
        Ok(self.inner.table.find(self.hash(key)).is_some())
    }

    /// Who holds what: one entry per occupied slot, including expired ones not yet reaped.
    /// Judges each owner's liveness (a system call or two per entry).
    pub fn holders(&self) -> Vec<Holder> {
        let table = &self.inner.table;
        let now = table.now();
        table
            .entries()
            .into_iter()
            .map(|e| Holder::from_entry(&e, now, !table.is_owner_dead(&e)))
            .collect()
    }

    /// Breaks the lock on `key`, whoever holds it, and returns who did (`None`: nobody).
    /// The holder finds out at its next unlock or renewal ([`Error::Expired`]); waiters are
    /// woken. For operators clearing a stuck lock: the holder may still be running.
    pub fn force_unlock(&self, key: impl AsRef<[u8]>) -> Result<Option<Holder>, Error> {
        let key = check_key(key.as_ref())?;
        let table = &self.inner.table;
        let now = table.now();
        Ok(table
            .break_hold(self.hash(key))
            .map(|(e, dead)| Holder::from_entry(&e, now, !dead)))
    }

    /// The format version of the file (see `src/format.rs`).
    pub fn format_version(&self) -> u32 {
        crate::format::VERSION
    }

    /// Where the live entry of `key` sits: `(home, slot)`. For tests that need to arrange
    /// keys in a probe path; not part of the stable API.
    #[doc(hidden)]
    pub fn debug_placement(&self, key: impl AsRef<[u8]>) -> Option<(usize, usize)> {
        let key = check_key(key.as_ref()).ok()?;
        self.inner
            .table
            .find(self.hash(key))
            .map(|b| (b.home, b.slot))
    }

    /// Frees every entry whose lease ran out or whose owner is seen dead, and returns how
    /// many. Claimers do this lazily for the keys they meet; this is for housekeeping
    /// (after a crash, before inspecting).
    pub fn reap(&self) -> usize {
        self.inner.table.reap_all()
    }

    /// How many slots are occupied (held, being claimed, or expired and not yet reaped).
    pub fn occupancy(&self) -> usize {
        self.inner.table.entries().len()
    }

    fn hash(&self, key: &[u8]) -> KeyHash {
        KeyHash::of(key, self.inner.header.seed)
    }

    /// Checks the key and describes one acquisition of it.
    #[inline(always)]
    fn request<'k>(&self, key: &'k [u8], exptime_ns: u64) -> Result<Request<'k>, Error> {
        let key = check_key(key)?;
        let owner = if self.inner.foreign_pid_ns {
            Owner { pid: 0, start: 0 }
        } else {
            process::current()
        };
        Ok(Request {
            key,
            hash: self.hash(key),
            owner,
            lease: next_lease(),
            exptime: exptime_ns,
        })
    }

    /// Everything but the fast path: the general claim, then waiting if the key is busy.
    #[cold]
    #[inline(never)]
    fn acquire_slow(
        &self,
        req: &Request<'_>,
        opts: &Resolved,
        timeout: Option<Duration>,
    ) -> Result<(Hold, Duration), Error> {
        match self.inner.table.try_acquire_slow(req) {
            Ok(Attempt::Acquired(held)) => Ok((Hold::new(held), Duration::ZERO)),
            Ok(Attempt::Busy(busy)) => self.wait(req, busy, opts, timeout),
            Err(_) => Err(Error::TableFull),
        }
    }

    /// The waiting part of an acquisition: resty's schedule of sleeps, either plain
    /// (`notify: false`, elapsed = sum of the steps) or on the home's futex, woken by
    /// whoever frees the key (elapsed = time actually waited).
    fn wait(
        &self,
        req: &Request<'_>,
        mut busy: Busy,
        opts: &Resolved,
        timeout: Option<Duration>,
    ) -> Result<(Hold, Duration), Error> {
        let table = &self.inner.table;
        let mut schedule = Schedule::new(opts, timeout.unwrap_or(Duration::ZERO));
        let notify = opts.notify && futex::AVAILABLE;
        let started = Instant::now();
        let mut slept = Duration::ZERO; // sum of the steps, for polling
        let elapsed = |slept| if notify { started.elapsed() } else { slept };
        let attempt = |busy: &mut Busy| match table.try_acquire(req) {
            Ok(Attempt::Acquired(held)) => Ok(Some(Hold::new(held))),
            Ok(Attempt::Busy(b)) => {
                *busy = b;
                Ok(None)
            }
            Err(_) => Err(Error::TableFull),
        };

        if notify && timeout.is_some_and(|t| !t.is_zero()) {
            // A short spin first: most critical sections end within microseconds.
            let backoff = Backoff::new();
            for _ in 0..SPINS {
                backoff.spin();
                if let Some(hold) = attempt(&mut busy)? {
                    return Ok((hold, elapsed(slept)));
                }
            }
        }
        // At most one retry without sleeping per step (after reaping a dead holder, or when
        // the entry changed while flagging it), so that no loop runs hot.
        let mut retried = false;
        loop {
            if !retried && self.reap_if_dead(&busy) {
                retried = true;
            } else {
                let Some(step) = schedule.next_sleep() else {
                    return Err(Error::Timeout);
                };
                retried = false;
                if !notify {
                    std::thread::sleep(step);
                    slept += step;
                } else {
                    match table.prepare_wait(&busy) {
                        Prepared::Sleep(seen) => {
                            let t = Instant::now();
                            futex::wait(table.wait_word(busy.home), seen, step);
                            schedule.refund(step.saturating_sub(t.elapsed()));
                        }
                        Prepared::Changed => {
                            schedule.refund(step);
                            retried = true;
                        }
                        Prepared::Poll => std::thread::sleep(step),
                    }
                }
            }
            if let Some(hold) = attempt(&mut busy)? {
                return Ok((hold, elapsed(slept)));
            }
        }
    }

    /// Checks the holder that made an attempt busy, at most once per interval per slot.
    fn reap_if_dead(&self, busy: &Busy) -> bool {
        let gate = &self.inner.checked[busy.slot % LIVENESS_GATES];
        let now = Monotonic.now();
        let last = gate.load(Ordering::Relaxed);
        if now.saturating_sub(last) < LIVENESS_INTERVAL_NS
            || gate
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return false;
        }
        self.inner.table.reap_if_dead(busy)
    }

    #[inline]
    fn release(&self, hold: &Hold) -> Result<(), Error> {
        if hold.pid != process::current_pid() {
            return Err(Error::NotOwner);
        }
        self.inner
            .table
            .release(&hold.held)
            .map_err(|_| Error::Expired)
    }

    fn extend(&self, hold: &mut Hold, exptime_ns: u64, ttl: Option<Duration>) -> Result<(), Error> {
        if hold.pid != process::current_pid() {
            return Err(Error::NotOwner);
        }
        let exptime = match ttl {
            None => exptime_ns,
            Some(d) => u64::try_from(d.as_nanos())
                .map_err(|_| Error::InvalidOptions("ttl must be below 584 years"))?,
        };
        self.inner
            .table
            .extend(&mut hold.held, exptime)
            .map_err(|_| Error::Expired)
    }

    fn token(&self, hold: &Hold) -> Option<u64> {
        if hold.pid != process::current_pid() {
            return None;
        }
        if hold.token.get() != 0 {
            return Some(hold.token.get());
        }
        let t = self.inner.table.token(&hold.held)?;
        hold.token.set(t);
        Some(t)
    }
}

impl std::fmt::Debug for LockTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockTable")
            .field("path", &self.inner.path)
            .field("capacity", &self.capacity())
            .finish()
    }
}

/// One occupied slot, as [`LockTable::holders`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The first bytes of the key (at most 40).
    pub key_preview: Vec<u8>,
    /// The full key length.
    pub key_len: usize,
    /// The owning process (0 when it is in another pid namespace than the table's creator).
    pub pid: u32,
    /// Whether the owner is alive, as far as this process can tell (pid, start time).
    pub owner_alive: bool,
    /// What the entry is doing.
    pub state: HolderState,
    /// Someone is asleep waiting for this key.
    pub waiters: bool,
    /// The fencing token, if the holder asked for one.
    pub token: Option<u64>,
    /// Time since the key was taken.
    pub age: Duration,
    /// Time left on the lease; `None` if it never expires.
    pub ttl: Option<Duration>,
    /// The lease ran out; the next claimer of the key (or [`LockTable::reap`]) frees it.
    pub expired: bool,
}

/// The state of an occupied slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HolderState {
    /// The owner is checking for a rival claim (a few instructions; or it died there).
    Claiming,
    /// Held.
    Held,
    /// Held, with the owner moving its deadline.
    Extending,
}

impl Holder {
    fn from_entry(e: &Entry, now: u64, owner_alive: bool) -> Holder {
        let state = match e.word.state() {
            State::Claiming => HolderState::Claiming,
            State::Extending => HolderState::Extending,
            _ => HolderState::Held,
        };
        // a claim's fields may still be the previous occupant's
        let settled = state != HolderState::Claiming;
        Holder {
            key_preview: e.preview.clone(),
            key_len: e.key_len as usize,
            pid: e.word.pid(),
            owner_alive,
            state,
            waiters: e.word.has_waiters(),
            token: (settled && e.token != 0).then_some(e.token),
            age: Duration::from_nanos(now.saturating_sub(e.acquired_at)),
            ttl: (e.deadline != u64::MAX)
                .then(|| Duration::from_nanos(e.deadline.saturating_sub(now))),
            expired: settled && e.deadline <= now,
        }
    }
}

fn check_key(key: &[u8]) -> Result<&[u8], Error> {
    if key.is_empty() {
        Err(Error::EmptyKey)
    } else if key.len() > MAX_KEY_LEN {
        Err(Error::KeyTooLong(key.len()))
    } else {
        Ok(key)
    }
}

/// A per-acquisition id, unique within the process without a shared counter on the lock
/// path: a thread number in the high bits, a thread-local count in the low 40.
fn next_lease() -> u64 {
    static THREADS: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static NEXT: Cell<u64> = const { Cell::new(0) };
    }
    let fresh = || THREADS.fetch_add(1, Ordering::Relaxed) << 40;
    NEXT.try_with(|next| {
        let mut v = next.get();
        if v == 0 || v & ((1 << 40) - 1) == (1 << 40) - 1 {
            v = fresh();
        }
        v += 1;
        next.set(v);
        v
    })
    .unwrap_or_else(|_| fresh() + 1)
}

/// What a lock object or guard knows about its hold.
struct Hold {
    held: Held,
    /// The process that took it: a copy in a forked child must not release it.
    pid: u32,
    /// The fencing token once asked for; 0 before (tokens start at 1).
    token: Cell<u64>,
}

impl Hold {
    #[inline]
    fn new(held: Held) -> Hold {
        Hold {
            held,
            pid: process::current_pid(),
            token: Cell::new(0),
        }
    }
}

/// A resty.lock-style lock object: holds at most one key at a time.
///
/// ```
/// use shmlock::{Error, Lock, LockOptions, LockTable};
/// use std::time::Duration;
///
/// # let path = std::env::temp_dir().join(format!("shmlock-doc-lock-{}", std::process::id()));
/// # let _ = std::fs::remove_file(&path);
/// let table = LockTable::open(&path, 1024)?;
/// let opts = LockOptions { timeout: Duration::from_millis(10), ..LockOptions::default() };
/// let mut lock = Lock::new(&table, opts)?;
/// let elapsed = lock.lock("key1")?;            // no wait: elapsed is zero
/// assert_eq!(elapsed, Duration::ZERO);
/// assert!(matches!(lock.lock("key2"), Err(Error::Locked)));
///
/// let mut rival = Lock::new(&table, opts)?;
/// assert!(matches!(rival.lock("key1"), Err(Error::Timeout)));
///
/// let token = lock.token().unwrap();           // fencing token of this hold
/// lock.expire(None)?;                          // renew the lease to exptime
/// lock.unlock()?;
/// assert!(matches!(lock.unlock(), Err(Error::Unlocked)));
/// rival.lock("key1")?;
/// assert!(rival.token().unwrap() > token);
/// # drop(rival); std::fs::remove_file(&path).unwrap();
/// # Ok::<(), shmlock::Error>(())
/// ```
pub struct Lock<'t> {
    table: &'t LockTable,
    opts: Resolved,
    timeout: Duration,
    hold: Option<Hold>,
}

impl<'t> Lock<'t> {
    /// A lock object on `table`. Fails with [`Error::InvalidOptions`] on nonsense options.
    pub fn new(table: &'t LockTable, opts: LockOptions) -> Result<Lock<'t>, Error> {
        Ok(Lock {
            table,
            opts: opts.resolve()?,
            timeout: opts.timeout,
            hold: None,
        })
    }

    /// Takes `key`, waiting up to the timeout. Returns the time waited: zero if the key was
    /// free, else the sum of the sleeps. [`Error::Locked`] at once if this object already
    /// holds a key.
    pub fn lock(&mut self, key: impl AsRef<[u8]>) -> Result<Duration, Error> {
        self.lock_with_timeout(key, self.timeout)
    }

    /// [`lock`](Lock::lock) with another timeout for this call only.
    pub fn lock_with_timeout(
        &mut self,
        key: impl AsRef<[u8]>,
        timeout: Duration,
    ) -> Result<Duration, Error> {
        if self.hold.is_some() {
            return Err(Error::Locked);
        }
        let req = self.table.request(key.as_ref(), self.opts.exptime_ns)?;
        if let Some(held) = self.table.inner.table.try_acquire_fast(&req) {
            self.hold = Some(Hold::new(held));
            return Ok(Duration::ZERO);
        }
        let (hold, elapsed) = self.table.acquire_slow(&req, &self.opts, Some(timeout))?;
        self.hold = Some(hold);
        Ok(elapsed)
    }

    /// Releases the key. [`Error::Unlocked`] if none is held; [`Error::Expired`] if the
    /// lease ran out and someone else took the key (their hold is left alone).
    pub fn unlock(&mut self) -> Result<(), Error> {
        let hold = self.hold.take().ok_or(Error::Unlocked)?;
        self.table.release(&hold)
    }

    /// Renews the lease: `None` for the object's exptime, `Some(ttl)` for another length
    /// (zero: never expires). [`Error::Expired`] if the lease already ran out; the object
    /// then holds nothing.
    pub fn expire(&mut self, ttl: Option<Duration>) -> Result<(), Error> {
        let hold = self.hold.as_mut().ok_or(Error::Unlocked)?;
        let result = self.table.extend(hold, self.opts.exptime_ns, ttl);
        if matches!(result, Err(Error::Expired)) {
            self.hold = None;
        }
        result
    }

    /// The fencing token of the current hold: larger than any token handed to an earlier
    /// holder of the key. `None` if nothing is held or the lease was already lost.
    pub fn token(&self) -> Option<u64> {
        self.table.token(self.hold.as_ref()?)
    }

    /// Whether this object holds a key.
    pub fn is_locked(&self) -> bool {
        self.hold.is_some()
    }
}

impl Drop for Lock<'_> {
    fn drop(&mut self) {
        if let Some(hold) = self.hold.take() {
            if hold.pid == process::current_pid() {
                let _ = self.table.release(&hold);
            }
        }
    }
}

/// A held key, released when dropped (unless this is a copy in a forked child).
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct LockGuard<'t> {
    table: &'t LockTable,
    hold: Hold,
    elapsed: Duration,
    exptime_ns: u64,
}

impl LockGuard<'_> {
    /// How long the acquisition waited (the sum of the sleeps).
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// The fencing token of this hold (see [`Lock::token`]).
    pub fn token(&self) -> Option<u64> {
        self.table.token(&self.hold)
    }

    /// Renews the lease (see [`Lock::expire`]).
    pub fn expire(&mut self, ttl: Option<Duration>) -> Result<(), Error> {
        self.table.extend(&mut self.hold, self.exptime_ns, ttl)
    }

    /// Releases the key now and reports whether the hold was still ours.
    pub fn unlock(self) -> Result<(), Error> {
        let this = std::mem::ManuallyDrop::new(self);
        this.table.release(&this.hold)
    }
}

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        if self.hold.pid == process::current_pid() {
            let _ = self.table.release(&self.hold);
        }
    }
}

impl std::fmt::Debug for LockGuard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("slot", &self.hold.held.slot)
            .field("elapsed", &self.elapsed)
            .finish()
    }
}
