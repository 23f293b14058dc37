//! Helpers of the dict tests (tests/dict.rs and the ported upstream cases).

use std::time::Duration;

use shmlock::{SharedDict, Value};

use super::TempPath;

/// A ttl that never runs out.
pub const NEVER: Duration = Duration::ZERO;
/// Longer than a tick of the coarse clock (1-10 ms): a read this long after another read of
/// the same key ranks the key anew (see `LruModel`).
pub const TICK: Duration = Duration::from_millis(15);

/// The order in which a dict evicts its keys (least recently used first), by the rule of
/// its LRU stamps: stores, the first read of a key after its last store, and a read of a
/// key after a step of stores since its last read (a step: a 64th of the dict's entries,
/// rounded down to a power of two, at least 1), rank in the order they were made, in any
/// process. (Two reads with no store between them, and a second read of a key in one tick
/// of the coarse clock before a step of stores, may rank either way: a test that follows
/// this model makes neither.)
pub struct LruModel {
    order: Vec<String>,
    /// The keys read since their last store, and the stores made before that read.
    read: std::collections::HashMap<String, u64>,
    stores: u64,
    step: u64,
}

impl LruModel {
    /// The model of a dict of `entries` entries.
    pub fn new(entries: usize) -> LruModel {
        LruModel {
            order: Vec::new(),
            read: Default::default(),
            stores: 0,
            step: 1 << (entries / 64).max(1).ilog2().min(10),
        }
    }

    /// `key` was stored (set, added, replaced, incremented).
    pub fn stored(&mut self, key: &str) {
        self.order.retain(|k| k != key);
        self.order.push(key.to_owned());
        self.read.remove(key);
        self.stores += 1;
    }

    /// `key` was read, as [`readable`](Self::readable) allows.
    pub fn read(&mut self, key: &str) {
        assert!(self.may_read(key), "{key} read again too soon");
        self.read.insert(key.to_owned(), self.stores);
        self.order.retain(|k| k != key);
        self.order.push(key.to_owned());
    }

    fn may_read(&self, key: &str) -> bool {
        self.read
            .get(key)
            .is_none_or(|&at| self.stores - at >= self.step)
    }

    /// The keys whose read ranks them: not read since their last store, or a step of
    /// stores ago. The least recently used first.
    pub fn readable(&self) -> Vec<&str> {
        self.order
            .iter()
            .filter(|k| self.may_read(k))
            .map(String::as_str)
            .collect()
    }

    /// The keys, the least recently used first.
    pub fn keys(&self) -> &[String] {
        &self.order
    }

    /// Takes out the `n` least recently used keys (those an eviction of `n` must take).
    pub fn evict(&mut self, n: usize) -> Vec<String> {
        let gone: Vec<String> = self.order.drain(..n).collect();
        for k in &gone {
            self.read.remove(k);
        }
        gone
    }

    /// Takes out `key` (deleted, or expired).
    pub fn remove(&mut self, key: &str) {
        self.order.retain(|k| k != key);
        self.read.remove(key);
    }
}

/// The keys of `d` (listing them marks none used, as a read would), sorted.
pub fn keys_of(d: &SharedDict) -> Vec<String> {
    let mut keys: Vec<String> = d
        .keys(0)
        .unwrap()
        .into_iter()
        .map(|k| String::from_utf8(k).unwrap())
        .collect();
    keys.sort();
    keys
}

/// A new dict of `capacity` entries with values of up to `max_value` bytes.
pub fn dict(name: &str, capacity: usize, max_value: usize) -> (TempPath, SharedDict) {
    let path = TempPath::new(name);
    let dict = SharedDict::open(&path, capacity, max_value).unwrap();
    (path, dict)
}

/// The live value of `key`.
pub fn value(d: &SharedDict, key: impl AsRef<[u8]>) -> Option<Value> {
    d.get(key).unwrap().map(|i| i.value)
}

