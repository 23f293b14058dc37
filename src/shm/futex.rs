//! Futexes (Linux): a lock-table slot's control word (its low half), the dict's writer
//! lock word. Elsewhere there is no wake-up: waiters poll.

use std::sync::atomic::{AtomicU32, AtomicU64};
use std::time::Duration;

/// Whether this build can sleep on a word (and be woken by another process).
pub(crate) const AVAILABLE: bool = cfg!(target_os = "linux");

/// The address of the half of a 64-bit word that holds its low 32 bits: a futex is 32
/// bits, and a lock-table slot's control word keeps its state and waiters bit there.
fn low_half(word: &AtomicU64) -> *const u32 {
    let at = if cfg!(target_endian = "little") { 0 } else { 1 };
    // SAFETY: the word is 8 bytes, so both 4-byte halves are inside it (and 4-aligned).
    unsafe { word.as_ptr().cast::<u32>().add(at) }
}

/// Wakes every sleeper on the low half of `word` (see [`wait_low_until`]).
pub(crate) fn wake_all_low(word: &AtomicU64) {
    wake_at(low_half(word));
}

/// Sleeps until the low half of `word` is woken, or no longer reads `expected`, or this
/// process's `CLOCK_MONOTONIC` reaches `until` (ns). The kernel reads that half itself;
/// nothing here accesses the word as 32 bits.
pub(crate) fn wait_low_until(word: &AtomicU64, expected: u32, until: u64) {
    let word = low_half(word);
    #[cfg(target_os = "linux")]
    // FUTEX_WAIT_BITSET takes the time as an absolute one of CLOCK_MONOTONIC (moved by the
    // kernel out of this process's time namespace, if any); the full bitset matches any
    // waker.
    futex_wait(
        word,
        libc::FUTEX_WAIT_BITSET,
        expected,
        Duration::from_nanos(until),
        u32::MAX, // FUTEX_BITSET_MATCH_ANY
    );
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (word, expected);
        let now = crate::shm::clock::precise_now();
        std::thread::sleep(Duration::from_nanos(until.saturating_sub(now)));
    }
}

/// Wakes every sleeper with `FUTEX_WAKE` on the shared (not process-private) word.
pub(crate) fn wake_all(word: &AtomicU32) {
    wake_at(word.as_ptr());
}

/// Sleeps until `word` is woken, or no longer holds `expected`, or `timeout` passes
/// (spurious returns are allowed: the caller looks again either way).
pub(crate) fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    #[cfg(target_os = "linux")]
    futex_wait(word.as_ptr(), libc::FUTEX_WAIT, expected, timeout, 0);
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (word, expected);
        std::thread::sleep(timeout);
    }
}

fn wake_at(word: *const u32) {
    #[cfg(target_os = "linux")]
    // SAFETY: `word` is a live, aligned u32 in memory mapped by this process; FUTEX_WAKE
    // only looks at the address, and a shared futex is keyed by the mapping, so it
    // reaches waiters in other processes.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word,
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
    #[cfg(not(target_os = "linux"))]
    let _ = word;
}

/// One futex wait of `op` (FUTEX_WAIT: `time` is relative; FUTEX_WAIT_BITSET: absolute).
#[cfg(target_os = "linux")]
fn futex_wait(word: *const u32, op: libc::c_int, expected: u32, time: Duration, bitset: u32) {
    let ts = libc::timespec {
        tv_sec: time.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: time.subsec_nanos() as libc::c_long,
    };
    // SAFETY: as for FUTEX_WAKE; the kernel compares `*word` with `expected` atomically
    // with going to sleep, and `ts` is a valid timespec that outlives the call.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word,
            op,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            bitset,
        );
    }
}
