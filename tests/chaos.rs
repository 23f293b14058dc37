//! Chaos: processes lock, renew and release while others SIGSTOP them past the stall bound
//! and SIGKILL them at random, for seconds on end; the history is then judged against the
//! promises: never two live holders of a key, fencing tokens only grow, no update lost, no
//! key left held. Three mixes: a few hot keys among many (workers log every critical
//! section, a shared counter per key is updated without atomics), one key fought over by
//! waiters that steal expired and dead holds while a reaper calls `reap` and `holders` in a
//! loop, and keys crowded into three neighbouring homes (the slow path: raised reaches,
//! release holes, entries displaced across homes).
//!
//! Exercises the slot protocol as a whole: `src/shm/table/` (claim, release, steal,
//! stall breaking), `src/shm/slot.rs`, `src/shm/registry.rs` (judging the killed dead) and
//! `src/shm/lock_table.rs` (`reap`, `holders`).
//!
//! `chaos FILTER` runs the tests whose name contains FILTER; `chaos --list` lists them.

mod common;

use std::ffi::CString;
use std::fs;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::fork::{fork, xorshift, Child, Shared};
use common::harness::Test;
use common::probe::{cont, header_u64, place, proc_state, Proc};
use common::{opts, TempPath};
use shmlock::{Error, Lock, LockTable};

const TESTS: &[Test] = &[
    Test::new(
        "chaos_with_sigstop_and_sigkill",
        chaos_with_sigstop_and_sigkill,
    ),
    Test::new(
        "chaos_many_stealers_reapers_stop_and_kill",
        chaos_many_stealers_reapers_stop_and_kill,
    ),
    Test::new("chaos_on_crowded_homes_with_stops_and_kills", crowded_chaos),
];

fn main() {
    common::harness::run("chaos", TESTS, common::harness::no_roles);
}

const K: &str = "K";

// ---------------------------------------------------------------------------------------
// Chaos with SIGSTOP pauses longer than the bound, and SIGKILLs

const ENTER: u32 = 1;
const EXIT: u32 = 2;
const KILL: u32 = 3;
const FAIL: u32 = 4;

/// A log record's size.
const REC: usize = 32;

fn log(fd: libc::c_int, kind: u32, pid: u32, key: u32, token: u64) {
    // 32 bytes, a divisor of the page: an appended record never straddles two pages, so a
    // SIGKILL in the write cannot leave part of it (a write is cut only between pages).
    let mut rec = [0u8; REC];
    rec[0..4].copy_from_slice(&kind.to_le_bytes());
    rec[4..8].copy_from_slice(&pid.to_le_bytes());
    rec[8..12].copy_from_slice(&key.to_le_bytes());
    rec[16..24].copy_from_slice(&token.to_le_bytes());
    // SAFETY: writing REC bytes from a valid buffer.
    let n = unsafe { libc::write(fd, rec.as_ptr().cast(), rec.len()) };
    assert_eq!(n, REC as isize);
}

const HOT: u32 = 3;
const KEYS: u32 = HOT + 40;

/// Locks, logs ENTER, does a shared non-atomic read-modify-write of the key's counter,
/// logs EXIT, unlocks. Leases are long (30 s): a SIGSTOP of 0.6-1.5 s must never cost a
/// holder its lease, so any overlap is a bug.
fn chaos_worker(
    table: &LockTable,
    fd: libc::c_int,
    stop: &Shared,
    counters: &Shared,
    seed: u64,
) -> i32 {
    let me = std::process::id();
    let mut lock = Lock::new(table, opts(30_000, 20_000)).unwrap();
    let mut x = seed | 1;
    while stop.word(0).load(Ordering::Relaxed) == 0 {
        let r = xorshift(&mut x);
        let key = if r.is_multiple_of(2) {
            (r >> 8) as u32 % HOT
        } else {
            HOT + (r >> 8) as u32 % (KEYS - HOT)
        };
        match lock.lock(format!("chaos:{key}")) {
            Ok(_) => {}
            Err(Error::Timeout { .. }) => continue, // a stopped holder keeps its key (30 s lease)
            Err(e) => {
                log(fd, FAIL, me, key, 0);
                eprintln!("lock: {e}");
                return 1;
            }
        }
        let token = lock.token().unwrap_or(0);
        log(fd, ENTER, me, key, token);
        let c = counters.word(key as usize);
        let v = c.load(Ordering::Relaxed);
        match r % 16 {
            0 => std::thread::sleep(Duration::from_micros(300)),
            1..=4 => (0..(r >> 20) % 3000).for_each(|_| std::hint::spin_loop()),
            _ => {}
        }
        if r % 32 == 7 && lock.expire(None).is_err() {
            log(fd, FAIL, me, key, 5);
            return 4;
        }
        c.store(v + 1, Ordering::Relaxed);
        log(fd, EXIT, me, key, token);
        match lock.unlock() {
            Ok(()) => {}
            Err(e) => {
                log(fd, FAIL, me, key, 2);
                eprintln!("unlock: {e}");
                return 3;
            }
        }
        counters
            .word(KEYS as usize + key as usize)
            .fetch_add(1, Ordering::Relaxed);
    }
    0
}

