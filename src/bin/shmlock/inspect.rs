//! `inspect`: opens a table file or a dict file read-only (Redis is opened by the caller),
//! and prints what it holds once, or again every interval with --watch.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use shmlock::{Error, FormatError, Holder, LockTable, RedisLocks, SharedDict, ValueInfo};

use crate::args::{secs, InspectArgs};
use crate::exit::{stdout_failed, Fail, EX_NOINPUT, EX_USAGE};
use crate::{json, text};

/// The shortest `--interval` of `inspect` and `stats`: 1e-9 printed tens of thousands of
/// tables a second, a busy loop.
pub const MIN_INTERVAL: std::time::Duration = std::time::Duration::from_millis(10);
pub const TOO_SHORT: &str = "--interval must be at least 0.01 (seconds)";

/// What `inspect` looks at.
pub enum Inspected {
    Table(LockTable, PathBuf),
    Dict(SharedDict, PathBuf),
    /// With the URLs as printed (passwords redacted).
    Redis(RedisLocks, String),
}

/// Opens `file` read-only (anyone who can read it can inspect it), as a lock table or as a
/// shared dict, whichever it is.
pub fn open_inspected(file: &Path) -> Result<Inspected, Fail> {
    match LockTable::options().read_only(true).open(file) {
        Ok(table) => Ok(Inspected::Table(table, file.to_path_buf())),
        Err(Error::Format {
            source: FormatError::WrongKind { .. },
            ..
        }) => Ok(Inspected::Dict(
            SharedDict::options().read_only(true).open(file)?,
            file.to_path_buf(),
        )),
        // nothing at the path to inspect: "cannot open", not "cannot create"
        Err(e @ Error::DeletedInUse { .. }) => Err(Fail(e.to_string(), EX_NOINPUT)),
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            Err(nothing_at(file))
        }
        Err(e) => Err(e.into()),
    }
}

/// `inspect --all` of a dict or of Redis.
pub fn all_is_for_tables() -> Fail {
    Fail(
        "--all adds a lock table's expired entries and dead owners' holds: a dict lists its \
         live keys, and Redis drops an expired lock itself"
            .into(),
        EX_USAGE,
    )
}

/// A command that needs a table at `file` and found nothing there: whether a `run` would
/// make one, or the directory is missing too (EX_NOINPUT).
pub fn nothing_at(file: &Path) -> Fail {
    let dir = match file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let why = if dir.is_dir() {
        format!(
            "{}: no table there yet (the first `shmlock run` makes one, or `shmlock \
             create`; --file or $SHMLOCK_FILE names another)",
            file.display()
        )
    } else {
        // (nothing would make one there: `run` cannot create the directory)
        format!(
            "{}: no such directory as {} (--file or $SHMLOCK_FILE names the table)",
            file.display(),
            dir.display()
        )
    };
    Fail(why, EX_NOINPUT)
}

/// Prints what `what` holds, once or (--watch) until interrupted.
pub fn inspect(what: &Inspected, a: &InspectArgs) -> Result<u8, Fail> {
    if a.all && !matches!(what, Inspected::Table(..)) {
        return Err(all_is_for_tables());
    }
    let mut buf = Vec::new();
    snapshot(&mut buf, what, a)?;
    if !a.watch && a.interval.is_none() {
        std::io::stdout().write_all(&buf).map_err(stdout_failed)?;
        return Ok(0);
    }
    let interval = secs(a.interval.unwrap_or(1.0), "--interval")?;
    if interval < MIN_INTERVAL {
        return Err(Fail(TOO_SHORT.into(), EX_USAGE));
    }
    let terminal = std::io::stdout().is_terminal();
    let watched = what.watched();
    let mut first = true;
    loop {
        if !first {
            std::thread::sleep(interval);
            buf.clear();
            if let Some(seen) = &watched {
                seen.still_there()?;
            }
            // A snapshot that fails (a Redis outage) is reported, and the next one tried.
            if let Err(Fail(msg, _)) = snapshot(&mut buf, what, a) {
                let _ = writeln!(buf, "shmlock: {msg}");
            }
        }
        first = false;
        let mut out = std::io::stdout().lock();
        let written = if a.json {
            // NDJSON: each snapshot is one line already.
            out.write_all(&buf)
        } else if terminal {
            // Home, erase the screen, then the whole snapshot in one write: no flicker.
            writeln!(
                out,
                "\x1b[H\x1b[2J{}  (every {}s; Ctrl-C to stop)",
                utc_now(),
                interval.as_secs_f64()
            )
            .and_then(|()| out.write_all(&buf))
        } else {
            writeln!(out, "--- {} ---", utc_now()).and_then(|()| out.write_all(&buf))
        };
        match written.and_then(|()| out.flush()) {
            Ok(()) => {}
            // The reader went away (`| head`): that is the end of watching, not an error.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(0),
            Err(e) => return Err(stdout_failed(e)),
        }
    }
}

