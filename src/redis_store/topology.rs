//! Where commands go: one server, the master a Sentinel names, or a Cluster; and making a
//! connection there within a deadline.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{Client, Connection, ConnectionInfo, RedisResult};

use crate::redis_store::cluster::{NodeConns, Slots};
use crate::redis_store::net::{self, left};
use crate::redis_store::scripts::Call;
use crate::redis_store::sentinel::{Addr, Sentinel};
use crate::redis_store::server_clock::{self, ServerClock};

/// What a handle connects to.
pub(crate) enum Topology {
    /// One server (also a replica set whose master never changes).
    Single(Client),
    /// The master the sentinels name, followed through failovers.
    Sentinel(Sentinel),
    /// A Redis Cluster: commands go to the master of the key's slot (see `cluster`); its
    /// seed addresses serve pub/sub and finding every master.
    Cluster(Arc<Slots>),
}

/// What every handle made from one `open` shares: where to connect, and the bound on the
/// servers' clock.
pub(crate) struct Shared {
    pub(crate) topology: Topology,
    pub(crate) clock: ServerClock,
}

/// Which server a connection reaches and, with Sentinel, the epoch it was made in (see
/// `sentinel`): a reply on a connection of an older epoch grants nothing.
#[derive(Clone, Debug, Default)]
pub(crate) struct Tag {
    pub(crate) epoch: u64,
    pub(crate) addr: Option<Addr>,
    /// The server's `host:port`, for errors to name (`None`: a cluster connection).
    pub(crate) server: Option<Arc<str>>,
}

/// A synchronous connection of any topology.
pub(crate) enum SyncConn {
    Plain(Connection),
    /// A connection to each master of a cluster that the commands have needed.
    Cluster(Box<NodeConns>),
}

/// A command's connection, held to the command's deadline: every request on it (the
/// script by hash, then whole; the `WAIT` after a grant) must be answered by then.
pub(crate) struct Req<'a> {
    conn: &'a mut SyncConn,
    limit: Instant,
    /// When the last reply came (or the connection was handed over).
    last: Instant,
}

impl Req<'_> {
    /// A connection's requests must be answered by `limit`.
    pub(crate) fn new(conn: &mut SyncConn, limit: Instant) -> Req<'_> {
        Req {
            conn,
            limit,
            last: Instant::now(),
        }
    }

    /// `cmd`, answered by the limit: its read and write timeouts are the time left (no
    /// time left: see [`net::out_of_time`]). On a cluster, sent to the master of its
    /// key's slot.
    pub(crate) fn query<T: redis::FromRedisValue>(&mut self, cmd: &redis::Cmd) -> RedisResult<T> {
        let c = match self.conn {
            SyncConn::Cluster(c) => return c.query(cmd, self.limit, &mut self.last),
            SyncConn::Plain(c) => c,
        };
        let time = left(self.limit).ok_or_else(|| net::out_of_time(self.last))?;
        c.set_read_timeout(Some(time))?;
        c.set_write_timeout(Some(time))?;
        let reply = cmd.query(c);
        self.last = Instant::now();
        reply
    }

    /// A script: by hash, then whole if the server lacks it, each within the time left.
    pub(crate) fn call<T: redis::FromRedisValue>(&mut self, call: &Call<'_>) -> RedisResult<T> {
        match self.query(&call.cmd(false)) {
            Err(e) if e.code() == Some("NOSCRIPT") => self.query(&call.cmd(true)),
            other => other,
        }
    }
}

/// For a handle on one server: an error if the server is a node of a Redis Cluster, which
/// holds only its own slots' keys (`holders` listed none of the others' and found none
/// held; a lock on a key of another node's slots failed with a bare `MOVED`).
pub(crate) fn refuse_cluster_node(con: &mut Connection, server: &str) -> RedisResult<()> {
    let info: String = match redis::cmd("INFO").arg("cluster").query(con) {
        Ok(info) => info,
        // (a user whose ACL denies INFO, a proxy that lacks it: not told, not refused)
        Err(e) if e.code().is_some() => return Ok(()),
        Err(e) => return Err(e),
    };
    if info.lines().any(|l| l.trim() == "cluster_enabled:1") {
        return Err(redis::RedisError::from((
            redis::ErrorKind::Client,
            "a Cluster node",
            format!(
                "{server} is a node of a Redis Cluster, which holds only its own slots' \
                 keys: open the Cluster (RedisLocks::open_cluster, --redis-cluster)"
            ),
        )));
    }
    Ok(())
}

