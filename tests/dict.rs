//! SharedDict in one process: ngx.shared.DICT's documented behaviour of each operation,
//! the layout limits, eviction, and the file checks. Behaviour across processes is in
//! tests/procs.rs.

mod common;

use std::thread::sleep;
use std::time::Duration;

use common::dict::{dict, keys_of, lru_rounds, NEVER, TICK};
use common::TempPath;
use shmlock::{
    Error, FormatError, ItemRef, LockTable, Put, SharedDict, Source, Value, ValueKind, ValueRef,
};

/// Short, but long enough that a value read back at once is still there on a busy machine.
const SHORT: Duration = Duration::from_millis(250);
/// Longer than SHORT plus the coarse clock's tick, with room to spare.
const PAST_SHORT: Duration = Duration::from_millis(400);

fn bytes(dict: &SharedDict, key: &str) -> Option<Vec<u8>> {
    dict.get(key)
        .unwrap()
        .map(|i| i.value.as_bytes().unwrap().to_vec())
}

#[test]
fn get_set_and_flags() {
    let (_p, d) = dict("get-set", 64, 32);
    assert_eq!(d.get("dog").unwrap(), None);
    assert!(!d.set("dog", "bark", NEVER).unwrap().forcible);
    assert_eq!(bytes(&d, "dog").unwrap(), b"bark");
    // overwrite with a shorter value: no leftovers of the longer one
    d.set("dog", "wo", NEVER).unwrap();
    assert_eq!(bytes(&d, "dog").unwrap(), b"wo");
    d.set("empty", "", NEVER).unwrap();
    assert_eq!(bytes(&d, "empty").unwrap(), b"");
    d.put(Put::Set, "f", "v", NEVER, 7).unwrap();
    assert_eq!(d.get("f").unwrap().unwrap().flags, 7);
    d.set("f", "v", NEVER).unwrap();
    assert_eq!(
        d.get("f").unwrap().unwrap().flags,
        0,
        "set without flags clears them"
    );
    d.set("n", 42i64, NEVER).unwrap();
    assert_eq!(d.get("n").unwrap().unwrap().value, Value::Int(42));
    // keys are bytes: a binary key and its near neighbours are distinct
    d.set(b"\x00\xffk".as_slice(), "bin", NEVER).unwrap();
    assert_eq!(
        d.get(b"\x00\xffk").unwrap().unwrap().value,
        Value::Bytes(b"bin".to_vec())
    );
    assert_eq!(d.get(b"\x00\xff").unwrap(), None);
    assert_eq!(d.len(), 5);
}

/// `get_with`'s view of an item, owned, to compare with `get`'s.
fn owned(item: ItemRef<'_>) -> (Value, u32) {
    let value = match item.value {
        ValueRef::Bytes(b) => Value::Bytes(b.to_vec()),
        ValueRef::Int(n) => Value::Int(n),
        ValueRef::Float(x) => Value::Float(x),
        ValueRef::Bool(b) => Value::Bool(b),
        other => panic!("a value kind this test does not know: {other:?}"),
    };
    (value, item.flags)
}

#[test]
fn get_with_hands_over_what_get_returns_without_an_owned_copy() {
    let (_p, d) = dict("get-with", 64, 100_000);
    let mut stored: Vec<(String, Value, u32)> = Vec::new();
    // every length around the word boundaries, and one past the kept buffer's size, then
    // shorter ones again: a reused buffer must leave no bytes of a longer value behind
    for (n, len) in [0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 99_999, 3, 70_000, 5]
        .into_iter()
        .enumerate()
    {
        let key = format!("b{n}");
        let bytes: Vec<u8> = (0..len).map(|i| (i * 7 + n) as u8).collect();
        d.put(Put::Set, &key, &bytes, NEVER, n as u32).unwrap();
        stored.push((key, Value::Bytes(bytes), n as u32));
    }
    d.set("int", -42i64, NEVER).unwrap();
    d.set("float", 2.5f64, NEVER).unwrap();
    d.put(Put::Set, "bool", true, NEVER, 9).unwrap();
    stored.push(("int".into(), Value::Int(-42), 0));
    stored.push(("float".into(), Value::Float(2.5), 0));
    stored.push(("bool".into(), Value::Bool(true), 9));
    for _ in 0..2 {
        for (key, value, flags) in &stored {
            let item = d.get(key).unwrap().unwrap();
            assert_eq!((&item.value, item.flags), (value, *flags), "get {key}");
            assert_eq!(
                d.get_with(key, owned).unwrap(),
                Some((value.clone(), *flags)),
                "get_with {key}"
            );
        }
    }
    // absent and expired: None, and `f` is not called
    assert_eq!(d.get_with("absent", |_| panic!("called")).unwrap(), None);
    d.set("short", "v", SHORT).unwrap();
    sleep(PAST_SHORT);
    assert_eq!(d.get_with("short", |_| panic!("called")).unwrap(), None);
    // a list is read through the list operations, as with get
    d.rpush("list", "x").unwrap();
    assert!(matches!(
        d.get_with("list", owned),
        Err(Error::IsAList { .. })
    ));
    // bad keys are the errors get gives
    assert!(matches!(d.get_with("", owned), Err(Error::EmptyKey)));
    // a read inside `f` gets a buffer of its own: the outer bytes stay as they were
    let (outer, inner) = d
        .get_with("b9", |a| {
            let inner = d.get_with("b1", owned).unwrap().unwrap().0;
            (owned(a).0, inner)
        })
        .unwrap()
        .unwrap();
    assert_eq!(
        Some(outer),
        stored.iter().find(|s| s.0 == "b9").map(|s| s.1.clone())
    );
    assert_eq!(
        Some(inner),
        stored.iter().find(|s| s.0 == "b1").map(|s| s.1.clone())
    );
}

#[test]
fn describe_tells_kind_length_flags_and_ttl_of_live_values_only() {
    let (_p, d) = dict("describe", 64, 64);
    d.put(Put::Set, "b", "seven b", Duration::from_secs(60), 3)
        .unwrap();
    d.set("n", 1i64, NEVER).unwrap();
    d.set("x", 1.5f64, NEVER).unwrap();
    d.set("t", false, NEVER).unwrap();
    d.lpush("l", "a").unwrap();
    d.lpush("l", 2i64).unwrap();
    let b = d.describe("b").unwrap().unwrap();
    assert_eq!((b.kind, b.len, b.flags), (ValueKind::Bytes, 7, 3));
    assert!(b.ttl.unwrap() > Duration::from_secs(50) && b.ttl.unwrap() <= Duration::from_secs(60));
    let kinds: Vec<_> = ["n", "x", "t", "l"]
        .iter()
        .map(|k| {
            let i = d.describe(k).unwrap().unwrap();
            (i.kind, i.len, i.ttl)
        })
        .collect();
    assert_eq!(
        kinds,
        [
            (ValueKind::Int, 8, None),
            (ValueKind::Float, 8, None),
            (ValueKind::Bool, 1, None),
            (ValueKind::List, 2, None),
        ]
    );
    assert_eq!(d.describe("absent").unwrap(), None);
    d.set("short", "v", SHORT).unwrap();
    sleep(PAST_SHORT);
    assert_eq!(d.describe("short").unwrap(), None, "expired");
    assert!(matches!(d.describe(""), Err(Error::EmptyKey)));
}

