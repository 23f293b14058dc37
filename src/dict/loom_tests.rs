//! Loom models of the dict: the entry's seqlock, the writer lock's takeover and the undo
//! copy, the production source of `entry.rs`, `writer.rs` and `journal.rs` on heap words
//! with loom's atomics.
//! Threads stand in for processes; a model declares owners dead or stalled.
//!
//! Run with the lock table's models (see `src/shm/loom_tests.rs`): the `loom` filter picks
//! up both.

use std::mem::ManuallyDrop;
use std::sync::Arc;

use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
use loom::thread;

use super::entry::{Aborted, Entry, Geometry, Kind, Look, PackedKey, ValueAt};
use super::filter::{self, Filter};
use super::journal::{Journals, Keep, JOURNALS};
use super::writer::{WriterEnv, WriterLock};
use crate::shm::primitive::{crash, Ordering};
use crate::shm::registry::OwnerId;

/// One entry: 8 head words, an 8-byte key, a 16-byte value.
fn geometry() -> &'static Geometry {
    static G: Geometry = Geometry::new(11, 8, 16);
    &G
}

/// One entry, its dict's writer lock and undo copy, who is dead and whether stalls are
/// declared.
#[derive(Clone)]
struct Dict {
    words: Arc<Vec<AtomicU64>>,
    /// The undo copies: each one's word and index word, and their entries' words.
    jcontrol: Arc<Vec<AtomicU64>>,
    jcopies: Arc<Vec<AtomicU64>>,
    lock: Arc<AtomicU64>,
    wait: Arc<AtomicU32>,
    turn: Arc<AtomicU32>,
    dead: Arc<AtomicU64>,
    stalled: Arc<AtomicBool>,
}

/// Process `pid`'s view of the world.
struct Proc<'a> {
    d: &'a Dict,
    pid: u32,
}

impl WriterEnv for Proc<'_> {
    fn owner(&self) -> OwnerId {
        OwnerId::new(self.pid as u16, 1)
    }
    fn is_dead(&self, owner: OwnerId) -> bool {
        self.d.is_dead(owner)
    }
    fn stalled(&self, _word: u64) -> bool {
        self.d.stalled.load(Ordering::SeqCst)
    }
    fn sleep(&self, _wait: &AtomicU32, _seen: u32) {
        thread::yield_now();
    }
}

impl Dict {
    fn new() -> Dict {
        Dict {
            words: Arc::new(
                (0..geometry().entry_words)
                    .map(|_| AtomicU64::new(0))
                    .collect(),
            ),
            jcontrol: Arc::new((0..2 * JOURNALS).map(|_| AtomicU64::new(0)).collect()),
            jcopies: Arc::new(
                (0..JOURNALS * geometry().entry_words)
                    .map(|_| AtomicU64::new(0))
                    .collect(),
            ),
            lock: Arc::new(AtomicU64::new(0)),
            wait: Arc::new(AtomicU32::new(0)),
            turn: Arc::new(AtomicU32::new(0)),
            dead: Arc::new(AtomicU64::new(0)),
            stalled: Arc::new(AtomicBool::new(false)),
        }
    }

