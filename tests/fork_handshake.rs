//! Attacks of the fifth adversarial review, with real processes (fork from signal handlers,
//! `_Fork`, posix_spawn, threads forking while others open tables, a stopped resetter,
//! overlayfs, programs juggling descriptors under ptrace): the registration's anchor (a
//! PROT_NONE, MADV_DONTFORK page of a description of its own) and the fork handler that
//! holds `fork` off while one is set up. Those that broke an earlier build are regression
//! tests now.

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::fork::{_Fork, fork, xorshift, Child, Shared};
use common::forking::{arm_alarm_in, backtrace, on_alarm};
use common::harness::Test;
use common::ns::{bind, private_mount_ns, BOOT_ID_FILE};
use common::probe::{describe_hang, monitor, ofd_locks_on};
use common::{opts, TempPath};
use shmlock::LockTable;

const TESTS: &[Test] = &[
    Test::new(
        "a_fork_in_a_signal_handler_during_open_never_deadlocks",
        fork_in_signal_handler_during_open,
    ),
    Test::new(
        "a_child_made_by_fork_in_a_handler_never_adopts_the_parents_registration",
        underscore_fork_in_signal_handler_child_adopts_owner,
    ),
    Test::new(
        "the_same_with_the_fork_handlers",
        fork_in_signal_handler_child_adopts_owner,
    ),
    Test::new(
        "fork_is_not_starved_by_threads_opening_tables",
        fork_starvation_many_openers,
    ),
    Test::new(
        "fork_is_not_stalled_by_a_stopped_resetter",
        fork_stalled_by_stopped_resetter,
    )
    .needs_root("bind-mounts a boot id in a mount namespace"),
    Test::new(
        "a_fork_child_never_inherits_anchors_being_set_up",
        underscore_fork_child_inherits_setting_up,
    ),
    Test::new(
        "posix_spawn_children_hold_nothing",
        posix_spawn_children_hold_nothing,
    ),
    Test::new(
        "a_forked_child_of_a_judging_thread_never_hangs",
        forked_child_of_a_judging_thread,
    ),
];

fn main() {
    common::harness::run("adversarial5", TESTS, common::harness::no_roles);
}

const K: &str = "K";

// ---------------------------------------------------------------------------------------
// 2. fork() from a signal handler that interrupted an open: the prepare handler waits for
//    the very thread it interrupted.

extern "C" fn on_alarm_fork(_: libc::c_int) {
    // SAFETY: fork in a handler (async-signal-safe in POSIX.1-2017); the child leaves at
    // once.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: leaving the child.
        unsafe { libc::_exit(0) };
    }
}

fn fork_in_signal_handler_during_open() {
    let path = TempPath::new("sigfork");
    drop(LockTable::open(&path, 64).unwrap());
    let shared = Shared::new(2);
    let c = fork(|| {
        // SAFETY: children are reaped by the kernel.
        unsafe { libc::signal(libc::SIGCHLD, libc::SIG_IGN) };
        on_alarm(on_alarm_fork);
        let mut x = 0x9e3779b97f4a7c15u64 ^ std::process::id() as u64;
        for i in 0..4000u64 {
            arm_alarm_in(1 + xorshift(&mut x) % 120);
            let t = LockTable::open(&path, 64).unwrap();
            arm_alarm_in(0);
            drop(t);
            shared.word(0).store(i + 1, Ordering::SeqCst);
        }
        0
    });
    match monitor(
        &c,
        &shared,
        0,
        Duration::from_secs(3),
        Duration::from_secs(120),
    ) {
        Ok(rc) => note!(
            "[rc {rc}, {} opens each with a fork from SIGALRM] ",
            shared.word(0).load(Ordering::SeqCst)
        ),
        Err(e) => panic!("BROKE (deadlock): {e}"),
    }
}

// ---------------------------------------------------------------------------------------
// 3. A child made in a signal handler that interrupted an open continues that open: it
//    returns a handle whose registration is the parent's, with the child's fork epoch, so
//    the child takes the parent's owner id for its own; its drop leaves the parent's entry.

