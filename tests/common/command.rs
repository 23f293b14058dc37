//! The `shmlock` command, spawned as a separate program (tests of the `cli` feature).

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use shmlock::LockTable;

use super::TempPath;

/// `shmlock --file FILE`, without `$SHMLOCK_FILE`.
pub fn shmlock(file: &TempPath) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_shmlock"));
    c.env_remove("SHMLOCK_FILE").arg("--file").arg(&file.0);
    c
}

/// Runs `c` with stdin closed, and collects its output.
pub fn output(c: &mut Command) -> Output {
    c.stdin(Stdio::null()).output().unwrap()
}

/// Runs `c` with stdin closed; its exit code.
pub fn code(c: &mut Command) -> i32 {
    output(c).status.code().unwrap()
}

/// Polls `cond` for up to 10 s (a hang guard, not a timing assertion).
pub fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The line a command writes to `path` (`echo ... > path`), once it is whole, trimmed.
pub fn line_written(path: &TempPath) -> String {
    eventually("the command wrote its line", || {
        std::fs::read_to_string(path).is_ok_and(|s| s.ends_with('\n'))
    });
    std::fs::read_to_string(path).unwrap().trim().to_string()
}

/// Whether `key` is held in the table at `file` (false if there is no table yet).
pub fn is_held(file: &TempPath, key: &str) -> bool {
    LockTable::options()
        .create(false)
        .register_lazily(true)
        .open(file)
        .is_ok_and(|t| t.is_locked(key).unwrap())
}

/// Starts `shmlock run [EXTRA] KEY -- sh -c SCRIPT` and waits until it holds KEY.
pub fn holding(file: &TempPath, key: &str, script: &str, extra: &[&str]) -> Child {
    let child = shmlock(file)
        .arg("run")
        .args(extra)
        .arg(key)
        .args(["--", "sh", "-c", script])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    eventually("the first run holds the key", || is_held(file, key));
    child
}
