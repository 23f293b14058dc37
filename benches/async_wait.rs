//! Async waits that scale (`cargo bench --bench async_wait --features tokio,redis`):
//!
//! * **Many tasks, one key.** 1000 tasks on one runtime each take one key once and hold it
//!   for 1 ms (a `tokio::time::sleep`, so about 1-2 ms), with a 30 s timeout: how many time
//!   out, how much of the run the key was held, and how long the tasks waited (the spread
//!   says how fair the queue is). On the lock table and on Redis.
//! * **Handoff.** A holder releases the key while one waiter (an async task, or a thread
//!   of its own) waits for it with 200 ms steps; the time from the release to the waiter's
//!   grant, over many rounds: median and p99, async against sync in the same run.
//!
//! `-- quick` runs fewer tasks and rounds. Figures print as a table; nothing is asserted
//! (the tests assert the behaviour, the benches measure it).

#[path = "../tests/common/redis_server.rs"]
mod redis_server;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shmlock::{Error, LockGuard, LockOptions, LockTable, RedisLocks};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// What one many-tasks run saw.
struct Many {
    timeouts: usize,
    busy: f64,
    waits: Vec<Duration>,
    total: Duration,
}

/// `tasks` tasks each taking `key` once through `lock` and holding it `hold`.
fn many<'a, B, F, Fut>(tasks: usize, hold: Duration, lock: F) -> Many
where
    B: shmlock::Backend + Sync + 'a,
    B::Hold: Send,
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<LockGuard<'a, B>, Error>> + Send,
{
    let rt = runtime();
    let held_ns = Arc::new(AtomicU64::new(0));
    let lock = Arc::new(lock);
    let started = Instant::now();
    let results: Vec<Result<Duration, ()>> = rt.block_on(async {
        let handles: Vec<_> = (0..tasks)
            .map(|_| {
                let (lock, held_ns) = (lock.clone(), held_ns.clone());
                tokio::spawn(async move {
                    let asked = Instant::now();
                    match lock().await {
                        Ok(g) => {
                            let waited = asked.elapsed();
                            let t = Instant::now();
                            tokio::time::sleep(hold).await;
                            held_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
                            drop(g);
                            Ok(waited)
                        }
                        Err(_) => Err(()),
                    }
                })
            })
            .collect();
        let mut out = Vec::new();
        for h in handles {
            out.push(h.await.unwrap());
        }
        out
    });
    let total = started.elapsed();
    let timeouts = results.iter().filter(|r| r.is_err()).count();
    let mut waits: Vec<Duration> = results.into_iter().flatten().collect();
    waits.sort();
    Many {
        timeouts,
        busy: held_ns.load(Ordering::Relaxed) as f64 / total.as_nanos() as f64,
        waits,
        total,
    }
}

fn pct(v: &[Duration], p: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn report_many(name: &str, m: &Many) {
    println!(
        "| {name} | {} | {:.1} % | {:.2?} | {:.2?} | {:.2?} | {:.2?} | {:.2?} |",
        m.timeouts,
        m.busy * 100.0,
        pct(&m.waits, 0.5),
        pct(&m.waits, 0.99),
        m.waits.last().copied().unwrap_or_default(),
        m.waits.first().copied().unwrap_or_default(),
        m.total
    );
}

fn wait_opts() -> LockOptions {
    LockOptions {
        timeout: Duration::from_secs(30),
        exptime: Duration::from_secs(30),
        step: Duration::from_millis(200),
        max_step: Duration::from_millis(200),
        ..LockOptions::default()
    }
}

/// One handoff on the table: `waiter` waits (async or in a thread) while a holder releases
/// 20 ms later.
fn table_handoff(table: &LockTable, rt: &tokio::runtime::Runtime, asynch: bool) -> Duration {
    let held = table.lock("handoff", LockOptions::default()).unwrap();
    let released = Arc::new(AtomicU64::new(0));
    let base = Instant::now();
    std::thread::scope(|s| {
        let r = released.clone();
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            r.store(base.elapsed().as_nanos() as u64, Ordering::SeqCst);
            drop(held);
        });
        let got = if asynch {
            rt.block_on(async {
                let g = table.lock_async("handoff", wait_opts()).await.unwrap();
                let at = base.elapsed();
                drop(g);
                at
            })
        } else {
            let g = table.lock("handoff", wait_opts()).unwrap();
            let at = base.elapsed();
            drop(g);
            at
        };
        got.saturating_sub(Duration::from_nanos(released.load(Ordering::SeqCst)))
    })
}

