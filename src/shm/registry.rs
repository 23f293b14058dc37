//! The owner registry: who may hold entries of a file, and whether they are still alive.
//!
//! Every process that opens a table for writing takes an entry of the registry, a small
//! array in the file after the header, and keeps an open-file-description lock
//! (`F_OFD_SETLK`) on that entry's first byte for as long as it has the table open. Lock
//! entries and the dict's writer lock record their owner as an [`OwnerId`] (registry
//! entry and 6 bits of that entry's generation), never as a pid; a published hold also
//! records the whole 32-bit generation in its lease, so an entry reused 64 times is not
//! taken for a dead holder.
//!
//! An owner is **dead** only when the kernel says so: its registry entry moved on to
//! another generation (which needs the old lock gone), or nobody holds the entry's lock
//! (`F_OFD_GETLK`). The kernel drops such a lock when the last descriptor of its open file
//! description closes, which happens when the process is gone, whatever its pid, user,
//! mount or time namespace and whatever `/proc` it sees; a process whose main thread
//! exited keeps its descriptors while any thread runs. Anything that cannot be judged (no
//! registry entry, a lock call that fails, an entry number out of range) is **alive**:
//! expiry and the stall bound are the backstop.
//!
//! The lock is taken through the open file description that backs the process's mapping
//! of the table (see `mapping.rs`), so closing descriptors does not drop it: it goes when
//! the mapping goes (death, `exec`, unmapping).
//!
//! ```text
//! entry word 0:  generation (32) | reserved (31) | taken (1)
//!       word 1:  dict writes in progress (32) | pid (32, in the owner's pid namespace)
//!       word 2:  start time (`/proc/self/stat` field 22)
//!       word 3:  pid namespace id
//! ```
//!
//! Words 1-3 are for inspection only, never for calling anyone dead. The count in word 1
//! is a dict's: how many of the registration's writes are under way (see `ops`).
//!
//! Taking an entry: lock its byte (non-blocking; a held byte belongs to a live process),
//! then publish the next generation with `taken`. Leaving it: clear `taken`, then close
//! the descriptor. So `taken` with the current generation and no lock means the owner
//! died (or closed its descriptor, see below).
//!
//! A forked child shares its parent's mapping, and so the description holding the
//! parent's lock: on its first look at itself it maps the table again from a description
//! of its own and registers through that (see `mapping.rs`).
//!
//! Every descriptor is checked to still name the table's file (device and inode) before
//! a lock is taken or tested through it: a program may close ours behind our back and
//! open something else under the same number.

use crate::shm::primitive::{AtomicU64, Ordering};

/// Who owns an entry: a registry entry number (16 bits) and the low 6 bits of that
/// entry's generation. 22 bits in all, as control words carry it. (A generation that
/// wrapped back to the same 6 bits can only make a dead owner look alive, never the
/// reverse: expiry is then the backstop.)
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct OwnerId(u32);

const GEN_BITS: u32 = 6;
const GEN_MASK: u32 = (1 << GEN_BITS) - 1;
const NO_ENTRY: u32 = 0xffff;

impl OwnerId {
    /// An owner nobody can judge (it has no registry entry): never seen dead.
    pub(crate) const UNKNOWN: OwnerId = OwnerId(NO_ENTRY << GEN_BITS);

    pub(crate) fn new(entry: u16, generation: u32) -> OwnerId {
        OwnerId(u32::from(entry) << GEN_BITS | (generation & GEN_MASK))
    }

    /// From the 22 bits a control word carries.
    pub(crate) fn from_bits(bits: u32) -> OwnerId {
        OwnerId(bits & ((1 << (16 + GEN_BITS)) - 1))
    }

    pub(crate) fn bits(self) -> u32 {
        self.0
    }

    pub(crate) fn entry(self) -> u32 {
        self.0 >> GEN_BITS
    }

    fn gen_low(self) -> u32 {
        self.0 & GEN_MASK
    }

    pub(crate) fn is_unknown(self) -> bool {
        self.entry() == NO_ENTRY
    }
}

impl std::fmt::Debug for OwnerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_unknown() {
            write!(f, "OwnerId(unknown)")
        } else {
            write!(f, "OwnerId({}/{})", self.entry(), self.gen_low())
        }
    }
}

/// The per-entry locks, as the kernel keeps them (or as a model fakes them).
pub(crate) trait EntryLocks {
    /// Takes entry `i`'s lock for this process. `Ok(false)`: another holds it.
    fn try_take(&self, i: usize) -> std::io::Result<bool>;
    /// Whether anyone (this process included) holds entry `i`'s lock.
    fn is_held(&self, i: usize) -> std::io::Result<bool>;
}

