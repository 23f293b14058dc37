//! The fork handshake: `fork` never deadlocks with, and never leaks to its child, a
//! registration being set up. A fork waits while another thread sets up a registration
//! (its anchor), so that no child inherits the anchor's descriptor, the parent's
//! registration; and it never waits for good: not when two threads fork at once, when a
//! signal handler forks inside `open` or inside the fork handler itself, when many threads
//! keep opening tables, when another process is stopped in a reboot reset, when another
//! library's atfork handler takes its own mutex or forks, when the fork fails, or when
//! another thread is in the middle of the process's very first call into the library (or
//! of a forked process's first use of a handle it inherited). A child
//! made by a signal handler in the middle of `open` never adopts the parent's
//! registration, and children made by glibc's `_Fork` or by a handler's fork that returns
//! can still open tables. A child a signal handler forks in the middle of an acquisition
//! never takes a hold claimed in its parent's name for its own (one that the child made
//! itself then stays until its lease ends: a known limit). Children of `posix_spawn` hold
//! no registration; one that blocks
//! before its exec does (a known limit, run with `--known-limits`).
//!
//! Exercises `src/shm/process.rs` (the fork handlers, the count of registrations being set
//! up), `src/shm/anchor.rs` (setting a registration up), `src/shm/attachment.rs` and
//! `src/shm/registry.rs` (a forked child's first use while a thread judges an owner). What a
//! child keeps of its parent once forked is in `tests/fork_and_exec.rs`.
//!
//! `fork_handshake FILTER` runs the tests whose name contains FILTER; `fork_handshake
//! --list` lists them; the root-only one runs with `--include-ignored` as root.
//! `fork_handshake --role NAME PATH` is how a test starts this binary afresh, so that the
//! order of `pthread_atfork` registrations is its own (the test kills the whole process
//! group if it hangs).

mod common;

use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::fork::{_Fork, fork, xorshift, Child, Shared};
use common::forking::{
    announce, arm_alarm, arm_alarm_in, await_flag, backtrace, held_fork,
    interrupted_in_before_fork, mask_alarm, on_alarm, report_child, watch_for_before_fork, Openers,
};
use common::harness::Test;
use common::ns::{bind, private_mount_ns, BOOT_ID_FILE};
use common::probe::{
    await_word, describe_hang, describe_threads, monitor, ofd_locks_on, stat_fields, Proc,
};
use common::{fresh_table, opts, TempPath};
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
    Test::new(
        "forks_from_two_threads_at_once_leak_no_registration",
        two_forkers,
    ),
    Test::new(
        "a_fork_in_a_signal_handler_during_a_fork_does_not_hang",
        handler_fork_in_before_fork,
    ),
    Test::new(
        "a_dead_parents_keys_are_free_despite_concurrent_forks",
        leaked_anchor_keeps_dead_parents_keys,
    ),
    Test::new(
        "a_child_forked_during_open_never_keeps_the_parents_registration",
        a_child_forked_during_open_never_keeps_the_parents_registration,
    ),
    Test::new(
        "atfork_prepare_mutex_registered_first_does_not_deadlock_open",
        atfork_mutex_first,
    ),
    Test::new(
        "atfork_prepare_mutex_registered_after_the_librarys_does_not_deadlock_open",
        atfork_mutex_after,
    ),
    Test::new(
        "child_of_a_fork_inside_a_prepare_handler_can_open",
        nested_fork_prepare,
    ),
    Test::new(
        "child_of_a_signal_handler_fork_inside_a_fork_can_open",
        nested_fork_signal,
    ),
    Test::new(
        "child_of_a_timer_signal_fork_inside_before_fork_can_open",
        timer_nested,
    ),
    Test::new("a_failed_fork_leaves_open_working", fork_fails),
    Test::new(
        "a_child_forked_during_the_processs_first_use_can_open",
        fork_during_first_use,
    ),
    Test::new(
        "a_grandchild_forked_while_its_parent_registers_can_lock",
        fork_during_reregister,
    ),
    Test::new(
        "a_child_made_by_a_handler_during_its_parents_registration_registers_itself",
        handler_fork_during_reregister,
    ),
    Test::new(
        "the_same_when_it_goes_on_once_its_parent_has_left",
        handler_fork_during_reregister_parent_gone,
    ),
    Test::new(
        "a_child_made_by_a_handler_during_its_parents_acquisition_never_takes_its_parents_hold_for_its_own",
        handler_fork_during_acquisition,
    ),
    Test::new(
        "the_same_for_a_shared_hold",
        handler_fork_during_shared_acquisition,
    ),
    Test::new(
        "a_child_made_by_a_handler_during_its_parents_renewal_leaves_the_parents_hold_alone",
        handler_fork_during_renewal,
    ),
    Test::new(
        "the_same_during_a_downgrade",
        handler_fork_during_downgrade,
    ),
    Test::new(
        "a_child_made_by_a_handler_on_keep_alives_renewer_thread_exits",
        handler_fork_on_the_renewer,
    ),
    Test::new(
        "a_claim_a_child_made_in_its_parents_name_does_not_outlive_both",
        orphaned_claims,
    )
    .known_limit(),
    // A documented fork caveat: posix_spawn clones without the fork handlers.
    Test::new(
        "a_posix_spawn_child_before_exec_holds_no_registration",
        posix_spawn_fifo,
    )
    .known_limit(),
];

fn main() {
    common::harness::run("fork_handshake", TESTS, roles);
}

fn roles(args: &[String]) -> i32 {
    let path = PathBuf::from(&args[1]);
    match args[0].as_str() {
        "atfork_mutex_first" => role_atfork_mutex(&path, true),
        "atfork_mutex_after" => role_atfork_mutex(&path, false),
        "nested_fork_prepare" => role_nested_fork(&path, false),
        "nested_fork_signal" => role_nested_fork(&path, true),
        "fork_fails" => role_fork_fails(&path),
        "fork_during_first_use" => role_fork_during_first_use(&path, Path::new(&args[2])),
        "fork_during_reregister" => role_fork_during_reregister(&path, Path::new(&args[2])),
        other => {
            eprintln!("unknown role {other}");
            2
        }
    }
}

const K: &str = "K";

// ---------------------------------------------------------------------------------------
// fork() from a signal handler that interrupted an open: the prepare handler must not wait
// for the very thread it interrupted.

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
// A child made in a signal handler that interrupted an open continues that open: the
// handle it returns must not carry the parent's registration (under the child's fork epoch
// the child would take the parent's owner id for its own, and its drop would leave the
// parent's entry).

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
            // SAFETY: polling our child; st is a valid out-pointer.
            if unsafe { libc::waitpid(child, &mut st, libc::WNOHANG) } == 0 {
                common::signal::send(child, libc::SIGKILL);
                // SAFETY: reaping our child, killed just now.
                unsafe { libc::waitpid(child, &mut st, 0) };
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
// Threads forking while many threads open tables: fork waits for a moment when no
// anchor is being set up anywhere in the process.

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
            // (a starved fork waits for as long as threads keep opening: seconds; a busy
            // machine can hold one back a few hundred ms)
            assert!(worst < 2_000_000, "BROKE: a fork waited {worst} us");
        }
        Err(e) => panic!("BROKE (fork starved): {e}"),
    }
}

// ---------------------------------------------------------------------------------------
// A process stopped in the middle of a reboot reset (it holds the attached byte for
// writing): another process's open waits for it (up to 10 s); a fork in that process must
// not wait as long.

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
            common::signal::send(r.0, libc::SIGSTOP);
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
    // (a stalled fork waits for the resetter, which resumes only when killed, 40 s on)
    assert!(took < 2_000, "BROKE: fork() stalled {took} ms");
}

// ---------------------------------------------------------------------------------------
// _Fork (no atfork handlers) from one thread while another sets up an anchor: the child
// inherits a count of registrations being set up (or of forks) that nothing in it will
// ever bring down, and must not hang on it.

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
                    common::signal::send(pid, libc::SIGKILL);
                    // SAFETY: reaping our child, killed just now; st is a valid out-pointer.
                    unsafe { libc::waitpid(pid, &mut st, 0) };
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
// posix_spawn (std::process::Command) children while threads open tables: none keeps a
// description of any table.

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
// A forked child of a multi-threaded process whose other thread was judging an owner
// (holding the probe mutex) at the fork: the child's first use must not hang on that
// mutex.

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
                    common::signal::send(pid, libc::SIGKILL);
                    // SAFETY: reaping our child, killed just now; st is a valid out-pointer.
                    unsafe { libc::waitpid(pid, &mut st, 0) };
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

// ---------------------------------------------------------------------------------------
// Helpers

/// In a forked child: whether it inherited a descriptor of inode `ino` that holds an OFD
/// lock (fdinfo "lock:" lines): a leaked anchor description (the parent's registration).
/// Raw syscalls and stack buffers only.
fn inherited_locked_fd(ino: u64) -> bool {
    for fd in 3..512 {
        // SAFETY: libc::stat is plain integers, so all-zero bytes are a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: st is a valid out-pointer; fstat on an unused descriptor number just fails.
        if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_ino != ino {
            continue;
        }
        let mut p = *b"/proc/self/fdinfo/\0\0\0\0\0\0\0\0";
        let mut n = fd;
        let mut digits = [0u8; 8];
        let mut k = 0;
        while n > 0 {
            digits[k] = b'0' + (n % 10) as u8;
            n /= 10;
            k += 1;
        }
        for i in 0..k {
            p[18 + i] = digits[k - 1 - i];
        }
        p[18 + k] = 0;
        // SAFETY: p is NUL-terminated (at most 3 digits after the 18-byte prefix, then a 0).
        let f = unsafe { libc::open(p.as_ptr().cast(), libc::O_RDONLY) };
        if f < 0 {
            continue;
        }
        let mut buf = [0u8; 2048];
        // SAFETY: buf is writable for buf.len() bytes; f is the descriptor opened above.
        let r = unsafe { libc::read(f, buf.as_mut_ptr().cast(), buf.len()) };
        // SAFETY: closing f, opened above and used by nothing else.
        unsafe { libc::close(f) };
        if r > 0 && buf[..r as usize].windows(5).any(|w| w == b"lock:") {
            return true;
        }
    }
    false
}

