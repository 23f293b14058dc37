//! Behaviour across real processes: forked workers and separately started ones.
//!
//! This binary has its own small harness (`harness = false`) so that it is single-threaded
//! and `fork` is safe. `procs FILTER` runs the tests whose name contains FILTER;
//! `procs --role NAME ARGS…` is how a test starts this binary as an unrelated process.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::fork::{fork, xorshift, Child, Gate, Shared};
use common::harness::{require_root, Test, TestFn};
use common::probe::{coarse_ns, mono_ns};
use common::TempPath;
use shmlock::{Error, Lock, LockOptions, LockTable};

// ---------------------------------------------------------------------------------------
// Harness

/// The tests, by function name.
macro_rules! tests {
    ($($name:ident),* $(,)?) => {
        &[$((stringify!($name), $name as TestFn)),*]
    };
}

const TESTS: &[(&str, TestFn)] = tests![
    mutual_exclusion_among_forked_workers,
    release_hole_hammered_by_processes,
    concurrent_creation_ends_on_one_table,
    forked_copies_never_release_the_parents_hold,
    elapsed_is_a_sum_of_steps,
    unlock_wakes_a_sleeping_waiter_in_another_process,
    expired_holder_in_another_process_is_taken_over,
    a_timeout_names_the_holder_in_another_process,
    a_holder_that_shortens_its_lease_wakes_its_sleeping_waiter,
    a_waiter_with_an_enormous_timer_slack_keeps_its_timeout,
    sigkilled_holder_is_reclaimed_at_once,
    sigkilled_holder_is_reclaimed_while_its_home_churns,
    unrelated_process_attaches_by_path,
    permission_denied_is_a_typed_error,
    a_full_filesystem_fails_at_open,
    threads_starting_together_in_a_forked_child_release_their_holds,
    chaos_sigkill_workers_at_random_moments,
];

/// All the tests of this build: the Redis one needs the `redis` feature.
fn tests() -> Vec<(&'static str, TestFn)> {
    #[cfg_attr(not(feature = "redis"), allow(unused_mut))]
    let mut all = TESTS.to_vec();
    #[cfg(feature = "redis")]
    all.extend_from_slice(tests![
        redis_paused_holder_loses_its_lease_and_its_late_unlock_is_refused
    ]);
    all
}

fn main() {
    let mut all: Vec<Test> = tests()
        .into_iter()
        .map(|(name, run)| Test::new(name, run))
        .collect();
    all.push(
        Test::new(
            "a_waiter_sleeps_its_steps_to_ticks_of_the_coarse_clock_and_keeps_its_own_slack",
            waiter_sleeps_to_ticks,
        )
        .needs_root(
            "needs root: CAP_SYS_NICE and ptrace access, to read another process's timer \
             slack and futex timeout",
        ),
    );
    common::harness::run("procs", &all, role);
}

fn opts(exptime_ms: u64, timeout_ms: u64) -> LockOptions {
    LockOptions {
        exptime: Duration::from_millis(exptime_ms),
        timeout: Duration::from_millis(timeout_ms),
        ..LockOptions::default()
    }
}

// ---------------------------------------------------------------------------------------
// Tests

/// Critical section with an overlap detector and a deliberately non-atomic counter update:
/// any second holder of the key shows up as a violation or a lost update.
fn critical_section(shared: &Shared, key: usize, violations: usize, spin: u32) {
    let inside = shared.word(2 * key);
    if inside.swap(1, Ordering::SeqCst) != 0 {
        shared.word(violations).fetch_add(1, Ordering::SeqCst);
    }
    let counter = shared.word(2 * key + 1);
    let v = counter.load(Ordering::Relaxed);
    for _ in 0..spin {
        std::hint::spin_loop();
    }
    counter.store(v + 1, Ordering::Relaxed);
    inside.store(0, Ordering::SeqCst);
}

fn mutual_exclusion_among_forked_workers() {
    const WORKERS: usize = 6;
    const HOT: usize = 3;
    const COLD: usize = 300;
    const ITERS: u64 = 20_000;
    let path = TempPath::new("mutex");
    let table = LockTable::open(&path, 256).unwrap();
    let keys: Vec<String> = (0..HOT + COLD).map(|i| format!("key:{i}")).collect();
    // words: [inside, counter] per key, then violations, then per-worker acquisitions
    let violations = 2 * keys.len();
    let shared = Shared::new(violations + 1 + WORKERS);
    let children: Vec<Child> = (0..WORKERS)
        .map(|w| {
            let (table, keys, shared) = (&table, &keys, &shared);
            fork(move || {
                let mut lock = Lock::new(table, opts(30_000, 10_000)).unwrap();
                let mut x = 0x2545_f491_4f6c_dd1d ^ (w as u64 + 1);
                let mut acquired = 0;
                for _ in 0..ITERS {
                    let r = xorshift(&mut x);
                    let k = if r % 10 < 7 {
                        (r >> 8) as usize % HOT
                    } else {
                        HOT + (r >> 8) as usize % COLD
                    };
                    lock.lock(&keys[k]).unwrap();
                    critical_section(shared, k, violations, 20);
                    lock.unlock().unwrap();
                    acquired += 1;
                }
                shared
                    .word(violations + 1 + w)
                    .store(acquired, Ordering::SeqCst);
                0
            })
        })
        .collect();
    for c in &children {
        assert_eq!(c.wait(Duration::from_secs(120)), 0);
    }
    let total: u64 = (0..WORKERS)
        .map(|w| shared.word(violations + 1 + w).load(Ordering::SeqCst))
        .sum();
    let counted: u64 = (0..keys.len())
        .map(|k| shared.word(2 * k + 1).load(Ordering::SeqCst))
        .sum();
    assert_eq!(total, WORKERS as u64 * ITERS);
    assert_eq!(counted, total, "lost updates: two holders at once");
    assert_eq!(shared.word(violations).load(Ordering::SeqCst), 0);
    assert_eq!(table.occupancy(), 0);
    print!("[{total} acquisitions] ");
}

