//! SharedDict across real processes: forked workers and a separately started one.
//!
//! Like tests/procs.rs this binary has its own small harness (`harness = false`), so it is
//! single-threaded and `fork` is safe. `dict_procs FILTER` runs the tests whose name
//! contains FILTER; `dict_procs --role NAME ARGS…` is how a test starts this binary as an
//! unrelated process.

mod common;

use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::dict::{lru_rounds, make_value, verify};
use common::fork::{fork, xorshift, Child, Shared};
use common::harness::TestFn;
use common::TempPath;
use shmlock::{Error, SharedDict, Value};

const TESTS: &[(&str, TestFn)] = &[
    (
        "operations_are_seen_across_processes",
        operations_are_seen_across_processes,
    ),
    (
        "incr_is_atomic_across_processes",
        incr_is_atomic_across_processes,
    ),
    (
        "an_unrelated_process_reads_by_path",
        an_unrelated_process_reads_by_path,
    ),
    (
        "reads_in_other_processes_rank_keys_for_eviction",
        reads_in_other_processes_rank_keys_for_eviction,
    ),
    (
        "a_list_is_a_queue_across_processes",
        a_list_is_a_queue_across_processes,
    ),
    (
        "readers_never_see_a_torn_value_while_writers_are_killed",
        readers_never_see_a_torn_value_while_writers_are_killed,
    ),
    (
        "a_writer_killed_holding_the_lock_leaves_the_entry_absent_or_whole",
        a_writer_killed_holding_the_lock_leaves_the_entry_absent_or_whole,
    ),
    (
        "a_fetch_stopped_past_its_lease_leaves_the_next_holders_value",
        a_fetch_stopped_past_its_lease_leaves_the_next_holders_value,
    ),
];

fn main() {
    common::harness::main("dict_procs", TESTS, role);
}

const NEVER: Duration = Duration::ZERO;
const LIMIT: Duration = Duration::from_secs(60);

/// Runs `f` in a forked child and asserts it succeeded.
fn in_child(f: impl FnOnce()) {
    let child = fork(|| {
        f();
        0
    });
    assert_eq!(child.wait(LIMIT), 0, "the child failed");
}

/// 3 forked producers push 300 numbers each onto one list while 3 forked consumers pop
/// from the other end: every number is taken exactly once, and each producer's numbers in
/// the order it pushed them.
fn a_list_is_a_queue_across_processes() {
    let path = TempPath::new("dict-queue");
    let d = SharedDict::open(&path, 64, 4096).unwrap();
    let taken = Shared::new(3 * 300 + 3);
    let producers: Vec<Child> = (0..3i64)
        .map(|p| {
            let d = &d;
            fork(move || {
                for i in 0..300 {
                    // a full list says NoMemory: wait for the consumers
                    while let Err(Error::NoMemory { .. }) = d.rpush("q", p * 1000 + i) {
                        std::thread::sleep(Duration::from_micros(100));
                    }
                }
                0
            })
        })
        .collect();
    let consumers: Vec<Child> = (0..3)
        .map(|c| {
            let (d, taken) = (&d, &taken);
            fork(move || {
                let mut last = [-1i64; 3];
                let deadline = Instant::now() + LIMIT;
                while taken.word(900 + c).load(Ordering::SeqCst) == 0 {
                    match d.lpop("q").unwrap() {
                        Some(Value::Int(n)) => {
                            let (p, i) = ((n / 1000) as usize, n % 1000);
                            assert!(i > last[p], "producer {p}: {i} after {}", last[p]);
                            last[p] = i;
                            taken
                                .word(p * 300 + i as usize)
                                .fetch_add(1, Ordering::SeqCst);
                        }
                        Some(other) => panic!("{other:?}"),
                        None => {
                            assert!(Instant::now() < deadline, "hang guard");
                            std::thread::sleep(Duration::from_micros(100));
                        }
                    }
                }
                0
            })
        })
        .collect();
    for p in producers {
        assert_eq!(p.wait(LIMIT), 0);
    }
    let deadline = Instant::now() + LIMIT;
    while d.llen("q").unwrap() > 0 {
        assert!(Instant::now() < deadline, "the queue never emptied");
        std::thread::sleep(Duration::from_millis(1));
    }
    for c in 0..3 {
        taken.word(900 + c).store(1, Ordering::SeqCst);
    }
    for c in consumers {
        assert_eq!(c.wait(LIMIT), 0);
    }
    for i in 0..900 {
        assert_eq!(taken.word(i).load(Ordering::SeqCst), 1, "number {i}");
    }
}

fn bytes(d: &SharedDict, key: &str) -> Option<Vec<u8>> {
    d.get(key)
        .unwrap()
        .map(|i| i.value.as_bytes().unwrap().to_vec())
}

