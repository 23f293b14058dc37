//! A table file mapped into this process, and the open file description behind it.
//!
//! A writable mapping is made from an open file description of its own, and this process
//! takes its registry lock and its attached-byte lock (see `registry.rs`, `file.rs`)
//! through that same description. The kernel keeps a description, and with it its
//! open-file-description locks, for as long as any descriptor *or mapping* refers to it.
//! So a registration lasts exactly as long as the mapping: closing descriptors behind the
//! library's back (a daemon's `close_range`) changes nothing, while the process's death,
//! an `exec` (whatever address the new image maps the table at), or unmapping the table
//! ends it.
//!
//! A forked child inherits the mapping, and with it a reference to its parent's
//! description, which would keep the parent's registration alive after the parent died.
//! On its first look at itself (see `process.rs`) the child maps every table it inherited
//! again, at the same address, from a description of its own: `MAP_FIXED` replaces the
//! inherited mapping in one step, and as both map the same file pages nothing the child
//! can see moves. The child's descriptor number then names the new description, and the
//! child registers through it. A child that never uses the library keeps the inherited
//! mapping while it lives: if its parent dies first, the parent's keys are reclaimed at
//! their expiry rather than at once. `exec` drops every mapping.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, IntoRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use memmap2::{MmapOptions, MmapRaw};

use crate::shm::format::{Header, HEADER_SIZE};
use crate::shm::process::fork_epoch;
use crate::shm::registry::{self, FileId, Registry};

/// Everything after the header of a mapped table file: the registry, then the body.
pub(crate) struct Mapping {
    base: NonNull<AtomicU64>,
    registry_words: usize,
    /// Where the body starts: the registry takes whole pages.
    body_at: usize,
    body_words: usize,
    /// The entry of [`TRACKS`] that follows a writable mapping through forks.
    track: Option<usize>,
    // Keeps the mapping (and so `base`) valid; unmapped on drop, after `track` is gone.
    _map: MmapRaw,
}

// SAFETY: the mapping is only reached through atomics (`&[AtomicU64]`, or structs whose
// fields are all atomics), so sharing it across threads is as sound as sharing the atomics;
// the mapping itself is owned and unmapped exactly once.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps everything after the header of the table file `desc`, whose size was checked
    /// against `header`. A writable mapping takes `desc` over: the registration's locks
    /// are taken through it (see [`own_fd`](Self::own_fd)), and a forked child maps the
    /// table again from a description of its own.
    pub(crate) fn new(
        desc: OwnedFd,
        path: &Path,
        id: FileId,
        header: &Header,
        writable: bool,
    ) -> io::Result<Mapping> {
        let len = header.mapped_len() as usize;
        let mut options = MmapOptions::new();
        options.offset(HEADER_SIZE as u64).len(len);
        let file = File::from(desc);
        let map = if writable {
            options.map_raw(&file)
        } else {
            options.map_raw_read_only(&file)
        }?;
        let base = NonNull::new(map.as_mut_ptr().cast::<AtomicU64>()).expect("mmap returned null");
        let track = if writable {
            let track = track(OwnedFd::from(file), path, id, base.as_ptr() as usize, len)
                .ok_or_else(|| {
                    io::Error::other("more than 1024 tables are open in this process")
                })?;
            Some(track)
        } else {
            None // the read-only description is closed here; the mapping needs none
        };
        Ok(Mapping {
            base,
            registry_words: header.registry as usize * registry::ENTRY_WORDS,
            body_at: (header.registry_len() / 8) as usize,
            body_words: (header.layout.body_len(header.slot_count) / 8) as usize,
            track,
            _map: map,
        })
    }

    /// The descriptor of the description behind this mapping, when that description is
    /// this process's own (made here, or made anew by this forked child) and the number
    /// still names the table's file: what registry locks are taken through.
    pub(crate) fn own_fd(&self) -> Option<BorrowedFd<'_>> {
        let t = &TRACKS[self.track?];
        if t.epoch.load(Ordering::Acquire) != fork_epoch() {
            return None;
        }
        let fd = t.fd.load(Ordering::Acquire);
        if fd < 0 {
            return None;
        }
        // SAFETY: a number this mapping's track owns; it is only borrowed for `&self`, and
        // checked to still name the table's file (a program may have closed it and opened
        // something else under the number).
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        t.file().names(fd).then_some(fd)
    }

    /// The registry's words (its entries; padding excluded).
    #[inline]
    pub(crate) fn registry(&self) -> Registry<'_> {
        // SAFETY: the registry starts one page into the mapping (aligned) and is
        // `registry_words` long, inside the mapping (its length was checked against the
        // file before mapping); every bit pattern is a valid `AtomicU64`; all mutation, by
        // us or others, is atomic; `self` keeps the mapping alive for the lifetime.
        Registry::new(unsafe {
            std::slice::from_raw_parts(self.base.as_ptr(), self.registry_words)
        })
    }

    /// The body as words. Every layout is made of 8-byte-aligned atomics.
    #[inline]
    pub(crate) fn words(&self) -> &[AtomicU64] {
        &self.all()[self.body_at..]
    }

    /// Everything mapped: registry pages, then the body.
    pub(crate) fn all(&self) -> &[AtomicU64] {
        // SAFETY: as for `registry`: the mapping is exactly `body_at + body_words` words
        // (checked against the file); page-aligned; atomics only; borrowed from `self`.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr(), self.body_at + self.body_words) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // Before the mapping goes: a child forked later must not map anything over an
        // address that no longer holds the table.
        if let Some(k) = self.track {
            untrack(k);
        }
    }
}

