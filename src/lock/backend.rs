//! Where locks live, and the one waiting loop every backend shares.
//!
//! A [`Backend`] knows how to try a key once, release, renew and fence a hold, and how to
//! sleep on a busy key (woken early where it can). [`Lock`](crate::Lock),
//! [`LockGuard`](crate::LockGuard), resty's step/ratio schedule and the elapsed-time
//! accounting are written once on top of it.

use std::time::{Duration, Instant};

use crossbeam_utils::Backoff;

use crate::error::Error;
use crate::lock::options::Resolved;
use crate::lock::slack::{TimerSlack, STEP_SLACK};
use crate::lock::wait::{instant_after, Schedule};

/// Rounds of exponential spinning (crossbeam's `Backoff::spin`) before a waiter sleeps:
/// about 1 µs in all. Spinning longer, or yielding, only steals the cache line from a
/// holder that is about to release it.
const SPINS: u32 = 6;

/// How far past its timeout by the wall clock a polling wait (resty's, which counts only its
/// steps) may sleep: an attempt's worth.
const POLL_GRACE: Duration = Duration::from_millis(100);

/// A polling wait's next step, cut so that it ends by the wall clock no later than
/// [`POLL_GRACE`] past the timeout (the attempt after it is bounded by its backend); `None`
/// once that is past. Where attempts take no time (the table) the steps' sum reaches the
/// timeout first, and no step is cut.
fn poll_step(step: Duration, started: Instant, budget: Duration) -> Option<Duration> {
    let left = (budget + POLL_GRACE).checked_sub(started.elapsed())?;
    (!left.is_zero()).then(|| step.min(left))
}

mod sealed {
    pub trait Sealed {}
}

pub(crate) use sealed::Sealed;

/// A place where named locks live: the shared-memory [`LockTable`](crate::LockTable) (and,
/// with the `redis` feature, a Redis server). Sealed: the methods are the crate's plumbing.
pub trait Backend: Sealed {
    /// One hold: what releasing, renewing and fencing it need.
    #[doc(hidden)]
    type Hold;
    /// What an attempt that found the key held learned about the holder.
    #[doc(hidden)]
    type Busy;

    /// Whether a hold is the calling process's: one a forked child inherited (or came out
    /// with, forked by a signal handler in the middle of its parent's acquisition) is its
    /// parent's, and the child must neither release nor renew it.
    #[doc(hidden)]
    fn is_ours(&self, hold: &Self::Hold) -> bool;

    /// The first attempt, its common case inlined into `lock`. `Ok(Err(Some(busy)))`: the
    /// attempt was made and found the key held; `Ok(Err(None))`: nothing was settled here,
    /// go on with [`try_acquire`](Self::try_acquire).
    #[doc(hidden)]
    #[allow(clippy::type_complexity)]
    fn acquire_fast(
        &self,
        key: &[u8],
        exptime_ns: u64,
    ) -> Result<Result<Self::Hold, Option<Self::Busy>>, Error>;

    /// One attempt to take `key` for `exptime_ns` (0: never expires), without waiting;
    /// a backend that waits for a server answers by `deadline` (that of the wait, if any).
    #[doc(hidden)]
    fn try_acquire(
        &self,
        key: &[u8],
        exptime_ns: u64,
        deadline: Option<Instant>,
    ) -> Result<Result<Self::Hold, Self::Busy>, Error>;

    /// Whether a hold keeps every other holder of its key out: false for a view of
    /// readers or a semaphore of several permits (`get_or_fetch` refuses those).
    #[doc(hidden)]
    fn exclusive(&self) -> bool {
        true
    }

    /// Releases a hold; [`Error::Expired`] if it was lost meanwhile.
    #[doc(hidden)]
    fn release(&self, hold: &Self::Hold) -> Result<(), Error>;

    /// Releases a hold whose guard or lock object is being dropped, where nobody can be
    /// told the outcome. A backend whose release is a network call inside an async runtime
    /// hands it to a blocking task instead of stalling the executor.
    #[doc(hidden)]
    fn release_on_drop(&self, hold: &Self::Hold) {
        let _ = self.release(hold);
    }