#[test]
fn expired_values_are_absent_on_every_read_but_stale_reads_see_them() {
    let (_p, d) = dict("expiry", 64, 32);
    d.set("short", "v", SHORT).unwrap();
    d.set("long", "v", Duration::from_secs(3600)).unwrap();
    assert!(d.get("short").unwrap().is_some());
    sleep(PAST_SHORT);
    assert_eq!(d.get("short").unwrap(), None);
    assert!(matches!(d.ttl("short"), Err(Error::NotFound { .. })));
    assert!(matches!(
        d.replace("short", "x", NEVER),
        Err(Error::NotFound { .. })
    ));
    assert!(matches!(
        d.incr("short", 1, None, NEVER),
        Err(Error::NotFound { .. })
    ));
    assert!(matches!(
        d.expire("short", NEVER),
        Err(Error::NotFound { .. })
    ));
    assert_eq!(d.keys(0).unwrap(), vec![b"long".to_vec()]);
    let (item, stale) = d.get_stale("short").unwrap().unwrap();
    assert_eq!((item.value, stale), (Value::Bytes(b"v".to_vec()), true));
    assert!(!d.get_stale("long").unwrap().unwrap().1);
    // add over an expired value succeeds, and is not forcible
    assert!(!d.add("short", "new", NEVER).unwrap().forcible);
    assert_eq!(bytes(&d, "short").unwrap(), b"new");
    // delete reports whether a live value went
    d.set("gone", "v", SHORT).unwrap();
    sleep(PAST_SHORT);
    assert!(!d.delete("gone").unwrap());
    assert!(d.delete("long").unwrap());
    assert!(!d.delete("long").unwrap());
    assert_eq!(d.get_stale("long").unwrap(), None);
}

#[test]
fn ttl_and_expire() {
    let (_p, d) = dict("ttl", 64, 32);
    d.set("forever", "v", NEVER).unwrap();
    assert_eq!(d.ttl("forever").unwrap(), None);
    d.set("hour", "v", Duration::from_secs(3600)).unwrap();
    let left = d.ttl("hour").unwrap().unwrap();
    assert!(left <= Duration::from_secs(3600) && left > Duration::from_secs(3500));
    assert!(matches!(d.ttl("absent"), Err(Error::NotFound { .. })));
    // expire: a new ttl, zero meaning never
    d.expire("hour", NEVER).unwrap();
    assert_eq!(d.ttl("hour").unwrap(), None);
    d.expire("forever", SHORT).unwrap();
    assert!(d.ttl("forever").unwrap().unwrap() <= SHORT);
    sleep(PAST_SHORT);
    assert_eq!(d.get("forever").unwrap(), None);
    // expire keeps value and flags
    d.put(Put::Set, "kept", "v", NEVER, 3).unwrap();
    d.expire("kept", Duration::from_secs(60)).unwrap();
    let item = d.get("kept").unwrap().unwrap();
    assert_eq!((item.value, item.flags), (Value::Bytes(b"v".to_vec()), 3));
}

#[test]
fn add_replace_and_their_errors() {
    let (_p, d) = dict("add-replace", 64, 32);
    assert!(matches!(
        d.replace("k", "v", NEVER),
        Err(Error::NotFound { .. })
    ));
    d.add("k", "one", NEVER).unwrap();
    assert!(matches!(
        d.add("k", "two", NEVER),
        Err(Error::Exists { .. })
    ));
    assert!(matches!(
        d.safe_add("k", "two", NEVER),
        Err(Error::Exists { .. })
    ));
    assert_eq!(bytes(&d, "k").unwrap(), b"one");
    d.replace("k", "three", SHORT).unwrap();
    assert_eq!(bytes(&d, "k").unwrap(), b"three");
    assert!(d.ttl("k").unwrap().is_some(), "replace sets the new ttl");
}

#[test]
fn incr_with_and_without_init_keeps_the_ttl() {
    let (_p, d) = dict("incr", 64, 32);
    assert!(matches!(
        d.incr("n", 1, None, NEVER),
        Err(Error::NotFound { .. })
    ));
    assert_eq!(
        d.incr("n", 5, Some(10), Duration::from_secs(3600)).unwrap(),
        15
    );
    let ttl = d.ttl("n").unwrap().unwrap();
    assert_eq!(
        d.incr("n", -20, Some(1000), NEVER).unwrap(),
        -5,
        "init only when absent"
    );
    let after = d.ttl("n").unwrap().unwrap();
    assert!(after <= ttl, "incr keeps the existing ttl");
    assert_eq!(d.get("n").unwrap().unwrap().value, Value::Int(-5));
    d.set("s", "12", NEVER).unwrap();
    assert!(matches!(
        d.incr("s", 1, Some(0), NEVER),
        Err(Error::NotANumber { .. })
    ));
    assert_eq!(
        d.incr("max", 1, Some(i64::MAX), NEVER).unwrap(),
        i64::MIN,
        "wraps"
    );
    // an init_ttl without an init is refused, as ngx does (even on a live number), and
    // changes nothing
    for key in ["n", "absent"] {
        assert!(matches!(
            d.incr(key, 1, None, Duration::from_secs(5)),
            Err(Error::InvalidOptions(_))
        ));
    }
    assert_eq!(d.get("n").unwrap().unwrap().value, Value::Int(-5));
    assert!(d.get("absent").unwrap().is_none());
    // a number set directly is a number to incr
    d.set("direct", 7i64, NEVER).unwrap();
    assert_eq!(d.incr("direct", 1, None, NEVER).unwrap(), 8);
    // a dict whose values cannot hold a number says so
    let (_p2, tiny) = dict("incr-tiny", 8, 4);
    assert!(matches!(
        tiny.incr("n", 1, Some(0), NEVER),
        Err(Error::ValueTooLong { len: 8, max: 4, .. })
    ));
}

#[test]
fn flush_all_then_flush_expired_counts() {
    let (_p, d) = dict("flush", 64, 32);
    for k in ["a", "b", "c", "d"] {
        d.set(k, "v", NEVER).unwrap();
    }
    d.flush_all().unwrap();
    for k in ["a", "b", "c", "d"] {
        assert_eq!(d.get(k).unwrap(), None);
    }
    assert!(d.keys(0).unwrap().is_empty());
    assert_eq!(d.len(), 4, "flush_all frees nothing");
    assert_eq!(d.flush_expired(3).unwrap(), 3);
    assert_eq!(d.flush_expired(0).unwrap(), 1);
    assert_eq!(d.flush_expired(0).unwrap(), 0);
    assert_eq!(d.len(), 0);
    assert_eq!(d.free_slots(), 64);
}

#[test]
fn a_full_dict_after_flush_all_takes_as_many_new_keys_as_it_flushed_before_evicting() {
    // 64 slots: every key's window is the whole table, its LRU sample 8 of them. ngx's
    // sets reclaim flushed items (its LRU tail) before they evict a live one: so here,
    // wherever the flushed entries lie.
    let (_p, d) = dict("flush-refill", 64, 8);
    for i in 0..64 {
        d.set(format!("old{i}"), "v", NEVER).unwrap();
    }
    assert_eq!(d.free_slots(), 0);
    d.flush_all().unwrap();
    for i in 0..64 {
        let stored = d.set(format!("new{i}"), "v", NEVER).unwrap();
        assert!(
            !stored.forcible,
            "new{i} evicted a live key with flushed ones left"
        );
    }
    assert_eq!(d.evictions(), 0);
    assert_eq!(d.keys(0).unwrap().len(), 64);
    assert!(d.set("one more", "v", NEVER).unwrap().forcible);
    assert_eq!(d.evictions(), 1);
}

