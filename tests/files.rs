//! The table file: however a process reaches a table, it is one table and the promises
//! hold on it. Several paths to one file (a hard link, a symbolic link) are one table; a
//! dead holder is reclaimed at once on a disk filesystem as on tmpfs; a filesystem on which
//! a live holder would look dead (overlayfs maps another file than the one opened) is
//! refused; fencing tokens keep growing when the file is deleted and made again. A table
//! deleted or replaced while in use never splits in two: no table is made at the path of
//! a deleted one while a live process still maps it, and the processes on it find out at
//! their next wait or renewal and take no new key from it. A filesystem without room says
//! how much it would need.
//!
//! Exercises `src/shm/file.rs` (creating and attaching, the filesystem check),
//! `src/shm/deleted.rs` and `src/shm/attachment.rs` (a file deleted or replaced in use),
//! `src/shm/anchor.rs` (the registration's locks on the file), `src/shm/format.rs` and
//! `src/shm/lock_table.rs` (the token base). The file layer's other cases (a dangling
//! symlink, mode bits, a creator killed midway) are in `tests/liveness.rs`.
//!
//! `files FILTER` runs the tests whose name contains FILTER; `files --list` lists them; the
//! root-only ones run with `--include-ignored` as root; `files --role newcomer PATH` is a
//! process with nothing mapped trying the table at PATH.

mod common;

use std::ffi::CString;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::fork::{fork, Gate, Shared};
use common::harness::Test;
use common::ns::private_mount_ns;
use common::probe::{await_word, ofd_locks_on, Proc};
use common::{cstr, opts, TempPath};
use shmlock::{LockTable, SharedDict};

const TESTS: &[Test] = &[
    Test::new(
        "hardlink_and_symlink_paths_are_one_table",
        hardlink_and_symlink_paths_are_one_table,
    ),
    Test::new(
        "a_dead_holder_on_a_disk_filesystem_is_reclaimed_at_once",
        a_dead_holder_on_a_disk_filesystem_is_reclaimed_at_once,
    ),
    Test::new(
        "a_table_on_overlayfs_is_refused_not_judged_dead",
        a_table_on_overlayfs_is_refused_not_judged_dead,
    )
    .needs_root("mounts an overlayfs in a mount namespace"),
    Test::new("control_tmpfs_live_holder", control_tmpfs_live_holder),
    Test::new(
        "a_table_too_big_for_its_filesystem_says_how_much_room_it_needs",
        a_table_too_big_for_its_filesystem_says_how_much_room_it_needs,
    )
    .needs_root("mounts a 1 MiB tmpfs in a mount namespace"),
    Test::new(
        "tokens_grow_across_re_creating_the_file",
        tokens_grow_across_re_creating_the_file,
    ),
    Test::new(
        "a_table_unlinked_while_in_use_never_gives_a_held_key_to_a_newcomer",
        a_table_unlinked_while_in_use_never_gives_a_held_key_to_a_newcomer,
    ),
    Test::new(
        "a_table_deleted_under_its_holder_is_not_made_anew_until_it_lets_go",
        a_table_deleted_under_its_holder_is_not_made_anew_until_it_lets_go,
    ),
    Test::new(
        "a_waiter_on_a_deleted_table_gives_up_saying_so",
        a_waiter_on_a_deleted_table_gives_up_saying_so,
    ),
    Test::new(
        "a_table_replaced_by_a_rename_is_left_by_its_users",
        a_table_replaced_by_a_rename_is_left_by_its_users,
    ),
    Test::new(
        "a_hold_kept_alive_outlives_the_deletion_of_its_file",
        a_hold_kept_alive_outlives_the_deletion_of_its_file,
    ),
    Test::new(
        "a_holder_whose_main_thread_exited_is_seen_mapping_a_deleted_table",
        a_holder_whose_main_thread_exited_is_seen_mapping_a_deleted_table,
    ),
    Test::new(
        "a_deleted_table_with_a_newline_in_its_path_is_seen",
        a_deleted_table_with_a_newline_in_its_path_is_seen,
    ),
    Test::new(
        "a_live_table_named_like_a_deleted_one_blocks_nothing",
        a_live_table_named_like_a_deleted_one_blocks_nothing,
    ),
    Test::new(
        "a_table_opened_by_a_relative_path_survives_a_chdir",
        a_table_opened_by_a_relative_path_survives_a_chdir,
    ),
    Test::new(
        "a_file_deleted_between_its_opening_and_its_mapping_is_let_go",
        a_file_deleted_between_its_opening_and_its_mapping_is_let_go,
    ),
];