    /// Moves the deadline of a hold to now + `exptime_ns` (0: never).
    #[doc(hidden)]
    fn extend(&self, hold: &mut Self::Hold, exptime_ns: u64) -> Result<(), Error>;

    /// The lease an [`extend`](Self::extend) sent now would set at least, in ns by this
    /// process's precise clock (0: none, the hold never expires): `exptime_ns`, or less
    /// where the backend caps holds (Redis's `with_max_hold`) or counts leases on a clock
    /// that may lag (the table's coarse clock).
    #[doc(hidden)]
    fn lease_ns(&self, hold: &Self::Hold, exptime_ns: u64) -> u64 {
        let _ = hold;
        exptime_ns
    }

    /// Whether the hold has been kept as long as the backend lets a hold be renewed
    /// (Redis's `with_max_hold`): a lease found run out then ran out at that cap.
    #[doc(hidden)]
    fn past_longest_hold(&self, hold: &Self::Hold) -> bool {
        let _ = hold;
        false
    }

    /// The fencing token of a hold; `None` if it is no longer valid (see
    /// [`check`](Self::check)), whatever it was before.
    #[doc(hidden)]
    fn token(&self, hold: &Self::Hold) -> Option<u64>;

    /// `Ok` if the hold is still ours and its lease has not run out, looked at now;
    /// [`Error::Expired`] otherwise (or the backend's own error).
    #[doc(hidden)]
    fn check(&self, hold: &Self::Hold) -> Result<(), Error>;

    /// The hold is left to run out its lease: whatever it needs must outlive its guard.
    #[doc(hidden)]
    fn leave(&self, hold: &Self::Hold) {
        let _ = hold;
    }

    /// The fencing token of a hold, or why there is none: [`Error::Expired`] if the hold
    /// was lost, or the backend's own error (a Redis backend that cannot reach its server
    /// or its replicas).
    #[doc(hidden)]
    fn try_token(&self, hold: &Self::Hold) -> Result<u64, Error> {
        self.token(hold).ok_or(Error::Expired)
    }

    /// Whether a short spin before sleeping can pay off (a local backend).
    #[doc(hidden)]
    fn spins(&self) -> bool;

    /// Whether the key `busy` saw held may be free now: a read, no write, cheap enough to
    /// spin on without taking the line from the holder.
    #[doc(hidden)]
    fn moved_on(&self, busy: &Self::Busy) -> bool {
        let _ = busy;
        true
    }

    /// Whether waiters can be woken early (else `notify` falls back to polling).
    #[doc(hidden)]
    fn can_notify(&self) -> bool;

    /// Checks whether the holder is gone for good (a dead process); `true`: retry now.
    #[doc(hidden)]
    fn reap(&self, busy: &Self::Busy) -> bool;

    /// Notes how an acquisition that found the key busy ended, for the backend's counters:
    /// `took` the key (a contended acquisition) or timed out, after `waited`.
    #[doc(hidden)]
    fn waited(&self, took: bool, waited: Duration) {
        let _ = (took, waited);
    }

    /// The error of a wait that ran out while `busy` was the last thing it saw: a
    /// [`Timeout`](Error::Timeout), or what kept the backend from answering at all.
    #[doc(hidden)]
    fn gave_up(&self, busy: Self::Busy, key: &[u8], waited: Duration) -> Error {
        let _ = busy;
        Error::timeout(key, waited, None)
    }

    /// Sleeps at most `step` for the holder of `busy` to let go, waking early where the
    /// backend can. Returns the time slept (zero: retry at once) and whether the key moved
    /// on meanwhile (a wake-up, or a change seen before sleeping), which makes a look at the
    /// holder's liveness pointless. The sleep may end up to `late` past `step` (the caller's
    /// deadline allows it); `slack` holds the thread's timer slack to a tick meanwhile.
    #[doc(hidden)]
    fn sleep(
        &self,
        busy: &Self::Busy,
        step: Duration,
        late: Duration,
        slack: &mut TimerSlack,
    ) -> (Duration, bool);
}

