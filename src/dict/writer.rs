//! The dict's writer lock: one per dict, as ngx's shared dicts have one mutex per zone.
//! Readers never take it; writers hold it for one entry's copy.
//!
//! The lock word records its owner, so a writer that dies holding it does not wedge the
//! dict: the next writer sees the owner dead, takes the lock over, and repairs the entry
//! the dead writer was in the middle of (see [`entry`](super::entry)).
//!
//! ```text
//!  63              24 23       2      1        0
//! +------------------+-----------+-------+--------+
//! | start time (40)  | pid (22)  |waiters| locked |
//! +------------------+-----------+-------+--------+
//! ```
//!
//! The start time (`/proc/<pid>/stat` field 22) goes in the same CAS as the pid, so a
//! reused pid is never mistaken for the owner.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::futex::{self, Futex};
use crate::primitive::{spin, SETTLE_ROUNDS};
use crate::process::{self, Kernel, Liveness};
use crate::table::Notify;

const LOCKED: u64 = 1;
const WAITERS: u64 = 2;
const PID_SHIFT: u32 = 2;
const PID_MASK: u64 = (1 << 22) - 1;
const START_SHIFT: u32 = 24;
const START_MASK: u64 = (1 << 40) - 1;

/// How long a waiting writer sleeps before it looks at the owner's liveness again.
const RECHECK: Duration = Duration::from_millis(10);

/// The writer lock's words in the control page.
#[derive(Clone, Copy)]
pub(crate) struct WriterLock<'a> {
    pub word: &'a AtomicU64,
    pub wait: &'a AtomicU32,
}

/// The writer lock, held; released on drop.
pub(crate) struct Writing<'a> {
    lock: WriterLock<'a>,
}

impl<'a> WriterLock<'a> {
    fn me(pid_ns_judged: bool) -> u64 {
        let me = process::current();
        // Outside the creator's pid namespace our pid means nothing to the others: record
        // none, so nobody judges us (and a dead writer there waits for a live one's check).
        let pid = if pid_ns_judged {
            u64::from(me.pid) & PID_MASK
        } else {
            0
        };
        LOCKED | pid << PID_SHIFT | (me.start & START_MASK) << START_SHIFT
    }

    /// Takes the lock. The flag says the previous owner died holding it: the caller must
    /// repair before writing.
    pub(crate) fn lock(self, liveness: &Kernel) -> (Writing<'a>, bool) {
        let me = Self::me(liveness.judge);
        let mut round = 0;
        loop {
            let cur = self.word.load(Ordering::Relaxed);
            if cur & LOCKED == 0 {
                if self
                    .word
                    .compare_exchange(cur, me, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    return (Writing { lock: self }, false);
                }
                continue;
            }
            if round < SETTLE_ROUNDS {
                spin(round);
                round += 1;
                continue;
            }
            let pid = ((cur >> PID_SHIFT) & PID_MASK) as u32;
            let start = (cur >> START_SHIFT) & START_MASK;
            if liveness.is_dead(pid, (start != 0).then_some(start)) {
                if self
                    .word
                    .compare_exchange(cur, me, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    if cur & WAITERS != 0 {
                        // The dead owner's sleepers would otherwise sleep out RECHECK.
                        self.wake();
                    }
                    // Whatever the dead writer stored is visible by now: its process had
                    // ended before the kernel reported it gone. The caller repairs.
                    return (Writing { lock: self }, true);
                }
                continue;
            }
            // The lost-wakeup guard: `seen` is read before the waiters bit is set, and the
            // releaser clears the word before it bumps `wait`, so a release after our CAS
            // changes `wait` and the futex returns at once (a release before it fails the
            // CAS). SeqCst keeps the load and the CAS in that order.
            let seen = self.wait.load(Ordering::SeqCst);
            if cur & WAITERS == 0
                && self
                    .word
                    .compare_exchange(cur, cur | WAITERS, Ordering::SeqCst, Ordering::Relaxed)
                    .is_err()
            {
                continue;
            }
            futex::wait(self.wait, seen, RECHECK);
        }
    }

    /// The pid in the word, if it is locked.
    pub(crate) fn holder(&self) -> Option<u32> {
        let cur = self.word.load(Ordering::Relaxed);
        (cur & LOCKED != 0).then_some(((cur >> PID_SHIFT) & PID_MASK) as u32)
    }

    fn wake(&self) {
        self.wait.fetch_add(1, Ordering::SeqCst);
        Futex.wake_all(self.wait);
    }
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        let prev = self.lock.word.swap(0, Ordering::Release);
        if prev & WAITERS != 0 {
            self.lock.wake();
        }
    }
}
