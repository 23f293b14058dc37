//! Where commands go: one server, the master a Sentinel names, or a Cluster; and the
//! connections to it that the threads (and tasks) of one handle share.
//!
//! Synchronous commands take a connection from a small free list and put it back after the
//! command (a pool without a background thread: check-out and check-in are a push and a pop
//! under a mutex held for nanoseconds). Threads that run commands at the same time each get
//! their own connection, so a handle shared by many threads scales like a handle per thread.
//! A connection that failed is dropped, and with it every idle one (after a failover they
//! all point at a server that is gone), so the next command connects afresh: to the same
//! server, to the master the sentinels name now, or through the cluster's slot map.
//!
//! Waiters subscribe to a key's release channel on connections of their own (pub/sub takes
//! a connection over), from a second free list: any number of threads can wait at once.
//!
//! Async commands (feature `tokio`) share one multiplexed connection (or one async cluster
//! connection), made on first use inside the runtime and made again after an error.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use redis::cluster::ClusterClient;
use redis::sentinel::{SentinelClient, SentinelServerType};
use redis::{Client, Connection, ConnectionAddr, ConnectionInfo, ConnectionLike, RedisResult};

use crate::error::Error;

/// A synchronous connection of any topology.
pub(crate) type SyncConn = Box<dyn ConnectionLike + Send>;

/// Idle connections kept per list; more are closed when returned.
const MAX_IDLE: usize = 64;

/// What a handle connects to.
pub(crate) enum Topology {
    /// One server (also a replica set whose master never changes).
    Single(Client),
    /// The master of `sentinel`'s service, asked for again whenever a connection breaks.
    Sentinel(Mutex<SentinelClient>),
    /// A Redis Cluster: commands go to the master of the key's slot; `nodes` are the seed
    /// addresses (for pub/sub and for finding every master).
    Cluster {
        client: ClusterClient,
        nodes: Vec<ConnectionInfo>,
    },
}

impl Topology {
    /// A client for one plain server: the server itself, the master the sentinels name
    /// now, or seed node `i` of the cluster (callers rotate `i`, so a dead seed is
    /// skipped next time).
    fn plain_client(&self, i: usize) -> RedisResult<Client> {
        match self {
            Topology::Single(c) => Ok(c.clone()),
            Topology::Sentinel(s) => lock(s).get_client(),
            Topology::Cluster { nodes, .. } => Client::open(nodes[i % nodes.len()].clone()),
        }
    }
}

/// The connections of one handle (and of its clones).
pub(crate) struct Pool {
    pub(crate) topology: Arc<Topology>,
    pub(crate) timeout: Duration,
    idle: Mutex<Vec<SyncConn>>,
    subscribers: Mutex<Vec<Connection>>,
    /// Round robin over the seed nodes for subscriber connections (cluster).
    next_node: std::sync::atomic::AtomicUsize,
    #[cfg(feature = "tokio")]
    aio: tokio::sync::Mutex<Option<AsyncConn>>,
}

