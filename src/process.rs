//! Who this process is, and whether another one is still alive.
//!
//! `getpid()` is a real system call (~100 ns here), too dear for the lock path, so the pid
//! and the process start time are cached and refreshed in a `pthread_atfork` child handler.

use std::fs;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Once;

/// The identity a slot records for its owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Owner {
    pub pid: u32,
    /// Field 22 of `/proc/<pid>/stat` (clock ticks after boot); 0 where unknown.
    pub start: u64,
}

static PID: AtomicU32 = AtomicU32::new(0);
static START: AtomicU64 = AtomicU64::new(0);
static ATFORK: Once = Once::new();

extern "C" fn forget_identity() {
    // Async-signal-safe: two atomic stores. The child looks itself up again on first use.
    PID.store(0, Ordering::Relaxed);
    START.store(0, Ordering::Relaxed);
}

/// The pid of the calling process, cached.
#[inline]
pub(crate) fn current_pid() -> u32 {
    let pid = PID.load(Ordering::Relaxed);
    if pid != 0 {
        return pid;
    }
    refresh()
}

#[cold]
fn refresh() -> u32 {
    ATFORK.call_once(|| {
        // SAFETY: the handler only stores to atomics, which is allowed in a fork child.
        let rc = unsafe { libc::pthread_atfork(None, None, Some(forget_identity)) };
        assert_eq!(rc, 0, "pthread_atfork failed");
    });
    // SAFETY: getpid has no preconditions and cannot fail.
    let pid = unsafe { libc::getpid() } as u32;
    START.store(start_time(pid).unwrap_or(0), Ordering::Relaxed);
    PID.store(pid, Ordering::Relaxed);
    pid
}

/// The calling process as a slot records it.
#[inline]
pub(crate) fn current() -> Owner {
    let pid = current_pid();
    Owner {
        pid,
        start: START.load(Ordering::Relaxed),
    }
}

/// Field 22 (`starttime`) of `/proc/<pid>/stat`, or `None` if the process does not exist.
pub(crate) fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read(format!("/proc/{pid}/stat")).ok()?;
    parse_start_time(&stat)
}

/// Parses `starttime` out of a stat line. The command name (field 2) may hold spaces and
/// parentheses, so fields are counted from the last `)`.
pub(crate) fn parse_start_time(stat: &[u8]) -> Option<u64> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&stat[close + 1..]).ok()?;
    // After ")" come field 3 (state) onwards; starttime is field 22, i.e. the 20th here.
    rest.split_ascii_whitespace().nth(19)?.parse().ok()
}

/// Whether the owner a slot records is gone.
pub(crate) trait Liveness {
    /// `start` is the recorded start time where the slot has a trustworthy one.
    fn is_dead(&self, pid: u32, start: Option<u64>) -> bool;
}

/// Liveness from the kernel: `kill(pid, 0)` then the start time for pid reuse.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Kernel;

impl Liveness for Kernel {
    fn is_dead(&self, pid: u32, start: Option<u64>) -> bool {
        if pid == 0 || pid > i32::MAX as u32 {
            return false; // not a pid we can judge; expiry stays the backstop
        }
        // SAFETY: signal 0 only checks for existence and permission; nothing is delivered.
        let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
        if rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
            return true;
        }
        // Alive (or EPERM: alive, someone else's). A different start time means the pid
        // was reused after the owner died.
        match (start, start_time(pid)) {
            (Some(recorded), Some(now)) if recorded != 0 => recorded != now,
            (Some(_), None) => true, // vanished between the two checks
            _ => false,
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn parses_start_time_with_hostile_comm() {
        let line = b"1234 (a) b (c)) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 4242 20 21";
        assert_eq!(parse_start_time(line), Some(4242));
        assert_eq!(parse_start_time(b"garbage"), None);
        assert_eq!(parse_start_time(b"1 (x) S 1 2"), None);
    }

    #[test]
    fn own_identity_is_live_and_stable() {
        let me = current();
        assert_eq!(me.pid, std::process::id());
        assert_ne!(me.start, 0);
        assert_eq!(start_time(me.pid), Some(me.start));
        assert!(!Kernel.is_dead(me.pid, Some(me.start)));
        // same pid, other start time: a reused pid
        assert!(Kernel.is_dead(me.pid, Some(me.start + 1)));
    }
}
