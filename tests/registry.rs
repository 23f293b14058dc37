//! The owner registry: every process that takes locks has an entry, and entries come and
//! go with processes. A process that finds the registry full (when it opens the table, or
//! as a forked child of a registered parent) takes no locks at all rather than locks that
//! nobody could judge; entries left by SIGKILLed processes are reused; a lease left to
//! expire outlives its process's exit and exec, without a registration per run filling the
//! registry.
//!
//! Exercises `src/shm/registry.rs`, `src/shm/attachment.rs` (registering, and again in a
//! forked child) and `src/shm/lock_table.rs` (`leave_to_expire`, `registered`). An entry
//! reused until its generation wraps is in `tests/generation_wraps.rs`.
//!
//! `registry FILTER` runs the tests whose name contains FILTER; `registry --list` lists
//! them.

mod common;

use std::ffi::CString;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::fork::{fork, Shared};
use common::harness::Test;
use common::probe::{await_word, fds_naming, Proc};
use common::{opts, TempPath};
use shmlock::{Error, LockTable};

const TESTS: &[Test] = &[
    Test::new(
        "a_lazy_handle_breaks_holds_in_a_full_registry_and_registers_at_its_first_lock",
        a_lazy_handle_breaks_holds_in_a_full_registry_and_registers_at_its_first_lock,
    ),
    Test::new(
        "a_process_with_no_registry_entry_takes_no_locks",
        a_process_with_no_registry_entry_takes_no_locks,
    ),
    Test::new(
        "a_forked_child_that_finds_the_registry_full_takes_nothing",
        a_forked_child_that_finds_the_registry_full_takes_nothing,
    ),
    Test::new(
        "registry_full_of_dead_entries_is_reused",
        registry_full_of_dead_entries_is_reused,
    ),
    Test::new(
        "a_lease_left_to_expire_outlives_its_process",
        a_lease_left_to_expire_outlives_its_process,
    ),
    Test::new(
        "a_lease_left_to_expire_outlives_an_exec",
        a_lease_left_to_expire_outlives_an_exec,
    ),
    Test::new(
        "leases_left_to_expire_never_fill_the_registry",
        leases_left_to_expire_never_fill_the_registry,
    ),
    Test::new(
        "a_dead_holder_whose_entry_came_round_to_the_same_owner_bits_is_dead",
        a_dead_holder_whose_entry_came_round_to_the_same_owner_bits_is_dead,
    ),
];

fn main() {
    common::harness::run("registry", TESTS, common::harness::no_roles);
}

// ---------------------------------------------------------------------------------------
// An entry reused 64 times

/// A hold records its owner as the entry and 6 bits of its generation: after 64 reuses of
/// the entry, a later process has the same owner bits as a dead holder. It must still see
/// that holder dead (by the full generation the hold records), not take it for itself.
fn a_dead_holder_whose_entry_came_round_to_the_same_owner_bits_is_dead() {
    let path = TempPath::new("owner-bits");
    let open = || {
        LockTable::options()
            .capacity(64)
            .max_processes(1)
            .open(&path)
    };
    drop(open().unwrap());
    // the holder: takes K for good (no lease) and dies holding it
    let p = path.0.clone();
    let holder = fork(move || {
        let t = LockTable::options()
            .capacity(64)
            .max_processes(1)
            .open(&p)
            .unwrap();
        std::mem::forget(t.try_lock_with_lease(K, Duration::ZERO).unwrap().unwrap());
        0
    });
    assert_eq!(holder.wait(Duration::from_secs(10)), 0);
    // 63 more registrations of the one entry: the next one has the holder's owner bits
    for _ in 0..63 {
        drop(open().unwrap());
    }
    let t = open().unwrap();
    let taken = t.try_lock_with_lease(K, Duration::from_secs(1)).unwrap();
    note!("[K taken after 64 reuses: {}] ", taken.is_some());
    assert!(
        taken.is_some(),
        "a dead holder with this process's owner bits kept K"
    );
}

const K: &str = "K";

// ---------------------------------------------------------------------------------------
// A process with no registry entry