// ---------------------------------------------------------------------------------------
// Two threads call fork() at about the same time while other threads open tables.
// The handshake counts forkers: the first fork's parent handler must not let anchors
// be made while the second is still on its way (its child would inherit an anchor's
// descriptor, the parent's registration), and no forker may wait forever.

fn two_forkers() {
    let dir = PathBuf::from(format!(
        "/dev/shm/shmlock-test-forkers-{}",
        std::process::id()
    ));
    fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t");
    drop(LockTable::open(&path, 64).unwrap());
    let ino = fs::metadata(&path).unwrap().ino();
    let shared = Shared::new(8);
    let rounds: u64 = 1500;
    let nforkers: usize = 2;
    let c = fork(|| {
        let openers = Openers::start(&path, 2);
        for round in 0..rounds {
            let barrier = Arc::new(Barrier::new(nforkers));
            let forkers: Vec<_> = (0..nforkers)
                .map(|_| {
                    let b = barrier.clone();
                    std::thread::spawn(move || {
                        b.wait();
                        // SAFETY: a threaded fork; the child runs only raw syscalls on stack
                        // buffers (inherited_locked_fd) and _exit, all async-signal-safe.
                        let pid = unsafe { libc::fork() };
                        if pid == 0 {
                            let code = if inherited_locked_fd(ino) { 42 } else { 0 };
                            // SAFETY: leaving the child without destructors or atexit handlers.
                            unsafe { libc::_exit(code) };
                        }
                        let mut st = 0;
                        // SAFETY: reaping the child just forked; st is a valid out-pointer.
                        unsafe { libc::waitpid(pid, &mut st, 0) };
                        libc::WEXITSTATUS(st)
                    })
                })
                .collect();
            for f in forkers {
                if f.join().unwrap() == 42 {
                    shared.word(1).fetch_add(1, Ordering::SeqCst);
                }
            }
            shared.word(0).store(round + 1, Ordering::SeqCst);
        }
        openers.stop();
        0
    });
    let r = monitor(
        &c,
        &shared,
        0,
        Duration::from_secs(4),
        Duration::from_secs(60),
    );
    let leaks = shared.word(1).load(Ordering::SeqCst);
    let done = shared.word(0).load(Ordering::SeqCst);
    let _ = fs::remove_dir_all(&dir);
    match r {
        Ok(rc) => note!("[rc {rc}; {done} rounds of {nforkers} simultaneous forks; children holding the parent's registration lock: {leaks}] "),
        Err(e) => {
            note!("[children holding the parent's registration lock before the hang: {leaks}] ");
            panic!("fork hung: {e}")
        }
    }
    assert_eq!(
        leaks, 0,
        "children of a plain fork() inherited an anchor's descriptor"
    );
}

// ---------------------------------------------------------------------------------------
// A thread in fork()'s before_fork wait (an anchor is being set up by another thread)
// takes a signal whose handler forks: the nested fork's handlers count in and out,
// and the outer fork still completes.

extern "C" fn on_alarm_fork_in_before_fork(_: libc::c_int) {
    // fork only when the interrupted thread is inside shmlock's before_fork (glibc's own
    // fork is not reentrant anywhere else)
    if !interrupted_in_before_fork() {
        return;
    }
    // SAFETY: fork in a signal handler (async-signal-safe in POSIX.1-2017); the child
    // leaves at once with _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: leaving the child.
        unsafe { libc::_exit(0) };
    }
    HANDLER_FORKS.fetch_add(1, Ordering::Relaxed);
    let w = HF_WORD.load(Ordering::Relaxed);
    if !w.is_null() {
        // SAFETY: w is non-null, so it is HF_WORD's pointer to a word of `shared`, mapped until
        // this process exits.
        unsafe { (*w).fetch_add(1, Ordering::SeqCst) };
    }
}
static HF_WORD: std::sync::atomic::AtomicPtr<AtomicU64> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());
static HANDLER_FORKS: AtomicU64 = AtomicU64::new(0);

fn handler_fork_in_before_fork() {
    let dir = PathBuf::from(format!(
        "/dev/shm/shmlock-test-hfork-{}",
        std::process::id()
    ));
    fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t");
    drop(LockTable::open(&path, 64).unwrap());
    let shared = Shared::new(8);
    let c = fork(|| {
        HF_WORD.store(
            shared.word(2) as *const AtomicU64 as *mut AtomicU64,
            Ordering::Relaxed,
        );
        watch_for_before_fork();
        // SAFETY: SIG_IGN for SIGCHLD installs no handler; the kernel reaps the children.
        unsafe { libc::signal(libc::SIGCHLD, libc::SIG_IGN) };
        mask_alarm(true);
        let openers = Openers::start(&path, 2);
        mask_alarm(false);
        on_alarm(on_alarm_fork_in_before_fork);
        let mut x = 0x9e3779b97f4a7c15u64;
        // 4000 forks, and on until 5 of them were interrupted in before_fork (at most
        // 40000: a loaded machine lands fewer alarms there)
        for i in 0..40_000u64 {
            if i >= 4000 && HANDLER_FORKS.load(Ordering::Relaxed) >= 5 {
                break;
            }
            arm_alarm(&mut x);
            // SAFETY: a threaded fork whose child only calls _exit, async-signal-safe.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                // SAFETY: leaving the child.
                unsafe { libc::_exit(0) };
            }
            shared.word(0).store(i + 1, Ordering::SeqCst);
            shared
                .word(1)
                .store(HANDLER_FORKS.load(Ordering::Relaxed), Ordering::SeqCst);
        }
        openers.stop();
        0
    });
    let r = monitor(
        &c,
        &shared,
        0,
        Duration::from_secs(4),
        Duration::from_secs(60),
    );
    let _ = fs::remove_dir_all(&dir);
    let hf = shared.word(2).load(Ordering::SeqCst);
    match r {
        Ok(rc) => note!(
            "[rc {rc}; {} forks, {hf} of them interrupted by a forking handler] ",
            shared.word(0).load(Ordering::SeqCst)
        ),
        Err(e) => panic!("fork hung after {hf} handler forks: {e}"),
    }
    assert!(hf > 0, "inconclusive: no alarm landed in before_fork");
}

// ---------------------------------------------------------------------------------------
// What a leaked anchor costs: threads open handles that each keep one key (60 s
// lease) while two threads fork at once (a third forks every 20 ms so no fork stays
// stuck). Children that inherited a locked descriptor of the table would stay alive;
// the whole parent is SIGKILLed, and its keys must be free at once.

fn fork_once(ino: u64, sh: &'static Shared) {
    // SAFETY: a threaded fork; the child runs only raw syscalls on stack buffers, atomics,
    // fork and sleep (async-signal-safe in POSIX.1-2017), then _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        if inherited_locked_fd(ino) {
            let k = sh.word(2).fetch_add(1, Ordering::SeqCst) as usize;
            // a grandchild keeps the inherited descriptor; this child leaves at once
            // SAFETY: fork is async-signal-safe (POSIX.1-2017); the grandchild sleeps and _exits.
            let g = unsafe { libc::fork() };
            if g == 0 {
                // SAFETY: sleep is async-signal-safe.
                unsafe { libc::sleep(60) };
                // SAFETY: leaving the grandchild.
                unsafe { libc::_exit(0) };
            }
            if k < 32 {
                sh.word(32 + k).store(g as u64, Ordering::SeqCst);
            }
        }
        // SAFETY: leaving the child.
        unsafe { libc::_exit(0) };
    }
    let mut st = 0;
    // SAFETY: reaping the child just forked; st is a valid out-pointer.
    unsafe { libc::waitpid(pid, &mut st, 0) };
}

