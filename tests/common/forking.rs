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

/// A fork while one thread is held inside the library: a role process of this test binary
/// (`--role NAME ARGS.. FLAGS`) whose thread gdb holds where `stop` says (breakpoint 1),
/// and whose main thread alone then runs on and forks (gdb's scheduler locking). The role
/// goes by the flag files in FLAGS (see [`announce`], [`await_flag`], [`report_child`]).
/// Returns what the role printed, trimmed (one line, [`report_child`]'s).
pub fn held_fork(role: &str, args: &[&str], stop: &[String], what: &str) -> String {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    use std::time::{Duration, Instant};

    use super::probe::{proc_state, require_gdb, wait_file, GdbStop, Spawned, Stage};

    require_gdb();
    let flags = super::TempPath::new("held-fork");
    fs::create_dir_all(&flags.0).unwrap();
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--role", role])
        .args(args)
        .arg(&flags.0)
        .process_group(0)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut role_proc = Spawned(child);
    assert!(
        wait_file(&flags.0.join("ready"), Duration::from_secs(20)),
        "the role never started"
    );
    let until = Instant::now() + Duration::from_secs(20);
    let pid: i32 = loop {
        // (written, then renamed: never seen half written)
        if let Some(pid) = fs::read_to_string(flags.0.join("ready"))
            .ok()
            .and_then(|s| s.parse().ok())
        {
            break pid;
        }
        assert!(Instant::now() < until, "the role's ready file names no pid");
        std::thread::sleep(Duration::from_millis(5));
    };
    let gdb = GdbStop::attach_stages(
        pid,
        &[
            Stage::new(stop),
            // Only the main thread runs on: it forks, waits for its child and leaves.
            Stage::new(&[
                "set scheduler-locking on".to_string(),
                "thread 1".to_string(),
            ]),
        ],
    );
    fs::write(flags.0.join("go"), b"").unwrap();
    assert!(
        gdb.stopped(Duration::from_secs(20)),
        "{what}: the held thread never reached its stop"
    );
    fs::write(flags.0.join("fork"), b"").unwrap();
    gdb.resume(0);
    // gdb's second `continue` ends when the held process has left; it can be waited for
    // once gdb lets it go (or once gdb is gone, were it to crash: it then runs untraced).
    let until = Instant::now() + Duration::from_secs(90);
    while !gdb.reached(1, Duration::from_millis(50)) {
        if matches!(proc_state(pid), None | Some(b'Z')) {
            break;
        }
        assert!(
            Instant::now() < until,
            "{what}: the held process never finished"
        );
    }
    gdb.release();
    let until = Instant::now() + Duration::from_secs(150);
    while role_proc.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < until, "{what}: the role never finished");
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut out = String::new();
    role_proc
        .0
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    out.trim().to_string()
}

/// In a [`held_fork`] role: tells the test that the process to hold is this one.
pub fn announce(flags: &Path) {
    // SAFETY: getpid cannot fail.
    let me = unsafe { libc::getpid() };
    let tmp = flags.join(format!("ready.{me}"));
    fs::write(&tmp, me.to_string()).unwrap();
    fs::rename(tmp, flags.join("ready")).unwrap();
}

/// In a [`held_fork`] role: waits for the test's flag `name` ("go": make the call to be
/// held; "fork": the thread is held, fork now).
pub fn await_flag(flags: &Path, name: &str) {
    while !flags.join(name).exists() {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Waits up to `limit` for the child `pid`: its exit status, or `None` (then it is killed
/// and reaped).
pub fn reap_within(pid: libc::pid_t, limit: std::time::Duration) -> Option<i32> {
    let until = std::time::Instant::now() + limit;
    let mut st = 0;
    loop {
        // SAFETY: polling our own child; st is a valid out-pointer.
        if unsafe { libc::waitpid(pid, &mut st, libc::WNOHANG) } == pid {
            return Some(libc::WEXITSTATUS(st));
        }
        if std::time::Instant::now() > until {
            super::signal::send(pid, libc::SIGKILL);
            // SAFETY: reaping our own child; st is a valid out-pointer.
            unsafe { libc::waitpid(pid, &mut st, 0) };
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// In a [`held_fork`] role: waits up to `limit` for the forked child `pid` and prints
/// `child exited N`, or `child hung: <its threads>` (then kills it).
pub fn report_child(pid: libc::pid_t, limit: std::time::Duration) {
    use std::io::Write;
    let until = std::time::Instant::now() + limit;
    let mut st = 0;
    loop {
        // SAFETY: polling our own child; st is a valid out-pointer.
        if unsafe { libc::waitpid(pid, &mut st, libc::WNOHANG) } == pid {
            println!("child exited {}", libc::WEXITSTATUS(st));
            break;
        }
        if std::time::Instant::now() > until {
            println!("child hung: {}", super::probe::describe_threads(pid));
            super::signal::send(pid, libc::SIGKILL);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let _ = std::io::stdout().flush();
}
