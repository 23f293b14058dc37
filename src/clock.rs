//! Time for lease deadlines.
//!
//! Deadlines are nanoseconds on a monotonic clock, so wall-clock jumps change nothing. The
//! clock is a type parameter of the table so that tests and loom models can drive it.

/// A monotonic source of nanoseconds shared by every process using one table.
pub(crate) trait Clock {
    fn now(&self) -> u64;
}

/// `CLOCK_MONOTONIC_COARSE`: a vDSO read of a few nanoseconds, with the kernel tick as
/// resolution (1-4 ms), which is what millisecond-scale leases need. It is the same clock
/// in every process of one boot; the header's boot id guards against reuse across boots.
#[cfg(not(loom))]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Monotonic;

#[cfg(not(loom))]
impl Clock for Monotonic {
    #[inline]
    fn now(&self) -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant the kernel
        // has supported since 2.6.32, so the call cannot fail.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
        (ts.tv_sec as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(ts.tv_nsec as u64)
    }
}

/// Adds a lease length to a time; a lease of zero means "never expires".
pub(crate) fn deadline(now: u64, exptime_ns: u64) -> u64 {
    if exptime_ns == 0 {
        u64::MAX
    } else {
        now.saturating_add(exptime_ns)
    }
}
