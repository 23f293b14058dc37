//! The lock API over any [`Backend`]: the resty-style [`Lock`] object and the RAII
//! [`LockGuard`].

use std::time::Duration;

use crate::backend::{acquire_slow, Backend};
use crate::error::Error;
use crate::options::{LockOptions, Resolved};
use crate::process;
use crate::LockTable;

/// A hold and the process that took it: a copy inherited by a forked child must not
/// release its parent's hold.
struct Holding<H> {
    hold: H,
    pid: u32,
}

impl<H> Holding<H> {
    #[inline]
    fn new(hold: H) -> Holding<H> {
        Holding {
            hold,
            pid: process::current_pid(),
        }
    }

    #[inline]
    fn ours(&self) -> Result<&H, Error> {
        if self.pid == process::current_pid() {
            Ok(&self.hold)
        } else {
            Err(Error::NotOwner)
        }
    }
}

fn release<B: Backend>(backend: &B, holding: &Holding<B::Hold>) -> Result<(), Error> {
    backend.release(holding.ours()?)
}

fn extend<B: Backend>(
    backend: &B,
    holding: &mut Holding<B::Hold>,
    exptime_ns: u64,
    ttl: Option<Duration>,
) -> Result<(), Error> {
    holding.ours()?;
    let exptime = match ttl {
        None => exptime_ns,
        Some(d) => u64::try_from(d.as_nanos())
            .map_err(|_| Error::InvalidOptions("ttl must be below 584 years"))?,
    };
    backend.extend(&mut holding.hold, exptime)
}

fn token<B: Backend>(backend: &B, holding: &Holding<B::Hold>) -> Option<u64> {
    backend.token(holding.ours().ok()?)
}

/// `try_lock` of any backend: one attempt for a guard, `Ok(None)` if the key is held.
pub(crate) fn try_guard<'b, B: Backend>(
    backend: &'b B,
    key: &[u8],
    exptime: Duration,
) -> Result<Option<LockGuard<'b, B>>, Error> {
    let opts = LockOptions {
        exptime,
        timeout: Duration::ZERO,
        ..LockOptions::default()
    };
    match guard(backend, key, &opts, None) {
        Ok(guard) => Ok(Some(guard)),
        Err(Error::Timeout) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Takes `key` on `backend` for a guard: the fast path, else the waiting loop.
#[inline(always)]
pub(crate) fn guard<'b, B: Backend>(
    backend: &'b B,
    key: &[u8],
    opts: &LockOptions,
    timeout: Option<Duration>,
) -> Result<LockGuard<'b, B>, Error> {
    let resolved = opts.resolve()?;
    let (hold, elapsed) = match backend.acquire_fast(key, resolved.exptime_ns)? {
        Some(hold) => (hold, Duration::ZERO),
        None => acquire_slow(backend, key, &resolved, timeout)?,
    };
    Ok(LockGuard {
        backend,
        holding: Holding::new(hold),
        elapsed,
        exptime_ns: resolved.exptime_ns,
    })
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
pub struct Lock<'b, B: Backend = LockTable> {
    backend: &'b B,
    opts: Resolved,
    timeout: Duration,
    holding: Option<Holding<B::Hold>>,
}

