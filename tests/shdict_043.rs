//! lua-nginx-module's `t/043-shdict.t` (ngx.shared.DICT), ported to `SharedDict`: one
//! test per upstream case that has a meaning for our API, named `t043_NNN_...` after the
//! upstream "=== TEST NNN". Each asserts what upstream's `--- response_body` expects,
//! translated: a Lua number value stored as an integer is `Value::Int` and one with a
//! fraction `Value::Float` (what an `f64` increment makes of an integer too), a Lua boolean
//! is `Value::Bool`, ngx's "exists" / "not found" /
//! "not a number" / "no memory" errors are `Error::Exists` / `NotFound` / `NotANumber` /
//! `NoMemory`, `forcible` is `Stored { forcible }`, a missing flags value is 0, and an
//! exptime in seconds is a short `Duration` with a sleep well past it.
//!
//! Translations of sizes: upstream fills a zone of so many KiB until a store evicts (or,
//! `safe_`, fails); a `SharedDict` counts its room in entries, so those cases use a dict of
//! 8 entries (every key's window is the whole table and the eviction sample all of it, so
//! the least recently used entry of the dict is the one evicted, as in ngx's LRU queue).
//! Large keys and values need a dict created with room for them (`max_key_len`,
//! `max_value_len`).
//!
//! Stand-ins: a Lua number key is its decimal string (Lua converts it so: cases 4, 71,
//! 82).
//!
//! Upstream cases not ported, by reason:
//!
//! * A nil value (`set(k, nil)` deletes, `add(k, nil)` is refused; a `ValueRef` is never
//!   nil, and deleting is `delete`, ported in 17 and 18): 19, 20, 84.
//! * A nil key (ruled out by the key's type): 61, 65, 69, 78.
//! * A negative exptime (ruled out by `Duration`): 92.
//! * The Lua binding's argument and type checking (a missing or bad `self` zone, a table
//!   as the zone, `ngx.null`, a value of a type it cannot store, a string increment
//!   coerced to a number, the Lua type of the dict object): 13 (also `--- SKIP` upstream),
//!   16, 62, 64, 79, 83, 86, 87, 88, 89, 90.
//! * nginx configuration: TEST 1 again in other request phases (`rewrite_by_lua`,
//!   `access_by_lua`, `set_by_lua`, `header_filter_by_lua`): 22, 23, 24, 25; a
//!   `lua_shared_dict` zone defined twice: 93.
//! * Zone size in bytes (how many ever-longer values a 100 KiB slab zone takes): 21.
//! * SharedDict deliberately differs (a value longer than the dict's `max_value_len` is
//!   `Error::ValueTooLong` before anything is looked at, where ngx answers "no memory",
//!   after evicting in 26): 14, 26.

mod common;

use std::thread::sleep;
use std::time::Duration;

use common::dict::{b, dict, int, value, NEVER};
use common::TempPath;
use shmlock::{Error, Put, SharedDict, Stored, Value};

/// Upstream's exptimes of 0.001 to 0.01 s (longer here: a value read back at once must
/// still be there on a busy machine).
const SHORT: Duration = Duration::from_millis(250);
/// A sleep clearly past SHORT (and the coarse clock's tick).
const PAST_SHORT: Duration = Duration::from_millis(400);
/// An exptime that does not run out during a test.
const LONG: Duration = Duration::from_secs(100);
const NOT_FORCIBLE: Stored = Stored { forcible: false };

fn float(x: f64) -> Option<Value> {
    Some(Value::Float(x))
}

/// Upstream's values of cases 9, 10, 58 and 59: `string.rep(" hello", 10) .. i`.
fn hello(i: usize) -> String {
    format!("{}{i}", " hello".repeat(10))
}

#[test]
fn t043_001_string_key_int_value() {
    let (_p, dogs) = dict("t043-001", 64, 32);
    dogs.set("foo", 32i64, NEVER).unwrap();
    dogs.set("bah", 10502i64, NEVER).unwrap();
    assert_eq!(value(&dogs, "foo"), int(32));
    assert_eq!(value(&dogs, "bah"), int(10502));
}

#[test]
#[allow(clippy::approx_constant)] // upstream's literal 3.14159, not an approximation of π
fn t043_002_string_key_floating_point_value() {
    let (_p, cats) = dict("t043-002", 64, 32);
    cats.set("foo", 3.14159, NEVER).unwrap();
    cats.set("baz", 1.28, NEVER).unwrap();
    cats.set("baz", 3.96, NEVER).unwrap();
    assert_eq!(value(&cats, "foo"), float(3.14159));
    assert_eq!(value(&cats, "baz"), float(3.96));
}

