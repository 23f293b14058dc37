//! The writer's mark on readers' holds, and shared holds far from home, with real
//! processes: a timed-out or killed writer's mark lapses even while a reader renews its
//! lease (a renewal moves the hold's word, not the hold the mark is kept for); the last
//! reader a writer waits for leaves the key to it (kept from readers while the writer is
//! stopped, theirs soon after a killed writer's last word; none kept for a writer that
//! gave up, and no reader kept out by one that gives up again and again); chaos of readers, writers and permit holders with renewals and downgrades, on keys
//! displaced 15 or more slots from home (the reach in the home's overflow word), under
//! SIGKILL and SIGSTOP.
//!
//! The first two failed every run before the writer's mark was kept per hold (a second
//! adversarial review's finding).
//! Guards `src/shm/table/mod.rs` (`mark_for_writer`, `writer_gone`, `reserved`), `hold.rs`
//! (the release that keeps the key), `claim.rs`, `recover.rs` and
//! `src/shm/attachment.rs` (the writer's mark).
//!
//! `shared_writers [FILTER]` runs the tests whose name contains FILTER.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::fork::{fork, xorshift, Gate, Shared};
use common::harness::Test;
use common::probe::{cont, header_u64, place, Proc};
use common::{opts, TempPath};
use shmlock::{Error, HoldMode, HolderState, LockTable};

const TESTS: &[Test] = &[
    Test::new(
        "a_timed_out_writers_mark_lapses_even_while_a_reader_renews",
        renewing_reader_timed_out_writer,
    ),
    Test::new(
        "a_killed_writers_mark_lapses_even_while_a_reader_renews",
        renewing_reader_killed_writer,
    ),
    Test::new(
        "chaos_mixed_modes_renewals_downgrades_far_from_home",
        far_chaos,
    ),
    Test::new(
        "the_last_reader_a_writer_waits_for_leaves_the_key_to_it",
        key_kept_for_a_stopped_writer,
    ),
    Test::new(
        "a_killed_writers_kept_key_goes_to_readers",
        key_kept_for_a_killed_writer,
    ),
    Test::new(
        "force_unlock_frees_a_key_kept_for_a_writer",
        force_unlock_of_a_kept_key,
    ),
    Test::new(
        "a_reader_kept_out_for_a_writer_is_told_why",
        reader_told_why,
    ),
    Test::new(
        "a_writer_that_gives_up_leaves_no_key_kept_for_it",
        writer_gives_up,
    ),
    #[cfg(feature = "tokio")]
    Test::new(
        "a_forked_copy_of_a_waiting_async_writer_dropped_takes_nothing",
        forked_copy_of_a_waiting_writer,
    ),
    Test::new(
        "another_writer_giving_up_again_and_again_lets_no_reader_past_a_waiting_writer",
        giver_beside_a_waiting_writer,
    ),
    Test::new(
        "a_writer_giving_up_again_and_again_keeps_no_reader_out",
        writer_gives_up_again_and_again,
    ),
];

fn main() {
    common::harness::run("shared_writers", TESTS, common::harness::no_roles);
}

const HANG: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------
// 1. A reader that renews its lease: each renewal keeps ww but changes the entry's ident,
//    and `writer_gone` keys its clock to the ident: does a gone writer's mark ever lapse?