/// A table whose registry is full (`max_processes(1)`, taken by the test). A process
/// that cannot register must not take locks at all: an entry whose owner nobody can judge
/// would, once its claim is broken into BROKEN, stay out of use for good if that process
/// died. Opening fails with `TooManyProcesses`; once the test's handle is dropped, the
/// entry is free again.
fn a_process_with_no_registry_entry_takes_no_locks() {
    let path = TempPath::new("unknown-owner");
    let table = LockTable::options()
        .capacity(2) // 4 slots
        .max_processes(1)
        .open(&path)
        .unwrap();
    assert!(table.registered());
    let other = fork(|| match LockTable::open(&path.0, 2) {
        Err(Error::TooManyProcesses { max: 1, .. }) => 0,
        Err(e) => {
            eprintln!("open with the registry full: {e}");
            1
        }
        Ok(_) => {
            eprintln!("a process with no registry entry opened the table");
            2
        }
    });
    assert_eq!(other.wait(Duration::from_secs(10)), 0);
    drop(table);
    let again = fork(|| match LockTable::open(&path.0, 2) {
        Ok(t) if t.registered() => 0,
        _ => 1,
    });
    assert_eq!(
        again.wait(Duration::from_secs(10)),
        0,
        "the entry was not freed"
    );
    note!("[full registry: TooManyProcesses; free again once the holder left] ");
}

/// `register_lazily`: a process that opens a table whose registry is full (its one
/// entry taken by a live child that holds K) gets a handle all the same, breaks the
/// child's hold (as `shmlock unlock --force` does), and lists holders; its own first lock
/// is `TooManyProcesses` while the child lives, and takes the entry once the child left.
fn a_lazy_handle_breaks_holds_in_a_full_registry_and_registers_at_its_first_lock() {
    let path = TempPath::new("lazy");
    drop(
        LockTable::options()
            .capacity(8)
            .max_processes(1)
            .open(&path)
            .unwrap(),
    );
    let flag = Shared::new(2);
    let child = fork(|| {
        let t = LockTable::open(&path.0, 8).unwrap();
        let g = t.lock(K, opts(60_000, 1_000)).unwrap();
        flag.word(0).store(1, Ordering::SeqCst);
        await_word(&flag, 1, Duration::from_secs(30));
        i32::from(!matches!(g.unlock(), Err(Error::Expired)))
    });
    await_word(&flag, 0, Duration::from_secs(30));
    assert!(matches!(
        LockTable::open(&path.0, 8),
        Err(Error::TooManyProcesses { max: 1, .. })
    ));
    let admin = LockTable::options()
        .create(false)
        .register_lazily(true)
        .open(&path)
        .unwrap();
    assert_eq!(admin.holders().len(), 1);
    let broken = admin.force_unlock_holders(K, None).unwrap();
    assert_eq!(broken.len(), 1);
    assert_eq!(broken[0].pid, child.0 as u32);
    assert!(broken[0].owner_alive);
    assert!(!admin.is_locked(K).unwrap());
    // its own lock needs an entry: none while the child lives
    let refused = admin.try_lock_with_lease(K, Duration::from_secs(60));
    assert!(
        matches!(refused, Err(Error::TooManyProcesses { max: 1, .. })),
        "{refused:?}"
    );
    assert!(!admin.registered());
    flag.word(1).store(1, Ordering::SeqCst);
    assert_eq!(
        child.wait(Duration::from_secs(30)),
        0,
        "the child kept its hold"
    );
    let g = admin
        .try_lock_with_lease(K, Duration::from_secs(60))
        .unwrap()
        .expect("K is free");
    assert!(admin.registered());
    g.unlock().unwrap();
    note!("[lazy handle: broke a live holder's key in a full registry, then registered] ");
}

// ---------------------------------------------------------------------------------------
// A forked child in a full registry

/// The registry has one entry, this process's. A forked child cannot register: its lock
/// calls must fail, not take keys under no owner (or under its parent's), and it must not
/// release the parent's hold.
fn a_forked_child_that_finds_the_registry_full_takes_nothing() {
    let path = TempPath::new("full");
    let table = LockTable::options()
        .capacity(64)
        .max_processes(1)
        .open(&path)
        .unwrap();
    let g = table.lock(K, opts(0, 1_000)).unwrap();
    let flag = Shared::new(1);
    let c = fork(|| {
        let other = table.try_lock_with_lease("other", Duration::from_secs(60));
        let mine = table.try_lock_with_lease(K, Duration::from_secs(60));
        let code = match (&other, &mine) {
            (Err(_), Err(_)) => 1,
            (Ok(Some(_)), _) => 2,
            (_, Ok(Some(_))) => 3,
            _ => 4,
        };
        eprintln!("child: other {other:?}, K {mine:?}");
        flag.word(0).store(code, Ordering::SeqCst);
        0
    });
    assert_eq!(c.wait(Duration::from_secs(20)), 0);
    let code = flag.word(0).load(Ordering::SeqCst);
    note!("[child: {code}] ");
    assert_eq!(code, 1, "a child without a registry entry took a key");
    // the child's copy of the guard is gone with the child: K is still ours
    assert!(g.unlock().is_ok());
    // and nothing the child did left an entry behind
    assert!(table.holders().is_empty(), "{:?}", table.holders());
}