// ---------------------------------------------------------------------------------------
// ngx.shared.DICT's behaviour, one process writing and another reading

/// Every read is made by a forked child, every store by this process, none a tick apart:
/// each evicting store takes exactly the key the LRU model says (a child's read ranks by
/// the writer lock's epoch that it reads in the file).
fn reads_in_other_processes_rank_keys_for_eviction() {
    let path = TempPath::new("dict-lru");
    let d = SharedDict::open(&path, 8, 8).unwrap();
    lru_rounds(&d, 400, 0x2545_F491_4F6C_DD1D, &mut |key| {
        in_child(|| assert!(d.get(key).unwrap().is_some(), "{key} read"));
    });
}

fn operations_are_seen_across_processes() {
    let path = TempPath::new("dict-ops");
    let d = SharedDict::open(&path, 64, 32).unwrap();
    in_child(|| {
        d.set("a", "from child", NEVER).unwrap();
        d.set("short", "v", Duration::from_millis(30)).unwrap();
        d.set("hour", "v", Duration::from_secs(3600)).unwrap();
        d.put(shmlock::Put::Set, "flagged", "v", NEVER, 9).unwrap();
        assert_eq!(d.incr("n", 1, Some(0), NEVER).unwrap(), 1);
    });
    assert_eq!(bytes(&d, "a").unwrap(), b"from child");
    assert!(matches!(d.add("a", "x", NEVER), Err(Error::Exists { .. })));
    assert_eq!(d.get("flagged").unwrap().unwrap().flags, 9);
    assert!(d.ttl("hour").unwrap().unwrap() > Duration::from_secs(3500));
    std::thread::sleep(Duration::from_millis(120));
    assert_eq!(
        d.get("short").unwrap(),
        None,
        "expired in another process's write"
    );
    assert!(d.get_stale("short").unwrap().unwrap().1);
    assert_eq!(d.incr("n", 1, None, NEVER).unwrap(), 2);

    in_child(|| {
        assert!(matches!(
            d.incr("a", 1, None, NEVER),
            Err(Error::NotANumber { .. })
        ));
        assert!(matches!(
            d.replace("nope", "x", NEVER),
            Err(Error::NotFound { .. })
        ));
        assert!(d.delete("hour").unwrap());
        d.flush_all().unwrap();
    });
    for key in ["a", "n", "flagged", "hour"] {
        assert_eq!(d.get(key).unwrap(), None, "{key} survived flush_all");
    }
    // a, short, flagged, n: flushed but still stored; hour was deleted
    assert_eq!(d.len(), 4);
    let removed = fork(|| d.flush_expired(0).unwrap() as i32).wait(LIMIT);
    assert_eq!(removed, 4);
    assert_eq!((d.len(), d.free_slots()), (0, 64));

    // no memory: a full small dict refuses safe stores from any process, set evicts
    let small_path = TempPath::new("dict-ops-small");
    let small = SharedDict::open(&small_path, 4, 8).unwrap();
    in_child(|| {
        for i in 0..4 {
            small.set(format!("k{i}"), "v", NEVER).unwrap();
        }
    });
    assert!(matches!(
        small.safe_set("new", "v", NEVER),
        Err(Error::NoMemory { .. })
    ));
    assert!(small.set("new", "v", NEVER).unwrap().forcible);
    assert_eq!(small.evictions(), 1);
    assert_eq!(small.len(), 4);
}

fn incr_is_atomic_across_processes() {
    const WORKERS: usize = 4;
    const EACH: i64 = 5_000;
    let path = TempPath::new("dict-incr");
    let d = SharedDict::open(&path, 64, 8).unwrap();
    let children: Vec<Child> = (0..WORKERS)
        .map(|_| {
            fork(|| {
                for _ in 0..EACH {
                    d.incr("count", 1, Some(0), NEVER).unwrap();
                }
                0
            })
        })
        .collect();
    for c in &children {
        assert_eq!(c.wait(LIMIT), 0);
    }
    assert_eq!(
        d.get("count").unwrap().unwrap().value,
        Value::Int(WORKERS as i64 * EACH)
    );
}

fn an_unrelated_process_reads_by_path() {
    let path = TempPath::new("dict-unrelated");
    let d = SharedDict::open(&path, 16, 32).unwrap();
    d.set("greeting", "hello from the parent", NEVER).unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--role", "get-then-set"])
        .arg(&path.0)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, b"hello from the parent\n");
    assert_eq!(bytes(&d, "reply").unwrap(), b"hello from the child");
}

// ---------------------------------------------------------------------------------------
// Torn reads and dead writers

