//! Real-process attacks on the two promises: "a key never has two live holders" and
//! "nothing dead or stopped wedges a key for good". Each test is an attack that once
//! worked (descriptors closed behind the library's back, time namespaces, `_Fork`, pid 1
//! of a new namespace, stopped writers, reboots, leases left to expire, short-lived
//! pollers, ...) and asserts what the design promises; two chaos tests SIGSTOP and SIGKILL
//! workers at random for 20 s each.
//! `adversarial FILTER` runs the tests whose name contains FILTER; the root-only ones run
//! with `--include-ignored` as root.

mod common;

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::fork::{fork, xorshift, Shared};
use common::harness::{require_root, Test};
use common::probe::{await_word, cont, proc_state, stop, Proc};
use common::{opts, TempPath};
use shmlock::{Error, HolderState, LockTable};

const TESTS: &[Test] = &[
    Test::new(
        "an_opener_stopped_while_attaching_blocks_nobody",
        an_opener_stopped_while_attaching_blocks_nobody,
    ),
    Test::new(
        "two_stopped_claims_64_slots_apart_are_both_broken",
        two_stopped_claims_64_slots_apart_are_both_broken,
    ),
    Test::new(
        "control_two_stopped_claims_32_slots_apart_are_broken",
        control_two_stopped_claims_32_slots_apart_are_broken,
    ),
    Test::new(
        "a_stopped_claim_is_broken_for_short_lived_pollers_too",
        a_stopped_claim_is_broken_for_short_lived_pollers_too,
    ),
    Test::new(
        "killed_mid_claim_many_times_leaves_nothing",
        killed_mid_claim_many_times_leaves_nothing,
    ),
    Test::new(
        "killed_mid_claim_in_a_new_pid_namespace_many_times_leaves_nothing",
        killed_mid_claim_in_a_new_pid_namespace_many_times_leaves_nothing,
    )
    .needs_root("needs root: new pid namespaces"),
];

fn main() {
    common::harness::run("adversarial", TESTS, common::harness::no_roles);
}

const K: &str = "K";

// ---------------------------------------------------------------------------------------
// F: unregistered owners (registry full) leave BROKEN slots nobody can free

/// Takes and releases `key` for good. The lease alternates between two lengths, so that
/// every claim goes through CLAIMING (a thread taking its key again within one clock tick
/// with the same lease publishes HELD with one CAS, and CLAIMING is then rarely seen).
fn claim_loop(path: &Path, key: &str) -> i32 {
    let Ok(table) = LockTable::open(path, 64) else {
        return 92;
    };
    for i in 0u64.. {
        let Ok(g) = table.lock(key, opts(30_000 + i % 2, 30_000)) else {
            return 93;
        };
        if g.unlock().is_err() {
            return 94;
        }
    }
    0
}

/// SIGSTOPs `pid` until `table` shows a Claiming entry (left stopped then).
fn catch_claiming(table: &LockTable, pid: libc::pid_t, tries: usize, x: &mut u64) -> bool {
    catch_claiming_beyond(table, pid, tries, x, 0)
}

/// The same, with `before` Claiming entries of other (stopped) claimers already there.
fn catch_claiming_beyond(
    table: &LockTable,
    pid: libc::pid_t,
    tries: usize,
    x: &mut u64,
    before: usize,
) -> bool {
    let mut seen: std::collections::BTreeMap<String, usize> = Default::default();
    for _ in 0..tries {
        stop(pid);
        let hs = table.holders();
        *seen
            .entry(format!(
                "{:?}",
                hs.iter().map(|h| h.state).collect::<Vec<_>>()
            ))
            .or_default() += 1;
        let n = hs
            .iter()
            .filter(|h| h.state == HolderState::Claiming)
            .count();
        if n > before {
            return true;
        }
        cont(pid);
        for _ in 0..xorshift(x) % 20_000 {
            std::hint::spin_loop();
        }
    }
    note!("[states seen while stopped: {seen:?}] ");
    false
}

// ---------------------------------------------------------------------------------------
// F: the init lock has no bound

