//! Unit tests of the slot protocol on heap slots, with a settable clock, owners declared
//! dead by hand and stalls on demand (the loom models are `shm/loom_tests.rs`).

use super::*;
use std::cell::Cell;
use std::collections::HashSet;
use std::sync::Mutex;

/// Heap slots, a settable clock, dead owners by hand, stalls on demand.
#[derive(Default)]
struct TestEnv {
    now: Cell<u64>,
    dead: Mutex<HashSet<OwnerId>>,
    stalled: Cell<bool>,
}

impl Env for TestEnv {
    fn now(&self) -> u64 {
        self.now.get()
    }
    fn is_dead(&self, owner: OwnerId) -> bool {
        self.dead.lock().unwrap().contains(&owner)
    }
    fn wake_all(&self, _: &AtomicU64) {}
    fn stalled(&self, _: &AtomicU64, _: Word) -> bool {
        self.stalled.get()
    }
}

struct Heap(Vec<Slot>, Vec<Cold>);
impl Slots for Heap {
    fn hot(&self) -> &[Slot] {
        &self.0
    }
    fn cold(&self) -> &[Cold] {
        &self.1
    }
}

fn table(n: usize) -> Table<Heap, TestEnv> {
    let heap = Heap(
        (0..n).map(|_| Slot::default()).collect(),
        (0..n).map(|_| Cold::default()).collect(),
    );
    let env = TestEnv::default();
    env.now.set(1000);
    Table::new(heap, env)
}

fn request(hash: KeyHash, owner: OwnerId, lease: u64) -> Request<'static> {
    Request {
        key: b"k",
        hash,
        owner,
        lease,
        exptime: 60_000,
        mode: Mode::Exclusive,
    }
}

fn held(a: Result<Attempt, TableFull>) -> Held {
    match a {
        Ok(Attempt::Acquired(h)) => h,
        other => panic!("not acquired: {other:?}"),
    }
}

fn busy_of(a: Result<Attempt, TableFull>) -> Busy {
    match a {
        Ok(Attempt::Busy(b)) => b,
        other => panic!("not busy: {other:?}"),
    }
}

const A: OwnerId = OwnerId::UNKNOWN;

#[test]
fn a_dead_owner_is_reaped_and_a_live_one_is_not() {
    let t = table(8);
    let me = OwnerId::new(1, 1);
    let other = OwnerId::new(2, 1);
    let hash = KeyHash::of(b"k", 1);
    held(t.try_acquire(&request(hash, other, 1)));
    let b = busy_of(t.try_acquire(&request(hash, me, 2)));
    assert!(!t.recover(&b), "a live owner's hold was taken");
    t.env().dead.lock().unwrap().insert(other);
    assert!(t.recover(&b));
    let h = held(t.try_acquire(&request(hash, me, 3)));
    assert_eq!(t.reap_all(), 0);
    t.release(&h).unwrap();
}

#[test]
fn an_unknown_owner_is_never_judged_and_expiry_still_works() {
    let t = table(8);
    let hash = KeyHash::of(b"k", 1);
    let h = held(t.try_acquire(&request(hash, A, 1)));
    let b = busy_of(t.try_acquire(&request(hash, OwnerId::new(1, 1), 2)));
    assert!(!t.recover(&b));
    t.env().now.set(1000 + 60_000);
    held(t.try_acquire(&request(hash, OwnerId::new(1, 1), 3)));
    assert_eq!(t.release(&h), Err(Lost));
}

#[test]
fn a_stalled_claim_is_broken_and_its_owner_backs_out() {
    let t = table(8);
    let hash = KeyHash::of(b"k", 1);
    let home = hash.home(8);
    let slot = &t.slots()[home];
    // a claimer that stopped right after its claim CAS
    let c = Word(slot.control.load(Ordering::Relaxed));
    let claiming = Word::new(State::Claiming, hash.tag(), A, c.gen() + 1, c);
    slot.control.store(claiming.0, Ordering::Relaxed);
    let b = busy_of(t.try_acquire(&request(hash, OwnerId::new(1, 1), 2)));
    assert!(!t.recover(&b), "broken before the bound");
    t.env().stalled.set(true);
    assert!(t.recover(&b));
    assert_eq!(t.word(home, Ordering::Relaxed).state(), State::Broken);
    // the key is free again (elsewhere), the broken slot is out of use
    let h = held(t.try_acquire(&request(hash, OwnerId::new(1, 1), 3)));
    assert_ne!(h.slot, home);
    // the stopped claimer resumes: its promote fails and it frees its own slot
    assert_eq!(t.promote(slot, claiming), Err(Lost));
    assert_eq!(t.word(home, Ordering::Relaxed).state(), State::Free);
    assert_eq!(t.entries().len(), 1);
    t.release(&h).unwrap();
}

#[test]
fn an_extension_is_broken_only_past_its_deadline() {
    let t = table(8);
    let hash = KeyHash::of(b"k", 1);
    let h = held(t.try_acquire(&request(hash, A, 1)));
    let slot = &t.slots()[h.slot];
    let ext = h.word.next(State::Extending);
    slot.control.store(ext.0, Ordering::Relaxed);
    t.env().stalled.set(true);
    let b = busy_of(t.try_acquire(&request(hash, OwnerId::new(1, 1), 2)));
    assert!(!t.recover(&b), "a lease still running was broken");
    t.env().now.set(1000 + 60_000);
    assert!(t.recover(&b));
    assert_eq!(t.word(h.slot, Ordering::Relaxed).state(), State::Broken);
}

