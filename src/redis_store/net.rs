//! The network's small tools: deadlines for commands and connections, and what a failed
//! command says about the server.

use std::time::{Duration, Instant};

use redis::{Client, Connection, ConnectionAddr, ConnectionInfo, RedisResult};

use crate::error::Error;

/// Time left until `limit`, if any.
pub(crate) fn left(limit: Instant) -> Option<Duration> {
    limit
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
}

/// A connection to `info` whose every step (connect, handshake, each reply) ends by
/// `limit`. redis-rs bounds each read of the handshake by the timeout it is given, not the
/// handshake as a whole: the library-name commands are left out, and the time left is
/// shared among the commands that remain (`AUTH`, `SELECT`).
pub(crate) fn connect_within(info: &ConnectionInfo, limit: Instant) -> RedisResult<Connection> {
    let settings = info.redis_settings().clone().set_skip_set_lib_name();
    let steps = 1 + u32::from(settings.password().is_some()) + u32::from(settings.db() != 0);
    let info = info.clone().set_redis_settings(settings);
    let timeout = left(limit).ok_or_else(timed_out)? / steps;
    let con = Client::open(info)?.get_connection_with_timeout(timeout)?;
    let timeout = left(limit).ok_or_else(timed_out)?;
    con.set_read_timeout(Some(timeout))?;
    con.set_write_timeout(Some(timeout))?;
    Ok(con)
}

pub(crate) fn timed_out() -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "the deadline passed",
    ))
}

/// `seed`'s settings (password, TLS, database) for another address.
pub(crate) fn with_addr(seed: &ConnectionInfo, host: &str, port: u16) -> ConnectionInfo {
    let addr = match seed.addr() {
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host: host.to_string(),
            port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => ConnectionAddr::Tcp(host.to_string(), port),
    };
    seed.clone().set_addr(addr)
}

#[cfg(feature = "tokio")]
/// `f`, failing with a timeout if it is not done by `limit`.
pub(crate) async fn bounded<T>(
    limit: Instant,
    f: impl std::future::Future<Output = RedisResult<T>>,
) -> RedisResult<T> {
    let wait = left(limit).ok_or_else(timed_out)?;
    tokio::time::timeout(wait, f)
        .await
        .unwrap_or_else(|_| Err(timed_out()))
}

/// A command that failed, and whether the server may have run it all the same (the
/// request went out and no answer came back).
#[derive(Debug)]
pub(crate) struct Failed {
    pub(crate) error: Error,
    pub(crate) unknown: bool,
}

impl From<Failed> for Error {
    fn from(f: Failed) -> Error {
        f.error
    }
}

/// Whether an error means the connection (and probably the server behind it) is unusable:
/// I/O trouble, a timeout, or a server that is no longer (or not yet) a writable master.
pub(crate) fn is_broken(e: &redis::RedisError) -> bool {
    is_unanswered(e)
        || e.is_connection_refusal()
        || matches!(e.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"))
}

/// How many stops of this process in a row a request that may be repeated goes through
/// (see [`is_interrupted`]).
pub(crate) const MAX_INTERRUPTS: u32 = 8;

/// Whether `e` is a request interrupted by a signal, not by the server or the network:
/// a process stopped (SIGSTOP, Ctrl-Z) and continued while it read a reply has that read
/// fail with EINTR, since the socket has a timeout (signal(7)). The request may have run.
///
/// The client keeps the `io::Error` to itself (behind an `Arc<dyn Error>` that no downcast
/// reaches), so this reads the OS error code that its text ends with, as `io::Error`
/// writes it ("... (os error 4)"), whatever the language of the description.
pub(crate) fn is_interrupted(e: &redis::RedisError) -> bool {
    e.is_io_error()
        && e.to_string()
            .ends_with(&format!("(os error {})", libc::EINTR))
}

/// Whether a request that failed with `e` may have run on the server: no reply came.
pub(crate) fn is_unanswered(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_timeout()
}

#[cfg(test)]
mod tests {
    use super::{is_broken, is_interrupted};

    #[test]
    fn an_interrupted_read_is_told_from_other_io_errors() {
        let io = |kind| redis::RedisError::from(std::io::Error::from(kind));
        let eintr = redis::RedisError::from(std::io::Error::from_raw_os_error(libc::EINTR));
        assert!(is_interrupted(&eintr));
        assert!(is_broken(&eintr)); // (the connection is dropped all the same)
        assert!(!is_interrupted(&io(std::io::ErrorKind::TimedOut)));
        assert!(!is_interrupted(&io(std::io::ErrorKind::ConnectionReset)));
        let eagain = redis::RedisError::from(std::io::Error::from_raw_os_error(libc::EAGAIN));
        assert!(!is_interrupted(&eagain));
    }
}
