//! Forks inside forks and against the application's own fork handlers, waiters on
//! stalled, renewing and expired holds (CPU and timeouts), with real processes. Each fork scenario runs in a freshly spawned copy of this
//! binary (`--role NAME PATH`) so that the order of `pthread_atfork` registrations is
//! controlled; the test kills it (its whole process group) if it hangs.
mod common;

use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::{Duration, Instant};

use common::fork::{fork, Child, Shared};
use common::forking::{
    arm_alarm, interrupted_in_before_fork, mask_alarm, on_alarm, watch_for_before_fork, Openers,
};
use common::harness::Test;
use common::probe::{
    await_word, describe_hang, describe_threads, flagging_waiter, header_u64, mapping_base,
    mono_ns, place, registry_len, stat_fields, GdbStop, Proc, Watch,
};
use common::{fresh_table, TempPath};
use shmlock::{LockOptions, LockTable};

const TESTS: &[Test] = &[
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
    // The README's fork caveat: posix_spawn clones without the fork handlers.
    Test::new(
        "a_posix_spawn_child_before_exec_holds_no_registration",
        posix_spawn_fifo,
    )
    .known_limit(),
    // The README's known limit: the futex sees 23 bits of the generation.
    Test::new(
        "a_late_sleeper_is_refused_its_sleep_after_a_generation_wrap",
        gen_wrap_lost_wakeup,
    )
    .known_limit()
    .release_only(),
    Test::new(
        "a_waiter_on_a_holder_renewing_in_a_loop_sleeps",
        renewing_tight_loop,
    ),
    Test::new(
        "a_waiter_on_a_stalled_renewal_keeps_its_timeout",
        stalled_extending,
    ),
    Test::new(
        "a_waiter_on_a_stalled_claim_keeps_its_timeout",
        stalled_claiming,
    ),
    Test::new(
        "a_waiter_on_a_renewing_short_lease_keeps_its_timeout",
        renewing_short_lease,
    ),
    Test::new(
        "a_waiter_on_an_expired_unstealable_looking_hold_does_not_spin",
        expired_hold_liveness_off,
    ),
];

fn main() {
    common::harness::run("adversarial7", TESTS, roles);
}

fn roles(args: &[String]) -> i32 {
    let path = PathBuf::from(&args[1]);
    match args[0].as_str() {
        "atfork_mutex_first" => role_atfork_mutex(&path, true),
        "atfork_mutex_after" => role_atfork_mutex(&path, false),
        "nested_fork_prepare" => role_nested_fork(&path, false),
        "nested_fork_signal" => role_nested_fork(&path, true),
        "fork_fails" => role_fork_fails(&path),
        other => {
            eprintln!("unknown role {other}");
            2
        }
    }
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
            // SAFETY: a plain signal (no memory) to the group our child led (process_group(0)).
            unsafe { libc::kill(-pid, libc::SIGKILL) };
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
            // SAFETY: a plain signal to our child's group; the child is not yet reaped.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
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
// F1. pthread_atfork ordering: an application registers, before shmlock's first use, the
//     usual handler that locks its mutex M around fork (prepare: lock M; parent/child:
//     unlock). Prepare handlers run in reverse order of registration, so shmlock's runs
//     first and bars new anchors; then the application's waits for M. A thread that holds
//     M and opens a table then waits in NoFork::hold for the fork to end: deadlock. The
//     control registers the application's handler after shmlock's (so it runs first).

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
// F2. A fork made inside a fork (by another library's prepare handler, registered before
//     shmlock's so it runs after shmlock's before_fork; or by a signal handler that a
//     signal runs in the middle of fork()), whose child returns from the handler: that
//     child goes on with the interrupted outer fork, as its parent, and runs the parent
//     handlers, after_fork_in_parent included, on a counter the wipe-on-fork page zeroed.
//     fetch_sub(FORKING) on 0 leaves 0xffff0000: the child can never make an anchor again
//     (NoFork::hold waits for a fork that is not there).

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

// F2b. The same without any atfork handler of ours: adversarial6's A2 (a SIGALRM handler
//      forks when it interrupts a thread inside shmlock's before_fork, which waits for
//      opener threads), except that the handler's child returns from the handler instead
//      of _exit. It goes on with the interrupted fork, then tries to open a table.

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
        // SAFETY: a plain signal (no memory involved) to the inner child, a grandchild of ours.
        unsafe { libc::kill(inner, libc::SIGKILL) };
    }
    // SAFETY: a plain signal (no memory) to the group our child made with setpgid(0, 0).
    unsafe { libc::kill(-group, libc::SIGKILL) };
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
// F3. fork() that fails (clone refused by a seccomp filter with EAGAIN): glibc runs the
//     parent handlers, so the FORKING count comes back and open still works.

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
// F4. posix_spawn (glibc: clone(CLONE_VM|CLONE_VFORK), no fork handlers) while other
//     threads open tables; the spawned child blocks before its exec in a file action (an
//     open of a FIFO). Does it hold an anchor's descriptor (a "lock:" line on the table's
//     inode in its fdinfo) meanwhile?

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
// Waiting: forged transitional entries (the table is untrusted input, and a forged word
// is exactly what a stopped owner leaves), timeout accounting and wake-ups.

