//! Stalls: a process stopped (SIGSTOP, a debugger, an overloaded machine) or killed at any
//! point of the slot protocol never wedges a key and never makes two live holders. A claim
//! stopped midway is broken after the stall bound (about 0.5 s): for a waiter that watches
//! it, for short-lived pollers that each look only once, and for two stopped claims whose
//! homes are 64 slots apart. An opener stopped while attaching holds nobody up. A stealer
//! stopped or killed right after freezing a hold, and a claimer stopped or killed between
//! publishing its claim and counting it, neither wedge the key nor take it from whoever
//! holds it next. Claimers killed mid-claim (also as pid 1 of a new pid namespace) leave
//! nothing behind.
//!
//! Exercises `src/shm/table/` (`claim.rs`, `recover.rs`: claiming and stealing, recovery, the stall bound),
//! `src/shm/attachment.rs` (the stall memory), `src/shm/file.rs` (attaching) and
//! `src/shm/registry.rs` (the killed judged dead). Stopped claimers and renewers watched
//! through `holders()` are in `tests/liveness.rs`, a waiter's timeout on a stalled entry in
//! `tests/wakeups.rs`.
//!
//! `stalls FILTER` runs the tests whose name contains FILTER; `stalls --list` lists them;
//! the root-only one runs with `--include-ignored` as root. gdb stops processes at exact
//! instructions (`scripts/test-tools.sh` installs it).

mod common;

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::fork::{fork, xorshift, Shared};
use common::harness::{require_root, Test};
use common::probe::{
    await_word, cont, header_u64, mapping_base, mono_ns, place, proc_state, registry_len, stop,
    GdbStop, Proc, Watch,
};
use common::word::state;
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
        "a_claimer_stopped_between_publish_and_count_takes_no_held_key",
        stopped_between_publish_and_count,
    ),
    Test::new(
        "a_claimer_killed_between_publish_and_count_leaves_the_key_free",
        killed_between_publish_and_count,
    ),
];

fn main() {
    common::harness::run("stalls", TESTS, common::harness::no_roles);
}

const K: &str = "K";

// ---------------------------------------------------------------------------------------
// Claimers caught mid-claim

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
// An opener stopped while attaching

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
// Two claims stopped at once, 64 slots apart (and, as a control, 32): each is broken after
// the bound, neither hiding the other's stall

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
// A stopped claim and short-lived pollers, none of which watches it for the whole bound

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
// Claimers killed mid-claim, twenty times over (`claim_loop` alternates two leases, so
// that its claims go through CLAIMING)

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
        common::signal::send(pid, libc::SIGKILL);
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

// ---------------------------------------------------------------------------------------
// A stealer stopped or killed right after its freezing CAS (HELD -> STEALING).
// A hardware watchpoint on the slot's control word stops it at the first store that
// leaves the state STEALING.

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
    common::signal::send(s.pid(), libc::SIGKILL);
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
    common::signal::send(s.pid(), libc::SIGKILL);
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
// A slow claimer X of K stopped (gdb watchpoint) right after publishing its CLAIMING
// entry in a release hole (no reach raised) and before counting it at the home. A rival
// Y of K waits, breaks X's claim after 500 ms, claims the next hole (no raise) and, as
// nobody counted since its read, skips pass 2. Then X resumes and counts. Or X is
// SIGKILLed there instead. Nobody may hold K while Y does.

