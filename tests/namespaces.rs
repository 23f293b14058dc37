//! Namespaces, `/proc` and the boot id: a holder is judged alive or dead on what the
//! kernel vouches for, whatever namespaces the processes involved run in. A process that
//! made a time namespace for its children, or whose main thread has exited (its
//! `/proc/self/timens_offsets` reads empty), keeps the clock everyone shares; a registrant
//! in a time namespace with a boottime offset that closed its descriptors is still seen
//! alive; a child that is pid 1 of a new pid namespace never takes its parent's hold for
//! its own; a holder that exited but is not reaped (a zombie) is dead; and a process that
//! reads another boot id (after a reboot, or through a mount namespace) resets a table
//! only when nobody alive uses it, and tokens keep growing across the reset.
//!
//! Exercises `src/shm/clock.rs` (the time-namespace offset), `src/shm/process.rs` (who
//! this process is), `src/shm/registry.rs` (judging an owner), `src/shm/file.rs` (the
//! reboot reset) and `src/shm/format.rs` (boot id, token base). More cases of the same
//! promise (a `/proc` mounted with hidepid for another uid, time, pid and boot-id
//! namespaces) are in `tests/liveness.rs`.
//!
//! `namespaces FILTER` runs the tests whose name contains FILTER; `namespaces --list`
//! lists them; the root-only ones run with `--include-ignored` as root.

mod common;

use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::fork::{fork, Shared};
use common::harness::{require_root, Test};
use common::ns::{bind, private_mount_ns, BOOT_ID_FILE};
use common::probe::{await_word, close_from_3, Proc};
use common::{opts, TempPath};
use shmlock::LockTable;

const ROOT_NS: &str = "needs root: time namespaces";

const TESTS: &[Test] = &[
    Test::new(
        "a_process_whose_proc_went_away_after_open_keeps_locking",
        a_process_whose_proc_went_away_after_open_keeps_locking,
    )
    .needs_root("needs root: a mount namespace without /proc"),
    Test::new(
        "a_child_in_a_chroot_without_proc_says_so",
        a_child_in_a_chroot_without_proc_says_so,
    )
    .needs_root("needs root: chroot"),
    Test::new(
        "a_process_that_unshared_a_time_namespace_keeps_its_own_clock",
        a_process_that_unshared_a_time_namespace_keeps_its_own_clock,
    )
    .needs_root(ROOT_NS),
    Test::new(
        "an_opener_whose_main_thread_exited_never_misreads_its_clock",
        an_opener_whose_main_thread_exited_never_misreads_its_clock,
    )
    .needs_root(ROOT_NS),
    Test::new(
        "closed_descriptor_registrant_in_a_boottime_namespace_keeps_its_key",
        closed_descriptor_registrant_in_a_boottime_namespace_keeps_its_key,
    )
    .needs_root("unshare(CLONE_NEWTIME)"),
    Test::new(
        "control_closed_descriptor_registrant_in_a_monotonic_only_namespace_keeps_its_key",
        control_closed_descriptor_registrant_in_a_monotonic_only_namespace_keeps_its_key,
    )
    .needs_root("unshare(CLONE_NEWTIME)"),
    Test::new(
        "a_pid_1_child_in_a_new_pid_namespace_never_releases_the_parents_hold",
        a_pid_1_child_in_a_new_pid_namespace_never_releases_the_parents_hold,
    )
    .needs_root("needs root: new pid namespaces"),
    Test::new("zombie_holder_frees_its_keys", zombie_holder_frees_its_keys),
    Test::new(
        "a_lazy_handle_resets_a_table_of_an_earlier_boot_and_none_is_reset_under_it",
        a_lazy_handle_resets_a_table_of_an_earlier_boot_and_none_is_reset_under_it,
    ),
    Test::new(
        "concurrent_attach_after_reboot_keeps_tokens_growing",
        concurrent_attach_after_reboot_keeps_tokens_growing,
    ),
    Test::new(
        "other_boot_id_newcomer_vs_holder_that_closed_every_descriptor",
        other_boot_id_newcomer_vs_holder_that_closed_every_descriptor,
    )
    .needs_root("bind-mounts a boot id in a mount namespace"),
    Test::new(
        "other_boot_id_newcomer_vs_worker_registered_on_a_dropped_description",
        other_boot_id_newcomer_vs_worker_registered_on_a_dropped_description,
    )
    .needs_root("bind-mounts a boot id in a mount namespace"),
    Test::new(
        "control_other_boot_id_newcomer_vs_worker_without_close_range",
        control_other_boot_id_newcomer_vs_worker_without_close_range,
    )
    .needs_root("bind-mounts a boot id in a mount namespace"),
];

