//! lua-nginx-module's `t/145-shdict-list.t` (ngx.shared.DICT's list operations `lpush`,
//! `rpush`, `lpop`, `rpop`, `llen`), ported to `SharedDict`: one test per upstream case
//! that has a meaning for our API, named `t145_NNN_...` after the upstream "=== TEST NNN".
//! Each asserts what upstream's `--- response_body` expects, translated: a Lua string
//! element is `Value::Bytes`, a Lua number pushed as `i` is an `i64` (`Value::Int`), ngx's
//! "value not a list" / "value is a list" / "not a number" / "exists" / "no memory" errors
//! are `Error::NotAList` / `IsAList` / `NotANumber` / `Exists` / `NoMemory` (whose messages
//! name the key before ngx's words), a `nil` pop is
//! `None`, and an exptime of 0.2 s is a short `Duration` with a sleep well past it.
//!
//! Translations of sizes: upstream fills a zone of so many KiB; a `SharedDict` counts its
//! room in entries, and bounds one list by its `max_value_len` (each element costs 9 bytes
//! besides its value).
//!
//! * 15, 16: a dict of at most 64 entries (every key's window is the whole table, so the
//!   dict is full exactly when all its entries are live). As ngx's, a push of a new key
//!   never evicts a live value: it fails with `NoMemory` when the dict is full, and
//!   expired lists make room again. Case 16's sets, made one after another, evict the least
//!   recently used (as in ngx's LRU).
//! * 19: a 30 KiB element needs a dict made with a `max_value_len` that holds it.
//! * 22: "lpush return nil" after 2920 pushes of "bar" into a 100 KiB zone is a list of
//!   `N` such elements that fills the dict's `max_value_len` exactly: the next push is
//!   `Error::NoMemory`.
//!
//! Stand-ins: a Lua number key is its decimal string (Lua converts it so: case 16); a
//! `string.format("%05d", i)` key is the same string.
//!
//! Upstream cases not ported: none (all 22 have a meaning here).

mod common;

use std::thread::sleep;
use std::time::Duration;

use common::dict::{b, dict, int, value, NEVER};
use shmlock::{Error, SharedDict};

/// Upstream's exptimes of 0.2 s.
const SHORT: Duration = Duration::from_millis(250);
/// A sleep clearly past SHORT (and the coarse clock's tick).
const PAST_SHORT: Duration = Duration::from_millis(400);

/// Upstream's `string.format("%05d", i)`.
fn key5(i: usize) -> String {
    format!("{i:05}")
}

#[test]
fn t145_001_lpush_and_lpop() {
    let (_p, dogs) = dict("t145-001", 64, 256);
    assert_eq!(dogs.lpush("foo", "bar").unwrap(), 1);
    assert_eq!(dogs.llen("foo").unwrap(), 1);
    assert_eq!(dogs.lpop("foo").unwrap(), b("bar"));
    assert_eq!(dogs.llen("foo").unwrap(), 0);
    assert_eq!(dogs.lpop("foo").unwrap(), None);
}

#[test]
fn t145_002_get_operation_on_list_type() {
    let (_p, dogs) = dict("t145-002", 64, 256);
    assert_eq!(dogs.lpush("foo", "bar").unwrap(), 1);
    assert!(matches!(dogs.get("foo"), Err(Error::IsAList { .. })));
    assert_eq!(
        dogs.get("foo").unwrap_err().to_string(),
        "key \"foo\": value is a list"
    );
}

#[test]
fn t145_003_set_operation_on_list_type() {
    let (_p, dogs) = dict("t145-003", 64, 256);
    assert_eq!(dogs.lpush("foo", "bar").unwrap(), 1);
    dogs.set("foo", "bar", NEVER).unwrap();
    assert_eq!(value(&dogs, "foo"), b("bar"));
}

#[test]
fn t145_004_replace_operation_on_list_type() {
    let (_p, dogs) = dict("t145-004", 64, 256);
    assert_eq!(dogs.lpush("foo", "bar").unwrap(), 1);
    dogs.replace("foo", "bar", NEVER).unwrap();
    assert_eq!(value(&dogs, "foo"), b("bar"));
}

#[test]
fn t145_005_add_operation_on_list_type() {
    let (_p, dogs) = dict("t145-005", 64, 256);
    assert_eq!(dogs.lpush("foo", "bar").unwrap(), 1);
    assert!(matches!(
        dogs.add("foo", "bar", NEVER),
        Err(Error::Exists { .. })
    ));
    assert!(matches!(dogs.get("foo"), Err(Error::IsAList { .. })));
}

#[test]
fn t145_006_delete_operation_on_list_type() {
    let (_p, dogs) = dict("t145-006", 64, 256);
    assert_eq!(dogs.lpush("foo", "bar").unwrap(), 1);
    assert!(dogs.delete("foo").unwrap());
    assert_eq!(value(&dogs, "foo"), None);
}