/// Forges the next generation of `slot`'s word in `state` (owner, tag, reach kept).
fn forge_next(w: &Watch, slot: usize, state: u64) -> u64 {
    let c = w.at(slot, 0).load(Ordering::SeqCst);
    let g = common::word::gen(c) + 1;
    let glow = g & ((1 << 23) - 1);
    let ghigh = (g >> 23) & 7;
    let keep = c & !(7 | (((1u64 << 23) - 1) << 9) | (7u64 << 61) | 8);
    let n = keep | state | glow << 9 | ghigh << 61;
    w.at(slot, 0)
        .compare_exchange(c, n, Ordering::SeqCst, Ordering::SeqCst)
        .unwrap();
    n
}

/// CPU ticks (utime + stime) and voluntary context switches of this process.
fn self_usage() -> (u64, u64) {
    let stat = fs::read_to_string("/proc/self/stat").unwrap();
    let f: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    let cpu = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    let status = fs::read_to_string("/proc/self/status").unwrap();
    let vol = status
        .lines()
        .find(|l| l.starts_with("voluntary_ctxt_switches"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (cpu, vol)
}

fn timed_wait(t: &LockTable, key: &str, o: &LockOptions) -> (bool, Duration, u64, u64) {
    let (c0, v0) = self_usage();
    let s = Instant::now();
    let r = t.lock(key, o);
    let took = s.elapsed();
    let (c1, v1) = self_usage();
    (r.is_ok(), took, c1 - c0, v1 - v0)
}

/// A holder process H takes `key` for `lease_ms`, then the test forges its word into
/// `state` (what H would leave if stopped right after its CAS). A waiter in this process
/// then locks with `timeout_ms`.
fn stalled(state: u64, lease_ms: u64, timeout_ms: u64) -> (bool, Duration, u64, u64, String) {
    let path = fresh_table("stall");
    let shared: &'static Shared = Box::leak(Box::new(Shared::new(4)));
    let p = path.0.clone();
    let h = fork(move || {
        let t = LockTable::open(&p, 64).unwrap();
        let g = t
            .lock(
                "K",
                LockOptions {
                    exptime: Duration::from_millis(lease_ms),
                    ..LockOptions::default()
                },
            )
            .unwrap();
        shared.word(0).store(
            1 + t.debug_placement("K").unwrap().1 as u64,
            Ordering::SeqCst,
        );
        std::thread::sleep(Duration::from_secs(60));
        drop(g);
        0
    });
    let until = Instant::now() + Duration::from_secs(10);
    while shared.word(0).load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < until);
        std::thread::sleep(Duration::from_millis(1));
    }
    let slot = shared.word(0).load(Ordering::SeqCst) as usize - 1;
    let w = Watch::new(&path.0);
    let forged = forge_next(&w, slot, state);
    let t = LockTable::open(&path, 64).unwrap();
    let o = LockOptions {
        exptime: Duration::from_secs(60),
        timeout: Duration::from_millis(timeout_ms),
        ..LockOptions::default()
    };
    let (ok, took, cpu, vol) = timed_wait(&t, "K", &o);
    let after = w.at(slot, 0).load(Ordering::SeqCst);
    h.kill();
    (
        ok,
        took,
        cpu,
        vol,
        format!("forged {forged:#x}, after {after:#x}"),
    )
}

fn stalled_extending() {
    // H's lease (20 s) is far from over: the renewal stalled before its deadline is not
    // broken; the waiter can only time out, after its timeout (3 s).
    let (ok, took, cpu, vol, words) = stalled(3, 20_000, 3_000);
    note!(
        "[EXTENDING stalled, lease 20 s, timeout 3 s: {} after {:.3} s, cpu {} ticks, \
         {vol} voluntary switches; {words}] ",
        if ok { "got" } else { "timed out" },
        took.as_secs_f64(),
        cpu
    );
    assert!(!ok);
    assert!(
        took < Duration::from_millis(3_250),
        "a waiter overran its 3 s timeout by {:?}",
        took.saturating_sub(Duration::from_secs(3))
    );
}

