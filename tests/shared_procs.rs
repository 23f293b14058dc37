//! Read locks and semaphores across real processes: readers in many processes share a key
//! and a writer waits for the last of them; a killed reader or permit holder gives its
//! share back at once; a writer gets in under a stream of readers and a reader under a
//! stream of writers; and chaos, with readers, writers and permit holders SIGSTOPped and
//! SIGKILLed at random: never a writer beside anyone, never more permits than the count,
//! nothing wedged, nothing leaked.
//!
//! Exercises `src/shm/shared.rs` and the shared side of the slot protocol
//! (`src/shm/table/claim.rs`, `wait.rs`, `recover.rs`).
//!
//! `shared_procs FILTER` runs the tests whose name contains FILTER.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::fork::{fork, xorshift, Child, Gate, Shared};
use common::harness::Test;
use common::probe::{cont, Proc};
use common::{opts, TempPath};
use shmlock::{Error, HoldMode, HolderState, LockTable};

const TESTS: &[Test] = &[
    Test::new(
        "readers_in_many_processes_share_and_a_writer_waits_for_the_last",
        readers_share,
    ),
    Test::new(
        "a_killed_reader_gives_its_share_back_at_once",
        killed_reader,
    ),
    Test::new(
        "a_killed_permit_holder_gives_its_permit_back_at_once",
        killed_permit_holder,
    ),
    Test::new(
        "a_permit_given_back_by_another_process_wakes_a_sleeping_waiter",
        permit_wakes_waiter,
    ),
    Test::new(
        "a_writer_gets_in_under_a_stream_of_readers",
        writer_under_readers,
    ),
    Test::new(
        "a_reader_gets_in_under_a_stream_of_writers",
        reader_under_writers,
    ),
    Test::new(
        "a_reader_behind_looping_writers_gets_in_at_the_next_release",
        reader_behind_looping_writers,
    ),
    Test::new("a_writer_kept_out_for_readers_is_told_why", writer_told_why),
    Test::new(
        "chaos_readers_writers_and_permits_with_stop_and_kill",
        chaos,
    ),
    Test::new(
        "a_forked_child_never_takes_its_parents_idle_entry",
        forked_child_idle,
    ),
    Test::new(
        "idle_entries_of_a_live_process_never_fill_the_table",
        idle_never_fills,
    ),
];

fn main() {
    common::harness::run("shared_procs", TESTS, common::harness::no_roles);
}

const HANG: Duration = Duration::from_secs(60);

fn readers_share() {
    let path = TempPath::new("shared-procs-share");
    let table = LockTable::open(&path, 64).unwrap();
    let mut held = Gate::new();
    let mut done = Gate::new();
    let readers: Vec<Child> = (0..8)
        .map(|_| {
            let (table, held, done) = (&table, &mut held, &mut done);
            fork(move || {
                let r = table.lock_shared("K", opts(60_000, 5_000)).unwrap();
                held.signal();
                done.wait();
                r.unlock().unwrap();
                0
            })
        })
        .collect();
    held.await_signals(8);
    let holders = table.holders();
    let mut pids: Vec<u32> = holders
        .iter()
        .filter(|h| h.mode == HoldMode::Shared)
        .map(|h| h.pid)
        .collect();
    pids.sort_unstable();
    let mut want: Vec<u32> = readers.iter().map(|c| c.0 as u32).collect();
    want.sort_unstable();
    assert_eq!(pids, want, "inspection lists every reader with its pid");
    assert!(table.try_lock_with_lease("K", HANG).unwrap().is_none());

    let shared = Shared::new(1);
    let writer = {
        let (table, shared, done) = (&table, &shared, &mut done);
        fork(move || {
            done.open(); // the readers' gate opens when the parent's end closes
            let w = table.lock("K", opts(60_000, 30_000)).unwrap();
            shared.word(0).store(1, Ordering::SeqCst);
            w.unlock().unwrap();
            0
        })
    };
    // once the writer waits, no new reader gets in (writer preference)
    let t = Instant::now();
    while !table.holders().iter().any(|h| h.waiters) {
        assert!(t.elapsed() < HANG, "the writer never waited");
        std::thread::sleep(Duration::from_millis(2));
    }
    std::thread::sleep(Duration::from_millis(50));
    assert!(table.try_lock_shared("K", HANG).unwrap().is_none());
    assert_eq!(
        shared.word(0).load(Ordering::SeqCst),
        0,
        "a writer beside readers"
    );
    done.open();
    for r in &readers {
        assert_eq!(r.wait(HANG), 0);
    }
    assert_eq!(writer.wait(HANG), 0);
    assert_eq!(shared.word(0).load(Ordering::SeqCst), 1);
    assert!(table.holders().is_empty());
}

