//! `unlock --force`: breaks a lock in a table file or in Redis, and says whom it was taken
//! from.

use std::path::Path;

use shmlock::{HoldMode, Holder, LockTable, RedisLocks};

use crate::args::UnlockArgs;
use crate::exit::{Fail, EX_USAGE};
use crate::show::{held_for, hex, printable};

/// Breaking a lock its holder still relies on is the user's decision: --force says so.
/// Returns the key's bytes (KEY itself, or decoded from hex with --hex).
pub fn refuse_without_force(a: &UnlockArgs) -> Result<Vec<u8>, Fail> {
    let key = if a.hex {
        from_hex(&a.key).ok_or_else(|| {
            let k = &a.key;
            let why = if k.starts_with("0x") || k.starts_with("0X") {
                "give the digits without 0x".to_string()
            } else if let Some(c) = k.chars().find(|c| !c.is_ascii_hexdigit()) {
                format!("{c:?} is not a hex digit")
            } else if k.is_empty() {
                "no digits".to_string()
            } else {
                format!("an odd number of digits ({})", k.len())
            };
            Fail(
                format!("--hex: {k:?} is not a key in hex (two digits a byte): {why}"),
                EX_USAGE,
            )
        })?
    } else {
        a.key.clone().into_bytes()
    };
    if key.is_empty() {
        return Err(shmlock::Error::EmptyKey.into());
    }
    if a.force {
        return Ok(key);
    }
    Err(Fail(
        format!(
            "refusing to break {} without --force (its holder may still rely on it)",
            quoted(&key)
        ),
        EX_USAGE,
    ))
}

/// `s`'s pairs of hex digits as bytes.
fn from_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

/// A key as the messages quote it: as text if it is, else as `--hex` takes it.
fn quoted(key: &[u8]) -> String {
    match std::str::from_utf8(key) {
        Ok(text) if !text.chars().any(char::is_control) => format!("{text:?}"),
        _ => format!("the key of hex {}", hex(key)),
    }
}

/// Breaks `a.key` in the table `file` (which must exist).
pub fn unlock(file: &Path, a: UnlockArgs) -> Result<u8, Fail> {
    let key = refuse_without_force(&a)?;
    if a.host.is_some() {
        return Err(Fail(
            "--host names the host of a Redis holder; a lock table's holders are all on \
             this host"
                .into(),
            EX_USAGE,
        ));
    }
    // (no registry entry: breaking a key works while every entry is taken)
    let table = LockTable::options()
        .create(false)
        .register_lazily(true)
        .open(file)
        .map_err(|e| match e {
            shmlock::Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                crate::inspect::nothing_at(file)
            }
            e => e.into(),
        })?;
    let broken = table.force_unlock_holders(&key, a.pid)?;
    if broken.is_empty() {
        let mut why = match a.pid {
            Some(pid) => format!("{} is not held by pid {pid}", quoted(&key)),
            None => format!("{} is not locked", quoted(&key)),
        };
        // `inspect` shows a long key's first bytes only: someone who copied them from
        // there holds no whole key, and must be told so.
        let longer = table
            .holders()
            .into_iter()
            .filter(|h| h.key_len > h.key_preview.len() && h.key_preview.starts_with(&key))
            .max_by_key(|h| h.key_len);
        if let Some(h) = longer {
            why.push_str(&format!(
                "; a key of {} bytes that starts so is held (inspect shows a key's first {} \
                 bytes only): give the whole key",
                h.key_len,
                h.key_preview.len()
            ));
        }
        return Err(Fail(why, 1));
    }
    for h in broken {
        tell!(
            "broke {}: held{} by {}, for {:.3}s",
            quoted(&key),
            held_as(h.mode),
            holder_of(&h),
            h.age.as_secs_f64()
        )?;
    }
    Ok(0)
}

/// Who held a broken hold, as its line says it. A hold left to expire has no owner, and a
/// pid of another pid namespace is not shown (pid 0).
fn holder_of(h: &Holder) -> String {
    let alive = if h.owner_alive { "alive" } else { "dead" };
    match h.pid {
        _ if h.left_to_expire => "no process (it was left to expire)".into(),
        0 => format!("a process of another pid namespace ({alive})"),
        pid => format!("pid {pid} ({alive})"),
    }
}

/// How a broken hold held its key, as its line says it: ` shared`, ` as one of N
/// permits`, or nothing (alone).
fn held_as(mode: HoldMode) -> String {
    match mode {
        HoldMode::Shared => " shared".into(),
        HoldMode::Permit { permits } => format!(" as one of {permits} permits"),
        _ => String::new(),
    }
}

/// Breaks `a.key` in Redis.
pub fn unlock_redis(redis: &RedisLocks, prefix: &str, a: UnlockArgs) -> Result<u8, Fail> {
    let key = refuse_without_force(&a)?;
    if let Some(pid) = a.pid {
        let host = a.host.as_deref();
        let n = redis.force_unlock_process(&key, host, pid)?;
        let whose = match host {
            Some(h) => format!("pid {pid} on {}", printable(h.as_bytes())),
            None => format!("pid {pid} on this host"),
        };
        if n == 0 {
            return Err(Fail(
                format!("{whose} holds nothing of {}", quoted(&key)),
                1,
            ));
        }
        tell!("broke {n} hold(s) of {} by {whose}", quoted(&key))?;
        return Ok(0);
    }
    let broken = redis.force_unlock_holders(&key)?;
    if broken.is_empty() {
        return Err(Fail(format!("{} is not locked", quoted(&key)), 1));
    }
    // As for a table, a line per hold; Redis knows no owner processes to call alive or
    // dead, and a value written by something else tells nothing of its holder.
    for h in broken {
        if let Some(kind) = &h.foreign_type {
            tell!(
                "broke {}: removed a {kind} at {}{{{}}} (a value shmlock did not write)",
                quoted(&key),
                printable(prefix.as_bytes()),
                printable(&key)
            )?;
            continue;
        }
        let whose = match (h.pid, &h.host) {
            (Some(pid), Some(host)) => format!("pid {pid} on {}", printable(host.as_bytes())),
            (Some(pid), None) => format!("pid {pid}"),
            _ => "an unknown holder (a value shmlock did not write)".into(),
        };
        let since =
            held_for(&h).map_or(String::new(), |d| format!(", for {:.3}s", d.as_secs_f64()));
        tell!(
            "broke {}: held{} by {whose}{since}",
            quoted(&key),
            held_as(h.mode)
        )?;
    }
    Ok(0)
}
