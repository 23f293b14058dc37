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

/// `e`, the failure of a connection to, or a request on a connection to, the server at
/// `server` (its `host:port`, never a password), that had `allowed` to answer, told so that
/// it names the server: a reply that did not come in time says so and names the limit (the
/// socket's timeout says `Resource temporarily unavailable`, EAGAIN), a reply that does
/// not parse says the server does not speak the Redis protocol (the parser quotes it over
/// several lines), and any other I/O error is prefixed with the server. Each stays an I/O
/// error of the same kind (`is_timeout`, `is_connection_refusal`, `is_connection_dropped`
/// and the `(os error N)` that [`is_interrupted`] reads are kept). Errors the server
/// replied with are left as they are (their code is what callers look at).
pub(crate) fn at_server(
    e: redis::RedisError,
    server: &str,
    allowed: Duration,
) -> redis::RedisError {
    use std::io::{Error as IoError, ErrorKind as Io};
    if e.is_timeout() {
        return IoError::new(
            Io::TimedOut,
            format!("{server} did not answer within {}", shown(allowed)),
        )
        .into();
    }
    if e.kind() == redis::ErrorKind::Parse {
        // (still a parse error, not an I/O one: a wait gives up on it at once, where an
        // I/O error would be tried again until the deadline)
        return redis::RedisError::from((
            redis::ErrorKind::Parse,
            "not the Redis protocol",
            format!("{server} does not speak the Redis protocol (its reply did not parse)"),
        ));
    }
    let text = e.to_string();
    if !e.is_io_error() || text.starts_with(server) {
        return e;
    }
    let kind = os_error(&text)
        .map(|n| IoError::from_raw_os_error(n).kind())
        .unwrap_or(if e.is_connection_refusal() {
            Io::ConnectionRefused
        } else if e.is_connection_dropped() {
            Io::ConnectionAborted
        } else {
            Io::Other
        });
    IoError::new(kind, format!("{server}: {text}")).into()
}

/// The OS error code an `io::Error`'s text ends with ("... (os error 111)").
fn os_error(text: &str) -> Option<i32> {
    text.strip_suffix(')')?
        .rsplit_once("(os error ")?
        .1
        .parse()
        .ok()
}

/// A time limit as an error names it, to the millisecond: `5s`, `300ms`, `1.5s`.
pub(crate) fn shown(d: Duration) -> String {
    let ms = (d.as_secs_f64() * 1000.0).round() as u64;
    match ms {
        // (what an earlier step left of a wait: "within 0s" read as no time at all)
        0 if !d.is_zero() => "under 1ms".to_string(),
        ms if ms % 1000 == 0 => format!("{}s", ms / 1000),
        ms if ms < 1000 => format!("{ms}ms"),
        ms => format!("{}s", ms as f64 / 1000.0),
    }
}

/// The time a step started at `started` had until `limit`, as an error names it: the
/// command `timeout` as configured when that was the limit (drawn a moment before the step
/// started: "within 4.999s" named a limit of 5 s as something else).
pub(crate) fn allowed(started: Instant, limit: Instant, timeout: Duration) -> Duration {
    let allowed = limit.saturating_duration_since(started);
    if allowed + Duration::from_millis(20) >= timeout {
        timeout
    } else {
        allowed
    }
}

/// What a request whose time limit passed before it went out fails with, when the time
/// went to this process (stopped: SIGSTOP, Ctrl-Z; or not run), not to the server: a
/// command whose limit passed before it asked anything, or a request whose limit passed
/// [`LATE_GAP`] or more after the reply before it came ([`is_interrupted`] tells it, as
/// a read that a stop cut).
pub(crate) fn late() -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(std::io::ErrorKind::Interrupted, LATE))
}

const LATE: &str = "this process was stopped or not run until the request's time limit had passed";

/// How long this process must have gone without running between one reply and the next
/// request before a limit that passed meanwhile counts as its lateness: what it does there
/// takes microseconds; a server that used the time answered the reply before late.
pub(crate) const LATE_GAP: Duration = Duration::from_millis(10);

