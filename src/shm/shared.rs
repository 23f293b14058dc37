//! Shared holds on the lock table: read locks ([`Shared`], taken with
//! [`LockTable::lock_shared`]) and counting semaphores ([`Semaphore`]). Both are entries of
//! the table like an exclusive hold, each with its own owner, lease and token, marked
//! shared: the slot protocol (`table/claim.rs`) lets shared entries of a key stand side by
//! side, at most `limit` of them for a semaphore, and an exclusive one only alone. So a
//! dead or stopped reader or permit holder is found and freed as an exclusive holder is.

use std::borrow::Borrow;
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::key::check_key;
use crate::lock::backend::{delegate_backend, Backend, Sealed};
use crate::lock::options::LockOptions;
use crate::lock::{self, LockGuard};
use crate::shm::lock_table::{LockTable, ShmBusy, ShmHold};
use crate::shm::table::Mode;

/// The lock table seen as read locks: a [`Backend`] whose holds of a key are shared with
/// every other reader of it, never with a writer (an exclusive hold of
/// [`LockTable::lock`]). Got by [`LockTable::shared`]; [`LockTable::lock_shared`] takes a
/// read hold in one call, and [`Lock::new`](crate::Lock::new) over it makes a resty-style
/// lock object that reads.
///
/// A writer that waits for readers keeps new readers out until it has had its turn
/// (writer preference); the readers already in finish as they would.
///
/// ```
/// # let path = std::env::temp_dir().join(format!("shmlock-doc-shared-{}", std::process::id()));
/// # let _ = std::fs::remove_file(&path);
/// use shmlock::{LockOptions, LockTable};
/// use std::time::Duration;
///
/// let table = LockTable::open(&path, 64)?;
/// let a = table.lock_shared("config", &LockOptions::default())?;
/// let b = table.lock_shared("config", &LockOptions::default())?; // readers share
/// assert!(table.try_lock_with_lease("config", Duration::from_secs(1))?.is_none());
/// drop((a, b));
/// let writer = table.lock("config", &LockOptions::default())?;
/// let reader = writer.downgrade()?; // no writer can come between
/// assert!(table.shared().try_lock_with_lease("config", Duration::from_secs(1))?.is_some());
/// # drop(reader);
/// # std::fs::remove_file(&path).unwrap();
/// # Ok::<(), shmlock::Error>(())
/// ```
#[repr(transparent)]
pub struct Shared(LockTable);

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Shared").field(&self.0).finish()
    }
}

impl LockTable {
    /// This table's read locks (see [`Shared`]).
    #[inline]
    pub fn shared(&self) -> &Shared {
        // SAFETY: `Shared` is `repr(transparent)` over `LockTable`, so both have one layout
        // and the reference keeps the borrow of `self`.
        unsafe { &*(self as *const LockTable).cast::<Shared>() }
    }

