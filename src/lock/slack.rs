//! How late a waiter's sleeps may end: a step's sleep ends on a tick of the coarse clock,
//! and the thread's own timer slack is held to a tick while it waits.
//!
//! A waiter woken early cancels its sleep's timer. When that timer is the CPU's next event,
//! the kernel reprograms the clock-event device at the cancel: a write to the TSC-deadline
//! register, which in a virtual machine traps to the hypervisor. On the 2-core VM the
//! benchmarks ran on, a wake from a futex sleep whose timeout was 0.5-2 ms away took
//! 8.9-10.9 µs (median), against 2.8-4.7 µs from one 3 ms or more away or with no timeout,
//! and a trace showed that register write at each slow cancel and none at the fast ones.
//!
//! So a step's sleep runs to the first tick of the coarse clock at or after the step's end
//! (an absolute futex timeout), when that tick comes within `late` (at most
//! [`STEP_SLACK`]); past it, to the step's end exactly. Measured side by side against a
//! tick of timer slack on each sleep (the previous way, which needed a system call to put
//! the slack back after the wake), the handoff at a 5 ms hold took 3.2-3.4 µs against
//! 4.0 µs (the robust mutex: 3.1-3.2), and over holds spread across 1-20 ms 5.7-5.8 µs
//! against 5.9-6.1 µs. With slack, 13-16 % of the rounds at the 5 ms hold had the
//! waiter's first step (1 ms, up to 4 ms late) end 25-100 µs before the release; it slept
//! again on the other CPU, and the release's wake of that idle CPU took 24-27 µs
//! (median).
//!
//! A step's sleep, with wake-ups on, only bounds how soon a dead holder is noticed (a
//! release wakes the sleeper, and so does a holder that shortens its lease): ending it up
//! to a tick late costs nothing else. It never runs past the caller's deadline, nor past
//! the holder's lease end and its tick, so timeouts and expiries stay as sharp as before.
//!
//! The kernel still adds the thread's own timer slack to every timeout. A thread whose own
//! slack is wider than a tick is held to a tick while it waits (a slack of seconds would
//! otherwise carry a 50 ms timeout seconds late, or for ever), and gets its own back when
//! `lock` returns. Any other thread's slack is left alone: one system call per wait reads
//! it, before the first sleep.

use std::time::Duration;

/// How late a step's sleep may end: one tick of the coarse clock at the usual 250 Hz.
pub(crate) const STEP_SLACK: Duration = Duration::from_nanos(crate::shm::clock::TICK_NS);

/// The calling thread's timer slack over one wait: read at the first sleep, held to a
/// tick, put back when dropped (also when a panic unwinds through the wait). Plumbing of
/// the sealed [`Backend`](crate::Backend) trait.
#[doc(hidden)]
#[derive(Debug, Default)]
pub struct TimerSlack {
    /// The thread's own slack in ns, once read; 0 means hands off (a real-time thread,
    /// whose timers take no slack, or one whose slack cannot be read).
    own: Option<u64>,
    /// Whether the thread's slack is held to a tick (its own is wider).
    held: bool,
}

impl TimerSlack {
    pub(crate) const fn new() -> TimerSlack {
        TimerSlack {
            own: None,
            held: false,
        }
    }

    /// Before a sleep: holds the thread's slack to a tick if its own is wider.
    pub(crate) fn hold(&mut self) {
        if self.own.is_some() {
            return;
        }
        let own = sys::get().unwrap_or(0);
        self.own = Some(own);
        let tick = crate::shm::clock::TICK_NS;
        self.held = own > tick && sys::set(tick);
    }

    /// The slack this wait has the thread on now, in ns (`None` before the first sleep).
    #[cfg(test)]
    pub(crate) fn current(&self) -> Option<u64> {
        let tick = crate::shm::clock::TICK_NS;
        self.own.map(|own| if self.held { tick } else { own })
    }
}

impl Drop for TimerSlack {
    fn drop(&mut self) {
        if let (Some(own), true) = (self.own, self.held) {
            sys::set(own);
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
    fn leaves_a_narrow_slack_alone_and_holds_a_wide_one_to_a_tick() {
        // A thread of its own: the slack is per thread, and other tests run on theirs.
        std::thread::spawn(|| {
            assert!(sys::set(123_456));
            {
                let mut slack = TimerSlack::new();
                assert_eq!(slack.current(), None);
                slack.hold();
                slack.hold();
                assert_eq!(sys::get(), Some(123_456));
                assert_eq!(slack.current(), Some(123_456));
            }
            assert_eq!(sys::get(), Some(123_456));
            // a thread whose own slack is wider than a tick is held to a tick and gets its
            // own back; so is one beyond what an `int` holds, and one beyond what a `long`
            // holds
            for own in [9_000_000, 5_000_000_000, (1 << 63) + 7] {
                assert!(sys::set(own));
                assert_eq!(sys::get(), Some(own));
                {
                    let mut slack = TimerSlack::new();
                    slack.hold();
                    assert_eq!(sys::get(), Some(4_000_000));
                    slack.hold();
                    assert_eq!(slack.current(), Some(4_000_000));
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
            assert!(sys::set(77_000_000));
            let r = std::panic::catch_unwind(|| {
                let mut slack = TimerSlack::new();
                slack.hold();
                assert_eq!(sys::get(), Some(4_000_000));
                panic!("in the wait");
            });
            assert!(r.is_err());
            assert_eq!(sys::get(), Some(77_000_000));
        })
        .join()
        .unwrap();
    }
}
