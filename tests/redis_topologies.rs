//! The Redis backend beyond one server, against real servers started here: a master with
//! two replicas and three sentinels (a failover with and without replicas required), a
//! 3-master Cluster (every slot range, holders across nodes, a node restart), and TLS.
//! One binary, so that these slow set-ups run side by side.

mod common;

use std::time::{Duration, Instant};

use common::redis_server::{await_failover, eventually, ClusterSetup, SentinelSetup, MASTER_NAME};
use shmlock::{Error, Lock, LockOptions, RedisLocks};

fn lease(exptime: Duration) -> LockOptions {
    LockOptions {
        exptime,
        ..LockOptions::default()
    }
}

/// A lock taken with 2 replicas required survives the master's SIGKILL: after the
/// failover nobody else gets the key before its lease ends, and the next holder's fencing
/// token is greater.
#[test]
fn sentinel_failover_with_replicas_required_keeps_the_lock_and_its_token() {
    let setup = SentinelSetup::start();
    let urls = setup.sentinel_urls();
    // (2 s for the acknowledgements: a loaded machine can keep a replica's past 500 ms)
    let redis = RedisLocks::open_sentinel(MASTER_NAME, &urls)
        .unwrap()
        .with_replicas(2, Duration::from_secs(2));

    #[cfg(feature = "tokio")]
    async_round_trip(&redis, "async-k");

    // With both replicas stopped, nothing can be granted: a typed error, and the key that
    // the SET took on the master is released again.
    for r in &setup.replicas {
        r.pause(true);
    }
    let refused = redis.try_lock_with_lease("k", Duration::from_secs(30));
    for r in &setup.replicas {
        r.pause(false);
    }
    assert!(
        matches!(
            refused,
            Err(Error::NotReplicated {
                acked: 0,
                wanted: 2,
                ..
            })
        ),
        "{refused:?}"
    );
    assert!(!redis.is_locked("k").unwrap());

    // longer than a failover takes (8.4 s measured here)
    let exptime = Duration::from_secs(15);
    let mut lock = Lock::new(&redis, lease(exptime)).unwrap();
    lock.lock("k").unwrap();
    let taken = Instant::now();
    let first = lock.try_token().unwrap();

    let old = setup.master.port;
    let mut master = setup.master;
    master.stop(); // SIGKILL
    let new = await_failover(&setup.sentinels, old);
    assert_ne!(new, old);

    // a client that connects now reaches the promoted replica, which has the hold
    let other = RedisLocks::open_sentinel(MASTER_NAME, &urls).unwrap();
    let holders = other.holders().unwrap();
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].pid, Some(std::process::id()));
    assert_eq!(holders[0].token, Some(first));
    let mut checks = 0;
    while taken.elapsed() + Duration::from_millis(700) < exptime {
        assert!(
            other.try_lock_with_lease("k", exptime).unwrap().is_none(),
            "another client took the key {:?} into an {exptime:?} lease",
            taken.elapsed()
        );
        checks += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(checks > 0, "the failover took the whole lease");
    // The old handle follows the master too (after at most one error on a connection to
    // the dead master) and finds its hold; but one replica is left, so a renewal that
    // requires two is refused. (That replica acknowledges only once it follows the new
    // master and has synced with it: a loaded CI run saw 0 acknowledgements here.)
    let renewal = match lock.expire(None) {
        Err(Error::Redis(_)) => lock.expire(None),
        other => other,
    };
    assert!(
        matches!(
            renewal,
            Err(Error::NotReplicated {
                acked: 0 | 1,
                wanted: 2,
                ..
            })
        ),
        "{renewal:?}"
    );
    lock.unlock().unwrap();
    let mut next = Lock::new(&other, lease(exptime)).unwrap();
    next.lock("k").unwrap();
    assert!(next.try_token().unwrap() > first);
    next.unlock().unwrap();
}

