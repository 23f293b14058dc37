//! How close a full `SharedDict`'s evictions come to an exact LRU: the hit rate of a cache
//! that reads a key and, on a miss, stores it, on streams of Zipf-distributed keys, beside
//! an exact LRU of the same number of entries and an LRU that evicts the least recently
//! used of 8 keys drawn at random (what a sample alone costs, as Redis evicts). Issue #26,
//! item 2: a dict's entry can only live within 64 slots of its home, so a full window
//! evicts the least recently used of the 8 entries nearest the home; this shows what that,
//! and the ranks of the LRU stamps, cost in hits.
//!
//! ```sh
//! cargo bench --bench dict_lru     # about 10 s
//! ```
//!
//! Each case: `capacity` entries (keys and values of up to 16 bytes), `capacity * spread`
//! distinct keys, 20 x that many operations from one process, as fast as it can go (so
//! that many uses fall in one tick of the coarse clock); hits are counted over the second
//! half (the first fills the cache). The stream is the same for the three (xorshift64,
//! fixed seed); the dict's hash seed is drawn per file, so its figure moves a little from
//! run to run.

#[path = "support/shm_dir.rs"]
mod shm_dir;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use shmlock::SharedDict;

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Keys `0..n` drawn with probability proportional to `1 / (k + 1)^s`.
fn zipf_stream(n: usize, s: f64, len: usize, seed: u64) -> Vec<usize> {
    let mut cdf = Vec::with_capacity(n);
    let mut total = 0.0;
    for k in 1..=n {
        total += 1.0 / (k as f64).powf(s);
        cdf.push(total);
    }
    let mut x = seed;
    (0..len)
        .map(|_| {
            let u = (xorshift(&mut x) >> 11) as f64 / (1u64 << 53) as f64 * total;
            cdf.partition_point(|&c| c < u).min(n - 1)
        })
        .collect()
}

/// Hits of an exact LRU of `capacity` keys over the second half of `stream`.
fn exact_lru(stream: &[usize], capacity: usize) -> u64 {
    let mut used_at: HashMap<usize, usize> = HashMap::new();
    let mut by_use: BTreeMap<usize, usize> = BTreeMap::new();
    let mut hits = 0;
    for (t, &k) in stream.iter().enumerate() {
        let hit = match used_at.insert(k, t) {
            Some(before) => {
                by_use.remove(&before);
                true
            }
            None => false,
        };
        by_use.insert(t, k);
        if used_at.len() > capacity {
            let (_, oldest) = by_use.pop_first().unwrap();
            used_at.remove(&oldest);
        }
        hits += u64::from(hit && t >= stream.len() / 2);
    }
    hits
}

/// Hits of an LRU that evicts the least recently used of `sample` keys drawn at random.
fn sampled_lru(stream: &[usize], capacity: usize, sample: usize) -> u64 {
    let mut keys: Vec<usize> = Vec::with_capacity(capacity);
    // key -> (index in `keys`, last use)
    let mut at: HashMap<usize, (usize, usize)> = HashMap::new();
    let mut x = 0x2545_f491_4f6c_dd1d;
    let mut hits = 0;
    for (t, &k) in stream.iter().enumerate() {
        let hit = match at.get_mut(&k) {
            Some(e) => {
                e.1 = t;
                true
            }
            None => {
                if keys.len() == capacity {
                    let victim = (0..sample)
                        .map(|_| (xorshift(&mut x) % keys.len() as u64) as usize)
                        .min_by_key(|&i| at[&keys[i]].1)
                        .unwrap();
                    at.remove(&keys.swap_remove(victim));
                    if let Some(&moved) = keys.get(victim) {
                        at.get_mut(&moved).unwrap().0 = victim;
                    }
                }
                at.insert(k, (keys.len(), t));
                keys.push(k);
                false
            }
        };
        hits += u64::from(hit && t >= stream.len() / 2);
    }
    hits
}

/// Hits of a `SharedDict` of `capacity` entries (and the time an operation took).
fn dict(stream: &[usize], capacity: usize, names: &[String]) -> (u64, Duration) {
    let path = shm_dir::dir().join(format!("shmlock-bench-dict-lru-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let d = SharedDict::options()
        .capacity(capacity)
        .max_key_len(16)
        .max_value_len(16)
        .open(&path)
        .expect("open the dict");
    let mut hits = 0;
    let started = Instant::now();
    for (t, &k) in stream.iter().enumerate() {
        let key = &names[k];
        let hit = d.get(key).expect("get").is_some();
        if !hit {
            d.set(key, "v", Duration::ZERO).expect("set");
        }
        hits += u64::from(hit && t >= stream.len() / 2);
    }
    let took = started.elapsed() / stream.len() as u32;
    drop(d);
    std::fs::remove_file(&path).expect("remove the dict");
    (hits, took)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("lru: bench");
        return;
    }
    println!(
        "| entries | distinct keys | Zipf s | exact LRU hits | SharedDict | / exact | 8 sampled at random | / exact | ns an op (dict) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (capacity, spread, s) in [
        (64, 8, 0.9),
        (512, 16, 0.9),
        (4096, 8, 0.7),
        (4096, 8, 0.9),
        (4096, 8, 1.1),
        (65_536, 4, 0.9),
    ] {
        let n = capacity * spread;
        let stream = zipf_stream(n, s, 20 * n, 0x9e37_79b9_7f4a_7c15);
        let names: Vec<String> = (0..n).map(|k| format!("k{k}")).collect();
        let counted = (stream.len() - stream.len() / 2) as f64;
        let (hits, took) = dict(&stream, capacity, &names);
        let exact = exact_lru(&stream, capacity);
        let sampled = sampled_lru(&stream, capacity, 8);
        println!(
            "| {capacity} | {n} | {s} | {:.4} | {:.4} | {:.4} | {:.4} | {:.4} | {} |",
            exact as f64 / counted,
            hits as f64 / counted,
            hits as f64 / exact as f64,
            sampled as f64 / counted,
            sampled as f64 / exact as f64,
            took.as_nanos()
        );
    }
}