fn leaked_anchor_keeps_dead_parents_keys() {
    let dir = PathBuf::from(format!("/dev/shm/shmlock-test-leak-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t");
    drop(LockTable::open(&path, 1024).unwrap());
    let ino = fs::metadata(&path).unwrap().ino();
    let sh: &'static Shared = Box::leak(Box::new(Shared::new(64)));
    let lab = Proc(Some(fork(|| {
        for o in 0..2u64 {
            let p = path.clone();
            std::thread::spawn(move || {
                let mut keep = Vec::new();
                let mut i = 0u64;
                while sh.word(2).load(Ordering::SeqCst) == 0 {
                    let raw: *mut LockTable =
                        Box::into_raw(Box::new(LockTable::open(&p, 1024).unwrap()));
                    // SAFETY: raw is from Box::into_raw just above; it is freed only after
                    // its guard is dropped (below), so t is never used dangling.
                    let t: &'static LockTable = unsafe { &*raw };
                    let g = t.lock(format!("hold:{o}:{i}"), opts(60_000, 100)).unwrap();
                    i += 1;
                    keep.push((Some(g), raw as usize));
                    sh.word(4 + o as usize).store(i, Ordering::SeqCst);
                    if keep.len() >= 200 && sh.word(2).load(Ordering::SeqCst) == 0 {
                        for (g, raw) in keep.drain(..) {
                            drop(g);
                            // SAFETY: raw came from Box::into_raw, freed once, after its guard g.
                            drop(unsafe { Box::from_raw(raw as *mut LockTable) });
                        }
                    }
                }
                sh.word(1).fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_secs(120));
                drop(keep);
            });
        }
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(20));
            fork_once(ino, sh);
        });
        let mut round = 0u64;
        let t0 = Instant::now();
        while sh.word(1).load(Ordering::SeqCst) < 2 && t0.elapsed() < Duration::from_secs(12) {
            let b = Arc::new(Barrier::new(2));
            let fs: Vec<_> = (0..2)
                .map(|_| {
                    let b = b.clone();
                    std::thread::spawn(move || {
                        b.wait();
                        fork_once(ino, sh);
                    })
                })
                .collect();
            for f in fs {
                f.join().unwrap();
            }
            round += 1;
            sh.word(3).store(round, Ordering::SeqCst);
        }
        sh.word(0).store(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(120));
        0
    })));
    let deadline = Instant::now() + Duration::from_secs(90);
    while sh.word(0).load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let leaked = sh.word(2).load(Ordering::SeqCst);
    let rounds = sh.word(3).load(Ordering::SeqCst);
    let held = sh.word(1).load(Ordering::SeqCst);
    // the parent dies with all its holds
    drop(lab);
    std::thread::sleep(Duration::from_millis(50));
    let t = LockTable::open(&path, 1024).unwrap();
    let mut busy = Vec::new();
    for o in 0..2 {
        for i in 0..sh.word(4 + o as usize).load(Ordering::SeqCst) {
            let k = format!("hold:{o}:{i}");
            if t.try_lock_with_lease(&k, Duration::from_secs(1))
                .unwrap()
                .is_none()
            {
                busy.push(k);
            }
        }
    }
    let alive_owner: usize = t.holders().iter().filter(|h| h.owner_alive).count();
    for k in 0..(leaked.min(32) as usize) {
        let pid = sh.word(32 + k).load(Ordering::SeqCst) as i32;
        if pid > 0 {
            common::signal::send(pid, libc::SIGKILL);
        }
    }
    drop(t);
    let _ = fs::remove_dir_all(&dir);
    note!("[{rounds} two-fork rounds ({held} opener threads done); children holding a table lock: {leaked}; after the parent's SIGKILL, keys still busy: {} {:?}, holders judged alive: {alive_owner}] ", busy.len(), busy.iter().take(3).collect::<Vec<_>>());
    assert!(
        busy.is_empty(),
        "a dead process's keys stay busy (its registration lives on in a forked child)"
    );
}

// ---------------------------------------------------------------------------------------
// A thread forks while another thread is inside open(), with the table's description
// opened (or mapped) but its registration not set up yet. A child that then uses the
// library must not keep the parent's registration alive for as long as it lives (the
// documented caveat covers only a child that never uses the library).

fn table_refs(ino: u64) -> (usize, usize) {
    use std::os::unix::fs::MetadataExt;
    let maps = fs::read_to_string("/proc/self/maps").unwrap();
    let m = maps
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .nth(4)
                .and_then(|i| i.parse::<u64>().ok())
                == Some(ino)
        })
        .count();
    let f = fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| fs::metadata(e.ok()?.path()).ok())
        .filter(|md| md.ino() == ino)
        .count();
    (m, f)
}

/// Descriptors of `ino` whose description holds OFD locks (fdinfo lists them).
fn locked_fds(ino: u64) -> usize {
    use std::os::unix::fs::MetadataExt;
    fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            (fs::metadata(e.path()).ok()?.ino() == ino).then(|| e.file_name())
        })
        .filter(|n| {
            fs::read_to_string(format!("/proc/self/fdinfo/{}", n.to_str().unwrap()))
                .is_ok_and(|t| t.contains("OFDLCK"))
        })
        .count()
}

fn a_child_forked_during_open_never_keeps_the_parents_registration() {
    use std::os::unix::fs::MetadataExt;
    let other = TempPath::new("other");
    drop(LockTable::open(&other, 64).unwrap());
    let flag = Shared::new(8);
    let mut hit = false;
    for trial in 0..200 {
        let path = TempPath::new("forkrace");
        drop(LockTable::open(&path, 64).unwrap());
        let ino = fs::metadata(&path).unwrap().ino();
        for w in 0..8 {
            flag.word(w).store(0, Ordering::SeqCst);
        }
        // P: thread A opens T and locks K; the main thread forks workers meanwhile. A worker
        // uses the library (opens another table, locks), then reports whether anything of
        // T is still in it. A leaky worker stays alive 5 s, the others exit.
        let p = Proc::new(fork(|| {
            let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let d2 = done.clone();
            let pp = path.0.clone();
            let a = std::thread::spawn(move || {
                let t = LockTable::open(&pp, 64).unwrap();
                d2.store(true, Ordering::SeqCst);
                let g = t.lock(K, opts(60_000, 1_000)).unwrap();
                std::mem::forget(g);
                std::mem::forget(t);
            });
            let mut kids = Vec::new();
            while !done.load(Ordering::SeqCst) && kids.len() < 200 {
                kids.push(fork(|| {
                    let u = LockTable::open(&other, 64).unwrap();
                    let g = u.lock("child", opts(1_000, 1_000)).unwrap();
                    drop(g);
                    let until = Instant::now() + Duration::from_secs(3);
                    while flag.word(0).load(Ordering::SeqCst) == 0 && Instant::now() < until {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    std::thread::sleep(Duration::from_millis(10));
                    let (m, f) = table_refs(ino);
                    if f > 0 && locked_fds(ino) > 0 {
                        flag.word(2)
                            .store((m as u64) << 8 | f as u64 | 1 << 16, Ordering::SeqCst);
                        flag.word(3)
                            .store(std::process::id() as u64, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_secs(5));
                        flag.word(4).store(1, Ordering::SeqCst);
                    }
                    0
                }));
            }
            a.join().unwrap();
            flag.word(0).store(1, Ordering::SeqCst);
            for k in kids {
                let _ = k.wait(Duration::from_secs(20));
            }
            0
        }));
        await_word(&flag, 0, Duration::from_secs(20));
        std::thread::sleep(Duration::from_millis(100));
        let leak = flag.word(2).load(Ordering::SeqCst);
        if leak == 0 {
            // P waits for every worker (20 s each at most, then it fails): a worker that
            // hangs in the library (one forked while thread A held a process-wide lock)
            // fails the test instead of living on.
            let mut p = p;
            assert_eq!(
                p.wait(Duration::from_secs(120)),
                0,
                "a worker hung or failed"
            );
            continue;
        }
        hit = true;
        // kill P (SIGKILL the holder); the leaky worker, which used the library, lives on
        let pid = p.0.as_ref().unwrap().0;
        common::signal::send(pid, libc::SIGKILL);
        std::thread::sleep(Duration::from_millis(20));
        let table = LockTable::open(&path, 64).unwrap();
        let started = Instant::now();
        let r = table.lock(K, opts(60_000, 3_000));
        note!(
            "[trial {trial}: worker pid {} (used the library) still has {} mapping(s) and {} \
             descriptor(s) of T; holder SIGKILLed; a waiter's lock(K, 3 s): {} after {:?}; \
             worker gone at that time: {}] ",
            flag.word(3).load(Ordering::SeqCst),
            (leak >> 8) & 0xff,
            leak & 0xff,
            if r.is_ok() { "took K" } else { "TIMED OUT" },
            started.elapsed(),
            flag.word(4).load(Ordering::SeqCst) == 1
        );
        drop(r);
        drop(p);
        break;
    }
    assert!(
        !hit,
        "a child that used the library kept its dead parent's keys"
    );
}

// ---------------------------------------------------------------------------------------
// Running a role with a hang guard.

enum Outcome {
    Exited(i32, String),
    Hung(String),
}

fn all_pids_in_group(pgid: i32) -> Vec<i32> {
    let mut v = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let f = stat_fields(&stat);
        if f.get(2).and_then(|g| g.parse::<i32>().ok()) == Some(pgid) {
            v.push(pid);
        }
    }
    v
}

