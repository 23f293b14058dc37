//! Loom models of the slot protocol and the owner registry: the production source of
//! `table/` and `registry.rs`, run on heap slots with loom's atomics, a clock, a
//! liveness oracle and a stall oracle the model drives.
//!
//! ```sh
//! LOOM_MAX_PREEMPTIONS=2 RUSTFLAGS="--cfg loom" \
//!     cargo test --release --lib --target-dir target-loom loom
//! ```
//!
//! Threads stand in for processes. Key hashes are built by hand so a model can put keys in
//! the homes and probe positions it needs. What loom cannot prove is said in
//! `table/claim.rs`.

use std::sync::Arc;

use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
use loom::thread;

use crate::shm::primitive::{crash, Ordering};
use crate::shm::registry::{EntryLocks, Identity, OwnerId, Registry, ENTRY_WORDS};
use crate::shm::slot::{Cold, Slot, State, Word};
use crate::shm::table::{Attempt, Busy, Env, Held, KeyHash, Mode, Prepared, Request, Slots, Table};

/// Heap slots.
struct Heap(Vec<Slot>, Vec<Cold>);

impl Slots for Heap {
    fn hot(&self) -> &[Slot] {
        &self.0
    }
    fn cold(&self) -> &[Cold] {
        &self.1
    }
}

/// Time the model sets (loom does not model time), owners the model has declared dead,
/// stalls the model declares, and a count of wake-ups instead of system calls.
#[derive(Clone)]
struct ModelEnv {
    now: Arc<AtomicU64>,
    dead: Arc<AtomicU64>,
    stalled: Arc<AtomicBool>,
    wakes: Arc<AtomicU64>,
    /// Readers waiting for an exclusive hold have stopped saying so (their mark lapsed).
    readers_gone: Arc<AtomicBool>,
}

impl ModelEnv {
    fn kill(&self, pid: u32) {
        self.dead.fetch_or(1 << pid, Ordering::SeqCst);
    }

    /// The kernel's `FUTEX_WAIT` on a slot's control word, as a model: a sleeper that
    /// finds the low half still reading `low` stays asleep until a wake-up comes after it
    /// looked (the kernel checks the value and queues the sleeper under one lock, so a
    /// wake-up after the check always finds it). Any wake-up counts (a futex may wake
    /// spuriously); a lost one is a sleeper that spins forever, which loom reports.
    fn futex_wait(&self, word: &AtomicU64, low: u32) {
        let woken = self.wakes.load(Ordering::SeqCst);
        if word.load(Ordering::SeqCst) as u32 != low {
            return;
        }
        while self.wakes.load(Ordering::SeqCst) == woken {
            thread::yield_now();
        }
    }
}

impl Env for ModelEnv {
    fn now(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
    fn is_dead(&self, owner: OwnerId) -> bool {
        // "pid" n is owner entry n; unknown owners are never judged
        !owner.is_unknown()
            && owner.entry() < 64
            && self.dead.load(Ordering::SeqCst) & (1 << owner.entry()) != 0
    }
    fn wake_all(&self, _word: &AtomicU64) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
    }
    fn stalled(&self, _seen: &AtomicU64, _word: Word) -> bool {
        self.stalled.load(Ordering::SeqCst)
    }
    fn readers_active(&self, _seen: &AtomicU64, _hold: u64) -> bool {
        !self.readers_gone.load(Ordering::SeqCst)
    }
}

type T = Table<Heap, ModelEnv>;

struct Model {
    table: Arc<T>,
    env: ModelEnv,
}

const LEASE: u64 = 1_000;

fn model(slots: usize) -> Model {
    let env = ModelEnv {
        now: Arc::new(AtomicU64::new(100)),
        dead: Arc::new(AtomicU64::new(0)),
        stalled: Arc::new(AtomicBool::new(false)),
        wakes: Arc::new(AtomicU64::new(0)),
        readers_gone: Arc::new(AtomicBool::new(false)),
    };
    let heap = Heap(
        (0..slots).map(|_| Slot::default()).collect(),
        (0..slots).map(|_| Cold::default()).collect(),
    );
    Model {
        table: Arc::new(Table::new(heap, env.clone())),
        env,
    }
}

