//! lua-resty-core's `t/shdict.t` (openresty/lua-resty-core), ported to `SharedDict`: each
//! test is named after the upstream case, `resty_core_shdict_NNN_...`, and asserts what the
//! case's `--- response_body` expects, in our terms (an integer stored reads back as
//! `Value::Int`, a double stored, or made by an `f64` increment, as `Value::Float`, a
//! boolean as `Value::Bool`; a double's printed form is `lua_number` of it; ngx's flags
//! `nil` is our flags `0`, ngx's `forcible` is `Stored { forcible }`, or the
//! `evictions()` counter where the operation (`incr`) returns no `Stored`). Upstream's loops
//! (run so that LuaJIT compiles them) are kept as loops; the trace checks are not ported.
//!
//! Upstream cases not ported, by reason:
//!
//! nil or negative arguments, which the Rust types rule out:
//!   17 set a number value and a nil (set(k, nil) as a delete: no nil value; see 22)
//!   23 set nil key
//!   24 get nil key
//!   25 get stale key (a nil key)
//!   26 incr key (a nil key)
//!   39 incr bad init_ttl argument (-1: a Duration is never negative)
//! Lua argument types only (a string where a number goes, or the method called without its
//! zone):
//!   28 incr, value is not number (the increment is the string "bar")
//!   30 incr, init is not number
//!   40 incr init_ttl argument is not a number
//!   44 incr key with init and init_ttl as string (Lua's coercion of "0.01"; else case 43)
//!   50 check zone argument
//! Slab-allocator page figures (free bytes of a zone partly filled, sized in bytes):
//!   34 free_space, about half full, one page left
//!   35 free_space, about half full, no page left
//!   38 free_space, full (100k) (the first forcible at the 736th set, 0 or 32768 bytes)
//! nginx versions:
//!   51 free_space, not supported in NGINX < 1.11.7
//!
//! Translations: upstream's zones are sized in bytes, ours in entries. The 16k zone `cats`
//! holds 63 of upstream's `keyNNNNN`/`valNNNNN` pairs (case 36 fills it with 63, case 37's
//! 64th set may be forcible), so `cats()` has 63 entries; at most 64 entries, a key's window
//! is the whole table, so the 64th set is forcible for certain. Exptimes of 0.01 and 0.02 s
//! are `SHORT`, waited out with `PAST_SHORT`.

mod common;

use std::thread::sleep;
use std::time::Duration;

use common::TempPath;
use shmlock::{Error, Item, Put, SharedDict, Value};

const NEVER: Duration = Duration::ZERO;
/// Upstream's 0.01 s and 0.02 s exptimes: long enough to read the value back first, even on
/// a loaded machine.
const SHORT: Duration = Duration::from_millis(100);
/// Clearly past SHORT (and the coarse clock's tick).
const PAST_SHORT: Duration = Duration::from_millis(300);
/// Upstream's `2 ^ 31` seconds, an exptime that overflows a 32-bit time.
const HUGE: Duration = Duration::from_secs(1 << 31);

fn open(name: &str, capacity: usize, max_key: usize, max_value: usize) -> (TempPath, SharedDict) {
    let path = TempPath::new(name);
    let dict = SharedDict::options()
        .capacity(capacity)
        .max_key_len(max_key)
        .max_value_len(max_value)
        .open(&path)
        .unwrap();
    (path, dict)
}

/// Upstream's `dogs` (a 1m zone): room for upstream's keys and for its 4097-byte value.
fn dogs(name: &str) -> (TempPath, SharedDict) {
    open(name, 1024, 64, 8192)
}

/// Upstream's `cats` (a 16k zone), in entries: 63 of its `keyNNNNN` pairs.
fn cats(name: &str) -> (TempPath, SharedDict) {
    open(name, 63, 16, 16)
}

/// Upstream's `birds` (a 100k zone), in entries.
fn birds(name: &str) -> (TempPath, SharedDict) {
    open(name, 1000, 16, 16)
}

