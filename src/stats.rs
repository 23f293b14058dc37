//! What a lock table, a dict or a Redis handle has done: [`LockStats`] and [`DictStats`].
//!
//! A table's and a dict's counters live in their file, so any process can read them
//! (`shmlock stats`, with `--prometheus` for a scraper); they count what every process did
//! since the file was made. A Redis handle counts what it did itself, in this process.

use std::time::Duration;

use crate::shm::counters::{self, CELL_WORDS};

/// How long something took, as a histogram of log2 buckets from 1 µs to 4.2 s.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Histogram {
    /// `(upper bound, count)`, in increasing order of bound: each count is of the values
    /// below its bound and at or above the bound before (not cumulative). The last bound
    /// is `None`: the values of 4.2 s and more.
    pub buckets: Vec<(Option<Duration>, u64)>,
    /// How many values.
    pub count: u64,
    /// Their sum.
    pub sum: Duration,
}

impl Histogram {
    fn from(words: &[u64], sum_ns: u64) -> Histogram {
        let buckets: Vec<(Option<Duration>, u64)> = words
            .iter()
            .enumerate()
            .map(|(i, &n)| (bound(i), n))
            .collect();
        Histogram {
            count: buckets.iter().fold(0u64, |c, b| c.saturating_add(b.1)),
            buckets,
            sum: Duration::from_nanos(sum_ns),
        }
    }
}

/// The upper bound of bucket `i`: 2^i µs, none for the last.
fn bound(i: usize) -> Option<Duration> {
    (i + 1 < counters::BUCKETS).then(|| Duration::from_micros(1 << i))
}

/// What was done with the keys of a [`LockTable`](crate::LockTable) (by every process,
/// since its file was made) or through a [`RedisLocks`](crate::RedisLocks) handle (by this
/// process). From [`LockTable::stats`](crate::LockTable::stats).
///
/// ```
/// use shmlock::{LockOptions, LockTable};
/// # let path = std::env::temp_dir().join(format!("shmlock-doc-stats-{}", std::process::id()));
/// let table = LockTable::open(&path, 64)?;
/// for _ in 0..3 {
///     table.lock("job", LockOptions::default())?.unlock()?;
/// }
/// let stats = table.stats();
/// assert_eq!((stats.acquisitions, stats.contended, stats.timeouts), (3, 0, 0));
/// # std::fs::remove_file(&path)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockStats {
    /// Keys taken.
    pub acquisitions: u64,
    /// Of those, the ones taken after waiting (the key was held when asked for).
    pub contended: u64,
    /// Waits that ran out ([`Error::Timeout`](crate::Error::Timeout), a zero timeout's
    /// busy key included).
    pub timeouts: u64,
    /// Held keys freed because their holder had died (before their lease ran out).
    pub dead_owner_takeovers: u64,
    /// Held keys freed because their lease had run out.
    pub expired_takeovers: u64,
    /// Acquisitions refused with [`Error::TableFull`](crate::Error::TableFull).
    pub table_full: u64,
    /// Renewals that found the hold lost ([`Error::Expired`](crate::Error::Expired)).
    pub lost: u64,
    /// How long the contended acquisitions waited.
    pub wait: Histogram,
    /// How long the holds that were released to waiters had been held: the holds that
    /// made others wait. (On a table, a hold nobody waited for is not timed: the clock read
    /// would cost half of an uncontended lock and unlock. A Redis handle times every hold.)
    pub hold: Histogram,
}

impl LockStats {
    pub(crate) fn from_totals(t: &[u64; CELL_WORDS]) -> LockStats {
        use counters::*;
        LockStats {
            acquisitions: t[ACQUISITIONS],
            contended: t[CONTENDED],
            timeouts: t[TIMEOUTS],
            dead_owner_takeovers: t[DEAD_TAKEOVERS],
            expired_takeovers: t[EXPIRED_TAKEOVERS],
            table_full: t[TABLE_FULL],
            lost: t[LOST],
            wait: Histogram::from(&t[WAIT_BUCKETS..WAIT_BUCKETS + BUCKETS], t[WAIT_NS]),
            hold: Histogram::from(&t[HOLD_BUCKETS..HOLD_BUCKETS + BUCKETS], t[HOLD_NS]),
        }
    }
}

/// What was done with a [`SharedDict`](crate::SharedDict), by every process since its
/// file was made, and what it holds now. From [`SharedDict::stats`](crate::SharedDict::stats).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DictStats {
    /// Reads that found a live value (`get_or_fetch` counts one read per call: a hit, or
    /// a miss whether it fetched or waited for the value).
    pub hits: u64,
    /// Reads that found none (a `get_stale` that found only an expired value included).
    pub misses: u64,
    /// Values stored (`set`, `add`, `replace`, `incr`, a list's push, ...).
    pub sets: u64,
    /// Live values evicted to make room (the least recently used first).
    pub evictions: u64,
    /// Stores that evicted a live value to make room (`forcible` in ngx's words).
    pub forcible_sets: u64,
    /// Entries in use now, expired ones not yet reused or flushed included (as
    /// [`SharedDict::len`](crate::SharedDict::len)).
    pub entries: u64,
    /// Entries the dict has ([`SharedDict::capacity`](crate::SharedDict::capacity)): a
    /// store finds no room for a new key once `entries` is near it (a key lives near its
    /// home), or once the heap is full.
    pub capacity: u64,
    /// Bytes of keys and values stored now.
    pub bytes_in_use: u64,
    /// An upper bound of the bytes the dict can hold: its capacity times the longest key
    /// and the value room of an entry, plus its heap. Not a measure of how full it is
    /// (short keys leave most of their room unused): `entries` of `capacity`, and
    /// `heap_free`, are.
    pub bytes_capacity: u64,
    /// Bytes of the heap (0: the dict has none), where values longer than an entry's
    /// room are kept.
    pub heap_bytes: u64,
    /// Bytes of the heap free now (ngx's `free_space`, for those values).
    pub heap_free: u64,
}