fn run_role(role: &str, path: &Path, limit: Duration) -> Outcome {
    let exe = std::env::current_exe().unwrap();
    let mut child = std::process::Command::new(exe)
        .args(["--role", role])
        .arg(path)
        .process_group(0)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let started = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            let mut s = String::new();
            use std::io::Read;
            let _ = child.stdout.take().unwrap().read_to_string(&mut s);
            // kill leftovers of the group (grandchildren)
            common::signal::send_group(pid, libc::SIGKILL);
            return Outcome::Exited(st.code().unwrap_or(-1), s.trim().to_string());
        }
        if started.elapsed() > limit {
            // describe every process of the group, twice 1 s apart (CPU progress)
            let pids = all_pids_in_group(pid);
            let first: Vec<String> = pids
                .iter()
                .map(|p| format!("pid {p}: {}", describe_threads(*p)))
                .collect();
            std::thread::sleep(Duration::from_secs(1));
            let second: Vec<String> = pids
                .iter()
                .map(|p| format!("pid {p}: {}", describe_threads(*p)))
                .collect();
            common::signal::send_group(pid, libc::SIGKILL);
            let _ = child.wait();
            let mut s = String::new();
            use std::io::Read;
            let _ = child.stdout.take().unwrap().read_to_string(&mut s);
            return Outcome::Hung(format!(
                "after {limit:?}: [{}] then 1 s later [{}]; output so far: {:?}",
                first.join(" | "),
                second.join(" | "),
                s.trim()
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

// ---------------------------------------------------------------------------------------
// pthread_atfork ordering: an application registers, before shmlock's first use, the
// usual handler that locks its mutex M around fork (prepare: lock M; parent/child:
// unlock). Prepare handlers run in reverse order of registration, so shmlock's runs
// first and bars new anchors; then the application's waits for M. A thread that holds
// M and opens a table then waits in NoFork::hold for the fork to end: deadlock. The
// control registers the application's handler after shmlock's (so it runs first).

/// The application's mutex, locked around `fork` by its handlers.
struct AppMutex(std::cell::UnsafeCell<libc::pthread_mutex_t>);
// SAFETY: a pthread mutex is made to be shared between threads; it is only ever used
// through the pthread functions.
unsafe impl Sync for AppMutex {}
static APP_MUTEX: AppMutex = AppMutex(std::cell::UnsafeCell::new(libc::PTHREAD_MUTEX_INITIALIZER));
static IN_PREPARE: AtomicBool = AtomicBool::new(false);
static A_HAS_M: AtomicBool = AtomicBool::new(false);

extern "C" fn app_prepare() {
    IN_PREPARE.store(true, Ordering::SeqCst);
    // SAFETY: a pointer to the static, initialized APP_MUTEX, which never moves.
    unsafe { libc::pthread_mutex_lock(APP_MUTEX.0.get()) };
}
extern "C" fn app_parent() {
    // SAFETY: the static APP_MUTEX, locked by app_prepare in this same forking thread.
    unsafe { libc::pthread_mutex_unlock(APP_MUTEX.0.get()) };
}
extern "C" fn app_child() {
    // SAFETY: the child's copy of APP_MUTEX, locked by app_prepare in the forking thread
    // (this child's only thread).
    unsafe { libc::pthread_mutex_unlock(APP_MUTEX.0.get()) };
}

fn role_atfork_mutex(path: &Path, app_first: bool) -> i32 {
    // SAFETY: the handlers are extern "C" fns that live as long as the program.
    let reg = || unsafe {
        assert_eq!(
            libc::pthread_atfork(Some(app_prepare), Some(app_parent), Some(app_child)),
            0
        )
    };
    if app_first {
        reg();
    }
    let t0 = LockTable::open(path, 64).unwrap(); // shmlock installs its handlers here
    if !app_first {
        reg();
    }
    let p = path.to_path_buf();
    let a = std::thread::spawn(move || {
        // SAFETY: a pointer to the static, initialized APP_MUTEX, which never moves.
        unsafe { libc::pthread_mutex_lock(APP_MUTEX.0.get()) };
        A_HAS_M.store(true, Ordering::SeqCst);
        let until = Instant::now() + Duration::from_secs(2);
        while !IN_PREPARE.load(Ordering::SeqCst) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(20));
        println!("A: opening a table while holding M");
        let _ = std::io::stdout().flush();
        let t = LockTable::open(&p, 64).unwrap();
        drop(t);
        // SAFETY: unlocking APP_MUTEX, which this thread locked above.
        unsafe { libc::pthread_mutex_unlock(APP_MUTEX.0.get()) };
        println!("A: done");
    });
    let b = std::thread::spawn(|| {
        while !A_HAS_M.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        // SAFETY: a threaded fork whose child only calls _exit, async-signal-safe.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: leaving the child.
            unsafe { libc::_exit(0) };
        }
        let mut st = 0;
        // SAFETY: reaping the child just forked; st is a valid out-pointer.
        unsafe { libc::waitpid(pid, &mut st, 0) };
        println!("B: fork done");
    });
    a.join().unwrap();
    b.join().unwrap();
    drop(t0);
    println!("completed");
    0
}

fn atfork_mutex(app_first: bool) {
    let path = fresh_table("atfork");
    let role = if app_first {
        "atfork_mutex_first"
    } else {
        "atfork_mutex_after"
    };
    match run_role(role, &path.0, Duration::from_secs(5)) {
        Outcome::Exited(rc, out) => {
            note!("[rc {rc}; {out:?}] ");
            assert_eq!(rc, 0);
        }
        Outcome::Hung(d) => {
            note!("[HUNG {d}] ");
            panic!("fork and open deadlocked");
        }
    }
}
fn atfork_mutex_first() {
    atfork_mutex(true)
}
fn atfork_mutex_after() {
    atfork_mutex(false)
}

// ---------------------------------------------------------------------------------------
// A fork made inside a fork (by another library's prepare handler, registered before
// shmlock's so it runs after shmlock's before_fork; or by a signal handler that a signal
// runs in the middle of fork()), whose child returns from the handler: that child goes on
// with the interrupted outer fork, as its parent, and runs the parent handlers,
// after_fork_in_parent included, on a counter the wipe-on-fork page zeroed. Taking FORKING
// off that 0 must not leave a count that bars the child from making an anchor for good
// (NoFork::hold would wait for a fork that is not there).

static FIRST: AtomicBool = AtomicBool::new(true);
static INNER_CHILD: AtomicBool = AtomicBool::new(false);
static INNER_PID: AtomicI32 = AtomicI32::new(0);

fn fork_in_handler() {
    // SAFETY: fork in a prepare or signal handler (async-signal-safe, POSIX.1-2017) of a
    // single-threaded role process; what its child does next is the test.
    let p = unsafe { libc::fork() };
    if p == 0 {
        INNER_CHILD.store(true, Ordering::SeqCst);
    } else {
        INNER_PID.store(p, Ordering::SeqCst);
    }
}
extern "C" fn forking_prepare() {
    if FIRST.swap(false, Ordering::SeqCst) {
        fork_in_handler();
    }
}
extern "C" fn raising_prepare() {
    if FIRST.swap(false, Ordering::SeqCst) {
        // SAFETY: raising SIGUSR1, whose handler (on_usr1) was installed before this prepare
        // handler was registered.
        unsafe { libc::raise(libc::SIGUSR1) };
    }
}
extern "C" fn on_usr1(_: libc::c_int) {
    fork_in_handler();
}

fn role_nested_fork(path: &Path, by_signal: bool) -> i32 {
    // SAFETY: a zeroed sigaction (plain C data) gets an extern "C" handler; the handlers
    // are extern "C" fns that live as long as the program.
    unsafe {
        if by_signal {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_usr1 as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut());
            assert_eq!(libc::pthread_atfork(Some(raising_prepare), None, None), 0);
        } else {
            assert_eq!(libc::pthread_atfork(Some(forking_prepare), None, None), 0);
        }
    }
    let t = LockTable::open(path, 64).unwrap(); // shmlock's handlers, registered second
    drop(t);
    // SAFETY: fork in a single-threaded role process; the child only calls _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: leaving the child.
        unsafe { libc::_exit(0) }; // the outer fork's child (or grandchild)
    }
    if INNER_CHILD.load(Ordering::SeqCst) {
        // The inner fork's child, back from the handler and past the outer fork.
        let mut st = 0;
        // SAFETY: reaping this process's own child of the outer fork; st is a valid out-pointer.
        unsafe { libc::waitpid(pid, &mut st, 0) };
        // SAFETY: default action for SIGALRM, then an alarm: it kills this child if open hangs.
        unsafe {
            libc::signal(libc::SIGALRM, libc::SIG_DFL);
            libc::alarm(3);
        }
        let s = Instant::now();
        let r = LockTable::open(path, 64);
        let code = if r.is_ok() { 0 } else { 7 };
        eprintln!("inner child: open {:?} after {:?}", r.is_ok(), s.elapsed());
        // SAFETY: leaving the inner child.
        unsafe { libc::_exit(code) };
    }
    // The original process.
    let mut st = 0;
    // SAFETY: reaping the outer fork's child; st is a valid out-pointer.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    let inner = INNER_PID.load(Ordering::SeqCst);
    if inner <= 0 {
        println!("no inner fork happened");
        return 3;
    }
    let started = Instant::now();
    let mut st = 0;
    // SAFETY: reaping the handler fork's child, ours; st is a valid out-pointer.
    unsafe { libc::waitpid(inner, &mut st, 0) };
    let waited = started.elapsed();
    // The parent can still open (its own counter is balanced).
    let own = LockTable::open(path, 64).is_ok();
    if libc::WIFSIGNALED(st) {
        println!(
            "inner child killed by signal {} (SIGALRM = 14: its open hung) after {:.2} s; \
             the parent's own open: {own}",
            libc::WTERMSIG(st),
            waited.as_secs_f64()
        );
        1
    } else {
        println!(
            "inner child exited {} after {:.2} s; the parent's own open: {own}",
            libc::WEXITSTATUS(st),
            waited.as_secs_f64()
        );
        libc::WEXITSTATUS(st)
    }
}

fn nested(role: &str) {
    let path = fresh_table("nested");
    match run_role(role, &path.0, Duration::from_secs(10)) {
        Outcome::Exited(rc, out) => {
            note!("[rc {rc}; {out}] ");
            assert_eq!(rc, 0, "the inner fork's child could not open a table");
        }
        Outcome::Hung(d) => {
            note!("[HUNG {d}] ");
            panic!("hung");
        }
    }
}
fn nested_fork_prepare() {
    nested("nested_fork_prepare")
}
fn nested_fork_signal() {
    nested("nested_fork_signal")
}

// The same without any atfork handler of ours: as in
// `a_fork_in_a_signal_handler_during_a_fork_does_not_hang` (a SIGALRM handler forks when it
// interrupts a thread inside shmlock's before_fork, which waits for opener threads), except
// that the handler's child returns from the handler instead of _exit. It goes on with the
// interrupted fork, then tries to open a table.

static HF_DONE: AtomicBool = AtomicBool::new(false);

extern "C" fn on_alarm_fork_and_return(_: libc::c_int) {
    if HF_DONE.load(Ordering::Relaxed) {
        return;
    }
    if !interrupted_in_before_fork() {
        return;
    }
    HF_DONE.store(true, Ordering::Relaxed);
    fork_in_handler();
}