fn main() {
    common::harness::run("files", TESTS, roles);
}

/// `--role newcomer PATH`: a process with nothing mapped opens the table at PATH and tries
/// K; prints `took`, `busy`, `deleted-in-use PID,PID…`, or `error MESSAGE`.
fn roles(args: &[String]) -> i32 {
    match args.first().map(String::as_str) {
        Some("newcomer") => {
            let out = match LockTable::open(&args[1], 64) {
                Ok(t) => match t.try_lock_with_lease(K, Duration::from_secs(60)) {
                    Ok(Some(g)) => {
                        g.leave_to_expire();
                        "took".to_string()
                    }
                    Ok(None) => "busy".to_string(),
                    Err(e) => format!("error {e}"),
                },
                Err(shmlock::Error::DeletedInUse { pids, .. }) => format!(
                    "deleted-in-use {}",
                    pids.iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(",")
                ),
                Err(e) => format!("error {e}"),
            };
            println!("{out}");
            0
        }
        _ => common::harness::no_roles(args),
    }
}

/// What a newcomer process (this binary, started anew) makes of the table at `path`.
fn newcomer(path: &Path) -> String {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--role", "newcomer"])
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn table_gone(r: Result<impl std::fmt::Debug, shmlock::Error>, how: &str) -> bool {
    match r {
        Err(shmlock::Error::TableGone { how: h, .. }) => h == how,
        other => {
            eprintln!("not TableGone ({how}): {other:?}");
            false
        }
    }
}

const K: &str = "K";

// ---------------------------------------------------------------------------------------
// Several paths to one file

/// A holder opens the table by its path, a waiter through a hard link, another through a
/// symbolic link: all are one table (busy for the others), and the holder's death frees K
/// at once for a waiter on another path.
fn hardlink_and_symlink_paths_are_one_table() {
    let path = TempPath::new("paths");
    let hard = TempPath::new("paths-hard");
    let soft = TempPath::new("paths-soft");
    let table = LockTable::open(&path, 64).unwrap();
    fs::hard_link(&path, &hard).unwrap();
    std::os::unix::fs::symlink(&path, &soft).unwrap();
    let flag = Shared::new(1);
    let mut h = Proc::new(fork(|| {
        let t = LockTable::open(&hard, 64).unwrap();
        let g = t.lock(K, opts(0, 1_000)).unwrap();
        std::mem::forget(g);
        flag.word(0).store(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(60));
        0
    }));
    await_word(&flag, 0, Duration::from_secs(10));
    let by_soft = LockTable::open(&soft, 64).unwrap();
    assert!(table
        .try_lock_with_lease(K, Duration::from_secs(1))
        .unwrap()
        .is_none());
    assert!(by_soft
        .try_lock_with_lease(K, Duration::from_secs(1))
        .unwrap()
        .is_none());
    h.kill();
    let started = Instant::now();
    let got = by_soft.lock(K, opts(0, 2_000));
    note!(
        "[after the holder's death: {:?} in {:?}] ",
        got.is_ok(),
        started.elapsed()
    );
    assert!(got.is_ok());
}

// ---------------------------------------------------------------------------------------
// A table on a disk filesystem (ext4/overlay/xfs, not tmpfs)

fn disk_dir() -> PathBuf {
    let dir = std::env::var_os("CARGO_TARGET_TMPDIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"));
    fs::create_dir_all(&dir).unwrap();
    dir
}