fn main() {
    common::harness::run("namespaces", TESTS, common::harness::no_roles);
}

// ---------------------------------------------------------------------------------------
// A process whose /proc goes away after it opened the table: it takes, renews and releases
// a key, and takes over a dead holder's key, which it judges by the registry's locks
// alone. (A child it forks then is refused: see docs/liveness.md, "Without /proc".)

fn a_process_whose_proc_went_away_after_open_keeps_locking() {
    common::harness::require_root();
    let path = TempPath::new("noproc");
    let table = LockTable::open(&path, 64).unwrap();
    let dead = fork(|| {
        std::mem::forget(table.lock("dead", common::opts(30_000, 0)).unwrap());
        0
    });
    assert_eq!(dead.wait(Duration::from_secs(30)), 0);
    drop(table);
    let child = fork(|| {
        let table = LockTable::open(&path, 64).unwrap();
        table
            .lock("k", common::opts(30_000, 0))
            .unwrap()
            .unlock()
            .unwrap();
        common::ns::private_mount_ns();
        // SAFETY: detaching a mount point named by a valid C string, in a child of our own.
        let rc = unsafe { libc::umount2(c"/proc".as_ptr(), libc::MNT_DETACH) };
        assert_eq!(rc, 0, "umount /proc");
        assert!(!Path::new("/proc/self").exists());
        let mut g = table.lock("k", common::opts(30_000, 0)).unwrap();
        g.expire(None).unwrap();
        g.check().unwrap();
        g.unlock().unwrap();
        let taken = table.lock("dead", common::opts(30_000, 5_000)).unwrap();
        i32::from(taken.try_token().is_err())
    });
    assert_eq!(child.wait(Duration::from_secs(30)), 0);
}

// ---------------------------------------------------------------------------------------
// A forked child that moved into a chroot with no /proc (and where the table's path names
// nothing) takes its first lock: the error says there is no /proc, not that the path
// names another file.

fn a_child_in_a_chroot_without_proc_says_so() {
    common::harness::require_root();
    let path = TempPath::new("chroot");
    let table = LockTable::open(&path, 64).unwrap();
    let root = TempPath::new("chroot-root");
    fs::create_dir(&root.0).unwrap();
    let child = fork(|| {
        let dir = common::cstr(root.0.to_str().unwrap());
        // SAFETY: chroot and chdir with valid C strings, in a forked child.
        unsafe {
            assert_eq!(libc::chroot(dir.as_ptr()), 0);
            assert_eq!(libc::chdir(c"/".as_ptr()), 0);
        }
        match table.lock("K", common::opts(30_000, 0)) {
            Ok(_) => 1,
            Err(e) if e.to_string().contains("no /proc") => 0,
            Err(e) => {
                eprintln!("{e}");
                2
            }
        }
    });
    assert_eq!(
        child.wait(Duration::from_secs(30)),
        0,
        "the error did not name the cause"
    );
}

const K: &str = "K";

// ---------------------------------------------------------------------------------------
// Time namespaces: /proc/self/timens_offsets is the offset of the namespace for children

/// A process that unshares a time namespace for the children it will start (setting their
/// monotonic clock 3600 s ahead) stays in its own namespace, but `timens_offsets` now shows
/// the children's offset. Opening a table afterwards must not take that offset for its own
/// (its leases would be expired for everyone else).
fn a_process_that_unshared_a_time_namespace_keeps_its_own_clock() {
    require_root();
    let path = TempPath::new("timens-unshare");
    drop(LockTable::open(&path, 64).unwrap());
    let ready = Shared::new(2);
    let _h = Proc::new(fork(|| {
        // SAFETY: plain system call.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWTIME) }, 0);
        fs::write("/proc/self/timens_offsets", "monotonic 3600 0\n").unwrap();
        let t = LockTable::open(&path, 64).unwrap();
        let g = t.lock(K, opts(60_000, 1_000)).unwrap();
        ready.word(0).store(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(30));
        drop(g);
        0
    }));
    await_word(&ready, 0, Duration::from_secs(10));
    let table = LockTable::open(&path, 64).unwrap();
    let got = table.lock(K, opts(60_000, 1_000));
    let stole = got.is_ok();
    if let Ok(g) = got {
        note!("[took K at once though its holder has 60 s left] ");
        std::mem::forget(g);
    }
    assert!(!stole, "two live holders of K");
}