/// 8 workers on 2 cores; every ~10 ms one is SIGSTOPped for 0.6-1.5 s (past the 500 ms
/// bound) or SIGKILLed. The log is replayed for overlaps; the counters must equal the
/// number of completed critical sections (an overlap loses increments).
fn chaos_with_sigstop_and_sigkill() {
    let env = |name: &str, default: u64| -> u64 {
        std::env::var(name)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(default)
    };
    let secs = env("SHMLOCK_CHAOS_SECS", 20);
    let workers_n = env("SHMLOCK_CHAOS_WORKERS", 8) as usize;
    let cap = env("SHMLOCK_CHAOS_CAP", 64) as usize;
    let path = TempPath::new("chaos-stop");
    let table = LockTable::open(&path, cap).unwrap();
    let log_path = TempPath::new("chaos-stop-log");
    let c_path = CString::new(log_path.0.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid path.
    let fd = unsafe {
        libc::open(
            c_path.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
            0o600,
        )
    };
    assert!(fd >= 0);
    let stop_flag = Shared::new(1);
    let counters = Shared::new(2 * KEYS as usize);
    let spawn = |seed: u64| {
        let (table, stop_flag, counters) = (&table, &stop_flag, &counters);
        fork(move || chaos_worker(table, fd, stop_flag, counters, seed))
    };
    let mut workers: Vec<Child> = (0..workers_n as u64).map(|i| spawn(i + 1)).collect();
    let mut stopped: Vec<Option<Instant>> = vec![None; workers_n];
    let deadline = Instant::now() + Duration::from_secs(secs);
    let (mut kills, mut stops) = (0u64, 0u64);
    let mut x = 0x0dd_ba11_u64;
    let mut seed = 100;
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_micros(xorshift(&mut x) % 20_000));
        for (i, s) in stopped.iter_mut().enumerate() {
            if s.is_some_and(|until| Instant::now() >= until) {
                cont(workers[i].0);
                *s = None;
            }
        }
        let victim = (xorshift(&mut x) % workers_n as u64) as usize;
        if stopped[victim].is_some() {
            continue;
        }
        if xorshift(&mut x).is_multiple_of(4) {
            log(fd, KILL, workers[victim].0 as u32, 0, 0);
            workers[victim].kill();
            kills += 1;
            seed += 1;
            workers[victim] = spawn(seed * 1_000_003);
        } else {
            common::signal::send(workers[victim].0, libc::SIGSTOP);
            stops += 1;
            let pause = 600 + xorshift(&mut x) % 900;
            stopped[victim] = Some(Instant::now() + Duration::from_millis(pause));
        }
    }
    for (i, s) in stopped.iter().enumerate() {
        if s.is_some() {
            cont(workers[i].0);
        }
    }
    stop_flag.word(0).store(1, Ordering::SeqCst);
    for w in &workers {
        assert_eq!(
            w.wait(Duration::from_secs(90)),
            0,
            "a surviving worker failed"
        );
    }
    // SAFETY: our descriptor.
    unsafe { libc::close(fd) };
    let bytes = fs::read(&log_path).unwrap();
    let mut holder: std::collections::HashMap<u32, (u32, u64)> = Default::default();
    let mut last_token: std::collections::HashMap<u32, u64> = Default::default();
    let mut killed = std::collections::HashSet::new();
    let (mut enters, mut overlaps, mut bad_tokens, mut bad_exits) = (0u64, 0u64, 0u64, 0u64);
    for rec in bytes.chunks(REC) {
        let u32_at = |o: usize| u32::from_le_bytes(rec[o..o + 4].try_into().unwrap());
        let (kind, pid, key) = (u32_at(0), u32_at(4), u32_at(8));
        let token = u64::from_le_bytes(rec[16..24].try_into().unwrap());
        match kind {
            ENTER => {
                enters += 1;
                if let Some((hp, _)) = holder.get(&key) {
                    if !killed.contains(hp) {
                        overlaps += 1;
                    }
                }
                if token <= last_token.get(&key).copied().unwrap_or(0) {
                    bad_tokens += 1;
                }
                holder.insert(key, (pid, token));
                last_token.insert(key, token);
            }
            EXIT => {
                if holder.remove(&key) != Some((pid, token)) {
                    bad_exits += 1;
                }
            }
            KILL => {
                killed.insert(pid);
            }
            _ => panic!("a worker failed: pid {pid} key {key} code {token}"),
        }
    }
    // counters: a killed worker may have died between its store and its tally (+1 at most
    // per kill), never fewer increments than tallies.
    let mut lost = 0i64;
    for k in 0..KEYS as usize {
        let inc = counters.word(k).load(Ordering::SeqCst) as i64;
        let tally = counters.word(KEYS as usize + k).load(Ordering::SeqCst) as i64;
        if inc < tally {
            lost += tally - inc;
        }
    }
    note!("[{secs}s, {workers_n} workers, capacity {cap}: {stops} stops, {kills} kills, {enters} critical sections; overlaps {overlaps}, bad tokens {bad_tokens}, bad exits {bad_exits}, lost increments {lost}] ");
    assert!(kills > 0 && stops > 0 && enters > 0);
    assert_eq!((overlaps, bad_tokens, bad_exits, lost), (0, 0, 0, 0));
    let mut lock = Lock::new(&table, opts(30_000, 5_000)).unwrap();
    for key in 0..KEYS {
        lock.lock(format!("chaos:{key}")).unwrap();
        lock.unlock().unwrap();
    }
    table.reap().unwrap();
    assert_eq!(table.occupancy(), 0);
}