fn release_hole_hammered_by_processes() {
    // A key held away from its home, the slots before it freed, then: claimers of the key
    // from several processes while it is held (none may win), and afterwards lock/unlock
    // of the key racing with churn that keeps opening holes in its path.
    let path = TempPath::new("hole");
    let table = LockTable::open(&path, 8).unwrap();
    let (target, held) = (0..500)
        .find_map(|attempt| {
            let target = format!("target-{attempt}");
            let fillers: Vec<_> = (0..7)
                .map(|i| {
                    table
                        .try_lock_with_lease(format!("f{attempt}-{i}"), Duration::from_secs(60))
                        .unwrap()
                        .unwrap()
                })
                .collect();
            let held = table
                .try_lock_with_lease(&target, Duration::from_secs(60))
                .unwrap()
                .unwrap();
            let (home, slot) = table.debug_placement(&target).unwrap();
            drop(fillers);
            // want at least one freed slot strictly between home and the key (a table has
            // four slots per key of capacity)
            let n = 4 * table.capacity();
            let dist = (slot + n - home) % n;
            (dist >= 2).then_some((target, held))
        })
        .expect("could not displace a key");
    let placement = table.debug_placement(&target).unwrap();

    let shared = Shared::new(8);
    let (wins, violations) = (2, 3);
    let mut go = Gate::new();
    let hammer: Vec<Child> = (0..4)
        .map(|_| {
            let (table, target, shared) = (&table, &target, &shared);
            let go = &mut go;
            fork(move || {
                go.wait();
                for _ in 0..20_000 {
                    if let Some(g) = table
                        .try_lock_with_lease(target, Duration::from_secs(60))
                        .unwrap()
                    {
                        shared.word(wins).fetch_add(1, Ordering::SeqCst);
                        drop(g);
                    }
                }
                0
            })
        })
        .collect();
    go.open();
    for c in &hammer {
        assert_eq!(c.wait(Duration::from_secs(60)), 0);
    }
    assert_eq!(
        shared.word(wins).load(Ordering::SeqCst),
        0,
        "a second holder got in"
    );
    assert_eq!(table.debug_placement(&target), Some(placement));
    assert_eq!(table.occupancy(), 1);
    drop(held);

    // Phase 2: the key changes hands while other keys churn through its probe path.
    let lockers: Vec<Child> = (0..3)
        .map(|w| {
            let (table, target, shared) = (&table, &target, &shared);
            fork(move || {
                let mut lock = Lock::new(table, opts(30_000, 10_000)).unwrap();
                for i in 0..5_000u64 {
                    lock.lock(target).unwrap();
                    critical_section(shared, 0, violations, (i % 50) as u32 + w);
                    lock.unlock().unwrap();
                }
                0
            })
        })
        .collect();
    let churners: Vec<Child> = (0..2)
        .map(|w| {
            let table = &table;
            fork(move || {
                let mut x = 77 + w as u64;
                for _ in 0..20_000 {
                    let k = format!("churn-{}", xorshift(&mut x) % 6);
                    if let Ok(Some(g)) = table.try_lock_with_lease(&k, Duration::from_secs(60)) {
                        drop(g);
                    }
                }
                0
            })
        })
        .collect();
    for c in lockers.iter().chain(&churners) {
        assert_eq!(c.wait(Duration::from_secs(120)), 0);
    }
    assert_eq!(shared.word(violations).load(Ordering::SeqCst), 0);
    assert_eq!(shared.word(1).load(Ordering::SeqCst), 3 * 5_000);
    assert_eq!(table.occupancy(), 0);
}

fn concurrent_creation_ends_on_one_table() {
    const PROCS: usize = 8;
    let path = TempPath::new("create");
    let shared = Shared::new(PROCS);
    let mut go = Gate::new();
    let ready = Gate::new();
    let mut done = Gate::new();
    let children: Vec<Child> = (0..PROCS)
        .map(|i| {
            let (path, shared, go, ready, done) = (&path, &shared, &mut go, &ready, &mut done);
            fork(move || {
                go.wait();
                let table = LockTable::open(path, 64).unwrap();
                shared
                    .word(i)
                    .store(1 + table.created() as u64, Ordering::SeqCst);
                let g = table
                    .try_lock_with_lease(format!("proc-{i}"), Duration::from_secs(60))
                    .unwrap()
                    .unwrap();
                ready.signal();
                done.wait(); // hold until the parent has looked
                drop(g);
                0
            })
        })
        .collect();
    go.open();
    ready.await_signals(PROCS);
    let table = LockTable::options().create(false).open(&path).unwrap();
    assert_eq!(table.capacity(), 64);
    let pids: std::collections::HashSet<u32> = table.holders().iter().map(|h| h.pid).collect();
    assert_eq!(
        pids.len(),
        PROCS,
        "every process holds its key in the one table"
    );
    done.open();
    for c in &children {
        assert_eq!(c.wait(Duration::from_secs(30)), 0);
    }
    let creators = (0..PROCS)
        .filter(|&i| shared.word(i).load(Ordering::SeqCst) == 2)
        .count();
    let opened = (0..PROCS)
        .filter(|&i| shared.word(i).load(Ordering::SeqCst) != 0)
        .count();
    assert_eq!((creators, opened), (1, PROCS));
    assert_eq!(table.occupancy(), 0);
    // no temporary files left behind
    let dir = path.0.parent().unwrap();
    let prefix = format!(".{}", path.0.file_name().unwrap().to_string_lossy());
    let leftovers = std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with(&prefix)
        })
        .count();
    assert_eq!(leftovers, 0);
}