fn renewing_reader(table: &LockTable, held: &mut Gate, stop: &Shared) -> Proc {
    Proc::new(fork(move || {
        let mut g = table.lock_shared("K", opts(2_000, 1_000)).unwrap();
        held.signal();
        // renew every 100 ms until told to stop (a keep-alive, as a long reader does)
        let every: u64 = std::env::var("ATK_RENEW_MS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(100);
        while stop.word(0).load(Ordering::SeqCst) == 0 {
            std::thread::sleep(Duration::from_millis(every));
            if let Err(e) = g.expire(Some(Duration::from_secs(2))) {
                eprintln!("renewing reader: {e}");
                return 1;
            }
        }
        drop(g);
        0
    }))
}

fn new_reader_after(table: &LockTable, what: &str) {
    let t = Instant::now();
    let got = table.lock_shared("K", opts(60_000, 4_000));
    note!(
        "[new reader after the {what}: {:?} after {:.0} ms] ",
        got.as_ref().map(|_| ()),
        t.elapsed().as_secs_f64() * 1e3
    );
    assert!(
        got.is_ok(),
        "a {what}'s mark kept a new reader out for 4 s (its mark should lapse in 0.5 s) \
         while the old reader renewed: {:?}",
        got.err()
    );
}

fn renewing_reader_timed_out_writer() {
    let path = TempPath::new("atk2-renew-timeout");
    let table = LockTable::open(&path, 64).unwrap();
    let (mut held, stop) = (Gate::new(), Shared::new(1));
    let mut r = renewing_reader(&table, &mut held, &stop);
    held.await_signals(1);
    let w = fork(|| match table.lock("K", opts(60_000, 300)) {
        Err(Error::Timeout { .. }) => 0,
        Ok(_) => 2,
        Err(_) => 1,
    });
    assert_eq!(w.wait(HANG), 0, "the writer should have timed out");
    new_reader_after(&table, "timed-out writer");
    stop.word(0).store(1, Ordering::SeqCst);
    assert_eq!(r.wait(HANG), 0);
}

fn renewing_reader_killed_writer() {
    let path = TempPath::new("atk2-renew-kill");
    let table = LockTable::open(&path, 64).unwrap();
    let (mut held, stop) = (Gate::new(), Shared::new(1));
    let mut r = renewing_reader(&table, &mut held, &stop);
    held.await_signals(1);
    let mut w = Proc::new(fork(|| {
        let _ = table.lock("K", opts(60_000, 60_000));
        0
    }));
    let t = Instant::now();
    while !table.holders().iter().any(|h| h.waiters) {
        assert!(t.elapsed() < HANG, "the writer never waited");
        std::thread::sleep(Duration::from_millis(2));
    }
    std::thread::sleep(Duration::from_millis(150));
    w.kill();
    new_reader_after(&table, "killed writer");
    stop.word(0).store(1, Ordering::SeqCst);
    assert_eq!(r.wait(HANG), 0);
}

// ---------------------------------------------------------------------------------------
// 2. The key kept for a writer. A reader R holds K, a writer W waits for it (its mark on
//    R's hold), and W is stopped (SIGSTOP) so that it cannot take the key when R leaves:
//    the race a reader used to win whenever it came before the woken writer. R's release
//    keeps the key for W: R itself (whose release is not kept idle for it) and another
//    process are refused it, W takes it once continued, and readers get it after W. If W
//    is killed instead, the key stays kept only while W's last word is recent (300 ms),
//    then a reader gets it.

/// A key is kept for a writer that said within 300 ms that it waits (`WRITER_ACTIVE_MS`;
/// a waiting writer says so every 100 ms at least); a round whose refusals were not all
/// seen well within that of the writer's stop is inconclusive, and run again.
const WELL_WITHIN_LAPSE: Duration = Duration::from_millis(200);

/// A reader process holding K (it does when this returns) until `shared`'s word 0 is set;
/// then it releases K and ends with what `then` returns.
fn reader_holding(table: &LockTable, shared: &Shared, then: impl FnOnce() -> i32) -> Proc {
    let held = Gate::new();
    let r = Proc::new(fork(|| {
        let g = table.lock_shared("K", opts(60_000, 1_000)).unwrap();
        held.signal();
        while shared.word(0).load(Ordering::SeqCst) == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(g);
        then()
    }));
    held.await_signals(1);
    r
}

/// Sets up R holding K and W waiting for it, stopped; then R leaves and tries again at
/// once. Returns W (stopped), the instant it was stopped, and whether R was refused.
fn reader_leaves_a_stopped_writer(table: &LockTable, shared: &Shared) -> (Proc, Instant, bool) {
    let mut r = reader_holding(table, shared, || {
        // at once again: the release kept nothing idle for this process
        match table.try_lock_shared("K", Duration::from_secs(60)) {
            Ok(None) => 0,
            Ok(Some(_)) => 3,
            Err(_) => 1,
        }
    });
    let w = Proc::new(fork(|| {
        let g = table.lock("K", opts(60_000, 30_000)).unwrap();
        shared.word(1).store(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(200));
        drop(g);
        0
    }));
    let t = Instant::now();
    while !table.holders().iter().any(|h| h.waiters) {
        assert!(t.elapsed() < HANG, "the writer never waited");
        std::thread::sleep(Duration::from_millis(2));
    }
    // (a look of the writer's after its flag: its mark is on the hold by then)
    std::thread::sleep(Duration::from_millis(20));
    common::probe::stop(w.pid());
    let stopped = Instant::now();
    shared.word(0).store(1, Ordering::SeqCst);
    let refused = r.wait(HANG) == 0;
    (w, stopped, refused)
}

/// Runs rounds of [`reader_leaves_a_stopped_writer`] in a table of their own until one
/// is conclusive: `round` returns `None` when it looked too late to tell (its writer's
/// mark may have lapsed by itself), which a slow machine is allowed three times. The
/// writer (`w`, stopped) is continued and waited for after each round, if the round did
/// not.
fn until_conclusive(
    name: &str,
    mut round: impl FnMut(usize, &LockTable, &Shared, &Proc, Instant, bool) -> Option<()>,
) {
    for n in 0.. {
        let path = TempPath::new(name);
        let table = LockTable::open(&path, 64).unwrap();
        let shared = Shared::new(2);
        let (mut w, stopped, r_refused) = reader_leaves_a_stopped_writer(&table, &shared);
        let done = round(n, &table, &shared, &w, stopped, r_refused);
        cont(w.pid());
        assert_eq!(w.wait(HANG), 0);
        if done.is_some() || n >= 3 {
            return;
        }
    }
}

fn key_kept_for_a_stopped_writer() {
    until_conclusive(
        "kept-for-writer",
        |round, table, shared, w, stopped, r_refused| {
            let other = table.try_lock_shared("K", Duration::from_secs(60)).unwrap();
            let looked = stopped.elapsed();
            let other_refused = other.is_none();
            drop(other);
            note!("[round {round}: R refused {r_refused}, another reader refused {other_refused}, {} ms after the writer stopped] ", looked.as_millis());
            if looked > WELL_WITHIN_LAPSE && round < 3 {
                return None; // too slow a machine to tell: the writer's mark may have lapsed
            }
            assert!(
                r_refused,
                "the reader that left took the key again before the writer"
            );
            assert!(
                other_refused,
                "a new reader took the key before the writer waiting for it"
            );
            cont(w.pid());
            // the writer takes it, then readers get it after the writer
            let t = Instant::now();
            let after = table.lock_shared("K", opts(60_000, 20_000));
            assert!(after.is_ok(), "{:?}", after.err());
            assert_eq!(
                shared.word(1).load(Ordering::SeqCst),
                1,
                "a reader got the key before the continued writer ({:?} after SIGCONT)",
                t.elapsed()
            );
            Some(())
        },
    );
}

fn key_kept_for_a_killed_writer() {
    let path = TempPath::new("kept-for-dead-writer");
    let table = LockTable::open(&path, 64).unwrap();
    let shared = Shared::new(2);
    let (mut w, _, _) = reader_leaves_a_stopped_writer(&table, &shared);
    w.kill();
    let t = Instant::now();
    let got = table.lock_shared("K", opts(60_000, 10_000));
    note!(
        "[a reader after the writer's kill: {:?} in {} ms] ",
        got.as_ref().map(|_| ()),
        t.elapsed().as_millis()
    );
    assert!(
        got.is_ok(),
        "a killed writer's kept key never came to readers: {:?}",
        got.err()
    );
    assert_eq!(shared.word(1).load(Ordering::SeqCst), 0);
}

/// A reader refused for a writer's sake hears why (its `Timeout` says a writer waits), and
/// `holders()` shows it: the marked readers' holds, then the key kept for the writer (a
/// review's finding: readers were refused for up to 300 ms with nothing to show for it).
fn reader_told_why() {
    let refused = |table: &LockTable| match table.lock_shared("K", opts(60_000, 0)) {
        Err(e @ Error::Timeout { .. }) => {
            let Error::Timeout {
                holder: Some(h), ..
            } = &e
            else {
                panic!("no holder seen: {e}")
            };
            (h.clone(), e.to_string())
        }
        other => panic!("a reader beside a waiting writer: {other:?}"),
    };
    // A reader holds K, a writer waits for it.
    let path = TempPath::new("told-why");
    let table = LockTable::open(&path, 64).unwrap();
    let go = Shared::new(1);
    let mut r = reader_holding(&table, &go, || 0);
    let mut w = Proc::new(fork(|| {
        drop(table.lock("K", opts(60_000, 30_000)).unwrap());
        0
    }));
    let t = Instant::now();
    while !table.holders().iter().any(|h| h.writer_waits) {
        assert!(
            t.elapsed() < HANG,
            "the writer never marked the reader's hold"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let (h, said) = refused(&table);
    note!("[{said}] ");
    assert!(h.writer_waits && h.pid == Some(r.pid() as u32), "{h:?}");
    assert!(said.contains("a writer waiting"), "{said}");
    let rows = table.holders();
    assert!(
        rows.iter()
            .any(|h| h.pid == r.pid() as u32 && h.writer_waits && h.mode == HoldMode::Shared),
        "{rows:?}"
    );
    go.word(0).store(1, Ordering::SeqCst);
    assert_eq!(r.wait(HANG), 0);
    assert_eq!(w.wait(HANG), 0);
    // Once the writer has held and released it, nothing says a writer waits.
    assert!(table.holders().iter().all(|h| !h.writer_waits));
    drop(table.lock_shared("K", opts(60_000, 0)).unwrap());

    // The reader left while the writer was stopped: the key is kept for the writer.
    until_conclusive("told-why-kept", |round, table, _, _, stopped, r_refused| {
        let rows = table.holders();
        let (h, said) = refused(table);
        let looked = stopped.elapsed();
        note!(
            "[round {round}: {said}, {} ms after the writer stopped] ",
            looked.as_millis()
        );
        if looked > WELL_WITHIN_LAPSE && round < 3 {
            return None; // the writer's mark may have lapsed by itself
        }
        assert!(r_refused);
        assert_eq!((h.pid, h.held_for, h.writer_waits), (None, None, true));
        assert_eq!(h.to_string(), "kept for a waiting writer");
        assert!(said.ends_with("is kept for a waiting writer"), "{said}");
        let kept: Vec<_> = rows
            .iter()
            .filter(|h| h.state == HolderState::Kept)
            .collect();
        assert_eq!(kept.len(), 1, "{rows:?}");
        let k = kept[0];
        assert_eq!(k.key_preview, b"K");
        assert!(
            k.writer_waits && k.pid == 0 && k.mode == HoldMode::Exclusive,
            "{k:?}"
        );
        assert_eq!(rows.len(), 1, "nobody else holds K: {rows:?}");
        Some(())
    });
}

/// `force_unlock` breaks whatever keeps a key busy: a key kept for a (stopped) writer
/// goes to the next reader at once, not once the writer's mark lapses.
fn force_unlock_of_a_kept_key() {
    until_conclusive("kept-forced", |round, table, _, _, stopped, _| {
        let before = table.try_lock_shared("K", Duration::from_secs(60)).unwrap();
        let refused = before.is_none();
        drop(before);
        let broken = table.force_unlock("K").unwrap();
        let after = table.try_lock_shared("K", Duration::from_secs(60)).unwrap();
        let looked = stopped.elapsed();
        note!("[round {round}: refused before {refused}, holders broken {}, a reader after: {}, {} ms after the writer stopped] ", broken.is_some(), after.is_some(), looked.as_millis());
        if looked > WELL_WITHIN_LAPSE && round < 3 {
            return None; // the mark may have lapsed by itself
        }
        assert!(refused, "a reader took a key kept for a writer");
        assert!(
            after.is_some(),
            "force_unlock left the key kept for the writer"
        );
        Some(())
    });
}

/// A writer that gives up waiting for a reader, by its timeout or by its `lock_async`
/// future being dropped, leaves no key kept for it: the reader's release frees the key
/// (a reader waited a second for a free key: the review's finding, under "try to write,
/// else go on" loops reader holds halved). Its mark on the reader's hold, aged, is left to
/// lapse (a mark is no writer's in particular: another writer waiting for the same reader
/// keeps it fresh, and clearing it took that writer's preference away).
fn writer_gives_up() {
    for asynchronous in [false, true] {
        if asynchronous && !cfg!(feature = "tokio") {
            continue;
        }
        let path = TempPath::new("writer-gives-up");
        let table = LockTable::open(&path, 64).unwrap();
        let shared = Shared::new(1);
        let mut r = reader_holding(&table, &shared, || 0);
        let mut w = Proc::new(fork(|| {
            let gave_up = if asynchronous {
                lock_dropped_after(&table, Duration::from_millis(150))
            } else {
                matches!(
                    table.lock("K", opts(60_000, 150)),
                    Err(Error::Timeout { .. })
                )
            };
            i32::from(!gave_up)
        }));
        assert_eq!(
            w.wait(HANG),
            0,
            "the writer did not give up (async: {asynchronous})"
        );
        let t = Instant::now();
        let beside = table.try_lock_shared("K", Duration::from_secs(60)).unwrap();
        let beside_ok = beside.is_some();
        drop(beside);
        shared.word(0).store(1, Ordering::SeqCst);
        assert_eq!(r.wait(HANG), 0);
        let after = table.try_lock_shared("K", Duration::from_secs(60)).unwrap();
        note!(
            "[{}: a reader beside the held one {beside_ok}, after its release {}, {} ms after the writer gave up] ",
            if asynchronous { "dropped future" } else { "timeout" },
            after.is_some(),
            t.elapsed().as_millis()
        );
        assert!(
            after.is_some(),
            "the key was kept for a writer that gave up (async: {asynchronous})"
        );
    }
}

/// A writer's `lock_async` dropped after `after` (by `tokio::time::timeout`): whether it
/// was still waiting then.
#[cfg(feature = "tokio")]
fn lock_dropped_after(table: &LockTable, after: Duration) -> bool {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(after, table.lock_async("K", opts(60_000, 30_000)))
            .await
            .is_err()
    })
}

#[cfg(not(feature = "tokio"))]
fn lock_dropped_after(_: &LockTable, _: Duration) -> bool {
    unreachable!("only with tokio")
}

/// A `lock_async` writer waiting for a reader, its future copied into a forked child that
/// drops it: the child takes back nothing of its parent's wait (before, the drop aged the
/// parent's marks, so the reader's release kept nothing for the parent, and a new reader
/// went first). With the tokio feature only.
#[cfg(feature = "tokio")]
fn forked_copy_of_a_waiting_writer() {
    for round in 0.. {
        match forked_copy_round(round) {
            Some(()) => return,
            None if round < 3 => continue,
            None => panic!("4 rounds too slow to tell"),
        }
    }
}

#[cfg(feature = "tokio")]
fn forked_copy_round(round: usize) -> Option<()> {
    // words: [0] R may leave, [1] R has left, [2] the writer holds or held K
    let path = TempPath::new("forked-async-writer");
    let table = LockTable::open(&path, 64).unwrap();
    let shared = Shared::new(3);
    let mut r = reader_holding(&table, &shared, || {
        shared.word(1).store(1, Ordering::SeqCst);
        0
    });
    // N: a new reader, trying from R's release on; 0 if it got K only after the writer
    let mut n = Proc::new(fork(|| {
        while shared.word(1).load(Ordering::SeqCst) == 0 {
            std::hint::spin_loop();
        }
        let t = Instant::now();
        loop {
            let writer_first = shared.word(2).load(Ordering::SeqCst) == 1;
            if table
                .try_lock_shared("K", Duration::from_secs(60))
                .unwrap()
                .is_some()
            {
                return if writer_first { 0 } else { 1 };
            }
            assert!(t.elapsed() < HANG);
        }
    }));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let looked = rt.block_on(async {
        let mut fut = Some(Box::pin(table.lock_async("K", opts(60_000, 30_000))));
        let t = Instant::now();
        while !table.holders().iter().any(|h| h.writer_waits) {
            let f = fut.as_mut().unwrap();
            assert!(tokio::time::timeout(Duration::from_millis(5), f)
                .await
                .is_err());
            assert!(
                t.elapsed() < HANG,
                "the writer never marked the reader's hold"
            );
        }
        // (the writer's last look, which refreshed its mark)
        let polled = Instant::now();
        let mut child = Proc::new(fork(|| {
            drop(fut.take());
            0
        }));
        assert_eq!(child.wait(HANG), 0);
        // R leaves, and N tries, while this process's writer is not polled
        shared.word(0).store(1, Ordering::SeqCst);
        while shared.word(1).load(Ordering::SeqCst) == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(10));
        let looked = polled.elapsed();
        let g = fut.take().unwrap().await.unwrap();
        shared.word(2).store(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(20));
        drop(g);
        looked
    });
    assert_eq!(r.wait(HANG), 0);
    let n_after = n.wait(HANG);
    note!("[round {round}: R left {} ms after the writer's last look; the new reader got K {} the writer] ", looked.as_millis(), if n_after == 0 { "after" } else { "before" });
    if looked > WELL_WITHIN_LAPSE && n_after != 0 {
        return None; // too slow to tell: the writer's own mark may no longer keep the key
    }
    assert_eq!(
        n_after, 0,
        "a new reader took K before the writer: the child's drop took the parent's wait"
    );
    Some(())
}