static CHILD_PID: AtomicI32 = AtomicI32::new(0);
static IN_CHILD: AtomicBool = AtomicBool::new(false);
static USE_FORK: AtomicBool = AtomicBool::new(false);
static mut FRAMES: [*mut libc::c_void; 24] = [std::ptr::null_mut(); 24];
static NFRAMES: AtomicI32 = AtomicI32::new(0);
static PIN_LO: AtomicU64 = AtomicU64::new(0);
static PIN_LEN: AtomicU64 = AtomicU64::new(0);
static BASE: AtomicU64 = AtomicU64::new(0);
static SKIPPED: AtomicU64 = AtomicU64::new(0);

fn exe_base() -> u64 {
    let maps = fs::read_to_string("/proc/self/maps").unwrap();
    let exe = fs::read_link("/proc/self/exe").unwrap();
    let line = maps
        .lines()
        .find(|l| l.ends_with(exe.to_str().unwrap()))
        .unwrap();
    u64::from_str_radix(line.split('-').next().unwrap(), 16).unwrap()
}

extern "C" fn on_alarm_adopt(_: libc::c_int) {
    if CHILD_PID.load(Ordering::Relaxed) != 0 || IN_CHILD.load(Ordering::Relaxed) {
        return;
    }
    // optionally: no fork while Anchor::pin is on the stack (SHMLOCK_FORK_PIN=start,len offsets)
    let (lo, len) = (
        PIN_LO.load(Ordering::Relaxed),
        PIN_LEN.load(Ordering::Relaxed),
    );
    if len != 0 {
        let mut buf = [std::ptr::null_mut::<libc::c_void>(); 32];
        // SAFETY: glibc backtrace into a local buffer (single-threaded test process).
        let n = unsafe { backtrace(buf.as_mut_ptr(), 32) };
        let base = BASE.load(Ordering::Relaxed);
        for &f in &buf[..n.max(0) as usize] {
            let off = (f as u64).wrapping_sub(base);
            if off >= lo && off < lo + len {
                SKIPPED.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    }
    // SAFETY: _Fork is async-signal-safe (POSIX.1-2024); fork was in POSIX.1-2017.
    let pid = unsafe {
        if USE_FORK.load(Ordering::Relaxed) {
            libc::fork()
        } else {
            _Fork()
        }
    };
    if pid == 0 {
        IN_CHILD.store(true, Ordering::Relaxed);
        // where the parent was interrupted (for the report)
        // SAFETY: a static array of pointers, written by this single-threaded child.
        unsafe {
            let n = backtrace(std::ptr::addr_of_mut!(FRAMES).cast(), 24);
            NFRAMES.store(n, Ordering::Relaxed);
        }
    } else if pid > 0 {
        CHILD_PID.store(pid, Ordering::Relaxed);
    }
}

fn adopt_trials(use_fork: bool) {
    let shared = Shared::new(8);
    let dir = PathBuf::from(format!(
        "/dev/shm/shmlock-test-adopt-{}",
        std::process::id()
    ));
    fs::create_dir_all(&dir).unwrap();
    let d2 = dir.clone();
    let sh = &shared;
    let c = fork(move || {
        let shared = sh;
        USE_FORK.store(use_fork, Ordering::Relaxed);
        BASE.store(exe_base(), Ordering::Relaxed);
        if let Ok(v) = std::env::var("SHMLOCK_FORK_PIN") {
            let mut it = v
                .split(',')
                .map(|x| u64::from_str_radix(x.trim_start_matches("0x"), 16).unwrap());
            PIN_LO.store(it.next().unwrap(), Ordering::Relaxed);
            PIN_LEN.store(it.next().unwrap(), Ordering::Relaxed);
        }
        on_alarm(on_alarm_adopt);
        let mut x = 0x1234_5678_9abc_def1u64 ^ std::process::id() as u64;
        let mut windows = 0u64;
        for trial in 1..=3000u64 {
            let path = d2.join(format!("t{}", trial % 4));
            CHILD_PID.store(0, Ordering::Relaxed);
            arm_alarm_in(1 + xorshift(&mut x) % 150);
            let t = LockTable::open(&path, 64);
            arm_alarm_in(0);
            if IN_CHILD.load(Ordering::Relaxed) {
                // the child: wait for the parent to hold K, then drop our handle
                let t = match t {
                    Ok(t) => t,
                    Err(_) => {
                        shared.word(2).store(trial, Ordering::SeqCst);
                        // SAFETY: leaving the child.
                        unsafe { libc::_exit(3) }
                    }
                };
                let until = Instant::now() + Duration::from_secs(5);
                while shared.word(1).load(Ordering::SeqCst) != trial && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(1));
                }
                drop(t);
                let base = exe_base();
                let n = NFRAMES.load(Ordering::Relaxed).clamp(0, 24) as usize;
                // SAFETY: reading the frames this child stored.
                let frames: Vec<String> = unsafe {
                    (&*std::ptr::addr_of!(FRAMES))[..n]
                        .iter()
                        .map(|&f| format!("{:#x}", (f as u64).wrapping_sub(base)))
                        .collect()
                };
                let _ = fs::write(
                    format!("/dev/shm/shmlock-test-bt-{trial}"),
                    frames.join(" "),
                );
                shared.word(2).store(trial, Ordering::SeqCst);
                // SAFETY: leaving the child.
                unsafe { libc::_exit(0) }
            }
            let t = t.unwrap();
            let child = CHILD_PID.load(Ordering::Relaxed);
            shared.word(0).store(trial, Ordering::SeqCst);
            if child == 0 {
                drop(t);
                continue;
            }
            windows += 1;
            let g = t.lock(K, opts(60_000, 1_000)).unwrap();
            shared.word(1).store(trial, Ordering::SeqCst);
            let until = Instant::now() + Duration::from_secs(6);
            while shared.word(2).load(Ordering::SeqCst) != trial && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(1));
            }
            let mut st = 0;
            // SAFETY: reaping our child (it has left or is killed).
            unsafe {
                if libc::waitpid(child, &mut st, libc::WNOHANG) == 0 {
                    libc::kill(child, libc::SIGKILL);
                    libc::waitpid(child, &mut st, 0);
                }
            }
            // a second handle of this process: its own registration, another owner
            let t2 = LockTable::open(&path, 64).unwrap();
            let hs: Vec<_> = t2
                .holders()
                .iter()
                .map(|h| (h.pid, h.owner_alive))
                .collect();
            let stolen = t2.try_lock_with_lease(K, Duration::from_secs(60)).unwrap();
            if stolen.is_some() {
                println!(
                    "\nBROKE at trial {trial} (child {child} made in the handler, exit status \
                     {st:#x}, dropped its handle): pid {} still holds {K} through its first \
                     handle (lease 60 s); holders() = {hs:?}; its second handle TOOK {K}; \
                     the first guard's unlock: {:?}",
                    std::process::id(),
                    {
                        let r = g.unlock();
                        r.map_err(|e| e.to_string())
                    }
                );
                shared.word(3).store(trial, Ordering::SeqCst);
                let bt = fs::read_to_string(format!("/dev/shm/shmlock-test-bt-{trial}"))
                    .unwrap_or_default();
                println!("  the child's frames (offsets in {}): {bt}; forks skipped because Anchor::pin was on the stack: {}", fs::read_link("/proc/self/exe").unwrap().display(), SKIPPED.load(Ordering::Relaxed));
                return 1;
            }
            let _ = fs::remove_file(format!("/dev/shm/shmlock-test-bt-{trial}"));
            drop(stolen);
            drop(g);
            drop(t2);
            drop(t);
        }
        shared.word(4).store(windows, Ordering::SeqCst);
        0
    });
    let r = monitor(
        &c,
        &shared,
        0,
        Duration::from_secs(10),
        Duration::from_secs(240),
    );
    let _ = fs::remove_dir_all(&dir);
    match r {
        Ok(0) => note!(
            "[held: {} trials with a child made inside/around open] ",
            shared.word(4).load(Ordering::SeqCst)
        ),
        Ok(rc) => panic!("rc {rc}: the child took the parent's registration"),
        Err(e) => panic!("BROKE (hang): {e}"),
    }
}

