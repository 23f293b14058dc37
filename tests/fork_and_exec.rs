//! Fork, clone, spawn and exec: a child, however it was made (`fork`, glibc's `_Fork` that
//! runs no atfork handlers, a raw `clone` or `clone3`, a grandchild), never takes the key
//! its parent holds, never releases it by dropping its copy of the guard, and never keeps
//! a dead parent's keys held by living on; neither does a program the holder spawned, nor
//! the new image of a holder that exec'd (re-opening the table or not, with address-space
//! randomisation or without). A child stays harmless when the program took memory away
//! from it (`MADV_DONTFORK`: the table is never mapped over the child's own memory) or when
//! its first use of the library falls at its descriptor limit.
//!
//! Exercises `src/shm/process.rs` (telling a forked child from its parent),
//! `src/shm/anchor.rs` (a registration no child and no new image inherits),
//! `src/shm/attachment.rs` (registering again in a child) and `src/shm/mapping.rs`. The
//! handshake between `fork` and a registration being set up is in
//! `tests/fork_handshake.rs`.
//!
//! `fork_and_exec FILTER` runs the tests whose name contains FILTER; `fork_and_exec
//! --list` lists them; `fork_and_exec --role NAME PATH` is how a test starts this binary as
//! a new image of a process.

mod common;

use std::ffi::CString;
use std::fs;
use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::fork::{_Fork, fork, Shared};
use common::harness::Test;
use common::probe::{await_word, Proc, Spawned};
use common::{opts, TempPath};
use shmlock::{Error, LockTable};

const TESTS: &[Test] = &[
    Test::new(
        "a_child_of_underscore_fork_never_releases_the_parents_hold",
        a_child_of_underscore_fork_never_releases_the_parents_hold,
    ),
    Test::new(
        "fork_kinds_child_never_keeps_or_shares_the_parents_registration",
        fork_kinds,
    ),
    Test::new(
        "a_raw_clone_child_neither_takes_nor_keeps_its_parents_keys",
        a_raw_clone_child_neither_takes_nor_keeps_its_parents_keys,
    ),
    Test::new(
        "a_child_never_maps_the_table_over_its_own_memory",
        a_child_never_maps_the_table_over_its_own_memory,
    ),
    Test::new(
        "a_child_at_its_fd_limit_never_keeps_the_parents_registration",
        a_child_at_its_fd_limit_never_keeps_the_parents_registration,
    ),
    Test::new(
        "a_holder_that_execs_frees_its_keys_at_once",
        a_holder_that_execs_frees_its_keys_at_once,
    ),
    Test::new(
        "a_holder_that_execs_and_reopens_the_table_frees_its_keys_at_once",
        a_holder_that_execs_and_reopens_the_table_frees_its_keys_at_once,
    ),
    Test::new(
        "exec_without_aslr_frees_the_old_images_keys",
        exec_without_aslr_frees_the_old_images_keys,
    ),
    Test::new(
        "control_exec_with_aslr_frees_the_old_images_keys",
        control_exec_with_aslr_frees_the_old_images_keys,
    ),
    Test::new(
        "a_program_spawned_by_a_holder_never_keeps_its_dead_parents_keys",
        a_program_spawned_by_a_holder_never_keeps_its_dead_parents_keys,
    ),
    Test::new(
        "a_child_forked_inside_keep_alive_comes_out_without_the_hold",
        a_child_forked_inside_keep_alive_comes_out_without_the_hold,
    ),
    #[cfg(feature = "tokio")]
    Test::new(
        "a_child_forked_while_a_task_waits_leaves_the_table_with_its_handle",
        a_child_forked_while_a_task_waits_leaves_the_table_with_its_handle,
    ),
];

fn main() {
    common::harness::run("fork_and_exec", TESTS, role);
}

