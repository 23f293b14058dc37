//! How keys, lock states and durations are shown: the small conversions the status line,
//! the text tables and the JSON reports share.

use std::time::{Duration, SystemTime};

use shmlock::{HolderState, RedisHolder};

/// Key bytes for a terminal: UTF-8 with invalid bytes replaced, control characters as `?`.
pub fn printable(key: &[u8]) -> String {
    String::from_utf8_lossy(key)
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// Key bytes in hex, for JSON (the exact bytes, whatever they are).
pub fn hex(key: &[u8]) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

/// A holder's state as both outputs name it.
pub fn state_name(s: HolderState) -> &'static str {
    match s {
        HolderState::Claiming => "claiming",
        HolderState::Extending => "extending",
        _ => "held",
    }
}

/// A duration for people: 4.2s, 3m07s, 2h05m.
pub fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{:.1}s", d.as_secs_f64()),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

/// How long a Redis holder has held its key: the time it took it is by the holder's
/// clock, so a skew between the hosts shows here (a time ahead of ours reads as 0).
pub fn held_for(h: &RedisHolder) -> Option<Duration> {
    h.since
        .map(|t| SystemTime::now().duration_since(t).unwrap_or_default())
}
