//! Attacks of the third adversarial review, with real processes (fork, exec, gdb
//! watchpoints, SIGSTOP/SIGKILL, time namespaces): the two-step steal of an expired or
//! dead holder's key, a hold's full registry generation, and a registration that lasts
//! as long as the process's mapping of the table. Each was run against the code it
//! attacked; those that broke it are regression tests now, and the one that still
//! succeeds is a known limit (`--known-limits` runs it).

mod common;

use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::fork::{fork, Shared};
use common::harness::Test;
use common::probe::{await_word, mapping_base, registry_len, GdbStop, Proc, Stage, Watch};
use common::word::{gen, ident, state, GEN_MASK};
use common::{opts, TempPath};
use shmlock::LockTable;

const TESTS: &[Test] = &[
    Test::new(
        "extending_dead_holder_after_64_registry_reuses_is_freed",
        extending_dead_holder_after_64_registry_reuses_is_freed,
    ),
    Test::new(
        "control_extending_dead_holder_after_63_registry_reuses_is_freed",
        control_extending_dead_holder_after_63_registry_reuses_is_freed,
    ),
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
    Test::new(
        "inspection_names_the_dead_holder_not_the_64th_reuser",
        inspection_names_the_dead_holder_not_the_64th_reuser,
    ),
    Test::new(
        "inspection_shows_a_token_only_on_the_hold_that_took_it",
        inspection_shows_a_token_only_on_the_hold_that_took_it,
    ),
    Test::new(
        "second_order_wrap_frees_a_live_hold",
        second_order_wrap_frees_a_live_hold,
    )
    .known_limit(),
];

fn main() {
    common::harness::run("adversarial3", TESTS, common::harness::no_roles);
}

const K: &str = "K";

// ---------------------------------------------------------------------------------------
// Helpers

// ---------------------------------------------------------------------------------------
// 1. 7feedcc: a dead holder killed mid-renewal (EXTENDING) after its registry entry was
//    reused 64 times. The commit says a waiter judging a HELD *or EXTENDING* entry
//    compares the whole 32-bit generation; the waiter's path for EXTENDING is
//    `recover -> unstick -> env.is_dead(owner)`, 6 bits only.

fn extending_dead_holder(reuses: usize) {
    let path = TempPath::new("ext-wrap");
    let table = LockTable::options()
        .capacity(64)
        .max_processes(2)
        .open(&path)
        .unwrap();
    let watch = Watch::new(path.as_ref());
    let registry_len = registry_len(path.as_ref());
    let shared = Shared::new(8);
    let mut p = Proc::new(fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        // a 600 s lease, renewed below to "never expires" (the watchpoint needs a change)
        let mut g = t.lock(K, opts(600_000, 1_000)).unwrap();
        let (_, slot) = t.debug_placement(K).unwrap();
        let base = mapping_base(&path.0) as u64;
        shared.word(7).store(slot as u64 + 1, Ordering::SeqCst);
        shared.word(1).store(
            base + registry_len + slot as u64 * 64 + 24,
            Ordering::SeqCst,
        );
        await_word(&shared, 0, Duration::from_secs(60));
        shared.word(6).store(1, Ordering::SeqCst); // inside the renewal
        let _ = g.expire(Some(Duration::ZERO)); // renew: never expires
        shared.word(6).store(0, Ordering::SeqCst);
        std::mem::forget(g);
        std::thread::sleep(Duration::from_secs(60));
        0
    }));
    let addr = await_word(&shared, 1, Duration::from_secs(10));
    let slot = (await_word(&shared, 7, Duration::from_secs(1)) - 1) as usize;
    let inside = shared.word(6) as *const AtomicU64 as u64;
    let gdb = GdbStop::attach(
        p.pid(),
        &[
            format!("watch *(long*){addr:#x}"),
            format!("condition 1 *(long*){inside:#x} == 1"),
        ],
    );
    shared.word(0).store(1, Ordering::SeqCst);
    assert!(
        gdb.stopped(Duration::from_secs(30)),
        "P never wrote its deadline"
    );
    let w = watch.control(slot);
    note!(
        "[P stopped after its deadline store; state {} deadline {:#x}] ",
        state(w),
        watch.at(slot, 24).load(Ordering::SeqCst)
    );
    assert_eq!(state(w), 3, "P not stopped in EXTENDING (inconclusive)");
    // SIGKILL while EXTENDING (before gdb goes, so it cannot resume), then reap
    // SAFETY: signalling our own child, unreaped until p.kill(), so its pid is not reused.
    unsafe { libc::kill(p.pid(), libc::SIGKILL) };
    drop(gdb);
    p.kill();
    for _ in 0..reuses {
        let c = fork(|| match LockTable::open(&path, 64) {
            Ok(_) => 0,
            Err(_) => 1,
        });
        assert_eq!(
            c.wait(Duration::from_secs(10)),
            0,
            "a reuser could not open"
        );
    }
    let flag = Shared::new(1);
    let _q = Proc::new(fork(|| {
        let _t = LockTable::open(&path, 64).unwrap();
        flag.word(0).store(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(60));
        0
    }));
    await_word(&flag, 0, Duration::from_secs(10));
    let alive: Vec<_> = table.holders().iter().map(|h| h.owner_alive).collect();
    let reaped = table.reap();
    note!("[reap() freed {reaped}] ");
    let started = Instant::now();
    let got = table.lock(K, opts(0, 3_000));
    note!(
        "[after {} reuses of the dead renewer's entry: holders() says owner_alive={alive:?}; \
         waiter {} in {:?}; slot state now {}] ",
        reuses + 1,
        if got.is_ok() { "took K" } else { "TIMED OUT" },
        started.elapsed(),
        state(watch.control(slot))
    );
    assert!(
        got.is_ok(),
        "a never-expiring key whose holder was SIGKILLed mid-renewal stays EXTENDING for as \
         long as the 64th reuser of its registry entry lives: {:?}",
        got.err()
    );
}