fn role(args: &[String]) -> i32 {
    match args.first().map(String::as_str) {
        // reopen PATH: open the table again (a new image of a process that exec'd), say
        // "open" on stdout, stay until killed
        Some("reopen") => {
            let _t = LockTable::open(&args[1], 64).unwrap();
            println!("open");
            let _ = std::io::stdout().flush();
            std::thread::sleep(Duration::from_secs(60));
            0
        }
        // holdexec PATH: open the table, take K for good, say where the table is mapped,
        // then exec a new image of this binary that opens the table again.
        Some("holdexec") => {
            let path = &args[1];
            let t = LockTable::open(path, 64).unwrap();
            let g = t.lock(K, opts(0, 1_000)).unwrap();
            std::mem::forget(g);
            println!("old {:#x}", mapping_start(Path::new(path)));
            let _ = std::io::stdout().flush();
            std::mem::forget(t);
            use std::os::unix::ffi::OsStringExt;
            let exe =
                CString::new(std::env::current_exe().unwrap().into_os_string().into_vec()).unwrap();
            let a = [
                exe.clone(),
                CString::new("--role").unwrap(),
                CString::new("reopen_showing_mapping").unwrap(),
                CString::new(path.as_str()).unwrap(),
            ];
            let mut argv: Vec<*const libc::c_char> = a.iter().map(|a| a.as_ptr()).collect();
            argv.push(std::ptr::null());
            // SAFETY: NUL-terminated strings, NULL-terminated argv.
            unsafe { libc::execv(exe.as_ptr(), argv.as_ptr()) };
            99
        }
        // reopen_showing_mapping PATH: open the table again, say where it is mapped ("new
        // ADDR", or the error), stay 30 s
        Some("reopen_showing_mapping") => {
            let path = &args[1];
            match LockTable::open(path, 64) {
                Ok(t) => {
                    println!("new {:#x}", mapping_start(Path::new(path)));
                    let _ = std::io::stdout().flush();
                    std::thread::sleep(Duration::from_secs(30));
                    drop(t);
                }
                Err(e) => {
                    println!("error {e}");
                    let _ = std::io::stdout().flush();
                    std::thread::sleep(Duration::from_secs(30));
                }
            }
            0
        }
        _ => common::harness::no_roles(args),
    }
}

const K: &str = "K";

// ---------------------------------------------------------------------------------------
// Helpers

/// Where this process mapped `path` at offset 0 (what the registry records).
fn mapping_start(path: &Path) -> usize {
    use std::os::unix::fs::MetadataExt;
    let ino = fs::metadata(path).unwrap().ino().to_string();
    let maps = fs::read_to_string("/proc/self/maps").unwrap();
    for line in maps.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() >= 5 && f[4] == ino {
            return usize::from_str_radix(f[0].split('-').next().unwrap(), 16).unwrap();
        }
    }
    panic!("{} is not mapped", path.display());
}