/// The [`Backend`] methods of a view of another backend (its read locks, a semaphore):
/// everything but the attempts (`acquire_fast`, `try_acquire`), which the view makes in its
/// own mode, is the backend's own. `self.$to()` is the backend.
#[cfg_attr(loom, allow(unused_macros))]
macro_rules! delegate_backend {
    ($to:ident, $hold:ty, $busy:ty) => {
        #[inline(always)]
        fn release(&self, hold: &$hold) -> Result<(), Error> {
            Backend::release(self.$to(), hold)
        }

        #[inline(always)]
        fn release_on_drop(&self, hold: &$hold) {
            Backend::release_on_drop(self.$to(), hold)
        }

        delegate_backend!($to, $hold, $busy, but_release);
    };
    // All but the release, which the caller writes.
    ($to:ident, $hold:ty, $busy:ty, but_release) => {
        fn extend(&self, hold: &mut $hold, exptime_ns: u64) -> Result<(), Error> {
            Backend::extend(self.$to(), hold, exptime_ns)
        }

        fn lease_ns(&self, hold: &$hold, exptime_ns: u64) -> u64 {
            Backend::lease_ns(self.$to(), hold, exptime_ns)
        }

        fn past_longest_hold(&self, hold: &$hold) -> bool {
            Backend::past_longest_hold(self.$to(), hold)
        }

        fn token(&self, hold: &$hold) -> Option<u64> {
            Backend::token(self.$to(), hold)
        }

        fn try_token(&self, hold: &$hold) -> Result<u64, Error> {
            Backend::try_token(self.$to(), hold)
        }

        fn check(&self, hold: &$hold) -> Result<(), Error> {
            Backend::check(self.$to(), hold)
        }

        fn leave(&self, hold: &$hold) {
            Backend::leave(self.$to(), hold)
        }

        fn spins(&self) -> bool {
            Backend::spins(self.$to())
        }

        fn moved_on(&self, busy: &$busy) -> bool {
            Backend::moved_on(self.$to(), busy)
        }

        fn can_notify(&self) -> bool {
            Backend::can_notify(self.$to())
        }

        fn reap(&self, busy: &$busy) -> bool {
            Backend::reap(self.$to(), busy)
        }

        fn waited(&self, took: bool, waited: Duration) {
            Backend::waited(self.$to(), took, waited)
        }

        fn gave_up(&self, busy: $busy, key: &[u8], waited: Duration) -> Error {
            Backend::gave_up(self.$to(), busy, key, waited)
        }

        fn sleep(
            &self,
            busy: &$busy,
            step: Duration,
            late: Duration,
            slack: &mut crate::lock::slack::TimerSlack,
        ) -> (Duration, bool) {
            Backend::sleep(self.$to(), busy, step, late, slack)
        }
    };
}
#[cfg_attr(loom, allow(unused_imports))]
pub(crate) use delegate_backend;

/// Tells `backend` how an acquisition that went past the fast path ended (a wait that took
/// the key, or ran out), for its counters.
#[inline]
pub(crate) fn note_wait<B: Backend, H>(
    backend: &B,
    r: &Result<(H, Duration), Error>,
    started: Instant,
) {
    match r {
        Ok((_, elapsed)) if !elapsed.is_zero() => backend.waited(true, started.elapsed()),
        Err(Error::Timeout { .. }) => backend.waited(false, started.elapsed()),
        _ => {}
    }
}

/// Everything but the fast path: one attempt (unless `first` says how the first went),
/// then resty's schedule of sleeps, plain
/// (`notify: false`: elapsed = sum of the steps) or woken by whoever frees the key
/// (elapsed = time actually waited). `timeout: None` tries once.
#[cold]
#[inline(never)]
pub(crate) fn acquire_slow<B: Backend>(
    backend: &B,
    key: &[u8],
    opts: &Resolved,
    timeout: Option<Duration>,
    first: Option<B::Busy>,
    counted: bool,
) -> Result<(B::Hold, Duration), Error> {
    let started = Instant::now();
    let r = wait(backend, key, opts, timeout, first, started);
    if counted {
        note_wait(backend, &r, started);
    }
    r
}

