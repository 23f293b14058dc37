//! The Redis backend's acquire+release pair against the same two round trips written by hand
//! with the same client: `SET key token NX PX ttl`, then a compare-and-delete `EVAL`; and
//! beside them, a read lock's pair and a semaphore's (each holder in the key's sorted set).
//!
//! Then the thread scaling of one handle: lock+unlock pairs per second of 8 threads sharing
//! one `RedisLocks` against 8 threads with a handle each (distinct keys), and of 1 thread.
//!
//! `cargo bench --bench redis` (starts its own redis-server on a free loopback port).

#[path = "../tests/common/redis_server.rs"]
mod redis_server;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use shmlock::{Lock, LockOptions, RedisLocks};

const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
";

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Medians in µs per pair of each candidate, over `samples` rounds in which every candidate
/// runs `pairs` pairs in turn: interleaved, so a noisy moment hits all of them alike.
fn per_pair(samples: usize, pairs: u32, candidates: &mut [&mut dyn FnMut(u32)]) -> Vec<f64> {
    for f in candidates.iter_mut() {
        for i in 0..pairs / 10 {
            f(i); // warm up
        }
    }
    let mut times = vec![Vec::new(); candidates.len()];
    for _ in 0..samples {
        for (f, t) in candidates.iter_mut().zip(&mut times) {
            let start = Instant::now();
            for i in 0..pairs {
                f(i);
            }
            t.push(start.elapsed().as_secs_f64() * 1e6 / f64::from(pairs));
        }
    }
    times.into_iter().map(median).collect()
}

/// Pairs per second of `handles.len()` threads, thread `i` locking its own key through
/// `handles[i]`, for `run`.
fn pairs_per_sec(handles: &[&RedisLocks], run: Duration) -> f64 {
    let stop = AtomicBool::new(false);
    let pairs = AtomicU64::new(0);
    let started = Instant::now();
    std::thread::scope(|s| {
        for (i, redis) in handles.iter().enumerate() {
            let (stop, pairs) = (&stop, &pairs);
            s.spawn(move || {
                let key = format!("thread-{i}");
                let mut lock = Lock::new(*redis, LockOptions::default()).unwrap();
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    lock.lock(&key).unwrap();
                    lock.unlock().unwrap();
                    n += 1;
                }
                pairs.fetch_add(n, Ordering::Relaxed);
            });
        }
        std::thread::sleep(run);
        stop.store(true, Ordering::Relaxed);
    });
    pairs.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

/// 1 thread, 8 threads sharing one handle, 8 threads with a handle each: medians of
/// `samples` interleaved runs, in pairs/s.
fn scaling(url: &str, samples: usize, run: Duration) -> (f64, f64, f64) {
    let shared = RedisLocks::open(url).unwrap();
    let own: Vec<RedisLocks> = (0..8).map(|_| RedisLocks::open(url).unwrap()).collect();
    let shared8 = vec![&shared; 8];
    let own8: Vec<&RedisLocks> = own.iter().collect();
    // warm up: every handle's connections made
    pairs_per_sec(&shared8, run / 4);
    pairs_per_sec(&own8, run / 4);
    let (mut one, mut sh, mut ow) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..samples {
        one.push(pairs_per_sec(&shared8[..1], run));
        sh.push(pairs_per_sec(&shared8, run));
        ow.push(pairs_per_sec(&own8, run));
    }
    (median(one), median(sh), median(ow))
}

fn main() {
    let quick = std::env::args().any(|a| a == "quick");
    let (samples, pairs) = if quick { (3, 100) } else { (21, 300) };
    let server = redis_server::RedisServer::start();

    let redis = RedisLocks::open(&server.url()).unwrap();
    let opts = LockOptions {
        exptime: Duration::from_secs(30),
        ..LockOptions::default()
    };
    let mut lock = Lock::new(&redis, opts).unwrap();
    let mut fenced = Lock::new(&redis, opts).unwrap();
    let mut reader = Lock::new(redis.shared(), opts).unwrap();
    let sem = redis.semaphore("bench-permits", 4).unwrap();

    let client = redis::Client::open(server.url()).unwrap();
    let mut con = client.get_connection().unwrap();
    let release = redis::Script::new(RELEASE);
    let mut raw_pair = |i: u32| {
        let token = format!("{i:032x}");
        let ok: Option<String> = redis::cmd("SET")
            .arg("raw-bench")
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query(&mut con)
            .unwrap();
        assert!(ok.is_some());
        let n: i64 = release
            .key("raw-bench")
            .arg(&token)
            .invoke(&mut con)
            .unwrap();
        assert_eq!(n, 1);
    };
    let medians = per_pair(
        samples,
        pairs,
        &mut [
            &mut |_| {
                lock.lock("bench").unwrap();
                lock.unlock().unwrap();
            },
            &mut |_| {
                fenced.lock("fenced").unwrap();
                assert!(fenced.token().is_some());
                fenced.unlock().unwrap();
            },
            &mut raw_pair,
            &mut |_| {
                reader.lock("bench-read").unwrap();
                reader.unlock().unwrap();
            },
            &mut |_| {
                sem.acquire(opts).unwrap().unlock().unwrap();
            },
        ],
    );
    let (ours, with_token, raw) = (medians[0], medians[1], medians[2]);
    let (read, permit) = (medians[3], medians[4]);

    println!("| Redis on loopback, acquire+release pair | median |\n|---|---|");
    println!("| shmlock RedisLocks (SET NX PX, release script) | {ours:.1} µs |");
    println!("| shmlock RedisLocks, also asking for the fencing token | {with_token:.1} µs |");
    println!("| raw SET NX PX + compare-and-delete EVAL, same client | {raw:.1} µs |");
    println!("| ratio | {:.2}x |", ours / raw);
    println!("| shmlock read lock (lock_shared + unlock) | {read:.1} µs |");
    println!("| shmlock semaphore of 4 (acquire + release) | {permit:.1} µs |");
    println!(
        "\ngoal: <= 1.1x the raw pair ({:.2}x): {}",
        ours / raw,
        if ours / raw <= 1.1 { "met" } else { "MISSED" }
    );

    let (samples, run) = if quick {
        (3, Duration::from_millis(200))
    } else {
        (11, Duration::from_millis(700))
    };
    let (one, shared, own) = scaling(&server.url(), samples, run);
    println!("\n| lock+unlock pairs/s, distinct keys, loopback | median |\n|---|---|");
    println!("| 1 thread | {:.1} k/s |", one / 1e3);
    println!(
        "| 8 threads sharing one RedisLocks | {:.1} k/s |",
        shared / 1e3
    );
    println!(
        "| 8 threads with a RedisLocks each | {:.1} k/s |",
        own / 1e3
    );
    println!("| shared / own | {:.2}x |", shared / own);
    println!(
        "\ngoal: 8 threads on one handle >= 0.9x 8 handles ({:.2}x): {}",
        shared / own,
        if shared / own >= 0.9 { "met" } else { "MISSED" }
    );
}
