//! The lock API over any [`Backend`]: the resty-style [`Lock`] object and the RAII
//! [`LockGuard`].

use std::borrow::Borrow;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::lock::backend::{acquire_slow, Backend};
use crate::lock::options::{LockOptions, Resolved};
use crate::shm::process;
use crate::shm::LockTable;

/// A [`Backend`] with `lock_async` (feature `tokio`): what
/// [`SharedDict::get_or_fetch_async`](crate::SharedDict::get_or_fetch_async) takes its lock
/// through, on either backend. Sealed, as `Backend` is.
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub trait AsyncBackend: Backend + Sized {
    /// `lock_async` of the backend, boxed.
    #[doc(hidden)]
    fn lock_boxed<'a>(
        &'a self,
        key: &'a [u8],
        opts: &'a crate::lock::options::LockOptions,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<LockGuard<'a, Self>, Error>> + Send + 'a>,
    >;
}

/// A hold, which a copy inherited by a forked child must not release (the backend tells
/// whose it is: `Backend::is_ours`), and the length of its lease as last asked for (at
/// its acquisition or by `expire`: what `keep_alive` renews; 0: never expires).
struct Holding<B: Backend> {
    hold: B::Hold,
    lease_ns: u64,
}

impl<B: Backend> Holding<B> {
    #[inline]
    fn new(hold: B::Hold, lease_ns: u64) -> Holding<B> {
        Holding { hold, lease_ns }
    }

    #[inline]
    fn ours(&self, backend: &B) -> Result<&B::Hold, Error> {
        if backend.is_ours(&self.hold) {
            Ok(&self.hold)
        } else {
            Err(Error::NotOwner)
        }
    }
}

fn release<B: Backend>(backend: &B, holding: &Holding<B>) -> Result<(), Error> {
    backend.release(holding.ours(backend)?)
}

/// The release of a dropped guard or lock object: by this process only, outcome unseen.
fn release_on_drop<B: Backend>(backend: &B, holding: &Holding<B>) {
    if let Ok(hold) = holding.ours(backend) {
        backend.release_on_drop(hold);
    }
}

fn extend<B: Backend>(
    backend: &B,
    holding: &mut Holding<B>,
    exptime_ns: u64,
    ttl: Option<Duration>,
) -> Result<(), Error> {
    holding.ours(backend)?;
    let exptime = match ttl {
        None => exptime_ns,
        Some(d) => u64::try_from(d.as_nanos())
            .map_err(|_| Error::InvalidOptions("ttl must be below 584 years"))?,
    };
    let result = backend.extend(&mut holding.hold, exptime);
    // A renewal that failed (a reply lost or late, `NotReplicated`) may or may not have
    // set the lease: what `keep_alive` renews is then a lease whichever it set, since its
    // first renewal sets it anyway; counting "never expires" where the server kept a lease
    // would renew nothing and let the key lapse unseen.
    holding.lease_ns = match result {
        Err(_) if exptime == 0 => holding.lease_ns,
        _ => exptime,
    };
    result
}

fn token<B: Backend>(backend: &B, holding: &Holding<B>) -> Option<u64> {
    backend.token(holding.ours(backend).ok()?)
}

/// A hold left to run out its lease: its token (taken while the hold is still ours), then
/// the hold given up to its lease.
fn leave<B: Backend>(backend: &B, holding: &Holding<B>) -> Option<u64> {
    let hold = holding.ours(backend).ok()?;
    let token = backend.token(hold);
    backend.leave(hold);
    token
}

fn try_token<B: Backend>(backend: &B, holding: &Holding<B>) -> Result<u64, Error> {
    backend.try_token(holding.ours(backend)?)
}

fn check<B: Backend>(backend: &B, holding: &Holding<B>) -> Result<(), Error> {
    backend.check(holding.ours(backend)?)
}

/// What [`LockGuard::keep_alive`] and [`Lock::keep_alive`] hand to the work they guard.
#[derive(Debug)]
pub struct KeepAlive {
    lost: AtomicBool,
    /// The renewals' time origin.
    base: Instant,
    /// When the work must stop, in ns after `base`: a tenth of a lease before the lease
    /// last renewed could lapse, counted from when that renewal was sent (0: none to stop
    /// at, the hold never expiring).
    stop_ns: AtomicU64,
}

impl Default for KeepAlive {
    fn default() -> KeepAlive {
        KeepAlive {
            lost: AtomicBool::new(false),
            base: Instant::now(),
            stop_ns: AtomicU64::new(0),
        }
    }
}

