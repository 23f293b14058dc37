//! Creating, attaching to and mapping a table file.
//!
//! Creation is race-free without any lock: the table is built completely in an unnamed
//! file (`O_TMPFILE`) in the same directory and then linked to its path, which fails if
//! the path exists. Of many processes creating one path at once, exactly one link wins
//! and the others attach to the winner's file; nobody ever sees a half-written table, and
//! a creator killed midway leaves nothing behind. (Where `O_TMPFILE` or `/proc` is
//! missing, a named temporary file is used instead, which a kill can leave behind.)
//!
//! A symbolic link at the path is followed when it leads to an existing file, so a table
//! can be reached through one. A table is never *created* through a link: a dangling link
//! at the path is an error, not a place to create one (in a shared directory such as
//! `/dev/shm` anyone can plant one).
//!
//! Attaching reads the header with `pread` and checks the file size before mapping, so a
//! foreign, truncated or corrupt file is an error, never a SIGBUS. A process that opens
//! the file for writing then marks it in use (a read lock on one header byte) and
//! registers as an owner (see `registry.rs`), after resetting a table left by an earlier
//! boot if — and only if — it read this boot's id, the file names another, and it could
//! lock that byte for writing (no other process has the file open for writing).

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::error::{Error, FormatError};
use crate::shm::anchor::Anchor;
use crate::shm::format::{Header, Layout, HEADER_SIZE};
use crate::shm::mapping::Mapping;
use crate::shm::registry::{self, FileId, FileLocks, Identity, OwnerId};

/// How to open a table file.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OpenSpec {
    /// What the file must hold; the lengths of a dict's layout count only when creating.
    pub layout: Layout,
    /// Keys of a table this call creates; ignored when attaching.
    pub capacity: u64,
    /// Registry entries (processes attached at once) of a table this call creates.
    pub registry: u32,
    /// Permission bits of a table this call creates.
    pub mode: u32,
    /// Create the file if it does not exist.
    pub create: bool,
    /// Map it read-only, register nothing (for inspection by anyone who can read it).
    pub read_only: bool,
    /// Attach to an existing table without taking a registry entry: the handle takes one
    /// at its first acquisition (as a forked child does), so that breaking or reaping
    /// holds works while every entry is taken.
    pub lazy: bool,
}

impl OpenSpec {
    pub(crate) fn new(layout: Layout) -> OpenSpec {
        OpenSpec {
            layout,
            capacity: 1024,
            registry: crate::shm::format::DEFAULT_REGISTRY,
            mode: 0o600,
            create: true,
            read_only: false,
            lazy: false,
        }
    }
}

/// How long an attaching process waits for another one to finish resetting the table.
const ATTACH_PATIENCE: Duration = Duration::from_secs(10);
/// How many times the path may vanish and reappear under one open before it gives up.
const OPEN_ROUNDS: u32 = 100;

/// An open, validated, mapped table, registered as one of its owners unless read-only.
pub(crate) struct Opened {
    pub map: Mapping,
    pub header: Header,
    pub created: bool,
    /// The descriptor the mapping came from. It holds no lock, so it can test others'.
    pub file: File,
    /// The file's device and inode, which every descriptor used later must still name.
    pub id: FileId,
    /// What keeps this process attached, and registered.
    pub pin: Pin,
}

/// What an open left pinned in the file (see `anchor.rs`).
pub(crate) enum Pin {
    /// Nothing: a read-only handle (and only such a one).
    None,
    /// This process marked attached, with no registry entry (a lazy handle): no reset can
    /// start under it (see [`join`]).
    Attached(Anchor),
    /// This process's registration: what keeps it, and the owner id its entries carry.
    Registered(Anchor, OwnerId),
}