fn forked_copies_never_release_the_parents_hold() {
    let path = TempPath::new("forkcopy");
    let table = LockTable::open(&path, 16).unwrap();
    let guard = table.lock("by-guard", LockOptions::default()).unwrap();
    let mut lock = Lock::new(&table, LockOptions::default()).unwrap();
    lock.lock("by-object").unwrap();
    let child = fork(|| {
        // In the child, `lock` and `guard` are this process's copies of the parent's.
        let mut lock_copy = Lock::new(&table, LockOptions::default()).unwrap();
        std::mem::swap(&mut lock_copy, &mut lock);
        // leaving the parent's hold to expire is refused too (it said Ok(None), and the
        // object forgot the hold), and the object still names it
        if !matches!(lock_copy.leave_to_expire(), Err(Error::NotOwner)) {
            return 4;
        }
        if !matches!(lock_copy.unlock(), Err(Error::NotOwner)) {
            return 1;
        }
        if guard.token().is_some() {
            return 2;
        }
        // SAFETY: the child owns its copy of the guard; the parent's original is never used
        // again in this process, so dropping the bitwise copy here drops it exactly once.
        drop(unsafe { std::ptr::read(&guard) });
        // the child's own locks work as usual on the inherited table
        let mine = table
            .try_lock_with_lease("child-key", Duration::from_secs(30))
            .unwrap();
        if mine.is_none()
            || !table.is_locked("by-guard").unwrap()
            || !table.is_locked("by-object").unwrap()
        {
            return 3;
        }
        0
    });
    assert_eq!(child.wait(Duration::from_secs(30)), 0);
    assert!(table.is_locked("by-guard").unwrap());
    assert!(table.is_locked("by-object").unwrap());
    assert!(!table.is_locked("child-key").unwrap());
    guard.unlock().unwrap();
    lock.unlock().unwrap();
}