/// In a time namespace with a +3600 s offset, a process whose main thread has exited opens
/// the table from another thread: `/proc/self/timens_offsets` of a process whose leader is
/// a zombie reads empty: it must not take that for "no offset" (every lease would look
/// expired to it); finding K busy, or refusing, are both right.
fn an_opener_whose_main_thread_exited_never_misreads_its_clock() {
    require_root();
    let path = TempPath::new("timens-zombie");
    let table = LockTable::open(&path, 64).unwrap();
    let g = table.lock(K, opts(60_000, 1_000)).unwrap();
    let result = Shared::new(2);
    let mut middle = Proc::new(fork(|| {
        // SAFETY: plain system call.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWTIME) }, 0);
        fs::write("/proc/self/timens_offsets", "monotonic 3600 0\n").unwrap();
        let inner = fork(|| {
            let p = path.0.clone();
            let w0 = result.word(0) as *const std::sync::atomic::AtomicU64 as usize;
            let w1 = result.word(1) as *const std::sync::atomic::AtomicU64 as usize;
            std::thread::spawn(move || {
                // SAFETY: words of a shared mapping that outlives this process.
                let (w0, w1) = unsafe {
                    (
                        &*(w0 as *const std::sync::atomic::AtomicU64),
                        &*(w1 as *const std::sync::atomic::AtomicU64),
                    )
                };
                std::thread::sleep(Duration::from_millis(200)); // the leader is gone by now
                let off = fs::read_to_string("/proc/self/timens_offsets").unwrap_or_default();
                let code = match LockTable::open(&p, 64).and_then(|t| {
                    t.try_lock_with_lease(K, Duration::from_secs(60))
                        .map(|g| g.map(std::mem::forget))
                }) {
                    Ok(Some(())) => 2,
                    Ok(None) => 1,
                    Err(_) => 3,
                };
                w1.store(off.len() as u64, Ordering::SeqCst);
                w0.store(code, Ordering::SeqCst);
                // SAFETY: leaving the process.
                unsafe { libc::_exit(0) };
            });
            // SAFETY: SYS_exit ends the calling (main) thread only; nothing on this stack
            // is used again.
            unsafe { libc::syscall(libc::SYS_exit, 0) };
            unreachable!()
        });
        inner.wait(Duration::from_secs(20))
    }));
    let code = await_word(&result, 0, Duration::from_secs(20));
    let _ = middle.wait(Duration::from_secs(20));
    note!(
        "[timens_offsets read {} bytes; the waiter {}] ",
        result.word(1).load(Ordering::SeqCst),
        match code {
            1 => "found K busy",
            2 => "TOOK K from a live 60 s holder",
            _ => "was refused (its clock offset cannot be read)",
        }
    );
    drop(g);
    // Finding K busy, or refusing to work with a clock it cannot vouch for, are both
    // right; taking K is not.
    assert_ne!(code, 2, "two live holders of K");
}

// ---------------------------------------------------------------------------------------
// A registrant that closed its descriptor is alive if /proc shows it running with the
// same start time. /proc/<pid>/stat's start time is shifted by the *reader's*
// time-namespace boottime offset, so a registrant in a time namespace with a boottime
// offset records a start time nobody outside reads: it must still be judged alive.

fn closed_descriptor_in_time_namespace(offsets: &'static str) {
    let path = TempPath::new("timens-closed");
    let table = LockTable::open(&path, 64).unwrap();
    let flag = Shared::new(2);
    let _o = Proc::new(fork(|| {
        // SAFETY: unshare in a single-threaded child.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWTIME) }, 0);
        fs::write("/proc/self/timens_offsets", offsets).unwrap();
        let d = fork(|| {
            let t = LockTable::open(&path, 64).unwrap();
            // SAFETY: closes descriptors; nothing else runs in this child.
            let rc = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
            assert_eq!(rc, 0);
            let g = t.lock(K, opts(0, 1_000)).unwrap();
            flag.word(0).store(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(1500));
            let r = g.unlock();
            flag.word(1)
                .store(if r.is_ok() { 1 } else { 2 }, Ordering::SeqCst);
            std::thread::sleep(Duration::from_secs(30));
            0
        });
        let _ = d.wait(Duration::from_secs(40));
        0
    }));
    await_word(&flag, 0, Duration::from_secs(10));
    let other = table
        .try_lock_with_lease(K, Duration::from_secs(60))
        .unwrap();
    let d_unlock = await_word(&flag, 1, Duration::from_secs(10));
    note!(
        "[offsets {:?}: D (running, descriptor closed) holds K; this process {}; D's unlock \
         later: {}] ",
        offsets.trim(),
        if other.is_some() {
            "ALSO TOOK K"
        } else {
            "was refused"
        },
        if d_unlock == 1 { "Ok" } else { "Expired" }
    );
    assert!(
        other.is_none(),
        "two live holders: a running registrant in a time namespace with a boottime offset \
         whose descriptor was closed is judged dead"
    );
}