#[test]
fn keys_lists_live_keys_up_to_max() {
    let (_p, d) = dict("keys", 64, 8);
    for i in 0..10 {
        d.set(format!("k{i}"), "v", NEVER).unwrap();
    }
    let mut all = d.keys(0).unwrap();
    all.sort();
    let mut want: Vec<Vec<u8>> = (0..10).map(|i| format!("k{i}").into_bytes()).collect();
    want.sort();
    assert_eq!(all, want);
    assert_eq!(d.keys(3).unwrap().len(), 3);
}

#[test]
fn a_full_dict_evicts_the_least_recently_used_and_safe_variants_refuse() {
    // 8 slots: every key's window is the whole table and the LRU sample is all of it.
    let (_p, d) = dict("evict", 8, 8);
    for i in 0..8 {
        assert!(!d.set(format!("k{i}"), "v", NEVER).unwrap().forcible);
    }
    assert_eq!(d.free_slots(), 0);
    // k0 is the oldest: reading it makes k1 the least recently used
    assert!(d.get("k0").unwrap().is_some());
    assert!(matches!(
        d.safe_set("new", "v", NEVER),
        Err(Error::NoMemory { .. })
    ));
    assert!(matches!(
        d.safe_add("new", "v", NEVER),
        Err(Error::NoMemory { .. })
    ));
    assert_eq!(d.evictions(), 0);
    let stored = d.set("new", "v", NEVER).unwrap();
    assert!(stored.forcible);
    assert_eq!(d.evictions(), 1);
    assert_eq!(d.get("k1").unwrap(), None, "the least recently used went");
    assert!(d.get("k0").unwrap().is_some());
    assert!(d.get("new").unwrap().is_some());
    // updating an existing key on a full dict never evicts
    assert!(!d.safe_set("k2", "w", NEVER).unwrap().forcible);
    // an expired entry is reused before any live one is evicted
    d.expire("k3", Duration::from_millis(1)).unwrap();
    sleep(PAST_SHORT);
    assert!(!d.safe_set("newer", "v", NEVER).unwrap().forcible);
    assert_eq!(d.evictions(), 1);
    assert_eq!(d.len(), 8);
    // full again: an evicting set reuses an expired entry of the sample, too
    d.expire("k4", Duration::from_millis(1)).unwrap();
    sleep(PAST_SHORT);
    assert!(!d.set("newest", "v", NEVER).unwrap().forcible);
    assert_eq!(d.evictions(), 1);
    assert_eq!(d.get("k4").unwrap(), None);
    assert_eq!(d.len(), 8);
}

#[test]
fn evictions_follow_stores_and_reads_in_the_order_they_were_made() {
    // No sleeps: uses within one tick of the coarse clock rank by the writer lock's epoch.
    let (_p, d) = dict("lru-order", 8, 8);
    lru_rounds(&d, 3000, 0x9E37_79B9_7F4A_7C15, &mut |key| {
        assert!(d.get(key).unwrap().is_some(), "{key} read");
    });
    // The other reads rank the key too: get_with and get_stale.
    let (_p, d) = dict("lru-reads", 8, 8);
    let mut n = 0;
    lru_rounds(&d, 1000, 0xD1B5_4A32_D192_ED03, &mut |key| {
        n += 1;
        let seen = match n % 2 {
            0 => d.get_with(key, |_| ()).unwrap().is_some(),
            _ => d.get_stale(key).unwrap().is_some(),
        };
        assert!(seen, "{key} read");
    });
}

#[test]
fn operations_that_find_a_key_but_store_nothing_rank_it_as_ngx_does() {
    // ngx's look-up makes every key it finds the most recently used: an `add` refused, an
    // `expire`, a `ttl`, an `incr` of a value that is not a number, an `llen` or a push
    // of a value that is not a list.
    let (_p, d) = dict("lru-lookups", 8, 8);
    for i in 0..8 {
        d.set(format!("k{i}"), "v", NEVER).unwrap();
    }
    assert!(matches!(d.add("k0", "w", NEVER), Err(Error::Exists { .. })));
    d.expire("k1", Duration::from_secs(100)).unwrap();
    assert_eq!(d.ttl("k2").unwrap(), None); // (never expires)
    let refused = d.incr("k3", 1i64, None, NEVER);
    assert!(
        matches!(refused, Err(Error::NotANumber { .. })),
        "{refused:?}"
    );
    assert!(matches!(d.llen("k4"), Err(Error::NotAList { .. })));
    assert!(matches!(d.lpush("k5", "x"), Err(Error::NotAList { .. })));
    // k6 and k7 were used last at the fill: they go first, then the others in turn
    for (n, gone) in ["k6", "k7", "k0", "k1", "k2", "k3", "k4", "k5"]
        .iter()
        .enumerate()
    {
        assert!(d.set(format!("new{n}"), "v", NEVER).unwrap().forcible);
        assert!(!keys_of(&d).contains(&gone.to_string()), "{gone} was kept");
    }
}

#[test]
fn a_key_read_again_after_a_step_of_stores_ranks_anew_within_a_tick() {
    // A second read of a key in the tick of its first ranks it anew once a step of stores
    // (in a dict of 8 entries, one store) was made since: here, with no pause, it is the
    // most recently used again. (Before, it kept its first read's rank for the tick, and
    // a hot key read over and over lost to keys stored once, later in the tick.)
    let (_p, d) = dict("lru-reread", 8, 8);
    for i in 0..8 {
        d.set(format!("k{i}"), "v", NEVER).unwrap();
    }
    assert!(d.get("k0").unwrap().is_some()); // k1 .. k7, k0
    for i in 1..8 {
        d.set(format!("k{i}"), "w", NEVER).unwrap(); // k0, k1 .. k7
    }
    assert!(d.get("k0").unwrap().is_some()); // k1 .. k7, k0
    for (n, gone) in ["k1", "k2", "k3", "k4", "k5", "k6", "k7", "k0"]
        .iter()
        .enumerate()
    {
        assert!(d.set(format!("new{n}"), "v", NEVER).unwrap().forcible);
        assert!(!keys_of(&d).contains(&gone.to_string()), "{gone} was kept");
        assert_eq!(keys_of(&d).len(), 8);
    }
}

#[test]
fn a_key_read_again_a_tick_later_ranks_anew() {
    // Within one tick, a second read of a key may keep its first read's rank (the stamp is
    // written once a tick); a tick later, it ranks the key anew.
    let (_p, d) = dict("lru-tick", 8, 8);
    for i in 0..8 {
        d.set(format!("k{i}"), "v", NEVER).unwrap();
    }
    assert!(d.get("k0").unwrap().is_some()); // k1 .. k7, k0
    d.set("k1", "w", NEVER).unwrap(); // k2 .. k7, k0, k1
    sleep(TICK);
    assert!(d.get("k0").unwrap().is_some()); // k2 .. k7, k1, k0
    for (n, gone) in ["k2", "k3", "k4", "k5", "k6", "k7", "k1", "k0"]
        .iter()
        .enumerate()
    {
        assert!(d.set(format!("new{n}"), "v", NEVER).unwrap().forcible);
        assert!(!keys_of(&d).contains(&gone.to_string()), "{gone} was kept");
        assert_eq!(keys_of(&d).len(), 8);
    }
}