#[test]
fn t043_003_string_key_boolean_value() {
    let (_p, cats) = dict("t043-003", 64, 32);
    cats.set("foo", true, NEVER).unwrap();
    cats.set("bar", false, NEVER).unwrap();
    assert_eq!(value(&cats, "foo"), Some(Value::Bool(true)));
    assert_eq!(value(&cats, "bar"), Some(Value::Bool(false)));
}

#[test]
fn t043_004_number_keys_string_values() {
    let (_p, cats) = dict("t043-004", 64, 32);
    // A Lua number key is its decimal string: 1234 and "1234" are one key.
    assert_eq!(
        cats.set(1234.to_string(), "cat", NEVER).unwrap(),
        NOT_FORCIBLE
    );
    assert_eq!(cats.set("1234", "dog", NEVER).unwrap(), NOT_FORCIBLE);
    assert_eq!(
        cats.set(256.to_string(), "bird", NEVER).unwrap(),
        NOT_FORCIBLE
    );
    assert_eq!(value(&cats, 1234.to_string()), b("dog"));
    assert_eq!(value(&cats, "1234"), b("dog"));
    assert_eq!(value(&cats, "256"), b("bird"));
}

#[test]
fn t043_005_different_size_values_set_to_the_same_key() {
    let (_p, dogs) = dict("t043-005", 64, 32);
    dogs.set("foo", "hello", NEVER).unwrap();
    assert_eq!(value(&dogs, "foo"), b("hello"));
    dogs.set("foo", "hello, world", NEVER).unwrap();
    assert_eq!(value(&dogs, "foo"), b("hello, world"));
    dogs.set("foo", "hello", NEVER).unwrap();
    assert_eq!(value(&dogs, "foo"), b("hello"));
}

#[test]
fn t043_006_expired_entries_can_be_auto_removed_by_get() {
    let (_p, dogs) = dict("t043-006", 64, 32);
    dogs.set("foo", 32i64, SHORT).unwrap();
    sleep(PAST_SHORT);
    assert_eq!(value(&dogs, "foo"), None);
}

#[test]
fn t043_007_expired_entries_can_not_be_auto_removed_by_get() {
    let (_p, dogs) = dict("t043-007", 64, 32);
    dogs.set("bar", 56i64, Duration::from_millis(1)).unwrap();
    dogs.set("baz", 78i64, Duration::from_millis(1)).unwrap();
    dogs.set("foo", 32i64, SHORT).unwrap();
    sleep(PAST_SHORT);
    assert_eq!(value(&dogs, "foo"), None);
}

#[test]
fn t043_008_not_yet_expired_entries() {
    let (_p, dogs) = dict("t043-008", 64, 32);
    dogs.set("foo", 32i64, LONG).unwrap();
    sleep(Duration::from_millis(10));
    assert_eq!(value(&dogs, "foo"), int(32));
}

#[test]
fn t043_009_forcibly_override_other_valid_entries() {
    let (_p, dogs) = dict("t043-009", 8, 128);
    // First request: store until a store evicts.
    let mut i = 0;
    let last = loop {
        i += 1;
        assert!(i <= 1000, "no store ever evicted");
        let stored = dogs.set(format!("key_{i}"), &hello(i), NEVER).unwrap();
        if stored.forcible {
            break stored;
        }
    };
    assert_eq!(last, Stored { forcible: true });
    assert_eq!(i, 9, "abort at: the 9th key of an 8-entry dict");
    assert_eq!(value(&dogs, format!("key_{i}")), b(&hello(i)));
    assert_eq!(value(&dogs, "key_1"), None, "the least recently used went");
    assert_eq!(value(&dogs, "key_2"), b(&hello(2)));
    // Second request: key_1 is gone and the dict is full, so its store evicts at once.
    assert_eq!(
        dogs.set("key_1", &hello(1), NEVER).unwrap(),
        Stored { forcible: true },
        "abort at 1"
    );
    assert_eq!(value(&dogs, "key_1"), b(&hello(1)));
}

