//! Shared holds and semaphores on the Redis backend, against a real redis-server: readers
//! beside readers and never beside a writer, a waiting writer keeping new readers out (and
//! its mark lapsing when it gives up), semaphores of N with their count fixed, leases,
//! renewals and owner-checked releases of each holder, fencing tokens, `downgrade`,
//! inspection and breaking, wake-ups through the release channel, many readers at once,
//! and async waits dropped at every await. Each thread opens a handle of its own (a host of
//! its own); the real-process cases (kills and stops) are in tests/redis_shared_procs.rs.

mod common;

use std::time::{Duration, Instant};

use common::redis_server::{eventually, RedisServer};
use shmlock::{Error, HoldMode, Lock, LockOptions, RedisLocks};

const LONG: Duration = Duration::from_secs(30);

fn opts(timeout: Duration) -> LockOptions {
    LockOptions {
        timeout,
        ..LockOptions::default()
    }
}

/// A wait whose steps (5 s) are far longer than a test allows: only a wake-up (a release's
/// message, or the end of what kept it out) gets it in in time.
fn long_steps() -> LockOptions {
    LockOptions {
        timeout: LONG,
        step: Duration::from_secs(5),
        max_step: Duration::from_secs(5),
        ..LockOptions::default()
    }
}

#[test]
fn readers_share_a_key_and_never_stand_beside_a_writer() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    let a = redis.lock_shared("cfg", opts(LONG)).unwrap();
    let b = redis
        .try_lock_shared("cfg", LONG)
        .unwrap()
        .expect("readers share");
    assert!(redis.is_locked("cfg").unwrap());
    assert!(redis.try_lock_with_lease("cfg", LONG).unwrap().is_none());
    drop(a);
    assert!(redis.try_lock_with_lease("cfg", LONG).unwrap().is_none());
    b.unlock().unwrap();
    assert!(!redis.is_locked("cfg").unwrap());
    let w = redis
        .try_lock_with_lease("cfg", LONG)
        .unwrap()
        .expect("free");
    assert!(redis.try_lock_shared("cfg", LONG).unwrap().is_none());
    // a reader that waits for the writer names it when it gives up
    match redis.lock_shared("cfg", opts(Duration::from_millis(200))) {
        Err(Error::Timeout { holder, .. }) => {
            assert_eq!(holder.and_then(|h| h.pid), Some(std::process::id()));
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    drop(w);
    let r = redis.try_lock_shared("cfg", LONG).unwrap();
    assert!(r.is_some());
}

#[test]
fn a_sleeping_writer_keeps_new_readers_out_and_is_woken_by_the_last_reader() {
    let server = RedisServer::start();
    let url = server.url();
    let redis = RedisLocks::open(&url).unwrap();
    let first = redis.lock_shared("doc", opts(LONG)).unwrap();
    let writer = std::thread::spawn(move || {
        let redis = RedisLocks::open(&url).unwrap();
        let o = long_steps();
        let started = Instant::now();
        let g = redis.lock("doc", o).unwrap();
        let took = started.elapsed();
        g.unlock().unwrap();
        took
    });
    // the writer's mark keeps a new reader out while the first reader still reads
    eventually("the writer's mark", LONG, || {
        server.cli(&["EXISTS", "shmlock:{doc}:writer"]).trim() == "1"
    });
    assert!(redis.try_lock_shared("doc", LONG).unwrap().is_none());
    let released = Instant::now();
    drop(first);
    let took = writer.join().unwrap();
    let after_release = released.elapsed();
    assert!(
        after_release < Duration::from_secs(4),
        "the writer was not woken by the release: {after_release:?} (waited {took:?})"
    );
    // the mark went with the writer's hold: readers come back at once
    assert!(redis.try_lock_shared("doc", LONG).unwrap().is_some());
}

#[test]
fn the_mark_of_a_writer_that_gave_up_lapses() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    let reader = redis.lock_shared("k", opts(LONG)).unwrap();
    let gave_up = redis.lock("k", opts(Duration::from_millis(300)));
    assert!(matches!(gave_up, Err(Error::Timeout { .. })), "{gave_up:?}");
    assert_eq!(server.cli(&["EXISTS", "shmlock:{k}:writer"]).trim(), "1");
    eventually("a reader gets in once the mark lapses", LONG, || {
        redis.try_lock_shared("k", LONG).unwrap().is_some()
    });
    drop(reader);
}