    fn entry(&self) -> Entry<'_> {
        Entry::new(&self.words, geometry())
    }

    fn keep(&self) -> Keep<'_> {
        Keep {
            journals: Journals {
                control: &self.jcontrol,
                copies: &self.jcopies,
                geometry: geometry(),
                all: &[],
            },
            at: 0,
        }
    }

    /// What the next holder of the lock does after a takeover, as `SharedDict::write_lock`
    /// does: settles the undo copies, then cleans the entry (writes a copy back if its
    /// writer is dead; a quarantined entry's copy stays, there being no other entry here).
    fn clean(&self, w: &super::writer::Writing<'_>) {
        let keep = self.keep();
        for n in 0..JOURNALS {
            let _ = keep
                .journals
                .get(n)
                .settle(|at| (at == 0).then(|| self.entry()), |o| self.is_dead(o));
        }
        self.entry().clean(w, |o| self.is_dead(o), Some(&keep));
    }

    fn is_dead(&self, owner: OwnerId) -> bool {
        owner.entry() < 64 && self.dead.load(Ordering::SeqCst) & (1 << owner.entry()) != 0
    }

    fn kill(&self, pid: u32) {
        self.dead.fetch_or(1 << pid, Ordering::SeqCst);
    }

    /// A writer's whole store of value number `n` under `k`: take the lock (recovering if
    /// it took it over), write, release. A crash leaves the lock held, as a dead process
    /// would: the guard is never dropped on unwind.
    fn store(&self, pid: u32, k: &[u8], n: u8) -> Result<(), Aborted> {
        let env = Proc { d: self, pid };
        let lock = WriterLock {
            word: &self.lock,
            wait: &self.wait,
            turn: &self.turn,
        };
        let (w, took_over) = lock.lock(&env);
        let w = ManuallyDrop::new(w);
        if took_over {
            self.clean(&w);
        }
        let r = self.entry().store(
            &w,
            Some(&self.keep()),
            &key(k),
            Kind::Bytes,
            ValueAt::Inline(&[n; 16]),
            u32::from(n),
            1_000,
            1,
        );
        let released = ManuallyDrop::into_inner(w).release();
        r.and(released.map_err(|_| Aborted::TakenOver))
    }

    /// A lock-free read, as `SharedDict::read_entry` makes it: the entry, or the undo copy
    /// when the entry is mid-write or out of use and the copy covers that write; looks
    /// again when neither could be read (the write ended between the two).
    fn read(&self, k: &[u8]) -> Got {
        self.read_tries(k, 4)
    }

    /// [`read`](Self::read) with at most `tries` looks.
    fn read_tries(&self, k: &[u8], tries: usize) -> Got {
        let journals = self.keep().journals;
        let mut value = Vec::new();
        let mut look = Look::Changed;
        for _ in 0..tries {
            look = self.entry().read(&key(k), Some(&mut value));
            if matches!(look, Look::Busy | Look::Parked) {
                let seq = self.entry().seq();
                if let Some(look) = journals.read(0, seq, &key(k), Some(&mut value)) {
                    return Got { look, value };
                }
            }
            if !matches!(look, Look::Busy | Look::Parked | Look::Changed) {
                break;
            }
            thread::yield_now();
        }
        Got { look, value }
    }

    /// The entry alone, without the undo copy.
    fn read_entry(&self, k: &[u8]) -> Got {
        let mut value = Vec::new();
        let look = self.entry().read(&key(k), Some(&mut value));
        Got { look, value }
    }
}

/// What a read found, and the value's bytes it copied.
#[derive(Debug)]
struct Got {
    look: Look,
    value: Vec<u8>,
}

/// A model explored with at most `preemptions` preemptions (the undo copy's steps make the
/// writes long: the models with a reader racing two writes stay within CI's time at 2).
fn model_with(preemptions: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(preemptions);
    b.check(f);
}

fn key(name: &[u8]) -> PackedKey<'_> {
    // One hash for both keys, so only the key bytes tell them apart.
    PackedKey::new(name, 0x5eed)
}

/// A reader of `k` in a thread of its own. Readers race writers from a spawned thread,
/// writers from the model's own: loom's DPOR remembers one last access per atomic, and a
/// writer that loads an entry's words before it stores them (the undo copy does) would hide
/// the reads of a reader that ran first from it, so that loom would never try the reader
/// in the middle of the writes (the models then pass a reader that trusts a torn copy).
fn reader_thread(d: &Dict, k: &'static [u8]) -> thread::JoinHandle<Got> {
    reader_thread_tries(d, k, 4)
}

/// [`reader_thread`] with at most `tries` looks.
fn reader_thread_tries(d: &Dict, k: &'static [u8], tries: usize) -> thread::JoinHandle<Got> {
    let d = d.clone();
    thread::spawn(move || d.read_tries(k, tries))
}

/// A read of `k` that is accepted must be one whole value: all 16 bytes and the flags from
/// the same store.
fn check(got: &Got) -> Option<u8> {
    match &got.look {
        Look::Found(c) => {
            let n = got.value[0];
            assert_eq!(got.value, vec![n; 16], "torn value");
            assert_eq!(c.flags, u32::from(n), "value and flags of different stores");
            Some(n)
        }
        _ => None,
    }
}

/// Model D1 — a reader copying an entry while a writer rewrites it twice never accepts a
/// mix of two values.
#[test]
fn dict_reader_never_accepts_a_torn_value() {
    model_with(2, || {
        let d = Dict::new();
        d.store(1, b"k", 1).unwrap();
        // The reader is the spawned thread: loom's first run then has the writer's stores
        // before the reader's loads (see `reader_thread`).
        // one look: a second multiplies the states past what CI affords
        let reader = reader_thread_tries(&d, b"k", 1);
        d.store(1, b"k", 2).unwrap();
        d.store(1, b"k", 3).unwrap();
        let got = check(&reader.join().unwrap());
        assert!(got.is_none_or(|n| (1..=3).contains(&n)));
        assert_eq!(check(&d.read(b"k")), Some(3));
    });
}