fn extending_dead_holder_after_64_registry_reuses_is_freed() {
    extending_dead_holder(63);
}

fn control_extending_dead_holder_after_63_registry_reuses_is_freed() {
    extending_dead_holder(62);
}

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

// ---------------------------------------------------------------------------------------
// 4. Inspection after 64 reuses: does `holders()` name the dead holder or the live reuser?

fn inspection_names_the_dead_holder_not_the_64th_reuser() {
    let path = TempPath::new("insp-wrap");
    let table = LockTable::options()
        .capacity(64)
        .max_processes(2)
        .open(&path)
        .unwrap();
    let flag = Shared::new(2);
    let mut p = Proc::new(fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        let g = t.lock(K, opts(0, 1_000)).unwrap();
        std::mem::forget(g);
        flag.word(0).store(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(60));
        0
    }));
    await_word(&flag, 0, Duration::from_secs(10));
    let p_pid = p.pid();
    p.kill();
    for _ in 0..63 {
        let c = fork(|| match LockTable::open(&path, 64) {
            Ok(_) => 0,
            Err(_) => 1,
        });
        assert_eq!(c.wait(Duration::from_secs(10)), 0);
    }
    let q = Proc::new(fork(|| {
        let _t = LockTable::open(&path, 64).unwrap();
        flag.word(1).store(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(60));
        0
    }));
    await_word(&flag, 1, Duration::from_secs(10));
    let hs = table.holders();
    let h = &hs[0];
    note!(
        "[dead holder pid {p_pid}, live reuser pid {}; holders(): pid {} owner_alive {}] ",
        q.pid(),
        h.pid,
        h.owner_alive
    );
    assert!(
        h.pid as i32 != q.pid(),
        "inspection names the live 64th reuser as the holder of the dead process's key"
    );
}

// ---------------------------------------------------------------------------------------
// 7. 7feedcc: the lease's upper half is now the registry generation, but the cold line's
//    token label is still `lease ^ owner_bits << 40`, so the generation bits and the owner
//    bits overlap: (entry 0, gen g) and (entry 1, gen g ^ 0x4000) of the same thread
//    number give the same label. Inspection then shows a token on a hold that never took
//    one (the previous holder's).

fn registry_gen(path: &Path, entry: usize) -> u32 {
    use std::os::unix::fs::FileExt;
    let f = fs::File::open(path).unwrap();
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, 4096 + entry as u64 * 32).unwrap();
    (u64::from_le_bytes(b) >> 32) as u32
}

