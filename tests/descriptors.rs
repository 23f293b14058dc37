//! Descriptors: nothing a program does with its own descriptors makes a live holder look
//! dead, hands one process's registration to another, or costs the program a descriptor.
//! Daemons close every descriptor after opening a table (`close_range`) and open log files
//! under the freed numbers; prefork workers close what they inherited and open the table
//! again; a program holds two handles of one table, replaces the library's numbers with
//! `dup2`, takes locks through its own description of the table, or opens and closes files
//! under a number while a waiter asks the kernel about a holder (even with the waiter
//! stopped by ptrace around that very call). The dict registers through the same layer.
//!
//! Exercises `src/shm/anchor.rs` (a registration held by a description of its own),
//! `src/shm/registry.rs` (judging an owner by its lock, the probe), `src/shm/attachment.rs`
//! and `src/shm/file.rs` (opening and registering).
//!
//! `descriptors FILTER` runs the tests whose name contains FILTER; `descriptors --list`
//! lists them.

mod common;

use std::fs;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::fork::{fork, Shared};
use common::harness::Test;
use common::probe::{await_word, close_from_3, fds_naming, Proc};
use common::{cstr, opts, TempPath};
use shmlock::{Error, LockTable};

const TESTS: &[Test] = &[
    Test::new(
        "open_short_of_descriptors_says_too_many_open_files",
        open_short_of_descriptors_says_too_many_open_files,
    ),
    Test::new(
        "a_child_with_a_full_descriptor_table_says_too_many_open_files",
        a_child_with_a_full_descriptor_table_says_too_many_open_files,
    ),
    Test::new(
        "a_worker_keeps_its_key_after_close_range_and_a_second_handle",
        a_worker_keeps_its_key_after_close_range_and_a_second_handle,
    ),
    Test::new(
        "worker_closes_inherited_fds_reopens_and_drops_the_inherited_handle",
        worker_closes_inherited_fds_reopens_and_drops_the_inherited_handle,
    ),
    Test::new(
        "a_probe_never_tests_through_a_description_that_holds_a_lock",
        a_probe_never_tests_through_a_description_that_holds_a_lock,
    ),
    Test::new(
        "reopening_the_probe_never_closes_the_programs_log_file",
        reopening_the_probe_never_closes_the_programs_log_file,
    ),
    Test::new(
        "dropping_a_handle_never_closes_the_programs_own_descriptor",
        dropping_a_handle_never_closes_the_programs_own_descriptor,
    ),
    Test::new(
        "a_child_never_replaces_the_programs_own_descriptor",
        a_child_never_replaces_the_programs_own_descriptor,
    ),
    Test::new(
        "a_dict_workers_registration_is_never_taken_by_a_newcomer",
        a_dict_workers_registration_is_never_taken_by_a_newcomer,
    ),
    Test::new(
        "control_dict_without_close_range",
        control_dict_without_close_range,
    ),
    Test::new(
        "a_replaced_probe_descriptor_never_makes_a_live_holder_look_dead",
        a_replaced_probe_descriptor_never_makes_a_live_holder_look_dead,
    ),
    Test::new(
        "a_forked_worker_that_closes_inherited_fds_stays_alive",
        a_forked_worker_that_closes_inherited_fds_stays_alive,
    ),
    Test::new(
        "a_process_that_closed_its_descriptors_after_opening_is_never_given_a_shared_key",
        a_process_that_closed_its_descriptors_after_opening_is_never_given_a_shared_key,
    ),
    Test::new(
        "a_newcomer_never_takes_the_registry_entry_of_a_process_that_closed_its_descriptors",
        a_newcomer_never_takes_the_registry_entry_of_a_process_that_closed_its_descriptors,
    ),
    Test::new("probe_games_leave_a_live_holder_alive", probe_games),
    Test::new(
        "a_probe_number_the_program_reuses_never_judges",
        probe_aba_program_reuses_the_number,
    ),
    Test::new(
        "a_probe_swapped_during_a_lock_test_never_judges",
        probe_aba_preempted_at_the_lock_test,
    ),
];

fn main() {
    common::harness::run("descriptors", TESTS, common::harness::no_roles);
}

/// The lowest descriptor number free now.
fn lowest_free() -> u64 {
    // SAFETY: dup of stdin (open in a test process) gives the lowest free number, which is
    // closed again at once.
    let fd = unsafe { libc::dup(0) };
    assert!(fd >= 0);
    // SAFETY: our own descriptor, just made.
    unsafe { libc::close(fd) };
    fd as u64
}

/// Sets this process's soft descriptor limit.
fn set_nofile(limit: u64) {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid out-pointer, then a valid in-pointer.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut r), 0);
        r.rlim_cur = limit.min(r.rlim_max);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &r), 0);
    }
}

fn is_emfile(e: &Error) -> bool {
    matches!(e, Error::Io { source, .. } if source.raw_os_error() == Some(libc::EMFILE))
}

// ---------------------------------------------------------------------------------------
// `open` with a descriptor limit that leaves it one, two, ... descriptors short: every
// refusal says "too many open files" (EMFILE, which the command maps to EX_OSERR), never
// that the table's path names another file.