// ---------------------------------------------------------------------------------------
// 3. Chaos far from home: fillers hold the home and the 14 slots after it (and one filler
//    process releases and retakes them, opening holes), so the contended keys sit 15+
//    slots out, where the reach lives in the home's overflow word. Workers take readers,
//    writers and permits, renew, downgrade; SIGKILL and SIGSTOP at random. Checked through
//    a shared mapping: never a writer beside anyone, never more permits than the count.

const NKEYS: usize = 4;
const LIMITS: [u32; NKEYS] = [0, 0, 2, 1]; // keys 0,1: rw; key 2: sem of 2; key 3: sem of 1
const WORKERS: usize = 8;
const MAXW: usize = 256;
const ST: usize = 4; // [0] stop [1] violations [2] errors [3] max distance seen
const DOOM: usize = ST + NKEYS * MAXW;
const OPSW: usize = DOOM + MAXW;

fn home_keys(path: &TempPath, prefix: &str, n: usize, home: u64) -> Vec<String> {
    let seed = header_u64(path.as_ref(), 32);
    let len = header_u64(path.as_ref(), 16);
    let mut out = Vec::new();
    let mut i = 0;
    while out.len() < n {
        let k = format!("{prefix}{i}");
        i += 1;
        if place(seed, len, &k).0 == home {
            out.push(k);
        }
    }
    out
}