// ---------------------------------------------------------------------------------------
// Chaos: many processes wait for one key while holders are SIGKILLed and SIGSTOPped,
// a reaper calls reap() and holders() in a loop, and another force-free-nothing
// process inspects. Leases never expire (so any second live holder is a break); a
// holder records itself in a shared word; a newcomer that finds the word taken checks
// whether that process is dead (killed by the parent, who sets its tombstone).

fn chaos_many_stealers_reapers_stop_and_kill() {
    let path = TempPath::new("chaos-stealers");
    let _table = LockTable::open(&path, 64).unwrap();
    const N: usize = 6;
    // word 0: current holder pid; 1: violations; 2: acquisitions; 3..3+N: tombstones
    // (pid of killed children); 20: stop flag
    let shared = Shared::new(32);
    let start = Instant::now();
    let worker = |i: usize| {
        let shared = &shared;
        let path = &path;
        move || {
            let t = LockTable::open(path, 64).unwrap();
            let me = std::process::id() as u64;
            let mut rng = me ^ 0x9e37_79b9_7f4a_7c15;
            while shared.word(20).load(Ordering::SeqCst) == 0 {
                let Ok(g) = t.lock(K, opts(0, 2_000)) else {
                    continue;
                };
                let prev = shared.word(0).swap(me, Ordering::SeqCst);
                if prev != 0 {
                    // the previous recorded holder must be one the parent killed
                    let dead =
                        (0..N + 8).any(|k| shared.word(3 + k).load(Ordering::SeqCst) == prev);
                    if !dead {
                        shared.word(1).fetch_add(1, Ordering::SeqCst);
                        shared.word(21).store(prev, Ordering::SeqCst);
                        shared.word(22).store(me, Ordering::SeqCst);
                    }
                }
                shared.word(2).fetch_add(1, Ordering::SeqCst);
                let spin = xorshift(&mut rng) % 200;
                for _ in 0..spin {
                    std::hint::spin_loop();
                }
                if xorshift(&mut rng).is_multiple_of(8) {
                    std::thread::sleep(Duration::from_micros(xorshift(&mut rng) % 2000));
                }
                let _ = shared
                    .word(0)
                    .compare_exchange(me, 0, Ordering::SeqCst, Ordering::SeqCst);
                let r = if xorshift(&mut rng).is_multiple_of(4) {
                    let mut g = g;
                    let _ = g.token();
                    let _ = g.expire(None);
                    g.unlock()
                } else {
                    g.unlock()
                };
                let _ = i;
                if r.is_err() {
                    // lost a never-expiring hold while alive: only force_unlock may do that
                    shared.word(23).fetch_add(1, Ordering::SeqCst);
                }
            }
            0
        }
    };
    let mut procs: Vec<Option<Proc>> = (0..N).map(|i| Some(Proc::new(fork(worker(i))))).collect();
    let reaper = Proc::new(fork(|| {
        let t = LockTable::open(&path, 64).unwrap();
        while shared.word(20).load(Ordering::SeqCst) == 0 {
            t.reap().unwrap();
            let _ = t.holders();
            let _ = t.is_locked(K);
            std::thread::sleep(Duration::from_micros(200));
        }
        0
    }));
    let mut rng = 12345u64;
    let mut kills = 0;
    let mut stops = 0;
    let mut tomb = 0;
    while start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(xorshift(&mut rng) % 30));
        let k = (xorshift(&mut rng) % N as u64) as usize;
        let Some(p) = procs[k].as_mut() else { continue };
        match xorshift(&mut rng) % 3 {
            0 if tomb < N + 8 => {
                let pid = p.pid();
                // tombstone first: once it is dead, anyone may find its record
                shared.word(3 + tomb).store(pid as u64, Ordering::SeqCst);
                tomb += 1;
                p.kill();
                kills += 1;
                procs[k] = Some(Proc::new(fork(worker(k))));
            }
            _ => {
                // SIGSTOP a live process (maybe while holding) for up to 700 ms
                common::signal::send(p.pid(), libc::SIGSTOP);
                std::thread::sleep(Duration::from_millis(xorshift(&mut rng) % 700));
                common::signal::send(p.pid(), libc::SIGCONT);
                stops += 1;
            }
        }
    }
    shared.word(20).store(1, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(2500));
    drop(procs);
    drop(reaper);
    let v = shared.word(1).load(Ordering::SeqCst);
    note!(
        "[{} acquisitions, {kills} kills, {stops} stops; violations {v} (prev {} me {}); \
         live holds lost {}] ",
        shared.word(2).load(Ordering::SeqCst),
        shared.word(21).load(Ordering::SeqCst),
        shared.word(22).load(Ordering::SeqCst),
        shared.word(23).load(Ordering::SeqCst)
    );
    assert_eq!(v, 0, "two live holders");
    assert_eq!(
        shared.word(23).load(Ordering::SeqCst),
        0,
        "a live never-expiring hold was lost"
    );
}

