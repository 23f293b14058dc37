//! `create`: makes a table file with a chosen capacity and mode, and never opens one that
//! exists.

use std::path::Path;

use shmlock::LockTable;

use crate::args::CreateArgs;
use crate::exit::{Fail, EX_CANTCREAT};

/// Creates the table `file`; fails if it exists, also if it appeared meanwhile.
pub fn create(file: &Path, a: CreateArgs) -> Result<u8, Fail> {
    if file.exists() {
        return Err(Fail(
            format!("{}: already exists", file.display()),
            EX_CANTCREAT,
        ));
    }
    let table = LockTable::options()
        .capacity(a.capacity)
        .max_processes(a.max_processes)
        .mode(a.mode)
        .open(file)?;
    if !table.created() {
        return Err(Fail(
            format!("{}: already exists", file.display()),
            EX_CANTCREAT,
        ));
    }
    println!(
        "created {} with capacity {}",
        file.display(),
        table.capacity()
    );
    Ok(0)
}
