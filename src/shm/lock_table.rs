//! The shared-memory backend: [`LockTable`], a lock table in a memory-mapped file.

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, HolderSeen, KeyPreview};
use crate::key::check_key;
#[cfg(feature = "tokio")]
use crate::lock::backend::Slept;
use crate::lock::backend::{Backend, Sealed};
use crate::lock::slack::TimerSlack;
use crate::shm::attachment::Attachment;
use crate::shm::clock::{self, Clock, Monotonic};
use crate::shm::counters::{self, Cells, Fast};
use crate::shm::file::{self, OpenSpec};
use crate::shm::format::{Header, Layout};
use crate::shm::futex;
use crate::shm::idle_cache::IdleCache;
use crate::shm::mapping::Mapping;
use crate::shm::process::SignalsBlocked;
use crate::shm::registry::OwnerId;
use crate::shm::slot::{Cold, Slot, State, Word};
use crate::shm::table::{
    self, Attempt, Busy, Entry, Held, KeyHash, Mode, Prepared, Request, Table, TableFull,
};

type Locks = Table<MappedSlots, ShmEnv>;

/// The hot slots and cold side array of a mapped lock table, located once: every
/// operation reaches its slot through these without re-deriving them from the mapping.
struct MappedSlots {
    hot: NonNull<Slot>,
    cold: NonNull<Cold>,
    len: usize,
    /// Keeps the slots mapped.
    _map: Arc<Mapping>,
}

// SAFETY: the pointers lead into the mapping `_map` keeps alive, which is only reached
// through atomics (every field of a `Slot` and a `Cold` is one), so sharing them across
// threads is as sound as sharing the atomics.
unsafe impl Send for MappedSlots {}
// SAFETY: as above.
unsafe impl Sync for MappedSlots {}

impl MappedSlots {
    fn new(map: Arc<Mapping>, len: usize) -> MappedSlots {
        let words = map.words();
        let hot = words.as_ptr().cast::<Slot>();
        // SAFETY: the body of a lock table is `len` hot slots then `len` cold slots (the
        // header checked that `slot_count` and the file size agree), so the cold ones start
        // `len` slots in, inside the mapping.
        let cold = unsafe { hot.add(len) }.cast::<Cold>();
        MappedSlots {
            hot: NonNull::new(hot.cast_mut()).expect("mapped"),
            cold: NonNull::new(cold.cast_mut()).expect("mapped"),
            len,
            _map: map,
        }
    }
}

impl table::Slots for MappedSlots {
    #[inline(always)]
    fn hot(&self) -> &[Slot] {
        // SAFETY: `len` hot slots at `hot` (see `new`); the body starts on a page boundary,
        // so every slot is 64-byte aligned; every bit pattern of a slot (atomic integers
        // only) is valid; the slice borrows `self`, which keeps the mapping.
        unsafe { std::slice::from_raw_parts(self.hot.as_ptr(), self.len) }
    }

    #[inline(always)]
    fn cold(&self) -> &[Cold] {
        // SAFETY: as above, for the `len` cold slots after the hot ones.
        unsafe { std::slice::from_raw_parts(self.cold.as_ptr(), self.len) }
    }
}

/// The lock table's world: the host clock, the registry's verdicts, futex wake-ups.
struct ShmEnv {
    att: Attachment,
}

impl table::Env for ShmEnv {
    #[inline]
    fn now(&self) -> u64 {
        Monotonic.now()
    }
    fn is_dead(&self, owner: OwnerId) -> bool {
        self.att.is_dead(owner)
    }
    fn is_holder_dead(&self, owner: OwnerId, lease: u64) -> bool {
        self.att.is_dead_at(owner, Some((lease >> 32) as u32))
    }
    fn wake_all(&self, word: &AtomicU64) {
        futex::wake_all_low(word);
    }
    fn reaps_dead_holders(&self) -> bool {
        self.att.judges()
    }
    fn stalled(&self, seen: &AtomicU64, word: Word) -> bool {
        crate::shm::attachment::stalled(seen, word.ident())
    }
    fn writer_waits_still(&self, seen: &AtomicU64, hold: u64) {
        crate::shm::attachment::writer_waits_still(seen, hold);
    }
    fn writer_gone(&self, seen: &AtomicU64, hold: u64) -> bool {
        crate::shm::attachment::writer_gone(seen, hold)
    }
    fn writer_active(&self, seen: &AtomicU64, hold: u64) -> bool {
        crate::shm::attachment::writer_active(seen, hold)
    }
    fn writer_withdraws(&self, seen: &AtomicU64, hold: u64) {
        crate::shm::attachment::writer_withdraws(seen, hold);
    }
    fn writer_mark_left(&self, seen: &AtomicU64, hold: u64) -> Option<Duration> {
        crate::shm::attachment::writer_mark_left(seen, hold)
    }
    fn readers_wait_still(&self, seen: &AtomicU64, hold: u64) {
        crate::shm::attachment::readers_wait_still(seen, hold);
    }
    fn readers_active(&self, seen: &AtomicU64, hold: u64) -> bool {
        crate::shm::attachment::readers_active(seen, hold)
    }
    fn readers_withdraw(&self, seen: &AtomicU64, hold: u64) {
        crate::shm::attachment::readers_withdraw(seen, hold);
    }
    #[cold]
    #[inline(never)]
    fn released_to_waiters(&self, acquired_at: u64) {
        let held_ns = Monotonic.now().saturating_sub(acquired_at);
        let cells = Cells::of(&self.att.map);
        cells.time(counters::HOLD_BUCKETS, counters::HOLD_NS, held_ns);
        cells.add(counters::HOLD_SAMPLES, 1);
    }
    fn took_over(&self, expired: bool) {
        let word = if expired {
            counters::EXPIRED_TAKEOVERS
        } else {
            counters::DEAD_TAKEOVERS
        };
        Cells::of(&self.att.map).add(word, 1);
    }
}

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
/// assert!(table.try_lock_with_lease("user:42", Duration::from_secs(30))?.is_none());
/// drop(guard);
/// assert!(table.try_lock_with_lease("user:42", Duration::from_secs(30))?.is_some());
/// # drop(table); std::fs::remove_dir_all(&dir).unwrap();
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
    table: Locks,
    header: Header,
    path: PathBuf,
    created: bool,
    /// This process's idle shared entries (see `table/idle.rs`).
    idle: IdleCache,
    /// The thread that wakes this process's async waiters (see `async_wait`).
    #[cfg(feature = "tokio")]
    watcher: crate::per_process::PerProcess<crate::shm::async_wait::Watcher>,
}