fn timer_nested() {
    let dir = PathBuf::from(format!(
        "/dev/shm/shmlock-test-timer-{}",
        std::process::id()
    ));
    fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t");
    drop(LockTable::open(&path, 64).unwrap());
    let shared: &'static Shared = Box::leak(Box::new(Shared::new(8)));
    let p = path.clone();
    let c = fork(move || {
        // SAFETY: setpgid(0, 0) only moves this forked child into a group of its own.
        unsafe { libc::setpgid(0, 0) }; // its own group: killed whole at the end
        watch_for_before_fork();
        mask_alarm(true);
        let openers = Openers::start(&p, 2);
        mask_alarm(false);
        on_alarm(on_alarm_fork_and_return);
        let mut x = 0x9e3779b97f4a7c15u64;
        for i in 0..4000u64 {
            arm_alarm(&mut x);
            // SAFETY: a threaded fork whose child only calls _exit, async-signal-safe.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                // SAFETY: leaving the child.
                unsafe { libc::_exit(0) };
            }
            let mut st = 0;
            // SAFETY: reaping the child just forked; st is a valid out-pointer.
            unsafe { libc::waitpid(pid, &mut st, 0) };
            if INNER_CHILD.load(Ordering::SeqCst) {
                // the handler's child, past the outer fork: only this thread here
                shared
                    .word(3)
                    .store(std::process::id() as u64, Ordering::SeqCst);
                shared.word(1).store(1, Ordering::SeqCst);
                let r = LockTable::open(&p, 64);
                shared
                    .word(2)
                    .store(if r.is_ok() { 1 } else { 2 }, Ordering::SeqCst);
                // SAFETY: leaving the handler's child, without destructors or atexit handlers.
                unsafe { libc::_exit(0) };
            }
            if HF_DONE.load(Ordering::Relaxed) {
                let inner = INNER_PID.load(Ordering::SeqCst);
                shared.word(4).store(i + 1, Ordering::SeqCst);
                let until = Instant::now() + Duration::from_secs(3);
                while shared.word(2).load(Ordering::SeqCst) == 0 && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(5));
                }
                let _ = inner;
                break;
            }
        }
        openers.stop();
        0
    });
    let group = c.0;
    let rc = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        c.wait(Duration::from_secs(60))
    }))
    .unwrap_or(-1);
    let started = shared.word(1).load(Ordering::SeqCst);
    let result = shared.word(2).load(Ordering::SeqCst);
    let inner = shared.word(3).load(Ordering::SeqCst) as i32;
    let mut d = String::new();
    if started == 1 && result == 0 && inner > 0 {
        d = describe_hang(inner);
        common::signal::send(inner, libc::SIGKILL);
    }
    common::signal::send_group(group, libc::SIGKILL);
    let _ = fs::remove_dir_all(&dir);
    note!(
        "[rc {rc}; handler fork at outer fork #{}; inner child started open: {}, open result: {} (0 = still running after 3 s) {d}] ",
        shared.word(4).load(Ordering::SeqCst),
        started == 1,
        result
    );
    assert!(
        started == 1,
        "inconclusive: no handler fork inside before_fork"
    );
    assert_eq!(
        result, 1,
        "the handler's child cannot open a table: it hangs"
    );
}

// ---------------------------------------------------------------------------------------
// fork() that fails (clone refused by a seccomp filter with EAGAIN): glibc runs the
// parent handlers, so the FORKING count comes back and open still works.

fn role_fork_fails(path: &Path) -> i32 {
    drop(LockTable::open(path, 64).unwrap());
    #[repr(C)]
    struct SockFilter {
        code: u16,
        jt: u8,
        jf: u8,
        k: u32,
    }
    #[repr(C)]
    struct SockFprog {
        len: u16,
        filter: *const SockFilter,
    }
    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const RET_K: u16 = 0x06;
    let errno_eagain = 0x0005_0000u32 | libc::EAGAIN as u32;
    let prog = [
        SockFilter {
            code: LD_W_ABS,
            jt: 0,
            jf: 0,
            k: 0,
        },
        SockFilter {
            code: JEQ_K,
            jt: 2,
            jf: 0,
            k: libc::SYS_clone as u32,
        },
        SockFilter {
            code: JEQ_K,
            jt: 1,
            jf: 0,
            k: libc::SYS_clone3 as u32,
        },
        SockFilter {
            code: RET_K,
            jt: 0,
            jf: 0,
            k: 0x7fff_0000,
        },
        SockFilter {
            code: RET_K,
            jt: 0,
            jf: 0,
            k: errno_eagain,
        },
    ];
    let fprog = SockFprog {
        len: prog.len() as u16,
        filter: prog.as_ptr(),
    };
    // SAFETY: fprog points to prog, a valid 5-instruction BPF filter alive for the call (the
    // kernel copies it); NO_NEW_PRIVS is set first, as seccomp requires.
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        assert_eq!(
            libc::prctl(
                libc::PR_SET_SECCOMP,
                2, /* FILTER */
                &fprog as *const _ as usize,
                0,
                0
            ),
            0
        );
    }
    let mut failures = 0;
    for _ in 0..3 {
        // SAFETY: fork in a single-threaded role process; the child only calls _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: leaving the child.
            unsafe { libc::_exit(0) };
        }
        if pid < 0 {
            failures += 1;
        }
    }
    let s = Instant::now();
    let ok = LockTable::open(path, 64).is_ok();
    println!(
        "{failures} failed forks; open afterwards: {ok} in {:?}",
        s.elapsed()
    );
    if failures == 3 && ok {
        0
    } else {
        1
    }
}

fn fork_fails() {
    let path = fresh_table("forkfail");
    match run_role("fork_fails", &path.0, Duration::from_secs(5)) {
        Outcome::Exited(rc, out) => {
            note!("[rc {rc}; {out}] ");
            assert_eq!(rc, 0);
        }
        Outcome::Hung(d) => {
            note!("[HUNG {d}] ");
            panic!("open hung after a failed fork");
        }
    }
}

// ---------------------------------------------------------------------------------------
// posix_spawn (glibc: clone(CLONE_VM|CLONE_VFORK), no fork handlers) while other
// threads open tables; the spawned child blocks before its exec in a file action (an
// open of a FIFO). Does it hold an anchor's descriptor (a "lock:" line on the table's
// inode in its fdinfo) meanwhile?

fn locked_fds_of(pid: i32, ino: u64) -> usize {
    let mut n = 0;
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    for e in dir.flatten() {
        let Ok(m) = fs::metadata(e.path()) else {
            continue;
        };
        if m.ino() != ino {
            continue;
        }
        let info = fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            e.file_name().to_string_lossy()
        ))
        .unwrap_or_default();
        if info.contains("lock:") {
            n += 1;
            if std::env::var_os("SHMLOCK_SHOW_LOCKS").is_some() {
                eprintln!(
                    "fd {:?} of {pid}: {}",
                    e.file_name(),
                    info.replace('\n', " | ")
                );
            }
        }
    }
    n
}

fn posix_spawn_fifo() {
    // The spawning thread is blocked in posix_spawn until the child execs, so a helper
    // thread watches for children blocked on the FIFO, inspects them, then opens the FIFO
    // for writing to let them go.
    let path = fresh_table("spawn");
    let ino = fs::metadata(&path.0).unwrap().ino();
    let fifo = path.0.with_extension("fifo");
    let _ = fs::remove_file(&fifo);
    let shared = Shared::new(4);
    let c = fork(|| {
        let cf = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: cf is a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(cf.as_ptr(), 0o600) }, 0);
        let openers = Openers::start(&path.0, 2);
        let truebin = std::ffi::CString::new("/bin/true").unwrap();
        let rounds = 400u64;
        let me = std::process::id() as i32;
        for round in 0..rounds {
            // release thread: find the blocked child, inspect, then open the FIFO
            let fifo2 = fifo.clone();
            // SAFETY: `shared` outlives this round's release thread, which is joined below.
            let sh: &'static Shared = unsafe { &*(&shared as *const Shared) };
            let rel = std::thread::spawn(move || {
                let until = Instant::now() + Duration::from_secs(5);
                let mut kid = None;
                while kid.is_none() && Instant::now() < until {
                    for e in fs::read_dir(format!("/proc/{me}/task/{me}/children"))
                        .ok()
                        .into_iter()
                        .flatten()
                        .flatten()
                    {
                        let _ = e;
                    }
                    let kids = fs::read_to_string(format!("/proc/{me}/task/{me}/children"))
                        .unwrap_or_default();
                    kid = kids
                        .split_whitespace()
                        .next()
                        .and_then(|k| k.parse::<i32>().ok());
                    if kid.is_none() {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
                if let Some(k) = kid {
                    std::thread::sleep(Duration::from_millis(2));
                    if locked_fds_of(k, ino) > 0 {
                        sh.word(1).fetch_add(1, Ordering::SeqCst);
                    }
                }
                // let the child go
                let _w = fs::OpenOptions::new().write(true).open(&fifo2);
            });
            // SAFETY: posix_spawn_file_actions_t is plain C data; init sets it up next.
            let mut fa: libc::posix_spawn_file_actions_t = unsafe { std::mem::zeroed() };
            // SAFETY: fa is valid storage; cf is NUL-terminated and outlives the spawn below.
            unsafe {
                libc::posix_spawn_file_actions_init(&mut fa);
                libc::posix_spawn_file_actions_addopen(
                    &mut fa,
                    900,
                    cf.as_ptr(),
                    libc::O_RDONLY,
                    0,
                );
            }
            let argv = [truebin.as_ptr() as *mut libc::c_char, std::ptr::null_mut()];
            let envp = [std::ptr::null_mut::<libc::c_char>()];
            let mut pid = 0;
            // SAFETY: fa is initialized, the path NUL-terminated, argv and envp NULL-terminated;
            // all outlive the call, and fa is destroyed once, after it.
            unsafe {
                libc::posix_spawn(
                    &mut pid,
                    truebin.as_ptr(),
                    &fa,
                    std::ptr::null(),
                    argv.as_ptr(),
                    envp.as_ptr(),
                );
                libc::posix_spawn_file_actions_destroy(&mut fa);
            }
            rel.join().unwrap();
            let mut st = 0;
            // SAFETY: reaping the spawned child; st is a valid out-pointer.
            unsafe { libc::waitpid(pid, &mut st, 0) };
            shared.word(0).store(round + 1, Ordering::SeqCst);
        }
        openers.stop();
        let _ = fs::remove_file(&fifo);
        0
    });
    let rc = c.wait(Duration::from_secs(120));
    let leaks = shared.word(1).load(Ordering::SeqCst);
    note!(
        "[rc {rc}; {} posix_spawn children blocked before exec, {leaks} of them held a \
         descriptor with the parent's registration locks] ",
        shared.word(0).load(Ordering::SeqCst)
    );
    assert_eq!(
        leaks, 0,
        "posix_spawn children inherited an anchor's descriptor"
    );
}