// ---------------------------------------------------------------------------------------
// Chaos on keys crowded into three neighbouring homes (slow path, raised reaches,
// release holes, displacement across homes): workers lock/try-lock, check mutual
// exclusion through an occupant word per key and that fencing tokens only grow; the
// controller SIGSTOPs workers (20-900 ms, past the 500 ms bound, under the 3 s lease)
// and SIGKILLs them (respawned).

const CK: usize = 18;

fn crowd_keys(path: &Path) -> Vec<String> {
    let seed = header_u64(path, 32);
    let n = header_u64(path, 16);
    let h0 = 100;
    let mut keys = Vec::new();
    let want = |home: u64, k: &Vec<String>| -> usize {
        k.iter().filter(|s| place(seed, n, s).0 == home).count()
    };
    let mut i = 0u64;
    while keys.len() < CK {
        let k = format!("crowd:{i}");
        i += 1;
        let (home, _) = place(seed, n, &k);
        let quota = match home - h0.min(home) {
            0 if home == h0 => 10,
            1 => 4,
            2 => 4,
            _ => 0,
        };
        if home >= h0 && want(home, &keys) < quota {
            keys.push(k);
        }
    }
    keys
}

fn crowd_worker(path: &Path, keys: &[String], sh: &Shared, seed: u64) -> i32 {
    let t = LockTable::open(path, 64).unwrap();
    let me = std::process::id() as u64;
    let mut x = seed | 1;
    let mut next = || xorshift(&mut x);
    while sh.word(0).load(Ordering::Relaxed) == 0 {
        let r = next();
        let ki = (r % CK as u64) as usize;
        let key = &keys[ki];
        let g = if r % 4 == 0 {
            match t.try_lock_with_lease(key, Duration::from_secs(3)) {
                Ok(Some(g)) => g,
                Ok(None) => continue,
                Err(e) => {
                    eprintln!("try_lock: {e}");
                    sh.word(5).fetch_add(1, Ordering::SeqCst);
                    continue;
                }
            }
        } else {
            match t.lock(key, opts(3000, 1500)) {
                Ok(g) => g,
                Err(shmlock::Error::Timeout { .. }) => continue,
                Err(e) => {
                    eprintln!("lock: {e}");
                    sh.word(5).fetch_add(1, Ordering::SeqCst);
                    continue;
                }
            }
        };
        let occ = sh.word(16 + ki);
        loop {
            match occ.compare_exchange(0, me, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => break,
                Err(p) => {
                    if matches!(proc_state(p as libc::pid_t), Some(b'Z') | None) {
                        // a killed holder's record: its key was rightly taken
                        let _ = occ.compare_exchange(p, 0, Ordering::SeqCst, Ordering::SeqCst);
                        continue;
                    }
                    sh.word(1).fetch_add(1, Ordering::SeqCst);
                    sh.word(2).store(ki as u64 + 1, Ordering::SeqCst);
                    sh.word(3).store(p << 32 | me, Ordering::SeqCst);
                    break;
                }
            }
        }
        if r % 3 == 0 {
            if let Some(tok) = g.token() {
                let last = sh.word(16 + CK + ki);
                let prev = last.load(Ordering::SeqCst);
                if tok <= prev {
                    sh.word(4).fetch_add(1, Ordering::SeqCst);
                    sh.word(6).store(prev, Ordering::SeqCst);
                    sh.word(7).store(tok, Ordering::SeqCst);
                }
                last.fetch_max(tok, Ordering::SeqCst);
            }
        }
        match (r >> 8) % 16 {
            0 => std::thread::sleep(Duration::from_micros(200)),
            1..=5 => (0..(r >> 20) % 3000).for_each(|_| std::hint::spin_loop()),
            _ => {}
        }
        let _ = occ.compare_exchange(me, 0, Ordering::SeqCst, Ordering::SeqCst);
        if g.unlock().is_err() {
            sh.word(8).fetch_add(1, Ordering::SeqCst); // lost a 3 s lease: unexpected
        }
        sh.word(9).fetch_add(1, Ordering::Relaxed);
    }
    0
}