/// A forked worker whose first requests arrive at once (a thread each, as a prefork server
/// runs them): every thread's hold is the child's own and is released when its guard
/// drops. The first use of the library in a child names the process anew; a thread that
/// asked for the name while another was setting it got the placeholder, took its hold under
/// the parent's registration, and, if its guard recorded the placeholder, had its drop
/// refused as a copy's: the key stayed held for its whole lease.
fn threads_starting_together_in_a_forked_child_release_their_holds() {
    const THREADS: usize = 16;
    let path = TempPath::new("fork-threads");
    let table = LockTable::open(&path, 256).unwrap();
    for round in 0..200 {
        let child = fork(|| {
            let start = std::sync::Barrier::new(THREADS);
            let left: usize = std::thread::scope(|s| {
                let handles: Vec<_> = (0..THREADS)
                    .map(|i| {
                        let (table, start) = (&table, &start);
                        s.spawn(move || {
                            let key = format!("r{round}-t{i}");
                            start.wait();
                            let guard = table.lock(&key, opts(60_000, 5_000)).unwrap();
                            // Taken under this process's registration, not its parent's.
                            let pid = table
                                .holders()
                                .into_iter()
                                .find(|h| h.key_preview == key.as_bytes())
                                .map(|h| h.pid);
                            drop(guard);
                            usize::from(pid != Some(std::process::id()))
                                + usize::from(table.is_locked(&key).unwrap())
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).sum()
            });
            left as i32
        });
        let left = child.wait(Duration::from_secs(30));
        assert_eq!(
            left, 0,
            "round {round}: {left} holds were taken under the parent's registration, or stayed \
             held after their guards dropped"
        );
    }
}

/// A child holds `key` for `hold`, then releases; the parent waits for it with `opts` and
/// returns what `lock` reported. (A hold of a few hundred ms: the parent's first try must
/// come before the release, also on a busy machine.)
fn wait_for_release(opts: LockOptions, hold: Duration) -> Duration {
    let path = TempPath::new("release");
    let table = LockTable::open(&path, 16).unwrap();
    let ready = Gate::new();
    let child = {
        let (table, ready) = (&table, &ready);
        fork(move || {
            let g = table.lock("k", LockOptions::default()).unwrap();
            ready.signal();
            std::thread::sleep(hold);
            drop(g);
            0
        })
    };
    ready.await_signals(1);
    let mut lock = Lock::new(&table, opts).unwrap();
    let elapsed = lock.lock("k").unwrap();
    assert_eq!(child.wait(Duration::from_secs(30)), 0);
    lock.unlock().unwrap();
    elapsed
}

fn elapsed_is_a_sum_of_steps() {
    let polling = LockOptions {
        notify: false,
        ..LockOptions::default()
    };
    let elapsed = wait_for_release(polling, Duration::from_millis(300));
    // 1, 2, 4, ... ms: elapsed is one of the running sums 1, 3, 7, 15, ..., 2^n - 1 ms
    let ms = elapsed.as_millis() as u64;
    assert_eq!(
        elapsed,
        Duration::from_millis(ms),
        "{elapsed:?} is not whole steps"
    );
    assert!(
        ms > 0 && (ms + 1).is_power_of_two(),
        "{ms} ms is not a sum of steps"
    );
    print!("[won at {ms} ms] ");
}

fn unlock_wakes_a_sleeping_waiter_in_another_process() {
    let one_long_step = LockOptions {
        step: Duration::from_secs(1),
        max_step: Duration::from_secs(1),
        ..LockOptions::default()
    };
    // polling cannot see the release before its first step ends, and says so exactly
    let polled = wait_for_release(
        LockOptions {
            notify: false,
            ..one_long_step
        },
        Duration::from_millis(300),
    );
    assert_eq!(polled, Duration::from_secs(1));
    // woken by the unlock, the waiter has the key long before that step is over
    let woken = wait_for_release(one_long_step, Duration::from_millis(300));
    assert!(woken < Duration::from_millis(900), "{woken:?}: not woken");
    print!("[polling {polled:?}, woken {woken:?}] ");
}

fn a_holder_that_shortens_its_lease_wakes_its_sleeping_waiter() {
    let path = TempPath::new("shorten");
    let table = LockTable::open(&path, 16).unwrap();
    // words: 0 set by the test to have the holder shorten its lease, 1 when it did (ns)
    let sh = Shared::new(2);
    let held = Gate::new();
    let holder = {
        let (table, sh, held) = (&table, &sh, &held);
        fork(move || {
            let mut lock = Lock::new(table, opts(30_000, 0)).unwrap();
            lock.lock("k").unwrap();
            held.signal();
            while sh.word(0).load(Ordering::SeqCst) == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            sh.word(1).store(mono_ns(), Ordering::SeqCst);
            lock.expire(Some(Duration::from_millis(10))).unwrap();
            // alive, holding, until its (short) lease is long gone
            std::thread::sleep(Duration::from_secs(2));
            0
        })
    };
    held.await_signals(1);
    // one long step: only a wake-up can cut it short
    let one_long_step = LockOptions {
        step: Duration::from_secs(3),
        max_step: Duration::from_secs(3),
        ..opts(30_000, 5_000)
    };
    let waiter = {
        let table = &table;
        fork(move || {
            let mut lock = Lock::new(table, one_long_step).unwrap();
            match lock.lock("k") {
                Ok(_) => 0,
                Err(e) => {
                    eprintln!("waiter: {e:?}");
                    1
                }
            }
        })
    };
    // let the waiter fall asleep on its one step, then have the lease shortened
    std::thread::sleep(Duration::from_millis(200));
    sh.word(0).store(1, Ordering::SeqCst);
    assert_eq!(
        waiter.wait(Duration::from_secs(30)),
        0,
        "the waiter got the key"
    );
    let after = Duration::from_nanos(mono_ns() - sh.word(1).load(Ordering::SeqCst));
    // the new lease ends 10 ms after the shortening; the step would have run 2.8 s more
    assert!(
        after < Duration::from_millis(1_000),
        "the waiter slept out its step: got the key {after:?} after the shortening"
    );
    assert_eq!(holder.wait(Duration::from_secs(30)), 0);
    print!("[waiter had the key {after:?} after the lease was cut to 10 ms] ");
}

fn a_waiter_with_an_enormous_timer_slack_keeps_its_timeout() {
    let path = TempPath::new("bigslack");
    let table = LockTable::open(&path, 16).unwrap();
    let held = table.lock("k", LockOptions::default()).unwrap();
    // words: the waits of the waiter (µs), notify on and off
    let sh = Shared::new(2);
    let waiter = {
        let (table, sh) = (&table, &sh);
        fork(move || {
            // 2^63 + 7 ns: any timer of this thread may fire centuries late
            let own: libc::c_ulong = (1 << 63) + 7;
            // SAFETY: PR_SET_TIMERSLACK takes an integer, and sets this thread's slack.
            assert_eq!(
                unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, own, 0, 0, 0) },
                0
            );
            let mut failed = 0;
            for (i, notify) in [true, false].into_iter().enumerate() {
                let mut lock = Lock::new(
                    table,
                    LockOptions {
                        notify,
                        ..opts(30_000, 50)
                    },
                )
                .unwrap();
                let t = Instant::now();
                if !matches!(lock.lock("k"), Err(Error::Timeout { .. })) {
                    failed += 1;
                }
                sh.word(i)
                    .store(t.elapsed().as_micros() as u64, Ordering::SeqCst);
            }
            // SAFETY: PR_GET_TIMERSLACK takes no pointers; by syscall, for the whole value.
            let after =
                unsafe { libc::syscall(libc::SYS_prctl, libc::PR_GET_TIMERSLACK, 0, 0, 0, 0) };
            if after as libc::c_ulong != own {
                eprintln!("slack after the waits: {after}");
                failed += 1;
            }
            failed
        })
    };
    assert_eq!(
        waiter.wait(Duration::from_secs(30)),
        0,
        "timed out, slack back"
    );
    let waits: Vec<u64> = (0..2).map(|i| sh.word(i).load(Ordering::SeqCst)).collect();
    // a 50 ms timeout; each sleep of the wait may end a tick (4 ms) late
    assert!(
        waits.iter().all(|&us| us < 1_000_000),
        "waits of {waits:?} µs for a 50 ms timeout"
    );
    drop(held);
    print!("[50 ms timeouts with a 2^63 ns slack took {waits:?} µs (notify on, off)] ");
}

/// The timer slack of `pid`'s main thread ("self": this one), in ns.
fn timer_slack(pid: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/timerslack_ns"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The absolute timeout of the futex wait `pid`'s main thread is blocked in, if it is in
/// one with a timeout (ns of CLOCK_MONOTONIC: read from its memory, so it may be read just
/// as the thread leaves the wait and reuses that memory; see the caller).
fn futex_deadline(pid: libc::pid_t) -> Option<u64> {
    use std::os::unix::fs::FileExt;
    let line = std::fs::read_to_string(format!("/proc/{pid}/syscall")).ok()?;
    let f: Vec<&str> = line.split_whitespace().collect();
    let arg = |i: usize| u64::from_str_radix(f.get(i)?.trim_start_matches("0x"), 16).ok();
    if f.first() != Some(&libc::SYS_futex.to_string().as_str())
        || arg(2)? & 0x7f != libc::FUTEX_WAIT_BITSET as u64
    {
        return None;
    }
    let mut ts = [0u8; 16];
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).ok()?;
    mem.read_exact_at(&mut ts, arg(4)?).ok()?;
    let secs = u64::from_ne_bytes(ts[..8].try_into().unwrap());
    let nanos = u64::from_ne_bytes(ts[8..].try_into().unwrap());
    let still = std::fs::read_to_string(format!("/proc/{pid}/syscall")).ok()? == line;
    (still && nanos < 1_000_000_000)
        .then(|| secs.checked_mul(1_000_000_000)?.checked_add(nanos))
        .flatten()
}

fn waiter_sleeps_to_ticks() {
    require_root();
    const OWN: u64 = 123_456;
    const TIMEOUT_MS: u64 = 400;
    let tick = {
        // SAFETY: timespec is plain integers, so all-zero bytes are a valid value.
        let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
        // SAFETY: `ts` is a valid out-pointer, and the coarse clock a supported one.
        assert_eq!(
            unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut ts) },
            0
        );
        ts.tv_nsec as u64
    };
    let path = TempPath::new("ticks");
    let table = LockTable::open(&path, 16).unwrap();
    let held = table.lock("k", LockOptions::default()).unwrap();
    // words: 0 when the waiter's lock started (ns), 1 set once it returned, 2 its slack
    // after the timed-out lock, 3 its slack after the lock it won
    let sh = Shared::new(4);
    let mut go = Gate::new();
    let waiter = {
        let (table, sh, go) = (&table, &sh, &mut go);
        fork(move || {
            // SAFETY: PR_SET_TIMERSLACK takes an integer, and sets this thread's slack.
            assert_eq!(
                unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, OWN, 0, 0, 0) },
                0
            );
            let mut lock = Lock::new(table, opts(30_000, TIMEOUT_MS)).unwrap();
            sh.word(0).store(mono_ns(), Ordering::SeqCst);
            // steps 1, 2, ..., 128 ms end by 255 ms; the last sleep is cut to the deadline
            let timed_out = matches!(lock.lock("k"), Err(Error::Timeout { .. }));
            sh.word(1).store(1, Ordering::SeqCst);
            sh.word(2)
                .store(timer_slack("self").unwrap_or(0), Ordering::SeqCst);
            go.wait();
            let won = lock.lock("k").is_ok();
            sh.word(3)
                .store(timer_slack("self").unwrap_or(0), Ordering::SeqCst);
            i32::from(!(timed_out && won))
        })
    };
    // The waiter's futex deadlines (each with how far it lies off the coarse clock's grid,
    // in ns) and its slack, over its wait.
    // A deadline counts once read twice in a row, a sample apart: each sleep lasts
    // milliseconds, while memory read as the waiter left its wait holds whatever it
    // wrote there next.
    let mut deadlines: Vec<(u64, u64)> = Vec::new();
    let mut slacks = Vec::new();
    let mut seen = None;
    let limit = Instant::now() + Duration::from_secs(30);
    while sh.word(1).load(Ordering::SeqCst) == 0 && Instant::now() < limit {
        if sh.word(0).load(Ordering::SeqCst) == 0 {
            continue; // its slack not set yet
        }
        let d = futex_deadline(waiter.0);
        if let (Some(d), true) = (d, d == seen) {
            if deadlines.last().is_none_or(|&(last, _)| last != d) {
                let off = d.abs_diff(coarse_ns()) % tick;
                deadlines.push((d, off.min(tick - off)));
            }
        }
        seen = d;
        slacks.extend(timer_slack(&waiter.0.to_string()));
        std::thread::sleep(Duration::from_micros(300));
    }
    go.open();
    std::thread::sleep(Duration::from_millis(20));
    drop(held);
    assert_eq!(
        waiter.wait(Duration::from_secs(30)),
        0,
        "timed out, then won"
    );
    let start = sh.word(0).load(Ordering::SeqCst);
    let at_ms = |d: u64| d.saturating_sub(start) / 1_000_000;
    let report: Vec<(u64, u64)> = deadlines.iter().map(|&(d, off)| (at_ms(d), off)).collect();
    let (steps, last) = deadlines.split_at(deadlines.len().saturating_sub(1));
    // a step ends on a tick (within the ns the clock's frequency correction moves it)
    assert!(
        steps.len() >= 4 && steps.iter().all(|&(_, off)| off < 1_000),
        "step deadlines (ms after the lock, ns off a tick): {report:?}"
    );
    // the last sleep ends at the caller's deadline, not at a tick after it: off the grid
    // (or, by a chance of 1 in 2000, on it but by the deadline; the lock's clock starts
    // a little after `start`, more under load)
    assert!(
        last.iter()
            .all(|&(d, off)| off >= 1_000 || d <= start + (TIMEOUT_MS + 1) * 1_000_000),
        "the last sleep runs to a tick past the timeout: {report:?}"
    );
    let other: Vec<u64> = slacks.iter().copied().filter(|&s| s != OWN).collect();
    assert!(
        !slacks.is_empty() && other.is_empty(),
        "the wait changed the thread's slack: {} samples, those not its own: {other:?}",
        slacks.len()
    );
    assert_eq!(sh.word(2).load(Ordering::SeqCst), OWN, "after the timeout");
    assert_eq!(sh.word(3).load(Ordering::SeqCst), OWN, "after the win");
    print!(
        "[step deadlines (ms after the lock, ns off a tick) {report:?}; {} slack samples] ",
        slacks.len()
    );
}

