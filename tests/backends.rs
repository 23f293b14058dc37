//! One behavioural suite, run on every backend: the shared-memory table and (with the
//! `redis` feature) a real redis-server started for each test.

mod common;

use std::time::{Duration, Instant};

use shmlock::{Backend, Error, Lock, LockOptions};

fn opts(exptime_ms: u64, timeout_ms: u64) -> LockOptions {
    LockOptions {
        exptime: Duration::from_millis(exptime_ms),
        timeout: Duration::from_millis(timeout_ms),
        ..LockOptions::default()
    }
}

fn lock_twice_on_one_object_is_locked<B: Backend>(b: &B) {
    let mut a = Lock::new(b, LockOptions::default()).unwrap();
    assert_eq!(a.lock("k").unwrap(), Duration::ZERO);
    assert!(matches!(a.lock("k"), Err(Error::Locked)));
    assert!(matches!(a.lock("other"), Err(Error::Locked)));
    a.unlock().unwrap();
    assert!(matches!(a.unlock(), Err(Error::Unlocked)));
    assert!(matches!(a.expire(None), Err(Error::Unlocked)));
}

fn two_objects_on_one_key_time_out<B: Backend>(b: &B) {
    let mut a = Lock::new(b, opts(30_000, 10)).unwrap();
    let mut c = Lock::new(b, opts(30_000, 10)).unwrap();
    a.lock("k").unwrap();
    let started = Instant::now();
    assert!(matches!(c.lock("k"), Err(Error::Timeout { .. })));
    assert!(started.elapsed() >= Duration::from_millis(10));
    assert!(matches!(
        c.lock_with_timeout("k", Duration::ZERO),
        Err(Error::Timeout { .. })
    ));
    a.unlock().unwrap();
    assert_eq!(c.lock("k").unwrap(), Duration::ZERO);
}

fn a_forgotten_holder_is_taken_over_after_exptime<B: Backend>(b: &B) {
    let mut forgetful = Lock::new(b, opts(100, 0)).unwrap();
    forgetful.lock("k").unwrap();
    let mut waiter = Lock::new(b, opts(30_000, 5_000)).unwrap();
    assert!(waiter.lock("k").unwrap() > Duration::ZERO);
    assert!(
        forgetful.token().is_none(),
        "a lost hold gets no fencing token"
    );
    assert!(waiter.token().is_some());
    assert!(matches!(forgetful.unlock(), Err(Error::Expired)));
    // the late unlock left the new holder alone
    let mut probe = Lock::new(b, opts(30_000, 0)).unwrap();
    assert!(matches!(probe.lock("k"), Err(Error::Timeout { .. })));
    waiter.unlock().unwrap();
}

fn expire_extends_the_lease_so_a_waiter_times_out<B: Backend>(b: &B) {
    let mut holder = Lock::new(b, opts(100, 0)).unwrap();
    holder.lock("k").unwrap();
    holder.expire(Some(Duration::from_secs(5))).unwrap();
    let mut waiter = Lock::new(b, opts(30_000, 300)).unwrap();
    assert!(matches!(waiter.lock("k"), Err(Error::Timeout { .. })));
    holder.expire(None).unwrap(); // back to 100 ms
    assert!(waiter.lock("k").unwrap() > Duration::ZERO);
    assert!(matches!(holder.expire(None), Err(Error::Expired)));
    assert!(!holder.is_locked());
    waiter.unlock().unwrap();
}

fn fencing_tokens_grow_across_holders<B: Backend>(b: &B) {
    let mut last = 0;
    for _ in 0..20 {
        let mut a = Lock::new(b, LockOptions::default()).unwrap();
        a.lock("fenced").unwrap();
        let t = a.token().unwrap();
        assert!(t > last, "{t} after {last}");
        assert_eq!(a.token(), Some(t));
        last = t;
    }
}

fn dropping_a_holding_lock_object_releases<B: Backend>(b: &B) {
    let mut a = Lock::new(b, opts(30_000, 0)).unwrap();
    {
        let mut held = Lock::new(b, opts(30_000, 0)).unwrap();
        held.lock("g").unwrap();
        assert!(matches!(a.lock("g"), Err(Error::Timeout { .. })));
    } // dropped while holding: released
    a.lock("g").unwrap();
    a.unlock().unwrap();
}

