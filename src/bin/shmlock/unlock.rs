//! `unlock --force`: breaks a lock in a table file or in Redis, and says whom it was taken
//! from.

use std::path::Path;

use shmlock::{LockTable, RedisLocks};

use crate::args::UnlockArgs;
use crate::exit::{Fail, EX_USAGE};

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
    let table = LockTable::options().create(false).open(file)?;
    match table.force_unlock(&a.key)? {
        Some(h) => {
            println!(
                "broke {:?}: held by pid {} ({}), for {:.3}s",
                a.key,
                h.pid,
                if h.owner_alive { "alive" } else { "dead" },
                h.age.as_secs_f64()
            );
            Ok(0)
        }
        None => Err(Fail(format!("{:?} is not locked", a.key), 1)),
    }
}

/// Breaks `a.key` in Redis.
pub fn unlock_redis(redis: &RedisLocks, a: UnlockArgs) -> Result<u8, Fail> {
    refuse_without_force(&a)?;
    if redis.force_unlock(&a.key)? {
        println!("broke {:?}", a.key);
        Ok(0)
    } else {
        Err(Fail(format!("{:?} is not locked", a.key), 1))
    }
}