/// Model D2 — the entry is given to another key (an eviction) while a reader looks up the
/// first key: the reader finds the first key's value or nothing, never the other's.
#[test]
fn dict_eviction_never_gives_a_key_another_keys_value() {
    loom::model(|| {
        let d = Dict::new();
        d.store(1, b"first", 1).unwrap();
        let reader = reader_thread(&d, b"first");
        d.store(1, b"second", 2).unwrap();
        if let Some(n) = check(&reader.join().unwrap()) {
            assert_eq!(n, 1, "the first key read the second key's value");
        }
        assert_eq!(d.read(b"first").look, Look::Other);
        assert_eq!(check(&d.read(b"second")), Some(2));
    });
}

/// Model D3 — a writer dies at every step of an update, holding the lock (the undo copy's
/// steps included). Readers meanwhile accept only whole values; the next writer takes the
/// lock over from the dead and recovers; the entry then reads as the old value (died
/// before its write ended: the copy is written back) or the new one (died after), never
/// absent, never garbage, and takes new stores.
#[test]
fn dict_writer_death_leaves_the_old_value_or_the_new() {
    for step in 0..16 {
        loom::model(move || {
            let d = Dict::new();
            d.store(1, b"k", 1).unwrap();
            let reader = reader_thread(&d, b"k");
            crash::arm(step);
            let _ = std::panic::catch_unwind(|| d.store(1, b"k", 2));
            crash::disarm();
            let during = check(&reader.join().unwrap());
            assert!(during.is_none_or(|n| n == 1 || n == 2));
            d.kill(1);
            // The next writer: takes over from the dead, recovers, writes.
            let env = Proc { d: &d, pid: 2 };
            let lock = WriterLock {
                word: &d.lock,
                wait: &d.wait,
                turn: &d.turn,
            };
            let (w, took_over) = lock.lock(&env);
            if took_over {
                d.clean(&w);
            }
            let look = d.read_entry(b"k");
            assert!(
                matches!(check(&look), Some(1 | 2)),
                "after step {step}: {look:?}"
            );
            d.entry()
                .store(
                    &w,
                    Some(&d.keep()),
                    &key(b"k"),
                    Kind::Bytes,
                    ValueAt::Inline(&[3; 16]),
                    3,
                    1_000,
                    1,
                )
                .unwrap();
            w.release().unwrap();
            assert_eq!(check(&d.read(b"k")), Some(3));
        });
    }
}

/// Model D4 — two writers, each seen stalled by the other: whichever holds the lock may be
/// taken over at any step and then resumes and goes on. A taken-over writer's late writes
/// never land over its successor's: the successor's value stands when it succeeded, what is
/// left is one whole value (from the entry, or from the undo copy of a quarantined one),
/// and no entry is left mid-write.
#[test]
fn dict_stalled_writer_taken_over_never_overwrites_its_successor() {
    loom::model(|| {
        let d = Dict::new();
        d.store(1, b"k", 1).unwrap();
        d.stalled.store(true, Ordering::SeqCst);
        let slow = {
            let d = d.clone();
            thread::spawn(move || d.store(1, b"k", 2))
        };
        let next = {
            let d = d.clone();
            thread::spawn(move || d.store(2, b"k", 3))
        };
        // (readers racing writers are models D1 to D3; one more thread here multiplies
        // the state space past what CI can afford)
        let a = slow.join().unwrap();
        let b = next.join().unwrap();
        assert_ne!(
            d.read_entry(b"k").look,
            Look::Busy,
            "an entry was left mid-write"
        );
        let last = d.read(b"k");
        let last = check(&last);
        assert!(
            last.is_some(),
            "the key lost its value: {a:?} {b:?} seq {:#x} journals {:?}",
            d.entry().seq(),
            d.jcontrol
                .iter()
                .map(|w| w.load(Ordering::SeqCst))
                .collect::<Vec<_>>()
        );
        // One writer took the lock over from the other only if that one reports it: the
        // taker's successful write must stand, whatever the other did after.
        if a == Err(Aborted::TakenOver) && b.is_ok() {
            assert_eq!(last, Some(3), "the stalled writer overwrote its successor");
        }
        if b == Err(Aborted::TakenOver) && a.is_ok() {
            assert_eq!(last, Some(2), "the stalled writer overwrote its successor");
        }
        if a.is_ok() && b.is_ok() {
            assert!(matches!(last, Some(2 | 3)), "{last:?}");
        }
    });
}

