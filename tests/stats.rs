//! The counters, as other processes see them: what forked and unrelated processes did to a
//! table or a dict is in its file (`stats()`, `shmlock stats`), each kind of event counted
//! once and only when it happens; every count is in the file as it is made (threads that
//! idle, a process that exits with threads still running, a handle dropped while another
//! thread counted, more threads than the file has cells), a forked child never counts
//! its parent's again, garbage in the counters is no panic; a Redis handle counts what it
//! did; `shmlock stats --prometheus` passes `promtool check metrics` and the Prometheus
//! client's parser, `--json` a JSON parser, and `--watch` prints rates.
//!
//! Guards `src/shm/counters.rs`, `src/stats.rs`, the counting in `src/shm/lock_table.rs`,
//! `src/dict/api.rs`, `src/redis_store/ops.rs` and the command's `stats`. Its own harness
//! (`harness = false`) so that `fork` copies a process with no test threads;
//! `stats FILTER` runs the tests whose name contains FILTER; `stats --role NAME ARGS…` is
//! how a test starts this binary as an unrelated process.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::fork::{fork, Gate};
use common::harness::Test;
use common::redis_server::RedisServer;
use common::{opts, TempPath};
use shmlock::{Error, Lock, LockOptions, LockTable, RedisLocks, SharedDict};

const TESTS: &[Test] = &[
    Test::new(
        "acquisitions_of_many_processes_are_all_counted",
        acquisitions_of_many_processes_are_all_counted,
    ),
    Test::new(
        "a_process_that_exits_normally_leaves_every_count",
        a_process_that_exits_normally_leaves_every_count,
    ),
    Test::new(
        "a_forked_child_never_counts_its_parents_counts_again",
        a_forked_child_never_counts_its_parents_counts_again,
    ),
    Test::new(
        "counts_of_idle_threads_and_of_threads_running_at_exit_are_in_the_file",
        counts_of_idle_threads_and_of_threads_running_at_exit_are_in_the_file,
    ),
    Test::new(
        "a_handle_dropped_while_another_thread_counted_loses_nothing",
        a_handle_dropped_while_another_thread_counted_loses_nothing,
    ),
    Test::new(
        "more_threads_than_cells_are_all_counted",
        more_threads_than_cells_are_all_counted,
    ),
    Test::new(
        "threads_that_end_give_their_cells_back",
        threads_that_end_give_their_cells_back,
    ),
    Test::new(
        "cells_of_living_threads_and_of_dead_processes_come_back",
        cells_of_living_threads_and_of_dead_processes_come_back,
    ),
    Test::new(
        "garbage_in_the_counters_is_read_without_a_panic",
        garbage_in_the_counters_is_read_without_a_panic,
    ),
    Test::new(
        "each_kind_of_event_is_counted_once_when_it_happens",
        each_kind_of_event_is_counted_once_when_it_happens,
    ),
    Test::new(
        "a_dict_counts_hits_misses_sets_and_evictions",
        a_dict_counts_hits_misses_sets_and_evictions,
    ),
    Test::new(
        "get_or_fetch_counts_one_read_a_call_and_a_stale_read_is_a_miss",
        get_or_fetch_counts_one_read_a_call_and_a_stale_read_is_a_miss,
    ),
    Test::new(
        "a_redis_handle_counts_what_it_did",
        a_redis_handle_counts_what_it_did,
    ),
    Test::new(
        "the_command_prints_prometheus_that_parses_json_and_rates",
        the_command_prints_prometheus_that_parses_json_and_rates,
    ),
];

fn main() {
    common::harness::run("stats", TESTS, roles);
}

