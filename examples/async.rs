//! `lock_async` in a tokio program: many tasks share a few keys on one runtime thread; a
//! waiting task yields the thread instead of blocking it.
//!
//! ```sh
//! cargo run --example async --features tokio
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use shmlock::{LockOptions, LockTable};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), shmlock::Error> {
    let path = std::env::temp_dir().join(format!("shmlock-example-async-{}", std::process::id()));
    let table = Arc::new(LockTable::open(&path, 64)?);
    let started = Instant::now();
    let opts = LockOptions {
        step: Duration::from_millis(1),
        ..LockOptions::default()
    };
    // 12 tasks, 3 keys: each key is held by one task at a time for 20 ms.
    let tasks: Vec<_> = (0..12)
        .map(|i| {
            let table = table.clone();
            tokio::spawn(async move {
                let key = format!("account:{}", i % 3);
                let guard = table.lock_async(&key, &opts).await?;
                tokio::time::sleep(Duration::from_millis(20)).await; // the critical section
                let waited = guard.elapsed();
                drop(guard);
                Ok::<_, shmlock::Error>((i, key, waited))
            })
        })
        .collect();
    for t in tasks {
        let (i, key, waited) = t.await.expect("task panicked")?;
        println!("task {i:2} held {key} after waiting {waited:?}");
    }
    // 4 turns of 20 ms per key, the keys in parallel on one thread: well under the 240 ms
    // the 12 critical sections would take one after another (waiters poll on resty's
    // schedule, 1, 2, 4 ... ms, so a turn is noticed a little after it ends).
    println!("all done in {:?} on one thread", started.elapsed());
    let _ = std::fs::remove_file(&path);
    Ok(())
}