fn item(value: Value, flags: u32) -> Item {
    Item { value, flags }
}

fn text(s: &str) -> Value {
    Value::Bytes(s.as_bytes().to_vec())
}

/// Upstream's double 3.1415926 (its literal, not an approximation of π).
#[allow(clippy::approx_constant)]
const UPSTREAM_DOUBLE: f64 = 3.1415926;

/// A number as Lua's `tostring` (and so `ngx.say`) prints it: C's `"%.14g"`.
fn lua_number(x: f64) -> String {
    const DIGITS: i32 = 14;
    let sci = format!("{x:.*e}", (DIGITS - 1) as usize);
    let (mantissa, exp) = sci.split_once('e').unwrap();
    let exp: i32 = exp.parse().unwrap();
    let trim = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s.to_string()
        }
    };
    if (-4..DIGITS).contains(&exp) {
        trim(&format!("{x:.*}", (DIGITS - 1 - exp) as usize))
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim(mantissa), exp.abs())
    }
}

/// Upstream's `string.format("key%05d", i)` and `("val%05d", i)`.
fn pair(i: usize) -> (String, String) {
    (format!("key{i:05}"), format!("val{i:05}"))
}

/// Sets upstream's pairs `1..=n` in `d`, as cases 32 to 38 do; the `i` of each forcible set.
fn set_pairs(d: &SharedDict, n: usize) -> Vec<usize> {
    (1..=n)
        .filter(|&i| {
            let (k, v) = pair(i);
            d.set(&k, &v, NEVER).unwrap().forcible
        })
        .collect()
}

fn ttl_is_about_huge(ttl: Option<Duration>) {
    let ttl = ttl.expect("a ttl of 2^31 s, not never");
    assert!(
        ttl <= HUGE && ttl > HUGE - Duration::from_secs(60),
        "ttl {ttl:?}, not about 2^31 s"
    );
}

#[test]
fn resty_core_shdict_001_get_a_string_value() {
    let (_p, d) = dogs("rc1");
    assert!(!d.put(Put::Set, "foo", "bar", NEVER, 72).unwrap().forcible);
    let mut got = None;
    for _ in 0..100 {
        got = d.get("foo").unwrap();
    }
    assert_eq!(got, Some(item(text("bar"), 72)));
}

#[test]
fn resty_core_shdict_002_get_an_nonexistent_key() {
    let (_p, d) = dogs("rc2");
    for _ in 0..100 {
        assert_eq!(d.get("nonexistent").unwrap(), None);
    }
}

#[test]
fn resty_core_shdict_003_get_a_boolean_value_true() {
    let (_p, d) = dogs("rc3");
    d.put(Put::Set, "foo", true, NEVER, 5678).unwrap();
    let mut got = None;
    for _ in 0..100 {
        got = d.get("foo").unwrap();
    }
    assert_eq!(got, Some(item(Value::Bool(true), 5678)));
}

#[test]
fn resty_core_shdict_004_get_a_boolean_value_false() {
    let (_p, d) = dogs("rc4");
    d.put(Put::Set, "foo", false, NEVER, 777).unwrap();
    let mut got = None;
    for _ in 0..100 {
        got = d.get("foo").unwrap();
    }
    assert_eq!(got, Some(item(Value::Bool(false), 777)));
}

#[test]
fn resty_core_shdict_005_get_a_number_value_int() {
    let (_p, d) = dogs("rc5");
    d.set("foo", 51203i64, NEVER).unwrap();
    let mut got = None;
    for _ in 0..100 {
        got = d.get("foo").unwrap();
    }
    // ngx's flags nil: none given
    assert_eq!(got, Some(item(Value::Int(51203), 0)));
}