#[test]
fn t043_010_forcibly_override_other_valid_entries_and_test_lru() {
    let (_p, dogs) = dict("t043-010", 8, 128);
    let mut i = 0;
    loop {
        i += 1;
        assert!(i <= 1000, "no store ever evicted");
        // Upstream reads key_1 part way through the filling (at its 10th of 353 stores).
        if i == 5 {
            assert!(dogs.get("key_1").unwrap().is_some());
        }
        if dogs
            .set(format!("key_{i}"), &hello(i), NEVER)
            .unwrap()
            .forcible
        {
            break;
        }
    }
    assert_eq!(i, 9, "abort at");
    assert_eq!(value(&dogs, format!("key_{i}")), b(&hello(i)));
    assert_eq!(value(&dogs, "key_1"), b(&hello(1)), "read, so kept");
    assert_eq!(value(&dogs, "key_2"), None, "the least recently used went");
    // Second request: key_1 is there (no eviction), key_2 is not (its store evicts).
    assert_eq!(dogs.set("key_1", &hello(1), NEVER).unwrap(), NOT_FORCIBLE);
    assert_eq!(
        dogs.set("key_2", &hello(2), NEVER).unwrap(),
        Stored { forcible: true },
        "abort at 2"
    );
    assert_eq!(value(&dogs, "key_2"), b(&hello(2)));
    assert_eq!(value(&dogs, "key_1"), b(&hello(1)));
}

#[test]
fn t043_011_dogs_and_cats_dicts() {
    let (_p1, dogs) = dict("t043-011-dogs", 64, 32);
    let (_p2, cats) = dict("t043-011-cats", 64, 32);
    dogs.set("foo", 32i64, NEVER).unwrap();
    cats.set("foo", "hello, world", NEVER).unwrap();
    assert_eq!(value(&dogs, "foo"), int(32));
    assert_eq!(value(&cats, "foo"), b("hello, world"));
    dogs.set("foo", 56i64, NEVER).unwrap();
    assert_eq!(value(&dogs, "foo"), int(56));
    assert_eq!(value(&cats, "foo"), b("hello, world"));
}

#[test]
fn t043_012_get_non_existent_keys() {
    let (_p, dogs) = dict("t043-012", 64, 32);
    assert_eq!(dogs.get("foo").unwrap(), None);
    assert_eq!(dogs.get("foo").unwrap(), None);
}

#[test]
fn t043_015_set_too_large_key() {
    // Keys of up to 65535 bytes, as ngx: a dict made for them.
    let path = TempPath::new("t043-015");
    let dogs = SharedDict::options()
        .capacity(4)
        .max_key_len(65535)
        .max_value_len(16)
        .open(&path)
        .unwrap();
    let key = "a".repeat(65535);
    assert_eq!(dogs.set(&key, "hello", NEVER).unwrap(), NOT_FORCIBLE);
    assert_eq!(value(&dogs, &key), b("hello"));
    let key = "a".repeat(65536);
    assert!(matches!(
        dogs.set(&key, "world", NEVER),
        Err(Error::KeyTooLong { len: 65536, .. })
    ));
}

#[test]
fn t043_017_delete_after_setting_values() {
    let (_p, dogs) = dict("t043-017", 64, 32);
    dogs.set("foo", 32i64, NEVER).unwrap();
    assert_eq!(value(&dogs, "foo"), int(32));
    dogs.delete("foo").unwrap();
    assert_eq!(value(&dogs, "foo"), None);
    dogs.set("foo", "hello, world", NEVER).unwrap();
    assert_eq!(value(&dogs, "foo"), b("hello, world"));
}

#[test]
fn t043_018_delete_at_first() {
    let (_p, dogs) = dict("t043-018", 64, 32);
    dogs.delete("foo").unwrap();
    assert_eq!(value(&dogs, "foo"), None);
    dogs.set("foo", "hello, world", NEVER).unwrap();
    assert_eq!(value(&dogs, "foo"), b("hello, world"));
}

#[test]
fn t043_027_add_key_key_exists() {
    let (_p, dogs) = dict("t043-027", 64, 32);
    dogs.set("foo", 32i64, NEVER).unwrap();
    assert!(matches!(
        dogs.add("foo", 10502i64, NEVER),
        Err(Error::Exists { .. })
    ));
    assert_eq!(value(&dogs, "foo"), int(32));
}