#[test]
fn a_full_big_dict_evicts_from_the_sample_and_safe_sets_find_expired_entries_anywhere() {
    // 256 slots, windows of 64, samples of 8: an evicting set on a full dict looks only at
    // its sample; a safe set (which must not evict) at the whole window.
    let (_p, d) = dict("evict-big", 256, 8);
    let fill = |prefix: &str| {
        for n in 0..100_000 {
            if d.len() == d.capacity() {
                return;
            }
            d.set(format!("{prefix}{n}"), "v", NEVER).unwrap();
        }
        panic!("the dict did not fill: {} of {}", d.len(), d.capacity());
    };
    fill("k");
    // every entry expires: each set finds an expired entry in its sample, evicting none
    // (7 sets: a sample of 8 then always has an expired entry, wherever they land)
    for key in d.keys(0).unwrap() {
        d.expire(&key, Duration::from_millis(1)).unwrap();
    }
    sleep(PAST_SHORT);
    let evicted = d.evictions();
    for i in 0..7 {
        assert!(!d.set(format!("a{i}"), "v", NEVER).unwrap().forcible);
    }
    assert_eq!(d.evictions(), evicted);
    // full again, then one expired entry somewhere: safe sets find it, whatever their home
    // is in its window
    d.flush_expired(0).unwrap();
    fill("b");
    let last = d.keys(1).unwrap().pop().unwrap();
    d.expire(&last, Duration::from_millis(1)).unwrap();
    sleep(PAST_SHORT);
    let evicted = d.evictions();
    let mut placed = 0;
    for i in 0..256 {
        match d.safe_set(format!("c{i}"), "v", NEVER) {
            Ok(stored) => {
                assert!(!stored.forcible);
                placed += 1;
            }
            Err(Error::NoMemory { .. }) => {}
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(placed, 1, "the one expired entry was reused once");
    assert_eq!(d.evictions(), evicted);
    assert_eq!(d.get(&last).unwrap(), None);
}

#[test]
fn deletes_and_stores_never_hide_a_stored_key_nor_show_a_deleted_one() {
    // A small dict and more keys than it holds: homes share entries, filters fill up and
    // are rebuilt after deletes. Every read agrees with a model of what was stored.
    let (_p, d) = dict("churn", 256, 8);
    let mut model = std::collections::HashMap::new();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for step in 0..40_000u64 {
        let r = next();
        let key = format!("key:{}", r % 400);
        match (r >> 32) % 4 {
            0 => {
                let deleted = d.delete(&key).unwrap();
                assert_eq!(
                    deleted,
                    model.remove(&key).is_some(),
                    "step {step}: delete {key}"
                );
            }
            1 | 2 => match d.safe_set(&key, step as i64, NEVER) {
                Ok(_) => {
                    model.insert(key.clone(), step as i64);
                }
                Err(Error::NoMemory { .. }) => assert!(!model.contains_key(&key)),
                Err(e) => panic!("step {step}: {e}"),
            },
            _ => {}
        }
        let probe = format!("key:{}", next() % 400);
        assert_eq!(
            d.get(&probe).unwrap().map(|i| i.value),
            model.get(&probe).map(|&n| Value::Int(n)),
            "step {step}: get {probe}"
        );
    }
    for n in 0..400 {
        let key = format!("key:{n}");
        assert_eq!(
            d.get(&key).unwrap().map(|i| i.value),
            model.get(&key).map(|&n| Value::Int(n)),
            "at the end: {key}"
        );
    }
    assert_eq!(d.len(), model.len());
}

#[test]
fn every_error_about_a_key_names_it() {
    let (_p, d) = dict("named-errors", 8, 16);
    d.set("text", "abc", NEVER).unwrap();
    d.incr("float", 0.5, Some(0.0), Duration::ZERO).unwrap();
    d.lpush("list", "x").unwrap();
    let long = format!("{}-end", "k".repeat(80)); // past what a preview keeps
    let errors = [
        ("text", d.incr("text", 1, None, Duration::ZERO).map(drop)),
        ("float", d.incr("float", 1, None, Duration::ZERO).map(drop)),
        ("text", d.lpush("text", "x").map(drop)),
        ("text", d.rpop("text").map(drop)),
        ("text", d.llen("text").map(drop)),
        ("list", d.get("list").map(drop)),
        ("list", d.get_stale("list").map(drop)),
        ("list", d.rpush("list", [0u8; 16].as_slice()).map(drop)),
        ("big", d.set("big", [0u8; 17].as_slice(), NEVER).map(drop)),
        (
            &long[..],
            d.set(&long, [0u8; 17].as_slice(), NEVER).map(drop),
        ),
    ];
    for (key, r) in errors {
        let e = r.unwrap_err();
        let named = match &e {
            Error::NotANumber { key, .. }
            | Error::NotAnInteger { key, .. }
            | Error::NotAList { key, .. }
            | Error::IsAList { key, .. }
            | Error::NoMemory { key, .. }
            | Error::ValueTooLong { key, .. } => key,
            other => panic!("{key}: unexpected error {other}"),
        };
        let shown = &key.as_bytes()[..key.len().min(shmlock::KeyPreview::MAX)];
        assert_eq!(named.as_bytes(), shown, "{e}");
        assert_eq!(named.len(), key.len(), "{e}");
        assert!(
            e.to_string()
                .contains(&format!("\"{}\"", String::from_utf8_lossy(shown))),
            "{e}"
        );
    }
    // a full dict: a safe store names the key it found no room for
    for i in 0..64 {
        if d.safe_set(format!("fill-{i}"), "v", NEVER).is_err() {
            break;
        }
    }
    let e = d.safe_set("one-more", "v", NEVER).unwrap_err();
    assert!(
        matches!(&e, Error::NoMemory { key, .. } if key.as_bytes() == b"one-more"),
        "{e}"
    );
    // and says why
    assert_eq!(
        e.to_string(),
        "key \"one-more\": no memory: no free or expired entry near its home (a safe_ \
         store, and a new list, evict no live key)"
    );
}

#[test]
fn limits_are_typed_errors() {
    let (_p, d) = dict("limits", 8, 16);
    assert!(matches!(d.get(""), Err(Error::EmptyKey)));
    assert!(matches!(d.set("", "v", NEVER), Err(Error::EmptyKey)));
    let long = "k".repeat(251);
    assert!(matches!(
        d.set(&long, "v", NEVER),
        Err(Error::KeyTooLong { len: 251, .. })
    ));
    let err = d.get(&long).unwrap_err();
    assert!(matches!(
        err,
        Error::KeyTooLong {
            len: 251,
            max: 250,
            ..
        }
    ));
    assert_eq!(
        err.to_string(),
        format!(
            "key \"{}\"... (251 bytes) is too long (at most 250 bytes here)",
            "k".repeat(64)
        )
    );
    // a key short enough to be shown whole is named, with its length
    let p16 = TempPath::new("limits-key16");
    let d16 = SharedDict::options()
        .capacity(8)
        .max_value_len(16)
        .max_key_len(16)
        .open(&p16)
        .unwrap();
    assert_eq!(
        d16.set("0123456789abcdefg", "v", NEVER)
            .unwrap_err()
            .to_string(),
        "key \"0123456789abcdefg\" of 17 bytes is too long (at most 16 bytes here)"
    );
    d.set("k".repeat(250), "v", NEVER).unwrap();
    assert!(matches!(
        d.set("k", &[0u8; 17], NEVER),
        Err(Error::ValueTooLong {
            len: 17,
            max: 16,
            ..
        })
    ));
    let _ = d.set("k", &[1u8; 16], NEVER).unwrap();
    assert_eq!(bytes(&d, "k").unwrap(), [1u8; 16]);

    let path = TempPath::new("bad-layout");
    for opts in [
        SharedDict::options().capacity(0),
        SharedDict::options().capacity(shmlock::MAX_CAPACITY + 1),
        SharedDict::options().max_key_len(0),
        SharedDict::options().max_key_len(65536),
        SharedDict::options().max_value_len((1 << 20) + 1),
        SharedDict::options().max_value_len(0), // (it stored only empty values)
    ] {
        let err = opts.open(&path).expect_err("a bad layout was accepted");
        assert!(
            matches!(err, Error::InvalidCapacity(_) | Error::InvalidLayout(_)),
            "{err}"
        );
        assert!(!path.0.exists(), "nothing is left behind");
    }
    assert!(matches!(
        SharedDict::options()
            .capacity(1 << 24)
            .max_value_len(1 << 20)
            .open(&path),
        Err(Error::InvalidLayout(_))
    ));
    // A heap that holds no value longer than an entry's room (it made a heap of 256 B
    // that stored nothing, and said "values up to 256 B in a heap of 256 B")...
    let small = |heap: u64, value: usize| {
        SharedDict::options()
            .capacity(16)
            .max_value_len(value)
            .heap_size(heap)
    };
    for (heap, value) in [(1, 16), (100, 16), (256, 16), (512, 256), (768, 512)] {
        match small(heap, value).open(&path) {
            Err(Error::InvalidLayout(why)) => assert!(why.contains("heap_size"), "{why}"),
            other => panic!("heap {heap}, values {value}: {:?}", other.map(|_| ())),
        }
        assert!(!path.0.exists(), "nothing is left behind");
    }
    // ...while the smallest that holds one longer does, and so does what attaches
    let d = small(512, 16).open(&path).unwrap();
    assert_eq!(d.max_value_len(), 256);
    let _ = d.set("k", &[7u8; 200], NEVER).unwrap();
    let again = small(100, 16).open(&path).unwrap();
    assert_eq!(bytes(&again, "k").unwrap(), [7u8; 200]);
}

#[test]
fn files_of_the_other_kind_or_damaged_are_refused() {
    let (path, _d) = dict("kind", 8, 8);
    let err = LockTable::open(&path, 8).err().unwrap();
    assert!(matches!(
        err,
        Error::Format {
            source: FormatError::WrongKind { .. },
            ..
        }
    ));
    assert!(
        err.to_string().contains("shared dict, not a lock table"),
        "{err}"
    );
    let locks = TempPath::new("kind-locks");
    LockTable::open(&locks, 8).unwrap();
    assert!(matches!(
        SharedDict::open(&locks, 8, 8),
        Err(Error::Format {
            source: FormatError::WrongKind { .. },
            ..
        })
    ));
    // a dict of the format before this one (15: lists written whole, elements with one
    // length) is refused with both versions named; a lock table of 15 is today's
    let mut old = std::fs::read(&path).unwrap();
    assert_eq!(old[8], 16, "a dict's format version");
    old[8] = 15;
    let old_path = TempPath::new("kind-v15");
    std::fs::write(&old_path, &old).unwrap();
    let err = SharedDict::open(&old_path, 8, 8).err().unwrap();
    assert!(
        matches!(
            err,
            Error::Format {
                source: FormatError::UnsupportedVersion(15),
                ..
            }
        ),
        "{err}"
    );
    let said = err.to_string();
    assert!(
        said.contains("version 15 is not supported") && said.contains("16 for dicts"),
        "{said}"
    );
    assert_eq!(
        std::fs::read(&locks).unwrap()[8],
        15,
        "a lock table's format version"
    );
    // truncated: an error, not a SIGBUS
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let len = f.metadata().unwrap().len();
    f.set_len(len - 1).unwrap();
    assert!(matches!(
        SharedDict::open(&path, 8, 8),
        Err(Error::Format {
            source: FormatError::Truncated { .. },
            ..
        })
    ));
    // missing, without create
    let missing = TempPath::new("kind-missing");
    assert!(matches!(
        SharedDict::options().create(false).open(&missing),
        Err(Error::Io { .. })
    ));
}

#[test]
fn attaching_keeps_the_files_layout_and_sees_the_same_entries() {
    let (path, d) = dict("attach", 100, 40);
    d.set("k", "v", NEVER).unwrap();
    let other = SharedDict::options()
        .capacity(5)
        .max_value_len(1)
        .max_key_len(3)
        .open(&path)
        .unwrap();
    assert!(d.created() && !other.created());
    assert_eq!(
        (other.capacity(), other.max_value_len(), other.max_key_len()),
        (100, 40, 250)
    );
    assert_eq!(bytes(&other, "k").unwrap(), b"v");
}

#[test]
fn many_keys_fill_the_table_and_stay_findable() {
    // Nearly every key fits when the table is not overfull, every key is either present or
    // reported evicted, and nothing is found twice. A key must find room within 64 slots
    // of its home, so at 88 % some do not: over 300 random seeds 7 to 59 of 3600 (median 22)
    // evicted another; the bound below is twice the worst seen.
    let (_p, d) = dict("many", 4096, 16);
    let n = 3600; // 88 % of the slots
    let mut evicted = 0;
    for i in 0..n {
        evicted += u32::from(
            d.set(format!("key:{i}"), &format!("{i}"), NEVER)
                .unwrap()
                .forcible,
        );
    }
    let present = (0..n)
        .filter(|i| bytes(&d, &format!("key:{i}")) == Some(format!("{i}").into_bytes()))
        .count();
    assert_eq!(present + evicted as usize, n);
    assert_eq!(d.len(), present);
    assert_eq!(d.keys(0).unwrap().len(), present);
    assert!(present >= n * 97 / 100, "only {present} of {n} kept");
}

/// `get_or_fetch` under a lock that lets several holders in (a view of readers, a
/// semaphore of several permits) is refused: nested, it fetched the same miss twice.
/// A semaphore of one permit keeps others out, and does the recipe.
#[test]
fn get_or_fetch_refuses_locks_that_let_several_fetch() {
    let (_p, d) = dict("fetch-shared", 64, 64);
    let locks_path = TempPath::new("fetch-shared-locks");
    let locks = LockTable::open(&locks_path, 64).unwrap();
    let never = || -> Result<Value, Error> { panic!("fetched under a shared lock") };
    let refused = |got: Result<shmlock::Fetched, Error>| matches!(got, Err(Error::InvalidOptions(why)) if why.contains("exclusive lock"));
    assert!(refused(d.get_or_fetch(locks.shared(), "k", NEVER, never)));
    let two = locks.semaphore("pool", 2).unwrap();
    assert!(refused(d.get_or_fetch(&two, "k", NEVER, never)));
    let one = locks.semaphore("single", 1).unwrap();
    let got = d
        .get_or_fetch(&one, "k", NEVER, || Ok::<_, Error>("v"))
        .unwrap();
    assert_eq!((got.source, got.value), (Source::Fetched, Value::from("v")));
    assert!(!locks.is_locked("k").unwrap(), "the hold was released");
}

#[test]
fn get_or_fetch_fetches_once_and_reports_where_values_came_from() {
    let (_p, d) = dict("fetch", 64, 64);
    let locks_path = TempPath::new("fetch-locks");
    let locks = LockTable::open(&locks_path, 64).unwrap();
    let mut calls = 0;
    let got = d
        .get_or_fetch(&locks, "item:1", Duration::from_secs(60), || {
            calls += 1;
            Ok::<_, Error>(b"one".to_vec())
        })
        .unwrap();
    assert_eq!(
        (got.source, got.value.as_bytes()),
        (Source::Fetched, Some(&b"one"[..]))
    );
    let got = d
        .get_or_fetch(&locks, "item:1", Duration::from_secs(60), || {
            calls += 1;
            Ok::<_, Error>(b"two".to_vec())
        })
        .unwrap();
    assert_eq!(
        (got.source, got.value.as_bytes()),
        (Source::Cache, Some(&b"one"[..]))
    );
    assert_eq!(calls, 1);
    // a failed fetch stores nothing and unlocks
    let err = d
        .get_or_fetch(&locks, "item:2", Duration::from_secs(60), || {
            Err::<Vec<u8>, _>(Error::InvalidOptions("the fetch failed"))
        })
        .unwrap_err();
    assert!(matches!(err, Error::InvalidOptions("the fetch failed")));
    assert_eq!(d.get("item:2").unwrap(), None);
    assert!(!locks.is_locked("item:2").unwrap());
    // a value the dict cannot hold is an error, and unlocks too
    let err = d
        .get_or_fetch(&locks, "item:3", Duration::from_secs(60), || {
            Ok::<_, Error>(vec![0; 65])
        })
        .unwrap_err();
    assert!(matches!(
        err,
        Error::ValueTooLong {
            len: 65,
            max: 64,
            ..
        }
    ));
    assert!(!locks.is_locked("item:3").unwrap());
    // while another holder has the key, the waiter times out as the lock says
    let held = locks
        .try_lock_with_lease("item:4", Duration::from_secs(60))
        .unwrap()
        .unwrap();
    let opts = shmlock::LockOptions {
        timeout: Duration::from_millis(20),
        ..Default::default()
    };
    let err = d
        .get_or_fetch_with(&locks, "item:4", Duration::from_secs(60), &opts, || {
            Ok::<_, Error>(b"x".to_vec())
        })
        .unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }));
    drop(held);
    // a fetch returns whatever a value is made from: a String, a number, a boolean
    let fetched = |key: &str, value: Value| {
        let got = d
            .get_or_fetch(&locks, key, Duration::from_secs(60), || {
                Ok::<_, Error>(value.clone())
            })
            .unwrap();
        assert_eq!((got.source, &got.value), (Source::Fetched, &value));
        assert_eq!(d.get(key).unwrap().map(|i| i.value), Some(value));
    };
    fetched("string", Value::Bytes(b"{\"id\": 5}".to_vec()));
    let got = d
        .get_or_fetch(&locks, "json", Duration::from_secs(60), || {
            Ok::<_, Error>(String::from("{}"))
        })
        .unwrap();
    assert_eq!(got.value.as_bytes(), Some(&b"{}"[..]));
    let got = d
        .get_or_fetch(&locks, "count", Duration::from_secs(60), || {
            Ok::<_, Error>(7i64)
        })
        .unwrap();
    assert_eq!(got.value, Value::Int(7));
    assert_eq!(d.incr("count", 1i64, None, Duration::ZERO).unwrap(), 8);
    fetched("float", Value::Float(0.5));
    fetched("flag", Value::Bool(true));
}