    /// Takes `key` for reading, waiting as `opts` says: beside other readers, never beside
    /// a writer. Released when the guard drops.
    #[inline]
    pub fn lock_shared(
        &self,
        key: impl AsRef<[u8]>,
        opts: impl Borrow<LockOptions>,
    ) -> Result<LockGuard<'_, Shared>, Error> {
        self.shared().lock(key, opts)
    }

    /// Takes `key` for reading if no writer holds it (or waits for it: writers first),
    /// without waiting, for a lease of `lease` (zero: never expires). `Ok(None)` if it is
    /// not to be had now.
    #[inline]
    pub fn try_lock_shared(
        &self,
        key: impl AsRef<[u8]>,
        lease: Duration,
    ) -> Result<Option<LockGuard<'_, Shared>>, Error> {
        self.shared().try_lock_with_lease(key, lease)
    }

    /// A counting semaphore named `key` of `permits` permits: at most that many holds of
    /// it at once, across every process of the table. A dead holder's permit comes back
    /// as soon as its death is known (the rule of the exclusive lock), and waiters are
    /// woken by any release. The count is fixed while any permit is held: asking for
    /// another is [`Error::PermitsMismatch`]. `permits` is between 1 and the table's
    /// capacity.
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("shmlock-doc-sem-{}", std::process::id()));
    /// # let _ = std::fs::remove_file(&path);
    /// use shmlock::{LockOptions, LockTable};
    /// use std::time::Duration;
    ///
    /// let table = LockTable::open(&path, 64)?;
    /// let gpus = table.semaphore("gpu", 2)?;
    /// let a = gpus.acquire(&LockOptions::default())?;
    /// let b = gpus.acquire(&LockOptions::default())?;
    /// assert!(gpus.try_acquire(Duration::from_secs(60))?.is_none()); // both taken
    /// drop(a);
    /// assert!(gpus.try_acquire(Duration::from_secs(60))?.is_some());
    /// # drop(b);
    /// # std::fs::remove_file(&path).unwrap();
    /// # Ok::<(), shmlock::Error>(())
    /// ```
    pub fn semaphore(&self, key: impl AsRef<[u8]>, permits: u32) -> Result<Semaphore<'_>, Error> {
        let key = check_key(key.as_ref())?;
        if permits == 0 || permits as usize > self.capacity() {
            return Err(Error::InvalidOptions(
                "a semaphore's permits must be between 1 and the table's capacity",
            ));
        }
        Ok(Semaphore {
            table: self,
            key: key.into(),
            permits,
        })
    }
}

impl LockTable {
    /// [`lock_shared`](Self::lock_shared) for async code (tokio), waiting as
    /// [`lock_async`](Self::lock_async) does: the runtime thread is never blocked, and a
    /// waiting task is woken by the release that lets it in.
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("shmlock-doc-shared-async-{}", std::process::id()));
    /// # let _ = std::fs::remove_file(&path);
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// use shmlock::{LockOptions, LockTable};
    ///
    /// let table = LockTable::open(&path, 64)?;
    /// let a = table.lock_shared_async("config", &LockOptions::default()).await?;
    /// let b = table.lock_shared_async("config", &LockOptions::default()).await?;
    /// drop((a, b));
    /// # std::fs::remove_file(&path).unwrap();
    /// # Ok::<(), shmlock::Error>(())
    /// # }).unwrap();
    /// ```
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub async fn lock_shared_async(
        &self,
        key: impl AsRef<[u8]>,
        opts: impl Borrow<LockOptions>,
    ) -> Result<LockGuard<'_, Shared>, Error> {
        self.shared().lock_async(key, opts).await
    }
}

impl Shared {
    fn mode(&self) -> Mode {
        Mode::Shared { limit: 0 }
    }

    /// Takes `key` for reading, for async code (see [`LockTable::lock_shared_async`]).
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub async fn lock_async(
        &self,
        key: impl AsRef<[u8]>,
        opts: impl Borrow<LockOptions>,
    ) -> Result<LockGuard<'_, Shared>, Error> {
        let (hold, elapsed, exptime) = self
            .0
            .acquire_async_in(key.as_ref(), opts.borrow(), self.mode())
            .await?;
        Ok(LockGuard::new(self, hold, elapsed, exptime))
    }

    /// The table these read locks live in.
    pub fn table(&self) -> &LockTable {
        &self.0
    }

    /// Takes `key` for reading (see [`LockTable::lock_shared`]).
    #[inline]
    pub fn lock(
        &self,
        key: impl AsRef<[u8]>,
        opts: impl Borrow<LockOptions>,
    ) -> Result<LockGuard<'_, Shared>, Error> {
        let opts = opts.borrow();
        lock::guard(self, key.as_ref(), opts, Some(opts.timeout))
    }

    /// Takes `key` for reading without waiting (see [`LockTable::try_lock_shared`]).
    #[inline]
    pub fn try_lock_with_lease(
        &self,
        key: impl AsRef<[u8]>,
        lease: Duration,
    ) -> Result<Option<LockGuard<'_, Shared>>, Error> {
        lock::try_guard(self, key.as_ref(), lease)
    }
}