const TORN_KEYS: u64 = 48;
const TORN_MAX: usize = 2048;

/// Sets random keys to values of random length until told to stop.
fn torn_writer(d: &SharedDict, stop: &Shared, counters: &Shared, seed: u64) -> i32 {
    let mut x = seed | 1;
    while stop.word(0).load(Ordering::Relaxed) == 0 {
        let key = (xorshift(&mut x) % TORN_KEYS) as u32;
        let len = 24 + (xorshift(&mut x) as usize % (TORN_MAX - 24));
        let _ = d
            .set(format!("t:{key}"), &make_value(key, x, len), NEVER)
            .unwrap();
        counters.word(0).fetch_add(1, Ordering::Relaxed);
    }
    0
}

/// Reads random keys and checks every value it gets; counts reads and bad values.
fn torn_reader(d: &SharedDict, stop: &Shared, counters: &Shared, seed: u64) -> i32 {
    let mut x = seed | 1;
    while stop.word(0).load(Ordering::Relaxed) == 0 {
        let key = (xorshift(&mut x) % TORN_KEYS) as u32;
        if let Some(item) = d.get(format!("t:{key}")).unwrap() {
            let ok = item.value.as_bytes().is_some_and(|v| verify(key, v));
            counters
                .word(if ok { 1 } else { 2 })
                .fetch_add(1, Ordering::Relaxed);
        }
    }
    0
}

fn readers_never_see_a_torn_value_while_writers_are_killed() {
    const WRITERS: usize = 2;
    const READERS: usize = 2;
    let secs: u64 = std::env::var("SHMLOCK_CHAOS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    let path = TempPath::new("dict-torn");
    // Fewer slots than keys: writes evict, so entries also change key under the readers.
    let d = SharedDict::open(&path, 32, TORN_MAX).unwrap();
    let stop = Shared::new(1);
    // writes, good reads, bad reads
    let counters = Shared::new(3);
    let spawn_writer = |seed: u64| fork(|| torn_writer(&d, &stop, &counters, seed));
    let mut writers: Vec<Child> = (0..WRITERS as u64).map(|i| spawn_writer(i + 1)).collect();
    let readers: Vec<Child> = (0..READERS as u64)
        .map(|i| fork(|| torn_reader(&d, &stop, &counters, 100 + i)))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(secs);
    let (mut kills, mut x, mut seed) = (0u64, 0xdead_u64, 1000);
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_micros(xorshift(&mut x) % 20_000));
        let victim = (xorshift(&mut x) % WRITERS as u64) as usize;
        writers[victim].kill();
        kills += 1;
        seed += 1;
        writers[victim] = spawn_writer(seed);
    }
    stop.word(0).store(1, Ordering::SeqCst);
    for c in writers.iter().chain(&readers) {
        assert_eq!(
            c.wait(LIMIT),
            0,
            "a worker failed (or hung on a dead writer)"
        );
    }
    let (writes, good, bad) = (
        counters.word(0).load(Ordering::SeqCst),
        counters.word(1).load(Ordering::SeqCst),
        counters.word(2).load(Ordering::SeqCst),
    );
    print!(
        "[{writes} writes, {good} checked reads, {kills} writer kills, {} repairs, {} evictions] ",
        d.repairs(),
        d.evictions()
    );
    assert_eq!(bad, 0, "readers saw {bad} torn values");
    assert!(writes > 0 && good > 0 && kills > 0);
    // Whatever the kills left, the dict is whole: every stored value checks out, the
    // count matches, and every key can be written and read again.
    let keys = d.keys(0).unwrap();
    assert_eq!(d.len(), keys.len());
    for key in 0..TORN_KEYS as u32 {
        if let Some(item) = d.get(format!("t:{key}")).unwrap() {
            assert!(verify(key, item.value.as_bytes().unwrap()));
        }
    }
    d.set("after", "whole", NEVER).unwrap();
    assert_eq!(bytes(&d, "after").unwrap(), b"whole");
}