#[test]
fn resty_core_shdict_006_get_a_number_value_double() {
    let (_p, d) = dogs("rc6");
    d.put(Put::Set, "foo", UPSTREAM_DOUBLE, NEVER, 78).unwrap();
    let mut got = None;
    for _ in 0..100 {
        got = d.get("foo").unwrap();
    }
    assert_eq!(got, Some(item(Value::Float(UPSTREAM_DOUBLE), 78)));
    assert_eq!(
        lua_number(got.unwrap().value.as_f64().unwrap()),
        "3.1415926"
    );
}

#[test]
fn resty_core_shdict_007_get_a_large_string_value() {
    let (_p, d) = dogs("rc7");
    d.set("other", "v", NEVER).unwrap();
    d.flush_all().unwrap();
    d.flush_expired(0).unwrap();
    let large = format!("{}a", "bbbb".repeat(1024));
    assert_eq!(large.len(), 4097);
    d.put(Put::Set, "foo", &large, NEVER, 912).unwrap();
    let mut got = None;
    for _ in 0..100 {
        got = d.get("foo").unwrap();
    }
    assert_eq!(got, Some(item(text(&large), 912)));
}

#[test]
fn resty_core_shdict_008_get_stale_false() {
    let (_p, d) = dogs("rc8");
    d.put(Put::Set, "foo", "bar", NEVER, 72).unwrap();
    let mut got = None;
    for _ in 0..100 {
        got = d.get_stale("foo").unwrap();
    }
    assert_eq!(got, Some((item(text("bar"), 72), false)));
}

#[test]
fn resty_core_shdict_009_get_stale_true() {
    let (_p, d) = dogs("rc9");
    assert!(!d.put(Put::Set, "foo", "bar", SHORT, 72).unwrap().forcible);
    sleep(PAST_SHORT);
    let mut got = None;
    for _ in 0..30 {
        got = d.get_stale("foo").unwrap();
    }
    assert_eq!(got, Some((item(text("bar"), 72), true)));
}

#[test]
fn resty_core_shdict_010_incr_int() {
    let (_p, d) = dogs("rc10");
    assert!(!d.set("foo", 56i64, NEVER).unwrap().forcible);
    let mut val = 0;
    for _ in 0..100 {
        val = d.incr("foo", 2, None, NEVER).unwrap();
    }
    assert_eq!(val, 256);
    assert_eq!(d.get("foo").unwrap().unwrap().value, Value::Int(256));
}

#[test]
fn resty_core_shdict_011_incr_double() {
    let (_p, d) = dogs("rc11");
    d.set("foo", 56i64, NEVER).unwrap();
    let mut val = 0.0;
    for _ in 0..100 {
        val = d.incr("foo", 2.1, None, NEVER).unwrap();
    }
    // 56 plus 2.1 a hundred times, in doubles (265.9999999999996), which Lua prints as 266
    assert_eq!(lua_number(val), "266");
    assert_eq!(d.get("foo").unwrap().unwrap().value, Value::Float(val));
}

#[test]
fn resty_core_shdict_012_set_a_string_value() {
    let (_p, d) = dogs("rc12");
    for _ in 0..100 {
        d.put(Put::Set, "foo", "bar", NEVER, 72).unwrap();
    }
    assert_eq!(d.get("foo").unwrap(), Some(item(text("bar"), 72)));
}

#[test]
fn resty_core_shdict_013_set_a_boolean_value_true() {
    let (_p, d) = dogs("rc13");
    for _ in 0..100 {
        d.put(Put::Set, "foo", true, NEVER, 5678).unwrap();
    }
    assert_eq!(d.get("foo").unwrap(), Some(item(Value::Bool(true), 5678)));
}

#[test]
fn resty_core_shdict_014_set_a_boolean_value_false() {
    let (_p, d) = dogs("rc14");
    for _ in 0..100 {
        d.put(Put::Set, "foo", false, NEVER, 777).unwrap();
    }
    assert_eq!(d.get("foo").unwrap(), Some(item(Value::Bool(false), 777)));
}

#[test]
fn resty_core_shdict_015_set_a_number_value_int() {
    let (_p, d) = dogs("rc15");
    for _ in 0..100 {
        d.set("foo", 51203i64, NEVER).unwrap();
    }
    assert_eq!(d.get("foo").unwrap(), Some(item(Value::Int(51203), 0)));
}

