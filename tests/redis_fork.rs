//! A Redis handle opened before `fork()`, as prefork servers open theirs: every child makes
//! connections of its own (never reading replies meant for another process), a guard or
//! lock object copied into a child never releases its parent's hold, and what runs on a
//! handle's threads (the janitor's releases, the sentinel watchers) runs anew in a child,
//! and nothing made once per process (the host name) makes a child wait for a thread of
//! its parent.
//!
//! Guards `src/per_process.rs`, `src/redis_store/conn.rs`, `aio.rs`, `janitor.rs` and
//! `sentinel.rs`, and `src/lock/api.rs`'s fork check. Its own small harness
//! (`harness = false`), so that `fork` copies a process with no test threads in it;
//! `redis_fork FILTER` runs the tests whose name contains FILTER.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::fork::{fork, Gate, Shared};
use common::redis_server::{RedisServer, SentinelSetup, MASTER_NAME};
use shmlock::{Error, Lock, LockOptions, RedisLocks, SharedDict, Source};

const CHILD_LIMIT: Duration = Duration::from_secs(30);

/// 30 rounds of 4 children each trying a fresh key at once through the parent's handle
/// (which holds idle connections made before the fork): exactly one is granted each key,
/// and nobody sees an error.
fn a_handle_opened_before_fork_grants_each_key_to_one_child() {
    const ROUNDS: usize = 30;
    const CHILDREN: usize = 4;
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    for _ in 0..3 {
        redis
            .lock("warm", LockOptions::default())
            .unwrap()
            .unlock()
            .unwrap();
    }
    // per round: grants, errors
    let counts = Shared::new(2 * ROUNDS);
    for round in 0..ROUNDS {
        let key = format!("k{round}");
        let mut gate = Gate::new();
        let children: Vec<_> = (0..CHILDREN)
            .map(|_| {
                fork(|| {
                    gate.wait();
                    match redis.try_lock_with_lease(&key, Duration::from_secs(30)) {
                        Ok(Some(g)) => {
                            counts.word(2 * round).fetch_add(1, Ordering::SeqCst);
                            g.leave_to_expire(); // stays held after this child exits
                        }
                        Ok(None) => {}
                        Err(_) => {
                            counts.word(2 * round + 1).fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    0
                })
            })
            .collect();
        gate.open();
        for c in children {
            assert_eq!(c.wait(CHILD_LIMIT), 0);
        }
    }
    let grants: Vec<u64> = (0..ROUNDS)
        .map(|r| counts.word(2 * r).load(Ordering::SeqCst))
        .collect();
    let errors: u64 = (0..ROUNDS)
        .map(|r| counts.word(2 * r + 1).load(Ordering::SeqCst))
        .sum();
    assert!(
        grants.iter().all(|&g| g == 1),
        "grants per round: {grants:?}"
    );
    assert_eq!(errors, 0);
    // the parent's handle still works, on connections of its own
    assert!(redis.is_locked("k0").unwrap());
    redis
        .lock("after", LockOptions::default())
        .unwrap()
        .unlock()
        .unwrap();
}

/// A guard and a lock object copied into a child are the parent's: dropping the guard
/// there releases nothing, unlocking the object says `NotOwner`.
fn a_guard_copied_into_a_child_never_releases_its_parents_hold() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    let mut guard = Some(redis.lock("g", LockOptions::default()).unwrap());
    let mut lock = Lock::new(&redis, LockOptions::default()).unwrap();
    lock.lock("l").unwrap();
    let mut lock = Some(lock);
    let child = fork(|| {
        drop(guard.take());
        let mut copy = lock.take().unwrap();
        let refused = matches!(copy.unlock(), Err(Error::NotOwner));
        drop(copy);
        i32::from(!refused)
    });
    assert_eq!(
        child.wait(CHILD_LIMIT),
        0,
        "the child's unlock was not NotOwner"
    );
    assert!(redis.is_locked("g").unwrap());
    assert!(redis.is_locked("l").unwrap());
    guard.take().unwrap().unlock().unwrap();
    lock.take().unwrap().unlock().unwrap();
}

/// The stampede recipe across forked workers, with the lock in Redis through a handle the
/// parent opened: one worker fetches, the others find the value it stored.
fn get_or_fetch_through_a_handle_opened_before_fork_fetches_once() {
    const WORKERS: usize = 4;
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    let path = common::TempPath::new("fork-dict");
    let cache = SharedDict::open(&path, 64, 64).unwrap();
    // fetches, then per source: Cache, Filled, Fetched
    let counts = Shared::new(4);
    let mut gate = Gate::new();
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            fork(|| {
                gate.wait();
                let got = cache
                    .get_or_fetch(&redis, "item", Duration::from_secs(60), || {
                        counts.word(0).fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(300));
                        Ok::<_, Error>(b"value".to_vec())
                    })
                    .unwrap();
                let i = match got.source {
                    Source::Cache => 1,
                    Source::Filled => 2,
                    Source::Fetched => 3,
                };
                counts.word(i).fetch_add(1, Ordering::SeqCst);
                0
            })
        })
        .collect();
    gate.open();
    for w in workers {
        assert_eq!(w.wait(CHILD_LIMIT), 0);
    }
    let read = |i| counts.word(i).load(Ordering::SeqCst);
    assert_eq!(read(0), 1, "fetches");
    assert_eq!(read(3), 1, "workers that fetched");
    assert_eq!(read(1) + read(2), WORKERS as u64 - 1);
}