/// Model D5 — the writer dies mid-write, then the one writing its undo copy back dies at
/// every step of that: the third holder of the lock finishes the write-back, and the
/// entry reads as the old value or the new one, never absent.
#[test]
fn dict_a_write_back_interrupted_at_any_step_is_finished_by_the_next() {
    for wstep in 0..12 {
        for rstep in 0..8 {
            loom::model(move || {
                let d = Dict::new();
                d.store(1, b"k", 1).unwrap();
                let lock = WriterLock {
                    word: &d.lock,
                    wait: &d.wait,
                    turn: &d.turn,
                };
                crash::arm(wstep);
                let _ = std::panic::catch_unwind(|| d.store(1, b"k", 2));
                crash::disarm();
                d.kill(1);
                crash::arm(rstep);
                let _ = std::panic::catch_unwind(|| {
                    let (w, _) = lock.lock(&Proc { d: &d, pid: 2 });
                    let w = ManuallyDrop::new(w);
                    d.clean(&w);
                    ManuallyDrop::into_inner(w).release()
                });
                crash::disarm();
                d.kill(2);
                let (w, _) = lock.lock(&Proc { d: &d, pid: 3 });
                d.clean(&w);
                let look = d.read_entry(b"k");
                assert!(
                    matches!(check(&look), Some(1 | 2)),
                    "writer died at {wstep}, restorer at {rstep}: {look:?}"
                );
                w.release().unwrap();
            });
        }
    }
}

/// Model D6 — a writer stalls at any step of an update and the lock is taken over (or it
/// takes the lock over from the other, which is declared stalled too): the key reads as
/// one whole value, the old or the new, at every moment, from the entry or from the undo
/// copy of the entry that was quarantined; never absent. A write that reports success
/// stands.
#[test]
fn dict_a_stalled_writer_leaves_the_old_value_readable() {
    loom::model(|| {
        let d = Dict::new();
        d.store(1, b"k", 1).unwrap();
        d.stalled.store(true, Ordering::SeqCst);
        let slow = {
            let d = d.clone();
            thread::spawn(move || d.store(1, b"k", 2))
        };
        let reader = reader_thread(&d, b"k");
        let lock = WriterLock {
            word: &d.lock,
            wait: &d.wait,
            turn: &d.turn,
        };
        let (w, _) = lock.lock(&Proc { d: &d, pid: 2 });
        d.clean(&w);
        let _ = w.release();
        let during = reader.join().unwrap();
        assert!(matches!(check(&during), Some(1 | 2)), "{during:?}");
        let written = slow.join().unwrap();
        let after = d.read(b"k");
        match check(&after) {
            Some(2) => {}
            Some(1) => assert!(written.is_err(), "a write that reported success was lost"),
            _ => panic!("the key's value was lost: {after:?}"),
        }
    });
}

/// Model D8 — writers taking turns: while writer 1 holds the lock, writer 2 waits and has
/// asked for a turn (as after a sleep: loom cannot keep a yielding waiter going while the
/// holder could run); writer 1 releases (the free word reserved for writer 2) and takes
/// the lock again at once, finding the word reserved: it waits, or sees the reservation
/// stand through a sleep (a yield here) and takes it. Each hold is alone (an increment
/// made of a load and a store loses nothing), both get through, and the lock ends free
/// with no turn left asked for.
#[test]
fn dict_writers_taking_turns_hold_the_lock_one_at_a_time() {
    fn lock(d: &Dict) -> WriterLock<'_> {
        WriterLock {
            word: &d.lock,
            wait: &d.wait,
            turn: &d.turn,
        }
    }
    fn hold<'a>(d: &'a Dict, pid: u32, count: &AtomicU64) -> super::writer::Writing<'a> {
        let (w, took_over) = lock(d).lock(&Proc { d, pid });
        assert!(!took_over, "nobody stalled nor died");
        let n = count.load(Ordering::Relaxed);
        count.store(n + 1, Ordering::Relaxed);
        w
    }
    model_with(3, || {
        let d = Dict::new();
        let count = Arc::new(AtomicU64::new(0));
        let first = hold(&d, 1, &count);
        let other = {
            let (d, count) = (d.clone(), count.clone());
            thread::spawn(move || hold(&d, 2, &count).release().unwrap())
        };
        lock(&d).asked_by(Proc { d: &d, pid: 2 }.owner());
        first.release().unwrap();
        hold(&d, 1, &count).release().unwrap();
        other.join().unwrap();
        assert_eq!(count.load(Ordering::SeqCst), 3, "two holds at once");
        assert_eq!(
            d.lock.load(Ordering::SeqCst) & 1,
            0,
            "the lock was left held"
        );
        assert_eq!(
            d.turn.load(Ordering::SeqCst),
            0,
            "a turn was left asked for"
        );
    });
}

