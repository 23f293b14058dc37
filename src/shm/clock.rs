//! Time for lease deadlines: one clock for every process of the machine.
//!
//! Deadlines are nanoseconds of the **host's** monotonic clock, so wall-clock jumps change
//! nothing and every process attached reads the same instant, whatever its time namespace:
//! a process in a time namespace (`unshare -T`, a CRIU restore) sees `CLOCK_MONOTONIC`
//! shifted by a fixed offset, which it reads once from `/proc/self/timens_offsets` and
//! takes back out (a process in the initial namespace, told by its namespace link, has
//! none; one that cannot tell is refused rather than trusted). The clock does not run while the machine is suspended, for the holders
//! and their waiters alike: a lease resumes with the time it had left.
//!
//! The clock is a type parameter of the table so that tests and loom models can drive it.

/// A monotonic source of nanoseconds shared by every process using one table.
pub(crate) trait Clock {
    fn now(&self) -> u64;
}

/// The coarse clock's resolution at the usual 250 Hz: a deadline is seen passed up to one
/// tick late, and two readings a tick apart may be equal.
pub(crate) const TICK_NS: u64 = 4_000_000;

/// Adds a lease length to a time; a lease of zero means "never expires".
pub(crate) fn deadline(now: u64, exptime_ns: u64) -> u64 {
    if exptime_ns == 0 {
        u64::MAX
    } else {
        now.saturating_add(exptime_ns)
    }
}

/// How far the coarse clock may lag the time: a lease counted on it from now may end
/// this much sooner, by the precise clock. A tick (and [`TICK_NS`] where its resolution
/// is not known).
pub(crate) fn lag_ns() -> u64 {
    #[cfg(not(loom))]
    let tick = tick_ns();
    #[cfg(loom)]
    let tick = 0;
    match tick {
        0 => TICK_NS,
        tick => tick,
    }
}

#[cfg(not(loom))]
pub(crate) use host::*;

#[cfg(not(loom))]
mod host {
    use std::sync::atomic::{AtomicI64, AtomicU64, AtomicU8, Ordering};

    use super::Clock;
    use crate::error::Error;

    /// `CLOCK_MONOTONIC_COARSE` minus this process's time-namespace offset: a vDSO read of
    /// a few nanoseconds with the kernel tick as resolution (1-4 ms), which is what
    /// millisecond-scale leases need.
    #[derive(Clone, Copy, Debug, Default)]
    pub(crate) struct Monotonic;

    static OFFSET: AtomicI64 = AtomicI64::new(0);
    static STATE: AtomicU8 = AtomicU8::new(UNREAD);
    const UNREAD: u8 = 0;
    const KNOWN: u8 = 1;
    /// Known before a fork; the child may be in the namespace its parent made for it.
    const INHERITED: u8 = 2;

    const OFFSETS: &str = "/proc/self/timens_offsets";

    impl Clock for Monotonic {
        #[inline]
        fn now(&self) -> u64 {
            if STATE.load(Ordering::Acquire) != KNOWN {
                let _ = refresh();
            }
            let raw = raw_now() as i64;
            raw.wrapping_sub(OFFSET.load(Ordering::Relaxed)).max(0) as u64
        }
    }

    /// This process's own `CLOCK_MONOTONIC_COARSE`: for durations measured within one
    /// process, where an offset cancels out.
    #[inline]
    pub(crate) fn raw_now() -> u64 {
        read(libc::CLOCK_MONOTONIC_COARSE)
    }

    /// This process's own `CLOCK_MONOTONIC` in ns: the clock of absolute futex timeouts.
    pub(crate) fn precise_now() -> u64 {
        read(libc::CLOCK_MONOTONIC)
    }

    /// A clock's reading in ns. By libc directly, not nix's wrapper: the coarse clock is
    /// read on every acquisition, and the wrapper (not inlined, its `Result<TimeSpec>`
    /// copied out through memory) cost 7 ns more a pair in a profile of the uncontended
    /// lock.
    #[inline(always)]
    fn read(clock: libc::clockid_t) -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec; both clock ids used are constants
        // the kernel has supported since 2.6.32, so the call cannot fail.
        unsafe { libc::clock_gettime(clock, &mut ts) };
        (ts.tv_sec as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(ts.tv_nsec as u64)
    }

    /// The first tick of the coarse clock at or after `at` (ns of this process's
    /// `CLOCK_MONOTONIC`), if it comes by `limit`; `at` itself otherwise. The coarse clock
    /// moves a whole tick at a time, so its reading is a tick and the later ones lie
    /// whole ticks after it (the clock may lag some ticks when every CPU idles, which
    /// changes nothing).
    pub(crate) fn on_tick(at: u64, limit: u64) -> u64 {
        let tick = tick_ns();
        if tick == 0 {
            return at;
        }
        let last = raw_now();
        at.saturating_sub(last)
            .div_ceil(tick)
            .checked_mul(tick)
            .and_then(|d| last.checked_add(d))
            .filter(|&t| t <= limit)
            .unwrap_or(at)
    }

    /// The coarse clock's tick in ns (its resolution: 1-10 ms, by the kernel's HZ); 0
    /// where it reads as something else, and ticks are not used.
    pub(crate) fn tick_ns() -> u64 {
        static TICK: AtomicU64 = AtomicU64::new(u64::MAX);
        let known = TICK.load(Ordering::Relaxed);
        if known != u64::MAX {
            return known;
        }
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec.
        let r = unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
        let tick = match (r, ts.tv_sec, ts.tv_nsec as u64) {
            (0, 0, ns) if (1_000_000..=10_000_000).contains(&ns) => ns,
            _ => 0,
        };
        TICK.store(tick, Ordering::Relaxed);
        tick
    }

