//! The lock API within one process: resty.lock's semantics, where we differ on purpose,
//! and bad input. Behaviour across processes is in `tests/procs.rs`.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use common::TempPath;
use shmlock::{Error, FormatError, Lock, LockOptions, LockTable};

fn table(name: &str, capacity: usize) -> (LockTable, TempPath) {
    let path = TempPath::new(name);
    (LockTable::open(&path, capacity).unwrap(), path)
}

fn opts(exptime_ms: u64, timeout_ms: u64) -> LockOptions {
    LockOptions {
        exptime: Duration::from_millis(exptime_ms),
        timeout: Duration::from_millis(timeout_ms),
        ..LockOptions::default()
    }
}

#[test]
fn first_try_succeeds_without_waiting() {
    let (t, _p) = table("first", 16);
    let mut lock = Lock::new(&t, LockOptions::default()).unwrap();
    assert_eq!(lock.lock("k").unwrap(), Duration::ZERO);
    assert!(lock.is_locked());
    assert!(t.is_locked("k").unwrap());
    lock.unlock().unwrap();
    assert!(!t.is_locked("k").unwrap());
}

#[test]
fn lock_twice_on_one_object_is_locked_at_once() {
    let (t, _p) = table("twice", 16);
    let mut lock = Lock::new(&t, LockOptions::default()).unwrap();
    lock.lock("a").unwrap();
    assert!(matches!(lock.lock("a"), Err(Error::Locked)));
    assert!(matches!(lock.lock("b"), Err(Error::Locked)));
    // the failed calls did not disturb the hold, nor take "b"
    assert!(t.is_locked("a").unwrap());
    assert!(!t.is_locked("b").unwrap());
    lock.unlock().unwrap();
}

#[test]
fn two_objects_one_key_time_out() {
    let (t, _p) = table("timeout", 16);
    let mut a = Lock::new(&t, opts(30_000, 10)).unwrap();
    let mut b = Lock::new(&t, opts(30_000, 10)).unwrap();
    a.lock("k").unwrap();
    let started = Instant::now();
    assert!(matches!(b.lock("k"), Err(Error::Timeout { .. })));
    // it slept its whole 10 ms budget (1 + 2 + 4 + 3 ms) before giving up
    assert!(started.elapsed() >= Duration::from_millis(10));
    assert!(!b.is_locked());
    a.unlock().unwrap();
    assert_eq!(b.lock("k").unwrap(), Duration::ZERO);
}

#[test]
fn timeout_zero_tries_once() {
    let (t, _p) = table("t0", 16);
    let mut a = Lock::new(&t, LockOptions::default()).unwrap();
    a.lock("k").unwrap();
    let mut b = Lock::new(&t, opts(30_000, 0)).unwrap();
    assert!(matches!(b.lock("k"), Err(Error::Timeout { .. })));
    // per-call override: a longer wait for this call only, and back to zero after
    assert!(matches!(
        b.lock_with_timeout("k", Duration::from_millis(3)),
        Err(Error::Timeout { .. })
    ));
    a.unlock().unwrap();
    assert_eq!(
        b.lock_with_timeout("k", Duration::ZERO).unwrap(),
        Duration::ZERO
    );
}

#[test]
fn forgotten_holder_is_taken_over_after_exptime() {
    let (t, _p) = table("forgot", 16);
    let mut forgetful = Lock::new(&t, opts(50, 5000)).unwrap();
    forgetful.lock("k").unwrap();
    let mut waiter = Lock::new(&t, opts(30_000, 5000)).unwrap();
    let started = Instant::now();
    let elapsed = waiter.lock("k").unwrap();
    assert!(elapsed > Duration::ZERO);
    // not before the lease ran out (the coarse clock may round a tick either way)
    assert!(started.elapsed() >= Duration::from_millis(45));
    // the forgetful holder lost it, and its unlock leaves the new holder alone
    assert!(matches!(forgetful.unlock(), Err(Error::Expired)));
    assert!(t.is_locked("k").unwrap());
    waiter.unlock().unwrap();
}

#[test]
fn expire_extends_the_lease_so_a_waiter_times_out() {
    let (t, _p) = table("extend", 16);
    let mut holder = Lock::new(&t, opts(100, 5000)).unwrap();
    holder.lock("k").unwrap();
    holder.expire(Some(Duration::from_secs(5))).unwrap();
    let mut waiter = Lock::new(&t, opts(30_000, 300)).unwrap();
    // without the renewal the lease would have run out after 100 ms of the 300 ms wait
    assert!(matches!(waiter.lock("k"), Err(Error::Timeout { .. })));
    // expire(None) renews to the object's exptime (100 ms): now the waiter gets it
    holder.expire(None).unwrap();
    assert!(waiter.lock("k").unwrap() > Duration::ZERO);
    assert!(matches!(holder.expire(None), Err(Error::Expired)));
    assert!(!holder.is_locked());
}

