//! `create`: makes a table file (or a SharedDict file) with a chosen layout and mode, and
//! never opens one that exists.

use std::path::Path;

use shmlock::{LockTable, SharedDict};

use crate::args::{CreateArgs, DEFAULT_CAPACITY};
use crate::exit::{Fail, EX_CANTCREAT};

/// The library's error, with its names of the settings (`max_value_len`) replaced by the
/// options the user gave (`--max-value-len`).
fn in_cli_words(e: shmlock::Error, dict: bool) -> Fail {
    let Fail(mut msg, code) = Fail::from(e);
    // (a table has no zone: --zone-size is a dict's)
    let smaller = if dict {
        "a smaller --capacity or --zone-size"
    } else {
        "a smaller --capacity"
    };
    for (lib, cli) in [
        ("max_value_len", "--max-value-len"),
        ("max_key_len", "--max-key-len"),
        ("max_processes", "--max-processes"),
        ("heap_size", "--heap-size"),
        ("zone_size", "--zone-size"),
        ("options: mode ", "options: --mode "),
        ("give a capacity", "give a --capacity"),
        ("a smaller capacity", smaller),
    ] {
        msg = msg.replace(lib, cli);
    }
    Fail(msg, code)
}

/// Creates the table (or dict) `file`; fails if it exists, also if it appeared meanwhile.
pub fn create(file: &Path, a: CreateArgs) -> Result<u8, Fail> {
    let exists = || Fail(format!("{}: already exists", file.display()), EX_CANTCREAT);
    if file.exists() {
        return Err(exists());
    }
    if a.dict {
        let mut options = SharedDict::options()
            .max_processes(a.max_processes)
            .mode(a.mode);
        match (a.capacity, a.zone_size) {
            (Some(n), _) => options = options.capacity(n),
            (None, None) => options = options.capacity(DEFAULT_CAPACITY),
            (None, Some(_)) => {}
        }
        if let Some(len) = a.max_key_len {
            options = options.max_key_len(len);
        }
        if let Some(len) = a.max_value_len {
            options = options.max_value_len(len);
        }
        if let Some(bytes) = a.heap_size {
            options = options.heap_size(bytes);
        }
        if let Some(bytes) = a.zone_size {
            options = options.zone_size(bytes);
        }
        let dict = options.open(file).map_err(|e| in_cli_words(e, true))?;
        if !dict.created() {
            return Err(exists());
        }
        if dict.heap_size() > 0 {
            tell!(
                "created {}: a shared dict of {} B, {} entries, keys up to {} B, values up \
                 to {} B in the entry and up to {} B in a heap of {} B",
                file.display(),
                dict.zone_size(),
                dict.capacity(),
                dict.max_key_len(),
                dict.entry_value_len(),
                dict.max_value_len(),
                dict.heap_size()
            )?;
        } else {
            tell!(
                "created {}: a shared dict of {} entries, keys up to {} B, values up to {} B",
                file.display(),
                dict.capacity(),
                dict.max_key_len(),
                dict.max_value_len()
            )?;
        }
        return Ok(0);
    }
    let table = LockTable::options()
        .capacity(a.capacity.unwrap_or(DEFAULT_CAPACITY))
        .max_processes(a.max_processes)
        .mode(a.mode)
        .open(file)
        .map_err(|e| in_cli_words(e, false))?;
    if !table.created() {
        return Err(exists());
    }
    // (the file's length: every page of it is reserved at creation)
    let bytes = std::fs::metadata(file).map(|m| m.len()).unwrap_or(0);
    tell!(
        "created {} with capacity {} ({} slots, {:.1} MiB)",
        file.display(),
        table.capacity(),
        table.slots(),
        bytes as f64 / (1u64 << 20) as f64
    )?;
    Ok(0)
}