/// Where a writable mapping lives and which description backs it, for a forked child to
/// map it again.
struct Track {
    /// -1: free; -2: being filled in or emptied; otherwise the descriptor of the
    /// description behind the mapping (published last, so a child that sees it sees the
    /// rest).
    fd: AtomicI32,
    addr: AtomicUsize,
    len: AtomicUsize,
    dev: AtomicU64,
    ino: AtomicU64,
    /// The path, NUL-terminated and owned by the track: where a child looks for the file
    /// if the descriptor no longer names it.
    path: AtomicPtr<libc::c_char>,
    /// The fork epoch of the process whose own description `fd` names.
    epoch: AtomicU64,
}

impl Track {
    fn file(&self) -> FileId {
        FileId {
            dev: self.dev.load(Ordering::Relaxed),
            ino: self.ino.load(Ordering::Relaxed),
        }
    }
}

const FREE: i32 = -1;
const BUSY: i32 = -2;

static TRACKS: [Track; 1024] = [const {
    Track {
        fd: AtomicI32::new(FREE),
        addr: AtomicUsize::new(0),
        len: AtomicUsize::new(0),
        dev: AtomicU64::new(0),
        ino: AtomicU64::new(0),
        path: AtomicPtr::new(std::ptr::null_mut()),
        epoch: AtomicU64::new(0),
    }
}; 1024];

fn track(fd: OwnedFd, path: &Path, id: FileId, addr: usize, len: usize) -> Option<usize> {
    let k = TRACKS.iter().position(|t| {
        t.fd.compare_exchange(FREE, BUSY, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    })?;
    let t = &TRACKS[k];
    t.addr.store(addr, Ordering::Relaxed);
    t.len.store(len, Ordering::Relaxed);
    t.dev.store(id.dev, Ordering::Relaxed);
    t.ino.store(id.ino, Ordering::Relaxed);
    let path =
        CString::new(path.as_os_str().as_bytes()).map_or(std::ptr::null_mut(), |p| p.into_raw());
    t.path.store(path, Ordering::Relaxed);
    t.epoch.store(fork_epoch(), Ordering::Relaxed);
    t.fd.store(fd.into_raw_fd(), Ordering::Release);
    Some(k)
}

fn untrack(k: usize) {
    let t = &TRACKS[k];
    let fd = t.fd.swap(BUSY, Ordering::AcqRel);
    if fd >= 0 {
        // SAFETY: only inspecting the number: `fstat` reads the metadata of whatever it
        // names.
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        if t.file().names(borrowed) {
            // SAFETY: the number names the table file and belongs to this track (the
            // mapping's description, or the one a forked child put under it); nothing
            // else in the process uses it.
            unsafe { libc::close(fd) };
        }
    }
    let path = t.path.swap(std::ptr::null_mut(), Ordering::Relaxed);
    if !path.is_null() {
        // SAFETY: made by `CString::into_raw` in `track` and owned by this track alone.
        drop(unsafe { CString::from_raw(path) });
    }
    t.fd.store(FREE, Ordering::Release);
}

/// In a forked child, on its first look at itself (`epoch` is its new fork epoch): maps
/// every tracked table again from a description of its own, so that no mapping or
/// descriptor of the child keeps a parent's registration alive. Uses no allocation: the
/// child of a multithreaded parent may have inherited a heap lock in any state.
pub(crate) fn remap_inherited(epoch: u64) {
    for t in &TRACKS {
        let fd = t.fd.load(Ordering::Acquire);
        if fd < 0 {
            continue;
        }
        let file = t.file();
        let Some(fresh) = reopen(fd, t.path.load(Ordering::Relaxed), file) else {
            continue; // the child cannot register on this table (its lock calls say so)
        };
        let (addr, len) = (
            t.addr.load(Ordering::Relaxed),
            t.len.load(Ordering::Relaxed),
        );
        // SAFETY: `addr..addr + len` is the inherited mapping of this very file region
        // (the track is published only while the mapping exists, and is emptied before it
        // is unmapped); MAP_FIXED replaces it in one step with a mapping of the same file
        // pages, so every reference into it stays valid and sees the same memory.
        let r = unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fresh.as_raw_fd(),
                HEADER_SIZE as libc::off_t,
            )
        };
        if r != addr as *mut libc::c_void {
            continue;
        }
        // SAFETY: only inspecting the number.
        let inherited = unsafe { BorrowedFd::borrow_raw(fd) };
        if fresh.as_raw_fd() == fd {
            // The number had been closed behind our back, and the open took it again.
            let _ = fresh.into_raw_fd();
        } else if file.names(inherited) {
            // The number now names the child's description (the inherited one is closed
            // by the same call).
            // SAFETY: both numbers are open; `fd` is this track's and names the table.
            if unsafe { libc::dup3(fresh.as_raw_fd(), fd, libc::O_CLOEXEC) } < 0 {
                continue;
            }
        } else {
            // Closed behind our back and reused: leave that number alone, keep ours.
            t.fd.store(fresh.into_raw_fd(), Ordering::Release);
        }
        t.epoch.store(epoch, Ordering::Release);
    }
}

