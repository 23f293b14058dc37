//! Who this process is, and whether it is still the process that did something earlier
//! (or a child forked since).
//!
//! `getpid()` is a real system call (~100 ns here), too dear for the lock path, so the pid
//! is cached, with a random token naming this process (pids repeat across pid
//! namespaces: a child that is pid 1 of a new one may carry its parent's number). A forked
//! child must not believe either: they live in a page marked
//! `MADV_WIPEONFORK`, which the kernel hands every child zeroed, however it was forked
//! (`fork`, glibc's `_Fork` that runs no atfork handlers, `clone` without `CLONE_VM`). A
//! `pthread_atfork` child handler clears it too, where that `madvise` is unsupported.
//!
//! The first call in a new child then does the child's work: a new fork epoch (so that
//! registrations made before belong to the parent; the child registers anew, see
//! `anchor.rs`) and the clock offset looked up again (see `clock.rs`).
//!
//! Nothing here waits on a `std::sync::Once` or a mutex: a child forked while another
//! thread of its parent was in the middle of the first call would wait for that thread,
//! which the child does not have. The one wait (for the thread naming the process) is on
//! the wipe-on-fork page, which a child finds zeroed.
//!
//! `fork` waits while an anchor is being set up ([`NoFork`]): its descriptor must not be
//! inherited.
//!
//! Nothing here decides whether another process is alive: pids mean nothing across pid
//! namespaces and `/proc` may hide them. The owner registry does that.

use std::fs;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::shm::clock;

/// The identity of this process, as inspection shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Me {
    pub pid: u32,
    /// Field 22 of `/proc/self/stat` (clock ticks after boot); 0 where unknown.
    pub start: u64,
}

/// What a forked child must find zeroed: this process's token and cached pid, and the
/// anchors its parent's threads were setting up (none of those threads is in the child).
#[repr(C)]
struct Cell {
    /// A random non-zero number naming this process image, and none of its children.
    token: AtomicU64,
    pid: AtomicU32,
    /// Anchors being set up (lower half) and forks waiting for them (upper half, in units
    /// of [`FORKING`]).
    setting_up: AtomicU32,
    /// Forks begun (wrapping): an anchor's patience is for each fork it waits for.
    /// Relaxed: only a hint of when to give up waiting; what is safe is `setting_up`'s.
    forks: AtomicU32,
}

/// Where the cell lives: the wipe-on-fork page, or this static where the page could not be
/// had (the fork handler clears it then).
static FALLBACK: Cell = Cell {
    token: AtomicU64::new(0),
    pid: AtomicU32::new(0),
    setting_up: AtomicU32::new(0),
    forks: AtomicU32::new(0),
};
/// The cell: null until the first look at this process chose the page or `FALLBACK`
/// (once, with a CAS; a child inherits the choice).
static CELL: AtomicPtr<Cell> = AtomicPtr::new(std::ptr::null_mut());
static START: AtomicU64 = AtomicU64::new(0);
/// Bumped in every forked child, on its first look at itself.
static FORK_EPOCH: AtomicU64 = AtomicU64::new(1);
/// This process image has been named before: a zeroed token then means a forked child.
static NAMED_BEFORE: AtomicBool = AtomicBool::new(false);
/// The fork handlers are installed in this process image (a child inherits them).
static HANDLERS: AtomicBool = AtomicBool::new(false);

extern "C" fn in_forked_child() {
    // Async-signal-safe: atomic stores. The child does the rest on first use.
    cell().token.store(0, Ordering::Relaxed);
    cell().pid.store(0, Ordering::Relaxed);
    cell().setting_up.store(0, Ordering::Relaxed);
}

/// One `fork` under way, in the upper half of `setting_up` (anchors being set up count in
/// the lower half). Forks are counted, not flagged: two threads may fork at once, and a
/// signal handler may fork while its thread waits here.
const FORKING: u32 = 1 << 16;
const SETUPS: u32 = FORKING - 1;

extern "C" fn before_fork() {
    // Keep new anchors from starting, then wait for those being set up (a few system
    // calls each, made with signals blocked: never by this very thread).
    let setting_up = &cell().setting_up;
    cell().forks.fetch_add(1, Ordering::Relaxed);
    setting_up.fetch_add(FORKING, Ordering::Acquire);
    while setting_up.load(Ordering::Acquire) & SETUPS != 0 {
        std::thread::yield_now();
    }
}