fn stalled_claiming() {
    // A claim stalled: broken after 500 ms, so a 2 s wait gets the key at ~0.5 s.
    let (ok, took, cpu, vol, words) = stalled(1, 20_000, 2_000);
    note!(
        "[CLAIMING stalled, timeout 2 s: {} after {:.3} s, cpu {} ticks, {vol} voluntary \
         switches; {words}] ",
        if ok { "got" } else { "timed out" },
        took.as_secs_f64(),
        cpu
    );
    // and with a timeout shorter than the stall bound: times out on time
    let (ok2, took2, cpu2, vol2, _) = stalled(1, 20_000, 300);
    note!(
        "[timeout 300 ms: {} after {:.3} s, cpu {cpu2} ticks, {vol2} switches] ",
        if ok2 { "got" } else { "timed out" },
        took2.as_secs_f64()
    );
    // generous margins over the 500 ms bound and the 300 ms timeout (a loaded machine)
    assert!(ok && took < Duration::from_millis(1_500));
    assert!(!ok2 && took2 < Duration::from_millis(550));
}

/// A holder of "K" on a fresh table that renews its lease of `lease` until word 3 is set
/// (or 20 s): after each `pause`, or back to back. Word 1 counts the renewals, word 2 is
/// set if one failed (the lease was lost). Returns once it holds.
fn renewing_holder(
    name: &str,
    lease: Duration,
    pause: Option<Duration>,
) -> (TempPath, &'static Shared, Child) {
    let path = fresh_table(name);
    let shared: &'static Shared = Box::leak(Box::new(Shared::new(4)));
    let p = path.0.clone();
    let h = fork(move || {
        let t = LockTable::open(&p, 64).unwrap();
        let o = LockOptions {
            exptime: lease,
            ..LockOptions::default()
        };
        let mut g = t.lock("K", o).unwrap();
        shared.word(0).store(1, Ordering::SeqCst);
        let s = Instant::now();
        let mut n = 0u64;
        while s.elapsed() < Duration::from_secs(20) && shared.word(3).load(Ordering::Relaxed) == 0 {
            if let Some(pause) = pause {
                std::thread::sleep(pause);
            }
            if g.expire(Some(lease)).is_err() {
                shared.word(2).store(1, Ordering::SeqCst);
                break;
            }
            n += 1;
            shared.word(1).store(n, Ordering::Relaxed);
        }
        0
    });
    await_word(shared, 0, Duration::from_secs(10));
    (path, shared, h)
}

/// A 2 s wait for "K" (lease 60 s) on the table at `path`: see [`timed_wait`].
fn wait_two_seconds(path: &TempPath) -> (bool, Duration, u64, u64) {
    let t = LockTable::open(path, 64).unwrap();
    let o = LockOptions {
        exptime: Duration::from_secs(60),
        timeout: Duration::from_millis(2_000),
        ..LockOptions::default()
    };
    timed_wait(&t, "K", &o)
}

fn renewing_short_lease() {
    // H renews a 30 ms lease every 10 ms (extend in a loop); the waiter's sleeps are cut
    // at each (old) lease end: how many wake-ups, and does it keep its 2 s timeout?
    let lease = Duration::from_millis(30);
    let (path, shared, h) = renewing_holder("renew", lease, Some(Duration::from_millis(10)));
    let (ok, took, cpu, vol) = wait_two_seconds(&path);
    let lost = shared.word(2).load(Ordering::SeqCst);
    h.kill();
    note!(
        "[{} after {:.3} s, cpu {cpu} ticks, {vol} voluntary switches, holder lost its \
         lease: {}] ",
        if ok { "got" } else { "timed out" },
        took.as_secs_f64(),
        lost == 1
    );
    assert!(!ok && took < Duration::from_millis(2_250));
}

