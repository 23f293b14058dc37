//! Loom models of the dict entry's seqlock: the production source of `entry.rs` on heap
//! words with loom's atomics. Threads stand in for processes; the writer lock is not
//! modelled (one writer at a time is its whole job), the reader-writer races are.
//!
//! Run with the lock table's models (see `src/loom_tests.rs`): the `loom` filter picks
//! up both.

use std::sync::Arc;

use loom::sync::atomic::AtomicU64;
use loom::thread;

use super::entry::{Entry, Geometry, Kind, Look, PackedKey};
use crate::primitive::crash;

/// One entry: 8 head words, an 8-byte key, a 16-byte value.
fn geometry() -> Geometry {
    Geometry::new(11, 8, 16)
}

fn words() -> Arc<Vec<AtomicU64>> {
    Arc::new(
        (0..geometry().entry_words)
            .map(|_| AtomicU64::new(0))
            .collect(),
    )
}

fn key(name: &[u8]) -> PackedKey<'_> {
    // One hash for both keys, so only the key bytes tell them apart.
    PackedKey::new(name, 0x5eed)
}

/// Value number `n`: 16 bytes of `n`, stored with flags `n`.
fn store(w: &[AtomicU64], k: &[u8], n: u8) {
    Entry::new(w, geometry()).store(&key(k), Kind::Bytes, &[n; 16], u32::from(n), 1_000, 1);
}

/// A read of `k` that is accepted must be one whole value: all 16 bytes and the flags from
/// the same store.
fn check(look: &Look) -> Option<u8> {
    match look {
        Look::Found(c) => {
            let n = c.value[0];
            assert_eq!(c.value, vec![n; 16], "torn value");
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
    loom::model(|| {
        let w = words();
        store(&w, b"k", 1);
        let writer = {
            let w = w.clone();
            thread::spawn(move || {
                store(&w, b"k", 2);
                store(&w, b"k", 3);
            })
        };
        let got = check(&Entry::new(&w, geometry()).read(&key(b"k"), true));
        assert!(got.is_none_or(|n| (1..=3).contains(&n)));
        writer.join().unwrap();
        assert_eq!(
            check(&Entry::new(&w, geometry()).read(&key(b"k"), true)),
            Some(3)
        );
    });
}

/// Model D2 — the entry is given to another key (an eviction) while a reader looks up the
/// first key: the reader finds the first key's value or nothing, never the other's.
#[test]
fn dict_eviction_never_gives_a_key_another_keys_value() {
    loom::model(|| {
        let w = words();
        store(&w, b"first", 1);
        let writer = {
            let w = w.clone();
            thread::spawn(move || store(&w, b"second", 2))
        };
        let look = Entry::new(&w, geometry()).read(&key(b"first"), true);
        if let Some(n) = check(&look) {
            assert_eq!(n, 1, "the first key read the second key's value");
        }
        writer.join().unwrap();
        let e = Entry::new(&w, geometry());
        assert_eq!(e.read(&key(b"first"), true), Look::Other);
        assert_eq!(check(&e.read(&key(b"second"), true)), Some(2));
    });
}

/// Model D3 — a writer dies at every step of an update. Readers meanwhile accept only whole
/// values; after the repair that the next writer runs, the entry reads as the new value (if
/// the writer finished) or as absent, never as garbage, and takes new stores.
#[test]
fn dict_writer_death_leaves_the_entry_whole_or_absent() {
    for step in 0..8 {
        loom::model(move || {
            let w = words();
            store(&w, b"k", 1);
            let victim = {
                let w = w.clone();
                thread::spawn(move || {
                    crash::arm(step);
                    let _ = std::panic::catch_unwind(|| store(&w, b"k", 2));
                })
            };
            let during = check(&Entry::new(&w, geometry()).read(&key(b"k"), true));
            assert!(during.is_none_or(|n| n == 1 || n == 2));
            victim.join().unwrap();

            let e = Entry::new(&w, geometry());
            let repaired = e.repair();
            match e.read(&key(b"k"), true) {
                Look::Free => assert!(repaired, "emptied without a repair"),
                look => assert_eq!(check(&look), Some(2), "after step {step}: {look:?}"),
            }
            store(&w, b"k", 3);
            assert_eq!(check(&e.read(&key(b"k"), true)), Some(3));
        });
    }
}
