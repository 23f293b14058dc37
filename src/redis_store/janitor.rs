//! Releases nobody waits for: a guard dropped inside an async runtime (which must not
//! block, and whose spawned tasks may never run again), and attempts whose outcome their
//! maker never learned (a dropped `lock_async` future, a reply that timed out).
//!
//! One thread per handle and process, started on first need, does them in order on a
//! connection of its own, trying again on a fresh connection until the server answers or
//! the hold could no longer matter. It ends when its handle is dropped, after the jobs
//! already given to it.

use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use redis::{RedisResult, Script};

use crate::redis_store::topology::{Shared, SyncConn, Tag};

/// A release or a cancel, by the hold's token.
pub(crate) struct Job {
    /// The lock key, its release channel, and the key the script marks (the release's
    /// mark, or the cancel marker).
    pub(crate) keys: [Vec<u8>; 3],
    pub(crate) token: String,
    pub(crate) kind: JobKind,
}

pub(crate) enum JobKind {
    /// A hold that was granted: released (`RELEASE`), its mark kept `mark_ms`.
    Release { mark_ms: u64 },
    /// An attempt that may or may not have been granted (`CANCEL`): its deadline in the
    /// server's µs (0: none), and the longest its marker may live.
    Cancel { not_after: i64, cap_ms: u64 },
}

/// The janitor of one handle in one process.
pub(crate) struct Janitor {
    tx: OnceLock<Mutex<Sender<Job>>>,
}

/// How long a job is tried before it is given up (the hold's lease ends it anyway).
const GIVE_UP: Duration = Duration::from_secs(30);

impl Janitor {
    pub(crate) const fn new() -> Janitor {
        Janitor {
            tx: OnceLock::new(),
        }
    }

    /// Hands `job` to the thread, started if this is the first.
    pub(crate) fn give(&self, shared: &Arc<Shared>, timeout: Duration, job: Job) {
        let tx = self.tx.get_or_init(|| {
            let (tx, rx) = mpsc::channel();
            let shared = shared.clone();
            let spawned = std::thread::Builder::new()
                .name("shmlock-redis-janitor".into())
                .spawn(move || work(&shared, timeout, &rx));
            if spawned.is_err() {
                // no thread: the jobs are dropped with the channel, and their holds lapse
                // with their leases
            }
            Mutex::new(tx)
        });
        let _ = tx.lock().unwrap_or_else(|e| e.into_inner()).send(job);
    }
}

fn work(shared: &Shared, timeout: Duration, jobs: &Receiver<Job>) {
    let release = Script::new(crate::redis_store::scripts::RELEASE);
    let cancel = Script::new(crate::redis_store::scripts::CANCEL);
    let mut con: Option<(SyncConn, Tag)> = None;
    let mut node = 0usize;
    while let Ok(job) = jobs.recv() {
        let give_up = Instant::now() + GIVE_UP;
        let mut pause = Duration::from_millis(20);
        loop {
            let done = run(shared, timeout, &mut con, &mut node, |c| {
                let (script, arg1, arg2) = match job.kind {
                    JobKind::Release { mark_ms } => (&release, 0i64, mark_ms),
                    JobKind::Cancel { not_after, cap_ms } => (&cancel, not_after, cap_ms),
                };
                let mut call = script.prepare_invoke();
                call.key(&job.keys[0]).key(&job.keys[1]).key(&job.keys[2]);
                call.arg(&job.token);
                if let JobKind::Cancel { .. } = job.kind {
                    call.arg(arg1);
                }
                call.arg(arg2);
                let _: i64 = call.invoke(c)?;
                Ok(())
            });
            if done.is_ok() || Instant::now() >= give_up {
                break;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }
}

/// Runs `f` on the janitor's connection, made anew after an error.
fn run(
    shared: &Shared,
    timeout: Duration,
    con: &mut Option<(SyncConn, Tag)>,
    node: &mut usize,
    f: impl FnOnce(&mut dyn redis::ConnectionLike) -> RedisResult<()>,
) -> RedisResult<()> {
    if con.as_ref().is_some_and(|(_, tag)| !shared.current(tag)) {
        *con = None; // a master that was replaced
    }
    let (c, _) = match con {
        Some(c) => c,
        None => {
            *node += 1;
            con.insert(shared.connect(*node, Instant::now() + timeout, timeout)?)
        }
    };
    c.set_timeouts(timeout)?;
    let outcome = f(c.as_dyn());
    if outcome.is_err() {
        *con = None;
    }
    outcome
}
