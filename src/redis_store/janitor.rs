//! Releases nobody waits for: a guard dropped inside an async runtime (which must not
//! block, and whose spawned tasks may never run again), and attempts whose outcome their
//! maker never learned (a dropped `lock_async` future, a reply that timed out).
//!
//! One thread per handle and process, started on first need, does them in order on a
//! connection of its own, trying again on a fresh connection until the server answers or
//! the hold could no longer matter. It ends when its handle is dropped, after the jobs
//! already given to it; a process that exits waits for them (see [`flush_at_exit`]).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use redis::RedisResult;

use crate::lock::wait::instant_after;
use crate::per_process::PerProcess;
use crate::redis_store::net::{is_broken, is_transient};
use crate::redis_store::scripts::Lua;
use crate::redis_store::topology::Req;
use crate::redis_store::topology::{Shared, SyncConn, Tag};
use crate::shm::process;

/// A release or a cancel, by the hold's token.
pub(crate) struct Job {
    /// The lock key, its release channel, the key the script marks (the release's mark,
    /// or the cancel marker), and the key's shared holds (hash and leases).
    pub(crate) keys: [Vec<u8>; 5],
    pub(crate) token: String,
    pub(crate) kind: JobKind,
    /// Until when the job is worth trying: when the hold it undoes has lapsed by itself
    /// anyway. `None`: as long as the handle lives, and [`PAST_THE_LEASE`] after (a hold
    /// that never expires, or one whose lease is not known here, would otherwise be left
    /// on the server for good).
    pub(crate) until: Option<Instant>,
}

pub(crate) enum JobKind {
    /// A hold that was granted: released (`RELEASE`), its mark kept `mark_ms` (a guard
    /// dropped inside an async runtime). With `unless`: not before its time, and not at all
    /// if the flag says a task of the runtime released it meanwhile.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    Release {
        mark_ms: u64,
        unless: Option<(Instant, Arc<AtomicBool>)>,
    },
    /// An attempt that may or may not have been granted (`CANCEL`): its deadline in the
    /// server's µs (0: none), and the longest its marker may live.
    Cancel { not_after: i64, cap_ms: u64 },
}

/// The janitor of one handle in one process.
pub(crate) struct Janitor {
    tx: OnceLock<Mutex<Sender<Job>>>,
    /// Jobs given and not yet done.
    pending: Arc<AtomicUsize>,
}

/// The janitors of this process with jobs to wait for at its exit: their pending count and
/// command timeout. Per process: a forked child has none of its parent's, and never finds
/// the list's mutex held by a thread of its parent.
static LIVE: PerProcess<Live> = PerProcess::new();

type Live = Mutex<Vec<(Weak<AtomicUsize>, Duration)>>;

/// The process (`process::token`) that registered [`flush_at_exit`] last: a forked child
/// registers its own (the parent's may be half done), and the process's threads once.
static AT_EXIT: AtomicU64 = AtomicU64::new(0);

