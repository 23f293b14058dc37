//! The connections the threads (and tasks) of one handle share.
//!
//! Synchronous commands take a connection from a small free list and put it back after the
//! command (a pool without a background thread: check-out and check-in are a push and a pop
//! under a mutex held for nanoseconds). Threads that run commands at the same time each get
//! their own connection, so a handle shared by many threads scales like a handle per thread.
//! A connection that failed is dropped, and with it every idle one (after a failover they
//! all point at a server that is gone), so the next command connects afresh: to the same
//! server, to the master the sentinels name now, or through the cluster's slot map. With
//! Sentinel, a connection made before the sentinels announced a switch is dropped when next
//! taken (see `sentinel`).
//!
//! Every command runs within a deadline: its reply (and the connection it needs, and the
//! master lookup that needs) must come by then, or it fails with a timeout. No lock of the
//! handle is held across network I/O.
//!
//! Waiters subscribe to a key's release channel on connections of their own (pub/sub takes
//! a connection over), from a second free list: any number of threads can wait at once.
//!
//! All of it is per process ([`PerProcess`]): a child forked with a handle starts with no
//! connection of its parent's.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis::{Connection, ConnectionLike, RedisResult};

use crate::error::Error;
#[cfg(feature = "tokio")]
use crate::error::HolderSeen;
use crate::lock::wait::instant_after;
use crate::per_process::PerProcess;
#[cfg(feature = "tokio")]
use crate::redis_store::aio::Aio;
#[cfg(feature = "tokio")]
use crate::redis_store::async_wait::Turn;
use crate::redis_store::janitor::{Janitor, Job};
use crate::redis_store::net::{
    self, is_broken, is_interrupted, is_unanswered, Failed, MAX_INTERRUPTS,
};
use crate::redis_store::sentinel;
use crate::redis_store::topology::{self, Req, Shared, SyncConn, Tag, Topology};

/// Idle connections kept per list; more are closed when returned.
const MAX_IDLE: usize = 64;

/// The connections of one handle (and of the handles derived from it with the same
/// command timeout).
pub(crate) struct Pool {
    pub(crate) shared: Arc<Shared>,
    /// The longest one command may take.
    pub(crate) timeout: Duration,
    local: PerProcess<Local>,
}

/// A pool's state in one process.
pub(crate) struct Local {
    idle: Mutex<Vec<(SyncConn, Tag)>>,
    subscribers: Mutex<Vec<(Connection, Tag)>>,
    /// Round robin over a cluster's seed nodes.
    next_node: AtomicUsize,
    janitor: Janitor,
    #[cfg(feature = "tokio")]
    pub(crate) aio: crate::redis_store::aio::Local,
}

impl Local {
    fn new() -> Local {
        Local {
            idle: Mutex::new(Vec::new()),
            subscribers: Mutex::new(Vec::new()),
            next_node: AtomicUsize::new(0),
            janitor: Janitor::new(),
            #[cfg(feature = "tokio")]
            aio: crate::redis_store::aio::Local::new(),
        }
    }
}