/// A child of a process whose handle already runs its janitor thread (a guard dropped in a
/// runtime) drops a guard in a runtime of its own: its own janitor releases it.
#[cfg(feature = "tokio")]
fn a_childs_releases_run_on_a_janitor_of_its_own() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let released = |key: &str| {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while redis.is_locked(key).unwrap() {
            if std::time::Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    };
    runtime().block_on(async {
        drop(redis.lock_async("p", LockOptions::default()).await.unwrap());
    });
    assert!(released("p"));
    let child = fork(|| {
        runtime().block_on(async {
            drop(redis.lock_async("c", LockOptions::default()).await.unwrap());
        });
        i32::from(!released("c"))
    });
    assert_eq!(
        child.wait(CHILD_LIMIT),
        0,
        "the child's dropped guard was not released"
    );
}

/// A process that drops its guards inside a runtime and then exits at once (as an async
/// `main` does when it returns; here `std::process::exit`, which runs the `atexit`
/// handlers): the releases handed to the handle's janitor are done before the process is
/// gone, so nobody finds the keys held afterwards, though their leases never expire. Once
/// with the handle still open at the exit, once with it dropped first.
#[cfg(feature = "tokio")]
fn guards_dropped_in_a_runtime_are_released_before_the_process_exits() {
    let server = RedisServer::start();
    let url = server.url();
    let forever = LockOptions {
        exptime: Duration::ZERO,
        ..LockOptions::default()
    };
    for drop_handle in [false, true] {
        let child = fork(|| {
            let redis = RedisLocks::open(&url).unwrap();
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let _guard = redis.lock_async("guard", &forever).await.unwrap();
                // a synchronous lock object in async code (a `#[tokio::main]` function)
                let mut object = Lock::new(&redis, forever).unwrap();
                object.lock("object").unwrap();
            }); // both dropped in the runtime: released by the janitor
            drop(runtime);
            if drop_handle {
                drop(redis);
            }
            std::process::exit(0)
        });
        assert_eq!(child.wait(CHILD_LIMIT), 0);
        let check = RedisLocks::open(&url).unwrap();
        let held: Vec<&str> = ["guard", "object"]
            .into_iter()
            .filter(|k| check.is_locked(k).unwrap())
            .collect();
        assert!(
            held.is_empty(),
            "held after the process exited (handle dropped first: {drop_handle}): {held:?}"
        );
    }
}

