//! Async waiters on the lock table, woken by the release that frees their key.
//!
//! A task cannot sleep on a futex: that would block its runtime's thread. Instead one thread
//! per table and process, the *watcher*, sleeps in the kernel on every word that the
//! process's waiting tasks wait for at once (`futex_waitv`, Linux 5.16), and on a word of
//! its own that a task rings when it starts or stops waiting. It flags each waited-on hold
//! exactly as a sleeping thread does ([`Table::prepare_wait`](super::table::Table)): whoever
//! moves a flagged hold off its key wakes the watcher, and a move before the watcher went
//! to sleep makes the kernel refuse the sleep, so no wake-up is lost.
//!
//! **No herd.** The tasks waiting for one key form a queue: when the key may be free, the
//! watcher wakes the first task only, and the others stay asleep until that task has made
//! its attempt (then they sleep on the new hold, or the next one is woken). Within a process
//! the key goes round in the order the tasks asked for it; across processes, each
//! process's first task competes, as sleeping threads do.
//!
//! A task's own step (resty's schedule) still bounds each of its sleeps, so a holder that
//! dies (and wakes nobody) is noticed as when polling. On a kernel without `futex_waitv`
//! the watcher looks at the words every millisecond instead.
//!
//! **A woken task that is not polled** (a future kept in a `select!` loop busy elsewhere)
//! keeps its turn for [`STUCK`](crate::lock::backend::STUCK) only: then the watcher treats the next task as the first,
//! so that a key left free is not left to the timeouts of everyone behind it. The late
//! task still makes its attempt when it is polled.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::lock::backend::Waiter;
use crate::shm::clock;
use crate::shm::futex::{self, WaitAny, Watched, WAIT_ANY_MAX};
use crate::shm::mapping::Mapping;
use crate::shm::table::{Busy, KeyHash, Prepared};

/// What the watcher needs of a table: to flag a busy hold before sleeping on it, and the
/// word to sleep on.
pub(crate) trait Watchable: Send + Sync + 'static {
    fn prepare_wait(&self, b: &Busy) -> Prepared;
    fn wait_word(&self, b: &Busy) -> &AtomicU64;
    /// The mapping the words are in: what the watcher keeps while it sleeps on them.
    fn mapping(&self) -> Arc<Mapping>;
}

/// How long the watcher sleeps with nothing to look at.
const IDLE: Duration = Duration::from_millis(100);

/// How soon the watcher looks again at a key whose first task was woken but has not tried
/// yet, or that is between states (a claim or renewal in progress wakes nobody).
const SOON: Duration = Duration::from_millis(1);

/// The watcher of one table in one process.
pub(crate) struct Watcher {
    state: Arc<State>,
}

struct State {
    registry: Mutex<Registry>,
    /// Rung (incremented, then woken) when a task starts or stops waiting.
    doorbell: AtomicU32,
}

#[derive(Default)]
struct Registry {
    /// The queues of tasks, one per busy key.
    groups: Vec<Group>,
    next_id: u64,
    /// Whether the watcher thread runs.
    running: bool,
}

/// The tasks waiting for one key, first come first.
struct Group {
    hash: KeyHash,
    /// The key's hold as a waiter saw it last (none yet: the first taker of a place has not
    /// tried the key).
    busy: Option<Busy>,
    entries: VecDeque<Waiter>,
}

impl Group {
    /// The task whose turn it is: the first one that is not stuck.
    fn head(&mut self, now: Instant) -> Option<&mut Waiter> {
        self.entries.iter_mut().find(|e| !e.stuck(now))
    }
}

fn lock(m: &Mutex<Registry>) -> MutexGuard<'_, Registry> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl State {
    fn ring(&self) {
        self.doorbell.fetch_add(1, Ordering::Release);
        futex::wake_private(&self.doorbell);
    }
}

impl Watcher {
    pub(crate) fn new() -> Watcher {
        Watcher {
            state: Arc::new(State {
                registry: Mutex::new(Registry::default()),
                doorbell: AtomicU32::new(0),
            }),
        }
    }

    /// A place at the back of the queue of the key `hash`, taken as a task asks for the key
    /// (before its first attempt, so that the order of asking is kept), and the key's hold
    /// if tasks of this process wait for it already (then the task does not try the key
    /// first: it is theirs before it is this task's).
    pub(crate) fn ticket(&self, hash: KeyHash) -> (Wake, Option<Busy>) {
        let mut reg = lock(&self.state.registry);
        let id = reg.next_id;
        reg.next_id += 1;
        let entry = Waiter {
            id,
            waker: None,
            woken: None,
        };
        let ahead = match reg.groups.iter_mut().find(|g| g.hash == hash) {
            Some(g) => {
                let ahead = g.busy.filter(|_| !g.entries.is_empty());
                g.entries.push_back(entry);
                ahead
            }
            None => {
                reg.groups.push(Group {
                    hash,
                    busy: None,
                    entries: VecDeque::from([entry]),
                });
                None
            }
        };
        let wake = Wake {
            state: self.state.clone(),
            id,
        };
        (wake, ahead)
    }
}

/// A task's place in a key's queue: ready when the key may be free. Dropping it leaves the
/// queue, and the watcher looks at the key again (and wakes the next task if it may be
/// free), attempted or not.
pub(crate) struct Wake {
    state: Arc<State>,
    id: u64,
}

impl Future for Wake {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut reg = lock(&self.state.registry);
        for g in &mut reg.groups {
            if let Some(e) = g.entries.iter_mut().find(|e| e.id == self.id) {
                if e.woken() {
                    return Poll::Ready(());
                }
                e.waker = Some(cx.waker().clone());
                return Poll::Pending;
            }
        }
        Poll::Ready(()) // (not queued any more: look at the key)
    }
}