fn expired_hold_liveness_off() {
    // A holder with a short lease, killed; waiters with liveness(false) and a long lease
    // left... here: the lease ends 200 ms into a 3 s wait; the waiter must take the key by
    // ~204 ms (lease cap), with few wake-ups.
    let path = fresh_table("liveoff");
    let shared: &'static Shared = Box::leak(Box::new(Shared::new(4)));
    let p = path.0.clone();
    let h = fork(move || {
        let t = LockTable::open(&p, 64).unwrap();
        let g = t
            .lock(
                "K",
                LockOptions {
                    exptime: Duration::from_millis(300),
                    ..LockOptions::default()
                },
            )
            .unwrap();
        std::mem::forget(g);
        shared.word(0).store(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(60));
        0
    });
    while shared.word(0).load(Ordering::SeqCst) == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    h.kill(); // dead holder; liveness off: only the lease frees it
    let t = LockTable::options()
        .capacity(64)
        .liveness(false)
        .open(&path.0)
        .unwrap();
    let o = LockOptions {
        exptime: Duration::from_secs(60),
        timeout: Duration::from_millis(3_000),
        ..LockOptions::default()
    };
    let (ok, took, cpu, vol) = timed_wait(&t, "K", &o);
    note!(
        "[liveness off, dead holder, lease 300 ms: {} after {:.3} s, cpu {cpu} ticks, {vol} \
         voluntary switches] ",
        if ok { "got" } else { "timed out" },
        took.as_secs_f64()
    );
    // the lease ends at 300 ms; a waiter not cut at the lease would get it at the end of
    // its 256 ms step, at 511 ms
    assert!(ok && took < Duration::from_millis(480));
}

#[allow(dead_code)]
fn unused(_: &Child) {}

// ---------------------------------------------------------------------------------------
// W1. adversarial6's lost wake-up (W stopped by gdb at the entry of its FUTEX_WAIT on H's
//     flagged hold of K1; H releases K1 and takes K2 in the same slot; X flags K2's hold),
//     except that H then cycles K2 until the slot's generation has come round 2^23
//     transitions to W's value (the low half holds only 23 bits of it): the low halves are
//     equal again, the kernel lets W sleep, and W sleeps its whole step while K1 is free.

