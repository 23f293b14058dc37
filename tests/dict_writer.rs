//! The dict's writer lock, and what a writer stopped or killed mid-write leaves behind: a
//! writer stopped inside `place` never lowers a home's reach once its lock was taken over;
//! a takeover's recovery stays within the stall bound on a big dict; and writers SIGSTOPped
//! past the bound and SIGKILLed leave every key with its previous value (the undo copy),
//! and for 20 s every value whole, no key stored twice, no deleted value coming back, and
//! a counter that loses no increment.
//!
//! Exercises `src/dict/writer.rs` (the writer lock, its takeover and recovery),
//! `src/dict/entry.rs` (the entry seqlock), `src/dict/journal.rs` (the undo copy) and
//! `src/dict/api.rs` (placement, reach, writing back). A
//! writer killed in another pid namespace is in `tests/liveness.rs`.
//!
//! `dict_writer FILTER` runs the tests whose name contains FILTER; `dict_writer --list`
//! lists them.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::dict::{gen_of, make_value, verify};
use common::fork::{fork, xorshift, Child, Shared};
use common::harness::Test;
use common::probe::{
    await_word, cont, header_u64, mapping_base, require_gdb, stop, symbol, GdbStop, Proc, Stage,
};
use common::TempPath;
use shmlock::Error;

const TESTS: &[Test] = &[
    Test::new(
        "a_writer_that_waits_gets_the_next_turn_before_a_writer_writing_back_to_back",
        a_writer_that_waits_gets_the_next_turn,
    ),
    Test::new(
        "a_turn_asked_by_a_writer_stopped_or_killed_lapses",
        a_turn_of_a_stopped_or_killed_writer_lapses,
    ),
    Test::new(
        "a_writer_taken_over_after_its_write_reports_what_it_did",
        a_writer_taken_over_after_its_write_reports_what_it_did,
    ),
    Test::new(
        "a_dict_writer_stopped_inside_place_never_lowers_reach",
        a_dict_writer_stopped_inside_place_never_lowers_reach,
    ),
    Test::new(
        "a_writer_taken_over_before_it_counts_its_entry_leaves_the_count_exact",
        a_writer_taken_over_before_it_counts_its_entry_leaves_the_count_exact,
    ),
    Test::new(
        "a_count_with_a_foreign_tag_is_taken_over_by_the_next_writer",
        a_count_with_a_foreign_tag_is_taken_over_by_the_next_writer,
    ),
    Test::new(
        "a_writer_stopped_mid_write_and_taken_over_leaves_the_count_exact",
        a_writer_stopped_mid_write_and_taken_over_leaves_the_count_exact,
    ),
    Test::new(
        "a_writer_killed_or_stopped_mid_write_leaves_the_previous_value",
        a_writer_killed_or_stopped_mid_write_leaves_the_previous_value,
    ),
    Test::new(
        "a_key_restored_after_a_takeover_keeps_its_rank",
        a_key_restored_after_a_takeover_keeps_its_rank,
    ),
    Test::new(
        "both_undo_copies_held_by_stopped_writers",
        both_undo_copies_held_by_stopped_writers,
    )
    .known_limit(),
    Test::new(
        "dict_chaos_with_sigstop_and_sigkill",
        dict_chaos_with_sigstop_and_sigkill,
    ),
    Test::new(
        "big_dict_takeover_recovery_versus_the_bound",
        big_dict_takeover_recovery_versus_the_bound,
    ),
    Test::new(
        "a_flush_all_longer_than_the_bound_is_not_taken_over",
        a_flush_all_longer_than_the_bound_is_not_taken_over,
    ),
];

fn main() {
    common::harness::run("dict_writer", TESTS, common::harness::no_roles);
}

// ---------------------------------------------------------------------------------------
// The entry count, which a full dict's eviction rests on

/// A dict's layout as the tests read it from the file.
struct Layout {
    seed: u64,
    slot_size: u64,
    registry_len: u64,
    capacity: u64,
}

impl Layout {
    fn of(path: &std::path::Path, capacity: u64) -> Layout {
        let registry = header_u64(path, 72) & 0xffff_ffff;
        Layout {
            seed: header_u64(path, 32),
            slot_size: header_u64(path, 24) & 0xffff_ffff,
            registry_len: (registry * 32).div_ceil(4096) * 4096,
            capacity,
        }
    }
    fn hash(&self, k: &str) -> u64 {
        xxhash_rust::xxh3::xxh3_64_with_seed(k.as_bytes(), self.seed)
    }
    fn home(&self, k: &str) -> u64 {
        ((u128::from(self.hash(k)) * u128::from(self.capacity)) >> 64) as u64
    }
    /// File offset of the control page (after the header and the registry).
    fn control(&self) -> u64 {
        4096 + self.registry_len
    }
    /// File offset of entry `i`.
    fn entry(&self, i: u64) -> u64 {
        self.control() + 4096 + i * self.slot_size
    }
    fn word(&self, path: &std::path::Path, at: u64) -> u64 {
        use std::os::unix::fs::FileExt;
        let mut b = [0u8; 8];
        std::fs::File::open(path)
            .unwrap()
            .read_exact_at(&mut b, at)
            .unwrap();
        u64::from_le_bytes(b)
    }
    /// Whether entry `i` holds a key (its meta word's bit 0).
    fn used(&self, path: &std::path::Path, i: u64) -> bool {
        self.word(path, self.entry(i) + 8) & 1 == 1
    }
    /// The stable entries in use, and the entries mid-write or out of use.
    fn census(&self, path: &std::path::Path) -> (usize, usize) {
        let (mut used, mut unstable) = (0, 0);
        for i in 0..self.capacity {
            if self.word(path, self.entry(i)) & 3 != 0 {
                unstable += 1;
            } else if self.used(path, i) {
                used += 1;
            }
        }
        (used, unstable)
    }
    /// The entry of `key`, or the first free one from its home.
    fn entry_of(&self, path: &std::path::Path, key: &str) -> u64 {
        (0..self.capacity)
            .map(|d| (self.home(key) + d) % self.capacity)
            .find(|&i| !self.used(path, i) || self.word(path, self.entry(i) + 16) == self.hash(key))
            .unwrap()
    }
}

