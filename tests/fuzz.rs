//! Hostile files: random bytes, mutated tables and garbage slots go through the public API.
//! Opening them is `Ok` or a typed error; whatever opens stays usable, with no panic,
//! hang or out-of-bounds access, whatever the slots say.
//!
//! `SHMLOCK_FUZZ_CASES=N` runs N cases per property instead of the default.

mod common;

use std::time::Duration;

use common::TempPath;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use shmlock::{Error, Lock, LockOptions, LockTable, SharedDict};

const HEADER: usize = 4096;
/// A slot's hot and cold lines; a table has four slots per key of capacity.
const SLOT: usize = 128;
const SLOTS_PER_KEY: usize = 4;

/// Opens `bytes` as a table file and, if it opens, works it. Returns whether it opened.
fn exercise(bytes: &[u8]) -> bool {
    let path = TempPath::new("fuzz");
    std::fs::write(&path, bytes).unwrap();
    let table = match LockTable::options().create(false).open(&path) {
        Ok(t) => t,
        Err(Error::Format { .. }) => return false,
        Err(e) => panic!("not a format error: {e}"),
    };
    // header, whole pages of owner registry, then the slots
    let registry = bytes.len() - HEADER - SLOTS_PER_KEY * table.capacity() * SLOT;
    assert!(
        registry.is_multiple_of(4096) && registry <= 65535 * 32 + 4095,
        "{registry}"
    );
    for h in table.holders() {
        assert!(h.key_preview.len() <= 32);
    }
    let _ = table.occupancy();
    let _ = table.reap();
    let opts = LockOptions {
        timeout: Duration::from_millis(1),
        ..LockOptions::default()
    };
    let mut lock = Lock::new(&table, opts).unwrap();
    for key in ["a", "user:42", "\u{0}\u{ff}", &"k".repeat(300)] {
        let _ = table.is_locked(key).unwrap();
        let _ = table.debug_placement(key);
        match lock.lock(key) {
            Ok(_) => {
                assert!(lock.token().is_some());
                lock.expire(None).unwrap();
                lock.unlock().unwrap();
            }
            Err(Error::Timeout { .. }) | Err(Error::TableFull { .. }) => {}
            Err(e) => panic!("{e}"),
        }
        match table.try_lock_with_lease(key, Duration::from_secs(1)) {
            Ok(Some(g)) => g.unlock().unwrap(),
            Ok(None) | Err(Error::TableFull { .. }) => {}
            Err(e) => panic!("{e}"),
        }
    }
    true
}

/// A real table file of `capacity` slots, as bytes, with a live entry in it.
fn valid(capacity: usize) -> Vec<u8> {
    let path = TempPath::new("fuzz-seed");
    let t = LockTable::open(&path, capacity).unwrap();
    let _g = t.try_lock_with_lease("seeded", Duration::ZERO).unwrap();
    std::fs::read(&path).unwrap()
}

