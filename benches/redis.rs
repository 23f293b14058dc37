//! The Redis backend's acquire+release pair against the same two round trips written by hand
//! with the same client: `SET key token NX PX ttl`, then a compare-and-delete `EVAL`.
//!
//! `cargo bench --bench redis` (starts its own redis-server on a free loopback port).

#[path = "../tests/common/redis_server.rs"]
mod redis_server;

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
        ],
    );
    let (ours, with_token, raw) = (medians[0], medians[1], medians[2]);

    println!("| Redis on loopback, acquire+release pair | median |\n|---|---|");
    println!("| shmlock RedisLocks (SET NX PX, release script) | {ours:.1} µs |");
    println!("| shmlock RedisLocks, also asking for the fencing token | {with_token:.1} µs |");
    println!("| raw SET NX PX + compare-and-delete EVAL, same client | {raw:.1} µs |");
    println!("| ratio | {:.2}x |", ours / raw);
    println!(
        "\ngoal: <= 1.1x the raw pair ({:.2}x): {}",
        ours / raw,
        if ours / raw <= 1.1 { "met" } else { "MISSED" }
    );
}