impl Wake {
    /// Waits (again) in the place, on the key's hold as `busy` saw it: the watcher flags
    /// that hold and sleeps on it. Starts the watcher thread if it does not run (it holds
    /// `table` weakly and ends when the table is gone, or when nobody waits for a while).
    /// Only a task that has just tried the key (or the first, or the first to ask) tells
    /// the watcher which hold to flag: the others' `busy` may be long gone.
    pub(crate) fn wait(&self, table: &Arc<dyn Watchable>, busy: &Busy) {
        {
            let now = Instant::now();
            let mut reg = lock(&self.state.registry);
            if let Some(g) = reg
                .groups
                .iter_mut()
                .find(|g| g.entries.iter().any(|e| e.id == self.id))
            {
                let head = g.head(now).map(|e| e.id);
                if let Some(e) = g.entries.iter_mut().find(|e| e.id == self.id) {
                    let fresh = e.woken() || head == Some(self.id);
                    e.woken = None;
                    if fresh || g.busy.is_none() {
                        g.busy = Some(*busy); // the hold seen last, to flag
                    }
                }
            }
            if !reg.running {
                let (state, weak) = (self.state.clone(), Arc::downgrade(table));
                reg.running = std::thread::Builder::new()
                    .name("shmlock-async-waits".into())
                    .spawn(move || watch(&state, &weak))
                    .is_ok();
            }
        }
        self.state.ring();
    }

    /// Whether no task of this process waits for the key before this one (but tasks
    /// woken and not polled for [`STUCK`](crate::lock::backend::STUCK)).
    pub(crate) fn is_first(&self) -> bool {
        let now = Instant::now();
        let mut reg = lock(&self.state.registry);
        reg.groups
            .iter_mut()
            .find(|g| g.entries.iter().any(|e| e.id == self.id))
            .is_none_or(|g| g.head(now).is_none_or(|e| e.id == self.id))
    }

    /// The key's hold as the task that tried it last saw it.
    pub(crate) fn hold(&self) -> Option<Busy> {
        let reg = lock(&self.state.registry);
        reg.groups
            .iter()
            .find(|g| g.entries.iter().any(|e| e.id == self.id))
            .and_then(|g| g.busy)
    }
}

impl crate::lock::backend::Place for Wake {
    fn attempted(self) {}
}

impl Drop for Wake {
    fn drop(&mut self) {
        let mut reg = lock(&self.state.registry);
        let mut others = false;
        for g in &mut reg.groups {
            let before = g.entries.len();
            g.entries.retain(|e| e.id != self.id);
            if g.entries.len() < before {
                others = !g.entries.is_empty();
            }
        }
        reg.groups.retain(|g| !g.entries.is_empty());
        drop(reg);
        if others {
            self.state.ring(); // the watcher looks at the key for the next one
        }
    }
}

/// How long the watcher lingers with no task waiting before its thread ends (the next
/// waiting task starts another).
const LINGER: Duration = Duration::from_secs(1);

/// The watcher thread.
fn watch(state: &State, table: &Weak<dyn Watchable>) {
    let mut waitv = cfg!(target_os = "linux");
    loop {
        let Some(table) = table.upgrade() else {
            lock(&state.registry).running = false;
            return;
        };
        // the doorbell as it reads before looking: a ring after this wakes the sleep below
        let ring = state.doorbell.load(Ordering::Acquire);
        let mut armed: Vec<(Busy, u32)> = Vec::new();
        let mut soon = false;
        let now = Instant::now();
        let idle = {
            let mut reg = lock(&state.registry);
            for g in &mut reg.groups {
                let busy = g.busy;
                let Some(first) = g.head(now) else {
                    continue; // all woken long ago: each tries when it is polled
                };
                if first.woken() {
                    soon = true; // its attempt is under way: the others wait for it
                    continue;
                }
                let Some(busy) = busy else {
                    continue; // its first taker is trying the key
                };
                match table.prepare_wait(&busy) {
                    Prepared::Sleep(low) => armed.push((busy, low)),
                    Prepared::Changed => {
                        first.wake(now);
                        soon = true;
                    }
                    Prepared::Poll => soon = true,
                }
            }
            reg.groups.is_empty()
        };
        if idle {
            drop(table);
            futex::wait_private(&state.doorbell, ring, LINGER);
            let mut reg = lock(&state.registry);
            if reg.groups.is_empty() {
                reg.running = false;
                return;
            }
            continue;
        }
        let all_armed = armed.len() < WAIT_ANY_MAX;
        let wait = if soon || !waitv || !all_armed {
            SOON
        } else {
            IDLE
        };
        // Only the mapping is kept while asleep, not the table: a child forked meanwhile
        // inherits whatever this thread holds, with no thread to let it go, and a table
        // kept so would keep the child's registration until the child's exit.
        let words: Vec<(*const AtomicU64, u32)> = armed
            .iter()
            .take(WAIT_ANY_MAX - 1)
            .map(|(busy, low)| (table.wait_word(busy) as *const AtomicU64, *low))
            .collect();
        let mapped = table.mapping();
        drop(table);
        if waitv {
            let until = clock::precise_now().saturating_add(wait.as_nanos() as u64);
            let mut watched = vec![Watched::Private(&state.doorbell, ring)];
            // SAFETY: each word is in the mapping `mapped` keeps mapped until after the
            // sleep (it is dropped at the end of this iteration).
            watched.extend(
                words
                    .iter()
                    .map(|&(w, low)| Watched::Low(unsafe { &*w }, low)),
            );
            if futex::wait_any(&watched, until) == WaitAny::Unsupported {
                waitv = false;
            }
        } else {
            futex::wait_private(&state.doorbell, ring, wait);
        }
        drop(mapped);
    }
}