fn claimer_stopped_between_publish_and_count(kill: bool) {
    let path = TempPath::new("pubcount");
    drop(LockTable::open(&path, 64).unwrap());
    let seed = header_u64(&path.0, 32);
    let n = header_u64(&path.0, 16);
    let mut by_home: std::collections::HashMap<u64, Vec<String>> = Default::default();
    let keys = (0..1_000_000)
        .find_map(|i| {
            let k = format!("pc:{i}");
            let (home, _) = place(seed, n, &k);
            let v = by_home.entry(home).or_default();
            v.push(k);
            (v.len() == 5 && home + 8 < n).then(|| v.clone())
        })
        .unwrap();
    let home = place(seed, n, &keys[0]).0 as usize;
    let k = keys[4].clone();
    let watch = Watch::new(&path.0);
    let rlen = registry_len(&path.0);
    let sh = Shared::new(16);
    // P: O1 at home, O2..O4 at +1..+3, then frees O2 and O4 (holes at +1 and +3, reach 3)
    let p = Proc(Some(fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        let gs: Vec<_> = keys[..4]
            .iter()
            .map(|key| t.lock(key, opts(60_000, 1000)).unwrap())
            .collect();
        let places: Vec<usize> = keys[..4]
            .iter()
            .map(|key| t.debug_placement(key).unwrap().1)
            .collect();
        let mut gs = gs.into_iter();
        let g1 = gs.next().unwrap();
        drop(gs.next());
        let g3 = gs.next().unwrap();
        drop(gs.next());
        sh.word(1).store(
            places.iter().fold(0u64, |a, &s| a << 12 | s as u64),
            Ordering::SeqCst,
        );
        std::thread::sleep(Duration::from_secs(40));
        drop((g1, g3));
        0
    })));
    let places = await_word(&sh, 1, Duration::from_secs(10));
    let ps: Vec<usize> = (0..4)
        .rev()
        .map(|i| ((places >> (12 * i)) & 0xfff) as usize)
        .collect();
    assert_eq!(
        ps,
        vec![home, home + 1, home + 2, home + 3],
        "inconclusive placement"
    );
    let hole = home + 1;
    // X: claims K; gdb stops it right after its CAS into the hole
    let x = Proc(Some(fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        let addr = mapping_base(&path.0) as u64 + rlen + hole as u64 * 64;
        sh.word(2).store(addr, Ordering::SeqCst);
        await_word(&sh, 3, Duration::from_secs(60));
        let r = t.lock(&k, opts(60_000, 3000));
        sh.word(4).store(mono_ns(), Ordering::SeqCst);
        sh.word(5)
            .store(if r.is_ok() { 1 } else { 2 }, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(30));
        0
    })));
    let addr = await_word(&sh, 2, Duration::from_secs(10));
    let mut gdb = Some(GdbStop::attach(
        x.pid(),
        &[
            format!("watch *(long*){addr:#x}"),
            format!("condition 1 (*(long*){addr:#x} & 7) == 1"),
        ],
    ));
    let fence_before = watch.at(home, 48).load(Ordering::SeqCst);
    sh.word(3).store(1, Ordering::SeqCst);
    assert!(
        gdb.as_ref().unwrap().stopped(Duration::from_secs(30)),
        "X never published"
    );
    let wx = watch.control(hole);
    let fence_x = watch.at(home, 48).load(Ordering::SeqCst);
    note!(
        "[X stopped: hole word state {}, home count {} -> {}] ",
        wx & 7,
        fence_before,
        fence_x
    );
    assert_eq!(wx & 7, 1, "inconclusive: not CLAIMING");
    assert_eq!(fence_x, fence_before, "inconclusive: X counted already");
    if kill {
        drop(gdb.take());
        common::signal::send(x.pid(), libc::SIGKILL);
        std::thread::sleep(Duration::from_millis(50));
    }
    // Y: takes K (breaks X's claim after the bound, or frees it at once if X is dead)
    let t = LockTable::open(&path, 64).unwrap();
    let s = Instant::now();
    let y = t.lock(&k, opts(60_000, 3000));
    let took = s.elapsed();
    let ys = t.debug_placement(&k).map(|p| p.1);
    note!(
        "[Y: {} K after {:.0} ms at slot {:?} (home {home}); home count now {}] ",
        if y.is_ok() { "got" } else { "did not get" },
        took.as_secs_f64() * 1e3,
        ys,
        watch.at(home, 48).load(Ordering::SeqCst)
    );
    let y = y.unwrap();
    let y_at = mono_ns();
    if !kill {
        gdb.take().unwrap().release();
        let rx = await_word(&sh, 5, Duration::from_secs(10));
        let when = sh.word(4).load(Ordering::SeqCst);
        note!(
            "[X resumed: {}; slot words: hole {:#x} state {}] ",
            if rx == 1 { "TOOK K" } else { "timed out" },
            watch.control(hole),
            watch.control(hole) & 7
        );
        let entries: Vec<_> = t
            .holders()
            .into_iter()
            .filter(|h| h.key_preview == k.as_bytes())
            .collect();
        drop(y);
        assert!(
            rx != 1 || when < y_at,
            "X took K while Y held it ({} entries of K)",
            entries.len()
        );
    } else {
        drop(y);
    }
    drop((p, x));
}
fn stopped_between_publish_and_count() {
    claimer_stopped_between_publish_and_count(false)
}
fn killed_between_publish_and_count() {
    claimer_stopped_between_publish_and_count(true)
}