fn open_short_of_descriptors_says_too_many_open_files() {
    let path = TempPath::new("emfile");
    drop(LockTable::open(&path, 64).unwrap()); // create
                                               // limits tried, EMFILE refusals, other refusals
    let told = Shared::new(3);
    let child = fork(|| {
        for extra in 1..32 {
            set_nofile(lowest_free() + extra);
            told.word(0).fetch_add(1, Ordering::SeqCst);
            match LockTable::open(&path, 64) {
                Ok(table) => {
                    drop(table);
                    break;
                }
                Err(e) if is_emfile(&e) => {
                    told.word(1).fetch_add(1, Ordering::SeqCst);
                }
                Err(e) => {
                    eprintln!("with {extra} descriptors free: {e}");
                    told.word(2).fetch_add(1, Ordering::SeqCst);
                }
            }
        }
        0
    });
    assert_eq!(child.wait(Duration::from_secs(30)), 0);
    let read = |i| told.word(i).load(Ordering::SeqCst);
    note!(
        "[{} limits tried, {} EMFILE, {} other] ",
        read(0),
        read(1),
        read(2)
    );
    assert!(
        read(1) >= 1,
        "no limit was too small: the test tried nothing"
    );
    assert_eq!(read(2), 0, "refusals that did not name the cause");
}

// ---------------------------------------------------------------------------------------
// A forked child whose descriptor table is full takes its first lock (which registers it,
// with descriptors of its own): the error says "too many open files".

fn a_child_with_a_full_descriptor_table_says_too_many_open_files() {
    let path = TempPath::new("emfile-child");
    let table = LockTable::open(&path, 64).unwrap();
    let child = fork(|| {
        set_nofile(lowest_free());
        match table.lock(K, opts(30_000, 0)) {
            Ok(_) => 1,
            Err(e) if is_emfile(&e) => 0,
            Err(e) => {
                eprintln!("{e}");
                2
            }
        }
    });
    assert_eq!(
        child.wait(Duration::from_secs(30)),
        0,
        "not an EMFILE error"
    );
}

const K: &str = "K";

/// `fd -> target` for every open descriptor of this process.
fn fds() -> String {
    let mut v: Vec<(i32, String)> = fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let n: i32 = e.file_name().to_str()?.parse().ok()?;
            let t = fs::read_link(e.path()).ok()?;
            Some((n, t.display().to_string()))
        })
        .filter(|(n, _)| *n > 2)
        .collect();
    v.sort();
    v.iter()
        .map(|(n, t)| format!("{n}->{}", t.rsplit('/').next().unwrap_or("")))
        .collect::<Vec<_>>()
        .join(" ")
}

// ---------------------------------------------------------------------------------------
// A daemon opens the table (handle A), closes every descriptor (`close_range`) and opens
// the same table again (B), whose descriptors take A's old numbers. Its forked worker holds
// K through A and drops B, which it does not need: A's registration must not go with B's
// descriptors while A still holds K.

fn a_worker_keeps_its_key_after_close_range_and_a_second_handle() {
    let path = TempPath::new("collapse");
    drop(LockTable::open(&path, 64).unwrap()); // create
    let flag = Shared::new(4);
    let _p = Proc::new(fork(|| {
        let a = LockTable::open(&path, 64).unwrap();
        close_from_3();
        let b = std::cell::RefCell::new(Some(LockTable::open(&path, 64).unwrap()));
        let before = fds();
        let c = fork(|| {
            flag.word(3)
                .store(std::process::id() as u64, Ordering::SeqCst);
            let g = a.lock(K, opts(60_000, 1_000)).unwrap();
            let after = fds();
            drop(b.borrow_mut().take()); // the worker only needs A
            eprintln!(
                "[parent fds {before}; worker after first use: {after}; after drop(B): {}]",
                fds()
            );
            flag.word(0).store(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(1500));
            let r = g.unlock();
            flag.word(1)
                .store(if r.is_ok() { 1 } else { 2 }, Ordering::SeqCst);
            std::thread::sleep(Duration::from_secs(30));
            0
        });
        let _ = c.wait(Duration::from_secs(40));
        0
    }));
    await_word(&flag, 0, Duration::from_secs(10));
    let table = LockTable::open(&path, 64).unwrap();
    let started = Instant::now();
    let other = table
        .try_lock_with_lease(K, Duration::from_secs(60))
        .unwrap();
    let took = started.elapsed();
    let w_unlock = await_word(&flag, 1, Duration::from_secs(10));
    note!(
        "[worker (alive, running) holds K through handle A; this process {}; the worker's \
         unlock later: {}] ",
        if other.is_some() {
            format!("ALSO TOOK K in {took:?}")
        } else {
            "was refused".into()
        },
        if w_unlock == 1 { "Ok" } else { "Expired" }
    );
    kill_word(&flag, 3);
    assert!(other.is_none(), "two live holders of K");
}

// ---------------------------------------------------------------------------------------
// The same daemon opens a log file after `close_range` (fd 3), then B, whose descriptors
// take A's old numbers. B must never test A's registry lock through the description that
// holds it (F_OFD_GETLK never reports one's own lock): it would judge A's owner dead and
// take K from it, in one process with two handles.

fn a_probe_never_tests_through_a_description_that_holds_a_lock() {
    let path = TempPath::new("probe");
    let log = TempPath::new("log");
    drop(LockTable::open(&path, 64).unwrap());
    let flag = Shared::new(4);
    let p = fork(|| {
        let a = LockTable::open(&path, 64).unwrap();
        close_from_3();
        let _log = fs::File::create(&log).unwrap();
        let b = LockTable::open(&path, 64).unwrap();
        let before = fds();
        let c = fork(|| {
            flag.word(3)
                .store(std::process::id() as u64, Ordering::SeqCst);
            let g = a.lock(K, opts(60_000, 1_000)).unwrap();
            let after = fds();
            let started = Instant::now();
            let other = b.try_lock_with_lease(K, Duration::from_secs(60)).unwrap();
            eprintln!(
                "[parent fds {before}; worker after first use: {after}; A holds K; B's try: {}]",
                if other.is_some() {
                    format!("ALSO TOOK K in {:?}", started.elapsed())
                } else {
                    "refused".into()
                }
            );
            flag.word(0)
                .store(if other.is_some() { 2 } else { 1 }, Ordering::SeqCst);
            drop(g);
            0
        });
        c.wait(Duration::from_secs(20))
    });
    let rc = p.wait(Duration::from_secs(30));
    let w = flag.word(0).load(Ordering::SeqCst);
    note!("[worker rc {rc}, verdict {w}] ");
    assert_eq!(w, 1, "handle B took K while handle A held it");
}

