//! Attacks of the third adversarial review, with real processes (fork, exec, gdb
//! watchpoints, SIGSTOP/SIGKILL, time namespaces): the two-step steal of an expired or
//! dead holder's key, a hold's full registry generation, and a registration that lasts
//! as long as the process's mapping of the table. Each was run against the code it
//! attacked; those that broke it are regression tests now, and the one that still
//! succeeds is a known limit (`--known-limits` runs it).

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::fork::{fork, Shared};
use common::harness::Test;
use common::probe::{await_word, mapping_base, registry_len, GdbStop, Proc, Watch};
use common::word::state;
use common::{opts, TempPath};
use shmlock::LockTable;

const TESTS: &[Test] = &[
    Test::new(
        "stealer_killed_while_stealing_an_expired_live_holders_key_blocks_nobody",
        stealer_killed_while_stealing_an_expired_live_holders_key_blocks_nobody,
    ),
    Test::new(
        "stealer_killed_while_stealing_a_dead_holders_key_blocks_nobody",
        stealer_killed_while_stealing_a_dead_holders_key_blocks_nobody,
    ),
    Test::new(
        "stealer_stopped_while_stealing_resumes_after_the_key_changed_hands",
        stealer_stopped_while_stealing_resumes_after_the_key_changed_hands,
    ),
];

fn main() {
    common::harness::run("adversarial3", TESTS, common::harness::no_roles);
}

const K: &str = "K";

// ---------------------------------------------------------------------------------------
// Helpers

// ---------------------------------------------------------------------------------------
// 3. 80a1247: a stealer stopped or killed right after its freezing CAS (HELD -> STEALING).
//    A hardware watchpoint on the slot's control word stops it at the first store that
//    leaves the state STEALING.

/// Forks a stealer S that waits for K (its lock call finds the hold expired or its owner
/// dead and freezes it), stopped by gdb right after the freeze. Returns S, gdb and the slot.
fn stopped_stealer(
    path: &TempPath,
    slot: usize,
    shared: &Shared,
    exptime_ms: u64,
) -> (Proc, GdbStop) {
    let registry_len = registry_len(path.as_ref());
    let s = Proc::new(fork(|| {
        let t = LockTable::open(path, 64).unwrap();
        let base = mapping_base(&path.0) as u64;
        shared
            .word(1)
            .store(base + registry_len + slot as u64 * 64, Ordering::SeqCst);
        await_word(shared, 0, Duration::from_secs(60));
        let g = t.lock(K, opts(exptime_ms, 5_000));
        shared
            .word(3)
            .store(if g.is_ok() { 1 } else { 2 }, Ordering::SeqCst);
        // S holds what it got for a while, and says when it lets go
        std::thread::sleep(Duration::from_millis(300));
        shared.word(4).store(1, Ordering::SeqCst);
        drop(g);
        std::thread::sleep(Duration::from_secs(30));
        0
    }));
    let addr = await_word(shared, 1, Duration::from_secs(10));
    let g = GdbStop::attach(
        s.pid(),
        &[
            format!("watch *(long*){addr:#x}"),
            format!("condition 1 (*(long*){addr:#x} & 7) == 5"),
        ],
    );
    shared.word(0).store(1, Ordering::SeqCst);
    assert!(
        g.stopped(Duration::from_secs(30)),
        "S never froze the entry"
    );
    (s, g)
}

/// H (this process) holds K with a 50 ms lease and keeps running. S freezes the expired
/// hold and is SIGKILLed there. H's renewal must say Expired; a waiter W must take K at
/// once; nothing wedged.
fn stealer_killed_while_stealing_an_expired_live_holders_key_blocks_nobody() {
    let path = TempPath::new("steal-kill");
    let table = LockTable::open(&path, 64).unwrap();
    let watch = Watch::new(path.as_ref());
    let mut h = table.lock(K, opts(50, 1_000)).unwrap();
    let (_, slot) = table.debug_placement(K).unwrap();
    let shared = Shared::new(8);
    std::thread::sleep(Duration::from_millis(80)); // H's lease runs out
    let (mut s, g) = stopped_stealer(&path, slot, &shared, 60_000);
    let w = watch.control(slot);
    note!("[S stopped, slot state {}] ", state(w));
    assert_eq!(state(w), 5, "S not stopped in STEALING (inconclusive)");
    // SAFETY: signalling our own child, unreaped until s.kill(), so its pid is not reused.
    unsafe { libc::kill(s.pid(), libc::SIGKILL) };
    drop(g);
    s.kill();
    assert_eq!(state(watch.control(slot)), 5, "STEALING left behind");
    let holders = table.holders();
    note!(
        "[holders(): {:?}] ",
        holders
            .iter()
            .map(|h| (h.state, h.expired, h.owner_alive))
            .collect::<Vec<_>>()
    );
    let renew = h.expire(Some(Duration::from_secs(60)));
    let started = Instant::now();
    let other = fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        let r = t.lock(K, opts(60_000, 2_000)).is_ok();
        if r {
            0
        } else {
            1
        }
    })
    .wait(Duration::from_secs(10));
    note!(
        "[H's renewal after S died: {renew:?}; W {} in {:?}] ",
        if other == 0 { "took K" } else { "TIMED OUT" },
        started.elapsed()
    );
    assert!(renew.is_err(), "an expired hold was renewed");
    assert_eq!(other, 0, "K wedged after a stealer died mid-steal");
}

