//! What only the Redis backend has to show, against a real redis-server: many connections
//! (standing in for many hosts) keeping mutual exclusion, guards, and a server restart.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::redis_server::RedisServer;
use shmlock::{Error, Lock, LockOptions, RedisLocks};

#[test]
fn many_connections_keep_mutual_exclusion() {
    let server = RedisServer::start();
    let inside = Arc::new(AtomicBool::new(false));
    let counter = Arc::new(AtomicU64::new(0));
    let overlaps = Arc::new(AtomicU64::new(0));
    let hosts: Vec<_> = (0..4)
        .map(|_| {
            let (url, inside, counter, overlaps) = (
                server.url(),
                inside.clone(),
                counter.clone(),
                overlaps.clone(),
            );
            std::thread::spawn(move || {
                // each "host" has its own connection
                let redis = RedisLocks::open(&url).unwrap();
                let opts = LockOptions {
                    step: Duration::from_micros(200),
                    ..LockOptions::default()
                };
                let mut lock = Lock::new(&redis, opts).unwrap();
                for _ in 0..300 {
                    lock.lock("hot").unwrap();
                    if inside.swap(true, Ordering::SeqCst) {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    let v = counter.load(Ordering::Relaxed);
                    std::thread::yield_now();
                    counter.store(v + 1, Ordering::Relaxed);
                    inside.store(false, Ordering::SeqCst);
                    lock.unlock().unwrap();
                }
            })
        })
        .collect();
    for h in hosts {
        h.join().unwrap();
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    assert_eq!(counter.load(Ordering::SeqCst), 4 * 300);
}

#[test]
fn guards_try_lock_and_is_locked() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap().with_prefix("app:");
    let g = redis.lock("job", LockOptions::default()).unwrap();
    assert!(redis.is_locked("job").unwrap());
    assert!(redis
        .try_lock_with_lease("job", Duration::from_secs(5))
        .unwrap()
        .is_none());
    let tok = g.token().unwrap();
    drop(g);
    assert!(!redis.is_locked("job").unwrap());
    let g = redis
        .try_lock_with_lease("job", Duration::from_secs(5))
        .unwrap()
        .unwrap();
    assert!(g.token().unwrap() > tok);
    // the prefix namespaces keys: another prefix does not see this lock
    let other = RedisLocks::open(&server.url())
        .unwrap()
        .with_prefix("other:");
    assert!(!other.is_locked("job").unwrap());
    g.unlock().unwrap();
}

#[test]
fn a_server_restart_gives_typed_errors_then_recovers() {
    let mut server = RedisServer::start();
    let redis = RedisLocks::open(&server.url())
        .unwrap()
        .with_timeout(Duration::from_millis(500));
    let mut holder = Lock::new(&redis, LockOptions::default()).unwrap();
    holder.lock("k").unwrap();
    server.stop();
    let mut other = Lock::new(&redis, LockOptions::default()).unwrap();
    assert!(matches!(other.lock("k"), Err(Error::Redis(_))));
    assert!(matches!(redis.is_locked("k"), Err(Error::Redis(_))));
    server.restart(); // empty: the old hold is gone with the old server
    assert!(!redis.is_locked("k").unwrap());
    // the holder's unlock finds its hold gone with the old server: it was lost, and says so
    assert!(matches!(holder.unlock(), Err(Error::Expired)));
    other.lock("k").unwrap();
    assert!(redis.is_locked("k").unwrap());
    other.unlock().unwrap();
    assert!(matches!(
        RedisLocks::open("redis://127.0.0.1:1/"),
        Err(Error::Redis(_))
    ));
}

#[test]
fn keep_alive_reports_a_lock_broken_under_it() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    let opts = LockOptions {
        exptime: Duration::from_millis(90),
        ..LockOptions::default()
    };
    let mut lock = Lock::new(&redis, opts).unwrap();
    lock.lock("job").unwrap();
    let (saw_loss, lease) = lock
        .keep_alive(|alive| {
            let breaker = RedisLocks::open(&server.url()).unwrap();
            assert!(breaker.force_unlock("job").unwrap());
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while !alive.is_lost() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            alive.is_lost()
        })
        .unwrap();
    assert!(saw_loss);
    assert!(matches!(lease, Err(Error::Expired)));
    assert!(!lock.is_locked());
}

