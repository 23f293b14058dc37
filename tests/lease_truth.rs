//! A holder is told the truth about its hold: `keep_alive` says `Ok` only if the hold was
//! still its own, its lease unbroken, when the work returned. The attack: a holder takes
//! a key with a 1.5 s lease and runs 2.4 s of work under `keep_alive`; 0.7 s in it is
//! stopped (SIGSTOP, or its cgroup frozen) for 2.1 s; a waiter takes the key when the
//! lease runs out and holds it; the holder resumes with its work done and its renewal
//! overdue, and the work's thread often runs first (its end stops the renewals). Run on
//! the lock table and on Redis, with real processes.
//!
//! The work watches `KeepAlive::is_lost`, which must say lost when it resumes: its lease
//! could have lapsed meanwhile, whatever the renewer has done yet.
//!
//! A holder that asks for its fencing token after such a stop is refused it, though it had
//! one before.
//!
//! Guards `src/lock/api.rs` (`keep_alive`'s last look), the backends' `check`
//! (`src/shm/table/hold.rs`, `src/redis_store/ops.rs`). Its own small harness
//! (`harness = false`): `lease_truth FILTER` runs the tests whose name contains FILTER; the
//! cgroup tests need root and run with `--include-ignored`.

mod common;

use std::time::{Duration, Instant};

use common::fork::{fork, Gate, Shared};
use common::harness::Test;
use shmlock::{Backend, Error, Lock, LockOptions, LockTable};

const LEASE: Duration = Duration::from_millis(1500);
const WORK: Duration = Duration::from_millis(2400);
const STOP_AT: Duration = Duration::from_millis(700);
const STOPPED_FOR: Duration = Duration::from_millis(2100);
const ROUNDS: usize = 5;

/// How a process is held still and let go again.
trait Pause {
    fn hold(&self, pid: libc::pid_t);
    fn release(&self, pid: libc::pid_t);
}

struct Sigstop;

impl Pause for Sigstop {
    fn hold(&self, pid: libc::pid_t) {
        assert_eq!(common::signal::send(pid, libc::SIGSTOP), 0);
    }
    fn release(&self, pid: libc::pid_t) {
        assert_eq!(common::signal::send(pid, libc::SIGCONT), 0);
    }
}

/// A cgroup of its own for the holder, frozen and thawed: cgroup v2's `cgroup.freeze`
/// where the unified hierarchy has it, else v1's freezer.
struct Frozen {
    dir: std::path::PathBuf,
    v2: bool,
}

impl Frozen {
    fn new() -> Frozen {
        let name = format!("shmlock-test-{}", std::process::id());
        for (base, v2) in [
            ("/sys/fs/cgroup", true),
            ("/sys/fs/cgroup/unified", true),
            ("/sys/fs/cgroup/freezer", false),
        ] {
            let probe = if v2 {
                "cgroup.controllers"
            } else {
                "freezer.state"
            };
            let base = std::path::Path::new(base);
            let usable = if v2 {
                base.join(probe).exists()
            } else {
                base.join("tasks").exists()
            };
            if !usable {
                continue;
            }
            let dir = base.join(&name);
            let _ = std::fs::create_dir(&dir);
            if dir
                .join(if v2 { "cgroup.freeze" } else { "freezer.state" })
                .exists()
            {
                return Frozen { dir, v2 };
            }
            let _ = std::fs::remove_dir(&dir);
        }
        panic!("no cgroup freezer here (neither cgroup.freeze nor the v1 freezer)");
    }

    fn set(&self, frozen: bool) {
        let (file, value) = if self.v2 {
            ("cgroup.freeze", if frozen { "1" } else { "0" })
        } else {
            ("freezer.state", if frozen { "FROZEN" } else { "THAWED" })
        };
        std::fs::write(self.dir.join(file), value).unwrap();
    }
}