struct Remove(PathBuf);
impl Drop for Remove {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

fn a_dead_holder_on_a_disk_filesystem_is_reclaimed_at_once() {
    let path = Remove(disk_dir().join(format!("shmlock-test-disk-{}", std::process::id())));
    let _ = fs::remove_file(&path.0);
    let table = LockTable::open(&path.0, 64).unwrap();
    let fs_type = {
        // SAFETY: statfs into a zeroed struct with a valid NUL-terminated path.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        let c = CString::new(path.0.to_str().unwrap()).unwrap();
        // SAFETY: c is a NUL-terminated path; st is a valid, writable statfs out-pointer.
        assert_eq!(unsafe { libc::statfs(c.as_ptr(), &mut st) }, 0);
        st.f_type
    };
    let flag = Shared::new(1);
    let mut h = Proc::new(fork(|| {
        let t = LockTable::open(&path.0, 64).unwrap();
        let g = t.lock(K, opts(0, 1_000)).unwrap();
        std::mem::forget(g);
        flag.word(0).store(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(60));
        0
    }));
    await_word(&flag, 0, Duration::from_secs(10));
    assert!(table
        .try_lock_with_lease(K, Duration::from_secs(1))
        .unwrap()
        .is_none());
    h.kill();
    let started = Instant::now();
    let got = table.lock(K, opts(0, 2_000));
    note!(
        "[filesystem magic {fs_type:#x}; after the holder's death: {:?} in {:?}] ",
        got.is_ok(),
        started.elapsed()
    );
    assert!(got.is_ok());
}

fn mount_overlay(base: &Path) -> PathBuf {
    for d in ["lower", "upper", "work", "merged"] {
        fs::create_dir_all(base.join(d)).unwrap();
    }
    let data = format!(
        "lowerdir={},upperdir={},workdir={}",
        base.join("lower").display(),
        base.join("upper").display(),
        base.join("work").display()
    );
    let merged = base.join("merged");
    // SAFETY: plain syscall on C strings we own.
    let rc = unsafe {
        libc::mount(
            cstr("overlay").as_ptr(),
            cstr(merged.to_str().unwrap()).as_ptr(),
            cstr("overlay").as_ptr(),
            0,
            cstr(&data).as_ptr().cast(),
        )
    };
    assert_eq!(rc, 0, "mount overlay: {}", std::io::Error::last_os_error());
    merged
}

// ---------------------------------------------------------------------------------------
// A table on overlayfs (a container's root filesystem): mmap of an overlay file maps the
// real (upper) file, so an anchor does not keep the overlay description, and its locks
// go when the anchor's descriptor is closed.

fn live_holder_check(dir: &Path) -> Result<(), String> {
    let path = dir.join("table");
    let _ = fs::remove_file(&path);
    let shared = Shared::new(4);
    let holder = fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        let g = t.lock(K, opts(60_000, 1_000)).unwrap();
        shared.word(0).store(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(20));
        drop(g);
        0
    });
    await_word(&shared, 0, Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(50));
    let ino = fs::metadata(&path).unwrap().ino();
    let locks = ofd_locks_on(ino);
    let t = LockTable::open(&path, 64).unwrap();
    let hs = t.holders();
    let alive: Vec<_> = hs.iter().map(|h| (h.pid, h.owner_alive)).collect();
    let stolen = t.try_lock_with_lease(K, Duration::from_secs(60)).unwrap();
    // the holder is alive (sleeping 20 s)?
    let mut st = 0;
    // SAFETY: our own child.
    let reaped = unsafe { libc::waitpid(holder.0, &mut st, libc::WNOHANG) };
    let holder_alive = reaped == 0;
    let r = if stolen.is_some() {
        Err(format!(
            "holder pid {} alive={holder_alive} holds {K} (lease 60 s); /proc/locks for the \
             table before our open: {locks:?}; holders() says (pid, owner_alive) = {alive:?}; a \
             newcomer's try_lock_with_lease({K}) TOOK IT",
            holder.0
        ))
    } else {
        note!("[holders {alive:?}, locks {locks:?}, newcomer could not take K] ");
        Ok(())
    };
    drop(stolen);
    holder.kill();
    r
}

