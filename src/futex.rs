//! The futex on a home's wait word (Linux); other systems have no wake-up and waiters poll.

use std::sync::atomic::AtomicU32;

use crate::table::Notify;

/// Wakes sleepers with `FUTEX_WAKE` on the shared (not process-private) word.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Futex;

impl Notify for Futex {
    fn wake_all(&self, word: &AtomicU32) {
        #[cfg(target_os = "linux")]
        // SAFETY: `word` is a live, aligned u32 in memory mapped by this process; FUTEX_WAKE
        // only reads the address, and a shared futex is keyed by the mapping, so it reaches
        // waiters in other processes.
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
}
