//! `inspect --json`: one object on a line per print, for a lock table (the schema
//! `inspect --help` describes), a shared dict or Redis.

use std::borrow::Cow;
use std::io::Write;
use std::path::Path;

use shmlock::{Holder, LockTable, RedisHolder, SharedDict, ValueInfo};

use crate::show::{held_for, hex, state_name, whole_chars};

/// One JSON object on a line, as `--json` promises.
fn print_json(out: &mut impl Write, value: &impl serde::Serialize) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, value)?;
    writeln!(out)
}

/// `inspect --json` of a lock table (the schema `inspect --help` describes).
#[derive(serde::Serialize)]
struct TableReport<'a> {
    file: Cow<'a, str>,
    kind: &'static str,
    format_version: u32,
    capacity: usize,
    slots: usize,
    occupancy: usize,
    holders: Vec<TableEntry>,
}

#[derive(serde::Serialize)]
struct TableEntry {
    key: String,
    key_hex: String,
    key_len: usize,
    truncated: bool,
    pid: u32,
    alive: bool,
    /// No owner: only the lease ends the hold (`pid` is 0, `alive` means nothing).
    left_to_expire: bool,
    state: &'static str,
    age_ms: u64,
    ttl_ms: Option<u64>,
    expired: bool,
    token: Option<u64>,
    /// The token in decimal: tokens pass 2^53, where JSON readers that parse numbers as
    /// doubles (jq, JavaScript) round them, and two tokens 1 apart would compare equal.
    token_text: Option<String>,
    /// A waiter flagged the hold since it was taken: not that one waits now.
    waiters: bool,
    /// A writer waits for this reader's hold (new readers defer to it), or the key is
    /// kept for it (`state` "kept").
    writer_waits: bool,
    /// Readers wait for this writer's hold (its release keeps the key for them), or the
    /// key is kept for them (`state` "kept").
    readers_wait: bool,
    mode: &'static str,
    permits: Option<u32>,
}

/// `hs`: the holders to list, sorted.
pub fn write_table(
    out: &mut impl Write,
    file: &Path,
    t: &LockTable,
    hs: &[Holder],
) -> std::io::Result<()> {
    let report = TableReport {
        file: file.to_string_lossy(),
        kind: "lock table",
        format_version: t.format_version(),
        capacity: t.capacity(),
        slots: t.slots(),
        occupancy: t.occupancy(),
        holders: hs
            .iter()
            .map(|h| TableEntry {
                key: String::from_utf8_lossy(whole_chars(
                    &h.key_preview,
                    h.key_len > h.key_preview.len(),
                ))
                .into_owned(),
                key_hex: hex(&h.key_preview),
                key_len: h.key_len,
                truncated: h.key_len > h.key_preview.len(),
                pid: h.pid,
                alive: h.owner_alive,
                left_to_expire: h.left_to_expire,
                state: state_name(h.state),
                age_ms: h.age.as_millis() as u64,
                ttl_ms: h.ttl.map(|d| d.as_millis() as u64),
                expired: h.expired,
                token: h.token,
                token_text: h.token.map(|t| t.to_string()),
                waiters: h.waiters,
                writer_waits: h.writer_waits,
                readers_wait: h.readers_wait,
                mode: h.mode.name(),
                permits: match h.mode {
                    shmlock::HoldMode::Permit { permits } => Some(permits),
                    _ => None,
                },
            })
            .collect(),
    };
    print_json(out, &report)
}

/// `inspect --json` of a shared dict.
#[derive(serde::Serialize)]
struct DictReport<'a> {
    file: Cow<'a, str>,
    kind: &'static str,
    capacity: usize,
    entries: usize,
    live: usize,
    max_key_len: usize,
    max_value_len: usize,
    /// The longest value kept in an entry; longer ones go in the heap.
    entry_value_len: usize,
    /// Bytes of the file (as `zone_size` sizes it).
    zone_size: u64,
    /// Bytes of the heap (0: none), and how many are free.
    heap_size: u64,
    heap_free: u64,
    evictions: u64,
    repairs: u64,
    writer_pid: Option<u32>,
    /// Whether the writer lock's holder lives (`null`: nobody holds it).
    writer_alive: Option<bool>,
    keys: Vec<DictKey>,
}

#[derive(serde::Serialize)]
struct DictKey {
    key: String,
    key_hex: String,
    /// `bytes`, `int`, `float`, `bool` or `list`.
    value_kind: &'static str,
    /// Bytes of a byte value, elements of a list; 8 for a number, 1 for a boolean.
    len: usize,
    ttl_ms: Option<u64>,
}

/// `keys`: the live keys and their time to live, sorted.
pub fn write_dict(
    out: &mut impl Write,
    file: &Path,
    dict: &SharedDict,
    keys: &[(Vec<u8>, ValueInfo)],
) -> std::io::Result<()> {
    let report = DictReport {
        file: file.to_string_lossy(),
        kind: "dict",
        capacity: dict.capacity(),
        entries: dict.len(),
        live: keys.len(),
        max_key_len: dict.max_key_len(),
        max_value_len: dict.max_value_len(),
        entry_value_len: dict.entry_value_len(),
        zone_size: dict.zone_size(),
        heap_size: dict.heap_size(),
        heap_free: dict.heap_free(),
        evictions: dict.evictions(),
        repairs: dict.repairs(),
        writer_pid: dict.writer_pid(),
        writer_alive: dict.writer_alive(),
        keys: keys
            .iter()
            .map(|(k, info)| DictKey {
                key: String::from_utf8_lossy(k).into_owned(),
                key_hex: hex(k),
                value_kind: info.kind.name(),
                len: info.len,
                ttl_ms: info.ttl.map(|d| d.as_millis() as u64),
            })
            .collect(),
    };
    print_json(out, &report)
}

/// `inspect --redis --json`.
#[derive(serde::Serialize)]
struct RedisReport<'a> {
    redis: &'a str,
    holders: Vec<RedisEntry>,
}

#[derive(serde::Serialize)]
struct RedisEntry {
    key: String,
    key_hex: String,
    ttl_ms: Option<u64>,
    token: Option<u64>,
    holder_token: Option<u64>,
    host: Option<String>,
    pid: Option<u32>,
    age_ms: Option<u64>,
    /// (the master that holds it, in a Cluster; null elsewhere)
    node: Option<String>,
    /// (null for a foreign value, which tells no mode)
    mode: Option<&'static str>,
    permits: Option<u32>,
    foreign_type: Option<String>,
}

/// `url`: the --redis URLs as printed (passwords redacted).
pub fn write_redis(out: &mut impl Write, url: &str, held: &[RedisHolder]) -> std::io::Result<()> {
    let report = RedisReport {
        redis: url,
        holders: held
            .iter()
            .map(|h| RedisEntry {
                key: String::from_utf8_lossy(&h.key).into_owned(),
                key_hex: hex(&h.key),
                ttl_ms: h.ttl.map(|d| d.as_millis() as u64),
                token: h.last_token,
                holder_token: h.token,
                host: h.host.clone(),
                pid: h.pid,
                age_ms: held_for(h).map(|d| d.as_millis() as u64),
                node: (!h.node.is_empty()).then(|| h.node.clone()),
                mode: h.foreign_type.is_none().then(|| h.mode.name()),
                permits: match h.mode {
                    shmlock::HoldMode::Permit { permits } => Some(permits),
                    _ => None,
                },
                foreign_type: h.foreign_type.clone(),
            })
            .collect(),
    };
    print_json(out, &report)
}