impl Shared {
    pub(crate) fn new(topology: Topology) -> Shared {
        Shared {
            topology,
            clock: ServerClock::new(),
        }
    }

    /// A plain connection to one server, made within `limit`: the server itself, the
    /// current master, or seed node `i` of a cluster (callers rotate `i`, so a dead seed is
    /// skipped next time). Its clock is read on the way. A timeout's error names the
    /// command `timeout` when that was the limit.
    pub(crate) fn plain(
        &self,
        i: usize,
        limit: Instant,
        timeout: Duration,
    ) -> RedisResult<(Connection, Tag)> {
        let started = Instant::now();
        let direct = |info: &ConnectionInfo| {
            let server: Arc<str> = info.addr().to_string().into();
            let con = net::connect_within(info, limit)
                .map_err(|e| net::at_server(e, &server, net::allowed(started, limit, timeout)))?;
            let tag = Tag {
                server: Some(server),
                ..Tag::default()
            };
            Ok::<_, redis::RedisError>((con, tag))
        };
        let (mut con, tag) = match &self.topology {
            Topology::Single(c) => direct(c.get_connection_info())?,
            Topology::Sentinel(s) => {
                let (con, epoch, addr) = s.connect_master(limit, timeout)?;
                let server = crate::redis_store::sentinel::server_name(&addr).into();
                (
                    con,
                    Tag {
                        epoch,
                        addr: Some(addr),
                        server: Some(server),
                    },
                )
            }
            Topology::Cluster(slots) => direct(&slots.seeds()[i % slots.seeds().len()])?,
        };
        self.read_clock(&mut con).map_err(|e| match &tag.server {
            // (a sentinel given as a data server: "unknown command 'TIME'")
            Some(server) if e.to_string().contains("unknown command") => redis::RedisError::from((
                redis::ErrorKind::Client,
                "not a data server",
                format!(
                    "{server} does not know TIME: not a Redis data server (a sentinel? \
                         RedisLocks::open_sentinel, --redis-sentinel NAME, takes sentinels)"
                ),
            )),
            Some(server) => net::at_server(e, server, net::allowed(started, limit, timeout)),
            None => e,
        })?;
        Ok((con, tag))
    }

    /// A connection for commands, made within `limit`.
    pub(crate) fn connect(
        &self,
        i: usize,
        limit: Instant,
        timeout: Duration,
    ) -> RedisResult<(SyncConn, Tag)> {
        match &self.topology {
            // (connections to its masters are made when a command needs them)
            Topology::Cluster(slots) => Ok((
                SyncConn::Cluster(Box::new(NodeConns::new(slots.clone(), timeout))),
                Tag::default(),
            )),
            _ => {
                let (con, tag) = self.plain(i, limit, timeout)?;
                Ok((SyncConn::Plain(con), tag))
            }
        }
    }

    /// For a cluster handle: reads the clock through the first seed node that answers
    /// (see [`plain`](Self::plain)), and is an error if that node says it has no cluster
    /// support (a plain server given to `open_cluster`). A seed that cannot be reached is
    /// skipped; none reached is the first one's error (a wrong address or password is
    /// an error at `open`, as on one server).
    pub(crate) fn check_cluster(&self, limit: Instant, timeout: Duration) -> RedisResult<()> {
        let Topology::Cluster(slots) = &self.topology else {
            return Ok(());
        };
        let seeds = slots.seeds();
        let mut first = None;
        for (i, seed) in seeds.iter().enumerate() {
            // (each seed gets its share of the time left: one that answers nothing must not
            // use it all)
            let Some(time) = left(limit) else { break };
            let share = Instant::now() + time / (seeds.len() - i) as u32;
            let mut con = match self.plain(i, share, timeout) {
                Ok((con, _)) => con,
                Err(e) => {
                    // (asked last for the slot map, not listened on, for a while)
                    slots.failed_at(&seed.addr().to_string().into());
                    first.get_or_insert(e);
                    continue;
                }
            };
            let info: RedisResult<String> = redis::cmd("CLUSTER").arg("INFO").query(&mut con);
            return match info {
                Err(why) if why.to_string().contains("cluster support disabled") => {
                    Err(redis::RedisError::from((
                        redis::ErrorKind::InvalidClientConfig,
                        "not a Redis Cluster node (RedisLocks::open opens a single server)",
                        format!("{}: {why}", seed.addr()),
                    )))
                }
                _ => Ok(()),
            };
        }
        Err(first.unwrap_or_else(net::timed_out))
    }

