//! The same code over both backends: a nightly job that must run on one machine only,
//! written once against `Backend`, run on the lock table and then on Redis.
//!
//! ```sh
//! cargo run --example redis --features redis                          # redis://127.0.0.1:6379/
//! cargo run --example redis --features redis -- redis://10.0.0.5:6379/
//! ```
//!
//! Without a reachable server the Redis half says so and the example exits non-zero.

use std::process::ExitCode;
use std::time::Duration;

use shmlock::{Backend, Error, Lock, LockOptions, LockTable, RedisLocks};

/// Runs tonight's report under `backend`'s lock unless another worker holds it; returns
/// what happened. Written once, for any backend.
fn nightly_report<B: Backend>(backend: &B, worker: &str) -> Result<String, Error> {
    let opts = LockOptions {
        exptime: Duration::from_secs(60),
        timeout: Duration::ZERO, // try once: another worker has it in hand
        ..LockOptions::default()
    };
    let mut lock = Lock::new(backend, opts)?;
    match lock.lock("report:nightly") {
        Ok(_) => {
            // The fencing token goes with every write the job makes, so that a store can
            // refuse a worker whose lease ran out (and whose successor has a larger one).
            let token = lock.token().unwrap_or(0);
            let result = format!("{worker} ran the report (token {token})");
            lock.unlock()?; // Err(Expired) if the lease ran out meanwhile
            Ok(result)
        }
        Err(Error::Timeout { .. }) => Ok(format!("{worker}: someone else is running it")),
        Err(e) => Err(e),
    }
}

fn main() -> ExitCode {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redis://127.0.0.1:6379/".to_string());

    let path = std::env::temp_dir().join(format!("shmlock-example-redis-{}", std::process::id()));
    let table = match LockTable::open(&path, 64) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("lock table: {e}");
            return ExitCode::FAILURE;
        }
    };
    let held_elsewhere = table.try_lock_with_lease("report:nightly", Duration::from_secs(5));
    match nightly_report(&table, "table, first worker") {
        Ok(s) => println!("{s}"),
        Err(e) => eprintln!("table: {e}"),
    }
    drop(held_elsewhere);
    match nightly_report(&table, "table, second worker") {
        Ok(s) => println!("{s}"),
        Err(e) => eprintln!("table: {e}"),
    }
    let _ = std::fs::remove_file(&path);

    let redis = match RedisLocks::open(&url) {
        Ok(r) => r.with_prefix("shmlock-example:"),
        Err(e) => {
            eprintln!("redis at {url}: {e}");
            return ExitCode::FAILURE;
        }
    };
    match nightly_report(&redis, "redis worker") {
        Ok(s) => {
            println!("{s}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("redis at {url}: {e} (is a server running there?)");
            ExitCode::FAILURE
        }
    }
}