impl<'t> LockGuard<'t, LockTable> {
    /// Turns this exclusive hold into a read hold, atomically: no writer can take the key
    /// in between, and the readers waiting for it are let in. The lease, its deadline and
    /// the entry stay; the token becomes a reader's (see [`LockGuard::token`]).
    /// [`Error::Expired`] if the hold was lost already, or if its lease has run out (then
    /// it is released: a writer could take the key at any moment).
    pub fn downgrade(self) -> Result<LockGuard<'t, Shared>, Error> {
        let shared = self.backend().shared();
        self.rebind(shared, |table, hold| table.downgrade_hold(hold))
    }
}

/// A counting semaphore of the lock table: see [`LockTable::semaphore`]. Each permit is a
/// guard ([`LockGuard`]) with its own lease, renewal and owner-checked release, as a lock's.
#[derive(Debug)]
pub struct Semaphore<'t> {
    table: &'t LockTable,
    key: Box<[u8]>,
    permits: u32,
}

impl<'t> Semaphore<'t> {
    /// The count of permits.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The table the semaphore lives in.
    pub fn table(&self) -> &'t LockTable {
        self.table
    }

    /// The semaphore's name.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// Takes a permit, waiting as `opts` says.
    #[inline]
    pub fn acquire(&self, opts: impl Borrow<LockOptions>) -> Result<LockGuard<'_, Self>, Error> {
        let opts = opts.borrow();
        lock::guard(self, &self.key, opts, Some(opts.timeout))
    }

    /// Takes a permit, for async code (tokio): the runtime thread is never blocked, and a
    /// waiting task is woken by the release of any permit.
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub async fn acquire_async(
        &self,
        opts: impl Borrow<LockOptions>,
    ) -> Result<LockGuard<'_, Self>, Error> {
        let (hold, elapsed, exptime) = self
            .table
            .acquire_async_in(&self.key, opts.borrow(), self.mode())
            .await?;
        Ok(LockGuard::new(self, hold, elapsed, exptime))
    }

    /// Takes a permit if one is free, without waiting, for a lease of `lease` (zero: never
    /// expires). `Ok(None)` if all are taken.
    #[inline]
    pub fn try_acquire(&self, lease: Duration) -> Result<Option<LockGuard<'_, Self>>, Error> {
        lock::try_guard(self, &self.key, lease)
    }

    /// How many permits are held now (a snapshot).
    pub fn held(&self) -> usize {
        self.table.shared_holds(&self.key)
    }

    fn mode(&self) -> Mode {
        Mode::Shared {
            limit: self.permits,
        }
    }
}

/// The [`Backend`] of a view of the table: its attempts in the view's mode (`mode()`),
/// everything else as the table's.
macro_rules! as_the_table {
    ($table:ident) => {
        fn exclusive(&self) -> bool {
            matches!(self.mode(), Mode::Shared { limit: 1 })
        }

        #[inline(always)]
        fn is_ours(&self, hold: &ShmHold) -> bool {
            self.$table().is_ours(hold)
        }

        #[inline(always)]
        fn acquire_fast(
            &self,
            key: &[u8],
            exptime_ns: u64,
        ) -> Result<Result<ShmHold, Option<ShmBusy>>, Error> {
            self.$table().acquire_fast_in(key, exptime_ns, self.mode())
        }

        fn try_acquire(
            &self,
            key: &[u8],
            exptime_ns: u64,
            _deadline: Option<Instant>,
        ) -> Result<Result<ShmHold, ShmBusy>, Error> {
            self.$table().try_acquire_in(key, exptime_ns, self.mode())
        }

        #[inline(always)]
        fn release(&self, hold: &ShmHold) -> Result<(), Error> {
            self.$table().release_shared(hold)
        }

        #[inline(always)]
        fn release_on_drop(&self, hold: &ShmHold) {
            let _ = self.release(hold);
        }

        delegate_backend!($table, ShmHold, ShmBusy, but_release);
    };
}

impl Sealed for Shared {}

impl Backend for Shared {
    type Hold = ShmHold;
    type Busy = ShmBusy;

    as_the_table!(table);
}

impl Sealed for Semaphore<'_> {}

impl Backend for Semaphore<'_> {
    type Hold = ShmHold;
    type Busy = ShmBusy;

    as_the_table!(table);
}