#[cfg(feature = "tokio")]
impl crate::shm::async_wait::Watchable for Inner {
    fn prepare_wait(&self, b: &Busy) -> Prepared {
        self.table.prepare_wait(b)
    }
    fn wait_word(&self, b: &Busy) -> &AtomicU64 {
        self.table.wait_word(b)
    }
    fn mapping(&self) -> Arc<crate::shm::mapping::Mapping> {
        self.table.env().att.map.clone()
    }
}

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
    liveness: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            spec: OpenSpec::new(Layout::Locks),
            liveness: true,
        }
    }
}

impl OpenOptions {
    /// How many keys can be held at once in a table this call creates (default 1024).
    pub fn capacity(mut self, capacity: usize) -> Self {
        self.spec.capacity = capacity as u64;
        self
    }

    /// How many processes may be attached to a table this call creates at once, each
    /// with an entry in its owner registry (default 1024, at most 65535). A process that
    /// finds every entry held by a live process cannot open the file for writing
    /// ([`Error::TooManyProcesses`]); a read-only handle takes no entry.
    pub fn max_processes(mut self, n: u32) -> Self {
        self.spec.registry = n;
        self
    }

    /// Permission bits of a table this call creates (default `0o600`; anything beyond
    /// `0o777`, or without owner read and write, is [`Error::InvalidOptions`]). Every process that can open the file for
    /// writing can take, break and inspect every lock in it.
    pub fn mode(mut self, mode: u32) -> Self {
        self.spec.mode = mode;
        self
    }

    /// Whether a missing file is created (default) or an error.
    pub fn create(mut self, create: bool) -> Self {
        self.spec.create = create;
        self
    }

    /// Whether this process takes the keys of holders the kernel says are dead at once
    /// (default: yes). With `false` it waits for their leases to expire instead. (What a
    /// dead process left half-claimed is freed either way.)
    pub fn liveness(mut self, judge: bool) -> Self {
        self.liveness = judge;
        self
    }