/// Model D7 — a writer rebuilding a home's filter (after a key of the home went) is taken
/// over in the middle, and its successor places a key of the home whose bit was already
/// set (by a key that went) and stores it: the rebuild, computed from entries that did not
/// hold the new key yet, never clears the new key's bit (readers would then miss a stored
/// key). The successor's add moves the filter's generation on, so the late CAS fails.
#[test]
fn dict_a_taken_over_filter_rebuild_never_clears_a_placed_key() {
    const HASH_A: u64 = 0x5ee0 | 1;
    const HASH_K: u64 = 0x5ee0 | 7;
    loom::model(|| {
        let d = Dict::new();
        let a = PackedKey::new(b"a", HASH_A);
        let k = PackedKey::new(b"k", HASH_K);
        let filter = Arc::new(AtomicU64::new(0));
        let lock = WriterLock {
            word: &d.lock,
            wait: &d.wait,
            turn: &d.turn,
        };
        // "a" is stored; the filter also has the bits of three keys that went, "k"'s among them
        {
            let (w, _) = lock.lock(&Proc { d: &d, pid: 3 });
            for hash in [HASH_A, HASH_K, 0x5ee0 | 9, 0x5ee0 | 11] {
                Filter(&filter).add(hash);
            }
            d.entry()
                .store(
                    &w,
                    None,
                    &a,
                    Kind::Bytes,
                    ValueAt::Inline(&[1; 16]),
                    1,
                    1_000,
                    1,
                )
                .unwrap();
            w.release().unwrap();
        }
        let held = Arc::new(AtomicBool::new(false));
        let stale = {
            let (d, filter, held) = (d.clone(), filter.clone(), held.clone());
            thread::spawn(move || {
                let lock = WriterLock {
                    word: &d.lock,
                    wait: &d.wait,
                    turn: &d.turn,
                };
                let (w, _) = lock.lock(&Proc { d: &d, pid: 1 });
                held.store(true, Ordering::SeqCst);
                // Lets the successor run first in loom's first schedule: its add's load
                // would otherwise hide this thread's load of the filter from loom's DPOR
                // (one last access per atomic), which would never try the load after it.
                thread::yield_now();
                Filter(&filter).rebuild(&w, || {
                    d.entry().stable_hash().map(|h| h.map_or(0, filter::bit))
                });
                let _ = ManuallyDrop::new(w); // taken over: its release would fail
            })
        };
        while !held.load(Ordering::SeqCst) {
            thread::yield_now();
        }
        // The holder is declared stalled: the successor takes the lock over, places "k"
        // where "a" was, and stores it.
        d.stalled.store(true, Ordering::SeqCst);
        let (w, took_over) = lock.lock(&Proc { d: &d, pid: 2 });
        assert!(took_over);
        Filter(&filter).add(HASH_K);
        d.entry()
            .store(
                &w,
                None,
                &k,
                Kind::Bytes,
                ValueAt::Inline(&[2; 16]),
                2,
                1_000,
                1,
            )
            .unwrap();
        stale.join().unwrap();
        assert_eq!(d.entry().stable_hash(), Some(Some(HASH_K)));
        assert!(
            Filter(&filter).may_hold(HASH_K),
            "a stored key's filter bit was cleared: {:#x}",
            filter.load(Ordering::SeqCst)
        );
        let _ = ManuallyDrop::new(w);
    });
}

