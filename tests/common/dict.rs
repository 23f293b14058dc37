//! Helpers of the dict tests (tests/dict.rs and the ported upstream cases).

use std::time::Duration;

use shmlock::{SharedDict, Value};

use super::TempPath;

/// A ttl that never runs out.
pub const NEVER: Duration = Duration::ZERO;
/// Longer than a tick of the coarse clock: two stores this far apart have distinct use
/// times, so the least recently used entry is the one stored first.
pub const TICK: Duration = Duration::from_millis(15);

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
