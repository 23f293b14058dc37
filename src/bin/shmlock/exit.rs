//! Exit codes: flock(1)'s choices, <sysexits.h> for errors, and `Fail`, a failure as one
//! line on stderr and its code.

use std::sync::OnceLock;

use shmlock::Error;

/// A failure, as one line on stderr and an exit code.
pub struct Fail(pub String, pub u8);

// Exit codes of <sysexits.h>, which flock(1) uses for everything but a lock it could not
// take and the command's own status.
/// The command line is wrong (clap's errors included; clap's own code would be 2).
pub const EX_USAGE: u8 = 64;
/// The file is not a usable lock table; a lock's Redis key holds a foreign value.
pub const EX_DATAERR: u8 = 65;
/// The file cannot be opened (as flock(1) exits when it cannot open its lock file).
pub const EX_NOINPUT: u8 = 66;
/// The Redis server cannot be reached or refuses.
pub const EX_UNAVAILABLE: u8 = 69;
/// Stdout cannot be written.
pub const EX_IOERR: u8 = 74;
/// Something that should not happen (lost track of the command).
pub const EX_SOFTWARE: u8 = 70;
/// The system is out of something (memory, file descriptors, processes).
pub const EX_OSERR: u8 = 71;
/// The file cannot be created (read-only file system, no space, a deleted table of the
/// path still in use; `create` on an existing file).
pub const EX_CANTCREAT: u8 = 73;
/// Full for now: no free slot in the table, no free entry in its owner registry.
pub const EX_TEMPFAIL: u8 = 75;
/// The command was found but could not be executed (as shells exit).
pub const EX_CANNOT_EXECUTE: u8 = 126;
/// The command was not found (as shells exit).
pub const EX_NOT_FOUND: u8 = 127;
/// `run` stopped its command: the lease was lost or --max-time passed.
pub const EX_TERMINATED: u8 = 2;

/// A write to stdout that failed (a closed pipe, a full disk).
pub fn stdout_failed(e: std::io::Error) -> Fail {
    Fail(format!("stdout: {e}"), EX_IOERR)
}

/// The exit code for an operating-system error, as flock(1) chooses it for its lock file.
fn os_error_code(e: &std::io::Error) -> u8 {
    match e.raw_os_error() {
        Some(libc::ENOMEM | libc::EMFILE | libc::ENFILE | libc::EAGAIN) => EX_OSERR,
        Some(libc::EROFS | libc::ENOSPC) => EX_CANTCREAT,
        _ => EX_NOINPUT,
    }
}

/// The Redis server (or servers) the command uses, as printed (passwords redacted).
static REDIS: OnceLock<String> = OnceLock::new();

/// Says which server the command uses: its errors name it from now on, as a file's errors
/// name the file.
pub fn using_redis(shown: String) {
    let _ = REDIS.set(shown);
}

/// `e` as the command says it: an error from Redis names the server.
pub fn describe(e: &Error) -> String {
    one_line(&match (e, REDIS.get()) {
        (Error::Redis(redis_error), Some(server)) => {
            // (the library names the server too, by host:port: said once)
            let inner = redis_error.to_string();
            let rest = inner
                .split_once(": ")
                .filter(|(addr, _)| server.split(',').any(|url| authority(url) == *addr))
                .map_or(inner.as_str(), |(_, rest)| rest);
            // a server that wants a password says only "Authentication required"
            let hint = if redis_error.code() == Some("NOAUTH") {
                " (give the password in the URL, redis://:PASSWORD@HOST:PORT/, or in $REDISCLI_AUTH)"
            } else {
                ""
            };
            format!("{server}: {rest}{hint}")
        }
        (Error::NotReplicated { .. }, Some(server)) => format!("{server}: {e}"),
        _ => e.to_string(),
    })
}

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        let code = match &e {
            Error::Io { source, .. } => os_error_code(source),
            Error::Format { .. } | Error::WrongType { .. } => EX_DATAERR,
            Error::NoSpace { .. } | Error::DeletedInUse { .. } => EX_CANTCREAT,
            Error::TableGone { .. } => EX_NOINPUT,
            Error::EmptyKey
            | Error::KeyTooLong { .. }
            | Error::InvalidKey { .. }
            | Error::InvalidOptions(_)
            | Error::InvalidCapacity(_)
            | Error::InvalidLayout(_)
            | Error::ZoneTooSmall { .. }
            | Error::PermitsMismatch { .. } => EX_USAGE,
            // (URLs are checked before: this is a setting the server or client refused)
            Error::Redis(r) if r.kind() == redis::ErrorKind::InvalidClientConfig => EX_USAGE,
            Error::Redis(_) | Error::NotReplicated { .. } => EX_UNAVAILABLE,
            Error::TableFull { .. } | Error::TooManyProcesses { .. } | Error::NoMemory { .. } => {
                EX_TEMPFAIL
            }
            _ => EX_SOFTWARE,
        };
        Fail(describe(&e), code)
    }
}

/// A URL's host:port (what follows `://` and any `user:password@`, up to the path).
fn authority(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let rest = rest.split(['/', '?', '#']).next().unwrap_or("");
    rest.rsplit_once('@').map_or(rest, |(_, host)| host)
}

/// `msg` as one line: whatever a library or server put on several (a reply quoted in a
/// parser's error) joined by "; ", so that an error is one line on stderr.
pub fn one_line(msg: &str) -> String {
    msg.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// The exit code for a command that could not be started, as shells choose it.
pub fn spawn_error_code(e: &std::io::Error) -> u8 {
    match e.raw_os_error() {
        Some(libc::ENOENT | libc::ENOTDIR) => EX_NOT_FOUND,
        Some(libc::EAGAIN | libc::ENOMEM | libc::EMFILE | libc::ENFILE) => EX_OSERR,
        _ => EX_CANNOT_EXECUTE,
    }
}