// ---------------------------------------------------------------------------------------
// The documented daemon case: `close_range`, then a log file opened under the number the
// library's probe descriptor had (3). A lock call that judges a busy key's holder (here
// another live process holds K) must not close fd 3, the program's log: the program's next
// open (a data file) would get 3, and its log lines would go into the data file.

fn reopening_the_probe_never_closes_the_programs_log_file() {
    let path = TempPath::new("logfd");
    let logp = TempPath::new("log");
    let datap = TempPath::new("data");
    drop(LockTable::open(&path, 64).unwrap());
    let flag = Shared::new(4);
    let _h = Proc::new(fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        let g = t.lock(K, opts(60_000, 1_000)).unwrap();
        flag.word(1).store(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(30));
        drop(g);
        0
    }));
    await_word(&flag, 1, Duration::from_secs(10));
    let p = fork(|| {
        let a = LockTable::open(&path, 64).unwrap();
        close_from_3();
        let mut log = fs::File::create(&logp).unwrap(); // fd 3, as the README's example
        let n = log.as_raw_fd();
        let before = fds();
        // K is held by a live process: the waiter judges it (probe reopened by path)
        let r = a.lock(K, opts(60_000, 50)).map(|_| ());
        let after = fds();
        let mut data = fs::File::create(&datap).unwrap();
        let w = log.write_all(b"log line\n");
        let _ = data.write_all(b"");
        let data_now = fs::read(&datap).unwrap();
        eprintln!(
            "[log fd {n}; before lock: {before}; lock: {:?}; after: {after}; data file got fd              {}; the program's log write: {w:?}; data file now holds {:?}]",
            r.map_err(|e| e.to_string()),
            data.as_raw_fd(),
            String::from_utf8_lossy(&data_now)
        );
        flag.word(0)
            .store(if data_now.is_empty() { 1 } else { 2 }, Ordering::SeqCst);
        std::mem::forget(log);
        std::mem::forget(data);
        std::mem::forget(a);
        0
    });
    let rc = p.wait(Duration::from_secs(20));
    let w = flag.word(0).load(Ordering::SeqCst);
    note!("[rc {rc}, verdict {w}] ");
    assert_eq!(w, 1, "the library closed the program's log file");
}

// Dropping a handle after `close_range` must not close what the program opened under the
// library's old numbers (here the program's own descriptor of the table file).

fn dropping_a_handle_never_closes_the_programs_own_descriptor() {
    let path = TempPath::new("ownfd");
    drop(LockTable::open(&path, 64).unwrap());
    let flag = Shared::new(4);
    let p = fork(|| {
        use std::os::unix::fs::FileExt;
        let a = LockTable::open(&path, 64).unwrap();
        close_from_3();
        let log = fs::File::create("/dev/null").unwrap(); // fd 3
        let mine = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap(); // 4
        let before = fds();
        drop(a);
        let after = fds();
        let w = mine.read_at(&mut [0u8; 8], 0);
        eprintln!(
            "[program's fds: /dev/null {}, table file {}; before drop(A): {before}; after: \
             {after}; the program's read_at on its table fd: {w:?}]",
            log.as_raw_fd(),
            mine.as_raw_fd()
        );
        flag.word(0)
            .store(if w.is_ok() { 1 } else { 2 }, Ordering::SeqCst);
        std::mem::forget(mine);
        std::mem::forget(log);
        0
    });
    let rc = p.wait(Duration::from_secs(20));
    let w = flag.word(0).load(Ordering::SeqCst);
    note!("[rc {rc}, verdict {w}] ");
    assert_eq!(w, 1, "the library closed descriptors it did not own");
}

// ---------------------------------------------------------------------------------------
// The same in a forked child: the program's own descriptor of the table file (read-only,
// at some offset) must not be replaced by one of the library's (read-write, close-on-exec,
// at offset 0).