// ---------------------------------------------------------------------------------------
// A fork while another thread makes the process's very first call into the library (which
// maps the wipe-on-fork page, installs the fork handlers and names the process): the
// child has no thread finishing that work, and must not wait for one. gdb holds the first
// user at `pthread_atfork` (inside that work) and lets only the main thread run, which
// forks; the child then opens a table and takes a lock.

fn role_fork_during_first_use(path: &Path, flags: &Path) -> i32 {
    let (p, f) = (path.to_path_buf(), flags.to_path_buf());
    // Thread A makes the first call when told; gdb stops it inside.
    std::thread::spawn(move || {
        await_flag(&f, "go");
        drop(LockTable::open(&p, 64));
    });
    announce(flags);
    await_flag(flags, "fork");
    // SAFETY: a threaded fork; the child uses the library, which is what is tested, then
    // leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let rc = match LockTable::open(path, 64) {
            Ok(t) => match t.try_lock_with_lease("K", Duration::from_secs(5)) {
                Ok(Some(_)) => 0,
                Ok(None) => 3,
                Err(_) => 4,
            },
            Err(_) => 5,
        };
        // SAFETY: leaving the child without running the parent's exit handlers.
        unsafe { libc::_exit(rc) };
    }
    report_child(pid, Duration::from_secs(10));
    // Thread A is still held by gdb: leave without joining it.
    // SAFETY: ending the process (every thread) at once.
    unsafe { libc::_exit(0) }
}

fn fork_during_first_use() {
    let path = fresh_table("firstuse");
    let out = held_fork(
        "fork_during_first_use",
        &[path.0.to_str().unwrap()],
        &["break pthread_atfork".to_string()],
        "the first use",
    );
    note!("[{out}] ");
    assert_eq!(
        out, "child exited 0",
        "the child forked during the first use"
    );
}

// ---------------------------------------------------------------------------------------
// A forked child registers anew at its first call (its parent's registration is the
// parent's), under a lock of the handle's. A grandchild forked by another thread while the
// child is in the middle of that must not find the lock held by a thread it does not
// have: gdb holds the child's registering thread inside the registration and lets only
// its main thread run, which forks; the grandchild then takes a lock with the handle.

fn role_fork_during_reregister(path: &Path, flags: &Path) -> i32 {
    let table = LockTable::open(path, 64).unwrap();
    // SAFETY: the role is single-threaded here; the child runs the test's part and leaves
    // with _exit.
    let child = unsafe { libc::fork() };
    if child == 0 {
        let (t, f) = (table.clone(), flags.to_path_buf());
        // Thread A makes the child's first call when told; gdb stops it inside.
        std::thread::spawn(move || {
            await_flag(&f, "go");
            drop(t.try_lock_with_lease("A", Duration::from_secs(5)));
        });
        announce(flags);
        await_flag(flags, "fork");
        // SAFETY: a threaded fork; the grandchild uses the handle, which is what is
        // tested, then leaves with _exit.
        let grandchild = unsafe { libc::fork() };
        if grandchild == 0 {
            let rc = match table.try_lock_with_lease(K, Duration::from_secs(5)) {
                Ok(Some(_)) => 0,
                Ok(None) => 3,
                Err(e) => {
                    eprintln!("grandchild: {e}");
                    4
                }
            };
            // SAFETY: leaving without running the child's exit handlers.
            unsafe { libc::_exit(rc) };
        }
        report_child(grandchild, Duration::from_secs(30));
        // Thread A is still held by gdb: leave without joining it.
        // SAFETY: ending the child (every thread) at once.
        unsafe { libc::_exit(0) };
    }
    let mut st = 0;
    // SAFETY: waiting for our own child (the test kills the whole group if it hangs).
    unsafe { libc::waitpid(child, &mut st, 0) };
    libc::WEXITSTATUS(st)
}

fn fork_during_reregister() {
    let path = fresh_table("reregister");
    let out = held_fork(
        "fork_during_reregister",
        &[path.0.to_str().unwrap()],
        // Inside the registration, under the handle's registration lock.
        &[format!(
            "break {}",
            common::probe::symbol("10Attachment14register_again")
        )],
        "a forked child's registration",
    );
    note!("[{out}] ");
    assert_eq!(
        out, "child exited 0",
        "the grandchild forked while its parent registered"
    );
}

// ---------------------------------------------------------------------------------------
// A signal handler forks while a forked child registers (its first use of an inherited
// handle): the grandchild runs on from the middle of the registration, and must neither
// take its parent's registration for its own (its holds would then be its parent's, free
// for the taking once the parent leaves), nor keep one of its own where its drop does not
// look (it would outlive the grandchild's last handle).

static RR_TABLE: AtomicU64 = AtomicU64::new(0);
static RR_IN_G: AtomicBool = AtomicBool::new(false);
static RR_G: AtomicI32 = AtomicI32::new(0);
/// If set: the word where the parent says which grandchild's parent has left, which the
/// grandchild waits for inside the handler, before it runs on into the interrupted call.
static RR_AWAIT_PARENT: std::sync::atomic::AtomicPtr<AtomicU64> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());
/// If set: the parent naps 1 ms in the handler after the fork, so that the grandchild
/// runs on first from where both were interrupted.
static RR_CHILD_FIRST: AtomicBool = AtomicBool::new(false);

extern "C" fn on_alarm_fork_once(_: libc::c_int) {
    if RR_IN_G.load(Ordering::Relaxed) || RR_G.load(Ordering::Relaxed) != 0 {
        return;
    }
    // `_Fork`, not `fork`: glibc's `fork` takes malloc's locks in a process that ever had
    // a second thread (this binary's earlier tests make some), and the alarm may have
    // landed inside malloc, so the handler would wait for its own thread for good.
    // SAFETY: _Fork is async-signal-safe (POSIX.1-2024); the child runs on from the
    // interrupted call, which is what is tested.
    let pid = unsafe { _Fork() };
    if pid == 0 {
        RR_IN_G.store(true, Ordering::Relaxed);
        let gone = RR_AWAIT_PARENT.load(Ordering::Relaxed);
        if !gone.is_null() {
            // SAFETY: getpid and nanosleep are async-signal-safe; the word is in a shared
            // mapping that outlives the test's processes.
            let me = unsafe { libc::getpid() } as u64;
            let nap = libc::timespec {
                tv_sec: 0,
                tv_nsec: 100_000,
            };
            for _ in 0..100_000 {
                if unsafe { &*gone }.load(Ordering::SeqCst) == me {
                    break;
                }
                unsafe { libc::nanosleep(&nap, std::ptr::null_mut()) };
            }
        }
    } else if pid > 0 {
        RR_G.store(pid, Ordering::Relaxed);
        if RR_CHILD_FIRST.load(Ordering::Relaxed) {
            let nap = libc::timespec {
                tv_sec: 0,
                tv_nsec: 1_000_000,
            };
            // SAFETY: nanosleep is async-signal-safe; `nap` is a valid timespec.
            unsafe { libc::nanosleep(&nap, std::ptr::null_mut()) };
        }
    }
}

/// In the grandchild: 0; 10 if a second handle of its own took its key while it held it
/// once its parent had left (its hold was its parent's); 11 if a registration of its pid
/// is left after it dropped its handles; 14 if its hold is listed under another pid.
fn rr_grandchild(table: LockTable, path: &Path, parent_gone: &AtomicU64) -> i32 {
    let me = std::process::id();
    let key = format!("g-{me}");
    let Ok(Some(g)) = table.try_lock_with_lease(&key, Duration::from_secs(60)) else {
        return 12;
    };
    let holder = table
        .holders()
        .into_iter()
        .find(|h| h.key_preview == key.as_bytes())
        .map(|h| h.pid);
    let until = Instant::now() + Duration::from_secs(10);
    while parent_gone.load(Ordering::SeqCst) != u64::from(me) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
    let other = LockTable::open(path, 64).unwrap();
    let stolen = other
        .try_lock_with_lease(&key, Duration::from_secs(1))
        .unwrap()
        .is_some();
    drop((g, other));
    drop(table);
    if stolen {
        eprintln!("grandchild {me}: another handle took {key} while it held it");
        return 10;
    }
    if holder != Some(me) {
        eprintln!("grandchild {me}: its hold is listed under pid {holder:?}");
        return 14;
    }
    if common::probe::registered_pids(path).contains(&me) {
        eprintln!("grandchild {me}: a registration of its pid is left after its drop");
        return 11;
    }
    0
}

fn handler_fork_during_reregister() {
    handler_fork_during_reregister_with(false);
}

/// The grandchild goes on with its parent's interrupted registration only once its parent
/// has left (it must not take the parent's registration, gone by then, for a filesystem
/// that keeps no locks).
fn handler_fork_during_reregister_parent_gone() {
    handler_fork_during_reregister_with(true);
}