/// A planned failover (`SENTINEL FAILOVER`) keeps the old master serving while the
/// promoted replica already is one: with every replica required, the renewals it
/// serves then are refused (the promoted replica no longer acknowledges), so nobody else
/// gets the key before the last lease its holder was told it has is over. (With fewer
/// replicas required than there are, the other replica acknowledged those renewals,
/// then followed the new master without them: another client held the key for 333-420
/// ms of a lease the first was told it had. docs/redis.md says so.)
#[test]
fn a_planned_failover_with_every_replica_required_never_gives_the_key_twice() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let setup = SentinelSetup::start();
    let urls = setup.sentinel_urls();
    let required = |r: RedisLocks| r.with_replicas(2, Duration::from_millis(500));
    let a = required(RedisLocks::open_sentinel(MASTER_NAME, &urls).unwrap());
    let b = required(RedisLocks::open_sentinel(MASTER_NAME, &urls).unwrap());
    let exptime = Duration::from_millis(1500);
    let mut lock = Lock::new(&a, lease(exptime)).unwrap();
    let sent = Instant::now();
    lock.lock("k").unwrap();
    // the end of the last lease A was told it has (a lease runs from before its request)
    let mut vouched = sent + exptime;
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let taker = s.spawn(|| {
            while !stop.load(Ordering::SeqCst) {
                if let Ok(Some(g)) = b.try_lock_with_lease("k", Duration::from_secs(30)) {
                    let at = Instant::now();
                    let _ = g.unlock();
                    return Some(at);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            None
        });
        let old = setup.master.port;
        let failover = setup.sentinels[0].cli(&["SENTINEL", "FAILOVER", MASTER_NAME]);
        assert!(failover.starts_with("OK"), "{failover}");
        let mut refused = 0;
        let mut promoted = None;
        // A renews every 100 ms through the failover, and 3 s past it, then stops
        while promoted.is_none_or(|at: Instant| at.elapsed() < Duration::from_secs(3)) {
            let sent = Instant::now();
            match lock.expire(None) {
                Ok(()) => vouched = sent + exptime,
                Err(_) => refused += 1,
            }
            if promoted.is_none() && setup.master_port().is_some_and(|p| p != old) {
                promoted = Some(Instant::now());
            }
            assert!(
                sent.duration_since(vouched - exptime) < Duration::from_secs(40),
                "hang"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(refused > 0, "no renewal was refused around the failover");
        // A has stopped renewing: the other client gets the key once A's lease is over
        let deadline = Instant::now() + Duration::from_secs(30);
        while !taker.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        stop.store(true, Ordering::SeqCst);
        let took = taker
            .join()
            .unwrap()
            .expect("the other client never got the key");
        assert!(
            took >= vouched,
            "the other client got the key {:?} into the lease A was told it had",
            vouched - took
        );
    });
}

/// The same failover without replicas required, when the replicas had not yet received
/// the writes (they are stopped for the few milliseconds of the grant): the promoted
/// replica never saw the hold, so a second client takes the key at once, and the fence
/// counter there is back where it was before the first holder's token. The second
/// holder's token is greater all the same (tokens are never below the server's clock in
/// µs), so a fencing store still tells the two holders apart and refuses the first. This
/// loss of the hold is what `with_replicas` prevents; the README says why both are needed.
#[test]
fn sentinel_failover_without_replicas_required_can_lose_the_lock_but_never_repeats_a_token() {
    let setup = SentinelSetup::start();
    let urls = setup.sentinel_urls();
    let redis = RedisLocks::open_sentinel(MASTER_NAME, &urls).unwrap();
    // some history for the counter, replicated
    let mut replicated = 0;
    for _ in 0..3 {
        let g = redis.lock("k", LockOptions::default()).unwrap();
        replicated = g.try_token().unwrap();
        g.unlock().unwrap();
    }
    eventually("replicas caught up", Duration::from_secs(10), || {
        setup
            .replicas
            .iter()
            .all(|r| r.cli(&["GET", "shmlock:{k}:fence"]).trim() == replicated.to_string())
    });

    // The replicas are cut off from the master while the hold is granted: stopped, and
    // their replication links closed by the master, so nothing of what follows reaches
    // them (not even through a socket buffer).
    for r in &setup.replicas {
        r.pause(true);
    }
    setup.master.cli(&["CLIENT", "KILL", "TYPE", "replica"]);
    let mut lock = Lock::new(&redis, lease(Duration::from_secs(30))).unwrap();
    lock.lock("k").unwrap(); // granted at once: nothing waits for the replicas
    let first = lock.try_token().unwrap();
    assert!(first > replicated);
    let old = setup.master.port;
    let mut master = setup.master;
    master.stop(); // SIGKILL, before the replicas got the writes
    for r in &setup.replicas {
        r.pause(false);
    }
    await_failover(&setup.sentinels, old);

    let other = RedisLocks::open_sentinel(MASTER_NAME, &urls).unwrap();
    let second = other
        .try_lock_with_lease("k", Duration::from_secs(30))
        .unwrap()
        .expect("the promoted replica never saw the hold: the key is free");
    // the promoted replica's counter is at the last replicated token, yet the second
    // holder's token is greater than the first holder's, which the replica never saw
    assert_eq!(
        setup.replicas.iter().find_map(|r| {
            let v = r.cli(&["GET", "shmlock:{k}:fence"]);
            (r.cli(&["ROLE"]).starts_with("master")).then(|| v.trim().to_string())
        }),
        Some(replicated.to_string())
    );
    let next = second.try_token().unwrap();
    assert!(next > first, "{next} after {first}");
    second.unlock().unwrap();
    // the first holder learns it at its next renewal
    let renewal = match lock.expire(None) {
        Err(Error::Redis(_)) => lock.expire(None),
        other => other,
    };
    assert!(matches!(renewal, Err(Error::Expired)), "{renewal:?}");
}

#[test]
fn cluster_routes_every_slot_range_lists_holders_on_every_master_and_survives_a_node_restart() {
    let mut cluster = ClusterSetup::start();
    let urls = cluster.urls();
    let redis = RedisLocks::open_cluster(&urls).unwrap();
    let other = RedisLocks::open_cluster(&urls[2..]).unwrap();
    let keys: Vec<String> = (0..24).map(|i| format!("job:{i}")).collect();
    let mut held = Vec::new();
    for k in &keys {
        let mut lock = Lock::new(&redis, lease(Duration::from_secs(30))).unwrap();
        lock.lock(k).unwrap();
        assert!(lock.try_token().unwrap() >= 1);
        assert!(other
            .try_lock_with_lease(k, Duration::from_secs(30))
            .unwrap()
            .is_none());
        held.push(lock);
    }
    // the keys span every master's slot range
    let owners: Vec<usize> = keys
        .iter()
        .map(|k| cluster.node_of(&format!("shmlock:{{{k}}}")))
        .collect();
    for n in 0..3 {
        assert!(owners.contains(&n), "no key on node {n}: {owners:?}");
    }
    // holders() asks every master
    let holders = other.holders().unwrap();
    assert_eq!(holders.len(), keys.len());
    let mut nodes: Vec<&str> = holders.iter().map(|h| h.node.as_str()).collect();
    nodes.sort();
    nodes.dedup();
    assert_eq!(nodes.len(), 3, "{nodes:?}");
    for h in &holders {
        let i = keys.iter().position(|k| k.as_bytes() == h.key).unwrap();
        assert_eq!(
            h.node,
            format!("127.0.0.1:{}", cluster.nodes[owners[i]].port)
        );
        assert_eq!(h.pid, Some(std::process::id()));
        assert!(h.token.is_some() && h.token == h.last_token);
    }
    // a waiter is woken by the release (published on one node, heard on another)
    let woken = wait_for_release(&redis, &other, "wake");
    assert!(woken < Duration::from_millis(1500), "{woken:?}: not woken");
    #[cfg(feature = "tokio")]
    async_round_trip(&other, "async-k");

    // force_unlock reaches the key's master, whichever it is
    let broken = 0;
    assert!(other.force_unlock(&keys[broken]).unwrap());
    assert!(matches!(held[broken].expire(None), Err(Error::Expired)));

    // restart one master empty: its holds are gone (the empty-restart case), the others
    // stay held, and the handles carry on once the cluster is whole again
    let victim = owners[1];
    cluster.nodes[victim].restart();
    cluster.await_ok();
    let deadline = Instant::now() + Duration::from_secs(20);
    for (i, k) in keys.iter().enumerate().skip(broken + 1) {
        let renewal = loop {
            match held[i].expire(None) {
                Err(Error::Redis(_)) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                other => break other,
            }
        };
        if owners[i] == victim {
            assert!(matches!(renewal, Err(Error::Expired)), "{k}: {renewal:?}");
            let g = other
                .try_lock_with_lease(k, Duration::from_secs(30))
                .unwrap();
            assert!(g.is_some(), "{k} is free after its master restarted empty");
        } else {
            renewal.unwrap();
            assert!(other.is_locked(k).unwrap());
            held[i].unlock().unwrap();
        }
    }
    assert!(
        other
            .holders()
            .unwrap()
            .iter()
            .all(|h| h.pid == Some(std::process::id())),
        "only this process's holds are left"
    );
}

/// On a Cluster every name of a lock (the key, its fence counter, its channel, its marks)
/// must hash to one slot, through the hash tag `{KEY}` that the lock's names share: a key
/// starting with `}`, or a prefix whose first braces are `{}`, would leave that tag empty
/// and spread the names over slots. Such keys are refused with `InvalidKey` by every call
/// that takes a key, before anything is sent (not with a CROSSSLOT error half-way, nor
/// granted); other braces in keys are fine; on a single server the same keys work.
#[test]
fn cluster_refuses_keys_that_would_empty_their_hash_tag() {
    fn invalid<T>(got: Result<T, Error>) -> bool {
        matches!(got, Err(Error::InvalidKey { .. }))
    }
    let round_trip = |redis: &RedisLocks, key: &str| -> Result<u64, Error> {
        let g = redis.lock(key, lease(Duration::from_secs(5)))?;
        let token = g.try_token()?;
        g.unlock()?;
        Ok(token)
    };
    let cluster = ClusterSetup::start();
    let redis = RedisLocks::open_cluster(&cluster.urls()).unwrap();
    let prefixed = redis.with_prefix("app{}");
    for (redis, key) in [(&redis, "}abc"), (&redis, "}"), (&prefixed, "k")] {
        assert!(
            invalid(redis.lock(key, lease(Duration::from_secs(5)))),
            "{key:?}"
        );
        assert!(invalid(
            redis.try_lock_with_lease(key, Duration::from_secs(5))
        ));
        assert!(invalid(redis.is_locked(key)));
        assert!(invalid(redis.force_unlock(key)));
        assert!(invalid(
            Lock::new(redis, LockOptions::default()).unwrap().lock(key)
        ));
        #[cfg(feature = "tokio")]
        assert!(invalid(
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(redis.lock_async(key, &LockOptions::default()))
        ));
    }
    assert!(
        redis.holders().unwrap().is_empty(),
        "a refused key was taken"
    );
    for key in ["a}b", "{x}", "x{", "k"] {
        round_trip(&redis, key).unwrap();
    }
    let single = common::redis_server::RedisServer::start();
    let single = RedisLocks::open(&single.url()).unwrap();
    round_trip(&single, "}abc").unwrap();
    round_trip(&single.with_prefix("app{}"), "k").unwrap();
}

/// A Cluster master that stops answering (SIGSTOP) makes a call on its keys fail with
/// the documented timeout (`did not answer within`, `is_timeout`), as on one server: it
/// was the socket's raw `Resource temporarily unavailable (os error 11)`.
#[test]
fn a_silent_cluster_master_is_a_named_timeout() {
    let cluster = ClusterSetup::start();
    let redis = RedisLocks::open_cluster(&cluster.urls())
        .unwrap()
        .with_timeout(Duration::from_millis(300));
    round_trip_once(&redis, "silent");
    let node = &cluster.nodes[cluster.node_of("shmlock:{silent}")];
    node.pause(true);
    let got = redis.try_lock_with_lease("silent", Duration::from_secs(5));
    node.pause(false);
    match got {
        Err(Error::Redis(e)) => {
            assert!(e.is_timeout(), "{e}");
            assert!(e.to_string().contains("did not answer within"), "{e}");
        }
        other => panic!("{:?}", other.map(|g| g.is_some())),
    }
    // a node given as a single server holds only its own slots' keys: refused at open,
    // naming what to do (`holders` there listed none of the others' and found none held)
    let node_url = cluster.urls()[0].clone();
    let msg = RedisLocks::open(&node_url)
        .map(drop)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("is a node of a Redis Cluster") && msg.contains("open_cluster"),
        "{msg}"
    );
}