extern "C" fn after_fork_in_parent() {
    // Never below zero: the child of a fork made inside a fork (by another prepare
    // handler, or a signal handler) goes on with the outer fork as its parent, on a
    // counter its own fork handler zeroed. It has one thread, so nothing to count.
    let _ = cell()
        .setting_up
        .fetch_update(Ordering::Release, Ordering::Relaxed, |v| {
            v.checked_sub(FORKING)
        });
}

/// How long an anchor waits for one fork under way before it goes ahead anyway. A fork
/// takes microseconds (milliseconds for a huge process); one that waits longer waits for
/// something else, perhaps in another fork handler for a lock this very thread holds (an
/// application's handler that locks its mutex around `fork`, registered before the
/// library's): waiting on would deadlock, going ahead only risks that child inheriting
/// the anchor's descriptor, as after a raw `clone`. The patience starts again at each
/// fork that begins meanwhile: counted from the first, forks back to back (a thread that
/// forks in a loop, leaving gaps of microseconds) outwaited it, and the anchor went ahead
/// in the middle of one that had taken a millisecond.
const FORK_PATIENCE: Duration = Duration::from_millis(100);

/// How long an anchor waits in all while forks keep beginning, each within its patience
/// (threads that fork all the time, with no gap the anchor sees).
const FORKS_PATIENCE: Duration = Duration::from_secs(2);

/// Held while an anchor's descriptor exists (see `anchor.rs`): a `fork` through the libc
/// function, which runs the fork handlers, waits until it is gone, so no child inherits
/// it; an anchor waits for a fork under way, up to [`FORK_PATIENCE`]. Signals are blocked
/// meanwhile, so that no signal handler of this thread forks (it would wait for itself)
/// or runs on into a child with a half-made anchor.
pub(crate) struct NoFork {
    // (dropped after `drop` below has let forks go: signals come back last)
    _signals: SignalsBlocked,
}

/// This thread's signals blocked until dropped (its mask before then restored): no signal
/// handler of this thread runs, and so none forks, in the middle of what this guards.
pub(crate) struct SignalsBlocked(libc::sigset_t);

impl SignalsBlocked {
    pub(crate) fn all() -> SignalsBlocked {
        // SAFETY: `all` and `old` are plain sigset_t values, filled before use;
        // pthread_sigmask only changes this thread's mask (restored on drop).
        SignalsBlocked(unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
            old
        })
    }
}

impl Drop for SignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: restoring the mask this thread had before `all`.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
    }
}

impl NoFork {
    pub(crate) fn hold() -> NoFork {
        // The fork handlers are installed by the first look at this process.
        token();
        let signals = SignalsBlocked::all();
        let setting_up = &cell().setting_up;
        let mut cur = setting_up.load(Ordering::Relaxed);
        // (when it began waiting; the count of forks begun and when it saw that count)
        let mut waited: Option<(Instant, u32, Instant)> = None;
        loop {
            if cur & !SETUPS != 0 {
                let forks = cell().forks.load(Ordering::Relaxed);
                let now = Instant::now();
                let (first, seen, since) = waited.get_or_insert((now, forks, now));
                if *seen != forks {
                    (*seen, *since) = (forks, now);
                }
                if now - *since < FORK_PATIENCE && now - *first < FORKS_PATIENCE {
                    // Yield rather than sleep: a thread that forks in a loop leaves short
                    // gaps between its forks, which a sleeper would miss.
                    std::thread::yield_now();
                    cur = setting_up.load(Ordering::Relaxed);
                    continue;
                }
            }
            match setting_up.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return NoFork { _signals: signals },
                Err(now) => cur = now,
            }
        }
    }
}

impl Drop for NoFork {
    fn drop(&mut self) {
        cell().setting_up.fetch_sub(1, Ordering::Release);
    }
}

#[inline]
fn cell() -> &'static Cell {
    let p = CELL.load(Ordering::Acquire);
    if p.is_null() {
        &FALLBACK
    } else {
        // SAFETY: a non-null pointer here points into the page `setup` mapped, which is
        // never unmapped; the page is aligned and only ever accessed as this one `Cell`
        // of atomics (zeroed memory is a valid `Cell`).
        unsafe { &*p }
    }
}

