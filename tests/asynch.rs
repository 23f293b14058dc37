//! lock_async on both backends: waiting never blocks the runtime, elapsed is the time waited
//! (the sum of resty's steps when polling), and a guard dropped inside the runtime is
//! released.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::redis_server::RedisServer;
use common::TempPath;
use shmlock::{Error, LockGuard, LockOptions, LockTable, RedisLocks};

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

/// On this (one-thread) runtime: waits for a key with `wait` while `release` frees it after
/// 60 ms. A wait that blocked the thread would starve both the releaser and the ticker.
async fn wait_while_released<'a, B: shmlock::Backend + 'a>(
    wait: impl std::future::Future<Output = Result<LockGuard<'a, B>, Error>>,
    release: impl FnOnce(),
) -> LockGuard<'a, B> {
    let (ticks, t) = ticker();
    let releaser = async {
        tokio::time::sleep(Duration::from_millis(60)).await;
        release();
    };
    let (guard, ()) = tokio::join!(wait, releaser);
    let guard = guard.unwrap();
    // with wake-ups (the default) the time waited; polling, the sum of resty's steps
    let waited = guard.elapsed();
    assert!(
        is_sum_of_steps(waited)
            || (waited >= Duration::from_millis(55) && waited < Duration::from_secs(1)),
        "{waited:?}"
    );
    assert!(
        ticks.load(Ordering::Relaxed) >= 10,
        "the runtime was blocked"
    );
    t.abort();
    guard
}

#[tokio::test(flavor = "current_thread")]
async fn shm_waits_without_blocking_the_runtime() {
    let path = TempPath::new("async");
    let table = LockTable::open(&path, 16).unwrap();
    let held = table.lock("k", LockOptions::default()).unwrap();
    let opts = LockOptions::default();
    let guard = wait_while_released(table.lock_async("k", &opts), || drop(held)).await;
    let short = LockOptions {
        timeout: Duration::from_millis(5),
        ..LockOptions::default()
    };
    assert!(matches!(
        table.lock_async("k", &short).await,
        Err(Error::Timeout { .. })
    ));
    drop(guard);
    assert!(!table.is_locked("k").unwrap());
    // polling, as resty does: the elapsed time is the sum of the steps
    let held = table.lock("k", LockOptions::default()).unwrap();
    let polling = LockOptions {
        notify: false,
        ..LockOptions::default()
    };
    let guard = wait_while_released(table.lock_async("k", &polling), || drop(held)).await;
    assert!(is_sum_of_steps(guard.elapsed()), "{:?}", guard.elapsed());
}

#[tokio::test(flavor = "current_thread")]
async fn redis_waits_without_blocking_the_runtime_and_drop_releases() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    let other = RedisLocks::open(&server.url()).unwrap();
    let held = other.lock("k", LockOptions::default()).unwrap();
    let opts = LockOptions::default();
    let guard = wait_while_released(redis.lock_async("k", &opts), || held.unlock().unwrap()).await;
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

#[test]
fn a_redis_guard_dropped_as_its_runtime_ends_is_still_released() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let guard = redis
            .lock_async("k", &LockOptions::default())
            .await
            .unwrap();
        drop(guard); // handed to the handle's janitor thread, which no runtime drives
    });
    drop(rt);
    // released by that thread within a round trip or so, with no runtime left
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while redis.is_locked("k").unwrap() {
        assert!(
            std::time::Instant::now() < deadline,
            "the dropped guard's key is still held"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Polls `f` once, outside every runtime.
fn poll_outside_a_runtime<F: std::future::Future>(f: F) -> std::task::Poll<F::Output> {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    f.as_mut().poll(&mut cx)
}

/// An async call outside a Tokio runtime is `Error::NoRuntime` at once, on a free key as on
/// a held one, on both backends (a held key's wait panicked in Tokio's timer, a free key
/// was taken: a call that worked until its key was first contended).
#[test]
fn async_calls_outside_a_runtime_are_refused_whether_or_not_the_key_is_free() {
    use std::task::Poll;
    let refused = |what: &str, p: Poll<Result<(), Error>>| {
        assert!(
            matches!(p, Poll::Ready(Err(Error::NoRuntime))),
            "{what}: {p:?}"
        );
    };
    let path = TempPath::new("async-no-runtime");
    let table = LockTable::open(&path, 16).unwrap();
    let opts = LockOptions::default();
    let dict_path = TempPath::new("async-no-runtime-dict");
    let dict = shmlock::SharedDict::open(&dict_path, 16, 16).unwrap();
    for held in [false, true] {
        let _other = held.then(|| table.lock("k", opts).unwrap());
        let what = |call| format!("{call}, the key held: {held}");
        refused(
            &what("lock_async"),
            poll_outside_a_runtime(async { table.lock_async("k", &opts).await.map(drop) }),
        );
        refused(
            &what("lock_shared_async"),
            poll_outside_a_runtime(async { table.lock_shared_async("k", &opts).await.map(drop) }),
        );
        let fetch = dict.get_or_fetch_async(&table, "k", Duration::ZERO, || async {
            Ok::<_, Error>(b"v".to_vec())
        });
        refused(
            &what("get_or_fetch_async"),
            poll_outside_a_runtime(async { fetch.await.map(drop) }),
        );
    }
    let gpus = table.semaphore("gpu", 1).unwrap();
    for held in [false, true] {
        let _other = held.then(|| gpus.acquire(opts).unwrap());
        refused(
            &format!("acquire_async, held: {held}"),
            poll_outside_a_runtime(async { gpus.acquire_async(&opts).await.map(drop) }),
        );
    }
    assert!(!table.is_locked("k").unwrap(), "nothing was taken");

    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    for held in [false, true] {
        let _other = held.then(|| redis.lock("k", opts).unwrap());
        refused(
            &format!("redis lock_async, held: {held}"),
            poll_outside_a_runtime(async { redis.lock_async("k", &opts).await.map(drop) }),
        );
    }
    assert!(!redis.is_locked("k").unwrap(), "nothing was taken");
    assert!(Error::NoRuntime.to_string().contains("no Tokio runtime"));
}