/// A process that opens and drops the table in a loop is SIGSTOPped at random moments of
/// its attaching (200 times) and left stopped while another process opens the table:
/// each open must succeed at once. (Only a reset after a reboot, which holds the attached
/// byte for writing, keeps others out while it runs.)
fn an_opener_stopped_while_attaching_blocks_nobody() {
    let path = TempPath::new("init-lock");
    drop(LockTable::open(&path, 64).unwrap());
    let mut opener = Proc::new(fork(|| loop {
        let t = LockTable::open(&path, 64).unwrap();
        drop(t);
    }));
    let mut x = 0xfeed;
    let mut slowest = Duration::ZERO;
    for _ in 0..200 {
        for _ in 0..xorshift(&mut x) % 50_000 {
            std::hint::spin_loop();
        }
        stop(opener.pid());
        let t0 = Instant::now();
        let r = LockTable::open(&path, 64);
        slowest = slowest.max(t0.elapsed());
        assert!(r.is_ok(), "open while an opener is stopped: {:?}", r.err());
        cont(opener.pid());
    }
    let _ = opener.try_wait();
    note!("[200 opens beside a stopped opener; slowest {slowest:.1?}] ");
    assert!(
        slowest < Duration::from_secs(1),
        "a stopped opener held others up"
    );
}

// ---------------------------------------------------------------------------------------
// F: the stall memory has 64 cells, and two stalled slots 64 apart evict each other

/// Two keys whose homes are `apart` slots apart (in a table of 128 slots).
fn keys_apart(table: &LockTable, apart: usize) -> (String, String) {
    let mut by_home = std::collections::HashMap::new();
    for n in 0.. {
        let k = format!("k{n}");
        let g = table
            .try_lock_with_lease(&k, Duration::from_secs(5))
            .unwrap()
            .unwrap();
        let (home, _) = table.debug_placement(&k).unwrap();
        drop(g);
        if let Some(other) = by_home.get(&((home + apart) % 128)) {
            return (k, String::clone(other));
        }
        by_home.insert(home, k);
    }
    unreachable!()
}

/// Two claimers, of keys A and B whose homes are 64 slots apart, are stopped mid-claim and
/// left stopped. One waiter process with two threads waits for A and for B. The design
/// bounds a stopped claim at ~0.5 s; both waits should succeed well within 5 s.
fn two_stopped_claims_64_slots_apart_are_both_broken() {
    two_stopped_claims(64);
}

/// The control: the same 32 slots apart.
fn control_two_stopped_claims_32_slots_apart_are_broken() {
    two_stopped_claims(32);
}

fn two_stopped_claims(apart: usize) {
    let path = TempPath::new("cells");
    let table = LockTable::open(&path, 64).unwrap(); // 128 slots
    let (a, b) = keys_apart(&table, apart);
    let mut x = 0xabc;
    let mut wa = Proc::new(fork(|| claim_loop(&path.0, &a)));
    assert!(
        catch_claiming(&table, wa.pid(), 50_000, &mut x),
        "A never caught"
    );
    let mut wb = Proc::new(fork(|| claim_loop(&path.0, &b)));
    assert!(
        catch_claiming(&table, wb.pid(), 50_000, &mut x),
        "B never caught"
    );
    let states: Vec<_> = table.holders().iter().map(|h| h.state).collect();
    let mut waiter = Proc::new(fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        let (t, a, b) = (&t, &a, &b);
        let res = std::thread::scope(|s| {
            let ja = s.spawn(move || t.lock(a, opts(30_000, 5_000)).map(|g| g.elapsed()));
            let jb = s.spawn(move || t.lock(b, opts(30_000, 5_000)).map(|g| g.elapsed()));
            (ja.join().unwrap(), jb.join().unwrap())
        });
        note!("[waiting for A: {:?}, for B: {:?}] ", res.0, res.1);
        // The bound is 500 ms; allow three times that.
        let slow = |r: &Result<Duration, Error>| {
            r.as_ref()
                .map_or(true, |d| *d > Duration::from_millis(1_500))
        };
        i32::from(slow(&res.0)) + 2 * i32::from(slow(&res.1))
    }));
    let code = waiter.wait(Duration::from_secs(30));
    let _ = (wa.try_wait(), wb.try_wait());
    assert_eq!(code, 0, "stopped claims left unbroken (entries {states:?})");
}