/// Children of a process with a Sentinel handle (and its watcher threads) lock one key in
/// turn through it: one holder at a time, no errors.
fn sentinel_handles_work_in_forked_children() {
    const CHILDREN: usize = 3;
    const ROUNDS: u64 = 20;
    let setup = SentinelSetup::start();
    let redis = RedisLocks::open_sentinel(MASTER_NAME, &setup.sentinel_urls()).unwrap();
    redis
        .lock("warm", LockOptions::default())
        .unwrap()
        .unlock()
        .unwrap();
    // inside, overlaps, rounds done
    let counts = Shared::new(3);
    let mut gate = Gate::new();
    let children: Vec<_> = (0..CHILDREN)
        .map(|_| {
            fork(|| {
                gate.wait();
                let wait = LockOptions {
                    timeout: Duration::from_secs(20),
                    ..LockOptions::default()
                };
                for _ in 0..ROUNDS {
                    let g = redis.lock("turn", wait).unwrap();
                    if counts.word(0).fetch_add(1, Ordering::SeqCst) != 0 {
                        counts.word(1).fetch_add(1, Ordering::SeqCst);
                    }
                    std::thread::sleep(Duration::from_millis(2));
                    counts.word(0).fetch_sub(1, Ordering::SeqCst);
                    g.unlock().unwrap();
                    counts.word(2).fetch_add(1, Ordering::SeqCst);
                }
                0
            })
        })
        .collect();
    gate.open();
    for c in children {
        assert_eq!(c.wait(Duration::from_secs(60)), 0);
    }
    assert_eq!(
        counts.word(1).load(Ordering::SeqCst),
        0,
        "overlapping holds"
    );
    assert_eq!(
        counts.word(2).load(Ordering::SeqCst),
        CHILDREN as u64 * ROUNDS
    );
}

/// A wait on Redis that runs out says who held the key: the holder's pid and host (a
/// forked child here) and how long it had held it, with notify, when polling, for a try
/// of zero timeout, and for async tasks, including those queued behind another task of
/// their process (which never asked the server themselves).
fn a_timeout_names_the_holder_in_another_process() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    // (before the child's hold: an upper bound of how long it was held, however late
    // the parent wakes)
    let since = std::time::Instant::now();
    let held = Gate::new();
    let mut proceed = Gate::new();
    let child = {
        let (redis, held, proceed) = (&redis, &held, &mut proceed);
        fork(move || {
            let _g = redis
                .lock("k", LockOptions::default())
                .expect("the child takes the key");
            held.signal();
            proceed.wait();
            0
        })
    };
    held.await_signals(1);
    let host = nix::unistd::gethostname().unwrap().into_string().unwrap();
    let check = |err: &Error, timeout_ms: u64| {
        let Error::Timeout {
            holder: Some(h), ..
        } = err
        else {
            panic!("no holder in {err:?}");
        };
        assert_eq!(h.pid, Some(child.0 as u32), "{err}");
        assert_eq!(h.host.as_deref(), Some(host.as_str()), "{err}");
        assert!(!h.this_process, "{err}");
        let held_for = h.held_for.expect("how long");
        // the holder's clock and the server's are this machine's: within 50 ms
        assert!(
            held_for + Duration::from_millis(50) >= Duration::from_millis(timeout_ms)
                && held_for <= since.elapsed() + Duration::from_millis(50),
            "{held_for:?} {err}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("held by pid {} on {host} for ", child.0)),
            "{msg}"
        );
    };
    for (timeout_ms, notify) in [(100, true), (100, false), (0, true)] {
        let o = LockOptions {
            notify,
            timeout: Duration::from_millis(timeout_ms),
            ..LockOptions::default()
        };
        check(&redis.lock("k", o).unwrap_err(), timeout_ms);
    }
    #[cfg(feature = "tokio")]
    {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let o = LockOptions {
            timeout: Duration::from_millis(150),
            ..LockOptions::default()
        };
        let (a, b, c) = rt.block_on(async {
            tokio::join!(
                redis.lock_async("k", &o),
                redis.lock_async("k", &o),
                redis.lock_async("k", &o)
            )
        });
        for r in [a, b, c] {
            check(&r.map(drop).unwrap_err(), 150);
        }
    }
    proceed.open();
    assert_eq!(child.wait(CHILD_LIMIT), 0);
}

