//! The Redis backend under real faults, in the manner of a Jepsen test: real servers and
//! sentinels started here, a master stopped (SIGSTOP) long enough to be failed over, a
//! server stalled under a waiting client, a proxy that cuts a connection after the request
//! reached the server, an empty restart, and a keyspace left alone after the leases.
//! Each test records what the clients were told and judges it against the promises: never
//! two holders told `Ok` at once, tokens that never repeat or go back, outcomes that say
//! what happened, waits that end on time, nothing left behind.
//!
//! Guards `src/redis_store/` (`sentinel.rs`, `conn.rs`, `ops.rs`, `scripts.rs`,
//! `server_clock.rs`, `janitor.rs`); forks of a handle are in `tests/redis_fork.rs`.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::proxy::Proxy;
use common::redis_server::{
    await_failover, eventually, free_port, ClusterSetup, RedisServer, SentinelSetup, MASTER_NAME,
};
use shmlock::{Error, Lock, LockOptions, RedisLocks};

fn opts(exptime: Duration, timeout: Duration) -> LockOptions {
    LockOptions {
        exptime,
        timeout,
        ..LockOptions::default()
    }
}

/// What one client was told about one hold: when it was granted, the last time a renewal
/// said `Ok`, and its fencing token.
#[derive(Clone, Debug)]
struct Held {
    who: &'static str,
    granted: Instant,
    last_ok: Instant,
    token: u64,
}

/// Holds the key `lock` holds for `hold`, renewing a lease of `lease` every third of it,
/// and records what it was told until the first renewal that failed.
fn hold_and_renew(
    who: &'static str,
    lock: &mut Lock<'_, RedisLocks>,
    hold: Duration,
    lease: Duration,
    history: &Mutex<Vec<Held>>,
) {
    let granted = Instant::now();
    let token = lock.try_token().unwrap();
    let mut last_ok = granted;
    while granted.elapsed() < hold {
        std::thread::sleep(lease / 3);
        match lock.expire(Some(lease)) {
            Ok(()) => last_ok = Instant::now(),
            Err(_) => break,
        }
    }
    let _ = lock.unlock();
    history.lock().unwrap().push(Held {
        who,
        granted,
        last_ok,
        token,
    });
}

/// The promises over a history: no two holds told `Ok` at overlapping times, and tokens
/// growing with the grants.
fn judge(history: &[Held]) {
    let mut h = history.to_vec();
    h.sort_by_key(|x| x.granted);
    for pair in h.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        assert!(
            a.last_ok < b.granted,
            "{} was told it held the key until {:?} after {} was granted it: {h:#?}",
            a.who,
            a.last_ok - b.granted.min(a.last_ok),
            b.who
        );
        assert!(b.token > a.token, "tokens went back or repeated: {h:#?}");
    }
}

/// A master stopped long enough to be failed over, with a client's `lock` pending on it:
/// when it resumes (still believing it is the master) it runs that request and grants the
/// key, while a client of the promoted master already holds it. The pending client must
/// not take that grant for a hold: it waits, and gets the key from the new master once
/// the other client is done. Never two holders told `Ok` at once; tokens in grant order.
#[test]
fn a_paused_master_never_grants_a_key_that_its_successor_grants() {
    let setup = SentinelSetup::start();
    let urls = setup.sentinel_urls();
    let a = RedisLocks::open_sentinel(MASTER_NAME, &urls).unwrap();
    // pooled connections to the master, as a busy client has
    for _ in 0..4 {
        a.lock("warm", LockOptions::default())
            .unwrap()
            .unlock()
            .unwrap();
    }
    let history = Mutex::new(Vec::new());
    let lease = Duration::from_millis(1500);
    let old = setup.master.port;
    setup.master.pause(true);
    let paused = Instant::now();
    std::thread::scope(|s| {
        let pending = s.spawn(|| {
            // a wait of 60 s, longer than a failover may take on a busy machine (resty caps
            // the wait at exptime), then leases of 1.5 s
            let wait = Duration::from_secs(60);
            let mut lock = Lock::new(&a, opts(wait, wait)).unwrap();
            lock.lock("k").unwrap();
            hold_and_renew(
                "the paused master's client",
                &mut lock,
                lease * 2,
                lease,
                &history,
            );
        });
        let new = await_failover(&setup.sentinels, old);
        assert_ne!(new, old);
        let b = RedisLocks::open_sentinel(MASTER_NAME, &urls).unwrap();
        let wait = Duration::from_secs(10);
        let mut lock = Lock::new(&b, opts(wait, wait)).unwrap();
        lock.lock("k").unwrap();
        // the old master resumes while the new one's client holds the key
        std::thread::sleep(Duration::from_secs(4).saturating_sub(paused.elapsed()));
        setup.master.pause(false);
        hold_and_renew(
            "the new master's client",
            &mut lock,
            lease * 2,
            lease,
            &history,
        );
        pending.join().unwrap();
    });
    let history = history.into_inner().unwrap();
    assert_eq!(history.len(), 2, "{history:#?}");
    judge(&history);
}