/// Holders that never let go, to be killed (and killed on drop, should the test fail).
fn stuck_holders(table: &LockTable, n: usize, take: impl Fn(&LockTable) + Copy) -> Vec<Proc> {
    let mut held = Gate::new();
    let children = (0..n)
        .map(|_| {
            let held = &mut held;
            Proc::new(fork(move || {
                take(table);
                held.signal();
                loop {
                    std::thread::sleep(Duration::from_secs(1));
                }
            }))
        })
        .collect();
    held.await_signals(n);
    children
}

fn killed_reader() {
    let path = TempPath::new("shared-procs-kill-reader");
    let table = LockTable::open(&path, 64).unwrap();
    let readers = stuck_holders(&table, 3, |t| {
        std::mem::forget(t.lock_shared("K", opts(600_000, 1_000)).unwrap());
    });
    let writer = fork(|| {
        let t = Instant::now();
        match table.lock("K", opts(600_000, 30_000)) {
            Ok(_) if t.elapsed() < Duration::from_secs(30) => 0,
            Ok(_) => 2,
            Err(e) => {
                eprintln!("writer: {e}");
                1
            }
        }
    });
    std::thread::sleep(Duration::from_millis(100));
    for mut r in readers {
        r.kill();
    }
    // the writer got in long before the readers' leases (10 minutes) ran out
    assert_eq!(writer.wait(HANG), 0);
}

fn killed_permit_holder() {
    let path = TempPath::new("shared-procs-kill-permit");
    let table = LockTable::open(&path, 64).unwrap();
    let holders = stuck_holders(&table, 2, |t| {
        let s = t.semaphore("gpu", 2).unwrap();
        std::mem::forget(s.acquire(opts(600_000, 1_000)).unwrap());
    });
    let s = table.semaphore("gpu", 2).unwrap();
    assert!(s.try_acquire(HANG).unwrap().is_none());
    let waiter = fork(|| match s.acquire(opts(600_000, 30_000)) {
        Ok(p) => {
            std::mem::forget(p);
            0
        }
        Err(e) => {
            eprintln!("waiter: {e}");
            1
        }
    });
    std::thread::sleep(Duration::from_millis(100));
    let mut holders = holders;
    holders[0].kill();
    assert_eq!(waiter.wait(HANG), 0);
    // the waiter exited holding its permit: its death gives it back too
    let again = s.acquire(opts(600_000, 30_000)).unwrap();
    assert!(
        s.try_acquire(HANG).unwrap().is_none(),
        "three permits of two"
    );
    holders[1].kill();
    drop(again);
}

