//! This process's attachment to one table file: its registration (taken anew in a forked
//! child), its judgement of other owners, and the stall bound.

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, TryLockError};
use std::time::Duration;

use crate::error::Error;
use crate::shm::anchor::Anchor;
use crate::shm::clock::{raw_now, Clock, Monotonic};
use crate::shm::mapping::Mapping;
use crate::shm::process::fork_epoch;
use crate::shm::registry::{self, FileId, FileLocks, Identity, OwnerId};

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
    /// A descriptor of the file that holds no lock, to test others' (re-opened if the
    /// program closed ours and reused its number).
    probe: Mutex<Probe>,
    id: FileId,
    path: PathBuf,
    /// `false`: leave dead holders' keys to their leases (`OpenOptions::liveness`).
    judge: bool,
    read_only: bool,
    /// This process's registration, what keeps it, and the fork epoch it was made in (a
    /// forked child finds its parent's here, and makes its own).
    reg: Mutex<Option<(OwnerId, Anchor, u64)>>,
    /// `fork epoch << 32 | owner bits` of the registration in use; 0 before any.
    cached: AtomicU64,
    /// The full registry generation of that registration (stored before `cached`).
    generation: AtomicU64,
    /// Per owner entry (mod 64): `owner << 40 | ms` of its last "alive" verdict.
    alive_at: [AtomicU64; GATES],
}