/// The entry count's word with a tag no hold of this file wrote (damage, or a build that
/// did not tag it): the next hold makes it its own, and the count moves again. It froze
/// when the tag read as a later hold's: every change and every recount was refused.
fn a_count_with_a_foreign_tag_is_taken_over_by_the_next_writer() {
    use std::os::unix::fs::FileExt;
    for tag in [0u64, 0x8000_0005, 0xdead_beef, u64::from(u32::MAX)] {
        let path = TempPath::new("dict-count-tag");
        let d = shmlock::SharedDict::open(&path, 64, 16).unwrap();
        let l = Layout::of(&path.0, 64);
        for n in 0..5 {
            d.set(format!("k{n}"), "v", Duration::ZERO).unwrap();
        }
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path.0)
            .unwrap();
        file.write_all_at(&(tag << 32 | 5).to_le_bytes(), l.control() + 2 * 8)
            .unwrap();
        assert_eq!(d.len(), 5);
        for n in 5..40 {
            d.set(format!("k{n}"), "v", Duration::ZERO).unwrap();
        }
        d.delete("k0").unwrap();
        assert_eq!(d.len(), 39, "tag {tag:#x}");
        assert_eq!(d.len(), d.keys(0).unwrap().len());
    }
}

/// A writer W is stopped (gdb) right after it marks an entry for a write (a new key's
/// free entry, an overwrite, a delete), and taken over after the bound: the takeover
/// quarantines that entry (W is alive) and recounts without it. W then resumes, or is
/// killed; later a write empties the quarantined entry. The count must equal the stable
/// entries in use then: it was one too low (the emptied entry, never counted, was taken
/// off), 20 of 20 op and fate combinations in the second review of the count.
fn a_writer_stopped_mid_write_and_taken_over_leaves_the_count_exact() {
    require_gdb();
    for (op, key) in [("set-new", "nk"), ("overwrite", "f3"), ("delete", "f3")] {
        for kill in [false, true] {
            let path = TempPath::new("dict-count-mid-write");
            let d = shmlock::SharedDict::open(&path, 64, 16).unwrap();
            let l = Layout::of(&path.0, 64);
            let never = Duration::ZERO;
            for n in 0..10 {
                d.set(format!("f{n}"), "v", never).unwrap();
            }
            let entry = l.entry_of(&path.0, key);
            let seq = mapping_base(&path.0) as u64 + l.entry(entry) - 4096;
            let shared = Shared::new(4);
            let mut w = Proc::new(fork(|| {
                await_word(&shared, 0, Duration::from_secs(60));
                let r = match op {
                    "delete" => d.delete(key).map(drop),
                    _ => d.set(key, "new", never).map(drop),
                };
                shared
                    .word(2)
                    .store(if r.is_ok() { 1 } else { 2 }, Ordering::SeqCst);
                0
            }));
            // W stops once its mark has changed the entry's seq word
            let gdb = GdbStop::attach_stages(
                w.pid(),
                &[Stage::new(&[format!("watch *(long*){seq:#x}")])],
            );
            shared.word(0).store(1, Ordering::SeqCst);
            assert!(gdb.stopped(Duration::from_secs(30)), "{op}: W never marked");
            assert_eq!(
                d.writer_pid(),
                Some(w.pid() as u32),
                "{op}: W holds the lock"
            );
            d.set("f0", "v2", never).unwrap(); // takes the lock over: an overwrite
            if kill {
                // (killed while traced, then let go: the reaping waits for the tracer)
                common::signal::send(w.pid(), libc::SIGKILL);
                gdb.release();
            } else {
                gdb.release();
                await_word(&shared, 2, Duration::from_secs(10));
            }
            w.wait(Duration::from_secs(10));
            // a write that cleans (empties) the entry: a key whose home it is, set and deleted
            let probe = (0..)
                .map(|n| format!("p{n}"))
                .find(|k| l.home(k) == entry)
                .unwrap();
            d.set(probe.as_str(), "p", never).unwrap();
            d.delete(probe.as_str()).unwrap();
            let (used, unstable) = l.census(&path.0);
            assert_eq!(unstable, 0, "{op}, killed {kill}: an entry left out of use");
            assert_eq!(d.len(), used, "{op}, killed {kill}: the count");
            assert_eq!(
                d.len(),
                d.keys(0).unwrap().len(),
                "{op}, killed {kill}: the keys"
            );
        }
    }
}

/// Forks W, which sets `key` in `d` and then says in word 2 of `shared` how it went (1:
/// `Ok`, 2: `Stalled` naming the key, 3: another error), and holds W (gdb) at its read number `hit` of the word at `offset`
/// bytes into the dict's mapping (which starts after the header: file offset 4096).
fn set_held_at_read(
    d: &shmlock::SharedDict,
    path: &TempPath,
    shared: &Shared,
    offset: u64,
    key: &str,
    hit: usize,
) -> (Proc, GdbStop) {
    let w = Proc::new(fork(|| {
        let base = mapping_base(&path.0) as u64;
        shared.word(1).store(base + offset, Ordering::SeqCst);
        await_word(shared, 0, Duration::from_secs(60));
        let said = match d.set(key, "w", Duration::ZERO) {
            Ok(_) => 1,
            Err(Error::Stalled { key: Some(k), .. }) if k.as_bytes() == key.as_bytes() => 2,
            Err(_) => 3, // another error, or a Stalled that does not name the key
        };
        shared.word(2).store(said, Ordering::SeqCst);
        0
    }));
    let addr = await_word(shared, 1, Duration::from_secs(10));
    let gdb = GdbStop::attach_stages(
        w.pid(),
        &[Stage::new(&[format!("rwatch *(long*){addr:#x}")]).at_hit(hit)],
    );
    shared.word(0).store(1, Ordering::SeqCst);
    assert!(
        gdb.stopped(Duration::from_secs(30)),
        "W never read the word {hit} time(s)"
    );
    (w, gdb)
}

/// A writer W setting a new key is stopped (gdb) at its read of the entry count in
/// `place`, before it counts the free entry it is about to take. P takes the writer lock
/// over after the bound and recounts. W resumes: it must not add its entry to the count
/// (its store fails: it was taken over, and the entry stays free). A count one too high
/// made a full-looking dict evict a live key from a set whose window had a free entry
/// (the adversarial review of the full-dict eviction found it: 7 of 7 runs).
///
/// Then the same with W stopped at its next read of the count, after its store, where it
/// is about to count the entry (and, its hold having taken the lock free, to tag the
/// count as its own); P takes over with a delete: P's recount has W's entry, and W must
/// not add it a second time.
fn a_writer_taken_over_before_it_counts_its_entry_leaves_the_count_exact() {
    // the count's reads in a set of a new key: place's "is the dict full" (1), then the
    // change of the count once the entry is stored (2)
    count_exact_after_a_takeover_at_read(1);
    count_exact_after_a_takeover_at_read(2);
}