#[test]
fn get_or_fetch_double_checks_after_waiting() {
    // The holder stores the value and unlocks while we wait: we must not fetch again.
    let (_p, d) = dict("fetch-wait", 64, 64);
    let locks_path = TempPath::new("fetch-wait-locks");
    let locks = LockTable::open(&locks_path, 64).unwrap();
    let guard = locks
        .try_lock_with_lease("k", Duration::from_secs(60))
        .unwrap()
        .unwrap();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            d.get_or_fetch(&locks, "k", Duration::from_secs(60), || {
                Ok::<_, Error>(b"fetched twice".to_vec())
            })
            .unwrap()
        });
        // the waiter is either still before its first look or waiting for the lock
        sleep(Duration::from_millis(50));
        d.set("k", "filled", NEVER).unwrap();
        drop(guard);
        let got = waiter.join().unwrap();
        assert_eq!(got.value.as_bytes(), Some(&b"filled"[..]));
        assert_ne!(got.source, Source::Fetched);
    });
}

#[test]
fn entries_left_mid_write_in_a_damaged_file_read_as_absent_not_a_panic() {
    // A file whose entries all say "a write is in progress" while nobody holds the writer
    // lock: no live protocol leaves that, a damaged or hostile file can. Offsets are the
    // documented format: 4 KiB header, the owner registry (1024 entries of 32 bytes by
    // default), a 4 KiB control page, entries of the layout's size, each starting with its
    // sequence word, two more entries' room (the undo copies), the home filters (a word per
    // entry, whole cache lines), then the counters. The first
    // undo copy's words in the control page (5 and 6) say it covers a write of an unused
    // entry, and its copy claims lengths past the entry's: nothing may trust them.
    let (path, d) = dict("odd-seq", 8, 8);
    d.set("k", "v", NEVER).unwrap();
    let entry_size = 64 + 256 + 64; // max_key_len 250 and max_value_len 8, rounded to 64
    let control = 4096 + 1024 * 32;
    let entries = control + 4096;
    let filters = 64; // 8 words
    let counters = 16 * 512 + 256 * 64; // process and thread cells, at the end
    let mut file = std::fs::read(&path).unwrap();
    assert_eq!(file.len(), entries + 10 * entry_size + filters + counters);
    for i in 0..8 {
        file[entries + i * entry_size] |= 1;
    }
    // READY (2), tag 0, owner 0: the word of an unused entry's damaged seq (state 1,
    // count 0, owner 0) once the 1 is read as WRITING
    let unused = (0..8)
        .find(|i| file[entries + i * entry_size..][..8] == [1, 0, 0, 0, 0, 0, 0, 0])
        .unwrap();
    file[control + 40..control + 48].copy_from_slice(&2u64.to_le_bytes());
    file[control + 48..control + 56].copy_from_slice(&(unused as u64).to_le_bytes());
    let copy = entries + 8 * entry_size;
    file[copy + 8..copy + 16].copy_from_slice(&u64::MAX.to_le_bytes()); // meta
    std::fs::write(&path, &file).unwrap();
    // The file was rewritten in place (same inode): this handle sees the damage.
    assert_eq!(d.get("k").unwrap(), None);
    // the copy names no key it could be (its key length is past the longest key)
    assert!(d.keys(0).unwrap().is_empty());
    assert!(matches!(d.ttl("k"), Err(Error::NotFound { .. })));
    assert!(matches!(
        d.incr("k", 1, None, NEVER),
        Err(Error::NotFound { .. })
    ));
    d.set("k", "again", NEVER).unwrap();
    assert_eq!(bytes(&d, "k"), Some(b"again".to_vec()));
    assert_eq!(d.len(), 1);
}

