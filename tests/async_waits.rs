//! Async waits that scale: a task waiting in `lock_async` is woken by the release that
//! frees its key (not at the end of its step), the tasks of a process waiting for one key
//! take it in turn (first come first, one woken per release), and a crowd of them on one
//! key all get it within a timeout that polling would miss. On the lock table and on Redis.
//!
//! Guards `src/shm/async_wait.rs` (the watcher thread and its `futex_waitv`),
//! `src/redis_store/async_wait.rs` (the pub/sub listener and its queues) and the async
//! waiting loop of `src/lock/backend.rs`. The figures (how much of the time the key was
//! held, handoff latency against a waiting thread) are measured by `benches/async_wait.rs`.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::redis_server::RedisServer;
use common::TempPath;
use shmlock::{Backend, Error, LockGuard, LockOptions, LockTable, RedisLocks};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Steps of 2 s: polling would see a release only 2 s after the wait began.
fn long_steps() -> LockOptions {
    LockOptions {
        step: Duration::from_secs(2),
        max_step: Duration::from_secs(2),
        timeout: Duration::from_secs(10),
        exptime: Duration::from_secs(30),
        ..LockOptions::default()
    }
}

/// A task waits with 2 s steps while a thread releases the key 100 ms in: how long the
/// task waited.
fn woken_after<'a, B, Fut>(release: impl FnOnce() + Send, wait: Fut) -> Duration
where
    B: Backend + 'a,
    Fut: std::future::Future<Output = Result<LockGuard<'a, B>, Error>>,
{
    let rt = runtime();
    std::thread::scope(|s| {
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            release();
        });
        let t = Instant::now();
        let g = rt.block_on(wait).unwrap();
        let waited = t.elapsed();
        drop(g);
        waited
    })
}

#[test]
fn a_waiting_task_is_woken_by_the_release_on_the_table() {
    let path = TempPath::new("async-woken");
    let table = LockTable::open(&path, 64).unwrap();
    let held = table.lock("k", LockOptions::default()).unwrap();
    let waited = woken_after(move || drop(held), table.lock_async("k", long_steps()));
    assert!(
        waited >= Duration::from_millis(90) && waited < Duration::from_millis(1500),
        "woken after {waited:?}: not by the release"
    );
}

#[test]
fn a_waiting_task_is_woken_by_the_release_on_redis() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    let holder = RedisLocks::open(&server.url()).unwrap();
    let held = holder.lock("k", LockOptions::default()).unwrap();
    let waited = woken_after(
        move || held.unlock().unwrap(),
        redis.lock_async("k", long_steps()),
    );
    assert!(
        waited >= Duration::from_millis(90) && waited < Duration::from_millis(1500),
        "woken after {waited:?}: not by the release"
    );
}

/// `tasks` tasks on one runtime (of one thread, or two) each take one key once and hold it
/// about 1 ms, with a 30 s timeout (which polling on resty's schedule misses for most of
/// them: they wake in lockstep and one in each round wins). Returns the timeouts, and each
/// task's rank of asking and of getting the key.
fn crowd<'a, B, F, Fut>(tasks: usize, one_thread: bool, lock: F) -> (usize, Vec<(u64, u64)>)
where
    B: Backend + Sync + 'a,
    B::Hold: Send,
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<LockGuard<'a, B>, Error>> + Send,
{
    let rt = if one_thread {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    } else {
        runtime()
    };
    let lock = Arc::new(lock);
    let (asked, got) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let results: Vec<Option<(u64, u64)>> = rt.block_on(async {
        let handles: Vec<_> = (0..tasks)
            .map(|_| {
                let (lock, asked, got) = (lock.clone(), asked.clone(), got.clone());
                tokio::spawn(async move {
                    let a = asked.fetch_add(1, Ordering::SeqCst);
                    let g = lock().await.ok()?;
                    let r = got.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    drop(g);
                    Some((a, r))
                })
            })
            .collect();
        let mut out = Vec::new();
        for h in handles {
            out.push(h.await.unwrap());
        }
        out
    });
    let timeouts = results.iter().filter(|r| r.is_none()).count();
    (timeouts, results.into_iter().flatten().collect())
}

/// How far, at most, a task's turn came after its place in the order of asking.
fn most_overtaken(ranks: &[(u64, u64)]) -> u64 {
    ranks
        .iter()
        .map(|&(a, g)| g.saturating_sub(a))
        .max()
        .unwrap_or(0)
}

