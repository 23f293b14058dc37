//! Forks inside forks and against the application's own fork handlers, waiters on
//! stalled, renewing and expired holds (CPU and timeouts), with real processes. Each fork scenario runs in a freshly spawned copy of this
//! binary (`--role NAME PATH`) so that the order of `pthread_atfork` registrations is
//! controlled; the test kills it (its whole process group) if it hangs.
mod common;

use std::fs;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::fork::{fork, Child, Shared};
use common::harness::Test;
use common::probe::{await_word, Watch};
use common::{fresh_table, TempPath};
use shmlock::{LockOptions, LockTable};

const TESTS: &[Test] = &[
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
    common::harness::run("adversarial7", TESTS, common::harness::no_roles);
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
