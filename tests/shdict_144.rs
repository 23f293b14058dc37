//! lua-nginx-module's `t/144-shdict-incr-init.t` (ngx.shared.DICT's `incr` with an `init`
//! value), ported to `SharedDict`: one test per upstream case that has a meaning for our
//! API, named `t144_NNN_...` after the upstream "=== TEST NNN". Each asserts what
//! upstream's `--- response_body` expects, translated: a Lua number value is `Value::Int`,
//! a Lua boolean `Value::Bool`, "not a number" is `Error::NotANumber`, an exptime in
//! seconds is a short `Duration` with a sleep well past it. `incr` returns the sum alone:
//! ngx's third return value, `forcible` (a live entry was evicted), is read as a change of
//! `evictions()`.
//!
//! Translations: upstream fills a 1 MiB zone with 1000-byte keys until a store evicts; a
//! `SharedDict` counts its room in entries, so case 5 uses a dict of 8 entries made for
//! such keys.
//!
//! Upstream cases not ported, by reason:
//!
//! * The Lua binding's type checking (an `init` that is a string): 8.

mod common;

use std::thread::sleep;
use std::time::Duration;

use common::dict::{dict, value, NEVER};
use common::TempPath;
use shmlock::{Error, SharedDict, Value};

/// Upstream's exptimes of 0.001 s.
const SHORT: Duration = Duration::from_millis(1);
/// A sleep clearly past SHORT (and the coarse clock's tick).
const PAST_SHORT: Duration = Duration::from_millis(120);

#[test]
fn t144_001_incr_key_with_init_key_exists() {
    let (_p, dogs) = dict("t144-001", 64, 32);
    dogs.set("foo", 32i64, NEVER).unwrap();
    assert_eq!(dogs.incr("foo", 10502, Some(1), NEVER).unwrap(), 10534);
    assert_eq!(value(&dogs, "foo"), Some(Value::Int(10534)));
}

#[test]
fn t144_002_incr_key_with_init_key_not_exists() {
    let (_p, dogs) = dict("t144-002", 64, 32);
    dogs.flush_all().unwrap();
    dogs.set("bah", 32i64, NEVER).unwrap();
    assert_eq!(dogs.incr("foo", 10502, Some(1), NEVER).unwrap(), 10503);
    assert_eq!(value(&dogs, "foo"), Some(Value::Int(10503)));
}

#[test]
fn t144_003_incr_key_with_init_key_expired_and_size_not_matched() {
    let (_p, dogs) = dict("t144-003", 64, 32);
    for i in 1..=20i64 {
        dogs.set(format!("bar{i}"), i, SHORT).unwrap();
    }
    dogs.set("foo", "32", SHORT).unwrap();
    sleep(PAST_SHORT);
    assert_eq!(dogs.incr("foo", 10502, Some(0), NEVER).unwrap(), 10502);
    assert_eq!(value(&dogs, "foo"), Some(Value::Int(10502)));
}

#[test]
fn t144_004_incr_key_with_init_key_expired_and_size_matched() {
    let (_p, dogs) = dict("t144-004", 64, 32);
    for i in 1..=20i64 {
        dogs.set(format!("bar{i}"), i, SHORT).unwrap();
    }
    dogs.set("foo", 32i64, SHORT).unwrap();
    sleep(PAST_SHORT);
    assert_eq!(dogs.incr("foo", 10502, Some(0), NEVER).unwrap(), 10502);
    assert_eq!(value(&dogs, "foo"), Some(Value::Int(10502)));
}

#[test]
fn t144_005_incr_key_with_init_forcibly_override_other_valid_entries() {
    let path = TempPath::new("t144-005");
    let dogs = SharedDict::options()
        .capacity(8)
        .max_key_len(1100)
        .max_value_len(8)
        .open(&path)
        .unwrap();
    dogs.flush_all().unwrap();
    let long_prefix = "1234567890".repeat(100);
    // Store until a store evicts, then delete what it stored: one entry is free.
    let mut filled = false;
    for i in 1..=1000i64 {
        let key = format!("{long_prefix}{i}");
        if dogs.set(&key, i, NEVER).unwrap().forcible {
            assert!(dogs.delete(&key).unwrap());
            filled = true;
            break;
        }
    }
    assert!(filled, "no store ever evicted");
    // The first incr takes the free entry: not forcible.
    let evictions = dogs.evictions();
    let bar = format!("{long_prefix}bar");
    assert_eq!(dogs.incr(&bar, 10502, Some(0), NEVER).unwrap(), 10502);
    assert_eq!(dogs.evictions(), evictions, "forcible: false");
    // The second finds the dict full: forcible.
    let foo = format!("{long_prefix}foo");
    assert_eq!(dogs.incr(&foo, 10502, Some(0), NEVER).unwrap(), 10502);
    assert_eq!(dogs.evictions(), evictions + 1, "forcible: true");
    assert_eq!(value(&dogs, &foo), Some(Value::Int(10502)));
}

#[test]
fn t144_006_incr_key_without_init_no_forcible_returned() {
    let (_p, dogs) = dict("t144-006", 64, 32);
    dogs.set("foo", 1i64, NEVER).unwrap();
    assert_eq!(dogs.incr("foo", 1, None, NEVER).unwrap(), 2);
    assert_eq!(dogs.evictions(), 0);
    assert_eq!(value(&dogs, "foo"), Some(Value::Int(2)));
}

#[test]
fn t144_007_incr_key_original_value_is_not_number() {
    let (_p, dogs) = dict("t144-007", 64, 32);
    dogs.set("foo", true, NEVER).unwrap();
    assert!(matches!(
        dogs.incr("foo", 1, Some(0), NEVER),
        Err(Error::NotANumber { .. })
    ));
    assert_eq!(value(&dogs, "foo"), Some(Value::Bool(true)));
}
