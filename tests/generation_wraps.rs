//! Generation wraps: a word that comes round to a value it had before is never taken for
//! the word it was. A slot's control word carries a 26-bit generation: an expired guard, a
//! claimer stopped before its one-CAS claim and a waiter stopped before its stealing CAS
//! each meet a word that came round after 2^25 or 2^26 transitions, and none of them may
//! free, or publish over, the live hold it finds there. An owner id carries 6 bits of its
//! registry entry's generation: a dead holder (holding, or killed mid-renewal) is still
//! dead after its entry was reused 63 or 64 times, and inspection names it, and the token
//! it took, rather than the live reuser. Two known limits (run with `--known-limits`): a
//! second-order wrap with two stealers stopped at chosen instructions, and a late sleeper
//! whose futex compares only 23 bits of the generation.
//!
//! Exercises `src/shm/slot.rs` (the control word), `src/shm/table/` (`claim.rs`, `recover.rs`: claim, steal,
//! renewal, release), `src/shm/registry.rs` (owner ids and generations),
//! `src/shm/lock_table.rs` (inspection) and `src/shm/futex.rs`.
//!
//! `generation_wraps FILTER` runs the tests whose name contains FILTER; `generation_wraps
//! --list` lists them. Tests that need a release build (tens of millions of lock
//! operations) say so and are skipped in debug builds: `cargo test --release --test
//! generation_wraps` runs them, as `scripts/test.sh` does. gdb stops processes at exact
//! instructions (`scripts/test-tools.sh` installs it).

mod common;

use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::fork::{fork, Shared};
use common::harness::Test;
use common::probe::{
    await_word, flagging_waiter, header_u64, mapping_base, mono_ns, place, registry_len,
    require_gdb, GdbStop, Proc, Stage, Watch,
};
use common::word::{gen, ident, state, GEN_MASK};
use common::{opts, TempPath};
use shmlock::{Error, LockOptions, LockTable};

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
    Test::new(
        "extending_dead_holder_after_64_registry_reuses_is_freed",
        extending_dead_holder_after_64_registry_reuses_is_freed,
    ),
    Test::new(
        "control_extending_dead_holder_after_63_registry_reuses_is_freed",
        control_extending_dead_holder_after_63_registry_reuses_is_freed,
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
    // A known limit: the futex sees 23 bits of the generation.
    Test::new(
        "a_late_sleeper_is_refused_its_sleep_after_a_generation_wrap",
        gen_wrap_lost_wakeup,
    )
    .known_limit()
    .release_only(),
];

fn main() {
    common::harness::run("generation_wraps", TESTS, common::harness::no_roles);
}

const K: &str = "K";

// ---------------------------------------------------------------------------------------
// The slot's 26-bit generation wraps under one thread's own holds

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
    require_gdb();
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
    require_gdb();
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
// The registry generation an owner id carries is 6 bits

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

// ---------------------------------------------------------------------------------------
// A dead holder killed mid-renewal (EXTENDING) after its registry entry was reused 64
// times: a waiter judges an EXTENDING entry as it judges a HELD one, on the whole 32-bit
// generation the hold recorded (also on its way through recovery, `recover -> unstick`),
// not on the 6 bits of the owner id.

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
    common::signal::send(p.pid(), libc::SIGKILL);
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
    let reaped = table.reap().unwrap();
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
// Inspection after 64 reuses: `holders()` names the dead holder, not the live reuser

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
// The token that inspection shows belongs to the hold that took it. A hold's lease carries
// the registry generation in its upper half; a token label of `lease ^ owner_bits << 40`
// would make generation and owner bits overlap: (entry 0, gen g) and (entry 1, gen
// g ^ 0x4000) of the same thread number would get one label, and inspection would show the
// previous holder's token on a hold that never took one.

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
// The second-order wrap, a documented known limit, tried for real.
// S3 looks at this process's expired hold H1 (word w) and is stopped before its freeze
// CAS; S1 freezes H1 (STEALING) and is stopped inside resolve_steal after reading the
// fields, before its check of the word. This process ends the steal (its release of
// H1 finds it expired), takes K again (H2, 600 s) and renews H2 until its word is w
// again (26-bit gen: ~0.8 s in release). S3 resumes: its freeze of H2 succeeds (its CAS
// is from w) and it is stopped right after. S1 resumes: the word is its frozen word, so
// it frees H2 on H1's fields. Does S1 then hold K while this process holds H2?

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

// ---------------------------------------------------------------------------------------
// A known limit: the lost wake-up of `tests/wakeups.rs` (W stopped by gdb at the entry of
// its FUTEX_WAIT on H's flagged hold of K1; H releases K1 and takes K2 in the same slot; X
// flags K2's hold), except that H then cycles K2 until the slot's generation has come
// round 2^23 transitions to W's value (the low half holds only 23 bits of it): the low
// halves are equal again, the kernel lets W sleep, and W sleeps its whole step while K1 is
// free.