    /// Reads the server's clock (`TIME`) on `con`, to bound deadlines by.
    pub(crate) fn read_clock(&self, con: &mut Connection) -> RedisResult<()> {
        let (secs, micros): (String, String) = redis::cmd("TIME").query(con)?;
        if let Some(us) = server_clock::server_us(&secs, &micros) {
            self.clock.observe(us, Instant::now());
        }
        Ok(())
    }

    /// Whether a reply on a connection tagged `tag`, to a request sent at `sent`, comes
    /// from the master now (always, but for Sentinel: see `Sentinel::vouch`).
    pub(crate) fn vouch(&self, tag: &Tag, sent: Instant, limit: Instant) -> RedisResult<bool> {
        match (&self.topology, &tag.addr) {
            (Topology::Sentinel(s), Some(addr)) => s.vouch(tag.epoch, addr, sent, limit),
            _ => Ok(true),
        }
    }

    /// [`vouch`](Self::vouch) without asking anyone: `None` if the sentinels must be asked.
    #[cfg(feature = "tokio")]
    pub(crate) fn vouch_quick(&self, tag: &Tag, sent: Instant) -> Option<bool> {
        match (&self.topology, &tag.addr) {
            (Topology::Sentinel(s), Some(_)) => s.vouch_quick(tag.epoch, sent),
            _ => Some(true),
        }
    }

    /// A cluster's `node` failed (a listener, a subscription): see `Slots::failed_at`.
    /// Nothing for another topology, or no node.
    pub(crate) fn cluster_node_failed(&self, node: Option<&Arc<str>>) {
        if let (Topology::Cluster(slots), Some(node)) = (&self.topology, node) {
            slots.failed_at(node);
        }
    }

    /// Whether connections tagged `tag` still reach the current master.
    pub(crate) fn current(&self, tag: &Tag) -> bool {
        match &self.topology {
            Topology::Sentinel(s) => s.view().epoch() == tag.epoch,
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request whose limit passed while this process did not run after the reply before
    /// it (10 ms or more: stopped) fails as this process's lateness, which a wait takes for
    /// a stop of its own; one whose limit the server's slowness used up (the reply before
    /// came late, or none came) as a timeout: a listener that accepts and never answers
    /// stands for the server.
    #[test]
    fn a_limit_passed_while_this_process_did_not_run_is_lateness_not_a_timeout() {
        use std::time::Duration;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("redis://{}", listener.local_addr().unwrap());
        let info = redis::IntoConnectionInfo::into_connection_info(url.as_str()).unwrap();
        let connect = || {
            let limit = Instant::now() + Duration::from_secs(5);
            SyncConn::Plain(net::connect_within(&info, limit).unwrap())
        };
        let ping = redis::cmd("PING");

        // (the process "stopped" 20 ms past a limit 5 ms away)
        let mut conn = connect();
        let mut req = Req::new(&mut conn, Instant::now() + Duration::from_millis(5));
        std::thread::sleep(Duration::from_millis(20));
        let e = req.query::<String>(&ping).unwrap_err();
        assert!(net::is_interrupted(&e) && !e.is_timeout(), "{e}");
        let e = net::at_server(e, "h:1", Duration::ZERO);
        assert!(net::is_interrupted(&e) && !e.is_timeout(), "named: {e}");

        // a limit that passed right after the last reply: the server's
        let mut conn = connect();
        let passed = Instant::now() - Duration::from_millis(1);
        let e = Req::new(&mut conn, passed)
            .query::<String>(&ping)
            .unwrap_err();
        assert!(e.is_timeout() && !net::is_interrupted(&e), "{e}");

        let mut conn = connect();
        let limit = Instant::now() + Duration::from_millis(50);
        let e = Req::new(&mut conn, limit)
            .query::<String>(&ping)
            .unwrap_err();
        assert!(e.is_timeout() && !net::is_interrupted(&e), "{e}");
    }
}
