//! Lock options, with resty.lock's names and defaults.

use std::time::Duration;

use crate::error::Error;

/// How long a lock lives and how its waiters back off.
///
/// The defaults are lua-resty-lock's: `exptime` 30 s, `timeout` 5 s, `step` 1 ms, `ratio` 2,
/// `max_step` 500 ms.
///
/// ```
/// use shmlock::LockOptions;
/// use std::time::Duration;
///
/// let opts = LockOptions { timeout: Duration::from_millis(10), ..LockOptions::default() };
/// assert_eq!(opts.exptime, Duration::from_secs(30));
///
/// // Seconds as floats, the way resty takes them, are checked for sense:
/// assert!(LockOptions::from_secs(30.0, f64::NAN, 0.001, 2.0, 0.5).is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LockOptions {
    /// Lease length: a holder that neither unlocks nor renews loses the lock after this
    /// long. Zero means the lock never expires.
    pub exptime: Duration,
    /// How long [`Lock::lock`](crate::Lock::lock) waits for a held key. Zero tries once.
    /// Capped at `exptime` when `exptime` is not zero.
    pub timeout: Duration,
    /// The first sleep of a waiter. Capped at `timeout`.
    pub step: Duration,
    /// Each later sleep is the previous one times `ratio` (at least 1 ms)...
    pub ratio: f64,
    /// ...but never more than `max_step`, nor more than the time left.
    pub max_step: Duration,
    /// Sleep on a futex that the unlocker wakes, instead of only polling: a waiter gets a
    /// freed key in microseconds, not at the end of its current step. The schedule above
    /// still bounds each sleep and the whole wait, and `elapsed` becomes the time actually
    /// waited. A step's sleep then only bounds how soon a dead holder is noticed, and may
    /// end up to 4 ms late (on a tick of the coarse clock, which makes an early wake
    /// cheaper); no sleep runs past the timeout, nor past the holder's lease end by more
    /// than the clock's tick (4 ms) as the coarse clock counts it (that clock runs some
    /// ms behind `CLOCK_MONOTONIC`: a 50 ms lease was taken 47.7-57.6 ms after it began).
    /// `false` reproduces resty's pure polling exactly (elapsed = sum of the steps).
    /// Default: `true` where futexes exist (Linux).
    pub notify: bool,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            exptime: Duration::from_secs(30),
            timeout: Duration::from_secs(5),
            step: Duration::from_millis(1),
            ratio: 2.0,
            max_step: Duration::from_millis(500),
            notify: cfg!(target_os = "linux"),
        }
    }
}

impl LockOptions {
    /// Options from seconds as `f64`, as resty.lock takes them; rejects negative, NaN and
    /// infinite values and everything [`Lock::new`](crate::Lock::new) would reject.
    pub fn from_secs(
        exptime: f64,
        timeout: f64,
        step: f64,
        ratio: f64,
        max_step: f64,
    ) -> Result<LockOptions, Error> {
        let secs =
            |v: f64, what| Duration::try_from_secs_f64(v).map_err(|_| Error::InvalidOptions(what));
        let opts = LockOptions {
            exptime: secs(exptime, "exptime must be a finite number of seconds >= 0")?,
            timeout: secs(timeout, "timeout must be a finite number of seconds >= 0")?,
            step: secs(step, "step must be a finite number of seconds > 0")?,
            ratio,
            max_step: secs(max_step, "max_step must be a finite number of seconds > 0")?,
            ..LockOptions::default()
        };
        opts.resolve()?;
        Ok(opts)
    }

    /// Checks the options and applies resty's caps.
    pub(crate) fn resolve(&self) -> Result<Resolved, Error> {
        if !self.ratio.is_finite() || self.ratio < 1.0 {
            return Err(Error::InvalidOptions("ratio must be a finite number >= 1"));
        }
        if self.step.is_zero() {
            return Err(Error::InvalidOptions("step must be > 0"));
        }
        if self.max_step.is_zero() {
            return Err(Error::InvalidOptions("max_step must be > 0"));
        }
        let exptime_ns = u64::try_from(self.exptime.as_nanos())
            .map_err(|_| Error::InvalidOptions("exptime must be below 584 years"))?;
        Ok(Resolved {
            exptime_ns,
            step: self.step,
            ratio: self.ratio,
            max_step: self.max_step,
            notify: self.notify,
        })
    }
}

/// Options that passed validation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Resolved {
    pub exptime_ns: u64,
    pub step: Duration,
    pub ratio: f64,
    pub max_step: Duration,
    pub notify: bool,
}

impl Resolved {
    /// The wait budget for one `lock` call with `timeout`, capped at the lease length.
    pub(crate) fn timeout_for(&self, timeout: Duration) -> Duration {
        if self.exptime_ns == 0 {
            timeout
        } else {
            timeout.min(Duration::from_nanos(self.exptime_ns))
        }
    }
}
