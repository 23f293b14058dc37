//! Loom models of idle shared entries (`table/idle.rs`): a process's re-entry of its idle
//! entry races a writer's claim, another permit's claim, and a writer's mark. The key's
//! home holds another key, and a free slot lies between it and the idle entry, so that a
//! claim that passed the idle entry by would claim the free slot and stand beside the
//! re-entered hold (what the broken variant, `SHMLOCK_BROKEN=idle`, does).

use super::shared::{modes_of, shared_req, take_shared};
use super::*;

/// A table of 4 slots: another key's hold at the home (slot 0), and `pid`'s idle entry of
/// `k` (mode `limit`) at slot 2, slot 1 free. Returns the other key's hold and the slot.
fn idle_at_two(m: &Model, k: KeyHash, pid: u32, limit: u32) -> (Held, usize) {
    let other = take(&m.table, key(0, 4, 2, 7), 9, 1).unwrap();
    let between = take(&m.table, key(0, 4, 3, 7), 8, 2).unwrap();
    let h = take_shared(&m.table, k, pid, 3, limit).unwrap();
    assert_eq!(h.slot, 2);
    assert!(
        m.table.release(&h).unwrap(),
        "released with nobody waiting: kept idle"
    );
    m.table.release(&between).unwrap();
    (other, h.slot)
}

/// Model I1 — a reader takes its idle entry again while a writer claims the key: never
/// both.
#[test]
fn a_readers_reentry_and_a_writer_never_both_win() {
    loom::model(|| {
        let m = model(4);
        let k = key(0, 4, 1, 7);
        let (other, slot) = idle_at_two(&m, k, 1, 0);
        let t = m.table.clone();
        let reader = thread::spawn(move || t.try_reenter(&shared_req(k, 1, 10, 0), slot, 0));
        let t = m.table.clone();
        let writer = thread::spawn(move || take(&t, k, 2, 11));
        let r = reader.join().unwrap();
        let w = writer.join().unwrap();
        assert!(
            !(r.is_some() && w.is_some()),
            "a writer beside a re-entered reader"
        );
        let (x, s) = modes_of(&m.table, k);
        assert!(x == 0 || s == 0);
        for h in r.iter().chain(w.iter()) {
            m.table.release(h).unwrap();
        }
        m.table.release(&other).unwrap();
        assert!(take(&m.table, k, 3, 20).is_some());
    });
}

/// Model I2 — a semaphore of one: its holder's re-entry races another process's claim
/// of the permit; at most one holds it.
#[test]
fn a_permits_reentry_never_exceeds_the_count() {
    loom::model(|| {
        let m = model(4);
        let k = key(0, 4, 1, 7);
        let (other, slot) = idle_at_two(&m, k, 1, 1);
        let t = m.table.clone();
        let again = thread::spawn(move || t.try_reenter(&shared_req(k, 1, 10, 1), slot, 0));
        let t = m.table.clone();
        let rival = thread::spawn(move || take_shared(&t, k, 2, 11, 1));
        let a = again.join().unwrap();
        let b = rival.join().unwrap();
        assert!(
            !(a.is_some() && b.is_some()),
            "two holders of a semaphore of one"
        );
        assert!(modes_of(&m.table, k).1 <= 1);
        for h in a.iter().chain(b.iter()) {
            m.table.release(h).unwrap();
        }
        m.table.release(&other).unwrap();
    });
}

/// Model I3 — a writer waiting for a reader marks it while another reader takes its idle
/// entry again: that reader either got in before the mark (and is waited for) or is kept
/// out after it, and the writer gets the key once the readers are gone.
#[test]
fn a_waiting_writer_keeps_idle_readers_out() {
    loom::model(|| {
        let m = model(4);
        let k = key(0, 4, 1, 7);
        let (other, slot) = idle_at_two(&m, k, 1, 0);
        let first = take_shared(&m.table, k, 4, 4, 0).unwrap();
        let t = m.table.clone();
        let writer = thread::spawn(move || {
            let b = busy(t.try_acquire(&req(k, 2, 11)).unwrap()).unwrap();
            assert_eq!(b.wait, crate::shm::table::WaitFor::Readers);
            t.prepare_wait(&b);
        });
        let t = m.table.clone();
        let reader = thread::spawn(move || t.try_reenter(&shared_req(k, 1, 10, 0), slot, 0));
        writer.join().unwrap();
        assert!(
            m.table
                .try_reenter(&shared_req(k, 1, 12, 0), slot, 0)
                .is_none(),
            "a reader came back after a writer's mark"
        );
        m.table.release(&first).unwrap();
        if let Some(r) = reader.join().unwrap() {
            assert!(
                take(&m.table, k, 2, 13).is_none(),
                "a writer beside a reader"
            );
            m.table.release(&r).unwrap();
        }
        assert!(take(&m.table, k, 2, 14).is_some());
        m.table.release(&other).unwrap();
    });
}

/// Model I4 — a table whose only slot left is an idle entry: a claim of another key
/// takes it as free while its owner takes it again, and exactly one of them gets it; an
/// idle entry is never reported as a hold.
#[test]
fn an_idle_entry_is_free_to_a_claim_that_needs_it() {
    loom::model(|| {
        let m = model(3);
        let k = key(0, 3, 1, 7);
        let a = take(&m.table, key(0, 3, 2, 7), 9, 1).unwrap();
        let b = take(&m.table, key(0, 3, 3, 7), 8, 2).unwrap();
        let h = take_shared(&m.table, k, 1, 3, 0).unwrap();
        assert!(m.table.release(&h).unwrap());
        assert_eq!(modes_of(&m.table, k), (0, 0));
        assert!(m.table.find(k).is_none());
        assert_eq!(m.table.entries().len(), 2);
        let t = m.table.clone();
        let owner = thread::spawn(move || t.try_reenter(&shared_req(k, 1, 10, 0), h.slot, 0));
        let t = m.table.clone();
        let other = thread::spawn(move || t.try_acquire(&req(key(0, 3, 4, 7), 2, 11)));
        let again = owner.join().unwrap();
        let claim = other.join().unwrap();
        match (again, claim) {
            (Some(_), Err(_)) => {}
            (None, Ok(Attempt::Acquired(w))) => assert_eq!(w.slot, h.slot),
            (a, c) => panic!("the idle slot went to {a:?} and {c:?}"),
        }
        m.table.release(&a).unwrap();
        m.table.release(&b).unwrap();
    });
}