fn gen_wrap_lost_wakeup() {
    let path = TempPath::new("genwrap");
    drop(LockTable::open(&path, 64).unwrap());
    let seed = header_u64(&path.0, 32);
    let n = header_u64(&path.0, 16);
    // two keys of one home (any tags)
    let mut seen = std::collections::HashMap::new();
    let (k1, k2) = (0..200_000)
        .find_map(|i| {
            let k = format!("g:{i}");
            let (home, _) = place(seed, n, &k);
            seen.insert(home, k.clone()).map(|prev| (prev, k))
        })
        .unwrap();
    let (home, _) = place(seed, n, &k1);
    let slot = home as usize;
    let watch = Watch::new(&path.0);
    let rlen = registry_len(&path.0);
    let shared: &'static Shared = Box::leak(Box::new(Shared::new(16)));
    let step = Duration::from_millis(400);
    let (pk1, pk2, pp) = (k1.clone(), k2.clone(), path.0.clone());
    // H: holds K1; on word 0 == target+1: releases K1 (time in word 3), then cycles K2 in
    // the same slot until a HELD word of generation low bits == target, and keeps it.
    let h = Proc(Some(fork(move || {
        let t = LockTable::open(&pp, 64).unwrap();
        let w = Watch::new(&pp);
        let o = LockOptions {
            exptime: Duration::from_secs(60),
            timeout: Duration::from_secs(1),
            ..LockOptions::default()
        };
        let g1 = t.lock(&pk1, o).unwrap();
        shared.word(1).store(1, Ordering::SeqCst);
        let target = await_word(shared, 0, Duration::from_secs(60)) - 1;
        let at = mono_ns();
        drop(g1);
        shared.word(3).store(at, Ordering::SeqCst);
        let mut cycles = 0u64;
        let started = Instant::now();
        loop {
            let g = t.lock(&pk2, o).unwrap();
            let c = w.at(slot, 0).load(Ordering::Relaxed);
            cycles += 1;
            if c & 7 == 2 && (c >> 9) & ((1 << 23) - 1) == target {
                shared.word(9).store(cycles, Ordering::SeqCst);
                shared
                    .word(10)
                    .store(started.elapsed().as_millis() as u64 + 1, Ordering::SeqCst);
                shared.word(4).store(
                    t.debug_placement(&pk2).unwrap().1 as u64 + 1,
                    Ordering::SeqCst,
                );
                std::thread::sleep(Duration::from_secs(30));
                drop(g);
                break;
            }
            drop(g);
            if started.elapsed() > Duration::from_secs(20) {
                shared.word(11).store(1, Ordering::SeqCst);
                break;
            }
        }
        0
    })));
    await_word(shared, 1, Duration::from_secs(10));
    let pw = path.0.clone();
    let wk1 = k1.clone();
    let w = Proc(Some(fork(move || {
        let t = LockTable::open(&pw, 64).unwrap();
        let addr = mapping_base(&pw) as u64 + rlen + slot as u64 * 64;
        shared.word(5).store(addr, Ordering::SeqCst);
        await_word(shared, 6, Duration::from_secs(60));
        let o = LockOptions {
            exptime: Duration::from_secs(60),
            timeout: Duration::from_secs(5),
            step,
            max_step: step,
            ..LockOptions::default()
        };
        let g = t.lock(&wk1, o);
        shared.word(7).store(mono_ns(), Ordering::SeqCst);
        shared
            .word(8)
            .store(if g.is_ok() { 1 } else { 2 }, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(30));
        0
    })));
    let addr = await_word(shared, 5, Duration::from_secs(10));
    let mut gdb = Some(GdbStop::at_futex(w.pid(), addr));
    shared.word(6).store(1, Ordering::SeqCst);
    assert!(
        gdb.as_ref().unwrap().stopped(Duration::from_secs(30)),
        "W never reached its futex wait"
    );
    let w1 = watch.at(slot, 0).load(Ordering::SeqCst);
    assert_eq!(w1 & 7, 2, "inconclusive: not held");
    assert_ne!(w1 & 8, 0, "inconclusive: not flagged");
    let target = (w1 >> 9) & ((1 << 23) - 1);
    shared.word(0).store(target + 1, Ordering::SeqCst);
    let s2 = await_word(shared, 4, Duration::from_secs(25)) - 1;
    assert_eq!(s2 as usize, slot, "inconclusive: K2 landed elsewhere");
    // X: a waiter of K2 flags H's hold of K2
    let _x = flagging_waiter(&path.0, &k2, &watch, slot);
    let w2 = watch.at(slot, 0).load(Ordering::SeqCst);
    note!(
        "[K1 {k1:?}, K2 {k2:?} share home {home}; W stopped at FUTEX_WAIT expecting {:#x} \
         (word {w1:#x}); H cycled K2 {} times ({} ms) to word {w2:#x}: low halves {}] ",
        w1 as u32,
        shared.word(9).load(Ordering::SeqCst),
        shared.word(10).load(Ordering::SeqCst) - 1,
        if w1 as u32 == w2 as u32 {
            "EQUAL"
        } else {
            "differ"
        }
    );
    let released = shared.word(3).load(Ordering::SeqCst);
    let resumed = mono_ns();
    gdb.take().unwrap().release();
    let got = await_word(shared, 8, Duration::from_secs(10));
    let acquired = shared.word(7).load(Ordering::SeqCst);
    let after_resume = Duration::from_nanos(acquired.saturating_sub(resumed));
    note!(
        "[W {} K1 {:.1} ms after it was resumed ({:.1} s after H released K1)] ",
        if got == 1 { "got" } else { "did NOT get" },
        after_resume.as_secs_f64() * 1e3,
        Duration::from_nanos(acquired - released).as_secs_f64()
    );
    drop(h);
    drop(w);
    assert!(got == 1);
    assert!(
        after_resume < Duration::from_millis(200),
        "lost wake-up: W slept its step on K2's hold while K1 was free"
    );
}