/// Chooses the cell, once per process image: a page the kernel zeroes in every forked
/// child, or `FALLBACK` where `MADV_WIPEONFORK` is unsupported. Threads racing here each
/// map a page; the first CAS wins and the others unmap theirs. Nothing waits.
#[cold]
fn choose_cell() {
    // SAFETY: an anonymous private mapping of one page: no file, no aliasing; checked for
    // failure below.
    let page = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    let mut chosen = std::ptr::addr_of!(FALLBACK).cast_mut();
    let mut mapped = false;
    if page != libc::MAP_FAILED {
        // SAFETY: `page` is the mapping just made, one page long.
        if unsafe { libc::madvise(page, 4096, libc::MADV_WIPEONFORK) } == 0 {
            chosen = page.cast::<Cell>();
            mapped = true;
        } else {
            // SAFETY: unmapping the page just mapped, which nothing refers to.
            unsafe { libc::munmap(page, 4096) };
        }
    }
    let lost = CELL
        .compare_exchange(
            std::ptr::null_mut(),
            chosen,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_err();
    if lost && mapped {
        // SAFETY: our page lost the race: nothing was ever given a pointer into it.
        unsafe { libc::munmap(page, 4096) };
    }
}

/// Installs the fork handlers, unless this image has them. A fork racing this either
/// copies them (glibc serialises `pthread_atfork` with `fork`) or leaves the child to
/// install its own; installed twice they do no harm (the counts they keep balance, and
/// clearing the cell twice is clearing it).
fn install_handlers() {
    if HANDLERS.load(Ordering::Acquire) {
        return;
    }
    // SAFETY: the handlers only use atomics (the one before the fork waits for anchors
    // being set up, which take a few system calls).
    let rc = unsafe {
        libc::pthread_atfork(
            Some(before_fork),
            Some(after_fork_in_parent),
            Some(in_forked_child),
        )
    };
    assert_eq!(rc, 0, "pthread_atfork failed");
    HANDLERS.store(true, Ordering::Release);
}

fn name_this_process() {
    let pid = std::process::id();
    START.store(start_time(pid).unwrap_or(0), Ordering::Relaxed);
    cell().pid.store(pid, Ordering::Relaxed);
    cell().token.store(new_token(), Ordering::Release);
}

fn new_token() -> u64 {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        b = (std::process::id() as u64 ^ clock::raw_now()).to_le_bytes();
    }
    // Odd (never 0, "not named"), top bit clear (never naming).
    (u64::from_le_bytes(b) >> 1) | 1
}

/// A number naming this process, which no forked child shares (however it was forked,
/// and whatever pid it has in whatever pid namespace: a child that is pid 1 of a new
/// namespace may have its parent's pid number).
#[inline]
pub(crate) fn token() -> u64 {
    let t = cell().token.load(Ordering::Acquire);
    // NAMING: another thread is naming this process right now; what it stores last is the
    // name (and the fork epoch and pid are set before it).
    if t != 0 && t & NAMING == 0 {
        return t;
    }
    refresh();
    cell().token.load(Ordering::Acquire)
}

/// Makes sure this process can use a table's deadlines: it knows its clock's offset (see
/// `clock.rs`). A forked child finds out here first that it is one (and forgets the offset
/// its parent read).
#[inline]
pub(crate) fn check_clock() -> Result<(), Error> {
    token();
    clock::check_offset()
}

/// The token while a thread names the process (its first look, or a forked child's),
/// with the namer's pid below it: never a name (tokens have this bit clear).
const NAMING: u64 = 1 << 63;

/// The pid of the calling process, cached (for inspection).
#[inline]
pub(crate) fn current_pid() -> u32 {
    token();
    cell().pid.load(Ordering::Relaxed)
}

/// The fork epoch of the calling process: a registration made in another one is the
/// parent's, not this process's.
#[inline]
pub(crate) fn fork_epoch() -> u64 {
    token();
    FORK_EPOCH.load(Ordering::Relaxed)
}