#[test]
fn unlock_after_expiry_and_takeover_is_expired_and_spares_the_new_owner() {
    let (t, _p) = table("retaken", 16);
    let mut old = Lock::new(&t, opts(20, 0)).unwrap();
    old.lock("k").unwrap();
    let old_token = old.token().unwrap();
    std::thread::sleep(Duration::from_millis(40));
    let mut new = Lock::new(&t, opts(30_000, 0)).unwrap();
    new.lock("k").unwrap();
    let new_token = new.token().unwrap();
    assert!(new_token > old_token);

    assert!(matches!(old.expire(None), Err(Error::Expired)));
    old.lock("other").unwrap();
    old.unlock().unwrap();
    let mut old2 = Lock::new(&t, opts(20, 0)).unwrap();
    assert!(matches!(old2.unlock(), Err(Error::Unlocked)));

    let mut stale = Lock::new(&t, opts(20, 0)).unwrap();
    stale.lock("k2").unwrap();
    std::thread::sleep(Duration::from_millis(40));
    let mut taker = Lock::new(&t, opts(30_000, 0)).unwrap();
    taker.lock("k2").unwrap();
    assert!(stale.token().is_none(), "a lost hold gets no token");
    assert!(matches!(stale.unlock(), Err(Error::Expired)));
    assert!(matches!(stale.unlock(), Err(Error::Unlocked)));
    // the new owners still hold their keys
    let mut probe = Lock::new(&t, opts(30_000, 0)).unwrap();
    assert!(matches!(probe.lock("k"), Err(Error::Timeout { .. })));
    assert!(matches!(probe.lock("k2"), Err(Error::Timeout { .. })));
    new.unlock().unwrap();
    taker.unlock().unwrap();
}

#[test]
fn expired_but_not_retaken_lease_cannot_be_renewed_but_unlocks() {
    let (t, _p) = table("lapsed", 16);
    let mut a = Lock::new(&t, opts(20, 0)).unwrap();
    a.lock("k").unwrap();
    std::thread::sleep(Duration::from_millis(40));
    assert!(matches!(a.expire(None), Err(Error::Expired)));
    assert!(!t.is_locked("k").unwrap());

    // unlock only reports a lease that was actually lost to someone
    a.lock("k").unwrap();
    std::thread::sleep(Duration::from_millis(40));
    a.unlock().unwrap();
    assert!(!t.is_locked("k").unwrap());
}

#[test]
fn unlock_and_expire_without_a_hold_are_unlocked() {
    let (t, _p) = table("unlocked", 16);
    let mut a = Lock::new(&t, LockOptions::default()).unwrap();
    assert!(matches!(a.unlock(), Err(Error::Unlocked)));
    assert!(matches!(a.expire(None), Err(Error::Unlocked)));
    assert_eq!(a.token(), None);
}

#[test]
fn fencing_tokens_grow_across_holders_and_are_stable_within_a_hold() {
    let (t, _p) = table("tokens", 16);
    let mut last = 0;
    for round in 0..50 {
        let mut a = Lock::new(&t, LockOptions::default()).unwrap();
        a.lock("fenced").unwrap();
        let tok = a.token().unwrap();
        assert!(tok > last, "round {round}: {tok} after {last}");
        assert_eq!(a.token(), Some(tok));
        last = tok;
        if round % 2 == 0 {
            a.unlock().unwrap();
        } // else dropped: released by Drop
    }
    let g = t.lock("fenced", LockOptions::default()).unwrap();
    assert!(g.token().unwrap() > last);
}

#[test]
fn guard_releases_on_drop_and_unlock() {
    let (t, _p) = table("guard", 16);
    {
        let g = t.lock("k", LockOptions::default()).unwrap();
        assert_eq!(g.elapsed(), Duration::ZERO);
        assert!(t
            .try_lock_with_lease("k", Duration::from_secs(30))
            .unwrap()
            .is_none());
    }
    let g = t
        .try_lock_with_lease("k", Duration::from_secs(30))
        .unwrap()
        .unwrap();
    g.unlock().unwrap();
    // (a lease of 200 ms: renewed before it ends, also on a busy machine)
    let mut g = t
        .try_lock_with_lease("k", Duration::from_millis(200))
        .unwrap()
        .unwrap();
    g.expire(Some(Duration::from_secs(10))).unwrap();
    std::thread::sleep(Duration::from_millis(400));
    assert!(t
        .try_lock_with_lease("k", Duration::from_secs(30))
        .unwrap()
        .is_none());
    drop(g);
    assert!(t
        .try_lock_with_lease("k", Duration::from_secs(30))
        .unwrap()
        .is_some());
}