fn a_child_never_replaces_the_programs_own_descriptor() {
    let path = TempPath::new("dup3");
    drop(LockTable::open(&path, 64).unwrap());
    let flag = Shared::new(4);
    let p = fork(|| {
        use std::io::{Read, Seek};
        let a = LockTable::open(&path, 64).unwrap();
        close_from_3();
        let _log = fs::File::create("/dev/null").unwrap(); // fd 3
        let mut mine = fs::File::open(&path).unwrap(); // read-only, the program's
        let mut skip = [0u8; 100];
        mine.read_exact(&mut skip).unwrap();
        let c = fork(|| {
            let n = mine.as_raw_fd();
            let pos0 = mine.stream_position().unwrap();
            // SAFETY: reading the descriptor flags of a number we own.
            let fl0 = unsafe { libc::fcntl(n, libc::F_GETFL) } & libc::O_ACCMODE;
            // SAFETY: fcntl F_GETFD passes no memory; n is `mine`'s descriptor, open all along.
            let cl0 = unsafe { libc::fcntl(n, libc::F_GETFD) };
            let _g = a.lock(K, opts(60_000, 1_000)).unwrap();
            let pos1 = mine.stream_position().unwrap();
            // SAFETY: fcntl F_GETFL passes no memory; n is `mine`'s descriptor, open all along.
            let fl1 = unsafe { libc::fcntl(n, libc::F_GETFL) } & libc::O_ACCMODE;
            // SAFETY: fcntl F_GETFD passes no memory; n is `mine`'s descriptor, open all along.
            let cl1 = unsafe { libc::fcntl(n, libc::F_GETFD) };
            eprintln!(
                "[program's read-only fd {n}: offset {pos0} -> {pos1}, access mode {fl0} -> \
                 {fl1} (0=RDONLY 2=RDWR), FD_CLOEXEC {cl0} -> {cl1}]"
            );
            let same = pos0 == pos1 && fl0 == fl1 && cl0 == cl1;
            flag.word(0)
                .store(if same { 1 } else { 2 }, Ordering::SeqCst);
            0
        });
        let rc = c.wait(Duration::from_secs(20));
        std::mem::forget(a);
        std::mem::forget(mine);
        rc
    });
    let rc = p.wait(Duration::from_secs(30));
    let w = flag.word(0).load(Ordering::SeqCst);
    note!("[rc {rc}, verdict {w}] ");
    assert_eq!(w, 1, "the library replaced the program's own descriptor");
}

// ---------------------------------------------------------------------------------------
// The prefork pattern, no `close_range` in the parent: the parent opens the table (A) and
// forks a worker, which closes the descriptors it inherited, opens its own handle C of the
// same table and drops the inherited A. C's registration must not go with A while C holds
// K.

fn worker_closes_inherited_fds_reopens_and_drops_the_inherited_handle() {
    let path = TempPath::new("prefork");
    drop(LockTable::open(&path, 64).unwrap());
    let flag = Shared::new(4);
    let _p = Proc::new(fork(|| {
        let a = std::cell::RefCell::new(Some(LockTable::open(&path, 64).unwrap()));
        let c = fork(|| {
            flag.word(3)
                .store(std::process::id() as u64, Ordering::SeqCst);
            close_from_3();
            let mine = LockTable::open(&path, 64).unwrap();
            let fds1 = fds();
            let g = mine.lock(K, opts(60_000, 1_000)).unwrap();
            eprintln!("[worker fds before drop(A): {}]", fds());
            drop(a.borrow_mut().take()); // the worker has no use for the parent handle
            eprintln!(
                "[worker fds after its open: {fds1}; after drop(A): {}]",
                fds()
            );
            flag.word(0).store(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(1500));
            let r = g.unlock();
            flag.word(1)
                .store(if r.is_ok() { 1 } else { 2 }, Ordering::SeqCst);
            std::thread::sleep(Duration::from_secs(30));
            0
        });
        let _ = c.wait(Duration::from_secs(40));
        0
    }));
    await_word(&flag, 0, Duration::from_secs(10));
    let table = LockTable::open(&path, 64).unwrap();
    let started = Instant::now();
    let other = table
        .try_lock_with_lease(K, Duration::from_secs(60))
        .unwrap();
    let took = started.elapsed();
    let w_unlock = await_word(&flag, 1, Duration::from_secs(10));
    note!(
        "[worker (alive) holds K through its own handle; this process {}; the worker's \
         unlock later: {}] ",
        if other.is_some() {
            format!("ALSO TOOK K in {took:?}")
        } else {
            "was refused".into()
        },
        if w_unlock == 1 { "Ok" } else { "Expired" }
    );
    kill_word(&flag, 3);
    assert!(other.is_none(), "two live holders of K");
}

// ---------------------------------------------------------------------------------------
// The dict, on the same attachment layer: a dict with room for 3 registrations. The daemon
// P (2 handles: A, then `close_range`, then B) and its worker (which writes through A and
// drops B) use all 3. A newcomer must get TooManyProcesses, not the worker's entry: the
// live worker's owner id would be dead to everyone (its writer lock broken at once, not
// after 500 ms).

fn a_dict_workers_registration_is_never_taken_by_a_newcomer() {
    dict_case(true);
}

fn control_dict_without_close_range() {
    dict_case(false);
}

fn dict_case(close: bool) {
    use shmlock::SharedDict;
    let path = TempPath::new("dict");
    let open = |p: &Path| SharedDict::options().capacity(64).max_processes(3).open(p);
    drop(open(path.as_ref()).unwrap());
    let flag = Shared::new(4);
    let _p = Proc::new(fork(|| {
        let a = open(path.as_ref()).unwrap();
        if close {
            close_from_3();
        }
        let b = std::cell::RefCell::new(Some(open(path.as_ref()).unwrap()));
        eprintln!(
            "[P after A and B: {} fds {}]",
            locks_of(path.as_ref()),
            fds()
        );
        let c = fork(|| {
            flag.word(3)
                .store(std::process::id() as u64, Ordering::SeqCst);
            eprintln!("[C before: {}]", locks_of(path.as_ref()));
            a.set("k", "v1", Duration::ZERO).unwrap();
            eprintln!("[C after set: {} fds {}]", locks_of(path.as_ref()), fds());
            drop(b.borrow_mut().take());
            eprintln!("[C after drop(B): {}]", locks_of(path.as_ref()));
            flag.word(0).store(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_secs(20));
            0
        });
        let _ = c.wait(Duration::from_secs(30));
        0
    }));
    await_word(&flag, 0, Duration::from_secs(10));
    {
        use std::os::unix::fs::{FileExt, MetadataExt};
        let f = fs::File::open(&path).unwrap();
        let ino = f.metadata().unwrap().ino();
        let mut w = vec![];
        for i in 0..3u64 {
            let mut b = [0u8; 8];
            f.read_exact_at(&mut b, 4096 + i * 32).unwrap();
            w.push(format!("{:#x}", u64::from_le_bytes(b)));
        }
        let locks: Vec<String> = fs::read_to_string("/proc/locks")
            .unwrap()
            .lines()
            .filter(|l| l.contains(&format!(":{ino} ")))
            .map(String::from)
            .collect();
        eprintln!("[registry words {w:?}; locks {locks:#?}]");
    }
    let q = open(path.as_ref());
    note!(
        "[P (2 registrations) and its worker (1) alive; a 4th process's open: {}] ",
        match &q {
            Ok(_) => "Ok (took a live process's entry)".to_string(),
            Err(e) => format!("{e}"),
        }
    );
    kill_word(&flag, 3);
    assert!(
        q.is_err(),
        "a newcomer took the live worker's registry entry"
    );
}