pub(crate) fn open(path: &Path, spec: OpenSpec) -> Result<Opened, Error> {
    if path.as_os_str().is_empty() {
        // (the OS's answer, ENOENT, came out as ": No such file or directory")
        return Err(Error::InvalidOptions("the path is empty: it names no file"));
    }
    if spec.mode & !0o777 != 0 {
        return Err(Error::InvalidOptions(
            "mode may only hold permission bits (at most 0o777)",
        ));
    }
    if spec.mode & 0o600 != 0o600 {
        return Err(Error::InvalidOptions(
            "mode must let the owner read and write the file (0o600): without both, nobody \
             but root could open it to lock (0o660 shares it with a group)",
        ));
    }
    crate::shm::process::check_clock()?;
    for _ in 0..OPEN_ROUNDS {
        let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
        match OpenOptions::new()
            .read(true)
            .write(!spec.read_only)
            .custom_flags(flags)
            .open(path)
        {
            Ok(file) => {
                let opened = attach(path, file, false, spec)?;
                if still_there(path, &opened) {
                    return Ok(opened);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound && spec.create && !spec.read_only => {
                if let Some(file) = create(path, spec)? {
                    let opened = attach(path, by_its_name(path, file), true, spec)?;
                    if still_there(path, &opened) {
                        return Ok(opened);
                    }
                }
                // Something is at the path: someone else linked first, or a dangling link.
                if let Ok(m) = fs::symlink_metadata(path) {
                    if m.file_type().is_symlink() && fs::metadata(path).is_err() {
                        return Err(Error::io(
                            path,
                            io::Error::new(
                                io::ErrorKind::NotFound,
                                "a dangling symbolic link is at the path; a table is never \
                                 created through a link (remove it, or point it at a table)",
                            ),
                        ));
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // (to inspect: the table of the path may be deleted and still in use)
                return Err(deleted_in_use(path).unwrap_or_else(|| Error::io(path, e)));
            }
            // Opened to change it: one who may only read it is told how to look at it.
            Err(e)
                if e.raw_os_error() == Some(libc::EACCES)
                    && !spec.read_only
                    && OpenOptions::new()
                        .read(true)
                        .custom_flags(flags)
                        .open(path)
                        .is_ok() =>
            {
                return Err(Error::io(
                    path,
                    io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        "permission denied: this user may read the file but not write it, \
                         and a handle that locks or stores must write; one that only reads \
                         it opens with `options().read_only(true)` (as `shmlock inspect` \
                         does)",
                    ),
                ));
            }
            // (said as a read-only open says it, not as "Is a directory (os error 21)")
            Err(e) if e.raw_os_error() == Some(libc::EISDIR) => {
                return Err(Error::io(path, not_a_table_file("a directory")));
            }
            // (a Unix socket cannot be opened: ENXIO says nothing of why)
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
                let socket = fs::metadata(path).is_ok_and(|m| m.file_type().is_socket());
                let why = if socket {
                    not_a_table_file("a Unix socket")
                } else {
                    e
                };
                return Err(Error::io(path, why));
            }
            Err(e) => return Err(Error::io(path, e)),
        }
    }
    Err(Error::io(
        path,
        io::Error::other("the path kept appearing and vanishing while it was opened"),
    ))
}

/// Whether `path` still leads to the file just mapped. A file deleted between its opening
/// and its mapping would be a table nobody else can reach, which a process that creates
/// one at the path meanwhile could not have seen mapped: it is let go, and the path opened
/// again. Once mapped, the mapping is what such a process sees.
fn still_there(path: &Path, opened: &Opened) -> bool {
    crate::shm::deleted::left(path, &opened.file, opened.id).is_none()
}

/// [`Error::DeletedInUse`] if live processes still map a deleted table of `path`.
fn deleted_in_use(path: &Path) -> Option<Error> {
    let users = crate::shm::deleted::users(path);
    (!users.pids.is_empty()).then(|| Error::DeletedInUse {
        path: path.to_path_buf(),
        pids: users.pids,
        unseen: users.unseen,
    })
}

/// The file just linked at `path`, opened again by that name: a mapping shows the name of
/// the file it was made through, and one made through the unnamed file reads as
/// `#INODE (deleted)` for good, so that nobody could tell later that it maps a deleted
/// table of `path` (see `deleted`). The unnamed descriptor if the path no longer leads to
/// the file.
fn by_its_name(path: &Path, file: File) -> File {
    let Ok(id) = FileId::of(&file) else {
        return file;
    };
    match OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(named) if id.names(&named) => named,
        _ => file,
    }
}

/// Builds a complete table beside `path` and links it into place. `None` if something
/// appeared at `path` meanwhile.
fn create(path: &Path, spec: OpenSpec) -> Result<Option<File>, Error> {
    spec.layout.check(spec.capacity, spec.registry)?;
    // A table of this path deleted while in use: its users would not see a new one.
    if let Some(e) = deleted_in_use(path) {
        return Err(e);
    }
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let header = Header {
        seed: random_u64(),
        boot_id: boot_id().unwrap_or([0; 16]),
        created_ns: unix_ns(),
        token_base: unix_ns(),
        ..Header::new(spec.layout, spec.capacity, spec.registry)
    };
    let needed = header.file_len();
    let build = |file: &File| -> io::Result<()> {
        // The umask may have cleared bits the caller asked for.
        file.set_permissions(fs::Permissions::from_mode(spec.mode))?;
        reserve(file, needed)?;
        file.write_all_at(&header.encode(), 0)
    };
    // A file system without room says how much there is, against what is needed. (A quota
    // or a file-size limit is not the file system's room: those stay the system's error.)
    let failed = |e: io::Error| match e.raw_os_error() {
        Some(libc::ENOSPC) => Error::NoSpace {
            path: path.to_path_buf(),
            needed,
            available: nix::sys::statvfs::statvfs(&dir).map_or(0, free_bytes),
        },
        _ => Error::io(path, e),
    };
    match OpenOptions::new()
        .read(true)
        .write(true)
        .mode(spec.mode)
        .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
        .open(&dir)
    {
        Ok(file) => {
            build(&file).map_err(failed)?;
            match link_unnamed(&file, path) {
                Ok(true) => return Ok(Some(file)),
                Ok(false) => return Ok(None),
                // Neither /proc nor the right to link by descriptor: use a named file.
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EPERM)) => {}
                Err(e) => return Err(Error::io(path, e)),
            }
        }
        // The filesystem cannot make unnamed files.
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL)
            ) => {}
        Err(e) => return Err(Error::io(&dir, e)),
    }
    create_named(path, &dir, spec, build, failed)
}