#[test]
fn a_panicking_thread_releases_its_guard_on_unwind() {
    let (t, _p) = table("panic", 16);
    let t2 = t.clone();
    let r = std::thread::spawn(move || {
        let _g = t2.lock("k", LockOptions::default()).unwrap();
        panic!("boom");
    })
    .join();
    assert!(r.is_err());
    assert!(!t.is_locked("k").unwrap());
}

#[test]
fn exptime_zero_never_expires() {
    let (t, _p) = table("never", 16);
    let mut a = Lock::new(&t, opts(0, 0)).unwrap();
    a.lock("k").unwrap();
    std::thread::sleep(Duration::from_millis(30));
    let mut b = Lock::new(&t, opts(0, 20)).unwrap();
    assert!(matches!(b.lock("k"), Err(Error::Timeout { .. })));
    let h = t.holders();
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].ttl, None);
    assert!(!h[0].expired);
}

#[test]
fn keys_are_any_bytes_of_1_to_65535() {
    let (t, _p) = table("keys", 16);
    assert!(matches!(
        t.try_lock_with_lease("", Duration::ZERO),
        Err(Error::EmptyKey)
    ));
    let long = vec![7u8; 65536];
    assert!(matches!(
        t.try_lock_with_lease(&long, Duration::ZERO),
        Err(Error::KeyTooLong {
            len: 65536,
            max: 65535,
            ..
        })
    ));
    let mut a = Lock::new(&t, LockOptions::default()).unwrap();
    assert!(matches!(a.lock(""), Err(Error::EmptyKey)));
    assert!(!a.is_locked());
    let max = vec![0xffu8; 65535];
    let g = t
        .try_lock_with_lease(&max, Duration::ZERO)
        .unwrap()
        .unwrap();
    let bin = [0u8, 1, 2, 0, 255];
    let g2 = t.try_lock_with_lease(bin, Duration::ZERO).unwrap().unwrap();
    // keys differing only past the preview are still different keys
    let mut other = max.clone();
    other[65534] = 0;
    assert!(t
        .try_lock_with_lease(&other, Duration::ZERO)
        .unwrap()
        .is_some());
    assert!(t
        .try_lock_with_lease(&max, Duration::ZERO)
        .unwrap()
        .is_none());
    drop((g, g2));
}

#[test]
fn nonsense_options_are_typed_errors() {
    let (t, _p) = table("opts", 16);
    let bad = [
        LockOptions {
            ratio: 0.5,
            ..LockOptions::default()
        },
        LockOptions {
            ratio: f64::NAN,
            ..LockOptions::default()
        },
        LockOptions {
            ratio: f64::INFINITY,
            ..LockOptions::default()
        },
        LockOptions {
            step: Duration::ZERO,
            ..LockOptions::default()
        },
        LockOptions {
            max_step: Duration::ZERO,
            ..LockOptions::default()
        },
        LockOptions {
            exptime: Duration::MAX,
            ..LockOptions::default()
        },
    ];
    for o in bad {
        assert!(
            matches!(Lock::new(&t, o), Err(Error::InvalidOptions(_))),
            "{o:?}"
        );
        assert!(matches!(t.lock("k", o), Err(Error::InvalidOptions(_))));
    }
    for (e, to, s, r, m) in [
        (f64::NAN, 5.0, 0.001, 2.0, 0.5),
        (30.0, f64::INFINITY, 0.001, 2.0, 0.5),
        (30.0, 5.0, -0.001, 2.0, 0.5),
        (30.0, 5.0, 0.0, 2.0, 0.5),
        (30.0, 5.0, 0.001, 0.9, 0.5),
        (30.0, 5.0, 0.001, 2.0, f64::NAN),
    ] {
        assert!(matches!(
            LockOptions::from_secs(e, to, s, r, m),
            Err(Error::InvalidOptions(_))
        ));
    }
    assert_eq!(
        LockOptions::from_secs(30.0, 5.0, 0.001, 2.0, 0.5).unwrap(),
        LockOptions::default()
    );
    assert!(matches!(
        t.try_lock_with_lease("k", Duration::MAX),
        Err(Error::InvalidOptions(_))
    ));
}

/// Takes new keys until the table is full; returns their guards.
fn fill<'t>(t: &'t LockTable, prefix: &str, lease: Duration) -> Vec<shmlock::LockGuard<'t>> {
    let mut guards = Vec::new();
    loop {
        match t.try_lock_with_lease(format!("{prefix}-{}", guards.len()), lease) {
            Ok(Some(g)) => guards.push(g),
            Err(Error::TableFull { .. }) => return guards,
            other => panic!("{other:?}"),
        }
        // the table has four slots per key of capacity: it may take more keys than its
        // capacity, never more than its slots
        assert!(guards.len() <= 4 * t.capacity(), "never full");
    }
}