/// After a failover with replicas required, a handle that had connections to the old
/// master takes keys from the promoted one at once, instead of hearing the old master
/// (resumed, and for a while still calling itself master) refuse for want of replicas.
/// (The old master has none left: however long it waits, it refuses. The promoted one's
/// replica may still be syncing from it: 3 s, not 300 ms, for its acknowledgement.)
#[test]
fn a_handle_follows_the_promoted_master_at_once() {
    let setup = SentinelSetup::start();
    let urls = setup.sentinel_urls();
    let redis = RedisLocks::open_sentinel(MASTER_NAME, &urls)
        .unwrap()
        .with_replicas(1, Duration::from_secs(3));
    for _ in 0..4 {
        redis
            .lock("warm", LockOptions::default())
            .unwrap()
            .unlock()
            .unwrap();
    }
    let old = setup.master.port;
    setup.master.pause(true);
    await_failover(&setup.sentinels, old);
    setup.master.pause(false);
    // the old master answers again, and still says it is the master
    eventually("the old master answers", Duration::from_secs(5), || {
        setup.master.cli(&["PING"]).trim() == "PONG"
    });
    let taken = redis.try_lock_with_lease("after", Duration::from_secs(10));
    assert!(
        matches!(taken, Ok(Some(_))),
        "the first attempt after the failover: {taken:?}"
    );
}

/// While the master is stopped (and before the sentinels fail it over), a `lock` with a
/// 500 ms timeout returns about then, not when the master resumes; another thread of the
/// same handle is not held up by the first one's master lookup either.
#[test]
fn a_stopped_master_stalls_no_wait_past_its_deadline() {
    let setup = SentinelSetup::start();
    let urls = setup.sentinel_urls();
    // a handle with no connection yet: its first command must look the master up
    let redis = RedisLocks::open_sentinel(MASTER_NAME, &urls)
        .unwrap()
        .with_timeout(Duration::from_secs(1));
    const PAUSE: Duration = Duration::from_secs(8);
    setup.master.pause(true);
    let paused = Instant::now();
    let took = std::thread::scope(|s| {
        let other = s.spawn(|| {
            let t = Instant::now();
            let _ = redis.is_locked("y");
            t.elapsed()
        });
        let t = Instant::now();
        let got = redis.lock(
            "x",
            opts(Duration::from_secs(30), Duration::from_millis(500)),
        );
        let took = t.elapsed();
        assert!(got.is_err(), "granted by a stopped master: {got:?}");
        (took, other.join().unwrap())
    });
    assert!(
        paused.elapsed() < PAUSE,
        "the master was stopped for less than the calls took"
    );
    std::thread::sleep(PAUSE.saturating_sub(paused.elapsed()));
    setup.master.pause(false);
    // far below the pause: bounded by the 500 ms wait (and the 1 s command timeout)
    assert!(took.0 < PAUSE / 2, "lock returned after {:?}", took.0);
    assert!(took.1 < PAUSE / 2, "is_locked returned after {:?}", took.1);
}

/// A partial partition: the old master and one sentinel are cut off from the rest, and
/// the rest fail the master over. When both come back, that sentinel still names the old
/// master (its links to the other sentinels are held by a proxy, and its links to the data
/// nodes were closed, so no news of the failover reaches it), and the old master still
/// says it is master. A client that lists that sentinel first, and whose other sentinels
/// told it of the failover, needs a new connection: it must go to the promoted master,
/// where it waits while the other client holds the key, instead of being granted the key
/// by the old master. Never two holders told `Ok` at once; tokens in grant order.
#[test]
fn a_sentinel_cut_off_from_a_failover_never_sends_a_client_to_the_old_master() {
    let stale_port = free_port();
    // the stale sentinel's network link, as the other sentinels reach it
    let link = Proxy::start(stale_port);
    let setup = SentinelSetup::start_announcing(Some((stale_port, link.port)));
    let s = &setup.sentinels;
    let a = RedisLocks::open_sentinel(MASTER_NAME, &[s[2].url(), s[0].url(), s[1].url()]).unwrap();
    let b = RedisLocks::open_sentinel(MASTER_NAME, &[s[0].url(), s[1].url()]).unwrap();
    for redis in [&a, &b] {
        redis
            .lock("warm", LockOptions::default())
            .unwrap()
            .unlock()
            .unwrap();
    }
    let stale_id = s[2].cli(&["SENTINEL", "MYID"]).trim().to_string();
    let old = setup.master.port;
    // the partition: the sentinel and the old master stopped, the sentinel's links held
    // or closed
    link.blackhole(true);
    s[2].pause(true);
    for server in std::iter::once(&setup.master).chain(&setup.replicas) {
        server.kill_clients_named(&format!("sentinel-{}", &stale_id[..8]));
    }
    setup.master.pause(true);
    let new = await_failover(&s[..2], old);
    let history = Mutex::new(Vec::new());
    let lease = Duration::from_millis(1500);
    let wait = Duration::from_secs(10);
    let mut lock_b = Lock::new(&b, opts(wait, wait)).unwrap();
    lock_b.lock("k").unwrap();
    // both come back, still cut off from the others
    setup.master.pause(false);
    s[2].pause(false);
    // the fault is in place: the cut-off sentinel names the old master, which says it is
    // the master
    let named = s[2].cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME]);
    let role = setup.master.cli(&["ROLE"]);
    assert_eq!(
        named.lines().nth(1),
        Some(old.to_string().as_str()),
        "{named}"
    );
    assert_eq!(role.lines().next(), Some("master"), "{role}");
    note!("[failover {old} -> {new}] ");
    std::thread::scope(|scope| {
        let waiter = scope.spawn(|| {
            let mut lock_a = Lock::new(&a, opts(wait, wait)).unwrap();
            lock_a.lock("k").unwrap();
            hold_and_renew(
                "the client that lists the cut-off sentinel first",
                &mut lock_a,
                lease,
                lease,
                &history,
            );
        });
        hold_and_renew("the other client", &mut lock_b, lease * 2, lease, &history);
        waiter.join().unwrap();
    });
    let history = history.into_inner().unwrap();
    assert_eq!(history.len(), 2, "{history:#?}");
    judge(&history);
}

