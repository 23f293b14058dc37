//! The counters kept in a table or dict file, which any process can read (`shmlock stats`).
//!
//! The file ends with [`STATS_CELLS`] cells of 64 words; a process adds to the cell of its
//! pid, with `fetch_add`, and a reader sums the cells. Events of the slow paths (a wait, a
//! timeout, a takeover, a full table, a dict write) are added as they happen. The events of
//! the fast paths are too frequent for a locked add each (one costs 5 ns here, a sixth of an
//! uncontended lock+unlock): an acquisition, a dict hit or miss is counted in the thread's
//! own memory and added to the file at its first event once [`FLUSH_AFTER`] of the table
//! clock has passed since the last time, when it turns to another table, when this process
//! reads the counters or drops its handle, and when the thread exits; so the file trails a
//! running thread by less than that. A hold's length needs a clock read at its release
//! (11 ns here), so one hold in [`HOLD_SAMPLE`] is timed: the hold histogram is a sample.
//!
//! A Redis handle keeps one such cell in its own memory (`RedisLocks::stats`: what this
//! process's handle did).

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::shm::format::STATS_CELLS;
use crate::shm::mapping::Mapping;

/// Words of a cell.
pub(crate) const CELL_WORDS: usize = 64;

// The words of a cell. Lock table (and Redis handle):
pub(crate) const ACQUISITIONS: usize = 0;
pub(crate) const CONTENDED: usize = 1;
pub(crate) const TIMEOUTS: usize = 2;
pub(crate) const DEAD_TAKEOVERS: usize = 3;
pub(crate) const EXPIRED_TAKEOVERS: usize = 4;
pub(crate) const TABLE_FULL: usize = 5;
pub(crate) const LOST: usize = 6;
pub(crate) const WAIT_NS: usize = 7;
pub(crate) const HOLD_NS: usize = 8;
pub(crate) const HOLD_SAMPLES: usize = 9;
// Shared dict:
pub(crate) const HITS: usize = 10;
pub(crate) const MISSES: usize = 11;
pub(crate) const SETS: usize = 12;
// (a dict's evictions are in its control page, counted under the writer lock)
/// Histogram buckets: bucket `i < BUCKETS - 1` counts values below 2^i µs (and at least
/// 2^(i-1) µs), the last one the rest (4.2 s and more).
pub(crate) const BUCKETS: usize = 24;
pub(crate) const WAIT_BUCKETS: usize = 16;
pub(crate) const HOLD_BUCKETS: usize = WAIT_BUCKETS + BUCKETS;
const _: () = assert!(HOLD_BUCKETS + BUCKETS <= CELL_WORDS);

/// A thread adds its fast-path counts to the file once this much of the table clock has
/// passed since it last did.
pub(crate) const FLUSH_AFTER: Duration = Duration::from_millis(100);
/// One hold in this many is timed.
pub(crate) const HOLD_SAMPLE: u32 = 16;

/// The bucket of a duration.
pub(crate) fn bucket(d_ns: u64) -> usize {
    let us = d_ns / 1000;
    // below 1 µs: bucket 0; below 2^i µs: bucket i
    let b = (u64::BITS - us.leading_zeros()) as usize;
    b.min(BUCKETS - 1)
}

/// Cells of counters: the end of a mapped file, or a Redis handle's own one.
#[derive(Clone, Copy)]
pub(crate) struct Cells<'a>(pub &'a [AtomicU64]);

impl<'a> Cells<'a> {
    /// The counters of a mapped file.
    pub(crate) fn of(map: &'a Mapping) -> Cells<'a> {
        Cells(map.stats())
    }

    /// The cell this process adds to.
    fn mine(self) -> &'a [AtomicU64] {
        let cells = self.0.len() / CELL_WORDS;
        let i = if cells > 1 {
            crate::shm::process::current_pid() as usize % cells
        } else {
            0
        };
        &self.0[i * CELL_WORDS..(i + 1) * CELL_WORDS]
    }