#[test]
fn capacity_always_fits_and_a_full_table_never_evicts() {
    for capacity in [1usize, 2, 7, 64, 1000] {
        let (t, _p) = table("cap", capacity);
        assert_eq!(t.capacity(), capacity);
        let mut guards = fill(&t, "key", Duration::from_secs(30));
        // the promise: at least `capacity` keys at once (the table has headroom beyond)
        assert!(guards.len() >= capacity, "{} < {capacity}", guards.len());
        let held = guards.len();
        assert_eq!(t.occupancy(), held);
        let mut waiter = Lock::new(&t, opts(30_000, 5)).unwrap();
        assert!(matches!(
            waiter.lock("one-more"),
            Err(Error::TableFull { .. })
        ));
        // every live lock is still held
        for i in 0..held {
            assert!(
                t.is_locked(format!("key-{i}")).unwrap(),
                "key-{i} was evicted"
            );
        }
        // releasing any one frees room
        drop(guards.remove(held / 2));
        let g = t
            .try_lock_with_lease("one-more", Duration::from_secs(30))
            .unwrap();
        assert!(g.is_some(), "capacity {capacity}: no room after a release");
        drop(g);
        drop(guards);
        assert_eq!(t.occupancy(), 0);
    }
}

#[test]
fn a_full_table_reclaims_expired_entries() {
    let (t, _p) = table("reclaim", 4);
    let gs = fill(&t, "old", Duration::from_millis(20));
    assert!(matches!(
        t.try_lock_with_lease("new", Duration::from_secs(30)),
        Err(Error::TableFull { .. })
    ));
    std::thread::sleep(Duration::from_millis(40));
    let g = t
        .try_lock_with_lease("new", Duration::from_secs(30))
        .unwrap();
    assert!(g.is_some());
    std::mem::forget(gs); // their releases would report Expired at best; keep it simple
}

#[test]
fn churn_over_a_small_table_leaves_it_empty() {
    let (t, _p) = table("churn", 32);
    let mut locks: Vec<Lock> = (0..24)
        .map(|_| Lock::new(&t, opts(30_000, 0)).unwrap())
        .collect();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..200_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let l = &mut locks[(x % 24) as usize];
        if l.is_locked() {
            l.unlock().unwrap();
        } else {
            let key = format!("k{}", (x >> 8) % 40);
            match l.lock(&key) {
                Ok(_) | Err(Error::Timeout { .. }) => {}
                Err(e) => panic!("{e}"),
            }
        }
        // never two holders of a key: every held key has exactly one entry
        if x.is_multiple_of(1024) {
            let held: Vec<_> = t.holders().into_iter().map(|h| h.key_preview).collect();
            let mut dedup = held.clone();
            dedup.sort();
            dedup.dedup();
            assert_eq!(held.len(), dedup.len());
        }
    }
    drop(locks);
    assert_eq!(t.occupancy(), 0);
}

#[test]
fn the_release_hole_does_not_admit_a_second_entry() {
    // Arrange a key displaced from its home, free the slots before it, and claim it again.
    let (t, _p) = table("hole", 8);
    for attempt in 0..200 {
        let target = format!("target-{attempt}");
        let fillers: Vec<_> = (0..7)
            .map(|i| {
                t.try_lock_with_lease(format!("f{attempt}-{i}"), Duration::from_secs(30))
                    .unwrap()
                    .unwrap()
            })
            .collect();
        let held = t
            .try_lock_with_lease(&target, Duration::from_secs(30))
            .unwrap()
            .unwrap();
        let (home, slot) = t.debug_placement(&target).unwrap();
        drop(fillers);
        if home == slot {
            drop(held);
            continue;
        }
        // the path from home to the key is now all free: a naive claim would stop there
        for _ in 0..100 {
            assert!(t
                .try_lock_with_lease(&target, Duration::from_secs(30))
                .unwrap()
                .is_none());
        }
        assert_eq!(t.occupancy(), 1);
        assert_eq!(t.debug_placement(&target), Some((home, slot)));
        drop(held);
        assert!(t
            .try_lock_with_lease(&target, Duration::from_secs(30))
            .unwrap()
            .is_some());
        return;
    }
    panic!("never managed to displace a key");
}

#[test]
fn holders_describe_the_entries() {
    let (t, _p) = table("holders", 16);
    let g = t.lock("user:42", LockOptions::default()).unwrap();
    let tok = g.token().unwrap();
    let long = "x".repeat(100);
    let _g2 = t
        .try_lock_with_lease(&long, Duration::ZERO)
        .unwrap()
        .unwrap();
    let mut h = t.holders();
    h.sort_by_key(|h| h.key_len);
    assert_eq!(h.len(), 2);
    assert_eq!(h[0].key_preview, b"user:42");
    assert_eq!(h[0].pid, std::process::id());
    assert_eq!(h[0].token, Some(tok));
    assert!(h[0].ttl.unwrap() <= Duration::from_secs(30));
    assert!(h[0].state == shmlock::HolderState::Held && !h[0].expired);
    assert!(h[0].owner_alive && !h[0].waiters);
    assert_eq!(h[1].key_len, 100);
    assert_eq!(h[1].key_preview.len(), 32);
    assert_eq!(h[1].ttl, None);
    drop(g);
    // breaking a lock reports who held it; the holder learns at its unlock
    let mut a = Lock::new(&t, LockOptions::default()).unwrap();
    a.lock("stuck").unwrap();
    let who = t.force_unlock("stuck").unwrap().unwrap();
    assert_eq!(
        (who.key_preview.as_slice(), who.pid),
        (&b"stuck"[..], std::process::id())
    );
    assert!(!t.is_locked("stuck").unwrap());
    assert!(matches!(a.unlock(), Err(Error::Expired)));
    assert_eq!(t.force_unlock("stuck").unwrap(), None);
}

