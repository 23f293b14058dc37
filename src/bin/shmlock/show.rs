//! How keys, lock states and durations are shown: the small conversions the status line,
//! the text tables and the JSON reports share.

use std::time::{Duration, SystemTime};

use shmlock::{HolderState, RedisHolder};

/// Key bytes for a terminal: UTF-8 with invalid bytes replaced, control characters as `?`,
/// and so the bidirectional controls (a right-to-left override in a key reordered the rest
/// of its row).
pub fn printable(key: &[u8]) -> String {
    String::from_utf8_lossy(key)
        .chars()
        .map(|c| {
            if c.is_control() || is_bidi_control(c) {
                '?'
            } else {
                c
            }
        })
        .collect()
}

/// Unicode's explicit bidirectional formatting characters (UAX #9).
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// The bytes of a key's stored preview that hold whole characters: a preview of a longer
/// key (`cut`) may end inside a UTF-8 character, which would show as `�`. Other invalid
/// bytes are left to `printable`.
pub fn whole_chars(preview: &[u8], cut: bool) -> &[u8] {
    let n = preview.len();
    if !cut {
        return preview;
    }
    // the lead byte of the last character, within its last 3 bytes
    for back in 1..=n.min(3) {
        let lead = preview[n - back];
        if lead & 0xC0 == 0x80 {
            continue;
        }
        let len = match lead {
            0xF0.. => 4,
            0xE0.. => 3,
            0xC0.. => 2,
            _ => 1,
        };
        return if len > back {
            &preview[..n - back]
        } else {
            preview
        };
    }
    preview
}

/// `s` padded with spaces to `width` terminal columns (Rust's `{:<N}` counts chars, and a
/// CJK character or an emoji takes two columns, a combining mark none: keys in those
/// scripts shifted the columns after them). Longer text is left whole.
pub fn column(s: &str, width: usize) -> String {
    let used: usize = s.chars().map(columns).sum();
    format!("{s}{}", " ".repeat(width.saturating_sub(used)))
}

/// `s` in exactly `width` terminal columns: padded as `column` pads it, or, if it is wider
/// or `cut` (only the start of the key is known), cut to `width - 1` columns and ended
/// with `…`, so that a long key does not push the columns after it to the right.
pub fn fitted(s: &str, width: usize, cut: bool) -> String {
    let used: usize = s.chars().map(columns).sum();
    if !cut && used <= width {
        return column(s, width);
    }
    let mut kept = String::new();
    let mut taken = 0;
    for c in s.chars() {
        if taken + columns(c) > width.saturating_sub(1) {
            break;
        }
        taken += columns(c);
        kept.push(c);
    }
    kept.push('…');
    column(&kept, width)
}

/// Terminal columns of `c`, as terminals draw the common cases (East Asian wide and
/// emoji ranges 2, combining marks and zero-width characters 0).
fn columns(c: char) -> usize {
    match u32::from(c) {
        0x0300..=0x036F | 0x200B..=0x200F | 0x20D0..=0x20FF | 0xFE00..=0xFE0F | 0xFE20..=0xFE2F => {
            0
        }
        0x1100..=0x115F
        | 0x2E80..=0x303E
        | 0x3041..=0x33FF
        | 0x3400..=0x4DBF
        | 0x4E00..=0x9FFF
        | 0xA000..=0xA4CF
        | 0xAC00..=0xD7A3
        | 0xF900..=0xFAFF
        | 0xFE30..=0xFE4F
        | 0xFF00..=0xFF60
        | 0xFFE0..=0xFFE6
        | 0x1F300..=0x1F64F
        | 0x1F900..=0x1F9FF
        | 0x20000..=0x3FFFD => 2,
        _ => 1,
    }
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
        HolderState::Broken => "broken",
        HolderState::Kept => "kept",
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