/// The first of three sentinels hangs (stopped): every new connection needs the master
/// looked up, and the hung sentinel must not take the whole deadline of each. With the
/// master closing the connections before each, five `lock`s with a 3 s wait on free keys
/// are all granted (the hung one is given a third of it; with a 1 s wait, a busy machine
/// once left too little of the rest for the lookup and the grant).
#[test]
fn a_hung_sentinel_does_not_hold_up_reconnects() {
    let setup = SentinelSetup::start();
    let redis = RedisLocks::open_sentinel(MASTER_NAME, &setup.sentinel_urls()).unwrap();
    redis
        .lock("warm", LockOptions::default())
        .unwrap()
        .unlock()
        .unwrap();
    setup.sentinels[0].pause(true);
    let mut outcomes = Vec::new();
    for i in 0..5 {
        setup.master.cli(&["CLIENT", "KILL", "TYPE", "normal"]);
        let t = Instant::now();
        let got = redis.lock(
            format!("k{i}"),
            opts(Duration::from_secs(5), Duration::from_secs(3)),
        );
        outcomes.push((
            t.elapsed(),
            got.map(|g| g.unlock()).map_err(|e| e.to_string()),
        ));
    }
    setup.sentinels[0].pause(false);
    note!(
        "[took {:?}] ",
        outcomes.iter().map(|(took, _)| *took).collect::<Vec<_>>()
    );
    assert!(
        outcomes.iter().all(|(_, got)| matches!(got, Ok(Ok(())))),
        "with the first sentinel hung (took, outcome): {outcomes:?}"
    );
}

