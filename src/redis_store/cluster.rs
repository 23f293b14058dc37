//! A Redis Cluster's routing: which master serves a key's slot (the slot map, read with
//! `CLUSTER SLOTS`), and a connection to each master a command needs, made and answered
//! within the command's deadline as a single server's are.
//!
//! The routing is ours, not redis-rs's cluster connection: that one checked every master
//! with a `PING` that had no time limit whenever it was made (and it was made again after
//! each timeout), so one master that accepted connections and answered nothing (stopped,
//! hung) stretched a 500 ms wait to 41 s and failed the calls on the healthy masters'
//! keys. Here a command touches the master of its key's slot and no other: a stopped
//! master costs its own keys their deadline, and nothing else.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis::{Cmd, Connection, ConnectionInfo, RedisResult, Value};

use crate::redis_store::net::{self, left};

/// How many slots a cluster has.
const SLOTS: u16 = 16384;

/// The slot map is read again at most this often after a redirect or a failed node (a
/// node that stays down would have every command on its keys ask).
const REREAD_GAP: Duration = Duration::from_millis(100);

/// Redirects followed for one request (a slot migrating while the map changes), and,
/// apart, `TRYAGAIN`s waited out (a multi-key request while its slot migrates).
const MAX_REDIRECTS: u32 = 5;

/// The first pause before a request that met `TRYAGAIN` is sent again; each next one is
/// twice as long, up to [`MAX_TRY_AGAIN_PAUSE`].
const TRY_AGAIN_PAUSE: Duration = Duration::from_millis(20);
const MAX_TRY_AGAIN_PAUSE: Duration = Duration::from_millis(200);

/// The pause before sending again a request that met `e` after `pauses` pauses, if `e`
/// says to try again (`TRYAGAIN`: a slot migrating) and the pause leaves time by `limit`
/// for the request.
fn pause_for(e: &redis::RedisError, pauses: u32, limit: Instant) -> Option<Duration> {
    let pause = TRY_AGAIN_PAUSE
        .saturating_mul(1 << pauses.min(8))
        .min(MAX_TRY_AGAIN_PAUSE);
    (e.code() == Some("TRYAGAIN") && left(limit).is_some_and(|t| t > 2 * pause)).then_some(pause)
}

/// The slot of `key`: CRC16 (XMODEM) of its hash tag (the bytes between the first `{` and
/// the next `}`, when that is not empty), else of the whole key.
pub(crate) fn slot_of(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .map(|close| &rest[..close])
        })
        .filter(|tag| !tag.is_empty());
    crc16(tagged.unwrap_or(key)) % SLOTS
}

fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The slot a command is routed by: its key's, a script's first key or else the first
/// argument. `None` for a command with no key (`WAIT`, `TIME`...), which goes where the
/// last one went.
fn slot_of_cmd(cmd: &Cmd) -> Option<u16> {
    let mut args = cmd.args_iter().filter_map(|a| match a {
        redis::Arg::Simple(a) => Some(a),
        _ => None,
    });
    let name = args.next()?;
    let is = |names: &[&str]| {
        names
            .iter()
            .any(|n| name.eq_ignore_ascii_case(n.as_bytes()))
    };
    let key = if is(&["EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO"]) {
        let _script = args.next()?;
        let keys: u64 = std::str::from_utf8(args.next()?).ok()?.parse().ok()?;
        if keys == 0 {
            return None;
        }
        args.next()?
    } else if is(&["WAIT", "TIME", "PING", "INFO", "CLUSTER", "ASKING"]) {
        return None;
    } else {
        args.next()?
    };
    Some(slot_of(key))
}

/// A master: its `host:port` (errors name it) and how to connect to it.
#[derive(Clone)]
pub(crate) struct Node {
    pub(crate) addr: Arc<str>,
    info: Arc<ConnectionInfo>,
}

impl Node {
    /// How to connect to it.
    pub(crate) fn info(&self) -> &ConnectionInfo {
        &self.info
    }