fn redis_handoff(
    redis: &RedisLocks,
    holder: &RedisLocks,
    rt: &tokio::runtime::Runtime,
    asynch: bool,
) -> Duration {
    let held = holder.lock("handoff", LockOptions::default()).unwrap();
    let released = Arc::new(AtomicU64::new(0));
    let base = Instant::now();
    std::thread::scope(|s| {
        let r = released.clone();
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            r.store(base.elapsed().as_nanos() as u64, Ordering::SeqCst);
            held.unlock().unwrap();
        });
        let got = if asynch {
            rt.block_on(async {
                let g = redis.lock_async("handoff", wait_opts()).await.unwrap();
                let at = base.elapsed();
                drop(g);
                at
            })
        } else {
            let g = redis.lock("handoff", wait_opts()).unwrap();
            let at = base.elapsed();
            g.unlock().unwrap();
            at
        };
        got.saturating_sub(Duration::from_nanos(released.load(Ordering::SeqCst)))
    })
}

fn main() {
    let quick = std::env::args().any(|a| a == "quick");
    let (tasks, rounds) = if quick { (200, 30) } else { (1000, 200) };
    let hold = Duration::from_millis(1);
    let wait = LockOptions {
        timeout: Duration::from_secs(30),
        exptime: Duration::from_secs(60),
        ..LockOptions::default()
    };

    let dir = std::env::temp_dir().join(format!("shmlock-bench-async-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let table: &'static LockTable =
        Box::leak(Box::new(LockTable::open(dir.join("locks"), 1024).unwrap()));
    let server = redis_server::RedisServer::start();
    let redis: &'static RedisLocks = Box::leak(Box::new(RedisLocks::open(&server.url()).unwrap()));

    println!("{tasks} tasks, one key, each holding it {hold:?} (a tokio sleep), 30 s timeout:");
    println!();
    println!("| backend | timeouts | key held | wait p50 | wait p99 | longest wait | shortest | whole run |");
    println!("|---|---|---|---|---|---|---|---|");
    let m = many(tasks, hold, move || table.lock_async("many", wait));
    report_many("table", &m);
    let m = many(tasks, hold, move || redis.lock_async("many", wait));
    report_many("Redis", &m);

    println!();
    println!("Handoff, release to grant, {rounds} rounds of a 20 ms hold, 200 ms steps:");
    println!();
    println!("| backend | async median | async p99 | thread median | thread p99 | median ratio |");
    println!("|---|---|---|---|---|---|");
    let rt = runtime();
    let (mut a, mut s) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        a.push(table_handoff(table, &rt, true));
        s.push(table_handoff(table, &rt, false));
    }
    let (a, s) = (sorted(a), sorted(s));
    println!(
        "| table | {:.1?} | {:.1?} | {:.1?} | {:.1?} | {:.2}x |",
        pct(&a, 0.5),
        pct(&a, 0.99),
        pct(&s, 0.5),
        pct(&s, 0.99),
        pct(&a, 0.5).as_secs_f64() / pct(&s, 0.5).as_secs_f64()
    );
    let holder = RedisLocks::open(&server.url()).unwrap();
    let (mut a, mut s) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        a.push(redis_handoff(redis, &holder, &rt, true));
        s.push(redis_handoff(redis, &holder, &rt, false));
    }
    let (a, s) = (sorted(a), sorted(s));
    println!(
        "| Redis | {:.1?} | {:.1?} | {:.1?} | {:.1?} | {:.2}x |",
        pct(&a, 0.5),
        pct(&a, 0.99),
        pct(&s, 0.5),
        pct(&s, 0.99),
        pct(&a, 0.5).as_secs_f64() / pct(&s, 0.5).as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn sorted(mut v: Vec<Duration>) -> Vec<Duration> {
    v.sort();
    v
}