#[test]
fn t043_028_add_key_key_not_exists() {
    let (_p, dogs) = dict("t043-028", 64, 32);
    dogs.set("bah", 32i64, NEVER).unwrap();
    assert_eq!(dogs.add("foo", 10502i64, NEVER).unwrap(), NOT_FORCIBLE);
    assert_eq!(value(&dogs, "foo"), int(10502));
}

#[test]
fn t043_029_add_key_key_expired() {
    let (_p, dogs) = dict("t043-029", 64, 32);
    dogs.set("bar", 32i64, Duration::from_millis(1)).unwrap();
    dogs.set("baz", 32i64, Duration::from_millis(1)).unwrap();
    dogs.set("foo", 32i64, Duration::from_millis(1)).unwrap();
    sleep(PAST_SHORT);
    assert_eq!(dogs.add("foo", 10502i64, NEVER).unwrap(), NOT_FORCIBLE);
    assert_eq!(value(&dogs, "foo"), int(10502));
}

#[test]
fn t043_030_add_key_key_expired_and_value_size_unmatched() {
    let (_p, dogs) = dict("t043-030", 64, 32);
    dogs.set("bar", 32i64, Duration::from_millis(1)).unwrap();
    dogs.set("baz", 32i64, Duration::from_millis(1)).unwrap();
    dogs.set("foo", "hi", Duration::from_millis(1)).unwrap();
    sleep(PAST_SHORT);
    assert_eq!(dogs.add("foo", "hello", NEVER).unwrap(), NOT_FORCIBLE);
    assert_eq!(value(&dogs, "foo"), b("hello"));
}

#[test]
fn t043_031_replace_key_key_exists() {
    let (_p, dogs) = dict("t043-031", 64, 32);
    dogs.set("foo", 32i64, NEVER).unwrap();
    assert_eq!(dogs.replace("foo", 10502i64, NEVER).unwrap(), NOT_FORCIBLE);
    assert_eq!(value(&dogs, "foo"), int(10502));
    assert_eq!(dogs.replace("foo", "hello", NEVER).unwrap(), NOT_FORCIBLE);
    assert_eq!(value(&dogs, "foo"), b("hello"));
}

#[test]
fn t043_032_replace_key_key_not_exists() {
    let (_p, dogs) = dict("t043-032", 64, 32);
    dogs.set("bah", 32i64, NEVER).unwrap();
    assert!(matches!(
        dogs.replace("foo", 10502i64, NEVER),
        Err(Error::NotFound { .. })
    ));
    assert_eq!(value(&dogs, "foo"), None);
}

#[test]
fn t043_033_replace_key_key_expired() {
    let (_p, dogs) = dict("t043-033", 64, 32);
    dogs.set("bar", 3i64, Duration::from_millis(1)).unwrap();
    dogs.set("baz", 2i64, Duration::from_millis(1)).unwrap();
    dogs.set("foo", 32i64, Duration::from_millis(1)).unwrap();
    sleep(PAST_SHORT);
    assert!(matches!(
        dogs.replace("foo", 10502i64, NEVER),
        Err(Error::NotFound { .. })
    ));
    assert_eq!(value(&dogs, "foo"), None);
}

#[test]
fn t043_034_replace_key_key_expired_and_value_size_unmatched() {
    let (_p, dogs) = dict("t043-034", 64, 32);
    dogs.set("bar", 32i64, Duration::from_millis(1)).unwrap();
    dogs.set("baz", 32i64, Duration::from_millis(1)).unwrap();
    dogs.set("foo", "hi", Duration::from_millis(1)).unwrap();
    sleep(PAST_SHORT);
    assert!(matches!(
        dogs.replace("foo", "hello", NEVER),
        Err(Error::NotFound { .. })
    ));
    assert_eq!(value(&dogs, "foo"), None);
}

#[test]
fn t043_035_incr_key_key_exists() {
    let (_p, dogs) = dict("t043-035", 64, 32);
    dogs.set("foo", 32i64, NEVER).unwrap();
    assert_eq!(dogs.incr("foo", 10502, None, NEVER).unwrap(), 10534);
    assert_eq!(value(&dogs, "foo"), int(10534));
}

#[test]
fn t043_036_incr_key_key_not_exists() {
    let (_p, dogs) = dict("t043-036", 64, 32);
    dogs.set("bah", 32i64, NEVER).unwrap();
    assert!(matches!(
        dogs.incr("foo", 2, None, NEVER),
        Err(Error::NotFound { .. })
    ));
    assert_eq!(value(&dogs, "foo"), None);
}