fn a_writer_killed_holding_the_lock_leaves_the_entry_absent_or_whole() {
    const BIG: usize = 1 << 20;
    let path = TempPath::new("dict-killed-writer");
    let d = SharedDict::open(&path, 4, BIG).unwrap();
    d.set("big", &make_value(7, 1, BIG), NEVER).unwrap();
    d.set("other", "untouched", NEVER).unwrap();
    // A writer rewriting a 1 MiB value spends most of its time inside the writer lock;
    // stop it until it is caught there, then kill it.
    let writer = fork(|| {
        let mut gen = 2;
        loop {
            d.set("big", &make_value(7, gen, BIG), NEVER).unwrap();
            gen += 1;
        }
    });
    let deadline = Instant::now() + LIMIT;
    loop {
        assert!(
            Instant::now() < deadline,
            "never caught the writer holding the lock"
        );
        std::thread::sleep(Duration::from_micros(300));
        common::signal::send(writer.0, libc::SIGSTOP);
        // SIGSTOP is asynchronous: wait until the child is really stopped.
        let mut status = 0;
        // SAFETY: our own child; status is a valid out-pointer.
        let r = unsafe { libc::waitpid(writer.0, &mut status, libc::WUNTRACED) };
        assert!(r == writer.0 && libc::WIFSTOPPED(status));
        if d.writer_pid() == Some(writer.0 as u32) {
            break;
        }
        common::signal::send(writer.0, libc::SIGCONT);
    }
    assert_eq!(d.writer_alive(), Some(true), "a stopped writer lives");
    writer.kill();
    // dead holding the lock, on the kernel's word (what `inspect` shows)
    assert_eq!(d.writer_alive(), Some(false));
    assert_eq!(d.repairs(), 0);
    // Another process reads: it must get a whole value or nothing, and not hang. Then it
    // writes: if its read did not already take the lock over (the writer may have died
    // between two entry writes, the entry whole), its write does.
    in_child(|| {
        if let Some(item) = d.get("big").unwrap() {
            assert!(
                verify(7, item.value.as_bytes().unwrap()),
                "torn after a writer's death"
            );
        }
        assert_eq!(bytes(&d, "other").unwrap(), b"untouched");
        d.set("probe", "p", NEVER).unwrap();
    });
    // Someone took the lock over from the dead writer and repaired after it.
    assert_eq!(d.repairs(), 1);
    assert_eq!((d.writer_pid(), d.writer_alive()), (None, None));
    assert_eq!(d.len(), d.keys(0).unwrap().len());
    d.set("big", &make_value(7, 99, 100), NEVER).unwrap();
    assert!(verify(7, &bytes(&d, "big").unwrap()));
}

// ---------------------------------------------------------------------------------------
// Roles: this binary started by a test as an unrelated process.

fn role(args: &[String]) -> i32 {
    match args.first().map(String::as_str) {
        // get-then-set PATH: print "greeting", store "reply"
        Some("get-then-set") => {
            let d = SharedDict::options().create(false).open(&args[1]).unwrap();
            let greeting = d.get("greeting").unwrap().unwrap();
            println!(
                "{}",
                String::from_utf8_lossy(greeting.value.as_bytes().unwrap())
            );
            d.set("reply", "hello from the child", NEVER).unwrap();
            0
        }
        other => {
            eprintln!("unknown role {other:?}");
            2
        }
    }
}

/// A `get_or_fetch` whose process is stopped (SIGSTOP) while it fetches, past its lease:
/// the next holder fetches and stores, and the stopped one, once it runs on, leaves that
/// value and returns it as `Filled`. It stored its own over it and said `Fetched`.
fn a_fetch_stopped_past_its_lease_leaves_the_next_holders_value() {
    let (dict_path, table_path) = (TempPath::new("fetch-stop-d"), TempPath::new("fetch-stop-t"));
    let d = SharedDict::open(&dict_path, 64, 64).unwrap();
    let locks = shmlock::LockTable::open(&table_path, 16).unwrap();
    let lease = shmlock::LockOptions {
        exptime: Duration::from_millis(300),
        ..shmlock::LockOptions::default()
    };
    let fetching = Shared::new(1);
    let first = fork(|| {
        let got = d
            .get_or_fetch_with(&locks, "item", NEVER, &lease, || {
                fetching.word(0).store(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(200)); // (stopped in here)
                Ok::<_, Error>("old")
            })
            .unwrap();
        assert_eq!(got.source, shmlock::Source::Filled, "{got:?}");
        assert_eq!(got.value, Value::from("new"));
        0
    });
    let deadline = Instant::now() + LIMIT;
    while fetching.word(0).load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the first never fetched");
        std::thread::sleep(Duration::from_millis(1));
    }
    common::signal::send(first.0, libc::SIGSTOP);
    while locks.is_locked("item").unwrap() {
        assert!(
            Instant::now() < deadline,
            "the stopped one's lease never ran out"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let got = d
        .get_or_fetch_with(&locks, "item", NEVER, &lease, || Ok::<_, Error>("new"))
        .unwrap();
    assert_eq!(got.source, shmlock::Source::Fetched);
    common::signal::send(first.0, libc::SIGCONT);
    assert_eq!(first.wait(LIMIT), 0, "the stopped one's result");
    assert_eq!(d.get("item").unwrap().unwrap().value, Value::from("new"));
}