fn inspection_shows_a_token_only_on_the_hold_that_took_it() {
    let path = TempPath::new("label");
    let table = LockTable::options()
        .capacity(64)
        .max_processes(2)
        .open(&path)
        .unwrap();
    // This process (thread number 1 after its first lock) takes K and a token, and lets go.
    let g = table.lock(K, opts(60_000, 1_000)).unwrap();
    let token = g.token();
    let (_, slot) = table.debug_placement(K).unwrap();
    drop(g);
    // which entry is ours?
    let (mine, other) = if registry_gen(&path.0, 0) != 0 && registry_gen(&path.0, 1) == 0 {
        (0usize, 1usize)
    } else {
        (1, 0)
    };
    let g_mine = registry_gen(&path.0, mine);
    // the other entry's generation whose label collided with ours (entry bits << 40
    // overlapped generation bit 14)
    let target = g_mine ^ 0x4000;
    let started = Instant::now();
    // C: opens and drops the table until the other entry is one generation short
    let c = fork(|| loop {
        let now = registry_gen(&path.0, other);
        if now.wrapping_add(1) == target {
            return 0;
        }
        drop(LockTable::open(&path, 64).unwrap());
    });
    assert_eq!(c.wait(Duration::from_secs(300)), 0);
    note!(
        "[{} registrations in {:.1}s] ",
        target - 1,
        started.elapsed().as_secs_f64()
    );
    let flag = Shared::new(2);
    let b = Proc::new(fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        let g = t.lock(K, opts(60_000, 1_000)).unwrap();
        flag.word(1)
            .store(t.debug_placement(K).unwrap().1 as u64 + 1, Ordering::SeqCst);
        std::mem::forget(g);
        flag.word(0).store(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(30));
        0
    }));
    await_word(&flag, 0, Duration::from_secs(10));
    let b_slot = (flag.word(1).load(Ordering::SeqCst) - 1) as usize;
    let hs = table.holders();
    note!(
        "[our entry {mine} gen {g_mine:#x} took token {token:?} in slot {slot}; B on entry \
         {other} gen {:#x} holds K in slot {b_slot} without a token; holders() shows token \
         {:?} for B (pid {})] ",
        registry_gen(&path.0, other),
        hs.first().and_then(|h| h.token),
        b.pid()
    );
    assert_eq!(b_slot, slot, "inconclusive: another slot");
    assert!(
        hs.first().is_some_and(|h| h.token.is_none()),
        "inspection shows the previous holder's token on a hold that never took one"
    );
}

// ---------------------------------------------------------------------------------------
// 8. 80a1247: the second-order wrap the README lists as a known limit, tried for real.
//    S3 looks at this process's expired hold H1 (word w) and is stopped before its freeze
//    CAS; S1 freezes H1 (STEALING) and is stopped inside resolve_steal after reading the
//    fields, before its check of the word. This process ends the steal (its release of
//    H1 finds it expired), takes K again (H2, 600 s) and renews H2 until its word is w
//    again (26-bit gen: ~0.8 s in release). S3 resumes: its freeze of H2 succeeds (its CAS
//    is from w) and it is stopped right after. S1 resumes: the word is its frozen word, so
//    it frees H2 on H1's fields. Does S1 then hold K while this process holds H2?