fn locks_of(p: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let ino = fs::metadata(p).unwrap().ino();
    fs::read_to_string("/proc/locks")
        .unwrap()
        .lines()
        .filter(|l| l.contains(&format!(":{ino} ")))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            format!("{}@{}", f[3], f[6])
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Kills the process whose pid a child stored in `flag` word `w` (an orphan by now).
fn kill_word(flag: &Shared, w: usize) {
    let pid = flag.word(w).load(Ordering::SeqCst) as libc::pid_t;
    if pid > 0 {
        common::signal::send(pid, libc::SIGKILL);
    }
}

// ---------------------------------------------------------------------------------------
// Process helpers

/// A child that takes K (lease `exptime_ms`) on its own handle, sets `ready[0]`, and holds
/// it for 30 s, counting in `ready[1]` how many times it saw itself still K's holder.
fn holder(path: &Path, ready: &Shared, exptime_ms: u64) -> Proc {
    let p = Proc::new(fork(|| {
        let t = LockTable::open(path, 64).unwrap();
        let g = t.lock(K, opts(exptime_ms, 1_000)).unwrap();
        ready
            .word(0)
            .store(u64::from(std::process::id()), Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(30));
        drop(g);
        0
    }));
    await_word(ready, 0, Duration::from_secs(10));
    p
}

// ---------------------------------------------------------------------------------------
// A descriptor number reused behind the library's back

/// A waiter process whose table descriptors were replaced by another file (what
/// `closefrom(3)` followed by opening a log file does) asks the kernel about the holder's
/// registry lock through a descriptor that names another file now: the waiter must not
/// take that "unlocked" for a verdict (the holder is alive).
fn a_replaced_probe_descriptor_never_makes_a_live_holder_look_dead() {
    let path = TempPath::new("probe");
    drop(LockTable::open(&path, 64).unwrap());
    let ready = Shared::new(2);
    let _h = holder(&path.0, &ready, 60_000);
    let other = TempPath::new("other-file");
    let mut waiter = Proc::new(fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        let fds = fds_naming(&path.0);
        let scratch = fs::File::create(&other).unwrap();
        scratch.set_len(8192).unwrap();
        // Only the lowest: the descriptor the mapping came from (the liveness probe).
        // SAFETY: replacing a descriptor number, as a careless closefrom+open would.
        unsafe { libc::dup2(scratch.as_raw_fd(), fds[0]) };
        let r = t.lock(K, opts(60_000, 1_500)).map(std::mem::forget);
        match r {
            Ok(()) => {
                note!(
                    "[waiter got K while pid {} holds it] ",
                    ready.word(0).load(Ordering::SeqCst)
                );
                1
            }
            Err(Error::Timeout { .. }) => 0,
            Err(e) => {
                eprintln!("{e}");
                2
            }
        }
    }));
    assert_eq!(
        waiter.wait(Duration::from_secs(20)),
        0,
        "two live holders of K"
    );
}

/// The prefork pattern: a master opens the table and forks a worker; the worker does the
/// usual daemon hygiene (close every inherited descriptor above 2, then open its own log
/// file, which takes the lowest free number) and then uses the table it inherited. Its
/// re-registration must go to the table, not to whatever took the number: the master must
/// find it alive while it holds K.
fn a_forked_worker_that_closes_inherited_fds_stays_alive() {
    let path = TempPath::new("prefork");
    let table = LockTable::open(&path, 64).unwrap();
    let log = TempPath::new("worker-log");
    let flag = Shared::new(2);
    let _worker = Proc::new(fork(|| {
        // SAFETY: closing every descriptor above stderr, as daemons do after fork.
        unsafe { libc::close_range(3, u32::MAX, 0) };
        let _log = fs::File::create(&log).unwrap(); // gets fd 3
        let g = table.lock(K, opts(60_000, 1_000)).unwrap();
        flag.word(0).store(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(30));
        drop(g);
        0
    }));
    await_word(&flag, 0, Duration::from_secs(10));
    let got = table.lock(K, opts(60_000, 1_500));
    let stole = got.is_ok();
    if let Ok(g) = got {
        note!("[master got K while the worker holds it] ");
        std::mem::forget(g);
    }
    assert!(!stole, "two live holders of K");
}

// ---------------------------------------------------------------------------------------
// A process that closes its descriptors after opening (a daemonizing step)