impl<'b, B: Backend> Lock<'b, B> {
    /// A lock object on `backend`. Fails with [`Error::InvalidOptions`] on nonsense options.
    pub fn new(backend: &'b B, opts: LockOptions) -> Result<Lock<'b, B>, Error> {
        Ok(Lock {
            backend,
            opts: opts.resolve()?,
            timeout: opts.timeout,
            holding: None,
        })
    }

    /// Takes `key`, waiting up to the timeout. Returns the time waited: zero if the key was
    /// free, else the sum of the sleeps (`notify: false`) or the time actually waited.
    /// [`Error::Locked`] at once if this object already holds a key.
    pub fn lock(&mut self, key: impl AsRef<[u8]>) -> Result<Duration, Error> {
        self.lock_with_timeout(key, self.timeout)
    }

    /// [`lock`](Lock::lock) with another timeout for this call only.
    pub fn lock_with_timeout(
        &mut self,
        key: impl AsRef<[u8]>,
        timeout: Duration,
    ) -> Result<Duration, Error> {
        if self.holding.is_some() {
            return Err(Error::Locked);
        }
        let key = key.as_ref();
        if let Some(hold) = self.backend.acquire_fast(key, self.opts.exptime_ns)? {
            self.holding = Some(Holding::new(hold));
            return Ok(Duration::ZERO);
        }
        let (hold, elapsed) = acquire_slow(self.backend, key, &self.opts, Some(timeout))?;
        self.holding = Some(Holding::new(hold));
        Ok(elapsed)
    }

    /// Releases the key. [`Error::Unlocked`] if none is held; [`Error::Expired`] if the
    /// lease ran out and someone else took the key (their hold is left alone).
    pub fn unlock(&mut self) -> Result<(), Error> {
        let holding = self.holding.take().ok_or(Error::Unlocked)?;
        release(self.backend, &holding)
    }

    /// Renews the lease: `None` for the object's exptime, `Some(ttl)` for another length
    /// (zero: never expires). [`Error::Expired`] if the lease already ran out; the object
    /// then holds nothing.
    pub fn expire(&mut self, ttl: Option<Duration>) -> Result<(), Error> {
        let holding = self.holding.as_mut().ok_or(Error::Unlocked)?;
        let result = extend(self.backend, holding, self.opts.exptime_ns, ttl);
        if matches!(result, Err(Error::Expired)) {
            self.holding = None;
        }
        result
    }

    /// The fencing token of the current hold: larger than any token handed to an earlier
    /// holder of the key. `None` if nothing is held or the lease was already lost.
    pub fn token(&self) -> Option<u64> {
        token(self.backend, self.holding.as_ref()?)
    }

    /// Stops holding the key without unlocking it: it stays taken until its lease runs out
    /// (see [`LockGuard::leave_to_expire`]). Returns the fencing token of the hold;
    /// [`Error::Unlocked`] if nothing is held.
    pub fn leave_to_expire(&mut self) -> Result<Option<u64>, Error> {
        let holding = self.holding.take().ok_or(Error::Unlocked)?;
        Ok(token(self.backend, &holding))
    }

    /// Whether this object holds a key.
    pub fn is_locked(&self) -> bool {
        self.holding.is_some()
    }
}

impl<B: Backend> Drop for Lock<'_, B> {
    fn drop(&mut self) {
        if let Some(holding) = self.holding.take() {
            let _ = release(self.backend, &holding);
        }
    }
}

/// A held key, released when dropped (unless this is a copy in a forked child).
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct LockGuard<'b, B: Backend = LockTable> {
    backend: &'b B,
    holding: Holding<B::Hold>,
    elapsed: Duration,
    exptime_ns: u64,
}

impl<B: Backend> LockGuard<'_, B> {
    /// How long the acquisition waited (see [`Lock::lock`]).
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// The fencing token of this hold (see [`Lock::token`]).
    pub fn token(&self) -> Option<u64> {
        token(self.backend, &self.holding)
    }

    /// Renews the lease (see [`Lock::expire`]).
    pub fn expire(&mut self, ttl: Option<Duration>) -> Result<(), Error> {
        extend(self.backend, &mut self.holding, self.exptime_ns, ttl)
    }

    /// Keeps the key until its lease runs out, without unlocking: a lease rather than a
    /// lock, as for "only one worker runs this tick". Returns the fencing token of the
    /// hold. With `exptime` zero the key stays held for good (until broken by force).
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("shmlock-doc-lease-{}", std::process::id()));
    /// # let _ = std::fs::remove_file(&path);
    /// use shmlock::LockTable;
    /// use std::time::Duration;
    ///
    /// let table = LockTable::open(&path, 64)?;
    /// // Whoever gets the lease for this minute's run does the work; nobody unlocks.
    /// if let Some(lease) = table.try_lock("cron:2026-11-21T20:46", Duration::from_secs(60))? {
    ///     let _token = lease.leave_to_expire();
    ///     // ... do this minute's work ...
    /// }
    /// assert!(table.try_lock("cron:2026-11-21T20:46", Duration::from_secs(60))?.is_none());
    /// # std::fs::remove_file(&path).unwrap();
    /// # Ok::<(), shmlock::Error>(())
    /// ```
    pub fn leave_to_expire(self) -> Option<u64> {
        let token = self.token();
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never used again and its Drop (which would release) does not
        // run, so the holding is read out and dropped exactly once.
        drop(unsafe { std::ptr::read(&this.holding) });
        token
    }

    /// Releases the key now and reports whether the hold was still ours.
    pub fn unlock(self) -> Result<(), Error> {
        let this = std::mem::ManuallyDrop::new(self);
        let result = release(this.backend, &this.holding);
        // SAFETY: `this` is never used again and its Drop does not run, so the holding is
        // read out (and dropped) exactly once.
        drop(unsafe { std::ptr::read(&this.holding) });
        result
    }
}

impl<B: Backend> Drop for LockGuard<'_, B> {
    fn drop(&mut self) {
        let _ = release(self.backend, &self.holding);
    }
}

impl<B: Backend> std::fmt::Debug for LockGuard<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("elapsed", &self.elapsed)
            .finish()
    }
}