fn second_order_wrap_frees_a_live_hold() {
    if cfg!(debug_assertions) {
        println!("(needs --release: 2^25 renewals) ");
        return;
    }
    let path = TempPath::new("wrap2");
    let table = LockTable::open(&path, 64).unwrap();
    let watch = Watch::new(path.as_ref());
    let registry_len = registry_len(path.as_ref());
    let a = table
        .try_lock_with_lease(K, Duration::from_millis(1))
        .unwrap()
        .unwrap();
    let (_, slot) = table.debug_placement(K).unwrap();
    let wa = watch.control(slot);
    std::thread::sleep(Duration::from_millis(20)); // H1 runs out
    let shared = Shared::new(16);
    // S3: stopped after its look (deadline read), then after its freeze
    let mut s3 = Proc::new(fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        let base = mapping_base(&path.0) as u64 + registry_len + slot as u64 * 64;
        shared.word(1).store(base, Ordering::SeqCst);
        await_word(&shared, 0, Duration::from_secs(60));
        let g = t.lock(K, opts(60_000, 20_000));
        shared
            .word(3)
            .store(if g.is_ok() { 1 } else { 2 }, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(30));
        0
    }));
    let base3 = await_word(&shared, 1, Duration::from_secs(10));
    let gdb3 = GdbStop::attach_stages(
        s3.pid(),
        &[
            Stage::new(&[format!("rwatch *(long*){:#x}", base3 + 24)]),
            Stage::new(&[
                "delete".to_string(),
                format!("watch *(long*){base3:#x}"),
                format!("condition 2 (*(long*){base3:#x} & 7) == 5"),
            ]),
        ],
    );
    shared.word(0).store(1, Ordering::SeqCst);
    assert!(gdb3.reached(0, Duration::from_secs(30)), "S3 never looked");
    assert_eq!(watch.control(slot), wa, "inconclusive (S3)");
    // S1: freezes H1, stopped after reading the lease in resolve_steal
    let mut s1 = Proc::new(fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        let base = mapping_base(&path.0) as u64 + registry_len + slot as u64 * 64;
        shared.word(5).store(base, Ordering::SeqCst);
        await_word(&shared, 4, Duration::from_secs(60));
        let g = t.lock(K, opts(60_000, 20_000));
        shared
            .word(6)
            .store(if g.is_ok() { 1 } else { 2 }, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(30));
        0
    }));
    let base1 = await_word(&shared, 5, Duration::from_secs(10));
    let gdb1 = GdbStop::attach(s1.pid(), &[format!("rwatch *(long*){:#x}", base1 + 32)]);
    shared.word(4).store(1, Ordering::SeqCst);
    assert!(gdb1.stopped(Duration::from_secs(30)), "S1 never froze");
    let w1 = watch.control(slot);
    note!(
        "[S3 stopped before its freeze; S1 stopped in resolve_steal, word state {}] ",
        state(w1)
    );
    assert_eq!(state(w1), 5, "inconclusive (S1)");
    // this process ends the steal (H1 expired), takes K again and wraps the word round
    let ra = a.unlock();
    let started = Instant::now();
    let mut b = table
        .try_lock_with_lease(K, Duration::from_secs(600))
        .unwrap()
        .unwrap();
    for _ in 0..100 {
        let sb = table.debug_placement(K).unwrap().1;
        if sb == slot && gen(wa).wrapping_sub(gen(watch.control(slot))) & GEN_MASK & 1 == 0 {
            break;
        }
        drop(b);
        std::thread::sleep(Duration::from_millis(5));
        b = table
            .try_lock_with_lease(K, Duration::from_secs(600))
            .unwrap()
            .unwrap();
    }
    let steps = gen(wa).wrapping_sub(gen(watch.control(slot))) & GEN_MASK;
    assert_eq!(steps & 1, 0, "inconclusive: odd distance");
    for _ in 0..steps / 2 {
        b.expire(Some(Duration::from_secs(600))).unwrap();
    }
    let wb = watch.control(slot);
    note!(
        "[H1's unlock {ra:?}; {:.2}s of renewals; H2's word {} H1's] ",
        started.elapsed().as_secs_f64(),
        if ident(wb) == ident(wa) {
            "equals"
        } else {
            "DIFFERS from"
        }
    );
    assert_eq!(ident(wb), ident(wa), "inconclusive (wrap)");
    // S3 resumes and freezes H2
    gdb3.resume(0);
    assert!(
        gdb3.reached(1, Duration::from_secs(30)),
        "S3 never froze H2"
    );
    let w3 = watch.control(slot);
    note!("[S3 froze H2: state {}] ", state(w3));
    // S1 resumes
    gdb1.release();
    std::thread::sleep(Duration::from_millis(200));
    let s1_got = shared.word(6).load(Ordering::SeqCst) == 1;
    let b_renews = b.expire(Some(Duration::from_secs(600)));
    gdb3.resume(1);
    note!(
        "[S1 {} K; this process's H2 then renews: {b_renews:?}] ",
        if s1_got { "TOOK" } else { "did not take" }
    );
    s1.kill();
    s3.kill();
    assert!(
        !s1_got,
        "two live holders: S1 freed the live H2 once the word came round and S3 froze it"
    );
}
