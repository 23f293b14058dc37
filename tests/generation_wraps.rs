//! A second round of real-process attacks on the liveness design (issue 12): the promises
//! "a key never has two live holders at once", "nothing wedges forever" and "fencing
//! tokens only grow", against what the first round (`tests/adversarial.rs`) did not try:
//! the 26-bit generation of a slot's control word and the 6-bit registry generation an
//! owner id carries wrapping around, a process that closes its descriptors after opening
//! a table, the table file unlinked while in use, exec and posix_spawn while holding, a
//! raw `clone` child, several paths to one file, a table on a disk filesystem, a forked
//! child that finds the registry full, and tokens across re-creating the file.
//!
//! `adversarial2 FILTER` runs the tests whose name contains FILTER. Tests that need a
//! release build (tens of millions of lock operations) say so and are skipped in debug
//! builds: run them with `cargo test --release --test adversarial2`.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::fork::{fork, Shared};
use common::harness::Test;
use common::probe::{await_word, mapping_base, registry_len, GdbStop, Proc, Watch};
use common::word::{gen, ident, state, GEN_MASK};
use common::{opts, TempPath};
use shmlock::{Error, LockTable};

const TESTS: &[Test] = &[
    Test::new(
        "an_expired_guard_never_frees_a_later_hold_of_its_thread_after_the_generation_wraps",
        an_expired_guard_never_frees_a_later_hold_of_its_thread_after_the_generation_wraps,
    )
    .release_only(),
    Test::new(
        "a_claimer_stopped_before_its_direct_claim_never_publishes_stale_fields",
        a_claimer_stopped_before_its_direct_claim_never_publishes_stale_fields,
    )
    .release_only(),
    Test::new(
        "a_waiter_stopped_before_stealing_an_expired_hold_never_frees_a_fresh_one",
        a_waiter_stopped_before_stealing_an_expired_hold_never_frees_a_fresh_one,
    )
    .release_only(),
    Test::new(
        "a_dead_holders_key_is_freed_after_its_registry_entry_was_reused_64_times",
        a_dead_holders_key_is_freed_after_its_registry_entry_was_reused_64_times,
    ),
    Test::new(
        "control_a_dead_holders_key_is_freed_after_its_registry_entry_was_reused_63_times",
        control_a_dead_holders_key_is_freed_after_its_registry_entry_was_reused_63_times,
    ),
];

fn main() {
    common::harness::run("adversarial2", TESTS, common::harness::no_roles);
}

const K: &str = "K";

// ---------------------------------------------------------------------------------------
// 1. The slot's 26-bit generation wraps under one thread's own holds

