//! The waiting status line: who holds the key `run` waits for (looked up in the table or
//! in Redis), shown on stderr in one line rewritten in place while stderr is a terminal.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

use shmlock::{LockTable, RedisLocks};

use crate::show::{held_for, human, printable};

/// Who holds a key, as far as the backend tells, for people waiting on it.
pub struct HolderInfo {
    /// "pid 1234", "host:1234" or "an unknown process".
    who: String,
    /// How long it had held the key when it was looked up.
    held: Option<Duration>,
    /// When it was looked up.
    pub seen: Instant,
}

impl HolderInfo {
    pub fn describe(&self) -> String {
        match self.held {
            Some(held) => format!("{} for {}", self.who, human(held + self.seen.elapsed())),
            None => self.who.clone(),
        }
    }
}

/// The backends `run` can tell the holder of a key of.
pub trait WhoHolds {
    fn who_holds(&self, key: &[u8]) -> Option<HolderInfo>;
}

impl WhoHolds for LockTable {
    fn who_holds(&self, key: &[u8]) -> Option<HolderInfo> {
        // The preview is the first 32 bytes: a longer key is matched by them and its length.
        let h = self
            .holders()
            .into_iter()
            .find(|h| h.key_len == key.len() && key.starts_with(&h.key_preview))?;
        Some(HolderInfo {
            who: if h.pid == 0 {
                "an unknown process".into()
            } else {
                format!("pid {}", h.pid)
            },
            held: Some(h.age),
            seen: Instant::now(),
        })
    }
}

impl WhoHolds for shmlock::Shared {
    fn who_holds(&self, key: &[u8]) -> Option<HolderInfo> {
        self.table().who_holds(key)
    }
}

impl WhoHolds for shmlock::Semaphore<'_> {
    fn who_holds(&self, key: &[u8]) -> Option<HolderInfo> {
        self.table().who_holds(key)
    }
}

impl WhoHolds for RedisLocks {
    fn who_holds(&self, key: &[u8]) -> Option<HolderInfo> {
        let h = self.holders().ok()?.into_iter().find(|h| h.key == key)?;
        Some(HolderInfo {
            who: match (&h.host, h.pid) {
                (Some(host), Some(pid)) => format!("pid {pid} on {}", printable(host.as_bytes())),
                (None, Some(pid)) => format!("pid {pid}"),
                _ => "an unknown process".into(),
            },
            held: held_for(&h),
            seen: Instant::now(),
        })
    }
}

impl WhoHolds for shmlock::RedisShared {
    fn who_holds(&self, key: &[u8]) -> Option<HolderInfo> {
        self.locks().who_holds(key)
    }
}

impl WhoHolds for shmlock::RedisSemaphore<'_> {
    fn who_holds(&self, key: &[u8]) -> Option<HolderInfo> {
        self.locks().who_holds(key)
    }
}

/// Whether a status line is on the screen, ending where the cursor is: a line of `run`'s
/// own (`say!`, from any thread) erases it first, or would be written into it. Read and
/// written under the lock of stderr.
static ON_SCREEN: AtomicBool = AtomicBool::new(false);

/// Writes `line` (ending in a newline) to stderr in one write, in place of the status line
/// if one is shown (the status line's next drawing puts it back below); a failed write is
/// dropped.
pub fn say_line(line: &str) {
    let mut err = std::io::stderr().lock();
    let _ = if ON_SCREEN.swap(false, Relaxed) {
        err.write_all(format!("\r\x1b[2K{line}").as_bytes())
    } else {
        err.write_all(line.as_bytes())
    };
}

/// The live line on stderr while `run` waits, if stderr is a terminal: rewritten in place
/// (carriage return, ANSI erase-line), erased when done.
pub struct StatusLine {
    pub on: bool,
}

impl StatusLine {
    pub fn new() -> StatusLine {
        StatusLine {
            on: std::io::stderr().is_terminal(),
        }
    }

    /// Draws `text` in place of the line shown; whether it was drawn. Only in the
    /// terminal's foreground: a background job's line would be drawn over whatever the
    /// foreground shows, and under `stty tostop` its write would stop the job (`run` and
    /// its command with it). A line drawn before `run` went to the background is left as
    /// it is, part of the terminal's history by now.
    pub fn show(&mut self, text: &str) -> bool {
        if !self.on {
            return false;
        }
        if !in_foreground() {
            let _err = std::io::stderr().lock();
            ON_SCREEN.store(false, Relaxed);
            return false;
        }
        // One line that never wraps, or the carriage return would not get back to its start.
        let text: String = text
            .chars()
            .take(terminal_width().saturating_sub(1))
            .collect();
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K{text}");
        let _ = err.flush();
        ON_SCREEN.store(true, Relaxed);
        true
    }

    /// Whether a line is on the screen now (not since erased, or written over by a line
    /// of `say!`).
    pub fn shown(&self) -> bool {
        let _err = std::io::stderr().lock();
        ON_SCREEN.load(Relaxed)
    }

    /// Erases the line shown, if `run` is still in the foreground (else it is left: see
    /// `show`).
    pub fn clear(&mut self) {
        let mut err = std::io::stderr().lock();
        if ON_SCREEN.swap(false, Relaxed) && in_foreground() {
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }
}

/// Erases the status line if one is shown (as `clear` does), then runs `stop`, which stops
/// `run` (Ctrl-Z: the shell's "Stopped" then comes on a clean line, not at the end of the
/// status line); the line is drawn again once `run` is back in the foreground. The lock
/// of stderr is held throughout, so that no line is drawn between the erase and the stop.
pub fn erase_then(stop: impl FnOnce()) {
    let mut err = std::io::stderr().lock();
    if ON_SCREEN.swap(false, Relaxed) && in_foreground() {
        let _ = write!(err, "\r\x1b[2K");
        let _ = err.flush();
    }
    stop();
    drop(err);
}

impl Drop for StatusLine {
    fn drop(&mut self) {
        self.clear();
    }
}

/// Whether this process's group is the foreground one of the terminal on stderr, or that
/// terminal is not this process's controlling terminal (then no job of ours is in its
/// background).
fn in_foreground() -> bool {
    // SAFETY: tcgetpgrp takes a descriptor number and returns a number; -1 (ENOTTY: not
    // our controlling terminal) says no group of ours.
    let group = unsafe { libc::tcgetpgrp(libc::STDERR_FILENO) };
    group <= 0 || group == nix::unistd::getpgrp().as_raw()
}

/// Columns of the terminal on stderr (80 if it does not say).
fn terminal_width() -> usize {
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one winsize into the struct pointed to, which lives across
    // the call; on failure it writes nothing.
    let r = unsafe { libc::ioctl(libc::STDERR_FILENO, libc::TIOCGWINSZ, &mut ws) };
    if r == 0 && ws.ws_col > 0 {
        usize::from(ws.ws_col)
    } else {
        80
    }
}
