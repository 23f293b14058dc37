//! The prefork model: a parent creates a lock table and forks workers that share it.
//!
//! Each worker takes locks on a mix of a few hot keys and many cold ones and, inside the
//! critical section, updates a counter per key with a plain (non-atomic) read-modify-write;
//! hot keys sometimes hold the lock for a millisecond, as a cache fill would. At the end the
//! parent checks that no update was lost and prints what each worker saw.
//!
//! ```sh
//! cargo run --release --example prefork -- [WORKERS] [ITERATIONS]   # default 4 2000
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use memmap2::MmapRaw;
use shmlock::{Lock, LockOptions, LockTable};

const HOT_KEYS: usize = 4;
const COLD_KEYS: usize = 1000;
const KEYS: usize = HOT_KEYS + COLD_KEYS;
/// Waits by whole milliseconds, one bucket per power of two: <1, 1-2, 3-6, 7-14, 15-30 ms...
/// (Polling, a wait is a sum of steps, 1, 3, 7, 15 ms: one bucket each.)
const BUCKETS: usize = 12;
/// Per worker: acquisitions, acquisitions that waited, wait time (µs), then the buckets.
const WORKER_WORDS: usize = 3 + BUCKETS;

/// Counters in a file mapping that forked workers share with the parent.
struct Shared {
    map: MmapRaw,
    words: usize,
}

impl Shared {
    fn new(path: &PathBuf, words: usize) -> std::io::Result<Shared> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        file.set_len(words as u64 * 8)?;
        Ok(Shared {
            map: MmapRaw::map_raw(&file)?,
            words,
        })
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        assert!(i < self.words);
        // SAFETY: in bounds, 8-aligned (the mapping is page-aligned), zero-filled by
        // set_len, alive as long as `self`, and only ever used as atomics.
        unsafe { AtomicU64::from_ptr(self.map.as_mut_ptr().cast::<u64>().add(i)) }
    }
}

fn worker(table: &LockTable, shared: &Shared, id: usize, iterations: u64) {
    let opts = LockOptions {
        exptime: Duration::from_secs(10),
        timeout: Duration::from_secs(10),
        ..LockOptions::default()
    };
    let mut lock = Lock::new(table, opts).expect("valid options");
    let base = KEYS + id * WORKER_WORDS;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (id as u64 + 1) << 32;
    for _ in 0..iterations {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let hot = rng.is_multiple_of(4);
        let k = if hot {
            (rng >> 8) as usize % HOT_KEYS
        } else {
            HOT_KEYS + (rng >> 8) as usize % COLD_KEYS
        };
        let elapsed = lock.lock(format!("item:{k}")).expect("lock");

        let counter = shared.word(k);
        let v = counter.load(Ordering::Relaxed); // read ...
        if hot && rng.is_multiple_of(16) {
            std::thread::sleep(Duration::from_millis(1)); // a slow cache fill
        }
        counter.store(v + 1, Ordering::Relaxed); // ... modify, write: exact only under the lock

        lock.unlock().expect("unlock");

        shared.word(base).fetch_add(1, Ordering::Relaxed);
        if !elapsed.is_zero() {
            shared.word(base + 1).fetch_add(1, Ordering::Relaxed);
            shared
                .word(base + 2)
                .fetch_add(elapsed.as_micros() as u64, Ordering::Relaxed);
        }
        let ms = elapsed.as_millis() as u64;
        let bucket = (64 - (ms + 1).leading_zeros() as usize - 1).min(BUCKETS - 1);
        shared
            .word(base + 3 + bucket)
            .fetch_add(1, Ordering::Relaxed);
    }
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (workers, iterations): (usize, u64) = match (
        args.next().map_or(Ok(4), |a| a.parse()),
        args.next().map_or(Ok(2000), |a| a.parse()),
    ) {
        (Ok(w), Ok(i)) if w > 0 => (w, i),
        _ => {
            eprintln!("usage: prefork [WORKERS] [ITERATIONS]   (whole numbers; default 4 2000)");
            return ExitCode::from(64);
        }
    };

    let dir = if std::path::Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let table_path = dir.join(format!("shmlock-prefork-{}", std::process::id()));
    let stats_path = dir.join(format!("shmlock-prefork-{}.stats", std::process::id()));
    let _ = std::fs::remove_file(&table_path);

    let table = LockTable::open(&table_path, 1024).expect("create the lock table");
    let shared = Shared::new(&stats_path, KEYS + workers * WORKER_WORDS).expect("stats file");
    println!(
        "table {} ({} slots), {workers} workers x {iterations} iterations, {HOT_KEYS} hot + {COLD_KEYS} cold keys",
        table_path.display(),
        table.capacity()
    );

    let started = Instant::now();
    let mut pids = Vec::new();
    for id in 0..workers {
        // SAFETY: the parent is single-threaded here, so the child is a full copy of it.
        match unsafe { libc::fork() } {
            -1 => panic!("fork: {}", std::io::Error::last_os_error()),
            0 => {
                let ok = std::panic::catch_unwind(|| worker(&table, &shared, id, iterations));
                // SAFETY: end the child without running the parent's exit handlers.
                unsafe { libc::_exit(if ok.is_ok() { 0 } else { 1 }) };
            }
            pid => pids.push(pid),
        }
    }
    let mut failed_workers = 0;
    for pid in pids {
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
            failed_workers += 1;
        }
    }
    let wall = started.elapsed();

    println!("\nworker  acquired  waited  mean wait   waited: <1ms  1-2ms  3-6ms  7-14ms  15-30ms  31-62ms  more");
    let mut total = 0;
    for id in 0..workers {
        let base = KEYS + id * WORKER_WORDS;
        let w = |i: usize| shared.word(base + i).load(Ordering::Relaxed);
        let (acquired, waited, wait_us) = (w(0), w(1), w(2));
        total += acquired;
        let b: Vec<u64> = (0..BUCKETS).map(|i| w(3 + i)).collect();
        let more: u64 = b[6..].iter().sum();
        println!(
            "{id:>6}  {acquired:>8}  {waited:>6}  {:>7.2}ms   {:>11}  {:>5}  {:>5}  {:>6}  {:>7}  {:>7}  {more:>4}",
            if waited > 0 { wait_us as f64 / waited as f64 / 1000.0 } else { 0.0 },
            b[0], b[1], b[2], b[3], b[4], b[5],
        );
    }
    let counted: u64 = (0..KEYS)
        .map(|k| shared.word(k).load(Ordering::Relaxed))
        .sum();
    println!(
        "\n{total} acquisitions in {:.2}s: {:.0} acquisitions/s",
        wall.as_secs_f64(),
        total as f64 / wall.as_secs_f64()
    );
    println!("table occupancy after the run: {}", table.occupancy());

    let expected = workers as u64 * iterations;
    drop(table);
    let _ = std::fs::remove_file(&table_path);
    let _ = std::fs::remove_file(&stats_path);
    if failed_workers > 0 || total != expected || counted != expected {
        println!("FAILED: {failed_workers} workers failed; {counted} counted updates, {total} acquisitions, {expected} expected");
        return ExitCode::FAILURE;
    }
    println!("counters exact: {counted} updates, none lost");
    ExitCode::SUCCESS
}