    fn new(seed: &ConnectionInfo, host: &str, port: u16) -> Node {
        Node {
            addr: format!("{host}:{port}").into(),
            info: Arc::new(net::with_addr(seed, host, port)),
        }
    }

    fn seed(info: &ConnectionInfo) -> Node {
        Node {
            addr: info.addr().to_string().into(),
            info: Arc::new(info.clone()),
        }
    }
}

/// Which master serves each slot, as one node said.
struct Map {
    /// `(first, last, master)`, by first slot.
    ranges: Vec<(u16, u16, usize)>,
    masters: Vec<Node>,
}

impl Map {
    fn master_of(&self, slot: u16) -> Option<&Node> {
        let i = self
            .ranges
            .partition_point(|r| r.0 <= slot)
            .checked_sub(1)?;
        let (_, last, m) = self.ranges[i];
        (slot <= last).then(|| &self.masters[m])
    }
}

/// The slot map of a cluster, shared by every connection of the handles of one `open`.
pub(crate) struct Slots {
    seeds: Vec<ConnectionInfo>,
    state: Mutex<State>,
}

struct State {
    map: Option<Arc<Map>>,
    /// A redirect or a failed node says the map may be out of date.
    stale: bool,
    /// How many times it was said so: a map read that began before the last time is not
    /// taken as up to date.
    stale_said: u64,
    /// When the map was last asked for (read again no sooner than [`REREAD_GAP`] after).
    asked: Option<Instant>,
    /// Masters that failed a request lately, and when: asked for the map last.
    failed: Vec<(Arc<str>, Instant)>,
    /// The node that gave the map.
    gave_map: Option<Node>,
}

/// How long a master that failed a request is asked for the slot map after the others.
const SUSPECT_FOR: Duration = Duration::from_secs(30);

impl State {
    /// Whether the map is to be read again before it is used (see `Slots::master_of`).
    fn due(&self) -> bool {
        self.map.is_none() || self.stale && self.asked.is_none_or(|t| t.elapsed() >= REREAD_GAP)
    }

    /// The nodes that failed lately.
    fn suspects(&self) -> impl Iterator<Item = &Arc<str>> {
        (self.failed.iter())
            .filter(|(_, at)| at.elapsed() < SUSPECT_FOR)
            .map(|(a, _)| a)
    }
}

impl Slots {
    pub(crate) fn new(seeds: Vec<ConnectionInfo>) -> Slots {
        Slots {
            seeds,
            state: Mutex::new(State {
                map: None,
                stale: true,
                stale_said: 0,
                asked: None,
                failed: Vec::new(),
                gave_map: None,
            }),
        }
    }