// ---------------------------------------------------------------------------------------
// Entries of dead processes

/// Every registry entry is left TAKEN by a process that was SIGKILLed: a new process must
/// still get an entry (the locks are gone).
fn registry_full_of_dead_entries_is_reused() {
    let path = TempPath::new("registry-dead");
    drop(LockTable::options().max_processes(4).open(&path).unwrap());
    let flag = Shared::new(8);
    for i in 0..4 {
        let c = fork(|| {
            let t = LockTable::open(&path, 64).unwrap();
            flag.word(i)
                .store(1 + u64::from(t.registered()), Ordering::SeqCst);
            std::thread::sleep(Duration::from_secs(30));
            drop(t);
            0
        });
        await_word(&flag, i, Duration::from_secs(10));
        c.kill();
    }
    let registered: Vec<_> = (0..4)
        .map(|i| flag.word(i).load(Ordering::SeqCst) == 2)
        .collect();
    let t = LockTable::open(&path, 64).unwrap();
    note!(
        "[dead processes registered: {registered:?}; a new one registered: {}] ",
        t.registered()
    );
    assert!(t.registered());
}

// ---------------------------------------------------------------------------------------
// Leases left to expire ("only one worker runs this tick") outlive their process, and take
// no registry entry with them

/// The documented cron pattern: whoever gets the lease for this minute does the work and
/// leaves the lease to expire. The winner finishes and exits well within the minute; a
/// second runner arriving in the same minute must not get the lease.
fn a_lease_left_to_expire_outlives_its_process() {
    let path = TempPath::new("leave-exit");
    let table = LockTable::open(&path, 64).unwrap();
    let mut first = Proc::new(fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        let got = t
            .try_lock_with_lease("cron:12:00", Duration::from_secs(60))
            .unwrap();
        match got {
            Some(g) => {
                let _ = g.leave_to_expire();
                0 // work done, exit
            }
            None => 1,
        }
    }));
    assert_eq!(first.wait(Duration::from_secs(10)), 0);
    let second = table
        .try_lock_with_lease("cron:12:00", Duration::from_secs(60))
        .unwrap();
    let ran_twice = second.is_some();
    note!(
        "[second runner in the same minute {}] ",
        if ran_twice {
            "GOT the lease"
        } else {
            "was refused"
        }
    );
    assert!(
        !ran_twice,
        "a lease left to expire was reaped when its process exited"
    );
}

/// The same for a launcher that takes the lease and execs the job.
fn a_lease_left_to_expire_outlives_an_exec() {
    let path = TempPath::new("leave-exec");
    let table = LockTable::open(&path, 64).unwrap();
    let flag = Shared::new(1);
    let _launcher = Proc::new(fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        let g = t
            .try_lock_with_lease("job", Duration::from_secs(60))
            .unwrap()
            .unwrap();
        let _ = g.leave_to_expire();
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
    std::thread::sleep(Duration::from_millis(200)); // the exec is done
    let second = table
        .try_lock_with_lease("job", Duration::from_secs(60))
        .unwrap();
    let twice = second.is_some();
    note!(
        "[while the exec'd job runs, a second launcher {}] ",
        if twice {
            "GOT the lease"
        } else {
            "was refused"
        }
    );
    assert!(
        !twice,
        "a lease left to expire was reaped when its process exec'd"
    );
}

/// A long-lived process that opens a handle per run and leaves each lease to expire must
/// not keep a registration (and its descriptor) per run: the registry would fill up.
fn leases_left_to_expire_never_fill_the_registry() {
    let path = TempPath::new("leave-leak");
    drop(
        LockTable::options()
            .capacity(4096)
            .max_processes(64)
            .open(&path)
            .unwrap(),
    );
    let mut child = Proc::new(fork(|| {
        for i in 0..100 {
            let t = LockTable::open(&path, 64).unwrap();
            if !t.registered() {
                note!(
                    "[run {i}: no registry entry left; fds open: {}] ",
                    fds_naming(&path.0).len()
                );
                return 1;
            }
            let g = t
                .try_lock_with_lease(format!("run:{i}"), Duration::from_millis(10))
                .unwrap()
                .unwrap();
            let _ = g.leave_to_expire();
        }
        0
    }));
    assert_eq!(child.wait(Duration::from_secs(30)), 0, "registrations leak");
}