/// The descriptors of process `pid` that name the file with inode `ino`.
fn fds_of_inode(pid: libc::pid_t, ino: u64) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return out;
    };
    for e in dir.flatten() {
        if fs::metadata(e.path()).is_ok_and(|m| m.ino() == ino) {
            out.push(format!(
                "{} -> {}",
                e.file_name().to_string_lossy(),
                fs::read_link(e.path()).map_or(String::new(), |p| p.display().to_string())
            ));
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// Children made without the fork handlers

/// glibc's `_Fork` (POSIX 2024; async-signal-safe fork) runs no atfork handlers, so the
/// child keeps the parent's memory as it was: its copy of the parent's guard must still
/// know it is not the child's (dropping it must not release the parent's hold).
fn a_child_of_underscore_fork_never_releases_the_parents_hold() {
    let path = TempPath::new("underscore-fork");
    let table = LockTable::open(&path, 64).unwrap();
    let g = table.lock(K, opts(60_000, 1_000)).unwrap();
    // SAFETY: single-threaded test binary.
    let pid = unsafe { _Fork() };
    if pid == 0 {
        drop(g); // the child's copy goes out of scope
                 // SAFETY: leave.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: our child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    let stolen = table.is_locked(K).unwrap();
    note!(
        "[after the _Fork child dropped its copy, K is {}] ",
        if stolen { "still held" } else { "FREE" }
    );
    drop(g);
    assert!(stolen, "the parent's hold was released by its child");
}

// ---------------------------------------------------------------------------------------
// Every way to make a child with a copy of the memory: fork, glibc's _Fork (no atfork
// handlers), a raw clone(SIGCHLD) syscall, clone3, and a grandchild of a child that
// used the library. The child (a) must not take K while its parent holds it, and
// (b) must not keep its parent's keys after the parent dies.

fn spawn_kind(kind: &str, f: impl FnOnce() -> i32) -> libc::pid_t {
    // SAFETY: single-threaded process; the child runs f and _exits.
    let pid = unsafe {
        match kind {
            "fork" => libc::fork(),
            "_Fork" => _Fork(),
            "clone" => libc::syscall(
                libc::SYS_clone,
                libc::SIGCHLD as libc::c_ulong,
                0usize,
                0usize,
                0usize,
                0usize,
            ) as libc::pid_t,
            "clone3" => {
                #[repr(C)]
                struct CloneArgs {
                    flags: u64,
                    pidfd: u64,
                    child_tid: u64,
                    parent_tid: u64,
                    exit_signal: u64,
                    stack: u64,
                    stack_size: u64,
                    tls: u64,
                    set_tid: u64,
                    set_tid_size: u64,
                    cgroup: u64,
                }
                let mut a: CloneArgs = std::mem::zeroed();
                a.exit_signal = libc::SIGCHLD as u64;
                libc::syscall(
                    libc::SYS_clone3,
                    &mut a as *mut CloneArgs,
                    std::mem::size_of::<CloneArgs>(),
                ) as libc::pid_t
            }
            _ => unreachable!(),
        }
    };
    assert!(pid >= 0, "{kind} failed");
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(101);
        // SAFETY: leaving the child without running the parent's destructors or atexit handlers.
        unsafe { libc::_exit(code) };
    }
    pid
}

fn fork_kinds() {
    let mut bad = vec![];
    for kind in ["fork", "_Fork", "clone", "clone3", "grandchild"] {
        let path = TempPath::new("kinds");
        drop(LockTable::open(&path, 64).unwrap());
        let flag = Shared::new(8);
        let p = Proc::new(fork(|| {
            let a = LockTable::open(&path, 64).unwrap();
            let g = a.lock(K, opts(60_000, 1_000)).unwrap();
            let body = || {
                let took = a.try_lock_with_lease(K, Duration::from_secs(60)).unwrap();
                // the pid first: the test reads it once word 1 is set
                flag.word(2)
                    .store(std::process::id() as u64, Ordering::SeqCst);
                flag.word(1)
                    .store(if took.is_some() { 2 } else { 1 }, Ordering::SeqCst);
                std::mem::forget(took);
                std::thread::sleep(Duration::from_secs(15));
                0
            };
            if kind == "grandchild" {
                let _mid = fork(|| {
                    flag.word(3)
                        .store(std::process::id() as u64, Ordering::SeqCst);
                    let _ = a.lock("mid", opts(1_000, 1_000)).map(drop);
                    let _gc = spawn_kind("fork", body);
                    std::thread::sleep(Duration::from_secs(15));
                    0
                });
            } else {
                spawn_kind(kind, body);
            }
            flag.word(0).store(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_secs(30));
            drop(g);
            0
        }));
        await_word(&flag, 0, Duration::from_secs(10));
        let took = await_word(&flag, 1, Duration::from_secs(10));
        let kid = flag.word(2).load(Ordering::SeqCst) as libc::pid_t;
        drop(p); // SIGKILL the parent
        let table = LockTable::open(&path, 64).unwrap();
        let started = Instant::now();
        let r = table.lock(K, opts(60_000, 2_000)).map(drop);
        note!(
            "[{kind}: child took K from its live parent: {}; after the parent's death a \
             waiter {} in {:?}] ",
            took == 2,
            if r.is_ok() { "took K" } else { "TIMED OUT" },
            started.elapsed()
        );
        if took == 2 || r.is_err() {
            bad.push(kind);
        }
        common::signal::send(kid, libc::SIGKILL);
        let mid = flag.word(3).load(Ordering::SeqCst) as libc::pid_t;
        if mid > 0 {
            common::signal::send(mid, libc::SIGKILL);
        }
    }
    assert!(bad.is_empty(), "broke for {bad:?}");
}

// ---------------------------------------------------------------------------------------
// A child made by the raw clone system call (no glibc fork path, no atfork handlers)

fn raw_fork() -> libc::pid_t {
    // SAFETY: clone with only the exit signal: a fork without glibc's bookkeeping. The
    // child runs on a copy of this (single-threaded) process's stack and memory.
    unsafe {
        libc::syscall(
            libc::SYS_clone,
            libc::SIGCHLD as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        ) as libc::pid_t
    }
}

/// H holds K (no expiry) and makes a child C with the raw clone system call. C uses the
/// library: it must not get or release K (H's), and once it has used the library it must
/// not keep H's registration alive: after H is SIGKILLed, K is free at once while C lives.
fn a_raw_clone_child_neither_takes_nor_keeps_its_parents_keys() {
    let path = TempPath::new("raw-clone");
    let table = LockTable::open(&path, 64).unwrap();
    let flag = Shared::new(4);
    let mut h = Proc::new(fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        let g = t.lock(K, opts(0, 1_000)).unwrap();
        let pid = raw_fork();
        if pid == 0 {
            // C: H's guard is a copy here; K is H's.
            let got = t
                .try_lock_with_lease(K, Duration::from_secs(60))
                .map(|g| g.is_some());
            let other = t
                .try_lock_with_lease("other", Duration::from_secs(60))
                .map(|g| g.is_some());
            let released = g.unlock();
            let code = match (got, other, released) {
                (Ok(false), Ok(true), Err(Error::NotOwner)) => 1,
                (Ok(false), Ok(true), Err(_)) => 1,
                (Ok(true), ..) => 2,
                (_, _, Ok(())) => 3,
                _ => 4,
            };
            flag.word(1).store(code, Ordering::SeqCst);
            std::thread::sleep(Duration::from_secs(30));
            // SAFETY: leaving the clone child without unwinding into the parent's frames.
            unsafe { libc::_exit(0) };
        }
        flag.word(2).store(pid as u64, Ordering::SeqCst);
        std::mem::forget(g);
        flag.word(0).store(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(60));
        0
    }));
    await_word(&flag, 0, Duration::from_secs(10));
    let c = await_word(&flag, 1, Duration::from_secs(10));
    let cpid = flag.word(2).load(Ordering::SeqCst) as libc::pid_t;
    h.kill();
    let started = Instant::now();
    let got = table.lock(K, opts(0, 2_000));
    common::signal::send(cpid, libc::SIGKILL);
    note!(
        "[clone child: {}; after the parent's death the waiter {} in {:?}] ",
        match c {
            1 => "refused K, took another key, could not release the parent's hold",
            2 => "TOOK the parent's K",
            3 => "RELEASED the parent's K",
            _ => "error",
        },
        if got.is_ok() { "took K" } else { "TIMED OUT" },
        started.elapsed()
    );
    assert_eq!(c, 1, "the raw clone child acted on its parent's hold");
    assert!(
        got.is_ok(),
        "the clone child kept its dead parent's registration"
    );
}