/// `--role take PATH N`: takes N keys of its own one after the other on the table at
/// PATH, then returns from `main` without dropping its handle.
fn roles(args: &[String]) -> i32 {
    match args.first().map(String::as_str) {
        Some("take") => {
            let table = LockTable::open(&args[1], 64).unwrap();
            let n: u64 = args[2].parse().unwrap();
            for i in 0..n {
                table
                    .lock(format!("role:{}", i % 8), LockOptions::default())
                    .unwrap()
                    .unlock()
                    .unwrap();
            }
            // (the table is leaked: no handle's drop touches the counts)
            std::mem::forget(table);
            0
        }
        // `--role threads PATH`: a thread takes 3 keys and parks; the main thread takes 2,
        // says "ready", waits for stdin to close, and returns from `main` (the parked
        // thread still there).
        Some("threads") => {
            let table = LockTable::open(&args[1], 64).unwrap();
            let t = table.clone();
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                for i in 0..3 {
                    drop(
                        t.lock(format!("thread:{i}"), LockOptions::default())
                            .unwrap(),
                    );
                }
                tx.send(()).unwrap();
                loop {
                    std::thread::park();
                }
            });
            rx.recv().unwrap();
            for i in 0..2 {
                drop(
                    table
                        .lock(format!("main:{i}"), LockOptions::default())
                        .unwrap(),
                );
            }
            println!("ready");
            let _ = std::io::Read::read(&mut std::io::stdin(), &mut [0u8; 1]);
            0
        }
        _ => common::harness::no_roles(args),
    }
}

/// 4 forked processes take 5000 keys each (uncontended, on keys of their own) and then let
/// go of their handle: the file counts all 20 000, and nothing contended.
fn acquisitions_of_many_processes_are_all_counted() {
    let path = TempPath::new("stats-many");
    drop(LockTable::open(&path, 256).unwrap());
    let children: Vec<_> = (0..4)
        .map(|c| {
            let path = &path;
            fork(move || {
                let table = LockTable::open(path, 256).unwrap();
                for i in 0..5000 {
                    let key = format!("c{c}:{}", i % 16);
                    drop(table.lock(key, LockOptions::default()).unwrap());
                }
                drop(table);
                0
            })
        })
        .collect();
    for c in children {
        assert_eq!(c.wait(Duration::from_secs(60)), 0);
    }
    let s = LockTable::open(&path, 256).unwrap().stats();
    assert_eq!(s.acquisitions, 20_000, "{s:?}");
    assert_eq!((s.contended, s.timeouts, s.wait.count), (0, 0, 0), "{s:?}");
}

/// A process counts 5 acquisitions and 5 dict misses, then forks: a child that exits
/// (through `exit`, running its thread-local destructors) leaves the counts at 5, one
/// that takes a key more makes them 6 (before, the child's copy of its parent's pending
/// counts went to the file again: 10 and 11).
fn a_forked_child_never_counts_its_parents_counts_again() {
    let path = TempPath::new("stats-fork");
    let dict_path = TempPath::new("stats-fork-dict");
    let table = LockTable::open(&path, 64).unwrap();
    let dict = SharedDict::open(&dict_path, 16, 8).unwrap();
    for i in 0..5 {
        drop(table.lock(format!("k{i}"), LockOptions::default()).unwrap());
        assert!(dict.get(format!("k{i}")).unwrap().is_none());
    }
    let quiet = fork(|| std::process::exit(0));
    assert_eq!(quiet.wait(Duration::from_secs(10)), 0);
    assert_eq!(table.stats().acquisitions, 5);
    assert_eq!(dict.stats().misses, 5);
    let busy = fork(|| {
        drop(table.lock("child", LockOptions::default()).unwrap());
        let _ = dict.get("child").unwrap();
        std::process::exit(0)
    });
    assert_eq!(busy.wait(Duration::from_secs(10)), 0);
    assert_eq!(table.stats().acquisitions, 6);
    assert_eq!(dict.stats().misses, 6);
}

/// An unrelated process whose one thread took 3 keys and idles, and whose main thread
/// took 2: all 5 are in the file while it idles, and stay when it returns from `main`
/// with the idle thread still there (before: 0 while idle, 2 after).
fn counts_of_idle_threads_and_of_threads_running_at_exit_are_in_the_file() {
    let path = TempPath::new("stats-threads");
    drop(LockTable::open(&path, 64).unwrap());
    let mut role = Command::new(std::env::current_exe().unwrap())
        .args(["--role", "threads"])
        .arg(&path.0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(role.stdout.take().unwrap()),
        &mut ready,
    )
    .unwrap();
    assert_eq!(ready, "ready\n");
    let table = LockTable::open(&path, 64).unwrap();
    assert_eq!(table.stats().acquisitions, 5, "while its threads idle");
    drop(role.stdin.take());
    assert!(role.wait().unwrap().success());
    assert_eq!(table.stats().acquisitions, 5, "after it exited");
}