/// H holds K for good and is SIGKILLed; S freezes the dead hold and is SIGKILLed there.
/// A waiter W must take K at once.
fn stealer_killed_while_stealing_a_dead_holders_key_blocks_nobody() {
    let path = TempPath::new("steal-kill-dead");
    let table = LockTable::open(&path, 64).unwrap();
    let watch = Watch::new(path.as_ref());
    let flag = Shared::new(2);
    let mut hp = Proc::new(fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        let g = t.lock(K, opts(0, 1_000)).unwrap();
        flag.word(1)
            .store(t.debug_placement(K).unwrap().1 as u64 + 1, Ordering::SeqCst);
        std::mem::forget(g);
        flag.word(0).store(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(60));
        0
    }));
    await_word(&flag, 0, Duration::from_secs(10));
    let slot = (flag.word(1).load(Ordering::SeqCst) - 1) as usize;
    hp.kill();
    let shared = Shared::new(8);
    let (mut s, g) = stopped_stealer(&path, slot, &shared, 60_000);
    assert_eq!(state(watch.control(slot)), 5, "inconclusive");
    // SAFETY: signalling our own child, unreaped until s.kill(), so its pid is not reused.
    unsafe { libc::kill(s.pid(), libc::SIGKILL) };
    drop(g);
    s.kill();
    let started = Instant::now();
    let got = table.lock(K, opts(0, 2_000));
    note!(
        "[S killed in STEALING; waiter {} in {:?}] ",
        if got.is_ok() { "took K" } else { "TIMED OUT" },
        started.elapsed()
    );
    assert!(got.is_ok(), "K wedged after a stealer died mid-steal");
}

/// H's hold expires; S freezes it and is stopped. This process's waiter W resolves the
/// steal, takes K (60 s) and keeps it; S then resumes: S must not get K while W holds it;
/// W's renewal and unlock must succeed.
fn stealer_stopped_while_stealing_resumes_after_the_key_changed_hands() {
    let path = TempPath::new("steal-stop");
    let table = LockTable::open(&path, 64).unwrap();
    let watch = Watch::new(path.as_ref());
    let h = table.lock(K, opts(50, 1_000)).unwrap();
    let (_, slot) = table.debug_placement(K).unwrap();
    std::mem::forget(h);
    std::thread::sleep(Duration::from_millis(80));
    let shared = Shared::new(8);
    let (mut s, g) = stopped_stealer(&path, slot, &shared, 60_000);
    assert_eq!(state(watch.control(slot)), 5, "inconclusive");
    // W: another table handle in this process would share its owner: fork W
    let wflag = Shared::new(4);
    let w = Proc::new(fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        let mut g = match t.lock(K, opts(60_000, 2_000)) {
            Ok(g) => g,
            Err(_) => {
                wflag.word(0).store(2, Ordering::SeqCst);
                return 0;
            }
        };
        wflag.word(0).store(1, Ordering::SeqCst);
        await_word(&wflag, 1, Duration::from_secs(30));
        let r = g.expire(None);
        let u = g.unlock();
        wflag
            .word(2)
            .store(if r.is_ok() && u.is_ok() { 1 } else { 2 }, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(30));
        0
    }));
    let w_got = await_word(&wflag, 0, Duration::from_secs(10)) == 1;
    // let the slot move on a few times under W's hold (renewals are W's; here: nothing)
    g.release();
    // S resumes; give it 200 ms to finish its look
    std::thread::sleep(Duration::from_millis(200));
    let s_got = shared.word(3).load(Ordering::SeqCst);
    wflag.word(1).store(1, Ordering::SeqCst);
    let w_ok = await_word(&wflag, 2, Duration::from_secs(10)) == 1;
    // now S should get K (its 5 s wait)
    let s_after = await_word(&shared, 3, Duration::from_secs(10));
    note!(
        "[W took K: {w_got}; while W held it S's lock: {}; W's renew+unlock ok: {w_ok}; \
         S afterwards: {}] ",
        match s_got {
            0 => "still waiting",
            1 => "RETURNED A HOLD",
            _ => "failed",
        },
        if s_after == 1 { "took K" } else { "failed" }
    );
    drop(w);
    s.kill();
    assert!(w_got, "W could not take the expired key");
    assert_ne!(s_got, 1, "two live holders: S took K while W held it");
    assert!(w_ok, "W's hold was disturbed by S");
}
