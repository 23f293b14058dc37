//! Forks at awkward moments: threads that open tables in a loop (so that an anchor is being
//! made at any instant), and a timer whose signal lands inside the library's fork handler.
#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use shmlock::LockTable;

/// Threads that open (and drop) the table at a path in a loop until stopped.
pub struct Openers {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Openers {
    pub fn start(path: &Path, threads: usize) -> Openers {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..threads)
            .map(|_| {
                let stop = stop.clone();
                let p: PathBuf = path.to_path_buf();
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        drop(LockTable::open(&p, 64).unwrap());
                    }
                })
            })
            .collect();
        Openers { stop, threads }
    }

    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
    }
}

/// The run-time address range of the library's `before_fork` (from nm and /proc/self/maps).
pub fn locate_before_fork() -> (u64, u64) {
    let exe = fs::read_link("/proc/self/exe").unwrap();
    let out = std::process::Command::new("nm")
        .arg("-S")
        .arg(&exe)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("process11before_fork"))
        .expect("before_fork symbol");
    let f: Vec<&str> = line.split_whitespace().collect();
    let off = u64::from_str_radix(f[0], 16).unwrap();
    let len = u64::from_str_radix(f[1], 16).unwrap();
    let maps = fs::read_to_string("/proc/self/maps").unwrap();
    let l = maps
        .lines()
        .find(|l| l.ends_with(exe.to_str().unwrap()))
        .unwrap();
    let base = u64::from_str_radix(l.split('-').next().unwrap(), 16).unwrap();
    (base + off, base + off + len)
}

extern "C" {
    /// glibc's `backtrace(3)`: the return addresses of the calling thread's frames.
    pub fn backtrace(buf: *mut *mut libc::c_void, size: libc::c_int) -> libc::c_int;
}

/// Where the library's `before_fork` lies at run time (see [`watch_for_before_fork`]).
static BEFORE_FORK_LO: AtomicU64 = AtomicU64::new(0);
static BEFORE_FORK_HI: AtomicU64 = AtomicU64::new(0);

/// Readies [`interrupted_in_before_fork`]: finds the library's `before_fork` and warms
/// `backtrace` up (it loads libgcc on first use, which a signal handler must not do).
pub fn watch_for_before_fork() {
    let (lo, hi) = locate_before_fork();
    BEFORE_FORK_LO.store(lo, Ordering::Relaxed);
    BEFORE_FORK_HI.store(hi, Ordering::Relaxed);
    let mut buf = [std::ptr::null_mut::<libc::c_void>(); 4];
    // SAFETY: backtrace into a local 4-entry buffer (warm-up: it loads libgcc).
    unsafe { backtrace(buf.as_mut_ptr(), 4) };
}

/// In a signal handler: whether the thread it interrupted is inside the library's
/// `before_fork` (after [`watch_for_before_fork`]).
pub fn interrupted_in_before_fork() -> bool {
    let mut buf = [std::ptr::null_mut::<libc::c_void>(); 32];
    // SAFETY: backtrace into a local 32-entry buffer, warmed up by watch_for_before_fork
    // (so it loads no library in a signal handler).
    let n = unsafe { backtrace(buf.as_mut_ptr(), 32) };
    let (lo, hi) = (
        BEFORE_FORK_LO.load(Ordering::Relaxed),
        BEFORE_FORK_HI.load(Ordering::Relaxed),
    );
    buf[..n.max(0) as usize]
        .iter()
        .any(|&f| (f as u64) >= lo && (f as u64) < hi)
}

/// Blocks or unblocks SIGALRM in the calling thread (threads started meanwhile inherit it).
pub fn mask_alarm(block: bool) {
    // SAFETY: zeroed storage is a valid sigset_t for sigemptyset; the mask changes only
    // this thread's.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGALRM);
        let how = if block {
            libc::SIG_BLOCK
        } else {
            libc::SIG_UNBLOCK
        };
        libc::pthread_sigmask(how, &set, std::ptr::null_mut());
    }
}

/// Installs `handler` for SIGALRM (restarting interrupted calls).
pub fn on_alarm(handler: extern "C" fn(libc::c_int)) {
    // SAFETY: the zeroed sigaction gets an extern "C" handler that lives as long as the
    // program, and an empty mask.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGALRM, &sa, std::ptr::null_mut()), 0);
    }
}

/// Arms a one-shot SIGALRM 1-150 µs from now, the delay drawn from the xorshift state `x`.
pub fn arm_alarm(x: &mut u64) {
    arm_alarm_in(1 + super::fork::xorshift(x) % 150);
}

/// Arms a one-shot SIGALRM `us` µs from now (0: disarms it).
pub fn arm_alarm_in(us: u64) {
    let it = libc::itimerval {
        it_interval: libc::timeval {
            tv_sec: 0,
            tv_usec: 0,
        },
        it_value: libc::timeval {
            tv_sec: 0,
            tv_usec: us as libc::suseconds_t,
        },
    };
    // SAFETY: `it` is a valid itimerval; the old value is not asked for (null).
    unsafe { libc::setitimer(libc::ITIMER_REAL, &it, std::ptr::null_mut()) };
}
