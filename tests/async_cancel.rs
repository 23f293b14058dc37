//! `lock_async` is cancel-safe and its releases happen: a future dropped at any point of
//! its attempt (before the request went out, after the server applied it but before the
//! reply, inside the `WAIT` for replicas) leaves no hold without a guard, and the key is
//! free again within milliseconds; a `WAIT` holds up no other task's commands; a guard
//! dropped inside `block_on`, or in a runtime that then ends, is released; one handle
//! serves runtime after runtime.
//!
//! Guards `src/redis_store/async_ops.rs`, `aio.rs`, `janitor.rs`, `scripts.rs` (`CANCEL`),
//! and the table's `lock_async` (`src/shm/guards.rs`).

mod common;

use std::time::{Duration, Instant};

use common::redis_server::{eventually, RedisServer};
use shmlock::{Error, LockOptions, LockTable, RedisLocks};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// How long after `t` `is_locked` first said the key was free (polled every 200 µs).
fn free_after(is_locked: impl Fn() -> bool, limit: Duration) -> Option<Duration> {
    let t = Instant::now();
    while is_locked() {
        if t.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    Some(t.elapsed())
}

/// A future polled at most `polls` times, then dropped: `None` if it was cut short. Each
/// poll that finds it pending is one of its await points, so a random `polls` drops it at
/// a random await point (before its request went out, with the request on the server and
/// the reply on its way, inside a `WAIT`...).
struct CutAfter<F> {
    inner: Option<std::pin::Pin<Box<F>>>,
    polls: u32,
}

impl<F: std::future::Future> std::future::Future for CutAfter<F> {
    type Output = Option<F::Output>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<F::Output>> {
        if self.polls == 0 {
            self.inner = None; // dropped here, at the await point it last reached
            return std::task::Poll::Ready(None);
        }
        self.polls -= 1;
        let inner = self.inner.as_mut().expect("polled after the end");
        match inner.as_mut().poll(cx) {
            std::task::Poll::Ready(v) => std::task::Poll::Ready(Some(v)),
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
}

/// `rounds` attempts, each dropped after a random number of polls (1 to `most`, or a
/// random time up to `span` when that is given, for waits that sleep); after each, the key
/// must be free again within a second. Returns how many were cut short, how many of those
/// had left the key held when they were dropped, and the longest time until it was free.
fn cancel_at_random<F, Fut, G>(
    rounds: usize,
    most: u32,
    span: Option<Duration>,
    attempt: F,
    is_locked: impl Fn() -> bool,
) -> (usize, usize, Duration)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<G, Error>>,
{
    let rt = runtime();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let (mut cut, mut left_held, mut longest) = (0, 0, Duration::ZERO);
    for round in 0..rounds {
        let outcome = match span {
            None => {
                let polls = 1 + u32::try_from(xorshift(&mut seed) % u64::from(most)).unwrap();
                rt.block_on(CutAfter {
                    inner: Some(Box::pin(attempt())),
                    polls,
                })
            }
            Some(span) => {
                let us = xorshift(&mut seed) % u64::try_from(span.as_micros()).unwrap().max(1);
                let after = Duration::from_micros(us);
                rt.block_on(async { tokio::time::timeout(after, attempt()).await.ok() })
            }
        };
        match outcome {
            Some(Ok(guard)) => drop(guard), // completed: released by its drop
            Some(Err(e)) => panic!("round {round}: {e}"),
            None => {
                cut += 1;
                if is_locked() {
                    left_held += 1;
                }
            }
        }
        let free = free_after(&is_locked, Duration::from_secs(1))
            .unwrap_or_else(|| panic!("round {round}: the key is still held after 1 s"));
        longest = longest.max(free);
    }
    (cut, left_held, longest)
}

#[test]
fn dropping_a_redis_lock_async_anywhere_leaves_no_hold() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    let probe = RedisLocks::open(&server.url()).unwrap();
    let (cut, left, longest) = cancel_at_random(
        3000,
        8,
        None,
        || redis.lock_async("k", LockOptions::default()),
        || probe.is_locked("k").unwrap(),
    );
    println!("3000 rounds: {cut} cut short, {left} of them had taken the key; free again within {longest:?} at most");
    assert!(
        cut > 300,
        "too few attempts were cut short ({cut}) to mean anything"
    );
    assert!(probe.holders().unwrap().is_empty());
}

/// The same for read holds and a semaphore's permits on Redis: a shared attempt dropped
/// anywhere is cancelled by its token as an exclusive one is.
#[test]
fn dropping_a_redis_shared_or_permit_wait_anywhere_leaves_no_hold() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    let probe = RedisLocks::open(&server.url()).unwrap();
    let (cut, left, longest) = cancel_at_random(
        1500,
        8,
        None,
        || redis.lock_shared_async("r", LockOptions::default()),
        || probe.is_locked("r").unwrap(),
    );
    println!("1500 read rounds: {cut} cut short, {left} of them had taken the key; free again within {longest:?} at most");
    assert!(cut > 75, "too few cut short ({cut})");
    let sem = redis.semaphore("s", 2).unwrap();
    let (cut, left, longest) = cancel_at_random(
        1500,
        8,
        None,
        || sem.acquire_async(LockOptions::default()),
        || probe.is_locked("s").unwrap(),
    );
    println!("1500 permit rounds: {cut} cut short, {left} of them had taken a permit; free again within {longest:?} at most");
    assert!(cut > 75, "too few cut short ({cut})");
    assert!(probe.holders().unwrap().is_empty());
}

#[test]
fn dropping_a_table_lock_async_anywhere_leaves_no_hold() {
    let path = common::TempPath::new("async-cancel");
    let table = LockTable::open(&path, 64).unwrap();
    let holder = LockTable::open(&path, 64).unwrap();
    // a holder that lets go now and then, so that attempts wait and are cut mid-wait
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (cut, _, longest) = std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let g = holder.lock("busy", LockOptions::default()).unwrap();
                std::thread::sleep(Duration::from_micros(300));
                drop(g);
                std::thread::sleep(Duration::from_micros(300));
            }
        });
        let r = cancel_at_random(
            2000,
            4,
            None,
            || table.lock_async("k", LockOptions::default()),
            || table.is_locked("k").unwrap(),
        );
        let r2 = cancel_at_random(
            500,
            0,
            Some(Duration::from_millis(3)),
            || table.lock_async("busy", LockOptions::default()),
            || false,
        );
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (r.0 + r2.0, 0, r.2)
    });
    println!("table: {cut} cut short; free again within {longest:?}");
    assert!(table.holders().iter().all(|h| h.key_preview != b"k"));
}