/// A Cluster master that accepts connections and answers nothing (SIGSTOP) costs its own
/// keys their deadline and nothing else, sync and async: `open_cluster` with it as the
/// first node, a wait on its key within the wait's timeout, and the other masters' keys
/// taken at once, before and after a request to it timed out; once it runs again, its
/// keys are taken as before, and `holders` fails naming it. (With redis-rs's cluster connection, which checked every
/// master with a `PING` that had no time limit: `open_cluster` took 10.2 s, a 500 ms wait
/// 41 s, and calls on the healthy masters' keys failed.)
#[test]
fn a_stopped_cluster_master_costs_its_own_keys_their_deadline_and_nothing_else() {
    let cluster = ClusterSetup::start();
    for n in &cluster.nodes {
        // (else the other masters refuse every key once the cluster marks it failed)
        n.cli(&["CONFIG", "SET", "cluster-require-full-coverage", "no"]);
    }
    let victim = cluster.node_of("shmlock:{silent}");
    let healthy: Vec<String> = (0..)
        .map(|i| format!("k{i}"))
        .filter(|k| cluster.node_of(&format!("shmlock:{{{k}}}")) != victim)
        .take(4)
        .collect();
    let mut urls = cluster.urls();
    urls.swap(0, victim);
    let timeout = Duration::from_secs(1);
    let before = RedisLocks::open_cluster(&urls)
        .unwrap()
        .with_timeout(timeout);
    round_trip_once(&before, "silent");
    for k in &healthy {
        round_trip_once(&before, k);
    }

    cluster.nodes[victim].pause(true);
    let t = Instant::now();
    let opened = RedisLocks::open_cluster(&urls);
    let open_took = t.elapsed();
    let after = opened.map(|r| r.with_timeout(timeout));
    let wait = LockOptions {
        exptime: Duration::from_secs(5),
        timeout: Duration::from_millis(500),
        ..LockOptions::default()
    };
    let victim_port = cluster.nodes[victim].port.to_string();
    let stopped_key_fails_in_time = |got: Result<(), Error>, took: Duration| {
        match got {
            Err(Error::Timeout { .. }) => {}
            Err(Error::Redis(e)) => assert!(e.to_string().contains(&victim_port), "{e}"),
            other => panic!("the stopped master's key: {other:?}"),
        }
        assert!(took < Duration::from_millis(2500), "{took:?}");
    };
    let mut checked = 0;
    for redis in [Ok(&before), after.as_ref()] {
        let redis = redis.unwrap_or_else(|e| panic!("open_cluster: {e}"));
        let t = Instant::now();
        let got = redis.lock("silent", wait).map(drop);
        stopped_key_fails_in_time(got, t.elapsed());
        for k in &healthy {
            let g = redis
                .try_lock_with_lease(k, Duration::from_secs(5))
                .unwrap();
            g.expect("a healthy master's key is free").unlock().unwrap();
            checked += 1;
        }
        #[cfg(feature = "tokio")]
        {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let t = Instant::now();
                let got = redis.lock_async("silent", &wait).await.map(drop);
                stopped_key_fails_in_time(got, t.elapsed());
                for k in &healthy {
                    let g = redis.lock_async(k, &wait).await.unwrap();
                    g.unlock().unwrap();
                    checked += 1;
                }
            });
        }
    }
    // a thread waiting (with steps of 2 s) on a handle opened with the stopped master
    // first is woken by the release (it listened on a seed chosen in turn)
    let sync_fresh = RedisLocks::open_cluster(&urls)
        .unwrap()
        .with_timeout(timeout);
    for _ in 0..3 {
        let waited = wait_for_release(&before, &sync_fresh, &healthy[1]);
        assert!(
            waited < Duration::from_millis(1500),
            "{waited:?}: not woken"
        );
    }
    // a handle opened with the stopped master first, whose first calls are async: it
    // takes the healthy masters' keys at once, and a task waiting for one of them (with
    // steps of 2 s) is woken by its release (it listened on the first seed only)
    #[cfg(feature = "tokio")]
    {
        let fresh = RedisLocks::open_cluster(&urls)
            .unwrap()
            .with_timeout(timeout);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            for k in &healthy {
                let g = fresh.lock_async(k, &wait).await.unwrap();
                g.unlock().unwrap();
            }
        });
        let held = before
            .lock(&healthy[0], lease(Duration::from_secs(5)))
            .unwrap();
        let long_steps = LockOptions {
            exptime: Duration::from_secs(5),
            timeout: Duration::from_secs(5),
            step: Duration::from_secs(2),
            max_step: Duration::from_secs(2),
            ..LockOptions::default()
        };
        let waited = std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(300));
                held.unlock().unwrap();
            });
            rt.block_on(async {
                let g = fresh.lock_async(&healthy[0], &long_steps).await.unwrap();
                let waited = g.elapsed();
                g.unlock().unwrap();
                waited
            })
        });
        assert!(
            waited < Duration::from_millis(1500),
            "{waited:?}: not woken"
        );
    }
    // listing the holders asks every master: the stopped one fails it, named (its holds
    // were left out, and "0 locks held" said, when the listing skipped masters flagged
    // failed)
    eventually(
        "the cluster flags the master failed",
        Duration::from_secs(10),
        || {
            cluster.nodes[(victim + 1) % 3]
                .cli(&["CLUSTER", "NODES"])
                .lines()
                .any(|l| l.contains(&format!(":{victim_port}@")) && l.contains("fail"))
        },
    );
    match before.holders() {
        Err(Error::Redis(e)) => assert!(e.to_string().contains(&victim_port), "{e}"),
        other => panic!("holders with a master stopped: {other:?}"),
    }
    cluster.nodes[victim].pause(false);
    assert!(
        open_took < Duration::from_secs(5),
        "open_cluster: {open_took:?}"
    );
    assert!(checked >= 2 * healthy.len());
    for redis in [&before, after.as_ref().unwrap()] {
        eventually(
            "the master's key taken again",
            Duration::from_secs(10),
            || {
                redis
                    .lock("silent", lease(Duration::from_secs(5)))
                    .is_ok_and(|g| g.unlock().is_ok())
            },
        );
    }
}