impl KeepAlive {
    /// Whether the work should stop: a renewal found the lease lost (taken over, broken,
    /// past the handle's longest hold), or no renewal has answered for so long that the
    /// lease might lapse within a tenth of itself (a link that went silent, a process
    /// that was stopped: the renewal still hanging or not yet run). Once true it stays
    /// true. The work no longer has the lock, or cannot count on it: anything fenced
    /// should be refused by now.
    pub fn is_lost(&self) -> bool {
        if self.lost.load(Ordering::Acquire) {
            return true;
        }
        let stop = self.stop_ns.load(Ordering::Acquire);
        if stop != 0 && self.since_base() >= stop {
            self.lost.store(true, Ordering::Release);
            return true;
        }
        false
    }

    fn since_base(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// A renewal sent at `sent` answered: the lease runs at least `lease_ns` from then
    /// (as [`Backend::lease_ns`] counts it). The work is to stop a tenth of it before its
    /// end.
    fn renewed(&self, sent: Instant, lease_ns: u64) {
        let sent = u64::try_from(sent.duration_since(self.base).as_nanos()).unwrap_or(u64::MAX);
        let stop = sent.saturating_add(lease_ns - lease_ns / 10).max(1);
        self.stop_ns.store(stop, Ordering::Release);
    }
}

/// Renews `holding` once, then runs `work` while a thread renews it every third of its
/// lease (as last asked for: at its acquisition, or by `expire`). Returns the work's
/// result and whether the lease held throughout: a renewal that finds the lease lost, or
/// refused past the backend's longest hold, stops the renewals, and the hold is looked at
/// once more when the work is done (a holder stopped past its lease may finish its work
/// before its renewer runs again). The first renewal is made before the work so that
/// [`KeepAlive::is_lost`] knows from its start when the lease could lapse; a renewer that
/// wakes past that point (a stopped process) says the lease lost before it renews: the
/// work cannot tell that it kept the key meanwhile.
fn keep_alive<B, R>(
    backend: &B,
    holding: &mut Holding<B>,
    work: impl FnOnce(&KeepAlive) -> R,
) -> (R, Result<(), Error>)
where
    B: Backend + Sync,
    B::Hold: Send,
{
    let exptime_ns = holding.lease_ns;
    if let Err(e) = holding.ours(backend) {
        return (work(&KeepAlive::default()), Err(e));
    }
    if exptime_ns == 0 {
        // never expires: nothing to renew, but it may have been broken meanwhile; or it
        // ends at the backend's longest hold, when the work is told
        let status = KeepAlive::default();
        let capped = backend.lease_ns(&holding.hold, 0);
        if capped != 0 {
            status.renewed(Instant::now(), capped);
        }
        let value = work(&status);
        return (value, closing_look(backend, &holding.hold));
    }
    let every = Duration::from_nanos(exptime_ns / 3);
    let status = KeepAlive::default();
    // The first renewal, before the work starts: from its answer, `is_lost` knows when the
    // lease could lapse. A lease found lost is lost for the work from its start; one that
    // could not be renewed (the server unreachable), too: nothing vouches for it.
    let sent = Instant::now();
    let lease = backend.lease_ns(&holding.hold, exptime_ns);
    match backend.extend(&mut holding.hold, exptime_ns) {
        Ok(()) => status.renewed(sent, lease),
        Err(e @ (Error::Expired | Error::MaxHoldReached | Error::NotOwner)) => {
            status.lost.store(true, Ordering::Release);
            return (work(&status), Err(e));
        }
        Err(_) => status.lost.store(true, Ordering::Release),
    }
    let done = (Mutex::new(false), Condvar::new());
    let hold = &mut holding.hold;
    let renew = || {
        let (stop, wake) = (&done.0, &done.1);
        let mut sent = sent;
        loop {
            // (every third of a lease from the last send, not from its answer: a slow
            // answer does not push the next renewal back)
            let next = every.saturating_sub(sent.elapsed());
            // Not held while renewing: when renewals take a third of a lease or more, the
            // wait's timeout is zero, and a wait of zero returns without letting the lock
            // go, so `stop` would never get it (and the renewals would go on for good).
            let stopped = wake
                .wait_timeout_while(
                    stop.lock().unwrap_or_else(|e| e.into_inner()),
                    next,
                    |stop| !*stop,
                )
                .unwrap_or_else(|e| e.into_inner())
                .0;
            if *stopped {
                return Ok(());
            }
            drop(stopped);
            // (past the stop point: `is_lost` turns true now, whatever this renewal says)
            let _ = status.is_lost();
            sent = Instant::now();
            let lease = backend.lease_ns(hold, exptime_ns);
            match backend.extend(hold, exptime_ns) {
                Ok(()) => status.renewed(sent, lease),
                // (NotOwner: this is a child that a signal handler forked on this thread,
                // and the hold is its parent's, to leave alone; the thread ends, and with
                // it the child)
                Err(e @ (Error::Expired | Error::MaxHoldReached | Error::NotOwner)) => {
                    status.lost.store(true, Ordering::Release);
                    return Err(e);
                }
                // Unreachable for now: try again next time; if the lease lapses
                // meanwhile, that renewal says Expired.
                Err(_) => {}
            }
        }
    };
    // Not a scoped thread: a child forked inside `work` has no renewer, and a scope would
    // wait for it at its end for good. The guard stops and joins it on every way out of
    // here in this process (a panic of `work` too); a forked child leaves it alone.
    // (the guard first, so that nothing stands between the spawn and its guard)
    let mut renewer = Renewer {
        thread: None,
        done: &done,
        process: process::token(),
    };
    // SAFETY: `renew` borrows `done`, `status`, `backend` and the hold, all of which outlive
    // `renewer`, whose drop joins the thread before any of them goes (in this process: in
    // a forked child the thread does not exist, so nothing runs on them).
    let thread = unsafe { std::thread::Builder::new().spawn_unchecked(renew) };
    renewer.thread = Some(thread.expect("failed to spawn the lease renewer"));
    let value = work(&status);
    let Some(lease) = renewer.stop() else {
        // a child forked by `work`: the hold, and its renewer, are the parent's
        return (value, Err(Error::NotOwner));
    };
    drop(renewer);
    // `Ok` says the lease held until the work was done: the hold must still be ours now.
    let lease = lease.and_then(|()| closing_look(backend, &holding.hold));
    if lease.is_err() {
        status.lost.store(true, Ordering::Release);
    }
    (value, lease)
}

/// [`keep_alive`]'s look at the hold once the work is done. A lease that ran out at the
/// backend's longest hold is said as a renewal refused there says it (`MaxHoldReached`),
/// whether the work ended before that renewal or the hold had no lease of its own.
fn closing_look<B: Backend>(backend: &B, hold: &B::Hold) -> Result<(), Error> {
    match backend.check(hold) {
        Err(Error::Expired) if backend.past_longest_hold(hold) => Err(Error::MaxHoldReached),
        other => other,
    }
}

/// The thread that renews a lease while [`keep_alive`]'s work runs: stopped and joined
/// when dropped, by the process that started it only.
struct Renewer<'a> {
    thread: Option<std::thread::JoinHandle<Result<(), Error>>>,
    done: &'a (Mutex<bool>, Condvar),
    process: u64,
}