#[test]
fn a_try_or_polling_writer_does_not_keep_readers_out() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    let _reader = redis.lock_shared("k", opts(LONG)).unwrap();
    assert!(redis.try_lock_with_lease("k", LONG).unwrap().is_none());
    let polling = LockOptions {
        timeout: Duration::from_millis(100),
        notify: false,
        ..LockOptions::default()
    };
    assert!(redis.lock("k", polling).is_err());
    assert_eq!(server.cli(&["EXISTS", "shmlock:{k}:writer"]).trim(), "0");
    assert!(redis.try_lock_shared("k", LONG).unwrap().is_some());
}

#[test]
fn a_semaphore_grants_its_count_and_its_count_is_fixed_while_held() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    assert!(matches!(
        redis.semaphore("gpu", 0),
        Err(Error::InvalidOptions(_))
    ));
    let gpus = redis.semaphore("gpu", 2).unwrap();
    let a = gpus.acquire(opts(LONG)).unwrap();
    let b = gpus.try_acquire(LONG).unwrap().expect("a second permit");
    assert_eq!(gpus.held().unwrap(), 2);
    assert!(gpus.try_acquire(LONG).unwrap().is_none());
    match redis.semaphore("gpu", 3).unwrap().try_acquire(LONG) {
        Err(Error::PermitsMismatch {
            held: 2, asked: 3, ..
        }) => {}
        other => panic!("expected PermitsMismatch, got {other:?}"),
    }
    match redis.try_lock_shared("gpu", LONG) {
        Err(Error::PermitsMismatch {
            held: 2, asked: 0, ..
        }) => {}
        other => panic!("expected PermitsMismatch, got {other:?}"),
    }
    assert!(redis.try_lock_with_lease("gpu", LONG).unwrap().is_none());
    drop(a);
    assert_eq!(gpus.held().unwrap(), 1);
    let c = gpus.try_acquire(LONG).unwrap().expect("a freed permit");
    drop((b, c));
    assert_eq!(gpus.held().unwrap(), 0);
    // no permit held: another count may use the key
    let three = redis.semaphore("gpu", 3).unwrap();
    let held: Vec<_> = (0..3)
        .map(|_| three.try_acquire(LONG).unwrap().unwrap())
        .collect();
    assert!(three.try_acquire(LONG).unwrap().is_none());
    drop(held);
    // nothing is left on the server (but the releases' short-lived marks)
    let left = server.cli(&["KEYS", "shmlock:{gpu}*"]);
    let left: Vec<_> = left
        .lines()
        .filter(|k| !k.is_empty() && !k.contains(":released:"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_permit_waiter_is_woken_by_a_release() {
    let server = RedisServer::start();
    let url = server.url();
    let redis = RedisLocks::open(&url).unwrap();
    let sem = redis.semaphore("jobs", 1).unwrap();
    let held = sem.acquire(opts(LONG)).unwrap();
    let waiter = std::thread::spawn(move || {
        let redis = RedisLocks::open(&url).unwrap();
        let o = long_steps();
        let sem = redis.semaphore("jobs", 1).unwrap();
        let g = sem.acquire(o).unwrap();
        let at = Instant::now();
        drop(g);
        at
    });
    std::thread::sleep(Duration::from_millis(300)); // the waiter is asleep by now
    let released = Instant::now();
    drop(held);
    let got = waiter.join().unwrap();
    assert!(
        got.duration_since(released) < Duration::from_secs(4),
        "woken only by its step"
    );
}

#[test]
fn each_shared_holder_has_its_own_lease_renewal_and_owner_checked_release() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    let short = redis
        .try_lock_shared("r", Duration::from_millis(300))
        .unwrap()
        .unwrap();
    let mut kept = redis
        .try_lock_shared("r", Duration::from_millis(300))
        .unwrap()
        .unwrap();
    kept.expire(Some(LONG)).unwrap();
    std::thread::sleep(Duration::from_millis(600));
    assert!(matches!(short.check(), Err(Error::Expired)));
    assert!(matches!(short.unlock(), Err(Error::Expired)));
    kept.check().unwrap();
    // a writer is still kept out by the renewed reader, then gets in
    assert!(redis.try_lock_with_lease("r", LONG).unwrap().is_none());
    // a reader's keep_alive renews; breaking the key loses it
    let mut lock = Lock::new(
        redis.shared(),
        LockOptions {
            exptime: Duration::from_millis(300),
            ..LockOptions::default()
        },
    )
    .unwrap();
    lock.lock("r").unwrap();
    let ((), held) = lock
        .keep_alive(|_| std::thread::sleep(Duration::from_millis(700)))
        .unwrap();
    held.unwrap();
    assert!(redis.force_unlock("r").unwrap());
    assert!(matches!(kept.check(), Err(Error::Expired)));
    assert!(matches!(lock.unlock(), Err(Error::Expired)));
    assert!(matches!(kept.unlock(), Err(Error::Expired)));
    assert!(!redis.is_locked("r").unwrap());
}

#[test]
fn readers_read_the_token_of_the_last_write_and_downgrade_keeps_it() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    let w = redis.lock("t", opts(LONG)).unwrap();
    let t1 = w.try_token().unwrap();
    let r1 = w.downgrade().unwrap();
    assert_eq!(
        r1.try_token().unwrap(),
        t1,
        "a downgraded hold reads its own write"
    );
    // readers were let in, a writer is not
    let r2 = redis.try_lock_shared("t", LONG).unwrap().unwrap();
    assert_eq!(r2.try_token().unwrap(), t1);
    assert!(redis.try_lock_with_lease("t", LONG).unwrap().is_none());
    drop((r1, r2));
    let w2 = redis.lock("t", opts(LONG)).unwrap();
    let t2 = w2.try_token().unwrap();
    assert!(t2 > t1);
    drop(w2);
    let r3 = redis.lock_shared("t", opts(LONG)).unwrap();
    assert_eq!(r3.try_token().unwrap(), t2);
    // a downgrade of a lost hold fails and leaves nothing
    let w3 = redis.try_lock_with_lease("u", LONG).unwrap().unwrap();
    redis.force_unlock("u").unwrap();
    assert!(matches!(w3.downgrade(), Err(Error::Expired)));
    assert!(!redis.is_locked("u").unwrap());
}

