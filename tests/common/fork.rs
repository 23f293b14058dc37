//! Forked children and what they share with the parent, for the harness-less process tests
//! (single-threaded binaries, so `fork` copies a whole process).
#![allow(dead_code)]

use std::os::unix::io::{FromRawFd, OwnedFd};
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use memmap2::MmapRaw;

use super::TempPath;

extern "C" {
    /// glibc's `_Fork` (POSIX.1-2024): an async-signal-safe fork that runs no atfork
    /// handlers.
    pub fn _Fork() -> libc::pid_t;
}

/// A forked child process.
pub struct Child(pub libc::pid_t);

/// Forks; the child runs `f` and exits with its result (101 if it panics).
pub fn fork(f: impl FnOnce() -> i32) -> Child {
    // SAFETY: this binary is single-threaded, so the child is a complete copy.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(101);
        // SAFETY: leave without running the parent's atexit handlers or destructors.
        unsafe { libc::_exit(code) };
    }
    Child(pid)
}

impl Child {
    /// Waits for the exit code; kills the child and panics after `limit` (hang guard).
    pub fn wait(&self, limit: Duration) -> i32 {
        let deadline = Instant::now() + limit;
        loop {
            let mut status = 0;
            // SAFETY: our own child; status is a valid out-pointer.
            let r = unsafe { libc::waitpid(self.0, &mut status, libc::WNOHANG) };
            if r == self.0 {
                if libc::WIFEXITED(status) {
                    return libc::WEXITSTATUS(status);
                }
                return 128 + libc::WTERMSIG(status);
            }
            if Instant::now() > deadline {
                self.kill();
                panic!("child {} hung", self.0);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    pub fn kill(&self) {
        super::signal::send(self.0, libc::SIGKILL);
        let mut status = 0;
        // SAFETY: reaping our own child.
        unsafe { libc::waitpid(self.0, &mut status, 0) };
    }
}

/// A pipe: children block reading it until the parent writes or closes it.
pub struct Gate {
    read: OwnedFd,
    write: Option<OwnedFd>,
}

impl Gate {
    pub fn new() -> Gate {
        let mut fds = [0; 2];
        // SAFETY: fds is a valid out-array of two ints.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: fresh descriptors we own.
        unsafe {
            Gate {
                read: OwnedFd::from_raw_fd(fds[0]),
                write: Some(OwnedFd::from_raw_fd(fds[1])),
            }
        }
    }

    /// In a child: block until the parent opens the gate.
    pub fn wait(&mut self) {
        self.write = None;
        let mut b = [0u8; 1];
        let fd = std::os::unix::io::AsRawFd::as_raw_fd(&self.read);
        // SAFETY: reading one byte into a valid buffer.
        unsafe { libc::read(fd, b.as_mut_ptr().cast(), 1) };
    }

    /// In a child: tell the parent something happened (one byte).
    pub fn signal(&self) {
        let fd = std::os::unix::io::AsRawFd::as_raw_fd(self.write.as_ref().unwrap());
        // SAFETY: writing one byte from a valid buffer.
        unsafe { libc::write(fd, [1u8].as_ptr().cast(), 1) };
    }

    /// In the parent: wait for `n` signals.
    pub fn await_signals(&self, n: usize) {
        let fd = std::os::unix::io::AsRawFd::as_raw_fd(&self.read);
        for _ in 0..n {
            let mut b = [0u8; 1];
            // SAFETY: reading one byte into a valid buffer.
            let r = unsafe { libc::read(fd, b.as_mut_ptr().cast(), 1) };
            assert_eq!(r, 1, "a child died before signalling");
        }
    }

    /// In the parent: release every child blocked in `wait`.
    pub fn open(&mut self) {
        self.write = None;
    }
}

/// Counters in a shared file mapping, visible to forked children. The file is unlinked
/// at once (the mapping keeps it), so a leaked or `_exit`ed `Shared` leaves nothing behind.
pub struct Shared {
    map: MmapRaw,
    len: usize,
}

impl Shared {
    pub fn new(words: usize) -> Shared {
        let path = TempPath::new("shared");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        file.set_len((words * 8) as u64).unwrap();
        let map = MmapRaw::map_raw(&file).unwrap();
        drop(path);
        Shared { map, len: words }
    }

    pub fn word(&self, i: usize) -> &AtomicU64 {
        assert!(i < self.len);
        // SAFETY: in bounds (checked), 8-aligned (page-aligned base), zero-initialised by
        // set_len, lives as long as `self`, and only ever accessed as atomics.
        unsafe { AtomicU64::from_ptr(self.map.as_mut_ptr().cast::<u64>().add(i)) }
    }
}

pub fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}