#[test]
fn attach_uses_the_files_layout_and_shares_state() {
    let path = TempPath::new("attach");
    let a = LockTable::open(&path, 100).unwrap();
    assert!(a.created());
    let b = LockTable::open(&path, 5).unwrap();
    assert!(!b.created());
    assert_eq!(b.capacity(), 100);
    let g = a
        .try_lock_with_lease("shared", Duration::from_secs(30))
        .unwrap()
        .unwrap();
    assert!(b
        .try_lock_with_lease("shared", Duration::from_secs(30))
        .unwrap()
        .is_none());
    drop(g);
    assert!(b
        .try_lock_with_lease("shared", Duration::from_secs(30))
        .unwrap()
        .is_some());
    let attach_only = LockTable::options().create(false).open(&path).unwrap();
    assert_eq!(attach_only.capacity(), 100);
}

#[test]
fn bad_capacity_and_missing_files_are_typed_errors() {
    let path = TempPath::new("badcap");
    assert!(matches!(
        LockTable::open(&path, 0),
        Err(Error::InvalidCapacity(0))
    ));
    assert!(matches!(
        LockTable::open(&path, shmlock::MAX_CAPACITY + 1),
        Err(Error::InvalidCapacity(_))
    ));
    assert!(!path.0.exists());
    // an empty path (an unset variable) is named as such, on both kinds of file
    for e in [
        LockTable::open("", 16).map(drop).unwrap_err(),
        shmlock::SharedDict::open("", 16, 16).map(drop).unwrap_err(),
    ] {
        assert!(
            matches!(e, Error::InvalidOptions(why) if why.contains("path is empty")),
            "{e:?}"
        );
    }
    match LockTable::options().create(false).open(&path) {
        Err(Error::Io { source, .. }) => assert_eq!(source.kind(), std::io::ErrorKind::NotFound),
        other => panic!("{other:?}"),
    }
    match LockTable::open("/nonexistent-dir/locks", 4) {
        Err(Error::Io { source, .. }) => assert_eq!(source.kind(), std::io::ErrorKind::NotFound),
        other => panic!("{other:?}"),
    }
}

fn format_error(path: &TempPath) -> FormatError {
    match LockTable::open(path, 16) {
        Err(Error::Format {
            source, path: p, ..
        }) => {
            assert_eq!(p, path.0);
            source
        }
        Err(e) => panic!("not a format error: {e}"),
        Ok(_) => panic!("accepted a bad file"),
    }
}

#[test]
fn foreign_truncated_and_corrupt_files_are_typed_errors() {
    let path = TempPath::new("bad");

    std::fs::write(&path, b"").unwrap();
    let empty = format_error(&path);
    assert_eq!(
        empty,
        FormatError::Truncated {
            len: 0,
            expected: 4096
        }
    );
    // not "truncated": nothing makes a table in place, so it says what to do instead
    let said = empty.to_string();
    assert!(
        said.starts_with("empty file (0 bytes), not a shmlock file") && said.contains("remove it"),
        "{said}"
    );

    std::fs::write(&path, vec![0u8; 4096 + 128 * 16]).unwrap();
    assert_eq!(format_error(&path), FormatError::NotATable);

    std::fs::write(&path, b"#!/bin/sh\necho not a lock table\n".repeat(200)).unwrap();
    assert_eq!(format_error(&path), FormatError::NotATable);

    // a real table, then damaged in various ways
    let make = || {
        let _ = std::fs::remove_file(&path);
        drop(LockTable::open(&path, 16).unwrap());
        std::fs::read(&path).unwrap()
    };
    let good = make();

    std::fs::write(&path, &good[..good.len() - 1]).unwrap();
    assert!(matches!(format_error(&path), FormatError::Truncated { .. }));
    std::fs::write(&path, &good[..100]).unwrap();
    let short = format_error(&path);
    assert!(matches!(short, FormatError::Truncated { .. }));
    // (what the header would have said is not there to read)
    assert_eq!(
        short.to_string(),
        "truncated shmlock file: 100 bytes, shorter than its 4096-byte header"
    );
    std::fs::write(&path, &good[..5]).unwrap();
    assert!(matches!(format_error(&path), FormatError::Truncated { .. }));
    // A short file that does not start as a table (a pid file given by mistake) is not a
    // truncated table, which its message would invite the user to remove.
    for foreign in [&b"42\n"[..], b"x", b"hello world"] {
        std::fs::write(&path, foreign).unwrap();
        assert_eq!(format_error(&path), FormatError::NotATable, "{foreign:?}");
    }

    let mut longer = good.clone();
    longer.extend_from_slice(&[0; 128]);
    std::fs::write(&path, &longer).unwrap();
    assert!(matches!(format_error(&path), FormatError::Corrupt(_)));

    for version in [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 16] {
        let mut other = good.clone();
        other[8] = version;
        std::fs::write(&path, &other).unwrap();
        assert_eq!(
            format_error(&path),
            FormatError::UnsupportedVersion(u32::from(version))
        );
    }

    let mut flipped = good.clone();
    flipped[16] ^= 0x40; // slot count
    std::fs::write(&path, &flipped).unwrap();
    assert!(matches!(format_error(&path), FormatError::Corrupt(_)));

    // garbage in the slots is not a header error: the table opens and stays usable
    let mut scribbled = good.clone();
    for (i, b) in scribbled[4096..].iter_mut().enumerate() {
        *b = (i * 7 + 3) as u8;
    }
    std::fs::write(&path, &scribbled).unwrap();
    let t = LockTable::open(&path, 16).unwrap();
    let _ = t.holders();
    let _ = t.try_lock_with_lease("after-garbage", Duration::from_secs(1));
}