#[test]
fn holders_lists_readers_and_permits_and_force_unlock_breaks_them_all() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    let _w = redis.lock("x", opts(LONG)).unwrap();
    let readers: Vec<_> = (0..3)
        .map(|_| redis.lock_shared("r", opts(LONG)).unwrap())
        .collect();
    let sem = redis.semaphore("s", 4).unwrap();
    let _p = sem.acquire(opts(LONG)).unwrap();
    let mut h = redis.holders().unwrap();
    h.sort_by(|a, b| a.key.cmp(&b.key));
    let modes: Vec<_> = h.iter().map(|h| (h.key.clone(), h.mode)).collect();
    assert_eq!(
        modes,
        vec![
            (b"r".to_vec(), HoldMode::Shared),
            (b"r".to_vec(), HoldMode::Shared),
            (b"r".to_vec(), HoldMode::Shared),
            (b"s".to_vec(), HoldMode::Permit { permits: 4 }),
            (b"x".to_vec(), HoldMode::Exclusive),
        ]
    );
    for holder in &h {
        assert_eq!(holder.pid, Some(std::process::id()));
        let ttl = holder.ttl.expect("a lease");
        assert!(ttl <= LockOptions::default().exptime && !ttl.is_zero());
    }
    assert!(redis.force_unlock("r").unwrap());
    for r in readers {
        assert!(matches!(r.unlock(), Err(Error::Expired)));
    }
    assert!(!redis.force_unlock("r").unwrap());
}

#[test]
fn thousands_of_readers_at_once_then_a_writer() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    let readers: Vec<_> = (0..2000)
        .map(|_| redis.try_lock_shared("many", LONG).unwrap().unwrap())
        .collect();
    assert_eq!(
        server.cli(&["ZCARD", "shmlock:{many}:leases"]).trim(),
        "2000"
    );
    assert!(redis.try_lock_with_lease("many", LONG).unwrap().is_none());
    drop(readers);
    assert!(redis.try_lock_with_lease("many", LONG).unwrap().is_some());
}