/// Model H1 — a value in the block heap, rewritten twice, the second rewrite taking the
/// blocks the first one freed: a reader that copied the blocks of the entry it saw, then
/// validated the entry, never accepts a copy of another value (the fence that begins
/// `Heap::write`). The entry is a `seq` word and the value's first block and number,
/// written with `Entry::write`'s orderings.
#[test]
fn heap_a_reader_never_accepts_a_block_reused_under_it() {
    use super::heap::{blocks_for, Chain, Heap, BLOCK_WORDS};
    const LEN: usize = 16;
    #[derive(Clone)]
    struct World {
        map: Arc<Vec<AtomicU64>>,
        data: Arc<Vec<AtomicU64>>,
        /// seq, first block, the value's number
        head: Arc<Vec<AtomicU64>>,
    }
    impl World {
        fn heap(&self) -> Heap<'_> {
            Heap::new(&self.map, &self.data)
        }
        /// Stores value `n` in fresh blocks, publishes it, frees `old`'s; returns the new
        /// value's blocks.
        fn store(&self, n: u8, old: &[u32]) -> Vec<u32> {
            let heap = self.heap();
            let mut blocks = Vec::new();
            assert!(heap.take(blocks_for(LEN), &mut 0, &mut blocks));
            let first = heap.write(&blocks, &[n; LEN], 1);
            let s = self.head[0].load(Ordering::Relaxed);
            self.head[0]
                .compare_exchange(s, s + 1, Ordering::Relaxed, Ordering::Relaxed)
                .unwrap();
            loom::sync::atomic::fence(Ordering::Release);
            self.head[1].store(u64::from(first), Ordering::Relaxed);
            self.head[2].store(u64::from(n), Ordering::Relaxed);
            self.head[0]
                .compare_exchange(s + 1, s + 2, Ordering::Release, Ordering::Relaxed)
                .unwrap();
            heap.free(old);
            blocks
        }
        fn read(&self) -> Option<(u8, Vec<u8>)> {
            let s1 = self.head[0].load(Ordering::Acquire);
            if s1 % 2 == 1 {
                return None;
            }
            let first = self.head[1].load(Ordering::Relaxed) as u32;
            let n = self.head[2].load(Ordering::Relaxed) as u8;
            let mut out = Vec::new();
            let chain = Chain {
                first,
                len: LEN,
                owner: 1,
                skip: 0,
            };
            self.heap().read(chain, &mut out).ok()?;
            loom::sync::atomic::fence(Ordering::Acquire);
            (self.head[0].load(Ordering::Relaxed) == s1).then_some((n, out))
        }
    }
    model_with(3, || {
        let w = World {
            map: Arc::new(vec![AtomicU64::new(0)]),
            data: Arc::new((0..4 * BLOCK_WORDS).map(|_| AtomicU64::new(0)).collect()),
            head: Arc::new((0..3).map(|_| AtomicU64::new(0)).collect()),
        };
        let first = w.store(1, &[]);
        let reader = {
            let w = w.clone();
            thread::spawn(move || w.read())
        };
        let second = w.store(2, &first);
        let third = w.store(3, &second);
        assert_eq!(
            third.iter().min(),
            first.iter().min(),
            "the third took the first's blocks"
        );
        if let Some((n, value)) = reader.join().unwrap() {
            assert_eq!(value, vec![n; LEN], "a copy of another value was accepted");
        }
        assert_eq!(w.read(), Some((3, vec![3; LEN])));
    });
}

