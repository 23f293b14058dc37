//! Read locks and semaphores on the lock table, within one process: who may stand beside
//! whom, counts that do not match, downgrades, tokens, and what inspection shows. Across
//! processes (forks, kills, stops): `shared_procs.rs`.

mod common;

use std::time::Duration;

use common::{opts, TempPath};
use shmlock::{Error, HoldMode, Lock, LockTable};
#[cfg(feature = "tokio")]
use std::time::Instant;

const LONG: Duration = Duration::from_secs(60);

fn table(name: &str) -> (TempPath, LockTable) {
    let path = TempPath::new(name);
    let t = LockTable::open(&path, 64).unwrap();
    (path, t)
}

#[test]
fn readers_stand_together_and_a_writer_alone() {
    let (_p, t) = table("readers-writer");
    let readers: Vec<_> = (0..20)
        .map(|_| {
            t.try_lock_shared("k", LONG)
                .unwrap()
                .expect("readers share")
        })
        .collect();
    assert!(t.try_lock_with_lease("k", LONG).unwrap().is_none());
    assert!(t.is_locked("k").unwrap());
    assert_eq!(
        t.holders()
            .iter()
            .filter(|h| h.mode == HoldMode::Shared)
            .count(),
        20
    );
    drop(readers);
    let w = t
        .try_lock_with_lease("k", LONG)
        .unwrap()
        .expect("free again");
    assert!(t.try_lock_shared("k", LONG).unwrap().is_none());
    let err = t.lock_shared("k", opts(1000, 30)).unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    drop(w);
    assert!(!t.is_locked("k").unwrap());
}

#[test]
fn a_semaphore_lets_in_its_count_and_no_more() {
    let (_p, t) = table("sem-count");
    let s = t.semaphore("gpu", 3).unwrap();
    assert_eq!(s.permits(), 3);
    let held: Vec<_> = (0..3)
        .map(|_| s.try_acquire(LONG).unwrap().expect("a permit is free"))
        .collect();
    assert_eq!(s.held(), 3);
    assert!(s.try_acquire(LONG).unwrap().is_none());
    assert!(matches!(
        s.acquire(opts(1000, 20)).unwrap_err(),
        Error::Timeout { .. }
    ));
    // a writer of the same key waits for all of them
    assert!(t.try_lock_with_lease("gpu", LONG).unwrap().is_none());
    let mut held = held;
    held.pop();
    assert_eq!(s.held(), 2);
    let again = s.try_acquire(LONG).unwrap().expect("one came back");
    assert!(s.try_acquire(LONG).unwrap().is_none());
    drop((held, again));
    assert_eq!(s.held(), 0);
    assert!(t
        .holders()
        .iter()
        .all(|h| h.mode != HoldMode::Permit { permits: 3 }));
}

#[test]
fn a_count_that_does_not_match_is_an_error_naming_both() {
    let (_p, t) = table("sem-mismatch");
    let two = t.semaphore("k", 2).unwrap();
    let _p1 = two.try_acquire(LONG).unwrap().unwrap();
    let three = t.semaphore("k", 3).unwrap();
    match three.try_acquire(LONG) {
        Err(Error::PermitsMismatch { held, asked, .. }) => assert_eq!((held, asked), (2, 3)),
        other => panic!("{other:?}"),
    }
    let err = t.lock_shared("k", opts(1000, 1000)).unwrap_err();
    assert!(matches!(
        err,
        Error::PermitsMismatch {
            held: 2,
            asked: 0,
            ..
        }
    ));
    assert!(
        err.to_string().contains("a semaphore of 2 permits"),
        "{err}"
    );
    // the other way round: readers first
    let _r = t.try_lock_shared("r", LONG).unwrap().unwrap();
    match t.semaphore("r", 4).unwrap().try_acquire(LONG) {
        Err(Error::PermitsMismatch { held, asked, .. }) => assert_eq!((held, asked), (0, 4)),
        other => panic!("{other:?}"),
    }
    // once nobody holds it, a key takes any count
    drop(_p1);
    assert!(three.try_acquire(LONG).unwrap().is_some());
}