const WAIT: LockOptions = LockOptions {
    exptime: Duration::from_secs(60),
    timeout: Duration::from_secs(30),
    step: Duration::from_millis(1),
    ratio: 2.0,
    max_step: Duration::from_millis(500),
    notify: true,
};

/// The crowd on `lock`: on one runtime thread the order of asking is the order of taking a
/// place in the queue, and the key goes round in that order; on two, no task times out
/// either (the order of asking is then only roughly the order of the places: a thread can
/// be descheduled between the two).
fn crowds<'a, B, F, Fut>(lock: F)
where
    B: Backend + Sync + 'a,
    B::Hold: Send,
    F: Fn() -> Fut + Send + Sync + Clone + 'static,
    Fut: std::future::Future<Output = Result<LockGuard<'a, B>, Error>> + Send,
{
    let (timeouts, ranks) = crowd(1000, true, lock.clone());
    let overtaken = most_overtaken(&ranks);
    println!("one thread: {timeouts} timeouts; a task got the key at most {overtaken} turns after its place");
    assert_eq!((timeouts, ranks.len()), (0, 1000));
    assert!(overtaken <= 2, "a task was overtaken by {overtaken}");
    let (timeouts, ranks) = crowd(1000, false, lock);
    println!(
        "two threads: {timeouts} timeouts, most overtaken {}",
        most_overtaken(&ranks)
    );
    assert_eq!((timeouts, ranks.len()), (0, 1000));
}

#[test]
fn a_thousand_tasks_on_one_table_key_all_get_it_in_turn() {
    let path = TempPath::new("async-crowd");
    let table: &'static LockTable = Box::leak(Box::new(LockTable::open(&path, 64).unwrap()));
    crowds(move || table.lock_async("k", WAIT));
}

#[test]
fn a_thousand_tasks_on_one_redis_key_all_get_it_in_turn() {
    let server = RedisServer::start();
    let redis: &'static RedisLocks = Box::leak(Box::new(RedisLocks::open(&server.url()).unwrap()));
    crowds(move || redis.lock_async("k", WAIT));
}

/// 1000 tasks miss one item at once and read it through `get_or_fetch_async`: one fetches
/// (a slow backend, 50 ms), the others wait without blocking the runtime and find the value
/// it stored.
fn burst<B: shmlock::AsyncBackend + Sync + 'static>(locks: &'static B)
where
    B::Hold: Send,
{
    let path = TempPath::new("async-fetch");
    let cache: &'static shmlock::SharedDict =
        Box::leak(Box::new(shmlock::SharedDict::open(&path, 64, 64).unwrap()));
    let fetches: &'static AtomicU64 = Box::leak(Box::new(AtomicU64::new(0)));
    let rt = runtime();
    let sources: Vec<shmlock::Source> = rt.block_on(async {
        let handles: Vec<_> = (0..1000)
            .map(|_| {
                tokio::spawn(async move {
                    let got = cache
                        .get_or_fetch_async(locks, "item", Duration::from_secs(60), || async {
                            fetches.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            Ok::<_, Error>(b"value".to_vec())
                        })
                        .await
                        .unwrap();
                    assert_eq!(got.value.as_bytes(), Some(&b"value"[..]));
                    got.source
                })
            })
            .collect();
        let mut out = Vec::new();
        for h in handles {
            out.push(h.await.unwrap());
        }
        out
    });
    let fetched = sources
        .iter()
        .filter(|s| **s == shmlock::Source::Fetched)
        .count();
    assert_eq!(
        fetches.load(Ordering::SeqCst),
        1,
        "the backend was asked more than once"
    );
    assert_eq!(fetched, 1);
    drop(path);
}

#[test]
fn a_thousand_tasks_missing_one_item_fetch_it_once_through_the_table() {
    let path = TempPath::new("async-fetch-locks");
    let table: &'static LockTable = Box::leak(Box::new(LockTable::open(&path, 64).unwrap()));
    burst(table);
}

#[test]
fn a_thousand_tasks_missing_one_item_fetch_it_once_through_redis() {
    let server = RedisServer::start();
    let redis: &'static RedisLocks = Box::leak(Box::new(RedisLocks::open(&server.url()).unwrap()));
    burst(redis);
}