    /// Opens the file for reading only: for inspecting a table ([`LockTable::holders`])
    /// with nothing but read permission. Nothing is created or registered, and every call
    /// that would change the table is [`Error::ReadOnly`].
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.spec.read_only = read_only;
        self
    }

    /// Attaches to an existing table without taking an entry of its owner registry: the
    /// handle takes one at its first acquisition (default `false`: when opening, so that
    /// a full registry is [`Error::TooManyProcesses`] at once). It attaches as any writer
    /// does otherwise: a table of an earlier boot is reset first, and none is reset under
    /// it while it is open. For tools that only inspect, break
    /// ([`LockTable::force_unlock_holders`]) or reap holds: they then work while every
    /// entry is taken by a live process, as `shmlock unlock --force` does. A table this
    /// call creates is registered at once all the same.
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("shmlock-doc-lazy-{}", std::process::id()));
    /// # let _ = std::fs::remove_file(&path);
    /// use shmlock::{Error, LockOptions, LockTable};
    ///
    /// let table = LockTable::options().max_processes(1).open(&path)?;
    /// let guard = table.lock("job", LockOptions::default())?;
    /// // what `shmlock unlock --force job` does, with or without a free entry
    /// let admin = LockTable::options().register_lazily(true).open(&path)?;
    /// assert_eq!(admin.force_unlock_holders("job", None)?.len(), 1);
    /// assert!(matches!(guard.unlock(), Err(Error::Expired)));
    /// # std::fs::remove_file(&path).unwrap();
    /// # Ok::<(), shmlock::Error>(())
    /// ```
    pub fn register_lazily(mut self, lazily: bool) -> Self {
        self.spec.lazy = lazily;
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
        let header = opened.header;
        let map = Arc::new(opened.map);
        let att = Attachment::new(
            map.clone(),
            opened.file,
            opened.id,
            path.to_path_buf(),
            opened.pin,
            options.liveness,
        );
        let slots = MappedSlots::new(map, header.slot_count as usize);
        Ok(LockTable {
            inner: Arc::new(Inner {
                table: Table::new(slots, ShmEnv { att }),
                header,
                path: path.to_path_buf(),
                created: opened.created,
                idle: IdleCache::new(),
                #[cfg(feature = "tokio")]
                watcher: crate::per_process::PerProcess::new(),
            }),
        })
    }

    fn att(&self) -> &Attachment {
        &self.inner.table.env().att
    }

    /// Whether the path still leads to this table's file (looked at now and then: see
    /// `Attachment::look_at_path`).
    fn look_at_path(&self) -> Result<(), Error> {
        self.att().look_at_path(self.inner.table.now())
    }

    fn writable(&self) -> Result<(), Error> {
        if self.att().read_only() {
            Err(Error::ReadOnly)
        } else {
            Ok(())
        }
    }

    /// Whether this process has an entry in the table's owner registry, so that its keys
    /// are reclaimed at once if it dies. Always, for a handle that opened the file for
    /// writing (opening fails with [`Error::TooManyProcesses`] otherwise); `false` for a
    /// read-only handle, or in a forked child (or with
    /// [`register_lazily`](OpenOptions::register_lazily)) that could not take an entry of
    /// its own (its lock calls then say why). A handle that has none tries to take one.
    pub fn registered(&self) -> bool {
        self.att().owner().is_ok()
    }

    /// How many keys can be held at once (fixed when the file was created). The table has
    /// four times as many slots, so most keys sit at their home even when it is this full.
    pub fn capacity(&self) -> usize {
        self.inner.header.capacity as usize
    }

    /// The file this table lives in.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Whether this handle's `open` created the file.
    pub fn created(&self) -> bool {
        self.inner.created
    }

    /// Whether someone holds `key` right now (a snapshot: it may change at once).
    pub fn is_locked(&self, key: impl AsRef<[u8]>) -> Result<bool, Error> {
        let key = check_key(key.as_ref())?;
        Ok(self.inner.table.find(self.hash(key)).is_some())
    }

    /// Who holds what: one entry per occupied slot, including expired ones not yet reaped,
    /// and the keys kept for a waiting writer or waiting readers ([`HolderState::Kept`]). Judges each owner's
    /// liveness (a system call or two per entry).
    pub fn holders(&self) -> Vec<Holder> {
        let table = &self.inner.table;
        let now = table.now();
        let mut all: Vec<Holder> = table
            .entries()
            .into_iter()
            .map(|e| self.holder(&e, now, !table.is_owner_dead(&e)))
            .collect();
        all.extend(table.kept_keys().iter().map(|e| self.holder(e, now, true)));
        all
    }

    fn holder(&self, e: &Entry, now: u64, owner_alive: bool) -> Holder {
        let mut h = Holder::from_entry(e, now, owner_alive, self.inner.header.token_base);
        if h.state == HolderState::Kept {
            // nobody's hold (its word's owner is the holder that left last): the entry
            // says whom it is kept for
            return h;
        }
        h.writer_waits = self.inner.table.writer_waits_for(e);
        h.readers_wait = self.inner.table.readers_wait_for(e);
        // A published hold records its owner's whole registry generation in its lease.
        let generation = matches!(
            e.word.state(),
            State::Held | State::Extending | State::Stealing
        )
        .then_some((e.lease >> 32) as u32);
        if let Some(id) = self.att().identity(e.word.owner(), generation) {
            let here = crate::shm::process::pid_namespace();
            // A pid from another pid namespace would name some other process here.
            if id.pid_ns == here || id.pid_ns == 0 || here == 0 {
                h.pid = id.pid;
            }
        }
        h
    }

    /// Breaks the lock on `key`, whoever holds it, and returns who did (`None`: nobody).
    /// The holder finds out at its next unlock or renewal ([`Error::Expired`]); waiters are
    /// woken. For operators clearing a stuck lock: the holder may still be running.
    pub fn force_unlock(&self, key: impl AsRef<[u8]>) -> Result<Option<Holder>, Error> {
        let key = check_key(key.as_ref())?;
        self.writable()?;
        let table = &self.inner.table;
        let now = table.now();
        Ok(table
            .break_hold(self.hash(key))
            .map(|(e, dead)| self.holder(&e, now, !dead)))
    }

    /// Breaks the holds of `key` whose owner is process `pid` (every holder's with
    /// `None`: a shared key has many), and returns them; claims of the key in progress
    /// are broken too. Each holder finds out at its next unlock or renewal
    /// ([`Error::Expired`]); waiters are woken.
    pub fn force_unlock_holders(
        &self,
        key: impl AsRef<[u8]>,
        pid: Option<u32>,
    ) -> Result<Vec<Holder>, Error> {
        let key = check_key(key.as_ref())?;
        self.writable()?;
        let table = &self.inner.table;
        let now = table.now();
        let picked = |e: &Entry| pid.is_none_or(|p| self.holder(e, now, true).pid == p);
        Ok(table
            .break_holds(self.hash(key), picked)
            .into_iter()
            .map(|(e, dead)| self.holder(&e, now, !dead))
            .collect())
    }

    /// The format version of the file (see `src/shm/format.rs`).
    pub fn format_version(&self) -> u32 {
        crate::shm::format::VERSION
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
    /// (after a crash, before inspecting). `Err(ReadOnly)` on a read-only handle.
    pub fn reap(&self) -> Result<usize, Error> {
        self.writable()?;
        Ok(self.inner.table.reap_all())
    }

    /// What every process did with this table's keys since its file was made: keys taken
    /// and contended, timeouts, takeovers, how long contended waits took and how long the
    /// holds that made others wait were held (see [`LockStats`](crate::stats::LockStats)), read
    /// from the file, where every process counts as it goes.
    pub fn stats(&self) -> crate::stats::LockStats {
        let att = self.att();
        crate::stats::LockStats::from_totals(&Cells::of(&att.map).totals())
    }

    /// How many holds fit at once: the table's slots, four per unit of
    /// [`capacity`](Self::capacity). Each key held exclusively takes one, and each reader
    /// or permit holder of a shared key one; past the capacity, a key finds room only
    /// where the slots near its home are not all held, so only `capacity` keys are sure
    /// to fit.
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("shmlock-doc-slots-{}", std::process::id()));
    /// # let _ = std::fs::remove_file(&path);
    /// let table = shmlock::LockTable::open(&path, 8)?;
    /// assert_eq!((table.capacity(), table.slots()), (8, 32));
    /// # std::fs::remove_file(&path).unwrap();
    /// # Ok::<(), shmlock::Error>(())
    /// ```
    pub fn slots(&self) -> usize {
        self.inner.table.slots().len()
    }

    /// How many slots are occupied (held, being claimed, or expired and not yet reaped).
    pub fn occupancy(&self) -> usize {
        self.inner.table.entries().len()
    }

    #[inline]
    fn hash(&self, key: &[u8]) -> KeyHash {
        KeyHash::of(key, self.inner.header.seed)
    }

    /// Checks the key and describes one acquisition of it.
    #[inline(always)]
    fn request<'k>(
        &self,
        key: &'k [u8],
        exptime_ns: u64,
        mode: Mode,
    ) -> Result<Request<'k>, Error> {
        let key = check_key(key)?;
        let (owner, generation) = self.att().registration()?;
        // Deadlines must mean the same instant to everyone: a process that cannot tell its
        // clock's offset takes nothing.
        crate::shm::process::check_clock()?;
        Ok(Request {
            key,
            hash: self.hash(key),
            owner,
            // The registration's full generation rides along, so that a waiter can tell
            // this hold's dead owner from a later process that reused its registry entry.
            lease: u64::from(generation) << 32 | (thread_lease() & 0xffff_ffff),
            exptime: exptime_ns,
            mode,
        })
    }

    /// How many shared holds (readers, or permits) `key` has now.
    pub(crate) fn shared_holds(&self, key: &[u8]) -> usize {
        self.inner.table.shared_holds(self.hash(key))
    }

    /// The token a holder sees: the home's counter above the file's base.
    fn token_of(&self, count: u64) -> u64 {
        self.inner.header.token_base.saturating_add(count)
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
    /// The first bytes of the key (at most 32).
    pub key_preview: Vec<u8>,
    /// The full key length.
    pub key_len: usize,
    /// The owning process, as its entry in the owner registry says (for inspection only;
    /// 0 when unknown, or when it is in another pid namespace than the caller).
    pub pid: u32,
    /// Whether the owner is alive: `false` only when the kernel says it is gone (its
    /// registry lock was dropped); an owner that cannot be judged counts as alive.
    pub owner_alive: bool,
    /// What the entry is doing.
    pub state: HolderState,
    /// A waiter flagged this hold since it was taken (each waiter sets the hold's one
    /// waiters bit before it sleeps, so that the release wakes it): not that one waits
    /// now. The bit stays after the waiters gave up or died, until the hold ends (a
    /// renewal keeps it); a new hold starts without it. No waiter can clear it when it
    /// leaves, as it cannot tell whether others still sleep on it.
    pub waiters: bool,
    /// A writer waits for this reader's hold to end (it marked the hold lately): new
    /// readers of the key defer to it until it has taken and released the key. Also set
    /// on a key [kept](HolderState::Kept) for a writer. Never on other holds.
    pub writer_waits: bool,
    /// Readers wait for this writer's hold to end (they marked it lately): its release
    /// keeps the key for them. Also set on a key [kept](HolderState::Kept) for readers.
    /// Never on other holds.
    pub readers_wait: bool,
    /// The fencing token, if the holder asked for one.
    pub token: Option<u64>,
    /// Time since the key was taken.
    pub age: Duration,
    /// Time left on the lease; `None` if it never expires.
    pub ttl: Option<Duration>,
    /// The lease ran out; the next claimer of the key (or [`LockTable::reap`]) frees it.
    pub expired: bool,
    /// How the key is held: alone, by a reader, or as one permit of a semaphore.
    pub mode: HoldMode,
    /// The hold was left to expire ([`LockGuard::leave_to_expire`](crate::LockGuard::leave_to_expire)):
    /// it has no owner, so only its lease (or a forced unlock) ends it. Its `pid` is 0 and
    /// its `owner_alive` says nothing.
    pub left_to_expire: bool,
}