#[test]
fn bad_semaphores_are_refused() {
    let (_p, t) = table("sem-bad");
    assert!(matches!(t.semaphore("k", 0), Err(Error::InvalidOptions(_))));
    assert!(matches!(
        t.semaphore("k", 65),
        Err(Error::InvalidOptions(_))
    ));
    assert!(matches!(t.semaphore("", 1), Err(Error::EmptyKey)));
    assert!(t.semaphore("k", 64).is_ok());
    assert!(matches!(
        t.lock_shared("", opts(10, 10)),
        Err(Error::EmptyKey)
    ));
}

#[test]
fn downgrade_lets_readers_in_and_keeps_writers_out() {
    let (_p, t) = table("downgrade");
    let w = t.lock("k", opts(60_000, 0)).unwrap();
    let token = w.token().unwrap();
    assert!(t.try_lock_shared("k", LONG).unwrap().is_none());
    let r = w.downgrade().unwrap();
    let other = t
        .try_lock_shared("k", LONG)
        .unwrap()
        .expect("a reader joins");
    assert!(t.try_lock_with_lease("k", LONG).unwrap().is_none());
    // the reader's token tells which write it reads: at least the writer's, below the next
    let seen = r.token().unwrap();
    assert!(seen >= token, "{seen} < {token}");
    assert_eq!(other.token().unwrap(), seen);
    drop((r, other));
    let next = t.lock("k", opts(60_000, 0)).unwrap();
    assert!(next.token().unwrap() > seen);
    // a lost hold cannot be downgraded
    t.force_unlock("k").unwrap();
    assert!(matches!(next.downgrade(), Err(Error::Expired)));
    // nor one whose lease ran out, though nobody took it yet: a writer could come at any
    // moment, so it is no reader's either; it is released
    let lapsed = t
        .try_lock_with_lease("e", Duration::from_millis(50))
        .unwrap()
        .unwrap();
    std::thread::sleep(Duration::from_millis(120));
    assert!(matches!(lapsed.downgrade(), Err(Error::Expired)));
    assert!(!t.is_locked("e").unwrap());
    assert!(t.try_lock_with_lease("e", LONG).unwrap().is_some());
}

/// A reader of a key no writer ever held takes the counter's first value as its token,
/// the file's base itself; inspection shows it as it shows any other token.
#[test]
fn inspection_shows_the_token_of_a_reader_before_any_writer() {
    let (_p, t) = table("first-token");
    let r = t.lock_shared("k", opts(60_000, 0)).unwrap();
    let sem = t.semaphore("s", 2).unwrap();
    let p = sem.acquire(opts(60_000, 0)).unwrap();
    let (rt, pt) = (r.token().unwrap(), p.token().unwrap());
    let holders = t.holders();
    let shown = |mode: fn(&HoldMode) -> bool| {
        let h: Vec<_> = holders.iter().filter(|h| mode(&h.mode)).collect();
        assert_eq!(h.len(), 1, "{holders:?}");
        h[0].token
    };
    assert_eq!(shown(|m| *m == HoldMode::Shared), Some(rt));
    assert_eq!(shown(|m| matches!(m, HoldMode::Permit { .. })), Some(pt));
    // and a holder that took no token shows none
    let _w = t.lock("w", opts(60_000, 0)).unwrap();
    let w = t
        .holders()
        .into_iter()
        .find(|h| h.key_preview == b"w")
        .unwrap();
    assert_eq!(w.token, None);
}

/// A hold that took no token is never shown one: not the token of the hold before it of
/// the same key, thread and clock tick (their labels were the same, so a writer after a
/// reader, or a hold taken again at once, was shown its predecessor's).
#[test]
fn inspection_never_shows_a_token_the_hold_did_not_take() {
    let (_p, t) = table("no-stale-token");
    let shown = |key: &str| {
        t.holders()
            .into_iter()
            .find(|h| h.key_preview == key.as_bytes())
            .expect("held")
            .token
    };
    for i in 0..50 {
        let (k, r) = (format!("k{i}"), format!("r{i}"));
        let g = t.try_lock_with_lease(&k, LONG).unwrap().unwrap();
        assert!(g.token().is_some());
        drop(g);
        let again = t.try_lock_with_lease(&k, LONG).unwrap().unwrap();
        assert_eq!(
            shown(&k),
            None,
            "{k}: a re-take shown its predecessor's token"
        );
        drop(again);
        let reader = t.try_lock_shared(&r, LONG).unwrap().unwrap();
        assert!(reader.token().is_some());
        drop(reader);
        let writer = t.try_lock_with_lease(&r, LONG).unwrap().unwrap();
        assert_eq!(shown(&r), None, "{r}: a writer shown its reader's token");
        let token = writer.token().unwrap();
        assert_eq!(shown(&r), Some(token), "{r}: a token taken is shown");
    }
    // A guard whose hold was broken, dropped after the same thread took the key again in
    // the same tick (the same label), leaves the new hold's token shown.
    for i in 0..50 {
        let k = format!("f{i}");
        let broken = t.try_lock_with_lease(&k, LONG).unwrap().unwrap();
        assert!(broken.token().is_some());
        t.force_unlock(&k).unwrap().expect("held");
        let next = t.try_lock_with_lease(&k, LONG).unwrap().unwrap();
        let token = next.token().unwrap();
        drop(broken);
        assert_eq!(
            shown(&k),
            Some(token),
            "{k}: a broken guard hid its successor's token"
        );
    }
}