/// A single server stalled (SIGSTOP) for 2.8 s, or answering 2.8 s late through a proxy:
/// `lock` with a 500 ms (or 800 ms) timeout returns long before the stall ends, and what
/// its attempts left on the server is undone: after the stall nobody holds the key.
#[test]
fn lock_timeouts_are_wall_time_while_a_server_stalls() {
    const STALL: Duration = Duration::from_millis(2800);
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    let holder = RedisLocks::open(&server.url()).unwrap();
    let held = holder.lock("held", LockOptions::default()).unwrap();
    server.pause(true);
    let stalled = Instant::now();
    let (free, busy) = std::thread::scope(|s| {
        let busy = s.spawn(|| {
            let t = Instant::now();
            let r = redis.lock(
                "held",
                opts(Duration::from_secs(30), Duration::from_millis(800)),
            );
            (t.elapsed(), r.is_err())
        });
        let t = Instant::now();
        let r = redis.lock(
            "q",
            opts(Duration::from_secs(30), Duration::from_millis(500)),
        );
        ((t.elapsed(), r.is_err()), busy.join().unwrap())
    });
    assert!(stalled.elapsed() < STALL, "the calls outlasted the stall");
    std::thread::sleep(STALL.saturating_sub(stalled.elapsed()));
    server.pause(false);
    assert!(free.1 && busy.1, "a stalled server granted a key");
    assert!(
        free.0 < STALL / 2,
        "lock on a free key returned after {:?}",
        free.0
    );
    assert!(
        busy.0 < STALL / 2,
        "lock on a held key returned after {:?}",
        busy.0
    );
    // the attempt that reached the stalled server is refused or undone
    eventually("the stalled attempt undone", Duration::from_secs(5), || {
        !redis.is_locked("q").unwrap()
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(!redis.is_locked("q").unwrap());
    assert!(redis.lock("q", LockOptions::default()).is_ok());
    drop(held);

    // replies held back 2.8 s by a proxy
    let proxy = Proxy::start(server.port);
    let slow = RedisLocks::open(&proxy.url()).unwrap();
    let held = holder.lock("held2", LockOptions::default()).unwrap();
    proxy.delay_replies(STALL);
    let t = Instant::now();
    let r = slow.lock(
        "held2",
        opts(Duration::from_secs(30), Duration::from_millis(500)),
    );
    let took = t.elapsed();
    proxy.delay_replies(Duration::ZERO);
    assert!(r.is_err());
    assert!(
        took < STALL / 2,
        "a 500 ms wait on a slow server took {took:?}"
    );
    drop(held);
}

/// A waiter subscribed to the key's release channel when its server stops (SIGSTOP) and
/// stays stopped: `lock` with a 1 s wait returns about then, with an error, not when a
/// command timeout (5 s) ends the unsubscribe that closes each sleep of the wait.
#[test]
fn a_waiter_whose_server_stops_returns_at_the_end_of_its_wait() {
    let server = RedisServer::start();
    let holder = RedisLocks::open(&server.url()).unwrap();
    let _held = holder.lock("k", LockOptions::default()).unwrap();
    let waiter = RedisLocks::open(&server.url()).unwrap();
    let (took, got) = std::thread::scope(|s| {
        let w = s.spawn(|| {
            let t = Instant::now();
            let got = waiter.lock("k", opts(Duration::from_secs(60), Duration::from_secs(1)));
            (t.elapsed(), got.map(drop))
        });
        std::thread::sleep(Duration::from_millis(300)); // the waiter sleeps subscribed
        server.pause(true);
        let done = w.join().unwrap();
        server.pause(false);
        done
    });
    note!("[{took:?}] ");
    assert!(got.is_err(), "granted a held key: {got:?}");
    // the wait and its last attempt and unsubscribe (T and 200 ms), with room to spare
    assert!(
        took < Duration::from_millis(2500),
        "a 1 s wait took {took:?}"
    );
}

/// A server that lacks the scripts (flushed, as after a restart), answering each request
/// 200 to 450 ms late through a proxy: `lock` on a free key with a 500 ms wait returns
/// within a generous bound of its wait (1 s), however many round trips the missing script
/// costs (`EVALSHA` refused with NOSCRIPT, then the script itself), not after each of
/// them was given the whole command timeout. What it did not take is not left held.
#[test]
fn a_server_without_the_scripts_answering_late_keeps_the_wait_short() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let redis = RedisLocks::open(&proxy.url()).unwrap();
    let mut took = Vec::new();
    for (round, delay) in [450u64, 350, 200].into_iter().enumerate() {
        let key = format!("free{round}");
        server.cli(&["SCRIPT", "FLUSH"]);
        proxy.delay_replies(Duration::from_millis(delay));
        let t = Instant::now();
        let got = redis.lock(
            &key,
            opts(Duration::from_secs(30), Duration::from_millis(500)),
        );
        took.push((delay, t.elapsed(), got.is_ok()));
        proxy.delay_replies(Duration::ZERO);
        if let Ok(g) = got {
            g.unlock().unwrap();
        }
        eventually("no hold left", Duration::from_secs(5), || {
            !redis.is_locked(&key).unwrap()
        });
    }
    note!("[reply delay, took, granted: {took:?}] ");
    assert!(
        took.iter()
            .all(|(_, t, _)| *t < Duration::from_millis(1000)),
        "500 ms waits took {took:?}"
    );
}

/// A release whose reply is lost (the proxy cuts the connection once the request is on
/// its way): the release took effect and woke a waiter, which took the key; the retry on
/// a fresh connection must report what happened (`Ok`: this holder released it), not
/// `Expired`.
#[test]
fn a_release_whose_reply_was_lost_reports_what_happened() {
    const ROUNDS: usize = 20;
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let holder = RedisLocks::open(&proxy.url()).unwrap();
    let waiter = RedisLocks::open(&server.url()).unwrap();
    let mut outcomes = Vec::new();
    for _ in 0..ROUNDS {
        let guard = holder.lock("k", LockOptions::default()).unwrap();
        std::thread::scope(|s| {
            let w = s.spawn(|| {
                let g = waiter
                    .lock("k", opts(Duration::from_secs(30), Duration::from_secs(5)))
                    .unwrap();
                std::thread::sleep(Duration::from_millis(20)); // holds it while the retry runs
                g.unlock().unwrap();
            });
            std::thread::sleep(Duration::from_millis(30)); // the waiter is waiting
            proxy.cut_after(b"{k}:free");
            outcomes.push(guard.unlock().map_err(|e| e.to_string()));
            w.join().unwrap();
        });
    }
    assert_eq!(
        proxy.cuts(),
        ROUNDS as u64,
        "every release's reply was lost"
    );
    assert!(
        outcomes.iter().all(Result::is_ok),
        "a release that took effect was reported as: {outcomes:?}"
    );
}

/// Fencing tokens never repeat or go back: across an empty restart of the server, and
/// after the key's fence counter expired.
#[test]
fn tokens_never_repeat_across_an_empty_restart_or_an_expired_counter() {
    let mut server = RedisServer::start();
    let redis = RedisLocks::open(&server.url())
        .unwrap()
        .with_fence_grace(Duration::from_millis(50));
    let mut seen = Vec::new();
    let mut fence = |redis: &RedisLocks| {
        let g = redis
            .lock("k", opts(Duration::from_millis(100), Duration::ZERO))
            .unwrap();
        seen.push(g.try_token().unwrap());
        g.unlock().unwrap();
    };
    fence(&redis);
    fence(&redis);
    server.restart(); // empty: the counter is gone
    let redis = RedisLocks::open(&server.url())
        .unwrap()
        .with_fence_grace(Duration::from_millis(50));
    fence(&redis);
    std::thread::sleep(Duration::from_millis(300)); // lease and grace: the counter expired
    assert_eq!(server.cli(&["EXISTS", "shmlock:{k}:fence"]).trim(), "0");
    fence(&redis);
    assert!(
        seen.windows(2).all(|w| w[1] > w[0]),
        "tokens went back or repeated: {seen:?}"
    );
}

/// 100 000 distinct keys, each locked, fenced and unlocked once: after their leases and
/// the fence grace, the server holds as many keys as before (no counter or mark is left
/// behind for good).
#[test]
fn nothing_is_left_in_redis_after_the_leases_and_the_grace() {
    const KEYS: usize = 100_000;
    const THREADS: usize = 8;
    let server = RedisServer::start();
    let before = server.cli(&["DBSIZE"]).trim().to_string();
    // (leases and the command timeout of 5 s: 300,000 commands on a busy machine may meet a
    // stall of half a second, and a hold whose lease ran out is not released)
    let redis = RedisLocks::open(&server.url())
        .unwrap()
        .with_fence_grace(Duration::from_millis(500));
    let lease = opts(Duration::from_secs(5), Duration::ZERO);
    let done = std::sync::atomic::AtomicBool::new(false);
    let most = std::thread::scope(|s| {
        // how many keys the server held at most while the holds were taken
        let sampler = s.spawn(|| {
            let mut most = 0u64;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                most = most.max(server.cli(&["DBSIZE"]).trim().parse().unwrap_or(0));
                std::thread::sleep(Duration::from_millis(100));
            }
            most
        });
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (redis, lease) = (&redis, &lease);
                s.spawn(move || {
                    for i in (t..KEYS).step_by(THREADS) {
                        let g = redis.lock(format!("key:{i}"), lease).unwrap();
                        g.try_token().unwrap();
                        g.unlock().unwrap();
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        sampler.join().unwrap()
    });
    note!("[at most {most} keys while the holds were taken] ");
    assert!(
        most > 1000,
        "the counters and marks were written: {most} keys at most"
    );
    eventually(
        "the keyspace back to its size",
        Duration::from_secs(60),
        || server.cli(&["DBSIZE"]).trim() == before,
    );
}

/// Faults seen by a client with a history of holds, run for a while: a proxy that cuts
/// connections after requests and holds replies back, under three contending clients
/// (one through the proxy). Never two holders told `Ok` at once, tokens in grant order.
#[test]
fn contending_clients_behind_a_lossy_proxy_keep_the_promises() {
    let server = RedisServer::start();
    let proxy = Arc::new(Proxy::start(server.port));
    let history = Mutex::new(Vec::new());
    let lease = Duration::from_millis(600);
    let deadline = Instant::now() + Duration::from_secs(6);
    std::thread::scope(|s| {
        for (who, url) in [
            ("direct 1", server.url()),
            ("direct 2", server.url()),
            ("through the proxy", proxy.url()),
        ] {
            let history = &history;
            s.spawn(move || {
                let redis = RedisLocks::open(&url)
                    .unwrap()
                    .with_timeout(Duration::from_millis(300));
                while Instant::now() < deadline {
                    let mut lock = Lock::new(&redis, opts(lease, Duration::from_secs(2))).unwrap();
                    if lock.lock("k").is_err() {
                        continue;
                    }
                    let granted = Instant::now();
                    let Ok(token) = lock.try_token() else {
                        continue;
                    };
                    let mut last_ok = granted;
                    for _ in 0..3 {
                        std::thread::sleep(Duration::from_millis(40));
                        match lock.expire(None) {
                            Ok(()) => last_ok = Instant::now(),
                            Err(_) => break,
                        }
                    }
                    let _ = lock.unlock();
                    history.lock().unwrap().push(Held {
                        who,
                        granted,
                        last_ok,
                        token,
                    });
                }
            });
        }
        let proxy = proxy.clone();
        s.spawn(move || {
            let mut n = 0u32;
            while Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(150));
                n += 1;
                if n.is_multiple_of(2) {
                    proxy.cut_after(b"{k}");
                } else {
                    proxy.delay_replies(Duration::from_millis(400));
                    std::thread::sleep(Duration::from_millis(100));
                    proxy.delay_replies(Duration::ZERO);
                }
            }
        });
    });
    let history = history.into_inner().unwrap();
    let through = history
        .iter()
        .filter(|h| h.who == "through the proxy")
        .count();
    note!(
        "[{} holds, {through} through the proxy, {} cuts] ",
        history.len(),
        proxy.cuts()
    );
    assert!(history.len() > 10, "{history:#?}");
    assert!(proxy.cuts() > 0);
    judge(&history);
}

/// `is_locked` does not see a cancelled attempt's marker, or a release's mark, as a hold,
/// and `holders` lists only holds.
#[test]
fn marks_are_not_holds() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    let g = redis.lock("m", LockOptions::default()).unwrap();
    g.unlock().unwrap();
    let _ = redis.holders().unwrap();
    assert!(!redis.is_locked("m").unwrap());
    assert!(redis.holders().unwrap().is_empty());
    let keys = server.cli(&["KEYS", "*"]);
    assert!(keys.contains("released"), "the release's mark: {keys}");
    let _ = Error::Expired;
}