/// How a [`Holder`] holds its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HoldMode {
    /// Alone ([`LockTable::lock`]).
    Exclusive,
    /// Beside other readers ([`LockTable::lock_shared`]).
    Shared,
    /// One of a semaphore's `permits` ([`LockTable::semaphore`]).
    Permit {
        /// The semaphore's count.
        permits: u32,
    },
}

impl HoldMode {
    /// The name `inspect` shows: `exclusive`, `shared` or `permit`.
    pub fn name(self) -> &'static str {
        match self {
            HoldMode::Exclusive => "exclusive",
            HoldMode::Shared => "shared",
            HoldMode::Permit { .. } => "permit",
        }
    }
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
    /// A claim or renewal that stalled past the bound and was broken: the key is free,
    /// but the slot stays out of use until its owner resumes (and frees it) or dies.
    Broken,
    /// Nobody holds the key: its last reader left while a writer waited, and the key is
    /// kept for that writer, which takes it next (new readers wait meanwhile); or its
    /// writer left while readers waited, and the key is kept for them (writers wait). At
    /// most 300 ms past the last sign of life of those it is kept for: a waiter that died
    /// or stopped loses it. Such a row has no pid, age, lease or token; its mode is theirs
    /// ([`HoldMode::Exclusive`] for a writer, with `writer_waits`; [`HoldMode::Shared`]
    /// for readers).
    Kept,
}