#[test]
fn force_unlock_breaks_a_claim_in_progress() {
    let t = table(8);
    let hash = KeyHash::of(b"k", 1);
    let home = hash.home(8);
    let slot = &t.slots()[home];
    let c = Word(slot.control.load(Ordering::Relaxed));
    let claiming = Word::new(
        State::Claiming,
        hash.tag(),
        OwnerId::new(3, 1),
        c.gen() + 1,
        c,
    );
    slot.control.store(claiming.0, Ordering::Relaxed);
    assert_eq!(t.break_hold(hash), None); // not held: nothing to report
    assert_eq!(t.word(home, Ordering::Relaxed).state(), State::Broken);
    held(t.try_acquire(&request(hash, OwnerId::new(1, 1), 3)));
}

#[test]
fn reach_survives_transitions_and_overflows_into_the_home_word() {
    let t = table(64);
    t.raise_reach(5, 3);
    assert_eq!(t.reach(5, Ordering::Relaxed), 3);
    t.raise_reach(5, 2);
    assert_eq!(t.reach(5, Ordering::Relaxed), 3);
    t.raise_reach(5, 40);
    assert_eq!(t.reach(5, Ordering::Relaxed), 40);
    // a claim and release of slot 5 itself keep its reach
    let slot = &t.slots()[5];
    let c = Word(slot.control.load(Ordering::Relaxed));
    assert_eq!(c.freed().reach(), REACH_OVERFLOW);
    assert_eq!(t.reach(5, Ordering::Relaxed), 40);
}

/// A reader stopped between its look at its idle entry and its CAS, while the slot's
/// generation came round to the same word with another key of the same tag idle there
/// (this process's): its re-entry must not take that entry as its own key's, which no
/// claim of its key had to take back (a writer holds the key elsewhere meanwhile).
#[test]
fn a_reentry_from_a_word_come_round_again_checks_the_key() {
    let t = table(8);
    let me = OwnerId::new(1, 1);
    let shared = |hash| Request {
        mode: Mode::Shared { limit: 0 },
        ..request(hash, me, 7)
    };
    // two keys of one home and one tag, and a third key of that home
    let k = KeyHash {
        lo: 0,
        hi: 3 << 59 | 1,
    };
    let k2 = KeyHash {
        lo: 0,
        hi: 3 << 59 | 2,
    };
    let x = KeyHash { lo: 0, hi: 9 << 59 };
    let hx = held(t.try_acquire(&request(x, me, 7)));
    let hk = held(t.try_acquire(&shared(k)));
    assert_eq!((hx.slot, hk.slot), (0, 1));
    assert!(t.release(&hk).unwrap(), "kept idle");
    t.release(&hx).unwrap();
    // a writer takes the key: the idle entry is taken back, the writer sits at the home
    let w = held(t.try_acquire(&request(k, OwnerId::new(2, 1), 9)));
    assert_eq!(w.slot, 0);
    // k2 idle at slot 1, with the word the stopped reader saw (the generation came round)
    let h2 = held(t.try_acquire(&shared(k2)));
    assert_eq!(h2.slot, 1);
    t.env().now.set(2000); // another tick: the re-entry writes the fields (CLAIMING, then HELD)
    assert!(t.release(&h2).unwrap());
    let seen = t.word(1, Ordering::SeqCst);
    assert_eq!(seen.state(), State::Idle);
    // (the look found k's fields: the CAS comes after the generation came round)
    assert!(
        t.claim_idle(&shared(k), 1, seen, 2000).is_none(),
        "a reader got in beside the writer"
    );
    assert_ne!(t.word(1, Ordering::SeqCst).state(), State::Held);
    // the writer is alone, and the key's own idle entry is still taken again
    t.release(&w).unwrap();
    let r = held(t.try_acquire(&shared(k)));
    assert!(t.release(&r).unwrap());
    let again = t.try_reenter(&shared(k), r.slot, 0).expect("re-entered");
    assert_eq!(again.slot, r.slot);
}

/// A general claim of a key takes its own process's idle entry of the key before a free
/// slot (a process whose cache forgot the entry does not leave it beside a new one);
/// another process takes the free slot, and a writer takes the idle entry back.
#[test]
fn a_claim_takes_its_own_idle_entry_first() {
    let t = table(8);
    let me = OwnerId::new(1, 1);
    let other = OwnerId::new(2, 1);
    let shared = |hash, owner| Request {
        mode: Mode::Shared { limit: 0 },
        ..request(hash, owner, 7)
    };
    let k = KeyHash {
        lo: 0,
        hi: 3 << 59 | 1,
    };
    let x = KeyHash { lo: 0, hi: 9 << 59 };
    let y = KeyHash {
        lo: 0,
        hi: 10 << 59,
    };
    let hx = held(t.try_acquire(&request(x, me, 7)));
    let hy = held(t.try_acquire(&request(y, me, 7)));
    let hk = held(t.try_acquire(&shared(k, me)));
    assert_eq!((hx.slot, hy.slot, hk.slot), (0, 1, 2));
    assert!(t.release(&hk).unwrap());
    t.release(&hy).unwrap(); // slot 1 free, nearer the home than the idle entry
    let again = held(t.try_acquire(&shared(k, me)));
    assert_eq!(again.slot, 2, "its own idle entry, not the free slot");
    let theirs = held(t.try_acquire(&shared(k, other)));
    assert_eq!(
        theirs.slot, 1,
        "another process's reader takes the free slot"
    );
    assert!(t.release(&again).unwrap());
    t.release(&theirs).unwrap();
    // a writer takes the idle entries back and stands alone
    t.release(&hx).unwrap();
    let w = held(t.try_acquire(&request(k, other, 9)));
    assert!(t
        .entries()
        .iter()
        .all(|e| e.slot as usize == w.slot || e.hash != k));
    assert!((0..8).all(|i| t.word(i, Ordering::SeqCst).state() != State::Idle));
}
