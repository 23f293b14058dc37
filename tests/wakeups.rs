//! Wake-ups: a waiter sleeps while its key is held, wakes when the key frees (never late,
//! never lost) and keeps its timeout. Every way a key frees ends a sleeping waiter's wait
//! in time: a release, `force_unlock` by a third process, renewals then a release, a lease
//! left to expire, a SIGKILLed holder. A sleeper is woken when another key of the same home
//! and tag takes its key's slot. A stray waiter's flag costs the holder one wake, not one per
//! unlock. A waiter on a holder that relocks in a loop, renews in a loop, or stalled in a
//! claim or a renewal keeps its timeout, and sleeps rather than spins. (A sleeper late after
//! a 2^23 generation wrap is a known limit, in `tests/generation_wraps.rs`.)
//!
//! Exercises `src/shm/futex.rs`, `src/lock/wait.rs` (the step schedule),
//! `src/shm/table/wait.rs` (the waiters flag, a sleep cut at the lease's end, stalled entries)
//! and `src/shm/slot.rs` (the control word's futex half).
//!
//! `wakeups FILTER` runs the tests whose name contains FILTER; `wakeups --list` lists them.
//! gdb and strace stop and watch processes at exact points (`scripts/test-tools.sh`
//! installs both).

mod common;

use std::fs;
use std::os::unix::process::CommandExt;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::fork::{fork, Child, Shared};
use common::harness::Test;
use common::probe::{
    await_word, coarse_ns, flagging_waiter, header_u64, mapping_base, mono_ns, place, registry_len,
    GdbStop, Proc, Spawned, Watch,
};
use common::{fresh_table, opts, TempPath};
use shmlock::{LockOptions, LockTable};

const TESTS: &[Test] = &[
    Test::new(
        "a_waiter_against_a_relocking_holder_keeps_its_timeout",
        timeout_overrun,
    ),
    Test::new(
        "a_sleeper_wakes_when_a_flagged_same_tag_key_takes_its_slot",
        lost_wakeup_k2_flagged,
    ),
    Test::new(
        "a_sleeper_wakes_when_an_unflagged_same_tag_key_takes_its_slot",
        control_lost_wakeup_k2_unflagged,
    ),
    Test::new(
        "a_stray_waiters_flag_costs_at_most_one_wake",
        stray_flag_syscalls,
    ),
    Test::new("every_way_a_key_frees_wakes_or_frees_its_waiter", who_wakes),
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
    common::harness::run("wakeups", TESTS, common::harness::no_roles);
}

// ---------------------------------------------------------------------------------------
// A waiter with a timeout against a holder that unlocks and locks again in a loop: it
// gets the key at some point and never waits past its timeout.

fn timeout_overrun() {
    let path = TempPath::new("overrun");
    let table = LockTable::open(&path, 64).unwrap();
    drop(table);
    let shared = Shared::new(4);
    let hold_us: u64 = 20;
    let holder = fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        let started = Instant::now();
        let mut n = 0u64;
        while started.elapsed() < Duration::from_secs(8)
            && shared.word(0).load(Ordering::Relaxed) == 0
        {
            let g = t.lock("K", opts(30_000, 5_000)).unwrap();
            std::hint::black_box(&g);
            let w = Instant::now();
            while w.elapsed() < Duration::from_micros(hold_us) {
                std::hint::spin_loop();
            }
            drop(g);
            n += 1;
        }
        shared.word(1).store(n, Ordering::SeqCst);
        0
    });
    std::thread::sleep(Duration::from_millis(50));
    let t = LockTable::open(&path, 64).unwrap();
    let mut worst = Duration::ZERO;
    let (mut got, mut timed_out) = (0, 0);
    let mut lines = Vec::new();
    for timeout_ms in [5u64, 20, 100, 300, 1000, 5, 20, 100, 300, 1000] {
        std::thread::sleep(Duration::from_millis(30));
        let s = Instant::now();
        let r = t.lock("K", opts(30_000, timeout_ms));
        let took = s.elapsed();
        match &r {
            Ok(_) => got += 1,
            Err(_) => timed_out += 1,
        }
        lines.push(format!(
            "timeout {timeout_ms} ms: {} after {:.1} ms",
            if r.is_ok() { "got" } else { "timed out" },
            took.as_secs_f64() * 1e3
        ));
        let over = took.saturating_sub(Duration::from_millis(timeout_ms));
        worst = worst.max(over);
        drop(r);
    }
    shared.word(0).store(1, Ordering::SeqCst);
    holder.wait(Duration::from_secs(20));
    note!(
        "[holder cycles {}; {got} got, {timed_out} timed out; {}] ",
        shared.word(1).load(Ordering::SeqCst),
        lines.join("; ")
    );
    // Generous margins: a shared 2-core machine may deschedule the waiter for a while.
    assert!(
        worst < Duration::from_millis(250),
        "a waiter overran its timeout by {worst:?}"
    );
    assert!(
        got > 0,
        "a waiter never got a key its holder frees every 20 µs"
    );
}