fn underscore_fork_in_signal_handler_child_adopts_owner() {
    adopt_trials(false);
}

fn fork_in_signal_handler_child_adopts_owner() {
    adopt_trials(true);
}

// ---------------------------------------------------------------------------------------
// 4. Threads forking while many threads open tables: fork waits for a moment when no
//    anchor is being set up anywhere in the process.

fn fork_starvation_many_openers() {
    let shared = Shared::new(4);
    let c = fork(|| {
        let dir = PathBuf::from(format!(
            "/dev/shm/shmlock-test-starve-{}",
            std::process::id()
        ));
        fs::create_dir_all(&dir).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let opens = Arc::new(AtomicU64::new(0));
        let nthreads: usize = std::env::var("SHMLOCK_FORK_THREADS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(8);
        let control = std::env::var_os("SHMLOCK_FORK_CONTROL").is_some();
        drop(LockTable::open(dir.join("t0"), 64).unwrap());
        drop(LockTable::open(dir.join("t1"), 64).unwrap());
        let threads: Vec<_> = (0..nthreads)
            .map(|i| {
                let stop = stop.clone();
                let opens = opens.clone();
                let p = dir.join(format!("t{}", i % 2));
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        if control {
                            // the same kind of work without anchors: open, map, lock-test, close
                            let f = fs::OpenOptions::new()
                                .read(true)
                                .write(true)
                                .open(&p)
                                .unwrap();
                            let m = memmap2::MmapOptions::new().len(4096).map_raw(&f).unwrap();
                            let f2 = fs::OpenOptions::new()
                                .read(true)
                                .write(true)
                                .open(&p)
                                .unwrap();
                            drop((
                                m,
                                f,
                                f2,
                                fs::read_to_string("/proc/sys/kernel/random/boot_id"),
                            ));
                        } else {
                            drop(LockTable::open(&p, 64).unwrap());
                        }
                        opens.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(200));
        let mut worst = Duration::ZERO;
        let mut total = Duration::ZERO;
        for _ in 0..30 {
            let s = Instant::now();
            // SAFETY: the child leaves at once.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                // SAFETY: leaving the child.
                unsafe { libc::_exit(0) };
            }
            let d = s.elapsed();
            let mut st = 0;
            // SAFETY: reaping our child.
            unsafe { libc::waitpid(pid, &mut st, 0) };
            worst = worst.max(d);
            total += d;
            shared.word(0).fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(20));
        }
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            t.join().unwrap();
        }
        let _ = fs::remove_dir_all(&dir);
        shared
            .word(1)
            .store(worst.as_micros() as u64, Ordering::SeqCst);
        shared
            .word(2)
            .store(total.as_micros() as u64 / 30, Ordering::SeqCst);
        shared
            .word(3)
            .store(opens.load(Ordering::Relaxed), Ordering::SeqCst);
        0
    });
    match monitor(
        &c,
        &shared,
        0,
        Duration::from_secs(20),
        Duration::from_secs(120),
    ) {
        Ok(rc) => {
            let worst = shared.word(1).load(Ordering::SeqCst);
            note!(
                "[rc {rc}; 30 forks while 8 threads open tables ({} opens): mean {} us, worst {} us] ",
                shared.word(3).load(Ordering::SeqCst),
                shared.word(2).load(Ordering::SeqCst),
                worst
            );
            assert!(worst < 500_000, "BROKE: a fork waited {worst} us");
        }
        Err(e) => panic!("BROKE (fork starved): {e}"),
    }
}