fn count_exact_after_a_takeover_at_read(hit: usize) {
    require_gdb();
    let path = TempPath::new("dict-count");
    let d = shmlock::SharedDict::open(&path, 64, 16).unwrap();
    let l = Layout::of(&path.0, 64);
    let never = Duration::ZERO;
    let mut n = 0;
    while d.len() < 63 {
        d.set(format!("f{n}"), "v", never).unwrap();
        n += 1;
    }
    assert_eq!(d.evictions(), 0);
    let free: Vec<u64> = (0..64).filter(|&i| !l.used(&path.0, i)).collect();
    assert_eq!(free.len(), 1, "one free entry");
    let f = free[0];
    // a new key whose LRU sample (8 entries from its home) misses the free entry
    let far = |k: &str| (f + 64 - l.home(k)) % 64 >= 12;
    let b = (0..).map(|i| format!("b{i}")).find(|k| far(k)).unwrap();
    let before: Vec<Vec<u8>> = d.keys(0).unwrap();
    let shared = Shared::new(4);
    let count = l.control() - 4096 + 2 * 8;
    let (mut w, gdb) = set_held_at_read(&d, &path, &shared, count, "a-new-key", hit);
    assert_eq!(d.writer_pid(), Some(w.pid() as u32), "W holds the lock");
    if hit == 1 {
        d.set("f0", "v2", never).unwrap(); // takes the lock over (an overwrite: no count change)
    } else {
        // takes the lock over, and takes the count below the capacity, which bounds it: a
        // second count of W's entry would show
        assert!(d.delete("f1").unwrap());
    }
    gdb.release();
    let said = await_word(&shared, 2, Duration::from_secs(10));
    w.wait(Duration::from_secs(10));
    let stored = d.keys(0).unwrap().len();
    note!(
        "[read {hit}: W said {said}, count {} for {stored} keys] ",
        d.len()
    );
    assert_eq!(
        d.len(),
        stored,
        "the count drifted (W said {said}: 2 is Stalled)"
    );
    // (so that each stop is where it says: before W's store, or after it)
    let expected = if hit == 1 { 2 } else { 1 };
    assert_eq!(
        said, expected,
        "W stopped at read {hit} said {said} (1: its set stood, 2: Stalled naming its key, 3: another error)"
    );
    assert!(
        !l.used(&path.0, f) || said == 1,
        "W's entry holds its key only if W's set stood"
    );
    if said == 2 {
        // the free entry is free, and the dict knows it: a set whose sample misses it
        // stores there, evicting nothing
        assert!(!d.set(b.as_str(), "b", never).unwrap().forcible);
        assert_eq!(d.evictions(), 0);
        let after: Vec<Vec<u8>> = d.keys(0).unwrap();
        assert!(
            before.iter().all(|k| after.contains(k)),
            "a live key was evicted"
        );
    }
}

// ---------------------------------------------------------------------------------------
// The dict's reach is raised with a plain store, by writers that may have been taken over

/// A writer W is stopped (by a debugger, standing in for SIGSTOP or an overloaded machine)
/// inside `place`, between its load of the home's reach and its store of the new reach.
/// Another process takes the writer lock over after the bound and stores two keys of the
/// same home farther out (reach 2). W resumes: it must not lower the reach (the key at
/// distance 2 would become invisible, a `set` of it would make a second entry, and after
/// `delete` the other value would come back).
fn a_dict_writer_stopped_inside_place_never_lowers_reach() {
    require_gdb();
    let path = TempPath::new("dict-reach");
    let d = shmlock::SharedDict::open(&path, 64, 16).unwrap();
    let seed = header_u64(&path.0, 32);
    let slot_size = header_u64(&path.0, 24) & 0xffff_ffff;
    let registry = header_u64(&path.0, 72) & 0xffff_ffff;
    let registry_len = (registry * 32).div_ceil(4096) * 4096;
    let hash = |k: &str| xxhash_rust::xxh3::xxh3_64_with_seed(k.as_bytes(), seed);
    let home = |k: &str| ((u128::from(hash(k)) * 64) >> 64) as u64;
    // four keys of one home, and of one bit of its filter (so that each store reads the
    // reach in its lookup before it raises it, as the breakpoint below counts)
    let mut by_home: std::collections::HashMap<(u64, u64), Vec<String>> = Default::default();
    let keys = (0..)
        .find_map(|n| {
            let k = format!("key{n}");
            let v = by_home.entry((home(&k), hash(&k) & 31)).or_default();
            v.push(k);
            (v.len() == 4).then(|| v.clone())
        })
        .unwrap();
    let h = home(&keys[0]);
    let (x, k1, k2, k3) = (&keys[0], &keys[1], &keys[2], &keys[3]);
    let never = Duration::ZERO;
    d.set(x.as_str(), "x", never).unwrap(); // distance 0
    let shared = Shared::new(4);
    // W is held at its second read of the reach.
    let reach = registry_len + 4096 + h * slot_size + 6 * 8; // past the control page
    let (mut w, gdb) = set_held_at_read(&d, &path, &shared, reach, k1, 2);
    assert_eq!(
        d.writer_pid(),
        Some(w.pid() as u32),
        "W should hold the writer lock"
    );
    // After the bound, take the lock over and fill distances 1 and 2 of the home.
    let t0 = Instant::now();
    d.set(k3.as_str(), "k3", never).unwrap();
    let took_over = t0.elapsed();
    d.set(k2.as_str(), "old", never).unwrap();
    let before = d.get(k2.as_str()).unwrap().map(|i| i.value);
    gdb.release();
    await_word(&shared, 2, Duration::from_secs(10));
    let _ = w.wait(Duration::from_secs(10));
    let after_resume = d.get(k2.as_str()).unwrap().map(|i| i.value);
    d.set(k2.as_str(), "new", never).unwrap();
    let after_set = d.get(k2.as_str()).unwrap().map(|i| i.value);
    let copies = d
        .keys(0)
        .unwrap()
        .iter()
        .filter(|k| k.as_slice() == k2.as_bytes())
        .count();
    let existed = d.delete(k2.as_str()).unwrap();
    let after_delete = d.get(k2.as_str()).unwrap().map(|i| i.value);
    let show = |v: &Option<shmlock::Value>| match v {
        Some(shmlock::Value::Bytes(b)) => String::from_utf8_lossy(b).into_owned(),
        Some(other) => format!("{other:?}"),
        None => "absent".into(),
    };
    note!(
        "[home {h}; took over after {took_over:.2?}; get(k2): {} before W resumed, {} after; \
         after set(\"new\"): {}; {copies} entries of k2; delete said {existed}, then get: {}] ",
        show(&before),
        show(&after_resume),
        show(&after_set),
        show(&after_delete)
    );
    assert_eq!(show(&after_resume), "old", "a stored key became invisible");
    assert_eq!(copies, 1, "two entries for one key");
    assert_eq!(
        show(&after_set),
        "new",
        "get returned an older value after set"
    );
    assert_eq!(
        show(&after_delete),
        "absent",
        "a value came back after delete"
    );
}

