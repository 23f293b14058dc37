//! The waiting policy: resty.lock's step/ratio/max_step schedule.
//!
//! A waiter sleeps `step`, retries, and multiplies the step by `ratio` (at least 1 ms, at
//! most `max_step` and at most the time left) until the timeout is spent. Polling, the time
//! it reports is the sum of the steps, as resty reports it. With wake-ups, each step is the
//! longest it sleeps on the futex; a waiter woken early gets the unslept part of the step
//! back into its budget and reports the time it actually waited.

use std::time::{Duration, Instant};

use crate::lock::options::Resolved;

const MIN_STEP: Duration = Duration::from_millis(1);

/// A century: what a longer timeout or setting (`Duration::MAX` for "as long as it
/// takes") is taken as, where it must be added to a time or sent to a server.
pub(crate) const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `d` after `from`, or a century after it where `d` goes past what an `Instant` can
/// hold (`Duration::MAX` as a timeout means "wait as long as it takes", not a panic).
pub(crate) fn instant_after(from: Instant, d: Duration) -> Instant {
    from.checked_add(d)
        .or_else(|| from.checked_add(CENTURY))
        .unwrap_or(from)
}

/// The sleeps of one `lock` call.
#[derive(Clone, Debug)]
pub(crate) struct Schedule {
    step: Duration,
    ratio: f64,
    max_step: Duration,
    remaining: Duration,
}

impl Schedule {
    pub(crate) fn new(opts: &Resolved, timeout: Duration) -> Schedule {
        let remaining = opts.timeout_for(timeout);
        Schedule {
            step: opts.step.min(remaining),
            ratio: opts.ratio,
            max_step: opts.max_step,
            remaining,
        }
    }

    /// The next sleep, or `None` once the timeout is spent.
    pub(crate) fn next_sleep(&mut self) -> Option<Duration> {
        if self.remaining.is_zero() {
            return None;
        }
        let sleep = self.step.min(self.remaining);
        self.remaining -= sleep;
        let grown = Duration::try_from_secs_f64(sleep.as_secs_f64() * self.ratio)
            .unwrap_or(self.max_step)
            .max(MIN_STEP);
        self.step = grown.min(self.remaining).min(self.max_step);
        Some(sleep)
    }

    /// Gives back the part of the last sleep that was not slept (a waiter woken early):
    /// the steps go on while time is left (a waiter that sleeps for real bounds its wait
    /// by the clock, see `backend::acquire_slow`).
    pub(crate) fn refund(&mut self, unused: Duration) {
        self.remaining += unused;
        if self.step.is_zero() {
            self.step = unused.min(self.max_step);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::lock::options::LockOptions;

    fn steps(opts: LockOptions) -> Vec<u64> {
        let mut s = Schedule::new(&opts.resolve().unwrap(), opts.timeout);
        std::iter::from_fn(|| s.next_sleep())
            .map(|d| d.as_micros() as u64)
            .collect()
    }

    #[test]
    fn default_schedule_doubles_to_max_step_and_sums_to_timeout() {
        let s = steps(LockOptions::default());
        let ms: Vec<u64> = s.iter().map(|us| us / 1000).collect();
        assert_eq!(&ms[..10], &[1, 2, 4, 8, 16, 32, 64, 128, 256, 500]);
        assert!(ms[10..ms.len() - 1].iter().all(|&m| m == 500));
        assert_eq!(s.iter().sum::<u64>(), 5_000_000);
        // a lock freed after 100 ms is won after the 64 ms step, at 127 ms
        let mut sum = 0;
        let won = ms.iter().find(|&&m| {
            sum += m;
            sum >= 100
        });
        assert_eq!((won, sum), (Some(&64), 127));
    }

    #[test]
    fn short_timeout_caps_last_step() {
        let opts = LockOptions {
            timeout: Duration::from_millis(10),
            ..LockOptions::default()
        };
        assert_eq!(steps(opts), [1000, 2000, 4000, 3000]);
    }

    #[test]
    fn timeout_zero_never_sleeps_and_exptime_caps_timeout() {
        let zero = LockOptions {
            timeout: Duration::ZERO,
            ..LockOptions::default()
        };
        assert!(steps(zero).is_empty());
        let capped = LockOptions {
            exptime: Duration::from_millis(3),
            ..LockOptions::default()
        };
        assert_eq!(steps(capped), [1000, 2000]);
        let never = LockOptions {
            exptime: Duration::ZERO,
            timeout: Duration::from_millis(3),
            ..LockOptions::default()
        };
        assert_eq!(steps(never), [1000, 2000]);
    }

    #[test]
    fn refunds_keep_the_budget_in_time_actually_waited() {
        let opts = LockOptions {
            timeout: Duration::from_millis(10),
            ..LockOptions::default()
        };
        let mut s = Schedule::new(&opts.resolve().unwrap(), opts.timeout);
        assert_eq!(s.next_sleep(), Some(Duration::from_millis(1)));
        s.refund(Duration::from_micros(900)); // woken after 100 µs
                                              // the schedule goes on growing, and the budget still has 9.9 ms in it
        let rest: Duration = std::iter::from_fn(|| s.next_sleep()).sum();
        assert_eq!(rest, Duration::from_micros(9_900));
        // a refund after the last step gives that time back as one more step
        s.refund(Duration::from_millis(2));
        assert_eq!(s.next_sleep(), Some(Duration::from_millis(2)));
        assert_eq!(s.next_sleep(), None);
    }

    #[test]
    fn ratio_below_two_floors_at_one_millisecond() {
        let opts = LockOptions {
            step: Duration::from_micros(100),
            ratio: 1.0,
            timeout: Duration::from_micros(2100),
            ..LockOptions::default()
        };
        assert_eq!(steps(opts), [100, 1000, 1000]);
    }
}