fn expired_holder_in_another_process_is_taken_over() {
    let path = TempPath::new("takeover");
    let table = LockTable::open(&path, 16).unwrap();
    let held = Gate::new();
    let mut proceed = Gate::new();
    let child = {
        let table = &table;
        let held = &held;
        let proceed = &mut proceed;
        fork(move || {
            let mut lock = Lock::new(table, opts(50, 0)).unwrap();
            lock.lock("k").unwrap();
            held.signal();
            proceed.wait();
            match lock.unlock() {
                Err(Error::Expired) => 0,
                other => {
                    eprintln!("late unlock: {other:?}");
                    1
                }
            }
        })
    };
    held.await_signals(1);
    let mut lock = Lock::new(&table, opts(30_000, 5_000)).unwrap();
    assert!(lock.lock("k").unwrap() > Duration::ZERO);
    proceed.open();
    assert_eq!(child.wait(Duration::from_secs(30)), 0);
    // the late unlock did not touch our hold
    assert!(table.is_locked("k").unwrap());
    assert_eq!(table.holders()[0].pid, std::process::id());
    lock.unlock().unwrap();
}

/// A wait that runs out says who held the key: the holder's pid (another process here) and
/// how long it had held the key, in the error and in its message; with notify and when
/// polling, and for a try of zero timeout.
fn a_timeout_names_the_holder_in_another_process() {
    let path = TempPath::new("timeout-holder");
    let table = LockTable::open(&path, 16).unwrap();
    // (before the child's hold: an upper bound of how long it was held, however late
    // the parent wakes)
    let since = Instant::now();
    let held = Gate::new();
    let mut proceed = Gate::new();
    let child = {
        let (table, held, proceed) = (&table, &held, &mut proceed);
        fork(move || {
            let _g = table.lock("k", opts(30_000, 0)).unwrap();
            held.signal();
            proceed.wait();
            0
        })
    };
    held.await_signals(1);
    for (timeout_ms, notify) in [(60, true), (60, false), (0, true)] {
        let o = LockOptions {
            notify,
            ..opts(30_000, timeout_ms)
        };
        let err = table.lock("k", o).unwrap_err();
        let Error::Timeout {
            holder: Some(h), ..
        } = &err
        else {
            panic!("no holder in {err:?}");
        };
        let held_for = h.held_for.expect("how long");
        assert_eq!(h.pid, Some(child.0 as u32), "{err}");
        assert!(!h.this_process, "{err}");
        // (by the table's coarse clock: up to a tick, 4 or 10 ms, short)
        assert!(
            held_for + Duration::from_millis(10) >= Duration::from_millis(timeout_ms)
                && held_for <= since.elapsed() + Duration::from_millis(50),
            "{held_for:?} {err}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("held by pid {} for ", child.0)),
            "{msg}"
        );
    }
    proceed.open();
    assert_eq!(child.wait(Duration::from_secs(30)), 0);
}

