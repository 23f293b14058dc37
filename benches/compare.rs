//! shmlock beside the kernel's inter-process locks, measured side by side in one run.
//!
//! ```sh
//! cargo bench --bench compare            # the whole table (about 6 minutes)
//! cargo bench --bench compare -- quick   # fewer rounds, for a smoke run
//! cargo bench --bench compare -- handoff # only the sections named (uncontended, handoff,
//!                                        # contended, scaling, load, attach)
//! ```
//!
//! 1. Uncontended lock+unlock pair: shmlock (one key; 1000 rotating keys; a new `Lock` per
//!    pair) vs a process-shared robust `pthread_mutex`, `flock` on an open descriptor, and
//!    open + `flock` + close of a per-key file.
//! 2. Handoff latency between two processes: the holder releases while the waiter sleeps in
//!    the kernel; release-to-acquire time, median and p99, at a 5 ms hold and at holds
//!    spread over 1-20 ms (how fast a sleeper wakes depends on how long it slept).
//! 3. Contended throughput: two processes on one key, tiny critical section, with the
//!    fraction of acquisitions that changed the owner.
//! 4. Scaling: 1, 2, 4 and 8 processes on distinct keys and 4 and 8 on one key, shmlock vs
//!    the robust mutex. With more processes than cores (the prefork norm) they time-share;
//!    distinct keys can scale only up to the number of cores.
//! 5. Load: the pair at 10 % vs 90 % of the capacity asked for, file bytes per key.
//! 6. Attach: opening a table of 1 M slots vs 1 K slots.
//!
//! Each figure is a median over repeated samples; goals are checked as ratios measured in
//! this same run, so a noisy machine shifts both sides alike. The goals, against the
//! robust mutex: the uncontended pair within 1.5x (one key and 1000 keys), the handoff
//! median within 1.1x and its p99 within 1.5x (at the 5 ms hold and over 1-20 ms holds),
//! two contending processes at least as fast; and of shmlock alone: the pair at 90 % load
//! within 1.3x of 10 %, attaching to 1 M slots within 2x of 1 K (docs/benchmarks.md).

mod common;

use std::hint::black_box;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::*;
use shmlock::{Lock, LockOptions, LockTable};

struct Row {
    section: &'static str,
    name: String,
    value: String,
}

struct Report {
    rows: Vec<Row>,
    goals: Vec<(String, bool)>,
}

impl Report {
    fn row(&mut self, section: &'static str, name: impl Into<String>, value: impl Into<String>) {
        let (name, value) = (name.into(), value.into());
        println!("  {name:<44} {value}");
        self.rows.push(Row {
            section,
            name,
            value,
        });
    }