/// A byte value, as `value` returns it.
pub fn b(s: &str) -> Option<Value> {
    Some(Value::Bytes(s.as_bytes().to_vec()))
}

/// An integer value, as `value` returns it.
pub fn int(n: i64) -> Option<Value> {
    Some(Value::Int(n))
}

/// A value that says what it is: key id, length, generation, filler, then a checksum of all
/// of that (at least 24 bytes). Any mix of two values, or of a value and garbage, fails
/// [`verify`].
pub fn make_value(key: u32, gen: u64, len: usize) -> Vec<u8> {
    let len = len.max(24);
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(&key.to_le_bytes());
    v.extend_from_slice(&(len as u32).to_le_bytes());
    v.extend_from_slice(&gen.to_le_bytes());
    let mut x = gen | 1;
    while v.len() < len - 8 {
        v.push(super::fork::xorshift(&mut x) as u8);
    }
    let sum = xxhash_rust::xxh3::xxh3_64(&v);
    v.extend_from_slice(&sum.to_le_bytes());
    v
}

/// Whether `v` is a whole value [`make_value`] made for `key`.
pub fn verify(key: u32, v: &[u8]) -> bool {
    v.len() >= 24
        && u32::from_le_bytes(v[0..4].try_into().unwrap()) == key
        && u32::from_le_bytes(v[4..8].try_into().unwrap()) as usize == v.len()
        && xxhash_rust::xxh3::xxh3_64(&v[..v.len() - 8]).to_le_bytes() == v[v.len() - 8..]
}

/// The generation a value of [`make_value`] was made with.
pub fn gen_of(v: &[u8]) -> u64 {
    u64::from_le_bytes(v[8..16].try_into().unwrap())
}

/// Drives a dict of 8 entries (every key's window is the whole table, and its eviction
/// sample all of it) with a random mix of stores and reads, none a tick apart, and checks
/// that every evicting store takes exactly the key the LRU model says.
pub fn lru_rounds(d: &SharedDict, rounds: usize, seed: u64, read: &mut dyn FnMut(&str)) {
    let mut model = LruModel::new(8);
    for i in 0..8 {
        let key = format!("k{i}");
        assert!(!d.set(&key, "v", NEVER).unwrap().forcible);
        model.stored(&key);
    }
    let mut x = seed;
    let mut fresh = 8;
    let mut last_was_read = false;
    let (mut reads, mut evictions) = (0, 0);
    for _ in 0..rounds {
        let r = super::fork::xorshift(&mut x) % 10;
        let readable = model.readable();
        if r < 4 && !last_was_read && !readable.is_empty() {
            let key = readable[super::fork::xorshift(&mut x) as usize % readable.len()].to_owned();
            read(&key);
            model.read(&key);
            last_was_read = true;
            reads += 1;
            continue;
        }
        last_was_read = false;
        if r < 7 {
            let keys = model.keys();
            let key = keys[super::fork::xorshift(&mut x) as usize % keys.len()].clone();
            if r == 6 {
                d.set(&key, 7i64, NEVER).unwrap();
                d.incr(&key, 1i64, None, NEVER).unwrap(); // a store too
            } else {
                assert!(!d.set(&key, "w", NEVER).unwrap().forcible);
            }
            model.stored(&key);
        } else {
            let key = format!("k{fresh}");
            fresh += 1;
            let stored = d.set(&key, "v", NEVER).unwrap();
            assert!(stored.forcible, "{key} found room in a full dict");
            let gone = model.evict(1);
            model.stored(&key);
            let mut expected: Vec<String> = model.keys().to_vec();
            expected.sort();
            assert_eq!(keys_of(d), expected, "{key} evicted another than {gone:?}");
            evictions += 1;
        }
    }
    assert!(
        reads > rounds / 5 && evictions > rounds / 5,
        "{reads} reads, {evictions} evictions"
    );
    assert_eq!(d.evictions(), evictions as u64);
}