/// A child forked while another thread of its parent reads the host name for its first hold
/// (once per process: what the hold's value names) takes a lock: gdb holds that thread in
/// `uname`, inside the read, and lets only the main thread run, which forks.
fn a_child_forked_while_its_parent_names_its_host_can_lock() {
    let server = RedisServer::start();
    let out = common::forking::held_fork(
        "fork_while_naming_host",
        &[&server.url()],
        &["catch syscall uname".to_string()],
        "the first hold's host name",
    );
    assert_eq!(out, "child exited 0", "the child forked mid-naming");
}

fn role_fork_while_naming_host(url: &str, flags: &std::path::Path) -> i32 {
    use common::forking::{announce, await_flag, report_child};
    let redis = RedisLocks::open(url).unwrap();
    // Thread A makes the process's first hold when told; gdb stops it inside.
    let (r, f) = (redis.clone(), flags.to_path_buf());
    std::thread::spawn(move || {
        await_flag(&f, "go");
        drop(r.try_lock_with_lease("A", Duration::from_secs(5)));
    });
    announce(flags);
    await_flag(flags, "fork");
    // SAFETY: a threaded fork; the child takes a lock, which is what is tested, then
    // leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let rc = match redis.try_lock_with_lease("K", Duration::from_secs(5)) {
            Ok(Some(g)) => {
                g.leave_to_expire();
                0
            }
            Ok(None) => 3,
            Err(_) => 4,
        };
        // SAFETY: leaving the child without running the parent's exit handlers.
        unsafe { libc::_exit(rc) };
    }
    report_child(pid, Duration::from_secs(10));
    // Thread A is still held by gdb: leave without joining it.
    // SAFETY: ending the process (every thread) at once.
    unsafe { libc::_exit(0) }
}

fn main() {
    common::harness::main(
        "redis_fork",
        &[
            (
                "a_timeout_names_the_holder_in_another_process",
                a_timeout_names_the_holder_in_another_process,
            ),
            (
                "a_handle_opened_before_fork_grants_each_key_to_one_child",
                a_handle_opened_before_fork_grants_each_key_to_one_child,
            ),
            (
                "a_guard_copied_into_a_child_never_releases_its_parents_hold",
                a_guard_copied_into_a_child_never_releases_its_parents_hold,
            ),
            (
                "get_or_fetch_through_a_handle_opened_before_fork_fetches_once",
                get_or_fetch_through_a_handle_opened_before_fork_fetches_once,
            ),
            #[cfg(feature = "tokio")]
            (
                "a_childs_releases_run_on_a_janitor_of_its_own",
                a_childs_releases_run_on_a_janitor_of_its_own,
            ),
            #[cfg(feature = "tokio")]
            (
                "guards_dropped_in_a_runtime_are_released_before_the_process_exits",
                guards_dropped_in_a_runtime_are_released_before_the_process_exits,
            ),
            (
                "sentinel_handles_work_in_forked_children",
                sentinel_handles_work_in_forked_children,
            ),
            (
                "a_child_forked_while_its_parent_names_its_host_can_lock",
                a_child_forked_while_its_parent_names_its_host_can_lock,
            ),
        ],
        |args| match args.first().map(String::as_str) {
            Some("fork_while_naming_host") => {
                role_fork_while_naming_host(&args[1], std::path::Path::new(&args[2]))
            }
            _ => 2,
        },
    )
}
