//! lock_async on Redis waits over the handle's one multiplexed connection: a thousand
//! tasks waiting for a thousand held keys on one runtime add no thread per waiter.
//! (A test binary of its own: it counts the threads of its process.)

mod common;

use std::time::Duration;

use common::redis_server::RedisServer;
use shmlock::{LockOptions, RedisLocks};

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

#[test]
fn a_thousand_waiting_tasks_hold_a_handful_of_threads() {
    const TASKS: usize = 1000;
    let server = RedisServer::start();
    let redis = RedisLocks::open(&server.url()).unwrap();
    // another "host"; 'static, for the releasing thread
    let holder: &'static RedisLocks = Box::leak(Box::new(RedisLocks::open(&server.url()).unwrap()));
    let held: Vec<_> = (0..TASKS)
        .map(|i| {
            holder
                .try_lock_with_lease(format!("k{i}"), Duration::from_secs(60))
                .unwrap()
                .unwrap()
        })
        .collect();
    let before = threads();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let opts = LockOptions {
            timeout: Duration::from_secs(20),
            ..LockOptions::default()
        };
        let tasks: Vec<_> = (0..TASKS)
            .map(|i| {
                let redis = redis.clone();
                tokio::spawn(async move {
                    let guard = redis.lock_async(format!("k{i}"), &opts).await?;
                    let token = guard.token();
                    drop(guard); // released on a spawned task, over the async connection
                    Ok::<_, shmlock::Error>(token)
                })
            })
            .collect();
        // every task has tried and is waiting now (steps of 1, 2, 4, ... ms)
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(tasks.iter().all(|t| !t.is_finished()));
        let during = threads();
        assert!(
            during <= before + 2,
            "{during} threads while {TASKS} tasks wait (before: {before})"
        );
        // release the keys from a thread of its own (blocking calls)
        let releaser = std::thread::spawn(move || {
            for g in held {
                g.unlock().unwrap();
            }
        });
        for t in tasks {
            assert!(t.await.unwrap().unwrap().is_some());
        }
        releaser.join().unwrap();
        // the dropped guards' releases ran on the runtime
        for _ in 0..200 {
            if !redis.holders().unwrap().is_empty() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        assert!(redis.holders().unwrap().is_empty());
    });
    drop(rt);
}