/// Waiters whose first sleep is 30 s (so that only a wake-up, not their schedule, lets
/// them in before it ends), a thread's and an async task's, for a semaphore of 2 whose
/// permits two other processes hold; one of them lets go after 200 ms.
fn permit_wakes_waiter() {
    let path = TempPath::new("shared-procs-permit-wake");
    let table = LockTable::open(&path, 64).unwrap();
    let slow = shmlock::LockOptions {
        exptime: Duration::from_secs(600),
        timeout: Duration::from_secs(60),
        step: Duration::from_secs(30),
        max_step: Duration::from_secs(30),
        ..shmlock::LockOptions::default()
    };
    for asynchronous in [false, true] {
        if asynchronous && !cfg!(feature = "tokio") {
            continue;
        }
        let mut go = Gate::new();
        let holders = stuck_holders(&table, 1, |t| {
            let s = t.semaphore("gpu", 2).unwrap();
            std::mem::forget(s.acquire(opts(600_000, 1_000)).unwrap());
        });
        let leaver = {
            let (table, go) = (&table, &mut go);
            fork(move || {
                let s = table.semaphore("gpu", 2).unwrap();
                let p = s.acquire(opts(600_000, 1_000)).unwrap();
                go.signal();
                std::thread::sleep(Duration::from_millis(200));
                drop(p);
                0
            })
        };
        go.await_signals(1);
        let sem = table.semaphore("gpu", 2).unwrap();
        assert!(sem.try_acquire(HANG).unwrap().is_none());
        // the waiter is a process of its own: a runtime's threads stay out of this one,
        // which forks
        let took = Shared::new(1);
        let waiter = fork(|| {
            let t = Instant::now();
            let permit = if asynchronous {
                acquire_async(&sem, slow)
            } else {
                sem.acquire(slow).unwrap()
            };
            took.word(0)
                .store(t.elapsed().as_micros() as u64, Ordering::SeqCst);
            drop(permit);
            0
        });
        assert_eq!(waiter.wait(HANG), 0);
        let waited = Duration::from_micros(took.word(0).load(Ordering::SeqCst));
        assert!(
            waited < Duration::from_secs(20),
            "not woken by the release: {waited:?} (async: {asynchronous})"
        );
        note!(
            "[{}: {:.1} ms] ",
            if asynchronous { "task" } else { "thread" },
            waited.as_secs_f64() * 1e3
        );
        assert_eq!(leaver.wait(HANG), 0);
        drop(holders);
    }
}

#[cfg(feature = "tokio")]
fn acquire_async<'a, 't>(
    sem: &'a shmlock::Semaphore<'t>,
    o: shmlock::LockOptions,
) -> shmlock::LockGuard<'a, shmlock::Semaphore<'t>> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(sem.acquire_async(o))
        .unwrap()
}

#[cfg(not(feature = "tokio"))]
fn acquire_async<'a, 't>(
    _: &'a shmlock::Semaphore<'t>,
    _: shmlock::LockOptions,
) -> shmlock::LockGuard<'a, shmlock::Semaphore<'t>> {
    unreachable!("only with tokio")
}

/// Holders that keep the key held, one after another, until told to stop: readers whose
/// holds overlap (without writer preference a writer would wait for a moment with no
/// reader in, which never comes), or writers that take the key again at once.
fn stream(table: &LockTable, stop: &Shared, n: usize, write: bool) -> Vec<Child> {
    (0..n)
        .map(|i| {
            fork(move || {
                let mut x = 0x5eed + i as u64;
                while stop.word(0).load(Ordering::SeqCst) == 0 {
                    let r = if write {
                        table.lock("K", opts(60_000, 30_000)).map(|g| {
                            std::thread::sleep(Duration::from_micros(
                                1_000 + xorshift(&mut x) % 2_000,
                            ));
                            drop(g);
                        })
                    } else {
                        table.lock_shared("K", opts(60_000, 30_000)).map(|g| {
                            std::thread::sleep(Duration::from_micros(
                                2_000 + xorshift(&mut x) % 8_000,
                            ));
                            drop(g);
                        })
                    };
                    if let Err(e) = r {
                        eprintln!("stream: {e}");
                        return 1;
                    }
                }
                0
            })
        })
        .collect()
}

fn writer_under_readers() {
    let path = TempPath::new("shared-procs-writer-starve");
    let table = LockTable::open(&path, 64).unwrap();
    let stop = Shared::new(1);
    let readers = stream(&table, &stop, 4, false);
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    let got = table.lock("K", opts(60_000, 20_000));
    let waited = t.elapsed();
    stop.word(0).store(1, Ordering::SeqCst);
    drop(got.unwrap_or_else(|e| panic!("the writer starved: {e}")));
    note!("[writer waited {:.1} ms] ", waited.as_secs_f64() * 1e3);
    for r in &readers {
        assert_eq!(r.wait(HANG), 0);
    }
}

