//! A table file deleted or replaced while in use (systemd's `RemoveIPC`, a `/tmp` cleaner,
//! an `rm`, a `mv` over it): the processes attached to it keep a table that nobody who opens
//! the path can reach, and a table made anew at the path would give their keys to others.
//!
//! Two checks close that split. Before a table is made at a path, the processes that still
//! map a deleted file of that path (their `/proc/PID/maps` name it "`PATH (deleted)`" on
//! the same device) are looked for: if any is alive the table is not made, and the error
//! names them. And a process attached to a table looks now and then (see
//! [`Attachment::look_at_path`](crate::shm::attachment::Attachment)) whether its path
//! still leads to its file: once it does not, the process takes no more keys from it.
//!
//! Only processes whose `maps` this process may read are seen (the same user, or root; not
//! those hidden by `hidepid`, nor those of another pid namespace that this `/proc` does not
//! show); the error counts the others it could not look at.

use std::fs::{self, File};
use std::io::{self, Read};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::shm::registry::FileId;

/// Why a table's path no longer leads to the file a process is attached to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gone {
    /// The file was deleted (no name left, or none at the path).
    Deleted,
    /// Another file is at the path.
    Replaced,
}

impl Gone {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Gone::Deleted => "deleted",
            Gone::Replaced => "replaced by another file",
        }
    }
}

/// Whether `path` still leads to the file `fd` (of id `id`) is: `None` if it does. A path
/// that cannot be looked at (a directory made unreadable) counts as leading to it, unless
/// the file has no name left at all.
pub(crate) fn left(path: &Path, fd: impl AsFd, id: FileId) -> Option<Gone> {
    match fs::metadata(path) {
        Ok(m) if m.dev() == id.dev && m.ino() == id.ino => None,
        Ok(_) => Some(Gone::Replaced),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Some(Gone::Deleted),
        Err(_) => {
            let st = nix::sys::stat::fstat(fd).ok()?;
            let ours = st.st_dev == id.dev && st.st_ino == id.ino;
            (ours && st.st_nlink == 0).then_some(Gone::Deleted)
        }
    }
}

/// The live processes that map a deleted file of `path`, and how many processes could not
/// be looked at.
#[derive(Debug, Default)]
pub(crate) struct Users {
    pub pids: Vec<u32>,
    pub unseen: usize,
}

/// Looks through `/proc` for processes that map a deleted file that was at `path` (on the
/// device of its directory). Nothing is found where `/proc` cannot be read.
pub(crate) fn users(path: &Path) -> Users {
    let mut found = Users::default();
    let Some((name, dev)) = mapped_name(path) else {
        return found;
    };
    let Ok(procs) = fs::read_dir("/proc") else {
        return found;
    };
    let mut buf = Vec::new();
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        match read_maps(&p.path(), &mut buf) {
            Ok(true) if maps_name(&buf, &name, dev, path) => found.pids.push(pid),
            Ok(true) => {}
            Ok(false) => found.unseen += 1,
            // gone meanwhile: nothing to see
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(_) => found.unseen += 1,
        }
    }
    found.pids.sort_unstable();
    found
}

/// Reads the mappings of the process at `/proc/PID` into `buf`: `Ok(false)` if they could
/// not be seen. A process whose main thread has exited shows none in its own `maps` (its
/// other threads' do), and one that is not dumpable (it changed its uids without exec)
/// shows none to others; a kernel thread has none.
fn read_maps(proc_dir: &Path, buf: &mut Vec<u8>) -> io::Result<bool> {
    buf.clear();
    File::open(proc_dir.join("maps"))?.read_to_end(buf)?;
    if !buf.is_empty() {
        return Ok(true);
    }
    for task in fs::read_dir(proc_dir.join("task"))?.flatten() {
        buf.clear();
        if File::open(task.path().join("maps"))
            .and_then(|mut f| f.read_to_end(buf))
            .is_ok_and(|n| n > 0)
        {
            return Ok(true);
        }
    }
    Ok(kernel_thread(proc_dir))
}

/// Whether the process is a kernel thread (`PF_KTHREAD` in the flags of its `stat`).
fn kernel_thread(proc_dir: &Path) -> bool {
    const PF_KTHREAD: u64 = 0x0020_0000;
    let Ok(stat) = fs::read_to_string(proc_dir.join("stat")) else {
        return false;
    };
    // after the command's closing parenthesis: state, ppid, pgrp, session, tty, tpgid, flags
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(6))
        .and_then(|f| f.parse::<u64>().ok())
        .is_some_and(|flags| flags & PF_KTHREAD != 0)
}