#[test]
fn thousands_of_lapsed_readers_are_dropped_in_one_attempt() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    for _ in 0..1500 {
        let g = redis
            .try_lock_shared("lapsed", Duration::from_millis(400))
            .unwrap()
            .unwrap();
        g.leave_to_expire();
    }
    // the keys themselves expire with the last lease; a writer gets in by then
    eventually("the writer after the leases", LONG, || {
        redis.try_lock_with_lease("lapsed", LONG).unwrap().is_some()
    });
}

#[cfg(feature = "tokio")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_readers_and_permits_and_their_cancellation_leave_nothing() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    let a = redis.lock_shared_async("k", opts(LONG)).await.unwrap();
    let b = redis.lock_shared_async("k", opts(LONG)).await.unwrap();
    // a writer waits; dropped at its first sleep, it leaves no hold
    let w = tokio::time::timeout(
        Duration::from_millis(200),
        redis.lock_async("k", opts(LONG)),
    );
    assert!(w.await.is_err());
    drop((a, b));
    let sem = redis.semaphore("s", 2).unwrap();
    let p1 = sem.acquire_async(opts(LONG)).await.unwrap();
    let p2 = sem.acquire_async(opts(LONG)).await.unwrap();
    // waiters dropped after every poll count: none leaves a permit behind
    for polls in 0..6 {
        let mut fut = Box::pin(sem.acquire_async(opts(LONG)));
        for _ in 0..polls {
            let _ = futures_poll_once(fut.as_mut()).await;
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        drop(fut);
    }
    drop((p1, p2));
    eventually("every permit back", LONG, || sem.held().unwrap() == 0);
    // readers woken by a writer's release all get in
    let w = redis.lock_async("k", opts(LONG)).await.unwrap();
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let redis = redis.clone();
            tokio::spawn(async move {
                let o = long_steps();
                let g = redis.lock_shared_async("k", &o).await.unwrap();
                tokio::time::sleep(Duration::from_millis(200)).await;
                drop(g);
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    drop(w);
    for t in tasks {
        t.await.unwrap();
    }
    assert!(
        released.elapsed() < Duration::from_secs(4),
        "readers behind a writer were not passed the wake-up"
    );
    eventually("nothing held", LONG, || !redis.is_locked("k").unwrap());
}

/// Polls a future once (as a `select!` that loses would).
#[cfg(feature = "tokio")]
async fn futures_poll_once<F: std::future::Future + Unpin>(f: F) -> Option<F::Output> {
    let mut f = f;
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match std::pin::Pin::new(&mut f).poll(cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        })
    })
    .await
}

fn exists(server: &RedisServer, key: &str) -> bool {
    server.cli(&["EXISTS", key]).trim() == "1"
}

/// A reader with no lease beside one whose lease lapses (left to expire, as if killed):
/// once the first releases, the keys expire with the lapsed lease instead of staying with
/// the no-lease one's "never".
#[test]
fn the_keys_expire_with_the_last_lease_left_after_a_release() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    let forever = redis
        .try_lock_shared("inf", Duration::ZERO)
        .unwrap()
        .unwrap();
    let dies = redis
        .try_lock_shared("inf", Duration::from_millis(300))
        .unwrap()
        .unwrap();
    dies.leave_to_expire();
    forever.unlock().unwrap();
    eventually("the keys gone with the lapsed lease", LONG, || {
        !exists(&server, "shmlock:{inf}:shared") && !exists(&server, "shmlock:{inf}:leases")
    });
    assert!(!redis.is_locked("inf").unwrap());
}

/// A downgrade whose reply is lost (the connection cut after the request reached the
/// server) is tried again, and the retry sees that it was done: the caller gets its read
/// hold, and a writer stays out.
#[test]
fn a_downgrade_whose_reply_was_lost_keeps_the_read_hold() {
    let server = RedisServer::start();
    let proxy = common::proxy::Proxy::start(server.port);
    // (the default command timeout: the cut ends the connection at once, and a shorter
    // one could run out before the request reached the proxy on a loaded machine)
    let redis = RedisLocks::open(&proxy.url()).unwrap();
    let w = redis.lock("dg", opts(LONG)).unwrap();
    // the first run goes as EVAL with the script's code (the server lacks it): cut there
    proxy.cut_after(b"redis.call('HSET', KEYS[3], ARGV[1], v, 'limit', '0')");
    let r = w.downgrade();
    assert_eq!(proxy.cuts(), 1, "the proxy did not cut the downgrade");
    let r = r.expect("the downgrade was done");
    r.check().unwrap();
    assert!(redis.try_lock_with_lease("dg", LONG).unwrap().is_none());
    r.unlock().unwrap();
    assert!(!redis.is_locked("dg").unwrap());
}