#[test]
fn resty_core_shdict_016_set_a_number_value_double() {
    let (_p, d) = dogs("rc16");
    for _ in 0..100 {
        d.put(Put::Set, "foo", UPSTREAM_DOUBLE, NEVER, 78).unwrap();
    }
    let got = d.get("foo").unwrap().unwrap();
    assert_eq!(got, item(Value::Float(UPSTREAM_DOUBLE), 78));
    assert_eq!(lua_number(got.value.as_f64().unwrap()), "3.1415926");
}

#[test]
fn resty_core_shdict_018_safe_set_a_number_value() {
    let (_p, d) = dogs("rc18");
    for _ in 0..100 {
        d.put(Put::SafeSet, "foo", UPSTREAM_DOUBLE, NEVER, 78)
            .unwrap();
    }
    assert_eq!(
        d.get("foo").unwrap(),
        Some(item(Value::Float(UPSTREAM_DOUBLE), 78))
    );
}

#[test]
fn resty_core_shdict_019_add_a_string_value() {
    let (_p, d) = dogs("rc19");
    // what an earlier run leaves (upstream repeats each case): flush_all makes it expired,
    // and add stores over expired values
    for i in 1..=100 {
        d.set(format!("foo{i}"), "old", NEVER).unwrap();
    }
    d.flush_all().unwrap();
    for i in 1..=100 {
        let stored = d.put(Put::Add, format!("foo{i}"), "bar", NEVER, 72);
        assert!(stored.is_ok(), "add foo{i}: {stored:?}");
    }
    assert_eq!(d.get("foo100").unwrap(), Some(item(text("bar"), 72)));
}

#[test]
fn resty_core_shdict_020_safe_add_a_string_value() {
    let (_p, d) = dogs("rc20");
    for i in 1..=100 {
        d.set(format!("foo{i}"), "old", NEVER).unwrap();
    }
    d.flush_all().unwrap();
    d.flush_expired(0).unwrap();
    for i in 1..=100 {
        let stored = d.put(Put::SafeAdd, format!("foo{i}"), "bar", NEVER, 72);
        assert!(stored.is_ok(), "safe_add foo{i}: {stored:?}");
    }
    assert_eq!(d.get("foo100").unwrap(), Some(item(text("bar"), 72)));
}

#[test]
fn resty_core_shdict_021_replace_a_string_value() {
    let (_p, d) = dogs("rc21");
    d.set("foo", "hello", NEVER).unwrap();
    for i in 1..=100 {
        let stored = d.put(Put::Replace, "foo", &format!("bar{i}"), NEVER, 72);
        assert!(stored.is_ok(), "replace {i}: {stored:?}");
    }
    assert_eq!(d.get("foo").unwrap(), Some(item(text("bar100"), 72)));
}

#[test]
fn resty_core_shdict_022_set_a_number_value_and_delete() {
    let (_p, d) = dogs("rc22");
    for _ in 0..150 {
        d.put(Put::Set, "foo", UPSTREAM_DOUBLE, NEVER, 78).unwrap();
        assert!(d.delete("foo").unwrap());
    }
    assert_eq!(d.get("foo").unwrap(), None);
}

#[test]
fn resty_core_shdict_027_flush_all() {
    let (_p, d) = dogs("rc27");
    d.set("foo", "bah", NEVER).unwrap();
    for _ in 0..150 {
        d.flush_all().unwrap();
    }
    assert_eq!(d.get("foo").unwrap(), None);
}

#[test]
fn resty_core_shdict_029_incr_with_init() {
    let (_p, d) = dogs("rc29");
    d.set("foo", 5i64, NEVER).unwrap();
    d.flush_all().unwrap();
    assert!(matches!(
        d.incr("foo", 10, None, NEVER),
        Err(Error::NotFound { .. })
    ));
    let evictions = d.evictions();
    assert_eq!(d.incr("foo", 10, Some(10), NEVER).unwrap(), 20);
    // forcible: false
    assert_eq!(d.evictions(), evictions);
}