#[test]
fn floats_and_booleans_are_values_and_floats_add_up() {
    let (_p, d) = dict("float-bool", 64, 16);
    d.set("x", 1.625, NEVER).unwrap();
    d.set("yes", true, NEVER).unwrap();
    d.set("no", false, NEVER).unwrap();
    assert_eq!(d.get("x").unwrap().unwrap().value, Value::Float(1.625));
    assert_eq!(d.get("yes").unwrap().unwrap().value, Value::Bool(true));
    assert_eq!(d.get("no").unwrap().unwrap().value.as_bool(), Some(false));
    // flags and get_stale as for any value
    d.put(Put::Set, "flagged", -0.0, NEVER, 7).unwrap();
    let item = d.get_stale("flagged").unwrap().unwrap().0;
    assert_eq!((item.value, item.flags), (Value::Float(-0.0), 7));
    assert_ne!(
        Value::Float(-0.0),
        Value::Float(0.0),
        "floats compare by their bits"
    );
    assert_eq!(Value::Float(f64::NAN), Value::Float(f64::NAN));
    d.set("nan", f64::NAN, NEVER).unwrap();
    assert!(d
        .get("nan")
        .unwrap()
        .unwrap()
        .value
        .as_f64()
        .unwrap()
        .is_nan());
    // incr: an f64 makes a float, from an integer too; an i64 on a float changes nothing
    assert_eq!(d.incr("n", 10, Some(0), NEVER).unwrap(), 10);
    assert_eq!(d.incr("n", 0.5, None, NEVER).unwrap(), 10.5);
    assert_eq!(d.get("n").unwrap().unwrap().value, Value::Float(10.5));
    assert!(matches!(
        d.incr("n", 1, None, NEVER),
        Err(Error::NotAnInteger { .. })
    ));
    assert_eq!(d.get("n").unwrap().unwrap().value, Value::Float(10.5));
    assert_eq!(d.incr("n", -0.25, None, NEVER).unwrap(), 10.25);
    assert_eq!(d.incr("f", 1.5, Some(0.25), NEVER).unwrap(), 1.75);
    assert_eq!(d.incr("x", 0.0, None, NEVER).unwrap(), 1.625);
    // booleans and bytes are not numbers
    assert!(matches!(
        d.incr("yes", 1.0, None, NEVER),
        Err(Error::NotANumber { .. })
    ));
    d.set("s", "1", NEVER).unwrap();
    assert!(matches!(
        d.incr("s", 1.0, Some(0.0), NEVER),
        Err(Error::NotANumber { .. })
    ));
    // add, replace, safe_set take them as any value
    assert!(matches!(
        d.add("yes", false, NEVER),
        Err(Error::Exists { .. })
    ));
    d.replace("yes", 2.5, NEVER).unwrap();
    assert_eq!(d.get("yes").unwrap().unwrap().value.as_f64(), Some(2.5));
    // a float needs 8 bytes of value, a boolean one
    let (_p2, tiny) = dict("float-bool-tiny", 8, 4);
    assert!(matches!(
        tiny.set("f", 1.0, NEVER),
        Err(Error::ValueTooLong { len: 8, max: 4, .. })
    ));
    tiny.set("b", true, NEVER).unwrap();
    assert_eq!(tiny.get("b").unwrap().unwrap().value, Value::Bool(true));
}