#[test]
fn a_shared_hold_has_a_lease_renewals_and_owner_checked_release() {
    let (_p, t) = table("shared-lease");
    let mut r = t.lock_shared("k", opts(50, 0)).unwrap();
    r.expire(Some(LONG)).unwrap();
    r.check().unwrap();
    let short = t.lock_shared("k", opts(20, 0)).unwrap();
    std::thread::sleep(Duration::from_millis(60));
    assert!(matches!(short.check(), Err(Error::Expired)));
    // the expired reader no longer keeps a writer out once the live one goes
    drop(r);
    let w = t.lock("k", opts(1000, 0)).unwrap();
    assert!(matches!(short.unlock(), Err(Error::Expired)));
    w.unlock().unwrap();
}

#[test]
fn a_resty_lock_object_reads_over_the_shared_view() {
    let (_p, t) = table("shared-lock-object");
    let mut a = Lock::new(t.shared(), opts(1000, 0)).unwrap();
    let mut b = Lock::new(t.shared(), opts(1000, 0)).unwrap();
    assert_eq!(a.lock("k").unwrap(), Duration::ZERO);
    assert_eq!(b.lock("k").unwrap(), Duration::ZERO);
    let mut w = Lock::new(&t, opts(1000, 0)).unwrap();
    assert!(matches!(w.lock("k"), Err(Error::Timeout { .. })));
    a.unlock().unwrap();
    b.unlock().unwrap();
    w.lock("k").unwrap();
}

/// A semaphore as a `Lock` object's backend (or `get_or_fetch`'s) is a semaphore of as
/// many permits on whichever key it is given, each key with its own count; its `held()`
/// counts its own key's.
#[test]
fn a_resty_lock_object_over_a_semaphore_counts_permits_per_key() {
    let (_p, t) = table("semaphore-lock-object");
    let gpus = t.semaphore("gpu", 2).unwrap();
    let lock = || Lock::new(&gpus, opts(1000, 0)).unwrap();
    let (mut a, mut b, mut c) = (lock(), lock(), lock());
    a.lock("other").unwrap();
    b.lock("other").unwrap();
    assert!(matches!(c.lock("other"), Err(Error::Timeout { .. })));
    assert_eq!(
        (t.semaphore("other", 2).unwrap().held(), gpus.held()),
        (2, 0)
    );
    c.lock("gpu").unwrap();
    assert_eq!(gpus.held(), 1);
    // another count on a key in use is refused, naming both
    assert!(matches!(
        t.semaphore("other", 3).unwrap().try_acquire(LONG),
        Err(Error::PermitsMismatch {
            held: 2,
            asked: 3,
            ..
        })
    ));
}

#[test]
fn force_unlock_breaks_every_holder_of_a_key() {
    let (_p, t) = table("shared-force");
    let s = t.semaphore("k", 5).unwrap();
    let held: Vec<_> = (0..4)
        .map(|_| s.try_acquire(LONG).unwrap().unwrap())
        .collect();
    let was = t.force_unlock("k").unwrap().expect("held");
    assert_eq!(was.mode, HoldMode::Permit { permits: 5 });
    assert_eq!(s.held(), 0);
    for h in held {
        assert!(matches!(h.unlock(), Err(Error::Expired)));
    }
}