fn a_lease_left_to_expire_holds_until_exptime<B: Backend>(b: &B) {
    // (a lease of 1 s: the other's try below must come before it ends on a busy machine)
    let mut worker = Lock::new(b, opts(1000, 0)).unwrap();
    worker.lock("tick").unwrap();
    let first = worker.token().unwrap();
    drop(worker); // released: the next tick's worker could take it at once
    let mut lease = Lock::new(b, opts(1000, 0)).unwrap();
    lease.lock("tick").unwrap();
    let token = lease.leave_to_expire().unwrap().unwrap();
    assert!(token > first);
    assert!(!lease.is_locked());
    assert!(matches!(lease.leave_to_expire(), Err(Error::Unlocked)));
    drop(lease); // no longer holding: dropping releases nothing
    let mut other = Lock::new(b, opts(30_000, 0)).unwrap();
    assert!(matches!(other.lock("tick"), Err(Error::Timeout { .. })));
    std::thread::sleep(Duration::from_millis(1100));
    other.lock("tick").unwrap();
    assert!(other.token().unwrap() > token);
}

fn keep_alive_holds_the_lock_through_work_longer_than_the_lease<B>(b: &B)
where
    B: Backend + Sync,
    B::Hold: Send,
{
    // (renewed every 150 ms: a loaded machine may hold the renewer back a while)
    let mut worker = Lock::new(b, opts(450, 0)).unwrap();
    worker.lock("job").unwrap();
    let (value, lease) = worker
        .keep_alive(|alive| {
            let mut rival = Lock::new(b, opts(30_000, 0)).unwrap();
            for _ in 0..4 {
                std::thread::sleep(Duration::from_millis(300)); // 1.2 s in all
                assert!(matches!(rival.lock("job"), Err(Error::Timeout { .. })));
                assert!(!alive.is_lost());
            }
            7
        })
        .unwrap();
    assert_eq!((value, lease.is_ok()), (7, true));
    worker.unlock().unwrap();
    let mut idle = Lock::new(b, opts(150, 0)).unwrap();
    assert!(matches!(idle.keep_alive(|_| ()), Err(Error::Unlocked)));
}

/// `keep_alive` on a hold whose lease ran out before it (another took the key): the work
/// sees `is_lost` from its start, and the result is `Expired` (the first look said false,
/// the renewer not having answered yet).
fn keep_alive_on_a_lease_that_ran_out_is_lost_from_the_start<B>(b: &B)
where
    B: Backend + Sync,
    B::Hold: Send,
{
    let mut worker = Lock::new(b, opts(100, 0)).unwrap();
    worker.lock("stale").unwrap();
    let mut rival = Lock::new(b, opts(30_000, 5_000)).unwrap();
    rival.lock("stale").unwrap();
    let (seen, lease) = worker.keep_alive(|alive| alive.is_lost()).unwrap();
    assert!(seen, "the work was not told");
    assert!(matches!(lease, Err(Error::Expired)), "{lease:?}");
    rival.unlock().unwrap();
}

