//! Async waiters on Redis, woken by the release channel (feature `tokio`).
//!
//! The tasks of a process waiting for one key form a queue, kept per handle and process,
//! first come first: a task joins it when its first attempt finds the key held (or, if
//! others of the process already wait for the key, before trying at all: a newcomer does
//! not take the key from under them). One pub/sub connection per handle, process and
//! runtime (a connection is driven by the runtime that made it, and one that is idle or
//! gone would hear nothing for the others; made again when the master changes) carries the
//! subscriptions; a dispatcher task reads its messages, and a release's message wakes the
//! first task of the key's queue only: no herd, and the key goes round in the order the
//! tasks asked for it. (Tasks of two runtimes waiting for one key are both subscribed: a
//! release wakes the first two.) A task woken that is dropped before its attempt hands its
//! wake-up to the next; one that is kept but not polled keeps its turn for
//! `STUCK` (20 ms) only, after which the next task tries at the
//! end of its step. A task's step (resty's schedule) still bounds each sleep, as a lease
//! that lapses sends no message; then only the first of the queue tries. When a runtime
//! ends, its dispatcher wakes every waiting task: they try, and listen anew in their own.
//!
//! Channels are subscribed to when a task first waits on them, and unsubscribed once a
//! message comes for a channel nobody waits on (or when idle ones pile up).

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use redis::aio::PubSubSink;
use redis::{Client, RedisResult};

use crate::error::HolderSeen;
use crate::lock::backend::{Waiter, STUCK};
use crate::redis_store::net::bounded;
use crate::redis_store::topology::{Shared, Tag, Topology};

/// The runtime the caller runs in (each has connections and a listener of its own).
pub(crate) fn this_runtime() -> tokio::runtime::Id {
    tokio::runtime::Handle::current().id()
}

/// A pool's queues and pub/sub connections in one process.
pub(crate) struct Listeners {
    queues: Arc<Mutex<Queues>>,
    /// Each runtime's pub/sub connection, made by one of its tasks at a time.
    conns: Mutex<HashMap<tokio::runtime::Id, Arc<ConnSlot>>>,
}

type ConnSlot = tokio::sync::Mutex<Option<Conn>>;

impl Listeners {
    pub(crate) fn new() -> Listeners {
        Listeners {
            queues: Arc::new(Mutex::new(Queues::default())),
            conns: Mutex::new(HashMap::new()),
        }
    }

    /// The caller's runtime's connection slot (those of runtimes that ended go).
    fn slot(&self) -> Arc<ConnSlot> {
        let runtime = this_runtime();
        let mut conns = lock(&self.conns);
        if let Some(slot) = conns.get(&runtime) {
            return slot.clone();
        }
        conns.retain(|_, slot| {
            slot.try_lock().map_or(true, |c| {
                c.as_ref().is_some_and(|c| c.alive.load(Ordering::Acquire))
            })
        });
        conns.entry(runtime).or_default().clone()
    }
}

/// One pub/sub connection: its sink, where it leads, whether its dispatcher task runs,
/// and what it is subscribed to.
struct Conn {
    sink: PubSubSink,
    tag: Tag,
    /// The cluster node it is made to (see `Slots::listener`).
    node: Option<Arc<str>>,
    alive: Arc<AtomicBool>,
    subscribed: HashSet<Vec<u8>>,
}

