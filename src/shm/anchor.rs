//! What keeps this process's registration in a table alive, and nothing else.
//!
//! The registry lock and the attached-byte lock (see `registry.rs`, `file.rs`) are
//! open-file-description locks: the kernel drops them when the last reference to their
//! description goes. Here that description is opened for them alone, the locks are taken
//! through it, a one-page mapping of it is made (`PROT_NONE`: nothing can touch it) and
//! marked `MADV_DONTFORK`, and its descriptor is closed. From then on the mapping is the
//! only reference, so the registration lasts exactly as long as this process has it:
//!
//! - no descriptor to be closed behind the library's back (a daemon's `close_range`), to
//!   be confused with another under a reused number, or to be inherited;
//! - a forked child does not inherit the mapping, so a parent's registration dies with
//!   the parent, whatever its children do; a child registers anew through its own anchor;
//! - `exec` drops every mapping, so an exec'd image is a new registrant;
//! - dropping the table handle unmaps it.
//!
//! While an anchor is being set up its descriptor exists for a few system calls; `fork`
//! is held off meanwhile and this thread's signals are blocked (see `process::NoFork`), so
//! no forked child inherits it. A child made without the fork handlers (a raw `clone`,
//! glibc's `_Fork`) by another thread during those calls keeps the descriptor, and so the
//! parent's registration, while it lives, which delays the recovery of the parent's keys
//! to their expiry. So does a child that shares the parent's memory (`CLONE_VM`): the
//! anchor is its mapping too.
//!
//! Some filesystems map another file than the one opened (overlayfs maps the file beneath
//! it), so a mapping there pins nothing: the caller checks that the locks survived the
//! descriptor ([`Anchor::pin`] returns before that check can be made) and refuses such a
//! filesystem.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::ptr::NonNull;

use crate::error::Error;
use crate::shm::process::{fork_epoch, NoFork};
use crate::shm::registry::{self, FileId};

const PAGE: usize = 4096;

/// This process's registration in one table file: a mapping nothing else refers to.
pub(crate) struct Anchor {
    at: NonNull<libc::c_void>,
    /// The fork epoch of the process that made it: a forked child has no such mapping
    /// (it was not inherited), so its copy of this value must not unmap anything.
    epoch: u64,
}

// SAFETY: the anchor is an address this process mapped, used only to unmap it once; no
// memory is reached through it.
unsafe impl Send for Anchor {}
// SAFETY: as above.
unsafe impl Sync for Anchor {}

impl Anchor {
    /// Opens a new description of the table file `want` (through `probe`, else by `path`),
    /// runs `register` with it (the caller takes its locks through it), and pins the
    /// description with an anchor. If `register` fails, nothing stays behind. The anchor
    /// records the fork epoch it was made in, which is the registration's: a child that
    /// runs on from here (forked by a signal handler, say) knows it is not its own.
    pub(crate) fn pin<T>(
        probe: BorrowedFd<'_>,
        path: &Path,
        want: FileId,
        register: impl FnOnce(BorrowedFd<'_>) -> Result<T, Error>,
    ) -> Result<(Anchor, T), Error> {
        let _no_fork = NoFork::hold();
        let epoch = fork_epoch();
        let desc: OwnedFd = registry::reopen(probe, path, want, registry::Access::Locks)
            .map_err(|e| Error::io(path, e))?;
        let value = register(std::os::fd::AsFd::as_fd(&desc))?;
        // SAFETY: a new mapping of one page of a file this process just opened, at an
        // address the kernel chooses; checked for failure below. PROT_NONE: it is never
        // read or written, only kept.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PAGE,
                libc::PROT_NONE,
                libc::MAP_SHARED,
                desc.as_raw_fd(),
                0,
            )
        };
        if at == libc::MAP_FAILED {
            return Err(Error::io(path, io::Error::last_os_error()));
        }
        let anchor = Anchor {
            at: NonNull::new(at).expect("mmap returned null"),
            epoch,
        };
        // SAFETY: the page just mapped; MADV_DONTFORK changes only what a child inherits.
        if unsafe { libc::madvise(at, PAGE, libc::MADV_DONTFORK) } != 0 {
            return Err(Error::io(path, io::Error::last_os_error())); // unmapped on drop
        }
        drop(desc); // the mapping alone holds the description (and its locks) now
        Ok((anchor, value))
    }

    /// The fork epoch of the process whose registration this anchor keeps.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }
}

impl Drop for Anchor {
    fn drop(&mut self) {
        if self.epoch != fork_epoch() {
            return; // a parent's anchor, copied into this child's memory but not mapped
        }
        // SAFETY: the page this process mapped in `pin` (same fork epoch), unmapped once.
        unsafe { libc::munmap(self.at.as_ptr(), PAGE) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::registry::{lock_held, set_lock};
    use std::os::fd::AsFd;

    /// The kernel facts the registration rests on: a lock taken through an anchored
    /// description outlives its descriptor, and goes with the anchor.
    #[test]
    fn a_lock_through_an_anchor_lasts_as_long_as_the_anchor() {
        let path = std::env::temp_dir().join(format!("shmlock-anchor-{}", std::process::id()));
        let probe = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        probe.set_len(8192).unwrap();
        let id = FileId::of(&probe).unwrap();
        let (anchor, ()) = Anchor::pin(probe.as_fd(), &path, id, |fd| {
            assert!(set_lock(fd, libc::F_WRLCK, 7, 1).unwrap());
            Ok(())
        })
        .unwrap();
        assert!(lock_held(&probe, libc::F_WRLCK, 7, 1).unwrap());
        drop(anchor);
        assert!(!lock_held(&probe, libc::F_WRLCK, 7, 1).unwrap());
        // a registration that fails leaves no lock behind
        let failed = Anchor::pin(probe.as_fd(), &path, id, |fd| {
            assert!(set_lock(fd, libc::F_WRLCK, 7, 1).unwrap());
            Err::<(), _>(Error::ReadOnly)
        });
        assert!(failed.is_err());
        assert!(!lock_held(&probe, libc::F_WRLCK, 7, 1).unwrap());
        let _ = std::fs::remove_file(&path);
    }
}
