//! Loom models of shared holds: readers beside readers and never beside a writer, a
//! semaphore's count, a writer's mark that keeps new readers out, a dead reader's share
//! taken back, and a permit's release that wakes its waiter. The keys share their home
//! with another key so that claims take the general path (the fast path needs a free home
//! of reach 0, where no other entry of the key can be).

use super::*;

pub(super) fn shared_req(hash: KeyHash, pid: u32, lease: u64, limit: u32) -> Request<'static> {
    Request {
        mode: Mode::Shared { limit },
        ..req(hash, pid, lease)
    }
}

pub(super) fn take_shared(table: &T, k: KeyHash, pid: u32, lease: u64, limit: u32) -> Option<Held> {
    acquired(
        table
            .try_acquire(&shared_req(k, pid, lease, limit))
            .unwrap(),
    )
}

/// Live entries of `hash` by mode: (exclusive, shared).
pub(super) fn modes_of(table: &T, hash: KeyHash) -> (usize, usize) {
    let live: Vec<_> = table
        .entries()
        .into_iter()
        .filter(|e| e.hash == hash && matches!(e.word.state(), State::Held | State::Extending))
        .collect();
    let shared = live.iter().filter(|e| e.word.is_shared()).count();
    (live.len() - shared, shared)
}

/// Model S1 — a reader and a writer claim one key at once: never both win.
#[test]
fn a_reader_and_a_writer_never_both_win() {
    loom::model(|| {
        let m = model(3);
        let k = key(0, 3, 1, 7);
        let o = take(&m.table, key(0, 3, 2, 7), 9, 1).unwrap();
        let t = m.table.clone();
        let reader = thread::spawn(move || take_shared(&t, k, 1, 10, 0));
        let t = m.table.clone();
        let writer = thread::spawn(move || take(&t, k, 2, 11));
        let r = reader.join().unwrap();
        let w = writer.join().unwrap();
        assert!(!(r.is_some() && w.is_some()), "a writer beside a reader");
        let (x, s) = modes_of(&m.table, k);
        assert!(x == 0 || s == 0);
        for h in r.iter().chain(w.iter()) {
            m.table.release(h).unwrap();
        }
        m.table.release(&o).unwrap();
        assert!(take(&m.table, k, 3, 20).is_some());
    });
}

/// Model S2 — two readers claim beside a reader that leaves, while a writer claims: the
/// readers never lose to each other, and the writer never stands beside any of them.
#[test]
fn readers_share_while_a_writer_claims() {
    loom::model(|| {
        let m = model(4);
        let k = key(0, 4, 1, 7);
        let first = take_shared(&m.table, k, 9, 1, 0).unwrap();
        let t = m.table.clone();
        let reader = thread::spawn(move || take_shared(&t, k, 1, 10, 0));
        let t = m.table.clone();
        let writer = thread::spawn(move || {
            t.release(&first).unwrap();
            take(&t, k, 2, 11)
        });
        let r = reader.join().unwrap();
        let w = writer.join().unwrap();
        assert!(!(r.is_some() && w.is_some()), "a writer beside a reader");
        let (x, s) = modes_of(&m.table, k);
        assert!(x == 0 || s == 0);
        assert!(x <= 1);
    });
}

/// Model S3 — a semaphore of 2 with one permit held, two claimers at once: at most one
/// more gets in.
#[test]
fn a_semaphore_never_lets_in_more_than_its_count() {
    loom::model(|| {
        let m = model(4);
        let k = key(0, 4, 1, 7);
        let held = take_shared(&m.table, k, 9, 1, 2).unwrap();
        let ts: Vec<_> = (0..2)
            .map(|i| {
                let t = m.table.clone();
                thread::spawn(move || take_shared(&t, k, 1 + i, 10 + u64::from(i), 2))
            })
            .collect();
        let won = ts.into_iter().filter_map(|t| t.join().unwrap()).count();
        assert!(won <= 1, "three holders of a semaphore of two");
        assert!(modes_of(&m.table, k).1 <= 2);
        m.table.release(&held).unwrap();
    });
}

/// Model S4 — a writer waiting for a reader marks it; a reader that comes after the mark
/// is kept out, one that came before it got in, and the writer gets the key once the
/// readers are gone.
#[test]
fn a_waiting_writer_keeps_new_readers_out() {
    loom::model(|| {
        let m = model(4);
        let k = key(0, 4, 1, 7);
        let first = take_shared(&m.table, k, 9, 1, 0).unwrap();
        let t = m.table.clone();
        let writer = thread::spawn(move || {
            let b = busy(t.try_acquire(&req(k, 2, 11)).unwrap()).unwrap();
            assert_eq!(b.wait, crate::shm::table::WaitFor::Readers);
            t.prepare_wait(&b);
        });
        let t = m.table.clone();
        let reader = thread::spawn(move || take_shared(&t, k, 1, 10, 0));
        writer.join().unwrap();
        let late = take_shared(&m.table, k, 3, 12, 0);
        assert!(late.is_none(), "a reader joined after a writer's mark");
        m.table.release(&first).unwrap();
        if let Some(r) = reader.join().unwrap() {
            m.table.release(&r).unwrap();
        }
        assert!(take(&m.table, k, 2, 13).is_some());
    });
}