// ---------------------------------------------------------------------------------------
// MADV_DONTFORK on the table's range (a program that keeps big regions out of its
// children): the child does not inherit the mapping, and its allocator may hand the hole to
// the program. The child's first use of the library must not map the table (MAP_FIXED)
// over that memory: the program's private buffer would become the shared table, and the
// program's next memset of its buffer would wipe every process's holds.

fn table_range(ino: u64) -> Option<(usize, usize)> {
    let maps = fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let range = f.next()?;
        if f.nth(3)?.parse::<u64>().ok()? != ino {
            return None;
        }
        let (a, b) = range.split_once('-')?;
        let a = usize::from_str_radix(a, 16).ok()?;
        let b = usize::from_str_radix(b, 16).ok()?;
        Some((a, b - a))
    })
}

/// A program marks the table's memory MADV_DONTFORK, so a forked child has a hole there,
/// and the child's own scratch buffer lands in it. The child's first use of the library
/// must not map the table over that buffer, nor may anyone take H's key.
fn a_child_never_maps_the_table_over_its_own_memory() {
    use std::os::unix::fs::MetadataExt;
    let path = TempPath::new("dontfork");
    drop(LockTable::open(&path, 64).unwrap());
    let ino = fs::metadata(&path).unwrap().ino();
    let flag = Shared::new(8);
    // H holds K (alive, running)
    let _h = Proc::new(fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        let g = t.lock(K, opts(60_000, 1_000)).unwrap();
        flag.word(0).store(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(30));
        drop(g);
        0
    }));
    await_word(&flag, 0, Duration::from_secs(10));
    let p = fork(|| {
        let a = LockTable::open(&path, 64).unwrap();
        let (addr, len) = table_range(ino).unwrap();
        // SAFETY: advising our own mapping.
        assert_eq!(
            unsafe { libc::madvise(addr as *mut _, len, libc::MADV_DONTFORK) },
            0
        );
        let c = fork(|| {
            // the program allocates scratch memory
            // SAFETY: a fresh anonymous private mapping.
            let buf = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            } as *mut u8;
            // SAFETY: the program's own buffer, len bytes.
            unsafe { std::ptr::write_bytes(buf, 0xAB, len) };
            // The child's first use of the library (on another table): it must map nothing
            // over the program's memory. (Using `a` itself now would be the program's own
            // use-after-unmap: it took that memory away from the child.)
            let b = LockTable::open(TempPath::new("dontfork-other"), 64).unwrap();
            let r = b.lock("other", opts(1_000, 1_000)).map(drop);
            // SAFETY: as above.
            let still = unsafe { std::slice::from_raw_parts(buf, len) }
                .iter()
                .all(|&b| b == 0xAB);
            // the program reuses its scratch buffer
            // SAFETY: as above.
            unsafe { std::ptr::write_bytes(buf, 0, len) };
            eprintln!(
                "[table at {addr:#x}+{len:#x} (DONTFORK); the child's scratch buffer at \
                 {:#x}; the child's lock call: {:?}; scratch buffer intact after it: {still}]",
                buf as usize,
                r.map_err(|e| e.to_string())
            );
            flag.word(1)
                .store(if still { 1 } else { 2 }, Ordering::SeqCst);
            0
        });
        let rc = c.wait(Duration::from_secs(20));
        std::mem::forget(a);
        rc
    });
    let rc = p.wait(Duration::from_secs(30));
    let verdict = flag.word(1).load(Ordering::SeqCst);
    let table = LockTable::open(&path, 64).unwrap();
    let other = table
        .try_lock_with_lease(K, Duration::from_secs(60))
        .unwrap();
    note!(
        "[child rc {rc}, verdict {verdict}; H (alive) holds K; this process {}] ",
        if other.is_some() {
            "ALSO TOOK K"
        } else {
            "was refused"
        }
    );
    assert!(
        verdict != 2 && other.is_none(),
        "the table was mapped over the program's memory"
    );
}