/// A thread counts on a table and idles; the handle is dropped and the table opened again:
/// its counts are there (before: gone for good with the mapping).
fn a_handle_dropped_while_another_thread_counted_loses_nothing() {
    let path = TempPath::new("stats-reopen");
    let child = fork(|| {
        let table = LockTable::open(&path, 64).unwrap();
        let t = table.clone();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let worker = std::thread::spawn(move || {
            for i in 0..3 {
                drop(t.lock(format!("w{i}"), LockOptions::default()).unwrap());
            }
            drop(t);
            done_tx.send(()).unwrap();
            let _ = rx.recv(); // idles until told
        });
        done_rx.recv().unwrap();
        drop(table);
        let n = LockTable::open(&path, 64).unwrap().stats().acquisitions;
        drop(tx);
        worker.join().unwrap();
        if n == 3 {
            0
        } else {
            eprintln!("acquisitions {n}, want 3");
            1
        }
    });
    assert_eq!(child.wait(Duration::from_secs(20)), 0);
}

/// 300 threads take a key each and stay: more than the file's 256 thread cells; those
/// without a cell count in their process's cell, and every one is counted.
fn more_threads_than_cells_are_all_counted() {
    let path = TempPath::new("stats-cells");
    let child = fork(|| {
        let table = LockTable::open(&path, 512).unwrap();
        let (stay_tx, stay_rx) = std::sync::mpsc::channel::<()>();
        let stay = std::sync::Arc::new(std::sync::Mutex::new(stay_rx));
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let threads: Vec<_> = (0..300)
            .map(|i| {
                let (t, stay, done) = (table.clone(), stay.clone(), done_tx.clone());
                std::thread::spawn(move || {
                    drop(t.lock(format!("t{i}"), LockOptions::default()).unwrap());
                    done.send(()).unwrap();
                    let _ = stay.lock().unwrap().recv(); // all stay until told
                })
            })
            .collect();
        for _ in 0..300 {
            done_rx.recv().unwrap();
        }
        let n = table.stats().acquisitions;
        drop(stay_tx);
        for t in threads {
            t.join().unwrap();
        }
        let after = table.stats().acquisitions;
        if (n, after) == (300, 300) {
            0
        } else {
            eprintln!("acquisitions {n}, then {after}; want 300");
            1
        }
    });
    assert_eq!(child.wait(Duration::from_secs(60)), 0);
}

/// The thread cells claimed in a table file (owner words not zero), read from the file.
fn cells_claimed(path: &TempPath) -> usize {
    let file = std::fs::read(path).unwrap();
    let thread_cells = &file[file.len() - 256 * 64..];
    thread_cells
        .chunks_exact(64)
        .filter(|c| c[..8] != [0; 8])
        .count()
}

/// 600 threads, one after the other, each take a key and end: all counted, and each gave
/// its cell back (none is left claimed, so threads never run out of them).
fn threads_that_end_give_their_cells_back() {
    let path = TempPath::new("stats-give-back");
    let child = fork(|| {
        let table = LockTable::open(&path, 64).unwrap();
        for i in 0..600 {
            let t = table.clone();
            std::thread::spawn(move || {
                drop(
                    t.lock(format!("t{}", i % 8), LockOptions::default())
                        .unwrap(),
                );
            })
            .join()
            .unwrap();
        }
        let (n, claimed) = (table.stats().acquisitions, cells_claimed(&path));
        if (n, claimed) == (600, 0) {
            0
        } else {
            eprintln!("acquisitions {n}, cells claimed {claimed}; want 600, 0");
            1
        }
    });
    assert_eq!(child.wait(Duration::from_secs(60)), 0);
    // a thread still counting holds its cell; dropping its handle gives it back
    let table = LockTable::open(&path, 64).unwrap();
    drop(table.lock("main", LockOptions::default()).unwrap());
    assert_eq!(cells_claimed(&path), 1);
    drop(table);
    assert_eq!(cells_claimed(&path), 0);
}

/// The owner words of the thread cells of a file.
fn cell_owners(path: &TempPath) -> Vec<u64> {
    let file = std::fs::read(path).unwrap();
    file[file.len() - 256 * 64..]
        .chunks_exact(64)
        .map(|c| u64::from_le_bytes(c[..8].try_into().unwrap()))
        .collect()
}