/// A link that goes silent (a partition that leaves the connection open) while
/// `keep_alive` renews a 600 ms lease: `is_lost` turns true once the lease last renewed
/// could lapse within a tenth of itself, while the renewal that hangs has seconds of its
/// command timeout left; another client then takes the key (the lease had indeed run out).
/// Before, `is_lost` said only what a renewal's answer said: false until the hanging
/// renewal gave up, 5 s in, while the other client held the key. A link silent from
/// before `keep_alive` starts its work told.
#[test]
fn keep_alive_says_lost_when_the_lease_could_lapse_on_a_silent_link() {
    let server = RedisServer::start();
    let link = Proxy::start(server.port);
    let redis = RedisLocks::open(&link.url()).unwrap();
    let other = RedisLocks::open(&server.url()).unwrap();
    let mut g = redis
        .lock("job", opts(Duration::from_millis(600), Duration::ZERO))
        .unwrap();
    let ((lost_after, taken), lease) = g.keep_alive(|alive| {
        std::thread::sleep(Duration::from_millis(300));
        assert!(!alive.is_lost(), "lost while the link was fine");
        link.blackhole(true);
        let cut = Instant::now();
        while !alive.is_lost() && cut.elapsed() < Duration::from_secs(4) {
            std::thread::sleep(Duration::from_millis(5));
        }
        let lost_after = cut.elapsed();
        let taken = other
            .lock("job", opts(Duration::from_secs(5), Duration::from_secs(2)))
            .map(|g| g.unlock());
        link.blackhole(false);
        (lost_after, taken)
    });
    note!("[lost {lost_after:?} after the cut; keep_alive: {lease:?}] ");
    assert!(lost_after < Duration::from_secs(1), "{lost_after:?}");
    assert!(matches!(taken, Ok(Ok(()))), "{taken:?}");
    assert!(lease.is_err(), "{lease:?}");

    // silent from before keep_alive: the renewal it makes before the work goes unanswered
    // (within the handle's 500 ms), and the work starts told (it was told nothing while
    // no renewal had answered)
    let short = redis.with_timeout(Duration::from_millis(500));
    let mut g = short
        .lock("job2", opts(Duration::from_millis(600), Duration::ZERO))
        .unwrap();
    link.blackhole(true);
    let (told, lease) = g.keep_alive(|alive| alive.is_lost());
    link.blackhole(false);
    assert!(told, "the work started with is_lost false on a silent link");
    assert!(lease.is_err(), "{lease:?}");
}

