//! Shared holds in Redis: read locks ([`RedisShared`], taken with
//! [`RedisLocks::lock_shared`]) and counting semaphores ([`RedisSemaphore`]), with the
//! promises of the exclusive lock: each reader and permit holder has its own token and
//! lease, renewal and owner-checked release, and a holder that dies frees its place when
//! its lease ends (the server cannot see a process die). Waiters are woken through the
//! key's release channel. See `scripts` for the keys a key's shared holds live in.

use std::borrow::Borrow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::key::check_key;
use crate::lock::backend::{delegate_backend, Backend, Sealed};
use crate::lock::options::LockOptions;
use crate::lock::{self, LockGuard};
use crate::redis_store::ops::{RedisBusy, RedisHold};
use crate::redis_store::RedisLocks;
use crate::shm::table::Mode;

/// The read locks of a [`RedisLocks`]: a [`Backend`] whose holds of a key are shared with
/// every other reader of it, never with a writer (an exclusive hold of
/// [`RedisLocks::lock`]). Got by [`RedisLocks::shared`]; [`Lock::new`](crate::Lock::new)
/// over it makes a resty-style lock object that reads.
///
/// A writer that sleeps waiting for readers marks the key, and new readers wait behind it
/// (writer preference); the mark lapses within a second of the writer's last look, so a
/// writer that timed out, was cancelled or died stops holding readers up.
///
/// ```no_run
/// use shmlock::{LockOptions, RedisLocks};
/// use std::time::Duration;
///
/// let redis = RedisLocks::open("redis://127.0.0.1:6379/")?;
/// let a = redis.lock_shared("config", &LockOptions::default())?;
/// let b = redis.lock_shared("config", &LockOptions::default())?; // readers share
/// assert!(redis.try_lock_with_lease("config", Duration::from_secs(1))?.is_none());
/// drop((a, b));
/// let writer = redis.lock("config", &LockOptions::default())?;
/// let reader = writer.downgrade()?; // no writer can come between
/// # Ok::<(), shmlock::Error>(())
/// ```
#[repr(transparent)]
pub struct RedisShared(RedisLocks);

impl std::fmt::Debug for RedisShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("RedisShared").field(&self.0).finish()
    }
}

impl RedisLocks {
    /// This handle's read locks (see [`RedisShared`]).
    pub fn shared(&self) -> &RedisShared {
        // SAFETY: `RedisShared` is `repr(transparent)` over `RedisLocks`, so both have one
        // layout, and the reference keeps the borrow of `self`.
        unsafe { &*(self as *const RedisLocks).cast::<RedisShared>() }
    }

