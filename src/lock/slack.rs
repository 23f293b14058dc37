//! How late a waiter's sleeps may end: the thread's timer slack, widened while it sleeps
//! out the schedule's steps and put back before `lock` returns.
//!
//! A waiter woken early cancels its sleep's timer. When that timer is the CPU's next event,
//! the kernel reprograms the clock-event device at the cancel: a write to the TSC-deadline
//! register, which in a virtual machine traps to the hypervisor. On the 2-core VM the
//! benchmarks ran on, a wake from a futex sleep whose timeout was 0.5-2 ms away took
//! 8.9-10.9 µs (median), against 2.8-4.7 µs from one 3 ms or more away or with no timeout,
//! and a trace showed that register write at each slow cancel and none at the fast ones.
//! With one tick of slack the timer is due a tick later, and may fire early along with
//! another one (the kernel runs every timer whose earliest expiry has passed): over holds
//! spread across 1-20 ms the schedule's sleeps then woke in 3.8-6.4 µs against 8.7-12.4 µs
//! without. A timeout simply a tick longer gave 10.1-12.5 µs: the early firing is what
//! helps, not only the later expiry.
//!
//! A step's sleep, with wake-ups on, only bounds how soon a dead holder is noticed (a
//! release wakes the sleeper, and so does a holder that shortens its lease): ending it up
//! to a tick late costs nothing else. The slack never carries a sleep past the caller's
//! deadline, nor past the holder's lease end and its tick, so timeouts and expiries stay
//! as sharp as before. A thread whose own slack is wider than a tick is held to a tick
//! while it waits (a slack of seconds would otherwise carry a 50 ms timeout seconds late,
//! or for ever), and gets its own back when `lock` returns.

use std::time::Duration;

/// How late a step's sleep may end: one tick of the usual 250 Hz clock.
pub(crate) const STEP_SLACK: Duration = Duration::from_millis(4);

/// The calling thread's timer slack over one wait: read at the first sleep, set per sleep,
/// put back when dropped (also when a panic unwinds through the wait). Plumbing of the
/// sealed [`Backend`](crate::Backend) trait.
#[doc(hidden)]
#[derive(Debug, Default)]
pub struct TimerSlack {
    /// The thread's own slack in ns, once read; 0 means hands off (a real-time thread,
    /// whose timers take no slack, or one whose slack cannot be read).
    own: Option<u64>,
    /// What the thread's slack is set to now.
    now: u64,
}

impl TimerSlack {
    pub(crate) const fn new() -> TimerSlack {
        TimerSlack { own: None, now: 0 }
    }

    /// Lets this thread's next sleeps end up to `late` past their timeouts, or by its own
    /// slack if that is wider, up to a tick.
    pub(crate) fn allow(&mut self, late: Duration) {
        let own = match self.own {
            Some(own) => own,
            None => {
                let own = sys::get().unwrap_or(0);
                self.own = Some(own);
                self.now = own;
                own
            }
        };
        if own == 0 {
            return;
        }
        let tick = STEP_SLACK.as_nanos() as u64;
        let want = own
            .min(tick)
            .max(u64::try_from(late.as_nanos()).unwrap_or(u64::MAX));
        if want != self.now && sys::set(want) {
            self.now = want;
        }
    }

    /// The slack this wait has the thread on now, in ns (`None` before the first sleep).
    #[cfg(test)]
    pub(crate) fn current(&self) -> Option<u64> {
        self.own.map(|_| self.now)
    }
}

impl Drop for TimerSlack {
    fn drop(&mut self) {
        if let Some(own) = self.own {
            if own != 0 && self.now != own {
                sys::set(own);
            }
        }
    }
}

#[cfg(target_os = "linux")]
mod sys {
    /// The calling thread's timer slack in ns. By `syscall`, not glibc's `prctl`, whose
    /// `int` result would cut a slack above 2.1 s; the kernel's value is unsigned, so a
    /// "negative" result is a slack of 2^63 ns or more (all but the last 4095 values, which
    /// read as an error).
    pub(super) fn get() -> Option<u64> {
        // SAFETY: PR_GET_TIMERSLACK takes no pointers (the unused arguments are zeros) and
        // only reads the calling thread's slack.
        let r = unsafe {
            libc::syscall(
                libc::SYS_prctl,
                libc::PR_GET_TIMERSLACK,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
            )
        };
        (r != -1).then_some(r as u64)
    }

    /// Sets the calling thread's timer slack (a nonzero `ns`: zero would mean "the
    /// default"); whether it took.
    pub(super) fn set(ns: u64) -> bool {
        debug_assert!(ns != 0);
        // SAFETY: PR_SET_TIMERSLACK takes an integer and no pointers, and only changes the
        // calling thread's slack.
        let r = unsafe {
            libc::syscall(
                libc::SYS_prctl,
                libc::PR_SET_TIMERSLACK,
                libc::c_ulong::try_from(ns).unwrap_or(libc::c_ulong::MAX),
                0 as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
            )
        };
        r == 0
    }
}

#[cfg(not(target_os = "linux"))]
mod sys {
    pub(super) fn get() -> Option<u64> {
        None
    }
    pub(super) fn set(_: u64) -> bool {
        false
    }
}

#[cfg(all(test, target_os = "linux", not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn widens_for_steps_narrows_for_deadlines_and_puts_back_the_threads_own() {
        // A thread of its own: the slack is per thread, and other tests run on theirs.
        std::thread::spawn(|| {
            assert!(sys::set(123_456));
            {
                let mut slack = TimerSlack::new();
                assert_eq!(slack.current(), None);
                slack.allow(STEP_SLACK);
                assert_eq!(sys::get(), Some(4_000_000));
                assert_eq!(slack.current(), Some(4_000_000));
                // a sleep that ends at the deadline: the thread's own slack, not less
                slack.allow(Duration::ZERO);
                assert_eq!(sys::get(), Some(123_456));
                slack.allow(Duration::from_millis(1));
                assert_eq!(sys::get(), Some(1_000_000));
            }
            assert_eq!(sys::get(), Some(123_456));
            // a thread whose own slack is wider than a tick is held to a tick, also at
            // the deadline, and gets its own back; so is one beyond what an `int` holds,
            // and one beyond what a `long` holds
            for own in [9_000_000, 5_000_000_000, (1 << 63) + 7] {
                assert!(sys::set(own));
                assert_eq!(sys::get(), Some(own));
                {
                    let mut slack = TimerSlack::new();
                    slack.allow(STEP_SLACK);
                    assert_eq!(sys::get(), Some(4_000_000));
                    slack.allow(Duration::ZERO);
                    assert_eq!(sys::get(), Some(4_000_000));
                    slack.allow(Duration::from_millis(1));
                    assert_eq!(sys::get(), Some(4_000_000));
                }
                assert_eq!(sys::get(), Some(own));
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_panic_in_the_wait_still_puts_the_slack_back() {
        std::thread::spawn(|| {
            assert!(sys::set(77_000));
            let r = std::panic::catch_unwind(|| {
                let mut slack = TimerSlack::new();
                slack.allow(STEP_SLACK);
                assert_eq!(sys::get(), Some(4_000_000));
                panic!("in the wait");
            });
            assert!(r.is_err());
            assert_eq!(sys::get(), Some(77_000));
        })
        .join()
        .unwrap();
    }
}