#[test]
fn t043_037_incr_key_key_expired() {
    let (_p, dogs) = dict("t043-037", 64, 32);
    dogs.set("bar", 3i64, Duration::from_millis(1)).unwrap();
    dogs.set("baz", 2i64, Duration::from_millis(1)).unwrap();
    dogs.set("foo", 32i64, Duration::from_millis(1)).unwrap();
    sleep(PAST_SHORT);
    assert!(matches!(
        dogs.incr("foo", 10502, None, NEVER),
        Err(Error::NotFound { .. })
    ));
    assert_eq!(value(&dogs, "foo"), None);
}

#[test]
fn t043_038_incr_key_incr_by_0() {
    let (_p, dogs) = dict("t043-038", 64, 32);
    dogs.set("foo", 32i64, NEVER).unwrap();
    assert_eq!(dogs.incr("foo", 0, None, NEVER).unwrap(), 32);
    assert_eq!(value(&dogs, "foo"), int(32));
}

#[test]
fn t043_039_incr_key_incr_by_floating_point_number() {
    let (_p, dogs) = dict("t043-039", 64, 32);
    dogs.set("foo", 32i64, NEVER).unwrap();
    // 32 + 0.14 in doubles is the double 32.14, printed so by Lua.
    assert_eq!(dogs.incr("foo", 0.14, None, NEVER).unwrap(), 32.14);
    assert_eq!(value(&dogs, "foo"), float(32.14));
}

#[test]
fn t043_040_incr_key_incr_by_negative_numbers() {
    let (_p, dogs) = dict("t043-040", 64, 32);
    dogs.set("foo", 32i64, NEVER).unwrap();
    assert_eq!(dogs.incr("foo", -0.14, None, NEVER).unwrap(), 31.86);
    assert_eq!(value(&dogs, "foo"), float(31.86));
}

#[test]
fn t043_041_incr_key_original_value_is_not_number() {
    let (_p, dogs) = dict("t043-041", 64, 32);
    dogs.set("foo", true, NEVER).unwrap();
    assert!(matches!(
        dogs.incr("foo", -0.14, None, NEVER),
        Err(Error::NotANumber { .. })
    ));
    assert_eq!(value(&dogs, "foo"), Some(Value::Bool(true)));
}

#[test]
fn t043_042_get_and_set_with_flags() {
    let (_p, dogs) = dict("t043-042", 64, 32);
    dogs.put(Put::Set, "foo", 32i64, NEVER, 199).unwrap();
    // exptime 202 s, no flags
    dogs.set("bah", 10502i64, Duration::from_secs(202)).unwrap();
    let foo = dogs.get("foo").unwrap().unwrap();
    assert_eq!((foo.value, foo.flags), (Value::Int(32), 199));
    let bah = dogs.get("bah").unwrap().unwrap();
    assert_eq!((bah.value, bah.flags), (Value::Int(10502), 0));
}

#[test]
fn t043_043_expired_entries_can_be_auto_removed_by_get_with_flags_set() {
    let (_p, dogs) = dict("t043-043", 64, 32);
    dogs.put(Put::Set, "foo", 32i64, SHORT, 255).unwrap();
    sleep(PAST_SHORT);
    assert_eq!(dogs.get("foo").unwrap(), None, "neither value nor flags");
}

#[test]
fn t043_044_flush_all() {
    let (_p, dogs) = dict("t043-044", 64, 32);
    dogs.set("foo", 32i64, NEVER).unwrap();
    dogs.set("bah", 10502i64, NEVER).unwrap();
    assert_eq!(value(&dogs, "foo"), int(32));
    assert_eq!(value(&dogs, "bah"), int(10502));
    dogs.flush_all().unwrap();
    assert_eq!(value(&dogs, "foo"), None);
    assert_eq!(value(&dogs, "bah"), None);
}

#[test]
fn t043_045_flush_expires() {
    let (_p, dogs) = dict("t043-045", 64, 32);
    dogs.set("foo", "x", SHORT).unwrap();
    dogs.set("bah", "y", NEVER).unwrap();
    dogs.set("bar", "z", LONG).unwrap();
    sleep(PAST_SHORT);
    assert_eq!(dogs.flush_expired(0).unwrap(), 1);
}

