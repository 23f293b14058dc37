//! Async connections (feature `tokio`): one multiplexed connection that the tasks of a
//! process share (redis-rs's, or its async cluster connection), and exclusive ones for
//! attempts that must `WAIT` for replicas (Redis answers one connection's requests in
//! order, so a `WAIT` on the shared one would hold up every other task's commands).
//!
//! A connection's requests are driven by a task on the runtime that made it: a runtime that
//! is not being driven (a current-thread runtime between two `block_on`s) would stall every
//! other runtime's requests on it. So each runtime that uses a handle gets connections of
//! its own. When a runtime shuts down its connections are dead, though their handles look
//! alive: a canary task spawned beside each marks it dead when the runtime drops it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::{Client, RedisResult};

use crate::redis_store::cluster::ClusterAio;
use crate::redis_store::net::{bounded, is_broken, left, timed_out, Failed};
use crate::redis_store::server_clock;
use crate::redis_store::topology::{Shared, Tag, Topology};

/// The async connection of a handle: redis-rs's multiplexed connection (many tasks share
/// one socket, requests pipelined), or one to each master of a cluster (see `cluster`).
#[derive(Clone)]
pub(crate) enum AsyncConn {
    Plain(redis::aio::MultiplexedConnection),
    Cluster(ClusterAio),
}

impl redis::aio::ConnectionLike for AsyncConn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            AsyncConn::Plain(c) => c.req_packed_command(cmd),
            AsyncConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            AsyncConn::Plain(c) => c.req_packed_commands(pipeline, offset, count),
            AsyncConn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            AsyncConn::Plain(c) => c.get_db(),
            AsyncConn::Cluster(c) => c.get_db(),
        }
    }
}

/// An async connection, where it leads, the runtime that drives it, and whether that
/// runtime still runs.
#[derive(Clone)]
pub(crate) struct Aio {
    pub(crate) conn: AsyncConn,
    pub(crate) tag: Tag,
    runtime: tokio::runtime::Id,
    alive: Arc<AtomicBool>,
}

impl Aio {
    /// The server a request on this connection went to, for errors to name: the
    /// connection's, or on a cluster the master of this clone's last request.
    pub(crate) fn server(&self) -> Option<Arc<str>> {
        match &self.conn {
            AsyncConn::Cluster(c) => c.sending(),
            AsyncConn::Plain(_) => self.tag.server.clone(),
        }
    }
}

/// Marks its connection dead when dropped: with its runtime, which drops every task.
struct Canary(Arc<AtomicBool>);