#[test]
fn lists_push_pop_and_keep_to_their_bounds() {
    let (_p, d) = dict("lists", 64, 64);
    assert_eq!(d.llen("q").unwrap(), 0);
    assert_eq!(d.lpop("q").unwrap(), None);
    assert_eq!(d.rpush("q", "b").unwrap(), 1);
    assert_eq!(d.lpush("q", 1i64).unwrap(), 2);
    assert_eq!(d.rpush("q", 2.5).unwrap(), 3);
    assert_eq!(d.rpush("q", true).unwrap(), 4);
    assert_eq!(d.llen("q").unwrap(), 4);
    assert_eq!(d.lpop("q").unwrap(), Some(Value::Int(1)));
    assert_eq!(d.rpop("q").unwrap(), Some(Value::Bool(true)));
    assert_eq!(d.rpop("q").unwrap(), Some(Value::Float(2.5)));
    // a list is not a value to get, and a value is not a list
    assert!(matches!(d.get("q"), Err(Error::IsAList { .. })));
    assert!(matches!(d.get_stale("q"), Err(Error::IsAList { .. })));
    assert!(matches!(
        d.incr("q", 1, None, NEVER),
        Err(Error::NotANumber { .. })
    ));
    d.set("v", "x", NEVER).unwrap();
    assert!(matches!(d.lpush("v", "y"), Err(Error::NotAList { .. })));
    assert!(matches!(d.rpop("v"), Err(Error::NotAList { .. })));
    assert!(matches!(d.llen("v"), Err(Error::NotAList { .. })));
    assert_eq!(bytes(&d, "v").unwrap(), b"x");
    assert!(d.keys(0).unwrap().contains(&b"q".to_vec()));
    // the last pop deletes the list
    assert_eq!(d.lpop("q").unwrap(), Some(Value::Bytes(b"b".to_vec())));
    assert!(d.keys(0).unwrap().iter().all(|k| k != b"q"));
    assert_eq!(d.len(), 1);
    // bounded by max_value_len (9 bytes an element besides its value)
    for n in 1..=4 {
        assert_eq!(d.rpush("full", "12345").unwrap(), n);
    }
    assert!(matches!(
        d.rpush("full", "12345"),
        Err(Error::NoMemory { .. })
    ));
    assert!(matches!(
        d.rpush("big", vec![0u8; 60].as_slice()),
        Err(Error::NoMemory { .. })
    ));
    assert_eq!(d.llen("full").unwrap(), 4);
    // expiry: a push onto an expired list starts a new one
    d.expire("full", SHORT).unwrap();
    sleep(PAST_SHORT);
    assert_eq!(d.llen("full").unwrap(), 0);
    assert_eq!(d.lpush("full", "again").unwrap(), 1);
    assert_eq!(d.ttl("full").unwrap(), None, "a new list never expires");
    // set over a list makes it a value
    d.set("full", "plain", NEVER).unwrap();
    assert_eq!(bytes(&d, "full").unwrap(), b"plain");
    // as ngx's, a push never evicts a live value to make room for a new list
    let (_p8, small) = dict("lists-small", 8, 16);
    for i in 0..8 {
        small.set(format!("k{i}"), "v", NEVER).unwrap();
    }
    assert!(matches!(
        small.lpush("new", "x"),
        Err(Error::NoMemory { .. })
    ));
    assert_eq!((small.len(), small.evictions()), (8, 0));
    small.expire("k3", SHORT).unwrap();
    sleep(PAST_SHORT);
    assert_eq!(
        small.lpush("new", "x").unwrap(),
        1,
        "an expired entry makes room"
    );
}