    pub(crate) fn seeds(&self) -> &[ConnectionInfo] {
        &self.seeds
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The map may be out of date: read it again before the next command that needs it.
    pub(crate) fn stale(&self) {
        let mut s = self.state();
        s.stale = true;
        s.stale_said += 1;
    }

    /// The node at `addr` failed a request (no answer, no connection): the map may be out
    /// of date (a failover), and the node is asked for it after the others, and not
    /// listened on, for a while.
    pub(crate) fn failed_at(&self, addr: &Arc<str>) {
        let mut s = self.state();
        s.stale = true;
        s.stale_said += 1;
        s.failed
            .retain(|(a, at)| a != addr && at.elapsed() < SUSPECT_FOR);
        s.failed.push((addr.clone(), Instant::now()));
    }

    /// A node to listen on for releases (a cluster's `PUBLISH` reaches every node): the
    /// masters of the map and the seeds, one that has not failed lately first.
    pub(crate) fn listener(&self) -> Node {
        // (the node that gave the map answered lately, unless it failed since)
        let gave_map = self.state().gave_map.clone();
        gave_map
            .filter(|g| !self.failed_lately(g))
            .or_else(|| {
                let (well, failed) = self.candidates(None);
                well.into_iter().chain(failed).next()
            })
            .expect("open_cluster takes at least one node")
    }

    fn failed_lately(&self, node: &Node) -> bool {
        self.state().suspects().any(|a| *a == node.addr)
    }

    /// The nodes to ask for the slot map: the masters of the map there is (or `old`), then
    /// the seeds; apart, those that failed lately.
    fn candidates(&self, old: Option<&Map>) -> (Vec<Node>, Vec<Node>) {
        let (map, failed) = {
            let s = self.state();
            let failed: Vec<Arc<str>> = s.suspects().cloned().collect();
            (s.map.clone(), failed)
        };
        let mut all: Vec<Node> = old
            .or(map.as_deref())
            .map(|m| m.masters.clone())
            .unwrap_or_default();
        for seed in &self.seeds {
            let seed = Node::seed(seed);
            if !all.iter().any(|n| n.addr == seed.addr) {
                all.push(seed);
            }
        }
        all.into_iter().partition(|n| !failed.contains(&n.addr))
    }

    /// The master of `slot` from the map there is, if it need not be read first (see
    /// [`master_of`](Self::master_of)): no I/O.
    fn known_master(&self, slot: u16) -> Option<Node> {
        let s = self.state();
        s.map
            .as_ref()
            .filter(|_| !s.due())?
            .master_of(slot)
            .cloned()
    }

    /// The master of `slot`, by `limit`: from the map, read first if there is none yet or
    /// it may be out of date (at most once per [`REREAD_GAP`]; when that read fails, the
    /// map there was is used).
    pub(crate) fn master_of(
        &self,
        slot: u16,
        limit: Instant,
        timeout: Duration,
    ) -> RedisResult<Node> {
        if let Some(node) = self.known_master(slot) {
            return Ok(node);
        }
        let (map, read, said) = {
            let mut s = self.state();
            let due = s.due();
            if due {
                s.asked = Some(Instant::now());
            }
            (s.map.clone(), due, s.stale_said)
        };
        let map = match (read, map) {
            (false, Some(map)) => map,
            (_, old) => match (self.read(old.as_deref(), limit, timeout), old) {
                (Ok((map, gave)), _) => {
                    let map = Arc::new(map);
                    self.store(map.clone(), gave, said);
                    map
                }
                (Err(_), Some(old)) => old,
                (Err(e), None) => return Err(e),
            },
        };
        map.master_of(slot).cloned().ok_or_else(|| {
            redis::RedisError::from((
                redis::ErrorKind::Server(redis::ServerErrorKind::ClusterDown),
                "no master serves the slot",
                format!("slot {slot}: no master of the cluster serves it now"),
            ))
        })
    }

    /// Every master that serves a slot, and how to connect to it, from a slot map read
    /// now (by `limit`): a master that is stopped or down is listed all the same, so that
    /// asking it fails rather than its keys going unseen.
    pub(crate) fn masters(&self, limit: Instant, timeout: Duration) -> RedisResult<Vec<Node>> {
        let (old, said) = {
            let s = self.state();
            (s.map.clone(), s.stale_said)
        };
        let (map, gave) = self.read(old.as_deref(), limit, timeout)?;
        let map = Arc::new(map);
        let masters = map.masters.clone();
        self.store(map, gave, said);
        Ok(masters)
    }

    /// Keeps `map`, which `gave` gave after the map was last said out of date `said` times.
    fn store(&self, map: Arc<Map>, gave: Node, said: u64) {
        let mut s = self.state();
        s.map = Some(map);
        s.gave_map = Some(gave);
        s.stale = s.stale_said != said;
    }

    /// The slot map, from the first node that gives it, all asked at once (the masters of
    /// `old` and the seeds), those that failed lately only if none of the others gave it:
    /// a node that answers nothing (stopped) costs no more than the quickest of the others.
    fn read(
        &self,
        old: Option<&Map>,
        limit: Instant,
        timeout: Duration,
    ) -> RedisResult<(Map, Node)> {
        let (well, failed) = self.candidates(old);
        match ask_all(well, limit, timeout) {
            Err(e) if !failed.is_empty() && left(limit).is_some() => {
                ask_all(failed, limit, timeout).map_err(|_| e)
            }
            got => got,
        }
    }
}

/// The slot map from the first of `nodes` that gives it, each asked on a thread of its
/// own (left to end by `limit`), or the last error.
fn ask_all(nodes: Vec<Node>, limit: Instant, timeout: Duration) -> RedisResult<(Map, Node)> {
    let (tx, rx) = std::sync::mpsc::channel();
    let started = Instant::now();
    let (mut spawned, mut last) = (0, None);
    for node in nodes {
        let tx = tx.clone();
        let thread = std::thread::Builder::new()
            .name("shmlock-slots".into())
            .spawn(move || {
                let reply = net::connect_within(&node.info, limit)
                    .and_then(|mut c| redis::cmd("CLUSTER").arg("SLOTS").query::<Value>(&mut c))
                    .and_then(|v| parse_slots(&v, &node.info))
                    .map_err(|e| {
                        net::at_server(e, &node.addr, net::allowed(started, limit, timeout))
                    });
                let _ = tx.send(reply.map(|map| (map, node)));
            });
        match thread {
            Ok(_) => spawned += 1,
            Err(e) => last = Some(e.into()),
        }
    }
    drop(tx);
    for _ in 0..spawned {
        let Some(time) = left(limit) else { break };
        match rx.recv_timeout(time) {
            Ok(Ok(got)) => return Ok(got),
            Ok(Err(e)) => last = Some(e),
            Err(_) => break,
        }
    }
    Err(last.unwrap_or_else(net::timed_out))
}

/// A `CLUSTER SLOTS` reply from the node at `asked`: each entry is `[first, last, [host,
/// port, ...], replicas...]`; an empty or unknown (`?`) host is the node that answered.
fn parse_slots(v: &Value, asked: &ConnectionInfo) -> RedisResult<Map> {
    let bad =
        || redis::RedisError::from((redis::ErrorKind::Parse, "unexpected reply to CLUSTER SLOTS"));
    let int = |v: &Value| match v {
        Value::Int(n) => u16::try_from(*n).ok().filter(|&n| n < SLOTS),
        _ => None,
    };
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let asked_host = match asked.addr() {
        redis::ConnectionAddr::Tcp(h, _) | redis::ConnectionAddr::TcpTls { host: h, .. } => {
            h.clone()
        }
        _ => return Err(bad()),
    };
    let Value::Array(entries) = v else {
        return Err(bad());
    };
    let mut map = Map {
        ranges: Vec::new(),
        masters: Vec::new(),
    };
    for e in entries {
        let Value::Array(e) = e else {
            return Err(bad());
        };
        let (Some(first), Some(last), Some(Value::Array(master))) =
            (e.first().and_then(int), e.get(1).and_then(int), e.get(2))
        else {
            return Err(bad());
        };
        let host = master.first().and_then(text).ok_or_else(bad)?;
        let port = match master.get(1) {
            Some(Value::Int(p)) => u16::try_from(*p).map_err(|_| bad())?,
            _ => return Err(bad()),
        };
        let host = if host.is_empty() || host == "?" {
            asked_host.clone()
        } else {
            host
        };
        let node = Node::new(asked, &host, port);
        let m = match map.masters.iter().position(|n| n.addr == node.addr) {
            Some(m) => m,
            None => {
                map.masters.push(node);
                map.masters.len() - 1
            }
        };
        map.ranges.push((first, last, m));
    }
    if map.ranges.is_empty() {
        return Err(redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ClusterDown),
            "the cluster serves no slot",
        )));
    }
    map.ranges.sort_unstable_by_key(|r| r.0);
    Ok(map)
}