/// A filesystem that maps another file than the one opened (overlayfs maps the file
/// beneath it) keeps no lock for a mapping: the registration would vanish with the anchor's
/// descriptor, a live holder would be judged dead (a newcomer would take its key), and a
/// newcomer with another boot id would reset a dict under its live writer. Opening a table
/// or a dict there is refused with a clear error instead.
fn a_table_on_overlayfs_is_refused_not_judged_dead() {
    common::harness::require_root();
    let c = fork(|| {
        private_mount_ns();
        let base = PathBuf::from(format!("/tmp/shmlock-test-ovl-{}", std::process::id()));
        let merged = mount_overlay(&base);
        let table = LockTable::open(merged.join("table"), 64).map(drop);
        let dict = SharedDict::open(merged.join("dict"), 64, 64).map(drop);
        // SAFETY: unmounting what we mounted.
        unsafe { libc::umount2(cstr(merged.to_str().unwrap()).as_ptr(), libc::MNT_DETACH) };
        let _ = fs::remove_dir_all(&base);
        let refused = |r: &Result<(), shmlock::Error>| match r {
            Err(shmlock::Error::Io { source, .. }) => {
                source.kind() == std::io::ErrorKind::Unsupported
            }
            _ => false,
        };
        note!("[overlayfs: table {table:?}; dict {dict:?}] ");
        i32::from(!(refused(&table) && refused(&dict)))
    });
    assert_eq!(
        c.wait(Duration::from_secs(60)),
        0,
        "a table on overlayfs was not refused"
    );
}