/// A holder on another connection releases after 300 ms; the waiter's first step is 1 s.
/// (The waiter's handle is opened first: opened after the holder's grant, on a busy
/// machine it could find the key free already.)
fn wait_for_a_release(url: &str, notify: bool) -> Duration {
    let (ready, locked) = std::sync::mpsc::channel();
    let redis = RedisLocks::open(url).unwrap();
    std::thread::scope(|scope| {
        scope.spawn(move || {
            // another "host": its own connection takes the key and releases it after 300 ms
            let holder = RedisLocks::open(url).unwrap();
            let held = holder.lock("k", LockOptions::default()).unwrap();
            ready.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(300));
            held.unlock().unwrap();
        });
        locked.recv().unwrap();
        let opts = LockOptions {
            step: Duration::from_secs(1),
            max_step: Duration::from_secs(1),
            notify,
            ..LockOptions::default()
        };
        let mut waiter = Lock::new(&redis, opts).unwrap();
        let elapsed = waiter.lock("k").unwrap();
        waiter.unlock().unwrap();
        elapsed
    })
}

#[test]
fn a_release_wakes_a_waiter_on_another_connection() {
    let server = RedisServer::start();
    // polling cannot see the release before its first 1 s step ends, and says so exactly
    assert_eq!(
        wait_for_a_release(&server.url(), false),
        Duration::from_secs(1)
    );
    // the release script's PUBLISH wakes the subscribed waiter long before that
    let woken = wait_for_a_release(&server.url(), true);
    assert!(woken < Duration::from_millis(900), "{woken:?}: not woken");
}

#[test]
fn threads_waiting_on_one_handle_are_each_woken_by_their_own_keys_release() {
    const N: usize = 6;
    const GAP: Duration = Duration::from_millis(300);
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    // another "host" holds the N keys
    let holder = RedisLocks::open(&server.url()).unwrap();
    let guards: Vec<_> = (0..N)
        .map(|i| {
            holder
                .lock(format!("k{i}"), LockOptions::default())
                .unwrap()
        })
        .collect();
    // polling alone would see a release only after 2 s
    let opts = LockOptions {
        step: Duration::from_secs(2),
        max_step: Duration::from_secs(2),
        timeout: Duration::from_secs(10),
        ..LockOptions::default()
    };
    let start = std::time::Instant::now();
    std::thread::scope(|s| {
        let waiters: Vec<_> = (0..N)
            .map(|i| {
                let redis = &redis;
                s.spawn(move || {
                    let g = redis.lock(format!("k{i}"), opts).unwrap();
                    let at = start.elapsed();
                    g.unlock().unwrap();
                    at
                })
            })
            .collect();
        let mut released = Vec::new();
        for g in guards {
            std::thread::sleep(GAP);
            released.push(start.elapsed());
            g.unlock().unwrap();
        }
        for (i, w) in waiters.into_iter().enumerate() {
            let at = w.join().unwrap();
            // woken by its own key's release: after it, and before the next one
            assert!(
                at >= released[i] && at < released[i] + GAP - Duration::from_millis(50),
                "waiter {i} got its key at {at:?}, released at {:?}",
                released[i]
            );
        }
    });
}

