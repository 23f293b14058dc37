//! [`SharedDict`] get/set of 64-byte values, beside an in-process `RwLock<HashMap>` and
//! Redis on loopback, measured side by side in one run.
//!
//! ```sh
//! cargo bench --bench dict --all-features        # the whole table (about 30 s)
//! cargo bench --bench dict -- quick              # fewer, shorter rounds (a smoke run)
//! SHMLOCK_BENCH_QUICK=1 cargo bench --bench dict # the same
//! cargo bench --bench dict -- single full        # only the sections named (single, procs, full, big, lists, writers)
//! ```
//!
//! 1. One process, one thread, 1024 keys, 64-byte values: `get` of a present key (and
//!    `get_with`, which reads into a buffer the thread reuses) and `set`
//!    overwriting a present key, for `SharedDict` (capacity 4096, file under /dev/shm), a
//!    `std::sync::RwLock<HashMap<Vec<u8>, Vec<u8>>>` (a get clones the value out under the
//!    read lock, as a cache returns an owned copy; a set inserts owned copies of key and
//!    value under the write lock) and, with the `redis` feature, `GET`/`SET` on a private
//!    redis-server over loopback with the sync `redis` client. The candidates run
//!    interleaved, sample by sample, so a noisy moment hits all of them alike; each figure
//!    is the median over the samples.
//! 2. Across processes (forked; the parent is single-threaded when it forks): 2 reader
//!    processes `get` 16 hot keys while 1 writer process `set`s the same keys without pause,
//!    for a fixed time, against the same readers with no writer (and the same with one
//!    reader, since with 2 readers + 1 writer a 2-core machine has more busy processes than
//!    cores). Reports reads/s per reader and writes/s (wall clock), and, since on a shared
//!    machine wall-clock rates follow the CPU the processes got, CPU ns per operation, the
//!    share of a core each got and how often each went to sleep; checks that no read saw a
//!    torn value. Counters come back through a shared file mapping.
//! 3. A full dict: `set` of never-seen keys (each evicts the least recently used entry of
//!    its neighbourhood) against `set` overwriting present keys, plus `get` hit and miss
//!    (never-seen keys) on the full dict.
//! 4. A big dict (65,536 entries, past the caches): `get` hit against `get` miss.
//! 5. A list as a queue: `rpush` + `lpop` of a 16-byte element on a list kept at 0, 1,000
//!    and 50,000 elements (in the heap), beside a `Mutex<VecDeque<Vec<u8>>>`. A list in
//!    the heap changes at its edges, but a push writes it a new index (4 bytes for each
//!    256 of the list: docs/dict.md): this shows what that costs.
//! 6. Two writers: this process `set`s a key every 200 µs while a forked process `set`s
//!    back to back, into the same dict, against the same beside a writer busy on a dict of
//!    its own (the CPU shared alike, the lock not): the waits of this process's sets
//!    (median, 99th percentile, longest) and the other's sets per second. A writer that
//!    waits gets the lock's next turn (docs/dict.md): without that, the back-to-back writer
//!    took the lock again at each release before the writer it woke could run.
//!
//! The Redis rows need `redis-server` on the PATH (`bash scripts/redis-server.sh`); without
//! it they are skipped. Files go to /dev/shm (or the temp dir) and are removed at the end.

#[cfg(feature = "redis")]
#[path = "../tests/common/redis_server.rs"]
mod redis_server;

use std::collections::HashMap;
use std::hint::black_box;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;
use std::time::{Duration, Instant};

use memmap2::MmapRaw;
use shmlock::SharedDict;

const KEYS: usize = 1024;
const VALUE_LEN: usize = 64;
const CAPACITY: usize = 4096;
const HOT_KEYS: usize = 16;

struct Scale {
    /// Samples per candidate in sections 1 and 3: many short ones (a few ms each), so that
    /// on a busy machine the median is a sample no other process interrupted.
    samples: usize,
    /// Operations per sample of an in-memory candidate.
    iters: u64,
    /// Operations per sample of a Redis candidate (a round trip each).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    redis_iters: u64,
    /// Rounds of each process scenario in section 2, and how long each runs.
    rounds: usize,
    run: Duration,
}

/// One line of the final table.
struct Row {
    section: &'static str,
    what: String,
    median: String,
    spread: String,
}

#[derive(Default)]
struct Report {
    rows: Vec<Row>,
}