    fn goal(&mut self, what: impl Into<String>, met: bool) {
        let what = what.into();
        println!("  goal: {what}: {}", if met { "met" } else { "MISSED" });
        self.goals.push((what, met));
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Median ns per call of `f` over `samples` samples of `iters` calls.
fn per_op(samples: usize, iters: u64, mut f: impl FnMut(u64)) -> f64 {
    for i in 0..iters / 10 {
        f(i); // warm up
    }
    median(
        (0..samples)
            .map(|_| {
                let t = Instant::now();
                for i in 0..iters {
                    f(i);
                }
                t.elapsed().as_nanos() as f64 / iters as f64
            })
            .collect(),
    )
}

fn opts(notify: bool) -> LockOptions {
    LockOptions {
        exptime: Duration::from_secs(60),
        timeout: Duration::from_secs(60),
        notify,
        ..LockOptions::default()
    }
}

struct Scale {
    samples: usize,
    iters: u64,
    rounds: usize,
    run: Duration,
}

fn uncontended(r: &mut Report, s: &Scale) {
    println!(
        "\n1. uncontended lock+unlock pair (ns, median of {} samples)",
        s.samples
    );
    let dir = scratch_dir("pair");
    let table = LockTable::open(dir.join("table"), 4096).unwrap();
    let keys: Vec<String> = (0..1000).map(|i| format!("bench:key:{i}")).collect();
    let o = opts(true);

    let mut lock = Lock::new(&table, o).unwrap();
    let one = per_op(s.samples, s.iters, |_| {
        lock.lock(black_box("bench:hot")).unwrap();
        lock.unlock().unwrap();
    });
    let rotating = per_op(s.samples, s.iters, |i| {
        lock.lock(black_box(&keys[(i % 1000) as usize])).unwrap();
        lock.unlock().unwrap();
    });
    let fresh = per_op(s.samples, s.iters, |_| {
        let mut l = Lock::new(&table, o).unwrap();
        l.lock(black_box("bench:hot")).unwrap();
        l.unlock().unwrap();
    });
    let mutex = RobustMutex::new();
    let robust = per_op(s.samples, s.iters, |_| {
        mutex.lock();
        mutex.unlock();
    });
    let fl = Flock::open(&dir.join("flock"));
    let flock = per_op(s.samples, s.iters / 10, |_| {
        fl.lock();
        fl.unlock();
    });
    let key_files: Vec<_> = (0..1000).map(|i| dir.join(format!("key-{i}"))).collect();
    let ofc = per_op(s.samples, s.iters / 50, |i| {
        open_flock_close(&key_files[(i % 1000) as usize]);
    });
    for (name, v) in [
        ("shmlock, one key", one),
        ("shmlock, 1000 rotating keys", rotating),
        ("shmlock, new Lock per pair", fresh),
        ("robust pthread_mutex (process-shared)", robust),
        ("flock on an open fd", flock),
        ("open + flock + close per key", ofc),
    ] {
        r.row("uncontended pair", name, format!("{v:.1} ns"));
    }
    r.row(
        "uncontended pair",
        "shmlock one key / robust mutex",
        format!("{:.2}x", one / robust),
    );
    r.row(
        "uncontended pair",
        "shmlock 1000 keys / robust mutex",
        format!("{:.2}x", rotating / robust),
    );
    r.goal(
        format!(
            "uncontended pair, one key <= 1.5x robust mutex ({:.2}x)",
            one / robust
        ),
        one / robust <= 1.5,
    );
    r.goal(
        format!(
            "uncontended pair, 1000 keys <= 1.5x robust mutex ({:.2}x)",
            rotating / robust
        ),
        rotating / robust <= 1.5,
    );
    drop(lock);
    drop(table);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Something two forked processes can lock. `make` runs in each process after the fork.
trait Kind {
    fn name(&self) -> String;
    fn make(&self) -> Box<dyn FnMut(bool)>; // true = lock, false = unlock
}

struct Shm {
    table: LockTable,
    notify: bool,
}

impl Kind for Shm {
    fn name(&self) -> String {
        format!(
            "shmlock (notify {})",
            if self.notify { "on" } else { "off" }
        )
    }
    fn make(&self) -> Box<dyn FnMut(bool)> {
        let table: &'static LockTable = Box::leak(Box::new(self.table.clone()));
        let mut lock = Lock::new(table, opts(self.notify)).unwrap();
        Box::new(move |acquire| {
            if acquire {
                lock.lock("hot").unwrap();
            } else {
                lock.unlock().unwrap();
            }
        })
    }
}

struct Mutex(&'static RobustMutex);

impl Kind for Mutex {
    fn name(&self) -> String {
        "robust pthread_mutex".into()
    }
    fn make(&self) -> Box<dyn FnMut(bool)> {
        let m = self.0;
        Box::new(move |acquire| if acquire { m.lock() } else { m.unlock() })
    }
}

struct FlockKind(std::path::PathBuf);

impl Kind for FlockKind {
    fn name(&self) -> String {
        "flock".into()
    }
    fn make(&self) -> Box<dyn FnMut(bool)> {
        let f = Flock::open(&self.0);
        Box::new(move |acquire| if acquire { f.lock() } else { f.unlock() })
    }
}

/// Handoff: the parent holds, the child asks and falls asleep, the parent releases after
/// `hold(round)`; the child stamps the time it got the lock. Returns the latencies in µs.
fn handoff(kind: &dyn Kind, rounds: usize, hold: impl Fn(u64) -> Duration) -> Vec<f64> {
    // words: 0 phase, 1 release stamp, 2.. latencies
    let w = shared_words(2 + rounds);
    let child = fork(|| {
        let mut lock = kind.make();
        for round in 0..rounds as u64 {
            while w[0].load(Ordering::SeqCst) != 2 * round + 1 {
                std::hint::spin_loop();
            }
            lock(true);
            let got = now_ns();
            let released = w[1].load(Ordering::SeqCst);
            w[2 + round as usize].store(got.saturating_sub(released), Ordering::SeqCst);
            lock(false);
            w[0].store(2 * round + 2, Ordering::SeqCst);
        }
    });
    let mut lock = kind.make();
    for round in 0..rounds as u64 {
        lock(true);
        w[0].store(2 * round + 1, Ordering::SeqCst);
        std::thread::sleep(hold(round));
        w[1].store(now_ns(), Ordering::SeqCst);
        lock(false);
        while w[0].load(Ordering::SeqCst) != 2 * round + 2 {
            std::thread::yield_now();
        }
    }
    wait(child);
    (0..rounds)
        .map(|i| w[2 + i].load(Ordering::SeqCst) as f64 / 1000.0)
        .collect()
}

/// Hold times spread evenly over 1-20 ms, the same sequence for every kind: how fast a
/// sleeper wakes depends on how long it slept and on where its timer stands, so one hold
/// time alone can favour either side.
fn spread_hold(batch: usize) -> impl Fn(u64) -> Duration {
    move |round| {
        let mut x = (batch as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ round;
        x ^= x >> 31;
        x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x ^= x >> 29;
        Duration::from_micros(1_000 + x % 19_001)
    }
}

/// shmlock (notify on, and off if `polling_too`), the robust mutex and flock, on a table
/// and a flock file in `dir`.
fn kinds(dir: &Path, polling_too: bool) -> Vec<Box<dyn Kind>> {
    let table = LockTable::open(dir.join("table"), 64).unwrap();
    let mutex: &'static RobustMutex = Box::leak(Box::new(RobustMutex::new()));
    let mut kinds: Vec<Box<dyn Kind>> = vec![Box::new(Shm {
        table: table.clone(),
        notify: true,
    })];
    if polling_too {
        kinds.push(Box::new(Shm {
            table,
            notify: false,
        }));
    }
    kinds.push(Box::new(Mutex(mutex)));
    kinds.push(Box::new(FlockKind(dir.join("flock"))));
    kinds
}

fn handoffs(r: &mut Report, s: &Scale) {
    println!(
        "\n2. handoff latency, release -> acquire in another process ({} rounds at a 5 ms \
         hold, {} at holds spread over 1-20 ms)",
        s.rounds,
        s.rounds / 2
    );
    let dir = scratch_dir("handoff");
    let kinds = kinds(&dir, true);
    // The kinds take turns in batches, so that a change in the machine's load falls on all.
    const BATCHES: usize = 10;
    // One batch of each kind first, thrown away: in two runs of this section alone, the
    // first batch found the two processes on different CPUs in 85 and 167 of its 200
    // rounds, the later batches in at most 22 (the polling kind aside), and the first
    // batch was always shmlock's.
    for k in &kinds {
        handoff(k.as_ref(), s.rounds.div_ceil(BATCHES), |_| {
            Duration::from_millis(5)
        });
    }
    let mut fixed = vec![Vec::new(); kinds.len()];
    // polling (notify off) sleeps its steps whatever the hold: left out of the spread
    let mut spread = vec![Vec::new(); kinds.len()];
    for batch in 0..BATCHES {
        for (i, k) in kinds.iter().enumerate() {
            let at_5ms = |_| Duration::from_millis(5);
            fixed[i].extend(handoff(k.as_ref(), s.rounds.div_ceil(BATCHES), at_5ms));
            if i != 1 {
                let rounds = (s.rounds / 2).div_ceil(BATCHES);
                spread[i].extend(handoff(k.as_ref(), rounds, spread_hold(batch)));
            }
        }
    }
    for (hold, lat) in [("5 ms hold", fixed), ("holds 1-20 ms", spread)] {
        let mut figures = Vec::new();
        for (k, mut l) in kinds.iter().zip(lat) {
            if l.is_empty() {
                figures.push((f64::NAN, f64::NAN));
                continue;
            }
            l.sort_by(f64::total_cmp);
            let (med, p99) = (percentile(&l, 0.5), percentile(&l, 0.99));
            r.row(
                "handoff",
                format!("{}, {hold}", k.name()),
                format!("median {med:.1} µs, p99 {p99:.1} µs"),
            );
            figures.push((med, p99));
        }
        let (shm, mutex) = (figures[0], figures[2]);
        r.goal(
            format!(
                "handoff median <= 1.1x robust mutex, {hold} ({:.2}x)",
                shm.0 / mutex.0
            ),
            shm.0 <= 1.1 * mutex.0,
        );
        r.goal(
            format!(
                "handoff p99 <= 1.5x robust mutex, {hold} ({:.2}x)",
                shm.1 / mutex.1
            ),
            shm.1 <= 1.5 * mutex.1,
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Forks `n` workers that start together and run `work(i, stop)` until the parent sets
/// `stop` after `run`. Returns the seconds they ran.
fn race(n: usize, run: Duration, work: impl Fn(usize, &AtomicU64)) -> f64 {
    let sync = shared_words(2); // 0: workers ready, 1: stop
    let pids: Vec<_> = (0..n)
        .map(|i| {
            let work = &work;
            fork(move || {
                sync[0].fetch_add(1, Ordering::SeqCst);
                while sync[0].load(Ordering::SeqCst) < n as u64 {
                    std::hint::spin_loop();
                }
                work(i, &sync[1]);
            })
        })
        .collect();
    while sync[0].load(Ordering::SeqCst) < n as u64 {
        std::thread::yield_now();
    }
    let t = Instant::now();
    std::thread::sleep(run);
    sync[1].store(1, Ordering::SeqCst);
    let secs = t.elapsed().as_secs_f64();
    pids.into_iter().for_each(wait);
    secs
}

/// `n` processes hammer one key for `run`: (acquisitions/s, fraction of owner changes).
fn contended(kind: &dyn Kind, n: usize, run: Duration) -> (f64, f64) {
    // words: 0 last owner, then n acquisition counts, then n owner-change counts
    let w = shared_words(1 + 2 * n);
    let secs = race(n, run, |i, stop| {
        let me = i as u64 + 1;
        let mut lock = kind.make();
        let (mut count, mut changes) = (0u64, 0u64);
        while stop.load(Ordering::Relaxed) == 0 {
            lock(true);
            if w[0].load(Ordering::Relaxed) != me {
                w[0].store(me, Ordering::Relaxed);
                changes += 1;
            }
            lock(false);
            count += 1;
        }
        w[1 + i].store(count, Ordering::SeqCst);
        w[1 + n + i].store(changes, Ordering::SeqCst);
    });
    let sum = |from: usize| {
        (from..from + n)
            .map(|i| w[i].load(Ordering::SeqCst))
            .sum::<u64>()
    };
    let (count, changes) = (sum(1), sum(1 + n));
    (count as f64 / secs, changes as f64 / count.max(1) as f64)
}

/// For each kind, the median (rate, owner-change fraction) of `runs` runs; the kinds take
/// turns, so that a change in the machine's load falls on all.
fn contended_runs(kinds: &[&dyn Kind], n: usize, run: Duration, runs: usize) -> Vec<(f64, f64)> {
    let mut all = vec![Vec::new(); kinds.len()];
    for _ in 0..runs {
        for (k, a) in kinds.iter().zip(&mut all) {
            a.push(contended(*k, n, run));
        }
    }
    all.into_iter()
        .map(|r| {
            (
                median(r.iter().map(|r| r.0).collect()),
                median(r.iter().map(|r| r.1).collect()),
            )
        })
        .collect()
}

fn contention(r: &mut Report, s: &Scale) {
    println!(
        "\n3. contended throughput, 2 processes on one key ({:?} each)",
        s.run
    );
    let dir = scratch_dir("contended");
    let kinds = kinds(&dir, false);
    let refs: Vec<&dyn Kind> = kinds.iter().map(|k| k.as_ref()).collect();
    let mut rates = Vec::new();
    for (k, (rate, changed)) in kinds.iter().zip(contended_runs(&refs, 2, s.run, 5)) {
        rates.push(rate);
        r.row(
            "contended",
            k.name(),
            format!(
                "{:.2} M acq/s, owner changed {:.1} %",
                rate / 1e6,
                changed * 100.0
            ),
        );
    }
    r.goal(
        format!(
            "contended, 2 processes >= 1.0x robust mutex ({:.2}x)",
            rates[0] / rates[1]
        ),
        rates[0] >= rates[1],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `procs` processes, each on its own key (shmlock) or its own mutex, for `run`: total
/// pairs per second.
fn distinct_keys(table: Option<&LockTable>, procs: usize, run: Duration) -> f64 {
    let counts = shared_words(procs);
    let mutexes: Vec<&'static RobustMutex> = (0..procs)
        .map(|_| &*Box::leak(Box::new(RobustMutex::new())))
        .collect();
    let secs = race(procs, run, |i, stop| {
        let mut pair: Box<dyn FnMut()> = match table {
            Some(table) => {
                let mut lock = Lock::new(table, opts(true)).unwrap();
                let key = format!("own-key-{i}");
                Box::new(move || {
                    lock.lock(&key).unwrap();
                    lock.unlock().unwrap();
                })
            }
            None => {
                let m = mutexes[i];
                Box::new(move || {
                    m.lock();
                    m.unlock();
                })
            }
        };
        let mut n = 0u64;
        while stop.load(Ordering::Relaxed) == 0 {
            for _ in 0..64 {
                pair();
            }
            n += 64;
        }
        counts[i].store(n, Ordering::SeqCst);
    });
    counts.iter().map(|c| c.load(Ordering::SeqCst)).sum::<u64>() as f64 / secs
}

fn scaling(r: &mut Report, s: &Scale) {
    println!("\n4. scaling: processes on distinct keys and on one key (2 cores here)");
    let dir = scratch_dir("scaling");
    let table = LockTable::open(dir.join("table"), 4096).unwrap();
    let mut ones = (0.0, 0.0);
    for procs in [1, 2, 4, 8] {
        let (mut shm, mut mutex) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            shm.push(distinct_keys(Some(&table), procs, s.run));
            mutex.push(distinct_keys(None, procs, s.run));
        }
        let (shm, mutex) = (median(shm), median(mutex));
        if procs == 1 {
            ones = (shm, mutex);
        }
        r.row(
            "scaling",
            format!("{procs} process(es), distinct keys"),
            format!(
                "shmlock {:.1} M pairs/s ({:.2}x one), mutex {:.1} M ({:.2}x one): {:.2}x mutex",
                shm / 1e6,
                shm / ones.0,
                mutex / 1e6,
                mutex / ones.1,
                shm / mutex
            ),
        );
    }
    let kinds = kinds(&dir, false);
    for procs in [4, 8] {
        let pair = [kinds[0].as_ref(), kinds[1].as_ref()];
        let runs = contended_runs(&pair, procs, s.run, 3);
        let ((shm, shm_changed), (mutex, mutex_changed)) = (runs[0], runs[1]);
        r.row(
            "scaling",
            format!("{procs} processes, one key"),
            format!(
                "shmlock {:.2} M acq/s (owner changed {:.1} %), mutex {:.2} M ({:.1} %): {:.2}x mutex",
                shm / 1e6,
                shm_changed * 100.0,
                mutex / 1e6,
                mutex_changed * 100.0,
                shm / mutex
            ),
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn load(r: &mut Report, s: &Scale) {
    println!("\n5. load: the pair on free keys with part of the capacity held");
    let dir = scratch_dir("load");
    // The pair on keys that are not held, with 10 % or 90 % of the capacity held.
    let cap = 10_000;
    let mut file_bytes = 0;
    let mut at_load = |pct: usize| {
        let path = dir.join(format!("load-{pct}"));
        let t = LockTable::open(&path, cap).unwrap();
        file_bytes = std::fs::metadata(&path).unwrap().len();
        let held: Vec<_> = (0..cap * pct / 100)
            .map(|i| {
                t.try_lock_with_lease(format!("held-{i}"), Duration::ZERO)
                    .unwrap()
                    .unwrap()
            })
            .collect();
        let keys: Vec<String> = (0..1000).map(|i| format!("probe-{i}")).collect();
        let mut lock = Lock::new(&t, opts(true)).unwrap();
        let v = per_op(s.samples, s.iters, |i| {
            lock.lock(&keys[(i % 1000) as usize]).unwrap();
            lock.unlock().unwrap();
        });
        drop(held);
        v
    };
    let low = at_load(10);
    let high = at_load(90);
    r.row("load", "pair at 10 % load", format!("{low:.1} ns"));
    r.row("load", "pair at 90 % load", format!("{high:.1} ns"));
    r.row(
        "load",
        format!("file bytes per key at capacity {cap}"),
        format!("{:.0} B", file_bytes as f64 / cap as f64),
    );
    r.goal(
        format!("90 % load <= 1.3x 10 % load ({:.2}x)", high / low),
        high / low <= 1.3,
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn attach(r: &mut Report) {
    println!("\n6. attach");
    let dir = scratch_dir("attach");
    let attach = |slots: usize| {
        let path = dir.join(format!("attach-{slots}"));
        drop(LockTable::open(&path, slots).unwrap());
        let us = median(
            (0..51)
                .map(|_| {
                    let t = Instant::now();
                    let table = LockTable::open(&path, slots).unwrap();
                    let us = t.elapsed().as_secs_f64() * 1e6;
                    drop(table);
                    us
                })
                .collect(),
        );
        let _ = std::fs::remove_file(&path);
        us
    };
    let small = attach(1 << 10);
    let big = attach(1 << 20);
    r.row("attach", "attach to capacity 1 K", format!("{small:.1} µs"));
    r.row("attach", "attach to capacity 1 M", format!("{big:.1} µs"));
    r.goal(
        format!(
            "attach does not grow with size: 1 M <= 2x 1 K ({:.2}x)",
            big / small
        ),
        big <= 2.0 * small,
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn main() {
    // cargo bench passes --bench; "quick" shortens everything for a smoke run
    let quick = std::env::args().any(|a| a == "quick");
    let s = if quick {
        Scale {
            samples: 3,
            iters: 100_000,
            rounds: 200,
            run: Duration::from_millis(200),
        }
    } else {
        Scale {
            samples: 11,
            iters: 2_000_000,
            rounds: 2000,
            run: Duration::from_secs(1),
        }
    };
    let mut r = Report {
        rows: Vec::new(),
        goals: Vec::new(),
    };
    // section names given on the command line pick sections; none: all
    let picked: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-') && a != "quick")
        .collect();
    let run = |name: &str| picked.is_empty() || picked.iter().any(|p| p == name);
    if run("uncontended") {
        uncontended(&mut r, &s);
    }
    if run("handoff") {
        handoffs(&mut r, &s);
    }
    if run("contended") {
        contention(&mut r, &s);
    }
    if run("scaling") {
        scaling(&mut r, &s);
    }
    if run("load") {
        load(&mut r, &s);
    }
    if run("attach") {
        attach(&mut r);
    }

    println!("\n| section | what | median |\n|---|---|---|");
    for row in &r.rows {
        println!("| {} | {} | {} |", row.section, row.name, row.value);
    }
    println!("\n| goal | |\n|---|---|");
    for (what, met) in &r.goals {
        println!("| {what} | {} |", if *met { "met" } else { "missed" });
    }
}
