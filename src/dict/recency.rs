//! LRU stamps: what an entry's `used_at` word holds, so that eviction can rank uses.
//!
//! ```text
//!  63                          23 22                     1     0
//! +------------------------------+------------------------+------+
//! |  tick: clock ns >> 20 (41)   |  lock epoch mod 2^22   | read |
//! +------------------------------+------------------------+------+
//! ```
//!
//! A store stamps the entry it writes with its own hold's epoch of the dict's writer lock
//! (which grows by one with every hold) and a read bit of 0. A read stamps the entry it
//! read with the epoch the lock's word shows and a read bit of 1, unless the entry already
//! carries a read's stamp of this tick and of this *step* of the epoch: then it writes
//! nothing, so that a key read over and over writes its entry's first line (which every
//! reader of the key reads) once a tick or a step, not at every read. A step is a 64th of
//! the dict's entries in holds, rounded down to a power of two (1 hold for a dict of up to
//! 127 entries, 64 for 4,096, at most 1,024); every hold that starts a step (and a long
//! recovery's heartbeat that moves the epoch on) writes it to a word of its own
//! (`READ_STEP` in `api.rs`), which readers read (it changes once a step: reading the
//! lock's word, which changes at every hold, would cost each read beside a busy writer a
//! cache miss). A writer of an earlier version of the library leaves the word as it was:
//! beside one, a read again reads the lock's word and stamps its key after any hold (or,
//! where the stale word matches its stamp, once a tick, as before). A damaged word is
//! mended by the next hold, and costs a load of the lock's word per read until then.
//!
//! So the least stamp is the least recently used entry, exactly but for these:
//!
//! * two reads of different keys in one tick with no hold of the writer lock between
//!   them tie (a window's eviction then takes the one nearer the home, the heap's the one
//!   in the lower entry);
//! * a key read again in the tick and the step of its last read keeps that read's rank:
//!   an entry's stamp lags its last use by less than a tick (4 ms at 250 Hz; at most
//!   about 2 ms with a faster kernel tick, the stamp's tick being 1.05 ms), and by fewer
//!   than a step of holds (so, in a dict of up to 127 entries, by none);
//! * the epoch's 22 bits wrap after 4 M holds, and the uses of the one tick in which they
//!   wrap may be misranked.
//!
//! Everything else ranks in the order it happened, in any process: a later tick ranks
//! later; in one tick, a store ranks after every read that saw an earlier hold's epoch
//! (each such read came before the store's hold took the lock), and before every read
//! that sees its own or a later one; two stores rank by their holds. Uses made during one
//! hold, by it and by readers, are concurrent, and either order is right for them.
//!
//! An operation under the lock that finds its key but stores nothing (an `add` refused,
//! an `expire`) stamps it as a store would, as ngx's look-up makes such a key the most
//! recently used. A value stored again from its undo copy keeps the copy's stamp (the
//! entry's when the interrupted write began): that is not a use. A stamp more than a
//! second ahead of a use's is damage, and the use replaces it. A read-only handle's reads
//! write no stamp (it cannot write the file).

/// Bits of the lock epoch kept.
const EPOCH_BITS: u32 = 22;
/// Coarse-clock nanoseconds to a stamp's tick (about a millisecond; the clock itself moves
/// by the kernel's tick, 1-10 ms, and that is the tick the rules above mean).
const TICK_SHIFT: u32 = 20;

/// Where a stamp's tick starts.
const TICK_AT: u32 = EPOCH_BITS + 1;

fn stamp(now_ns: u64, epoch: u32, read: bool) -> u64 {
    let epoch = u64::from(epoch) & ((1 << EPOCH_BITS) - 1);
    (now_ns >> TICK_SHIFT) << TICK_AT | epoch << 1 | u64::from(read)
}

/// The stamp of a store made at `now_ns` by the hold of lock epoch `epoch`.
pub(crate) fn of_store(now_ns: u64, epoch: u32) -> u64 {
    stamp(now_ns, epoch, false)
}

/// The stamp of a read made at `now_ns` while the writer lock's word shows `epoch`.
pub(crate) fn of_read(now_ns: u64, epoch: u32) -> u64 {
    stamp(now_ns, epoch, true)
}