/// What follows a request's error: the redirects followed so far (up to
/// [`MAX_REDIRECTS`]) and the `TRYAGAIN` pauses taken (as long as the request's limit
/// allows: a migration takes seconds, and an `unlock` that gave up left the key held).
#[derive(Default)]
struct Retries {
    redirects: u32,
    pauses: u32,
}

/// After an error: send the request to this node (asking it first, or not), pause and
/// send it to the same node again, or give the error.
enum Then {
    Send(Node, bool),
    Pause(Duration),
    Fail,
}

impl Retries {
    /// What to do after `e` from `node`, with the time by `limit` for pauses (`None`: no
    /// pause, the caller's wait tries again at its next step). A redirect says the map
    /// may be out of date (`MOVED`); the last one allowed is the error, one a wait goes on
    /// through.
    fn after(
        &mut self,
        e: &redis::RedisError,
        node: &Node,
        slots: &Slots,
        limit: Option<Instant>,
    ) -> Then {
        if let Some((next, asking)) = redirected(e, node) {
            if !asking {
                slots.stale();
            }
            if self.redirects < MAX_REDIRECTS {
                self.redirects += 1;
                return Then::Send(next, asking);
            }
            return Then::Fail;
        }
        match limit.and_then(|limit| pause_for(e, self.pauses, limit)) {
            Some(pause) => {
                self.pauses += 1;
                Then::Pause(pause)
            }
            None => Then::Fail,
        }
    }
}