#[cold]
fn refresh() {
    // A signal handler of this thread that forked in the middle of the naming would run on
    // into the child with the naming half done: its pid read before the fork (the
    // parent's), its fork epoch bumped to the parent's new one.
    let _signals = SignalsBlocked::all();
    if CELL.load(Ordering::Acquire).is_null() {
        choose_cell();
    }
    let cell = cell();
    let on_page = !std::ptr::eq(cell, &FALLBACK);
    loop {
        // One thread names the process: on its first look, or a forked child's (the page,
        // or the fork handler, zeroed the token).
        let naming = NAMING | u64::from(std::process::id());
        match cell
            .token
            .compare_exchange(0, naming, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => break,
            Err(t) if t & NAMING == 0 => return,
            Err(_) => {}
        }
        // Naming reads /proc and closes descriptors: give the namer the CPU (it may share
        // one with every waiting thread) rather than spin against it.
        let mut spins = 0u32;
        loop {
            let t = cell.token.load(Ordering::Acquire);
            if t == 0 {
                // the naming was given up (a namer that panicked, or a child's takeover
                // under way): try to name it here
                break;
            }
            if t & NAMING == 0 {
                return;
            }
            if spins < 64 {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            std::thread::yield_now();
            // Without the page, a child forked while its parent named itself before the
            // fork handler was installed inherits the parent's naming word: the namer is
            // then another process, whose pid the word holds (the page needs no such
            // look, as a child finds it zeroed). A child of a fork into a new pid namespace
            // whose pid there is its parent's number would wait on: kernels that lack the
            // page (before 4.14) and such a fork, in the middle of the first look, at once.
            if !on_page && t & !NAMING != u64::from(std::process::id()) {
                let _ = cell
                    .token
                    .compare_exchange(t, 0, Ordering::AcqRel, Ordering::Acquire);
                break;
            }
        }
    }
    // A namer that unwinds (`pthread_atfork` failing panics) gives the naming back, so
    // that the threads waiting for it do not wait for good.
    struct GiveBack<'a>(&'a AtomicU64);
    impl Drop for GiveBack<'_> {
        fn drop(&mut self) {
            let t = self.0.load(Ordering::Relaxed);
            if t & NAMING != 0 {
                let _ = self
                    .0
                    .compare_exchange(t, 0, Ordering::AcqRel, Ordering::Relaxed);
            }
        }
    }
    let give_back = GiveBack(&cell.token);
    install_handlers();
    if NAMED_BEFORE.swap(true, Ordering::Relaxed) {
        // Named before, yet zeroed: this is a forked child.
        FORK_EPOCH.fetch_add(1, Ordering::Relaxed);
        clock::forget_offset();
    }
    name_this_process();
    drop(give_back);
}

/// The calling process, as inspection shows it.
pub(crate) fn current() -> Me {
    let pid = current_pid();
    Me {
        pid,
        start: START.load(Ordering::Relaxed),
    }
}

/// Field 22 (`starttime`) of `/proc/<pid>/stat`, or `None` if it cannot be read.
pub(crate) fn start_time(pid: u32) -> Option<u64> {
    parse_start(&fs::read(format!("/proc/{pid}/stat")).ok()?)
}

/// The start time from a stat line. The command name (field 2) may hold spaces and
/// parentheses, so fields are counted from the last `)`.
pub(crate) fn parse_start(line: &[u8]) -> Option<u64> {
    let close = line.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&line[close + 1..]).ok()?;
    // After ")" come field 3 (state) onwards; starttime is field 22, the 20th here.
    rest.split_ascii_whitespace().nth(19)?.parse().ok()
}

/// The pid namespace of this process (`/proc/thread-self/ns/pid` as device and inode),
/// or 0 where it cannot be told. A pid only means something within its namespace.
pub(crate) fn pid_namespace() -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::metadata("/proc/thread-self/ns/pid").map_or(0, |m| m.dev().rotate_left(32) ^ m.ino())
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_hostile_comm() {
        let line = b"1234 (a) b (c)) Z 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 4242 20 21";
        assert_eq!(parse_start(line), Some(4242));
        assert_eq!(parse_start(b"garbage"), None);
        assert_eq!(parse_start(b"1 (x) S 1 2"), None);
        assert_eq!(parse_start(b"1 (x) "), None);
    }

    #[test]
    fn own_identity_is_stable() {
        let me = current();
        assert_eq!(me.pid, std::process::id());
        assert_ne!(me.start, 0);
        assert_eq!(start_time(me.pid), Some(me.start));
        assert_ne!(pid_namespace(), 0);
        let epoch = fork_epoch();
        assert_eq!(fork_epoch(), epoch);
        let cell = CELL.load(Ordering::Relaxed);
        assert!(
            !cell.is_null() && !std::ptr::eq(cell, &FALLBACK),
            "no wipe-on-fork page"
        );
        assert_eq!(token(), token());
    }
}