/// `path` made absolute, its directory's links resolved (what the kernel shows of a file
/// mapped through it): `None` if its directory cannot be resolved.
pub(crate) fn absolute(path: &Path) -> Option<PathBuf> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Some(fs::canonicalize(dir).ok()?.join(path.file_name()?))
}

/// What a mapping of the deleted file reads as in `maps` ("`/abs/path (deleted)`", a
/// newline written `\012` as the kernel does), and the device it is on.
fn mapped_name(path: &Path) -> Option<(Vec<u8>, u64)> {
    let abs = absolute(path)?;
    let dev = fs::metadata(abs.parent()?).ok()?.dev();
    let mut name = Vec::new();
    for &b in abs.as_os_str().as_bytes() {
        if b == b'\n' {
            name.extend_from_slice(b"\\012");
        } else {
            name.push(b);
        }
    }
    name.extend_from_slice(b" (deleted)");
    Some((name, dev))
}

/// Whether a `maps` text has a mapping of `name` on device `dev`, of a file that is really
/// deleted (not one whose name ends in " (deleted)": `path` + " (deleted)" is then that very
/// inode). A line is `start-end perms offset major:minor inode   pathname`.
fn maps_name(maps: &[u8], name: &[u8], dev: u64, path: &Path) -> bool {
    maps.split(|&b| b == b'\n').any(|line| {
        let mut fields = line.splitn(6, |&b| b == b' ');
        let (Some(devf), Some(inode), Some(rest)) = (fields.nth(3), fields.next(), fields.next())
        else {
            return false;
        };
        rest.trim_ascii_start() == name && parse_dev(devf) == Some(dev) && !named_so(path, inode)
    })
}

/// Whether a live file is named `path` + " (deleted)", with the inode `inode` (decimal).
fn named_so(path: &Path, inode: &[u8]) -> bool {
    let mut live = path.as_os_str().to_os_string();
    live.push(" (deleted)");
    let ino = std::str::from_utf8(inode)
        .ok()
        .and_then(|s| s.parse::<u64>().ok());
    fs::metadata(live).is_ok_and(|m| Some(m.ino()) == ino)
}

/// `major:minor` in hex, as `maps` writes a device.
fn parse_dev(f: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(f).ok()?;
    let (major, minor) = s.split_once(':')?;
    let major = u32::from_str_radix(major, 16).ok()?;
    let minor = u32::from_str_radix(minor, 16).ok()?;
    Some(libc::makedev(major, minor))
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_maps_line_names_a_deleted_file_on_its_device() {
        let dev = libc::makedev(0, 0x1a);
        let name = b"/dev/shm/app locks (deleted)";
        let maps = b"7f00-7f10 rw-s 00000000 00:1a 123   /dev/shm/app locks (deleted)\n\
                     7f10-7f20 r--p 00000000 00:1b 9   /usr/lib/libc.so.6\n";
        let path = Path::new("/nonexistent/app locks");
        assert!(maps_name(maps, name, dev, path));
        // another device, another name, the file not deleted
        assert!(!maps_name(maps, name, libc::makedev(0, 0x1b), path));
        assert!(!maps_name(maps, b"/dev/shm/other (deleted)", dev, path));
        let live = b"7f00-7f10 rw-s 00000000 00:1a 123   /dev/shm/app locks\n";
        assert!(!maps_name(live, name, dev, path));
        assert!(!maps_name(b"garbage\n\n", name, dev, path));
        assert_eq!(parse_dev(b"103:02"), Some(libc::makedev(0x103, 2)));
    }

    #[test]
    fn this_process_is_found_mapping_a_deleted_file() {
        let dir = Path::new("/dev/shm");
        let dir = if dir.is_dir() {
            dir.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let path = dir.join(format!("shmlock-deleted-unit-{}", std::process::id()));
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        file.set_len(4096).unwrap();
        // SAFETY: a file of our own, which nothing else maps or truncates.
        let map = unsafe { memmap2::MmapMut::map_mut(&file) }.unwrap();
        assert!(users(&path).pids.is_empty());
        fs::remove_file(&path).unwrap();
        assert_eq!(users(&path).pids, vec![std::process::id()]);
        drop(map);
        assert!(users(&path).pids.is_empty());
    }
}