fn sigkilled_holder_is_reclaimed_at_once() {
    let path = TempPath::new("sigkill");
    let table = LockTable::open(&path, 16).unwrap();
    let held = Gate::new();
    let child = {
        let table = &table;
        let held = &held;
        fork(move || {
            let _g = table.lock("k", LockOptions::default()).unwrap(); // 30 s lease
            held.signal();
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    };
    held.await_signals(1);
    assert!(table.is_locked("k").unwrap());
    child.kill();
    let mut lock = Lock::new(&table, LockOptions::default()).unwrap();
    let elapsed = lock.lock("k").unwrap();
    // seen dead on the first look: well under the 30 s lease, in fact without sleeping
    assert!(elapsed < Duration::from_secs(1), "{elapsed:?}");
    print!("[waited {elapsed:?}] ");
    lock.unlock().unwrap();
}

/// Waiters sleep on their key's home word, which other keys share. Wake-ups from
/// releases of such a key say nothing about our holder: the waiter must still look at it,
/// or a dead holder keeps its key until the lease ends while a neighbour churns.
fn sigkilled_holder_is_reclaimed_while_its_home_churns() {
    let path = TempPath::new("sigkill-churn");
    let table = LockTable::open(&path, 8).unwrap();
    let (home, _) = {
        let _g = table.lock("a", LockOptions::default()).unwrap();
        table.debug_placement("a").unwrap()
    };
    let neighbour = (0..10_000)
        .map(|i| format!("b{i}"))
        .find(|k| {
            let _g = table.lock(k, LockOptions::default()).unwrap();
            table.debug_placement(k).unwrap().0 == home
        })
        .expect("no key shares the home of \"a\"");
    let held = Gate::new();
    let stop = Shared::new(1);
    let holder = {
        let (table, held) = (&table, &held);
        fork(move || {
            let _g = table.lock("a", LockOptions::default()).unwrap(); // 30 s lease
            held.signal();
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    };
    held.await_signals(1);
    let churners: Vec<Child> = (0..3)
        .map(|_| {
            let (table, stop, neighbour) = (&table, &stop, &neighbour);
            fork(move || {
                while stop.word(0).load(Ordering::SeqCst) == 0 {
                    let g = table.lock(neighbour, LockOptions::default()).unwrap();
                    std::thread::sleep(Duration::from_micros(500));
                    drop(g);
                }
                0
            })
        })
        .collect();
    // the waiter is asleep, and woken by the neighbour's releases, when the holder dies
    let killer = {
        let pid = holder.0;
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            common::signal::send(pid, libc::SIGKILL);
            Instant::now()
        })
    };
    let mut lock = Lock::new(&table, opts(30_000, 25_000)).unwrap();
    let result = lock.lock("a");
    let got = Instant::now();
    let killed = killer.join().unwrap();
    stop.word(0).store(1, Ordering::SeqCst);
    for c in &churners {
        assert_eq!(c.wait(Duration::from_secs(30)), 0);
    }
    holder.kill();
    result.unwrap();
    let after = got.saturating_duration_since(killed);
    // seen dead soon after the kill: far below the 30 s lease
    assert!(
        after < Duration::from_secs(3),
        "taken {after:?} after the kill"
    );
    print!("[taken {after:?} after the kill] ");
    lock.unlock().unwrap();
}

fn unrelated_process_attaches_by_path() {
    let path = TempPath::new("unrelated");
    let table = LockTable::open(&path, 16).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--role", "hold"])
        .arg(&path.0)
        .arg("shared-key")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "held");
    assert!(table.is_locked("shared-key").unwrap());
    assert!(table
        .try_lock_with_lease("shared-key", Duration::from_secs(30))
        .unwrap()
        .is_none());
    assert_eq!(table.holders()[0].pid, child.id());
    drop(child.stdin.take()); // EOF: the child unlocks and exits
    assert!(child.wait().unwrap().success());
    assert!(!table.is_locked("shared-key").unwrap());
}

fn permission_denied_is_a_typed_error() {
    let path = TempPath::new("perm");
    drop(LockTable::open(&path, 4).unwrap()); // mode 0600, owned by us
    let child = {
        let path = &path;
        fork(move || {
            // SAFETY: plain syscalls in a single-threaded child.
            unsafe {
                if libc::geteuid() == 0 {
                    // root reads anything: become nobody to meet the file's permissions
                    if libc::setgid(65534) != 0 || libc::setuid(65534) != 0 {
                        return 10;
                    }
                } else if libc::chmod(
                    std::ffi::CString::new(path.0.as_os_str().as_encoded_bytes())
                        .unwrap()
                        .as_ptr(),
                    0,
                ) != 0
                {
                    return 11;
                }
            }
            match LockTable::open(path, 4) {
                Err(Error::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::PermissionDenied =>
                {
                    0
                }
                other => {
                    eprintln!("{other:?}");
                    1
                }
            }
        })
    };
    assert_eq!(child.wait(Duration::from_secs(30)), 0);
}

fn a_full_filesystem_fails_at_open() {
    // A file-size limit stands in for a full /dev/shm: the space is reserved at creation,
    // so the failure is an error from `open`, not a SIGBUS at the first touch of a page.
    let path = TempPath::new("full");
    let child = {
        let path = &path;
        fork(move || {
            // SAFETY: plain syscalls in a single-threaded child.
            unsafe {
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                let limit = libc::rlimit {
                    rlim_cur: 1 << 20,
                    rlim_max: 1 << 20,
                };
                if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                    return 10;
                }
            }
            match LockTable::open(path, 100_000) {
                // 12.8 MB asked for, 1 MB allowed
                Err(Error::Io { source, .. }) if source.raw_os_error() == Some(libc::EFBIG) => {
                    if path.0.exists() {
                        1 // a half-made table must never appear under the path
                    } else {
                        0
                    }
                }
                other => {
                    eprintln!("{other:?}");
                    2
                }
            }
        })
    };
    assert_eq!(child.wait(Duration::from_secs(30)), 0);
    // and with room, the same call works
    let t = LockTable::open(&path, 100_000).unwrap();
    assert_eq!(t.capacity(), 100_000);
}

const ENTER: u32 = 1;
const EXIT: u32 = 2;
const KILL: u32 = 3;
const FAIL: u32 = 4;

/// One record of the chaos log, appended with a single `write` (atomic with O_APPEND).
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
    // SAFETY: writing REC bytes from a valid buffer to an open descriptor.
    let n = unsafe { libc::write(fd, rec.as_ptr().cast(), rec.len()) };
    assert_eq!(n, REC as isize);
}