impl Holder {
    fn from_entry(e: &Entry, now: u64, owner_alive: bool, token_base: u64) -> Holder {
        let state = match e.word.state() {
            State::Claiming => HolderState::Claiming,
            State::Extending => HolderState::Extending,
            State::Broken => HolderState::Broken,
            State::Idle => HolderState::Kept,
            _ => HolderState::Held,
        };
        if state == HolderState::Kept {
            // kept for a writer (a reader's entry, marked) or for readers (a writer's)
            let for_writer = e.word.is_shared();
            return Holder {
                key_preview: e.preview.clone(),
                key_len: e.key_len as usize,
                pid: 0,
                owner_alive: true,
                state,
                waiters: e.word.has_waiters(),
                writer_waits: for_writer,
                readers_wait: !for_writer,
                token: None,
                age: Duration::ZERO,
                ttl: None,
                expired: false,
                mode: if for_writer {
                    HoldMode::Exclusive
                } else {
                    HoldMode::Shared
                },
                left_to_expire: false,
            };
        }
        // a claim's fields may still be the previous occupant's
        let settled = matches!(state, HolderState::Held | HolderState::Extending);
        Holder {
            key_preview: e.preview.clone(),
            key_len: e.key_len as usize,
            pid: 0,
            owner_alive,
            state,
            waiters: e.word.has_waiters(),
            writer_waits: false,
            readers_wait: false,
            token: e
                .token
                .filter(|_| settled)
                .map(|t| token_base.saturating_add(t)),
            age: Duration::from_nanos(now.saturating_sub(e.acquired_at)),
            ttl: (e.deadline != u64::MAX)
                .then(|| Duration::from_nanos(e.deadline.saturating_sub(now))),
            expired: settled && e.deadline <= now,
            mode: match (e.word.is_shared(), e.limit) {
                (false, _) => HoldMode::Exclusive,
                (true, 0) => HoldMode::Shared,
                (true, permits) => HoldMode::Permit { permits },
            },
            left_to_expire: settled && e.word.owner() == OwnerId::UNKNOWN,
        }
    }
}

thread_local! {
    /// The key whose holds this thread's wait marked last (and whether as a reader), so
    /// that a wait that gives up takes its marks back whatever its last look found.
    static MARKED: Cell<Option<(table::KeyHash, bool)>> = const { Cell::new(None) };
}

/// How long a waiter sleeps before looking again at a claim or renewal in progress.
const TRANSIENT_POLL: Duration = Duration::from_millis(1);

/// The coarse clock's resolution (a deadline is seen passed up to one tick late).
const CLOCK_TICK: Duration = Duration::from_nanos(crate::shm::clock::TICK_NS);

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The calling thread's number within the process, which every hold it takes carries as
/// its lease: with the entry's owner and generation it tells the holder's holds from those
/// of the process's other threads. (The same for every hold of one thread, so a thread
/// that takes its key again within a clock tick finds the slot's fields already right.)
#[inline]
fn thread_lease() -> u64 {
    static THREADS: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static ID: Cell<u64> = const { Cell::new(0) };
    }
    ID.try_with(|id| {
        if id.get() == 0 {
            id.set(THREADS.fetch_add(1, Ordering::Relaxed));
        }
        id.get()
    })
    .unwrap_or_else(|_| THREADS.fetch_add(1, Ordering::Relaxed))
}

/// The error of a shared claim that met holds of another count (out of the claim's way).
#[cold]
#[inline(never)]
fn mismatch(req: &Request<'_>, held: u32) -> Error {
    Error::PermitsMismatch {
        key: KeyPreview::new(req.key),
        held,
        asked: req.mode.limit(),
    }
}

/// A hold on the table: the slot's word and lease, and its fencing token once asked for
/// (0 means "not yet").
#[derive(Debug)]
pub struct ShmHold {
    held: Held,
    token: Cell<u64>,
}

/// What a busy attempt saw: the holder's entry.
#[derive(Debug)]
pub struct ShmBusy(Busy);

#[cfg(feature = "tokio")]
impl ShmBusy {
    /// Whether this is a writer's wait for readers, or a reader's for a writer (which
    /// marks the holds).
    pub(crate) fn marks(&self) -> bool {
        matches!(
            self.0.wait,
            table::WaitFor::Readers | table::WaitFor::Writer
        )
    }

    /// Whether this is a reader's wait for a writer.
    pub(crate) fn waits_for_writer(&self) -> bool {
        self.0.wait == table::WaitFor::Writer
    }

    pub(crate) fn hash(&self) -> table::KeyHash {
        self.0.hash
    }
}

#[cfg(feature = "tokio")]
impl LockTable {
    /// See `Table::readers_withdraw`.
    pub(crate) fn readers_withdraw(&self, hash: table::KeyHash) {
        self.inner.table.readers_withdraw(hash);
    }

    /// See `Table::writer_withdraws`.
    pub(crate) fn writer_withdraws(&self, hash: table::KeyHash) {
        self.inner.table.writer_withdraws(hash);
    }
}

impl LockTable {
    // Inlined: a general claim's result is then moved straight into the caller's (52
    // instructions fewer a claim; 1.5-2 ns a pair at 90 % load).
    #[inline]
    fn hold_or_busy(
        &self,
        a: Result<Attempt, TableFull>,
        req: &Request<'_>,
    ) -> Result<Result<ShmHold, ShmBusy>, Error> {
        match a {
            Ok(Attempt::Acquired(held)) => {
                self.count_acquired();
                Ok(Ok(ShmHold {
                    held,
                    token: Cell::new(0),
                }))
            }
            Ok(Attempt::Busy(busy)) => Ok(Err(ShmBusy(busy))),
            Ok(Attempt::Mismatch { limit }) => Err(mismatch(req, limit)),
            Err(TableFull) => {
                Cells::of(&self.att().map).add(counters::TABLE_FULL, 1);
                Err(Error::TableFull {
                    key: KeyPreview::new(req.key),
                    capacity: self.capacity(),
                    slots: self.slots(),
                })
            }
        }
    }

    /// Counts an acquisition (in the thread, then in the file: see `counters`).
    #[inline(always)]
    fn count_acquired(&self) {
        let att = self.att();
        counters::count(att.map_id(), &att.map, Fast::Acquired);
    }