/// A slot that moves to another master after a handle read the slot map: its `MOVED`
/// reply is followed (and the map read again). While a slot migrates, the old master's
/// `ASK` for keys it lacks is followed with `ASKING` (the new one then answers `TRYAGAIN`,
/// as Redis answers a request on several keys of a migrating slot: without `ASKING` it
/// would have sent the request back), and a wait goes on through it and takes the key
/// once the migration ends. Sync and async.
#[test]
fn a_slot_moved_or_migrating_is_followed() {
    let cluster = ClusterSetup::start();
    let redis = RedisLocks::open_cluster(&cluster.urls()).unwrap();
    let holder_node = |key: &str| {
        let g = redis.lock(key, lease(Duration::from_secs(30))).unwrap();
        let node = redis
            .holders()
            .unwrap()
            .into_iter()
            .find(|h| h.key == key.as_bytes())
            .map(|h| h.node);
        g.unlock().unwrap();
        node.unwrap_or_else(|| panic!("{key} held but not listed"))
    };
    let id = |i: usize| {
        cluster.nodes[i]
            .cli(&["CLUSTER", "MYID"])
            .trim()
            .to_string()
    };
    let port = |i: usize| format!("127.0.0.1:{}", cluster.nodes[i].port);
    for (key, migrating) in [("moved", false), ("asked", true)] {
        let from = cluster.node_of(&format!("shmlock:{{{key}}}"));
        let to = (from + 1) % 3;
        assert_eq!(holder_node(key), port(from));
        let slot = cluster.nodes[0].cli(&["CLUSTER", "KEYSLOT", &format!("shmlock:{{{key}}}")]);
        let slot = slot.trim().to_string();
        cluster.nodes[to].cli(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &id(from)]);
        cluster.nodes[from].cli(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &id(to)]);
        let move_slot = || {
            for n in &cluster.nodes {
                n.cli(&["CLUSTER", "SETSLOT", &slot, "NODE", &id(to)]);
            }
        };
        if migrating {
            match redis.try_lock_with_lease(key, Duration::from_secs(30)) {
                Err(Error::Redis(e)) => assert_eq!(e.code(), Some("TRYAGAIN"), "{e}"),
                other => panic!(
                    "{key} while its slot migrates: {:?}",
                    other.map(|g| g.is_some())
                ),
            }
            // a wait the migration outlasts ends with `Timeout` (the server kept saying
            // to try again: it said TryAgain, an error)
            let short = LockOptions {
                timeout: Duration::from_millis(300),
                ..LockOptions::default()
            };
            let got = redis.lock(key, short).map(drop);
            assert!(matches!(got, Err(Error::Timeout { .. })), "{got:?}");
            let opts = LockOptions {
                exptime: Duration::from_secs(30),
                timeout: Duration::from_secs(10),
                ..LockOptions::default()
            };
            // (the clock starts before the moving thread does: a wait cannot seem short)
            let t = Instant::now();
            let waited = std::thread::scope(|s| {
                s.spawn(|| {
                    std::thread::sleep(Duration::from_millis(300));
                    move_slot();
                });
                // (the wait, or the attempt's own pauses on TRYAGAIN, last until the
                // migration ends)
                let g = redis.lock(key, opts).unwrap();
                let waited = t.elapsed();
                g.unlock().unwrap();
                waited
            });
            assert!(waited >= Duration::from_millis(250), "{waited:?}");
        } else {
            move_slot();
        }
        assert_eq!(holder_node(key), port(to), "{key}");
        #[cfg(feature = "tokio")]
        async_round_trip(&redis, key);
        let fresh = RedisLocks::open_cluster(&cluster.urls()).unwrap();
        let g = fresh.lock(key, lease(Duration::from_secs(30))).unwrap();
        assert!(
            redis.is_locked(key).unwrap(),
            "{key}: one hold, seen through both"
        );
        g.unlock().unwrap();
    }
}