    /// Takes `key` for reading, waiting as `opts` says: beside other readers, never beside
    /// a writer. Released when the guard drops.
    pub fn lock_shared(
        &self,
        key: impl AsRef<[u8]>,
        opts: impl Borrow<LockOptions>,
    ) -> Result<LockGuard<'_, RedisShared>, Error> {
        self.shared().lock(key, opts)
    }

    /// Takes `key` for reading if no writer holds it (or waits for it: writers first),
    /// without waiting, for a lease of `lease` (zero: never expires). `Ok(None)` if it is
    /// not to be had now.
    pub fn try_lock_shared(
        &self,
        key: impl AsRef<[u8]>,
        lease: Duration,
    ) -> Result<Option<LockGuard<'_, RedisShared>>, Error> {
        self.shared().try_lock_with_lease(key, lease)
    }

    /// A counting semaphore named `key` of `permits` permits: at most that many holds of
    /// it at once, across every client of the server. A holder's permit comes back when
    /// it releases it or its lease ends (a dead holder's too: the server cannot see it
    /// die), and waiters are woken by any release. The count is fixed while any permit
    /// is held: asking for another is [`Error::PermitsMismatch`]. `permits` is at least 1.
    ///
    /// ```no_run
    /// use shmlock::{LockOptions, RedisLocks};
    /// use std::time::Duration;
    ///
    /// let redis = RedisLocks::open("redis://127.0.0.1:6379/")?;
    /// let gpus = redis.semaphore("gpu", 2)?;
    /// let a = gpus.acquire(&LockOptions::default())?;
    /// let b = gpus.acquire(&LockOptions::default())?;
    /// assert!(gpus.try_acquire(Duration::from_secs(60))?.is_none()); // both taken
    /// # Ok::<(), shmlock::Error>(())
    /// ```
    pub fn semaphore(
        &self,
        key: impl AsRef<[u8]>,
        permits: u32,
    ) -> Result<RedisSemaphore<'_>, Error> {
        let key = check_key(key.as_ref())?;
        if permits == 0 {
            return Err(Error::InvalidOptions(
                "a semaphore's permits must be at least 1",
            ));
        }
        self.names_of(key)?;
        Ok(RedisSemaphore {
            locks: self,
            key: key.into(),
            permits,
        })
    }

    /// How many shared holds of `key` stand now (a snapshot).
    fn shared_holds(&self, key: &[u8]) -> Result<usize, Error> {
        let names = self.names_of(key)?;
        let n: u64 = self
            .run_script(
                &self
                    .0
                    .scripts
                    .held
                    .call()
                    .key(&names.shared)
                    .key(&names.leases),
            )
            .map_err(|e| self.wrong_type(key, e, None))?;
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }

    /// Turns the exclusive `hold` into a reader's (see `scripts::DOWNGRADE`).
    fn downgrade_hold(&self, hold: &mut RedisHold) -> Result<(), Error> {
        self.granted_ours(
            &self
                .0
                .scripts
                .downgrade
                .call()
                .key(&hold.names.lock)
                .key(&hold.names.channel)
                .key(&hold.names.shared)
                .key(&hold.names.leases)
                .key(&hold.names.readers)
                .arg(&hold.token),
        )
    }
}

#[cfg(feature = "tokio")]
impl RedisLocks {
    /// [`lock_shared`](Self::lock_shared) for async code (tokio), waiting and cancel-safe
    /// as [`lock_async`](Self::lock_async).
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub async fn lock_shared_async(
        &self,
        key: impl AsRef<[u8]>,
        opts: impl Borrow<LockOptions>,
    ) -> Result<LockGuard<'_, RedisShared>, Error> {
        self.shared().lock_async(key, opts).await
    }
}

impl RedisShared {
    fn mode(&self) -> Mode {
        Mode::Shared { limit: 0 }
    }

    /// The handle these read locks belong to.
    pub fn locks(&self) -> &RedisLocks {
        &self.0
    }

    /// Takes `key` for reading (see [`RedisLocks::lock_shared`]).
    pub fn lock(
        &self,
        key: impl AsRef<[u8]>,
        opts: impl Borrow<LockOptions>,
    ) -> Result<LockGuard<'_, RedisShared>, Error> {
        let opts = opts.borrow();
        lock::guard(self, key.as_ref(), opts, Some(opts.timeout))
    }

    /// Takes `key` for reading without waiting (see [`RedisLocks::try_lock_shared`]).
    pub fn try_lock_with_lease(
        &self,
        key: impl AsRef<[u8]>,
        lease: Duration,
    ) -> Result<Option<LockGuard<'_, RedisShared>>, Error> {
        lock::try_guard(self, key.as_ref(), lease)
    }

    /// Takes `key` for reading, for async code (see [`RedisLocks::lock_shared_async`]).
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub async fn lock_async(
        &self,
        key: impl AsRef<[u8]>,
        opts: impl Borrow<LockOptions>,
    ) -> Result<LockGuard<'_, RedisShared>, Error> {
        let (hold, elapsed, exptime) = self
            .0
            .acquire_async_in(key.as_ref(), opts.borrow(), self.mode())
            .await?;
        Ok(LockGuard::new(self, hold, elapsed, exptime))
    }
}

impl<'r> LockGuard<'r, RedisLocks> {
    /// Turns this exclusive hold into a read hold, in one script: no writer can take the
    /// key in between, and the readers waiting for it are woken. The token and what is
    /// left of the lease stay. [`Error::Expired`] if the hold was lost already.
    pub fn downgrade(self) -> Result<LockGuard<'r, RedisShared>, Error> {
        let shared = self.backend().shared();
        self.rebind(shared, |locks, hold| locks.downgrade_hold(hold))
    }
}

