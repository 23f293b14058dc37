//! Loom models of the slot protocol: the production source of `table.rs`, run on heap
//! slots with loom's atomics, a clock and a liveness oracle the model drives.
//!
//! ```sh
//! LOOM_MAX_PREEMPTIONS=2 RUSTFLAGS="--cfg loom" \
//!     cargo test --release --lib --target-dir target-loom loom
//! ```
//!
//! Threads stand in for processes. Key hashes are built by hand so a model can put keys in
//! the homes and probe positions it needs.

use std::sync::Arc;

use loom::sync::atomic::{AtomicU32, AtomicU64};
use loom::thread;

use crate::clock::Clock;
use crate::primitive::{crash, Ordering};
use crate::process::{Liveness, Owner};
use crate::slot::Slot;
use crate::table::{Attempt, Busy, Held, KeyHash, Notify, Prepared, Request, Table};

/// Time the model sets; loom does not model time itself.
#[derive(Clone)]
struct FakeClock(Arc<AtomicU64>);

impl Clock for FakeClock {
    fn now(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// Pids below 64 the model has declared dead.
#[derive(Clone)]
struct FakeLiveness(Arc<AtomicU64>);

impl FakeLiveness {
    fn kill(&self, pid: u32) {
        self.0.fetch_or(1 << pid, Ordering::SeqCst);
    }
}

impl Liveness for FakeLiveness {
    fn is_dead(&self, pid: u32, _start: Option<u64>) -> bool {
        self.0.load(Ordering::SeqCst) & (1 << pid) != 0
    }
}

/// Counts wake-ups instead of making system calls.
#[derive(Clone)]
struct Wakes(Arc<AtomicU64>);

impl Notify for Wakes {
    fn wake_all(&self, _word: &AtomicU32) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

type T = Table<Vec<Slot>, FakeClock, FakeLiveness, Wakes>;

struct Model {
    table: Arc<T>,
    clock: FakeClock,
    liveness: FakeLiveness,
}

const LEASE: u64 = 1_000;

fn model(slots: usize) -> Model {
    let clock = FakeClock(Arc::new(AtomicU64::new(100)));
    let liveness = FakeLiveness(Arc::new(AtomicU64::new(0)));
    let wakes = Wakes(Arc::new(AtomicU64::new(0)));
    let slots: Vec<Slot> = (0..slots).map(|_| Slot::default()).collect();
    Model {
        table: Arc::new(Table::new(slots, clock.clone(), liveness.clone(), wakes)),
        clock,
        liveness,
    }
}

/// A key whose home is `home` in a table of `n` slots. `id` tells keys apart; keys with the
/// same `tag` look alike to a scanner until it reads their full hash.
fn key(home: usize, n: usize, id: u64, tag: u8) -> KeyHash {
    // the smallest lo with lo * n >> 64 == home
    let lo = ((home as u128) << 64).div_ceil(n as u128) as u64;
    KeyHash {
        lo,
        hi: (u64::from(tag) << 56) | id,
    }
}

fn req(hash: KeyHash, pid: u32, lease: u64) -> Request<'static> {
    Request {
        key: b"k",
        hash,
        owner: Owner { pid, start: 1 },
        lease,
        exptime: LEASE,
    }
}

fn acquired(a: Attempt) -> Option<Held> {
    match a {
        Attempt::Acquired(h) => Some(h),
        Attempt::Busy(_) => None,
    }
}

fn busy(a: Attempt) -> Option<Busy> {
    match a {
        Attempt::Acquired(_) => None,
        Attempt::Busy(b) => Some(b),
    }
}

/// One attempt to take `k` as process `pid`.
fn take(table: &T, k: KeyHash, pid: u32, lease: u64) -> Option<Held> {
    acquired(table.try_acquire(&req(k, pid, lease)).unwrap())
}

/// Two threads, pids `first_pid` and the next, each trying once to take `k`.
fn claimers(table: &Arc<T>, k: KeyHash, first_pid: u32) -> Vec<thread::JoinHandle<Option<Held>>> {
    (0..2)
        .map(|i| {
            let t = table.clone();
            thread::spawn(move || {
                acquired(
                    t.try_acquire(&req(k, first_pid + i, 10 + u64::from(i)))
                        .unwrap(),
                )
            })
        })
        .collect()
}

/// Live (CLAIMING, HELD or EXTENDING) entries of `hash`.
fn entries_of(table: &T, hash: KeyHash) -> usize {
    table.entries().iter().filter(|e| e.hash == hash).count()
}

/// Model 1 — two claimers of one key: never both win, and a loser saw the key busy.
/// The key has a rival entry in its home so the claims take the general (two-scan) path.
#[test]
fn two_claimers_one_key() {
    loom::model(|| {
        let m = model(3);
        let k = key(0, 3, 1, 7);
        let other = key(0, 3, 2, 7); // same home and tag: looks like k until its hash is read
        let o = take(&m.table, other, 9, 1).unwrap();
        let ts = claimers(&m.table, k, 1);
        let won: Vec<Held> = ts.into_iter().filter_map(|t| t.join().unwrap()).collect();
        assert!(won.len() <= 1, "two holders of one key");
        assert!(entries_of(&m.table, k) <= 1);
        // a loss is never a wedge: with the winner gone the key can be taken
        for h in &won {
            m.table.release(h).unwrap();
        }
        m.table.release(&o).unwrap();
        assert!(take(&m.table, k, 3, 20).is_some());
    });
}

/// Model 2 — claim racing the holder's release: the claimer either sees the key held or
/// gets it; the release never fails; a later claim always succeeds.
#[test]
fn claim_versus_release() {
    loom::model(|| {
        let m = model(2);
        let k = key(0, 2, 1, 3);
        let h = take(&m.table, k, 1, 1).unwrap();
        let t = m.table.clone();
        let releaser = thread::spawn(move || t.release(&h));
        let t = m.table.clone();
        let claimer = thread::spawn(move || take(&t, k, 2, 2));
        assert_eq!(releaser.join().unwrap(), Ok(()));
        let got = claimer.join().unwrap();
        assert!(entries_of(&m.table, k) <= 1);
        match got {
            Some(h2) => m.table.release(&h2).unwrap(),
            None => assert!(take(&m.table, k, 3, 3).is_some()),
        }
    });
}

/// Model 3 — the release hole: k is held away from its home; an unrelated entry before it
/// is released while two processes claim k. Neither may win while k is held.
#[test]
fn release_hole() {
    loom::model(|| {
        let m = model(3);
        let filler = key(0, 3, 1, 5);
        let k = key(0, 3, 2, 6);
        let f = take(&m.table, filler, 9, 1).unwrap();
        let held = take(&m.table, k, 8, 2).unwrap();
        assert_eq!((f.slot, held.slot), (0, 1));
        let t = m.table.clone();
        let hole = thread::spawn(move || t.release(&f).unwrap());
        let claimers = claimers(&m.table, k, 1);
        hole.join().unwrap();
        for c in claimers {
            assert!(c.join().unwrap().is_none(), "a second entry for a held key");
        }
        assert_eq!(entries_of(&m.table, k), 1);
        m.table.release(&held).unwrap();
    });
}

/// Model 3b — the release hole with the key changing hands: the holder releases while the
/// hole opens and two processes claim. At most one wins; never two entries of the key.
#[test]
fn release_hole_while_key_changes_hands() {
    loom::model(|| {
        let m = model(3);
        let filler = key(0, 3, 1, 5);
        let k = key(0, 3, 2, 6);
        let f = take(&m.table, filler, 9, 1).unwrap();
        let held = take(&m.table, k, 8, 2).unwrap();
        let t = m.table.clone();
        let hole = thread::spawn(move || {
            t.release(&f).unwrap();
            t.release(&held).unwrap();
        });
        let claimers = claimers(&m.table, k, 1);
        hole.join().unwrap();
        let won = claimers
            .into_iter()
            .filter_map(|c| c.join().unwrap())
            .count();
        assert!(won <= 1, "two holders of one key");
        assert_eq!(entries_of(&m.table, k), won);
    });
}

/// Model 4 — expiry steal: two stealers of an expired hold; at most one wins, and the old
/// holder's late release either came first (Ok) or is refused, leaving the winner intact.
#[test]
fn expiry_steal() {
    loom::model(|| {
        let m = model(2);
        let k = key(0, 2, 1, 4);
        let old = take(&m.table, k, 1, 1).unwrap();
        m.clock.0.store(100 + LEASE, Ordering::SeqCst); // the lease is over
        let stealers = claimers(&m.table, k, 2);
        let t = m.table.clone();
        let late = thread::spawn(move || t.release(&old));
        let won: Vec<Held> = stealers
            .into_iter()
            .filter_map(|s| s.join().unwrap())
            .collect();
        let _ = late.join().unwrap();
        assert!(won.len() <= 1, "two stealers won");
        assert_eq!(entries_of(&m.table, k), won.len());
        for h in won {
            assert_eq!(
                m.table.release(&h),
                Ok(()),
                "the winner's hold was disturbed"
            );
        }
    });
}

/// Model 5 — dead-owner steal: the holder is declared dead while two waiters look at it;
/// at most one takes the key, and the dead owner's entry goes away.
#[test]
fn dead_owner_steal() {
    loom::model(|| {
        let m = model(2);
        let k = key(0, 2, 1, 4);
        let _dead = take(&m.table, k, 1, 1).unwrap();
        let lv = m.liveness.clone();
        let killer = thread::spawn(move || lv.kill(1));
        let waiters: Vec<_> = (0..2)
            .map(|i| {
                let t = m.table.clone();
                thread::spawn(move || {
                    let r = req(k, 2 + i, 10 + u64::from(i));
                    match t.try_acquire(&r).unwrap() {
                        Attempt::Acquired(h) => Some(h),
                        Attempt::Busy(b) => {
                            if t.reap_if_dead(&b) {
                                acquired(t.try_acquire(&r).unwrap())
                            } else {
                                None
                            }
                        }
                    }
                })
            })
            .collect();
        killer.join().unwrap();
        let won: Vec<Held> = waiters
            .into_iter()
            .filter_map(|w| w.join().unwrap())
            .collect();
        assert!(won.len() <= 1, "two waiters took a dead owner's key");
        assert!(entries_of(&m.table, k) <= 1);
        // once the death is known, the key is never wedged
        if won.is_empty() {
            let b = busy(m.table.try_acquire(&req(k, 5, 20)).unwrap()).unwrap();
            assert!(m.table.reap_if_dead(&b));
            assert!(take(&m.table, k, 5, 21).is_some());
        }
    });
}

/// Model 6 — renewal racing a steal at the deadline: the extension and the steal never
/// both succeed.
#[test]
fn extend_versus_steal_at_the_deadline() {
    loom::model(|| {
        let m = model(2);
        let k = key(0, 2, 1, 4);
        let mut h = take(&m.table, k, 1, 1).unwrap();
        let (t, clock) = (m.table.clone(), m.clock.clone());
        let stealer = thread::spawn(move || {
            clock.0.store(100 + LEASE, Ordering::SeqCst); // time reaches the deadline
            take(&t, k, 2, 2)
        });
        let t = m.table.clone();
        let holder = thread::spawn(move || {
            let r = t.extend(&mut h, 10 * LEASE);
            (r, h)
        });
        let stolen = stealer.join().unwrap();
        let (extended, h) = holder.join().unwrap();
        assert!(
            !(extended.is_ok() && stolen.is_some()),
            "both the renewal and the steal succeeded"
        );
        assert!(entries_of(&m.table, k) <= 1);
        if extended.is_ok() {
            assert_eq!(m.table.release(&h), Ok(()));
        }
    });
}

/// Model 7 — a process dies at every step of claim and release. Whatever it left, the key
/// becomes claimable once the death is known, and an unrelated key sharing the home is never
/// blocked.
#[test]
fn death_at_every_step() {
    for step in 0..16 {
        loom::model(move || {
            let m = model(3);
            let k = key(0, 3, 1, 4);
            let other = key(0, 3, 2, 4); // same home and tag: the worst neighbour
            let t = m.table.clone();
            let victim = thread::spawn(move || {
                crash::arm(step);
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    if let Some(h) = take(&t, k, 1, 1) {
                        let _ = t.token(&h);
                        let mut h = h;
                        let _ = t.extend(&mut h, LEASE);
                        let _ = t.release(&h);
                    }
                }));
            });
            let t = m.table.clone();
            let neighbour = thread::spawn(move || {
                // never blocked for good: busy only while the victim may be mid-claim
                let r = req(other, 2, 2);
                match t.try_acquire(&r).unwrap() {
                    Attempt::Acquired(h) => t.release(&h).unwrap(),
                    Attempt::Busy(b) => assert_eq!(b.word.pid(), 1),
                }
            });
            victim.join().unwrap();
            neighbour.join().unwrap();
            m.liveness.kill(1);
            // After the death: both keys can be taken, reaping what the victim left.
            for (hash, pid) in [(other, 3), (k, 4)] {
                let r = req(hash, pid, 30 + u64::from(pid));
                let got = match m.table.try_acquire(&r).unwrap() {
                    Attempt::Acquired(h) => Some(h),
                    Attempt::Busy(b) => {
                        assert!(m.table.reap_if_dead(&b), "a dead owner's entry stuck");
                        acquired(m.table.try_acquire(&r).unwrap())
                    }
                };
                assert!(got.is_some(), "key wedged after step {step}");
            }
        });
    }
}