const TAKEN: u64 = 1;
/// Words of one entry.
pub(crate) const ENTRY_WORDS: usize = 4;

/// What the registry says of an owner, for inspection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    pub pid: u32,
    pub start: u64,
    pub pid_ns: u64,
}

/// The registry words of a file.
#[derive(Clone, Copy)]
pub(crate) struct Registry<'a> {
    words: &'a [AtomicU64],
}

impl<'a> Registry<'a> {
    pub(crate) fn new(words: &'a [AtomicU64]) -> Registry<'a> {
        Registry { words }
    }

    pub(crate) fn len(&self) -> usize {
        (self.words.len() / ENTRY_WORDS).min(NO_ENTRY as usize)
    }

    fn word(&self, i: usize) -> &'a AtomicU64 {
        &self.words[i * ENTRY_WORDS]
    }

    /// Takes a free entry for `me`, starting the search at `hint`. Entries that look free
    /// are tried first (each try is a system call). `None`: every entry is held by a live
    /// process, or the locks cannot be taken at all here.
    pub(crate) fn register(
        &self,
        locks: &impl EntryLocks,
        me: Identity,
        hint: usize,
    ) -> Option<OwnerId> {
        let n = self.len();
        for looks_free_only in [true, false] {
            for k in 0..n {
                let i = (hint + k) % n;
                if looks_free_only && self.word(i).load(Ordering::Relaxed) & TAKEN != 0 {
                    continue;
                }
                match locks.try_take(i) {
                    Ok(true) => return Some(self.claim(i, me)),
                    Ok(false) => continue,
                    Err(_) => return None,
                }
            }
        }
        None
    }

    /// Publishes a new generation of entry `i`, whose lock this process just took.
    fn claim(&self, i: usize, me: Identity) -> OwnerId {
        let at = i * ENTRY_WORDS;
        self.words[at + 1].store(u64::from(me.pid), Ordering::Relaxed);
        self.words[at + 2].store(me.start, Ordering::Relaxed);
        self.words[at + 3].store(me.pid_ns, Ordering::Relaxed);
        // Nobody else writes an entry whose lock we hold, but the file may have been
        // damaged: take whatever generation is there and move past it.
        let old = self.word(i).load(Ordering::Relaxed);
        let generation = ((old >> 32) as u32).wrapping_add(1);
        self.word(i)
            .store(u64::from(generation) << 32 | TAKEN, Ordering::SeqCst);
        OwnerId::new(i as u16, generation)
    }

    /// Leaves an entry this process registered (before its lock is dropped).
    pub(crate) fn unregister(&self, owner: OwnerId) {
        let i = owner.entry() as usize;
        if owner.is_unknown() || i >= self.len() {
            return;
        }
        let w = self.word(i).load(Ordering::Relaxed);
        if w & TAKEN != 0 && (w >> 32) as u32 & GEN_MASK == owner.gen_low() {
            let _ =
                self.word(i)
                    .compare_exchange(w, w & !TAKEN, Ordering::SeqCst, Ordering::Relaxed);
        }
    }

    /// Whether `owner` is gone: its entry moved to another generation or was left, or
    /// nobody holds the entry's lock. `generation`
    /// is the owner's full generation where the caller knows it (a hold's lease records
    /// it), so that an entry taken again 64 times is not mistaken for the dead owner.
    /// Doubt (an error, a number out of range) is "alive".
    pub(crate) fn is_dead(
        &self,
        locks: &impl EntryLocks,
        owner: OwnerId,
        generation: Option<u32>,
    ) -> bool {
        let i = owner.entry() as usize;
        if owner.is_unknown() || i >= self.len() {
            return false;
        }
        let w = self.word(i).load(Ordering::SeqCst);
        let now = (w >> 32) as u32;
        let moved = match generation {
            Some(g) => now != g,
            None => now & GEN_MASK != owner.gen_low(),
        };
        if moved || w & TAKEN == 0 {
            // Moved on (the old lock was free for that) or left.
            return true;
        }
        // The owner took the lock before it published this generation, and gives it up
        // only after clearing `taken`, or with its mapping (by dying, or by exec).
        matches!(locks.is_held(i), Ok(false))
    }

    /// The generation entry `owner` is at now (all 32 bits).
    pub(crate) fn generation(&self, owner: OwnerId) -> u32 {
        let i = owner.entry() as usize;
        if owner.is_unknown() || i >= self.len() {
            return 0;
        }
        (self.word(i).load(Ordering::Acquire) >> 32) as u32
    }