    /// This thread's signals blocked, if `hold` is this process's (looked at with them
    /// blocked), for a change of the hold in place (its lease, its mode). A child forked
    /// by a signal handler in the middle of the change would finish it in its parent's
    /// name; the parent, finding its hold changed under it, would take it for lost and
    /// leave the key held (for good with a lease of 0). Two system calls: not for the
    /// release, where such a child frees the key (and the parent hears `Expired`).
    fn quietly_ours(&self, hold: &ShmHold) -> Result<SignalsBlocked, Error> {
        let quiet = SignalsBlocked::all();
        if self.is_ours(hold) {
            Ok(quiet)
        } else {
            Err(Error::NotOwner)
        }
    }

    /// A hold found lost (at a release or renewal): counted, and [`Error::Expired`].
    #[cold]
    #[inline(never)]
    fn lost(&self) -> Error {
        Cells::of(&self.att().map).add(counters::LOST, 1);
        Error::Expired
    }
}

#[cfg(feature = "tokio")]
impl LockTable {
    /// An async waiter's sleep on a busy key (see `async_wait`): at most `step`, and no
    /// later than the holder's lease end and a tick (an expiry wakes nobody); woken by the
    /// release through the process's watcher, first come first. `place` is the waiter's
    /// place in the key's queue from its last sleep, kept. Returns the time slept, whether
    /// the key may be free, and the place.
    /// A place in the queue of `key`'s async waiters of this process, taken as the task
    /// asks, and the key's hold if others wait for it already (see `acquire_async`'s
    /// `queued`).
    pub(crate) fn ticket_async(
        &self,
        key: &[u8],
    ) -> (Option<ShmBusy>, Option<crate::shm::async_wait::Wake>) {
        let watcher = self.inner.watcher.get(crate::shm::async_wait::Watcher::new);
        let (wake, ahead) = watcher.ticket(self.hash(key));
        (ahead.map(ShmBusy), Some(wake))
    }

    fn ticket_async_hash(&self, hash: crate::shm::table::KeyHash) -> crate::shm::async_wait::Wake {
        let watcher = self.inner.watcher.get(crate::shm::async_wait::Watcher::new);
        watcher.ticket(hash).0
    }

    pub(crate) fn sleep_async(
        &self,
        busy: &ShmBusy,
        step: Duration,
        place: Option<crate::shm::async_wait::Wake>,
    ) -> impl std::future::Future<Output = Slept<crate::shm::async_wait::Wake>> + '_ {
        let busy = busy.0;
        async move { self.sleep_async_on(busy, step, place).await }
    }

    async fn sleep_async_on(
        &self,
        busy: Busy,
        step: Duration,
        place: Option<crate::shm::async_wait::Wake>,
    ) -> Slept<crate::shm::async_wait::Wake> {
        let started = Instant::now();
        let mut wake = match place {
            Some(wake) => wake,
            None => self.ticket_async_hash(busy.hash),
        };
        {
            // (not kept across the sleep: a child forked meanwhile would inherit it, with
            // no task to let it go, and keep its registration until it exits)
            let table: Arc<dyn crate::shm::async_wait::Watchable> = self.inner.clone();
            wake.wait(&table, &busy);
        }
        // No later than the lease's end (an expiry wakes nobody) of the hold the key's last
        // attempt saw: a task behind others has not tried since it asked, and the hold it
        // saw then may be long gone (its end passed: a tick's sleep again and again).
        let hold = wake.hold().unwrap_or(busy);
        let step = match self.inner.table.lease_left(&hold) {
            Some(left) => step.min(left + CLOCK_TICK),
            None => step,
        };
        let woken = crate::lock::backend::first_of(&mut wake, tokio::time::sleep(step)).await;
        let moved = woken && self.inner.table.moved_on(&busy);
        if moved && self.inner.table.behind_a_writer(&busy) {
            // the writer woken by the same release goes first (see `WRITER_HEAD_START`)
            let left = step.saturating_sub(started.elapsed());
            tokio::time::sleep(table::WRITER_HEAD_START.min(left)).await;
        }
        Slept {
            used: started.elapsed(),
            moved,
            // a step that ran out: only the first of the queue tries (a dead holder wakes
            // nobody), the others keep their turn
            attempt: woken || wake.is_first(),
            place: wake,
        }
    }
}

impl LockTable {
    /// [`Backend::acquire_fast`] in any mode.
    #[inline(always)]
    pub(crate) fn acquire_fast_in(
        &self,
        key: &[u8],
        exptime_ns: u64,
        mode: Mode,
    ) -> Result<Result<ShmHold, Option<ShmBusy>>, Error> {
        let req = self.request(key, exptime_ns, mode)?;
        let fast = match self.reenter(&req, mode) {
            None => self.inner.table.try_acquire_fast(&req),
            held => held,
        };
        match fast {
            Some(held) => {
                self.count_acquired();
                Ok(Ok(ShmHold {
                    held,
                    token: Cell::new(0),
                }))
            }
            // The general claim, with the request already made (key checked and hashed).
            None => {
                let a = self.inner.table.try_acquire_slow(&req);
                let r = self.hold_or_busy(a, &req)?;
                Ok(r.map_err(Some))
            }
        }
    }

    /// [`Backend::try_acquire`] in any mode.
    pub(crate) fn try_acquire_in(
        &self,
        key: &[u8],
        exptime_ns: u64,
        mode: Mode,
    ) -> Result<Result<ShmHold, ShmBusy>, Error> {
        // (every wait comes this way after a sleep: a table deleted under it is seen)
        self.look_at_path()?;
        let req = self.request(key, exptime_ns, mode)?;
        if let Some(held) = self.reenter(&req, mode) {
            self.count_acquired();
            return Ok(Ok(ShmHold {
                held,
                token: Cell::new(0),
            }));
        }
        self.hold_or_busy(self.inner.table.try_acquire(&req), &req)
    }