/// With `with_max_hold`, the last renewals set a lease shorter than exptime (what is left
/// of the longest hold), and a hold that never expires gets that lease: `is_lost` turns
/// true before the key lapses, whichever comes first (it counted a whole exptime from the
/// last renewal, and never for exptime 0, while another client held the key).
#[test]
fn is_lost_counts_the_lease_a_max_hold_leaves() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url())
        .unwrap()
        .with_max_hold(Duration::from_millis(1000));
    let other = RedisLocks::open(&server.url()).unwrap();
    for exptime in [Duration::from_millis(900), Duration::ZERO] {
        let opts = LockOptions {
            exptime,
            ..LockOptions::default()
        };
        let mut guard = redis.lock("capped", opts).unwrap();
        let started = std::time::Instant::now();
        let ((told, taken), _) = guard.keep_alive(|alive| {
            let mut told = None;
            loop {
                if told.is_none() && alive.is_lost() {
                    told = Some(started.elapsed());
                }
                if let Ok(Some(g)) = other.try_lock_with_lease("capped", Duration::from_secs(5)) {
                    let taken = started.elapsed();
                    g.unlock().unwrap();
                    return (told, taken);
                }
                assert!(started.elapsed() < Duration::from_secs(5), "never lapsed");
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        let told = told.unwrap_or_else(|| panic!("{exptime:?}: not told; taken at {taken:?}"));
        assert!(
            told < taken,
            "{exptime:?}: told at {told:?}, taken at {taken:?}"
        );
    }
}

#[test]
fn max_hold_caps_renewals_by_keep_alive() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url())
        .unwrap()
        .with_max_hold(Duration::from_millis(1600));
    // (leases of 600 ms, renewed every 200 ms: a loaded machine may hold the renewer back)
    let opts = LockOptions {
        exptime: Duration::from_millis(600),
        ..LockOptions::default()
    };
    let mut guard = redis.lock("job", opts).unwrap();
    let started = std::time::Instant::now();
    // a "hung" job: it would run for 5 s, but it watches the lease
    let (ran, lease) = guard.keep_alive(|alive| {
        while !alive.is_lost() && started.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        started.elapsed()
    });
    // renewed past its first 600 ms lease; told to stop a little before the cap (the
    // last renewal's lease ends there), or refused at it
    assert!(
        matches!(lease, Ok(()) | Err(Error::MaxHoldReached)),
        "{lease:?}"
    );
    assert!(ran >= Duration::from_millis(1200), "{ran:?}");
    assert!(ran < Duration::from_secs(4), "{ran:?}");
    std::thread::sleep(Duration::from_millis(1600).saturating_sub(started.elapsed()));
    assert!(matches!(guard.expire(None), Err(Error::MaxHoldReached)));
    // the last renewal set the lease to end at the cap: the key is free soon after
    let other = RedisLocks::open(&server.url()).unwrap();
    let wait = LockOptions {
        timeout: Duration::from_secs(2),
        ..LockOptions::default()
    };
    assert!(other.lock("job", wait).is_ok());
    assert!(started.elapsed() < Duration::from_millis(3000));
    drop(guard);
}

/// Work that runs past the longest hold (not watching `is_lost`) ends `keep_alive` with
/// `MaxHoldReached`: with a lease renewed until a renewal is refused at the cap, with one
/// whose work ends after the cap but before that renewal (the lease the cap shortened ran
/// out; the closing look said `Expired`), and without expiry (the cap gives the hold a
/// lease, which ran out; said `Expired` too).
#[test]
fn keep_alive_past_the_longest_hold_says_so_with_or_without_a_lease() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url())
        .unwrap()
        .with_max_hold(Duration::from_millis(1500));
    let other = RedisLocks::open(&server.url()).unwrap();
    // (exptime, work): renewals every third of exptime, the cap at 1.5 s
    let cases = [
        // renewed at 0.2 s, ..., 1.4 s; refused at 1.6 s
        (Duration::from_millis(600), Duration::from_millis(2500)),
        // renewed at 0 s (a lease of 1.5 s) and 1 s (0.5 s); the work ends at 1.8 s, before
        // the renewal at 2 s
        (Duration::from_secs(3), Duration::from_millis(1800)),
        // never expires: the cap's lease of 1.5 s
        (Duration::ZERO, Duration::from_millis(2500)),
    ];
    for (exptime, work) in cases {
        let opts = LockOptions {
            exptime,
            ..LockOptions::default()
        };
        let mut guard = redis.lock("past", opts).unwrap();
        let ((), lease) = guard.keep_alive(|_| std::thread::sleep(work));
        assert!(
            matches!(lease, Err(Error::MaxHoldReached)),
            "{exptime:?}: {lease:?}"
        );
        // the key lapsed at the cap
        assert!(
            other
                .try_lock_with_lease("past", Duration::from_secs(5))
                .unwrap()
                .is_some(),
            "{exptime:?}"
        );
        drop(guard);
    }
}