/// [`acquire_slow`]'s attempts and sleeps.
fn wait<B: Backend>(
    backend: &B,
    key: &[u8],
    opts: &Resolved,
    timeout: Option<Duration>,
    first: Option<B::Busy>,
    started: Instant,
) -> Result<(B::Hold, Duration), Error> {
    let budget = opts.timeout_for(timeout.unwrap_or(Duration::ZERO));
    // Attempts that wait for a server are held to the wait's end (none: try once).
    let deadline = (!budget.is_zero()).then(|| instant_after(started, budget));
    let mut busy = match first {
        Some(busy) => busy,
        None => match backend.try_acquire(key, opts.exptime_ns, deadline)? {
            Ok(hold) => return Ok((hold, Duration::ZERO)),
            Err(busy) => busy,
        },
    };
    let mut schedule = Schedule::new(opts, timeout.unwrap_or(Duration::ZERO));
    let notify = opts.notify && backend.can_notify();
    let mut slack = TimerSlack::new(); // put back when this returns
    let mut slept = Duration::ZERO; // the sum of the steps, when polling
    let elapsed = |slept| if notify { started.elapsed() } else { slept };
    let attempt = |busy: &mut B::Busy| -> Result<Option<B::Hold>, Error> {
        match backend.try_acquire(key, opts.exptime_ns, deadline)? {
            Ok(hold) => Ok(Some(hold)),
            Err(b) => {
                *busy = b;
                Ok(None)
            }
        }
    };

    if notify && backend.spins() && timeout.is_some_and(|t| !t.is_zero()) {
        // Most critical sections end within microseconds.
        // Watch the holder's word without writing to it (a write would take the line
        // from a holder about to release); try only once the key has looked free twice,
        // a spin apart: a holder that releases in a loop takes the key straight back, and
        // a waiter that cuts in takes the line from it each time (owner changes cost most).
        let backoff = Backoff::new();
        for _ in 0..SPINS {
            backoff.spin();
            if backend.moved_on(&busy) && {
                backoff.spin();
                backend.moved_on(&busy)
            } {
                if let Some(hold) = attempt(&mut busy)? {
                    return Ok((hold, elapsed(slept)));
                }
            }
        }
    }
    // At most one retry without sleeping per step (after reaping a dead holder, or when the
    // holder changed while the backend got ready to sleep), so that no loop runs hot.
    let mut retried = false;
    // A holder is looked at for death before the first sleep and after each sleep nobody
    // cut short: a dead holder wakes nobody, while a wake means the key changed hands
    // (and the look would only take the line from the live holder).
    let mut look = true;
    loop {
        if look && !retried && backend.reap(&busy) {
            retried = true;
        } else {
            let Some(step) = schedule.next_sleep() else {
                return Err(backend.gave_up(busy, key, budget));
            };
            retried = false;
            if notify {
                // Waiting for real, the timeout is wall time: the looks and tries between
                // sleeps count too.
                let left = match budget.checked_sub(started.elapsed()) {
                    Some(left) if !left.is_zero() => left,
                    _ => return Err(backend.gave_up(busy, key, budget)),
                };
                let step = step.min(left);
                // A step may end a tick late (see `slack`), never past the deadline.
                let late = (left - step).min(STEP_SLACK);
                let (used, moved) = backend.sleep(&busy, step, late, &mut slack);
                schedule.refund(step.saturating_sub(used));
                retried = used.is_zero();
                look = !moved;
            } else {
                // resty's timeout counts the steps; a wait whose attempts are slow (a server
                // far away or stalled) ends all the same by the wall clock, an attempt's
                // worth past it
                let Some(step) = poll_step(step, started, budget) else {
                    return Err(backend.gave_up(busy, key, budget));
                };
                // resty's own step, as sharp as the thread's slack allows (up to a tick)
                slack.hold();
                std::thread::sleep(step);
                slept += step;
            }
        }
        if let Some(hold) = attempt(&mut busy)? {
            return Ok((hold, elapsed(slept)));
        }
    }
}