fn crowded_chaos() {
    let secs: u64 = 8;
    let nw: usize = 5;
    let path = TempPath::new("crowd");
    drop(LockTable::open(&path, 64).unwrap());
    let keys = crowd_keys(&path.0);
    let sh = Shared::new(16 + 2 * CK);
    let spawn = |seed: u64| fork(|| crowd_worker(&path.0, &keys, &sh, seed));
    let mut workers: Vec<Child> = (0..nw as u64).map(|i| spawn(i * 7919 + 1)).collect();
    let mut stopped_until: Vec<Option<Instant>> = vec![None; nw];
    let mut rested: Vec<Instant> = vec![Instant::now(); nw];
    let deadline = Instant::now() + Duration::from_secs(secs);
    let (mut kills, mut stops) = (0u64, 0u64);
    let mut x = 0x5eed_u64;
    let mut next = || xorshift(&mut x);
    let mut seed = 1000;
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_micros(2000 + next() % 13_000));
        for i in 0..nw {
            if stopped_until[i].is_some_and(|u| Instant::now() >= u) {
                common::signal::send(workers[i].0, libc::SIGCONT);
                stopped_until[i] = None;
                rested[i] = Instant::now();
            }
        }
        let i = (next() % nw as u64) as usize;
        if stopped_until[i].is_some() || rested[i].elapsed() < Duration::from_millis(600) {
            continue;
        }
        if next() % 6 == 0 {
            let pid = workers[i].0;
            common::signal::send(pid, libc::SIGKILL);
            while proc_state(pid) != Some(b'Z') {
                std::thread::sleep(Duration::from_micros(200));
            }
            for k in 0..CK {
                let _ = sh.word(16 + k).compare_exchange(
                    pid as u64,
                    0,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                );
            }
            let mut st = 0;
            // SAFETY: reaping that child; st is a valid out-pointer.
            unsafe { libc::waitpid(pid, &mut st, 0) };
            seed += 1;
            workers[i] = spawn(seed);
            kills += 1;
        } else {
            common::signal::send(workers[i].0, libc::SIGSTOP);
            stopped_until[i] = Some(Instant::now() + Duration::from_millis(20 + next() % 880));
            stops += 1;
        }
    }
    for (i, w) in workers.iter().enumerate() {
        if stopped_until[i].is_some() {
            common::signal::send(w.0, libc::SIGCONT);
        }
    }
    sh.word(0).store(1, Ordering::SeqCst);
    for w in &workers {
        w.wait(Duration::from_secs(30));
    }
    let g = |i| sh.word(i).load(Ordering::SeqCst);
    note!(
        "[{} critical sections, {stops} stops, {kills} kills; overlaps {} (last key {}, pids {:#x}); tokens not growing {} ({} then {}); unlock Expired {}; errors {}] ",
        g(9), g(1), g(2), g(3), g(4), g(6), g(7), g(8), g(5)
    );
    assert_eq!(g(1), 0, "two live holders of one key");
    assert_eq!(g(4), 0, "a fencing token did not grow");
}