/// Model H4 — a list in the heap popped at its front (`api/list.rs`): the list's 16 bytes
/// lie across two data blocks (from a skip of 248); the pop of its first 8 moves the skip
/// to 256, so the chain starts at the second data block (the index stays), and the first
/// data block goes back; another value takes it (and two more) and writes it at once,
/// laid out as the list was. A reader that
/// copied the chain it saw (the skip included), then validated the entry, accepts only
/// whole values: the list before the pop or after it. The entry is a `seq` word, the
/// first block, the skip, the length and the value's number, written with
/// `Entry::write`'s orderings.
#[test]
fn heap_a_reader_of_a_list_popped_at_its_front_never_accepts_a_reused_block() {
    use super::heap::{Chain, Heap, BLOCK, BLOCK_WORDS};
    const SKIP: usize = BLOCK - 8;
    #[derive(Clone)]
    struct World {
        map: Arc<Vec<AtomicU64>>,
        data: Arc<Vec<AtomicU64>>,
        /// seq, first block, skip, length, the value's number
        head: Arc<Vec<AtomicU64>>,
    }
    impl World {
        fn heap(&self) -> Heap<'_> {
            Heap::new(&self.map, &self.data)
        }
        fn publish(&self, first: u32, skip: usize, len: usize, n: u8) {
            let s = self.head[0].load(Ordering::Relaxed);
            self.head[0]
                .compare_exchange(s, s + 1, Ordering::Relaxed, Ordering::Relaxed)
                .unwrap();
            loom::sync::atomic::fence(Ordering::Release);
            self.head[1].store(u64::from(first), Ordering::Relaxed);
            self.head[2].store(skip as u64, Ordering::Relaxed);
            self.head[3].store(len as u64, Ordering::Relaxed);
            self.head[4].store(u64::from(n), Ordering::Relaxed);
            self.head[0]
                .compare_exchange(s + 1, s + 2, Ordering::Release, Ordering::Relaxed)
                .unwrap();
        }
        fn read(&self) -> Option<(u8, Vec<u8>)> {
            let s1 = self.head[0].load(Ordering::Acquire);
            if s1 % 2 == 1 {
                return None;
            }
            let chain = Chain {
                first: self.head[1].load(Ordering::Relaxed) as u32,
                skip: (self.head[2].load(Ordering::Relaxed) as usize).min(BLOCK),
                len: (self.head[3].load(Ordering::Relaxed) as usize).min(16),
                owner: 1,
            };
            let n = self.head[4].load(Ordering::Relaxed) as u8;
            let mut out = Vec::new();
            self.heap().read(chain, &mut out).ok()?;
            loom::sync::atomic::fence(Ordering::Acquire);
            (self.head[0].load(Ordering::Relaxed) == s1).then_some((n, out))
        }
    }
    let list = || {
        let mut v = vec![1u8; 8];
        v.extend([2u8; 8]);
        v
    };
    model_with(3, move || {
        let w = World {
            map: Arc::new(vec![AtomicU64::new(0)]),
            data: Arc::new((0..5 * BLOCK_WORDS).map(|_| AtomicU64::new(0)).collect()),
            head: Arc::new((0..5).map(|_| AtomicU64::new(0)).collect()),
        };
        let heap = w.heap();
        // the list: an index block and two data blocks, its bytes the last word of the
        // first and the first word of the second
        let mut old = Vec::new();
        assert!(heap.take(3, &mut 0, &mut old));
        let (index, data) = (old[0], [old[1], old[2]]);
        let first = heap.write_index(&[index], &data, &[], 1);
        let word = |b: u32, at: usize| &w.data[b as usize * BLOCK_WORDS + at];
        let lay_out = |data: &[u32], bytes: [u8; 2]| {
            word(data[0], BLOCK_WORDS - 1)
                .store(u64::from_le_bytes([bytes[0]; 8]), Ordering::Relaxed);
            word(data[1], 0).store(u64::from_le_bytes([bytes[1]; 8]), Ordering::Relaxed);
        };
        lay_out(&data, [1, 2]);
        w.publish(first, SKIP, 16, 1);
        let reader = {
            let w = w.clone();
            thread::spawn(move || w.read())
        };
        // a pop of its first 8 bytes: the skip moves to the second data block
        w.publish(first, BLOCK, 8, 2);
        heap.free(&[data[0]]);
        // another value takes the block given back and two more, and writes it as the
        // list's bytes were laid out (the block given back as its first data block)
        let mut other = Vec::new();
        assert!(heap.take(3, &mut 0, &mut other));
        assert_eq!(other[0], data[0], "the other value took what the pop freed");
        heap.write_index(&other[1..2], &[other[0], other[2]], &[], 1);
        lay_out(&[other[0], other[2]], [3, 3]);
        if let Some((n, value)) = reader.join().unwrap() {
            let want = match n {
                1 => list(),
                _ => list()[8..].to_vec(),
            };
            assert_eq!(value, want, "a copy of another value was accepted");
        }
        assert_eq!(w.read(), Some((2, list()[8..].to_vec())));
    });
}