impl Renewer<'_> {
    /// Stops the renewals: how the lease went, or `None` in a process forked since (which
    /// has no renewer to stop, and must not touch its parent's mutex, which the renewer
    /// may have held at the fork).
    fn stop(&mut self) -> Option<Result<(), Error>> {
        let thread = self.thread.take()?;
        if process::token() != self.process {
            std::mem::forget(thread); // the parent's thread: nothing here to join or detach
            return None;
        }
        *self.done.0.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.done.1.notify_all();
        Some(thread.join().unwrap_or(Err(Error::Expired)))
    }
}

impl Drop for Renewer<'_> {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// `try_lock` of any backend: one attempt for a guard, `Ok(None)` if the key is held.
#[inline]
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
    let resolved = opts.resolve()?;
    // The guard is built in place in the `Some`: mapping `guard`'s `Ok` into one moved it
    // through memory in 16-byte loads of 8-byte stores, a store-forwarding stall the
    // caller paid on every success.
    let (hold, elapsed) = match backend.acquire_fast(key, resolved.exptime_ns)? {
        Ok(hold) => (hold, Duration::ZERO),
        Err(first) => match acquire_slow(backend, key, &resolved, None, first, true) {
            Ok(taken) => taken,
            Err(Error::Timeout { .. }) => return Ok(None),
            Err(e) => return Err(e),
        },
    };
    Ok(Some(LockGuard::new(
        backend,
        hold,
        elapsed,
        resolved.exptime_ns,
    )))
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
        Ok(hold) => (hold, Duration::ZERO),
        Err(first) => acquire_slow(backend, key, &resolved, timeout, first, true)?,
    };
    Ok(LockGuard::new(backend, hold, elapsed, resolved.exptime_ns))
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
/// assert!(matches!(rival.lock("key1"), Err(Error::Timeout { .. })));
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
    holding: Option<Holding<B>>,
    /// Whether its waits go to the backend's counters (see `uncounted`).
    counted: bool,
}