/// A new description of the file `want`: through `/proc/self/fd/<fd>`, else by `path`.
fn reopen(fd: i32, path: *const libc::c_char, want: FileId) -> Option<OwnedFd> {
    let mut proc_path = [0u8; 32];
    let prefix = b"/proc/self/fd/";
    proc_path[..prefix.len()].copy_from_slice(prefix);
    let mut digits = [0u8; 10];
    let mut n = fd as u32;
    let mut d = digits.len();
    loop {
        d -= 1;
        digits[d] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    proc_path[prefix.len()..prefix.len() + digits.len() - d].copy_from_slice(&digits[d..]);
    let open = |p: *const libc::c_char| -> Option<OwnedFd> {
        // SAFETY: `p` is a NUL-terminated path (the stack buffer above is zero-filled past
        // the digits; the track's path is a `CString` it owns).
        let raw = unsafe { libc::open(p, libc::O_RDWR | libc::O_CLOEXEC | libc::O_NONBLOCK) };
        if raw < 0 {
            return None;
        }
        // SAFETY: a descriptor just opened, owned by nobody else.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
        want.names(fd.as_fd()).then_some(fd)
    };
    open(proc_path.as_ptr().cast()).or_else(|| (!path.is_null()).then(|| open(path)).flatten())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::format::Layout;
    use crate::shm::registry::{lock_held, reopen, set_lock};

    /// The kernel facts the registration rests on: a lock taken through the description
    /// behind a mapping outlives every descriptor of it, and goes with the mapping.
    #[test]
    fn a_lock_through_the_mapping_lasts_as_long_as_the_mapping() {
        let path = std::env::temp_dir().join(format!("shmlock-mapping-{}", std::process::id()));
        let header = Header::new(Layout::Locks, 4, 1);
        let probe = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        probe.set_len(header.file_len()).unwrap();
        let id = FileId::of(&probe).unwrap();
        let desc = reopen(&probe, &path, id, true).unwrap();
        let map = Mapping::new(desc, &path, id, &header, true).unwrap();
        let fd = map.own_fd().expect("made here, so ours");
        assert!(set_lock(fd, libc::F_WRLCK, 7, 1).unwrap());
        assert!(lock_held(&probe, libc::F_WRLCK, 7, 1).unwrap());
        // a program closes the descriptor behind the library's back: the lock stays
        let raw = fd.as_raw_fd();
        // SAFETY: closing a number this test owns (the track then finds it gone).
        unsafe { libc::close(raw) };
        assert!(map.own_fd().is_none());
        assert!(lock_held(&probe, libc::F_WRLCK, 7, 1).unwrap());
        // unmapped: gone
        drop(map);
        assert!(!lock_held(&probe, libc::F_WRLCK, 7, 1).unwrap());
        let _ = std::fs::remove_file(&path);
    }
}