/// A thread's guard A on K runs out its lease; the same thread then takes K again (guard B,
/// stealing the expired hold, in the same slot) and keeps B for a while, renewing it. Every
/// renewal moves the slot's 26-bit `gen` on by two; the owner id (this process's
/// registration) and the lease (the thread's number, the same for all its holds) never
/// change. After 2^25 renewals B's word is bit for bit the word A took. Dropping A then
/// must report `Expired` and leave B alone: a "successful" release of A frees B's hold
/// under its holder, and another process takes K while B still holds it.
fn an_expired_guard_never_frees_a_later_hold_of_its_thread_after_the_generation_wraps() {
    let path = TempPath::new("gen-wrap");
    let table = LockTable::open(&path, 64).unwrap();
    let watch = Watch::new(path.as_ref());
    let a = table
        .try_lock_with_lease(K, Duration::from_millis(1))
        .unwrap()
        .unwrap();
    let (_, slot) = table.debug_placement(K).unwrap();
    let wa = watch.control(slot);
    assert_eq!(state(wa), 2, "A's entry is HELD");
    std::thread::sleep(Duration::from_millis(20)); // A's lease runs out
    let mut b = table
        .try_lock_with_lease(K, Duration::from_secs(600))
        .unwrap()
        .expect("the expired hold is taken");
    // B must sit in A's slot at an even distance (in transitions) from A's word.
    for _ in 0..100 {
        let (_, sb) = table.debug_placement(K).unwrap();
        let wb = watch.control(sb);
        if sb == slot && gen(wa).wrapping_sub(gen(wb)) & GEN_MASK & 1 == 0 {
            break;
        }
        drop(b);
        std::thread::sleep(Duration::from_millis(5)); // another clock tick: 3 transitions
        b = table
            .try_lock_with_lease(K, Duration::from_secs(600))
            .unwrap()
            .unwrap();
    }
    let wb = watch.control(slot);
    let tb = b.token().expect("B's token");
    let steps = gen(wa).wrapping_sub(gen(wb)) & GEN_MASK;
    assert_eq!(steps & 1, 0, "could not place B at an even distance");
    let started = Instant::now();
    for _ in 0..steps / 2 {
        b.expire(Some(Duration::from_secs(600))).unwrap();
    }
    let now = watch.control(slot);
    note!(
        "[{} renewals in {:.2}s; B's word {} A's] ",
        steps / 2,
        started.elapsed().as_secs_f64(),
        if ident(now) == ident(wa) {
            "equals"
        } else {
            "differs from"
        }
    );
    // The expired guard asks for a fencing token: it must get none (B holds K).
    let ta = a.token();
    let released = a.unlock();
    let after = watch.control(slot);
    // Does anyone else get K while B still holds it?
    let flag = Shared::new(1);
    let child = fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        let got = t
            .try_lock_with_lease(K, Duration::from_secs(60))
            .unwrap()
            .is_some();
        flag.word(0)
            .store(if got { 1 } else { 2 }, Ordering::SeqCst);
        0
    });
    assert_eq!(child.wait(Duration::from_secs(10)), 0);
    let other_got_k = flag.word(0).load(Ordering::SeqCst) == 1;
    let b_renews = b.expire(Some(Duration::from_secs(600)));
    note!(
        "[A's token {ta:?} (B's {tb}); A's unlock: {released:?}; slot state after it {}; \
         another process {} K; B's next renewal {b_renews:?}] ",
        state(after),
        if other_got_k { "GOT" } else { "was refused" }
    );
    assert_eq!(
        ta, None,
        "an expired guard got a fencing token above the live holder's ({tb})"
    );
    assert!(
        matches!(released, Err(Error::Expired)),
        "an expired guard's unlock succeeded on a later hold's word (gen wrapped): {released:?}"
    );
    assert!(
        !other_got_k,
        "another process took K while this thread's later guard still held it"
    );
}