impl<B: Backend> std::fmt::Debug for Lock<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("timeout", &self.timeout)
            .field("locked", &self.holding.is_some())
            .finish_non_exhaustive()
    }
}

impl<'b, B: Backend> Lock<'b, B> {
    /// A lock object on `backend`. Fails with [`Error::InvalidOptions`] on nonsense options.
    /// Options may be given by value or by reference, as to [`LockTable::lock`](crate::LockTable::lock).
    pub fn new(backend: &'b B, opts: impl Borrow<LockOptions>) -> Result<Lock<'b, B>, Error> {
        let opts = opts.borrow();
        Ok(Lock {
            backend,
            opts: opts.resolve()?,
            timeout: opts.timeout,
            holding: None,
            counted: true,
        })
    }

    /// A lock whose waits are left out of the backend's counters (contended acquisitions,
    /// timeouts, wait times): for a caller that waits in slices and counts its whole wait
    /// itself (`Backend::waited`), as the command's `run` does. Its acquisitions are
    /// counted as any.
    #[doc(hidden)]
    pub fn uncounted(mut self) -> Self {
        self.counted = false;
        self
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
        let first = match self.backend.acquire_fast(key, self.opts.exptime_ns)? {
            Ok(hold) => {
                self.holding = Some(Holding::new(hold, self.opts.exptime_ns));
                return Ok(Duration::ZERO);
            }
            Err(first) => first,
        };
        let (hold, elapsed) = acquire_slow(
            self.backend,
            key,
            &self.opts,
            Some(timeout),
            first,
            self.counted,
        )?;
        self.holding = Some(Holding::new(hold, self.opts.exptime_ns));
        Ok(elapsed)
    }

    /// Releases the key. [`Error::Unlocked`] if none is held; [`Error::Expired`] if the
    /// lease ran out and someone else took the key (their hold is left alone).
    pub fn unlock(&mut self) -> Result<(), Error> {
        // Released in place and cleared after: moving the holding out first would reload it
        // in 16-byte pieces just written in 8-byte ones (a store-forwarding stall).
        // Not `ok_or(Error::Unlocked)`: that builds (and drops) an error on every unlock.
        let Some(holding) = self.holding.as_ref() else {
            return Err(Error::Unlocked);
        };
        let result = release(self.backend, holding);
        self.holding = None;
        result
    }

    /// Renews the lease: `None` for the object's exptime, `Some(ttl)` for another length
    /// (zero: never expires), which [`keep_alive`](Lock::keep_alive) then renews.
    /// [`Error::Expired`] if the lease already ran out; the object then holds nothing.
    pub fn expire(&mut self, ttl: Option<Duration>) -> Result<(), Error> {
        let holding = self.holding.as_mut().ok_or(Error::Unlocked)?;
        let result = extend(self.backend, holding, self.opts.exptime_ns, ttl);
        if matches!(result, Err(Error::Expired)) {
            self.holding = None;
        }
        result
    }

    /// The fencing token of the current hold: larger than any token handed to an earlier
    /// holder of the key. `None` if nothing is held or the hold is no longer valid: every
    /// call looks at the hold (see [`check`](Lock::check)), so a holder whose lease ran out
    /// gets `None`, even after it had a token.
    pub fn token(&self) -> Option<u64> {
        token(self.backend, self.holding.as_ref()?)
    }

    /// [`token`](Lock::token), saying why there is none: [`Error::Unlocked`] if nothing is
    /// held, [`Error::Expired`] if the lease was lost or ran out, or the backend's error (for Redis
    /// with replicas required, [`Error::NotReplicated`]: the token was not handed out).
    pub fn try_token(&self) -> Result<u64, Error> {
        try_token(self.backend, self.holding.as_ref().ok_or(Error::Unlocked)?)
    }

    /// Stops holding the key without unlocking it: it stays taken until its lease runs out
    /// (see [`LockGuard::leave_to_expire`]). Returns the fencing token of the hold;
    /// [`Error::Unlocked`] if nothing is held; [`Error::NotOwner`] in a process forked
    /// from the holder (the hold is the parent's, left alone; this object still names it,
    /// as after [`expire`](Lock::expire)'s refusal).
    pub fn leave_to_expire(&mut self) -> Result<Option<u64>, Error> {
        self.holding
            .as_ref()
            .ok_or(Error::Unlocked)?
            .ours(self.backend)?;
        let holding = self.holding.take().ok_or(Error::Unlocked)?;
        Ok(leave(self.backend, &holding))
    }

    /// Renews the lease, then runs `work` while a background thread renews it every third
    /// of its length, so a long job keeps the lock however long it runs (and a crashed one
    /// loses it within a lease). The length is the exptime, or the one the last
    /// [`expire`](Lock::expire) asked for (a hold made never to expire is not renewed).
    /// Returns the work's result and `Ok` only if the hold was still this object's, its
    /// lease unbroken, when the work returned (it is looked at then); [`Error::Expired`]
    /// if a renewal or that last look found it lost (the work can watch
    /// [`KeepAlive::is_lost`] to stop early: it also turns true when no renewal has
    /// answered for nearly a lease), and the object then holds nothing;
    /// [`Error::MaxHoldReached`] if the hold was kept as long as its handle allows
    /// (Redis's `with_max_hold`), whether a renewal was refused there or the lease the cap
    /// left ran out before that last look; or the backend's error if it could not tell.
    /// [`Error::Unlocked`] (and no run of `work`) if nothing is held.
    pub fn keep_alive<R>(
        &mut self,
        work: impl FnOnce(&KeepAlive) -> R,
    ) -> Result<(R, Result<(), Error>), Error>
    where
        B: Sync,
        B::Hold: Send,
    {
        let holding = self.holding.as_mut().ok_or(Error::Unlocked)?;
        let (value, lease) = keep_alive(self.backend, holding, work);
        if matches!(lease, Err(Error::Expired)) {
            self.holding = None;
        }
        Ok((value, lease))
    }

    /// Whether the hold is still this object's and its lease has not run out, asked of the
    /// backend now (not remembered): `Ok`, [`Error::Expired`] if it was lost (taken over,
    /// broken, or its lease ran out), [`Error::Unlocked`] if nothing is held, or the
    /// backend's own error. A hold that was lost stays this object's until `unlock`.
    pub fn check(&self) -> Result<(), Error> {
        check(self.backend, self.holding.as_ref().ok_or(Error::Unlocked)?)
    }

    /// Whether this object holds a key, as far as it knows (no look at the backend: see
    /// [`check`](Lock::check)).
    pub fn is_locked(&self) -> bool {
        self.holding.is_some()
    }
}

impl<B: Backend> Drop for Lock<'_, B> {
    fn drop(&mut self) {
        if let Some(holding) = &self.holding {
            release_on_drop(self.backend, holding);
        }
    }
}