fn handler_fork_during_reregister_with(await_parent: bool) {
    let path = fresh_table("rr-handler");
    let table = LockTable::open(&path, 64).unwrap();
    RR_TABLE.store(Box::into_raw(Box::new(table)) as u64, Ordering::SeqCst);
    // words: grandchildren made, holds taken from them, left registered, other failures,
    // the grandchild whose parent dropped its handle, holds listed under another pid
    let shared = Shared::new(6);
    let word: *const AtomicU64 = shared.word(4);
    let awaited = if await_parent {
        word.cast_mut()
    } else {
        std::ptr::null_mut()
    };
    RR_AWAIT_PARENT.store(awaited, Ordering::SeqCst);
    let p = path.0.clone();
    let sh = &shared;
    let trials = alarm_fork_trials(0x9e37_79b9_7f4a_7c15, 400, 40, &shared, |us| {
        // SAFETY: the handle boxed above, inherited whole by this child.
        let t = unsafe { Box::from_raw(RR_TABLE.load(Ordering::SeqCst) as *mut LockTable) };
        on_alarm(on_alarm_fork_once);
        arm_alarm_in(us);
        let first = t.try_lock_with_lease("first", Duration::from_secs(5));
        arm_alarm_in(0);
        if RR_IN_G.load(Ordering::Relaxed) {
            if let Err(e) = first {
                eprintln!("grandchild: its parent's interrupted try_lock failed: {e}");
                return 15;
            }
            drop(first);
            return rr_grandchild(*t, &p, sh.word(4));
        }
        drop(first);
        let Some(g) = grandchild_forked() else {
            return 0;
        };
        sh.word(0).fetch_add(1, Ordering::SeqCst);
        // leave: the parent's registration goes (what a grandchild that took it for
        // its own would hold its keys by)
        drop(t);
        sh.word(4).store(g as u64, Ordering::SeqCst);
        let rc = common::forking::reap_within(g, Duration::from_secs(15)).unwrap_or(13);
        match rc {
            0 => {}
            10 => {
                sh.word(1).fetch_add(1, Ordering::SeqCst);
            }
            11 => {
                sh.word(2).fetch_add(1, Ordering::SeqCst);
            }
            14 => {
                sh.word(5).fetch_add(1, Ordering::SeqCst);
            }
            _ => {
                sh.word(3).fetch_add(1, Ordering::SeqCst);
            }
        }
        0
    });
    RR_AWAIT_PARENT.store(std::ptr::null_mut(), Ordering::SeqCst); // `shared` goes
    let [made, taken, left, other, _, misnamed] =
        [0, 1, 2, 3, 4, 5].map(|i| shared.word(i).load(Ordering::SeqCst));
    note!(
        "[{trials} trials, {made} grandchildren forked mid-registration: {taken} had a key \
         taken while held, {misnamed} listed under another pid, {left} left registered, \
         {other} failed otherwise] "
    );
    assert!(made > 0, "no grandchild was forked during a registration");
    assert_eq!((taken, misnamed, left, other), (0, 0, 0, 0));
}

// ---------------------------------------------------------------------------------------
// A signal handler forks in the middle of an acquisition: the child runs on from the
// middle of its parent's `try_lock`. Whatever that call gives the child must be the
// child's own hold (which nobody takes while it is held, even once the parent is gone), or
// be told apart as its parent's (`NotOwner`); never a hold the child believes its own but
// made under its parent's registration.

/// What a grandchild made mid-acquisition found (its exit code).
const AQ_NOTHING: i32 = 0;
const AQ_OWN: i32 = 20;
const AQ_PARENTS: i32 = 21;
const AQ_TAKEN_WHILE_HELD: i32 = 10;
const AQ_LEFT_REGISTERED: i32 = 11;
const AQ_MISNAMED: i32 = 14;

/// In the grandchild, with what its parent's interrupted `try_lock` returned to it.
fn aq_grandchild<B: shmlock::Backend>(
    table: &LockTable,
    got: Result<Option<shmlock::LockGuard<'_, B>>, shmlock::Error>,
    key: &str,
    path: &Path,
    parent_gone: &AtomicU64,
) -> i32 {
    let me = std::process::id();
    let g = match got {
        Ok(Some(g)) => g,
        Ok(None) => return AQ_NOTHING,
        Err(e) => {
            eprintln!("grandchild {me}: try_lock failed: {e}");
            return 12;
        }
    };
    match g.check() {
        Ok(()) => {}
        Err(shmlock::Error::NotOwner) => {
            drop(g);
            return AQ_PARENTS;
        }
        Err(e) => {
            eprintln!("grandchild {me}: check of its hold failed: {e}");
            return 12;
        }
    }
    let listed = table
        .holders()
        .into_iter()
        .any(|h| h.key_preview == key.as_bytes() && h.pid == me);
    let until = Instant::now() + Duration::from_secs(10);
    while parent_gone.load(Ordering::SeqCst) != u64::from(me) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
    let other = LockTable::open(path, 64).unwrap();
    let stolen = other
        .try_lock_with_lease(key, Duration::from_secs(1))
        .unwrap()
        .is_some();
    let released = g.unlock();
    drop(other);
    if stolen {
        eprintln!("grandchild {me}: another handle took {key} while it held it");
        return AQ_TAKEN_WHILE_HELD;
    }
    if !listed {
        eprintln!("grandchild {me}: its hold is not listed under its pid");
        return AQ_MISNAMED;
    }
    if let Err(e) = released {
        eprintln!("grandchild {me}: unlock of its own hold failed: {e}");
        return 12;
    }
    AQ_OWN
}

fn handler_fork_during_acquisition() {
    handler_fork_during(|t, key| t.try_lock_with_lease(key, Duration::from_secs(60)));
}

fn handler_fork_during_shared_acquisition() {
    handler_fork_during(|t, key| t.try_lock_shared(key, Duration::from_secs(60)));
}

/// One attempt at a key: `try_lock` in the mode under test.
type TryLock<B> =
    for<'t> fn(&'t LockTable, &str) -> Result<Option<shmlock::LockGuard<'t, B>>, shmlock::Error>;

fn handler_fork_during<B: shmlock::Backend>(try_lock: TryLock<B>) {
    // (the grandchild goes on at once: see `on_alarm_fork_once`)
    RR_AWAIT_PARENT.store(std::ptr::null_mut(), Ordering::SeqCst);
    let path = fresh_table("aq-handler");
    // words: grandchildren made mid-acquisition, with a hold of their own, with their
    // parent's (NotOwner), holds taken from them, misnamed, left registered, other
    // failures, the grandchild whose parent has left
    let shared = Shared::new(8);
    let p = path.0.clone();
    let sh = &shared;
    let trials = alarm_fork_trials(0x2545_f491_4f6c_dd1d, 200, 60, &shared, |us| {
        let (t, key) = armed_trial(&p, us);
        let started = Instant::now();
        loop {
            let got = try_lock(&t, &key);
            if RR_IN_G.load(Ordering::Relaxed) {
                let rc = aq_grandchild(&t, got, &key, &p, sh.word(7));
                drop(t);
                if rc == AQ_OWN && common::probe::registered_pids(&p).contains(&std::process::id())
                {
                    eprintln!("grandchild: a registration of its pid is left after its drop");
                    return AQ_LEFT_REGISTERED;
                }
                return rc;
            }
            drop(got);
            if RR_IN_G.load(Ordering::Relaxed) {
                return AQ_NOTHING; // forked in the release: not what is tested
            }
            if RR_G.load(Ordering::Relaxed) != 0 || started.elapsed() > Duration::from_secs(1) {
                break;
            }
        }
        let Some(g) = grandchild_forked() else {
            return 0;
        };
        // leave: the parent's registration goes (what a hold made in its name, that
        // the grandchild took for its own, would stand on)
        drop(t);
        sh.word(7).store(g as u64, Ordering::SeqCst);
        let rc = common::forking::reap_within(g, Duration::from_secs(15)).unwrap_or(13);
        let word = match rc {
            AQ_NOTHING => None,
            AQ_OWN => Some(1),
            AQ_PARENTS => Some(2),
            AQ_TAKEN_WHILE_HELD => Some(3),
            AQ_MISNAMED => Some(4),
            AQ_LEFT_REGISTERED => Some(5),
            _ => Some(6),
        };
        if let Some(w) = word {
            sh.word(0).fetch_add(1, Ordering::SeqCst);
            sh.word(w).fetch_add(1, Ordering::SeqCst);
        }
        0
    });
    let [made, own, parents, taken, misnamed, left, other, _] =
        [0, 1, 2, 3, 4, 5, 6, 7].map(|i| shared.word(i).load(Ordering::SeqCst));
    note!(
        "[{trials} trials, {made} grandchildren given a guard mid-acquisition: {own} their \
         own, {parents} their parent's; {taken} had a key taken while held, {misnamed} \
         not listed under their pid, {left} left registered, {other} failed otherwise] "
    );
    assert!(
        made > 0,
        "no grandchild was given a guard by an interrupted try_lock"
    );
    assert_eq!((taken, misnamed, left, other), (0, 0, 0, 0));
}

// ---------------------------------------------------------------------------------------
// A signal handler forks in the middle of a change of a held guard in place (a renewal, a
// downgrade): the child runs on from the middle of it. It must leave its parent's hold
// alone: a child that finished the change in its parent's name made the parent take its
// hold for lost (`Expired`), and the key stayed held by nobody until the lease ended (for
// good with a lease of 0).

/// The grandchild came out of the change under test.
const CH_IN_CHANGE: i32 = 30;
/// The grandchild came out of something else (the acquisition or the release around the
/// change: not what is tested).
const CH_ELSEWHERE: i32 = 31;

fn handler_fork_during_renewal() {
    handler_fork_during_change(0x6a09_e667_f3bc_c908, |mut g| {
        for i in 0..16 {
            // a lease of 0 (for good) and the guard's own, in turn
            g.expire((i % 2 == 0).then_some(Duration::ZERO))?;
        }
        Ok(g)
    });
}

fn handler_fork_during_downgrade() {
    handler_fork_during_change(0xbb67_ae85_84ca_a73b, |g| g.downgrade());
}

