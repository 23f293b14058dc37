//! This process's attachment to one table file: its registration (taken anew in a forked
//! child), its judgement of other owners, and its memory of entries that look stalled.

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::clock::raw_now;
use crate::file::{Mapping, Registered};
use crate::registry::{self, fork_epoch, FileLocks, HeldFd, Identity, OwnerId};

/// How long an entry in a transitional state (a claim, an extension, the dict's writer
/// lock) must look exactly the same before a waiter may break it. Such states last
/// microseconds; a process stopped or descheduled for this long is not making progress,
/// and breaking it costs it only a retry (or, past its lease, the lease it already lost).
pub(crate) const STALL_BOUND: Duration = Duration::from_millis(500);

/// The least time between two liveness checks of one owner from this process: a waiter's
/// loop must not turn into a loop of system calls.
const RECHECK_NS: u64 = 1_000_000;

const GATES: usize = 64;

pub(crate) struct Attachment {
    pub map: Arc<Mapping>,
    /// The descriptor the mapping came from; it holds no lock, so it can test others'.
    file: File,
    path: PathBuf,
    /// `false`: judge nobody dead (expiry and the stall bound only).
    judge: bool,
    read_only: bool,
    reg: Mutex<Option<Registered>>,
    /// `fork epoch << 32 | owner bits` of the registration in use; 0 before any.
    cached: AtomicU64,
    /// Per owner entry (mod 64): `owner << 40 | ms` of its last "alive" verdict.
    alive_at: [AtomicU64; GATES],
    /// Per slot (mod 64): `hash of (slot, word) << 32 | ms` of its first sighting.
    seen: [AtomicU64; GATES],
    /// A lease was left to expire: keep the registration for the life of the process.
    kept: AtomicBool,
}

impl Attachment {
    pub(crate) fn new(
        map: Arc<Mapping>,
        file: File,
        path: PathBuf,
        registered: Option<Registered>,
        judge: bool,
    ) -> Attachment {
        let read_only = registered.is_none();
        let cached = registered
            .as_ref()
            .map_or(0, |r| fork_epoch() << 32 | u64::from(r.owner.bits()));
        Attachment {
            map,
            file,
            path,
            judge,
            read_only,
            reg: Mutex::new(registered),
            cached: AtomicU64::new(cached),
            alive_at: std::array::from_fn(|_| AtomicU64::new(0)),
            seen: std::array::from_fn(|_| AtomicU64::new(0)),
            kept: AtomicBool::new(false),
        }
    }

    pub(crate) fn read_only(&self) -> bool {
        self.read_only
    }

    /// The owner id this process's entries carry.
    #[inline]
    pub(crate) fn owner(&self) -> OwnerId {
        let c = self.cached.load(Ordering::Relaxed);
        if c >> 32 == fork_epoch() & 0xffff_ffff {
            return OwnerId::from_bits(c as u32);
        }
        self.reregister()
    }

    /// In a forked child (or before any registration): takes an entry of our own.
    #[cold]
    fn reregister(&self) -> OwnerId {
        if self.read_only {
            return OwnerId::UNKNOWN;
        }
        // The mutex may have been held by a thread of the parent that does not exist in
        // this child: do not wait for it forever (an unknown owner only delays recovery).
        let mut guard = None;
        for _ in 0..1000 {
            match self.reg.try_lock() {
                Ok(g) => {
                    guard = Some(g);
                    break;
                }
                Err(std::sync::TryLockError::Poisoned(p)) => {
                    guard = Some(p.into_inner());
                    break;
                }
                Err(std::sync::TryLockError::WouldBlock) => {
                    std::thread::sleep(Duration::from_millis(1))
                }
            }
        }
        let Some(mut reg) = guard else {
            return OwnerId::UNKNOWN;
        };
        if let Some(r) = reg.as_ref().filter(|r| r.fd.get().is_some()) {
            let owner = r.owner;
            self.cached.store(
                fork_epoch() << 32 | u64::from(owner.bits()),
                Ordering::Relaxed,
            );
            return owner;
        }
        let fresh = self.register_again();
        let owner = fresh.as_ref().map_or(OwnerId::UNKNOWN, |r| r.owner);
        // The parent's registration (if any) is dropped without closing its descriptor
        // number: the fork handler closed our copy already.
        *reg = fresh;
        self.cached.store(
            fork_epoch() << 32 | u64::from(owner.bits()),
            Ordering::Relaxed,
        );
        owner
    }