#[test]
fn t145_007_incr_operation_on_list_type() {
    let (_p, dogs) = dict("t145-007", 64, 256);
    assert_eq!(dogs.lpush("foo", "bar").unwrap(), 1);
    assert!(matches!(
        dogs.incr("foo", 1, None, NEVER),
        Err(Error::NotANumber { .. })
    ));
    assert!(matches!(dogs.get("foo"), Err(Error::IsAList { .. })));
}

#[test]
fn t145_008_get_keys_operation_on_list_type() {
    let (_p, dogs) = dict("t145-008", 64, 256);
    assert_eq!(dogs.lpush("foo", "bar").unwrap(), 1);
    assert_eq!(dogs.keys(0).unwrap(), vec![b"foo".to_vec()]);
}

#[test]
fn t145_009_push_operation_on_key_value_type() {
    let (_p, dogs) = dict("t145-009", 64, 256);
    dogs.set("foo", "bar", NEVER).unwrap();
    assert!(matches!(
        dogs.lpush("foo", "bar"),
        Err(Error::NotAList { .. })
    ));
    assert_eq!(
        dogs.lpush("foo", "bar").unwrap_err().to_string(),
        "key \"foo\": value not a list"
    );
    assert_eq!(value(&dogs, "foo"), b("bar"));
}

#[test]
fn t145_010_pop_operation_on_key_value_type() {
    let (_p, dogs) = dict("t145-010", 64, 256);
    dogs.set("foo", "bar", NEVER).unwrap();
    assert!(matches!(dogs.lpop("foo"), Err(Error::NotAList { .. })));
    assert_eq!(value(&dogs, "foo"), b("bar"));
}

#[test]
fn t145_011_llen_operation_on_key_value_type() {
    let (_p, dogs) = dict("t145-011", 64, 256);
    dogs.set("foo", "bar", NEVER).unwrap();
    assert!(matches!(dogs.llen("foo"), Err(Error::NotAList { .. })));
    assert_eq!(value(&dogs, "foo"), b("bar"));
}

#[test]
fn t145_012_lpush_and_lpop() {
    let (_p, dogs) = dict("t145-012", 64, 256);
    for i in 1..=3 {
        assert_eq!(dogs.lpush("foo", i as i64).unwrap(), i);
    }
    let popped: Vec<_> = (0..3).map(|_| dogs.lpop("foo").unwrap()).collect();
    assert_eq!(popped, vec![int(3), int(2), int(1)]);
}

#[test]
fn t145_013_lpush_and_rpop() {
    let (_p, dogs) = dict("t145-013", 64, 256);
    for i in 1..=3 {
        assert_eq!(dogs.lpush("foo", i as i64).unwrap(), i);
    }
    let popped: Vec<_> = (0..3).map(|_| dogs.rpop("foo").unwrap()).collect();
    assert_eq!(popped, vec![int(1), int(2), int(3)]);
}

#[test]
fn t145_014_rpush_and_lpop() {
    let (_p, dogs) = dict("t145-014", 64, 256);
    for i in 1..=3 {
        assert_eq!(dogs.rpush("foo", i as i64).unwrap(), i);
    }
    let popped: Vec<_> = (0..3).map(|_| dogs.lpop("foo").unwrap()).collect();
    assert_eq!(popped, vec![int(1), int(2), int(3)]);
}

/// Pushes `i` onto the list `key5(i)` for each `i` of `order` until a push fails (no
/// room: a push never evicts a live value); returns the `i` of that push.
fn push_until_full(dogs: &SharedDict, order: impl Iterator<Item = usize>) -> usize {
    for i in order {
        match dogs.lpush(key5(i), i as i64) {
            Ok(len) => assert_eq!(len, 1),
            Err(Error::NoMemory { .. }) => return i,
            Err(e) => panic!("{e}"),
        }
    }
    panic!("no push failed");
}

#[test]
fn t145_015_list_removed_expired() {
    const N: usize = 100_000;
    let (_p, dogs) = dict("t145-015", 64, 64);

    let max = push_until_full(&dogs, 1..=N);
    assert_eq!(max, dogs.capacity() + 1); // the dict was full
    let keys = dogs.keys(0).unwrap();
    // max - 1 matched keys length: true
    assert_eq!(max - 1, keys.len());

    dogs.flush_all().unwrap();
    // keys all expired, left number: 0
    assert_eq!(dogs.keys(0).unwrap().len(), 0);

    // the expired lists make room again: the same number of pushes fit
    let i = push_until_full(&dogs, (1..=N).rev());
    assert_eq!(N + 1 - i, max);

    dogs.flush_all().unwrap();
    dogs.flush_expired(0).unwrap();

    let i = push_until_full(&dogs, 1..=N);
    assert_eq!(i, max);
}