/// What is not a file the library could ever have made says what it is, not a format
/// error: a kernel's file read as "empty file (0 bytes) ... remove it", a Unix socket as
/// ENXIO, and a FIFO, a device or a directory as the type it is. (Read-only handles, so
/// that any uid may open the kernel's files; read-write ones take the same path once
/// opened, and a directory, which they cannot open, is said the same.)
#[test]
fn files_that_are_not_tables_say_what_they_are() {
    let sock = TempPath::new("not-a-table-socket");
    let _listener = std::os::unix::net::UnixListener::bind(&sock.0).unwrap();
    let fifo = TempPath::new("not-a-table-fifo");
    let c = std::ffi::CString::new(fifo.0.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let dir = std::env::temp_dir();
    let cases: [(&std::path::Path, &str); 6] = [
        (
            "/proc/self/status".as_ref(),
            "a file of the kernel's proc file system, not a shmlock file",
        ),
        (
            "/sys/kernel/uevent_seqnum".as_ref(),
            "a file of the kernel's sysfs, not a shmlock file",
        ),
        (&sock.0, "a Unix socket, not a shmlock file"),
        (&fifo.0, "a FIFO, not a shmlock file"),
        (
            "/dev/null".as_ref(),
            "not a regular file, not a shmlock file",
        ),
        (&dir, "a directory, not a shmlock file"),
    ];
    for (path, says) in cases {
        let table = LockTable::options().read_only(true).open(path);
        let dict = shmlock::SharedDict::options().read_only(true).open(path);
        for (what, got) in [("table", table.map(drop)), ("dict", dict.map(drop))] {
            match got {
                Err(Error::Io {
                    path: p, source, ..
                }) => {
                    assert_eq!(p, path, "{what}");
                    assert_eq!(source.to_string(), says, "{what} at {path:?}");
                }
                other => panic!("{what} at {path:?}: {other:?}"),
            }
        }
    }
    // A directory opened to lock or store says the same (not "Is a directory").
    let table = LockTable::open(&dir, 4).map(drop);
    let dict = shmlock::SharedDict::open(&dir, 4, 64).map(drop);
    for (what, got) in [("table", table), ("dict", dict)] {
        match got {
            Err(Error::Io { source, .. }) => assert_eq!(
                source.to_string(),
                "a directory, not a shmlock file",
                "{what} opened read-write"
            ),
            other => panic!("{what} opened read-write at {dir:?}: {other:?}"),
        }
    }
}

#[test]
fn files_are_private_by_default_and_take_the_mode_asked_for() {
    let path = TempPath::new("mode");
    drop(LockTable::open(&path, 4).unwrap());
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let path2 = TempPath::new("mode2");
    drop(
        LockTable::options()
            .capacity(4)
            .mode(0o664)
            .open(&path2)
            .unwrap(),
    );
    let mode = std::fs::metadata(&path2).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o664);
}

#[test]
fn keep_alive_reports_a_lock_broken_under_it() {
    let (t, _p) = table("keepalive", 16);
    let mut g = t.lock("job", opts(90, 0)).unwrap();
    let (saw_loss, lease) = g.keep_alive(|alive| {
        t.force_unlock("job").unwrap().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !alive.is_lost() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        alive.is_lost()
    });
    assert!(saw_loss);
    assert!(matches!(lease, Err(Error::Expired)));
    assert!(matches!(g.unlock(), Err(Error::Expired)));
}