    fn identity_at(&self, i: usize) -> Identity {
        let at = i * ENTRY_WORDS;
        let w1 = self.words[at + 1].load(Ordering::Relaxed);
        Identity {
            pid: w1 as u32,
            start: self.words[at + 2].load(Ordering::Relaxed),
            pid_ns: self.words[at + 3].load(Ordering::Relaxed),
        }
    }

    /// The word whose high half counts entry `i`'s dict writes under way (from before a
    /// writer asks for the dict's writer lock to after it lets go): a dict's heap is swept
    /// only while no other live registration has one (see `SharedDict`). Taking the entry
    /// sets it to 0 with the pid.
    pub(crate) fn ops(&self, i: usize) -> &'a AtomicU64 {
        &self.words[i * ENTRY_WORDS + 1]
    }

    /// Who holds entry `i` now, with its full generation: `None` if nobody does.
    pub(crate) fn owner_at(&self, i: usize) -> Option<(OwnerId, u32)> {
        let w = self.word(i).load(Ordering::Acquire);
        let generation = (w >> 32) as u32;
        (w & TAKEN != 0).then(|| (OwnerId::new(i as u16, generation), generation))
    }

    /// Pid, start time and pid namespace of `owner`, if the registry still has them: its
    /// entry is taken at its generation (all 32 bits, where the caller knows them).
    pub(crate) fn identity(&self, owner: OwnerId, generation: Option<u32>) -> Option<Identity> {
        let i = owner.entry() as usize;
        if owner.is_unknown() || i >= self.len() {
            return None;
        }
        let w = self.word(i).load(Ordering::Acquire);
        let id = self.identity_at(i);
        let now = (w >> 32) as u32;
        let same = match generation {
            Some(g) => now == g,
            None => now & GEN_MASK == owner.gen_low(),
        };
        (w & TAKEN != 0 && same).then_some(id)
    }
}

#[cfg(not(loom))]
pub(crate) use ofd::*;

/// The kernel's side: open-file-description locks on the file.
#[cfg(not(loom))]
mod ofd {
    use std::io;
    use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
    use std::os::unix::fs::MetadataExt;

    use nix::fcntl::{fcntl, FcntlArg};

    use super::EntryLocks;
    use crate::shm::format::{ATTACHED_LOCK_BYTE, HEADER_SIZE, REGISTRY_ENTRY};