/// Errors name the server they come from: a refused connection (it said `redis:
/// Connection refused (os error 111)`), and a server that accepts and never answers,
/// which is said not to have answered within the command timeout (it said `Resource
/// temporarily unavailable (os error 11)`); a stopped server the same.
#[test]
fn connection_errors_name_the_server_and_a_silent_one_the_time_limit() {
    let err = RedisLocks::open("redis://:pw@127.0.0.1:1/").unwrap_err();
    assert!(
        matches!(err, Error::Redis(ref e) if e.is_connection_refusal()),
        "{err}"
    );
    let text = err.to_string();
    assert!(text.contains("127.0.0.1:1"), "{text}");
    assert!(!text.contains("pw"), "{text}");

    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = std::thread::spawn(move || {
        let s = listener.accept();
        std::thread::sleep(Duration::from_secs(7));
        drop(s);
    });
    let err = RedisLocks::open(&format!("redis://127.0.0.1:{port}/")).unwrap_err();
    assert!(
        matches!(err, Error::Redis(ref e) if e.is_timeout()),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&format!("127.0.0.1:{port} did not answer within 5s")),
        "{text}"
    );
    accepted.join().unwrap();

    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url())
        .unwrap()
        .with_timeout(Duration::from_millis(300));
    let silent = format!("127.0.0.1:{} did not answer within 300ms", server.port);
    server.pause(true);
    let err = redis.is_locked("k").unwrap_err();
    server.pause(false);
    assert!(err.to_string().contains(&silent), "{err}");

    // The first async call, whose connection is made then, on a server that accepts it and
    // answers nothing (`CLIENT PAUSE`): named as the sync call's (it said "the deadline
    // passed": the clock read after connecting).
    server.cli(&["CLIENT", "PAUSE", "3000"]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let opts = LockOptions {
        timeout: Duration::from_millis(300),
        ..LockOptions::default()
    };
    let err = rt
        .block_on(redis.lock_async("k", opts))
        .map(drop)
        .unwrap_err();
    server.cli(&["CLIENT", "UNPAUSE"]);
    assert!(err.to_string().contains(&silent), "{err}");
}
/// A value of another type than shmlock writes at a lock's Redis keys is a typed error
/// naming the lock and the Redis key (it was a raw WRONGTYPE script error).
#[test]
fn a_foreign_type_at_a_lock_key_is_a_typed_error() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    server.cli(&["LPUSH", "shmlock:{lst}", "x"]);
    let err = redis
        .try_lock_with_lease("lst", Duration::from_secs(5))
        .unwrap_err();
    let Error::WrongType {
        ref key,
        ref redis_key,
        ref found,
        ..
    } = err
    else {
        panic!("{err:?}")
    };
    assert_eq!(key.as_bytes(), b"lst");
    assert_eq!(redis_key.as_bytes(), b"shmlock:{lst}");
    assert_eq!(found, "list");
    let text = err.to_string();
    assert!(
        text.contains("\"lst\"") && text.contains("shmlock:{lst}"),
        "{text}"
    );

    server.cli(&["SET", "shmlock:{shw}:shared", "notahash"]);
    let err = redis
        .try_lock_shared("shw", Duration::from_secs(5))
        .unwrap_err();
    assert!(
        matches!(&err, Error::WrongType { redis_key, found, .. }
            if redis_key.as_bytes() == b"shmlock:{shw}:shared" && found == "string"),
        "{err:?}"
    );
}