/// Where a `MOVED` or `ASK` reply sends a request: `(node, asking)`.
fn redirected(e: &redis::RedisError, from: &Node) -> Option<(Node, bool)> {
    let asking = match e.code()? {
        "MOVED" => false,
        "ASK" => true,
        _ => return None,
    };
    let (addr, _) = e.redirect_node()?;
    let (host, port) = addr.rsplit_once(':')?;
    // (an empty host is the node that redirected)
    let host = match host {
        "" => match from.info.addr() {
            redis::ConnectionAddr::Tcp(h, _) | redis::ConnectionAddr::TcpTls { host: h, .. } => {
                h.as_str()
            }
            _ => return None,
        },
        h => h,
    };
    Some((Node::new(&from.info, host, port.parse().ok()?), asking))
}

/// The synchronous connections of one command at a time: one to each master it has
/// needed, made when first needed, each request held to the command's deadline.
pub(crate) struct NodeConns {
    slots: Arc<Slots>,
    timeout: Duration,
    conns: Vec<(Arc<str>, Connection)>,
    /// Where the last request went: a command without a key (the `WAIT` after a grant)
    /// goes there too.
    last: Option<Node>,
}

impl NodeConns {
    pub(crate) fn new(slots: Arc<Slots>, timeout: Duration) -> NodeConns {
        NodeConns {
            slots,
            timeout,
            conns: Vec::new(),
            last: None,
        }
    }

    /// `cmd` on the master of its key's slot, answered by `limit`; `replied` is when the
    /// last reply came (see [`net::out_of_time`]), set when one comes. An error is
    /// named by the node it came from; a node that did not answer (or could not be
    /// reached) loses its connection, and the slot map is read again (a failover).
    pub(crate) fn query<T: redis::FromRedisValue>(
        &mut self,
        cmd: &Cmd,
        limit: Instant,
        replied: &mut Instant,
    ) -> RedisResult<T> {
        let slot = slot_of_cmd(cmd);
        let mut to: Option<(Node, bool)> = None;
        let mut retries = Retries::default();
        loop {
            let started = Instant::now();
            let (node, asking) = match to.take() {
                Some(to) => to,
                None => match slot {
                    Some(slot) => (self.slots.master_of(slot, limit, self.timeout)?, false),
                    None => (self.last.clone().ok_or_else(no_node)?, false),
                },
            };
            let reply = self.send(&node, cmd, asking, limit, *replied);
            *replied = Instant::now();
            match reply {
                Ok(v) => {
                    self.last = Some(node);
                    return Ok(redis::from_redis_value(v)?);
                }
                Err(e) => {
                    match retries.after(&e, &node, &self.slots, Some(limit)) {
                        Then::Send(next, ask) => {
                            to = Some((next, ask));
                            continue;
                        }
                        Then::Pause(pause) => {
                            std::thread::sleep(pause);
                            to = Some((node, asking)); // (the same node, asked the same way)
                            continue;
                        }
                        Then::Fail => {}
                    }
                    if net::is_broken(&e) {
                        self.conns.retain(|(a, _)| *a != node.addr);
                        self.slots.failed_at(&node.addr);
                    }
                    let allowed = net::allowed(started, limit, self.timeout);
                    return Err(net::at_server(e, &node.addr, allowed));
                }
            }
        }
    }

