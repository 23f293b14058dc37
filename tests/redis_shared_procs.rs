//! Redis read locks and semaphores across real processes, each using a handle opened
//! before `fork()` (as a prefork server opens it): readers in many processes share a key
//! and a writer waits for the last of them; a killed permit holder's permit comes back
//! when its lease ends, to a waiter that sleeps until then; a writer gets in under a
//! stream of readers from several processes; waits on a stopped server end at their
//! deadline; and chaos, readers, writers and permit holders SIGSTOPped (for less than
//! their lease: the server cannot tell a stopped holder from a working one) and SIGKILLed
//! at random: never a writer beside anyone, never more permits than the count, nothing
//! wedged, nothing left on the server once the leases of the killed have run out.
//!
//! Exercises `src/redis_store/shared.rs` and the scripts of `src/redis_store/scripts.rs`.
//! Its own small harness (`harness = false`), so that `fork` copies a process with no test
//! threads in it; `redis_shared_procs FILTER` runs the tests whose name contains FILTER.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::fork::{fork, xorshift, Child, Gate, Shared};
use common::probe::cont;
use common::redis_server::{eventually, RedisServer};
use shmlock::{Error, HoldMode, LockOptions, RedisLocks};

const HANG: Duration = Duration::from_secs(60);

fn opts(exptime: Duration, timeout: Duration) -> LockOptions {
    LockOptions {
        exptime,
        timeout,
        ..LockOptions::default()
    }
}

/// 6 reader processes hold one key at once; a writer process waits for the last, and no
/// new reader gets in once it waits.
fn readers_share() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    let mut held = Gate::new();
    let mut done = Gate::new();
    let readers: Vec<Child> = (0..6)
        .map(|_| {
            let (redis, held, done) = (&redis, &mut held, &mut done);
            fork(move || {
                let r = redis.lock_shared("K", opts(HANG, HANG)).unwrap();
                held.signal();
                done.wait();
                r.unlock().unwrap();
                0
            })
        })
        .collect();
    held.await_signals(6);
    let mut pids: Vec<u32> = redis
        .holders()
        .unwrap()
        .iter()
        .filter(|h| h.mode == HoldMode::Shared)
        .filter_map(|h| h.pid)
        .collect();
    pids.sort_unstable();
    let mut want: Vec<u32> = readers.iter().map(|c| c.0 as u32).collect();
    want.sort_unstable();
    assert_eq!(pids, want, "holders lists every reader with its pid");
    let shared = Shared::new(1);
    let writer = {
        let (redis, shared, done) = (&redis, &shared, &mut done);
        fork(move || {
            done.open();
            let w = redis.lock("K", opts(HANG, HANG)).unwrap();
            shared.word(0).store(1, Ordering::SeqCst);
            w.unlock().unwrap();
            0
        })
    };
    eventually("the writer's mark", HANG, || {
        server.cli(&["EXISTS", "shmlock:{K}:writer"]).trim() == "1"
    });
    assert!(redis.try_lock_shared("K", HANG).unwrap().is_none());
    assert_eq!(
        shared.word(0).load(Ordering::SeqCst),
        0,
        "a writer beside readers"
    );
    done.open();
    for r in &readers {
        assert_eq!(r.wait(HANG), 0);
    }
    assert_eq!(writer.wait(HANG), 0);
    assert_eq!(shared.word(0).load(Ordering::SeqCst), 1);
    assert!(!redis.is_locked("K").unwrap());
}