/// A reader's token once the fence counter has lapsed is not 0: it is at least the last
/// writer's, and the next writer's is greater.
#[test]
fn a_readers_token_never_goes_back_when_the_counter_lapsed() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url())
        .unwrap()
        .with_fence_grace(Duration::from_millis(1));
    let w = redis
        .try_lock_with_lease("f", Duration::from_millis(200))
        .unwrap()
        .unwrap();
    let wt = w.try_token().unwrap();
    w.unlock().unwrap();
    eventually("the counter lapses", LONG, || {
        !exists(&server, "shmlock:{f}:fence")
    });
    let r = redis.try_lock_shared("f", LONG).unwrap().unwrap();
    let rt = r.try_token().unwrap();
    assert!(rt >= wt, "the writer's token {wt}, the next reader's {rt}");
    // the counter, set to the clock by that ask, lapses again while the reader holds: its
    // token stays the one it was given (it was the clock of the next ask, once a CI run
    // took more than the grace between two asks)
    eventually("the counter lapses again", LONG, || {
        !exists(&server, "shmlock:{f}:fence")
    });
    assert_eq!(r.try_token().unwrap(), rt, "a reader's token stays");
    drop(r);
    let w2 = redis.try_lock_with_lease("f", LONG).unwrap().unwrap();
    assert!(w2.try_token().unwrap() > rt);
}