    /// A shared claim takes this process's idle entry of the key again, if it has one
    /// (see `table/idle.rs`).
    #[inline(always)]
    fn reenter(&self, req: &Request<'_>, mode: Mode) -> Option<Held> {
        // (`mode` a constant where inlined: the exclusive lock's paths have none of this)
        if mode == Mode::Exclusive {
            return None;
        }
        let table = &self.inner.table;
        let home = req.hash.home(table.slots().len());
        // An entry away from its home is in the cache (one at the home is not put there:
        // a release reads nothing more for it). The home is looked at only without one:
        // another process's reader of the key may hold it, and its line would go back and
        // forth.
        if let Some(i) = self.inner.idle.get(req.hash) {
            if let Some(held) = table.try_reenter(req, i, home) {
                return Some(held);
            }
            // taken back, or this process's entry is at the home by now
            self.inner.idle.forget(req.hash, i);
        }
        table.try_reenter(req, home, home)
    }

    /// Releases a shared hold, kept idle for this process if nobody waits (see
    /// `table/idle.rs`), and remembers where; the idle entry the cache forgets for it is
    /// let go.
    #[inline(always)]
    /// Clears the inspection label of a hold that took a fencing token (only if the hold
    /// is still its own: see `Table::forget_token`), before it is released or downgraded.
    fn forget_token(&self, hold: &ShmHold) {
        if hold.token.get() != 0 {
            self.inner.table.forget_token(&hold.held);
        }
    }

    pub(crate) fn release_shared(&self, hold: &ShmHold) -> Result<(), Error> {
        let held = &hold.held;
        self.forget_token(hold);
        match self.inner.table.release(held) {
            Ok(false) => Ok(()),
            Ok(true) if held.slot == held.home => Ok(()), // found without the cache
            Ok(true) => {
                // The key's hash, from the entry we have just left idle (taken back
                // and reused meanwhile, it is another key's: a hint that fails, no more).
                let slot = &self.inner.table.slots()[held.slot];
                let hi = slot.hash_hi.load(Ordering::Relaxed);
                if let Some(old) = self.inner.idle.put(hi, held.slot) {
                    self.inner.table.let_go(old, held.word.owner());
                }
                Ok(())
            }
            Err(_) => Err(Error::Expired),
        }
    }

    /// Turns an exclusive hold into a reader's (see [`LockGuard::downgrade`]).
    pub(crate) fn downgrade_hold(&self, hold: &mut ShmHold) -> Result<(), Error> {
        let _quiet = self.quietly_ours(hold)?;
        self.forget_token(hold);
        hold.token.set(0);
        self.inner
            .table
            .downgrade(&mut hold.held)
            .map_err(|_| self.lost())
    }
}

impl Sealed for LockTable {}

impl Backend for LockTable {
    type Hold = ShmHold;
    type Busy = ShmBusy;

    /// Claimed under this process's registration: a child's first use registers it anew,
    /// so whatever it inherited, or came out with from the middle of its parent's
    /// acquisition (forked by a signal handler), was claimed in its parent's name, unless
    /// the claim was made with its own registration already.
    #[inline(always)]
    fn is_ours(&self, hold: &ShmHold) -> bool {
        let held = &hold.held;
        self.att()
            .is_ours(held.word.owner(), Some((held.lease >> 32) as u32))
    }

    #[inline(always)]
    fn acquire_fast(
        &self,
        key: &[u8],
        exptime_ns: u64,
    ) -> Result<Result<ShmHold, Option<ShmBusy>>, Error> {
        self.acquire_fast_in(key, exptime_ns, Mode::Exclusive)
    }

    fn try_acquire(
        &self,
        key: &[u8],
        exptime_ns: u64,
        _deadline: Option<Instant>,
    ) -> Result<Result<ShmHold, ShmBusy>, Error> {
        self.try_acquire_in(key, exptime_ns, Mode::Exclusive)
    }

    // This and release_on_drop forced inline: with the acquisition's counting inlined too, the inliner left the
    // guard's drop a call (2 ns more a pair, criterion `pair/guard`).
    #[inline(always)]
    fn release(&self, hold: &ShmHold) -> Result<(), Error> {
        // (an exclusive hold is never kept idle: shared ones are released by `Shared` and
        // `Semaphore`, see `release_shared`)
        self.forget_token(hold);
        self.inner
            .table
            .release_exclusive(&hold.held)
            .map_err(|_| Error::Expired)
    }

    #[inline(always)]
    fn release_on_drop(&self, hold: &ShmHold) {
        let _ = self.release(hold);
    }

    /// The lease counted on the coarse clock, which may lag a tick: by the precise clock
    /// it may be that much shorter.
    fn lease_ns(&self, _hold: &ShmHold, exptime_ns: u64) -> u64 {
        match exptime_ns {
            0 => 0,
            ns => ns.saturating_sub(clock::lag_ns()).max(1),
        }
    }

    fn extend(&self, hold: &mut ShmHold, exptime_ns: u64) -> Result<(), Error> {
        let _quiet = self.quietly_ours(hold)?;
        self.inner
            .table
            .extend(&mut hold.held, exptime_ns)
            .map_err(|_| self.lost())
    }

    fn waited(&self, took: bool, waited: Duration) {
        let cells = Cells::of(&self.att().map);
        let ns = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        if took {
            cells.add(counters::CONTENDED, 1);
            cells.time(counters::WAIT_BUCKETS, counters::WAIT_NS, ns);
        } else {
            cells.add(counters::TIMEOUTS, 1);
        }
    }