// ---------------------------------------------------------------------------------------
// A forked child whose first use of the library falls at its descriptor limit goes on
// using the library (another table works; this one says it cannot register): it must not
// keep its dead parent's keys held until their leases end.

fn a_child_at_its_fd_limit_never_keeps_the_parents_registration() {
    let path = TempPath::new("emfile");
    let other = TempPath::new("emfile-other");
    drop(LockTable::open(&path, 64).unwrap());
    let flag = Shared::new(8);
    let p = Proc::new(fork(|| {
        let a = LockTable::open(&path, 64).unwrap();
        let g = a.lock(K, opts(60_000, 1_000)).unwrap();
        let _c = fork(|| {
            let n = fs::read_dir("/proc/self/fd").unwrap().count() as u64;
            let mut old = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: valid out-pointer / in-pointer.
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut old) };
            let tight = libc::rlimit {
                rlim_cur: n + 2,
                rlim_max: old.rlim_max,
            };
            // SAFETY: tight is a valid rlimit; it lowers only this forked child's limit.
            unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &tight) };
            // a busy server at its limit for a moment
            let mut hog = vec![];
            while let Ok(f) = fs::File::open("/dev/null") {
                hog.push(f);
            }
            let first = a.registered();
            drop(hog);
            // SAFETY: old is the valid rlimit getrlimit filled in; it restores this child's limit.
            unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &old) };
            let later = a.lock("mine", opts(1_000, 100)).map(drop);
            let u = LockTable::open(&other, 64).unwrap();
            let uses = u.lock("x", opts(1_000, 100)).map(drop);
            eprintln!(
                "[child: first use at the limit registered={first}; later (limit lifted) lock on \
                 T: {:?}; lock on another table: {uses:?}]",
                later.map_err(|e| e.to_string())
            );
            flag.word(1)
                .store(std::process::id() as u64, Ordering::SeqCst);
            std::thread::sleep(Duration::from_secs(20));
            0
        });
        flag.word(0).store(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(30));
        drop(g);
        0
    }));
    await_word(&flag, 0, Duration::from_secs(10));
    let child = await_word(&flag, 1, Duration::from_secs(10)) as libc::pid_t;
    drop(p); // SIGKILL the holder
    let table = LockTable::open(&path, 64).unwrap();
    let started = Instant::now();
    let r = table.lock(K, opts(60_000, 3_000));
    note!(
        "[holder SIGKILLed; its child (alive, used the library) {child}; a waiter's lock(K, \
         3 s): {} after {:?}] ",
        if r.is_ok() { "took K" } else { "TIMED OUT" },
        started.elapsed()
    );
    common::signal::send(child, libc::SIGKILL);
    assert!(
        r.is_ok(),
        "a child that used the library kept its dead parent's keys"
    );
}