// ---------------------------------------------------------------------------------------
// Lost wake-up: a waiter W of K1 flags H's hold of K1 and is stopped at the entry of its
// FUTEX_WAIT (gdb catch syscall). H releases K1 (wakes nobody: W is not asleep yet) and
// takes K2, a key of the same home and the same 7-bit tag, in the same slot; X, a waiter of
// K2, flags that hold (or not). The futex compares only the word's low 32 bits; they carry
// the low bits of the generation, so they differ from W's expected value and the kernel
// refuses W the sleep (were they equal, W would sleep its step out).

fn lost_wakeup_same_tag(flag_k2: bool) {
    let path = TempPath::new("lostwake");
    drop(LockTable::open(&path, 64).unwrap());
    let seed = header_u64(&path.0, 32);
    let n = header_u64(&path.0, 16);
    let mut seen = std::collections::HashMap::new();
    let (k1, k2) = (0..200_000)
        .find_map(|i| {
            let k = format!("w:{i}");
            let p = place(seed, n, &k);
            seen.insert(p, k.clone()).map(|prev| (prev, k))
        })
        .unwrap();
    let (home, tag) = place(seed, n, &k1);
    let slot = home as usize;
    let watch = Watch::new(&path.0);
    let rlen = registry_len(&path.0);
    let shared = Shared::new(16);
    let step = Duration::from_millis(400);
    // H: holds K1; on word 0 == 1 releases it (time in word 3) and takes K2.
    let h = Proc(Some(fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        let g1 = t.lock(&k1, opts(60_000, 1000)).unwrap();
        shared.word(1).store(1, Ordering::SeqCst);
        await_word(&shared, 0, Duration::from_secs(60));
        let at = mono_ns();
        drop(g1);
        let g2 = t.lock(&k2, opts(60_000, 1000)).unwrap();
        shared.word(3).store(at, Ordering::SeqCst);
        shared.word(4).store(
            t.debug_placement(&k2).unwrap().1 as u64 + 1,
            Ordering::SeqCst,
        );
        std::thread::sleep(Duration::from_secs(30));
        drop(g2);
        0
    })));
    await_word(&shared, 1, Duration::from_secs(10));
    // W: waits for K1 with a 400 ms first step
    let w = Proc(Some(fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        let addr = mapping_base(&path.0) as u64 + rlen + slot as u64 * 64;
        shared.word(5).store(addr, Ordering::SeqCst);
        await_word(&shared, 6, Duration::from_secs(60));
        let o = LockOptions {
            exptime: Duration::from_secs(60),
            timeout: Duration::from_secs(5),
            step,
            max_step: step,
            ..LockOptions::default()
        };
        let g = t.lock(&k1, o);
        shared.word(7).store(mono_ns(), Ordering::SeqCst);
        shared
            .word(8)
            .store(if g.is_ok() { 1 } else { 2 }, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(30));
        0
    })));
    let addr = await_word(&shared, 5, Duration::from_secs(10));
    let mut gdb = Some(GdbStop::at_futex(w.pid(), addr));
    shared.word(6).store(1, Ordering::SeqCst);
    assert!(
        gdb.as_ref().unwrap().stopped(Duration::from_secs(30)),
        "W never reached its futex wait"
    );
    let w1 = watch.control(slot);
    note!("[K1 {k1:?}, K2 {k2:?}: home {home}, tag {tag}; W stopped at FUTEX_WAIT, word {w1:#x}] ");
    assert_eq!(w1 & 7, 2, "inconclusive: not held");
    assert_ne!(w1 & 8, 0, "inconclusive: not flagged");
    // H releases K1 and takes K2 in the same slot
    shared.word(0).store(1, Ordering::SeqCst);
    let s2 = await_word(&shared, 4, Duration::from_secs(10)) - 1;
    assert_eq!(s2 as usize, slot, "inconclusive: K2 landed elsewhere");
    // X: a waiter of K2 flags H's new hold
    let _x = flag_k2.then(|| flagging_waiter(&path.0, &k2, &watch, slot));
    let w2 = watch.control(slot);
    note!(
        "[after: word {w2:#x}, low halves {} ] ",
        if w1 as u32 == w2 as u32 {
            "EQUAL"
        } else {
            "differ"
        }
    );
    gdb.take().unwrap().release();
    let got = await_word(&shared, 8, Duration::from_secs(10));
    let released = shared.word(3).load(Ordering::SeqCst);
    let acquired = shared.word(7).load(Ordering::SeqCst);
    let late = Duration::from_nanos(acquired - released);
    note!(
        "[W {} K1 {:.1} ms after H released it (incl. the time W was held stopped)] ",
        if got == 1 { "got" } else { "did NOT get" },
        late.as_secs_f64() * 1e3
    );
    drop(h);
    drop(w);
    assert!(got == 1);
    assert!(
        late < Duration::from_millis(300),
        "lost wake-up: W slept through K1's release on K2's hold for its step"
    );
}
fn lost_wakeup_k2_flagged() {
    lost_wakeup_same_tag(true)
}
fn control_lost_wakeup_k2_unflagged() {
    lost_wakeup_same_tag(false)
}