/// A request's limit found passed: the server's slowness (a timeout), unless this
/// process went [`LATE_GAP`] or more without running since `last_reply` (stopped), which
/// is this process's lateness ([`late`]).
pub(crate) fn out_of_time(last_reply: Instant) -> redis::RedisError {
    if last_reply.elapsed() >= LATE_GAP {
        late()
    } else {
        timed_out()
    }
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
/// `f`, failing with a timeout if it is not done by `limit`. A reply may have come in time
/// and not yet been read by the connection's task when the timer fires (the two woke
/// together: this process was stopped, or its runtime busy elsewhere), so `f` gets a
/// short grace first: 2 ms, or 10 ms if the timer fired 10 ms or more late (a request
/// held up with this process reaches the server only then). With no reply even then, the
/// server had its time: a timeout.
pub(crate) async fn bounded<T>(
    limit: Instant,
    f: impl std::future::Future<Output = RedisResult<T>>,
) -> RedisResult<T> {
    let wait = left(limit).ok_or_else(timed_out)?;
    let mut f = std::pin::pin!(f);
    if let Ok(done) = tokio::time::timeout(wait, f.as_mut()).await {
        return done;
    }
    let grace = if Instant::now() >= limit + LATE_GAP {
        LATE_GRACE
    } else {
        GRACE
    };
    tokio::time::timeout(grace, f)
        .await
        .unwrap_or_else(|_| Err(timed_out()))
}

/// How long [`bounded`] gives a request whose timer fired, for a reply that came in time
/// to be read (a turn of the runtime), and one whose timer fired late.
#[cfg(feature = "tokio")]
const GRACE: Duration = Duration::from_millis(2);
#[cfg(feature = "tokio")]
const LATE_GRACE: Duration = Duration::from_millis(10);

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

/// A server's error reply that says to try again later: a slot migrating (`TRYAGAIN`,
/// and a redirect still there after those followed), a cluster failing over
/// (`CLUSTERDOWN`), a script running long (`BUSY`).
pub(crate) fn is_transient(e: &redis::RedisError) -> bool {
    matches!(
        e.code(),
        Some("TRYAGAIN" | "CLUSTERDOWN" | "BUSY" | "MOVED" | "ASK")
    )
}

/// How many stops of this process in a row a request that may be repeated goes through
/// (see [`is_interrupted`]).
pub(crate) const MAX_INTERRUPTS: u32 = 8;

/// Whether `e` is a request interrupted by a stop of this process, not by the server or
/// the network: a process stopped (SIGSTOP, Ctrl-Z) and continued while it read a reply
/// has that read fail with EINTR, since the socket has a timeout (signal(7)), and one
/// stopped before the request went out, past its time limit, fails with [`late`]. The
/// request may have run (the one before it did, when a stop came between two).
///
/// The client keeps the `io::Error` to itself (behind an `Arc<dyn Error>` that no downcast
/// reaches), so this reads the OS error code that its text ends with, as `io::Error`
/// writes it ("... (os error 4)"), whatever the language of the description, or
/// [`late`]'s words.
pub(crate) fn is_interrupted(e: &redis::RedisError) -> bool {
    if !e.is_io_error() {
        return false;
    }
    let text = e.to_string();
    text.ends_with(&format!("(os error {})", libc::EINTR)) || text.ends_with(LATE)
}

/// Whether a request that failed with `e` may have run on the server: no reply came.
pub(crate) fn is_unanswered(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_timeout()
}

#[cfg(test)]
mod tests {
    use super::{is_broken, is_interrupted};

    #[test]
    fn errors_named_by_their_server_keep_what_callers_look_at() {
        use super::{at_server, shown};
        use std::time::Duration;
        let raw = |n| redis::RedisError::from(std::io::Error::from_raw_os_error(n));
        let refused = at_server(raw(libc::ECONNREFUSED), "h:1", Duration::from_secs(5));
        assert!(refused.is_connection_refusal() && refused.is_io_error());
        assert!(refused.to_string().starts_with("h:1: "), "{refused}");
        let eintr = at_server(raw(libc::EINTR), "h:1", Duration::from_secs(5));
        assert!(is_interrupted(&eintr), "{eintr}");
        let reset = at_server(raw(libc::ECONNRESET), "h:1", Duration::from_secs(5));
        assert!(reset.is_connection_dropped() && is_broken(&reset));
        let late = at_server(raw(libc::EAGAIN), "h:1", Duration::from_micros(4_999_700));
        assert!(late.is_timeout() && is_broken(&late));
        assert_eq!(late.to_string(), "h:1 did not answer within 5s");
        let server = redis::RedisError::from((redis::ErrorKind::Client, "x"));
        assert_eq!(
            at_server(server, "h:1", Duration::ZERO).to_string(),
            "x - Client"
        );
        let parse = redis::RedisError::from((redis::ErrorKind::Parse, "x"));
        let parse = at_server(parse, "h:1", Duration::ZERO);
        assert_eq!(parse.kind(), redis::ErrorKind::Parse);
        assert!(!is_broken(&parse), "a wait would try it again");
        assert!(
            parse
                .to_string()
                .contains("h:1 does not speak the Redis protocol"),
            "{parse}"
        );
        assert_eq!(shown(Duration::from_millis(300)), "300ms");
        assert_eq!(shown(Duration::from_millis(1500)), "1.5s");
        assert_eq!(shown(Duration::from_micros(300)), "under 1ms");
        assert_eq!(shown(Duration::ZERO), "0s");
    }

    /// A limit drawn as the command timeout a moment before the step that failed started
    /// is named as the timeout ("within 4.999s" after 1 ms spent elsewhere, as a loaded
    /// machine showed); a limit that was a wait's remainder is named as what was left.
    #[test]
    fn an_error_names_the_command_timeout_when_that_was_the_limit() {
        use super::allowed;
        use std::time::{Duration, Instant};
        let five = Duration::from_secs(5);
        let drawn = Instant::now();
        let limit = drawn + five;
        for spent in [0, 1, 19] {
            let started = drawn + Duration::from_millis(spent);
            assert_eq!(allowed(started, limit, five), five, "{spent} ms");
        }
        let started = drawn + Duration::from_millis(4000);
        assert_eq!(allowed(started, limit, five), Duration::from_secs(1));
        assert_eq!(allowed(limit + five, limit, five), Duration::ZERO);
    }

    /// `bounded` on a runtime whose thread was kept from running past the limit (as a stop
    /// of the process keeps it): a reply that came meanwhile is taken, not a timeout; no
    /// reply is a timeout, whether the runtime was held or not (the server had its time).
    #[cfg(feature = "tokio")]
    #[test]
    fn a_timer_that_fires_late_gives_the_reply_its_chance() {
        use super::bounded;
        use std::time::{Duration, Instant};
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let hold_the_runtime = || {
            tokio::spawn(async {
                tokio::time::sleep(Duration::from_millis(1)).await;
                std::thread::sleep(Duration::from_millis(60)); // the whole runtime
            })
        };
        rt.block_on(async {
            // The reply comes at 10 ms, through a task of the runtime (as a connection's
            // reader), while the runtime's thread is held until 60 ms (the timer at 20 ms).
            let limit = Instant::now() + Duration::from_millis(20);
            let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                let _ = tx.send(7);
            });
            hold_the_runtime();
            let reply = async { Ok::<_, redis::RedisError>(rx.await.unwrap_or(0)) };
            assert_eq!(bounded(limit, reply).await.unwrap(), 7);

            for held in [true, false] {
                let limit = Instant::now() + Duration::from_millis(20);
                if held {
                    hold_the_runtime();
                }
                let never = std::future::pending::<redis::RedisResult<()>>();
                let e = bounded(limit, never).await.unwrap_err();
                assert!(e.is_timeout() && !is_interrupted(&e), "held {held}: {e}");
            }
        });
    }

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