/// A string at a lock key that is not a hold's value (something else wrote it, with no
/// expiry) is a typed error for every kind of attempt, waits and async ones included: it
/// read as a hold of an unknown process, and a wait for it lasted until its timeout, or
/// for ever without one. A hold's own value still reads as a holder.
#[test]
fn a_string_at_a_lock_key_that_is_not_a_hold_is_a_typed_error() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    // (the waits' timeouts only end the test if the attempts wait, as they did)
    let wait = LockOptions {
        timeout: Duration::from_secs(30),
        exptime: Duration::ZERO,
        ..LockOptions::default()
    };
    #[cfg(feature = "tokio")]
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for value in ["garbage", "0123456789abcdef0123456789abcdefX 1 2 3 h", ""] {
        server.cli(&["SET", "shmlock:{str}", value]);
        let sem = redis.semaphore("str", 2).unwrap();
        #[allow(unused_mut)]
        let mut errs = vec![
            redis
                .try_lock_with_lease("str", Duration::from_secs(5))
                .err(),
            redis.lock("str", wait).err(),
            redis.try_lock_shared("str", Duration::from_secs(5)).err(),
            redis.lock_shared("str", wait).err(),
            sem.acquire(wait).err(),
        ];
        #[cfg(feature = "tokio")]
        errs.extend([
            rt.block_on(redis.lock_async("str", &wait)).err(),
            rt.block_on(redis.lock_shared_async("str", &wait)).err(),
            rt.block_on(sem.acquire_async(&wait)).err(),
        ]);
        for (i, err) in errs.into_iter().enumerate() {
            let err = err.unwrap_or_else(|| panic!("attempt {i} took a key {value:?} holds"));
            assert!(
                matches!(&err, Error::WrongType { key, redis_key, found, .. }
                    if key.as_bytes() == b"str"
                        && redis_key.as_bytes() == b"shmlock:{str}"
                        && found == "string"),
                "attempt {i} on {value:?}: {err:?}"
            );
            assert!(err.to_string().contains("shmlock did not write"), "{err}");
        }
        assert_eq!(
            server.cli(&["GET", "shmlock:{str}"]).trim(),
            value,
            "replaced"
        );
        let holders = redis.holders().unwrap();
        let h = holders.iter().find(|h| h.key == b"str").unwrap();
        assert_eq!(h.foreign_type.as_deref(), Some("string"), "{h:?}");
    }
    // a hold's value is a holder, as before, named in the timeout
    server.cli(&["DEL", "shmlock:{str}"]);
    let _held = redis
        .try_lock_with_lease("str", Duration::ZERO)
        .unwrap()
        .unwrap();
    let quick = LockOptions {
        timeout: Duration::from_millis(100),
        ..LockOptions::default()
    };
    let err = RedisLocks::open(&server.url())
        .unwrap()
        .lock("str", quick)
        .unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    let holders = redis.holders().unwrap();
    let h = holders.iter().find(|h| h.key == b"str").unwrap();
    assert_eq!(h.foreign_type, None, "{h:?}");
    assert_eq!(h.pid, Some(std::process::id()), "{h:?}");
}