/// A permit holder killed mid-hold: its permit comes back when its lease ends (not
/// before: the server cannot see it die), and a waiter sleeping on the semaphore with a
/// step far longer than that gets it then (it sleeps until the lease's end at most).
fn killed_permit_holder() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    let lease = Duration::from_millis(1500);
    let mut held = Gate::new();
    let holder = {
        let (redis, held) = (&redis, &mut held);
        fork(move || {
            let sem = redis.semaphore("S", 1).unwrap();
            let g = sem.acquire(opts(lease, HANG)).unwrap();
            held.signal();
            std::mem::forget(g);
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    };
    held.await_signals(1);
    holder.kill();
    let killed = Instant::now();
    let sem = redis.semaphore("S", 1).unwrap();
    assert!(
        sem.try_acquire(HANG).unwrap().is_none(),
        "the lease still runs"
    );
    let got = sem
        .acquire(LockOptions {
            timeout: HANG,
            step: Duration::from_secs(10),
            max_step: Duration::from_secs(10),
            ..LockOptions::default()
        })
        .unwrap();
    let after = killed.elapsed();
    note!("[permit back {after:?} after the kill, lease {lease:?}] ");
    assert!(
        after < Duration::from_secs(8),
        "the waiter slept out its step: {after:?}"
    );
    assert_eq!(sem.held().unwrap(), 1);
    drop(got);
    assert_eq!(sem.held().unwrap(), 0);
}

/// 4 reader processes each take the key again and again, their holds overlapping so
/// that the key is never free of readers; a writer process still gets in.
fn writer_under_readers() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    let s = Shared::new(2);
    let readers: Vec<Child> = (0..4)
        .map(|i| {
            let (redis, s) = (&redis, &s);
            fork(move || {
                std::thread::sleep(Duration::from_millis(15 * i));
                while s.word(0).load(Ordering::SeqCst) == 0 {
                    match redis.lock_shared("K", opts(HANG, Duration::from_millis(200))) {
                        Ok(g) => {
                            std::thread::sleep(Duration::from_millis(60));
                            drop(g);
                        }
                        Err(Error::Timeout { .. }) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
                0
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let writer = {
        let (redis, s) = (&redis, &s);
        fork(move || {
            let t = Instant::now();
            let w = redis
                .lock("K", opts(HANG, Duration::from_secs(20)))
                .unwrap();
            s.word(1)
                .store(t.elapsed().as_millis() as u64 + 1, Ordering::SeqCst);
            w.unlock().unwrap();
            0
        })
    };
    let code = writer.wait(HANG);
    s.word(0).store(1, Ordering::SeqCst);
    for r in &readers {
        assert_eq!(r.wait(HANG), 0);
    }
    assert_eq!(code, 0, "the writer starved");
    note!(
        "[writer in after {} ms] ",
        s.word(1).load(Ordering::SeqCst) - 1
    );
}

/// 2 writer processes retake the key at once after each release; a reader process still
/// gets in, time after time (readers race writers at each release).
fn reader_under_writers() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    let s = Shared::new(1);
    let writers: Vec<Child> = (0..2)
        .map(|_| {
            let (redis, s) = (&redis, &s);
            fork(move || {
                while s.word(0).load(Ordering::SeqCst) == 0 {
                    if let Ok(g) = redis.lock("K", opts(HANG, Duration::from_millis(500))) {
                        std::thread::sleep(Duration::from_millis(20));
                        drop(g);
                    }
                }
                0
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let reader = {
        let redis = &redis;
        fork(move || {
            for _ in 0..10 {
                match redis.lock_shared("K", opts(HANG, Duration::from_secs(20))) {
                    Ok(g) => drop(g),
                    Err(e) => panic!("a reader starved: {e}"),
                }
            }
            0
        })
    };
    let t = Instant::now();
    let code = reader.wait(HANG);
    s.word(0).store(1, Ordering::SeqCst);
    for w in &writers {
        assert_eq!(w.wait(HANG), 0);
    }
    assert_eq!(code, 0, "the reader starved");
    note!("[10 reads in {:?}] ", t.elapsed());
}

/// A server stopped (SIGSTOP) while a reader, a writer and a permit waiter wait: each
/// returns by the end of its wait, none granted anything the server did not grant.
fn stopped_server() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url())
        .unwrap()
        .with_timeout(Duration::from_secs(1));
    let w = redis.lock("K", opts(HANG, HANG)).unwrap();
    let sem = redis.semaphore("S", 1).unwrap();
    let p = sem.acquire(opts(HANG, HANG)).unwrap();
    let s = Shared::new(3);
    let waiters: Vec<Child> = (0..3)
        .map(|i| {
            let (redis, s) = (&redis, &s);
            fork(move || {
                let t = Instant::now();
                let o = opts(HANG, Duration::from_millis(1500));
                let r = match i {
                    0 => redis.lock_shared("K", o).map(drop),
                    1 => redis.lock("K", o).map(drop),
                    _ => redis.semaphore("S", 1).unwrap().acquire(o).map(drop),
                };
                assert!(r.is_err(), "granted while held: {r:?}");
                s.word(i)
                    .store(t.elapsed().as_millis() as u64 + 1, Ordering::SeqCst);
                0
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    server.pause(true);
    let paused = Instant::now();
    for c in &waiters {
        assert_eq!(c.wait(HANG), 0);
    }
    let stalled = paused.elapsed();
    server.pause(false);
    let took: Vec<u64> = (0..3)
        .map(|i| s.word(i).load(Ordering::SeqCst) - 1)
        .collect();
    note!("[waits of 1.5 s took {took:?} ms] ");
    assert!(
        took.iter().all(|&t| t < 3_000),
        "a wait stretched with the stall: {took:?} ({stalled:?})"
    );
    drop((w, p));
}

const READER: u64 = 1;
const WRITER: u64 = 2;
const PERMIT: u64 = 3;
const OUT: u64 = 0;
const PERMITS: u32 = 2;
/// Words: 0 stop, 1 violations (and errors, a wait cut by the worker's own stop that
/// blamed the server among them), 2 timeouts, OPS+kind done, STATE+i what worker i holds,
/// DOOMED+i worker i was killed.
const OPS: usize = 4;
const STATE: usize = 8;
const SLOTS: usize = 24;
const DOOMED: usize = STATE + SLOTS;

/// The three kinds of hold in one variable.
#[allow(dead_code)]
enum Guard<'a, 'r> {
    Read(shmlock::LockGuard<'a, shmlock::RedisShared>),
    Write(shmlock::LockGuard<'a, RedisLocks>),
    Permit(shmlock::LockGuard<'a, shmlock::RedisSemaphore<'r>>),
}

fn chaos_worker(redis: &RedisLocks, w: &Shared, me: usize, lease: Duration) -> i32 {
    let sem = redis.semaphore("S", PERMITS).unwrap();
    let mut x = 0x9e37_79b9 ^ (me as u64 * 0x1_0000_0001);
    let in_use = |i: usize| i != me && w.word(DOOMED + i).load(Ordering::SeqCst) == 0;
    while w.word(0).load(Ordering::SeqCst) == 0 {
        let r = xorshift(&mut x);
        let kind = match r % 10 {
            0..=4 => READER,
            5..=6 => WRITER,
            _ => PERMIT,
        };
        let o = opts(lease, Duration::from_secs(4));
        let guard = match kind {
            READER => redis.lock_shared("K", o).map(Guard::Read),
            WRITER => redis.lock("K", o).map(Guard::Write),
            _ => sem.acquire(o).map(Guard::Permit),
        };
        let guard = match guard {
            Ok(g) => g,
            Err(Error::Timeout { .. }) => {
                w.word(2).fetch_add(1, Ordering::SeqCst);
                continue;
            }
            Err(e) => {
                // (counted: a worker killed later loses its exit code)
                w.word(1).fetch_add(1, Ordering::SeqCst);
                eprintln!("worker {me}: {e}");
                return 1;
            }
        };
        w.word(STATE + me).store(kind, Ordering::SeqCst);
        let mut permits = 1;
        for i in 0..SLOTS {
            let other = w.word(STATE + i).load(Ordering::SeqCst);
            if other == OUT || !in_use(i) {
                continue;
            }
            let clash = match kind {
                READER => other == WRITER,
                WRITER => other == READER || other == WRITER,
                _ => {
                    permits += u32::from(other == PERMIT);
                    false
                }
            };
            if clash || permits > PERMITS {
                w.word(1).fetch_add(1, Ordering::SeqCst);
                eprintln!("worker {me} ({kind}) beside worker {i} ({other})");
            }
        }
        if r.is_multiple_of(3) {
            std::thread::sleep(Duration::from_micros(r >> 52));
        }
        w.word(STATE + me).store(OUT, Ordering::SeqCst);
        match guard {
            Guard::Read(g) => g.unlock(),
            Guard::Write(g) => g.unlock(),
            Guard::Permit(g) => g.unlock(),
        }
        .unwrap_or_else(|e| panic!("worker {me}: a release found its hold lost: {e}"));
        w.word(OPS + kind as usize).fetch_add(1, Ordering::SeqCst);
    }
    0
}

fn chaos() {
    let secs: u64 = std::env::var("SHMLOCK_CHAOS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    // stops are far shorter than the lease, and a worker is not stopped again for a
    // second: no lease runs out under a holder that the test still counts
    let lease = Duration::from_secs(3);
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    let w = Shared::new(DOOMED + SLOTS);
    let n = 6;
    let mut next = 0;
    let spawn = |me: usize| {
        let (redis, w) = (&redis, &w);
        fork(move || chaos_worker(redis, w, me, lease))
    };
    let mut workers: Vec<(usize, Child)> = (0..n)
        .map(|_| {
            next += 1;
            (next - 1, spawn(next - 1))
        })
        .collect();
    let mut stopped: Vec<Option<Instant>> = vec![None; n];
    let mut rested: Vec<Instant> = vec![Instant::now(); n];
    let (mut kills, mut stops) = (0, 0);
    let mut x = 0x5eed_u64;
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        std::thread::sleep(Duration::from_micros(20_000 + xorshift(&mut x) % 60_000));
        for (i, s) in stopped.iter_mut().enumerate() {
            if s.is_some_and(|until| Instant::now() >= until) {
                cont(workers[i].1 .0);
                *s = None;
                rested[i] = Instant::now() + Duration::from_secs(1);
            }
        }
        let v = (xorshift(&mut x) % n as u64) as usize;
        if stopped[v].is_some() || Instant::now() < rested[v] {
            continue;
        }
        if xorshift(&mut x).is_multiple_of(6) && next < SLOTS {
            w.word(DOOMED + workers[v].0).store(1, Ordering::SeqCst);
            workers[v].1.kill();
            kills += 1;
            next += 1;
            workers[v] = (next - 1, spawn(next - 1));
        } else {
            common::signal::send(workers[v].1 .0, libc::SIGSTOP);
            stops += 1;
            let pause = 50 + xorshift(&mut x) % 400;
            stopped[v] = Some(Instant::now() + Duration::from_millis(pause));
        }
    }
    for (i, s) in stopped.iter().enumerate() {
        if s.is_some() {
            cont(workers[i].1 .0);
        }
    }
    w.word(0).store(1, Ordering::SeqCst);
    for (_, c) in &workers {
        assert_eq!(c.wait(HANG), 0, "a worker failed");
    }
    let ops: Vec<u64> = (1..=3)
        .map(|k| w.word(OPS + k).load(Ordering::SeqCst))
        .collect();
    let violations = w.word(1).load(Ordering::SeqCst);
    note!(
        "[{secs} s: {} reads, {} writes, {} permits, {} timeouts, \
         {kills} kills, {stops} stops, {violations} violations] ",
        ops[0],
        ops[1],
        ops[2],
        w.word(2).load(Ordering::SeqCst),
    );
    assert_eq!(violations, 0);
    assert!(
        ops.iter().all(|&o| o > 0),
        "a kind never got through: {ops:?}"
    );
    // nothing left once the killed workers' leases (and a writer's mark) have run out
    let left = || {
        let keys = server.cli(&["KEYS", "shmlock:*"]);
        keys.lines()
            .filter(|k| !k.is_empty() && !k.contains(":released:") && !k.contains(":cancel:"))
            .filter(|k| !k.ends_with(":fence"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let t = Instant::now();
    while !left().is_empty() && t.elapsed() < lease + Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(left().is_empty(), "left on the server: {:?}", left());
    assert!(redis.holders().unwrap().is_empty());
    let sem = redis.semaphore("S", PERMITS).unwrap();
    let a = sem.try_acquire(HANG).unwrap().expect("a permit");
    let b = sem.try_acquire(HANG).unwrap().expect("both permits");
    drop((a, b));
    assert!(redis.try_lock_with_lease("K", HANG).unwrap().is_some());
}

/// A first hold and release: the handle's connection and scripts are ready.
fn warm(redis: &RedisLocks) {
    redis
        .lock("warm", opts(HANG, HANG))
        .unwrap()
        .unlock()
        .unwrap();
}

/// Stops `child` (SIGSTOP) for `d`, then continues it.
fn stop_and_continue(child: &Child, d: Duration) {
    common::signal::send(child.0, libc::SIGSTOP);
    std::thread::sleep(d);
    cont(child.0);
}

/// A process stopped and continued (SIGSTOP, SIGCONT: Ctrl-Z and `fg`) while it waits for
/// a reply: the read fails with EINTR (signal(7): a socket with a timeout), which says
/// nothing about the server. A reader, a writer and a permit holder trying a free key, each
/// stopped in the middle of its request (the server is paused meanwhile, so that every
/// request is), get their hold once the server answers: never `Interrupted system call`,
/// also after a stop longer than the command timeout (that limit is the server's).
/// It was that error, and a wait whose last attempt met it ended with it in place of the
/// timeout (the chaos test below, 1 run in about 30 under load).
fn interrupted_requests() {
    let server = RedisServer::start();
    // a stop shorter than the command timeout, then one 3x longer
    for (timeout, stop) in [(5_000, 100), (300, 1_000)] {
        interrupted_requests_with(&server, timeout, stop);
    }
}

fn interrupted_requests_with(server: &RedisServer, timeout_ms: u64, stop_ms: u64) {
    let redis = RedisLocks::open(&server.url())
        .unwrap()
        .with_timeout(Duration::from_millis(timeout_ms));
    warm(&redis);
    // per kind: its outcome (1 granted, 2 an error, its text printed, 3 refused), and 1 to
    // let it begin
    let s = Shared::new(6);
    for kind in 0..3 {
        let child = {
            let (redis, s) = (&redis, &s);
            fork(move || {
                while s.word(3 + kind).load(Ordering::SeqCst) == 0 {
                    std::thread::sleep(Duration::from_millis(1));
                }
                let key = format!("k{kind}-{timeout_ms}");
                // tries: a wait would try again after the error anyway (and end with it)
                let r = match kind {
                    0 => redis
                        .try_lock_shared(&key, HANG)
                        .map(|g| g.map(|g| g.unlock())),
                    1 => redis
                        .try_lock_with_lease(&key, HANG)
                        .map(|g| g.map(|g| g.unlock())),
                    _ => redis
                        .semaphore(&key, 2)
                        .unwrap()
                        .try_acquire(HANG)
                        .map(|g| g.map(|g| g.unlock())),
                };
                let outcome = match r {
                    Ok(Some(Ok(()))) => 1,
                    Ok(None) => 3,
                    Ok(Some(Err(e))) | Err(e) => {
                        eprintln!("kind {kind}: {e}");
                        2
                    }
                };
                s.word(kind).store(outcome, Ordering::SeqCst);
                0
            })
        };
        server.pause(true);
        s.word(3 + kind).store(1, Ordering::SeqCst);
        // the child's request is sent by now, and its reply will not come: it reads
        std::thread::sleep(Duration::from_millis(timeout_ms.min(300) / 2));
        stop_and_continue(&child, Duration::from_millis(stop_ms));
        std::thread::sleep(Duration::from_millis(100));
        server.pause(false);
        assert_eq!(child.wait(HANG), 0);
    }
    let outcomes: Vec<u64> = (0..3).map(|k| s.word(k).load(Ordering::SeqCst)).collect();
    note!("[timeout {timeout_ms} ms, stop {stop_ms} ms: reader, writer, permit {outcomes:?}] ");
    assert_eq!(
        outcomes,
        [1, 1, 1],
        "a stop and continue mid-request ended a wait"
    );
    // the cut requests were undone before the tries that followed them: nothing is held
    assert!(redis.holders().unwrap().is_empty(), "{:?}", redis.holders());
}

/// An async wait whose process is stopped mid-request, past the attempt's time limit and
/// its own deadline, while the server (paused) answers only during the stop: at the
/// continue the reply is in and the timer is due at once. The wait ends with its hold or
/// `Timeout`, never with an error that blames the server (which answered within the
/// limit of the time this process ran): a reader, a writer and a permit waiter, each on a
/// runtime of its own. The timer used to win (the reply not yet read by the connection's
/// task), and a retry past the limit met no time left: `Error::Redis` ("did not answer
/// within 100ms"), in 81 of 436 stops of a chaos run of short waits.
#[cfg(feature = "tokio")]
fn stopped_async_waits() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    warm(&redis);
    // per kind: its outcome (1 granted, 2 timed out, 3 another error, its text printed),
    // and 1 to let it begin
    let s = Shared::new(6);
    for kind in 0..3 {
        let child = {
            let (redis, s) = (&redis, &s);
            fork(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let key = format!("a{kind}");
                let sem = redis.semaphore(&key, 2).unwrap();
                rt.block_on(async {
                    // the runtime's connection, made before the server pauses
                    redis
                        .lock_async("warm", opts(HANG, HANG))
                        .await
                        .unwrap()
                        .unlock()
                        .unwrap();
                    while s.word(3 + kind).load(Ordering::SeqCst) == 0 {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    let o = opts(HANG, Duration::from_millis(20));
                    let r = match kind {
                        0 => redis.lock_shared_async(&key, o).await.map(|g| g.unlock()),
                        1 => redis.lock_async(&key, o).await.map(|g| g.unlock()),
                        _ => sem.acquire_async(o).await.map(|g| g.unlock()),
                    };
                    let outcome = match r {
                        Ok(Ok(())) => 1,
                        Err(Error::Timeout { .. }) => 2,
                        Ok(Err(e)) | Err(e) => {
                            eprintln!("kind {kind}: {e}");
                            3
                        }
                    };
                    s.word(kind).store(outcome, Ordering::SeqCst);
                });
                0
            })
        };
        std::thread::sleep(Duration::from_millis(100)); // (its warm-up)
        server.pause(true);
        s.word(3 + kind).store(1, Ordering::SeqCst);
        // the request is out by now (the attempt's limit: 100 ms from it)
        std::thread::sleep(Duration::from_millis(40));
        common::signal::send(child.0, libc::SIGSTOP);
        std::thread::sleep(Duration::from_millis(160));
        server.pause(false);
        // the reply is in the stopped child's socket
        std::thread::sleep(Duration::from_millis(100));
        cont(child.0);
        assert_eq!(child.wait(HANG), 0);
    }
    let outcomes: Vec<u64> = (0..3).map(|k| s.word(k).load(Ordering::SeqCst)).collect();
    note!("[reader, writer, permit: {outcomes:?}] ");
    assert!(
        outcomes.iter().all(|&o| o == 1 || o == 2),
        "a stop ended an async wait with an error: {outcomes:?}"
    );
    // what a late grant took was given back
    let t = Instant::now();
    while !redis.holders().unwrap().is_empty() && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(redis.holders().unwrap().is_empty(), "{:?}", redis.holders());
}

/// The same for a holder's own calls, each stopped and continued mid-request while the
/// server is paused: its token, a renewal, a check and its release all answer once the
/// server does (the token the same as before), none with `Interrupted system call`, also
/// after a stop longer than the command timeout.
fn interrupted_holder_calls() {
    let server = RedisServer::start();
    // a stop shorter than the command timeout, then one 3x longer (and shorter than a
    // release's mark, two timeouts and a second: see docs/redis.md)
    for (timeout, stop) in [(5_000, 100), (300, 1_000)] {
        interrupted_holder_calls_with(&server, timeout, stop);
    }
}

const CALLS: usize = 4;

fn interrupted_holder_calls_with(server: &RedisServer, timeout_ms: u64, stop_ms: u64) {
    let redis = RedisLocks::open(&server.url())
        .unwrap()
        .with_timeout(Duration::from_millis(timeout_ms));
    // per call: its outcome (1 as expected, 2 an error, its text printed), 1 to let it begin
    let s = Shared::new(2 * CALLS);
    for call in 0..CALLS {
        let child = {
            let (redis, s) = (&redis, &s);
            fork(move || {
                let mut g = redis
                    .lock(format!("h{call}-{timeout_ms}"), opts(HANG, HANG))
                    .unwrap();
                let token = g.try_token().unwrap();
                s.word(CALLS + call).store(1, Ordering::SeqCst); // held: pause the server
                while s.word(CALLS + call).load(Ordering::SeqCst) != 2 {
                    std::thread::sleep(Duration::from_millis(1));
                }
                let r = match call {
                    0 => g.try_token().map(|t| assert_eq!(t, token, "another token")),
                    1 => g.expire(None),
                    2 => g.check(),
                    _ => g.unlock(),
                };
                let outcome = match r {
                    Ok(()) => 1,
                    Err(e) => {
                        eprintln!("call {call}: {e}");
                        2
                    }
                };
                s.word(call).store(outcome, Ordering::SeqCst);
                0
            })
        };
        while s.word(CALLS + call).load(Ordering::SeqCst) != 1 {
            std::thread::sleep(Duration::from_millis(1));
        }
        server.pause(true);
        s.word(CALLS + call).store(2, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(timeout_ms.min(300) / 2));
        stop_and_continue(&child, Duration::from_millis(stop_ms));
        std::thread::sleep(Duration::from_millis(100));
        server.pause(false);
        assert_eq!(child.wait(HANG), 0);
    }
    let outcomes: Vec<u64> = (0..CALLS)
        .map(|k| s.word(k).load(Ordering::SeqCst))
        .collect();
    note!(
        "[timeout {timeout_ms} ms, stop {stop_ms} ms: token, expire, check, unlock {outcomes:?}] "
    );
    assert_eq!(
        outcomes, [1; CALLS],
        "a stop and continue mid-request failed a call"
    );
}

fn main() {
    common::harness::main(
        "redis_shared_procs",
        &[
            (
                "readers_in_many_processes_share_and_a_writer_waits_for_the_last",
                readers_share,
            ),
            (
                "a_killed_permit_holders_permit_comes_back_when_its_lease_ends",
                killed_permit_holder,
            ),
            (
                "a_writer_gets_in_under_a_stream_of_readers_from_many_processes",
                writer_under_readers,
            ),
            (
                "a_reader_gets_in_under_a_stream_of_writers_from_many_processes",
                reader_under_writers,
            ),
            (
                "a_request_interrupted_by_a_stop_and_continue_is_not_an_error",
                interrupted_requests,
            ),
            (
                "a_holders_call_interrupted_by_a_stop_and_continue_is_not_an_error",
                interrupted_holder_calls,
            ),
            #[cfg(feature = "tokio")]
            (
                "an_async_wait_stopped_past_its_limit_ends_in_its_hold_or_timeout",
                stopped_async_waits,
            ),
            (
                "waits_on_a_stopped_server_end_at_their_deadline",
                stopped_server,
            ),
            (
                "chaos_readers_writers_and_permits_with_stop_and_kill",
                chaos,
            ),
        ],
        |_| 2,
    )
}
