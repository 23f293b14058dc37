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