/// Model H2 — two writers take blocks from the heap at once (one taken over and resuming
/// late, its successor writing): no block is handed to both, and each value reads back
/// whole. Fails with a take that keeps the bits another writer set first (the broken
/// variant `protocol`).
#[test]
fn heap_two_writers_never_take_one_block() {
    use super::heap::{blocks_for, Chain, Heap, BLOCK_WORDS};
    const LEN: usize = 16;
    loom::model(|| {
        let map = Arc::new(vec![AtomicU64::new(0)]);
        let data: Arc<Vec<AtomicU64>> =
            Arc::new((0..4 * BLOCK_WORDS).map(|_| AtomicU64::new(0)).collect());
        let writer = |n: u8| {
            let (map, data) = (map.clone(), data.clone());
            move || {
                let heap = Heap::new(&map, &data);
                let mut blocks = Vec::new();
                assert!(heap.take(blocks_for(LEN), &mut 0, &mut blocks));
                let first = heap.write(&blocks, &[n; LEN], 1);
                (blocks, first)
            }
        };
        let other = thread::spawn(writer(2));
        let (mine, my_first) = writer(1)();
        let (theirs, their_first) = other.join().unwrap();
        assert!(
            mine.iter().all(|b| !theirs.contains(b)),
            "a block was handed to both: {mine:?} and {theirs:?}"
        );
        let heap = Heap::new(&map, &data);
        let mut out = Vec::new();
        heap.read(
            Chain {
                first: my_first,
                len: LEN,
                owner: 1,
                skip: 0,
            },
            &mut out,
        )
        .unwrap();
        assert_eq!(out, vec![1; LEN]);
        heap.read(
            Chain {
                first: their_first,
                len: LEN,
                owner: 1,
                skip: 0,
            },
            &mut out,
        )
        .unwrap();
        assert_eq!(out, vec![2; LEN]);
    });
}

/// Model H3 — a sweeper taken over in the middle of its sweep, and its successor's restore
/// of a value from the undo copy into its entry (a chain's name moves without the map
/// changing). The value's chain, named by the undo copy when the sweeper began and by the
/// entry when its successor is done, stays taken and whole: the successor retags the map
/// before it moves anything, and the sweep frees only in words that kept the tag and the
/// bits it read first. Fails with a sweep that frees whatever the word holds (the broken
/// variant `protocol`).
#[test]
fn heap_a_sweeper_taken_over_frees_nothing_its_successor_names() {
    use super::heap::{blocks_for, map_words, Chain, Heap, BLOCK_WORDS};
    const LEN: usize = 16;
    const NONE: u64 = u64::MAX;
    loom::model(|| {
        let map = Arc::new(vec![AtomicU64::new(0)]);
        let data: Arc<Vec<AtomicU64>> =
            Arc::new((0..4 * BLOCK_WORDS).map(|_| AtomicU64::new(0)).collect());
        // what names the value's chain: the undo copy, then the entry
        let names = Arc::new([AtomicU64::new(NONE), AtomicU64::new(NONE)]);
        let first = {
            let heap = Heap::new(&map, &data);
            let mut blocks = Vec::new();
            assert!(heap.take(blocks_for(LEN), &mut 0, &mut blocks));
            heap.write(&blocks, &[7; LEN], 1)
        };
        names[0].store(u64::from(first), Ordering::Relaxed);
        let sweeper = {
            let (map, data, names) = (map.clone(), data.clone(), names.clone());
            thread::spawn(move || {
                let heap = Heap::new(&map, &data);
                let before = heap.snapshot();
                let mut named = vec![0u64; map_words(heap.blocks())];
                // the entry first, then the undo copy: as `SharedDict::sweep` does
                for name in [&names[1], &names[0]] {
                    let f = name.load(Ordering::Acquire);
                    if f != NONE {
                        heap.mark(
                            Chain {
                                first: f as u32,
                                len: LEN,
                                owner: 1,
                                skip: 0,
                            },
                            &mut named,
                        );
                    }
                }
                heap.sweep(&before, 0, &named).freed
            })
        };
        // the successor: retags, then moves the name from the copy to the entry
        let heap = Heap::new(&map, &data);
        heap.retag(1);
        names[1].store(u64::from(first), Ordering::Release);
        names[0].store(NONE, Ordering::Release);
        sweeper.join().unwrap();
        let mut chain = Vec::new();
        heap.blocks_of(
            Chain {
                first,
                len: LEN,
                owner: 1,
                skip: 0,
            },
            &mut chain,
        )
        .unwrap();
        let bits = map[0].load(Ordering::Relaxed);
        assert!(
            chain.iter().all(|&b| bits & 1 << b != 0),
            "the entry's chain {chain:?} was freed (map {bits:#x})"
        );
        let mut out = Vec::new();
        heap.read(
            Chain {
                first,
                len: LEN,
                owner: 1,
                skip: 0,
            },
            &mut out,
        )
        .unwrap();
        assert_eq!(out, vec![7; LEN]);
    });
}