fn gen_wrap_lost_wakeup() {
    let path = TempPath::new("genwrap");
    drop(LockTable::open(&path, 64).unwrap());
    let seed = header_u64(&path.0, 32);
    let n = header_u64(&path.0, 16);
    // two keys of one home (any tags)
    let mut seen = std::collections::HashMap::new();
    let (k1, k2) = (0..200_000)
        .find_map(|i| {
            let k = format!("g:{i}");
            let (home, _) = place(seed, n, &k);
            seen.insert(home, k.clone()).map(|prev| (prev, k))
        })
        .unwrap();
    let (home, _) = place(seed, n, &k1);
    let slot = home as usize;
    let watch = Watch::new(&path.0);
    let rlen = registry_len(&path.0);
    let shared: &'static Shared = Box::leak(Box::new(Shared::new(16)));
    let step = Duration::from_millis(400);
    let (pk1, pk2, pp) = (k1.clone(), k2.clone(), path.0.clone());
    // H: holds K1; on word 0 == target+1: releases K1 (time in word 3), then cycles K2 in
    // the same slot until a HELD word of generation low bits == target, and keeps it.
    let h = Proc(Some(fork(move || {
        let t = LockTable::open(&pp, 64).unwrap();
        let w = Watch::new(&pp);
        let o = LockOptions {
            exptime: Duration::from_secs(60),
            timeout: Duration::from_secs(1),
            ..LockOptions::default()
        };
        let g1 = t.lock(&pk1, o).unwrap();
        shared.word(1).store(1, Ordering::SeqCst);
        let target = await_word(shared, 0, Duration::from_secs(60)) - 1;
        let at = mono_ns();
        drop(g1);
        shared.word(3).store(at, Ordering::SeqCst);
        let mut cycles = 0u64;
        let started = Instant::now();
        loop {
            let g = t.lock(&pk2, o).unwrap();
            let c = w.at(slot, 0).load(Ordering::Relaxed);
            cycles += 1;
            if c & 7 == 2 && (c >> 9) & ((1 << 23) - 1) == target {
                shared.word(9).store(cycles, Ordering::SeqCst);
                shared
                    .word(10)
                    .store(started.elapsed().as_millis() as u64 + 1, Ordering::SeqCst);
                shared.word(4).store(
                    t.debug_placement(&pk2).unwrap().1 as u64 + 1,
                    Ordering::SeqCst,
                );
                std::thread::sleep(Duration::from_secs(30));
                drop(g);
                break;
            }
            drop(g);
            if started.elapsed() > Duration::from_secs(20) {
                shared.word(11).store(1, Ordering::SeqCst);
                break;
            }
        }
        0
    })));
    await_word(shared, 1, Duration::from_secs(10));
    let pw = path.0.clone();
    let wk1 = k1.clone();
    let w = Proc(Some(fork(move || {
        let t = LockTable::open(&pw, 64).unwrap();
        let addr = mapping_base(&pw) as u64 + rlen + slot as u64 * 64;
        shared.word(5).store(addr, Ordering::SeqCst);
        await_word(shared, 6, Duration::from_secs(60));
        let o = LockOptions {
            exptime: Duration::from_secs(60),
            timeout: Duration::from_secs(5),
            step,
            max_step: step,
            ..LockOptions::default()
        };
        let g = t.lock(&wk1, o);
        shared.word(7).store(mono_ns(), Ordering::SeqCst);
        shared
            .word(8)
            .store(if g.is_ok() { 1 } else { 2 }, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(30));
        0
    })));
    let addr = await_word(shared, 5, Duration::from_secs(10));
    let mut gdb = Some(GdbStop::at_futex(w.pid(), addr));
    shared.word(6).store(1, Ordering::SeqCst);
    assert!(
        gdb.as_ref().unwrap().stopped(Duration::from_secs(30)),
        "W never reached its futex wait"
    );
    let w1 = watch.at(slot, 0).load(Ordering::SeqCst);
    assert_eq!(w1 & 7, 2, "inconclusive: not held");
    assert_ne!(w1 & 8, 0, "inconclusive: not flagged");
    let target = (w1 >> 9) & ((1 << 23) - 1);
    shared.word(0).store(target + 1, Ordering::SeqCst);
    let s2 = await_word(shared, 4, Duration::from_secs(25)) - 1;
    assert_eq!(s2 as usize, slot, "inconclusive: K2 landed elsewhere");
    // X: a waiter of K2 flags H's hold of K2
    let _x = flagging_waiter(&path.0, &k2, &watch, slot);
    let w2 = watch.at(slot, 0).load(Ordering::SeqCst);
    note!(
        "[K1 {k1:?}, K2 {k2:?} share home {home}; W stopped at FUTEX_WAIT expecting {:#x} \
         (word {w1:#x}); H cycled K2 {} times ({} ms) to word {w2:#x}: low halves {}] ",
        w1 as u32,
        shared.word(9).load(Ordering::SeqCst),
        shared.word(10).load(Ordering::SeqCst) - 1,
        if w1 as u32 == w2 as u32 {
            "EQUAL"
        } else {
            "differ"
        }
    );
    let released = shared.word(3).load(Ordering::SeqCst);
    let resumed = mono_ns();
    gdb.take().unwrap().release();
    let got = await_word(shared, 8, Duration::from_secs(10));
    let acquired = shared.word(7).load(Ordering::SeqCst);
    let after_resume = Duration::from_nanos(acquired.saturating_sub(resumed));
    note!(
        "[W {} K1 {:.1} ms after it was resumed ({:.1} s after H released K1)] ",
        if got == 1 { "got" } else { "did NOT get" },
        after_resume.as_secs_f64() * 1e3,
        Duration::from_nanos(acquired - released).as_secs_f64()
    );
    drop(h);
    drop(w);
    assert!(got == 1);
    assert!(
        after_resume < Duration::from_millis(200),
        "lost wake-up: W slept its step on K2's hold while K1 was free"
    );
}

// ---------------------------------------------------------------------------------------
// W2. A holder that renews in a tight loop (each renewal moves the generation twice, and
//     the futex half now carries it): does a waiter still sleep, or spin on EAGAIN?

fn renewing_tight_loop() {
    let (path, shared, h) = renewing_holder("tight", Duration::from_secs(30), None);
    std::thread::sleep(Duration::from_millis(50));
    let (ok, took, cpu, vol) = wait_two_seconds(&path);
    shared.word(3).store(1, Ordering::SeqCst);
    h.wait(Duration::from_secs(10));
    note!(
        "[{} renewals/s by the holder; waiter {} after {:.3} s, cpu {cpu} ticks (of {}), \
         {vol} voluntary switches] ",
        shared.word(1).load(Ordering::SeqCst) as f64 / (took.as_secs_f64() + 0.05),
        if ok { "got" } else { "timed out" },
        took.as_secs_f64(),
        (took.as_secs_f64() * 100.0) as u64
    );
    assert!(!ok && took < Duration::from_millis(2_250));
    assert!(
        cpu < 50,
        "the waiter burned {cpu} ticks of CPU in a 2 s wait"
    );
}
