//! Creating, attaching to and mapping a table file.
//!
//! Creation is race-free without any lock: the table is built completely in a temporary
//! file in the same directory and then `link`ed to its path, which fails if the path
//! exists. Of many processes creating one path at once, exactly one link wins and the
//! others attach to the winner's file; nobody ever sees a half-written table. (`rename`
//! would silently replace a table others already use.)
//!
//! Attaching reads the header with `pread` and checks the file size before mapping, so a
//! foreign, truncated or corrupt file is an error, never a SIGBUS.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::{MmapOptions, MmapRaw};

use crate::error::{Error, FormatError};
use crate::format::{Header, Layout, HEADER_SIZE};
use crate::slot::Slot;

/// How to open a table file.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OpenSpec {
    /// What the file must hold; the lengths of a dict's layout count only when creating.
    pub layout: Layout,
    /// Slots of a table this call creates; ignored when attaching.
    pub capacity: u64,
    /// Permission bits of a table this call creates.
    pub mode: u32,
    /// Create the file if it does not exist.
    pub create: bool,
}

/// The body (everything after the header) of a mapped table file.
pub(crate) struct Mapping {
    body: NonNull<AtomicU64>,
    words: usize,
    // Keeps the mapping (and so `body`) valid; unmapped on drop.
    _map: MmapRaw,
}

// SAFETY: the body is only reached through atomics (`&[AtomicU64]`, or `&Slot` whose fields
// are all atomics), so sharing it across threads is as sound as sharing the atomics; the
// mapping itself is owned and unmapped exactly once.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// The body as words. Every layout is made of 8-byte-aligned atomics.
    #[inline]
    pub(crate) fn words(&self) -> &[AtomicU64] {
        // SAFETY: the mapping is `HEADER_SIZE + words * 8` bytes (checked against the file
        // size before mapping, and the file is never shrunk by us), so the range is in
        // bounds; it starts one page in, so it is aligned; every bit pattern is a valid
        // `AtomicU64`; all mutation, by us or by other processes, is atomic; and `self`
        // keeps the mapping alive for the returned lifetime.
        unsafe { std::slice::from_raw_parts(self.body.as_ptr(), self.words) }
    }
}

/// The slots of a mapped lock table.
pub(crate) struct MappedSlots(Mapping);

impl MappedSlots {
    /// The body of a lock-table file: slots right after the header.
    pub(crate) fn new(map: Mapping, header: &Header) -> MappedSlots {
        assert!(header.layout == Layout::Locks);
        assert!(map.words * 8 == header.slot_count as usize * std::mem::size_of::<Slot>());
        MappedSlots(map)
    }
}

impl AsRef<[Slot]> for MappedSlots {
    #[inline]
    fn as_ref(&self) -> &[Slot] {
        let words = self.0.words();
        // SAFETY: `new` checked that the body is exactly a whole number of slots; it is
        // page-aligned plus 4096, so 64-byte aligned; every bit pattern is a valid `Slot`
        // (atomic integers only), and the slice borrows the mapping.
        unsafe {
            std::slice::from_raw_parts(
                words.as_ptr().cast::<Slot>(),
                words.len() * 8 / std::mem::size_of::<Slot>(),
            )
        }
    }
}

/// An open, validated, mapped table.
pub(crate) struct Opened {
    pub map: Mapping,
    pub header: Header,
    pub created: bool,
}

pub(crate) fn open(path: &Path, spec: OpenSpec) -> Result<Opened, Error> {
    loop {
        match OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
        {
            Ok(file) => return attach(path, file, false, spec.layout),
            Err(e) if e.kind() == io::ErrorKind::NotFound && spec.create => {
                if let Some(file) = create(path, spec)? {
                    return attach(path, file, true, spec.layout);
                }
                // Someone else linked first: attach to theirs.
            }
            Err(e) => return Err(Error::io(path, e)),
        }
    }
}

