//! lock_async on both backends: waiting never blocks the runtime, elapsed is the sum of the
//! steps, and a guard dropped inside the runtime is released.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::redis_server::RedisServer;
use common::TempPath;
use shmlock::{Error, LockOptions, LockTable, RedisLocks};

/// Ticks every millisecond until stopped: counts how often the runtime let it run.
fn ticker() -> (Arc<AtomicU64>, tokio::task::JoinHandle<()>) {
    let ticks = Arc::new(AtomicU64::new(0));
    let t = ticks.clone();
    let handle = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(1)).await;
            t.fetch_add(1, Ordering::Relaxed);
        }
    });
    (ticks, handle)
}

fn is_sum_of_steps(d: Duration) -> bool {
    let ms = d.as_millis() as u64;
    d == Duration::from_millis(ms) && ms > 0 && (ms + 1).is_power_of_two()
}

// One thread: a wait that blocked it would starve the ticker and the releasing task.
#[tokio::test(flavor = "current_thread")]
async fn shm_waits_without_blocking_the_runtime() {
    let path = TempPath::new("async");
    let table = LockTable::open(&path, 16).unwrap();
    let held = table.lock("k", &LockOptions::default()).unwrap();
    let (ticks, t) = ticker();
    let releaser = async {
        tokio::time::sleep(Duration::from_millis(60)).await;
        drop(held);
    };
    let opts = LockOptions::default();
    let (guard, ()) = tokio::join!(table.lock_async("k", &opts), releaser);
    let guard = guard.unwrap();
    assert!(is_sum_of_steps(guard.elapsed()), "{:?}", guard.elapsed());
    assert!(
        ticks.load(Ordering::Relaxed) >= 10,
        "the runtime was blocked"
    );
    t.abort();
    let short = LockOptions {
        timeout: Duration::from_millis(5),
        ..LockOptions::default()
    };
    assert!(matches!(
        table.lock_async("k", &short).await,
        Err(Error::Timeout)
    ));
    drop(guard);
    assert!(!table.is_locked("k").unwrap());
}

#[tokio::test(flavor = "current_thread")]
async fn redis_waits_without_blocking_the_runtime_and_drop_releases() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    let other = RedisLocks::open(&server.url()).unwrap();
    let held = other.lock("k", &LockOptions::default()).unwrap();
    let (ticks, t) = ticker();
    let releaser = async {
        tokio::time::sleep(Duration::from_millis(60)).await;
        held.unlock().unwrap();
    };
    let opts = LockOptions::default();
    let (guard, ()) = tokio::join!(redis.lock_async("k", &opts), releaser);
    let guard = guard.unwrap();
    assert!(is_sum_of_steps(guard.elapsed()), "{:?}", guard.elapsed());
    assert!(
        ticks.load(Ordering::Relaxed) >= 10,
        "the runtime was blocked"
    );
    t.abort();
    // dropped inside the runtime: released on the blocking pool, soon
    drop(guard);
    for _ in 0..500 {
        if !redis.is_locked("k").unwrap() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("the dropped guard's key is still held");
}
