//! `unlock --force`: breaks a lock in a table file or in Redis, and says whom it was taken
//! from.

use std::path::Path;

use shmlock::{HoldMode, LockTable, RedisLocks};

use crate::args::UnlockArgs;
use crate::exit::{Fail, EX_USAGE};
use crate::show::{held_for, printable};

/// Breaking a lock its holder still relies on is the user's decision: --force says so.
fn refuse_without_force(a: &UnlockArgs) -> Result<(), Fail> {
    if a.force {
        return Ok(());
    }
    Err(Fail(
        format!(
            "refusing to break {:?} without --force (its holder may still rely on it)",
            a.key
        ),
        EX_USAGE,
    ))
}

/// Breaks `a.key` in the table `file` (which must exist).
pub fn unlock(file: &Path, a: UnlockArgs) -> Result<u8, Fail> {
    refuse_without_force(&a)?;
    if a.host.is_some() {
        return Err(Fail(
            "--host names the host of a Redis holder; a lock table's holders are all on \
             this host"
                .into(),
            EX_USAGE,
        ));
    }
    let table = LockTable::options().create(false).open(file)?;
    let broken = table.force_unlock_holders(&a.key, a.pid)?;
    if broken.is_empty() {
        let mut why = match a.pid {
            Some(pid) => format!("{:?} is not held by pid {pid}", a.key),
            None => format!("{:?} is not locked", a.key),
        };
        // `inspect` shows a long key's first bytes only: someone who copied them from
        // there holds no whole key, and must be told so.
        let longer = table
            .holders()
            .into_iter()
            .filter(|h| {
                h.key_len > h.key_preview.len() && h.key_preview.starts_with(a.key.as_bytes())
            })
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
        println!(
            "broke {:?}: held{} by pid {} ({}), for {:.3}s",
            a.key,
            held_as(h.mode),
            h.pid,
            if h.owner_alive { "alive" } else { "dead" },
            h.age.as_secs_f64()
        );
    }
    Ok(0)
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
    refuse_without_force(&a)?;
    if let Some(pid) = a.pid {
        let host = a.host.as_deref();
        let n = redis.force_unlock_process(&a.key, host, pid)?;
        let whose = match host {
            Some(h) => format!("pid {pid} on {}", printable(h.as_bytes())),
            None => format!("pid {pid} on this host"),
        };
        if n == 0 {
            return Err(Fail(format!("{whose} holds nothing of {:?}", a.key), 1));
        }
        println!("broke {n} hold(s) of {:?} by {whose}", a.key);
        return Ok(0);
    }
    let broken = redis.force_unlock_holders(&a.key)?;
    if broken.is_empty() {
        return Err(Fail(format!("{:?} is not locked", a.key), 1));
    }
    // As for a table, a line per hold; Redis knows no owner processes to call alive or
    // dead, and a value written by something else tells nothing of its holder.
    for h in broken {
        if let Some(kind) = &h.foreign_type {
            println!(
                "broke {:?}: removed a {kind} at {}{{{}}} (a value shmlock did not write)",
                a.key,
                printable(prefix.as_bytes()),
                printable(a.key.as_bytes())
            );
            continue;
        }
        let whose = match (h.pid, &h.host) {
            (Some(pid), Some(host)) => format!("pid {pid} on {}", printable(host.as_bytes())),
            (Some(pid), None) => format!("pid {pid}"),
            _ => "an unknown holder (a value shmlock did not write)".into(),
        };
        let since =
            held_for(&h).map_or(String::new(), |d| format!(", for {:.3}s", d.as_secs_f64()));
        println!(
            "broke {:?}: held{} by {whose}{since}",
            a.key,
            held_as(h.mode)
        );
    }
    Ok(0)
}