/// Renewals that each take a third of the lease or more (replies 150 ms late, a 400 ms
/// lease renewed every 133 ms): `keep_alive` returns when its work is done, the lease kept
/// throughout. (The renewer held the lock that ends it while it renewed, and a wait of
/// zero never let it go: `keep_alive` never returned, and renewed the key for good.)
#[test]
fn keep_alive_returns_when_each_renewal_takes_a_third_of_the_lease() {
    let server = RedisServer::start();
    let link = Proxy::start(server.port);
    // (leaked: the thread that runs keep_alive may outlive the test, if it hangs)
    let redis: &'static RedisLocks = Box::leak(Box::new(RedisLocks::open(&link.url()).unwrap()));
    let mut g = redis
        .lock("slow", opts(Duration::from_millis(400), Duration::ZERO))
        .unwrap();
    link.delay_replies(Duration::from_millis(150));
    let (done, ended) = std::sync::mpsc::channel();
    let t0 = Instant::now();
    std::thread::spawn(move || {
        let (_, lease) = g.keep_alive(|_| std::thread::sleep(Duration::from_millis(50)));
        let _ = done.send(lease);
        // (its release is left to the lease: with each reply this late, a release after
        // the look that ends keep_alive may come after it)
        g.leave_to_expire();
    });
    // (a hang guard: it returns within a renewal or two of the work's end)
    let lease = ended
        .recv_timeout(Duration::from_secs(20))
        .expect("keep_alive did not return within 20 s of 50 ms of work");
    note!("[returned after {:?}] ", t0.elapsed());
    link.delay_replies(Duration::ZERO);
    assert!(lease.is_ok(), "{lease:?}");
}