fn round_trip_once(redis: &RedisLocks, key: &str) {
    let g = redis.lock(key, lease(Duration::from_secs(5))).unwrap();
    g.unlock().unwrap();
}

/// `open_cluster` given a server without cluster support fails at once, saying so, as
/// `open` does of a wrong address: it returned a handle whose every call failed.
#[test]
fn open_cluster_on_a_plain_server_says_so_at_once() {
    let single = common::redis_server::RedisServer::start();
    match RedisLocks::open_cluster(&[single.url()]) {
        Err(Error::Redis(e)) => {
            let said = e.to_string();
            assert!(
                said.contains("not a Redis Cluster node")
                    && said.contains("cluster support disabled"),
                "{said}"
            );
        }
        Err(e) => panic!("not a Redis error: {e}"),
        Ok(_) => panic!("open_cluster accepted a plain server"),
    }
}

/// lock_async, a token and the release of the dropped guard, on a runtime of its own.
#[cfg(feature = "tokio")]
fn async_round_trip(redis: &RedisLocks, key: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let g = redis
            .lock_async(key, &LockOptions::default())
            .await
            .unwrap();
        assert!(g.token().unwrap() >= 1);
        g.unlock().unwrap();
    });
    assert!(!redis.is_locked(key).unwrap());
}