/// Whether `old` is more than a second later than `stamp`, made now: not a stamp any
/// process made (the coarse clock is the same in every one), but damage.
pub(crate) fn from_the_future(old: u64, stamp: u64) -> bool {
    old >> TICK_AT > (stamp >> TICK_AT) + (1_000_000_000 >> TICK_SHIFT)
}

/// The longest step: 1,024 holds.
const MAX_STEP_SHIFT: u32 = 10;

/// The shift of a step of the lock's epoch for a dict of `entries`: a 64th of them,
/// rounded down to a power of two, from 1 hold up to 1,024.
pub(crate) fn step_shift(entries: usize) -> u32 {
    (entries / 64).max(1).ilog2().min(MAX_STEP_SHIFT)
}

/// The step of lock epoch `epoch`, as the dict's `READ_STEP` word keeps it.
pub(crate) fn step_of(epoch: u32, shift: u32) -> u64 {
    u64::from(epoch >> shift)
}

/// Whether `stamp` is of a read in the tick of `now_ns`.
pub(crate) fn read_in_tick(stamp: u64, now_ns: u64) -> bool {
    stamp & 1 == 1 && stamp >> TICK_AT == now_ns >> TICK_SHIFT
}

/// Whether `stamp` was made in the step of the lock's epoch that the dict's `READ_STEP`
/// word shows (`step`; steps of 2^`shift` holds).
pub(crate) fn in_step(stamp: u64, step: u64, shift: u32) -> bool {
    let mask = (1 << (EPOCH_BITS - shift)) - 1;
    (stamp >> 1 >> shift) & mask == step & mask
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uses_rank_by_tick_then_hold_then_reads_after_stores() {
        let t = 5 << TICK_SHIFT;
        // A read before hold 8, the store of hold 8, a read after it, the store of hold 9.
        let order = [of_read(t, 7), of_store(t, 8), of_read(t, 8), of_store(t, 9)];
        assert!(order.windows(2).all(|p| p[0] < p[1]), "{order:x?}");
        // A later tick ranks later even with an earlier epoch (the epoch wraps).
        assert!(of_read(t + (1 << TICK_SHIFT), 0) > of_store(t, u32::MAX));
        // Within one tick the clock's low bits do not count: two reads tie.
        assert_eq!(of_read(t, 3), of_read(t + 12_345, 3));
        // A stamp far in the future is damage; one a tick ahead is another process's.
        let now = of_read(t, 3);
        assert!(from_the_future(u64::MAX, now));
        assert!(from_the_future(of_store(t + 2_000_000_000, 0), now));
        assert!(!from_the_future(of_store(t + (1 << TICK_SHIFT), 0), now));
        assert!(!from_the_future(of_read(t, 2), now));
        // A read's stamp holds for the tick and the step of holds it was made in.
        let read = of_read(t, 70);
        assert!(read_in_tick(read, t + 1) && in_step(read, step_of(70, 3), 3));
        // (70 and 71: step 8, of 8 holds)
        assert!(in_step(read, step_of(71, 3), 3));
        // a step of stores since, a tick since, not a read
        assert!(!in_step(read, step_of(72, 3), 3));
        assert!(!read_in_tick(read, t + (1 << TICK_SHIFT)));
        assert!(!read_in_tick(of_store(t, 70), t));
        // steps wrap with the epoch's bits
        let wrapped = of_read(t, (1 << EPOCH_BITS) + 70);
        assert!(in_step(wrapped, step_of((1 << EPOCH_BITS) + 70, 3), 3));
        assert!(in_step(wrapped, step_of(70, 3), 3));
        // a step is a 64th of the entries, from 1 hold to 1,024
        let steps: Vec<u32> = [1, 8, 127, 128, 4096, 65_536, 1 << 30]
            .iter()
            .map(|&n| step_shift(n))
            .collect();
        assert_eq!(steps, [0, 0, 0, 1, 6, 10, 10]);
        // A clock of 36 years since boot still fits.
        let years = 36 * 365 * 24 * 3600 * 1_000_000_000u64;
        assert!(of_read(years, 0) > of_read(years - (1 << TICK_SHIFT), 0));
    }
}