/// Runs `worker.keep_alive` until 2.5 s after `set` while `other` tries to take `key`
/// every 20 ms: it must never get it, and a failure of the lease must have been told to
/// the work; then unlocks (what it says is not asked: a busy machine may fail a
/// replica's acknowledgement).
fn keep_alive_keeps_the_key_from(
    mut worker: Lock<'_, RedisLocks>,
    other: &RedisLocks,
    key: &str,
    set: Instant,
) {
    let ((taken, told), lease) = worker
        .keep_alive(|alive| {
            while set.elapsed() < Duration::from_millis(2500) {
                if let Ok(g) = other.lock(key, opts(Duration::from_secs(5), Duration::ZERO)) {
                    g.unlock().unwrap();
                    return (Some(set.elapsed()), alive.is_lost());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            (None, alive.is_lost())
        })
        .unwrap();
    assert_eq!(
        taken, None,
        "another client took the key mid-work (the work told: {told})"
    );
    assert!(lease.is_ok() || told, "{lease:?} without is_lost");
    let _ = worker.unlock();
}

/// `expire(Some(..))` that the master applied but its replica did not acknowledge
/// (`NotReplicated`): its lease is the one `keep_alive` renews, though `expire` said it
/// failed. (A hold taken without expiry kept that status: nothing was renewed, and another
/// client took the key mid-work while `is_lost` said false.)
#[test]
fn keep_alive_renews_a_lease_that_expire_set_unacknowledged() {
    let (master, replica) = RedisServer::with_a_replica();
    let redis = RedisLocks::open(&master.url())
        .unwrap()
        .with_replicas(1, Duration::from_millis(200));
    let other = RedisLocks::open(&master.url()).unwrap();
    let mut worker = Lock::new(&redis, opts(Duration::ZERO, Duration::ZERO)).unwrap();
    // (a busy machine may keep the replica's acknowledgement past 200 ms: the key is then
    // given back, and taken again)
    let t0 = Instant::now();
    while let Err(e) = worker.lock("unacked") {
        assert!(
            matches!(e, Error::NotReplicated { .. }) && t0.elapsed() < Duration::from_secs(20),
            "{e}"
        );
    }
    replica.pause(true);
    let said = worker.expire(Some(Duration::from_millis(1200)));
    let set = Instant::now();
    replica.pause(false);
    assert!(
        matches!(said, Err(Error::NotReplicated { .. })),
        "the replica acknowledged: {said:?}"
    );
    keep_alive_keeps_the_key_from(worker, &other, "unacked", set);
}

/// `expire(None)` back to "never expires" that never reached the server (the link went
/// silent and the proxy was replaced, its requests dropped): the server keeps the lease
/// set before, and `keep_alive` renews that one. (It took the hold to never expire and
/// renewed nothing: another client took the key mid-work while `is_lost` said false.)
#[test]
fn keep_alive_renews_the_lease_a_failed_expire_left() {
    let server = RedisServer::start();
    let link = Proxy::start(server.port);
    let port = link.port;
    let redis = RedisLocks::open(&link.url())
        .unwrap()
        .with_timeout(Duration::from_millis(200));
    let other = RedisLocks::open(&server.url()).unwrap();
    let mut worker = Lock::new(&redis, opts(Duration::ZERO, Duration::ZERO)).unwrap();
    worker.lock("left").unwrap();
    worker.expire(Some(Duration::from_millis(1000))).unwrap();
    let set = Instant::now();
    link.blackhole(true);
    let said = worker.expire(None);
    assert!(
        said.is_err(),
        "expire answered through a silent link: {said:?}"
    );
    drop(link); // (what it held is dropped, never sent)
    let _link = Proxy::start_on(port, server.port);
    keep_alive_keeps_the_key_from(worker, &other, "left", set);
}

/// A Cluster node reached through a link that stalls (both ways, for 1.5 s) right after
/// an acquisition reaches it: the attempt takes the key, its reply is late, and redis-rs's
/// cluster connection sends the request again. `lock` (a lease of 0: never expires, and a
/// 1 s wait) gives up before the reply comes; it must not leave the key held: once the
/// link is back, the key is free and another client takes it.
#[test]
fn a_cluster_attempt_sent_twice_leaves_no_hold_behind() {
    let cluster = ClusterSetup::start();
    let node = &cluster.nodes[cluster.node_of("shmlock:{k}")];
    let link = Proxy::start(node.port);
    node.cli(&[
        "CONFIG",
        "SET",
        "cluster-announce-port",
        &link.port.to_string(),
    ]);
    eventually(
        "every node sends clients through the proxy",
        Duration::from_secs(20),
        || {
            cluster.nodes.iter().all(|n| {
                n.cli(&["CLUSTER", "SLOTS"])
                    .lines()
                    .any(|l| l.trim() == link.port.to_string())
            })
        },
    );
    let redis = RedisLocks::open_cluster(&cluster.urls()).unwrap();
    // the script cached on the node, a connection made through the proxy
    redis
        .lock("k", LockOptions::default())
        .unwrap()
        .unlock()
        .unwrap();
    link.freeze_after(b"EVALSHA", Duration::from_millis(1500));
    let t = Instant::now();
    let got = redis.lock("k", opts(Duration::ZERO, Duration::from_secs(1)));
    let took = t.elapsed();
    assert_eq!(link.freezes(), 1, "the link never stalled");
    note!("[{took:?}: {:?}] ", got.as_ref().map(|_| ()));
    if let Ok(g) = got {
        g.unlock().unwrap(); // granted after all: released, as any hold
    }
    std::thread::sleep(Duration::from_millis(1500).saturating_sub(t.elapsed()));
    eventually("the key free again", Duration::from_secs(3), || {
        node.cli(&["EXISTS", "shmlock:{k}"]).trim() == "0"
    });
    let other = RedisLocks::open_cluster(&cluster.urls()).unwrap();
    other
        .lock("k", opts(Duration::from_secs(5), Duration::from_secs(2)))
        .unwrap()
        .unlock()
        .unwrap();
}

/// A server that stops speaking the Redis protocol in the middle of a wait (a port taken
/// over by something else): the wait ends with that error at once, not at its deadline (a
/// reply that does not parse was retried as if unanswered, for the whole 30 s).
#[test]
fn a_server_that_stops_speaking_redis_mid_wait_ends_the_wait_at_once() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let holder = RedisLocks::open(&server.url()).unwrap();
    let held = holder
        .lock("k", opts(Duration::from_secs(60), Duration::ZERO))
        .unwrap();
    let waiter = RedisLocks::open(&proxy.url())
        .unwrap()
        .with_timeout(Duration::from_millis(500));
    let garbling = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            proxy.garble(true);
        });
        let started = Instant::now();
        let got = waiter.lock("k", opts(Duration::from_secs(60), Duration::from_secs(30)));
        (started.elapsed(), got.map(drop))
    });
    let (waited, got) = garbling;
    let err = got.expect_err("granted a held key");
    assert!(
        err.to_string()
            .contains("does not speak the Redis protocol"),
        "{err}"
    );
    assert!(
        waited < Duration::from_secs(15),
        "the wait went on for {waited:?} after the server stopped speaking Redis"
    );
    drop(held);
}