    fn register_again(&self) -> Option<Registered> {
        let fd = registry::reopen(&self.file, &self.path).ok()?;
        let mut r = Registered {
            fd: HeldFd::new(fd),
            owner: OwnerId::UNKNOWN,
        };
        let lock = r.fd.get()?;
        if !matches!(
            registry::take_init_lock(lock, Duration::from_secs(10)),
            Ok(true)
        ) {
            return Some(r);
        }
        if matches!(registry::mark_attached(lock), Ok(true)) {
            let me = crate::process::current();
            let id = Identity {
                pid: me.pid,
                start: me.start,
                pid_ns: crate::process::pid_namespace(),
            };
            let locks = FileLocks {
                take: Some(lock),
                probe: &self.file,
            };
            if let Some(owner) = self.map.registry().register(&locks, id, me.pid as usize) {
                r.owner = owner;
            }
        }
        registry::drop_init_lock(lock);
        Some(r)
    }

    /// Whether `owner` is gone for good, by the registry (at most one system call per
    /// owner and millisecond from this process; "alive" in between).
    pub(crate) fn is_dead(&self, owner: OwnerId) -> bool {
        if !self.judge || owner.is_unknown() || owner == self.owner() {
            return false;
        }
        let gate = &self.alive_at[owner.entry() as usize % GATES];
        let now = raw_now() / RECHECK_NS;
        let g = gate.load(Ordering::Relaxed);
        if g >> 40 == u64::from(owner.bits()) && now.wrapping_sub(g) & ((1 << 40) - 1) < 1 {
            return false;
        }
        let locks = FileLocks {
            take: None,
            probe: &self.file,
        };
        let dead = self.map.registry().is_dead(&locks, owner);
        if !dead {
            gate.store(
                u64::from(owner.bits()) << 40 | (now & ((1 << 40) - 1)),
                Ordering::Relaxed,
            );
        }
        dead
    }

    /// Pid, start time and pid namespace of an owner, as the registry has them.
    pub(crate) fn identity(&self, owner: OwnerId) -> Option<Identity> {
        self.map.registry().identity(owner)
    }

    /// Notes that slot `i` reads `word` now; `true` once this process has seen that same
    /// word there for [`STALL_BOUND`].
    pub(crate) fn stalled(&self, i: usize, word: u64) -> bool {
        let mark =
            (xxhash_rust::xxh3::xxh3_64_with_seed(&word.to_le_bytes(), i as u64) >> 32) << 32;
        let now = (raw_now() / 1_000_000) & 0xffff_ffff;
        let cell = &self.seen[i % GATES];
        let c = cell.load(Ordering::Relaxed);
        if c & !0xffff_ffff == mark && c != 0 {
            let since = now.wrapping_sub(c & 0xffff_ffff) & 0xffff_ffff;
            return since >= STALL_BOUND.as_millis() as u64;
        }
        cell.store(mark | now, Ordering::Relaxed);
        false
    }

    /// A hold was left to expire: it must keep a live owner for as long as this process
    /// lives, even after its last handle to the table is dropped.
    pub(crate) fn keep(&self) {
        self.kept.store(true, Ordering::Relaxed);
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        let reg = self.reg.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        let Some(reg) = reg else { return };
        if self.kept.load(Ordering::Relaxed) {
            // Leases left to expire still name this registration: keep it (and its lock)
            // until the process ends.
            std::mem::forget(reg);
            return;
        }
        if reg.fd.get().is_some() {
            self.map.registry().unregister(reg.owner);
        }
        drop(reg); // closing the descriptor drops the locks
    }
}