/// `holder` takes `key` and releases it after 100 ms while a thread of `waiter` waits
/// with 2 s steps: how long the waiter waited.
fn wait_for_release(holder: &RedisLocks, waiter: &RedisLocks, key: &str) -> Duration {
    let held = holder.lock(key, LockOptions::default()).unwrap();
    std::thread::scope(|s| {
        let w = s.spawn(|| {
            let opts = LockOptions {
                step: Duration::from_secs(2),
                max_step: Duration::from_secs(2),
                ..LockOptions::default()
            };
            let g = waiter.lock(key, opts).unwrap();
            let waited = g.elapsed();
            g.unlock().unwrap();
            waited
        });
        std::thread::sleep(Duration::from_millis(100));
        held.unlock().unwrap();
        w.join().unwrap()
    })
}

#[cfg(all(feature = "redis-tls", feature = "tokio"))]
#[test]
fn tls_with_a_self_signed_certificate_authority() {
    let tls = common::redis_server::TlsSetup::start();
    let redis = RedisLocks::open_with_root_cert(&tls.url(), &tls.ca_pem).unwrap();
    let mut lock = Lock::new(&redis, LockOptions::default()).unwrap();
    lock.lock("secure").unwrap();
    let token = lock.try_token().unwrap();
    assert_eq!(redis.holders().unwrap()[0].token, Some(token));
    assert!(redis
        .try_lock_with_lease("secure", Duration::from_secs(1))
        .unwrap()
        .is_none());
    lock.unlock().unwrap();
    // async over TLS too
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let g = redis
            .lock_async("secure", &LockOptions::default())
            .await
            .unwrap();
        assert!(g.token().unwrap() > token);
        g.unlock().unwrap();
    });
    // a certificate nobody vouches for, plain text on a TLS port, a wrong password:
    // typed errors at open
    let untrusted = RedisLocks::open(&tls.url());
    assert!(
        matches!(untrusted, Err(Error::Redis(_))),
        "untrusted CA accepted"
    );
    let plain = RedisLocks::open(&format!(
        "redis://:{}@127.0.0.1:{}/",
        tls.password, tls.server.port
    ));
    assert!(matches!(plain, Err(Error::Redis(_))));
    let wrong = RedisLocks::open_with_root_cert(
        &format!("rediss://:wrong@127.0.0.1:{}/", tls.server.port),
        &tls.ca_pem,
    );
    assert!(matches!(wrong, Err(Error::Redis(_))));
}