// ---------------------------------------------------------------------------------------
// exec and posix_spawn while holding

/// H takes K with no expiry and execs `sleep`: the exec'd program keeps no descriptor of
/// the table, so its registration is gone and a waiter takes K at once (not wedged).
fn a_holder_that_execs_frees_its_keys_at_once() {
    use std::os::unix::fs::MetadataExt;
    let path = TempPath::new("exec");
    let table = LockTable::open(&path, 64).unwrap();
    let ino = fs::metadata(&path).unwrap().ino();
    let flag = Shared::new(1);
    let h = Proc::new(fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        let g = t.lock(K, opts(0, 1_000)).unwrap();
        std::mem::forget(g);
        flag.word(0).store(1, Ordering::SeqCst);
        let sleep = CString::new("/bin/sleep").unwrap();
        let arg = CString::new("30").unwrap();
        // SAFETY: valid NUL-terminated strings and a NULL-terminated argv.
        unsafe {
            libc::execv(
                sleep.as_ptr(),
                [sleep.as_ptr(), arg.as_ptr(), std::ptr::null()].as_ptr(),
            )
        };
        99
    }));
    await_word(&flag, 0, Duration::from_secs(10));
    // The exec is done once the process image is sleep's.
    let deadline = Instant::now() + Duration::from_secs(5);
    while fs::read_to_string(format!("/proc/{}/comm", h.pid()))
        .map_or(true, |c| c.trim() != "sleep")
    {
        assert!(Instant::now() < deadline, "no exec");
        std::thread::sleep(Duration::from_millis(2));
    }
    let kept = fds_of_inode(h.pid(), ino);
    let started = Instant::now();
    let got = table.lock(K, opts(0, 2_000));
    note!(
        "[exec'd program keeps {kept:?}; waiter {} in {:?}] ",
        if got.is_ok() { "took K" } else { "TIMED OUT" },
        started.elapsed()
    );
    assert!(
        kept.is_empty(),
        "the exec'd program kept table descriptors: {kept:?}"
    );
    assert!(got.is_ok(), "a holder's keys stayed held after it exec'd");
}

/// H takes K with no expiry, then execs a new image of itself that opens the table again
/// (a server re-executing itself to upgrade). The new image has the same pid and start
/// time and maps the table too, but it is not the registrant that took K: K must be
/// taken at once, not kept for as long as the process runs.
fn a_holder_that_execs_and_reopens_the_table_frees_its_keys_at_once() {
    let path = TempPath::new("exec-reopen");
    let table = LockTable::open(&path, 64).unwrap();
    let flag = Shared::new(1);
    let (out_r, out_w) = nix::unistd::pipe().unwrap();
    let h = Proc::new(fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        let g = t.lock(K, opts(0, 1_000)).unwrap();
        std::mem::forget(g);
        flag.word(0).store(1, Ordering::SeqCst);
        use std::os::fd::AsRawFd;
        use std::os::unix::ffi::OsStringExt;
        // SAFETY: both descriptors are open; stdout now names the pipe's write end.
        assert_eq!(unsafe { libc::dup2(out_w.as_raw_fd(), 1) }, 1);
        let exe =
            CString::new(std::env::current_exe().unwrap().into_os_string().into_vec()).unwrap();
        let args = [
            exe.clone(),
            CString::new("--role").unwrap(),
            CString::new("reopen").unwrap(),
            CString::new(path.0.clone().into_os_string().into_vec()).unwrap(),
        ];
        let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
        argv.push(std::ptr::null());
        // SAFETY: valid NUL-terminated strings and a NULL-terminated argv.
        unsafe { libc::execv(exe.as_ptr(), argv.as_ptr()) };
        99
    }));
    drop(out_w);
    await_word(&flag, 0, Duration::from_secs(10));
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(fs::File::from(out_r)),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "open", "the new image did not open the table");
    let started = Instant::now();
    let got = table.lock(K, opts(0, 2_000));
    note!(
        "[new image of pid {} has the table open; waiter {} in {:?}] ",
        h.pid(),
        if got.is_ok() { "took K" } else { "TIMED OUT" },
        started.elapsed()
    );
    assert!(
        got.is_ok(),
        "an exec'd holder's keys stayed held by its new image"
    );
}

