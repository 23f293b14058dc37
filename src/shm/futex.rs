//! The futex on a home's wait word (Linux). Elsewhere there is no wake-up: waiters poll.

use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Whether this build can sleep on a wait word (and be woken by another process).
pub(crate) const AVAILABLE: bool = cfg!(target_os = "linux");

/// Wakes every sleeper with `FUTEX_WAKE` on the shared (not process-private) word.
pub(crate) fn wake_all(word: &AtomicU32) {
    #[cfg(target_os = "linux")]
    // SAFETY: `word` is a live, aligned u32 in memory mapped by this process; FUTEX_WAKE
    // only looks at the address, and a shared futex is keyed by the mapping, so it
    // reaches waiters in other processes.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
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

/// Sleeps until `word` is woken, or no longer holds `expected`, or `timeout` passes
/// (spurious returns are allowed: the caller looks again either way).
pub(crate) fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    #[cfg(target_os = "linux")]
    {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: as for FUTEX_WAKE; the kernel compares `*word` with `expected` atomically
        // with going to sleep, and `ts` is a valid relative timeout that outlives the call.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAIT,
                expected,
                &ts as *const libc::timespec,
                std::ptr::null::<u32>(),
                0u32,
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (word, expected);
        std::thread::sleep(timeout);
    }
}