#[test]
fn resty_core_shdict_031_capacity() {
    let (path, cats) = cats("rc31");
    assert_eq!(cats.capacity(), 63);
    // as the zone's size is the configuration's: also for a handle that attaches
    let attached = SharedDict::open(&path, 5, 5).unwrap();
    assert_eq!(attached.capacity(), 63);
}

#[test]
fn resty_core_shdict_032_free_space_empty_16k_zone() {
    let (_p, cats) = cats("rc32");
    set_pairs(&cats, 40);
    cats.set("short", "v", Duration::from_millis(1)).unwrap();
    sleep(Duration::from_millis(20));
    cats.flush_all().unwrap();
    cats.flush_expired(0).unwrap();
    assert_eq!(cats.free_slots(), cats.capacity());
    assert_eq!(cats.len(), 0);
}

#[test]
fn resty_core_shdict_033_free_space_empty_100k_zone() {
    let (_p, birds) = birds("rc33");
    set_pairs(&birds, 500);
    assert!(birds.len() >= 490);
    birds.flush_all().unwrap();
    birds.flush_expired(0).unwrap();
    assert_eq!(birds.free_slots(), birds.capacity());
    assert_eq!(birds.len(), 0);
}

#[test]
fn resty_core_shdict_036_free_space_full() {
    let (_p, cats) = cats("rc36");
    cats.set("left over", "v", NEVER).unwrap();
    cats.flush_all().unwrap();
    cats.flush_expired(0).unwrap();
    // no error, no forcible, every set stored
    assert_eq!(set_pairs(&cats, 63), Vec::<usize>::new());
    assert_eq!(cats.free_slots(), 0);
    for i in 1..=63 {
        let (k, v) = pair(i);
        assert_eq!(cats.get(&k).unwrap().unwrap().value, text(&v));
    }
}

#[test]
fn resty_core_shdict_037_free_space_got_forcible() {
    let (_p, cats) = cats("rc37");
    cats.flush_all().unwrap();
    cats.flush_expired(0).unwrap();
    // upstream allows "got forcible, i=64"; with 63 entries it is certain
    assert_eq!(set_pairs(&cats, 64), vec![64]);
    assert_eq!(cats.free_slots(), 0);
    let (k, v) = pair(64);
    assert_eq!(cats.get(&k).unwrap().unwrap().value, text(&v));
}

#[test]
fn resty_core_shdict_041_incr_init_ttl_argument_without_init() {
    let (_p, d) = dogs("rc41");
    // upstream: must provide "init" when providing "init_ttl"
    assert!(matches!(
        d.incr("foo", 1, None, Duration::from_millis(10)),
        Err(Error::InvalidOptions(_))
    ));
    assert_eq!(d.get("foo").unwrap(), None);
}

#[test]
fn resty_core_shdict_042_incr_key_with_init_ttl_key_exists() {
    let (_p, d) = dogs("rc42");
    d.set("foo", 32i64, NEVER).unwrap();
    assert_eq!(d.incr("foo", 10502, Some(0), SHORT).unwrap(), 10534);
    assert_eq!(d.get("foo").unwrap().unwrap().value, Value::Int(10534));
    sleep(PAST_SHORT);
    // the init_ttl applies only to a value incr makes
    assert_eq!(d.get("foo").unwrap().unwrap().value, Value::Int(10534));
}

#[test]
fn resty_core_shdict_043_incr_key_with_init_and_init_ttl_key_not_exists() {
    let (_p, d) = dogs("rc43");
    d.set("foo", 7i64, NEVER).unwrap();
    d.flush_all().unwrap();
    assert_eq!(d.incr("foo", 10502, Some(1), SHORT).unwrap(), 10503);
    assert_eq!(d.get("foo").unwrap().unwrap().value, Value::Int(10503));
    sleep(PAST_SHORT);
    assert_eq!(d.get("foo").unwrap(), None);
}