/// The async waiting loop, as [`acquire_slow`]'s: one attempt, then resty's schedule of
/// sleeps. With `notify`, each sleep is `sleep`'s (woken by whoever frees the key where the
/// backend can), the elapsed time is the time actually waited and the timeout is wall
/// time; the waiter's place in the key's queue, which its first sleep gives it, is handed
/// to each later sleep (so a waiter whose step ran out, or whose attempt after a wake-up
/// failed, keeps its turn) and left once the wait ends. Polling (`notify: false`) sleeps resty's steps with `tokio::time::sleep`,
/// elapsed = their sum. `attempt` makes one attempt without blocking the runtime,
/// answered by the deadline it is given (the wait's end; none: try once); `queued` says
/// whether other tasks of the process wait for the key already (then the waiter joins
/// them without a first attempt), and may give the waiter its place at once; `reap` checks a busy holder for death; `gave_up` makes the
/// error of a wait that ran out (see [`Backend::gave_up`]).
#[cfg(feature = "tokio")]
#[allow(clippy::too_many_arguments)]
pub(crate) async fn acquire_async<H, Busy, Fut, Sleep, G: Place>(
    key: &[u8],
    opts: &Resolved,
    timeout: Duration,
    queued: impl FnOnce() -> (Option<Busy>, Option<G>),
    mut attempt: impl FnMut(Option<Instant>) -> Fut,
    reap: impl Fn(&Busy) -> bool,
    mut sleep: impl FnMut(&Busy, Duration, Option<G>) -> Sleep,
    gave_up: impl FnOnce(Busy, &[u8], Duration) -> Error,
) -> Result<(H, Duration), Error>
where
    Fut: std::future::Future<Output = Result<Result<H, Busy>, Error>>,
    Sleep: std::future::Future<Output = Slept<G>>,
{
    // (refused whether or not the key is free: a wait would need the runtime's timers,
    // and a call that worked until its key was first contended would fail in production;
    // a task's id is read first, as it touches no line shared with other workers)
    if tokio::task::try_id().is_none() && tokio::runtime::Handle::try_current().is_err() {
        return Err(Error::NoRuntime);
    }
    let budget = opts.timeout_for(timeout);
    let started = Instant::now();
    let deadline = (!budget.is_zero()).then(|| instant_after(started, budget));
    let notify = opts.notify;
    let elapsed = |slept| if notify { started.elapsed() } else { slept };
    let mut schedule = Schedule::new(opts, timeout);
    let mut slept = Duration::ZERO;
    // Other tasks of this process already wait for the key (`queued`, with notify): no
    // first attempt, so as not to take the key from under them; the wait starts at the back
    // of their queue. A backend may give the waiter its place (the waiter's place in the
    // key's queue) before the first attempt, so that it keeps the order of asking.
    // (A try of zero timeout makes its one attempt whoever waits.)
    let (ahead, mut place) = if notify && !budget.is_zero() {
        queued()
    } else {
        (None, None)
    };
    let (mut busy, mut retried) = match ahead {
        Some(busy) => (busy, true),
        None => match attempt(deadline).await {
            Ok(Ok(hold)) => {
                if let Some(p) = place.take() {
                    p.attempted();
                }
                return Ok((hold, Duration::ZERO));
            }
            Ok(Err(busy)) => (busy, false),
            Err(e) => {
                if let Some(p) = place.take() {
                    p.attempted();
                }
                return Err(e);
            }
        },
    };
    // as in `acquire_slow`: at most one retry without sleeping per step, and a look at the
    // holder's liveness only after a sleep nobody cut short
    let mut look = true;
    let mut jitter = Jitter::new();
    loop {
        if look && !retried && reap(&busy) {
            retried = true;
        } else {
            let Some(step) = schedule.next_sleep() else {
                return Err(gave_up(busy, key, budget));
            };
            retried = false;
            if notify {
                let left = match budget.checked_sub(started.elapsed()) {
                    Some(left) if !left.is_zero() => left,
                    _ => return Err(gave_up(busy, key, budget)),
                };
                // tasks that started together do not all wake on one tick; the schedule
                // gets back all of its step that was not slept (the wall clock, not the
                // steps, ends a wait with notify)
                let charged = step;
                let step = jitter.shorten(step.min(left));
                let slept = sleep(&busy, step, place.take()).await;
                place = Some(slept.place);
                schedule.refund(charged.saturating_sub(slept.used));
                retried = slept.used.is_zero();
                look = !slept.moved;
                if !slept.attempt {
                    // behind others in the key's queue: their turn first (the first of
                    // them also looks at the holder's liveness)
                    retried = true;
                    continue;
                }
            } else {
                // as in `acquire_slow`'s polling
                let Some(step) = poll_step(step, started, budget) else {
                    return Err(gave_up(busy, key, budget));
                };
                tokio::time::sleep(step).await;
                slept += step;
            }
        }
        match attempt(deadline).await {
            Ok(Ok(hold)) => {
                if let Some(p) = place.take() {
                    p.attempted();
                }
                return Ok((hold, elapsed(slept)));
            }
            Ok(Err(b)) => busy = b,
            Err(e) => {
                if let Some(p) = place.take() {
                    p.attempted();
                }
                return Err(e);
            }
        }
    }
}