/// A writer stopped (gdb) after its pop was written, before it let the writer lock go, is
/// taken over by a push; when it resumes its pop reports the element it took (before:
/// `Stalled`, as if nothing happened, while the element was gone: a retry would pop
/// another, and a retried push stored its element twice).
fn a_writer_taken_over_after_its_write_reports_what_it_did() {
    require_gdb();
    let path = TempPath::new("dict-late-release");
    let d = shmlock::SharedDict::open(&path, 64, 64).unwrap();
    d.rpush("q", "a").unwrap();
    d.rpush("q", "b").unwrap();
    let shared = Shared::new(2);
    let mut w = Proc::new(fork(|| {
        await_word(&shared, 0, Duration::from_secs(60));
        let said = match d.rpop("q") {
            Ok(Some(shmlock::Value::Bytes(b))) if b == b"b" => 1,
            Err(Error::Stalled { .. }) => 2,
            _ => 3,
        };
        shared.word(1).store(said, Ordering::SeqCst);
        0
    }));
    let gdb = GdbStop::attach(
        w.pid(),
        &[format!("break {}", symbol("6writer7Writing6unlock"))],
    );
    shared.word(0).store(1, Ordering::SeqCst);
    assert!(
        gdb.stopped(Duration::from_secs(30)),
        "W never got to release"
    );
    assert_eq!(
        d.writer_pid(),
        Some(w.pid() as u32),
        "W holds the writer lock"
    );
    d.rpush("q", "c").unwrap(); // takes the writer lock over after the bound
    gdb.release();
    let said = await_word(&shared, 1, Duration::from_secs(10));
    let _ = w.wait(Duration::from_secs(10));
    let mut left = Vec::new();
    while let Some(v) = d.lpop("q").unwrap() {
        left.push(v);
    }
    note!(
        "[W said {said}; {} takeover(s); left {left:?}] ",
        d.repairs()
    );
    let b = |s: &str| shmlock::Value::Bytes(s.as_bytes().to_vec());
    assert_eq!(left, vec![b("a"), b("c")], "the pop was made");
    assert_eq!(
        said, 1,
        "the pop was made but W was told 2 (Stalled) or 3 (other)"
    );
}

// ---------------------------------------------------------------------------------------
// The undo copy: a key keeps its previous value when its writer dies or stalls mid-write

/// A child rewrites a big value (up to 256 KiB, so that most signals land inside a write)
/// and counts with `incr` in a loop; the parent SIGKILLs it (140 rounds) or SIGSTOPs it
/// past the bound (6 rounds) at random moments. After each: a reader, before anyone takes
/// the lock over, and again after a writer did, finds the big value whole (the old one or
/// the new) and the counter at what the child last saw or one more (or, once a stopped
/// child resumed and counts on, between that and what it saw after the read), never absent
/// and never restarted.
fn a_writer_killed_or_stopped_mid_write_leaves_the_previous_value() {
    use shmlock::{SharedDict, Value};
    const MAX: usize = 256 * 1024;
    const KILLS: usize = 140;
    const STOPS: usize = 6;
    let path = TempPath::new("dict-undo");
    let d = SharedDict::open(&path, 64, MAX).unwrap();
    d.set("big", &make_value(1, 1, MAX), Duration::ZERO)
        .unwrap();
    assert_eq!(d.incr("n", 1, Some(0), Duration::ZERO).unwrap(), 1);
    // word 0: the last sum the child's incr returned; word 1: the child is writing
    let shared = Shared::new(2);
    shared.word(0).store(1, Ordering::SeqCst);
    let (mut x, mut held, mut gen) = (0x5eed_u64, [0usize; 2], 1u64);
    let check = |when: &str, round: usize| {
        let big = d.get("big").unwrap();
        let whole = big
            .as_ref()
            .and_then(|i| i.value.as_bytes())
            .is_some_and(|v| verify(1, v));
        assert!(whole, "round {round}, {when}: the big value is {big:?}");
        // a resumed child counts on while this reads: its sum before the read and after
        let seen = shared.word(0).load(Ordering::SeqCst) as i64;
        let n = d.get("n").unwrap().map(|i| i.value);
        let later = shared.word(0).load(Ordering::SeqCst) as i64;
        assert!(
            matches!(n, Some(Value::Int(n)) if n >= seen && n <= later + 1),
            "round {round}, {when}: the counter reads {n:?}, its writer last saw {seen} \
             (then {later})"
        );
    };
    for round in 0..KILLS + STOPS {
        gen += 1_000_000;
        let child = {
            let (d, shared) = (&d, &shared);
            fork(move || {
                // made first: the loop spends its time inside the dict's writes
                let mut x = gen;
                let values: Vec<Vec<u8>> = (0..8)
                    .map(|g| {
                        make_value(1, gen + g, MAX / 2 + xorshift(&mut x) as usize % (MAX / 2))
                    })
                    .collect();
                shared.word(1).store(1, Ordering::SeqCst);
                for value in values.iter().cycle() {
                    match d.set("big", value, Duration::ZERO) {
                        Ok(_) | Err(Error::Stalled { .. }) => {}
                        Err(_) => return 1,
                    }
                    match d.incr("n", 1i64, None, Duration::ZERO) {
                        Ok(n) => shared.word(0).store(n as u64, Ordering::SeqCst),
                        Err(Error::Stalled { .. }) => {}
                        Err(_) => return 2,
                    }
                }
                0
            })
        };
        await_word(&shared, 1, Duration::from_secs(30));
        shared.word(1).store(0, Ordering::SeqCst);
        std::thread::sleep(Duration::from_micros(200 + xorshift(&mut x) % 3000));
        let stop = round >= KILLS;
        if stop {
            common::signal::send(child.0, libc::SIGSTOP);
        } else {
            child.kill();
        }
        let mid_write = d.writer_pid() == Some(child.0 as u32);
        held[usize::from(stop)] += usize::from(mid_write);
        check(if stop { "stopped" } else { "killed" }, round);
        // a write takes the lock over (after the bound, from the stopped child), and
        // writes the copy back or stores it elsewhere
        d.set("other", "x", Duration::ZERO).unwrap();
        check("after a takeover", round);
        if stop {
            cont(child.0);
            std::thread::sleep(Duration::from_millis(2));
            check("after the stopped writer resumed", round);
            child.kill();
        }
        // the counter's value is the child's last sum, or one more (an incr that ended
        // as it was killed): from here the parent's own increments count
        let n = d.get("n").unwrap().and_then(|i| i.value.as_int()).unwrap();
        shared.word(0).store(n as u64, Ordering::SeqCst);
    }
    note!(
        "[{KILLS} kills, {} of them holding the writer lock; {STOPS} stops past the bound, {} \
         holding it; {} takeovers] ",
        held[0],
        held[1],
        d.repairs()
    );
    assert!(
        held[0] >= KILLS / 4 && held[1] >= 1,
        "too few signals landed inside a write to show anything"
    );
    let keys = d.keys(0).unwrap();
    let uniq: std::collections::HashSet<_> = keys.iter().collect();
    assert_eq!(uniq.len(), keys.len(), "a key stored twice");
}