/// D opens the table, then closes every descriptor from 3 up (`close_range`, as a
/// daemonizing library does) and opens a few files under the freed numbers; then it locks
/// K. Either D's lock call must fail, or nobody else may take K while D holds it.
fn a_process_that_closed_its_descriptors_after_opening_is_never_given_a_shared_key() {
    let path = TempPath::new("daemon");
    let table = LockTable::open(&path, 64).unwrap();
    let flag = Shared::new(2);
    let _d = Proc::new(fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        close_from_3();
        let _logs: Vec<fs::File> = (0..4)
            .map(|_| fs::File::open("/dev/null").unwrap())
            .collect();
        match t.lock(K, opts(60_000, 1_000)) {
            Ok(g) => {
                flag.word(0).store(1, Ordering::SeqCst);
                // Later: does D still think it holds K?
                std::thread::sleep(Duration::from_millis(500));
                let still = g.unlock();
                flag.word(1)
                    .store(if still.is_ok() { 1 } else { 2 }, Ordering::SeqCst);
            }
            Err(e) => {
                eprintln!("D's lock after close_range: {e}");
                flag.word(0).store(2, Ordering::SeqCst);
            }
        }
        std::thread::sleep(Duration::from_secs(30));
        0
    }));
    let d_got = await_word(&flag, 0, Duration::from_secs(10)) == 1;
    let mut other = None;
    if d_got {
        other = table
            .try_lock_with_lease(K, Duration::from_secs(60))
            .unwrap();
    }
    let d_unlock = if d_got {
        await_word(&flag, 1, Duration::from_secs(10))
    } else {
        0
    };
    note!(
        "[D's lock after closing its descriptors: {}; another process {}; D's unlock {}] ",
        if d_got { "granted" } else { "refused" },
        if other.is_some() {
            "ALSO took K"
        } else {
            "was refused"
        },
        match d_unlock {
            1 => "Ok",
            2 => "Expired",
            _ => "-",
        }
    );
    assert!(
        other.is_none(),
        "two live holders: a process whose registration descriptor was closed was granted \
         K and another process took it at once"
    );
}

/// D closes its descriptors after opening and then holds K with no lease, so only its
/// liveness can free K. The registry has two entries: this process's and D's. A newcomer
/// whose registration found D's entry unlocked and took it would make D's hold look dead;
/// it must be refused instead. Once D dies, its entry and K are free again.
fn a_newcomer_never_takes_the_registry_entry_of_a_process_that_closed_its_descriptors() {
    let path = TempPath::new("daemon-entry");
    let table = LockTable::options()
        .capacity(64)
        .max_processes(2)
        .open(&path)
        .unwrap();
    let flag = Shared::new(1);
    let mut d = Proc::new(fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        close_from_3();
        let g = t.lock(K, opts(0, 1_000)).unwrap();
        std::mem::forget(g);
        flag.word(0).store(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(60));
        0
    }));
    await_word(&flag, 0, Duration::from_secs(10));
    // 3: refused a registry entry; 1: took K; 2: registered but K was busy
    let newcomer = || {
        fork(|| match LockTable::open(&path, 64) {
            Err(shmlock::Error::TooManyProcesses { .. }) => 3,
            Err(e) => panic!("{e}"),
            Ok(t) => match t.try_lock_with_lease(K, Duration::from_secs(60)) {
                Ok(Some(g)) => {
                    std::mem::forget(g);
                    1
                }
                _ => 2,
            },
        })
        .wait(Duration::from_secs(10))
    };
    let while_d_runs = newcomer();
    let here = table
        .try_lock_with_lease(K, Duration::from_secs(60))
        .unwrap()
        .is_some();
    d.kill();
    let after = newcomer();
    note!("[newcomer while D runs: exit {while_d_runs}; after D's death: exit {after}] ");
    assert_eq!(
        while_d_runs, 3,
        "a newcomer took the registry entry of a live process that closed its descriptors"
    );
    assert!(!here, "another process took D's key while D runs");
    assert_eq!(after, 1, "D's entry and key stay taken after its death");
}

// ---------------------------------------------------------------------------------------
// Probe games a program may play with its own descriptors.