#[test]
fn many_keys_of_readers_and_permits_share_one_table() {
    let (_p, t) = table("shared-many");
    let mut guards = Vec::new();
    for k in 0..20 {
        guards.push(t.try_lock_shared(format!("r{k}"), LONG).unwrap().unwrap());
        guards.push(t.try_lock_shared(format!("r{k}"), LONG).unwrap().unwrap());
    }
    let sems: Vec<_> = (0..10)
        .map(|k| t.semaphore(format!("s{k}"), 2).unwrap())
        .collect();
    let permits: Vec<_> = sems
        .iter()
        .flat_map(|s| {
            [
                s.try_acquire(LONG).unwrap().unwrap(),
                s.try_acquire(LONG).unwrap().unwrap(),
            ]
        })
        .collect();
    for s in &sems {
        assert!(s.try_acquire(LONG).unwrap().is_none());
    }
    for k in 0..20 {
        assert!(t
            .try_lock_with_lease(format!("r{k}"), LONG)
            .unwrap()
            .is_none());
    }
    drop((guards, permits));
    assert_eq!(t.holders().len(), 0);
}

#[cfg(feature = "tokio")]
mod asynchronous {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn async_readers_share_and_a_waiting_writer_is_woken_by_the_last() {
        let (_p, t) = table("async-readers");
        runtime().block_on(async {
            let a = t.lock_shared_async("k", opts(60_000, 0)).await.unwrap();
            let b = t.lock_shared_async("k", opts(60_000, 0)).await.unwrap();
            let writer = async {
                let w = t.lock("k", opts(60_000, 0));
                assert!(w.is_err(), "a writer beside readers");
                let started = Instant::now();
                let w = t.lock_async("k", opts(60_000, 10_000)).await.unwrap();
                (w, started.elapsed())
            };
            let readers = async {
                tokio::time::sleep(Duration::from_millis(30)).await;
                // the writer waits: a new reader stays out
                assert!(t.try_lock_shared("k", LONG).unwrap().is_none());
                drop(a);
                tokio::time::sleep(Duration::from_millis(10)).await;
                drop(b);
            };
            let ((w, waited), ()) = tokio::join!(writer, readers);
            assert!(waited >= Duration::from_millis(35), "{waited:?}");
            assert!(w.elapsed() > Duration::ZERO);
        });
    }

    #[test]
    fn async_permits_never_exceed_the_count_and_all_get_through() {
        let (_p, t) = table("async-permits");
        let sem = t.semaphore("gpu", 3).unwrap();
        let inside = Rc::new(Cell::new(0));
        let most = Rc::new(Cell::new(0));
        runtime().block_on(async {
            let tasks = (0..12).map(|i| {
                let (inside, most, sem) = (inside.clone(), most.clone(), &sem);
                async move {
                    let p = sem.acquire_async(opts(60_000, 10_000)).await.unwrap();
                    inside.set(inside.get() + 1);
                    most.set(most.get().max(inside.get()));
                    tokio::time::sleep(Duration::from_millis(2 + i % 3)).await;
                    inside.set(inside.get() - 1);
                    drop(p);
                }
            });
            futures_join_all(tasks).await;
        });
        assert_eq!(most.get(), 3);
        assert_eq!(sem.held(), 0);
    }

    /// A `lock_shared_async` or `acquire_async` future dropped at any await point leaves no
    /// hold behind.
    #[test]
    fn dropped_async_waits_leave_nothing() {
        let (_p, t) = table("async-cancel");
        let sem = t.semaphore("s", 1).unwrap();
        let rt = runtime();
        for polls in 1..12u32 {
            let w = t.lock("k", opts(60_000, 0)).unwrap();
            let p = sem.try_acquire(LONG).unwrap().unwrap();
            rt.block_on(async {
                let reader = std::pin::pin!(t.lock_shared_async("k", opts(60_000, 5_000)));
                let permit = std::pin::pin!(sem.acquire_async(opts(60_000, 5_000)));
                let (mut reader, mut permit) = (reader, permit);
                for _ in 0..polls {
                    tokio::select! {
                        biased;
                        r = &mut reader => panic!("a reader beside a writer: {r:?}"),
                        r = &mut permit => panic!("two permits of one: {r:?}"),
                        () = tokio::time::sleep(Duration::from_micros(300)) => {}
                    }
                }
            });
            drop((w, p));
            assert!(t.holders().is_empty(), "left behind after {polls} polls");
        }
    }