/// `keep_alive` renews the lease the hold has, as `expire` last set it: a hold taken
/// without expiry and given 300 ms by `expire` keeps the key through 1 s of work (a rival
/// trying all along), and the work is not told it lost it; one taken with 200 ms and made
/// never to expire is not turned back into a 200 ms lease by `keep_alive`.
fn keep_alive_renews_the_lease_that_expire_set<B>(b: &B)
where
    B: Backend + Sync,
    B::Hold: Send,
{
    let rival_took = |key: &str| {
        let mut rival = Lock::new(b, opts(30_000, 0)).unwrap();
        match rival.lock(key) {
            Ok(_) => {
                rival.unlock().unwrap();
                true
            }
            Err(Error::Timeout { .. }) => false,
            Err(e) => panic!("the rival's attempt: {e}"),
        }
    };

    let mut worker = Lock::new(b, opts(0, 0)).unwrap();
    worker.lock("leased").unwrap();
    worker.expire(Some(Duration::from_millis(300))).unwrap();
    let (seen, lease) = worker
        .keep_alive(|alive| {
            let t0 = Instant::now();
            let mut taken_at = None;
            while t0.elapsed() < Duration::from_secs(1) && taken_at.is_none() {
                if rival_took("leased") {
                    taken_at = Some(t0.elapsed());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            (taken_at, alive.is_lost())
        })
        .unwrap();
    assert_eq!(
        seen,
        (None, false),
        "(when a rival took the key during the work, whether the work was told): the \
         lease that expire set was not kept alive"
    );
    lease.unwrap();
    worker.unlock().unwrap();

    let mut worker = Lock::new(b, opts(200, 0)).unwrap();
    worker.lock("forever").unwrap();
    worker.expire(Some(Duration::ZERO)).unwrap();
    let ((), lease) = worker.keep_alive(|_| ()).unwrap();
    lease.unwrap();
    std::thread::sleep(Duration::from_millis(600));
    assert!(
        !rival_took("forever"),
        "a hold made never to expire ran out 200 ms (its exptime) after keep_alive"
    );
    worker.unlock().unwrap();
}

/// A's lease runs out, B takes the key and unlocks it, then A unlocks: `Expired` on every
/// backend (A's hold was lost, whoever holds the key now).
fn an_unlock_after_a_takeover_is_expired<B: Backend>(b: &B) {
    let mut a = Lock::new(b, opts(100, 0)).unwrap();
    a.lock("k").unwrap();
    let mut other = Lock::new(b, opts(30_000, 5_000)).unwrap();
    other.lock("k").unwrap();
    other.unlock().unwrap();
    assert!(matches!(a.unlock(), Err(Error::Expired)));
}

/// A hold that was lost is told so by every query, even one that answered before: no
/// token, `check` says `Expired`.
fn a_lost_hold_gets_no_token_even_the_one_it_had<B: Backend>(b: &B) {
    let mut a = Lock::new(b, opts(100, 0)).unwrap();
    a.lock("k").unwrap();
    let t = a.try_token().unwrap();
    assert_eq!(a.token(), Some(t));
    a.check().unwrap();
    let mut other = Lock::new(b, opts(30_000, 5_000)).unwrap();
    other.lock("k").unwrap();
    assert_eq!(a.token(), None);
    assert!(matches!(a.try_token(), Err(Error::Expired)));
    assert!(matches!(a.check(), Err(Error::Expired)));
    assert!(other.token().unwrap() > t);
    other.check().unwrap();
    other.unlock().unwrap();
    assert!(matches!(
        Lock::new(b, opts(100, 0)).unwrap().check(),
        Err(Error::Unlocked)
    ));
}

fn bad_keys_are_typed_errors<B: Backend>(b: &B) {
    let mut a = Lock::new(b, LockOptions::default()).unwrap();
    assert!(matches!(a.lock(""), Err(Error::EmptyKey)));
    assert!(matches!(
        a.lock(vec![1u8; 65536]),
        Err(Error::KeyTooLong { len: 65536, .. })
    ));
    a.lock(vec![0u8, 255, b'{', b'}', 7]).unwrap();
    a.unlock().unwrap();
}

macro_rules! suite {
    ($name:ident, $make:expr) => {
        mod $name {
            use super::*;

            #[test]
            fn lock_twice_on_one_object_is_locked() {
                let (b, _keep) = $make;
                super::lock_twice_on_one_object_is_locked(&b);
            }

            #[test]
            fn two_objects_on_one_key_time_out() {
                let (b, _keep) = $make;
                super::two_objects_on_one_key_time_out(&b);
            }

            #[test]
            fn a_forgotten_holder_is_taken_over_after_exptime() {
                let (b, _keep) = $make;
                super::a_forgotten_holder_is_taken_over_after_exptime(&b);
            }

            #[test]
            fn expire_extends_the_lease_so_a_waiter_times_out() {
                let (b, _keep) = $make;
                super::expire_extends_the_lease_so_a_waiter_times_out(&b);
            }

            #[test]
            fn fencing_tokens_grow_across_holders() {
                let (b, _keep) = $make;
                super::fencing_tokens_grow_across_holders(&b);
            }

            #[test]
            fn dropping_a_holding_lock_object_releases() {
                let (b, _keep) = $make;
                super::dropping_a_holding_lock_object_releases(&b);
            }

            #[test]
            fn a_lease_left_to_expire_holds_until_exptime() {
                let (b, _keep) = $make;
                super::a_lease_left_to_expire_holds_until_exptime(&b);
            }

            #[test]
            fn keep_alive_holds_the_lock_through_work_longer_than_the_lease() {
                let (b, _keep) = $make;
                super::keep_alive_holds_the_lock_through_work_longer_than_the_lease(&b);
            }

            #[test]
            fn keep_alive_on_a_lease_that_ran_out_is_lost_from_the_start() {
                let (b, _keep) = $make;
                super::keep_alive_on_a_lease_that_ran_out_is_lost_from_the_start(&b);
            }

            #[test]
            fn keep_alive_renews_the_lease_that_expire_set() {
                let (b, _keep) = $make;
                super::keep_alive_renews_the_lease_that_expire_set(&b);
            }

            #[test]
            fn an_unlock_after_a_takeover_is_expired() {
                let (b, _keep) = $make;
                super::an_unlock_after_a_takeover_is_expired(&b);
            }

            #[test]
            fn a_lost_hold_gets_no_token_even_the_one_it_had() {
                let (b, _keep) = $make;
                super::a_lost_hold_gets_no_token_even_the_one_it_had(&b);
            }

            #[test]
            fn bad_keys_are_typed_errors() {
                let (b, _keep) = $make;
                super::bad_keys_are_typed_errors(&b);
            }
        }
    };
}

suite!(shm, {
    let path = common::TempPath::new("suite");
    (shmlock::LockTable::open(&path, 64).unwrap(), path)
});

#[cfg(feature = "redis")]
suite!(redis, {
    let server = common::redis_server::RedisServer::start();
    (shmlock::RedisLocks::open(&server.url()).unwrap(), server)
});