const CHAOS_HOT: u32 = 4;
const CHAOS_KEYS: u32 = CHAOS_HOT + 300;

fn chaos_worker(table: &LockTable, fd: libc::c_int, stop: &Shared, seed: u64) -> i32 {
    let me = std::process::id();
    let opts = LockOptions {
        exptime: Duration::from_secs(30),
        timeout: Duration::from_secs(10),
        ..LockOptions::default()
    };
    let mut lock = Lock::new(table, opts).unwrap();
    let mut x = seed | 1;
    while stop.word(0).load(Ordering::Relaxed) == 0 {
        let r = xorshift(&mut x);
        let key = if r.is_multiple_of(2) {
            (r >> 8) as u32 % CHAOS_HOT
        } else {
            CHAOS_HOT + (r >> 8) as u32 % (CHAOS_KEYS - CHAOS_HOT)
        };
        if let Err(e) = lock.lock(format!("chaos:{key}")) {
            log(fd, FAIL, me, key, 0);
            eprintln!("lock: {e}");
            return 1;
        }
        let Some(token) = lock.token() else {
            log(fd, FAIL, me, key, 1);
            return 2;
        };
        log(fd, ENTER, me, key, token);
        match r % 16 {
            0 => std::thread::sleep(Duration::from_micros(200)),
            1..=4 => (0..(r >> 20) % 2000).for_each(|_| std::hint::spin_loop()),
            _ => {}
        }
        log(fd, EXIT, me, key, token);
        if let Err(e) = lock.unlock() {
            log(fd, FAIL, me, key, 2);
            eprintln!("unlock: {e}");
            return 3;
        }
    }
    0
}