/// Model S5 — a dead reader's share is taken back by the writer that waits for it, while
/// a live reader's is not.
#[test]
fn a_dead_readers_share_is_taken_back() {
    loom::model(|| {
        let m = model(4);
        let k = key(0, 4, 1, 7);
        let _dead = take_shared(&m.table, k, 1, 1, 0).unwrap();
        let live = take_shared(&m.table, k, 2, 2, 0).unwrap();
        let env = m.env.clone();
        let killer = thread::spawn(move || env.kill(1));
        let t = m.table.clone();
        let writer = thread::spawn(move || {
            let r = req(k, 3, 3);
            match t.try_acquire(&r).unwrap() {
                Attempt::Busy(b) => {
                    t.recover(&b);
                }
                a => panic!("a writer beside readers: {a:?}"),
            }
        });
        killer.join().unwrap();
        writer.join().unwrap();
        // whatever the order, the live reader still holds and the writer waits for it
        assert!(take(&m.table, k, 3, 4).is_none());
        m.table.release(&live).unwrap();
        match m.table.try_acquire(&req(k, 3, 5)).unwrap() {
            Attempt::Acquired(_) => {} // the writer had taken the dead reader's share back
            Attempt::Busy(b) => {
                // the dead reader, if the writer looked before it died
                assert!(m.table.recover(&b), "a dead reader's share stuck");
                assert!(take(&m.table, k, 3, 6).is_some());
            }
            a => panic!("{a:?}"),
        }
    });
}

/// Model S6 — a permit's waiter that sleeps on the home's claim count is always woken by
/// the release of the permit it waits for.
#[test]
fn a_permits_release_wakes_its_waiter() {
    loom::model(|| {
        let m = model(3);
        let k = key(0, 3, 1, 7);
        let o = take(&m.table, key(0, 3, 2, 7), 9, 1).unwrap();
        let h = take_shared(&m.table, k, 1, 1, 1).unwrap();
        let t = m.table.clone();
        let holder = thread::spawn(move || t.release(&h).unwrap());
        let (t, env) = (m.table.clone(), m.env.clone());
        let waiter = thread::spawn(move || {
            let r = shared_req(k, 2, 2, 1);
            loop {
                match t.try_acquire(&r).unwrap() {
                    Attempt::Acquired(h) => return h,
                    Attempt::Busy(b) => match t.prepare_wait(&b) {
                        Prepared::Sleep(low) => env.futex_wait(t.wait_word(&b), low),
                        Prepared::Changed | Prepared::Poll => thread::yield_now(),
                    },
                    a => panic!("{a:?}"),
                }
            }
        });
        holder.join().unwrap();
        let h = waiter.join().unwrap();
        m.table.release(&h).unwrap();
        m.table.release(&o).unwrap();
    });
}

/// A reader's hold of `k` (pid 9) that a waiting writer (pid 2) has marked.
fn marked_reader(m: &Model, k: KeyHash) -> Held {
    let first = take_shared(&m.table, k, 9, 1, 0).unwrap();
    let b = busy(m.table.try_acquire(&req(k, 2, 11)).unwrap()).unwrap();
    m.table.prepare_wait(&b); // the writer marks `first`
    first
}

/// Model S7 — the last reader a writer waits for leaves while a new reader claims: the
/// key is kept for the writer (the release leaves a reservation), so the new reader never
/// gets in before it, and the writer then takes the key.
#[test]
fn the_last_marked_readers_release_keeps_the_key_for_the_writer() {
    loom::model(|| {
        let m = model(4);
        let k = key(0, 4, 1, 7);
        let first = marked_reader(&m, k);
        let t = m.table.clone();
        let leaving = thread::spawn(move || t.release(&first).unwrap());
        let t = m.table.clone();
        let reader = thread::spawn(move || take_shared(&t, k, 3, 12, 0));
        assert!(!leaving.join().unwrap(), "kept idle for its reader");
        assert!(
            reader.join().unwrap().is_none(),
            "a reader got in between the readers a writer waited for and the writer"
        );
        assert!(take(&m.table, k, 2, 13).is_some(), "the writer kept out");
    });
}

/// Model S8 — the writer and a new reader claim a key kept for the writer at once: the
/// writer always gets it, the reader never.
#[test]
fn a_key_kept_for_a_writer_goes_to_the_writer() {
    loom::model(|| {
        let m = model(4);
        let k = key(0, 4, 1, 7);
        let first = marked_reader(&m, k);
        m.table.release(&first).unwrap();
        let t = m.table.clone();
        let writer = thread::spawn(move || take(&t, k, 2, 13));
        let t = m.table.clone();
        let reader = thread::spawn(move || take_shared(&t, k, 3, 12, 0));
        let w = writer.join().unwrap();
        let r = reader.join().unwrap();
        assert!(r.is_none(), "a reader took the key kept for a writer");
        assert!(w.is_some(), "the writer did not get the key kept for it");
        let (x, s) = modes_of(&m.table, k);
        assert_eq!((x, s), (1, 0));
    });
}