impl Report {
    fn row(
        &mut self,
        section: &'static str,
        what: impl Into<String>,
        median: String,
        spread: String,
    ) {
        let what = what.into();
        println!("  {what:<52} {median:>14}  {spread}");
        self.rows.push(Row {
            section,
            what,
            median,
            spread,
        });
    }

    fn op(&mut self, section: &'static str, what: impl Into<String>, s: &Stats) {
        self.row(
            section,
            what,
            fmt_ns(s.median),
            format!("p25-p75 {}-{}", fmt_ns(s.p25), fmt_ns(s.p75)),
        );
    }

    fn ratio(&mut self, section: &'static str, what: impl Into<String>, r: f64) {
        self.row(section, what, format!("{r:.2}x"), String::new());
    }
}

fn fmt_ns(ns: f64) -> String {
    if ns >= 10_000.0 {
        format!("{:.1} µs", ns / 1000.0)
    } else {
        format!("{ns:.1} ns")
    }
}

/// Median and quartiles of some samples.
#[derive(Clone, Copy)]
struct Stats {
    median: f64,
    p25: f64,
    p75: f64,
}

fn stats(mut v: Vec<f64>) -> Stats {
    v.sort_by(f64::total_cmp);
    let at = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    Stats {
        median: at(0.5),
        p25: at(0.25),
        p75: at(0.75),
    }
}

/// Something to time: `iters` calls of `f` make one sample; `f` gets the call's index.
struct Candidate<'a> {
    iters: u64,
    f: &'a mut dyn FnMut(u64),
}