fn chaos_sigkill_workers_at_random_moments() {
    const WORKERS: usize = 6;
    let secs: u64 = std::env::var("SHMLOCK_CHAOS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let path = TempPath::new("chaos");
    let table = LockTable::open(&path, 64).unwrap();
    let log_path = TempPath::new("chaos-log");
    let c_path = std::ffi::CString::new(log_path.0.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid path; the descriptor is shared by all children (O_APPEND).
    let fd = unsafe {
        libc::open(
            c_path.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
            0o600,
        )
    };
    assert!(fd >= 0);
    let stop = Shared::new(1);
    let mut seed = 0x5eed_u64;
    let spawn = |seed: u64| {
        let (table, stop) = (&table, &stop);
        fork(move || chaos_worker(table, fd, stop, seed))
    };
    let mut workers: Vec<Child> = (0..WORKERS as u64).map(|i| spawn(i + 1)).collect();
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut kills = 0u64;
    let mut x = 0x0dd_ba11_u64;
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_micros(xorshift(&mut x) % 15_000));
        let victim = (xorshift(&mut x) % WORKERS as u64) as usize;
        log(fd, KILL, workers[victim].0 as u32, 0, 0);
        workers[victim].kill(); // SIGKILL, then reaped
        kills += 1;
        seed += 1;
        workers[victim] = spawn(seed * 1_000_003);
    }
    stop.word(0).store(1, Ordering::SeqCst);
    for w in &workers {
        assert_eq!(
            w.wait(Duration::from_secs(60)),
            0,
            "a surviving worker failed"
        );
    }
    // SAFETY: our descriptor, closed once.
    unsafe { libc::close(fd) };

    // Replay the log: a second ENTER while a live (not killed) holder is inside is an
    // overlap; fencing tokens must grow per key; EXIT must match the holder.
    let bytes = std::fs::read(&log_path).unwrap();
    assert_eq!(bytes.len() % REC, 0);
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
    print!("[{kills} kills, {enters} critical sections] ");
    assert!(kills > 0 && enters > 0);
    assert_eq!((overlaps, bad_tokens, bad_exits), (0, 0, 0));

    // Every key can be taken now (reaping what the killed left), and then nothing is left.
    let opts = LockOptions {
        timeout: Duration::from_secs(5),
        ..LockOptions::default()
    };
    let mut lock = Lock::new(&table, opts).unwrap();
    for key in 0..CHAOS_KEYS {
        lock.lock(format!("chaos:{key}")).unwrap();
        lock.unlock().unwrap();
    }
    table.reap().unwrap();
    assert_eq!(table.occupancy(), 0);
}

#[cfg(feature = "redis")]
fn redis_paused_holder_loses_its_lease_and_its_late_unlock_is_refused() {
    let server = common::redis_server::RedisServer::start();
    let url = server.url();
    let held = Gate::new();
    let mut proceed = Gate::new();
    let child = {
        let (url, held, proceed) = (&url, &held, &mut proceed);
        fork(move || {
            let redis = shmlock::RedisLocks::open(url).unwrap();
            let mut lock = Lock::new(&redis, opts(300, 0)).unwrap();
            lock.lock("k").unwrap();
            held.signal();
            proceed.wait(); // SIGSTOPped somewhere around here, for longer than the lease
            match lock.unlock() {
                Err(Error::Expired) => 0,
                other => {
                    eprintln!("late unlock: {other:?}");
                    1
                }
            }
        })
    };
    held.await_signals(1);
    common::signal::send(child.0, libc::SIGSTOP);
    let redis = shmlock::RedisLocks::open(&url).unwrap();
    let mut lock = Lock::new(&redis, opts(30_000, 5_000)).unwrap();
    assert!(
        lock.lock("k").unwrap() > Duration::ZERO,
        "took the paused holder's lease"
    );
    common::signal::send(child.0, libc::SIGCONT);
    proceed.open();
    assert_eq!(child.wait(Duration::from_secs(30)), 0);
    // the late unlock did not delete the new owner's key
    assert!(redis.is_locked("k").unwrap());
    lock.unlock().unwrap();
    assert!(!redis.is_locked("k").unwrap());
}

// ---------------------------------------------------------------------------------------
// Roles: this binary started by a test as an unrelated process.

fn role(args: &[String]) -> i32 {
    match args.first().map(String::as_str) {
        // hold PATH KEY: take KEY, say "held", release when stdin closes
        Some("hold") => {
            let table = LockTable::open(&args[1], 16).unwrap();
            let guard = table.lock(&args[2], LockOptions::default()).unwrap();
            println!("held");
            std::io::stdout().flush().unwrap();
            let mut sink = String::new();
            while std::io::stdin().read_line(&mut sink).unwrap() > 0 {}
            guard.unlock().unwrap();
            0
        }
        other => {
            eprintln!("unknown role {other:?}");
            2
        }
    }
}