// ---------------------------------------------------------------------------------------
// A stray flag: a waiter that timed out leaves the waiters bit on the hold; the holder
// pays one FUTEX_WAKE for it, not one on every uncontended lock/unlock ever after.

fn stray_flag_syscalls() {
    let path = TempPath::new("stray");
    drop(LockTable::open(&path, 64).unwrap());
    let sh = Shared::new(8);
    let h = Proc(Some(fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        let mut g = t.lock("S", opts(60_000, 1000)).unwrap();
        sh.word(1).store(1, Ordering::SeqCst);
        await_word(&sh, 0, Duration::from_secs(60));
        // renew a few times (the flag stays), then 300 times towards one end 60 s away
        // (the deadline then moves back and forth within a tick of the coarse clock), then
        // unlock, then 1000 uncontended cycles.
        //
        // A renewal delayed between the reading of `Instant::now()` and the table's clock
        // (preempted: a loaded machine, strace's stops) really moves the deadline later,
        // and the next one really moves it back by more than a tick, which wakes sleepers
        // by design (`end_extension`). Each renewal's deadline lies within [coarse clock
        // before + exptime, coarse clock after + exptime]: a pair whose bounds allow such
        // a move back is counted, and allowed one wake.
        let mut bounds = Vec::with_capacity(305);
        let mut renew = |g: &mut shmlock::LockGuard<'_>, exptime: Duration| {
            let before = coarse_ns();
            g.expire(Some(exptime)).unwrap();
            let e = exptime.as_nanos() as u64;
            bounds.push((before + e, coarse_ns() + e));
        };
        for _ in 0..5 {
            renew(&mut g, Duration::from_secs(60));
        }
        let end = Instant::now() + Duration::from_secs(60);
        for _ in 0..300 {
            std::thread::sleep(Duration::from_micros(100));
            renew(&mut g, end - Instant::now());
        }
        let tick = 4_000_000; // the table clock's tick (src/shm/clock.rs)
        let moved_back = bounds.windows(2).filter(|w| w[0].1 > w[1].0 + tick).count();
        sh.word(3).store(moved_back as u64, Ordering::SeqCst);
        drop(g);
        for _ in 0..1000 {
            drop(t.lock("S", opts(60_000, 1000)).unwrap());
        }
        sh.word(2).store(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(30));
        0
    })));
    await_word(&sh, 1, Duration::from_secs(10));
    let t = LockTable::open(&path, 64).unwrap();
    assert!(t.lock("S", opts(60_000, 20)).is_err());
    let flagged = t.holders().iter().any(|e| e.waiters);
    assert!(
        flagged,
        "the timed-out waiter left no flag: nothing to test"
    );
    let out = TempPath::new("strace-out");
    let mut st = Spawned(
        std::process::Command::new("strace")
            .process_group(0)
            .args([
                "-f",
                "-e",
                "trace=futex",
                "-o",
                out.0.to_str().unwrap(),
                "-p",
                &h.pid().to_string(),
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(500));
    sh.word(0).store(1, Ordering::SeqCst);
    await_word(&sh, 2, Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(100));
    common::signal::send(st.0.id() as i32, libc::SIGINT);
    let _ = st.0.wait();
    let text = fs::read_to_string(&out.0).unwrap_or_default();
    let wakes = text
        .lines()
        .filter(|l| l.contains("FUTEX_WAKE") && !l.contains("PRIVATE"))
        .count();
    let moved_back = sh.word(3).load(Ordering::SeqCst) as usize;
    note!("[flag left on the hold: {flagged}; shared FUTEX_WAKEs by the holder over 305 renewals + 1001 unlocks: {wakes}; renewals that may have moved the deadline back by more than a tick: {moved_back}] ");
    drop(h);
    let shown: Vec<&str> = text.lines().filter(|l| l.contains("FUTEX_WAKE")).collect();
    assert!(
        wakes <= 1 + moved_back,
        "a stray flag costs a system call per unlock or renewal:\n{}",
        shown.join("\n")
    );
}

// ---------------------------------------------------------------------------------------
// Each way a key frees ends a sleeping waiter's wait: release, force_unlock by a third
// process, many renewals then release (woken: long before W's 2 s step would end), a
// lease left to expire (W's sleep ends at the deadline, not at its step), a SIGKILLed
// holder (W finds it dead at its next step, with the default schedule 2 s into its
// wait).

fn wake_latency(action: u64) -> (Duration, bool) {
    let path = TempPath::new("wake");
    drop(LockTable::open(&path, 64).unwrap());
    let sh = Shared::new(16);
    let h = Proc(Some(fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        let mut g = t
            .lock("W", opts(if action == 3 { 150 } else { 60_000 }, 1000))
            .unwrap();
        sh.word(1).store(1, Ordering::SeqCst);
        await_word(&sh, 0, Duration::from_secs(60));
        match action {
            0 => {
                sh.word(3).store(mono_ns(), Ordering::SeqCst);
                drop(g);
            }
            2 => {
                for _ in 0..100 {
                    g.expire(Some(Duration::from_secs(60))).unwrap();
                }
                sh.word(3).store(mono_ns(), Ordering::SeqCst);
                drop(g);
            }
            3 => {
                g.leave_to_expire();
            }
            _ => {}
        }
        std::thread::sleep(Duration::from_secs(30));
        0
    })));
    await_word(&sh, 1, Duration::from_secs(10));
    let w = Proc(Some(fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        let o = if action == 4 {
            LockOptions {
                exptime: Duration::from_secs(60),
                timeout: Duration::from_secs(10),
                ..LockOptions::default()
            }
        } else {
            LockOptions {
                exptime: Duration::from_secs(60),
                timeout: Duration::from_secs(10),
                step: Duration::from_secs(2),
                max_step: Duration::from_secs(2),
                ..LockOptions::default()
            }
        };
        sh.word(5).store(1, Ordering::SeqCst);
        let g = t.lock("W", o);
        sh.word(7).store(mono_ns(), Ordering::SeqCst);
        sh.word(8)
            .store(if g.is_ok() { 1 } else { 2 }, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(30));
        0
    })));
    await_word(&sh, 5, Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(if action == 4 { 2200 } else { 100 }));
    let t = LockTable::open(&path, 64).unwrap();
    let waiting = t.holders().iter().any(|e| e.waiters);
    match action {
        1 => {
            sh.word(3).store(mono_ns(), Ordering::SeqCst);
            t.force_unlock("W").unwrap();
        }
        3 => {
            sh.word(0).store(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(160));
            // the lease ran out now
            sh.word(3).store(mono_ns(), Ordering::SeqCst);
        }
        4 => {
            sh.word(3).store(mono_ns(), Ordering::SeqCst);
            common::signal::send(h.pid(), libc::SIGKILL);
        }
        _ => sh.word(0).store(1, Ordering::SeqCst),
    }
    let got = await_word(&sh, 8, Duration::from_secs(10)) == 1;
    let at = sh.word(3).load(Ordering::SeqCst);
    let acq = sh.word(7).load(Ordering::SeqCst);
    drop((h, w));
    (Duration::from_nanos(acq.saturating_sub(at)), got && waiting)
}