    /// Runs the futures concurrently on this task until all are done.
    async fn futures_join_all<F: std::future::Future<Output = ()>>(fs: impl Iterator<Item = F>) {
        let mut fs: Vec<Option<std::pin::Pin<Box<F>>>> = fs.map(|f| Some(Box::pin(f))).collect();
        std::future::poll_fn(|cx| {
            for slot in fs.iter_mut() {
                if let Some(f) = slot {
                    if f.as_mut().poll(cx).is_ready() {
                        *slot = None;
                    }
                }
            }
            if fs.iter().all(Option::is_none) {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
        .await
    }
}

/// A read hold or permit given back with nobody waiting stays in the table, idle, for
/// this process to take again in one step: it is nobody's hold meanwhile, to inspection,
/// to `is_locked`, to a writer, to the semaphore's count and to a table short of room.
#[test]
fn a_released_shared_hold_left_idle_is_nobodys() {
    let path = TempPath::new("idle-nobodys");
    let t = LockTable::open(&path, 1).unwrap(); // 4 slots
    let r = t.lock_shared("k", opts(60_000, 1_000)).unwrap();
    let (_, slot) = t.debug_placement("k").unwrap();
    drop(r);
    assert!(!t.is_locked("k").unwrap());
    assert!(t.holders().is_empty(), "{:?}", t.holders());
    // taken again in the same slot
    let r = t.lock_shared("k", opts(60_000, 1_000)).unwrap();
    assert_eq!(t.debug_placement("k").unwrap().1, slot);
    drop(r);
    // a writer takes the key at once
    let w = t
        .try_lock_with_lease("k", LONG)
        .unwrap()
        .expect("nobody holds it");
    assert_eq!(t.holders().len(), 1);
    drop(w);
    let s = t.semaphore("gpu", 1).unwrap();
    drop(s.try_acquire(LONG).unwrap().unwrap());
    assert_eq!(s.held(), 0);
    let p = s.try_acquire(LONG).unwrap().expect("the permit came back");
    drop(p);
    // idle entries of four keys fill every slot: exclusive holds still find room
    for k in ["a", "b", "c", "d"] {
        drop(t.lock_shared(k, opts(60_000, 1_000)).unwrap());
    }
    let held: Vec<_> = ["e", "f", "g", "h"]
        .iter()
        .map(|k| {
            t.try_lock_with_lease(k, LONG)
                .unwrap_or_else(|e| panic!("{k}: {e}"))
                .expect("free")
        })
        .collect();
    assert_eq!(t.holders().len(), 4);
    drop(held);
    for k in ["a", "b", "c", "d"] {
        drop(t.lock_shared(k, opts(60_000, 1_000)).unwrap());
    }
}

/// Two keys of one home, read in turn by one process: each takes its idle entry again in
/// one step, neither claims anew (a claim counts at the home, and the home's fencing
/// counter shows it), and neither knocks the other's entry out of the process's cache.
#[test]
fn two_keys_of_one_home_read_in_turn_keep_their_idle_entries() {
    let path = TempPath::new("idle-one-home");
    let t = LockTable::open(&path, 1).unwrap(); // 4 slots
    let o = opts(60_000, 1_000);
    let k = "k";
    let home = {
        let _held = t.lock_shared(k, o).unwrap();
        t.debug_placement(k).unwrap().0
    };
    let c = (0..10_000)
        .map(|i| format!("c{i}"))
        .find(|c| {
            let g = t.lock_shared(c, o).unwrap();
            let same = t.debug_placement(c).unwrap().0 == home;
            drop(g);
            same
        })
        .expect("a key of the same home");
    let token = || {
        let w = t.lock(k, o).unwrap();
        let n = w.token().expect("a token");
        drop(w);
        n
    };
    // both idle: the home key at its home, the other one away from it
    drop((t.lock_shared(k, o).unwrap(), t.lock_shared(&c, o).unwrap()));
    let before = token();
    for _ in 0..200 {
        drop(t.lock_shared(k, o).unwrap());
        drop(t.lock_shared(&c, o).unwrap());
    }
    let after = token();
    assert!(
        after - before < 20,
        "{} claims counted at the home in 200 rounds",
        after - before
    );
}