/// Builds a complete table beside `path` and links it into place. `None` if `path`
/// appeared meanwhile.
fn create(path: &Path, spec: OpenSpec) -> Result<Option<File>, Error> {
    spec.layout.check(spec.capacity)?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
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
    let result = (|| {
        // The umask may have cleared bits the caller asked for.
        file.set_permissions(fs::Permissions::from_mode(spec.mode))?;
        let header = Header {
            layout: spec.layout,
            slot_count: spec.capacity,
            seed: random_u64(),
            boot_id: boot_id(),
            created_ns: unix_ns(),
            pid_ns: crate::process::pid_namespace(),
        };
        reserve(&file, header.file_len())?;
        file.write_all_at(&header.encode(), 0)?;
        match fs::hard_link(&tmp, path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(e),
        }
    })();
    let _ = fs::remove_file(&tmp);
    match result {
        Ok(true) => Ok(Some(file)),
        Ok(false) => Ok(None),
        Err(e) => Err(Error::io(path, e)),
    }
}

/// Allocates the whole file now, so a full filesystem fails here instead of raising SIGBUS
/// on first touch of a page.
fn reserve(file: &File, len: u64) -> io::Result<()> {
    // SAFETY: a valid open fd and an in-range length; posix_fallocate returns the error
    // number instead of setting errno.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) };
    match rc {
        0 => Ok(()),
        // Filesystems without fallocate: fall back to extending the file (sparse).
        libc::EOPNOTSUPP | libc::EINVAL => file.set_len(len),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

fn attach(path: &Path, file: File, created: bool, layout: Layout) -> Result<Opened, Error> {
    let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    let mut head = vec![0u8; HEADER_SIZE.min(len as usize)];
    file.read_exact_at(&mut head, 0)
        .map_err(|e| Error::io(path, e))?;
    let header = Header::decode(&head).map_err(|e| e.at(path))?;
    if header.layout.magic() != layout.magic() {
        let wrong = FormatError::WrongKind {
            found: header.layout.name(),
            expected: layout.name(),
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
    let map = MmapOptions::new()
        .len(expected as usize)
        .map_raw(&file)
        .map_err(|e| Error::io(path, e))?;
    let body = NonNull::new(
        map.as_mut_ptr()
            .wrapping_add(HEADER_SIZE)
            .cast::<AtomicU64>(),
    )
    .expect("mmap returned null");
    let map = Mapping {
        body,
        words: (header.body_len() / 8) as usize,
        _map: map,
    };
    let header = if header.boot_id != boot_id() {
        reset_after_reboot(path, &file, &map)?
    } else {
        header
    };
    Ok(Opened {
        map,
        header,
        created,
    })
}

/// Deadlines and pids of an earlier boot mean nothing now: every entry is stale. The first
/// process of this boot to attach clears the body, under `flock` so that it happens once.
#[cold]
fn reset_after_reboot(path: &Path, file: &File, map: &Mapping) -> Result<Header, Error> {
    let fd = file.as_raw_fd();
    // SAFETY: valid fd; flock blocks until granted.
    if unsafe { libc::flock(fd, libc::LOCK_EX) } != 0 {
        return Err(Error::io(path, io::Error::last_os_error()));
    }
    let result = (|| {
        let mut head = vec![0u8; HEADER_SIZE];
        file.read_exact_at(&mut head, 0)
            .map_err(|e| Error::io(path, e))?;
        let mut header = Header::decode(&head).map_err(|e| e.at(path))?;
        let now_boot = boot_id();
        if header.boot_id != now_boot {
            for word in map.words() {
                word.store(0, Ordering::Relaxed);
            }
            header.boot_id = now_boot;
            file.write_all_at(&header.encode(), 0)
                .map_err(|e| Error::io(path, e))?;
        }
        Ok(header)
    })();
    // SAFETY: valid fd.
    unsafe { libc::flock(fd, libc::LOCK_UN) };
    result
}

/// The kernel's boot id (`/proc/sys/kernel/random/boot_id`), or zeros where there is none.
pub(crate) fn boot_id() -> [u8; 16] {
    let mut id = [0u8; 16];
    if let Ok(text) = fs::read_to_string("/proc/sys/kernel/random/boot_id") {
        let hex: Vec<u8> = text.bytes().filter(u8::is_ascii_hexdigit).collect();
        for (i, pair) in hex.chunks(2).take(16).enumerate() {
            let s = std::str::from_utf8(pair).unwrap_or("0");
            id[i] = u8::from_str_radix(s, 16).unwrap_or(0);
        }
    }
    id
}

fn random_u64() -> u64 {
    let mut buf = [0u8; 8];
    // SAFETY: writes at most 8 bytes into `buf`.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n == 8 {
        u64::from_le_bytes(buf)
    } else {
        unix_ns() ^ (u64::from(std::process::id()) << 32)
    }
}

fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