/// A foreign value at a lock's waiting marks (`:writer`, `:readers`) is named too: they
/// were only looked at with `EXISTS`, so a list there kept every reader (or writer) out
/// until its wait gave up, with no holder to name.
#[test]
fn a_foreign_type_at_a_waiting_mark_is_a_typed_error() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    let wait = LockOptions {
        timeout: Duration::from_millis(300),
        ..LockOptions::default()
    };
    let is_list_at = |err: &Error, name: &str| {
        matches!(err, Error::WrongType { redis_key, found, .. }
            if redis_key.as_bytes() == name.as_bytes() && found == "list")
    };
    for (mark, what) in [
        ("writer", "reader"),
        ("writer", "permit"),
        ("readers", "writer"),
    ] {
        let key = format!("{mark}-{what}");
        let name = format!("shmlock:{{{key}}}:{mark}");
        server.cli(&["LPUSH", &name, "x"]);
        let (err_try, err_wait) = match what {
            "reader" => (
                redis.try_lock_shared(&key, Duration::from_secs(5)).err(),
                redis.lock_shared(&key, wait).err(),
            ),
            "permit" => {
                let sem = redis.semaphore(&key, 2).unwrap();
                (
                    sem.try_acquire(Duration::from_secs(5)).err(),
                    sem.acquire(wait).err(),
                )
            }
            _ => (
                redis
                    .try_lock_with_lease(&key, Duration::from_secs(5))
                    .err(),
                redis.lock(&key, wait).err(),
            ),
        };
        for err in [err_try, err_wait] {
            let err = err.unwrap_or_else(|| panic!("a {what} went past a foreign {name}"));
            assert!(is_list_at(&err, &name), "{what} at {name}: {err:?}");
        }
        assert_eq!(
            server.cli(&["TYPE", &name]).trim(),
            "list",
            "{name} was replaced"
        );
    }
}

/// `Duration::MAX` is "as long as it takes", never a panic: as a wait's timeout (it
/// panicked adding it to the clock, on a free key too), as the command timeout (at the
/// first command), as the replicas' timeout (in `with_replicas` itself), and as the
/// fence grace (a raw "out of range" server error).
#[test]
fn duration_max_settings_are_as_long_as_it_takes() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url())
        .unwrap()
        .with_timeout(Duration::MAX)
        .with_replicas(0, Duration::MAX)
        .with_fence_grace(Duration::MAX);
    let forever = LockOptions {
        exptime: Duration::ZERO,
        timeout: Duration::MAX,
        ..LockOptions::default()
    };
    let guard = redis.lock("free", forever).unwrap();
    assert!(guard.try_token().unwrap() > 0);
    drop(guard);
    let sem = redis.semaphore("permits", 1).unwrap();
    drop(redis.lock_shared("free", forever).unwrap());
    drop(sem.acquire(forever).unwrap());
    // held: the waits wait, and end when it is released
    let guard = redis.lock("held", forever).unwrap();
    let permit = sem.acquire(forever).unwrap();
    std::thread::scope(|s| {
        let waiters = [
            s.spawn(|| redis.lock("held", forever).map(drop)),
            s.spawn(|| redis.lock_shared("held", forever).map(drop)),
            s.spawn(|| sem.acquire(forever).map(drop)),
        ];
        std::thread::sleep(Duration::from_millis(200));
        assert!(waiters.iter().all(|w| !w.is_finished()), "a wait ended");
        drop(guard);
        drop(permit);
        for w in waiters {
            w.join().unwrap().unwrap();
        }
    });
}

/// A wait for a key that another handle of the same process holds says the holder is this
/// process itself (a self-deadlock: it ends only if that hold is released); one held by
/// another process is not (`redis_fork.rs`).
#[test]
fn a_wait_for_a_hold_of_this_process_says_so() {
    let server = RedisServer::start();
    let a = RedisLocks::open(&server.url()).unwrap();
    let b = RedisLocks::open(&server.url()).unwrap();
    let _held = a.lock("self", LockOptions::default()).unwrap();
    for timeout in [Duration::ZERO, Duration::from_millis(50)] {
        let opts = LockOptions {
            timeout,
            ..LockOptions::default()
        };
        let err = b.lock("self", opts).unwrap_err();
        let Error::Timeout {
            holder: Some(h), ..
        } = &err
        else {
            panic!("{err:?}");
        };
        assert!(h.this_process, "{err:?}");
        assert_eq!(h.pid, Some(std::process::id()));
        let msg = err.to_string();
        assert!(msg.contains("by this process itself (pid "), "{msg}");
        assert!(!msg.contains("someone else"), "{msg}");
    }
}