/// A master with one replica that is stopped: every grant waits the whole `WAIT`.
struct StalledReplica {
    master: RedisServer,
    replica: RedisServer,
}

impl StalledReplica {
    fn start() -> StalledReplica {
        let (master, replica) = RedisServer::with_a_replica();
        replica.pause(true);
        StalledReplica { master, replica }
    }
}

impl Drop for StalledReplica {
    fn drop(&mut self) {
        self.replica.pause(false);
    }
}

#[test]
fn dropping_a_lock_async_inside_its_wait_for_replicas_leaves_no_hold() {
    let setup = StalledReplica::start();
    let redis = RedisLocks::open(&setup.master.url())
        .unwrap()
        .with_replicas(1, Duration::from_millis(200));
    let probe = RedisLocks::open(&setup.master.url()).unwrap();
    let (cut, left, longest) = cancel_at_random(
        100,
        0,
        Some(Duration::from_millis(150)),
        || redis.lock_async("w", LockOptions::default()),
        || probe.is_locked("w").unwrap(),
    );
    println!("100 rounds: {cut} cut short, {left} inside the WAIT; free again within {longest:?}");
    // (how many rounds land inside the WAIT depends on the machine's load: a quarter of
    // them is plenty to exercise it; a CI run beside other loads had 47 of 100)
    assert!(
        left >= 25,
        "the attempts were not cut inside the WAIT ({left})"
    );
    // and one that runs to its end is refused, with the key given back
    let rt = runtime();
    let refused = rt.block_on(redis.lock_async("w", LockOptions::default()));
    assert!(matches!(
        refused,
        Err(Error::NotReplicated {
            acked: 0,
            wanted: 1,
            ..
        })
    ));
    eventually(
        "the refused grant given back",
        Duration::from_secs(1),
        || !probe.is_locked("w").unwrap(),
    );
}