/// A key whose home is `home` in a table of `n` slots. `id` tells keys apart; keys with the
/// same `tag` look alike to a scanner until it reads their full hash.
fn key(home: usize, n: usize, id: u64, tag: u8) -> KeyHash {
    // the smallest lo with lo * n >> 64 == home
    let lo = ((home as u128) << 64).div_ceil(n as u128) as u64;
    KeyHash {
        lo,
        hi: (u64::from(tag) << 59) | id,
    }
}

/// Process "pid" n: registry entry n, generation 1.
fn owner(pid: u32) -> OwnerId {
    OwnerId::new(pid as u16, 1)
}

fn req(hash: KeyHash, pid: u32, lease: u64) -> Request<'static> {
    Request {
        key: b"k",
        hash,
        owner: owner(pid),
        lease,
        exptime: LEASE,
        mode: Mode::Exclusive,
    }
}

fn acquired(a: Attempt) -> Option<Held> {
    match a {
        Attempt::Acquired(h) => Some(h),
        Attempt::Mismatch { .. } => None,
        Attempt::Busy(_) => None,
    }
}

fn busy(a: Attempt) -> Option<Busy> {
    match a {
        Attempt::Acquired(_) => None,
        Attempt::Mismatch { .. } => None,
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
    table
        .entries()
        .iter()
        .filter(|e| e.hash == hash && e.word.state() != State::Broken)
        .count()
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
        assert_eq!(releaser.join().unwrap(), Ok(false));
        let got = claimer.join().unwrap();
        assert!(entries_of(&m.table, k) <= 1);
        match got {
            Some(h2) => assert!(!m.table.release(&h2).unwrap()),
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

/// Model 3c — two claimers of one key inside a reach already raised: the home holds
/// another key, the slot after it is freed while both claim, and the last slot of the
/// range is free. One claimer can find the range's second slot taken and pick the third,
/// the other find it freed and pick it, neither raising the reach nor seeing the other in
/// pass 1: only the home's claim count sends one of them to look again.
#[test]
fn two_claimers_in_a_raised_reach() {
    loom::model(|| {
        let m = model(3);
        let x = take(&m.table, key(0, 3, 1, 5), 9, 1).unwrap();
        let y = take(&m.table, key(0, 3, 2, 6), 8, 2).unwrap();
        let z = take(&m.table, key(0, 3, 3, 4), 7, 3).unwrap();
        assert_eq!((x.slot, y.slot, z.slot), (0, 1, 2));
        m.table.release(&z).unwrap(); // the reach stays 2
        let k = key(0, 3, 4, 7);
        let t = m.table.clone();
        let hole = thread::spawn(move || t.release(&y).unwrap());
        let ts = claimers(&m.table, k, 1);
        hole.join().unwrap();
        let won: Vec<Held> = ts.into_iter().filter_map(|t| t.join().unwrap()).collect();
        assert!(won.len() <= 1, "two holders of one key");
        assert!(entries_of(&m.table, k) <= 1);
        for h in &won {
            m.table.release(h).unwrap();
        }
        m.table.release(&x).unwrap();
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
        m.env.now.store(100 + LEASE, Ordering::SeqCst); // the lease is over
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
                Ok(false),
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
        let env = m.env.clone();
        let killer = thread::spawn(move || env.kill(1));
        let waiters: Vec<_> = (0..2)
            .map(|i| {
                let t = m.table.clone();
                thread::spawn(move || {
                    let r = req(k, 2 + i, 10 + u64::from(i));
                    match t.try_acquire(&r).unwrap() {
                        Attempt::Acquired(h) => Some(h),
                        Attempt::Mismatch { .. } => unreachable!("no shared holds here"),
                        Attempt::Busy(b) => {
                            if t.recover(&b) {
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
            assert!(m.table.recover(&b));
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
        let (t, env) = (m.table.clone(), m.env.clone());
        let stealer = thread::spawn(move || {
            env.now.store(100 + LEASE, Ordering::SeqCst); // time reaches the deadline
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
            assert_eq!(m.table.release(&h), Ok(false));
        }
    });
}

/// Model 6b — a steal whose look is stale: the thief CASes from the very word of a live
/// hold, as a look made before the slot's generation wrapped round would (loom cannot run
/// 2^26 transitions; the word is handed over instead). The live hold must come through
/// untouched while its holder renews and releases, and a rival gets the key only after
/// the release.
#[test]
fn a_steal_from_a_stale_look_leaves_a_live_hold_alone() {
    loom::model(|| {
        let m = model(2);
        let k = key(0, 2, 1, 4);
        let mut h = take(&m.table, k, 1, 1).unwrap();
        let word = h.word;
        let slot = h.slot;
        let releasing = Arc::new(AtomicBool::new(false));
        let t = m.table.clone();
        let thief = thread::spawn(move || t.steal(slot, word));
        let (t, r) = (m.table.clone(), releasing.clone());
        let holder = thread::spawn(move || {
            let extended = t.extend(&mut h, 10 * LEASE);
            r.store(true, Ordering::SeqCst);
            (extended, t.release(&h))
        });
        let (t, r) = (m.table.clone(), releasing.clone());
        let rival = thread::spawn(move || {
            let got = take(&t, k, 2, 2);
            if got.is_some() {
                assert!(r.load(Ordering::SeqCst), "the rival took a live hold");
            }
            got
        });
        assert!(!thief.join().unwrap(), "a stale steal freed a live hold");
        let (extended, released) = holder.join().unwrap();
        assert_eq!(extended, Ok(()), "the renewal was disturbed");
        assert_eq!(released, Ok(false), "the release was disturbed");
        if let Some(g) = rival.join().unwrap() {
            assert_eq!(m.table.release(&g), Ok(false));
        }
        assert_eq!(entries_of(&m.table, k), 0);
    });
}

/// Model 6c — a thief dies right after freezing an expired hold: the STEALING word blocks
/// nobody. The holder's renewal ends the check (its lease ran out: lost), and a waiter
/// that meets it ends it too and takes the key; never both.
#[test]
fn a_thief_that_dies_halfway_blocks_nobody() {
    for live in [false, true] {
        loom::model(move || {
            let m = model(2);
            let k = key(0, 2, 1, 4);
            let mut h = take(&m.table, k, 1, 1).unwrap();
            if !live {
                m.env.now.store(100 + LEASE, Ordering::SeqCst); // the lease is over
            }
            let (word, slot) = (h.word, h.slot);
            let t = m.table.clone();
            let thief = thread::spawn(move || {
                crash::arm(0); // dies at the first crash point: right after freezing
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    t.steal(slot, word);
                }));
            });
            let t = m.table.clone();
            let holder = thread::spawn(move || {
                let r = t.extend(&mut h, 10 * LEASE);
                (r, h)
            });
            let t = m.table.clone();
            let waiter = thread::spawn(move || take(&t, k, 2, 2));
            thief.join().unwrap();
            let (extended, h) = holder.join().unwrap();
            let won = waiter.join().unwrap();
            assert!(!(extended.is_ok() && won.is_some()), "two holders");
            assert_eq!(
                extended.is_ok(),
                live,
                "a live hold lost, or a dead one renewed"
            );
            assert!(entries_of(&m.table, k) <= 1);
            if let Some(w) = won {
                assert_eq!(m.table.release(&w), Ok(false));
            }
            if extended.is_ok() {
                assert_eq!(m.table.release(&h), Ok(false));
            }
            // nothing is left frozen
            assert!(m
                .table
                .entries()
                .iter()
                .all(|e| e.word.state() != State::Stealing));
        });
    }
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
                    Attempt::Acquired(h) => assert!(!t.release(&h).unwrap()),
                    Attempt::Mismatch { .. } => unreachable!("no shared holds here"),
                    Attempt::Busy(b) => assert_eq!(b.word.owner(), owner(1)),
                }
            });
            victim.join().unwrap();
            neighbour.join().unwrap();
            m.env.kill(1);
            // After the death: both keys can be taken, reaping what the victim left.
            for (hash, pid) in [(other, 3), (k, 4)] {
                let r = req(hash, pid, 30 + u64::from(pid));
                let got = match m.table.try_acquire(&r).unwrap() {
                    Attempt::Acquired(h) => Some(h),
                    Attempt::Mismatch { .. } => unreachable!("no shared holds here"),
                    Attempt::Busy(b) => {
                        assert!(m.table.recover(&b), "a dead owner's entry stuck");
                        acquired(m.table.try_acquire(&r).unwrap())
                    }
                };
                assert!(got.is_some(), "key wedged after step {step}");
            }
        });
    }
}

/// Model 8 — waiting: a waiter that flags the entry and sleeps is always woken by the
/// release, even when the holder renews (EXTENDING) in between (see
/// `ModelEnv::futex_wait` for the futex on the slot's control word).
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
        let (t, env) = (m.table.clone(), m.env.clone());
        let waiter = thread::spawn(move || {
            let r = req(k, 2, 2);
            loop {
                match t.try_acquire(&r).unwrap() {
                    Attempt::Acquired(h) => return h,
                    Attempt::Mismatch { .. } => unreachable!("no shared holds here"),
                    Attempt::Busy(b) => match t.prepare_wait(&b) {
                        Prepared::Sleep(low) => env.futex_wait(t.wait_word(&b), low),
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

/// Model 8b — waiting on a key its holder keeps taking again: the waiter's attempt saw one
/// hold, the holder released it and took the key again before the waiter flagged it; the
/// waiter flags the new hold (not the one it saw) and sleeps, and the new hold's release
/// wakes it. A waiter sent back to try again (the key was free for a moment) may win the
/// key at once instead; either way it never sleeps through the last release.
#[test]
fn a_waiter_flags_the_holders_next_hold_of_the_key() {
    loom::model(|| {
        let m = model(2);
        let k = key(0, 2, 1, 4);
        let first = take(&m.table, k, 1, 1).unwrap();
        let r = req(k, 2, 2);
        let seen = busy(m.table.try_acquire(&r).unwrap()).unwrap();
        let t = m.table.clone();
        let holder = thread::spawn(move || {
            t.release(&first).unwrap();
            if let Some(again) = take(&t, k, 1, 1) {
                t.release(&again).unwrap();
            }
        });
        let (t, env) = (m.table.clone(), m.env.clone());
        let waiter = thread::spawn(move || {
            let mut b = seen;
            loop {
                match t.prepare_wait(&b) {
                    Prepared::Sleep(low) => env.futex_wait(t.wait_word(&b), low),
                    Prepared::Changed | Prepared::Poll => {}
                }
                match t.try_acquire(&r).unwrap() {
                    Attempt::Acquired(h) => return h,
                    Attempt::Mismatch { .. } => unreachable!("no shared holds here"),
                    Attempt::Busy(next) => b = next,
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
        m.env.now.store(100 + LEASE, Ordering::SeqCst);
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

/// Model 10 — a claim on the fast path (home free, reach 0) racing a claim of the same key
/// on the slow path, which finds the home taken by another key (released meanwhile) and
/// raises the reach to place the key farther out. Never two entries of the key: either
/// the fast claim's CAS fails on the raised reach, or the raise reads the fast claim's
/// entry and the slow claimer's rescan defers to it.
#[test]
fn fast_claim_versus_slow_claim_that_raises_reach() {
    loom::model(|| {
        let m = model(3);
        let k = key(0, 3, 1, 7);
        let other = key(0, 3, 2, 5);
        let o = take(&m.table, other, 9, 1).unwrap();
        assert_eq!(o.slot, 0);
        let t = m.table.clone();
        let releaser = thread::spawn(move || t.release(&o).unwrap());
        let ts = claimers(&m.table, k, 1);
        releaser.join().unwrap();
        let won: Vec<Held> = ts.into_iter().filter_map(|t| t.join().unwrap()).collect();
        assert!(won.len() <= 1, "two holders of one key");
        assert_eq!(entries_of(&m.table, k), won.len());
        for h in &won {
            m.table.release(h).unwrap();
        }
        assert!(take(&m.table, k, 3, 20).is_some(), "the key was wedged");
    });
}

/// Model 11 — an owner nobody can judge (no registry entry): even with every registered
/// owner declared dead, a waiter never frees its entry; only its expiry does.
#[test]
fn an_owner_that_cannot_be_judged_is_alive_until_its_lease_ends() {
    loom::model(|| {
        let m = model(2);
        let k = key(0, 2, 1, 4);
        let r = Request {
            owner: OwnerId::UNKNOWN,
            ..req(k, 0, 1)
        };
        let h = acquired(m.table.try_acquire(&r).unwrap()).unwrap();
        let env = m.env.clone();
        let killer = thread::spawn(move || env.dead.store(u64::MAX, Ordering::SeqCst));
        let t = m.table.clone();
        let waiter = thread::spawn(move || match t.try_acquire(&req(k, 2, 2)).unwrap() {
            Attempt::Acquired(_) => panic!("took the key of a live holder"),
            Attempt::Mismatch { .. } => unreachable!("no shared holds here"),
            Attempt::Busy(b) => {
                assert!(!t.recover(&b), "freed an owner that cannot be judged");
            }
        });
        killer.join().unwrap();
        waiter.join().unwrap();
        assert_eq!(entries_of(&m.table, k), 1);
        m.env.now.store(100 + LEASE, Ordering::SeqCst);
        assert!(take(&m.table, k, 3, 3).is_some(), "expiry did not end it");
        assert_eq!(m.table.release(&h), Err(crate::shm::table::Lost));
    });
}

/// Model 12 — a claimer stalled past the bound (stopped mid-claim) is broken by a waiter,
/// then resumes: its CAS fails and it backs out of its own broken slot. At most one holder,
/// the winner's fields are its own, and no broken slot is left behind.
#[test]
fn a_stalled_claim_is_broken_and_its_owner_backs_out() {
    loom::model(|| {
        let m = model(2);
        let k = key(0, 2, 1, 4);
        m.env.stalled.store(true, Ordering::SeqCst);
        let t = m.table.clone();
        let stopped = thread::spawn(move || take(&t, k, 1, 11));
        let t = m.table.clone();
        let waiter = thread::spawn(move || {
            let r = req(k, 2, 22);
            match t.try_acquire(&r).unwrap() {
                Attempt::Acquired(h) => Some(h),
                Attempt::Mismatch { .. } => unreachable!("no shared holds here"),
                Attempt::Busy(b) => {
                    if t.recover(&b) {
                        acquired(t.try_acquire(&r).unwrap())
                    } else {
                        None
                    }
                }
            }
        });
        let a = stopped.join().unwrap();
        let b = waiter.join().unwrap();
        assert!(a.is_none() || b.is_none(), "two holders of one key");
        let won = usize::from(a.is_some()) + usize::from(b.is_some());
        assert_eq!(entries_of(&m.table, k), won);
        assert!(
            m.table
                .entries()
                .iter()
                .all(|e| e.word.state() != State::Broken),
            "a broken slot was left behind"
        );
        if let Some(h) = b {
            let slot = &m.table.slots()[h.slot];
            assert_eq!(
                slot.lease.load(Ordering::SeqCst),
                22,
                "the winner's fields were overwritten"
            );
            assert_eq!(slot.deadline.load(Ordering::SeqCst), 100 + LEASE);
            m.table.release(&h).unwrap();
        }
        if let Some(h) = a {
            m.table.release(&h).unwrap();
        }
    });
}

/// Model 13 — a holder stalled in the middle of a renewal, past its deadline, is broken by
/// a waiter and resumes: the renewal reports the lease lost and never moves the deadline of
/// the waiter's hold; the renewal and the waiter's hold never both stand.
#[test]
fn a_stalled_renewal_past_its_deadline_is_broken_and_reports_the_lease_lost() {
    loom::model(|| {
        let m = model(2);
        let k = key(0, 2, 1, 4);
        let mut h = take(&m.table, k, 1, 11).unwrap();
        m.env.stalled.store(true, Ordering::SeqCst);
        let t = m.table.clone();
        let holder = thread::spawn(move || {
            let r = t.extend(&mut h, 50 * LEASE);
            (r, h)
        });
        let (t, env) = (m.table.clone(), m.env.clone());
        let waiter = thread::spawn(move || {
            env.now.store(100 + LEASE, Ordering::SeqCst); // the old deadline passes
            let r = req(k, 2, 22);
            match t.try_acquire(&r).unwrap() {
                Attempt::Acquired(h) => Some(h),
                Attempt::Mismatch { .. } => unreachable!("no shared holds here"),
                Attempt::Busy(b) => {
                    if t.recover(&b) {
                        acquired(t.try_acquire(&r).unwrap())
                    } else {
                        None
                    }
                }
            }
        });
        let (extended, h) = holder.join().unwrap();
        let won = waiter.join().unwrap();
        assert!(
            !(extended.is_ok() && won.is_some()),
            "renewal and steal both stand"
        );
        assert!(entries_of(&m.table, k) <= 1);
        assert!(m
            .table
            .entries()
            .iter()
            .all(|e| e.word.state() != State::Broken));
        if let Some(w) = won {
            let slot = &m.table.slots()[w.slot];
            assert_eq!(
                slot.deadline.load(Ordering::SeqCst),
                100 + 2 * LEASE,
                "the stale renewal moved the new holder's deadline"
            );
            assert_eq!(m.table.release(&h), Err(crate::shm::table::Lost));
            m.table.release(&w).unwrap();
        } else if extended.is_ok() {
            m.table.release(&h).unwrap();
        }
    });
}

/// Model 14 — the registry: process 1 registers and holds; process 2 registers beside it;
/// process 1 dies (the kernel drops its lock) while process 3 takes an entry, maybe the
/// same one with a new generation, and a judge looks at process 1. The judge says "dead"
/// only after the death, never of a live owner; a process that left cleanly is dead at
/// once; a judge that cannot ask the kernel says "alive".
#[test]
fn registry_judges_only_the_dead_and_reuses_entries_with_a_new_generation() {
    loom::model(|| {
        let words: Arc<Vec<AtomicU64>> =
            Arc::new((0..2 * ENTRY_WORDS).map(|_| AtomicU64::new(0)).collect());
        let locks: Arc<Vec<AtomicU32>> = Arc::new((0..2).map(|_| AtomicU32::new(0)).collect());
        let died = Arc::new(AtomicBool::new(false));
        fn id(pid: u32) -> Identity {
            Identity {
                pid,
                start: 0,
                pid_ns: 0,
            }
        }
        let shared = |me: u32| SharedLocks {
            locks: locks.clone(),
            me,
        };
        let reg = Registry::new(&words);
        let p1 = reg.register(&shared(1), id(1), 0).unwrap();
        let p2 = reg.register(&shared(2), id(2), 0).unwrap();
        assert_ne!(p1, p2);
        assert!(!reg.is_dead(&shared(9), p1, None) && !reg.is_dead(&shared(9), p2, None));

        let (l, d) = (locks.clone(), died.clone());
        let death = thread::spawn(move || {
            d.store(true, Ordering::SeqCst);
            // the kernel drops the dead process's lock
            l[p1.entry() as usize].store(0, Ordering::SeqCst);
        });
        let (w, l) = (words.clone(), locks.clone());
        let newcomer = thread::spawn(move || {
            let reg = Registry::new(&w);
            reg.register(&SharedLocks { locks: l, me: 3 }, id(3), 0)
        });
        let (w, l, d) = (words.clone(), locks.clone(), died.clone());
        let judge = thread::spawn(move || {
            let reg = Registry::new(&w);
            if reg.is_dead(&SharedLocks { locks: l, me: 9 }, p1, None) {
                assert!(d.load(Ordering::SeqCst), "a live owner was judged dead");
            }
            // without the kernel, only a generation that moved on (which needed the old
            // lock gone) can say "dead"
            if reg.is_dead(&Blind, p1, None) {
                assert!(
                    d.load(Ordering::SeqCst),
                    "a judge that cannot ask said dead"
                );
            }
        });
        death.join().unwrap();
        let p3 = newcomer.join().unwrap();
        judge.join().unwrap();
        // after the death: process 1 is dead, 2 lives; process 3 got the freed entry (if
        // it looked after the death) under a new generation, and lives
        assert!(reg.is_dead(&shared(9), p1, None));
        assert!(!reg.is_dead(&shared(9), p2, None));
        if let Some(p3) = p3 {
            assert_eq!(p3.entry(), p1.entry());
            assert_ne!(p3, p1);
            assert!(!reg.is_dead(&shared(9), p3, None));
            // leaving cleanly: dead at once, before the lock is even dropped
            reg.unregister(p3);
            assert!(reg.is_dead(&shared(9), p3, None));
        }
    });
}

/// The fake kernel lock table shared by the model's "processes".
struct SharedLocks {
    locks: Arc<Vec<AtomicU32>>,
    me: u32,
}

impl EntryLocks for SharedLocks {
    fn try_take(&self, i: usize) -> std::io::Result<bool> {
        Ok(self.locks[i]
            .compare_exchange(0, self.me, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok())
    }
    fn is_held(&self, i: usize) -> std::io::Result<bool> {
        Ok(self.locks[i].load(Ordering::SeqCst) != 0)
    }
}

/// A kernel that cannot be asked (locks unsupported, an error).
struct Blind;

impl EntryLocks for Blind {
    fn try_take(&self, _: usize) -> std::io::Result<bool> {
        Err(std::io::ErrorKind::Unsupported.into())
    }
    fn is_held(&self, _: usize) -> std::io::Result<bool> {
        Err(std::io::ErrorKind::Unsupported.into())
    }
}

/// Model 15 — a thread takes its key again while the slot's fields still say exactly what
/// its hold would write (the one-CAS claim), racing another process's claim of the key and
/// a renewal-free steal attempt: one winner, one entry, and the hold's fields are right.
#[test]
fn a_one_cas_claim_racing_a_rival() {
    loom::model(|| {
        let m = model(2);
        let k = key(0, 2, 1, 4);
        let h = take(&m.table, k, 1, 5).unwrap();
        m.table.release(&h).unwrap();
        let ts: Vec<_> = [(1, 5), (2, 6)]
            .into_iter()
            .map(|(pid, lease)| {
                let t = m.table.clone();
                thread::spawn(move || take(&t, k, pid, lease))
            })
            .collect();
        let won: Vec<Held> = ts.into_iter().filter_map(|t| t.join().unwrap()).collect();
        assert_eq!(won.len(), 1, "no winner, or two");
        assert_eq!(entries_of(&m.table, k), 1);
        let w = won[0];
        let slot = &m.table.slots()[w.slot];
        assert_eq!(slot.lease.load(Ordering::SeqCst), w.lease);
        assert_eq!(slot.hash_lo.load(Ordering::SeqCst), k.lo);
        m.table.release(&w).unwrap();
    });
}

mod idle;
mod shared;