/// Read locks and semaphores on a Cluster (their keys share the lock's hash tag, so each
/// script runs on one master) and across a Sentinel failover with replicas required (the
/// promoted replica has every reader and permit holder, each still keeping a writer, or a
/// permit over the count, out).
#[test]
fn shared_holds_on_a_cluster_and_across_a_sentinel_failover() {
    // a Cluster: keys on every master
    let cluster = ClusterSetup::start();
    let urls = cluster.urls();
    let redis = RedisLocks::open_cluster(&urls).unwrap();
    let other = RedisLocks::open_cluster(&urls[1..]).unwrap();
    let keys: Vec<String> = (0..12).map(|i| format!("doc:{i}")).collect();
    let mut readers = Vec::new();
    for k in &keys {
        readers.push(
            redis
                .lock_shared(k, lease(Duration::from_secs(30)))
                .unwrap(),
        );
        readers.push(
            other
                .try_lock_shared(k, Duration::from_secs(30))
                .unwrap()
                .unwrap(),
        );
        assert!(other
            .try_lock_with_lease(k, Duration::from_secs(30))
            .unwrap()
            .is_none());
    }
    let owners: Vec<usize> = keys
        .iter()
        .map(|k| cluster.node_of(&format!("shmlock:{{{k}}}")))
        .collect();
    for n in 0..3 {
        assert!(owners.contains(&n), "no key on node {n}: {owners:?}");
    }
    let holders = other.holders().unwrap();
    assert_eq!(holders.len(), 2 * keys.len());
    for h in &holders {
        let i = keys.iter().position(|k| k.as_bytes() == h.key).unwrap();
        assert_eq!(h.mode, shmlock::HoldMode::Shared);
        assert_eq!(
            h.node,
            format!("127.0.0.1:{}", cluster.nodes[owners[i]].port)
        );
    }
    let sem = other.semaphore("gpu", 2).unwrap();
    let permits: Vec<_> = (0..2)
        .map(|_| sem.try_acquire(Duration::from_secs(30)).unwrap().unwrap())
        .collect();
    assert!(redis
        .semaphore("gpu", 2)
        .unwrap()
        .try_acquire(Duration::from_secs(30))
        .unwrap()
        .is_none());
    assert!(matches!(
        redis
            .semaphore("gpu", 3)
            .unwrap()
            .try_acquire(Duration::from_secs(30)),
        Err(Error::PermitsMismatch {
            held: 2,
            asked: 3,
            ..
        })
    ));
    drop(permits);
    assert!(other.force_unlock(&keys[0]).unwrap());
    assert!(redis
        .try_lock_with_lease(&keys[0], Duration::from_secs(30))
        .unwrap()
        .is_some());
    drop(readers);
    drop(cluster);

    // Sentinel, replicas required
    let setup = SentinelSetup::start();
    let urls = setup.sentinel_urls();
    // (2 s for the acknowledgements: a loaded machine can keep a replica's past 500 ms)
    let redis = RedisLocks::open_sentinel(MASTER_NAME, &urls)
        .unwrap()
        .with_replicas(2, Duration::from_secs(2));
    // a lease well past a failover (one took 8.4 s here, so an 8 s lease once left no
    // holder on the promoted master to list)
    let exptime = Duration::from_secs(30);
    let r1 = redis.lock_shared("k", lease(exptime)).unwrap();
    let r2 = redis.lock_shared("k", lease(exptime)).unwrap();
    let sem = redis.semaphore("s", 1).unwrap();
    let p = sem.acquire(lease(exptime)).unwrap();
    let taken = Instant::now();
    let old = setup.master.port;
    let mut master = setup.master;
    master.stop(); // SIGKILL
    let new = await_failover(&setup.sentinels, old);
    assert_ne!(new, old);
    let failover = taken.elapsed();
    println!("failover after {failover:?}");
    assert!(
        failover + Duration::from_secs(5) < exptime,
        "the failover took {failover:?} of the {exptime:?} lease"
    );
    let other = RedisLocks::open_sentinel(MASTER_NAME, &urls).unwrap();
    let mut modes: Vec<_> = other
        .holders()
        .unwrap()
        .iter()
        .map(|h| (h.key.clone(), h.mode))
        .collect();
    modes.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        modes,
        vec![
            (b"k".to_vec(), shmlock::HoldMode::Shared),
            (b"k".to_vec(), shmlock::HoldMode::Shared),
            (b"s".to_vec(), shmlock::HoldMode::Permit { permits: 1 }),
        ]
    );
    // for two seconds of the leases left, nobody else gets in
    let mut checks = 0;
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        assert!(
            other.try_lock_with_lease("k", exptime).unwrap().is_none(),
            "a writer beside readers after the failover"
        );
        assert!(
            other
                .semaphore("s", 1)
                .unwrap()
                .try_acquire(exptime)
                .unwrap()
                .is_none(),
            "a second permit of one"
        );
        checks += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(checks > 0);
    drop((r1, r2, p));
}