/// A writer on a semaphore's key gets in under permits that overlap (its mark keeps new
/// permits out, as new readers).
#[test]
fn a_writer_gets_in_under_overlapping_permits() {
    let server = RedisServer::start();
    let url = server.url();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let (url, stop) = (url.clone(), stop.clone());
            std::thread::spawn(move || {
                let redis = RedisLocks::open(&url).unwrap();
                let sem = redis.semaphore("sem", 2).unwrap();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Ok(p) = sem.acquire(opts(Duration::from_secs(5))) {
                        std::thread::sleep(Duration::from_millis(60));
                        drop(p);
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let redis = RedisLocks::open(&url).unwrap();
    let r = redis.lock("sem", opts(Duration::from_secs(20)));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    assert!(r.is_ok(), "the writer starved: {:?}", r.err());
}

/// Keys named like the keys beside a lock (`}`, `:leases`, `:shared`, glob characters)
/// are locks of their own, and leave nothing behind.
#[test]
fn awkward_key_names_are_separate_locks() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    let names = [
        "a",
        "a}",
        "a}:leases",
        "a}:shared",
        "a:leases",
        "*",
        "a*",
        "[a]",
        "a?",
        "{a}",
        "}a",
        "a\\",
        "a}:writer",
        "a}:fence",
    ];
    let mut guards = Vec::new();
    for (i, n) in names.iter().enumerate() {
        if i % 2 == 0 {
            guards.push(redis.try_lock_shared(n, LONG).unwrap().expect(n));
        } else {
            let sem = redis.semaphore(n, 1).unwrap();
            sem.try_acquire(LONG).unwrap().expect(n).unlock().unwrap();
        }
    }
    for (i, n) in names.iter().enumerate() {
        let w = redis.try_lock_with_lease(n, LONG).unwrap();
        assert_eq!(w.is_some(), i % 2 == 1, "{n}");
    }
    let shared = redis
        .holders()
        .unwrap()
        .iter()
        .filter(|h| h.mode == HoldMode::Shared)
        .count();
    assert_eq!(shared, names.len().div_ceil(2));
    drop(guards);
    let keys = server.cli(&["KEYS", "*"]);
    let left: Vec<&str> = keys
        .lines()
        .filter(|l| !l.is_empty() && !l.contains(":released:") && !l.ends_with(":fence"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// Both marks left with no hold (a reader that gave up while a writer held the key, a
/// writer that waits): the free key goes to the writer (writers first), and the readers'
/// mark then makes the next writer wait for a reader.
#[test]
fn two_marks_never_keep_a_free_key_from_everyone() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    server.cli(&["SET", "shmlock:{k}:readers", "1", "PX", "5000"]);
    server.cli(&["SET", "shmlock:{k}:writer", "1", "PX", "5000"]);
    assert!(
        redis.try_lock_shared("k", LONG).unwrap().is_none(),
        "a writer waits"
    );
    let w = redis.try_lock_with_lease("k", LONG).unwrap();
    assert!(
        w.is_some(),
        "a free key refused to a writer with both marks"
    );
    drop(w);
    assert!(!exists(&server, "shmlock:{k}:writer"));
    // the readers' turn now
    assert!(redis.try_lock_with_lease("k", LONG).unwrap().is_none());
    let r = redis.try_lock_shared("k", LONG).unwrap().unwrap();
    assert!(
        !exists(&server, "shmlock:{k}:readers"),
        "a reader's take ends its mark"
    );
    drop(r);
    assert!(redis.try_lock_with_lease("k", LONG).unwrap().is_some());
}

/// A downgrade is a reader's take: it ends the readers' mark (left by a reader that gave
/// up while the key was held), so a writer that then waits on the downgraded hold gets
/// in when it goes.
#[test]
fn a_downgrade_ends_the_readers_mark() {
    let server = RedisServer::start();
    let url = server.url();
    let redis = RedisLocks::open(&url).unwrap();
    let x = redis.lock("k", opts(LONG)).unwrap();
    let reader = RedisLocks::open(&url).unwrap();
    let gave_up = reader.lock_shared("k", opts(Duration::from_millis(300)));
    assert!(matches!(gave_up, Err(Error::Timeout { .. })), "{gave_up:?}");
    assert!(exists(&server, "shmlock:{k}:readers"));
    let down = x.downgrade().unwrap();
    assert!(!exists(&server, "shmlock:{k}:readers"));
    drop(down);
    assert!(redis.try_lock_with_lease("k", LONG).unwrap().is_some());
}

/// Tasks of one process waiting to read (or for permits) behind holds that lapse (their
/// holders died): the first follows the lapse and passes the turn on, so none sleeps out
/// its (5 s) step.
#[cfg(feature = "tokio")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_shared_waiters_behind_lapsing_holds_all_follow_the_lapse() {
    let server = RedisServer::start();
    let url = server.url();
    let holder = RedisLocks::open(&url).unwrap();
    let lease = Duration::from_millis(700);
    let w = holder.try_lock_with_lease("k", lease).unwrap().unwrap();
    w.leave_to_expire();
    let sem = holder.semaphore("p", 3).unwrap();
    for _ in 0..3 {
        sem.try_acquire(lease).unwrap().unwrap().leave_to_expire();
    }
    let lapse = Instant::now() + lease;
    let redis = RedisLocks::open(&url).unwrap();
    let o = long_steps();
    let readers = (0..5).map(|_| async {
        let g = redis.lock_shared_async("k", &o).await.unwrap();
        let at = Instant::now();
        // held far longer than the bound below: a waiter behind it is not let in by
        // its release
        tokio::time::sleep(Duration::from_secs(3)).await;
        drop(g);
        at
    });
    let permits = (0..3).map(|_| async {
        let s = redis.semaphore("p", 3).unwrap();
        let g = s.acquire_async(&o).await.unwrap();
        let at = Instant::now();
        // held far longer than the bound below: a waiter behind it is not let in by
        // its release
        tokio::time::sleep(Duration::from_secs(3)).await;
        drop(g);
        at
    });
    let (r, p) = tokio::join!(
        futures_join_all(readers.collect()),
        futures_join_all(permits.collect())
    );
    let late: Vec<Duration> = r
        .iter()
        .chain(&p)
        .map(|at| at.saturating_duration_since(lapse))
        .collect();
    assert!(
        late.iter().all(|l| *l < Duration::from_secs(2)),
        "a waiter slept out its step: {late:?} after the lapse"
    );
}

/// Awaits every future (in this task), in order of the list.
#[cfg(feature = "tokio")]
async fn futures_join_all<F: std::future::Future>(futs: Vec<F>) -> Vec<F::Output> {
    let mut futs: Vec<_> = futs.into_iter().map(Box::pin).map(Some).collect();
    let mut out: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, o) in futs.iter_mut().zip(out.iter_mut()) {
            if let Some(fut) = f {
                match fut.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => {
                        *o = Some(v);
                        *f = None;
                    }
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().map(|o| o.expect("ready")).collect()
}