/// The bytes an unprivileged process may still write on a filesystem.
#[allow(clippy::unnecessary_cast)] // the counts are 32-bit on some targets
fn free_bytes(v: nix::sys::statvfs::Statvfs) -> u64 {
    (v.blocks_available() as u64).saturating_mul(v.fragment_size() as u64)
}

/// Links an `O_TMPFILE` file to `path`. `Ok(false)`: the path exists.
fn link_unnamed(file: &File, path: &Path) -> io::Result<bool> {
    use nix::fcntl::{AtFlags, AT_FDCWD};
    let proc_path = format!("/proc/self/fd/{}", file.as_raw_fd());
    let linked = nix::unistd::linkat(
        AT_FDCWD,
        proc_path.as_str(),
        AT_FDCWD,
        path,
        AtFlags::AT_SYMLINK_FOLLOW,
    )
    .or_else(|e| {
        if e == nix::errno::Errno::ENOENT {
            nix::unistd::linkat(file, "", AT_FDCWD, path, AtFlags::AT_EMPTY_PATH)
        } else {
            Err(e)
        }
    });
    match linked {
        Ok(()) => Ok(true),
        Err(nix::errno::Errno::EEXIST) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Creation through a named temporary file, where unnamed ones cannot be linked.
fn create_named(
    path: &Path,
    dir: &Path,
    spec: OpenSpec,
    build: impl Fn(&File) -> io::Result<()>,
    failed: impl Fn(io::Error) -> Error,
) -> Result<Option<File>, Error> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(
        ".{name}.{}.{:x}.tmp",
        std::process::id(),
        random_u64()
    ));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(spec.mode)
        .custom_flags(libc::O_CLOEXEC)
        .open(&tmp)
        .map_err(|e| Error::io(&tmp, e))?;
    if let Err(e) = build(&file) {
        let _ = fs::remove_file(&tmp);
        return Err(failed(e));
    }
    let linked = match fs::hard_link(&tmp, path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    };
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(true) => Ok(Some(file)),
        Ok(false) => Ok(None),
        Err(e) => Err(Error::io(path, e)),
    }
}