    /// `cmd` to `node`, on its connection or a new one. A connection kept from an earlier
    /// command that turns out closed (the node restarted, or closed it idle) is replaced
    /// and the request sent again once: what ran on a connection the server had closed,
    /// or is found at the server as this request's own (every script is idempotent by its
    /// token), the second request answers for.
    fn send(
        &mut self,
        node: &Node,
        cmd: &Cmd,
        asking: bool,
        limit: Instant,
        replied: Instant,
    ) -> RedisResult<Value> {
        let late = || net::out_of_time(replied);
        let mut kept = self.conns.iter().position(|(a, _)| *a == node.addr);
        loop {
            let at = match kept {
                Some(at) => at,
                None => {
                    left(limit).ok_or_else(late)?;
                    let c = net::connect_within(&node.info, limit)?;
                    self.conns.push((node.addr.clone(), c));
                    self.conns.len() - 1
                }
            };
            let conn = &mut self.conns[at].1;
            let time = left(limit).ok_or_else(late)?;
            conn.set_read_timeout(Some(time))?;
            conn.set_write_timeout(Some(time))?;
            let reply = if asking {
                redis::cmd("ASKING")
                    .query::<()>(conn)
                    .and_then(|()| cmd.query(conn))
            } else {
                cmd.query(conn)
            }
            .and_then(server_error);
            match reply {
                Err(e) if kept.is_some() && e.is_connection_dropped() => {
                    self.conns.swap_remove(at);
                    kept = None;
                }
                reply => return reply,
            }
        }
    }
}

/// A server's error reply as an error (a reply read as a `Value` may carry one: a
/// redirect must be seen as one).
fn server_error(v: Value) -> RedisResult<Value> {
    match v {
        Value::ServerError(e) => Err(e.into()),
        v => Ok(v),
    }
}

fn no_node() -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Client,
        "a command with no key needs a command with a key before it",
    ))
}

#[cfg(feature = "tokio")]
pub(crate) use self::aio::ClusterAio;

#[cfg(feature = "tokio")]
mod aio {
    use super::*;
    use redis::aio::MultiplexedConnection;

    /// A connection to each master, by its address.
    type Conns = Mutex<Vec<(Arc<str>, MultiplexedConnection)>>;

    /// The async connections of a cluster handle in one runtime: a multiplexed connection
    /// to each master, made when first needed and shared by the clones (the tasks); each
    /// clone remembers where its own last request went.
    #[derive(Clone)]
    pub(crate) struct ClusterAio {
        slots: Arc<Slots>,
        timeout: Duration,
        conns: Arc<Conns>,
        last: Option<Node>,
        /// The master of the request in flight, if any: a request whose future is dropped
        /// at its deadline says so through [`node_failed`](Self::node_failed).
        sending: Option<Node>,
    }

    impl ClusterAio {
        pub(crate) fn new(slots: Arc<Slots>, timeout: Duration) -> ClusterAio {
            ClusterAio {
                slots,
                timeout,
                conns: Arc::default(),
                last: None,
                sending: None,
            }
        }

        /// The master of the request in flight on this clone (or the last one that failed).
        pub(crate) fn sending(&self) -> Option<Arc<str>> {
            self.sending.as_ref().map(|n| n.addr.clone())
        }

