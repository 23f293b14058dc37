//! The counters kept in a table or dict file, which any process can read (`shmlock stats`).
//!
//! The file ends with [`STATS_CELLS`] process cells of 64 words, then [`THREAD_CELLS`]
//! thread cells of one cache line each. Events of the slow paths (a wait, a timeout, a
//! takeover, a full table, a dict write) are added to the cell of the process's pid, with
//! `fetch_add`, as they happen. The events of the fast paths are too frequent for a locked
//! add each (one costs 5 ns here, a sixth of an uncontended lock+unlock): an acquisition, a
//! dict hit or miss is counted in a thread cell that the thread claimed for itself (a CAS
//! of its owner word, once per thread and file), with a plain load and store, since no one
//! else writes it. A reader sums every cell; the counts are in the file the moment they
//! are made, whatever the thread does next (idles, exits, is killed with its process).
//!
//! A thread gives its cell back when it ends or turns to another file, and the last drop
//! of a handle gives back every cell its process's threads hold in that file; the next
//! owner goes on from the counts there, so nothing is ever moved or lost. A cell whose
//! process died without giving it back keeps its counts, and is taken again once no cell
//! is free; failing that, a thread counts with `fetch_add` in its process cell. A forked child never writes its parent's cell: the
//! fork handler forgets the cell in the child, and a cell is given back only by the
//! process (pid) that claimed it.
//!
//! A Redis handle keeps one process cell in its own memory (`RedisLocks::stats`: what this
//! process's handle did).

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use crate::shm::format::{STATS_CELLS, THREAD_CELLS};
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
    /// The counters of a mapped file (its process cells and thread cells).
    pub(crate) fn of(map: &'a Mapping) -> Cells<'a> {
        Cells(map.stats())
    }

    /// The cell this process adds to.
    fn mine(self) -> &'a [AtomicU64] {
        let cells = (self.0.len() / CELL_WORDS).min(STATS_CELLS);
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

    /// Every cell summed (a file's thread cells too).
    pub(crate) fn totals(self) -> [u64; CELL_WORDS] {
        let mut t = [0u64; CELL_WORDS];
        let (process, thread) = self.0.split_at(self.0.len().min(STATS_CELLS * CELL_WORDS));
        for cell in process.chunks_exact(CELL_WORDS) {
            for (sum, w) in t.iter_mut().zip(cell) {
                *sum = sum.wrapping_add(w.load(Ordering::Relaxed));
            }
        }
        for cell in thread.chunks_exact(THREAD_CELL_WORDS) {
            for (i, &word) in FAST_WORDS.iter().enumerate() {
                t[word] = t[word].wrapping_add(cell[1 + i].load(Ordering::Relaxed));
            }
        }
        t
    }
}

const _: () = assert!(
    (STATS_CELLS * CELL_WORDS + THREAD_CELLS * THREAD_CELL_WORDS) * 8
        == crate::shm::format::STATS_SIZE as usize
);

/// Fast-path events, counted in the thread's own cell.
#[derive(Clone, Copy)]
pub(crate) enum Fast {
    Acquired = 0,
    Hit = 1,
    Miss = 2,
    /// A dict store (counted in the thread's cell: a process cell's word is one more
    /// read-modify-write, and the cell's index a division, on every `set`).
    Set = 3,
}

const FAST_WORDS: [usize; 4] = [ACQUISITIONS, HITS, MISSES, SETS];
const _: () = assert!(FAST_WORDS.len() < THREAD_CELL_WORDS); // (word 0 is the owner)
/// Words of a thread cell: its owner (0: free; else pid << 32 | the thread's id), then one
/// counter per [`Fast`] event.
pub(crate) const THREAD_CELL_WORDS: usize = 8;

/// The thread cells of a file's counters (after the process cells).
fn thread_cells(map: &Mapping) -> &[AtomicU64] {
    &map.stats()[STATS_CELLS * CELL_WORDS..]
}