/// A worker thread counts through a handle that another thread then drops (and opens the
/// table again, 300 times): the worker's cells come back each time, none is left claimed
/// (before: one leaked per round, and after 256 rounds none was free). And the cells of
/// processes that ended without giving theirs back (`_exit`) are taken again once no
/// cell is free, their counts kept.
fn cells_of_living_threads_and_of_dead_processes_come_back() {
    let path = TempPath::new("stats-cells-back");
    drop(LockTable::open(&path, 64).unwrap());
    let child = fork(|| {
        let (to_worker, rx) = std::sync::mpsc::channel::<LockTable>();
        let (done, from_worker) = std::sync::mpsc::channel();
        let worker = std::thread::spawn(move || {
            for t in rx {
                drop(t.lock("w", LockOptions::default()).unwrap());
                drop(t);
                done.send(()).unwrap();
            }
        });
        for _ in 0..300 {
            let t = LockTable::open(&path, 64).unwrap();
            to_worker.send(t.clone()).unwrap();
            from_worker.recv().unwrap();
            drop(t); // the last handle, dropped here while the worker lives
        }
        let claimed = cells_claimed(&path);
        drop(to_worker);
        worker.join().unwrap();
        if claimed == 0 {
            0
        } else {
            eprintln!("{claimed} cells claimed after the rounds");
            1
        }
    });
    assert_eq!(child.wait(Duration::from_secs(60)), 0);
    assert_eq!(
        LockTable::open(&path, 64).unwrap().stats().acquisitions,
        300
    );
    // 256 processes claim a cell each and _exit without giving it back
    for _ in 0..256 {
        let c = fork(|| {
            let t = LockTable::open(&path, 64).unwrap();
            drop(t.lock("p", LockOptions::default()).unwrap());
            std::mem::forget(t);
            0 // the harness's fork leaves with _exit
        });
        assert_eq!(c.wait(Duration::from_secs(10)), 0);
    }
    assert_eq!(cells_claimed(&path), 256);
    let table = LockTable::open(&path, 64).unwrap();
    drop(table.lock("me", LockOptions::default()).unwrap());
    let me = u64::from(std::process::id());
    assert!(
        cell_owners(&path).iter().any(|o| o >> 32 == me),
        "no dead process's cell was taken"
    );
    assert_eq!(table.stats().acquisitions, 300 + 256 + 1);
}

/// A file whose counters are all ones (garbage, or a counter at its end): `stats()` and
/// `shmlock stats` in each format answer (they sum with wrapping and saturating adds; in
/// this debug build, an overflowing add would panic), and the table still works.
fn garbage_in_the_counters_is_read_without_a_panic() {
    let path = TempPath::new("stats-garbage");
    drop(LockTable::open(&path, 16).unwrap());
    let len = std::fs::metadata(&path).unwrap().len();
    let stats_len = 16 * 512 + 256 * 64;
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.seek(SeekFrom::Start(len - stats_len)).unwrap();
        f.write_all(&vec![0xff; stats_len as usize]).unwrap();
    }
    let table = LockTable::open(&path, 16).unwrap();
    let _ = table.stats();
    drop(table.lock("k", LockOptions::default()).unwrap());
    for format in [&[][..], &["--json"], &["--prometheus"]] {
        let out = Command::new(env!("CARGO_BIN_EXE_shmlock"))
            .arg("--file")
            .arg(&path.0)
            .arg("stats")
            .args(format)
            .output()
            .unwrap();
        assert!(out.status.success(), "{format:?}: {out:?}");
    }
}

/// An unrelated process takes 777 keys and returns from `main` without dropping its
/// handle: its thread's counts reach the file as it exits.
fn a_process_that_exits_normally_leaves_every_count() {
    let path = TempPath::new("stats-exit");
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--role", "take"])
        .arg(&path.0)
        .arg("777")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let s = LockTable::open(&path, 64).unwrap().stats();
    assert_eq!(s.acquisitions, 777, "{s:?}");
}