fn who_wakes() {
    let mut out = Vec::new();
    let mut late = Vec::new();
    // The bound each case must beat, far from the figures it shows (tens of µs for a wake,
    // a clock tick or two after a deadline, up to the 500 ms max_step after a kill): the
    // 2 s step W would otherwise sleep out, or (the kill) the 10 s timeout.
    for (a, name, bound) in [
        (0, "release", 1000),
        (1, "force_unlock by a 3rd process", 1000),
        (2, "100 renewals then release", 1000),
        (3, "lease left to expire (150 ms)", 1000),
        (
            4,
            "holder SIGKILLed, waiter 2.2 s in (default schedule)",
            5000,
        ),
    ] {
        let (d, got) = wake_latency(a);
        // `got` includes that W was seen asleep on the key (its flag on the hold) first
        out.push(format!(
            "{name}: {} after {:.2} ms",
            if got { "got" } else { "NOT got" },
            d.as_secs_f64() * 1e3
        ));
        if !got || d >= Duration::from_millis(bound) {
            late.push(name);
        }
    }
    note!("[{}] ", out.join("; "));
    assert!(
        late.is_empty(),
        "waiters not woken or freed in time: {late:?}"
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
        took < Duration::from_millis(3_500),
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
    let (ok2, took2, cpu2, vol2, _) = stalled(1, 20_000, 100);
    note!(
        "[timeout 100 ms: {} after {:.3} s, cpu {cpu2} ticks, {vol2} switches] ",
        if ok2 { "got" } else { "timed out" },
        took2.as_secs_f64()
    );
    // generous margins over the 500 ms bound and the 100 ms timeout (a loaded machine)
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
    // (one step of 2 s: a sleep not cut at the lease's end ends there)
    let o = LockOptions {
        exptime: Duration::from_secs(60),
        timeout: Duration::from_millis(3_000),
        step: Duration::from_secs(2),
        max_step: Duration::from_secs(2),
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
    // its first step, at 2 s
    assert!(ok && took < Duration::from_millis(1_500));
}

// ---------------------------------------------------------------------------------------
// A holder that renews in a tight loop (each renewal moves the generation twice, and the
// futex half carries it): a waiter must still sleep, not spin on EAGAIN.

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