fn probe_games() {
    let path = TempPath::new("probe");
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
    let mut results = Vec::new();
    let t = LockTable::open(&path, 64).unwrap();
    // find our probe: the descriptor naming the table
    let ino = fs::metadata(&path).unwrap().ino();
    let fds: Vec<i32> = fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let n: i32 = e.file_name().to_str()?.parse().ok()?;
            let m = fs::metadata(e.path()).ok()?;
            (m.ino() == ino).then_some(n)
        })
        .collect();
    results.push(format!("table fds {fds:?}"));
    let n = fds[0];
    let try_k = |what: &str, results: &mut Vec<String>| {
        let r = t.try_lock_with_lease(K, Duration::from_secs(60)).unwrap();
        results.push(format!(
            "{what}: {}",
            if r.is_some() { "TOOK K" } else { "busy" }
        ));
        r.is_some()
    };
    let mut broke = try_k("baseline", &mut results);
    use std::os::unix::fs::OpenOptionsExt;
    // (a) the program reopens the table itself O_NONBLOCK|O_RDWR and takes an OFD lock on
    //     the holder's entry range? no: it takes a *write* lock on the whole header page
    //     through its own description, closes our number and dup2s that description onto it
    let own = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&path)
        .unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: dup2 onto the library's number (the program replaces it: out of contract
    // for a number the library owns, but exactly what close-then-reopen produces)
    unsafe { libc::dup2(own.as_raw_fd(), n) };
    broke |= try_k(
        "our number replaced by the program's O_NONBLOCK description of the table",
        &mut results,
    );
    // (b) the program takes OFD locks on the registry through that description
    let fl = libc::flock {
        l_type: libc::F_RDLCK as i16,
        l_whence: libc::SEEK_SET as i16,
        l_start: 4096,
        l_len: 4096 * 16,
        l_pid: 0,
    };
    // SAFETY: fcntl on our own descriptor.
    let rc = unsafe { libc::fcntl(own.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
    broke |= try_k(
        &format!("program read-locks the registry pages through it (rc {rc})"),
        &mut results,
    );
    // (c) clears O_NONBLOCK on it
    // SAFETY: fcntl on our own descriptor.
    unsafe { libc::fcntl(n, libc::F_SETFL, 0) };
    broke |= try_k(
        "program clears O_NONBLOCK on that description",
        &mut results,
    );
    holder.kill();
    std::thread::sleep(Duration::from_millis(20));
    let after = t.try_lock_with_lease(K, Duration::from_secs(60)).unwrap();
    results.push(format!(
        "after the holder's death: {}",
        if after.is_some() {
            "took K"
        } else {
            "busy (doubt = alive)"
        }
    ));
    note!("[{}] ", results.join("; "));
    assert!(!broke, "BROKE: a live holder was judged dead");
}

// ---------------------------------------------------------------------------------------
// A program that closed the library's number once (a daemon's `close_range`) and then opens
// and closes files of its own under it (the table itself with O_NONBLOCK, a log file) can
// have the number name the table before and after a waiter's lock test and a log file
// during it: no verdict may come from that test.

static REPEAT_CLOSE_RANGE: AtomicBool = AtomicBool::new(false);

fn probe_aba_program_reuses_the_number() {
    REPEAT_CLOSE_RANGE.store(
        std::env::var_os("SHMLOCK_REPEAT_CLOSE_RANGE").is_some(),
        Ordering::Relaxed,
    );
    let path = TempPath::new("aba");
    let log = TempPath::new("abalog");
    fs::write(&log, b"log").unwrap();
    drop(LockTable::open(&path, 64).unwrap());
    let shared = Shared::new(8);
    let q = fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        let g = t.lock(K, opts(120_000, 1_000)).unwrap();
        shared.word(0).store(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(60));
        drop(g);
        0
    });
    await_word(&shared, 0, Duration::from_secs(10));
    let c = fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        // the table's descriptor in this process
        let ino = fs::metadata(&path).unwrap().ino();
        let n: i32 = fs::read_dir("/proc/self/fd")
            .unwrap()
            .flatten()
            .filter_map(|e| {
                let n: i32 = e.file_name().to_str()?.parse().ok()?;
                (fs::metadata(e.path()).ok()?.ino() == ino).then_some(n)
            })
            .min()
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let (tp, lp) = (
            cstr(path.0.to_str().unwrap()),
            cstr(log.0.to_str().unwrap()),
        );
        let cycler = std::thread::spawn(move || {
            // SAFETY: closes the library's number once (as close_range would), then only
            // descriptors this thread opened itself.
            unsafe { libc::close(n) };
            let mut cycles = 0u64;
            while !s2.load(Ordering::Relaxed) {
                // SAFETY: opening and closing our own descriptors.
                unsafe {
                    if REPEAT_CLOSE_RANGE.load(Ordering::Relaxed) {
                        libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
                    }
                    let a = libc::open(
                        tp.as_ptr(),
                        libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC,
                    );
                    libc::close(a);
                    let b = libc::open(lp.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
                    libc::close(b);
                }
                cycles += 1;
            }
            cycles
        });
        let start = Instant::now();
        let mut tries = 0u64;
        let mut took = false;
        while start.elapsed() < Duration::from_secs(5) {
            tries += 1;
            if let Ok(Some(g)) = t.try_lock_with_lease(K, Duration::from_secs(60)) {
                took = true;
                std::mem::forget(g);
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        stop.store(true, Ordering::Relaxed);
        let cycles = cycler.join().unwrap();
        println!(
            "\n  probe number {n}; program's open/close cycles {cycles}; our try_lock calls \
             {tries} in {:?}; took K from the live holder: {took}",
            start.elapsed()
        );
        i32::from(took)
    });
    let rc = c.wait(Duration::from_secs(60));
    let alive = common::signal::send(q.0, 0) == 0;
    q.kill();
    assert!(
        !(rc == 1 && alive),
        "BROKE: a live holder's key was taken (holder alive {alive})"
    );
}

// The same, with the waiter preempted exactly around its lock test (ptrace stops it at
// entry and exit of fcntl(F_OFD_GETLK), as the scheduler could): while it is off the
// CPU the program closes its own table descriptor and opens a log file under the
// number, then the other way round.