/// The cell this thread counts in, for one file at a time.
struct Mine {
    /// The mapping it is in (its `id`; 0: none).
    id: Cell<u64>,
    /// Its first word in that mapping; null: no cell was free (count in the process cell).
    cell: Cell<*const AtomicU64>,
}

thread_local! {
    // No destructor, so that reaching it is a plain thread-local access (see `Exit`).
    static MINE: Mine = const {
        Mine {
            id: Cell::new(0),
            cell: Cell::new(std::ptr::null()),
        }
    };
    /// The mapping the cell is in, kept weakly (it is given back only while mapped), in
    /// the one thread-local whose destructor gives the cell back when the thread ends
    /// (so that the mapping is known then, whatever order the destructors run in).
    static EXIT: Exit = const { Exit { map: RefCell::new(Weak::new()) } };
    /// This thread's number in the owner word.
    static THREAD: Cell<u32> = const { Cell::new(0) };
}

struct Exit {
    map: RefCell<Weak<Mapping>>,
}

impl Drop for Exit {
    fn drop(&mut self) {
        let map = self.map.borrow().upgrade();
        let _ = MINE.try_with(|m| give_back_in(m, map.as_deref()));
    }
}

/// What this thread writes in the owner word of a cell it claims.
fn owner() -> u64 {
    static THREADS: AtomicU64 = AtomicU64::new(1);
    let thread = THREAD
        .try_with(|t| {
            if t.get() == 0 {
                t.set((THREADS.fetch_add(1, Ordering::Relaxed) as u32).max(1));
            }
            t.get()
        })
        .unwrap_or(1);
    u64::from(crate::shm::process::current_pid()) << 32 | u64::from(thread)
}

/// Gives this thread's cell back (if its mapping is still mapped and the cell is still
/// this process's: a forked child's copy of its parent's is not), and forgets it.
fn give_back(m: &Mine) {
    let map = EXIT.try_with(|e| e.map.borrow().upgrade()).ok().flatten();
    give_back_in(m, map.as_deref());
}

/// [`give_back`], the mapping looked up (`None`: no longer mapped).
fn give_back_in(m: &Mine, map: Option<&Mapping>) {
    let cell = m.cell.replace(std::ptr::null());
    let id = m.id.replace(0);
    let (false, Some(map)) = (cell.is_null(), map) else {
        return;
    };
    let cells = thread_cells(map);
    let me = owner();
    // `cell` is compared as an address only, against the cells of the mapping it was
    // taken from (kept mapped by `map`).
    if let Some((i, word)) = cells
        .chunks_exact(THREAD_CELL_WORDS)
        .map(|c| &c[0])
        .enumerate()
        .find(|(_, w)| std::ptr::eq(*w, cell))
    {
        // Release: the next owner sees every count made in it.
        let _ = word.compare_exchange(me, 0, Ordering::Release, Ordering::Relaxed);
        claimed(|l| l.retain(|c| (c.0, c.1) != (id, i)));
    }
}

/// The cells this process's threads hold, by mapping (its number, the cell's, the owner
/// word): all given back when the mapping's last handle goes, for a thread that lives on
/// can no longer give its own back then.
///
/// Not a `Mutex`: a process forked by one thread while another held a mutex would find it
/// held for good (that thread does not exist in the child), and its first count in a new
/// table would wait forever. The lock word holds the holding process's token instead (see
/// `process::token`, which no forked child shares): a child that finds it held by another
/// process's token knows the holder is a thread of its parent, frozen by the fork, takes
/// the lock over and starts from an empty list (the parent's copy may be half-changed, and
/// none of its cells are the child's to give back).
struct Claimed {
    lock: AtomicU64,
    list: std::cell::UnsafeCell<Vec<(u64, usize, u64)>>,
}

// SAFETY: `list` is only reached through `claimed`, under `lock`.
unsafe impl Sync for Claimed {}

static CLAIMED: Claimed = Claimed {
    lock: AtomicU64::new(0),
    list: std::cell::UnsafeCell::new(Vec::new()),
};