/// Runs `cases` cases of `strategy` through `exercise`; returns how many opened.
fn fuzz<S: Strategy>(
    name: &str,
    default_cases: u32,
    strategy: S,
    make: impl Fn(S::Value) -> Vec<u8>,
) -> u32 {
    let cases = std::env::var("SHMLOCK_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_cases);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let opened = std::cell::Cell::new(0);
    runner
        .run(&strategy, |v| {
            if exercise(&make(v)) {
                opened.set(opened.get() + 1);
            }
            Ok(())
        })
        .unwrap();
    println!(
        "{name}: {cases} cases ran clean, {} opened and were worked",
        opened.get()
    );
    opened.get()
}

#[test]
fn random_bytes() {
    let opened = fuzz(
        "random_bytes",
        3000,
        prop::collection::vec(any::<u8>(), 0..(HEADER + 4 * SLOT + 64)),
        |b| b,
    );
    assert_eq!(opened, 0, "random bytes passed for a table");
}

#[test]
fn mutated_tables() {
    let strategy = (
        1usize..8,
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        prop_oneof![Just(0i64), -200i64..200],
        any::<bool>(),
    );
    let opened = fuzz(
        "mutated_tables",
        3000,
        strategy,
        |(capacity, edits, resize, slots_only)| {
            let mut bytes = valid(capacity);
            for (at, value) in edits {
                // half the cases keep the header intact and scribble over the slots only
                let i = if slots_only {
                    HEADER + at.index(bytes.len() - HEADER)
                } else {
                    at.index(bytes.len())
                };
                bytes[i] = value;
            }
            let len = (bytes.len() as i64 + resize).max(0) as usize;
            bytes.resize(len, 0);
            bytes
        },
    );
    assert!(
        opened > 0,
        "no mutated table opened: the slot paths were never worked"
    );
}

#[test]
fn garbage_slots() {
    let opened = fuzz(
        "garbage_slots",
        3000,
        (1usize..6, any::<u64>()),
        |(capacity, seed)| {
            let mut bytes = valid(capacity);
            let mut x = seed | 1;
            for b in &mut bytes[HEADER..] {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            bytes
        },
    );
    assert!(opened > 0);
}

/// Opens `bytes` as a shared-dict file and, if it opens, works it through every operation.
/// Returns whether it opened.
fn exercise_dict(bytes: &[u8]) -> bool {
    let path = TempPath::new("fuzz-dict");
    std::fs::write(&path, bytes).unwrap();
    let d = match SharedDict::options().create(false).open(&path) {
        Ok(d) => d,
        Err(Error::Format { .. }) => return false,
        Err(e) => panic!("not a format error: {e}"),
    };
    assert!(d.len() <= d.capacity());
    let _ = (d.evictions(), d.repairs(), d.writer_pid(), d.free_slots());
    for key in [
        "a",
        "user:42",
        "\u{0}\u{ff}",
        "k".repeat(d.max_key_len()).as_str(),
    ] {
        let _ = d.get(key).unwrap();
        let _ = d.get_stale(key).unwrap();
        let _ = d.ttl(key);
        let v = vec![7u8; d.max_value_len().min(16)];
        match d.set(key, &v, Duration::from_secs(60)) {
            Ok(_) => {
                let got = d.get(key).unwrap().expect("a value just stored is there");
                assert_eq!(got.value.as_bytes(), Some(&v[..]));
            }
            Err(Error::NoMemory { .. }) => {}
            Err(e) => panic!("set: {e}"),
        }
        let _ = d.add(key, &v, Duration::ZERO);
        let _ = d.expire(key, Duration::from_secs(1));
        let _ = d.delete(key).unwrap();
        match d.incr(key, 1, Some(1), Duration::ZERO) {
            Ok(2) | Err(Error::NoMemory { .. }) | Err(Error::ValueTooLong { .. }) => {}
            other => panic!("incr of a deleted key: {other:?}"),
        }
    }
    let keys = d.keys(0).unwrap();
    assert!(keys.len() <= d.capacity());
    let _ = d.flush_expired(0);
    let _ = d.flush_all();
    assert!(d.keys(0).unwrap().is_empty());
    true
}

/// A real dict file of `capacity` entries, as bytes, with a few values in it.
fn valid_dict(capacity: usize) -> Vec<u8> {
    let path = TempPath::new("fuzz-dict-seed");
    let d = SharedDict::options()
        .capacity(capacity)
        .max_key_len(16)
        .max_value_len(24)
        .max_processes(4)
        .open(&path)
        .unwrap();
    d.set("seeded", "value", Duration::ZERO).unwrap();
    d.incr("count", 5, Some(0), Duration::from_secs(60))
        .unwrap();
    std::fs::read(&path).unwrap()
}

/// Where a dict file's entries start: header, one page of registry (4 entries), control.
const DICT_ENTRIES: usize = HEADER + 4096 + 4096;

/// Runs `cases` cases of `strategy` through `exercise_dict`; returns how many opened.
fn fuzz_dict<S: Strategy>(
    name: &str,
    default_cases: u32,
    strategy: S,
    make: impl Fn(S::Value) -> Vec<u8>,
) -> u32 {
    let cases = std::env::var("SHMLOCK_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_cases);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let opened = std::cell::Cell::new(0);
    runner
        .run(&strategy, |v| {
            if exercise_dict(&make(v)) {
                opened.set(opened.get() + 1);
            }
            Ok(())
        })
        .unwrap();
    println!(
        "{name}: {cases} cases ran clean, {} opened and were worked",
        opened.get()
    );
    opened.get()
}

#[test]
fn random_bytes_as_a_dict() {
    let opened = fuzz_dict(
        "random_bytes_as_a_dict",
        1000,
        prop::collection::vec(any::<u8>(), 0..(HEADER + 2 * 4096 + 64)),
        |b| b,
    );
    assert_eq!(opened, 0, "random bytes passed for a dict");
}

#[test]
fn mutated_dicts() {
    let strategy = (
        1usize..8,
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        prop_oneof![Just(0i64), -200i64..200],
        any::<bool>(),
    );
    let opened = fuzz_dict(
        "mutated_dicts",
        1000,
        strategy,
        |(capacity, edits, resize, entries_only)| {
            let mut bytes = valid_dict(capacity);
            for (at, value) in edits {
                // half the cases keep header and control page intact and scribble over the
                // entries only (a writer lock word of garbage would make every case wait
                // out the stall bound)
                let i = if entries_only {
                    DICT_ENTRIES + at.index(bytes.len() - DICT_ENTRIES)
                } else {
                    at.index(bytes.len())
                };
                bytes[i] = value;
            }
            let len = (bytes.len() as i64 + resize).max(0) as usize;
            bytes.resize(len, 0);
            bytes
        },
    );
    assert!(
        opened > 0,
        "no mutated dict opened: the entry paths were never worked"
    );
}

#[test]
fn garbage_dict_entries() {
    let opened = fuzz_dict(
        "garbage_dict_entries",
        1000,
        (1usize..6, any::<u64>()),
        |(capacity, seed)| {
            let mut bytes = valid_dict(capacity);
            let mut x = seed | 1;
            for b in &mut bytes[DICT_ENTRIES..] {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            bytes
        },
    );
    assert!(opened > 0);
}