#[test]
fn a_panic_in_keep_alives_work_reaches_the_caller_and_the_hold_stays() {
    let (t, p) = table("keepalive-panic", 16);
    // On another thread, so that a keep_alive that never returned fails the test instead
    // of hanging it (its renewer, never told to stop, kept the scope waiting).
    let (tx, rx) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        let t = t;
        let _p = p;
        let mut g = t.lock("job", opts(60_000, 0)).unwrap();
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            g.keep_alive(|_| -> () { panic!("the work fails") })
        }));
        let still = g.keep_alive(|_| 7);
        let _ = tx.send((
            caught.is_err(),
            still.0,
            still.1.is_ok(),
            t.is_locked("job").unwrap(),
        ));
        g.unlock().unwrap();
    });
    let got = rx.recv_timeout(Duration::from_secs(20));
    assert_eq!(
        got,
        Ok((true, 7, true, true)),
        "the panic came out, and the hold is still held and renewable (Err: keep_alive never returned)"
    );
    worker.join().unwrap();
}

#[test]
fn handles_are_send_sync_and_cheap_clones() {
    fn send_sync<T: Send + Sync + Clone>() {}
    send_sync::<LockTable>();
    #[cfg(feature = "redis")]
    send_sync::<shmlock::RedisLocks>();
    // a guard can move to another thread (locks belong to processes, not threads)
    fn send<T: Send>() {}
    send::<shmlock::LockGuard<'static>>();
    let (t, _p) = table("clone", 4);
    let c = t.clone();
    let g = t
        .try_lock_with_lease("shared", Duration::from_secs(30))
        .unwrap()
        .unwrap();
    assert!(c.is_locked("shared").unwrap());
    std::thread::scope(|s| {
        s.spawn(move || g.unlock().unwrap());
    });
    assert!(!c.is_locked("shared").unwrap());
}