impl Drop for Canary {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// A pool's async connections in one process.
pub(crate) struct Local {
    /// The shared connection of each runtime.
    shared: Mutex<Vec<Aio>>,
    exclusive: Mutex<Vec<Aio>>,
    /// The pub/sub listener that wakes waiting tasks (see `async_wait`).
    pub(crate) listeners: crate::redis_store::async_wait::Listeners,
}

impl Local {
    pub(crate) fn new() -> Local {
        Local {
            shared: Mutex::new(Vec::new()),
            exclusive: Mutex::new(Vec::new()),
            listeners: crate::redis_store::async_wait::Listeners::new(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Idle exclusive connections kept.
const MAX_IDLE: usize = 16;

impl Local {
    /// Alive, to the current master, and driven by the caller's runtime.
    fn usable(shared: &Shared, a: &Aio, runtime: tokio::runtime::Id) -> bool {
        a.runtime == runtime && a.alive.load(Ordering::Acquire) && shared.current(&a.tag)
    }

    /// The shared async connection, made on first use (by `limit`) inside the caller's
    /// runtime. Its response timeout is the handle's command timeout, not redis-rs's
    /// 500 ms default.
    pub(crate) async fn shared_conn(
        &self,
        shared: &Arc<Shared>,
        timeout: Duration,
        limit: Instant,
    ) -> Result<Aio, Failed> {
        let runtime = crate::redis_store::async_wait::this_runtime();
        let find = |all: &[Aio]| {
            all.iter()
                .find(|a| Self::usable(shared, a, runtime))
                .cloned()
        };
        if let Some(a) = find(&lock(&self.shared)) {
            return Ok(a);
        }
        // Made without the lock: a connect that stalls stalls only this task.
        let made = connect(shared, timeout, limit).await.map_err(not_sent)?;
        let mut all = lock(&self.shared);
        match find(&all) {
            Some(other) => Ok(other), // another task was quicker
            None => {
                // those of runtimes that ended, or to a master replaced, go
                all.retain(|a| a.alive.load(Ordering::Acquire) && shared.current(&a.tag));
                all.retain(|a| a.runtime != runtime);
                all.push(made.clone());
                Ok(made)
            }
        }
    }

    /// A connection no other task uses until it is given back.
    pub(crate) async fn exclusive_conn(
        &self,
        shared: &Arc<Shared>,
        timeout: Duration,
        limit: Instant,
    ) -> Result<Aio, Failed> {
        let runtime = crate::redis_store::async_wait::this_runtime();
        let found = {
            let mut idle = lock(&self.exclusive);
            idle.retain(|a| a.alive.load(Ordering::Acquire) && shared.current(&a.tag));
            let at = idle.iter().rposition(|a| a.runtime == runtime);
            at.map(|i| idle.swap_remove(i))
        };
        match found {
            Some(a) => Ok(a),
            None => connect(shared, timeout, limit).await.map_err(not_sent),
        }
    }

    pub(crate) fn put_back_exclusive(&self, a: Aio) {
        let mut idle = lock(&self.exclusive);
        if idle.len() < MAX_IDLE {
            idle.push(a);
        }
    }

    /// Forgets the shared connection after an error that broke it.
    pub(crate) fn failed(&self, a: &Aio, e: &redis::RedisError) {
        if is_broken(e) {
            if let AsyncConn::Cluster(c) = &a.conn {
                // (only the connection to the failed request's master goes; a request cut
                // off by its deadline did not say so itself)
                c.node_failed();
                return;
            }
            a.alive.store(false, Ordering::Release);
            lock(&self.shared).retain(|s| !Arc::ptr_eq(&s.alive, &a.alive));
        }
    }
}

/// A new async connection, made within `limit` in the caller's runtime.
async fn connect(shared: &Arc<Shared>, timeout: Duration, limit: Instant) -> RedisResult<Aio> {
    let begun = Instant::now();
    let wait = left(limit).ok_or_else(timed_out)?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(wait))
        .set_response_timeout(Some(timeout));
    let (conn, tag) = match &shared.topology {
        Topology::Single(client) => {
            let server = client.get_connection_info().addr().to_string();
            let started = Instant::now();
            let c = bounded(
                limit,
                client.get_multiplexed_async_connection_with_config(&config),
            )
            .await
            .map_err(|e| {
                crate::redis_store::net::at_server(
                    e,
                    &server,
                    crate::redis_store::net::allowed(started, limit, timeout),
                )
            })?;
            // (the server named by the errors of its requests, as on a plain connection)
            let tag = Tag {
                server: Some(server.into()),
                ..Tag::default()
            };
            (AsyncConn::Plain(c), tag)
        }
        Topology::Sentinel(_) => {
            // Asking the sentinels is a few blocking round trips, made only when
            // (re)connecting: on the blocking pool, not on a runtime thread.
            let shared = shared.clone();
            let located = tokio::task::spawn_blocking(move || match &shared.topology {
                Topology::Sentinel(s) => s.locate(limit, timeout),
                _ => unreachable!("a sentinel topology"),
            })
            .await
            .map_err(|e| redis::RedisError::from(std::io::Error::other(e)))??;
            let (info, epoch, addr) = located;
            let client = Client::open(info)?;
            let started = Instant::now();
            let c = bounded(
                limit,
                client.get_multiplexed_async_connection_with_config(&config),
            )
            .await
            .map_err(|e| {
                crate::redis_store::net::at_server(
                    e,
                    &crate::redis_store::sentinel::server_name(&addr),
                    crate::redis_store::net::allowed(started, limit, timeout),
                )
            })?;
            (
                AsyncConn::Plain(c),
                Tag {
                    epoch,
                    server: Some(crate::redis_store::sentinel::server_name(&addr).into()),
                    addr: Some(addr),
                },
            )
        }
        // (connections to its masters are made when a request needs them)
        Topology::Cluster(slots) => (
            AsyncConn::Cluster(ClusterAio::new(slots.clone(), timeout)),
            Tag::default(),
        ),
    };
    let alive = Arc::new(AtomicBool::new(true));
    let canary = Canary(alive.clone());
    tokio::spawn(async move {
        let _canary = canary;
        std::future::pending::<()>().await;
    });
    let mut a = Aio {
        conn,
        tag,
        runtime: crate::redis_store::async_wait::this_runtime(),
        alive,
    };
    if let AsyncConn::Plain(_) = a.conn {
        // (named as the requests' errors are: a server that accepts connections and
        // answers nothing, or paused by `CLIENT PAUSE`, said "the deadline passed")
        let time: (String, String) = bounded(limit, redis::cmd("TIME").query_async(&mut a.conn))
            .await
            .map_err(|e| match &a.tag.server {
                Some(server) => crate::redis_store::net::at_server(
                    e,
                    server,
                    crate::redis_store::net::allowed(begun, limit, timeout),
                ),
                None => e,
            })?;
        if let Some(us) = server_clock::server_us(&time.0, &time.1) {
            shared.clock.observe(us, Instant::now());
        }
    }
    Ok(a)
}

fn not_sent(e: redis::RedisError) -> Failed {
    Failed {
        error: e.into(),
        unknown: false,
    }
}