/// Every sentinel down while the master is healthy: a try says which sentinel it could not
/// reach, and a wait goes on through their refusals until they answer again (it ended at
/// once with a bare "Connection refused", as no other connection error ends a wait); a data
/// server given as a sentinel is said not to be one (it was "no sentinel knows a master
/// named", sending the user after the name).
#[test]
fn unreachable_sentinels_are_named_and_a_wait_goes_on_through_them() {
    let mut setup = SentinelSetup::start();
    let redis = RedisLocks::open_sentinel(MASTER_NAME, &setup.sentinel_urls()).unwrap();
    round_trip_once(&redis, "warm");
    // the async connection made while the sentinels answer
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(redis.lock_async("warm-async", LockOptions::default()))
        .map(drop)
        .unwrap();
    for s in &mut setup.sentinels {
        s.stop();
    }
    // past the time a watcher's last word vouches for the master: grants ask the sentinels
    std::thread::sleep(Duration::from_millis(1500));
    let tried = redis.try_lock_with_lease("k", Duration::from_secs(30));
    let msg = match &tried {
        Err(Error::Redis(e)) => e.to_string(),
        other => panic!("{:?}", other.as_ref().map(|g| g.is_some())),
    };
    let ports: Vec<String> = setup.sentinels.iter().map(|s| s.port.to_string()).collect();
    assert!(
        msg.contains("sentinel 127.0.0.1:") && ports.iter().any(|p| msg.contains(p.as_str())),
        "{msg}"
    );
    assert!(
        !redis.is_locked("k").unwrap(),
        "the unvouched grant was given back"
    );
    // async: the grant is given back on the connection that took it (the janitor, which
    // needs a sentinel to find the master, left it held: the wait then timed out on the
    // process's own hold, and without a lease the key stayed held for ever)
    let short = LockOptions {
        timeout: Duration::from_millis(700),
        exptime: Duration::ZERO,
        ..LockOptions::default()
    };
    let got = rt.block_on(redis.lock_async("ak", short)).map(drop);
    assert!(matches!(&got, Err(Error::Redis(_))), "{got:?}");
    assert!(
        !redis.is_locked("ak").unwrap(),
        "the unvouched async grant was given back"
    );
    let started = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_secs(1));
            for sentinel in &mut setup.sentinels {
                sentinel.restart();
            }
        });
        let wait = LockOptions {
            timeout: Duration::from_secs(10),
            ..LockOptions::default()
        };
        let guard = redis.lock("k", wait);
        assert!(
            guard.is_ok(),
            "{:?} after {:?}",
            guard.err(),
            started.elapsed()
        );
    });
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    let not_a_sentinel = RedisLocks::open_sentinel(MASTER_NAME, &[setup.master.url()]);
    let msg = not_a_sentinel.map(drop).unwrap_err().to_string();
    assert!(msg.contains("is not a sentinel"), "{msg}");
    // and a sentinel given as a data server is said to be none ("unknown command 'TIME'")
    let msg = RedisLocks::open(&setup.sentinels[0].url())
        .map(drop)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("not a Redis data server"), "{msg}");
}