/// H takes K with no expiry and spawns a long-running program (`std::process::Command`,
/// posix_spawn / clone(CLONE_VM|CLONE_VFORK) under the hood); then H is SIGKILLed. The
/// spawned program must hold no descriptor of the table, so K is taken at once.
fn a_program_spawned_by_a_holder_never_keeps_its_dead_parents_keys() {
    use std::os::unix::fs::MetadataExt;
    let path = TempPath::new("spawn");
    let table = LockTable::open(&path, 64).unwrap();
    let ino = fs::metadata(&path).unwrap().ino();
    let flag = Shared::new(1);
    let mut h = Proc::new(fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        let g = t.lock(K, opts(0, 1_000)).unwrap();
        std::mem::forget(g);
        let child = std::process::Command::new("/bin/sleep")
            .arg("30")
            .spawn()
            .unwrap();
        flag.word(0).store(u64::from(child.id()), Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(60));
        // (killed before this: the test kills the orphaned program itself)
        drop(child.wait_with_output());
        0
    }));
    let spawned = await_word(&flag, 0, Duration::from_secs(10)) as libc::pid_t;
    let kept = fds_of_inode(spawned, ino);
    h.kill();
    let started = Instant::now();
    let got = table.lock(K, opts(0, 2_000));
    common::signal::send(spawned, libc::SIGKILL);
    note!(
        "[spawned program keeps {kept:?}; waiter {} in {:?}] ",
        if got.is_ok() { "took K" } else { "TIMED OUT" },
        started.elapsed()
    );
    assert!(
        kept.is_empty(),
        "the spawned program kept table descriptors: {kept:?}"
    );
    assert!(
        got.is_ok(),
        "a dead holder's keys stayed held by its spawned program"
    );
}

// ---------------------------------------------------------------------------------------
// An exec'd image is a new process for the registry even when it maps the table at the
// same page as the old image did, as it does without address-space randomisation
// (personality ADDR_NO_RANDOMIZE, `setarch -R`, or sysctl kernel.randomize_va_space=0):
// the old image's registration (its descriptor closed by O_CLOEXEC) must not be judged
// alive for as long as the new image runs.

fn exec_reopen(no_aslr: bool) {
    use std::os::unix::process::CommandExt;
    let path = TempPath::new("exec-noaslr");
    // 3 entries: this process, the old image's, the new image's; a 4th process is refused
    // if the old image's entry is never given back.
    let table = LockTable::options()
        .capacity(64)
        .max_processes(3)
        .open(&path)
        .unwrap();
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.process_group(0);
    cmd.args(["--role", "holdexec"])
        .arg(&path.0)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit());
    if no_aslr {
        // SAFETY: personality is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                libc::personality(libc::ADDR_NO_RANDOMIZE as libc::c_ulong);
                Ok(())
            });
        }
    }
    let mut h = Spawned(cmd.spawn().unwrap());
    let mut out = std::io::BufReader::new(h.0.stdout.take().unwrap());
    let (mut l1, mut l2) = (String::new(), String::new());
    out.read_line(&mut l1).unwrap();
    out.read_line(&mut l2).unwrap();
    let same = l1.split_whitespace().nth(1) == l2.split_whitespace().nth(1);
    note!(
        "[pid {}: {} / {}: {}] ",
        h.0.id(),
        l1.trim(),
        l2.trim(),
        if same { "SAME page" } else { "different pages" }
    );
    assert!(l2.starts_with("new"), "the new image did not open: {l2}");
    let started = Instant::now();
    let got = table.lock(K, opts(0, 2_000));
    let waited = started.elapsed();
    // a newcomer: one entry should be free (the old image's) once the old image is gone
    let newcomer = fork(|| match LockTable::open(&path, 64) {
        Ok(_) => 0,
        Err(Error::TooManyProcesses { .. }) => 3,
        Err(_) => 1,
    })
    .wait(Duration::from_secs(10));
    note!(
        "[waiter {} in {waited:?}; a newcomer's open: {}] ",
        if got.is_ok() { "took K" } else { "TIMED OUT" },
        match newcomer {
            0 => "ok",
            3 => "REFUSED (TooManyProcesses)",
            _ => "error",
        }
    );
    assert!(
        got.is_ok(),
        "the old image's key stays held for as long as the exec'd image runs"
    );
    assert_eq!(
        newcomer, 0,
        "the old image's registry entry is never given back"
    );
}