impl Pause for Frozen {
    fn hold(&self, pid: libc::pid_t) {
        let procs = if self.v2 { "cgroup.procs" } else { "tasks" };
        std::fs::write(self.dir.join(procs), pid.to_string()).unwrap();
        self.set(true);
    }
    fn release(&self, _pid: libc::pid_t) {
        self.set(false);
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        self.set(false);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// What the holder's `keep_alive` said, as a number in shared memory.
/// Added to [`code`]'s when the work saw `is_lost` turn true.
const SAW_LOST: u64 = 16;

fn code(r: &Result<(), Error>) -> u64 {
    match r {
        Ok(()) => 1,
        Err(Error::Expired) => 2,
        Err(_) => 3,
    }
}

/// The attack, `ROUNDS` times on `backend`: returns what the holder was told each time.
fn stopped_past_its_lease<B>(backend: &B, pause: &dyn Pause) -> Vec<u64>
where
    B: Backend + Sync,
    B::Hold: Send,
{
    let told = Shared::new(ROUNDS);
    for round in 0..ROUNDS {
        let key = format!("K{round}");
        let held = Gate::new();
        let holder = fork(|| {
            let opts = LockOptions {
                exptime: LEASE,
                timeout: Duration::ZERO,
                ..LockOptions::default()
            };
            let mut lock = Lock::new(backend, opts).unwrap();
            lock.lock(&key).unwrap();
            held.signal();
            // (the work watches its lease as it goes, and says how it ended)
            let (saw_lost, lease) = lock
                .keep_alive(|alive| {
                    let end = Instant::now() + WORK;
                    while Instant::now() < end && !alive.is_lost() {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    alive.is_lost()
                })
                .unwrap();
            let said = code(&lease) | if saw_lost { SAW_LOST } else { 0 };
            told.word(round)
                .store(said, std::sync::atomic::Ordering::SeqCst);
            0
        });
        held.await_signals(1);
        std::thread::sleep(STOP_AT);
        pause.hold(holder.0);
        let stopped = Instant::now();
        // the waiter takes the key once the holder's lease has run out
        let wait = LockOptions {
            exptime: Duration::from_secs(30),
            timeout: Duration::from_secs(10),
            ..LockOptions::default()
        };
        let mut waiter = Lock::new(backend, wait).unwrap();
        waiter.lock(&key).unwrap();
        assert!(stopped.elapsed() < STOPPED_FOR, "the key was free too late");
        std::thread::sleep(STOPPED_FOR.saturating_sub(stopped.elapsed()));
        pause.release(holder.0);
        assert_eq!(holder.wait(Duration::from_secs(30)), 0);
        waiter.unlock().unwrap();
    }
    (0..ROUNDS)
        .map(|r| told.word(r).load(std::sync::atomic::Ordering::SeqCst))
        .collect()
}

/// A holder takes a key and its fencing token, is stopped (SIGSTOP) past its lease while a
/// waiter takes the key, and asks for its token again when it resumes: it must be refused
/// (before, the table handed back the token it had, for a hold that was gone). Returns
/// what `try_token` said (1 the token, 2 Expired, 3 another error).
fn token_after_a_stop<B: Backend>(backend: &B) -> u64 {
    let told = Shared::new(1);
    let held = Gate::new();
    let opts = LockOptions {
        exptime: LEASE,
        timeout: Duration::ZERO,
        ..LockOptions::default()
    };
    let holder = fork(|| {
        let mut lock = Lock::new(backend, opts).unwrap();
        lock.lock("T").unwrap();
        let before = lock.try_token().unwrap();
        held.signal();
        // stopped here by the parent, past the lease
        std::thread::sleep(STOP_AT + STOPPED_FOR);
        let verdict = match lock.try_token() {
            Ok(t) if t == before => 1,
            Ok(_) => 3,
            Err(Error::Expired) => 2,
            Err(_) => 3,
        };
        let consistent = lock.token().is_none() == (verdict == 2)
            && matches!(lock.check(), Err(Error::Expired)) == (verdict == 2);
        told.word(0).store(
            if consistent { verdict } else { 3 },
            std::sync::atomic::Ordering::SeqCst,
        );
        0
    });
    held.await_signals(1);
    std::thread::sleep(STOP_AT);
    Sigstop.hold(holder.0);
    let wait = LockOptions {
        exptime: Duration::from_secs(30),
        timeout: Duration::from_secs(10),
        ..LockOptions::default()
    };
    let mut waiter = Lock::new(backend, wait).unwrap();
    waiter.lock("T").unwrap();
    Sigstop.release(holder.0);
    assert_eq!(holder.wait(Duration::from_secs(30)), 0);
    waiter.unlock().unwrap();
    told.word(0).load(std::sync::atomic::Ordering::SeqCst)
}

fn a_token_asked_after_a_stop_past_the_lease_is_refused_on_the_table() {
    let (t, _path) = table();
    let told = token_after_a_stop(&t);
    note!("[try_token said {told} (1 the old token, 2 Expired)] ");
    assert_eq!(told, 2);
}

#[cfg(feature = "redis")]
fn a_token_asked_after_a_stop_past_the_lease_is_refused_on_redis() {
    let server = common::redis_server::RedisServer::start();
    let redis = shmlock::RedisLocks::open(&server.url()).unwrap();
    let told = token_after_a_stop(&redis);
    note!("[try_token said {told} (1 the old token, 2 Expired)] ");
    assert_eq!(told, 2);
}

/// keep_alive said Expired every time, and the work saw `is_lost` turn true every time:
/// when it resumed, whether or not the renewer had run yet (before, `is_lost` said only
/// what a renewal's answer had said, and the work often ended first).
fn assert_told_expired(told: &[u64]) {
    note!("[keep_alive said {told:?} (1 Ok, 2 Expired, +16 the work saw is_lost)] ");
    assert!(
        told.iter().all(|&t| t & !SAW_LOST == 2),
        "keep_alive said Ok (1) for a hold the waiter had taken: {told:?}"
    );
    assert!(
        told.iter().all(|&t| t & SAW_LOST != 0),
        "the work did not see is_lost after its lease could have lapsed: {told:?}"
    );
}

fn table() -> (LockTable, common::TempPath) {
    let path = common::TempPath::new("truth");
    (LockTable::open(&path, 64).unwrap(), path)
}

fn keep_alive_after_a_stop_past_the_lease_says_expired_on_the_table() {
    let (t, _path) = table();
    assert_told_expired(&stopped_past_its_lease(&t, &Sigstop));
}

fn keep_alive_after_a_freeze_past_the_lease_says_expired_on_the_table() {
    common::harness::require_root();
    let (t, _path) = table();
    assert_told_expired(&stopped_past_its_lease(&t, &Frozen::new()));
}

#[cfg(feature = "redis")]
fn keep_alive_after_a_stop_past_the_lease_says_expired_on_redis() {
    let server = common::redis_server::RedisServer::start();
    let redis = shmlock::RedisLocks::open(&server.url()).unwrap();
    assert_told_expired(&stopped_past_its_lease(&redis, &Sigstop));
}

#[cfg(feature = "redis")]
fn keep_alive_after_a_freeze_past_the_lease_says_expired_on_redis() {
    common::harness::require_root();
    let server = common::redis_server::RedisServer::start();
    let redis = shmlock::RedisLocks::open(&server.url()).unwrap();
    assert_told_expired(&stopped_past_its_lease(&redis, &Frozen::new()));
}

fn main() {
    const FREEZE: &str = "needs root: freezes a cgroup";
    common::harness::run(
        "lease_truth",
        &[
            Test::new(
                "keep_alive_after_a_stop_past_the_lease_says_expired_on_the_table",
                keep_alive_after_a_stop_past_the_lease_says_expired_on_the_table,
            ),
            Test::new(
                "keep_alive_after_a_freeze_past_the_lease_says_expired_on_the_table",
                keep_alive_after_a_freeze_past_the_lease_says_expired_on_the_table,
            )
            .needs_root(FREEZE),
            Test::new(
                "a_token_asked_after_a_stop_past_the_lease_is_refused_on_the_table",
                a_token_asked_after_a_stop_past_the_lease_is_refused_on_the_table,
            ),
            #[cfg(feature = "redis")]
            Test::new(
                "a_token_asked_after_a_stop_past_the_lease_is_refused_on_redis",
                a_token_asked_after_a_stop_past_the_lease_is_refused_on_redis,
            ),
            #[cfg(feature = "redis")]
            Test::new(
                "keep_alive_after_a_stop_past_the_lease_says_expired_on_redis",
                keep_alive_after_a_stop_past_the_lease_says_expired_on_redis,
            ),
            #[cfg(feature = "redis")]
            Test::new(
                "keep_alive_after_a_freeze_past_the_lease_says_expired_on_redis",
                keep_alive_after_a_freeze_past_the_lease_says_expired_on_redis,
            )
            .needs_root(FREEZE),
        ],
        |_| 2,
    )
}