        /// The request in flight on this clone failed or was cut off by its deadline: its
        /// master's connection goes (a late reply must not answer the next request's) and
        /// the slot map is read again before the next request (a failover?).
        pub(crate) fn node_failed(&self) {
            if let Some(node) = &self.sending {
                self.conns().retain(|(a, _)| *a != node.addr);
                self.slots.failed_at(&node.addr);
            }
        }

        fn conns(&self) -> MutexGuard<'_, Vec<(Arc<str>, MultiplexedConnection)>> {
            self.conns.lock().unwrap_or_else(|e| e.into_inner())
        }

        /// The master of `slot`. Reading the slot map is blocking I/O: off the runtime's
        /// threads, and only when the map must be read.
        async fn master_of(&self, slot: u16) -> RedisResult<Node> {
            if let Some(node) = self.slots.known_master(slot) {
                return Ok(node);
            }
            let limit = crate::lock::wait::instant_after(Instant::now(), self.timeout);
            let slots = self.slots.clone();
            let timeout = self.timeout;
            tokio::task::spawn_blocking(move || slots.master_of(slot, limit, timeout))
                .await
                .map_err(|e| redis::RedisError::from(std::io::Error::other(e)))?
        }

        async fn connect(&self, node: &Node) -> RedisResult<MultiplexedConnection> {
            let config = redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(self.timeout))
                .set_response_timeout(Some(self.timeout));
            redis::Client::open((*node.info).clone())?
                .get_multiplexed_async_connection_with_config(&config)
                .await
        }

        /// A connection to `node`, and whether it was kept from an earlier request.
        async fn conn_to(&self, node: &Node) -> RedisResult<(MultiplexedConnection, bool)> {
            if let Some((_, c)) = self.conns().iter().find(|(a, _)| *a == node.addr) {
                return Ok((c.clone(), true));
            }
            let c = self.connect(node).await?;
            let mut all = self.conns();
            if let Some((_, other)) = all.iter().find(|(a, _)| *a == node.addr) {
                return Ok((other.clone(), false)); // another task was quicker
            }
            all.push((node.addr.clone(), c.clone()));
            Ok((c, false))
        }

        /// `cmd` to `node`; sent again once on a new connection if a kept one turns out
        /// closed (see `NodeConns::send`).
        async fn send(&self, node: &Node, cmd: &Cmd, asking: bool) -> RedisResult<Value> {
            if asking {
                // (`ASKING` holds for the next request on its connection: on one of its own,
                // so that no other task's request comes between; a rare path)
                let mut c = self.connect(node).await?;
                redis::cmd("ASKING").query_async::<()>(&mut c).await?;
                return c.req_packed_command(cmd).await.and_then(server_error);
            }
            loop {
                let (mut c, kept) = self.conn_to(node).await?;
                // (a server's error comes back as a value: a redirect must be seen)
                match c.req_packed_command(cmd).await.and_then(server_error) {
                    Err(e) if kept && e.is_connection_dropped() => {
                        self.conns().retain(|(a, _)| *a != node.addr);
                    }
                    reply => return reply,
                }
            }
        }

        async fn route(&mut self, cmd: &Cmd) -> RedisResult<Value> {
            self.sending = None;
            let slot = slot_of_cmd(cmd);
            let mut to: Option<(Node, bool)> = None;
            let mut retries = Retries::default();
            loop {
                let (node, asking) = match to.take() {
                    Some(to) => to,
                    None => match slot {
                        Some(slot) => (self.master_of(slot).await?, false),
                        None => (self.last.clone().ok_or_else(no_node)?, false),
                    },
                };
                self.sending = Some(node.clone());
                let reply = self.send(&node, cmd, asking).await;
                match reply {
                    Ok(v) => {
                        self.sending = None;
                        self.last = Some(node);
                        return Ok(v);
                    }
                    Err(e) => {
                        // (no pause on TRYAGAIN: the caller's deadline, which would cut
                        // it, is not known here; a wait tries again at its next step)
                        if let Then::Send(next, ask) = retries.after(&e, &node, &self.slots, None) {
                            self.sending = None;
                            to = Some((next, ask));
                            continue;
                        }
                        if net::is_broken(&e) {
                            self.node_failed();
                        }
                        return Err(net::at_server(e, &node.addr, self.timeout));
                    }
                }
            }
        }
    }

    use redis::aio::ConnectionLike;

    impl ConnectionLike for ClusterAio {
        fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> redis::RedisFuture<'a, Value> {
            Box::pin(self.route(cmd))
        }

        /// (no caller pipelines on a cluster handle: refused rather than misrouted)
        fn req_packed_commands<'a>(
            &'a mut self,
            _pipeline: &'a redis::Pipeline,
            _offset: usize,
            _count: usize,
        ) -> redis::RedisFuture<'a, Vec<Value>> {
            Box::pin(async {
                Err(redis::RedisError::from((
                    redis::ErrorKind::Client,
                    "pipelines are not routed on a cluster",
                )))
            })
        }

        fn get_db(&self) -> i64 {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_those_of_the_cluster_spec() {
        // (the spec's own example, and keys whose slots redis-server gave)
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(
            slot_of(b"{user1000}.following"),
            slot_of(b"{user1000}.followers")
        );
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
        assert_eq!(slot_of(b"foo{}{bar}"), crc16(b"foo{}{bar}") % SLOTS);
        assert_eq!(slot_of(b"foo{{bar}}zap"), slot_of(b"{bar"));
        assert_eq!(slot_of(b"foo{bar}{zap}"), slot_of(b"bar"));
    }

    #[test]
    fn commands_are_routed_by_their_key() {
        let sha = redis::cmd("EVALSHA")
            .arg("abc")
            .arg(2)
            .arg("k1")
            .arg("k2")
            .clone();
        assert_eq!(slot_of_cmd(&sha), Some(slot_of(b"k1")));
        let none = redis::cmd("EVAL").arg("return 1").arg(0).clone();
        assert_eq!(slot_of_cmd(&none), None);
        assert_eq!(
            slot_of_cmd(redis::cmd("EXISTS").arg("a").arg("b")),
            Some(slot_of(b"a"))
        );
        assert_eq!(slot_of_cmd(redis::cmd("WAIT").arg(1).arg(100)), None);
    }

    #[test]
    fn a_slot_map_reply_gives_each_slot_its_master() {
        let seed =
            redis::IntoConnectionInfo::into_connection_info("redis://10.0.0.9:7000").unwrap();
        let entry = |a: i64, b: i64, host: &str, port: i64| {
            Value::Array(vec![
                Value::Int(a),
                Value::Int(b),
                Value::Array(vec![
                    Value::BulkString(host.as_bytes().to_vec()),
                    Value::Int(port),
                    Value::BulkString(b"id".to_vec()),
                ]),
            ])
        };
        let reply = Value::Array(vec![
            entry(5461, 10922, "10.0.0.2", 7001),
            entry(0, 5460, "", 7000),
            entry(10923, 16383, "10.0.0.3", 7002),
        ]);
        let map = parse_slots(&reply, &seed).unwrap();
        let at = |slot| map.master_of(slot).map(|n| n.addr.to_string());
        assert_eq!(at(0).as_deref(), Some("10.0.0.9:7000"));
        assert_eq!(at(5461).as_deref(), Some("10.0.0.2:7001"));
        assert_eq!(at(16383).as_deref(), Some("10.0.0.3:7002"));
        let partial = parse_slots(&Value::Array(vec![entry(100, 200, "h", 1)]), &seed).unwrap();
        assert!(partial.master_of(99).is_none() && partial.master_of(201).is_none());
        assert!(parse_slots(&Value::Array(vec![]), &seed).is_err());
        assert!(parse_slots(&Value::Int(3), &seed).is_err());
    }
}