impl Attachment {
    pub(crate) fn new(
        map: Arc<Mapping>,
        file: File,
        id: FileId,
        path: PathBuf,
        registered: Option<(Anchor, OwnerId)>,
        judge: bool,
    ) -> Attachment {
        let read_only = registered.is_none();
        let owner = registered.as_ref().map(|(_, owner)| *owner);
        let cached = owner.map_or(0, |owner| fork_epoch() << 32 | u64::from(owner.bits()));
        let generation = owner.map_or(0, |owner| map.registry().generation(owner));
        Attachment {
            map,
            probe: Mutex::new(Probe(Some(file))),
            id,
            path,
            judge,
            read_only,
            reg: Mutex::new(registered.map(|(anchor, owner)| (owner, anchor, fork_epoch()))),
            cached: AtomicU64::new(cached),
            generation: AtomicU64::new(u64::from(generation)),
            alive_at: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    pub(crate) fn read_only(&self) -> bool {
        self.read_only
    }

    /// Whether dead holders' keys are taken before their leases end.
    pub(crate) fn judges(&self) -> bool {
        self.judge
    }

    /// The owner id this process's entries carry.
    #[inline]
    pub(crate) fn owner(&self) -> Result<OwnerId, Error> {
        self.registration().map(|(owner, _)| owner)
    }

    /// The owner id and the full registry generation of this process's registration.
    #[inline]
    pub(crate) fn registration(&self) -> Result<(OwnerId, u32), Error> {
        let c = self.cached.load(Ordering::Acquire);
        let owner = if c != 0 && c >> 32 == fork_epoch() & 0xffff_ffff {
            OwnerId::from_bits(c as u32)
        } else {
            self.reregister()?
        };
        Ok((owner, self.generation.load(Ordering::Relaxed) as u32))
    }

    /// In a forked child: takes an entry of our own (the parent's is the parent's).
    #[cold]
    fn reregister(&self) -> Result<OwnerId, Error> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        // The mutex may have been held by a thread of the parent that does not exist in
        // this child: do not wait for it forever.
        let mut guard = None;
        for _ in 0..1000 {
            match self.reg.try_lock() {
                Ok(g) => {
                    guard = Some(g);
                    break;
                }
                Err(TryLockError::Poisoned(p)) => {
                    guard = Some(p.into_inner());
                    break;
                }
                Err(TryLockError::WouldBlock) => std::thread::sleep(Duration::from_millis(1)),
            }
        }
        let mut reg = guard.ok_or_else(|| {
            Error::io(
                &self.path,
                std::io::Error::other("could not register this forked process"),
            )
        })?;
        if let Some((owner, _, _)) = reg.as_ref().filter(|r| r.2 == fork_epoch()) {
            let owner = *owner;
            self.remember(owner);
            return Ok(owner);
        }
        // The parent's registration is the parent's to leave (its anchor was not
        // inherited, and its copy here unmaps nothing).
        *reg = None;
        let (anchor, owner) = self.register_again()?;
        *reg = Some((owner, anchor, fork_epoch()));
        self.remember(owner);
        Ok(owner)
    }

    fn remember(&self, owner: OwnerId) {
        self.generation.store(
            u64::from(self.map.registry().generation(owner)),
            Ordering::Relaxed,
        );
        self.cached.store(
            fork_epoch() << 32 | u64::from(owner.bits()),
            Ordering::Release,
        );
    }

    /// Registers this forked child, through an anchor of its own.
    fn register_again(&self) -> Result<(Anchor, OwnerId), Error> {
        let probe = self.probe();
        let file = probe.file();
        Anchor::pin(file, &self.path, self.id, |fd| {
            let until = std::time::Instant::now() + Duration::from_secs(10);
            while !registry::mark_attached(fd).map_err(|e| Error::io(&self.path, e))? {
                if std::time::Instant::now() >= until {
                    return Err(Error::io(
                        &self.path,
                        std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "another process has been resetting this table for 10 s (stopped?)",
                        ),
                    ));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            crate::shm::file::register(
                &self.path,
                file,
                fd,
                &self.map,
                self.map.registry().len() as u32,
            )
        })
    }

    /// The probe descriptor, re-opened first if its number no longer names the table's
    /// file through a description that holds no lock of ours.
    fn probe(&self) -> std::sync::MutexGuard<'_, Probe> {
        let mut probe = self.probe.lock().unwrap_or_else(|p| p.into_inner());
        let file = probe.file();
        if !(self.id.names(file) && registry::is_probe(file)) {
            let fresh = registry::reopen(file, &self.path, self.id, registry::Access::Probe);
            if let Ok(fd) = fresh {
                // The old number is the program's now (it closed ours): not ours to close.
                std::mem::forget(probe.0.replace(File::from(fd)));
            }
        }
        probe
    }

    /// Whether `owner` is gone for good, by the registry (at most one system call per
    /// owner and millisecond from this process; "alive" in between). A verdict "dead" is
    /// only given through a descriptor checked to name the table's file.
    pub(crate) fn is_dead(&self, owner: OwnerId) -> bool {
        self.is_dead_at(owner, None)
    }

    /// [`is_dead`](Self::is_dead) for an owner whose full registry generation is known
    /// (a hold's lease records it).
    pub(crate) fn is_dead_at(&self, owner: OwnerId, generation: Option<u32>) -> bool {
        if owner.is_unknown() || self.owner().is_ok_and(|me| me == owner) {
            return false;
        }
        // Moved on past the holder's generation: no system call needed, nor any gate.
        if generation.is_some_and(|g| {
            let reg = self.map.registry();
            let i = owner.entry() as usize;
            i < reg.len() && reg.generation(owner) != g
        }) {
            return true;
        }
        let gate = &self.alive_at[owner.entry() as usize % GATES];
        let now = raw_now() / RECHECK_NS;
        let g = gate.load(Ordering::Relaxed);
        if g >> 40 == u64::from(owner.bits()) && now.wrapping_sub(g) & ((1 << 40) - 1) < 1 {
            return false;
        }
        let probe = self.probe();
        let file = probe.file();
        let locks = FileLocks {
            take: None,
            probe: file,
        };
        // Asked twice around a check of the descriptor: a "nobody holds it" through a
        // number that names another file (or holds a lock of ours) by the time we look
        // means nothing.
        let dead = self.map.registry().is_dead(&locks, owner, generation)
            && self.id.names(file)
            && registry::is_probe(file);
        if !dead {
            gate.store(
                u64::from(owner.bits()) << 40 | (now & ((1 << 40) - 1)),
                Ordering::Relaxed,
            );
        }
        dead
    }

    /// Pid, start time and pid namespace of an owner, as the registry has them (checked
    /// against its full registry generation where it is known).
    pub(crate) fn identity(&self, owner: OwnerId, generation: Option<u32>) -> Option<Identity> {
        self.map.registry().identity(owner, generation)
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        let reg = self.reg.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        if let Some((owner, anchor, epoch)) = reg {
            if epoch == fork_epoch() {
                self.map.registry().unregister(owner);
            }
            drop(anchor); // unmapping it drops the locks
        }
        let probe = self.probe.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(file) = probe.0.take() {
            if !(self.id.names(&file) && registry::is_probe(&file)) {
                // Closed behind our back and the number reused: the program's now.
                std::mem::forget(file);
            }
        }
    }
}

/// The probe descriptor: closed only while its number is still ours (see `probe`).
struct Probe(Option<File>);

impl Probe {
    fn file(&self) -> &File {
        self.0.as_ref().expect("taken only on drop")
    }
}

/// Notes in a slot's stall mark that it reads the entry `ident` now, and says whether
/// that very entry has been seen there, by any process, for [`STALL_BOUND`]. The mark is
/// a hash of the entry and the time it was first seen (host clock, ms): every process
/// reads the same clock, so a string of short-lived pollers adds up as one waiter would.
/// (Two entries whose hashes agree could cut a wait short; breaking a claim early costs
/// its owner only a retry.)
pub(crate) fn stalled(seen: &AtomicU64, ident: u64) -> bool {
    let hash = xxhash_rust::xxh3::xxh3_64(&ident.to_le_bytes()) >> 32 | 1;
    let now = (Monotonic.now() / 1_000_000) & 0xffff_ffff;
    let c = seen.load(Ordering::Relaxed);
    if c >> 32 == hash {
        let since = now.wrapping_sub(c & 0xffff_ffff) & 0xffff_ffff;
        return since >= STALL_BOUND.as_millis() as u64;
    }
    let _ = seen.compare_exchange(c, hash << 32 | now, Ordering::Relaxed, Ordering::Relaxed);
    false
}