/// A counting semaphore in Redis: see [`RedisLocks::semaphore`]. Each permit is a guard
/// ([`LockGuard`]) with its own lease, renewal and owner-checked release, as a lock's.
#[derive(Debug)]
pub struct RedisSemaphore<'r> {
    locks: &'r RedisLocks,
    key: Arc<[u8]>,
    permits: u32,
}

impl<'r> RedisSemaphore<'r> {
    /// The count of permits.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The handle the semaphore lives in.
    pub fn locks(&self) -> &'r RedisLocks {
        self.locks
    }

    /// The semaphore's name.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// Takes a permit, waiting as `opts` says.
    pub fn acquire(&self, opts: impl Borrow<LockOptions>) -> Result<LockGuard<'_, Self>, Error> {
        let opts = opts.borrow();
        lock::guard(self, &self.key, opts, Some(opts.timeout))
    }

    /// Takes a permit if one is free, without waiting, for a lease of `lease` (zero: never
    /// expires). `Ok(None)` if all are taken.
    pub fn try_acquire(&self, lease: Duration) -> Result<Option<LockGuard<'_, Self>>, Error> {
        lock::try_guard(self, &self.key, lease)
    }

    /// Takes a permit, for async code (tokio), waiting and cancel-safe as
    /// [`RedisLocks::lock_async`].
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub async fn acquire_async(
        &self,
        opts: impl Borrow<LockOptions>,
    ) -> Result<LockGuard<'_, Self>, Error> {
        let (hold, elapsed, exptime) = self
            .locks
            .acquire_async_in(&self.key, opts.borrow(), self.mode())
            .await?;
        Ok(LockGuard::new(self, hold, elapsed, exptime))
    }

    /// How many permits are held now (a snapshot, asked of the server).
    pub fn held(&self) -> Result<usize, Error> {
        self.locks.shared_holds(&self.key)
    }

    fn mode(&self) -> Mode {
        Mode::Shared {
            limit: self.permits,
        }
    }
}

/// The [`Backend`] of a view of the handle: its attempts in the view's mode, everything
/// else as the handle's (the scripts tell a shared hold from an exclusive one by its token).
macro_rules! as_the_handle {
    ($locks:ident) => {
        fn exclusive(&self) -> bool {
            matches!(self.mode(), Mode::Shared { limit: 1 })
        }

        fn is_ours(&self, hold: &RedisHold) -> bool {
            self.$locks().is_ours(hold)
        }

        fn acquire_fast(
            &self,
            _key: &[u8],
            _exptime_ns: u64,
        ) -> Result<Result<RedisHold, Option<RedisBusy>>, Error> {
            Ok(Err(None))
        }

        fn try_acquire(
            &self,
            key: &[u8],
            exptime_ns: u64,
            deadline: Option<Instant>,
        ) -> Result<Result<RedisHold, RedisBusy>, Error> {
            self.$locks()
                .try_acquire_in(key, exptime_ns, deadline, self.mode())
        }

        delegate_backend!($locks, RedisHold, RedisBusy);
    };
}

impl Sealed for RedisShared {}

impl Backend for RedisShared {
    type Hold = RedisHold;
    type Busy = RedisBusy;

    as_the_handle!(locks);
}

impl Sealed for RedisSemaphore<'_> {}

impl Backend for RedisSemaphore<'_> {
    type Hold = RedisHold;
    type Busy = RedisBusy;

    as_the_handle!(locks);
}

#[cfg(feature = "tokio")]
impl crate::lock::AsyncBackend for RedisShared {
    fn lock_boxed<'a>(
        &'a self,
        key: &'a [u8],
        opts: &'a LockOptions,
    ) -> std::pin::Pin<
        Box<
            dyn std::future::Future<Output = Result<LockGuard<'a, RedisShared>, Error>> + Send + 'a,
        >,
    > {
        Box::pin(self.lock_async(key, opts))
    }
}
