//! Who this process is, for inspection and for telling a forked child from its parent.
//!
//! `getpid()` is a real system call (~100 ns here), too dear for the lock path, so the pid
//! and the process start time are cached and forgotten in a `pthread_atfork` child
//! handler, which also drops the registration descriptors the child inherited (see
//! `registry.rs`) and the cached clock offset (see `clock.rs`).
//!
//! Nothing here decides whether another process is alive: pids mean nothing across pid
//! namespaces and `/proc` may hide them. The owner registry does that.

use std::fs;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Once;

/// The identity of this process, as inspection shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Me {
    pub pid: u32,
    /// Field 22 of `/proc/self/stat` (clock ticks after boot); 0 where unknown.
    pub start: u64,
}

static PID: AtomicU32 = AtomicU32::new(0);
static START: AtomicU64 = AtomicU64::new(0);
static ATFORK: Once = Once::new();

extern "C" fn in_forked_child() {
    // Async-signal-safe: atomic stores and close(2).
    PID.store(0, Ordering::Relaxed);
    START.store(0, Ordering::Relaxed);
    crate::registry::close_inherited();
    crate::clock::forget_offset();
}

/// Installs the fork handler (once per process).
pub(crate) fn install_fork_handler() {
    ATFORK.call_once(|| {
        // SAFETY: the handler only stores to atomics and closes descriptors the child
        // inherited and owns, which is allowed in the child of a multi-threaded process.
        let rc = unsafe { libc::pthread_atfork(None, None, Some(in_forked_child)) };
        assert_eq!(rc, 0, "pthread_atfork failed");
    });
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
    install_fork_handler();
    let pid = std::process::id();
    START.store(start_time(pid).unwrap_or(0), Ordering::Relaxed);
    PID.store(pid, Ordering::Relaxed);
    pid
}

/// The calling process, as inspection shows it.
pub(crate) fn current() -> Me {
    let pid = current_pid();
    Me {
        pid,
        start: START.load(Ordering::Relaxed),
    }
}

/// Field 22 (`starttime`) of `/proc/<pid>/stat`, or `None` if it cannot be read.
pub(crate) fn start_time(pid: u32) -> Option<u64> {
    parse_start(&fs::read(format!("/proc/{pid}/stat")).ok()?)
}

/// The start time from a stat line. The command name (field 2) may hold spaces and
/// parentheses, so fields are counted from the last `)`.
pub(crate) fn parse_start(line: &[u8]) -> Option<u64> {
    let close = line.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&line[close + 1..]).ok()?;
    // After ")" come field 3 (state) onwards; starttime is field 22, the 20th here.
    rest.split_ascii_whitespace().nth(19)?.parse().ok()
}

/// The pid namespace of this process (`/proc/self/ns/pid` as device and inode), or 0
/// where it cannot be told. A pid only means something within its namespace.
pub(crate) fn pid_namespace() -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.dev().rotate_left(32) ^ m.ino())
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_hostile_comm() {
        let line = b"1234 (a) b (c)) Z 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 4242 20 21";
        assert_eq!(parse_start(line), Some(4242));
        assert_eq!(parse_start(b"garbage"), None);
        assert_eq!(parse_start(b"1 (x) S 1 2"), None);
        assert_eq!(parse_start(b"1 (x) "), None);
    }

    #[test]
    fn own_identity_is_stable() {
        let me = current();
        assert_eq!(me.pid, std::process::id());
        assert_ne!(me.start, 0);
        assert_eq!(start_time(me.pid), Some(me.start));
        assert_ne!(pid_namespace(), 0);
    }
}