/// Runs `f` on the claimed cells' list, under its lock (see [`Claimed`]).
fn claimed<R>(f: impl FnOnce(&mut Vec<(u64, usize, u64)>) -> R) -> R {
    claimed_in(&CLAIMED, crate::shm::process::token(), f)
}

/// [`claimed`] on `c`, as the process named `me`.
fn claimed_in<R>(c: &Claimed, me: u64, f: impl FnOnce(&mut Vec<(u64, usize, u64)>) -> R) -> R {
    loop {
        match c
            .lock
            .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
        {
            Ok(_) => break,
            // another thread of this process has it
            Err(holder) if holder == me => std::thread::yield_now(),
            // a thread of the process this one was forked from, which is not here
            Err(holder) => {
                if c.lock
                    .compare_exchange(holder, me, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    // SAFETY: the lock is ours; the parent's list is left as it was (its
                    // memory may be half-changed: never freed or read).
                    unsafe { std::mem::forget(std::mem::take(&mut *c.list.get())) };
                    break;
                }
            }
        }
    }
    // SAFETY: the lock is ours, so no other thread reaches the list until it is let go.
    let r = f(unsafe { &mut *c.list.get() });
    c.lock.store(0, Ordering::Release);
    r
}

/// Whether the process of an owner word is gone (`kill` finds no such pid). In another
/// pid namespace a live owner's pid may be unknown here: its cell is then shared, and
/// some of its counts may be lost (never anything else).
fn owner_gone(owner: u64) -> bool {
    let pid = (owner >> 32) as libc::pid_t;
    pid > 0
        && pid as u32 != crate::shm::process::current_pid()
        // SAFETY: signal 0 only asks whether the process exists.
        && unsafe { libc::kill(pid, 0) } == -1
        && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

/// Counts a fast-path event of the mapping `map` (numbered `id`).
#[inline(always)]
pub(crate) fn count(id: u64, map: &Arc<Mapping>, event: Fast) {
    let counted = MINE.try_with(|m| {
        if m.id.get() != id {
            switch(m, id, map);
        }
        let cell = m.cell.get();
        if cell.is_null() {
            return false;
        }
        // SAFETY: `cell` is the first word of a thread cell of the mapping numbered `id`
        // (ids are never reused), which the caller's `map` keeps mapped; the cell has
        // THREAD_CELL_WORDS words, and this thread owns it: no one else writes them.
        let w = unsafe { &*cell.add(1 + event as usize) };
        w.store(w.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
        true
    });
    if counted != Ok(true) {
        Cells::of(map).add(FAST_WORDS[event as usize], 1);
    }
}

/// Turns this thread to the file of `map`: gives back its cell of the last one, claims
/// one in this one.
#[cold]
fn switch(m: &Mine, id: u64, map: &Arc<Mapping>) {
    forget_in_children();
    give_back(m);
    let me = owner();
    let words = || {
        thread_cells(map)
            .chunks_exact(THREAD_CELL_WORDS)
            .map(|c| &c[0])
            .enumerate()
    };
    let take = |w: &AtomicU64, from: u64| {
        w.compare_exchange(from, me, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    };
    // a free cell; else one whose process is gone (its counts stay: they go on from there)
    let got = words()
        .find(|(_, w)| w.load(Ordering::Relaxed) == 0 && take(w, 0))
        .or_else(|| {
            words().find(|(_, w)| {
                let o = w.load(Ordering::Relaxed);
                o != 0 && owner_gone(o) && take(w, o)
            })
        });
    if let Some((i, _)) = got {
        claimed(|l| l.push((id, i, me)));
    }
    m.cell
        .set(got.map_or(std::ptr::null(), |(_, w)| w as *const AtomicU64));
    m.id.set(id);
    // (its destructor gives the cell back at the thread's end)
    let _ = EXIT.try_with(|e| *e.map.borrow_mut() = Arc::downgrade(map));
}

/// The last handle of the mapping `map` (numbered `id`) is being dropped: gives back this
/// thread's cell of it, and those of the process's other threads (which will never count
/// in it again: its number is never reused).
pub(crate) fn leave(id: u64, map: &Mapping) {
    let _ = MINE.try_with(|m| {
        if m.id.get() == id {
            give_back_in(m, Some(map));
        }
    });
    let pid = u64::from(crate::shm::process::current_pid());
    let cells = thread_cells(map);
    claimed(|l| {
        l.retain(|&(of, i, owner)| {
            if of != id {
                return true;
            }
            // (a forked child's copy of the list is its parent's: not its to give back)
            if owner >> 32 == pid {
                if let Some(word) = cells.get(i * THREAD_CELL_WORDS) {
                    let _ = word.compare_exchange(owner, 0, Ordering::Release, Ordering::Relaxed);
                }
            }
            false
        })
    });
}

/// In a forked child (a fork handler, in the thread that forked, the child's only one):
/// the cell is the parent's; this thread claims its own at its next count. Only `Cell`
/// stores.
extern "C" fn forget_in_child() {
    let _ = MINE.try_with(|m| {
        m.id.set(0);
        m.cell.set(std::ptr::null());
    });
}

/// Installs [`forget_in_child`] as a fork handler, once per process (before its first
/// cell is claimed).
///
/// Not a `Once`: a process forked while another thread was inside it would find it running
/// for good and wait. The state word holds the registering process's token (see
/// [`Claimed`]): a forked child that finds its parent's registers the handler itself (a
/// second registration of this idempotent handler is harmless; a parent's finished one is
/// inherited as DONE).
fn forget_in_children() {
    const DONE: u64 = u64::MAX;
    static STATE: AtomicU64 = AtomicU64::new(0);
    let mut seen = STATE.load(Ordering::Acquire);
    if seen == DONE {
        return;
    }
    let me = crate::shm::process::token();
    loop {
        if seen == me {
            // another thread of this process registers it: wait for it
            std::thread::yield_now();
            seen = STATE.load(Ordering::Acquire);
        } else if seen == DONE {
            return;
        } else if STATE
            .compare_exchange(seen, me, Ordering::Acquire, Ordering::Acquire)
            .is_ok()
        {
            // SAFETY: the handler only stores to this thread's thread-locals.
            let rc = unsafe { libc::pthread_atfork(None, None, Some(forget_in_child)) };
            debug_assert_eq!(rc, 0, "pthread_atfork failed");
            STATE.store(DONE, Ordering::Release);
            return;
        } else {
            seen = STATE.load(Ordering::Acquire);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The list's lock found held by another process's token (a thread of the parent,
    /// frozen by the fork) is taken over, with an empty list; held by this process's, it
    /// is waited for.
    #[test]
    fn a_list_lock_held_across_a_fork_is_taken_over() {
        let c = Claimed {
            lock: AtomicU64::new(0),
            list: std::cell::UnsafeCell::new(Vec::new()),
        };
        let (parent, child) = (0x11, 0x23);
        claimed_in(&c, parent, |l| l.push((1, 2, 3)));
        assert_eq!(claimed_in(&c, parent, |l| l.len()), 1);
        c.lock.store(parent, Ordering::SeqCst); // held when the child was forked
        assert_eq!(claimed_in(&c, child, |l| l.len()), 0, "taken over, emptied");
        assert_eq!(c.lock.load(Ordering::SeqCst), 0);
        // held by another thread of this process: waited for, then had
        c.lock.store(child, Ordering::SeqCst);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| claimed_in(&c, child, |l| l.push((4, 5, 6))));
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert!(!waiter.is_finished(), "went in beside the holder");
            c.lock.store(0, Ordering::SeqCst);
            waiter.join().unwrap();
        });
        assert_eq!(claimed_in(&c, child, |l| l.clone()), vec![(4, 5, 6)]);
    }

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