fn control_tmpfs_live_holder() {
    let dir = PathBuf::from(format!("/dev/shm/shmlock-test-ctl-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let r = live_holder_check(&dir);
    let _ = fs::remove_dir_all(&dir);
    if let Err(e) = r {
        panic!("{e}");
    }
}

// ---------------------------------------------------------------------------------------
// A filesystem without room

/// A table or dict bigger than its filesystem's free room (a container's 64 MiB `/dev/shm`
/// and a large capacity) is refused with `Error::NoSpace` naming the bytes needed and the
/// bytes free, and nothing is left behind on the filesystem. A capacity that fits is then
/// made there as usual. (The CLI's exit code for it: `tests/cli.rs`.)
fn a_table_too_big_for_its_filesystem_says_how_much_room_it_needs() {
    common::harness::require_root();
    let c = fork(|| {
        private_mount_ns();
        let dir = PathBuf::from(format!("/tmp/shmlock-test-full-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        // SAFETY: mounting a tmpfs on a directory we made, with C strings we own.
        let mounted = unsafe {
            libc::mount(
                cstr("tmpfs").as_ptr(),
                cstr(dir.to_str().unwrap()).as_ptr(),
                cstr("tmpfs").as_ptr(),
                0,
                cstr("size=1m").as_ptr().cast(),
            )
        };
        assert_eq!(
            mounted,
            0,
            "mount tmpfs: {}",
            std::io::Error::last_os_error()
        );
        let table = LockTable::open(dir.join("table"), 100_000).map(drop);
        let dict = SharedDict::open(dir.join("dict"), 100_000, 64).map(drop);
        let left: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        let small = LockTable::open(dir.join("small"), 64).map(|t| t.capacity());
        // SAFETY: unmounting what we mounted.
        unsafe { libc::umount2(cstr(dir.to_str().unwrap()).as_ptr(), libc::MNT_DETACH) };
        let _ = fs::remove_dir_all(&dir);
        let no_space = |r: &Result<(), shmlock::Error>| match r {
            Err(shmlock::Error::NoSpace {
                needed, available, ..
            }) => *needed > 1 << 20 && *available <= 1 << 20,
            _ => false,
        };
        note!("[table {table:?}; dict {dict:?}; left {left:?}; small {small:?}] ");
        let ok = no_space(&table) && no_space(&dict) && left.is_empty() && small.is_ok();
        i32::from(!ok)
    });
    assert_eq!(
        c.wait(Duration::from_secs(60)),
        0,
        "a table too big for its filesystem was not refused with NoSpace"
    );
}

// ---------------------------------------------------------------------------------------
// Tokens across re-creating the file

fn tokens_grow_across_re_creating_the_file() {
    let path = TempPath::new("tokens");
    let mut last = 0;
    for round in 0..5 {
        let table = LockTable::open(&path, 64).unwrap();
        assert!(
            table.created(),
            "round {round}: the file was not re-created"
        );
        for _ in 0..1000 {
            let g = table.lock(K, opts(1_000, 1_000)).unwrap();
            let t = g.token().unwrap();
            assert!(t > last, "round {round}: token {t} after {last}");
            last = t;
        }
        drop(table);
        fs::remove_file(&path).unwrap();
    }
}

// ---------------------------------------------------------------------------------------
// The table file unlinked (or replaced) while processes use it

/// H holds K on the table. The path is then unlinked (an administrator's `rm`, a tmp
/// cleaner) and a newcomer opens the same path. The newcomer must not be handed K while H
/// still holds it (it may get an error, or wait).
fn a_table_unlinked_while_in_use_never_gives_a_held_key_to_a_newcomer() {
    let path = TempPath::new("unlinked");
    let table = LockTable::open(&path, 64).unwrap();
    let _g = table.lock(K, opts(60_000, 1_000)).unwrap();
    fs::remove_file(&path).unwrap();
    let flag = Shared::new(1);
    let c = fork(|| {
        let code = match LockTable::open(&path, 64) {
            Ok(t) => match t.try_lock_with_lease(K, Duration::from_secs(60)) {
                Ok(Some(_)) => 1,
                Ok(None) => 2,
                Err(_) => 3,
            },
            Err(_) => 4,
        };
        flag.word(0).store(code, Ordering::SeqCst);
        0
    });
    assert_eq!(c.wait(Duration::from_secs(10)), 0);
    let code = flag.word(0).load(Ordering::SeqCst);
    note!(
        "[newcomer on the re-created path: {}] ",
        match code {
            1 => "TOOK K",
            2 => "refused",
            3 => "lock error",
            _ => "open error",
        }
    );
    assert_ne!(
        code, 1,
        "two live holders: the path was unlinked while K was held, and a newcomer on the \
         re-created file took K"
    );
    assert_eq!(code, 4, "the newcomer was not refused the path");
}

/// K is held and the table's file deleted (`rm`, a cleaner, systemd's `RemoveIPC`): a new
/// process that opens the path is refused (`DeletedInUse`, naming the holder) and makes
/// nothing there; the holder's renewals go on, its check says `TableGone`, it takes no new
/// key, and releases what it holds. Once it has let go of the table, the path is made anew.
fn a_table_deleted_under_its_holder_is_not_made_anew_until_it_lets_go() {
    let path = TempPath::new("deleted");
    let table = LockTable::open(&path, 64).unwrap();
    let mut held = shmlock::Lock::new(&table, opts(60_000, 0)).unwrap();
    held.lock(K).unwrap();
    fs::remove_file(&path).unwrap();
    let seen = newcomer(&path.0);
    assert_eq!(seen, format!("deleted-in-use {}", std::process::id()));
    assert!(!path.0.exists(), "a table was made beside the deleted one");
    // its renewals go on in the table its processes share; a check says it is gone
    held.expire(None).unwrap();
    assert!(table_gone(held.check(), "deleted"));
    assert!(table_gone(table.lock("other", opts(1000, 0)), "deleted"));
    assert!(table_gone(
        table.try_lock_with_lease("other", Duration::from_secs(1)),
        "deleted"
    ));
    held.unlock().unwrap();
    drop(held);
    drop(table);
    assert_eq!(newcomer(&path.0), "took");
}

/// A process waits for K, held by another; the file is deleted meanwhile. The wait ends
/// with `TableGone` (within a step, 0.5 s), not at its 30 s timeout with a key nobody else
/// can see.
fn a_waiter_on_a_deleted_table_gives_up_saying_so() {
    let path = TempPath::new("deleted-wait");
    let table = LockTable::open(&path, 64).unwrap();
    let held = Gate::new();
    let mut done = Gate::new();
    let holder = {
        let (table, held, done) = (&table, &held, &mut done);
        fork(move || {
            let _g = table.lock(K, opts(60_000, 0)).unwrap();
            held.signal();
            done.wait();
            0
        })
    };
    held.await_signals(1);
    let remover = {
        let path = path.0.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            fs::remove_file(path).unwrap();
        })
    };
    let t = Instant::now();
    let r = table.lock(K, opts(60_000, 30_000)).map(drop);
    let waited = t.elapsed();
    remover.join().unwrap();
    note!("[the wait ended after {waited:.2?}: {r:?}] ");
    assert!(table_gone(r, "deleted"));
    done.open();
    assert_eq!(holder.wait(Duration::from_secs(30)), 0);
}

/// A new table is made beside the one in use and renamed over its path (a deploy script,
/// `mv`): a newcomer gets the new table (and K in it); the process on the old one learns it
/// at its next check or wait (`TableGone`, "replaced") and takes no new key there.
fn a_table_replaced_by_a_rename_is_left_by_its_users() {
    let path = TempPath::new("replaced");
    let table = LockTable::open(&path, 64).unwrap();
    let mut held = shmlock::Lock::new(&table, opts(60_000, 0)).unwrap();
    held.lock(K).unwrap();
    let next = TempPath::new("replaced-next");
    drop(LockTable::open(&next, 64).unwrap());
    fs::rename(&next.0, &path.0).unwrap();
    assert_eq!(newcomer(&path.0), "took");
    held.expire(None).unwrap();
    assert!(table_gone(held.check(), "replaced by another file"));
    assert!(table_gone(
        table.lock("other", opts(1000, 0)),
        "replaced by another file"
    ));
    held.unlock().unwrap();
}

/// A hold kept alive (`keep_alive`, a 300 ms lease renewed under 1.2 s of work) while its
/// file is deleted: renewals go on in the table its processes share, so another of them
/// (a forked child) never gets K meanwhile and the work never reads "lost"; `keep_alive`
/// then says the table is gone.
fn a_hold_kept_alive_outlives_the_deletion_of_its_file() {
    let path = TempPath::new("deleted-keepalive");
    let table = LockTable::open(&path, 64).unwrap();
    let mut held = shmlock::Lock::new(&table, opts(300, 0)).unwrap();
    held.lock(K).unwrap();
    let took = Shared::new(1);
    let stop = Shared::new(1);
    let rival = {
        let (table, took, stop) = (&table, &took, &stop);
        fork(move || {
            while stop.word(0).load(Ordering::SeqCst) == 0 {
                if let Ok(Some(g)) = table.try_lock_with_lease(K, Duration::from_secs(1)) {
                    took.word(0).store(1, Ordering::SeqCst);
                    drop(g);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            0
        })
    };
    let (lost_seen, result) = held
        .keep_alive(|k| {
            std::thread::sleep(Duration::from_millis(100));
            fs::remove_file(&path.0).unwrap();
            let mut lost = false;
            for _ in 0..22 {
                std::thread::sleep(Duration::from_millis(50));
                lost |= k.is_lost();
            }
            lost
        })
        .unwrap();
    stop.word(0).store(1, Ordering::SeqCst);
    assert_eq!(rival.wait(Duration::from_secs(30)), 0);
    note!("[work saw lost: {lost_seen}; keep_alive: {result:?}] ");
    assert_eq!(
        took.word(0).load(Ordering::SeqCst),
        0,
        "K was taken during the work"
    );
    assert!(!lost_seen);
    assert!(table_gone(result, "deleted"));
    held.unlock().unwrap();
}

/// The holder's main thread has exited while another of its threads holds K (its own
/// `maps` reads empty then; its threads' do not): after the file is deleted, a newcomer is
/// still refused, naming it.
fn a_holder_whose_main_thread_exited_is_seen_mapping_a_deleted_table() {
    let path = TempPath::new("deleted-mainless");
    let held = Gate::new();
    let holder = {
        let (owned, held) = (path.0.clone(), &held);
        fork(move || {
            // SAFETY: the gate lives in memory this child keeps until it is killed (its
            // main thread exits, its stack and heap stay: the process goes on).
            let held: &'static Gate = unsafe { &*(held as *const Gate) };
            std::thread::spawn(move || {
                let table = LockTable::open(&owned, 64).unwrap();
                let _g = table.lock(K, opts(60_000, 0)).unwrap();
                held.signal();
                loop {
                    std::thread::sleep(Duration::from_secs(60));
                }
            });
            // The main thread leaves (by the raw system call: no unwinding, no exit
            // handlers); the process lives on in the other one.
            // SAFETY: ends this thread only; nothing of its stack is used after.
            unsafe { libc::syscall(libc::SYS_exit, 0) };
            unreachable!("SYS_exit returned")
        })
    };
    held.await_signals(1);
    fs::remove_file(&path.0).unwrap();
    let seen = newcomer(&path.0);
    holder.kill();
    assert_eq!(seen, format!("deleted-in-use {}", holder.0));
}

/// A path with a newline (which `maps` writes as `\012`): its deleted table in use is seen.
fn a_deleted_table_with_a_newline_in_its_path_is_seen() {
    let path = TempPath::new("deleted\nnewline");
    let table = LockTable::open(&path, 64).unwrap();
    let _g = table.lock(K, opts(60_000, 0)).unwrap();
    fs::remove_file(&path.0).unwrap();
    assert_eq!(
        newcomer(&path.0),
        format!("deleted-in-use {}", std::process::id())
    );
}

/// A live table whose name ends in " (deleted)" is not a deleted table of the name before
/// it: that table is made as usual.
fn a_live_table_named_like_a_deleted_one_blocks_nothing() {
    let path = TempPath::new("named");
    let mut odd = path.0.clone().into_os_string();
    odd.push(" (deleted)");
    let odd = TempPath(PathBuf::from(odd));
    let table = LockTable::open(&odd, 64).unwrap();
    let _g = table.lock(K, opts(60_000, 0)).unwrap();
    assert_eq!(newcomer(&path.0), "took");
}

/// A table opened by a relative path: after the process changes its directory, its waits
/// and checks still find the path leading to the file (the path was made absolute).
fn a_table_opened_by_a_relative_path_survives_a_chdir() {
    let path = TempPath::new("relative");
    let here = std::env::current_dir().unwrap();
    std::env::set_current_dir(path.0.parent().unwrap()).unwrap();
    let opened = LockTable::open(path.0.file_name().unwrap(), 64);
    std::env::set_current_dir("/").unwrap();
    let r = opened.and_then(|table| {
        let mut lock = shmlock::Lock::new(&table, opts(60_000, 0))?;
        lock.lock(K)?;
        std::thread::sleep(Duration::from_millis(150)); // past the look's 100 ms
        let check = lock.check();
        lock.unlock()?;
        check
    });
    std::env::set_current_dir(here).unwrap();
    r.unwrap();
}

/// The race the check at `open` closes: a newcomer opens the path of a table nobody uses,
/// and its `openat` is held 1.5 s by strace; meanwhile the file is deleted and another
/// process makes a new table there and takes K. The delayed one must not map the deleted
/// file and take K in it: it finds its path gone, opens again, and finds K busy.
fn a_file_deleted_between_its_opening_and_its_mapping_is_let_go() {
    let path = TempPath::new("deleted-midopen");
    drop(LockTable::open(&path, 64).unwrap());
    let slow = std::process::Command::new("strace")
        .args(["-f", "-qq", "-o", "/dev/null", "-P"])
        .arg(&path.0)
        .args(["-e", "inject=openat:delay_exit=1500000:when=1", "--"])
        .arg(std::env::current_exe().unwrap())
        .args(["--role", "newcomer"])
        .arg(&path.0)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    fs::remove_file(&path.0).unwrap();
    let first = newcomer(&path.0);
    let out = slow.wait_with_output().unwrap();
    let delayed = String::from_utf8_lossy(&out.stdout).trim().to_string();
    note!("[the first made anew: {first}; the delayed one: {delayed}] ");
    assert_eq!(first, "took");
    assert_eq!(
        delayed, "busy",
        "the delayed opener took K in a deleted table"
    );
}