/// One of each, across processes: a wait that took the key after its holder let go, a
/// wait that ran out, a key taken from a SIGKILLed holder and one after its lease ran out,
/// a table full, a renewal of a lost hold. Each is counted once, as it happens; the wait
/// and the hold that made it wait are timed.
fn each_kind_of_event_is_counted_once_when_it_happens() {
    let path = TempPath::new("stats-events");
    let table = LockTable::open(&path, 2).unwrap();
    // a contended wait: another process holds K for 600 ms (the parent's try must come
    // before the release, also on a busy machine)
    let held = Gate::new();
    let holder = {
        let (table, held) = (&table, &held);
        fork(move || {
            let g = table.lock("K", opts(60_000, 0)).unwrap();
            held.signal();
            std::thread::sleep(Duration::from_millis(600));
            drop(g);
            0
        })
    };
    held.await_signals(1);
    let t = Instant::now();
    table
        .lock("K", opts(60_000, 10_000))
        .unwrap()
        .unlock()
        .unwrap();
    let waited = t.elapsed();
    assert_eq!(holder.wait(Duration::from_secs(30)), 0);
    let s = table.stats();
    assert_eq!(
        (s.contended, s.wait.count, s.hold.count),
        (1, 1, 1),
        "{s:?}"
    );
    assert!(
        s.wait.sum <= waited && s.wait.sum >= Duration::from_millis(300),
        "{s:?}"
    );
    assert!(s.hold.sum >= Duration::from_millis(550), "{s:?}");

    // a timeout: K held by a process stopped with it
    let held = Gate::new();
    let stuck = {
        let (table, held) = (&table, &held);
        fork(move || {
            let _g = table.lock("K", opts(60_000, 0)).unwrap();
            held.signal();
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    };
    held.await_signals(1);
    assert!(matches!(
        table.lock("K", opts(60_000, 50)),
        Err(Error::Timeout { .. })
    ));
    assert_eq!(table.stats().timeouts, 1);

    // its holder killed: K is taken from the dead
    stuck.kill();
    table
        .lock("K", opts(60_000, 10_000))
        .unwrap()
        .unlock()
        .unwrap();
    assert_eq!(table.stats().dead_owner_takeovers, 1);

    // a lease run out: K is taken after it (and the late holder's renewal finds it lost)
    let mut late = Lock::new(&table, opts(50, 0)).unwrap();
    late.lock("K").unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let g = table.lock("K", opts(60_000, 0)).unwrap();
    assert_eq!(table.stats().expired_takeovers, 1);
    assert!(matches!(late.expire(None), Err(Error::Expired)));
    assert_eq!(table.stats().lost, 1);
    drop(g);

    // a full table (its capacity is 2 keys, its slots take some more): filled until it
    // refuses one
    let mut guards = Vec::new();
    loop {
        match table.lock(format!("fill:{}", guards.len()), opts(60_000, 0)) {
            Ok(g) => guards.push(g),
            Err(Error::TableFull { .. }) => break,
            Err(e) => panic!("{e}"),
        }
    }
    let s = table.stats();
    assert_eq!(s.table_full, 1, "{s:?}");
    // and nothing counted twice (the key taken from the dead holder was held when asked
    // for: a contended acquisition too)
    assert_eq!(
        (
            s.contended,
            s.timeouts,
            s.dead_owner_takeovers,
            s.expired_takeovers,
            s.lost
        ),
        (2, 1, 1, 1, 1),
        "{s:?}"
    );
}

/// Two processes read and write a dict: hits, misses and sets are counted where they
/// happen, evictions when a full window makes room, and the bytes in use are those stored.
fn a_dict_counts_hits_misses_sets_and_evictions() {
    let path = TempPath::new("stats-dict");
    let dict = SharedDict::open(&path, 4, 16).unwrap();
    let child = {
        let path = &path;
        fork(move || {
            let d = SharedDict::open(path, 4, 16).unwrap();
            for i in 0..4 {
                d.set(format!("k{i}"), "vvvv", Duration::ZERO).unwrap();
            }
            for i in 0..6 {
                let _ = d.get(format!("k{i}")).unwrap(); // 4 hits, 2 misses
            }
            drop(d);
            0
        })
    };
    assert_eq!(child.wait(Duration::from_secs(30)), 0);
    let s = dict.stats();
    assert_eq!(
        (s.hits, s.misses, s.sets, s.evictions),
        (4, 2, 4, 0),
        "{s:?}"
    );
    assert_eq!((s.entries, s.bytes_in_use), (4, 4 * (2 + 4)), "{s:?}");
    // full: a fifth key evicts one
    let stored = dict.set("k9", "v", Duration::ZERO).unwrap();
    assert!(stored.forcible);
    let s = dict.stats();
    assert_eq!((s.sets, s.evictions, s.forcible_sets), (5, 1, 1), "{s:?}");
    assert_eq!((s.entries, s.capacity), (4, 4), "{s:?}");
}

/// A `get_or_fetch` is one read: a miss when it fetches (its second look under the lock
/// counted a second miss), a hit from the cache; one that waited for another process's
/// value is one miss (it counted a miss and a hit). A `get_stale` that finds only an
/// expired value is a miss (it counted a hit).
fn get_or_fetch_counts_one_read_a_call_and_a_stale_read_is_a_miss() {
    let path = TempPath::new("stats-fetch");
    let locks_path = TempPath::new("stats-fetch-locks");
    let dict = SharedDict::open(&path, 16, 16).unwrap();
    let locks = LockTable::open(&locks_path, 16).unwrap();
    let counts = |d: &SharedDict| {
        let s = d.stats();
        (s.hits, s.misses)
    };
    let fetch = || Ok::<_, Error>("v");
    dict.get_or_fetch(&locks, "k", Duration::ZERO, fetch)
        .unwrap();
    assert_eq!(counts(&dict), (0, 1), "fetched");
    dict.get_or_fetch(&locks, "k", Duration::ZERO, fetch)
        .unwrap();
    assert_eq!(counts(&dict), (1, 1), "from the cache");
    // another process holds the key's lock, stores the value, and lets go: this call waits
    // for it and finds the value filled
    let ready = Gate::new();
    let child = {
        let (path, locks_path, ready) = (&path, &locks_path, &ready);
        fork(move || {
            let d = SharedDict::open(path, 16, 16).unwrap();
            let l = LockTable::open(locks_path, 16).unwrap();
            let g = l.lock("filled", LockOptions::default()).unwrap();
            ready.signal();
            std::thread::sleep(Duration::from_millis(100));
            d.set("filled", "v", Duration::ZERO).unwrap();
            drop(g);
            0
        })
    };
    ready.await_signals(1);
    let got = dict
        .get_or_fetch(
            &locks,
            "filled",
            Duration::ZERO,
            || -> Result<&str, Error> { panic!("fetched what another process stored") },
        )
        .unwrap();
    assert_eq!(got.source, shmlock::Source::Filled);
    assert_eq!(child.wait(Duration::from_secs(30)), 0);
    assert_eq!(counts(&dict), (1, 2), "filled");
    // a stale value is no hit
    dict.set("old", "v", Duration::from_millis(1)).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let (_, stale) = dict.get_stale("old").unwrap().unwrap();
    assert!(stale);
    assert_eq!(counts(&dict), (1, 3), "stale");
    dict.get_stale("k").unwrap().unwrap();
    assert_eq!(counts(&dict), (2, 3), "live through get_stale");
}

/// A Redis handle (and the handles derived from it) counts its own acquisitions, waits,
/// timeouts, holds and lost renewals; another handle's are its own.
fn a_redis_handle_counts_what_it_did() {
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    let other = RedisLocks::open(&server.url()).unwrap();
    for _ in 0..3 {
        redis
            .lock("k", LockOptions::default())
            .unwrap()
            .unlock()
            .unwrap();
    }
    let g = other.lock("k", opts(60_000, 0)).unwrap();
    assert!(matches!(
        redis.with_prefix("shmlock:").lock("k", opts(60_000, 50)),
        Err(Error::Timeout { .. })
    ));
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(100));
            g.unlock().unwrap();
        });
        redis
            .lock("k", opts(60_000, 5_000))
            .unwrap()
            .unlock()
            .unwrap();
    });
    let mut late = Lock::new(&redis, opts(50, 0)).unwrap();
    late.lock("lease").unwrap();
    std::thread::sleep(Duration::from_millis(150));
    assert!(matches!(late.expire(None), Err(Error::Expired)));
    let s = redis.stats();
    assert_eq!(
        (s.acquisitions, s.contended, s.timeouts, s.lost),
        (5, 1, 1, 1),
        "{s:?}"
    );
    assert_eq!((s.wait.count, s.hold.count), (1, 4), "{s:?}");
    assert_eq!(other.stats().acquisitions, 1);
}