enum G<'a, 't> {
    R(#[allow(dead_code)] shmlock::LockGuard<'a, shmlock::Shared>),
    W(#[allow(dead_code)] shmlock::LockGuard<'a>),
    P(#[allow(dead_code)] shmlock::LockGuard<'a, shmlock::Semaphore<'t>>),
}

fn far_worker(table: &LockTable, w: &Shared, keys: &[String], me: usize) -> i32 {
    let mut x = 0x1234_5678_9abc_u64 ^ (me as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let in_use = |i: usize| w.word(DOOM + i).load(Ordering::SeqCst) == 0;
    let check = |ki: usize, kind: u64, limit: u32| {
        let mut permits = 0;
        for i in 0..MAXW {
            let other = w.word(ST + ki * MAXW + i).load(Ordering::SeqCst);
            if other == 0 || i == me || !in_use(i) {
                continue;
            }
            let clash = match kind {
                1 => other == 2,
                2 => true,
                _ => {
                    permits += 1;
                    other != 3
                }
            };
            if clash || (kind == 3 && permits + 1 > limit) {
                w.word(1).fetch_add(1, Ordering::SeqCst);
                eprintln!(
                    "worker {me} ({kind}) on key {ki} beside {i} ({other}) permits {}",
                    permits + 1
                );
            }
        }
    };
    while w.word(0).load(Ordering::SeqCst) == 0 {
        let r = xorshift(&mut x);
        let ki = (r % NKEYS as u64) as usize;
        let key = &keys[ki];
        let limit = LIMITS[ki];
        let kind: u64 = if limit > 0 {
            3
        } else if (r >> 8).is_multiple_of(3) {
            2
        } else {
            1
        };
        let o = opts(20_000, 3_000);
        let sem = table.semaphore(key, limit.max(1)).unwrap();
        let g = match kind {
            1 => table.lock_shared(key, o).map(G::R),
            2 => table.lock(key, o).map(G::W),
            _ => sem.acquire(o).map(G::P),
        };
        let mut g = match g {
            Ok(g) => g,
            Err(Error::Timeout { .. }) => continue,
            Err(e) => {
                eprintln!("worker {me}: {e}");
                w.word(2).fetch_add(1, Ordering::SeqCst);
                return 1;
            }
        };
        let mut kind = kind;
        w.word(ST + ki * MAXW + me).store(kind, Ordering::SeqCst);
        check(ki, kind, limit);
        // renew (keeps ww / waiters), maybe several times
        if (r >> 16).is_multiple_of(2) {
            for _ in 0..((r >> 20) % 4) {
                let res = match &mut g {
                    G::R(g) => g.expire(Some(Duration::from_secs(20))),
                    G::W(g) => g.expire(Some(Duration::from_secs(20))),
                    G::P(g) => g.expire(Some(Duration::from_secs(20))),
                };
                if let Err(e) = res {
                    eprintln!("worker {me}: renew: {e}");
                    w.word(2).fetch_add(1, Ordering::SeqCst);
                    return 1;
                }
                std::thread::sleep(Duration::from_micros((r >> 24) % 500));
                check(ki, kind, limit);
            }
        }
        // downgrade a writer now and then: mark reader *before* the downgrade lands
        // (a reader beside other readers is fine either way)
        if kind == 2 && (r >> 30).is_multiple_of(2) {
            if let G::W(wg) = g {
                w.word(ST + ki * MAXW + me).store(1, Ordering::SeqCst);
                kind = 1;
                match wg.downgrade() {
                    Ok(rg) => g = G::R(rg),
                    Err(e) => {
                        eprintln!("worker {me}: downgrade: {e}");
                        w.word(2).fetch_add(1, Ordering::SeqCst);
                        return 1;
                    }
                }
                check(ki, kind, limit);
            }
        }
        if r.is_multiple_of(3) {
            std::thread::sleep(Duration::from_micros((r >> 40) % 3000));
        }
        check(ki, kind, limit);
        w.word(ST + ki * MAXW + me).store(0, Ordering::SeqCst);
        drop(g);
        w.word(OPSW + kind as usize).fetch_add(1, Ordering::SeqCst);
    }
    0
}

fn far_chaos() {
    let secs: u64 = std::env::var("ATK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    let path = TempPath::new("atk2-far");
    let table = LockTable::open(&path, 16).unwrap();
    let len = header_u64(path.as_ref(), 16);
    let home = 5 % len;
    let keys = home_keys(&path, "k", NKEYS, home);
    let fillers = home_keys(&path, "filler", 18, home);
    // the parent holds the first 13 fillers for good: home .. home+12
    let held: Vec<_> = fillers[..13]
        .iter()
        .map(|k| table.lock(k, opts(0, 1_000)).unwrap())
        .collect();
    let w = Shared::new(OPSW + 8);
    // a churner takes and gives back 5 more fillers (holes and reach raises on the home)
    let churn = {
        let (table, w, fillers) = (&table, &w, &fillers);
        Proc::new(fork(move || {
            let mut x = 77u64;
            let mut gs: Vec<Option<shmlock::LockGuard<'_>>> = (0..5).map(|_| None).collect();
            while w.word(0).load(Ordering::SeqCst) == 0 {
                let i = (xorshift(&mut x) % 5) as usize;
                if gs[i].is_some() {
                    gs[i] = None;
                } else {
                    gs[i] = table
                        .try_lock_with_lease(&fillers[13 + i], Duration::ZERO)
                        .ok()
                        .flatten();
                }
                std::thread::sleep(Duration::from_micros(200 + xorshift(&mut x) % 2000));
            }
            0
        }))
    };
    std::thread::sleep(Duration::from_millis(20));
    let mut next = 0usize;
    let spawn = |me: usize| {
        let (table, w, keys) = (&table, &w, &keys);
        fork(move || far_worker(table, w, keys, me))
    };
    let mut workers: Vec<(usize, Proc)> = (0..WORKERS)
        .map(|_| {
            next += 1;
            (next - 1, Proc::new(spawn(next - 1)))
        })
        .collect();
    let mut stopped: Vec<Option<Instant>> = vec![None; WORKERS];
    let mut x = 0xfeed_u64;
    let (mut kills, mut stops) = (0, 0);
    let mut maxd = 0u64;
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        std::thread::sleep(Duration::from_micros(3_000 + xorshift(&mut x) % 20_000));
        for k in &keys {
            if let Some((h, s)) = table.debug_placement(k) {
                maxd = maxd.max(((s + len as usize - h) % len as usize) as u64);
            }
        }
        for (i, s) in stopped.iter_mut().enumerate() {
            if s.is_some_and(|u| Instant::now() >= u) {
                cont(workers[i].1.pid());
                *s = None;
            }
        }
        let v = (xorshift(&mut x) % WORKERS as u64) as usize;
        if stopped[v].is_some() {
            continue;
        }
        if xorshift(&mut x).is_multiple_of(3) && next < MAXW {
            w.word(DOOM + workers[v].0).store(1, Ordering::SeqCst);
            workers[v].1.kill();
            kills += 1;
            next += 1;
            workers[v] = (next - 1, Proc::new(spawn(next - 1)));
        } else {
            common::signal::send(workers[v].1.pid(), libc::SIGSTOP);
            stops += 1;
            stopped[v] = Some(Instant::now() + Duration::from_millis(20 + xorshift(&mut x) % 300));
        }
    }
    for (i, s) in stopped.iter().enumerate() {
        if s.is_some() {
            cont(workers[i].1.pid());
        }
    }
    w.word(0).store(1, Ordering::SeqCst);
    let mut failed = 0;
    for (_, c) in &mut workers {
        if c.wait(HANG) != 0 {
            failed += 1;
        }
    }
    let mut churn = churn;
    assert_eq!(churn.wait(HANG), 0);
    let ops: Vec<u64> = (1..=3)
        .map(|k| w.word(OPSW + k).load(Ordering::SeqCst))
        .collect();
    let v = w.word(1).load(Ordering::SeqCst);
    note!("[{secs}s ops r/w/p {ops:?}, kills {kills}, stops {stops}, max distance {maxd}, violations {v}, failed {failed}] ");
    // nothing wedged: every key can be taken exclusively at once
    table.reap().unwrap();
    for k in &keys {
        let g = table.lock(k, opts(0, 2_000));
        assert!(
            g.is_ok(),
            "key {k} wedged: {:?} holders {:?}",
            g.err(),
            table.holders()
        );
    }
    drop(held);
    table.reap().unwrap();
    let left = table.holders();
    assert_eq!(v, 0, "violations");
    assert_eq!(failed, 0);
    assert!(left.is_empty(), "left: {left:?}");
}

/// A writer that tries for 5 ms every 240 ms and gives up each time, beside a reader that
/// holds the key throughout: new readers come in between its tries, in the 40 ms between
/// the lapse of the marks it aged (200 ms after each give-up) and its next try, with the
/// default schedule (steps up to half a second), as they wake when the marks lapse. (Its
/// marks, aged by each give-up only to 300 ms, kept them out until they lapsed at 1 s,
/// which its next try never let happen: a review's run, one other reader's hold in 6 s;
/// readers that slept out their step instead of waking at the lapse missed the windows:
/// a 3 s timeout, 3 runs of 3; docs/semantics.md.)
fn writer_gives_up_again_and_again() {
    let path = TempPath::new("gives-up-again");
    let table = LockTable::open(&path, 64).unwrap();
    let (held, stop) = (Gate::new(), Shared::new(1));
    let mut reader = Proc::new(fork(|| {
        let g = table.lock_shared("K", opts(120_000, 1_000)).unwrap();
        held.signal();
        while stop.word(0).load(Ordering::SeqCst) == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(g);
        0
    }));
    held.await_signals(1);
    let mut writer = Proc::new(fork(|| {
        let mut tries = 0;
        while stop.word(0).load(Ordering::SeqCst) == 0 {
            match table.lock("K", opts(60_000, 5)) {
                Err(Error::Timeout { .. }) => tries += 1,
                other => {
                    eprintln!("the writer's try: {:?}", other.map(|_| ()));
                    return 1;
                }
            }
            std::thread::sleep(Duration::from_millis(240));
        }
        i32::from(tries < 3) * 2
    }));
    // (the writer's first try marked the hold)
    std::thread::sleep(Duration::from_millis(100));
    // (the default schedule, whose steps grow to half a second: a reader behind the
    // writer's mark wakes when the mark lapses, not at the end of such a step)
    let look = opts(60_000, 3_000);
    let mut longest = Duration::ZERO;
    for n in 0..6 {
        let t = Instant::now();
        let got = table.lock_shared("K", look);
        let waited = t.elapsed();
        longest = longest.max(waited);
        if got.is_err() {
            stop.word(0).store(1, Ordering::SeqCst);
            let _ = (reader.wait(HANG), writer.wait(HANG));
        }
        assert!(
            got.is_ok(),
            "hold {n}: a writer giving up every 240 ms kept a new reader out for {waited:?}: \
             {:?}",
            got.err()
        );
        drop(got);
        std::thread::sleep(Duration::from_millis(50 + 37 * n));
    }
    note!("[6 holds beside the held key, longest wait {longest:.1?}] ");
    stop.word(0).store(1, Ordering::SeqCst);
    assert_eq!(reader.wait(HANG), 0);
    assert_eq!(
        writer.wait(HANG),
        0,
        "the writer gave up fewer than 3 times"
    );
}

/// A writer L waits for a reader that holds K throughout; another writer G tries K for
/// 2 ms every 100-110 ms and gives up, each give-up aging the marks on the reader's hold;
/// a third process tries to read K every half millisecond. L refreshes the marks within
/// 100 ms of each give-up (plus a clock tick and its wake-up), before they lapse: no read
/// hold ever begins while L waits (a review's finding: aged to one refresh period short of
/// lapsing, 156 reads got in beside L in 30 s, at 96-104 ms after a give-up).
fn giver_beside_a_waiting_writer() {
    let path = TempPath::new("giver-beside-writer");
    let table = LockTable::open(&path, 64).unwrap();
    // [0] R0 may leave, [1] the prober stops, [2] reads that got in, [3] L holds
    let shared = Shared::new(4);
    let mut r0 = reader_holding(&table, &shared, || 0);
    let mut l = Proc::new(fork(|| {
        let g = table.lock("K", opts(60_000, 60_000)).unwrap();
        shared.word(3).store(1, Ordering::SeqCst);
        drop(g);
        0
    }));
    let t = Instant::now();
    while !table.holders().iter().any(|h| h.writer_waits) {
        assert!(t.elapsed() < HANG, "L never marked the reader's hold");
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut prober = Proc::new(fork(|| {
        while shared.word(1).load(Ordering::SeqCst) == 0 {
            if table
                .try_lock_shared("K", Duration::from_secs(60))
                .unwrap()
                .is_some()
                && shared.word(3).load(Ordering::SeqCst) == 0
            {
                shared.word(2).fetch_add(1, Ordering::SeqCst);
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        0
    }));
    let mut x = 0x2545_f491;
    let gives = 60;
    for _ in 0..gives {
        assert!(matches!(
            table.lock("K", opts(60_000, 2)),
            Err(Error::Timeout { .. })
        ));
        std::thread::sleep(Duration::from_micros(100_000 + xorshift(&mut x) % 10_000));
    }
    shared.word(1).store(1, Ordering::SeqCst);
    assert_eq!(prober.wait(HANG), 0);
    let got_in = shared.word(2).load(Ordering::SeqCst);
    note!("[{gives} give-ups beside a waiting writer: {got_in} reads got in] ");
    shared.word(0).store(1, Ordering::SeqCst);
    assert_eq!(r0.wait(HANG), 0);
    assert_eq!(l.wait(HANG), 0);
    assert_eq!(got_in, 0, "reads got in while a writer waited");
}