/// Process P locks and unlocks K in a loop; within one clock tick its fast path finds the
/// free home's fields already right (`fields_say`) and publishes HELD with its one CAS from
/// the free word it read. P is stopped (by a debugger, standing in for SIGSTOP or a paused
/// VM) right after that check read the slot's fields, before the CAS. Meanwhile other
/// holders of K move the slot on by exactly 2^26 transitions, leaving it free again, with
/// their own fields (a lease of 1 ms). Free words carry no owner and no tag, so the word
/// is bit for bit the one P read. P resumes: its CAS must not publish a hold whose fields
/// it checked before the stop (another holder's deadline, already past): else P's `lock`
/// returns a 60 s lease that everyone else sees expired, and a second process takes K.
fn a_claimer_stopped_before_its_direct_claim_never_publishes_stale_fields() {
    if std::process::Command::new("gdb")
        .arg("--version")
        .output()
        .is_err()
    {
        panic!("needs gdb");
    }
    let path = TempPath::new("stale-direct");
    let table = LockTable::open(&path, 64).unwrap();
    let watch = Watch::new(path.as_ref());
    // K's home (where every uncontended hold of K sits)
    let (home, slot) = {
        let g = table
            .try_lock_with_lease(K, Duration::from_secs(1))
            .unwrap()
            .unwrap();
        let p = table.debug_placement(K).unwrap();
        drop(g);
        p
    };
    assert_eq!(home, slot);
    let registry_len = registry_len(path.as_ref());
    let shared = Shared::new(8);
    let mut p = Proc::new(fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        let base = mapping_base(&path.0) as u64;
        // acquired_at: the last field `fields_say` reads
        shared.word(1).store(
            base + registry_len + slot as u64 * 64 + 40,
            Ordering::SeqCst,
        );
        await_word(&shared, 0, Duration::from_secs(60));
        loop {
            // Word 6 says "inside an acquisition": the debugger stops only on reads of
            // the field made there (a release reads it too, to check the hold is its).
            shared.word(6).store(1, Ordering::SeqCst);
            let g = t.try_lock_with_lease(K, Duration::from_secs(60)).unwrap();
            shared.word(6).store(0, Ordering::SeqCst);
            if shared.word(2).load(Ordering::SeqCst) != 0 {
                // The acquisition that was stopped midway has returned.
                let Some(g) = g else {
                    shared.word(3).store(2, Ordering::SeqCst);
                    return 0;
                };
                shared.word(3).store(1, Ordering::SeqCst);
                await_word(&shared, 4, Duration::from_secs(30));
                let r = g.unlock();
                shared
                    .word(5)
                    .store(if r.is_ok() { 1 } else { 2 }, Ordering::SeqCst);
                return 0;
            }
            drop(g);
        }
    }));
    let addr = await_word(&shared, 1, Duration::from_secs(10));
    let inside = shared.word(6) as *const AtomicU64 as u64;
    let gdb = GdbStop::attach(
        p.pid(),
        &[
            format!("rwatch *(long*){addr:#x}"),
            format!("condition 1 *(long*){inside:#x} == 1"),
        ],
    );
    shared.word(0).store(1, Ordering::SeqCst);
    assert!(
        gdb.stopped(Duration::from_secs(30)),
        "P never read the fields"
    );
    let w0 = watch.control(slot);
    note!("[P stopped; slot word {w0:#x}, state {}] ", state(w0));
    assert_eq!(
        state(w0),
        0,
        "P was not stopped on a free home (inconclusive)"
    );
    // Move the slot on by 2^26 transitions with holds of our own, ending free.
    let target = gen(w0);
    let started = Instant::now();
    loop {
        let mut b = table
            .try_lock_with_lease(K, Duration::from_secs(600))
            .unwrap()
            .unwrap();
        assert_eq!(table.debug_placement(K).unwrap().1, slot);
        let h = gen(watch.control(slot));
        let r = target.wrapping_sub(h) & GEN_MASK; // transitions left, the last a release
        if r & 1 == 1 && r >= 3 {
            for _ in 0..(r - 1) / 2 - 1 {
                b.expire(Some(Duration::from_secs(600))).unwrap();
            }
            b.expire(Some(Duration::from_millis(1))).unwrap();
            b.unlock().unwrap();
            break;
        }
        drop(b);
        std::thread::sleep(Duration::from_millis(5));
    }
    let w1 = watch.control(slot);
    note!(
        "[{:.2}s of holds; slot word {w1:#x} {} the one P read] ",
        started.elapsed().as_secs_f64(),
        if w1 == w0 { "is" } else { "is NOT" }
    );
    assert_eq!(w1, w0, "could not bring the word back (inconclusive)");
    shared.word(2).store(1, Ordering::SeqCst);
    gdb.release();
    let p_holds = await_word(&shared, 3, Duration::from_secs(10)) == 1;
    std::thread::sleep(Duration::from_millis(20));
    let other = table
        .try_lock_with_lease(K, Duration::from_secs(60))
        .unwrap();
    let both = p_holds && other.is_some();
    shared.word(4).store(1, Ordering::SeqCst);
    let p_unlock = await_word(&shared, 5, Duration::from_secs(10));
    drop(other);
    p.kill();
    note!(
        "[P's lock returned {}; 20 ms later this process {} K; P's unlock {}] ",
        if p_holds { "a 60 s hold" } else { "busy" },
        if both { "ALSO took" } else { "could not take" },
        if p_unlock == 1 { "Ok" } else { "Expired" }
    );
    assert!(
        !both,
        "two live holders: a claim stopped between its field check and its CAS published \
         another holder's stale fields once the free word came back"
    );
}