#[test]
fn t145_016_list_removed_forcibly() {
    const N: usize = 200_000;
    let (_p, dogs) = dict("t145-016", 8, 64);

    let mut max = 0;
    for i in 1..=N {
        let stored = dogs.set(i.to_string(), i as i64, NEVER).unwrap();
        if stored.forcible {
            max = i;
            break;
        }
    }
    assert_eq!(max, dogs.capacity() + 1); // the dict was full
                                          // two == number 2: true
    assert_eq!(value(&dogs, "2"), int(2));

    dogs.flush_all().unwrap();
    dogs.flush_expired(0).unwrap();
    // no one left: 0
    assert_eq!(dogs.keys(0).unwrap().len(), 0);

    // the dict full of lists
    push_until_full(&dogs, 1..=N);

    for i in 1..=max {
        dogs.set(i.to_string(), i as i64, NEVER)
            .unwrap_or_else(|e| panic!("set err: {e}"));
    }
    // two == number 2: true
    assert_eq!(value(&dogs, "2"), int(2));
}

#[test]
fn t145_017_expire_on_all_types() {
    let (_p, dogs) = dict("t145-017", 64, 256);
    assert_eq!(dogs.lpush("list", "foo").unwrap(), 1);
    dogs.set("key", "bar", NEVER).unwrap();
    assert_eq!(dogs.keys(0).unwrap().len(), 2);
    dogs.flush_all().unwrap();
    assert_eq!(dogs.keys(0).unwrap().len(), 0);
}

#[test]
fn t145_018_long_list_node() {
    let (_p, dogs) = dict("t145-018", 64, 256);
    let long_str = "foo".repeat(10);
    for i in 1..=3 {
        assert_eq!(dogs.lpush("list", &long_str).unwrap(), i);
    }
    for _ in 0..3 {
        assert_eq!(dogs.lpop("list").unwrap(), b(&long_str));
    }
}

#[test]
fn t145_019_incr_on_expired_list() {
    let (_p, dogs) = dict("t145-019", 16, 32 * 1024);
    let long_str = "foo".repeat(10 * 1024); // 30k
    for _ in 0..100 {
        for j in 1..=10 {
            let key = format!("list{j}");
            dogs.lpush(&key, &long_str)
                .unwrap_or_else(|e| panic!("push err: {e}"));
        }

        dogs.flush_all().unwrap();

        for j in (1..=10).rev() {
            let key = format!("list{j}");
            let newval = dogs
                .incr(&key, 1, Some(0), NEVER)
                .unwrap_or_else(|e| panic!("incr err: {e}"));
            assert_eq!(newval, 1);
        }

        dogs.flush_all().unwrap();
    }
    // done
}

#[test]
fn t145_020_push_to_an_expired_list() {
    let (_p, dogs) = dict("t145-020", 64, 256);
    assert_eq!(dogs.lpush("cc", "1").unwrap(), 1);
    assert_eq!(dogs.lpush("aa", "1").unwrap(), 1);
    dogs.expire("aa", SHORT).unwrap();
    sleep(PAST_SHORT); // list aa expired
                       // pushing to an expired list starts a new list
    assert_eq!(dogs.lpush("aa", "2").unwrap(), 1);
    // aa:len :1
    assert_eq!(dogs.llen("aa").unwrap(), 1);
}

#[test]
fn t145_021_push_to_an_expired_list_then_pop_more_than_its_len() {
    let (_p, dogs) = dict("t145-021", 64, 256);
    assert_eq!(dogs.lpush("cc", "1").unwrap(), 1);
    assert_eq!(dogs.lpush("aa", "1").unwrap(), 1);
    dogs.expire("aa", SHORT).unwrap();
    sleep(PAST_SHORT); // list aa expired
    assert_eq!(dogs.lpush("aa", "2").unwrap(), 1);
    assert_eq!(dogs.lpop("aa").unwrap(), b("2"));
    // aa list value: nil
    assert_eq!(dogs.lpop("aa").unwrap(), None);
}

#[test]
fn t145_022_lpush_return_nil() {
    /// Elements of "bar" that fill the list: 9 bytes each besides the value's 3.
    const N: usize = 100;
    let (_p, dogs) = dict("t145-022", 64, N * (9 + 3));
    for i in 1..=N {
        assert_eq!(dogs.lpush("foo", "bar").unwrap(), i);
    }
    // nil: the list no longer fits
    let full = dogs.lpush("foo", "bar").unwrap_err();
    assert!(
        matches!(&full, Error::NoMemory { why, .. } if why.contains("max_value_len")),
        "{full}"
    );
    assert_eq!(dogs.llen("foo").unwrap(), N);
}