    pub(crate) fn add(self, word: usize, n: u64) {
        if n != 0 {
            self.mine()[word].fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Adds a duration to a histogram (`buckets`: its first word) and to its sum.
    pub(crate) fn time(self, buckets: usize, sum: usize, d_ns: u64) {
        let cell = self.mine();
        cell[buckets + bucket(d_ns)].fetch_add(1, Ordering::Relaxed);
        cell[sum].fetch_add(d_ns, Ordering::Relaxed);
    }

    /// Every cell summed.
    pub(crate) fn totals(self) -> [u64; CELL_WORDS] {
        let mut t = [0u64; CELL_WORDS];
        for cell in self.0.chunks_exact(CELL_WORDS) {
            for (sum, w) in t.iter_mut().zip(cell) {
                *sum = sum.wrapping_add(w.load(Ordering::Relaxed));
            }
        }
        t
    }
}

const _: () = assert!(STATS_CELLS * CELL_WORDS * 8 == crate::shm::format::STATS_SIZE as usize);

/// Fast-path events counted in the thread first.
#[derive(Clone, Copy)]
pub(crate) enum Fast {
    Acquired = 0,
    Hit = 1,
    Miss = 2,
}

const FAST_WORDS: [usize; 3] = [ACQUISITIONS, HITS, MISSES];

/// A thread's counts not yet in the file, for one mapping at a time. No destructor, so that
/// reaching it is a plain thread-local access (see [`Exit`] for the thread's end).
struct Pending {
    /// The mapping they are for (its `id`; 0: none).
    id: Cell<u64>,
    counts: [Cell<u32>; 3],
    /// The table clock (ns) by which they go to the file.
    due: Cell<u64>,
}

thread_local! {
    static PENDING: Pending = const {
        Pending {
            id: Cell::new(0),
            counts: [Cell::new(0), Cell::new(0), Cell::new(0)],
            due: Cell::new(0),
        }
    };
    /// The mapping the pending counts are for, kept weakly: they are dropped with it.
    static MAP: RefCell<Weak<Mapping>> = const { RefCell::new(Weak::new()) };
    /// Adds the pending counts to the file when the thread ends (or the process, from its
    /// main thread): set up by the thread's first count.
    static EXIT: Exit = const { Exit };
}

struct Exit;

impl Drop for Exit {
    fn drop(&mut self) {
        let _ = PENDING.try_with(flush_pending);
    }
}

/// Adds the pending counts to their mapping's file (if it is still mapped) and clears them.
fn flush_pending(p: &Pending) {
    let map = MAP.try_with(|m| m.borrow().upgrade()).ok().flatten();
    for (c, &word) in p.counts.iter().zip(&FAST_WORDS) {
        let n = c.replace(0);
        if let Some(m) = &map {
            Cells::of(m).add(word, u64::from(n));
        }
    }
}

/// Counts a fast-path event of the mapping `map` (numbered `id`) at table clock `now`.
/// Returns whether this is an acquisition whose hold is to be timed (one in
/// [`HOLD_SAMPLE`]).
#[inline(always)]
pub(crate) fn count(id: u64, map: &Arc<Mapping>, event: Fast, now: u64) -> bool {
    PENDING.with(|p| {
        if p.id.get() != id {
            switch(p, id, map, now);
        }
        let c = &p.counts[event as usize];
        let n = c.get().wrapping_add(1);
        c.set(n);
        if now >= p.due.get() {
            flush_due(p, now);
        }
        n % HOLD_SAMPLE == 0
    })
}

#[cold]
fn switch(p: &Pending, id: u64, map: &Arc<Mapping>, now: u64) {
    flush_pending(p);
    p.id.set(id);
    let _ = MAP.try_with(|m| *m.borrow_mut() = Arc::downgrade(map));
    let _ = EXIT.try_with(|_| {}); // its destructor flushes at the thread's end
    p.due.set(now.saturating_add(FLUSH_AFTER.as_nanos() as u64));
}

#[cold]
fn flush_due(p: &Pending, now: u64) {
    flush_pending(p);
    p.due.set(now.saturating_add(FLUSH_AFTER.as_nanos() as u64));
}

/// Adds this thread's pending counts of the mapping `id` to its file now (before this
/// process reads the counters, or lets go of the mapping).
pub(crate) fn flush(id: u64) {
    let _ = PENDING.try_with(|p| {
        if p.id.get() == id {
            flush_pending(p);
        }
    });
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn durations_fall_in_log2_microsecond_buckets() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(999), 0);
        assert_eq!(bucket(1_000), 1);
        assert_eq!(bucket(1_999), 1);
        assert_eq!(bucket(2_000), 2);
        assert_eq!(bucket(3_000_000), 12); // 3 ms: [2048, 4096) µs
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn cells_sum_and_one_cell_serves_a_handle() {
        let words: Vec<AtomicU64> = (0..CELL_WORDS * 2).map(|_| AtomicU64::new(0)).collect();
        words[ACQUISITIONS].store(3, Ordering::Relaxed);
        words[CELL_WORDS + ACQUISITIONS].store(4, Ordering::Relaxed);
        let cells = Cells(&words);
        cells.add(TIMEOUTS, 2);
        cells.time(WAIT_BUCKETS, WAIT_NS, 1_500);
        let t = cells.totals();
        assert_eq!(t[ACQUISITIONS], 7);
        assert_eq!(t[TIMEOUTS], 2);
        assert_eq!(t[WAIT_BUCKETS + 1], 1);
        assert_eq!(t[WAIT_NS], 1_500);
        let one: Vec<AtomicU64> = (0..CELL_WORDS).map(|_| AtomicU64::new(0)).collect();
        Cells(&one).add(LOST, 1);
        assert_eq!(one[LOST].load(Ordering::Relaxed), 1);
    }
}