#[test]
fn errors_name_the_key_and_the_limit() {
    let (t, _p) = table("errors-name", 2);
    let _a = t
        .try_lock_with_lease("held:a", Duration::ZERO)
        .unwrap()
        .unwrap();
    let mut rival = Lock::new(&t, opts(1000, 30)).unwrap();
    let err = rival.lock("held:a").unwrap_err();
    match &err {
        Error::Timeout {
            key,
            timeout,
            holder,
            ..
        } => {
            assert_eq!(key.as_bytes(), b"held:a");
            assert_eq!(*timeout, Duration::from_millis(30));
            // the holder (this process) is named, and it had held the key the whole wait
            // (by the table's coarse clock: up to a tick, 4 or 10 ms, less)
            let h = holder.as_ref().expect("the holder");
            assert_eq!(h.pid, Some(std::process::id()));
            assert_eq!(h.host, None);
            assert!(h.this_process, "{h:?}");
            let held_for = h.held_for.unwrap() + Duration::from_millis(10);
            assert!(held_for >= Duration::from_millis(30), "{h:?}");
        }
        other => panic!("{other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("\"held:a\"") && msg.contains("30ms"), "{msg}");
    // (a wait for a hold of its own process says so: it ends only if that is released)
    assert!(
        msg.contains(&format!(
            "stayed held for the whole 30ms by this process itself (pid {}, for ",
            std::process::id()
        )),
        "{msg}"
    );
    // A try of zero timeout says the key is held, not that a wait ran out.
    let err = Lock::new(&t, opts(1000, 0))
        .unwrap()
        .lock("held:a")
        .unwrap_err();
    assert!(err.to_string().contains("is held"), "{err}");
    // A hold taken within the coarse clock's tick is "under 1ms" old, not "0.0ns".
    let fresh = t.lock("fresh", LockOptions::default()).unwrap();
    let err = Lock::new(&t, opts(1000, 0))
        .unwrap()
        .lock("fresh")
        .unwrap_err();
    fresh.unlock().unwrap();
    let msg = err.to_string();
    assert!(!msg.contains("0.0ns") && msg.contains(", for "), "{msg}");
    // The wait is capped at the lease's length, and the error names the wait that ran.
    let t0 = std::time::Instant::now();
    let err = Lock::new(&t, opts(50, 20_000))
        .unwrap()
        .lock("held:a")
        .unwrap_err();
    assert!(
        matches!(err, Error::Timeout { timeout, .. } if timeout == Duration::from_millis(50)),
        "{err:?} after {:?}",
        t0.elapsed()
    );

    // Fill every slot, then one more: the message names the key, the capacity and the slots.
    let guards: Vec<_> = (0..8)
        .map_while(|i| {
            t.try_lock_with_lease(format!("fill:{i}"), Duration::ZERO)
                .ok()
                .flatten()
        })
        .collect();
    assert!(!guards.is_empty());
    let long = format!("{}\u{1b}[2J", "x".repeat(100));
    let err = t.try_lock_with_lease(&long, Duration::ZERO).unwrap_err();
    let Error::TableFull {
        key,
        capacity,
        slots,
        ..
    } = &err
    else {
        panic!("{err:?}");
    };
    // Full with 8 holds (these and `held:a`) at a capacity of 2: the message says both,
    // so that it does not read as a table that held 2.
    assert_eq!(guards.len() + 1, 8);
    assert_eq!((*capacity, *slots), (2, 8));
    assert_eq!((key.len(), key.is_truncated()), (104, true));
    let msg = err.to_string();
    assert!(
        msg.contains("capacity 2") && msg.contains("its 8 slots") && msg.contains("(104 bytes)"),
        "{msg}"
    );
    // Escapes never reach a terminal raw, even when cut off.
    assert!(!msg.contains('\u{1b}'), "{msg}");
    let err = t
        .try_lock_with_lease("x\u{1b}[2J", Duration::ZERO)
        .unwrap_err();
    assert!(err.to_string().contains(r#""x\x1b[2J""#), "{err}");
}

/// Code written against the old names keeps compiling and working.
#[test]
#[allow(deprecated)]
fn old_names_and_option_forms_still_work() {
    let (t, _p) = table("old-names", 16);
    let g = t.try_lock("k", Duration::from_secs(5)).unwrap().unwrap();
    assert!(t.try_lock("k", Duration::ZERO).unwrap().is_none());
    drop(g);
    let o = opts(1000, 0);
    // Options by reference or by value, for the table and for a Lock object alike.
    #[allow(clippy::needless_borrows_for_generic_args)]
    drop(t.lock("k", &o).unwrap());
    drop(t.lock("k", o).unwrap());
    #[allow(clippy::needless_borrows_for_generic_args)]
    let mut by_ref = Lock::new(&t, &o).unwrap();
    let mut by_value = Lock::new(&t, o).unwrap();
    by_ref.lock("k").unwrap();
    assert!(matches!(by_value.lock("k"), Err(Error::Timeout { .. })));
    by_ref.unlock().unwrap();
    by_value.lock("k").unwrap();
}

/// A read-only handle inspects and changes nothing: every call that would change the table
/// says so (`reap` did nothing and said nothing).
#[test]
fn a_read_only_table_reads_and_refuses_every_change() {
    let (t, path) = table("read-only", 16);
    let held = t.lock("held", opts(60_000, 0)).unwrap();
    let _ = t.lock("lapsed", opts(1, 0)).unwrap().leave_to_expire();
    std::thread::sleep(Duration::from_millis(20));
    let ro = LockTable::options()
        .read_only(true)
        .create(false)
        .open(&path)
        .unwrap();
    assert!(ro.is_locked("held").unwrap());
    assert_eq!(ro.holders().len(), 2, "the lapsed entry is not reaped yet");
    assert!(matches!(ro.reap(), Err(Error::ReadOnly)));
    assert!(matches!(
        ro.lock("other", opts(1000, 0)),
        Err(Error::ReadOnly)
    ));
    assert!(matches!(ro.force_unlock("held"), Err(Error::ReadOnly)));
    assert!(held.check().is_ok());
    assert_eq!(t.reap().unwrap(), 1, "the lapsed entry was left for us");
}

/// `Duration::MAX` as a timeout is "as long as it takes", on every kind of wait: it
/// panicked (`overflow when adding duration to instant`) once the key was held.
#[test]
fn a_timeout_of_duration_max_waits_as_long_as_it_takes() {
    let (t, _p) = table("duration-max", 16);
    let forever = LockOptions {
        exptime: Duration::ZERO,
        timeout: Duration::MAX,
        ..LockOptions::default()
    };
    let sem = t.semaphore("permits", 1).unwrap();
    for wait in [
        "lock",
        "lock_shared",
        "acquire",
        "Lock::lock",
        "lock_with_timeout",
    ] {
        let guard = t.try_lock_with_lease("k", Duration::ZERO).unwrap().unwrap();
        let permit = sem.try_acquire(Duration::ZERO).unwrap().unwrap();
        std::thread::scope(|s| {
            let waiter = s.spawn(|| match wait {
                "lock" => t.lock("k", forever).map(drop),
                "lock_shared" => t.lock_shared("k", forever).map(drop),
                "acquire" => sem.acquire(forever).map(drop),
                "Lock::lock" => Lock::new(&t, forever).unwrap().lock("k").map(drop),
                _ => Lock::new(&t, forever)
                    .unwrap()
                    .lock_with_timeout("k", Duration::MAX)
                    .map(drop),
            });
            std::thread::sleep(Duration::from_millis(100));
            assert!(!waiter.is_finished(), "{wait} did not wait");
            drop(guard);
            drop(permit);
            waiter.join().unwrap().unwrap();
        });
    }
}