#[test]
fn t043_046_flush_expires_with_number() {
    let (_p, dogs) = dict("t043-046", 1024, 32);
    for i in 1..=100 {
        dogs.set(i.to_string(), "x", SHORT).unwrap();
    }
    dogs.set("bah", "y", NEVER).unwrap();
    dogs.set("bar", "z", LONG).unwrap();
    sleep(PAST_SHORT);
    assert_eq!(dogs.flush_expired(42).unwrap(), 42);
}

#[test]
fn t043_047_flush_expires_an_empty_dict() {
    let (_p, dogs) = dict("t043-047", 64, 32);
    assert_eq!(dogs.flush_expired(0).unwrap(), 0);
}

#[test]
fn t043_048_flush_expires_a_dict_without_expired_items() {
    let (_p, dogs) = dict("t043-048", 64, 32);
    dogs.set("bah", "y", NEVER).unwrap();
    dogs.set("bar", "z", LONG).unwrap();
    assert_eq!(dogs.flush_expired(0).unwrap(), 0);
}

#[test]
fn t043_049_list_all_keys_in_a_shdict() {
    let (_p, dogs) = dict("t043-049", 64, 32);
    dogs.set("bah", "y", NEVER).unwrap();
    dogs.set("bar", "z", NEVER).unwrap();
    let mut keys = dogs.keys(0).unwrap();
    assert_eq!(keys.len(), 2);
    keys.sort();
    assert_eq!(keys, [b"bah".to_vec(), b"bar".to_vec()]);
}

#[test]
fn t043_050_list_keys_in_a_shdict_with_limit() {
    let (_p, dogs) = dict("t043-050", 64, 32);
    dogs.set("bah", "y", NEVER).unwrap();
    dogs.set("bar", "z", NEVER).unwrap();
    assert_eq!(dogs.keys(1).unwrap().len(), 1);
}

#[test]
fn t043_051_list_all_keys_in_a_shdict_with_expires() {
    let (_p, dogs) = dict("t043-051", 64, 32);
    dogs.set("foo", "x", SHORT).unwrap();
    dogs.set("bah", "y", NEVER).unwrap();
    dogs.set("bar", "z", LONG).unwrap();
    sleep(PAST_SHORT);
    assert_eq!(dogs.keys(0).unwrap().len(), 2);
}

#[test]
fn t043_052_list_keys_in_a_shdict_with_limit_larger_than_number_of_keys() {
    let (_p, dogs) = dict("t043-052", 64, 32);
    dogs.set("bah", "y", NEVER).unwrap();
    dogs.set("bar", "z", NEVER).unwrap();
    assert_eq!(dogs.keys(3).unwrap().len(), 2);
}

#[test]
fn t043_053_list_keys_in_an_empty_shdict() {
    let (_p, dogs) = dict("t043-053", 64, 32);
    assert_eq!(dogs.keys(0).unwrap().len(), 0);
}

#[test]
fn t043_054_list_keys_in_an_empty_shdict_with_a_limit() {
    let (_p, dogs) = dict("t043-054", 64, 32);
    assert_eq!(dogs.keys(4).unwrap().len(), 0);
}

#[test]
fn t043_055_list_all_keys_in_a_shdict_with_all_keys_expired() {
    let (_p, dogs) = dict("t043-055", 64, 32);
    dogs.set("foo", "x", SHORT).unwrap();
    dogs.set("bah", "y", SHORT).unwrap();
    dogs.set("bar", "z", SHORT).unwrap();
    sleep(PAST_SHORT);
    assert_eq!(dogs.keys(0).unwrap().len(), 0);
}

/// 2048 number values under the keys "1" to "2048", in a dict roomy enough (1/8 full) that
/// none evicts another.
fn dict_of_2048_keys(name: &str) -> (TempPath, SharedDict) {
    let path = TempPath::new(name);
    let dogs = SharedDict::options()
        .capacity(16384)
        .max_key_len(16)
        .max_value_len(8)
        .open(&path)
        .unwrap();
    for i in 1..=2048i64 {
        dogs.set(i.to_string(), i, NEVER).unwrap();
    }
    (path, dogs)
}

#[test]
fn t043_056_list_all_keys_in_a_shdict_with_more_than_1024_keys_with_no_limit_set() {
    // get_keys() without a limit is get_keys(1024); `keys` has no default.
    let (_p, dogs) = dict_of_2048_keys("t043-056");
    assert_eq!(dogs.keys(1024).unwrap().len(), 1024);
}