fn exec_without_aslr_frees_the_old_images_keys() {
    exec_reopen(true);
}

fn control_exec_with_aslr_frees_the_old_images_keys() {
    exec_reopen(false);
}

/// `keep_alive`'s work forks (a worker that spawns a helper, say): the child comes out of
/// `keep_alive` at once, told that the hold is not its own, while its parent's renewals go
/// on. (The renewer is a thread the child does not have: it must neither wait for it nor
/// take the mutex that thread may have held at the fork.)
fn a_child_forked_inside_keep_alive_comes_out_without_the_hold() {
    let path = TempPath::new("keepalive-fork");
    let table = LockTable::open(&path, 64).unwrap();
    let mut guard = table.lock("K", opts(60, 1_000)).unwrap();
    let (child, lease) = guard.keep_alive(|_| {
        // let the renewer run a few times first (every 20 ms)
        std::thread::sleep(Duration::from_millis(70));
        // SAFETY: a threaded fork; the child only returns from keep_alive, checks what it
        // said, and leaves with _exit.
        unsafe { libc::fork() }
    });
    if child == 0 {
        let rc = match lease {
            Err(Error::NotOwner) => 0,
            _ => 1,
        };
        // SAFETY: leaving the child without running the parent's exit handlers.
        unsafe { libc::_exit(rc) };
    }
    assert!(child > 0, "fork failed");
    let rc = common::forking::reap_within(child, Duration::from_secs(10));
    assert!(lease.is_ok(), "the parent's renewals held: {lease:?}");
    assert_eq!(
        rc,
        Some(0),
        "the child came out of keep_alive told the hold is not its own (None: it hung)"
    );
    assert!(table.is_locked("K").unwrap());
    guard.unlock().unwrap();
}

/// A child forked while a task of its parent waits in `lock_async` (the parent's watcher
/// thread asleep on the key's word): when the child drops its only handle, its
/// registration goes, as anywhere else. (The watcher kept the table itself while asleep, a
/// reference the child inherited with no thread to let it go: the child's registration
/// then lasted until the child's exit.)
#[cfg(feature = "tokio")]
fn a_child_forked_while_a_task_waits_leaves_the_table_with_its_handle() {
    use std::sync::atomic::AtomicPtr;
    static TABLE: AtomicPtr<LockTable> = AtomicPtr::new(std::ptr::null_mut());
    let path = TempPath::new("watcher-fork");
    let boxed = Box::into_raw(Box::new(LockTable::open(&path, 64).unwrap()));
    TABLE.store(boxed, Ordering::SeqCst);
    // SAFETY: the box above, freed only at the end of this test (after the waiter is
    // joined), or in the child, which has no waiter thread.
    let t: &'static LockTable = unsafe { &*boxed };
    let g = t.lock("K", opts(60_000, 1_000)).unwrap();
    let waiter = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async { t.lock_async("K", opts(60_000, 20_000)).await.map(drop) })
    });
    std::thread::sleep(Duration::from_millis(300)); // the task waits, the watcher sleeps
    let p = path.0.clone();
    let child = fork(move || {
        // SAFETY: this process's copy of the box; nothing else here uses it.
        let t = unsafe { Box::from_raw(TABLE.load(Ordering::SeqCst)) };
        drop(t.try_lock_with_lease("c", Duration::from_secs(5)));
        let me = std::process::id();
        if !common::probe::registered_pids(&p).contains(&me) {
            return 2; // it never registered: nothing tested
        }
        drop(t);
        let until = Instant::now() + Duration::from_secs(3);
        while common::probe::registered_pids(&p).contains(&me) {
            if Instant::now() > until {
                return 1;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        0
    });
    let rc = child.wait(Duration::from_secs(20));
    drop(g);
    assert!(waiter.join().unwrap().is_ok(), "the waiting task got K");
    // SAFETY: the waiter, the only other user of the box, has been joined.
    drop(unsafe { Box::from_raw(boxed) });
    assert_eq!(
        rc, 0,
        "the child's registration went with its handle (1: still there 3 s after)"
    );
}