    /// Makes sure this process knows its offset: a table cannot be used by a process that
    /// cannot tell its clock from the others'. Called by `process::check_clock`, which
    /// first lets a forked child find out that it is one (and forget the offset).
    #[inline]
    pub(crate) fn check_offset() -> Result<(), Error> {
        if STATE.load(Ordering::Acquire) == KNOWN {
            // Known already: a later unshare for children does not change our own.
            return Ok(());
        }
        refresh()
    }

    #[cold]
    #[inline(never)]
    fn refresh() -> Result<(), Error> {
        match read_offset() {
            Ok(off) => {
                OFFSET.store(off, Ordering::Relaxed);
                STATE.store(KNOWN, Ordering::Release);
                Ok(())
            }
            // A forked child that cannot read its own offset does not borrow its parent's:
            // the parent may have made a new time namespace for it.
            Err(e) => Err(e),
        }
    }

    /// In a forked child (async-signal-safe): look the offset up again on next use.
    pub(crate) fn forget_offset() {
        if STATE.load(Ordering::Relaxed) == KNOWN {
            STATE.store(INHERITED, Ordering::Relaxed);
        }
    }

    /// The inode of the initial time namespace (the kernel's `PROC_TIME_INIT_INO`): a
    /// process there has no offset at all.
    const INITIAL_TIME_NS: u64 = 0xEFFF_FFFA;

    fn unknown(why: &str) -> Error {
        Error::io(
            OFFSETS,
            std::io::Error::other(format!(
                "cannot tell this process's clock offset (time namespace): {why}"
            )),
        )
    }

    /// This process's monotonic offset. `timens_offsets` describes the namespace this
    /// process's *children* get, which is its own only until it unshares one for them, and
    /// it reads empty once the main thread has exited; so the namespace links of the
    /// calling thread decide first: the initial namespace has no offset, and the file is
    /// believed only when it describes the namespace the thread is in.
    fn read_offset() -> Result<i64, Error> {
        use std::os::unix::fs::MetadataExt;
        let ns = |link: &str| std::fs::metadata(format!("/proc/thread-self/ns/{link}"));
        let mine = match ns("time") {
            Ok(m) => m,
            // A kernel without time namespaces, if /proc is there at all.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return if std::path::Path::new("/proc/thread-self/stat").exists() {
                    Ok(0)
                } else {
                    Err(unknown("no /proc: mount /proc to use a shared table"))
                };
            }
            Err(e) => return Err(Error::io("/proc/thread-self/ns/time", e)),
        };
        if mine.ino() == INITIAL_TIME_NS {
            return Ok(0);
        }
        let children = ns("time_for_children").map_err(|e| Error::io(OFFSETS, e))?;
        if children.ino() != mine.ino() || children.dev() != mine.dev() {
            return Err(unknown(
                "this process made a new time namespace for its children; open the table \
                 before doing so, or from a child",
            ));
        }
        let text = std::fs::read_to_string(OFFSETS).map_err(|e| Error::io(OFFSETS, e))?;
        parse(&text).ok_or_else(|| unknown("the offsets could not be read"))
    }

    /// The monotonic offset in ns from `timens_offsets` ("monotonic SECS NANOS"); `None`
    /// if it has no such line (as when read for a process whose main thread exited).
    pub(crate) fn parse(text: &str) -> Option<i64> {
        for line in text.lines() {
            let mut f = line.split_ascii_whitespace();
            if f.next() != Some("monotonic") {
                continue;
            }
            let secs: i64 = f.next()?.parse().ok()?;
            let nanos: i64 = f.next()?.parse().ok()?;
            return secs.checked_mul(1_000_000_000)?.checked_add(nanos);
        }
        None
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn parses_offsets() {
            assert_eq!(parse("monotonic 0 0\nboottime 0 0\n"), Some(0));
            assert_eq!(
                parse("monotonic 3600 5\nboottime 0 0\n"),
                Some(3_600_000_000_005)
            );
            assert_eq!(
                parse("boottime 1 0\nmonotonic -2 0\n"),
                Some(-2_000_000_000)
            );
            assert_eq!(parse("monotonic x 0\n"), None);
            assert_eq!(parse(""), None);
        }

        #[test]
        fn on_tick_ends_on_the_coarse_clocks_grid_within_the_limit() {
            let tick = tick_ns();
            assert!((1_000_000..=10_000_000).contains(&tick), "{tick}");
            let now = precise_now();
            let last = raw_now();
            let at = now + 1_000_000;
            let end = on_tick(at, at + tick);
            assert!((at..at + tick).contains(&end), "{at} {end}");
            // on the grid of the coarse clock: whole ticks after its last reading (which
            // may move up to a tick by ns of frequency correction)
            let off = (end - last) % tick;
            assert!(off.min(tick - off) < 1_000, "{off} ns off the grid");
            // no tick by the limit: the end itself (looked at within one reading of the
            // coarse clock, which a correction may move by some ns at its next tick)
            let (next, before, on) = loop {
                let last = raw_now();
                let next = on_tick(at, u64::MAX);
                let seen = (next, on_tick(at, next - 1), on_tick(at, next));
                if raw_now() == last {
                    break seen;
                }
            };
            assert_eq!(before, at);
            assert_eq!(on, next);
        }

        #[test]
        fn host_clock_is_this_process_clock_outside_a_time_namespace() {
            check_offset().unwrap();
            let a = Monotonic.now();
            let b = raw_now();
            // this test does not run in a time namespace
            assert!(a.abs_diff(b) < 1_000_000_000, "{a} {b}");
        }
    }
}