fn closed_descriptor_registrant_in_a_boottime_namespace_keeps_its_key() {
    closed_descriptor_in_time_namespace("boottime 3600 0\n");
}

fn control_closed_descriptor_registrant_in_a_monotonic_only_namespace_keeps_its_key() {
    closed_descriptor_in_time_namespace("monotonic 3600 0\n");
}

// ---------------------------------------------------------------------------------------
// A pid-1 child of a pid-1 parent: a guard must not tell its process by pid alone

/// A container's init (pid 1 in its namespace) holds K and forks a child into a new pid
/// namespace (as sandboxes and nested containers do): the child is pid 1 too, and its copy
/// of the guard must still not count as its own.
fn a_pid_1_child_in_a_new_pid_namespace_never_releases_the_parents_hold() {
    require_root();
    let path = TempPath::new("pid1");
    let table = LockTable::open(&path, 64).unwrap();
    let r = Shared::new(2);
    let mut middle = Proc::new(fork(|| {
        // SAFETY: plain system call.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWPID) }, 0);
        let init = fork(|| {
            // pid 1 of a new namespace
            let t = LockTable::open(&path, 64).unwrap();
            let g = t.lock(K, opts(60_000, 1_000)).unwrap();
            // SAFETY: plain system call.
            assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWPID) }, 0);
            let gref = &g;
            let child = fork(move || {
                // The child's copy of the guard goes out of scope (it is pid 1 as well).
                // SAFETY: this is the child's own copy of the memory; the original is never
                // used in this process again.
                drop(unsafe { std::ptr::read(gref) });
                0
            });
            child.wait(Duration::from_secs(10));
            r.word(1)
                .store(u64::from(std::process::id()), Ordering::SeqCst);
            r.word(0).store(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_secs(30));
            drop(g);
            0
        });
        init.wait(Duration::from_secs(60))
    }));
    await_word(&r, 0, Duration::from_secs(10));
    let held = table.is_locked(K).unwrap();
    note!(
        "[the holder is pid {} in its namespace; after its child dropped its copy, K is {}] ",
        r.word(1).load(Ordering::SeqCst),
        if held { "still held" } else { "FREE" }
    );
    let _ = middle.try_wait();
    assert!(held, "a forked child released its parent's hold");
}

// ---------------------------------------------------------------------------------------
// A holder that exited but is not reaped (a zombie): its mapping went at exit.

fn zombie_holder_frees_its_keys() {
    let path = TempPath::new("zombie");
    drop(LockTable::open(&path, 64).unwrap());
    let z = fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        let g = t.lock(K, opts(60_000, 1_000)).unwrap();
        std::mem::forget(g);
        std::mem::forget(t);
        0
    });
    std::thread::sleep(Duration::from_millis(100));
    let state = fs::read_to_string(format!("/proc/{}/stat", z.0)).unwrap();
    let table = LockTable::open(&path, 64).unwrap();
    let started = Instant::now();
    let r = table.lock(K, opts(60_000, 2_000)).map(drop);
    note!(
        "[holder state {}; waiter {} in {:?}] ",
        state.split_whitespace().nth(2).unwrap(),
        if r.is_ok() { "took K" } else { "TIMED OUT" },
        started.elapsed()
    );
    z.wait(Duration::from_secs(5));
    assert!(r.is_ok());
}

// ---------------------------------------------------------------------------------------
// The reboot reset against a concurrent attacher

fn set_boot_id_in_header(path: &Path, id: [u8; 16]) {
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut h = [0u8; 96];
    f.read_exact_at(&mut h, 0).unwrap();
    h[40..56].copy_from_slice(&id);
    let sum = xxhash_rust::xxh3::xxh3_64(&h);
    f.write_all_at(&h, 0).unwrap();
    f.write_all_at(&sum.to_le_bytes(), 96).unwrap();
}