impl Inspected {
    /// The file looked at as it is now, if it is a file (and can be looked at).
    pub fn watched(&self) -> Option<FileSeen<'_>> {
        match self {
            Inspected::Table(_, f) | Inspected::Dict(_, f) => FileSeen::of(f),
            Inspected::Redis(..) => None,
        }
    }
}

/// The file `--watch` opened, as it was: a snapshot of a file that was deleted or replaced
/// since would show a table nobody uses any more, and one of a truncated file would touch
/// pages the file no longer has (SIGBUS).
pub struct FileSeen<'a> {
    file: &'a Path,
    dev: u64,
    ino: u64,
    len: u64,
}

impl<'a> FileSeen<'a> {
    fn of(file: &'a Path) -> Option<FileSeen<'a>> {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(file).ok().map(|m| FileSeen {
            file,
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
        })
    }

    /// Whether the path still leads to the file watched, whole: else watching ends with
    /// why. (A file truncated between this look and the snapshot still faults: the look
    /// only narrows that to the snapshot's few microseconds.)
    pub fn still_there(&self) -> Result<(), Fail> {
        let why = match FileSeen::of(self.file) {
            None => "was deleted",
            Some(n) if (n.dev, n.ino) != (self.dev, self.ino) => "was replaced by another file",
            Some(n) if n.len < self.len => "was truncated",
            Some(_) => return Ok(()),
        };
        Err(Fail(
            format!("{} {why}: watching stops", self.file.display()),
            EX_NOINPUT,
        ))
    }
}

/// Now in UTC, as `2026-01-31 23:59:59 UTC` (from the Unix time: days to a civil date by
/// Howard Hinnant's algorithm).
fn utc_now() -> String {
    let t = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let (days, rem) = ((t / 86_400) as i64, t % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// One print of `what` into `out`.
fn snapshot(out: &mut Vec<u8>, what: &Inspected, a: &InspectArgs) -> Result<(), Fail> {
    let written = match what {
        Inspected::Table(table, file) => {
            let all = table.holders();
            let listed = all.len();
            let mut holders: Vec<Holder> = all
                .into_iter()
                .filter(|h| a.all || (!h.expired && h.owner_alive))
                .collect();
            let hidden = listed - holders.len();
            holders.sort_by(|x, y| x.key_preview.cmp(&y.key_preview));
            if a.json {
                json::write_table(out, file, table, &holders)
            } else {
                text::write_table(out, file, table, &holders, hidden)
            }
        }
        Inspected::Dict(dict, file) => {
            let mut keys: Vec<(Vec<u8>, ValueInfo)> = Vec::new();
            for k in dict.keys(0)? {
                // a key may expire or go between the two looks
                if let Some(info) = dict.describe(&k)? {
                    keys.push((k, info));
                }
            }
            keys.sort_by(|x, y| x.0.cmp(&y.0));
            if a.json {
                json::write_dict(out, file, dict, &keys)
            } else {
                text::write_dict(out, file, dict, &keys)
            }
        }
        Inspected::Redis(redis, url) => {
            let mut held = redis.holders()?;
            held.sort_by(|x, y| x.key.cmp(&y.key));
            if a.json {
                json::write_redis(out, url, &held)
            } else {
                text::write_redis(out, url, &held)
            }
        }
    };
    written.map_err(stdout_failed)
}