/// This process holds K with a 1 ms lease and lets it run out. A waiter W finds the hold
/// expired and is stopped (by a debugger) right after reading its deadline, before its
/// stealing CAS. Meanwhile this process takes K again (the same owner, thread and key)
/// and renews the new hold until the slot's 26-bit gen has come round: the word is bit for
/// bit the expired one W read, but the lease is fresh (600 s). W resumes: its CAS must
/// not free the live hold (else W takes K while this process holds it).
fn a_waiter_stopped_before_stealing_an_expired_hold_never_frees_a_fresh_one() {
    if std::process::Command::new("gdb")
        .arg("--version")
        .output()
        .is_err()
    {
        panic!("needs gdb");
    }
    let path = TempPath::new("stale-steal");
    let table = LockTable::open(&path, 64).unwrap();
    let watch = Watch::new(path.as_ref());
    let a = table
        .try_lock_with_lease(K, Duration::from_millis(1))
        .unwrap()
        .unwrap();
    let (_, slot) = table.debug_placement(K).unwrap();
    let wa = watch.control(slot);
    std::thread::sleep(Duration::from_millis(20)); // A runs out
    let registry_len = registry_len(path.as_ref());
    let shared = Shared::new(8);
    let mut w = Proc::new(fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        let base = mapping_base(&path.0) as u64;
        // the deadline, which the waiter reads to find the hold expired
        shared.word(1).store(
            base + registry_len + slot as u64 * 64 + 24,
            Ordering::SeqCst,
        );
        await_word(&shared, 0, Duration::from_secs(60));
        let g = t.try_lock_with_lease(K, Duration::from_secs(60)).unwrap();
        shared
            .word(3)
            .store(if g.is_some() { 1 } else { 2 }, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(30));
        0
    }));
    let addr = await_word(&shared, 1, Duration::from_secs(10));
    let gdb = GdbStop::attach(w.pid(), &[format!("rwatch *(long*){addr:#x}")]);
    shared.word(0).store(1, Ordering::SeqCst);
    assert!(
        gdb.stopped(Duration::from_secs(30)),
        "W never read the deadline"
    );
    assert_eq!(
        watch.control(slot),
        wa,
        "W was stopped elsewhere (inconclusive)"
    );
    // Take K again and bring the slot's word round to A's, with a fresh lease.
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
    assert_eq!(steps & 1, 0, "could not place B at an even distance");
    for _ in 0..steps / 2 {
        b.expire(Some(Duration::from_secs(600))).unwrap();
    }
    let wb = watch.control(slot);
    note!(
        "[{:.2}s of renewals; the fresh hold's word {} the expired one W read] ",
        started.elapsed().as_secs_f64(),
        if ident(wb) == ident(wa) {
            "equals"
        } else {
            "DIFFERS from"
        }
    );
    assert_eq!(ident(wb), ident(wa), "inconclusive");
    gdb.release();
    let w_got = await_word(&shared, 3, Duration::from_secs(10)) == 1;
    let b_renews = b.expire(Some(Duration::from_secs(600)));
    drop(a);
    w.kill();
    note!(
        "[W {} K; this process's fresh hold then renews: {b_renews:?}] ",
        if w_got { "TOOK" } else { "did not take" }
    );
    assert!(
        !w_got,
        "two live holders: a waiter stopped before its stealing CAS freed a fresh 600 s hold \
         whose word had come round to the expired one it read"
    );
}

// ---------------------------------------------------------------------------------------
// 2. The registry generation an owner id carries is 6 bits

/// Process P takes K with no expiry and is SIGKILLed. Its registry entry is then taken and
/// left by `reuses` short-lived processes, and a last one, Q, takes it and stays. With
/// `reuses` = 63, Q's generation has the same low 6 bits as P's: a waiter must still see
/// P dead (K is free at once), not take Q's live registration for P's.
fn dead_holder_after_reuses(reuses: usize) {
    let path = TempPath::new("reg-wrap");
    // Two entries: this process takes one, so every child takes the other.
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
    let _q = Proc::new(fork(|| {
        let _t = LockTable::open(&path, 64).unwrap();
        flag.word(1).store(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(60));
        0
    }));
    await_word(&flag, 1, Duration::from_secs(10));
    let started = Instant::now();
    let got = table.lock(K, opts(0, 2_000));
    note!(
        "[after {} reuses of the dead holder's entry, waiter: {} in {:?}] ",
        reuses + 1,
        if got.is_ok() { "took K" } else { "TIMED OUT" },
        started.elapsed()
    );
    assert!(
        got.is_ok(),
        "a dead holder's never-expiring key stays held while a live process reuses its \
         registry entry with the same low 6 generation bits: {:?}",
        got.err()
    );
}

fn a_dead_holders_key_is_freed_after_its_registry_entry_was_reused_64_times() {
    dead_holder_after_reuses(63);
}

fn control_a_dead_holders_key_is_freed_after_its_registry_entry_was_reused_63_times() {
    dead_holder_after_reuses(62);
}