/// `shmlock stats --prometheus` of a table and a dict passes `promtool check metrics` and
/// parses with prometheus_client's parser (both installed by scripts/test-tools.sh) into
/// the values `stats()` gives;
/// `--json` parses; `--watch` prints a rate from its second print on.
fn the_command_prints_prometheus_that_parses_json_and_rates() {
    let bin = env!("CARGO_BIN_EXE_shmlock");
    let path = TempPath::new("stats-cli \"quoted\"");
    let table = LockTable::open(&path, 64).unwrap();
    for _ in 0..7 {
        drop(table.lock("k", LockOptions::default()).unwrap());
    }
    let dict_path = TempPath::new("stats-cli-dict");
    let dict = SharedDict::open(&dict_path, 8, 8).unwrap();
    dict.set("a", "1", Duration::ZERO).unwrap();
    let _ = dict.get("a").unwrap();
    let _ = dict.get("b").unwrap();
    drop(dict); // this thread's counts of it go to the file (as after 100 ms of use)
    let stats = |file: &TempPath, extra: &[&str]| {
        let out = Command::new(bin)
            .arg("--file")
            .arg(&file.0)
            .arg("stats")
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    // Prometheus: the real parser, then the values
    let script = r#"
import sys
from prometheus_client.parser import text_string_to_metric_families
for family in text_string_to_metric_families(sys.stdin.read()):
    for s in family.samples:
        le = s.labels.get("le", "")
        v = float(s.value)
        print(family.type, s.name, le, int(v) if v.is_integer() else v, s.labels["file"])
"#;
    let parse = |text: String| {
        let mut py = Command::new("python3")
            .args(["-c", script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        py.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
        let out = py.wait_with_output().unwrap();
        assert!(out.status.success(), "the parser refused:\n{text}\n{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    // promtool: parses and lints (names, HELP, TYPE, suffixes); exit 0 only when clean
    let promtool = |text: &str| {
        let here = concat!(env!("CARGO_MANIFEST_DIR"), "/target/tools/bin/promtool");
        let tool = if std::path::Path::new(here).exists() {
            here
        } else {
            "promtool"
        };
        let mut p = Command::new(tool)
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{tool}: {e} (scripts/test-tools.sh installs it)"));
        use std::io::Write;
        p.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
        let out = p.wait_with_output().unwrap();
        assert!(out.status.success(), "promtool refused:\n{text}\n{out:?}");
    };
    let text = stats(&path, &["--prometheus"]);
    promtool(&text);
    promtool(&stats(&dict_path, &["--prometheus"]));
    let parsed = parse(text);
    let file = path.0.to_string_lossy();
    assert!(
        parsed.contains(&format!("counter shmlock_acquisitions_total  7 {file}")),
        "{parsed}"
    );
    assert!(
        parsed.contains("histogram shmlock_wait_seconds_bucket +Inf 0 "),
        "{parsed}"
    );
    assert!(
        parsed.contains("histogram shmlock_contended_hold_seconds_count  0 "),
        "{parsed}"
    );
    let parsed = parse(stats(&dict_path, &["--prometheus"]));
    for want in [
        "counter shmlock_dict_hits_total  1 ",
        "counter shmlock_dict_misses_total  1 ",
        "counter shmlock_dict_sets_total  1 ",
        "gauge shmlock_dict_entries  1 ",
        "gauge shmlock_dict_bytes_in_use  2 ",
    ] {
        assert!(parsed.contains(want), "{want} in\n{parsed}");
    }
    // JSON
    let v: serde_json::Value = serde_json::from_str(&stats(&path, &["--json"])).unwrap();
    assert_eq!(v["acquisitions"], 7);
    assert_eq!(v["kind"], "lock table");
    assert_eq!(v["wait"]["buckets"].as_array().unwrap().len(), 24);
    // --watch: rates from the second print on (the table keeps being used meanwhile)
    let mut watch = Command::new(bin)
        .arg("--file")
        .arg(&path.0)
        .args(["stats", "--json", "--interval", "1"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(watch.stdout.take().unwrap()));
    let first: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    for _ in 0..30 {
        drop(table.lock("k", LockOptions::default()).unwrap());
    }
    drop(table); // its counts go to the file
    let second: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    watch.kill().unwrap();
    let _ = watch.wait();
    assert!(first["per_second"].is_null(), "{first}");
    let rate = second["per_second"]["acquisitions"].as_f64().unwrap();
    assert!(rate > 0.0, "{second}");
    // every count the text gives a rate has one in JSON too
    let mut rated: Vec<&str> = second["per_second"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    rated.sort_unstable();
    assert_eq!(
        rated,
        [
            "acquisitions",
            "contended",
            "dead_owner_takeovers",
            "expired_takeovers",
            "lost",
            "table_full",
            "timeouts"
        ],
        "{second}"
    );
    assert_eq!(second["acquisitions"], 37);
}