/// A reply, with the connection it came on and when the request went out.
pub(crate) struct Ran<T> {
    pub(crate) value: T,
    pub(crate) tag: Tag,
    pub(crate) sent: Instant,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Pool {
    pub(crate) fn new(shared: Arc<Shared>, timeout: Duration) -> Pool {
        Pool {
            shared,
            timeout,
            local: PerProcess::new(),
        }
    }

    /// The same servers with another command timeout and connections of its own.
    pub(crate) fn renew(&self, timeout: Duration) -> Pool {
        Pool::new(self.shared.clone(), timeout)
    }

    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.shared.topology, Topology::Cluster { .. })
    }

    pub(crate) fn local(&self) -> &Local {
        self.local.get(Local::new)
    }

    /// When a command started now must be done: within the command timeout, and by
    /// `deadline` if one is given.
    pub(crate) fn limit(&self, deadline: Option<Instant>) -> Instant {
        let own = instant_after(Instant::now(), self.timeout);
        deadline.map_or(own, |d| d.min(own))
    }

    fn connect(&self, limit: Instant) -> RedisResult<(SyncConn, Tag)> {
        let i = self.local().next_node.fetch_add(1, Ordering::Relaxed);
        self.shared.connect(i, limit, self.timeout)
    }

    /// Connects once, so that a wrong address or password is an error at `open`; reads
    /// the server's clock (a cluster's through a seed node).
    pub(crate) fn check(&self) -> Result<(), Error> {
        let limit = self.limit(None);
        let mut conn = self.connect(limit)?;
        if let (Topology::Single(_), SyncConn::Plain(c)) = (&self.shared.topology, &mut conn.0) {
            let started = Instant::now();
            topology::refuse_cluster_node(c, conn.1.server.as_deref().unwrap_or("the server"))
                .map_err(|e| match &conn.1.server {
                    Some(server) => {
                        net::at_server(e, server, net::allowed(started, limit, self.timeout))
                    }
                    None => e,
                })?;
        }
        self.shared.check_cluster(limit, self.timeout)?;
        self.put_back(conn);
        Ok(())
    }

    fn put_back(&self, conn: (SyncConn, Tag)) {
        let mut idle = lock(&self.local().idle);
        if idle.len() < MAX_IDLE {
            idle.push(conn);
        }
    }

    /// Runs `f` on a connection of the pool, all of it by `limit`; a connection that broke
    /// is dropped with all idle ones, to be made anew by the next command.
    pub(crate) fn run<T>(
        &self,
        limit: Instant,
        f: impl FnOnce(&mut Req<'_>) -> RedisResult<T>,
    ) -> Result<Ran<T>, Failed> {
        let started = Instant::now();
        let before = |e: redis::RedisError| Failed {
            error: e.into(),
            unknown: false,
        };
        if started >= limit {
            // (callers draw the limit just before: it passed while this process was
            // stopped, before anything was asked)
            return Err(before(net::late()));
        }
        let taken = loop {
            let Some((c, tag)) = lock(&self.local().idle).pop() else {
                break None;
            };
            if self.shared.current(&tag) {
                break Some((c, tag));
            }
            // made before the sentinels announced a switch: dropped
        };
        let (mut conn, tag) = match taken {
            Some(c) => c,
            None => self.connect(limit).map_err(before)?,
        };
        let sent = Instant::now();
        match f(&mut Req::new(&mut conn, limit)) {
            Ok(value) => {
                self.put_back((conn, tag.clone()));
                Ok(Ran { value, tag, sent })
            }
            Err(e) => {
                let unknown = is_unanswered(&e);
                let e = match &tag.server {
                    Some(server) => {
                        net::at_server(e, server, net::allowed(started, limit, self.timeout))
                    }
                    // (a cluster's: named by the node, see `cluster`)
                    None => e,
                };
                if is_broken(&e) {
                    drop(conn);
                    lock(&self.local().idle).clear();
                } else {
                    self.put_back((conn, tag));
                }
                Err(Failed {
                    unknown,
                    error: e.into(),
                })
            }
        }
    }

    /// [`run`](Self::run) with the command timeout, once more on a fresh connection if the
    /// first one broke: for commands that are safe to repeat (compare-and-delete,
    /// compare-and-renew).
    pub(crate) fn retrying<T>(
        &self,
        f: impl Fn(&mut Req<'_>) -> RedisResult<T>,
    ) -> Result<Ran<T>, Failed> {
        match self.run_through_stops(&f) {
            Err(Failed {
                error: Error::Redis(e),
                ..
            }) if is_broken(&e) => self.run_through_stops(&f),
            other => other,
        }
    }

    /// [`run`](Self::run) with the command timeout, again (on a fresh connection, with a
    /// fresh timeout) each time a stop and continue of this process cut it (see
    /// [`is_interrupted`]), at most [`MAX_INTERRUPTS`] times: for commands that are safe to
    /// repeat. The timeout bounds the server's answer; a stop of this process, however
    /// long, is not the server's.
    pub(crate) fn run_through_stops<T>(
        &self,
        f: impl Fn(&mut Req<'_>) -> RedisResult<T>,
    ) -> Result<Ran<T>, Failed> {
        let mut cut = 0;
        loop {
            match self.run(self.limit(None), &f) {
                Err(Failed {
                    error: Error::Redis(e),
                    ..
                }) if is_interrupted(&e) && cut < MAX_INTERRUPTS => cut += 1,
                other => return other,
            }
        }
    }

    /// Whether a reply on a connection tagged `tag`, to a request sent at `sent`, comes
    /// from the master now (see `Sentinel::vouch`).
    pub(crate) fn vouch(&self, tag: &Tag, sent: Instant, limit: Instant) -> Result<bool, Error> {
        Ok(self.shared.vouch(tag, sent, limit)?)
    }

    /// A connection for one subscription (taken over by pub/sub until given back).
    pub(crate) fn subscriber(&self, limit: Instant) -> RedisResult<(Connection, Tag)> {
        loop {
            let Some((c, tag)) = lock(&self.local().subscribers).pop() else {
                break;
            };
            if self.shared.current(&tag) {
                return Ok((c, tag));
            }
        }
        if let Topology::Cluster(slots) = &self.shared.topology {
            // (a cluster's PUBLISH reaches every node: one that has not failed lately)
            let node = slots.listener();
            let tag = Tag {
                server: Some(node.addr.clone()),
                ..Tag::default()
            };
            return match net::connect_within(node.info(), limit) {
                Ok(con) => Ok((con, tag)),
                Err(e) => {
                    slots.failed_at(&node.addr);
                    Err(e)
                }
            };
        }
        let i = self.local().next_node.fetch_add(1, Ordering::Relaxed);
        self.shared.plain(i, limit, self.timeout)
    }

    pub(crate) fn put_back_subscriber(&self, conn: Connection, tag: Tag) {
        let mut idle = lock(&self.local().subscribers);
        if idle.len() < MAX_IDLE && conn.is_open() {
            idle.push((conn, tag));
        }
    }

    /// Hands a release or cancel to the handle's janitor thread (see `janitor`).
    pub(crate) fn janitor(&self, job: Job) {
        self.local().janitor.give(&self.shared, self.timeout, job);
    }

    /// Plain connections to every master (one server, the current master, or each master
    /// of the cluster's slot map, read now): each with the address a cluster's master is
    /// at (empty otherwise) and the server's name for errors.
    pub(crate) fn masters(&self) -> Result<Vec<(String, Arc<str>, Connection)>, Error> {
        let limit = self.limit(None);
        let Topology::Cluster(slots) = &self.shared.topology else {
            let (conn, tag) = self.shared.plain(0, limit, self.timeout)?;
            let server = tag.server.unwrap_or_else(|| "the server".into());
            return Ok(vec![(String::new(), server, conn)]);
        };
        let mut out = Vec::new();
        for node in slots.masters(limit, self.timeout)? {
            let (started, limit) = (Instant::now(), self.limit(None));
            let conn = net::connect_within(node.info(), limit).map_err(|e| {
                net::at_server(e, &node.addr, net::allowed(started, limit, self.timeout))
            })?;
            out.push((node.addr.to_string(), node.addr.clone(), conn));
        }
        Ok(out)
    }
}

/// A client for the masters of Sentinel `service`.
pub(crate) fn sentinel_topology(service: &str, sentinels: Vec<redis::ConnectionInfo>) -> Topology {
    Topology::Sentinel(sentinel::Sentinel::new(service.to_string(), sentinels))
}

/// The async connections and waiters of the pool in this process (see `aio` and
/// `async_wait`).
#[cfg(feature = "tokio")]
impl Pool {
    /// The shared async connection, made on first use (by `limit`) in the caller's runtime.
    pub(crate) async fn aio(&self, limit: Instant) -> Result<Aio, Failed> {
        self.local()
            .aio
            .shared_conn(&self.shared, self.timeout, limit)
            .await
    }

    /// An async connection no other task uses until it is given back.
    pub(crate) async fn aio_exclusive(&self, limit: Instant) -> Result<Aio, Failed> {
        self.local()
            .aio
            .exclusive_conn(&self.shared, self.timeout, limit)
            .await
    }

    pub(crate) fn put_back_exclusive(&self, a: Aio) {
        self.local().aio.put_back_exclusive(a);
    }

    /// Forgets the shared async connection after an error that broke it.
    pub(crate) fn aio_failed(&self, a: &Aio, e: &redis::RedisError) {
        self.local().aio.failed(a, e);
    }

    /// A place at the back of the queue of async waiters on `channel` (see
    /// `Listeners::turn`).
    pub(crate) fn turn(&self, channel: &[u8], passes_on: bool) -> Turn {
        self.local().aio.listeners.turn(channel, passes_on)
    }

    /// Notes the holder an attempt on `channel`'s key saw (see `async_wait`).
    pub(crate) fn saw(&self, channel: &[u8], seen: &(HolderSeen, Instant)) {
        self.local().aio.listeners.saw(channel, seen)
    }

    /// The holder the last attempt of this process on `channel`'s key saw.
    pub(crate) fn last_seen(&self, channel: &[u8]) -> Option<(HolderSeen, Instant)> {
        self.local().aio.listeners.last_seen(channel)
    }

    /// Makes sure the process listens on `channel` (see `async_wait`).
    pub(crate) async fn listen_on(&self, channel: &[u8], limit: Instant) -> RedisResult<()> {
        self.local()
            .aio
            .listeners
            .listen_on(&self.shared, channel, limit, self.timeout)
            .await
    }
}
