//! Helpers shared by the test binaries.
#![allow(dead_code)]

/// Prints a test's figures on its result line, at once (the harness-less tests print
/// `test NAME ... [figures] ok`).
#[macro_export]
macro_rules! note {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        print!($($arg)*);
        let _ = std::io::stdout().flush();
    }};
}

#[cfg(feature = "cli")]
pub mod command;
pub mod dict;
pub mod fork;
pub mod forking;
pub mod harness;
pub mod ns;
pub mod probe;
#[cfg(feature = "redis")]
pub mod proxy;
#[cfg(feature = "redis")]
pub mod redis_server;
pub mod signal;
pub mod word;

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Lock options with a lease of `exptime_ms` (0: never expires) and a wait of at most
/// `timeout_ms`, the rest as by default.
pub fn opts(exptime_ms: u64, timeout_ms: u64) -> shmlock::LockOptions {
    shmlock::LockOptions {
        exptime: Duration::from_millis(exptime_ms),
        timeout: Duration::from_millis(timeout_ms),
        ..shmlock::LockOptions::default()
    }
}

/// A C string of `s` (which has no NUL).
pub fn cstr(s: &str) -> CString {
    CString::new(s).unwrap()
}

/// A table path that is removed when dropped.
pub struct TempPath(pub PathBuf);

impl TempPath {
    pub fn new(name: &str) -> TempPath {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let path = dir.join(format!(
            "shmlock-test-{}-{}-{name}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_file(&path);
        TempPath(path)
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        // some tests make a directory there (gdb's flag files)
        if self.0.is_dir() {
            let _ = std::fs::remove_dir_all(&self.0);
        } else {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

/// The path of a table made (capacity 64) and closed again.
pub fn fresh_table(name: &str) -> TempPath {
    let p = TempPath::new(name);
    drop(shmlock::LockTable::open(&p, 64).unwrap());
    p
}

impl AsRef<Path> for TempPath {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}