/// After a `WRONGTYPE` reply (a value of a foreign type at a lock's key) the look at which
/// key holds what ends by the caller's deadline, even when the server stalls then (it took
/// a whole command timeout, 10 s here, past a 200 ms wait).
#[test]
fn the_look_after_a_wrongtype_reply_ends_by_the_callers_deadline() {
    let server = RedisServer::start();
    server.cli(&["LPUSH", "shmlock:{w}", "x"]);
    let proxy = Proxy::start(server.port);
    let via = RedisLocks::open(&proxy.url())
        .unwrap()
        .with_timeout(Duration::from_secs(10));
    // the first TYPE request (the look) stalls the link for longer than any wait here
    proxy.freeze_after(b"$4\r\nTYPE\r\n", Duration::from_secs(20));
    let started = Instant::now();
    let got = via.lock(
        "w",
        opts(Duration::from_secs(5), Duration::from_millis(200)),
    );
    let took = started.elapsed();
    assert!(got.is_err(), "granted a key that holds a list");
    assert!(
        took < Duration::from_secs(5),
        "a 200 ms wait took {took:?} (freezes: {})",
        proxy.freezes()
    );
}

/// An attempt of exptime 0 (a hold that never expires) whose grant the client never heard
/// of, on a link that then stalls for longer than 30 s: the handle's thread goes on
/// undoing it until the link is back, and the key is free then. It gave up after 30 s, and
/// the grant stayed on the server for good (readers, permits and writers alike).
#[test]
fn a_lost_grant_without_a_lease_is_undone_after_a_long_partition() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let via = RedisLocks::open(&proxy.url())
        .unwrap()
        .with_timeout(Duration::from_millis(300));
    // the scripts cached, a connection made through the proxy
    via.lock_shared("r", LockOptions::default())
        .unwrap()
        .unlock()
        .unwrap();
    let stall = Duration::from_secs(36);
    proxy.freeze_after(b"EVALSHA", stall);
    let t = Instant::now();
    let got = via.lock_shared("r", opts(Duration::ZERO, Duration::from_secs(1)));
    assert_eq!(proxy.freezes(), 1, "the link never stalled");
    assert!(got.is_err(), "granted through a frozen link");
    // granted on the server, unknown to the client
    assert_eq!(server.cli(&["ZCARD", "shmlock:{r}:leases"]).trim(), "1");
    std::thread::sleep(stall.saturating_sub(t.elapsed()));
    eventually("the grant undone", Duration::from_secs(10), || {
        server.cli(&["ZCARD", "shmlock:{r}:leases"]).trim() == "0"
    });
    let other = RedisLocks::open(&server.url()).unwrap();
    other
        .lock("r", opts(Duration::from_secs(5), Duration::from_secs(2)))
        .unwrap()
        .unlock()
        .unwrap();
}