fn reader_under_writers() {
    let path = TempPath::new("shared-procs-reader-starve");
    let table = LockTable::open(&path, 64).unwrap();
    let stop = Shared::new(1);
    let writers = stream(&table, &stop, 2, true);
    std::thread::sleep(Duration::from_millis(200));
    let mut waits = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let r = table
            .lock_shared("K", opts(60_000, 20_000))
            .unwrap_or_else(|e| panic!("the reader starved: {e}"));
        waits.push(t.elapsed());
        drop(r);
    }
    stop.word(0).store(1, Ordering::SeqCst);
    waits.sort();
    note!(
        "[reader waits: median {:.2} ms, max {:.2} ms] ",
        waits[10].as_secs_f64() * 1e3,
        waits[19].as_secs_f64() * 1e3
    );
    for w in &writers {
        assert_eq!(w.wait(HANG), 0);
    }
}

/// Six writer processes take K in turn, holding it 10 ms and asking again 0-1 ms after
/// each release, so that some of them always wait: a reader that comes to wait gets the
/// key at the next release (the writer's release keeps the key for the readers waiting
/// for it: `table/idle.rs`), not when it happens to win a race against five writers (it
/// waited up to 41 holds, median 3, before).
fn reader_behind_looping_writers() {
    let path = TempPath::new("shared-procs-reader-behind-writers");
    let table = LockTable::open(&path, 64).unwrap();
    // [0] stop, [1] writer holds so far
    let words = Shared::new(2);
    let writers: Vec<_> = (0..6u64)
        .map(|i| {
            let (table, words) = (&table, &words);
            fork(move || {
                let mut x = 0x5eed + i;
                while words.word(0).load(Ordering::SeqCst) == 0 {
                    let g = table.lock("K", opts(60_000, 30_000)).unwrap();
                    words.word(1).fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(10));
                    drop(g);
                    std::thread::sleep(Duration::from_micros(xorshift(&mut x) % 1_000));
                }
                0
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    let mut x = 0x2545_f491;
    let mut holds = Vec::new();
    for _ in 0..20 {
        let before = words.word(1).load(Ordering::SeqCst);
        let r = table
            .lock_shared("K", opts(60_000, 20_000))
            .unwrap_or_else(|e| panic!("the reader starved: {e}"));
        holds.push(words.word(1).load(Ordering::SeqCst) - before);
        drop(r);
        // (at a random point of a hold)
        std::thread::sleep(Duration::from_micros(20_000 + xorshift(&mut x) % 10_000));
    }
    words.word(0).store(1, Ordering::SeqCst);
    for w in &writers {
        assert_eq!(w.wait(HANG), 0);
    }
    holds.sort();
    note!(
        "[writer holds begun while the reader waited: median {}, most {}] ",
        holds[10],
        holds[19]
    );
    // The hold it found, and one begun between its look and its mark (a writer woken by
    // that hold's release may go first: the reader marks the hold it sleeps on).
    assert!(
        holds[19] <= 2,
        "a reader waited while {} writer holds began: {holds:?}",
        holds[19]
    );
}

/// A writer W holds K and a reader R waits for it: `holders()` shows W's hold as waited
/// for by readers; R is stopped and W leaves: the key is kept for R (a `kept` row of mode
/// shared), and another writer is refused with a `Timeout` that says so. R, continued,
/// gets the key. A round that looked too late to tell (R's mark may have lapsed: it says
/// it waits every 100 ms, and a key is kept for 300 ms after that) is run again.
fn writer_told_why() {
    for round in 0..8 {
        let path = TempPath::new("shared-procs-writer-told-why");
        let table = LockTable::open(&path, 64).unwrap();
        let words = Shared::new(2); // [0] W may leave, [1] R got K
        let held = Gate::new();
        let mut w = Proc::new(fork(|| {
            let g = table.lock("K", opts(60_000, 1_000)).unwrap();
            held.signal();
            while words.word(0).load(Ordering::SeqCst) == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            drop(g);
            0
        }));
        held.await_signals(1);
        let mut r = Proc::new(fork(|| {
            drop(table.lock_shared("K", opts(60_000, 30_000)).unwrap());
            words.word(1).store(1, Ordering::SeqCst);
            0
        }));
        let t = Instant::now();
        while !table.holders().iter().any(|h| h.readers_wait) {
            assert!(
                t.elapsed() < HANG,
                "the reader never marked the writer's hold"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        let rows = table.holders();
        assert!(
            rows.iter()
                .any(|h| h.pid == w.pid() as u32 && h.readers_wait && !h.writer_waits),
            "{rows:?}"
        );
        common::probe::stop(r.pid());
        let stopped = Instant::now();
        words.word(0).store(1, Ordering::SeqCst);
        assert_eq!(w.wait(HANG), 0);
        let refused = table.lock("K", opts(60_000, 0));
        let rows = table.holders();
        let looked = stopped.elapsed();
        cont(r.pid());
        assert_eq!(r.wait(HANG), 0);
        note!(
            "[round {round}: {:?}, {} ms after the reader stopped] ",
            refused.as_ref().err().map(|e| e.to_string()),
            looked.as_millis()
        );
        if looked > Duration::from_millis(150) && round < 7 {
            continue; // too slow to tell: R's mark may have lapsed
        }
        let said = refused.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(said.ends_with("is kept for waiting readers"), "{said:?}");
        let kept: Vec<_> = rows
            .iter()
            .filter(|h| h.state == HolderState::Kept)
            .collect();
        assert_eq!(kept.len(), 1, "{rows:?}");
        assert!(
            kept[0].readers_wait && !kept[0].writer_waits && kept[0].mode == HoldMode::Shared,
            "{:?}",
            kept[0]
        );
        assert_eq!(words.word(1).load(Ordering::SeqCst), 1);
        return;
    }
}

// ---------------------------------------------------------------------------------------
// Chaos

const OUT: u64 = 0;
const READER: u64 = 1;
const WRITER: u64 = 2;
const PERMIT: u64 = 3;
const PERMITS: u32 = 2;
const SLOTS: usize = 256;
/// Words: [0] stop, [1] violations, [2] timeouts, [3..3+SLOTS] each worker's state, then
/// each worker's "doomed" mark (set by the parent before it kills it), then ops by kind.
const STATE: usize = 3;
const DOOMED: usize = STATE + SLOTS;
const OPS: usize = DOOMED + SLOTS;

fn chaos_worker(table: &LockTable, w: &Shared, me: usize) -> i32 {
    let sem = table.semaphore("S", PERMITS).unwrap();
    let mut x = 0x9e37_79b9 ^ (me as u64 * 0x1_0000_0001);
    let in_use = |i: usize| i != me && w.word(DOOMED + i).load(Ordering::SeqCst) == 0;
    while w.word(0).load(Ordering::SeqCst) == 0 {
        let r = xorshift(&mut x);
        let kind = match r % 10 {
            0..=4 => READER,
            5..=6 => WRITER,
            _ => PERMIT,
        };
        let o = opts(30_000, 3_000);
        let guard = match kind {
            READER => table.lock_shared("K", o).map(Guard::Read),
            WRITER => table.lock("K", o).map(Guard::Write),
            _ => sem.acquire(o).map(Guard::Permit),
        };
        let guard = match guard {
            Ok(g) => g,
            Err(Error::Timeout { .. }) => {
                w.word(2).fetch_add(1, Ordering::SeqCst);
                continue;
            }
            Err(e) => {
                eprintln!("worker {me}: {e}");
                return 1;
            }
        };
        w.word(STATE + me).store(kind, Ordering::SeqCst);
        let mut permits = 1;
        for i in 0..SLOTS {
            let other = w.word(STATE + i).load(Ordering::SeqCst);
            if other == OUT || !in_use(i) {
                continue;
            }
            let clash = match kind {
                READER => other == WRITER,
                WRITER => other == READER || other == WRITER,
                _ => {
                    permits += u32::from(other == PERMIT);
                    false
                }
            };
            if clash || permits > PERMITS {
                w.word(1).fetch_add(1, Ordering::SeqCst);
                eprintln!("worker {me} ({kind}) beside worker {i} ({other})");
            }
        }
        if r.is_multiple_of(4) {
            std::thread::sleep(Duration::from_micros(r >> 50));
        }
        w.word(STATE + me).store(OUT, Ordering::SeqCst);
        drop(guard);
        w.word(OPS + kind as usize).fetch_add(1, Ordering::SeqCst);
    }
    0
}

/// The three kinds of hold in one variable.
#[allow(dead_code)]
enum Guard<'a, 't> {
    Read(shmlock::LockGuard<'a, shmlock::Shared>),
    Write(shmlock::LockGuard<'a>),
    Permit(shmlock::LockGuard<'a, shmlock::Semaphore<'t>>),
}

fn chaos() {
    let secs: u64 = std::env::var("SHMLOCK_CHAOS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    let path = TempPath::new("shared-procs-chaos");
    let table = LockTable::open(&path, 64).unwrap();
    let w = Shared::new(OPS + 4);
    let n = 8;
    let mut next = 0;
    let spawn = |me: usize| {
        let (table, w) = (&table, &w);
        fork(move || chaos_worker(table, w, me))
    };
    let mut workers: Vec<(usize, Child)> = (0..n)
        .map(|_| {
            next += 1;
            (next - 1, spawn(next - 1))
        })
        .collect();
    let mut stopped: Vec<Option<Instant>> = vec![None; n];
    let (mut kills, mut stops) = (0, 0);
    let mut x = 0xc4a05_u64;
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        std::thread::sleep(Duration::from_micros(5_000 + xorshift(&mut x) % 30_000));
        for (i, s) in stopped.iter_mut().enumerate() {
            if s.is_some_and(|until| Instant::now() >= until) {
                cont(workers[i].1 .0);
                *s = None;
            }
        }
        let v = (xorshift(&mut x) % n as u64) as usize;
        if stopped[v].is_some() {
            continue;
        }
        if xorshift(&mut x).is_multiple_of(3) && next < SLOTS {
            w.word(DOOMED + workers[v].0).store(1, Ordering::SeqCst);
            workers[v].1.kill();
            kills += 1;
            next += 1;
            workers[v] = (next - 1, spawn(next - 1));
        } else {
            common::signal::send(workers[v].1 .0, libc::SIGSTOP);
            stops += 1;
            let pause = 50 + xorshift(&mut x) % 400;
            stopped[v] = Some(Instant::now() + Duration::from_millis(pause));
        }
    }
    for (i, s) in stopped.iter().enumerate() {
        if s.is_some() {
            cont(workers[i].1 .0);
        }
    }
    w.word(0).store(1, Ordering::SeqCst);
    for (_, c) in &workers {
        assert_eq!(c.wait(HANG), 0, "a worker failed");
    }
    let ops: Vec<u64> = (1..=3)
        .map(|k| w.word(OPS + k).load(Ordering::SeqCst))
        .collect();
    let violations = w.word(1).load(Ordering::SeqCst);
    note!(
        "[{secs} s: {} reads, {} writes, {} permits, {} timeouts, {kills} kills, {stops} stops, \
         {violations} violations] ",
        ops[0],
        ops[1],
        ops[2],
        w.word(2).load(Ordering::SeqCst)
    );
    assert_eq!(violations, 0);
    assert!(
        ops.iter().all(|&o| o > 0),
        "a kind never got through: {ops:?}"
    );
    // nothing leaked: the killed workers' holds are taken back, nothing else is left
    table.reap().unwrap();
    let left = table.holders();
    assert!(left.is_empty(), "left behind: {left:?}");
    let sem = table.semaphore("S", PERMITS).unwrap();
    let a = sem.try_acquire(HANG).unwrap().expect("a permit");
    let b = sem.try_acquire(HANG).unwrap().expect("both permits");
    drop((a, b));
    assert!(table.try_lock_with_lease("K", HANG).unwrap().is_some());
}

// ---------------------------------------------------------------------------------------
// Idle entries (a read hold or permit given back with nobody waiting, kept for its process
// to take again: `src/shm/table/idle.rs`)

/// The pid that inspection shows for the one shared hold of the table.
fn shared_holder(table: &LockTable) -> u32 {
    let h = table.holders();
    assert_eq!(h.len(), 1, "{h:?}");
    assert_eq!(h[0].mode, HoldMode::Shared);
    h[0].pid
}

fn forked_child_idle() {
    let path = TempPath::new("shared-procs-fork-idle");
    let table = LockTable::open(&path, 64).unwrap();
    let me = std::process::id();
    let r = table.lock_shared("K", opts(60_000, 1_000)).unwrap();
    assert_eq!(shared_holder(&table), me);
    drop(r); // idle, and remembered by this handle, which the child inherits
    assert!(table.holders().is_empty());
    let mut held = Gate::new();
    let mut done = Gate::new();
    let child = {
        let (table, held, done) = (&table, &mut held, &mut done);
        fork(move || {
            let r = table.lock_shared("K", opts(60_000, 1_000));
            held.signal(); // (failed or not: the parent waits for it)
            done.wait();
            let Ok(r) = r else { return 2 };
            drop(r);
            // and again: its own idle entry this time
            let r = table.lock_shared("K", opts(60_000, 1_000)).unwrap();
            let ok = table.holders().iter().all(|h| h.pid == std::process::id());
            drop(r);
            i32::from(!ok)
        })
    };
    held.await_signals(1);
    assert_eq!(
        shared_holder(&table),
        child.0 as u32,
        "the child's hold is the child's, not its parent's idle entry taken again"
    );
    // the parent reads beside it
    let r = table.lock_shared("K", opts(60_000, 1_000)).unwrap();
    let mut pids: Vec<u32> = table.holders().iter().map(|h| h.pid).collect();
    pids.sort_unstable();
    let mut want = vec![me, child.0 as u32];
    want.sort_unstable();
    assert_eq!(pids, want);
    drop(r);
    done.open();
    assert_eq!(child.wait(HANG), 0);
    // a writer gets the key at once: idle entries are nobody's
    let w = table
        .try_lock_with_lease("K", HANG)
        .unwrap()
        .expect("the key is free");
    drop(w);
    let r = table.lock_shared("K", opts(60_000, 1_000)).unwrap();
    assert_eq!(shared_holder(&table), me);
    drop(r);
}

fn idle_never_fills() {
    let path = TempPath::new("shared-procs-idle-full");
    let table = LockTable::open(&path, 4).unwrap(); // 16 slots
    let mut held = Gate::new();
    let mut done = Gate::new();
    let reader = {
        let (table, held, done) = (&table, &mut held, &mut done);
        fork(move || {
            let mut failed = 0;
            for i in 0..16 {
                let r = table.lock_shared(format!("r{i}"), opts(60_000, 1_000));
                let p = table.semaphore(format!("p{i}"), 2).unwrap();
                let q = p.acquire(opts(60_000, 1_000));
                for e in [r.err(), q.err()].into_iter().flatten() {
                    eprintln!("reader: {e}");
                    failed = 1;
                }
            }
            held.signal(); // (failed or not: the parent waits for it)
            done.wait(); // alive, its idle entries kept
            failed
        })
    };
    held.await_signals(1);
    // every slot, idle or free, goes to the writers of other keys
    let writers: Vec<_> = (0..16)
        .map(|i| {
            table
                .try_lock_with_lease(format!("w{i}"), HANG)
                .unwrap_or_else(|e| panic!("w{i}: {e}"))
                .unwrap_or_else(|| panic!("w{i} busy"))
        })
        .collect();
    assert_eq!(table.holders().len(), 16);
    assert!(matches!(
        table.try_lock_with_lease("w16", HANG),
        Err(Error::TableFull { .. })
    ));
    drop(writers);
    done.open();
    assert_eq!(reader.wait(HANG), 0);
}