#[derive(Default)]
struct Queues {
    waiting: HashMap<Vec<u8>, VecDeque<Waiter>>,
    /// The holder the last attempt on a waited-for key saw (for the timeouts of the tasks
    /// behind it, which do not ask the server themselves).
    seen: HashMap<Vec<u8>, (HolderSeen, Instant)>,
    next_id: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Marks its connection dead when dropped, with its dispatcher task (the connection ended,
/// or its runtime is shutting down), and wakes every waiting task: they try the key and
/// listen anew, in their own runtime.
struct Canary {
    alive: Arc<AtomicBool>,
    queues: Arc<Mutex<Queues>>,
}

impl Drop for Canary {
    fn drop(&mut self) {
        self.alive.store(false, Ordering::Release);
        let mut q = lock(&self.queues);
        for entries in q.waiting.values_mut() {
            for e in entries.iter_mut() {
                e.wake(Instant::now());
            }
        }
    }
}

/// Subscribed channels nobody waits on, beyond which they are unsubscribed at once.
const IDLE_CHANNELS: usize = 64;

impl Listeners {
    /// Joins the back of `channel`'s queue. A waiter that `passes_on` (a shared one:
    /// those behind it may get in beside it) hands a wake-up it got on to the next waiter
    /// when it takes the key too.
    pub(crate) fn turn(&self, channel: &[u8], passes_on: bool) -> Turn {
        let queues = &self.queues;
        let id = {
            let mut q = lock(queues);
            let id = q.next_id;
            q.next_id += 1;
            q.waiting
                .entry(channel.to_vec())
                .or_default()
                .push_back(Waiter {
                    id,
                    waker: None,
                    woken: None,
                });
            id
        };
        Turn {
            queues: queues.clone(),
            channel: channel.to_vec(),
            id,
            attempted: false,
            passes_on,
        }
    }

    /// Notes the holder an attempt on `channel`'s key saw, while tasks wait for it.
    pub(crate) fn saw(&self, channel: &[u8], seen: &(HolderSeen, Instant)) {
        let mut q = lock(&self.queues);
        if q.waiting.contains_key(channel) {
            q.seen.insert(channel.to_vec(), seen.clone());
        }
    }

    /// The holder the last attempt on `channel`'s key saw, if tasks still wait for it.
    pub(crate) fn last_seen(&self, channel: &[u8]) -> Option<(HolderSeen, Instant)> {
        lock(&self.queues).seen.get(channel).cloned()
    }

    /// Makes sure the process listens on `channel`: a live pub/sub connection to the
    /// current master (made within `limit` if there is none) subscribed to it.
    pub(crate) async fn listen_on(
        &self,
        shared: &Arc<Shared>,
        channel: &[u8],
        limit: Instant,
        timeout: Duration,
    ) -> RedisResult<()> {
        let listeners = self;
        let slot = self.slot();
        let mut conn = bounded(limit, async { Ok(slot.lock().await) }).await?;
        let fresh = conn
            .as_ref()
            .is_some_and(|c| c.alive.load(Ordering::Acquire) && shared.current(&c.tag));
        if !fresh {
            *conn = None;
            *conn = Some(self.connect(shared, limit, timeout).await?);
        }
        let c = conn.as_mut().expect("made above");
        if c.subscribed.contains(channel) {
            return Ok(());
        }
        // channels nobody waits on any more, past a few, go first
        if c.subscribed.len() > IDLE_CHANNELS {
            let idle: Vec<Vec<u8>> = {
                let q = lock(&listeners.queues);
                c.subscribed
                    .iter()
                    .filter(|ch| !q.waiting.contains_key(*ch))
                    .cloned()
                    .collect()
            };
            if bounded(limit, c.sink.unsubscribe(&idle)).await.is_ok() {
                for ch in &idle {
                    c.subscribed.remove(ch);
                }
            }
        }
        if let Err(e) = bounded(limit, c.sink.subscribe(channel)).await {
            // a cluster node that did not let this subscribe (stopped, gone) is left for
            // another the next time
            if c.node.is_some() {
                shared.cluster_node_failed(c.node.as_ref());
                *conn = None;
            }
            return Err(e);
        }
        c.subscribed.insert(channel.to_vec());
        Ok(())
    }

    async fn connect(
        &self,
        shared: &Arc<Shared>,
        limit: Instant,
        timeout: Duration,
    ) -> RedisResult<Conn> {
        let mut node = None;
        let (client, tag) = match &shared.topology {
            Topology::Single(c) => (c.clone(), Tag::default()),
            Topology::Cluster(slots) => {
                // a cluster's PUBLISH reaches every node: one that has not failed lately
                let listener = slots.listener();
                node = Some(listener.addr.clone());
                (Client::open(listener.info().clone())?, Tag::default())
            }
            Topology::Sentinel(_) => {
                let shared = shared.clone();
                let located = tokio::task::spawn_blocking(move || match &shared.topology {
                    Topology::Sentinel(s) => s.locate(limit, timeout),
                    _ => unreachable!("a sentinel topology"),
                })
                .await
                .map_err(|e| redis::RedisError::from(std::io::Error::other(e)))??;
                let (info, epoch, addr) = located;
                (
                    Client::open(info)?,
                    Tag {
                        epoch,
                        addr: Some(addr),
                        ..Tag::default()
                    },
                )
            }
        };
        let pubsub = bounded(limit, client.get_async_pubsub())
            .await
            .inspect_err(|_| shared.cluster_node_failed(node.as_ref()))?;
        let (sink, stream) = pubsub.split();
        let alive = Arc::new(AtomicBool::new(true));
        let canary = Canary {
            alive: alive.clone(),
            queues: self.queues.clone(),
        };
        tokio::spawn(dispatch(stream, self.queues.clone(), canary));
        Ok(Conn {
            sink,
            tag,
            node,
            alive,
            subscribed: HashSet::new(),
        })
    }
}

/// The dispatcher task: wakes the first task waiting on each channel that a message comes
/// for; when the connection ends (or the runtime drops the task), its canary wakes them
/// all.
async fn dispatch(stream: redis::aio::PubSubStream, queues: Arc<Mutex<Queues>>, _canary: Canary) {
    let mut stream = Box::pin(stream);
    while let Some(msg) =
        std::future::poll_fn(|cx| futures_core::Stream::poll_next(stream.as_mut(), cx)).await
    {
        let Ok(channel) = msg.get_channel::<Vec<u8>>() else {
            continue;
        };
        wake_next_watched(&queues, &channel);
    }
}

/// Wakes the first task of a queue that is not woken yet. Returns it and when.
fn wake_next(entries: &mut VecDeque<Waiter>) -> Option<(u64, Instant)> {
    let e = entries.iter_mut().find(|e| !e.woken())?;
    e.wake(Instant::now());
    Some((e.id, e.woken?))
}

/// Wakes the first task of `channel`'s queue that is not woken yet, and, if it is not
/// polled within `STUCK` (its attempt not made: its `woken` unchanged), the next one.
fn wake_next_watched(queues: &Arc<Mutex<Queues>>, channel: &[u8]) {
    let woke = lock(queues).waiting.get_mut(channel).and_then(wake_next);
    let (Some((id, at)), Ok(rt)) = (woke, tokio::runtime::Handle::try_current()) else {
        return;
    };
    let (queues, channel) = (queues.clone(), channel.to_vec());
    rt.spawn(async move {
        tokio::time::sleep(STUCK).await;
        let stuck = lock(&queues)
            .waiting
            .get(&channel)
            .is_some_and(|entries| entries.iter().any(|e| e.id == id && e.woken == Some(at)));
        if stuck {
            wake_next_watched(&queues, &channel);
        }
    });
}

/// A task's place in a key's queue: ready when a release wakes it. Kept from sleep to
/// sleep ([`again`](Turn::again)) and left with [`attempted`](Turn::attempted) when the
/// wait ends; dropped otherwise (the task was cancelled) after being woken, it hands the
/// wake-up to the next task.
pub(crate) struct Turn {
    queues: Arc<Mutex<Queues>>,
    channel: Vec<u8>,
    id: u64,
    attempted: bool,
    passes_on: bool,
}

impl Turn {
    /// Leaves the queue at the end of the wait. A waiter that passes on wakes the next
    /// one as it goes, whether a message woke it or a lapse did (no message comes then).
    pub(crate) fn attempted(mut self) {
        self.attempted = !self.passes_on;
    }

    /// Waits again in the same place.
    pub(crate) fn again(&mut self) {
        let mut q = lock(&self.queues);
        if let Some(e) = q
            .waiting
            .get_mut(&self.channel)
            .and_then(|entries| entries.iter_mut().find(|e| e.id == self.id))
        {
            e.woken = None;
        }
    }

    /// Whether no task of this process waits for the key before this one (but tasks
    /// woken and not polled for `STUCK`).
    pub(crate) fn is_first(&self) -> bool {
        let now = Instant::now();
        let q = lock(&self.queues);
        q.waiting
            .get(&self.channel)
            .and_then(|entries| entries.iter().find(|e| !e.stuck(now)))
            .is_none_or(|e| e.id == self.id)
    }
}

impl Future for Turn {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut q = lock(&self.queues);
        let entry = q
            .waiting
            .get_mut(&self.channel)
            .and_then(|entries| entries.iter_mut().find(|e| e.id == self.id));
        match entry {
            Some(e) if !e.woken() => {
                e.waker = Some(cx.waker().clone());
                Poll::Pending
            }
            _ => Poll::Ready(()),
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut q = lock(&self.queues);
        let Some(entries) = q.waiting.get_mut(&self.channel) else {
            return;
        };
        let Some(at) = entries.iter().position(|e| e.id == self.id) else {
            return;
        };
        let was_woken = entries[at].woken();
        entries.remove(at);
        if entries.is_empty() {
            q.waiting.remove(&self.channel);
            q.seen.remove(&self.channel);
        } else if (was_woken || self.passes_on) && !self.attempted {
            drop(q);
            wake_next_watched(&self.queues, &self.channel);
        }
    }
}

impl crate::lock::backend::Place for Turn {
    fn attempted(self) {
        Turn::attempted(self);
    }
}