/// Allocates the whole file now, so a full filesystem fails here instead of raising SIGBUS
/// on first touch of a page.
fn reserve(file: &File, len: u64) -> io::Result<()> {
    match nix::fcntl::posix_fallocate(file, 0, len as libc::off_t) {
        Ok(()) => Ok(()),
        // Filesystems without fallocate: fall back to extending the file (sparse).
        Err(nix::errno::Errno::EOPNOTSUPP | nix::errno::Errno::EINVAL) => file.set_len(len),
        Err(e) => Err(e.into()),
    }
}

/// What is at a path that is no file the library could have made: `what`.
fn not_a_table_file(what: &str) -> io::Error {
    io::Error::other(format!("{what}, not a shmlock file"))
}

fn attach(path: &Path, file: File, created: bool, spec: OpenSpec) -> Result<Opened, Error> {
    let meta = file.metadata().map_err(|e| Error::io(path, e))?;
    if !meta.file_type().is_file() {
        let what = if meta.file_type().is_fifo() {
            "a FIFO"
        } else if meta.is_dir() {
            "a directory"
        } else {
            "not a regular file"
        };
        return Err(Error::io(path, not_a_table_file(what)));
    }
    if let Some(fs) = kernel_fs(&file) {
        let what = format!("a file of the kernel's {fs}");
        return Err(Error::io(path, not_a_table_file(&what)));
    }
    let len = meta.len();
    let mut head = vec![0u8; HEADER_SIZE.min(len as usize)];
    file.read_exact_at(&mut head, 0)
        .map_err(|e| Error::io(path, e))?;
    let header = Header::decode(&head).map_err(|e| e.at(path))?;
    if header.layout.magic() != spec.layout.magic() {
        let wrong = FormatError::WrongKind {
            found: header.layout.name(),
            expected: spec.layout.name(),
        };
        return Err(Error::from(wrong).at(path));
    }
    let expected = header.file_len();
    if len < expected {
        return Err(Error::from(FormatError::Truncated { len, expected }).at(path));
    }
    if len > expected {
        return Err(Error::from(FormatError::Corrupt("file longer than its layout")).at(path));
    }
    let id = FileId::of(&file).map_err(|e| Error::io(path, e))?;
    // This description never holds a lock of ours: it is the probe lock tests go through.
    registry::mark_probe(&file).map_err(|e| Error::io(path, e))?;
    let map = Mapping::new(&file, &header, !spec.read_only).map_err(|e| Error::io(path, e))?;
    if spec.read_only {
        return Ok(Opened {
            map,
            header,
            created,
            file,
            id,
            pin: Pin::None,
        });
    }
    // A lazy handle joins as any writer does (a table of an earlier boot is reset first,
    // and none can be reset under it after), but takes no registry entry. (A table this
    // call made registers now.)
    let lazy = spec.lazy && !created;
    let (anchor, header, owner) =
        pin_registration(path, file.as_fd(), id, &map, Some(header), !lazy)?;
    let header = header.expect("given a header, a registration returns one");
    let pin = match owner {
        Some(owner) => Pin::Registered(anchor, owner),
        None => Pin::Attached(anchor),
    };
    Ok(Opened {
        map,
        header,
        created,
        file,
        id,
        pin,
    })
}

/// The name of the kernel's file system `file` is on, if it is one whose files show the
/// kernel's state (their sizes say nothing of what a read gets, so the format's own
/// errors would be wrong: "empty file, remove it" of `/proc/self/status`).
fn kernel_fs(file: &File) -> Option<&'static str> {
    use nix::sys::statfs as fs;
    let kind = fs::fstatfs(file).ok()?.filesystem_type();
    [
        (fs::PROC_SUPER_MAGIC, "proc file system"),
        (fs::SYSFS_MAGIC, "sysfs"),
        (fs::CGROUP_SUPER_MAGIC, "cgroup file system"),
        (fs::CGROUP2_SUPER_MAGIC, "cgroup2 file system"),
        (fs::DEBUGFS_MAGIC, "debugfs"),
        (fs::TRACEFS_MAGIC, "tracefs"),
        (fs::SECURITYFS_MAGIC, "securityfs"),
        (fs::BPF_FS_MAGIC, "bpf file system"),
    ]
    .into_iter()
    .find(|(magic, _)| *magic == kind)
    .map(|(_, name)| name)
}