fn ofd_lock(f: &fs::File, byte: i64, kind: i32) -> bool {
    // SAFETY: a zeroed flock is valid.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = byte;
    fl.l_len = 1;
    // SAFETY: valid descriptor and flock.
    unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_SETLK, &fl) == 0 }
}

/// A handle opened with `register_lazily` attaches as any writer does: the table of an
/// earlier boot is reset when it opens (a key left to expire then is free, and tokens go
/// on growing from above the old ones, its own too), and no other process resets the
/// table under it while it is open, even before it registers.
fn a_lazy_handle_resets_a_table_of_an_earlier_boot_and_none_is_reset_under_it() {
    let path = TempPath::new("lazy-reboot");
    let mut before = 0;
    {
        let t = LockTable::open(&path, 64).unwrap();
        for _ in 0..200 {
            let g = t.lock(K, opts(1_000, 1_000)).unwrap();
            before = before.max(g.token().unwrap());
        }
        let old = t.lock("OLD", opts(3_600_000, 1_000)).unwrap();
        before = before.max(old.leave_to_expire().unwrap());
    }
    set_boot_id_in_header(&path.0, [0x42; 16]);
    let lazy = LockTable::options()
        .create(false)
        .register_lazily(true)
        .open(&path)
        .unwrap();
    assert!(
        !lazy.is_locked("OLD").unwrap(),
        "an earlier boot's key outlived it"
    );
    let other = fork(|| {
        let t = LockTable::open(&path.0, 64).unwrap();
        let g = t.lock(K, opts(1_000, 1_000)).unwrap();
        i32::from(g.token().unwrap() <= before)
    });
    assert_eq!(
        other.wait(Duration::from_secs(20)),
        0,
        "a token went backwards"
    );
    let held = lazy
        .try_lock_with_lease("HELD", Duration::from_secs(600))
        .unwrap()
        .expect("HELD is free");
    let mine = held.token().unwrap();
    assert!(mine > before, "the lazy handle's token {mine} <= {before}");
    // Another reboot, as the file tells it, while the lazy handle is open: a newcomer
    // must leave the table as it is.
    set_boot_id_in_header(&path.0, [0x43; 16]);
    let newcomer = fork(|| {
        let t = LockTable::open(&path.0, 64).unwrap();
        let kept = t.is_locked("HELD").unwrap();
        let g = t.lock(K, opts(1_000, 1_000)).unwrap();
        i32::from(!kept) + 2 * i32::from(g.token().unwrap() <= mine)
    });
    assert_eq!(
        newcomer.wait(Duration::from_secs(20)),
        0,
        "the table was reset under a lazy handle (1: key lost, 2: token went back)"
    );
    held.unlock().unwrap();
    note!("[lazy open reset the old boot's table; none under it] ");
}

/// After a reboot (the file names another boot), two processes attach at once. Both read
/// the old header before either marks the file in use; the first resets the table (and
/// moves its token base past every old token); the second must then use the header as it
/// is, so every token after the reboot is above those handed out before it.
fn concurrent_attach_after_reboot_keeps_tokens_growing() {
    let path = TempPath::new("reboot");
    let mut before = 0;
    {
        let t = LockTable::open(&path, 64).unwrap();
        for _ in 0..1000 {
            let g = t.lock(K, opts(1_000, 1_000)).unwrap();
            before = before.max(g.token().unwrap());
        }
    }
    set_boot_id_in_header(&path.0, [0x42; 16]);
    // Somebody is attaching (holds the init lock) while A and B start.
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    assert!(ofd_lock(&f, 4000, libc::F_WRLCK));
    let tokens = Shared::new(4);
    let attach = |slot: usize| {
        let (path, tokens) = (&path, &tokens);
        Proc::new(fork(move || {
            let t = LockTable::open(path, 64).unwrap();
            // take turns: A first, then B; A stays attached until B is done
            if slot == 1 {
                await_word(tokens, 0, Duration::from_secs(20));
            }
            let g = t.lock(K, opts(1_000, 5_000)).unwrap();
            tokens
                .word(slot)
                .store(g.token().unwrap(), Ordering::SeqCst);
            drop(g);
            if slot == 0 {
                await_word(tokens, 1, Duration::from_secs(20));
            }
            0
        }))
    };
    let mut a = attach(0);
    let mut b = attach(1);
    std::thread::sleep(Duration::from_millis(300)); // both have read the header by now
    assert!(ofd_lock(&f, 4000, libc::F_UNLCK));
    assert_eq!(a.wait(Duration::from_secs(20)), 0);
    assert_eq!(b.wait(Duration::from_secs(20)), 0);
    let (ta, tb) = (
        tokens.word(0).load(Ordering::SeqCst),
        tokens.word(1).load(Ordering::SeqCst),
    );
    note!("[before reboot up to {before}; after: A {ta}, then B {tb}] ");
    assert!(ta > before && tb > ta, "fencing tokens went backwards");
}