#[test]
fn resty_core_shdict_045_incr_key_with_init_and_init_ttl_key_expired_and_size_matched() {
    let (_p, d) = dogs("rc45");
    for i in 1..=20i64 {
        d.set(format!("bar{i}"), i, SHORT).unwrap();
    }
    d.set("foo", 32i64, SHORT).unwrap();
    sleep(PAST_SHORT);
    // the expired 32 is not added to: init is
    assert_eq!(d.incr("foo", 10502, Some(0), SHORT).unwrap(), 10502);
    assert_eq!(d.get("foo").unwrap().unwrap().value, Value::Int(10502));
    sleep(PAST_SHORT);
    assert_eq!(d.get("foo").unwrap(), None);
}

#[test]
fn resty_core_shdict_046_incr_key_with_init_and_init_ttl_forcibly_override_other_valid_entries() {
    // 1000-byte keys, as upstream's; 32 entries, so that a key's window is the whole table
    let (_p, d) = open("rc46", 32, 1100, 16);
    let long_prefix = "1234567890".repeat(100);
    d.set("left over", "v", NEVER).unwrap();
    d.flush_all().unwrap();
    let mut forcible_at = None;
    for i in 1..=1000i64 {
        let key = format!("{long_prefix}{i}");
        if d.set(&key, i, NEVER).unwrap().forcible {
            assert!(d.delete(&key).unwrap());
            forcible_at = Some(i);
            break;
        }
    }
    assert_eq!(forcible_at, Some(33), "the set one past full is forcible");
    let evictions = d.evictions();
    let bar = format!("{long_prefix}bar");
    assert_eq!(d.incr(&bar, 10502, Some(0), NEVER).unwrap(), 10502);
    assert_eq!(d.evictions(), evictions, "incr bar: forcible false");
    let foo = format!("{long_prefix}foo");
    assert_eq!(d.incr(&foo, 10502, Some(0), SHORT).unwrap(), 10502);
    assert_eq!(d.evictions(), evictions + 1, "incr foo: forcible true");
    assert_eq!(d.get(&foo).unwrap().unwrap().value, Value::Int(10502));
    sleep(PAST_SHORT);
    // upstream reads back the short "foo" here (nil); the long key's init_ttl is over too
    assert_eq!(d.get("foo").unwrap(), None);
    assert_eq!(d.get(&foo).unwrap(), None);
}

#[test]
fn resty_core_shdict_047_exptime_uses_long_type_to_avoid_overflow_in_set_ttl() {
    let (_p, d) = dogs("rc47");
    d.flush_all().unwrap();
    d.set("huge_ttl", "v", HUGE).unwrap();
    ttl_is_about_huge(d.ttl("huge_ttl").unwrap());
    assert!(d.get("huge_ttl").unwrap().is_some());
}

#[test]
fn resty_core_shdict_048_exptime_uses_long_type_to_avoid_overflow_in_expire_ttl() {
    let (_p, d) = dogs("rc48");
    d.flush_all().unwrap();
    d.set("updated_huge_ttl", "v", NEVER).unwrap();
    d.expire("updated_huge_ttl", HUGE).unwrap();
    ttl_is_about_huge(d.ttl("updated_huge_ttl").unwrap());
    assert!(d.get("updated_huge_ttl").unwrap().is_some());
}

#[test]
fn resty_core_shdict_049_init_ttl_uses_long_type_to_avoid_overflow_in_incr_ttl() {
    let (_p, d) = dogs("rc49");
    d.flush_all().unwrap();
    assert_eq!(d.incr("incr_huge_ttl", 1, Some(0), HUGE).unwrap(), 1);
    ttl_is_about_huge(d.ttl("incr_huge_ttl").unwrap());
    assert_eq!(
        d.get("incr_huge_ttl").unwrap().unwrap().value,
        Value::Int(1)
    );
}