/// Model S9 — a reader asleep on a key kept for a writer is woken when the writer takes
/// it (or, having looked after that, when the writer lets it go): never left asleep.
#[test]
fn a_reader_asleep_on_a_key_kept_for_a_writer_is_woken() {
    loom::model(|| {
        let m = model(4);
        let k = key(0, 4, 1, 7);
        let first = marked_reader(&m, k);
        m.table.release(&first).unwrap();
        let (t, env) = (m.table.clone(), m.env.clone());
        let reader = thread::spawn(move || {
            let r = shared_req(k, 3, 12, 0);
            match t.try_acquire(&r).unwrap() {
                Attempt::Acquired(h) => Some(h),
                Attempt::Busy(b) => {
                    if let Prepared::Sleep(low) = t.prepare_wait(&b) {
                        env.futex_wait(t.wait_word(&b), low);
                    }
                    None
                }
                a => panic!("{a:?}"),
            }
        });
        let t = m.table.clone();
        let writer = thread::spawn(move || {
            let h = take(&t, k, 2, 13).expect("the writer got the key kept for it");
            t.release(&h).unwrap();
        });
        writer.join().unwrap();
        if let Some(h) = reader.join().unwrap() {
            m.table.release(&h).unwrap();
        }
    });
}

/// Model S8 — a writer's release keeps the key for the reader waiting for it (`idle.rs`),
/// while a second reader claims the key and a writer, which finds the readers' mark
/// lapsed, takes the kept key back and claims: the writer never stands beside a reader,
/// and a writer that finds the key kept for readers (their mark fresh) waits. The key's
/// home holds another key and a free slot lies before the kept one, so that a claim that
/// passed the kept entry by would stand beside the reader who claimed it in place.
#[test]
fn a_key_kept_for_readers_never_lets_a_writer_beside_them() {
    loom::model(|| {
        let m = model(4);
        let k = key(0, 4, 1, 7);
        let other = take(&m.table, key(0, 4, 2, 7), 9, 1).unwrap();
        let between = take(&m.table, key(0, 4, 3, 7), 8, 2).unwrap();
        let w1 = take(&m.table, k, 3, 3).unwrap();
        assert_eq!(w1.slot, 2);
        m.table.release(&between).unwrap();
        // a reader waits for the writer: it marks the hold
        let b = busy(m.table.try_acquire(&shared_req(k, 4, 4, 0)).unwrap()).unwrap();
        assert_eq!(b.wait, crate::shm::table::WaitFor::Writer);
        m.table.prepare_wait(&b);
        let t = m.table.clone();
        let release = thread::spawn(move || t.release_exclusive(&w1).unwrap());
        let t = m.table.clone();
        let reader = thread::spawn(move || take_shared(&t, k, 4, 10, 0));
        let (t, env) = (m.table.clone(), m.env.clone());
        let writer = thread::spawn(move || {
            env.readers_gone.store(true, Ordering::SeqCst);
            take(&t, k, 5, 11)
        });
        release.join().unwrap();
        let r = reader.join().unwrap();
        let w = writer.join().unwrap();
        assert!(!(r.is_some() && w.is_some()), "a writer beside a reader");
        let (x, s) = modes_of(&m.table, k);
        assert!(x == 0 || s == 0, "{x} writers beside {s} readers");
        for h in r.iter().chain(w.iter()) {
            m.table.release(h).unwrap();
        }
        m.table.release(&other).unwrap();
        assert!(take(&m.table, k, 6, 20).is_some(), "the key left kept");
    });
}

/// Model S9 — a writer's release keeps the key for the readers waiting for it: a writer
/// that looks while they are still waiting is refused (kept or held), a reader gets in.
#[test]
fn a_writers_release_keeps_the_key_for_waiting_readers() {
    loom::model(|| {
        let m = model(3);
        let k = key(0, 3, 1, 7);
        let other = take(&m.table, key(0, 3, 2, 7), 9, 1).unwrap();
        let w1 = take(&m.table, k, 3, 3).unwrap();
        let b = busy(m.table.try_acquire(&shared_req(k, 4, 4, 0)).unwrap()).unwrap();
        m.table.prepare_wait(&b);
        let t = m.table.clone();
        let release = thread::spawn(move || t.release_exclusive(&w1).unwrap());
        let t = m.table.clone();
        let writer = thread::spawn(move || take(&t, k, 5, 11));
        release.join().unwrap();
        assert!(
            writer.join().unwrap().is_none(),
            "a writer went before the readers"
        );
        let r = take_shared(&m.table, k, 4, 10, 0).expect("the kept key refused a reader");
        assert_eq!(r.slot, w1.slot, "the reader took the kept entry");
        m.table.release(&r).unwrap();
        m.table.release(&other).unwrap();
    });
}