// ---------------------------------------------------------------------------------------
// 5. A process stopped in the middle of a reboot reset (it holds the attached byte for
//    writing): another process's open waits in `join` up to 10 s, inside an anchor's
//    setup, and every fork of that process waits as long.

fn fork_stalled_by_stopped_resetter() {
    common::harness::require_root();
    let path = TempPath::new("reset-stall");
    let fake = TempPath::new("bootid");
    fs::write(&fake, "0badc0de-1111-4222-8333-444455556666\n").unwrap();
    // the table is made by a process of "another boot"; big, so that its reset takes a while
    let maker = fork(|| {
        private_mount_ns();
        bind(fake.0.to_str().unwrap(), BOOT_ID_FILE);
        drop(LockTable::open(&path, 1 << 22).unwrap());
        0
    });
    assert_eq!(maker.wait(Duration::from_secs(60)), 0);
    let ino = fs::metadata(&path).unwrap().ino();
    // R resets it (this boot's id differs): stop R while it holds the attached byte for writing
    let r = fork(|| {
        drop(LockTable::open(&path, 64).unwrap());
        std::thread::sleep(Duration::from_secs(30));
        0
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut stopped = false;
    while Instant::now() < deadline {
        if ofd_locks_on(ino)
            .iter()
            .any(|l| l.contains("WRITE") && l.contains(" 4001 4001"))
        {
            // SAFETY: stopping our own child.
            unsafe { libc::kill(r.0, libc::SIGSTOP) };
            std::thread::sleep(Duration::from_millis(5));
            stopped = ofd_locks_on(ino)
                .iter()
                .any(|l| l.contains("WRITE") && l.contains(" 4001 4001"));
            break;
        }
    }
    if !stopped {
        r.kill();
        panic!("could not stop the resetter inside its reset");
    }
    note!(
        "[resetter {} stopped holding the attached byte for writing: {:?}] ",
        r.0,
        ofd_locks_on(ino)
    );
    let shared = Shared::new(4);
    let b = fork(|| {
        let p = path.0.clone();
        let opener = std::thread::spawn(move || {
            let s = Instant::now();
            let res = LockTable::open(&p, 64)
                .map(|_| ())
                .map_err(|e| e.to_string());
            (s.elapsed(), res)
        });
        std::thread::sleep(Duration::from_millis(200));
        let s = Instant::now();
        // SAFETY: the child leaves at once.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: leaving the child.
            unsafe { libc::_exit(0) };
        }
        let took = s.elapsed();
        let mut st = 0;
        // SAFETY: reaping our child.
        unsafe { libc::waitpid(pid, &mut st, 0) };
        let (open_took, res) = opener.join().unwrap();
        println!(
            "\n  a thread's open: {res:?} after {open_took:?}; another thread's fork() (a child \
             that _exits at once) took {took:?}"
        );
        shared
            .word(0)
            .store(took.as_millis() as u64 + 1, Ordering::SeqCst);
        0
    });
    let rc = b.wait(Duration::from_secs(40));
    r.kill();
    let took = shared.word(0).load(Ordering::SeqCst).saturating_sub(1);
    assert_eq!(rc, 0);
    assert!(took < 500, "BROKE: fork() stalled {took} ms");
}

// ---------------------------------------------------------------------------------------
// 6. _Fork (no atfork handlers) from one thread while another sets up an anchor: the child
//    inherits SETTING_UP != 0 (or FORKING), which nothing in it will ever clear.

fn underscore_fork_child_inherits_setting_up() {
    let shared = Shared::new(8);
    let c = fork(|| {
        let dir = PathBuf::from(format!("/dev/shm/shmlock-test-uf-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = (0..2)
            .map(|i| {
                let stop = stop.clone();
                let p = dir.join(format!("t{i}"));
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        drop(LockTable::open(&p, 64).unwrap());
                    }
                })
            })
            .collect();
        // a thread forking with fork() too, so FORKING is sometimes set
        let s2 = stop.clone();
        let forker = std::thread::spawn(move || {
            while !s2.load(Ordering::Relaxed) {
                // SAFETY: the child leaves at once.
                let pid = unsafe { libc::fork() };
                if pid == 0 {
                    // SAFETY: leaving.
                    unsafe { libc::_exit(0) };
                }
                let mut st = 0;
                // SAFETY: reaping.
                unsafe { libc::waitpid(pid, &mut st, 0) };
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        std::thread::sleep(Duration::from_millis(100));
        let other = dir.join("other");
        drop(LockTable::open(&other, 64).unwrap());
        let (mut hung_fork, mut hung_open, mut ok) = (0u64, 0u64, 0u64);
        for i in 0..100u64 {
            // SAFETY: _Fork: the child runs only a fork (async-signal-safe in POSIX.1-2017)
            // or the library, with an alarm as hang guard.
            let pid = unsafe { _Fork() };
            if pid == 0 {
                // SAFETY: alarm in the child: SIGALRM kills it if it hangs.
                unsafe { libc::alarm(30) };
                if i % 2 == 0 {
                    // SAFETY: fork in the child; the grandchild leaves at once.
                    let g = unsafe { libc::fork() };
                    if g == 0 {
                        // SAFETY: leaving.
                        unsafe { libc::_exit(0) };
                    }
                    // SAFETY: leaving.
                    unsafe { libc::_exit(10) };
                } else {
                    let t = LockTable::open(&other, 64);
                    let code = match t {
                        Ok(t) => match t.try_lock_with_lease("c", Duration::from_secs(1)) {
                            Ok(_) => 11,
                            Err(_) => 12,
                        },
                        Err(_) => 13,
                    };
                    // SAFETY: leaving.
                    unsafe { libc::_exit(code) };
                }
            }
            let mut st = 0;
            let until = Instant::now() + Duration::from_secs(2);
            loop {
                // SAFETY: reaping our child.
                let r = unsafe { libc::waitpid(pid, &mut st, libc::WNOHANG) };
                if r == pid {
                    break;
                }
                if Instant::now() > until {
                    let d = describe_hang(pid);
                    let frames: Vec<&str> = d
                        .split('\n')
                        .filter(|l| l.contains(" in "))
                        .take(6)
                        .collect();
                    println!("\n  hung _Fork child {pid} (i={i}): {}", frames.join(" | "));
                    // SAFETY: killing and reaping our child.
                    unsafe {
                        libc::kill(pid, libc::SIGKILL);
                        libc::waitpid(pid, &mut st, 0);
                    }
                    // A child of a threaded process made by _Fork may find glibc's own
                    // locks (malloc's, the fork handler list's) held by a thread it does
                    // not have: a hang there is glibc's (such a child may call only
                    // async-signal-safe functions), whatever the library does. Only a hang
                    // in the library's own fork handler counts.
                    st = if d.contains("before_fork") {
                        libc::SIGALRM // counted as hung below
                    } else {
                        println!("  (in glibc, not the library: not counted)");
                        0
                    };
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            if libc::WIFSIGNALED(st) && libc::WTERMSIG(st) == libc::SIGALRM {
                if i % 2 == 0 {
                    hung_fork += 1;
                } else {
                    hung_open += 1;
                }
            } else {
                ok += 1;
            }
            shared.word(0).store(i + 1, Ordering::SeqCst);
            if hung_fork + hung_open >= 3 {
                break;
            }
        }
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            t.join().unwrap();
        }
        forker.join().unwrap();
        let _ = fs::remove_dir_all(&dir);
        shared.word(1).store(hung_fork, Ordering::SeqCst);
        shared.word(2).store(hung_open, Ordering::SeqCst);
        shared.word(3).store(ok, Ordering::SeqCst);
        0
    });
    let r = monitor(
        &c,
        &shared,
        0,
        Duration::from_secs(20),
        Duration::from_secs(300),
    );
    let (hf, ho, ok) = (
        shared.word(1).load(Ordering::SeqCst),
        shared.word(2).load(Ordering::SeqCst),
        shared.word(3).load(Ordering::SeqCst),
    );
    note!("[{r:?}: _Fork children: {ok} fine, {hf} hung in fork() (3 s alarm), {ho} hung in the library] ");
    assert!(hf + ho == 0, "BROKE: _Fork children hung");
}

// ---------------------------------------------------------------------------------------
// 8. posix_spawn (std::process::Command) and clone3 children while threads open tables:
//    none keeps a description of any table.

fn table_fds_of(pid: i32, dir: &Path) -> usize {
    // descriptors of a table that hold a lock (fdinfo "lock:" lines), and anchor mappings
    // (one PROT_NONE shared page of a table file)
    let mut n = 0;
    if let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) {
        for fd in fds.flatten() {
            if fs::read_link(fd.path()).is_ok_and(|l| l.starts_with(dir)) {
                let info = fs::read_to_string(format!(
                    "/proc/{pid}/fdinfo/{}",
                    fd.file_name().to_str().unwrap()
                ))
                .unwrap_or_default();
                if info.contains("lock:") {
                    n += 1;
                }
            }
        }
    }
    if let Ok(maps) = fs::read_to_string(format!("/proc/{pid}/maps")) {
        n += maps
            .lines()
            .filter(|l| l.contains(dir.to_str().unwrap()) && l.contains(" ---s "))
            .count()
            * 1000;
    }
    n
}

fn posix_spawn_children_hold_nothing() {
    let dir = PathBuf::from(format!(
        "/dev/shm/shmlock-test-spawn-{}",
        std::process::id()
    ));
    fs::create_dir_all(&dir).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..2)
        .map(|i| {
            let stop = stop.clone();
            let p = dir.join(format!("t{i}"));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    drop(LockTable::open(&p, 64).unwrap());
                }
            })
        })
        .collect();
    let mut kids = Vec::new();
    for _ in 0..200 {
        kids.push(
            std::process::Command::new("sleep")
                .arg("2")
                .spawn()
                .unwrap(),
        );
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let leaks: usize = kids.iter().map(|k| table_fds_of(k.id() as i32, &dir)).sum();
    for mut k in kids {
        let _ = k.kill();
        let _ = k.wait();
    }
    let _ = fs::remove_dir_all(&dir);
    note!("[200 spawned: table descriptors/mappings in them: {leaks}] ");
    assert_eq!(leaks, 0);
}