/// What an async waiter's sleep says: how long it slept, whether the key may be free
/// (woken), whether to try now (not when the step ran out while others of the process
/// were waiting for the key before this waiter: they try first), and its place.
#[cfg(feature = "tokio")]
pub(crate) struct Slept<G> {
    pub used: Duration,
    pub moved: bool,
    pub attempt: bool,
    pub place: G,
}

/// A waiter's place in a queue of waiters for one key, held from its first sleep to the end
/// of its wait: [`attempted`](Place::attempted) then; dropped without it (the waiting
/// future was cancelled), it may hand a wake-up it got on to the next waiter.
#[cfg(feature = "tokio")]
pub(crate) trait Place {
    fn attempted(self);
}

/// How long a waiter woken in its queue keeps its turn without making its attempt (its
/// future is not polled: kept in a `select!` busy elsewhere): past it, the next waiter's
/// turn comes, so that a key left free is not left to the timeouts of all behind it. Far
/// above a runtime's usual delay in polling a woken task.
#[cfg(feature = "tokio")]
pub(crate) const STUCK: Duration = Duration::from_millis(20);

/// An async task's place in a key's queue of waiters (both backends keep such queues).
#[cfg(feature = "tokio")]
pub(crate) struct Waiter {
    pub id: u64,
    pub waker: Option<std::task::Waker>,
    /// Told the key may be free (when): it is making its attempt.
    pub woken: Option<Instant>,
}

#[cfg(feature = "tokio")]
impl Waiter {
    pub fn woken(&self) -> bool {
        self.woken.is_some()
    }

    /// Woken so long ago that it is not being polled.
    pub fn stuck(&self, now: Instant) -> bool {
        self.woken.is_some_and(|t| now.duration_since(t) >= STUCK)
    }

    pub fn wake(&mut self, now: Instant) {
        self.woken = Some(now);
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }
}

#[cfg(feature = "tokio")]
impl<P: Place> Place for Option<P> {
    fn attempted(self) {
        if let Some(p) = self {
            p.attempted();
        }
    }
}

/// Shortens async sleeps by up to a quarter, at random, so that tasks that started
/// together and are not woken do not all wake on one timer tick.
#[cfg(feature = "tokio")]
struct Jitter(u64);

#[cfg(feature = "tokio")]
impl Jitter {
    fn new() -> Jitter {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0x9e37_79b9_7f4a_7c15);
        let clock = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos() as u64);
        Jitter((NEXT.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed) ^ clock) | 1)
    }

    fn shorten(&mut self, step: Duration) -> Duration {
        // xorshift64
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        let quarter = step / 4;
        let cut = quarter.mul_f64((self.0 >> 11) as f64 / (1u64 << 53) as f64);
        step - cut
    }
}

/// Whether `wake` finished before `timer`: polls both until one does.
#[cfg(feature = "tokio")]
pub(crate) async fn first_of(
    wake: &mut (impl std::future::Future<Output = ()> + Unpin),
    timer: impl std::future::Future<Output = ()>,
) -> bool {
    let mut timer = std::pin::pin!(timer);
    std::future::poll_fn(|cx| {
        if std::pin::Pin::new(&mut *wake).poll(cx).is_ready() {
            return std::task::Poll::Ready(true);
        }
        timer.as_mut().poll(cx).map(|()| false)
    })
    .await
}