/// Whether an error means the connection (and probably the server behind it) is unusable:
/// I/O trouble, a timeout, or a server that is no longer (or not yet) a writable master.
pub(crate) fn is_broken(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_timeout()
        || e.is_connection_refusal()
        || matches!(e.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Pool {
    pub(crate) fn new(topology: Arc<Topology>, timeout: Duration) -> Pool {
        Pool {
            topology,
            timeout,
            idle: Mutex::new(Vec::new()),
            subscribers: Mutex::new(Vec::new()),
            next_node: std::sync::atomic::AtomicUsize::new(0),
            #[cfg(feature = "tokio")]
            aio: tokio::sync::Mutex::new(None),
        }
    }

    /// The same topology with empty connection lists (a handle with another prefix or
    /// timeout).
    pub(crate) fn renew(&self, timeout: Duration) -> Pool {
        Pool::new(self.topology.clone(), timeout)
    }

    fn plain_connection(&self) -> RedisResult<Connection> {
        let i = self
            .next_node
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let c = self
            .topology
            .plain_client(i)?
            .get_connection_with_timeout(self.timeout)?;
        c.set_read_timeout(Some(self.timeout))?;
        c.set_write_timeout(Some(self.timeout))?;
        Ok(c)
    }

    fn connect(&self) -> RedisResult<SyncConn> {
        match &*self.topology {
            Topology::Cluster { client, .. } => {
                let config = redis::cluster::ClusterConfig::new()
                    .set_connection_timeout(self.timeout)
                    .set_response_timeout(self.timeout);
                Ok(Box::new(client.get_connection_with_config(config)?))
            }
            _ => Ok(Box::new(self.plain_connection()?)),
        }
    }

    /// Connects once, so that a wrong address or password is an error at `open`.
    pub(crate) fn check(&self) -> Result<(), Error> {
        let conn = self.connect()?;
        self.put_back(conn);
        Ok(())
    }

    fn put_back(&self, conn: SyncConn) {
        let mut idle = lock(&self.idle);
        if idle.len() < MAX_IDLE {
            idle.push(conn);
        }
    }

    /// Runs `f` on a connection of the pool; a connection that broke is dropped with all
    /// idle ones, to be made anew by the next command.
    pub(crate) fn run<T>(
        &self,
        f: impl FnOnce(&mut dyn ConnectionLike) -> RedisResult<T>,
    ) -> Result<T, Error> {
        let taken = lock(&self.idle).pop();
        let mut conn = match taken {
            Some(c) => c,
            None => self.connect()?,
        };
        let result = f(&mut *conn);
        match &result {
            Err(e) if is_broken(e) => {
                drop(conn);
                lock(&self.idle).clear();
            }
            _ => self.put_back(conn),
        }
        Ok(result?)
    }

    /// [`run`](Self::run), once more on a fresh connection if the first one broke: for
    /// commands that are safe to repeat (compare-and-delete, compare-and-renew).
    pub(crate) fn retrying<T>(
        &self,
        f: impl Fn(&mut dyn ConnectionLike) -> RedisResult<T>,
    ) -> Result<T, Error> {
        match self.run(&f) {
            Err(Error::Redis(e)) if is_broken(&e) => self.run(&f),
            other => other,
        }
    }

    /// A connection for one subscription (taken over by pub/sub until given back).
    pub(crate) fn subscriber(&self) -> RedisResult<Connection> {
        let taken = lock(&self.subscribers).pop();
        match taken {
            Some(c) => Ok(c),
            None => self.plain_connection(),
        }
    }

    pub(crate) fn put_back_subscriber(&self, conn: Connection) {
        let mut idle = lock(&self.subscribers);
        if idle.len() < MAX_IDLE && conn.is_open() {
            idle.push(conn);
        }
    }

    /// Plain connections to every master (one server, the current master, or each master
    /// of the cluster as `CLUSTER NODES` lists them), with the address each one is at.
    pub(crate) fn masters(&self) -> Result<Vec<(String, Connection)>, Error> {
        let Topology::Cluster { nodes, .. } = &*self.topology else {
            let conn = self.plain_connection()?;
            return Ok(vec![(String::new(), conn)]);
        };
        let mut last = None;
        for seed in nodes {
            let listing: RedisResult<String> = Client::open(seed.clone())
                .and_then(|c| c.get_connection_with_timeout(self.timeout))
                .and_then(|mut c| {
                    c.set_read_timeout(Some(self.timeout))?;
                    redis::cmd("CLUSTER").arg("NODES").query(&mut c)
                });
            match listing {
                Ok(listing) => {
                    let mut out = Vec::new();
                    for (host, port) in cluster_masters(&listing) {
                        let info = with_addr(seed, &host, port);
                        let conn = Client::open(info)?.get_connection_with_timeout(self.timeout)?;
                        conn.set_read_timeout(Some(self.timeout))?;
                        out.push((format!("{host}:{port}"), conn));
                    }
                    return Ok(out);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.map_or(
            Error::InvalidOptions("a cluster needs a node"),
            Error::Redis,
        ))
    }
}

/// The masters in a `CLUSTER NODES` listing that are up and serve slots: their address.
fn cluster_masters(listing: &str) -> Vec<(String, u16)> {
    let mut out = Vec::new();
    for line in listing.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        if fields.len() < 8 {
            continue;
        }
        let flags = fields[2];
        if !flags.split(',').any(|f| f == "master") || flags.contains("fail") {
            continue;
        }
        // ip:port@cport[,hostname]
        let addr = fields[1].split(['@', ',']).next().unwrap_or("");
        let Some((host, port)) = addr.rsplit_once(':') else {
            continue;
        };
        if let Ok(port) = port.parse() {
            out.push((host.to_string(), port));
        }
    }
    out
}

/// `seed`'s settings (password, TLS, database) for another address.
fn with_addr(seed: &ConnectionInfo, host: &str, port: u16) -> ConnectionInfo {
    let addr = match seed.addr() {
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host: host.to_string(),
            port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => ConnectionAddr::Tcp(host.to_string(), port),
    };
    seed.clone().set_addr(addr)
}

/// A Sentinel client for the master of `service`, with the masters' connection settings
/// (password, database, TLS) taken from the first sentinel URL's.
pub(crate) fn sentinel_client(
    service: &str,
    sentinels: Vec<ConnectionInfo>,
) -> RedisResult<SentinelClient> {
    let node = sentinels.first().map(|first| {
        let redis = first.redis_settings().clone();
        let mut node =
            redis::sentinel::SentinelNodeConnectionInfo::default().set_redis_connection_info(redis);
        if let ConnectionAddr::TcpTls { insecure, .. } = first.addr() {
            node = node.set_tls_mode(if *insecure {
                redis::TlsMode::Insecure
            } else {
                redis::TlsMode::Secure
            });
        }
        node
    });
    // redis-rs takes a String here without TLS, `impl AsRef<str>` with it
    #[allow(clippy::unnecessary_to_owned)]
    SentinelClient::build(
        sentinels,
        service.to_string(),
        node,
        SentinelServerType::Master,
    )
}

/// The async connection of a handle: redis-rs's multiplexed connection (many tasks share
/// one socket, requests pipelined), or its async cluster connection.
#[cfg(feature = "tokio")]
#[derive(Clone)]
pub(crate) enum AsyncConn {
    Plain(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

#[cfg(feature = "tokio")]
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

#[cfg(feature = "tokio")]
impl Pool {
    /// The shared async connection, made on first use (inside the caller's runtime). Its
    /// response timeout is the handle's command timeout, not redis-rs's 500 ms default:
    /// with replicas required a `WAIT` may take that long.
    pub(crate) async fn aio(&self) -> Result<AsyncConn, Error> {
        let mut slot = self.aio.lock().await;
        if let Some(c) = &*slot {
            return Ok(c.clone());
        }
        let conn = match &*self.topology {
            Topology::Cluster { client, .. } => {
                let config = redis::cluster::ClusterConfig::new()
                    .set_connection_timeout(self.timeout)
                    .set_response_timeout(self.timeout);
                AsyncConn::Cluster(client.get_async_connection_with_config(config).await?)
            }
            Topology::Single(client) => AsyncConn::Plain(self.multiplexed(client).await?),
            Topology::Sentinel(_) => {
                // Asking the sentinels is a few blocking round trips, made only when
                // (re)connecting: on the blocking pool, not on a runtime thread.
                let topology = self.topology.clone();
                let client = tokio::task::spawn_blocking(move || topology.plain_client(0))
                    .await
                    .map_err(|e| redis::RedisError::from(std::io::Error::other(e)))??;
                AsyncConn::Plain(self.multiplexed(&client).await?)
            }
        };
        *slot = Some(conn.clone());
        Ok(conn)
    }

    async fn multiplexed(&self, client: &Client) -> RedisResult<redis::aio::MultiplexedConnection> {
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout));
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
    }

    /// Forgets the async connection after an error that broke it.
    pub(crate) async fn aio_failed(&self, e: &redis::RedisError) {
        if is_broken(e) {
            *self.aio.lock().await = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_nodes_listing_gives_the_live_masters() {
        let listing = "\
07c3 127.0.0.1:30004@40004 slave e7d1 0 1426238317239 4 connected
67ed 127.0.0.1:30002@40002 master - 0 1426238316232 2 connected 5461-10922
292f 127.0.0.1:30003@40003,node-3.example master - 0 1426238318243 3 connected 10923-16383
e7d1 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460
dead 127.0.0.1:30009@40009 master,fail - 0 0 1 disconnected
";
        assert_eq!(
            cluster_masters(listing),
            vec![
                ("127.0.0.1".to_string(), 30002),
                ("127.0.0.1".to_string(), 30003),
                ("127.0.0.1".to_string(), 30001)
            ]
        );
        assert!(cluster_masters("garbage\n\n").is_empty());
    }
}
