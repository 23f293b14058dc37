//! `inspect`'s text output: a header line, then one row per lock (or per key of a shared
//! dict), in columns for a terminal.

use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

use shmlock::{Holder, HolderState, LockTable, RedisHolder, SharedDict, ValueInfo};

use crate::show::{fitted, held_for, printable, state_name, whole_chars};

/// A key as its row shows it, in `width` columns: the preview, cut short and ended with
/// `…` if the key is longer.
fn shown_key(h: &Holder, width: usize) -> String {
    let cut = h.key_len > h.key_preview.len();
    fitted(&printable(whole_chars(&h.key_preview, cut)), width, cut)
}

/// `hs`: the holders to list, sorted; `hidden`: how many more `--all` would list.
pub fn write_table(
    out: &mut impl Write,
    file: &Path,
    t: &LockTable,
    hs: &[Holder],
    hidden: usize,
) -> std::io::Result<()> {
    writeln!(
        out,
        "{}: format {}, capacity {} ({} slots), occupancy {}",
        printable(file.as_os_str().as_bytes()),
        t.format_version(),
        t.capacity(),
        t.slots(),
        t.occupancy()
    )?;
    if hs.is_empty() {
        return match hidden {
            0 => writeln!(out, "no locks held"),
            n => writeln!(
                out,
                "no locks held ({n} expired or dead holder's entr{}, not yet reaped: --all \
                 lists {})",
                if n == 1 { "y" } else { "ies" },
                if n == 1 { "it" } else { "them" }
            ),
        };
    }
    writeln!(
        out,
        "{:<32} {:>8} {:>6} {:>9} {:>10} {:>10} {:>19} {:>7} {:>10}",
        // WAITED: a waiter flagged the hold since it was taken (it may have left since);
        // "writer": a writer waits for it now, and new readers defer to it; "readers":
        // readers wait for this writer's hold now, and go next
        "KEY",
        "PID",
        "ALIVE",
        "STATE",
        "AGE",
        "TTL",
        "TOKEN",
        "WAITED",
        "MODE"
    )?;
    for h in hs {
        let kept = h.state == HolderState::Kept;
        let ttl = match h.ttl {
            _ if kept => "-".to_string(),
            _ if h.expired => "expired".to_string(),
            Some(d) => format!("{:.3}s", d.as_secs_f64()),
            None => "never".to_string(),
        };
        writeln!(
            out,
            // (a table's tokens have 19 digits)
            "{} {:>8} {:>6} {:>9} {:>10} {:>10} {:>19} {:>7} {:>10}",
            shown_key(h, 32),
            // (no process known here: a hold left to expire, or one of another pid namespace)
            if h.pid == 0 {
                "-".to_string()
            } else {
                h.pid.to_string()
            },
            match (h.left_to_expire || kept, h.owner_alive) {
                (true, _) => "-",
                (false, true) => "yes",
                (false, false) => "no",
            },
            state_name(h.state),
            if kept {
                "-".to_string()
            } else {
                format!("{:.3}s", h.age.as_secs_f64())
            },
            ttl,
            h.token.map_or("-".to_string(), |t| t.to_string()),
            match (h.writer_waits, h.readers_wait, h.waiters) {
                (true, _, _) => "writer",
                (_, true, _) => "readers",
                (_, _, true) => "yes",
                _ => "no",
            },
            mode_name(h.mode),
        )?;
    }
    Ok(())
}

/// `keys`: the live keys and their time to live, sorted.
pub fn write_dict(
    out: &mut impl Write,
    file: &Path,
    dict: &SharedDict,
    keys: &[(Vec<u8>, ValueInfo)],
) -> std::io::Result<()> {
    writeln!(
        out,
        "{}: shared dict, capacity {}, entries {} ({} live), keys up to {} B, values up to {} B{}, evictions {}, repairs {}, writer {}",
        printable(file.as_os_str().as_bytes()),
        dict.capacity(),
        dict.len(),
        keys.len(),
        dict.max_key_len(),
        dict.max_value_len(),
        // (the heap: where values longer than an entry's room go, and how much is free)
        if dict.heap_size() > 0 {
            format!(
                " ({} in the entry, longer in a heap of {} B, {} B free)",
                dict.entry_value_len(),
                dict.heap_size(),
                dict.heap_free()
            )
        } else {
            String::new()
        },
        dict.evictions(),
        dict.repairs(),
        match (dict.writer_pid(), dict.writer_alive()) {
            (None, _) => "none".to_string(),
            (Some(p), Some(false)) => format!("pid {p} (dead: the next write takes over)"),
            (Some(p), _) => format!("pid {p}"),
        }
    )?;
    if keys.is_empty() {
        return writeln!(out, "no live keys");
    }
    writeln!(
        out,
        "{:<48} {:>6} {:>8} {:>10}",
        "KEY", "KIND", "LEN", "TTL"
    )?;
    for (k, info) in keys {
        let ttl = info
            .ttl
            .map_or("never".to_string(), |d| format!("{:.3}s", d.as_secs_f64()));
        writeln!(
            out,
            "{} {:>6} {:>8} {:>10}",
            fitted(&printable(k), 48, false),
            info.kind.name(),
            info.len,
            ttl
        )?;
    }
    Ok(())
}

/// `url`: the --redis URLs as printed (passwords redacted). A NODE column is added when
/// the holders come from a cluster's nodes.
pub fn write_redis(out: &mut impl Write, url: &str, held: &[RedisHolder]) -> std::io::Result<()> {
    writeln!(
        out,
        "{}: {} lock{} held",
        printable(url.as_bytes()),
        held.len(),
        if held.len() == 1 { "" } else { "s" }
    )?;
    if held.is_empty() {
        return Ok(());
    }
    let cluster = held.iter().any(|h| !h.node.is_empty());
    write!(
        out,
        // (a Redis token is the server's clock in µs, 16 digits, once its counter lapsed)
        "{:<32} {:>24} {:>10} {:>10} {:>16} {:>10}",
        "KEY", "HOLDER", "AGE", "TTL", "TOKEN", "MODE"
    )?;
    writeln!(out, "{}", if cluster { "  NODE" } else { "" })?;
    for h in held {
        let holder = match (&h.host, h.pid) {
            (Some(host), Some(pid)) => format!("{}:{pid}", printable(host.as_bytes())),
            _ => "?".to_string(),
        };
        let secs = |d: Option<Duration>, none: &str| {
            d.map_or(none.to_string(), |d| format!("{:.3}s", d.as_secs_f64()))
        };
        write!(
            out,
            "{} {:>24} {:>10} {:>10} {:>16} {:>10}",
            fitted(&printable(&h.key), 32, false),
            holder,
            secs(held_for(h), "?"),
            secs(h.ttl, "never"),
            h.token
                .or(h.last_token)
                .map_or("-".to_string(), |t| t.to_string()),
            // (a value of another type than shmlock writes: that type)
            h.foreign_type.clone().unwrap_or_else(|| mode_name(h.mode)),
        )?;
        writeln!(
            out,
            "{}",
            if cluster {
                format!("  {}", h.node)
            } else {
                String::new()
            }
        )?;
    }
    Ok(())
}

/// A hold's mode as the MODE column shows it.
fn mode_name(mode: shmlock::HoldMode) -> String {
    match mode {
        shmlock::HoldMode::Permit { permits } => format!("permit/{permits}"),
        m => m.name().to_string(),
    }
}
