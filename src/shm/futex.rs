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

/// One word for [`wait_any`] to sleep on: the low half of a slot's control word (shared
/// with other processes) or a word of this process's own.
#[cfg(all(target_os = "linux", feature = "tokio"))]
pub(crate) enum Watched<'a> {
    Low(&'a AtomicU64, u32),
    Private(&'a AtomicU32, u32),
}

/// `struct futex_waitv` of the kernel's uapi.
#[cfg(all(target_os = "linux", feature = "tokio"))]
#[repr(C)]
struct FutexWaitv {
    val: u64,
    uaddr: u64,
    flags: u32,
    reserved: u32,
}

/// How [`wait_any`] ended.
#[cfg(all(target_os = "linux", feature = "tokio"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitAny {
    /// Woken, timed out, or a word no longer read its value: look again.
    Returned,
    /// This kernel has no `futex_waitv` (before Linux 5.16).
    Unsupported,
}

/// The most words one [`wait_any`] sleeps on (the kernel's limit).
#[cfg(all(target_os = "linux", feature = "tokio"))]
pub(crate) const WAIT_ANY_MAX: usize = 128;

/// Sleeps until any of `words` is woken or no longer reads its value, or this process's
/// `CLOCK_MONOTONIC` reaches `until` (ns): `futex_waitv` (Linux 5.16), one thread waiting on
/// many words at once. At most [`WAIT_ANY_MAX`] words.
#[cfg(all(target_os = "linux", feature = "tokio"))]
pub(crate) fn wait_any(words: &[Watched<'_>], until: u64) -> WaitAny {
    let waitv: Vec<FutexWaitv> = words
        .iter()
        .take(WAIT_ANY_MAX)
        .map(|w| match w {
            Watched::Low(word, expected) => FutexWaitv {
                val: u64::from(*expected),
                uaddr: low_half(word) as u64,
                flags: libc::FUTEX2_SIZE_U32 as u32,
                reserved: 0,
            },
            Watched::Private(word, expected) => FutexWaitv {
                val: u64::from(*expected),
                uaddr: word.as_ptr() as u64,
                flags: (libc::FUTEX2_SIZE_U32 | libc::FUTEX_PRIVATE_FLAG) as u32,
                reserved: 0,
            },
        })
        .collect();
    let ts = libc::timespec {
        tv_sec: (until / 1_000_000_000).min(i64::MAX as u64) as libc::time_t,
        tv_nsec: (until % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: `waitv` holds `waitv.len()` valid entries naming live, aligned u32 words (the
    // callers keep the mappings and the private words alive across the call); `ts` is a
    // valid absolute timespec of CLOCK_MONOTONIC that outlives the call. The kernel compares
    // each word with its value atomically with going to sleep.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_futex_waitv,
            waitv.as_ptr(),
            waitv.len() as libc::c_uint,
            0 as libc::c_uint,
            &ts as *const libc::timespec,
            libc::CLOCK_MONOTONIC,
        )
    };
    if rc < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
        WaitAny::Unsupported
    } else {
        WaitAny::Returned
    }
}

/// Wakes the sleepers on a word of this process's own.
#[cfg(all(target_os = "linux", feature = "tokio"))]
pub(crate) fn wake_private(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE_PRIVATE on a live, aligned u32 of this process; it only looks at
    // the address.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// [`wait`] on a word of this process's own, woken by [`wake_private`].
#[cfg(feature = "tokio")]
pub(crate) fn wait_private(word: &AtomicU32, expected: u32, timeout: Duration) {
    #[cfg(all(target_os = "linux", feature = "tokio"))]
    futex_wait(
        word.as_ptr(),
        libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
        expected,
        timeout,
        0,
    );
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (word, expected);
        std::thread::sleep(timeout);
    }
}