    /// Taken once per hold; every ask looks at the hold again, so a hold that was lost (or
    /// whose lease ran out) gets no token, even the one it had.
    fn token(&self, hold: &ShmHold) -> Option<u64> {
        if hold.token.get() == 0 {
            let count = self.inner.table.token(&hold.held)?;
            hold.token.set(self.token_of(count));
        }
        self.inner.table.check(&hold.held).ok()?;
        Some(hold.token.get())
    }

    fn check(&self, hold: &ShmHold) -> Result<(), Error> {
        self.look_at_path()?;
        self.inner
            .table
            .check(&hold.held)
            .map_err(|_| Error::Expired)
    }

    fn leave(&self, hold: &ShmHold) {
        self.inner.table.disown(&hold.held);
    }

    fn spins(&self) -> bool {
        true
    }

    fn moved_on(&self, busy: &ShmBusy) -> bool {
        self.inner.table.moved_on(&busy.0)
    }

    fn can_notify(&self) -> bool {
        futex::AVAILABLE
    }

    fn reap(&self, busy: &ShmBusy) -> bool {
        self.inner.table.recover(&busy.0)
    }

    /// A wait that ran out says who held the key then (a snapshot of its entry, read
    /// after the deadline: no cost while waiting).
    fn gave_up(&self, busy: ShmBusy, key: &[u8], waited: Duration) -> Error {
        let table = &self.inner.table;
        // (a waiter that waited marked the holds: see `writer_withdraws`; one that only
        // tried marked nothing, and takes nobody's marks back). Its last look may have
        // found something else (a claim in progress): what it marked before counts.
        if !waited.is_zero() {
            let marked = MARKED
                .try_with(Cell::take)
                .ok()
                .flatten()
                .filter(|&(hash, _)| hash == busy.0.hash);
            match (busy.0.wait, marked) {
                (table::WaitFor::Readers, _) | (_, Some((_, false))) => {
                    table.writer_withdraws(busy.0.hash)
                }
                (table::WaitFor::Writer, _) | (_, Some((_, true))) => {
                    table.readers_withdraw(busy.0.hash)
                }
                _ => {}
            }
        }
        // (a writer's own marks, aged as it gave up, are no other writer's wait)
        let reader = busy.0.wait == table::WaitFor::Entry;
        let seen = match table.entry_of(busy.0.hash) {
            Some(e) => {
                let h = self.holder(&e, table.now(), true);
                Some(HolderSeen {
                    pid: (h.pid != 0).then_some(h.pid),
                    host: None,
                    held_for: Some(h.age),
                    writer_waits: reader && h.writer_waits,
                    readers_wait: false,
                    this_process: h.pid != 0 && h.pid == crate::shm::process::current_pid(),
                })
            }
            // nobody holds it: a reader kept out by the key kept for a writer, a writer
            // kept out by the key kept for readers, or let go
            None => table.is_kept(&busy.0).then(|| HolderSeen {
                writer_waits: busy.0.word.is_shared(),
                readers_wait: !busy.0.word.is_shared(),
                ..HolderSeen::default()
            }),
        };
        Error::timeout(key, waited, seen)
    }

    fn sleep(
        &self,
        busy: &ShmBusy,
        step: Duration,
        late: Duration,
        slack: &mut TimerSlack,
    ) -> (Duration, bool) {
        let table = &self.inner.table;
        if let table::WaitFor::Readers | table::WaitFor::Writer = busy.0.wait {
            let reader = busy.0.wait == table::WaitFor::Writer;
            let _ = MARKED.try_with(|m| m.set(Some((busy.0.hash, reader))));
        }
        // A writer waiting for readers (or readers for a writer) looks again often enough
        // to keep its mark fresh; a key kept for someone is looked at as often, so that
        // the end of their wait is seen (it wakes nobody).
        let step = match busy.0.wait {
            table::WaitFor::Readers | table::WaitFor::Writer => step.min(table::WRITER_REFRESH),
            _ if busy.0.word.state() == State::Idle => step.min(table::WRITER_REFRESH),
            _ => step,
        };
        match table.prepare_wait(&busy.0) {
            Prepared::Sleep(low) => {
                // Sleep no later than the lease's end (and one tick of the coarse clock
                // past it): an expiry wakes nobody. A step's end may come `late`, the
                // lease's may not.
                let (step, late) = match table.lease_left(&busy.0) {
                    Some(left) => {
                        let end = left + CLOCK_TICK;
                        (step.min(end), late.min(end.saturating_sub(step)))
                    }
                    None => (step, late),
                };
                slack.hold();
                // The step ends on a tick of the coarse clock where `late` allows it (see
                // `slack`).
                let start = clock::precise_now();
                let end = start.saturating_add(nanos(step));
                let until = clock::on_tick(end, end.saturating_add(nanos(late)));
                futex::wait_low_until(table.wait_word(&busy.0), low, until);
                let mut used = Duration::from_nanos(clock::precise_now().saturating_sub(start));
                // Woken early, or refused the sleep: moved on only if the key may be free
                // now (a holder that took it straight back still holds, and may be dead
                // by the next look).
                let moved = used < step && table.moved_on(&busy.0);
                if moved && table.behind_a_writer(&busy.0) {
                    let head = table::WRITER_HEAD_START.min(step - used);
                    std::thread::sleep(head);
                    used += head;
                }
                (used, moved)
            }
            Prepared::Changed => (Duration::ZERO, true),
            // A claim, a renewal or a check in progress lasts microseconds, and nobody sleeps
            // on it: look again soon rather than a whole step later, or a waiter that met
            // one would sleep out long steps while the ones asleep on the word are woken at
            // each release and take the key before it (starved for its timeout).
            Prepared::Poll => {
                slack.hold();
                let t = Instant::now();
                std::thread::sleep(step.min(TRANSIENT_POLL));
                (t.elapsed(), false)
            }
        }
    }
}