impl<'a> Candidate<'a> {
    fn new(iters: u64, f: &'a mut dyn FnMut(u64)) -> Candidate<'a> {
        Candidate { iters, f }
    }
}

/// Nanoseconds per call of each candidate, over `samples` rounds in which every candidate
/// runs one sample in turn: interleaved, so a noisy moment hits all of them alike.
fn interleaved(samples: usize, candidates: &mut [Candidate<'_>]) -> Vec<Stats> {
    for c in candidates.iter_mut() {
        for i in 0..c.iters / 10 {
            (c.f)(i); // warm up
        }
    }
    let mut times = vec![Vec::with_capacity(samples); candidates.len()];
    for _ in 0..samples {
        for (c, t) in candidates.iter_mut().zip(&mut times) {
            let start = Instant::now();
            for i in 0..c.iters {
                (c.f)(i);
            }
            t.push(start.elapsed().as_nanos() as f64 / c.iters as f64);
        }
    }
    times.into_iter().map(stats).collect()
}

/// Where the bench's files go: /dev/shm where there is one. Files only, no directories.
fn scratch(name: &str) -> PathBuf {
    let dir = if std::path::Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let path = dir.join(format!("shmlock-bench-dict-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

/// A dict in a fresh file, removed again on drop.
struct TempDict {
    dict: SharedDict,
    path: PathBuf,
}

impl TempDict {
    fn new(name: &str) -> TempDict {
        let path = scratch(name);
        let dict = SharedDict::open(&path, CAPACITY, VALUE_LEN).expect("create the dict");
        TempDict { dict, path }
    }
}

impl Drop for TempDict {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn key(i: usize) -> Vec<u8> {
    format!("bench:key:{i:05}").into_bytes()
}

/// Key `i` of `keys`, cycling: made before the clock starts, so a timed read builds none.
fn nth<K: AsRef<[u8]>>(keys: &[K], i: u64) -> &[u8] {
    black_box(keys[i as usize % keys.len()].as_ref())
}

/// A 12-byte binary key: a 4-byte prefix and a counter, built without allocating.
fn counted_key(prefix: &[u8; 4], n: u64) -> [u8; 12] {
    let mut k = [0u8; 12];
    k[..4].copy_from_slice(prefix);
    k[4..].copy_from_slice(&n.to_le_bytes());
    k
}

// ---------------------------------------------------------------------------------------
// 1. One process

fn single_process(r: &mut Report, s: &Scale) {
    println!(
        "\n1. one process, one thread: {KEYS} keys, {VALUE_LEN}-byte values (median of {} interleaved samples)",
        s.samples
    );
    let keys: Vec<Vec<u8>> = (0..KEYS).map(key).collect();
    let value = [b'v'; VALUE_LEN];

    let t = TempDict::new("single");
    let dict = &t.dict;
    let map: RwLock<HashMap<Vec<u8>, Vec<u8>>> = RwLock::new(HashMap::new());
    for k in &keys {
        dict.set(k, &value, Duration::ZERO).unwrap();
        map.write().unwrap().insert(k.clone(), value.to_vec());
    }
    let k = |i: u64| black_box(keys[i as usize % KEYS].as_slice());

    let mut dict_get = |i| {
        let item = dict.get(k(i)).unwrap();
        assert!(black_box(item).is_some());
    };
    let mut dict_get_with = |i| {
        let len = dict
            .get_with(k(i), |item| match item.value {
                shmlock::ValueRef::Bytes(b) => black_box(b).len(),
                _ => 0,
            })
            .unwrap();
        assert_eq!(len, Some(VALUE_LEN));
    };
    let mut dict_set = |i| {
        let _ = black_box(dict.set(k(i), &value, Duration::ZERO).unwrap());
    };
    let mut map_get = |i| {
        let v = map.read().unwrap().get(k(i)).cloned();
        assert!(black_box(v).is_some());
    };
    let mut map_set = |i| {
        let old = map.write().unwrap().insert(k(i).to_vec(), value.to_vec());
        black_box(old);
    };

    // Two connections, so that each candidate owns one.
    #[cfg(feature = "redis")]
    let server = std::panic::catch_unwind(redis_server::RedisServer::start);
    #[cfg(feature = "redis")]
    let mut redis_cons = match &server {
        Ok(server) => {
            let connect = || {
                redis::Client::open(server.url())
                    .unwrap()
                    .get_connection()
                    .unwrap()
            };
            let (mut get_con, set_con) = (connect(), connect());
            for k in &keys {
                redis::cmd("SET")
                    .arg(k)
                    .arg(&value[..])
                    .query::<()>(&mut get_con)
                    .unwrap();
            }
            Some((get_con, set_con))
        }
        Err(_) => {
            println!("  (redis-server did not start: Redis rows skipped)");
            None
        }
    };
    #[cfg(feature = "redis")]
    let (mut redis_get, mut redis_set);

    let mut candidates = vec![
        Candidate {
            iters: s.iters,
            f: &mut dict_get,
        },
        Candidate {
            iters: s.iters,
            f: &mut dict_get_with,
        },
        Candidate {
            iters: s.iters,
            f: &mut map_get,
        },
        Candidate {
            iters: s.iters,
            f: &mut dict_set,
        },
        Candidate {
            iters: s.iters,
            f: &mut map_set,
        },
    ];
    #[cfg(feature = "redis")]
    if let Some((get_con, set_con)) = redis_cons.as_mut() {
        redis_get = |i| {
            let v: Option<Vec<u8>> = redis::cmd("GET").arg(k(i)).query(get_con).unwrap();
            assert_eq!(black_box(v).map(|v| v.len()), Some(VALUE_LEN));
        };
        redis_set = |i| {
            redis::cmd("SET")
                .arg(k(i))
                .arg(&value[..])
                .query::<()>(set_con)
                .unwrap();
        };
        candidates.push(Candidate {
            iters: s.redis_iters,
            f: &mut redis_get,
        });
        candidates.push(Candidate {
            iters: s.redis_iters,
            f: &mut redis_set,
        });
    }

    let m = interleaved(s.samples, &mut candidates);
    drop(candidates);
    const S: &str = "1. one process";
    r.op(S, "SharedDict get (hit)", &m[0]);
    r.op(S, "SharedDict get_with (hit, no owned copy)", &m[1]);
    r.op(S, "RwLock<HashMap> get (read lock, clone out)", &m[2]);
    r.op(S, "SharedDict set (overwrite)", &m[3]);
    r.op(S, "RwLock<HashMap> set (write lock, insert)", &m[4]);
    if m.len() > 5 {
        r.op(S, "Redis GET (loopback, sync client)", &m[5]);
        r.op(S, "Redis SET (loopback, sync client)", &m[6]);
    }
    r.ratio(
        S,
        "get: SharedDict / RwLock<HashMap>",
        m[0].median / m[2].median,
    );
    r.ratio(
        S,
        "get_with: SharedDict / RwLock<HashMap> get",
        m[1].median / m[2].median,
    );
    r.ratio(
        S,
        "set: SharedDict / RwLock<HashMap>",
        m[3].median / m[4].median,
    );
    if m.len() > 5 {
        r.ratio(S, "get: Redis / SharedDict", m[5].median / m[0].median);
        r.ratio(S, "set: Redis / SharedDict", m[6].median / m[3].median);
    }
}

// ---------------------------------------------------------------------------------------
// 2. Across processes

/// Counters in a file mapping that forked children share with the parent.
struct Shared {
    map: MmapRaw,
    words: usize,
    path: PathBuf,
}

impl Shared {
    fn new(words: usize) -> Shared {
        let path = scratch("counters");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .expect("counters file");
        file.set_len(words as u64 * 8).expect("counters file size");
        Shared {
            map: MmapRaw::map_raw(&file).expect("map the counters"),
            words,
            path,
        }
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        assert!(i < self.words);
        // SAFETY: in bounds, 8-aligned (the mapping is page-aligned), zero-filled by
        // set_len, alive as long as `self`, and only ever accessed as atomics.
        unsafe { AtomicU64::from_ptr(self.map.as_mut_ptr().cast::<u64>().add(i)) }
    }

    fn clear(&self) {
        for i in 0..self.words {
            self.word(i).store(0, Ordering::SeqCst);
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

// Words of the counters mapping: control, then CHILD_WORDS per child.
const GO: usize = 0;
const STOP: usize = 1;
const READY: usize = 2;
const CHILD_BASE: usize = 3;
const OPS: usize = 0;
const BAD: usize = 1;
const WALL_NS: usize = 2;
const CPU_NS: usize = 3;
const SLEEPS: usize = 4;
const CHILD_WORDS: usize = 5;

fn cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec and the clock id is a constant.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Voluntary context switches of this process so far: how often it went to sleep.
fn sleeps() -> u64 {
    // SAFETY: `rusage` is plain data, for which all zeroes is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    ru.ru_nvcsw as u64
}

fn threads_of_this_process() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(1, |d| d.count())
}

/// Forks a child that runs `f` and exits; a panic exits with status 1.
fn fork(f: impl FnOnce()) -> libc::pid_t {
    assert_eq!(
        threads_of_this_process(),
        1,
        "fork only while single-threaded"
    );
    // SAFETY: the parent is single-threaded here (checked above), so the child is a full,
    // consistent copy of it and may run any code.
    match unsafe { libc::fork() } {
        -1 => panic!("fork: {}", std::io::Error::last_os_error()),
        0 => {
            let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_ok();
            // SAFETY: ends the child without running the parent's exit handlers or
            // flushing the parent's buffers a second time.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) }
        }
        pid => pid,
    }
}

fn wait(pid: libc::pid_t) {
    let mut status = 0;
    // SAFETY: waits for our own child; `status` is a valid out-pointer.
    let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(rc, pid, "waitpid: {}", std::io::Error::last_os_error());
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "a child failed"
    );
}

/// The body of a child: says it is ready, waits for GO, runs `step` in batches until STOP
/// and leaves its counters in its words.
fn child_loop(shared: &Shared, me: usize, mut step: impl FnMut(u64) -> bool) {
    let base = CHILD_BASE + me * CHILD_WORDS;
    shared.word(READY).fetch_add(1, Ordering::SeqCst);
    while shared.word(GO).load(Ordering::SeqCst) == 0 {
        std::thread::sleep(Duration::from_micros(100));
    }
    let (start, cpu0, sleeps0) = (Instant::now(), cpu_ns(), sleeps());
    let (mut n, mut bad) = (0u64, 0u64);
    while shared.word(STOP).load(Ordering::Relaxed) == 0 {
        for _ in 0..64 {
            bad += u64::from(!step(n));
            n += 1;
        }
    }
    let (wall, cpu) = (start.elapsed().as_nanos() as u64, cpu_ns() - cpu0);
    shared
        .word(base + SLEEPS)
        .store(sleeps() - sleeps0, Ordering::SeqCst);
    shared.word(base + OPS).store(n, Ordering::SeqCst);
    shared.word(base + BAD).store(bad, Ordering::SeqCst);
    shared.word(base + WALL_NS).store(wall, Ordering::SeqCst);
    shared.word(base + CPU_NS).store(cpu, Ordering::SeqCst);
}

/// One child's result: operations per second (wall clock), CPU ns per operation, the
/// share of a core it got, how often per second it went to sleep (a reader that waits out
/// a descheduled writer, or a writer that waits for the writer lock), failed operations.
struct ChildResult {
    per_sec: f64,
    cpu_per_op: f64,
    cpu_share: f64,
    sleeps_per_sec: f64,
    bad: u64,
}

/// Runs `readers` reader processes, and a writer process if `writer`, for `run`.
/// Returns the readers' results and the writer's.
fn run_scenario(
    dict: &SharedDict,
    shared: &Shared,
    keys: &[Vec<u8>],
    readers: usize,
    writer: bool,
    run: Duration,
) -> (Vec<ChildResult>, Option<ChildResult>) {
    shared.clear();
    let mut pids = Vec::new();
    for me in 0..readers {
        pids.push(fork(|| {
            child_loop(shared, me, |n| {
                match dict.get(&keys[n as usize % keys.len()]) {
                    // A value is 64 copies of one byte: anything else is a torn read.
                    Ok(Some(item)) => item
                        .value
                        .as_bytes()
                        .is_some_and(|v| v.len() == VALUE_LEN && v.iter().all(|&b| b == v[0])),
                    _ => false,
                }
            });
        }));
    }
    if writer {
        pids.push(fork(|| {
            child_loop(shared, readers, |n| {
                let v = [n as u8; VALUE_LEN];
                dict.set(&keys[n as usize % keys.len()], &v, Duration::ZERO)
                    .is_ok()
            });
        }));
    }
    let children = readers + usize::from(writer);
    while shared.word(READY).load(Ordering::SeqCst) < children as u64 {
        std::thread::sleep(Duration::from_micros(200));
    }
    shared.word(GO).store(1, Ordering::SeqCst);
    std::thread::sleep(run);
    shared.word(STOP).store(1, Ordering::SeqCst);
    for pid in pids {
        wait(pid);
    }
    let result = |me: usize| {
        let w = |i: usize| {
            shared
                .word(CHILD_BASE + me * CHILD_WORDS + i)
                .load(Ordering::SeqCst)
        };
        let ops = w(OPS).max(1) as f64;
        ChildResult {
            per_sec: ops / (w(WALL_NS) as f64 / 1e9),
            cpu_per_op: w(CPU_NS) as f64 / ops,
            cpu_share: w(CPU_NS) as f64 / w(WALL_NS).max(1) as f64,
            sleeps_per_sec: w(SLEEPS) as f64 / (w(WALL_NS).max(1) as f64 / 1e9),
            bad: w(BAD),
        }
    };
    (
        (0..readers).map(result).collect(),
        writer.then(|| result(readers)),
    )
}

fn across_processes(r: &mut Report, s: &Scale) {
    println!(
        "\n2. across processes: readers get {HOT_KEYS} hot keys while a writer process sets them \
         ({} interleaved rounds of {} ms)",
        s.rounds,
        s.run.as_millis()
    );
    let t = TempDict::new("procs");
    let dict = &t.dict;
    let keys: Vec<Vec<u8>> = (0..HOT_KEYS).map(key).collect();
    for k in &keys {
        let _ = dict.set(k, &[0u8; VALUE_LEN], Duration::ZERO).unwrap();
    }
    let shared = Shared::new(CHILD_BASE + 3 * CHILD_WORDS);
    // (readers, writer)
    let scenarios = [(2, true), (2, false), (1, true), (1, false)];
    let mut readers_of: Vec<Vec<ChildResult>> = scenarios.iter().map(|_| Vec::new()).collect();
    let mut writer_of: Vec<Vec<ChildResult>> = scenarios.iter().map(|_| Vec::new()).collect();
    for _ in 0..s.rounds {
        for (i, &(readers, writer)) in scenarios.iter().enumerate() {
            let (rs, w) = run_scenario(dict, &shared, &keys, readers, writer, s.run);
            readers_of[i].extend(rs);
            writer_of[i].extend(w);
        }
    }
    const S: &str = "2. across processes";
    let summary = |cs: &[ChildResult]| {
        (
            stats(cs.iter().map(|c| c.per_sec).collect()),
            stats(cs.iter().map(|c| c.cpu_per_op).collect()).median,
            stats(cs.iter().map(|c| c.cpu_share).collect()).median,
            stats(cs.iter().map(|c| c.sleeps_per_sec).collect()).median,
        )
    };
    let row = |r: &mut Report, what: String, cs: &[ChildResult], unit: &str| {
        let (rate, cpu, share, sleeps) = summary(cs);
        r.row(
            S,
            what,
            format!("{:.2} M/s", rate.median / 1e6),
            format!(
                "p25-p75 {:.2}-{:.2} M/s; {cpu:.1} CPU ns/{unit}; {:.0} % of a core; \
                 {sleeps:.0} sleeps/s",
                rate.p25 / 1e6,
                rate.p75 / 1e6,
                share * 100.0
            ),
        );
    };
    for (i, &(readers, writer)) in scenarios.iter().enumerate() {
        let who = format!(
            "{readers} reader{}, {}",
            if readers > 1 { "s" } else { "" },
            if writer { "1 writer" } else { "no writer" }
        );
        row(
            r,
            format!("{who}: reads/s per reader"),
            &readers_of[i],
            "read",
        );
        if writer {
            row(r, format!("{who}: writes/s"), &writer_of[i], "write");
        }
    }
    for (with, without) in [(0, 1), (2, 3)] {
        let n = scenarios[with].0;
        let (rate_w, cpu_w, ..) = summary(&readers_of[with]);
        let (rate_wo, cpu_wo, ..) = summary(&readers_of[without]);
        r.ratio(
            S,
            format!("{n} reader(s): reads/s per reader, with writer / without"),
            rate_w.median / rate_wo.median,
        );
        r.ratio(
            S,
            format!("{n} reader(s): CPU ns per read, with writer / without"),
            cpu_w / cpu_wo,
        );
    }
    let bad: u64 = readers_of
        .iter()
        .chain(&writer_of)
        .flatten()
        .map(|c| c.bad)
        .sum();
    r.row(
        S,
        "torn or missing reads, failed writes",
        bad.to_string(),
        String::new(),
    );
    assert_eq!(bad, 0, "a reader saw a torn value");
}

// ---------------------------------------------------------------------------------------
// 3. A full dict

fn full_dict(r: &mut Report, s: &Scale) {
    println!(
        "\n3. a full dict (capacity {CAPACITY}): set of new keys (evicting) vs set of present keys \
         (median of {} interleaved samples)",
        s.samples
    );
    let value = [b'f'; VALUE_LEN];
    // Two dicts of one geometry, both full: `evicting` takes only new keys, `steady` only
    // overwrites, so neither candidate changes what the other finds.
    let evicting = TempDict::new("full-evicting");
    let steady = TempDict::new("full-steady");
    for t in [&evicting, &steady] {
        for n in 0..4 * CAPACITY as u64 {
            let _ = t
                .dict
                .set(counted_key(b"fill", n), &value, Duration::ZERO)
                .unwrap();
        }
    }
    let present = steady.dict.keys(0).unwrap();
    let stride = (present.len() / KEYS).max(1);
    let present: Vec<Vec<u8>> = present.into_iter().step_by(stride).take(KEYS).collect();
    println!(
        "  after filling with {} keys: {} of {CAPACITY} slots used, {} evictions",
        4 * CAPACITY,
        steady.dict.len(),
        steady.dict.evictions()
    );

    // Absent keys made before the clock starts, as the present ones are: a key built in
    // the timed loop (a 4-byte and an 8-byte store) stalls the hash's first 8-byte load on
    // store forwarding, which doubled a miss (15 -> 30 ns) and is the caller's cost.
    let absent: Vec<[u8; 12]> = (0..KEYS as u64).map(|n| counted_key(b"miss", n)).collect();
    let (mut new_n, mut forcible) = (0u64, 0u64);
    let (ev, st) = (&evicting.dict, &steady.dict);
    let p = |i: u64| black_box(present[i as usize % present.len()].as_slice());
    let mut set_new = |_| {
        new_n += 1;
        let stored = ev
            .set(
                black_box(counted_key(b"new:", new_n)),
                &value,
                Duration::ZERO,
            )
            .unwrap();
        forcible += u64::from(stored.forcible);
    };
    let mut set_present = |i| {
        let _ = black_box(st.set(p(i), &value, Duration::ZERO).unwrap());
    };
    let mut get_hit = |i| {
        assert!(black_box(st.get(p(i)).unwrap()).is_some());
    };
    let mut get_miss = |i| {
        assert!(black_box(st.get(nth(&absent, i)).unwrap()).is_none());
    };
    let m = interleaved(
        s.samples,
        &mut [
            Candidate::new(s.iters / 4, &mut set_new),
            Candidate::new(s.iters / 4, &mut set_present),
            Candidate::new(s.iters / 4, &mut get_hit),
            Candidate::new(s.iters / 4, &mut get_miss),
        ],
    );
    const S: &str = "3. full dict";
    r.op(S, "set of a new key (evicting)", &m[0]);
    r.op(S, "set of a present key (overwrite)", &m[1]);
    r.op(S, "get hit", &m[2]);
    r.op(S, "get miss", &m[3]);
    r.ratio(
        S,
        "set: new (evicting) / present",
        m[0].median / m[1].median,
    );
    r.ratio(S, "get: miss / hit", m[3].median / m[2].median);
    r.row(
        S,
        "new-key sets that evicted a live entry",
        format!("{:.1} %", 100.0 * forcible as f64 / new_n.max(1) as f64),
        format!("{forcible} of {new_n}"),
    );
}

// ---------------------------------------------------------------------------------------
// 4. A big dict

/// Entries of the big dict: 65,536 of 384 bytes (25 MiB), past the caches and the TLB.
const BIG_CAPACITY: usize = 65_536;

fn big_dict(r: &mut Report, s: &Scale) {
    println!(
        "\n4. a big dict (capacity {BIG_CAPACITY}, full): get hit vs get miss (median of {} \
         interleaved samples)",
        s.samples
    );
    let path = scratch("big");
    let dict = SharedDict::open(&path, BIG_CAPACITY, VALUE_LEN).expect("create the big dict");
    let value = [b'b'; VALUE_LEN];
    for n in 0..2 * BIG_CAPACITY as u64 {
        let _ = dict
            .set(counted_key(b"fill", n), &value, Duration::ZERO)
            .unwrap();
    }
    // Keys spread over the whole dict (every key of a stride), so that each read lands on
    // lines and pages of its own, as in a cache far bigger than the CPU's.
    let present = dict.keys(0).unwrap();
    let stride = (present.len() / (4 * KEYS)).max(1);
    let present: Vec<Vec<u8>> = present.into_iter().step_by(stride).take(4 * KEYS).collect();
    let absent: Vec<[u8; 12]> = (0..4 * KEYS as u64)
        .map(|n| counted_key(b"miss", n))
        .collect();
    let mut get_hit = |i| {
        assert!(black_box(dict.get(nth(&present, i)).unwrap()).is_some());
    };
    let mut get_miss = |i| {
        assert!(black_box(dict.get(nth(&absent, i)).unwrap()).is_none());
    };
    let m = interleaved(
        s.samples,
        &mut [
            Candidate::new(s.iters / 4, &mut get_hit),
            Candidate::new(s.iters / 4, &mut get_miss),
        ],
    );
    drop(dict);
    let _ = std::fs::remove_file(&path);
    const S: &str = "4. big dict";
    r.op(S, "get hit", &m[0]);
    r.op(S, "get miss", &m[1]);
    r.ratio(S, "get: miss / hit", m[1].median / m[0].median);
}

// 5. Lists

fn lists(r: &mut Report, s: &Scale) {
    println!(
        "\n5. a list as a queue: rpush + lpop of 16 bytes at a length kept (median of {} \
         interleaved samples)",
        s.samples
    );
    let path = scratch("list");
    let dict = SharedDict::options()
        .capacity(64)
        .max_value_len(64)
        .heap_size(8 << 20)
        .open(&path)
        .expect("create the list dict");
    let element = [b'e'; 16];
    const S: &str = "5. lists";
    for len in [0usize, 1_000, 50_000] {
        let key = format!("q{len}");
        for _ in 0..len {
            dict.rpush(&key, &element[..]).unwrap();
        }
        let queue = std::sync::Mutex::new(std::collections::VecDeque::new());
        for _ in 0..len {
            queue.lock().unwrap().push_back(element.to_vec());
        }
        let mut pair = |_| {
            dict.rpush(&key, &element[..]).unwrap();
            black_box(dict.lpop(&key).unwrap());
        };
        let mut deque = |_| {
            queue.lock().unwrap().push_back(black_box(element.to_vec()));
            black_box(queue.lock().unwrap().pop_front());
        };
        // (about 1 ms a pair at 50,000: fewer of them)
        let iters = (s.iters / (1 + len as u64 / 50)).max(4);
        let m = interleaved(
            s.samples,
            &mut [
                Candidate::new(iters, &mut pair),
                Candidate::new(iters, &mut deque),
            ],
        );
        assert_eq!(dict.llen(&key).unwrap(), len);
        r.op(S, format!("rpush + lpop, length {len}"), &m[0]);
        r.op(S, format!("Mutex<VecDeque>, length {len}"), &m[1]);
    }
    drop(dict);
    let _ = std::fs::remove_file(&path);
}

// ---------------------------------------------------------------------------------------
// 6. Two writers

fn two_writers(r: &mut Report, s: &Scale) {
    println!(
        "\n6. two writers: a set every 200 µs beside a process setting back to back, in the \
         same dict or in one of its own ({} rounds of {} ms each, alternated)",
        s.rounds,
        s.run.as_millis()
    );
    const S: &str = "6. two writers";
    let path = scratch("writers");
    let other = scratch("writers-other");
    let dict = SharedDict::open(&path, CAPACITY, VALUE_LEN).expect("create the dict");
    let own = SharedDict::open(&other, CAPACITY, VALUE_LEN).expect("create the other dict");
    let shared = Shared::new(CHILD_BASE + CHILD_WORDS);
    let v = [7u8; VALUE_LEN];
    let mut waits: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut rates: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..s.rounds {
        for (i, busy) in [&dict, &own].into_iter().enumerate() {
            shared.clear();
            let pid = fork(|| {
                child_loop(&shared, 0, |n| {
                    busy.set(key(n as usize % 100), &v, Duration::ZERO).is_ok()
                })
            });
            while shared.word(READY).load(Ordering::SeqCst) < 1 {
                std::thread::sleep(Duration::from_micros(200));
            }
            shared.word(GO).store(1, Ordering::SeqCst);
            let end = Instant::now() + s.run;
            let mut n = 0;
            while Instant::now() < end {
                let t = Instant::now();
                dict.set(key(1000 + n % 100), &v, Duration::ZERO)
                    .expect("set");
                waits[i].push(t.elapsed().as_nanos() as f64);
                n += 1;
                std::thread::sleep(Duration::from_micros(200));
            }
            shared.word(STOP).store(1, Ordering::SeqCst);
            wait(pid);
            let w = |k: usize| shared.word(CHILD_BASE + k).load(Ordering::SeqCst) as f64;
            rates[i].push(w(OPS) / (w(WALL_NS) / 1e9));
        }
    }
    for (i, what) in ["the same dict", "a dict of its own"].iter().enumerate() {
        let mut all = std::mem::take(&mut waits[i]);
        all.sort_by(f64::total_cmp);
        let at = |q: f64| all[((all.len() - 1) as f64 * q) as usize];
        let row = format!(
            "{} / {} / {}",
            fmt_ns(at(0.5)),
            fmt_ns(at(0.99)),
            fmt_ns(all[all.len() - 1])
        );
        r.row(
            S,
            format!("set: median / p99 / longest, beside {what}"),
            row,
            format!("{} sets", all.len()),
        );
        let mut rate = std::mem::take(&mut rates[i]);
        rate.sort_by(f64::total_cmp);
        r.row(
            S,
            format!("the back-to-back writer's sets/s, in {what}"),
            format!("{:.2} M/s", rate[rate.len() / 2] / 1e6),
            String::new(),
        );
    }
    drop((dict, own));
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&other);
}

fn main() {
    // cargo bench passes --bench; "quick" (or SHMLOCK_BENCH_QUICK=1) shortens everything.
    let quick = std::env::args().any(|a| a == "quick")
        || std::env::var("SHMLOCK_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    let s = if quick {
        Scale {
            samples: 5,
            iters: 20_000,
            redis_iters: 200,
            rounds: 1,
            run: Duration::from_millis(200),
        }
    } else {
        Scale {
            samples: 101,
            iters: 20_000,
            redis_iters: 300,
            rounds: 5,
            run: Duration::from_millis(800),
        }
    };
    let started = Instant::now();
    let mut r = Report::default();
    // Section names on the command line (`procs`, `single`, `full`, `big`, `lists`,
    // `writers`) pick
    // sections; none: all.
    let picked: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-') && a != "quick")
        .collect();
    let run = |name: &str| picked.is_empty() || picked.iter().any(|p| name.contains(p.as_str()));
    if run("single") {
        single_process(&mut r, &s);
    }
    // Nothing here starts a thread (redis-server is a child process, the redis client is
    // synchronous), so this process can still fork; `fork` checks it.
    if run("procs") {
        across_processes(&mut r, &s);
    }
    if run("full") {
        full_dict(&mut r, &s);
    }
    if run("big") {
        big_dict(&mut r, &s);
    }
    if run("lists") {
        lists(&mut r, &s);
    }
    if run("writers") {
        two_writers(&mut r, &s);
    }

    println!("\n| section | what | median | spread |\n|---|---|---|---|");
    for row in &r.rows {
        println!(
            "| {} | {} | {} | {} |",
            row.section, row.what, row.median, row.spread
        );
    }
    println!(
        "\n{} run in {:.2} s",
        if quick { "quick" } else { "full" },
        started.elapsed().as_secs_f64()
    );
}