#[test]
fn t043_057_list_all_keys_in_a_shdict_with_more_than_1024_keys_with_0_limit_set() {
    let (_p, dogs) = dict_of_2048_keys("t043-057");
    assert_eq!(dogs.keys(0).unwrap().len(), 2048);
}

#[test]
fn t043_058_safe_set() {
    let (_p, dogs) = dict("t043-058", 8, 128);
    // Both requests alike: the keys already there are overwritten, the 9th finds no room.
    for _request in 0..2 {
        let mut i = 0;
        loop {
            i += 1;
            assert!(i <= 1000, "no store ever failed");
            match dogs.safe_set(format!("key_{i}"), &hello(i), NEVER) {
                Ok(stored) => assert_eq!(stored, NOT_FORCIBLE),
                Err(Error::NoMemory { .. }) => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(i, 9, "abort at");
        assert_eq!(value(&dogs, format!("key_{i}")), None);
        assert_eq!(value(&dogs, "key_1"), b(&hello(1)));
        assert_eq!(value(&dogs, "key_2"), b(&hello(2)));
    }
}

#[test]
fn t043_059_safe_add() {
    let (_p, dogs) = dict("t043-059", 8, 128);
    let mut i = 0;
    loop {
        i += 1;
        assert!(i <= 1000, "no store ever failed");
        match dogs.safe_add(format!("key_{i}"), &hello(i), NEVER) {
            Ok(stored) => assert_eq!(stored, NOT_FORCIBLE),
            Err(Error::NoMemory { .. }) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(i, 9, "abort at");
    assert_eq!(value(&dogs, format!("key_{i}")), None);
    assert_eq!(value(&dogs, "key_1"), b(&hello(1)));
    assert_eq!(value(&dogs, "key_2"), b(&hello(2)));
    // Second request: key_1 exists.
    assert!(matches!(
        dogs.safe_add("key_1", &hello(1), NEVER),
        Err(Error::Exists { .. })
    ));
    assert_eq!(value(&dogs, "key_1"), b(&hello(1)));
}

#[test]
fn t043_060_get_stale_expired_entries_can_still_be_fetched() {
    let (_p, dogs) = dict("t043-060", 64, 32);
    dogs.set("foo", 32i64, SHORT).unwrap();
    dogs.set("blah", 33i64, LONG).unwrap();
    sleep(PAST_SHORT);
    let (foo, stale) = dogs.get_stale("foo").unwrap().unwrap();
    assert_eq!((foo.value, foo.flags, stale), (Value::Int(32), 0, true));
    let (blah, stale) = dogs.get_stale("blah").unwrap().unwrap();
    assert_eq!((blah.value, blah.flags, stale), (Value::Int(33), 0, false));
}

#[test]
fn t043_063_set_empty_string_keys() {
    let (_p, dogs) = dict("t043-063", 64, 32);
    assert!(matches!(dogs.set("", 32i64, NEVER), Err(Error::EmptyKey)));
}

#[test]
fn t043_066_get_empty_key() {
    let (_p, dogs) = dict("t043-066", 64, 32);
    assert!(matches!(dogs.get(""), Err(Error::EmptyKey)));
}

#[test]
fn t043_067_get_a_too_long_key() {
    let (_p, dogs) = dict("t043-067", 64, 32);
    assert!(matches!(
        dogs.get("a".repeat(65536)),
        Err(Error::KeyTooLong { len: 65536, .. })
    ));
}

#[test]
fn t043_068_set_and_get_large_values() {
    let (_p, dogs) = dict("t043-068", 16, 16384);
    dogs.set("foo", "helloworld".repeat(1024).as_str(), NEVER)
        .unwrap();
    let data = value(&dogs, "foo").unwrap().into_bytes().unwrap();
    assert_eq!(data.len(), 10240);
    assert_eq!(data, "helloworld".repeat(1024).as_bytes());
}

#[test]
fn t043_070_get_stale_empty_key() {
    let (_p, dogs) = dict("t043-070", 64, 32);
    assert!(matches!(dogs.get_stale(""), Err(Error::EmptyKey)));
}

#[test]
fn t043_071_get_stale_number_key() {
    let (_p, dogs) = dict("t043-071", 64, 32);
    dogs.set(1024.to_string(), "hello", NEVER).unwrap();
    let (item, stale) = dogs.get_stale(1024.to_string()).unwrap().unwrap();
    assert_eq!((Some(item.value), stale), (b("hello"), false));
}

#[test]
fn t043_072_get_stale_a_too_long_key() {
    let (_p, dogs) = dict("t043-072", 64, 32);
    assert!(matches!(
        dogs.get_stale("a".repeat(65536)),
        Err(Error::KeyTooLong { len: 65536, .. })
    ));
}

#[test]
fn t043_073_get_stale_a_non_existent_key() {
    let (_p, dogs) = dict("t043-073", 64, 32);
    assert_eq!(dogs.get_stale("not_found").unwrap(), None);
}

#[test]
fn t043_074_set_and_get_stale_large_values() {
    let (_p, dogs) = dict("t043-074", 16, 16384);
    dogs.set("foo", "helloworld".repeat(1024).as_str(), NEVER)
        .unwrap();
    let (item, stale) = dogs.get_stale("foo").unwrap().unwrap();
    assert_eq!(item.value.as_bytes().map(<[u8]>::len), Some(10240));
    assert!(!stale);
}

#[test]
fn t043_075_set_and_get_stale_boolean_values_true() {
    let (_p, dogs) = dict("t043-075", 64, 32);
    assert_eq!(dogs.set("foo", true, NEVER).unwrap(), NOT_FORCIBLE);
    let (item, stale) = dogs.get_stale("foo").unwrap().unwrap();
    assert_eq!((item.value, stale), (Value::Bool(true), false));
}

#[test]
fn t043_076_set_and_get_stale_boolean_values_false() {
    let (_p, dogs) = dict("t043-076", 64, 32);
    assert_eq!(dogs.set("foo", false, NEVER).unwrap(), NOT_FORCIBLE);
    let (item, stale) = dogs.get_stale("foo").unwrap().unwrap();
    assert_eq!((item.value, stale), (Value::Bool(false), false));
}

#[test]
fn t043_077_set_and_get_stale_with_a_flag() {
    let (_p, dogs) = dict("t043-077", 64, 32);
    dogs.put(Put::Set, "foo", false, NEVER, 325).unwrap();
    let (item, stale) = dogs.get_stale("foo").unwrap().unwrap();
    assert_eq!(
        (item.value, item.flags, stale),
        (Value::Bool(false), 325, false)
    );
}

#[test]
fn t043_080_incr_empty_string_keys() {
    let (_p, dogs) = dict("t043-080", 64, 32);
    assert!(matches!(
        dogs.incr("", 32, None, NEVER),
        Err(Error::EmptyKey)
    ));
}

#[test]
fn t043_081_incr_too_long_key() {
    let (_p, dogs) = dict("t043-081", 64, 32);
    assert!(matches!(
        dogs.incr("a".repeat(65536), 32, None, NEVER),
        Err(Error::KeyTooLong { len: 65536, .. })
    ));
}

#[test]
fn t043_082_incr_number_key() {
    let (_p, dogs) = dict("t043-082", 64, 32);
    let key = 56.to_string();
    dogs.set(&key, 1i64, NEVER).unwrap();
    dogs.incr(&key, 32, None, NEVER).unwrap();
    let item = dogs.get(&key).unwrap().unwrap();
    assert_eq!((item.value, item.flags), (Value::Int(33), 0));
}

#[test]
fn t043_085_replace_key_with_exptime() {
    let (_p, dogs) = dict("t043-085", 64, 32);
    dogs.set("foo", 2i64, NEVER).unwrap();
    dogs.replace("foo", 32i64, SHORT).unwrap();
    assert_eq!(value(&dogs, "foo"), int(32));
    sleep(PAST_SHORT);
    assert!(matches!(
        dogs.replace("foo", 10502i64, NEVER),
        Err(Error::NotFound { .. })
    ));
    assert_eq!(value(&dogs, "foo"), None);
}

#[test]
fn t043_091_dogs_cat_mixing() {
    let (_p1, dogs) = dict("t043-091-dogs", 64, 32);
    let (_p2, cats) = dict("t043-091-cats", 64, 32);
    dogs.set("foo", 32i64, NEVER).unwrap();
    dogs.set("bah", 10502i64, NEVER).unwrap();
    assert_eq!(value(&dogs, "foo"), int(32));
    assert_eq!(value(&dogs, "bah"), int(10502));
    assert_eq!(value(&cats, "foo"), None);
    assert_eq!(value(&cats, "bah"), None);
}
