//! The servers' clock as this process can bound it, for deadlines the server enforces.
//!
//! Every attempt to take a key carries a deadline in the server's own time (`TIME`, µs
//! since the epoch): a server that runs the attempt later (it was stopped, or the request
//! sat in a proxy) refuses it. That is what makes an attempt whose reply never came safe
//! to cancel from any connection (see `scripts::CANCEL`), and what keeps a stalled server
//! from granting a key long after its asker gave up.
//!
//! Each reply that carries the server's time bounds the offset between the two clocks
//! from below: the server read its clock before the reply arrived, so `server - local at
//! arrival` is at most the true offset. The largest such bound is kept. A deadline made
//! with it is therefore never later, in the server's time, than the local deadline it
//! stands for (short of a server clock stepped back since, which only makes a deadline
//! later: the cancel marker covers it, see `CANCEL`'s cap). A server clock stepped forward
//! makes attempts come back refused with the server's time in them, which corrects the
//! bound (see `RedisLocks`'s retry of a refused attempt).

use crate::per_process::MadeOnce;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Instant;

/// An offset that is not known yet.
const UNKNOWN: i64 = i64::MIN;

/// The largest lower bound seen of `server µs - local µs`.
#[derive(Debug)]
pub(crate) struct ServerClock {
    offset: AtomicI64,
}

/// Microseconds of `at` on this process's monotonic base.
fn local_us(at: Instant) -> i64 {
    // (made once and inherited, so a forked child measures on its parent's base, which the
    // offsets it inherited are on; no lock a child could find held)
    static BASE: MadeOnce<Instant> = MadeOnce::new();
    let base = *BASE.get(Instant::now);
    at.checked_duration_since(base)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// A `TIME` reply's two fields (seconds, microseconds) as µs since the epoch.
pub(crate) fn server_us(secs: &str, micros: &str) -> Option<i64> {
    let s: i64 = secs.parse().ok()?;
    let us: i64 = micros.parse().ok()?;
    s.checked_mul(1_000_000)?.checked_add(us)
}

impl ServerClock {
    pub(crate) const fn new() -> ServerClock {
        ServerClock {
            offset: AtomicI64::new(UNKNOWN),
        }
    }

    /// The server said its clock read `server_us` in a reply that arrived at `arrived`.
    pub(crate) fn observe(&self, server_us: i64, arrived: Instant) {
        let bound = server_us.saturating_sub(local_us(arrived));
        self.offset.fetch_max(bound, Ordering::Relaxed);
    }

    /// The server's time (µs) at local instant `at`, never later than it really will be
    /// (as far as the replies seen tell); `None` before any reply told.
    pub(crate) fn at(&self, at: Instant) -> Option<i64> {
        let offset = self.offset.load(Ordering::Relaxed);
        (offset != UNKNOWN).then(|| local_us(at).saturating_add(offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_bound_is_the_largest_seen_and_deadlines_follow_it() {
        let c = ServerClock::new();
        let t0 = Instant::now();
        assert_eq!(c.at(t0), None);
        // a reply read at t0 + 10 ms, sent when the server read 5_000_000 µs
        c.observe(5_000_000, t0 + Duration::from_millis(10));
        let a = c.at(t0 + Duration::from_millis(10)).unwrap();
        assert_eq!(a, 5_000_000);
        // a slower reply gives a smaller bound: ignored
        c.observe(5_000_000, t0 + Duration::from_millis(50));
        assert_eq!(c.at(t0 + Duration::from_millis(10)).unwrap(), 5_000_000);
        // a faster one raises it
        c.observe(5_000_000, t0 + Duration::from_millis(5));
        assert_eq!(c.at(t0 + Duration::from_millis(10)).unwrap(), 5_005_000);
        assert_eq!(server_us("12", "000034"), Some(12_000_034));
        assert_eq!(server_us("x", "1"), None);
    }
}