    /// A file, by device and inode: what a descriptor must still name before it is used
    /// (a program may close ours and reuse the number for something else).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(crate) struct FileId {
        pub dev: u64,
        pub ino: u64,
    }

    impl FileId {
        pub(crate) fn of(fd: impl AsFd) -> io::Result<FileId> {
            let st = nix::sys::stat::fstat(fd)?;
            Ok(FileId {
                dev: st.st_dev,
                ino: st.st_ino,
            })
        }

        /// Whether `fd` names this file.
        pub(crate) fn names(self, fd: impl AsFd) -> bool {
            FileId::of(fd).is_ok_and(|id| id == self)
        }
    }

    fn flock(kind: libc::c_int, start: u64, len: u64) -> libc::flock {
        // SAFETY: `flock` is a plain C struct of integers, for which all zeros is valid.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = kind as libc::c_short;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        fl.l_start = start as libc::off_t;
        fl.l_len = len as libc::off_t;
        fl
    }

    /// Sets (or clears, with `F_UNLCK`) an open-file-description lock without waiting.
    /// `Ok(false)`: another open file description holds a conflicting lock.
    pub(crate) fn set_lock(
        fd: impl AsFd,
        kind: libc::c_int,
        start: u64,
        len: u64,
    ) -> io::Result<bool> {
        match fcntl(fd, FcntlArg::F_OFD_SETLK(&flock(kind, start, len))) {
            Ok(_) => Ok(true),
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether another open file description holds a lock on the range that conflicts
    /// with `kind` (a write lock conflicts with any).
    pub(crate) fn lock_held(
        fd: impl AsFd,
        kind: libc::c_int,
        start: u64,
        len: u64,
    ) -> io::Result<bool> {
        let mut fl = flock(kind, start, len);
        fcntl(fd, FcntlArg::F_OFD_GETLK(&mut fl))?;
        Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
    }

    /// The registry's locks in one file: taken through the description behind this
    /// process's mapping, tested through a descriptor that holds no lock (a lock of our
    /// own open file description would not conflict with the test). The caller has checked
    /// that both still name the table's file.
    pub(crate) struct FileLocks<'a> {
        pub take: Option<BorrowedFd<'a>>,
        pub probe: BorrowedFd<'a>,
    }

    fn entry_byte(i: usize) -> u64 {
        HEADER_SIZE as u64 + i as u64 * REGISTRY_ENTRY
    }

    impl EntryLocks for FileLocks<'_> {
        fn try_take(&self, i: usize) -> io::Result<bool> {
            let fd = self.take.ok_or(io::ErrorKind::PermissionDenied)?;
            set_lock(fd, libc::F_WRLCK, entry_byte(i), 1)
        }

        fn is_held(&self, i: usize) -> io::Result<bool> {
            lock_held(self.probe, libc::F_WRLCK, entry_byte(i), 1)
        }
    }

    /// Marks the file as in use by this process for as long as `fd`'s description lives
    /// (a read lock on one header byte, shared by every process that has the file mapped
    /// for writing). `Ok(false)`: a process is resetting the table right now.
    pub(crate) fn mark_attached(fd: BorrowedFd<'_>) -> io::Result<bool> {
        set_lock(fd, libc::F_RDLCK, ATTACHED_LOCK_BYTE, 1)
    }

    /// Takes the attached byte for writing: only possible while no other process has the
    /// file open for writing, and keeps any from attaching until it is turned into a read
    /// lock by [`mark_attached`].
    pub(crate) fn attach_alone(fd: BorrowedFd<'_>) -> io::Result<bool> {
        set_lock(fd, libc::F_WRLCK, ATTACHED_LOCK_BYTE, 1)
    }

    /// What a new description of the table file is for.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(crate) enum Access {
        /// To take this process's registration locks through (read-write, as a write lock
        /// needs), then to be pinned by an anchor (see `anchor.rs`).
        Locks,
        /// To test others' locks through (read-only), marked as a probe (see
        /// [`mark_probe`]).
        Probe,
    }

    /// Opens a new open file description of the table file `want`: through
    /// `/proc/self/fd` of `fd`, else by `path`, accepting only the same file.
    pub(crate) fn reopen(
        fd: impl AsFd,
        path: &std::path::Path,
        want: FileId,
        access: Access,
    ) -> io::Result<OwnedFd> {
        use std::os::unix::fs::OpenOptionsExt;
        let open = |p: &std::path::Path| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(access == Access::Locks)
                .custom_flags(libc::O_CLOEXEC | libc::O_NONBLOCK)
                .open(p)
        };
        let raw = fd.as_fd().as_raw_fd();
        let proc_path = std::path::PathBuf::from(format!("/proc/self/fd/{raw}"));
        // Why neither candidate gave the table. An error about this process (out of
        // descriptors or memory) is the cause, whatever the paths say.
        let mut path_error = None;
        let mut proc_missing = false;
        for candidate in [proc_path.as_path(), path] {
            match open(candidate) {
                Ok(file) => {
                    let meta = file.metadata()?;
                    if meta.dev() == want.dev && meta.ino() == want.ino {
                        if access == Access::Probe {
                            mark_probe(&file)?;
                        }
                        return Ok(OwnedFd::from(file));
                    }
                }
                Err(e) if is_exhaustion(&e) => return Err(e),
                Err(_) if candidate == proc_path => {
                    proc_missing = !std::path::Path::new("/proc/self").exists();
                }
                Err(e) => path_error = Some(e),
            }
        }
        let by_path = match path_error {
            Some(e) => format!("its path names no file it can open now ({e})"),
            None => "its path names another file now".to_string(),
        };
        let why = if proc_missing {
            format!("the table file cannot be opened again: there is no /proc, and {by_path}")
        } else {
            format!("the table file can no longer be opened: {by_path}")
        };
        Err(io::Error::other(why))
    }

    /// Whether an error is about this process's resources rather than the file.
    fn is_exhaustion(e: &io::Error) -> bool {
        matches!(
            e.raw_os_error(),
            Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM)
        )
    }

    /// Marks a description this process opened as a probe: lock tests go through it, so
    /// it must hold none of this process's locks. The mark is an owner for `SIGIO`
    /// (which nothing asks for without `O_ASYNC`): no description the library takes
    /// locks through has one, and a program's own descriptor of the table seldom does, so
    /// a probe number that a program closed and reused is told from the library's own.
    pub(crate) fn mark_probe(fd: impl AsFd) -> io::Result<()> {
        let fd = fd.as_fd().as_raw_fd();
        // SAFETY: F_SETOWN on a descriptor this process owns; it takes an integer.
        let rc = unsafe { libc::fcntl(fd, libc::F_SETOWN, std::process::id()) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Whether `fd` is a probe of the library's (see [`mark_probe`]). (A lock test
    /// through the very description that holds the lock would find it free.)
    pub(crate) fn is_probe(fd: impl AsFd) -> bool {
        let fd = fd.as_fd().as_raw_fd();
        // SAFETY: F_GETOWN reads a descriptor's owner; an invalid number is an error.
        unsafe { libc::fcntl(fd, libc::F_GETOWN) > 0 }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::fs::{File, OpenOptions};
    use std::sync::atomic::AtomicU64;

    use super::*;

    fn file() -> (std::path::PathBuf, File) {
        let path = std::env::temp_dir().join(format!(
            "shmlock-registry-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        f.set_len(8192).unwrap();
        (path, f)
    }

    fn me(pid: u32) -> Identity {
        Identity {
            pid,
            start: 7,
            pid_ns: 9,
        }
    }

    /// The kernel facts the registry rests on: a lock of one open file description is seen
    /// from another one of the same process, and goes when its last descriptor closes.
    #[test]
    fn open_file_description_locks_judge_owners_in_one_process() {
        let (path, probe) = file();
        let words: Vec<AtomicU64> = (0..2 * ENTRY_WORDS).map(|_| AtomicU64::new(0)).collect();
        let reg = Registry::new(&words);
        let fd1 = reopen(&probe, &path, FileId::of(&probe).unwrap(), Access::Locks).unwrap();
        let fd2 = reopen(&probe, &path, FileId::of(&probe).unwrap(), Access::Locks).unwrap();
        fn with<'a>(take: Option<&'a std::os::fd::OwnedFd>, probe: &'a File) -> FileLocks<'a> {
            use std::os::fd::AsFd;
            FileLocks {
                take: take.map(|fd| fd.as_fd()),
                probe: probe.as_fd(),
            }
        }
        let locks = |_: Option<()>| with(None, &probe);
        let a = reg.register(&with(Some(&fd1), &probe), me(1), 0).unwrap();
        let b = reg.register(&with(Some(&fd2), &probe), me(2), 0).unwrap();
        assert_ne!(a.entry(), b.entry());
        assert_eq!(reg.identity(a, None), Some(me(1)));
        assert_eq!(reg.identity(a, Some(reg.generation(a))), Some(me(1)));
        assert_eq!(reg.identity(a, Some(reg.generation(a) ^ 64)), None);
        assert!(!reg.is_dead(&locks(None), a, None) && !reg.is_dead(&locks(None), b, None));
        // the descriptor closes: the owner is gone
        drop(fd1);
        assert!(reg.is_dead(&locks(None), a, None));
        assert!(!reg.is_dead(&locks(None), b, None));
        // its entry (the only one free) is taken again under a new generation; the old
        // owner stays dead
        let fd3 = reopen(&probe, &path, FileId::of(&probe).unwrap(), Access::Locks).unwrap();
        let c = reg
            .register(&with(Some(&fd3), &probe), me(3), a.entry() as usize)
            .unwrap();
        assert_eq!(c.entry(), a.entry());
        assert!(reg.is_dead(&locks(None), a, None) && !reg.is_dead(&locks(None), c, None));
        assert_eq!(reg.identity(a, None), None);
        // leaving cleanly is dead at once
        reg.unregister(b);
        assert!(reg.is_dead(&locks(None), b, None));
        // out-of-range and unknown owners are alive
        assert!(!reg.is_dead(&locks(None), OwnerId::new(1000, 1), None));
        assert!(!reg.is_dead(&locks(None), OwnerId::UNKNOWN, None));
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_full_registry_gives_no_entry() {
        let (path, probe) = file();
        let words: Vec<AtomicU64> = (0..ENTRY_WORDS).map(|_| AtomicU64::new(0)).collect();
        let reg = Registry::new(&words);
        let fd1 = reopen(&probe, &path, FileId::of(&probe).unwrap(), Access::Locks).unwrap();
        let fd2 = reopen(&probe, &path, FileId::of(&probe).unwrap(), Access::Locks).unwrap();
        fn take<'a>(fd: &'a std::os::fd::OwnedFd, probe: &'a File) -> FileLocks<'a> {
            FileLocks {
                take: Some(std::os::fd::AsFd::as_fd(fd)),
                probe: std::os::fd::AsFd::as_fd(probe),
            }
        }
        assert!(reg.register(&take(&fd1, &probe), me(1), 0).is_some());
        assert_eq!(reg.register(&take(&fd2, &probe), me(2), 0), None);
        let _ = std::fs::remove_file(&path);
    }
}