/// At `exit` (main returning, `std::process::exit`), waits for the janitors' pending jobs,
/// for at most the longest of their command timeouts (and 2 s) in all: a guard dropped
/// inside a runtime just before the process ends is still released. Not on `_exit` or a
/// signal, where a hold lapses with its lease.
extern "C" fn flush_at_exit() {
    // (a mutex another thread holds now is not waited for)
    let Ok(live) = LIVE.get(Default::default).try_lock() else {
        return;
    };
    // One bound for them all: each janitor waited for in turn made an exit with many
    // handles whose server is gone wait that long for each.
    let longest = live.iter().map(|(_, t)| *t).max().unwrap_or_default();
    let until = Instant::now() + longest.min(Duration::from_secs(2));
    for (pending, _) in live.iter() {
        let Some(pending) = pending.upgrade() else {
            continue;
        };
        while pending.load(Ordering::Acquire) > 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// How long past the lease of the hold it undoes a job is still tried: a lease is counted
/// on the server's clock from a request's arrival, which may come that much after the
/// job was made.
const PAST_THE_LEASE: Duration = Duration::from_secs(30);

/// Until when a job for a hold of a lease of `ttl_ms` (0: none) is tried.
pub(crate) fn until(ttl_ms: u64) -> Option<Instant> {
    (ttl_ms != 0).then(|| {
        instant_after(
            Instant::now(),
            Duration::from_millis(ttl_ms) + PAST_THE_LEASE,
        )
    })
}

impl Janitor {
    pub(crate) fn new() -> Janitor {
        Janitor {
            tx: OnceLock::new(),
            pending: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Hands `job` to the thread, started if this is the first.
    pub(crate) fn give(&self, shared: &Arc<Shared>, timeout: Duration, job: Job) {
        let tx = self.tx.get_or_init(|| {
            let me = process::token();
            if AT_EXIT.swap(me, Ordering::AcqRel) != me {
                // With forks held off: a child forked while this thread is inside `atexit`
                // would find glibc's lock of the exit handlers held for good, and hang at
                // its own exit.
                let _no_fork = process::NoFork::hold();
                // SAFETY: registers a function of no arguments that touches only statics and
                // atomics; it may run at any `exit` of this process (or of a forked child,
                // where it sees the child's janitors only; a child may run it twice, once
                // inherited, which waits for nothing more).
                unsafe { libc::atexit(flush_at_exit) };
            }
            let (tx, rx) = mpsc::channel();
            let (shared, pending) = (shared.clone(), self.pending.clone());
            let spawned = std::thread::Builder::new()
                .name("shmlock-redis-janitor".into())
                .spawn(move || work(&shared, timeout, &rx, &pending));
            if spawned.is_ok() {
                let mut live = LIVE
                    .get(Default::default)
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                live.retain(|(p, _)| p.strong_count() > 0);
                live.push((Arc::downgrade(&self.pending), timeout));
            }
            // (no thread: the jobs are dropped with the channel, and their holds lapse with
            // their leases)
            Mutex::new(tx)
        });
        self.pending.fetch_add(1, Ordering::AcqRel);
        if tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(job)
            .is_err()
        {
            self.pending.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// A job given to the thread and not done yet.
struct Queued {
    job: Job,
    /// When it is tried next.
    next: Instant,
    /// How long it waits after a failure (doubling, up to a second).
    pause: Duration,
}

/// The thread: tries each job as it comes, and again after a pause while the server cannot
/// be reached, newer jobs meanwhile (one that keeps failing holds up none of them), until
/// it is done or `until` has passed. When the handle is gone, a job kept for as long as
/// the process lives is kept [`PAST_THE_LEASE`] more, and the thread ends with its last
/// job.
fn work(shared: &Shared, timeout: Duration, jobs: &Receiver<Job>, pending: &AtomicUsize) {
    let release = Lua::new(crate::redis_store::scripts::RELEASE);
    let cancel = Lua::new(crate::redis_store::scripts::CANCEL);
    let mut con: Option<(SyncConn, Tag)> = None;
    let mut node = 0usize;
    let mut queue: Vec<Queued> = Vec::new();
    let mut open = true;
    loop {
        let due = queue.iter().map(|q| q.next).min();
        let wait = due.map(|d| d.saturating_duration_since(Instant::now()));
        if open {
            let got = match wait {
                None => jobs.recv().map_err(|_| RecvTimeoutError::Disconnected),
                Some(wait) => jobs.recv_timeout(wait),
            };
            match got {
                Ok(job) => {
                    let next = match &job.kind {
                        JobKind::Release {
                            unless: Some((at, _)),
                            ..
                        } => *at,
                        _ => Instant::now(),
                    };
                    queue.push(Queued {
                        job,
                        next,
                        pause: Duration::from_millis(20),
                    });
                    continue; // (any other job given meanwhile first)
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    open = false;
                    let until = instant_after(Instant::now(), PAST_THE_LEASE);
                    for q in &mut queue {
                        q.job.until.get_or_insert(until);
                    }
                }
            }
        } else {
            match wait {
                None => return,
                Some(wait) => std::thread::sleep(wait),
            }
        }
        let mut i = 0;
        while i < queue.len() {
            let now = Instant::now();
            let q = &mut queue[i];
            if q.next > now {
                i += 1;
                continue;
            }
            let job = &q.job;
            let finished = match &job.kind {
                // released by a task of the runtime meanwhile
                JobKind::Release {
                    unless: Some((_, done)),
                    ..
                } if done.load(Ordering::Acquire) => Ok(()),
                kind => {
                    let call = match kind {
                        JobKind::Release { .. } => release.call(),
                        JobKind::Cancel { .. } => cancel.call(),
                    }
                    .key(&job.keys[..])
                    .arg(&job.token);
                    let call = match kind {
                        JobKind::Release { mark_ms, .. } => call.arg(*mark_ms),
                        JobKind::Cancel { not_after, cap_ms } => call.arg(*not_after).arg(*cap_ms),
                    };
                    run(shared, timeout, &mut con, &mut node, |r| {
                        r.call::<i64>(&call).map(drop)
                    })
                }
            };
            let again = match &finished {
                Ok(()) => false,
                // the server answered with an error that trying again will not change
                Err(e) if e.code().is_some() && !is_broken(e) && !is_transient(e) => false,
                Err(_) => job.until.is_none_or(|u| now < u),
            };
            if again {
                // (the server is out of reach: every job due now waits as long)
                let next = now + q.pause;
                q.pause = (q.pause * 2).min(Duration::from_secs(1));
                for q in queue.iter_mut().filter(|q| q.next <= now) {
                    q.next = next;
                }
                break;
            }
            queue.swap_remove(i);
            pending.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Runs `f` on the janitor's connection, made anew after an error or a failover.
fn run(
    shared: &Shared,
    timeout: Duration,
    con: &mut Option<(SyncConn, Tag)>,
    node: &mut usize,
    f: impl FnOnce(&mut Req<'_>) -> RedisResult<()>,
) -> RedisResult<()> {
    if con.as_ref().is_some_and(|(_, tag)| !shared.current(tag)) {
        *con = None; // a master that was replaced
    }
    let limit = instant_after(Instant::now(), timeout);
    let (c, _) = match con {
        Some(c) => c,
        None => {
            *node += 1;
            con.insert(shared.connect(*node, limit, timeout)?)
        }
    };
    let outcome = f(&mut Req::new(c, limit));
    if outcome.is_err() {
        *con = None;
    }
    outcome
}