#[test]
fn a_read_only_handle_reads_and_changes_nothing() {
    let (path, d) = dict("read-only", 64, 32);
    d.set("dog", "bark", NEVER).unwrap();
    d.rpush("q", 1i64).unwrap();
    let ro = SharedDict::options()
        .read_only(true)
        .create(false)
        .open(&path)
        .unwrap();
    // reads (they count nothing: the mapping cannot be written; they used to fault here)
    assert_eq!(bytes(&ro, "dog"), Some(b"bark".to_vec()));
    assert_eq!(ro.get("cat").unwrap(), None);
    assert!(ro.get_stale("dog").unwrap().is_some());
    assert_eq!(ro.ttl("dog").unwrap(), None);
    assert_eq!(ro.llen("q").unwrap(), 1);
    assert_eq!(ro.keys(0).unwrap().len(), 2);
    // changes are refused
    assert!(matches!(ro.set("dog", "woof", NEVER), Err(Error::ReadOnly)));
    assert!(matches!(ro.delete("dog"), Err(Error::ReadOnly)));
    assert!(matches!(
        ro.incr("n", 1, Some(0), NEVER),
        Err(Error::ReadOnly)
    ));
    assert!(matches!(ro.lpop("q"), Err(Error::ReadOnly)));
    // get_or_fetch: a hit is read; a miss is refused before the fetch (it called the
    // fetcher, then could not store what it fetched)
    let locks_path = TempPath::new("read-only-locks");
    let locks = LockTable::open(&locks_path, 64).unwrap();
    let hit = ro
        .get_or_fetch(&locks, "dog", NEVER, || -> Result<&str, Error> {
            panic!("fetched a hit")
        })
        .unwrap();
    assert_eq!(hit.value.as_bytes(), Some(&b"bark"[..]));
    let mut fetched = false;
    let miss = ro.get_or_fetch(&locks, "cat", NEVER, || {
        fetched = true;
        Ok::<_, Error>("meow")
    });
    assert!(matches!(miss, Err(Error::ReadOnly)), "{miss:?}");
    assert!(
        !fetched,
        "the fetcher ran for a value that could not be stored"
    );
    assert!(locks.holders().is_empty());
    // the flushes too (they did nothing and said nothing)
    assert!(matches!(ro.flush_all(), Err(Error::ReadOnly)));
    d.set("gone", "x", Duration::from_millis(1)).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert!(matches!(ro.flush_expired(0), Err(Error::ReadOnly)));
    assert_eq!(bytes(&d, "dog"), Some(b"bark".to_vec()));
    assert_eq!(
        d.flush_expired(0).unwrap(),
        1,
        "the expired entry was left for us"
    );
}

/// An existing dict is attached with its own layout whatever the opener asks, lengths that
/// could not make a dict included (`open(path, 0, 0)` was `InvalidLayout`); a missing
/// file is not created from them, and that error names what is wrong.
#[test]
fn an_existing_dict_is_attached_whatever_lengths_are_asked() {
    let path = TempPath::new("dict-attach-any");
    let made = SharedDict::open(&path, 64, 16).unwrap();
    made.set("k", "v", NEVER).unwrap();
    for (capacity, max_value) in [(0, 0), (0, 16), (64, 0), (64, 2 << 20)] {
        let d = SharedDict::open(&path, capacity, max_value)
            .unwrap_or_else(|e| panic!("open({capacity}, {max_value}): {e}"));
        assert_eq!((d.capacity(), d.entry_value_len()), (64, 16));
        assert_eq!(bytes(&d, "k").as_deref(), Some(&b"v"[..]));
    }
    let missing = TempPath::new("dict-attach-none");
    for (capacity, max_value) in [(64, 0), (64, 2 << 20)] {
        let e = SharedDict::open(&missing, capacity, max_value).unwrap_err();
        assert!(
            matches!(e, Error::InvalidLayout(_)) && e.to_string().contains("max_value_len"),
            "{e}"
        );
        assert!(
            !missing.0.exists(),
            "a file was made from lengths it refused"
        );
    }
    // The options' own conflict is said first, whatever the lengths; a call that may not
    // create (or only reads) a missing dict says that it is missing.
    let both = SharedDict::options()
        .max_value_len(0)
        .zone_size(1 << 20)
        .heap_size(1 << 20)
        .open(&path)
        .unwrap_err();
    assert!(matches!(both, Error::InvalidOptions(_)), "{both}");
    for opts in [
        SharedDict::options().max_value_len(0).create(false),
        SharedDict::options().max_value_len(0).read_only(true),
        SharedDict::options().max_value_len(2 << 20).create(false),
    ] {
        let e = opts.open(&missing).unwrap_err();
        assert!(
            matches!(&e, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound),
            "{e}"
        );
        assert!(!missing.0.exists());
    }
    let attached = SharedDict::options()
        .max_value_len(0)
        .read_only(true)
        .open(&path)
        .unwrap();
    assert_eq!(bytes(&attached, "k").as_deref(), Some(&b"v"[..]));
    assert!(matches!(
        attached.set("k", "w", NEVER),
        Err(Error::ReadOnly)
    ));
}

/// A dict file replaced under its path (a new one renamed over it) is written and read no
/// more by a handle of the old one: the processes that open the path use the new file, and
/// the old handle's `set`s and `get`s went on there with no error, each side blind to the
/// other's. Deleting the path is caught the same way.
#[test]
fn a_dict_replaced_under_its_path_is_used_no_more() {
    let (path, old) = dict("replaced", 64, 64);
    old.set("k", "old", NEVER).unwrap();
    let other = TempPath::new("replaced-new");
    SharedDict::open(&other, 64, 64).unwrap();
    std::fs::rename(&other.0, &path.0).unwrap();
    let new = SharedDict::open(&path, 64, 64).unwrap();
    new.set("k", "new", NEVER).unwrap();
    // (the path is looked at every 100 ms at most)
    sleep(Duration::from_millis(150));
    let gone = |e: Error| matches!(e, Error::TableGone { how, .. } if how.contains("replaced"));
    assert!(gone(old.set("k", "late", NEVER).unwrap_err()));
    assert!(gone(old.get("k").unwrap_err()));
    // every read of a key, not only get: get_stale handed out "old" as fresh
    assert!(gone(old.get_stale("k").unwrap_err()));
    assert!(gone(old.ttl("k").unwrap_err()));
    assert!(gone(old.describe("k").unwrap_err()));
    assert!(gone(old.keys(0).unwrap_err()));
    assert!(gone(old.llen("k").unwrap_err()));
    assert!(gone(old.get_with("k", |_| ()).unwrap_err()));
    assert_eq!(new.get("k").unwrap().unwrap().value, Value::from("new"));
    let (path, d) = dict("deleted", 64, 64);
    std::fs::remove_file(&path.0).unwrap();
    sleep(Duration::from_millis(150));
    let deleted = |e: Error| matches!(e, Error::TableGone { how: "deleted", .. });
    assert!(deleted(d.set("k", "v", NEVER).unwrap_err()));
    assert!(deleted(d.get_stale("k").unwrap_err()));
}