// ---------------------------------------------------------------------------------------
// The stall memory is per process

/// A claimer is stopped mid-claim and left stopped. Fresh processes poll the key with
/// `try_lock` every 100 ms for 5 s (a cron job, `shmlock run --nonblock`, a CLI with a short
/// timeout): none of them watches the claim for 500 ms itself, yet together they must
/// break it after the bound.
fn a_stopped_claim_is_broken_for_short_lived_pollers_too() {
    let path = TempPath::new("pollers");
    let table = LockTable::open(&path, 64).unwrap();
    let mut x = 0x77;
    let mut w = Proc::new(fork(|| claim_loop(&path.0, K)));
    assert!(
        catch_claiming(&table, w.pid(), 50_000, &mut x),
        "never caught the claimer"
    );
    let t0 = Instant::now();
    let mut polls = 0;
    let mut got = None;
    while t0.elapsed() < Duration::from_secs(5) {
        polls += 1;
        let mut p = Proc::new(fork(|| {
            let t = LockTable::open(&path, 64).unwrap();
            let r = t
                .try_lock_with_lease(K, Duration::from_secs(1))
                .map(|g| g.is_some());
            i32::from(matches!(r, Ok(true)))
        }));
        if p.wait(Duration::from_secs(5)) == 1 {
            got = Some(t0.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = w.try_wait();
    note!(
        "[{polls} fresh pollers: {}] ",
        got.map_or("none got K".to_string(), |t| format!("K after {t:.2?}"))
    );
    assert!(
        got.is_some(),
        "a stopped claim is never broken by short-lived processes"
    );
}

// ---------------------------------------------------------------------------------------
// The lead's "killed mid-claim" scenarios, with a claimer that really goes through CLAIMING
// (tests/liveness.rs's claim_loop mostly takes the one-CAS path and is never caught there
// on a machine with a 4 ms clock tick).

fn killed_mid_claim_many_times_leaves_nothing() {
    killed_mid_claim(false);
}

fn killed_mid_claim_in_a_new_pid_namespace_many_times_leaves_nothing() {
    require_root();
    killed_mid_claim(true);
}

fn killed_mid_claim(new_pid_ns: bool) {
    const KILLS: usize = 20;
    let path = TempPath::new("killed-mid-claim");
    let table = LockTable::open(&path, 16).unwrap();
    let mut x = 0x31337;
    let mut worst = Duration::ZERO;
    let pidfile = Shared::new(2);
    for n in 0..KILLS {
        pidfile.word(0).store(0, Ordering::SeqCst);
        // The worker: our child, or (new pid ns) the child of a middle process of ours.
        let middle = Proc::new(fork(|| {
            if new_pid_ns {
                // SAFETY: plain system call.
                assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWPID) }, 0);
                let inner = fork(|| claim_loop(&path.0, K));
                pidfile.word(0).store(inner.0 as u64, Ordering::SeqCst);
                inner.wait(Duration::from_secs(120))
            } else {
                pidfile
                    .word(0)
                    .store(u64::from(std::process::id()), Ordering::SeqCst);
                claim_loop(&path.0, K)
            }
        }));
        let pid = await_word(&pidfile, 0, Duration::from_secs(10)) as libc::pid_t;
        assert!(
            catch_claiming(&table, pid, 50_000, &mut x),
            "worker {n} never caught claiming: state {:?}, entries {:?}",
            proc_state(pid).map(char::from),
            table.holders()
        );
        // SAFETY: our (grand)child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let mut middle = middle;
        let _ = middle.wait(Duration::from_secs(10));
        let t0 = Instant::now();
        let g = table
            .lock(K, opts(30_000, 5_000))
            .unwrap_or_else(|e| panic!("kill {n}: {e}; entries {:?}", table.holders()));
        worst = worst.max(t0.elapsed());
        assert_eq!(
            table.holders().len(),
            1,
            "kill {n}: left {:?}",
            table.holders()
        );
        drop(g);
    }
    note!("[{KILLS} kills in Claiming; K back within {worst:.2?} each time] ");
    assert!(table.holders().is_empty());
}
