//! What a lock key holds: the hold's random token, then who holds it.
//!
//! The value is `TOKEN FENCE PID SINCE HOST`, separated by single spaces: the 32 hex digits
//! of the acquisition's token (what release, renewal and fencing compare, by prefix), the
//! fencing token the holder took (`0` until it asks; the token script writes it in), the
//! holder's process id, when the hold was taken (milliseconds since the Unix epoch, by the
//! holder's clock), and the holder's host name (last, as it is the one free-form field).
//! Values written by anything else parse as "unknown holder", never as an error.

use std::fmt::Write;

use crate::per_process::PerProcess;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Length of the token in hex digits, the prefix the scripts compare.
pub(crate) const TOKEN_LEN: usize = 32;

/// This host's name, read once per process (`?` if it cannot be read). Per process, with no
/// lock a child could find held by a thread of its parent (and a child in a new UTS
/// namespace names its own host).
pub(crate) fn host_name() -> &'static str {
    static HOST: PerProcess<String> = PerProcess::new();
    HOST.get(|| {
        let name = nix::unistd::gethostname()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        // one field of a space-separated value: no spaces, no control characters
        let name: String = name
            .chars()
            .map(|c| {
                if c.is_whitespace() || c.is_control() {
                    '_'
                } else {
                    c
                }
            })
            .collect();
        if name.is_empty() {
            "?".to_string()
        } else {
            name
        }
    })
}

/// A token no other acquisition anywhere shares, and the value to store for a hold with
/// it (one read of the pid for both).
pub(crate) fn new_hold() -> (String, String) {
    let pid = crate::shm::process::current_pid();
    let token = random_token();
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let mut value = String::with_capacity(TOKEN_LEN + 64);
    value.push_str(&token);
    let _ = write!(value, " 0 {pid} {since} {}", host_name());
    (token, value)
}

/// A token no other acquisition anywhere shares: 128 bits, the high 64 and a base for the
/// low 64 drawn at random once per process (again in a forked child: the seed is kept per
/// process, without a lock, which a thread holding it at a `fork` would leave locked in the
/// child), plus a per-process count.
pub(crate) fn random_token() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEED: PerProcess<(u64, u64)> = PerProcess::new();
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let &(hi, lo) = SEED.get(|| {
        let mut buf = [0u8; 16];
        getrandom::fill(&mut buf).expect("the system's random source failed");
        (
            u64::from_le_bytes(buf[..8].try_into().unwrap()),
            u64::from_le_bytes(buf[8..].try_into().unwrap()),
        )
    });
    let n = COUNT.fetch_add(1, Ordering::Relaxed);
    format!("{hi:016x}{:016x}", lo.wrapping_add(n))
}

/// Who holds a key, as far as its value tells.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Identity {
    pub token: Option<u64>,
    pub pid: Option<u32>,
    pub since: Option<SystemTime>,
    pub host: Option<String>,
}

/// Whether a lock key's value is a hold's, as this crate writes them: its token, a space,
/// then who holds it (what `ACQUIRE` checks before it lets a waiter wait).
pub(crate) fn is_hold(value: &[u8]) -> bool {
    value.len() > TOKEN_LEN
        && value[..TOKEN_LEN].iter().all(u8::is_ascii_hexdigit)
        && value[TOKEN_LEN] == b' '
}

/// Reads a stored value; anything not in our format gives an empty identity.
pub(crate) fn parse(value: &[u8]) -> Identity {
    let Ok(text) = std::str::from_utf8(value) else {
        return Identity::default();
    };
    let mut fields = text.splitn(5, ' ');
    let token = fields.next().unwrap_or("");
    if token.len() != TOKEN_LEN || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Identity::default();
    }
    parse_fields(fields)
}

/// Reads what follows the token in a stored value (what the acquire script shows a waiter).
pub(crate) fn parse_after_token(rest: &[u8]) -> Identity {
    match std::str::from_utf8(rest) {
        Ok(text) if !text.is_empty() => parse_fields(text.splitn(4, ' ')),
        _ => Identity::default(),
    }
}

/// Who holds a key, as far as the fields after a value's token tell.
fn parse_fields<'a>(mut fields: impl Iterator<Item = &'a str>) -> Identity {
    let fence = fields.next().and_then(|f| f.parse::<u64>().ok());
    let pid = fields.next().and_then(|f| f.parse::<u32>().ok());
    let since = fields
        .next()
        .and_then(|f| f.parse::<u64>().ok())
        .and_then(|ms| UNIX_EPOCH.checked_add(Duration::from_millis(ms)));
    let host = fields.next().filter(|h| !h.is_empty()).map(str::to_string);
    Identity {
        token: fence.filter(|&f| f != 0),
        pid,
        since,
        host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_reads_back_and_garbage_reads_as_unknown() {
        let (token, v) = new_hold();
        assert_eq!(token.len(), TOKEN_LEN);
        assert_ne!(random_token(), token);
        let id = parse(v.as_bytes());
        assert_eq!(id.token, None);
        assert_eq!(id.pid, Some(std::process::id()));
        assert!(id.since.unwrap().elapsed().unwrap() < Duration::from_secs(60));
        assert_eq!(id.host.as_deref(), Some(host_name()));
        // the token script's rewrite: the fence after the token
        let fenced = format!("{token} 42{}", &v[TOKEN_LEN + 2..]);
        assert_eq!(parse(fenced.as_bytes()).token, Some(42));
        for junk in [
            &b""[..],
            b"x",
            b"\xff\xfe",
            b"0123 4 5 6 7",
            b"token 1 2 3 h",
        ] {
            assert_eq!(parse(junk), Identity::default());
        }
        // an old-style value (the token alone) is a holder of unknown identity
        assert_eq!(parse(token.as_bytes()), Identity::default());
        // what a waiter is shown: the value past the token reads the same
        assert_eq!(parse_after_token(&v.as_bytes()[TOKEN_LEN + 1..]), id);
        assert_eq!(parse_after_token(b""), Identity::default());
    }
}