/// A change of an exclusive guard in place, in the mode under test: the guard it leaves.
type Change<B> = for<'t> fn(
    shmlock::LockGuard<'t, LockTable>,
) -> Result<shmlock::LockGuard<'t, B>, shmlock::Error>;

fn handler_fork_during_change<B: shmlock::Backend>(seed: u64, change: Change<B>) {
    // (the grandchild goes on at once: see `on_alarm_fork_once`)
    RR_AWAIT_PARENT.store(std::ptr::null_mut(), Ordering::SeqCst);
    RR_CHILD_FIRST.store(true, Ordering::SeqCst);
    let path = fresh_table("ch-handler");
    // words: grandchildren forked mid-change, parents whose change or release found their
    // hold lost, keys left held once both let go, grandchildren that failed
    let shared = Shared::new(4);
    let p = path.0.clone();
    let sh = &shared;
    let trials = alarm_fork_trials(seed, 200, 100, &shared, |us| {
        let (t, key) = armed_trial(&p, us);
        let started = Instant::now();
        let mut lost = false;
        loop {
            let got = t.try_lock_with_lease(&key, Duration::from_secs(60));
            if RR_IN_G.load(Ordering::Relaxed) {
                return CH_ELSEWHERE;
            }
            let Ok(Some(g)) = got else {
                lost = true; // the key was not free between rounds
                break;
            };
            let changed = change(g);
            if RR_IN_G.load(Ordering::Relaxed) {
                return CH_IN_CHANGE; // whatever it came out with, let go
            }
            let released = changed.and_then(|g| g.unlock());
            if RR_IN_G.load(Ordering::Relaxed) {
                return CH_ELSEWHERE;
            }
            if released.is_err() {
                lost = true;
                break;
            }
            if RR_G.load(Ordering::Relaxed) != 0 || started.elapsed() > Duration::from_secs(1) {
                break;
            }
        }
        let Some(g) = grandchild_forked() else {
            return 0;
        };
        match common::forking::reap_within(g, Duration::from_secs(15)) {
            Some(CH_IN_CHANGE) => {}
            Some(CH_ELSEWHERE) => return 0,
            _ => {
                sh.word(3).fetch_add(1, Ordering::SeqCst);
                return 0;
            }
        }
        sh.word(0).fetch_add(1, Ordering::SeqCst);
        if lost {
            sh.word(1).fetch_add(1, Ordering::SeqCst);
        }
        // both have let go of whatever they had: the key must be free
        if t.try_lock_with_lease(&key, Duration::from_secs(1))
            .unwrap()
            .is_none()
        {
            sh.word(2).fetch_add(1, Ordering::SeqCst);
        }
        0
    });
    RR_CHILD_FIRST.store(false, Ordering::SeqCst);
    let [made, lost, held, failed] = [0, 1, 2, 3].map(|i| shared.word(i).load(Ordering::SeqCst));
    note!(
        "[{trials} trials, {made} grandchildren forked mid-change: {lost} parents told their \
         hold was lost, {held} keys left held by nobody, {failed} grandchildren failed] "
    );
    assert!(made > 0, "no grandchild was forked during a change");
    assert_eq!((lost, held, failed), (0, 0, 0));
}

// ---------------------------------------------------------------------------------------
// A signal handler forks on `keep_alive`'s renewer thread: the child has that thread
// alone, which goes on renewing a hold that is its parent's. It must stop (the hold is
// not its own to renew) and so the child ends; it used to try again every third of the
// lease, for good.

fn handler_fork_on_the_renewer() {
    RR_AWAIT_PARENT.store(std::ptr::null_mut(), Ordering::SeqCst);
    let path = fresh_table("ka-handler");
    // words: grandchildren forked on the renewer, that did not end, that failed
    // otherwise, keys left held once both let go; parents whose lease was lost (load)
    let shared = Shared::new(5);
    let p = path.0.clone();
    let sh = &shared;
    let trials = alarm_fork_trials(0x510e_527f_ade6_82d1, 250_000, 6, &shared, |us| {
        let (t, key) = armed_trial(&p, 0);
        let mut g = t
            .try_lock_with_lease(&key, Duration::from_millis(300))
            .unwrap()
            .unwrap();
        let (_, lease) = g.keep_alive(|_| {
            // (the alarm goes to the renewer: this thread blocks it, the renewer, made
            // before, does not)
            mask_alarm(true);
            arm_alarm_in(us);
            std::thread::sleep(Duration::from_millis(400));
        });
        mask_alarm(false);
        if RR_IN_G.load(Ordering::Relaxed) {
            return 12; // the grandchild runs only the renewer, never this
        }
        if lease.is_err() {
            sh.word(4).fetch_add(1, Ordering::SeqCst);
        }
        drop(g.unlock());
        let Some(gc) = grandchild_forked() else {
            return 0;
        };
        sh.word(0).fetch_add(1, Ordering::SeqCst);
        match common::forking::reap_within(gc, Duration::from_secs(5)) {
            Some(0) => {}
            None => drop(sh.word(1).fetch_add(1, Ordering::SeqCst)),
            Some(_) => drop(sh.word(2).fetch_add(1, Ordering::SeqCst)),
        }
        if t.try_lock_with_lease(&key, Duration::from_secs(1))
            .unwrap()
            .is_none()
        {
            sh.word(3).fetch_add(1, Ordering::SeqCst);
        }
        0
    });
    let [made, hung, failed, held, lapsed] =
        [0, 1, 2, 3, 4].map(|i| shared.word(i).load(Ordering::SeqCst));
    note!(
        "[{trials} trials, {made} grandchildren forked on the renewer: {hung} still running \
         after 5 s, {failed} failed, {held} keys left held; {lapsed} parents' leases lapsed] "
    );
    assert!(made > 0, "no grandchild was forked on the renewer");
    assert_eq!((hung, failed, held), (0, 0, 0));
}

// ---------------------------------------------------------------------------------------
// The cost of `handler_fork_during`'s fix: a child forked in the middle of its parent's
// acquisition, before the claim, may make that claim itself, in its parent's name (the
// request was made for the parent). It cannot tell that claim from its parent's own hold,
// so it neither keeps nor releases it; the key stays held until the lease ends or the
// parent is gone. Fails today (a known limit): closing it takes the claim and the look at
// who makes it in one step, which signals blocked around every acquisition would cost.

fn orphaned_claims() {
    RR_AWAIT_PARENT.store(std::ptr::null_mut(), Ordering::SeqCst);
    let path = fresh_table("aq-orphan");
    // words: grandchildren made mid-acquisition, keys left held once both let go
    let shared = Shared::new(2);
    let p = path.0.clone();
    let sh = &shared;
    alarm_fork_trials(0x3c6e_f372_fe94_f82b, 200, 40, &shared, |us| {
        let (t, key) = armed_trial(&p, us);
        let started = Instant::now();
        loop {
            let got = t.try_lock_with_lease(&key, Duration::from_secs(60));
            let in_grandchild = RR_IN_G.load(Ordering::Relaxed);
            drop(got);
            if in_grandchild || RR_IN_G.load(Ordering::Relaxed) {
                return 0; // whatever it came out with, let go
            }
            if RR_G.load(Ordering::Relaxed) != 0 || started.elapsed() > Duration::from_secs(1) {
                break;
            }
        }
        let Some(g) = grandchild_forked() else {
            return 0;
        };
        sh.word(0).fetch_add(1, Ordering::SeqCst);
        assert_eq!(
            common::forking::reap_within(g, Duration::from_secs(15)),
            Some(0)
        );
        // both have let go of whatever they had: the key must be free
        if t.try_lock_with_lease(&key, Duration::from_secs(1))
            .unwrap()
            .is_none()
        {
            sh.word(1).fetch_add(1, Ordering::SeqCst);
        }
        0
    });
    let [made, held] = [0, 1].map(|i| shared.word(i).load(Ordering::SeqCst));
    note!("[{made} grandchildren forked mid-acquisition: {held} keys left held by nobody] ");
    assert!(made > 0, "no grandchild was forked during an acquisition");
    assert_eq!(held, 0, "claims made in a parent's name outlived both");
}

/// Trials of a child whose alarm fires `us` µs (1 to `max_us`, drawn from `seed`) into
/// what it runs, `child(us)`, until the children have counted `wanted` in `shared`'s word
/// 0, or for 20 s. Returns the number of trials.
fn alarm_fork_trials(
    seed: u64,
    max_us: u64,
    wanted: u64,
    shared: &Shared,
    child: impl Fn(u64) -> i32,
) -> u32 {
    let mut x = seed ^ u64::from(std::process::id());
    let until = Instant::now() + Duration::from_secs(20);
    let mut trials = 0;
    while Instant::now() < until && shared.word(0).load(Ordering::SeqCst) < wanted {
        trials += 1;
        let us = 1 + xorshift(&mut x) % max_us;
        let c = fork(|| child(us));
        assert_eq!(c.wait(Duration::from_secs(30)), 0);
    }
    trials
}

/// In a trial child: the table at `path`, registered (by a hold of this process's key,
/// taken and let go), the key, and the forking handler armed to fire in `us` µs.
fn armed_trial(path: &Path, us: u64) -> (LockTable, String) {
    let t = LockTable::open(path, 64).unwrap();
    let key = format!("k-{}", std::process::id());
    drop(t.try_lock_with_lease(&key, Duration::from_secs(60)));
    on_alarm(on_alarm_fork_once);
    arm_alarm_in(us);
    (t, key)
}

/// Stops the alarm (in the child the trial forked): the grandchild its handler forked, if
/// it did.
fn grandchild_forked() -> Option<libc::pid_t> {
    arm_alarm_in(0);
    let g = RR_G.load(Ordering::Relaxed);
    (g != 0).then_some(g)
}