fn probe_aba_preempted_at_the_lock_test() {
    let path = TempPath::new("aba2");
    let log = TempPath::new("aba2log");
    fs::write(&log, b"log").unwrap();
    drop(LockTable::open(&path, 64).unwrap());
    let shared = Shared::new(8);
    let q = fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        let g = t.lock(K, opts(120_000, 1_000)).unwrap();
        shared.word(0).store(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(60));
        drop(g);
        0
    });
    await_word(&shared, 0, Duration::from_secs(10));
    // word 1: waiter tid; word 2: probe number; word 3: command to the program (1: make it a
    // log, 2: make it the table) ; word 4: ack; word 5: result (1 took, 2 not)
    let c = fork(|| {
        let t = Arc::new(LockTable::open(&path, 64).unwrap());
        let ino = fs::metadata(&path).unwrap().ino();
        let n: i32 = fs::read_dir("/proc/self/fd")
            .unwrap()
            .flatten()
            .filter_map(|e| {
                let n: i32 = e.file_name().to_str()?.parse().ok()?;
                (fs::metadata(e.path()).ok()?.ino() == ino).then_some(n)
            })
            .min()
            .unwrap();
        let (tp, lp) = (
            cstr(path.0.to_str().unwrap()),
            cstr(log.0.to_str().unwrap()),
        );
        // the program: closes the library's number once (close_range), opens the table
        // itself (O_NONBLOCK) and gets that number; later swaps its own descriptors on demand
        // SAFETY: plain descriptor calls.
        unsafe {
            libc::close(n);
            let a = libc::open(
                tp.as_ptr(),
                libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC,
            );
            assert_eq!(a, n);
        }
        shared.word(2).store(n as u64, Ordering::SeqCst);
        let t2 = t.clone();
        let sh = &shared;
        // SAFETY: shared lives until the end of this child (it is joined below).
        let sh: &'static Shared = unsafe { &*(sh as *const Shared) };
        let waiter = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            sh.word(1)
                .store(unsafe { libc::gettid() } as u64, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(300)); // the tracer attaches
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(10) {
                if let Ok(Some(g)) = t2.try_lock_with_lease(K, Duration::from_secs(60)) {
                    std::mem::forget(g);
                    return true;
                }
                std::thread::sleep(Duration::from_millis(3));
            }
            false
        });
        // the program's own descriptor work, on demand
        let start = Instant::now();
        let mut last = 0;
        while start.elapsed() < Duration::from_secs(15)
            && shared.word(5).load(Ordering::SeqCst) == 0
        {
            let cmd = shared.word(3).load(Ordering::SeqCst);
            if cmd != last && cmd != 0 {
                last = cmd;
                // SAFETY: the program's own descriptor n.
                unsafe {
                    libc::close(n);
                    let p = if cmd & 1 == 1 {
                        lp.as_ptr()
                    } else {
                        tp.as_ptr()
                    };
                    let fl = if cmd & 1 == 1 {
                        libc::O_RDONLY
                    } else {
                        libc::O_RDONLY | libc::O_NONBLOCK
                    };
                    let a = libc::open(p, fl | libc::O_CLOEXEC);
                    assert_eq!(a, n);
                }
                shared.word(4).store(cmd, Ordering::SeqCst);
            }
            if waiter.is_finished() {
                break;
            }
            std::hint::spin_loop();
        }
        let took = waiter.join().unwrap();
        shared
            .word(5)
            .store(if took { 1 } else { 2 }, Ordering::SeqCst);
        0
    });
    let tid = await_word(&shared, 1, Duration::from_secs(10)) as i32;
    let n = shared.word(2).load(Ordering::SeqCst);
    // the tracer
    // SAFETY: tracing a thread of our own child.
    unsafe {
        assert_eq!(
            libc::ptrace(
                libc::PTRACE_SEIZE,
                tid,
                0,
                libc::PTRACE_O_TRACESYSGOOD as usize
            ),
            0,
            "seize: {}",
            std::io::Error::last_os_error()
        );
        libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0);
    }
    let mut st = 0;
    // SAFETY: waiting for our tracee.
    unsafe { libc::waitpid(tid, &mut st, libc::__WALL) };
    let mut cmd = 0u64;
    let mut in_getlk = false;
    let mut swaps = 0;
    let deadline = Instant::now() + Duration::from_secs(12);
    while Instant::now() < deadline {
        // SAFETY: resuming our tracee to its next system call stop.
        if unsafe { libc::ptrace(libc::PTRACE_SYSCALL, tid, 0, 0) } != 0 {
            break;
        }
        // SAFETY: waiting for our tracee.
        let r = unsafe { libc::waitpid(tid, &mut st, libc::__WALL) };
        if r != tid || libc::WIFEXITED(st) || libc::WIFSIGNALED(st) {
            break;
        }
        if !(libc::WIFSTOPPED(st) && libc::WSTOPSIG(st) == (libc::SIGTRAP | 0x80)) {
            continue;
        }
        // SAFETY: reading the tracee's registers into a zeroed struct.
        let regs = unsafe {
            let mut regs: libc::user_regs_struct = std::mem::zeroed();
            libc::ptrace(libc::PTRACE_GETREGS, tid, 0, &mut regs as *mut _);
            regs
        };
        let is_getlk = regs.orig_rax == libc::SYS_fcntl as u64
            && regs.rdi == n
            && regs.rsi == libc::F_OFD_GETLK as u64;
        if !is_getlk {
            continue;
        }
        // entry, then exit
        in_getlk = !in_getlk;
        cmd += 1; // odd: log (at entry), even: table (at exit)
        assert_eq!(cmd & 1 == 1, in_getlk);
        shared.word(3).store(cmd, Ordering::SeqCst);
        let until = Instant::now() + Duration::from_secs(2);
        while shared.word(4).load(Ordering::SeqCst) != cmd && Instant::now() < until {
            std::hint::spin_loop();
        }
        swaps += 1;
    }
    // SAFETY: detaching (the tracee may be gone).
    unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0, 0) };
    let rc = c.wait(Duration::from_secs(30));
    let took = shared.word(5).load(Ordering::SeqCst);
    let alive = common::signal::send(q.0, 0) == 0;
    q.kill();
    note!("[probe number {n}; descriptor swaps by the program while the waiter was preempted in its lock test: {swaps}; rc {rc}; the waiter took K from the live holder: {}, holder alive: {alive}] ", took == 1);
    assert!(
        !(took == 1 && alive),
        "BROKE: a live holder's key was taken"
    );
}