// ---------------------------------------------------------------------------------------
// 10. A forked child of a multi-threaded process whose other thread was judging an owner
//     (holding the probe mutex) at the fork: the child's first use takes that mutex.

fn forked_child_of_a_judging_thread() {
    let path = TempPath::new("judging");
    drop(LockTable::open(&path, 256).unwrap());
    let shared = Shared::new(8);
    // 30 live holders, one key each
    let holders: Vec<Child> = (0..30)
        .map(|i| {
            let p = path.0.clone();
            let sh = &shared;
            fork(move || {
                let t = LockTable::open(&p, 256).unwrap();
                let g = t.lock(format!("busy{i}"), opts(120_000, 1_000)).unwrap();
                sh.word(0).fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_secs(60));
                drop(g);
                0
            })
        })
        .collect();
    while shared.word(0).load(Ordering::SeqCst) < 30 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let c = fork(|| {
        let t = Arc::new(LockTable::open(&path, 256).unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let (t2, s2) = (t.clone(), stop.clone());
        let judge = std::thread::spawn(move || {
            let mut n = 0u64;
            while !s2.load(Ordering::Relaxed) {
                n += t2.holders().len() as u64;
            }
            n
        });
        std::thread::sleep(Duration::from_millis(50));
        let mut hung = 0;
        let mut report = String::new();
        for i in 0..200u64 {
            // SAFETY: fork from a multi-threaded process; the child uses the library as a
            // prefork worker would, with an alarm as hang guard.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                // SAFETY: hang guard.
                unsafe { libc::alarm(20) };
                let r = t.try_lock_with_lease("child", Duration::from_secs(1));
                // SAFETY: leaving.
                unsafe { libc::_exit(if r.is_ok() { 0 } else { 3 }) };
            }
            let mut st = 0;
            let until = Instant::now() + Duration::from_secs(2);
            loop {
                // SAFETY: reaping our child.
                let r = unsafe { libc::waitpid(pid, &mut st, libc::WNOHANG) };
                if r == pid {
                    break;
                }
                if Instant::now() > until {
                    hung += 1;
                    if report.is_empty() {
                        let d = describe_hang(pid);
                        let frames: Vec<&str> = d
                            .split('\n')
                            .filter(|l| l.contains(" in "))
                            .take(9)
                            .collect();
                        report = format!("child {pid} (fork #{i}): {}", frames.join(" | "));
                    }
                    // SAFETY: killing and reaping our child.
                    unsafe {
                        libc::kill(pid, libc::SIGKILL);
                        libc::waitpid(pid, &mut st, 0);
                    }
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            shared.word(1).store(i + 1, Ordering::SeqCst);
            if hung >= 3 {
                break;
            }
        }
        stop.store(true, Ordering::Relaxed);
        let n = judge.join().unwrap();
        println!(
            "\n  judge saw {n} holder rows; forks done {}; children hung 2 s+: {hung}; {report}",
            shared.word(1).load(Ordering::SeqCst)
        );
        shared.word(2).store(hung + 1, Ordering::SeqCst);
        0
    });
    let r = c.wait(Duration::from_secs(200));
    for h in holders {
        h.kill();
    }
    let hung = shared.word(2).load(Ordering::SeqCst).saturating_sub(1);
    assert_eq!(r, 0);
    assert_eq!(hung, 0, "BROKE: forked children deadlocked");
}
