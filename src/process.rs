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
    stat(pid).map(|s| s.start)
}

/// What liveness needs from `/proc/<pid>/stat`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stat {
    /// Field 3: `R`, `S`, `Z` (zombie), ...
    pub state: u8,
    /// Field 22: start time in clock ticks after boot.
    pub start: u64,
}

fn stat(pid: u32) -> Option<Stat> {
    parse_stat(&fs::read(format!("/proc/{pid}/stat")).ok()?)
}

/// Parses a stat line. The command name (field 2) may hold spaces and parentheses, so
/// fields are counted from the last `)`.
pub(crate) fn parse_stat(line: &[u8]) -> Option<Stat> {
    let close = line.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&line[close + 1..]).ok()?;
    let mut fields = rest.split_ascii_whitespace();
    // After ")" come field 3 (state) onwards; starttime is field 22, the 20th here.
    let state = *fields.next()?.as_bytes().first()?;
    let start = fields.nth(18)?.parse().ok()?;
    Some(Stat { state, start })
}

/// The pid namespace of this process (`/proc/self/ns/pid` as device and inode), or 0
/// where it cannot be told. Pids only mean something within one namespace.
pub(crate) fn pid_namespace() -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.dev().rotate_left(32) ^ m.ino())
}

/// Whether the owner a slot records is gone.
pub(crate) trait Liveness {
    /// `start` is the recorded start time where the slot has a trustworthy one.
    fn is_dead(&self, pid: u32, start: Option<u64>) -> bool;
}

/// Liveness from the kernel: `kill(pid, 0)`, then `/proc/<pid>/stat` for a zombie (dead,
/// not yet reaped by its parent) or a different start time (the pid was reused).
/// `judge: false` says "alive" to everything: for a table shared across pid namespaces,
/// where another process's pid means nothing here.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Kernel {
    pub judge: bool,
}

impl Liveness for Kernel {
    fn is_dead(&self, pid: u32, start: Option<u64>) -> bool {
        if !self.judge || pid == 0 || pid > i32::MAX as u32 {
            return false; // not a pid we can judge; expiry stays the backstop
        }
        // SAFETY: signal 0 only checks for existence and permission; nothing is delivered.
        let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
        if rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
            return true;
        }
        // Alive, or EPERM: alive and someone else's. Unless it is a zombie or a newcomer.
        match stat(pid) {
            None => true, // vanished between the two looks
            Some(s) if s.state == b'Z' || s.state == b'X' => true,
            Some(s) => matches!(start, Some(recorded) if recorded != 0 && recorded != s.start),
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_hostile_comm() {
        let line = b"1234 (a) b (c)) Z 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 4242 20 21";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                state: b'Z',
                start: 4242
            })
        );
        assert_eq!(parse_stat(b"garbage"), None);
        assert_eq!(parse_stat(b"1 (x) S 1 2"), None);
        assert_eq!(parse_stat(b"1 (x) "), None);
    }

    #[test]
    fn own_identity_is_live_and_stable() {
        let me = current();
        assert_eq!(me.pid, std::process::id());
        assert_ne!(me.start, 0);
        assert_eq!(start_time(me.pid), Some(me.start));
        let kernel = Kernel { judge: true };
        assert!(!kernel.is_dead(me.pid, Some(me.start)));
        assert!(!kernel.is_dead(me.pid, None));
        // same pid, other start time: a reused pid
        assert!(kernel.is_dead(me.pid, Some(me.start + 1)));
        // a table shared across pid namespaces judges nobody
        assert!(!Kernel { judge: false }.is_dead(me.pid, Some(me.start + 1)));
        assert_ne!(pid_namespace(), 0);
    }

    #[test]
    fn a_zombie_is_dead_and_a_reaped_pid_too() {
        let kernel = Kernel { judge: true };
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let start = start_time(pid);
        // not yet waited for: a zombie once it has exited
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while stat(pid).is_some_and(|s| s.state != b'Z') {
            assert!(std::time::Instant::now() < deadline, "child never exited");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(kernel.is_dead(pid, start));
        child.wait().unwrap();
        assert!(kernel.is_dead(pid, start));
    }
}