/// Model 8 — the wait word: a waiter that flags the entry and sleeps is always woken by
/// the release, even when the holder renews (EXTENDING) in between. The futex is modelled
/// as "sleep while the word still reads the value seen": a lost wake-up is a waiter that
/// spins forever, which loom reports.
#[test]
fn no_lost_wakeup() {
    loom::model(|| {
        let m = model(2);
        let k = key(0, 2, 1, 4);
        let mut h = take(&m.table, k, 1, 1).unwrap();
        let t = m.table.clone();
        let holder = thread::spawn(move || {
            t.extend(&mut h, LEASE).unwrap();
            t.release(&h).unwrap();
        });
        let t = m.table.clone();
        let waiter = thread::spawn(move || {
            let r = req(k, 2, 2);
            loop {
                match t.try_acquire(&r).unwrap() {
                    Attempt::Acquired(h) => return h,
                    Attempt::Busy(b) => match t.prepare_wait(&b) {
                        Prepared::Sleep(seen) => {
                            while t.wait_word(b.home).load(Ordering::SeqCst) == seen {
                                thread::yield_now();
                            }
                        }
                        Prepared::Changed | Prepared::Poll => thread::yield_now(),
                    },
                }
            }
        });
        holder.join().unwrap();
        let h = waiter.join().unwrap();
        m.table.release(&h).unwrap();
    });
}

/// Model 9 — fencing tokens: a stale holder (lease over) and its successor both ask for a
/// token; a token handed to the stale holder is always below the successor's.
#[test]
fn fencing_tokens_order_successive_holders() {
    loom::model(|| {
        let m = model(2);
        let k = key(0, 2, 1, 4);
        let old = take(&m.table, k, 1, 1).unwrap();
        let first = m.table.token(&old).unwrap();
        m.clock.0.store(100 + LEASE, Ordering::SeqCst);
        let t = m.table.clone();
        let stale = thread::spawn(move || t.token(&old));
        let t = m.table.clone();
        let next = thread::spawn(move || {
            let h = take(&t, k, 2, 2)?;
            t.token(&h)
        });
        let stale = stale.join().unwrap();
        let next = next.join().unwrap();
        if let Some(s) = stale {
            assert!(s > first);
        }
        if let (Some(s), Some(n)) = (stale, next) {
            assert!(
                s < n,
                "stale holder's token {s} outranks its successor's {n}"
            );
        }
        if let Some(n) = next {
            assert!(n > first);
        }
    });
}