// ---------------------------------------------------------------------------------------
// The reboot reset. A newcomer in a mount namespace whose boot id file reads another id
// attaches while (a) a holder that closed every descriptor holds K, (b) a daemon's worker
// registered through a description that is gone (as in
// `a_worker_keeps_its_key_after_close_range_and_a_second_handle`, `tests/descriptors.rs`)
// holds K. Neither table may be reset.

/// In a forked child: a private mount namespace where the boot id reads another id, then
/// opens `path`; exit code 0 if the open worked.
fn newcomer_with_other_boot_id(path: &Path) -> i32 {
    let fake = TempPath::new("bootid");
    fs::write(&fake, "0badc0de-1111-4222-8333-444455556666\n").unwrap();
    let c = fork(|| {
        private_mount_ns();
        bind(fake.0.to_str().unwrap(), BOOT_ID_FILE);
        let seen = fs::read_to_string(BOOT_ID_FILE).unwrap();
        assert!(seen.starts_with("0badc0de"));
        match LockTable::open(path, 64) {
            Ok(t) => {
                drop(t);
                0
            }
            Err(e) => {
                eprintln!("newcomer: {e}");
                1
            }
        }
    });
    c.wait(Duration::from_secs(20))
}

fn other_boot_id_newcomer_vs_holder_that_closed_every_descriptor() {
    common::harness::require_root();
    let path = TempPath::new("reset-a");
    drop(LockTable::open(&path, 64).unwrap());
    let flag = Shared::new(4);
    let _h = Proc::new(fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        let g = t.lock(K, opts(60_000, 1_000)).unwrap();
        close_from_3();
        flag.word(0).store(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(30));
        drop(g);
        0
    }));
    await_word(&flag, 0, Duration::from_secs(10));
    let rc = newcomer_with_other_boot_id(path.as_ref());
    let table = LockTable::open(&path, 64).unwrap();
    let locked = table.is_locked(K).unwrap();
    note!("[newcomer rc {rc}; K still held by the live holder: {locked}] ");
    assert!(locked, "a live table was reset");
}

fn other_boot_id_newcomer_vs_worker_registered_on_a_dropped_description() {
    reset_b(true);
}

fn control_other_boot_id_newcomer_vs_worker_without_close_range() {
    reset_b(false);
}

fn reset_b(close: bool) {
    common::harness::require_root();
    let path = TempPath::new("reset-b");
    drop(LockTable::open(&path, 64).unwrap());
    let flag = Shared::new(4);
    let p = fork(|| {
        let a = LockTable::open(&path, 64).unwrap();
        if close {
            close_from_3();
        }
        let b = std::cell::RefCell::new(Some(LockTable::open(&path, 64).unwrap()));
        let _c = fork(|| {
            flag.word(2)
                .store(std::process::id() as u64, Ordering::SeqCst);
            let g = a.lock(K, opts(60_000, 1_000)).unwrap();
            drop(b.borrow_mut().take());
            // wait for the parent to be gone (the daemon's launcher exits)
            std::thread::sleep(Duration::from_millis(200));
            flag.word(0).store(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_secs(20));
            drop(g);
            0
        });
        std::mem::forget(a);
        0 // P exits; the worker C is reparented and keeps running
    });
    let _ = p.wait(Duration::from_secs(10));
    await_word(&flag, 0, Duration::from_secs(10));
    let worker = flag.word(2).load(Ordering::SeqCst) as libc::pid_t;
    let rc = newcomer_with_other_boot_id(path.as_ref());
    let table = LockTable::open(&path, 64).unwrap();
    let locked = table.is_locked(K).unwrap();
    let alive = fs::read_to_string(format!("/proc/{worker}/stat"))
        .map(|s| s.split_whitespace().nth(2).unwrap_or("?").to_string());
    note!("[worker {worker} state {alive:?} holds K; newcomer (other boot id) rc {rc}; K still held: {locked}] ");
    common::signal::send(worker, libc::SIGKILL);
    assert!(locked, "a live table was reset");
}