/// A held key, released when dropped (unless this is a copy in a forked child).
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct LockGuard<'b, B: Backend = LockTable> {
    backend: &'b B,
    /// Taken out exactly once: by `unlock`, `leave_to_expire` or `Drop`.
    holding: ManuallyDrop<Holding<B>>,
    elapsed: Duration,
    exptime_ns: u64,
}

impl<'b, B: Backend> LockGuard<'b, B> {
    #[inline]
    pub(crate) fn new(backend: &'b B, hold: B::Hold, elapsed: Duration, exptime_ns: u64) -> Self {
        LockGuard {
            backend,
            holding: ManuallyDrop::new(Holding::new(hold, exptime_ns)),
            elapsed,
            exptime_ns,
        }
    }

    /// The backend the hold is on.
    pub(crate) fn backend(&self) -> &'b B {
        self.backend
    }

    /// Takes the holding out of a guard that will not be dropped.
    fn into_holding(self) -> (&'b B, Holding<B>) {
        let mut this = ManuallyDrop::new(self);
        // SAFETY: `this` is never used again and its Drop does not run, so the holding is
        // taken out exactly once.
        let holding = unsafe { ManuallyDrop::take(&mut this.holding) };
        (this.backend, holding)
    }

    /// How long the acquisition waited (see [`Lock::lock`]).
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// The fencing token of this hold (see [`Lock::token`]).
    pub fn token(&self) -> Option<u64> {
        token(self.backend, &self.holding)
    }

    /// The fencing token of this hold, saying why there is none (see [`Lock::try_token`]).
    pub fn try_token(&self) -> Result<u64, Error> {
        try_token(self.backend, &self.holding)
    }

    /// Whether the hold is still this guard's and its lease has not run out, asked of the
    /// backend now (see [`Lock::check`]).
    pub fn check(&self) -> Result<(), Error> {
        check(self.backend, &self.holding)
    }

    /// Renews the lease (see [`Lock::expire`]).
    pub fn expire(&mut self, ttl: Option<Duration>) -> Result<(), Error> {
        extend(self.backend, &mut self.holding, self.exptime_ns, ttl)
    }

    /// Runs `work` while a background thread renews the lease every third of its length
    /// (the exptime, or the one the last [`expire`](LockGuard::expire) gave; see
    /// [`Lock::keep_alive`]): the work's result, and whether the lease held throughout.
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("shmlock-doc-keep-{}", std::process::id()));
    /// # let _ = std::fs::remove_file(&path);
    /// use shmlock::{LockOptions, LockTable};
    /// use std::time::Duration;
    ///
    /// let table = LockTable::open(&path, 64)?;
    /// let opts = LockOptions { exptime: Duration::from_millis(100), ..LockOptions::default() };
    /// let mut guard = table.lock("report", &opts)?;
    /// let (rows, lease) = guard.keep_alive(|alive| {
    ///     std::thread::sleep(Duration::from_millis(250)); // longer than the lease
    ///     assert!(!alive.is_lost());
    ///     42
    /// });
    /// assert_eq!(rows, 42);
    /// assert!(lease.is_ok()); // renewed all along
    /// guard.unlock()?;
    /// # std::fs::remove_file(&path).unwrap();
    /// # Ok::<(), shmlock::Error>(())
    /// ```
    pub fn keep_alive<R>(&mut self, work: impl FnOnce(&KeepAlive) -> R) -> (R, Result<(), Error>)
    where
        B: Sync,
        B::Hold: Send,
    {
        keep_alive(self.backend, &mut self.holding, work)
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
    /// if let Some(lease) = table.try_lock_with_lease("cron:2026-11-21T20:46", Duration::from_secs(60))? {
    ///     let _token = lease.leave_to_expire();
    ///     // ... do this minute's work ...
    /// }
    /// assert!(table.try_lock_with_lease("cron:2026-11-21T20:46", Duration::from_secs(60))?.is_none());
    /// # std::fs::remove_file(&path).unwrap();
    /// # Ok::<(), shmlock::Error>(())
    /// ```
    pub fn leave_to_expire(self) -> Option<u64> {
        let (backend, holding) = self.into_holding();
        leave(backend, &holding)
    }

    /// Releases the key now and reports whether the hold was still ours.
    pub fn unlock(self) -> Result<(), Error> {
        let (backend, holding) = self.into_holding();
        release(backend, &holding)
    }

    /// The same hold as a guard of another view of the backend, after `change` made it
    /// what that view holds (a downgrade). If `change` fails the hold is released.
    pub(crate) fn rebind<C: Backend<Hold = B::Hold>>(
        self,
        to: &'b C,
        change: impl FnOnce(&B, &mut B::Hold) -> Result<(), Error>,
    ) -> Result<LockGuard<'b, C>, Error> {
        let (elapsed, exptime_ns) = (self.elapsed, self.exptime_ns);
        let (backend, mut holding) = self.into_holding();
        holding.ours(backend)?;
        if let Err(e) = change(backend, &mut holding.hold) {
            // Not ours after all (a child forked by a signal handler since the look
            // above, which `change` looks again for): the parent's, to leave alone.
            if !matches!(e, Error::NotOwner) {
                backend.release_on_drop(&holding.hold);
            }
            return Err(e);
        }
        Ok(LockGuard {
            backend: to,
            holding: ManuallyDrop::new(Holding::new(holding.hold, holding.lease_ns)),
            elapsed,
            exptime_ns,
        })
    }
}

impl<B: Backend> Drop for LockGuard<'_, B> {
    #[inline]
    fn drop(&mut self) {
        // Released in place (moving the holding out would reload it in pieces just written).
        release_on_drop(self.backend, &self.holding);
        // SAFETY: Drop runs once, the other takers of the holding consume the guard without
        // running Drop, and the holding is not touched after this.
        unsafe { ManuallyDrop::drop(&mut self.holding) };
    }
}

impl<B: Backend> std::fmt::Debug for LockGuard<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("elapsed", &self.elapsed)
            .finish()
    }
}