/// Registers this process in the file: marks it attached (after resetting a table left
/// by an earlier boot, when `header` is given and the rule allows it) and, if `entry`,
/// takes a registry entry, through a description that only an anchor keeps (see
/// `anchor.rs`). Waits while another process is resetting the table (up to 10 s), without
/// holding anything. Returns the anchor, the header as it is once attached (if one was
/// given), and the owner id (if `entry`).
pub(crate) fn pin_registration(
    path: &Path,
    file: BorrowedFd<'_>,
    id: FileId,
    map: &Mapping,
    header: Option<Header>,
    entry: bool,
) -> Result<(Anchor, Option<Header>, Option<OwnerId>), Error> {
    let until = std::time::Instant::now() + ATTACH_PATIENCE;
    let mut header = header;
    loop {
        let (anchor, joined) = Anchor::pin(file, path, id, |lock_fd| {
            let Joined::Attached(now) = join(path, file, lock_fd, map, header)? else {
                return Ok(None);
            };
            if !entry {
                return Ok(Some((now, None)));
            }
            let entries = map.registry().len() as u32;
            Ok(Some((
                now,
                Some(register(path, file, lock_fd, map, entries)?),
            )))
        })?;
        if let Some((now, None)) = joined {
            return Ok((anchor, now, None));
        }
        if let Some((now, Some(owner))) = joined {
            // A filesystem that maps another file than the one opened (overlayfs) lets the
            // locks go with the anchor's descriptor: refuse it rather than be judged dead.
            let locks = FileLocks {
                take: None,
                probe: file,
            };
            let held = registry::EntryLocks::is_held(&locks, owner.entry() as usize);
            // (unless this is a child that a signal handler forked since the pin: the anchor
            // is its parent's, whose locks go when the parent does, and the caller, seeing
            // its epoch, registers anew; looked at last, so that no fork slips in between)
            let ours = anchor.epoch() == crate::shm::process::fork_epoch();
            if ours && !held.map_err(|e| Error::io(path, e))? {
                return Err(Error::io(
                    path,
                    io::Error::new(
                        io::ErrorKind::Unsupported,
                        "this filesystem keeps no lock for a file that is only mapped \
                         (overlayfs maps the file beneath it): put the table on tmpfs \
                         (/dev/shm) or a plain local filesystem",
                    ),
                ));
            }
            return Ok((anchor, now, Some(owner)));
        }
        // Someone is resetting the table right now.
        drop(anchor);
        if std::time::Instant::now() >= until {
            return Err(Error::io(
                path,
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    "another process has been resetting this table for 10 s (stopped?)",
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
        if header.is_some() {
            header = Some(read_header(path, file)?);
        }
    }
}

/// Marks the file in use by this process (a read lock on its attached byte, taken through
/// `lock_fd`, which the registration's anchor keeps), after resetting a table left by an
/// earlier boot if `header` is given and — only if — this process read this boot's id, the
/// file names another, and it could take that byte for writing (no other process has the
/// file open). Returns the header as it is once the byte is held (a reset by another
/// process in the meantime is seen; `None` inside the `Some` when no header was given),
/// or `None` while another process is resetting the table.
fn join(
    path: &Path,
    file: BorrowedFd<'_>,
    lock_fd: BorrowedFd<'_>,
    map: &Mapping,
    header: Option<Header>,
) -> Result<Joined, Error> {
    let unsupported = |e: io::Error| {
        Error::io(
            path,
            io::Error::new(
                e.kind(),
                format!(
                    "byte-range locks (F_OFD_SETLK) do not work on this file ({e}): the \
                         owner registry needs them"
                ),
            ),
        )
    };
    if let Some(header) = header {
        if let Some(now) = boot_id().filter(|now| *now != header.boot_id) {
            if registry::attach_alone(lock_fd).map_err(unsupported)? {
                // Nobody else has the file open: it is ours to reset (re-read under the
                // lock: someone may have reset it already).
                let header = read_header(path, file)?;
                if header.boot_id != now {
                    reset(path, file, map, header, now)?;
                }
            }
            // Otherwise in use by a live process (of this boot, since locks do not survive
            // a reboot): whoever it is, its entries are not stale. Leave them.
        }
    }
    if !registry::mark_attached(lock_fd).map_err(unsupported)? {
        return Ok(Joined::Resetting);
    }
    // Held now (a write lock of ours became this read lock): no reset can start. The
    // header is read again: a reset by another process in the meantime is seen.
    match header {
        Some(_) => Ok(Joined::Attached(Some(read_header(path, file)?))),
        None => Ok(Joined::Attached(None)),
    }
}

/// What [`join`] found.
enum Joined {
    /// Marked attached; the header as it is now, if one was asked for.
    Attached(Option<Header>),
    /// Another process is resetting the table: try again shortly.
    Resetting,
}

/// Takes a registry entry for this process through `lock_fd` (the description the
/// registration's anchor keeps), or says why it cannot.
pub(crate) fn register(
    path: &Path,
    file: BorrowedFd<'_>,
    lock_fd: BorrowedFd<'_>,
    map: &Mapping,
    entries: u32,
) -> Result<OwnerId, Error> {
    let me = crate::shm::process::current();
    let id = Identity {
        pid: me.pid,
        start: me.start,
        pid_ns: crate::shm::process::pid_namespace(),
    };
    let locks = FileLocks {
        take: Some(lock_fd),
        probe: file,
    };
    map.registry()
        .register(&locks, id, me.pid as usize)
        .ok_or(Error::TooManyProcesses {
            path: path.to_path_buf(),
            max: entries,
        })
}

fn read_header(path: &Path, file: BorrowedFd<'_>) -> Result<Header, Error> {
    let mut head = vec![0u8; HEADER_SIZE];
    let mut done = 0;
    while done < head.len() {
        match nix::sys::uio::pread(file, &mut head[done..], done as libc::off_t) {
            Ok(0) => break, // shorter than a header: decode says what is wrong
            Ok(n) => done += n,
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(Error::io(path, e.into())),
        }
    }
    head.truncate(done);
    Header::decode(&head).map_err(|e| e.at(path))
}

/// Empties a table of an earlier boot: its deadlines and owners mean nothing now. Fencing
/// tokens carry on above every token handed out before. Caller holds the attached byte
/// for writing: nobody else has the file open for writing.
#[cold]
fn reset(
    path: &Path,
    file: BorrowedFd<'_>,
    map: &Mapping,
    mut header: Header,
    boot: [u8; 16],
) -> Result<Header, Error> {
    let max_fence = match header.layout {
        Layout::Locks => {
            const FENCE: usize = std::mem::offset_of!(crate::shm::slot::Slot, fence) / 8;
            const SLOT: usize = crate::shm::format::SLOT_SIZE / 8;
            (0..header.slot_count as usize)
                .map(|i| map.words()[i * SLOT + FENCE].load(Ordering::Relaxed))
                .max()
                .unwrap_or(0)
        }
        Layout::Dict { .. } => 0,
    };
    for w in map.all() {
        w.store(0, Ordering::Relaxed);
    }
    header.boot_id = boot;
    header.token_base = unix_ns().max(
        header
            .token_base
            .saturating_add(max_fence)
            .saturating_add(1),
    );
    let bytes = header.encode();
    let written = nix::sys::uio::pwrite(file, &bytes, 0).map_err(|e| Error::io(path, e.into()))?;
    if written != bytes.len() {
        return Err(Error::io(
            path,
            io::Error::other("short write of the header"),
        ));
    }
    Ok(header)
}

/// The kernel's boot id (`/proc/sys/kernel/random/boot_id`), or `None` where it cannot be
/// read (no `/proc`, a masked `/proc/sys`, ...).
pub(crate) fn boot_id() -> Option<[u8; 16]> {
    let text = fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let hex: Vec<u8> = text.bytes().filter(u8::is_ascii_hexdigit).collect();
    if hex.len() != 32 {
        return None;
    }
    let mut id = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        id[i] = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    (id != [0; 16]).then_some(id)
}

fn random_u64() -> u64 {
    let mut buf = [0u8; 8];
    match getrandom::fill(&mut buf) {
        Ok(()) => u64::from_le_bytes(buf),
        Err(_) => unix_ns() ^ (u64::from(std::process::id()) << 32),
    }
}

pub(crate) fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