/// A child rewrites k7 of a full 8-entry dict over and over and is SIGSTOPped, often in the
/// middle of a write; this process then reads k0, and stores new keys (the first takes the
/// writer lock over past the bound, and k7's previous value is stored again from its undo
/// copy, elsewhere, the stopped writer's entry being quarantined) until k0 or k7 is
/// evicted. k7's last use (its last whole store) came before the read of k0, so k7 must go
/// first: a restore is not a use (it once stamped k7 as just stored, and k0 went).
fn a_key_restored_after_a_takeover_keeps_its_rank() {
    use shmlock::SharedDict;
    const MAX: usize = 64 * 1024;
    let shared = Shared::new(1);
    let (mut x, mut rounds, mut mid_write) = (0x7e57_u64, 0, 0);
    while mid_write < 3 {
        rounds += 1;
        assert!(
            rounds <= 40,
            "{mid_write} of {rounds} stops landed inside a write"
        );
        let path = TempPath::new("dict-restore-rank");
        let d = SharedDict::open(&path, 8, MAX).unwrap();
        for i in 0..8 {
            d.set(format!("k{i}"), &make_value(i, 1, 100)[..], Duration::ZERO)
                .unwrap();
        }
        let child = {
            let (d, shared) = (&d, &shared);
            fork(move || {
                let value = make_value(7, 2, MAX);
                shared.word(0).store(1, Ordering::SeqCst);
                loop {
                    match d.set("k7", &value[..], Duration::ZERO) {
                        Ok(_) | Err(Error::Stalled { .. }) => {}
                        Err(_) => return 1,
                    }
                }
            })
        };
        await_word(&shared, 0, Duration::from_secs(30));
        shared.word(0).store(0, Ordering::SeqCst);
        std::thread::sleep(Duration::from_micros(500 + xorshift(&mut x) % 2000));
        common::signal::send(child.0, libc::SIGSTOP);
        mid_write += usize::from(d.writer_pid() == Some(child.0 as u32));
        assert!(d.get("k0").unwrap().is_some());
        let mut n = 0;
        let gone = loop {
            n += 1;
            assert!(n < 100, "neither k0 nor k7 was ever evicted");
            d.set(format!("new{n}"), "v", Duration::ZERO).unwrap();
            let keys = d.keys(0).unwrap();
            let kept = |k: &str| keys.iter().any(|key| key == k.as_bytes());
            match (kept("k0"), kept("k7")) {
                (true, true) => continue,
                (k0, k7) => break (k0, k7),
            }
        };
        cont(child.0);
        child.kill();
        assert_eq!(gone, (true, false), "round {rounds}: k0 went before k7");
    }
    note!("[{mid_write} of {rounds} stops inside a write] ");
}

/// A known limit. Writers W1 and W2 are each stopped by gdb while filling one of the dict's
/// two undo copies, and taken over there: both copies stay out of use while they may still
/// store into them. W3 then rewrites "k" with no copy to be had, and is killed after it
/// marked the entry, before it wrote: "k" has no value left (the promise: its previous
/// one).
fn both_undo_copies_held_by_stopped_writers() {
    use shmlock::{SharedDict, Value};
    require_gdb();
    let path = TempPath::new("dict-both-copies");
    let d = SharedDict::open(&path, 64, 64).unwrap();
    for key in ["a", "b", "k"] {
        d.set(key, "before", Duration::ZERO).unwrap();
    }
    let shared = Shared::new(3);
    let writer = |key: &'static str, go: usize| {
        let (d, shared) = (&d, &shared);
        fork(move || {
            await_word(shared, go, Duration::from_secs(60));
            let _ = d.set(key, "after", Duration::ZERO);
            0
        })
    };
    let mut held = Vec::new();
    for (n, key) in ["a", "b"].into_iter().enumerate() {
        let w = Proc::new(writer(key, n));
        let gdb = GdbStop::attach(
            w.pid(),
            &[format!("break {}", symbol("5entry5Entry7copy_to"))],
        );
        shared.word(n).store(1, Ordering::SeqCst);
        assert!(
            gdb.stopped(Duration::from_secs(30)),
            "W{} never filled a copy",
            n + 1
        );
        // takes the lock over after the bound; the copy W is filling goes out of use
        d.set("other", "x", Duration::ZERO).unwrap();
        held.push((w, gdb));
    }
    let mut w3 = Proc::new(writer("k", 2));
    let gdb = GdbStop::attach(
        w3.pid(),
        &[format!("break {}", symbol("6writer7Writing10still_mine"))],
    );
    shared.word(2).store(1, Ordering::SeqCst);
    assert!(
        gdb.stopped(Duration::from_secs(30)),
        "W3 never marked its entry"
    );
    // killed while gdb holds it; gdb lets it go (dead) before it can be reaped
    common::signal::send(w3.pid(), libc::SIGKILL);
    gdb.release();
    let _ = w3.wait(Duration::from_secs(10));
    let k = d.get("k").unwrap().map(|i| i.value);
    for (mut w, gdb) in held {
        gdb.release();
        let _ = w.wait(Duration::from_secs(10));
    }
    note!("[\"k\" after W3 was killed: {k:?}] ");
    assert_eq!(
        k,
        Some(Value::Bytes(b"before".to_vec())),
        "the key lost its value"
    );
}

// ---------------------------------------------------------------------------------------
// Dict chaos: writers SIGSTOPped past the bound and SIGKILLed; readers check every value,
// a controller checks delete, set-then-get and duplicates; counters are tallied.

const DKEYS: u64 = 48;
fn dmax() -> usize {
    std::env::var("SHMLOCK_DICT_MAX")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4096)
}