/// While one task of a handle waits for replicas, another task's attempt on the same
/// handle reaches the server at once (it does not queue behind the `WAIT`).
#[test]
fn a_wait_for_replicas_holds_up_no_other_task() {
    let setup = StalledReplica::start();
    let redis = RedisLocks::open(&setup.master.url())
        .unwrap()
        .with_replicas(1, Duration::from_secs(2));
    let probe = RedisLocks::open(&setup.master.url()).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (seen_b, a) = rt.block_on(async {
        let redis2 = redis.clone();
        let started = Instant::now();
        let a = tokio::spawn(async move {
            let r = redis2.lock_async("a", LockOptions::default()).await;
            (started.elapsed(), r.is_err())
        });
        tokio::time::sleep(Duration::from_millis(200)).await; // a is in its WAIT
        let redis3 = redis.clone();
        let b = tokio::spawn(async move {
            let _ = redis3.lock_async("b", LockOptions::default()).await;
        });
        // b's SET is on the server while a still waits for its replica (its 2 s WAIT: a b
        // queued behind it would be seen at 2 s at the earliest; looked for until 1.5 s, so
        // that a busy machine's slow start of b is not taken for queueing)
        let probe2 = probe.clone();
        let seen_b = tokio::task::spawn_blocking(move || loop {
            if probe2.is_locked("b").unwrap() {
                break true;
            }
            if started.elapsed() > Duration::from_millis(1500) {
                break false;
            }
            std::thread::sleep(Duration::from_millis(20));
        })
        .await
        .unwrap();
        let a = a.await.unwrap();
        b.await.unwrap();
        (seen_b, a)
    });
    assert!(a.1, "a was granted with its replica stopped");
    assert!(
        a.0 >= Duration::from_millis(1500),
        "a's WAIT ended early ({:?}): b's check ran after it",
        a.0
    );
    assert!(seen_b, "b's attempt queued behind a's WAIT");
}

/// A guard dropped inside `block_on`, the runtime kept but not driven any more: released.
#[test]
fn a_guard_dropped_inside_block_on_is_released_while_the_runtime_lives() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    let rt = runtime();
    rt.block_on(async {
        let g = redis.lock_async("k", LockOptions::default()).await.unwrap();
        drop(g);
    });
    // the runtime lives on, idle: nothing runs its tasks
    let free = free_after(|| redis.is_locked("k").unwrap(), Duration::from_secs(2));
    assert!(free.is_some(), "the guard's key is still held");
    // and a sync lock on this thread gets it
    let opts = LockOptions {
        timeout: Duration::from_millis(500),
        ..LockOptions::default()
    };
    redis.lock("k", opts).unwrap().unlock().unwrap();
    drop(rt);
}

/// One handle, three runtimes in turn, each taking and dropping a guard: every one works
/// (the async connection of a runtime that ended is not reused) and the key ends free.
#[test]
fn one_handle_serves_runtime_after_runtime() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    for i in 0..3 {
        let rt = runtime();
        let got = rt.block_on(async {
            let g = redis.lock_async("k", LockOptions::default()).await?;
            let t = g.try_token()?;
            drop(g);
            Ok::<_, Error>(t)
        });
        assert!(got.is_ok(), "runtime {i}: {got:?}");
        drop(rt);
        assert!(
            free_after(|| redis.is_locked("k").unwrap(), Duration::from_secs(2)).is_some(),
            "runtime {i}'s guard was not released"
        );
    }
}

/// An async wait whose deadline passes while its request is unanswered (the link stalled
/// right after it) fails with an error that names the server, as every other connection
/// error does: it said "the deadline passed".
#[test]
fn a_deadline_passed_mid_request_names_the_server() {
    let server = RedisServer::start();
    let proxy = common::proxy::Proxy::start(server.port);
    let redis = RedisLocks::open(&proxy.url()).unwrap();
    let rt = runtime();
    rt.block_on(async {
        // the scripts cached, the async connection made
        drop(redis.lock_async("k", LockOptions::default()).await.unwrap());
        proxy.freeze_after(b"EVALSHA", Duration::from_secs(3));
        let opts = LockOptions {
            timeout: Duration::from_millis(500),
            ..LockOptions::default()
        };
        let err = match redis.lock_shared_async("k", &opts).await {
            Ok(_) => panic!("granted through a frozen link"),
            Err(e) => e,
        };
        assert_eq!(proxy.freezes(), 1, "the link never stalled");
        let text = err.to_string();
        assert!(
            text.contains(&format!("127.0.0.1:{}", proxy.port)),
            "{text}"
        );
    });
}