fn dict_chaos_with_sigstop_and_sigkill() {
    use shmlock::{SharedDict, Value};
    let secs: u64 = std::env::var("SHMLOCK_CHAOS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    const WRITERS: usize = 3;
    let path = TempPath::new("dict-chaos");
    let d = SharedDict::open(&path, 32, dmax()).unwrap();
    let cpath = TempPath::new("dict-chaos-counters");
    let c = SharedDict::open(&cpath, 64, 8).unwrap();
    let stop_flag = Shared::new(1);
    // 0 writes, 1 good reads, 2 torn, 3 incr ok, 4 controller rounds, 5 resurrections,
    // 6 stale reads, 7 duplicates, 8 reader/controller errors, 9 stalled errors,
    // 10 incrs that created the counter (returned 1: the first, and one per restart)
    let k = Shared::new(16);
    let writer = |seed: u64| {
        let (d, c, stop_flag, k) = (&d, &c, &stop_flag, &k);
        fork(move || {
            let mut x = seed | 1;
            while stop_flag.word(0).load(Ordering::Relaxed) == 0 {
                let key = (xorshift(&mut x) % DKEYS) as u32;
                let len = 24 + (xorshift(&mut x) as usize % (dmax() - 24));
                match d.set(format!("t:{key}"), &make_value(key, x, len), Duration::ZERO) {
                    Ok(_) => {
                        k.word(0).fetch_add(1, Ordering::Relaxed);
                    }
                    Err(Error::Stalled { .. }) => {
                        k.word(9).fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        eprintln!("set: {e}");
                        return 1;
                    }
                }
                match c.incr("count", 1, Some(0), Duration::ZERO) {
                    Ok(sum) => {
                        if sum == 1 {
                            k.word(10).fetch_add(1, Ordering::Relaxed);
                        }
                        k.word(3).fetch_add(1, Ordering::Relaxed);
                    }
                    Err(Error::Stalled { .. }) => {
                        k.word(9).fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        eprintln!("incr: {e}");
                        return 1;
                    }
                }
            }
            0
        })
    };
    let mut writers: Vec<Child> = (0..WRITERS as u64).map(|i| writer(i + 1)).collect();
    let readers: Vec<Child> = (0..2u64)
        .map(|i| {
            let (d, stop_flag, k) = (&d, &stop_flag, &k);
            fork(move || {
                let mut x = 77 + i;
                while stop_flag.word(0).load(Ordering::Relaxed) == 0 {
                    let key = (xorshift(&mut x) % DKEYS) as u32;
                    match d.get(format!("t:{key}")) {
                        Ok(Some(item)) => {
                            let ok = item.value.as_bytes().is_some_and(|v| verify(key, v));
                            k.word(if ok { 1 } else { 2 })
                                .fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(None) => {}
                        Err(e) => {
                            eprintln!("get: {e}");
                            k.word(8).fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                0
            })
        })
        .collect();
    // The controller: never stopped.
    let controller = {
        let (d, stop_flag, k) = (&d, &stop_flag, &k);
        fork(move || {
            let mut gen = 1u64;
            while stop_flag.word(0).load(Ordering::Relaxed) == 0 {
                let key = 1000 + (gen % 8) as u32;
                let name = format!("r:{key}");
                let v = make_value(key, gen, 64);
                if d.set(name.as_str(), &v, Duration::ZERO).is_err() {
                    gen += 1;
                    continue;
                }
                match d.get(name.as_str()) {
                    Ok(Some(item)) => {
                        let b = item.value.as_bytes().unwrap();
                        if !verify(key, b) || gen_of(b) != gen {
                            k.word(6).fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Ok(None) => {} // evicted meanwhile
                    Err(_) => {
                        k.word(8).fetch_add(1, Ordering::Relaxed);
                    }
                }
                if d.delete(name.as_str()).is_err() {
                    gen += 1;
                    continue;
                }
                for _ in 0..3 {
                    if let Ok(Some(_)) = d.get(name.as_str()) {
                        k.word(5).fetch_add(1, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_micros(200));
                }
                // A listing is no snapshot: a writer's key evicted from one slot and stored
                // again in a later one can show twice. The controller's own keys cannot move
                // while it lists (only it stores them), so twice means two entries.
                if gen.is_multiple_of(64) {
                    if let Ok(keys) = d.keys(0) {
                        let mut seen = std::collections::HashSet::new();
                        for key in keys.into_iter().filter(|k| k.starts_with(b"r:")) {
                            if !seen.insert(key) {
                                k.word(7).fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }
                k.word(4).fetch_add(1, Ordering::Relaxed);
                gen += 1;
            }
            0
        })
    };
    let mut stopped: Vec<Option<Instant>> = vec![None; WRITERS];
    let deadline = Instant::now() + Duration::from_secs(secs);
    let (mut kills, mut stops, mut x, mut seed) = (0u64, 0u64, 0xfeed_u64, 1000u64);
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_micros(xorshift(&mut x) % 30_000));
        for (i, s) in stopped.iter_mut().enumerate() {
            if s.is_some_and(|until| Instant::now() >= until) {
                cont(writers[i].0);
                *s = None;
            }
        }
        let victim = (xorshift(&mut x) % WRITERS as u64) as usize;
        if stopped[victim].is_some() {
            continue;
        }
        if xorshift(&mut x).is_multiple_of(3) {
            writers[victim].kill();
            kills += 1;
            seed += 1;
            writers[victim] = writer(seed);
        } else {
            common::signal::send(writers[victim].0, libc::SIGSTOP);
            stops += 1;
            stopped[victim] =
                Some(Instant::now() + Duration::from_millis(600 + xorshift(&mut x) % 900));
        }
    }
    for (i, s) in stopped.iter().enumerate() {
        if s.is_some() {
            cont(writers[i].0);
        }
    }
    stop_flag.word(0).store(1, Ordering::SeqCst);
    for ch in writers
        .iter()
        .chain(&readers)
        .chain(std::iter::once(&controller))
    {
        assert_eq!(
            ch.wait(Duration::from_secs(60)),
            0,
            "a worker failed or hung"
        );
    }
    let w = |i| k.word(i).load(Ordering::SeqCst);
    let count = match c.get("count").unwrap() {
        Some(item) => match item.value {
            Value::Int(n) => n,
            _ => -1,
        },
        None => -2,
    };
    note!(
        "[{secs}s: {stops} stops, {kills} kills, {} repairs; {} sets, {} stalled, {} good reads, \
         {} torn, {} controller rounds, {} resurrections, {} stale reads, {} duplicates, {} \
         errors; counter {count} vs {} incr Ok (+ at most {kills} in flight), {} counter creations, \
         {} counter-dict repairs, {} counter keys] ",
        d.repairs(),
        w(0),
        w(9),
        w(1),
        w(2),
        w(4),
        w(5),
        w(6),
        w(7),
        w(8),
        w(3),
        w(10),
        c.repairs(),
        c.keys(0).unwrap().len()
    );
    assert!(w(1) > 0 && w(4) > 0 && stops > 0);
    assert_eq!((w(2), w(5), w(6), w(7), w(8)), (0, 0, 0, 0, 0));
    let keys = d.keys(0).unwrap();
    let uniq: std::collections::HashSet<_> = keys.iter().collect();
    assert_eq!(uniq.len(), keys.len(), "duplicate keys at the end");
    assert_eq!(c.keys(0).unwrap().len(), 1, "the counter has one entry");
    // Every takeover writes the counter's undo copy back (or stores it elsewhere): it is
    // created once and never starts again from its init.
    assert_eq!(w(10), 1, "the counter was created again: it lost its value");
    assert!(
        count >= w(3) as i64 && count <= (w(3) + kills + w(9)) as i64,
        "the counter lost or gained increments"
    );
}

// ---------------------------------------------------------------------------------------
// The dict's takeover scans every entry under the lock; the bound is 500 ms

/// A big dict (SHMLOCK_BIG_DICT entries, default 4M): how long a takeover's recovery holds
/// the writer lock, and what two writers that keep writing make of it once it exceeds the
/// bound (each takes the lock over from the other while it is still recovering).
fn big_dict_takeover_recovery_versus_the_bound() {
    use shmlock::SharedDict;
    let Some(n) = std::env::var("SHMLOCK_BIG_DICT")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
    else {
        note!("[set SHMLOCK_BIG_DICT=16000000 to run: it needs ~2 GiB of /dev/shm] ");
        return;
    };
    let path = TempPath::new("big-dict");
    let d = SharedDict::options()
        .capacity(n)
        .max_key_len(8)
        .max_value_len(8)
        .open(&path)
        .unwrap();
    // A writer stopped holding the lock, then killed: the next writer takes over.
    let t0 = Instant::now();
    let w = fork(|| loop {
        let _ = d.set("a", "b", Duration::ZERO);
    });
    let mut x = 1u64;
    loop {
        std::thread::sleep(Duration::from_micros(xorshift(&mut x) % 500));
        stop(w.0);
        if d.writer_pid() == Some(w.0 as u32) {
            break;
        }
        cont(w.0);
    }
    w.kill();
    let t1 = Instant::now();
    d.set("c", "d", Duration::ZERO).unwrap();
    let recover = t1.elapsed();
    // A second takeover after a stop of 600 ms, with two live writers waiting.
    let ok = Shared::new(4);
    let spawn = |slot: usize| {
        let (d, ok) = (&d, &ok);
        fork(move || {
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                match d.set(format!("w{slot}"), "v", Duration::ZERO) {
                    Ok(_) => ok.word(slot).fetch_add(1, Ordering::Relaxed),
                    Err(_) => ok.word(2 + slot).fetch_add(1, Ordering::Relaxed),
                };
            }
            0
        })
    };
    let staller = fork(|| loop {
        let _ = d.set("s", "t", Duration::ZERO);
    });
    loop {
        std::thread::sleep(Duration::from_micros(xorshift(&mut x) % 500));
        stop(staller.0);
        if d.writer_pid() == Some(staller.0 as u32) {
            break;
        }
        cont(staller.0);
    }
    let (a, b) = (spawn(0), spawn(1));
    std::thread::sleep(Duration::from_millis(700));
    staller.kill();
    a.wait(Duration::from_secs(60));
    b.wait(Duration::from_secs(60));
    let w = |i| ok.word(i).load(Ordering::SeqCst);
    note!(
        "[{n} entries (setup {:.1?}): a takeover's recovery held the lock {recover:.2?}; then \
         10 s of two writers: {} + {} sets ok, {} + {} failed (Stalled); {} repairs] ",
        t1 - t0,
        w(0),
        w(1),
        w(2),
        w(3),
        d.repairs()
    );
    assert!(
        recover < Duration::from_millis(500),
        "recovery outlasts the bound"
    );
    assert!(
        w(0) + w(1) > 100,
        "writers livelock taking the lock over from each other"
    );
}

/// `flush_all` walks every entry in one hold of the writer lock; on a dict of a million
/// entries that is longer than the stall bound, and a writer waiting meanwhile took the
/// working holder for a stalled one: the flush stopped half done with `Stalled` (on 12 M
/// entries in a release build too). A long pass now moves the lock's word on as it goes.
fn a_flush_all_longer_than_the_bound_is_not_taken_over() {
    use shmlock::SharedDict;
    let filled = |name: &str, n: usize| {
        let path = TempPath::new(name);
        let d = SharedDict::options()
            .capacity(n)
            .max_key_len(8)
            .max_value_len(8)
            .open(&path)
            .unwrap();
        for i in 0..n * 9 / 10 {
            d.set(format!("{i:x}"), "v", Duration::ZERO).unwrap();
        }
        (path, d)
    };
    // The flush must outlast the bound: sized by a small flush's pace (1.5 M entries in
    // the debug build the suite uses, the most a dict takes, 16 M, in a release build).
    let pace = {
        let (_path, d) = filled("flush-all-pace", 200_000);
        let t = Instant::now();
        d.flush_all().unwrap();
        t.elapsed().max(Duration::from_millis(1))
    };
    let wanted = 200_000.0 * 0.9 / pace.as_secs_f64();
    let n = wanted.clamp(1.5e6, 1.6e7) as usize;
    let (_path, d) = filled("flush-all-long", n);
    // Faster still (a release build): the flush shares its CPU with spinners, as a
    // holder on a busy machine does.
    let _crowd = Crowd::of((wanted / n as f64).ceil() as usize - 1);
    let keys = n * 9 / 10;
    // (a window that fills evicts: most of them are there)
    assert!(d.len() > keys * 9 / 10, "{} of {keys} keys stored", d.len());
    let started = Shared::new(1);
    let other = {
        let (d, started) = (&d, &started);
        fork(move || loop {
            let _ = d.set("other", "x", Duration::ZERO);
            started.word(0).store(1, Ordering::SeqCst);
        })
    };
    await_word(&started, 0, Duration::from_secs(10));
    let t = Instant::now();
    let flushed = d.flush_all();
    let took = t.elapsed();
    other.kill();
    note!("[flush_all of about {keys} keys beside a writer: {took:.2?}] ");
    flushed.unwrap_or_else(|e| panic!("flush_all after {took:?}: {e}"));
    // (else the test proves nothing: the flush must outlast the bound)
    assert!(
        took > Duration::from_millis(550),
        "flush_all took {took:?}: a dict of {n} entries is too small here"
    );
    let live = d.keys(0).unwrap();
    assert!(
        live.iter().all(|k| k == b"other"),
        "{} keys left live",
        live.len()
    );
}

/// `k` spinning children sharing this process's CPU (both pinned to the one it runs on),
/// so that what it does takes about `k + 1` times as long on the wall clock. Dropped, they
/// are killed and the process runs anywhere again.
struct Crowd {
    spinners: Vec<Child>,
    was: Option<libc::cpu_set_t>,
}

impl Crowd {
    fn of(k: usize) -> Crowd {
        if k == 0 {
            return Crowd {
                spinners: Vec::new(),
                was: None,
            };
        }
        let size = std::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: a zeroed cpu_set_t is an empty set; the calls write within `size` bytes
        // of sets we own.
        let was = unsafe {
            let mut was: libc::cpu_set_t = std::mem::zeroed();
            assert_eq!(libc::sched_getaffinity(0, size, &mut was), 0);
            let mut one: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(libc::sched_getcpu().max(0) as usize, &mut one);
            assert_eq!(libc::sched_setaffinity(0, size, &one), 0);
            was
        };
        let spinners = (0..k)
            .map(|_| {
                fork(|| loop {
                    std::hint::spin_loop();
                })
            })
            .collect();
        Crowd {
            spinners,
            was: Some(was),
        }
    }
}

impl Drop for Crowd {
    fn drop(&mut self) {
        for s in &self.spinners {
            s.kill();
        }
        if let Some(was) = &self.was {
            // SAFETY: `was` is the set read in `of`.
            unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), was) };
        }
    }
}

/// Word of the control page where a waiting writer asks for the lock's next turn (`TURN`
/// in `src/dict/api.rs`): its owner id, marked, in the low half.
const TURN_WORD: u64 = 13;

/// A writer that adds 1 to key `n` back to back, until word 0 of `s` is set.
fn back_to_back(d: &shmlock::SharedDict, s: &Shared) -> Child {
    fork(|| {
        while s.word(0).load(Ordering::SeqCst) == 0 {
            d.incr("n", 1i64, Some(0), Duration::ZERO).unwrap();
        }
        0
    })
}

/// Stops `h` at a moment it holds the dict's writer lock.
fn stop_holding(d: &shmlock::SharedDict, h: &Child) {
    for _ in 0..10_000 {
        stop(h.0);
        if d.writer_pid() == Some(h.0 as u32) {
            return;
        }
        cont(h.0);
        std::thread::sleep(Duration::from_micros(200));
    }
    panic!("{} never stopped holding the writer lock", h.0);
}

/// Waits until a writer asked for the lock's next turn.
fn await_turn(path: &std::path::Path) {
    let at = Layout::of(path, 64).control() + TURN_WORD * 8;
    let deadline = Instant::now() + Duration::from_secs(60);
    while header_u64(path, at) & 0xffff_ffff == 0 {
        assert!(Instant::now() < deadline, "no writer asked for a turn");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A writer that waited is not kept out by another process writing back to back, which
/// took the lock again at each release before the writer it woke could run (here, 1 to
/// 995 more of its writes came first). The back-to-back writer (adding 1
/// to `n`) is stopped holding the lock, another process's write waits (sleeps, wakes,
/// asks for a turn), the first is continued: the waiter's write (adding 0 to `n`, which
/// reads the count under the lock) comes right after the one the first was stopped in,
/// ten rounds out of ten.
fn a_writer_that_waits_gets_the_next_turn() {
    let path = TempPath::new("dict-turn");
    let d = shmlock::SharedDict::open(&path.0, 64, 16).unwrap();
    let s = Shared::new(4);
    // (stored before: the writer stopped in its first add would leave `n` absent, as a
    // write stopped in the middle leaves the value it had)
    d.set("n", 0i64, Duration::ZERO).unwrap();
    let h = back_to_back(&d, &s);
    let count = |d: &shmlock::SharedDict| match d.get("n").unwrap().map(|i| i.value) {
        Some(shmlock::Value::Int(n)) => n,
        other => panic!("n: {other:?}"),
    };
    let mut between = Vec::new();
    for _ in 0..10 {
        stop_holding(&d, &h);
        // (the add it was stopped in may be published or not)
        let stopped_at = count(&d);
        let w = {
            let (d, s) = (&d, &s);
            fork(move || {
                let n = d.incr("n", 0i64, Some(0), Duration::ZERO).unwrap();
                s.word(2).store(n as u64 + 1, Ordering::SeqCst);
                0
            })
        };
        await_turn(&path.0);
        cont(h.0);
        assert_eq!(w.wait(Duration::from_secs(60)), 0);
        between.push(s.word(2).swap(0, Ordering::SeqCst) as i64 - 1 - stopped_at);
    }
    s.word(0).store(1, Ordering::SeqCst);
    assert_eq!(h.wait(Duration::from_secs(60)), 0);
    note!("[adds of the back-to-back writer before each waiter's: {between:?}] ");
    // (0 or 1: the add it was stopped in)
    assert!(
        between.iter().all(|&n| (0..=1).contains(&n)),
        "the back-to-back writer went first: {between:?}"
    );
}

/// A turn asked for by a writer that is then stopped, or killed, keeps nobody out for
/// long: the back-to-back writer, finding the lock reserved for it, goes on once it has
/// seen the reservation stand through a whole sleep (stopped), or the kernel says its
/// writer is dead (killed).
fn a_turn_of_a_stopped_or_killed_writer_lapses() {
    let path = TempPath::new("dict-turn-lapse");
    let d = shmlock::SharedDict::open(&path.0, 64, 16).unwrap();
    let s = Shared::new(4);
    let h = back_to_back(&d, &s);
    for kill in [false, true] {
        stop_holding(&d, &h);
        let w = {
            let d = &d;
            fork(move || {
                d.set("w", &[2u8; 8][..], Duration::ZERO).unwrap();
                0
            })
        };
        await_turn(&path.0);
        stop(w.0);
        if kill {
            w.kill();
        }
        let count = || match d.get("n").unwrap().map(|i| i.value) {
            Some(shmlock::Value::Int(n)) => n,
            other => panic!("n: {other:?}"),
        };
        let before = count();
        cont(h.0);
        // the back-to-back writer goes on, the waiter stopped or dead
        let deadline = Instant::now() + Duration::from_secs(60);
        while count() < before + 1000 {
            assert!(
                Instant::now() < deadline,
                "a turn kept the lock (killed: {kill})"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        if !kill {
            cont(w.0);
            assert_eq!(w.wait(Duration::from_secs(60)), 0);
        }
    }
    s.word(0).store(1, Ordering::SeqCst);
    assert_eq!(h.wait(Duration::from_secs(60)), 0);
}
