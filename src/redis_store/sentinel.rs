//! Following the master that Sentinel names, and knowing when it stops being the master.
//!
//! **Finding it.** Every sentinel is asked (`SENTINEL MASTER`), each within its share of
//! the caller's deadline, and the master named with the highest configuration epoch is
//! taken (a sentinel cut off from a failover still names the old master, with the old
//! epoch); that server must say it is a master (`ROLE`) before anything is sent to it. No
//! lock of the handle is held across any of it: a stopped sentinel or master stalls only
//! the thread that asked, and only for its share.
//!
//! **Hearing of a switch.** One thread per sentinel, per process, subscribes to its
//! `+odown`, `+promoted-slave` and `+switch-master` events and pings it every
//! [`PING_EVERY`]. Any of them for our master bumps the *epoch*: every connection made
//! before is dropped when next taken from the idle list, and a reply that arrives on one
//! counts for nothing (see [`Sentinel::vouch`]). A master that was stopped long enough to
//! be failed over is seen down by the sentinels (`+odown`) before any replica is promoted,
//! so a grant its resumed process sends afterwards on an old connection is refused here,
//! even though that server still believes it is the master.
//!
//! **What is left.** A grant is accepted when its reply comes on a connection of the
//! current epoch and a sentinel was heard within [`HEALTHY`] (else, and after a reply that
//! took longer than [`STALL`], the sentinels are asked again first). Sentinel is not a
//! consensus store: a master cut off from every sentinel this process reaches, yet still
//! reachable from here, can grant a key for as long as those sentinels do not know of the
//! failover (their gossip takes up to about 2 s); its holder learns at its next renewal,
//! which goes to the new master and says `Expired`. `RedisLocks::with_replicas` closes
//! this gap, as the README's topology table says.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use redis::{Connection, ConnectionInfo, RedisResult, Value};

use crate::per_process::PerProcess;
use crate::redis_store::net::{allowed, at_server, connect_within, left, timed_out, with_addr};

/// How often a watcher pings its sentinel (and at most how long it waits for an event).
pub(crate) const PING_EVERY: Duration = Duration::from_millis(250);

/// A sentinel heard within this long vouches for the epoch.
pub(crate) const HEALTHY: Duration = Duration::from_secs(1);

/// A reply that took longer than this may come from a server that was stopped long
/// enough to be failed over: the sentinels are asked before it counts.
pub(crate) const STALL: Duration = Duration::from_millis(250);

/// The events that mean our master may be (or is) replaced.
const EVENTS: [&str; 3] = ["+odown", "+promoted-slave", "+switch-master"];

/// A master's address as the sentinels give it.
pub(crate) type Addr = (String, u16);

/// `host:port`, as errors name a server.
pub(crate) fn server_name(addr: &Addr) -> String {
    format!("{}:{}", addr.0, addr.1)
}

/// What one sentinel said of the master: its address and configuration epoch, or `None`
/// if it knows no master of that name.
type Answer = RedisResult<Option<(Addr, u64)>>;

/// The sentinels of one master name.
pub(crate) struct Sentinel {
    name: String,
    sentinels: Vec<ConnectionInfo>,
    view: PerProcess<Arc<View>>,
}

/// What this process knows of the master: its epoch, and when a sentinel was last heard.
pub(crate) struct View {
    epoch: AtomicU64,
    /// Nanoseconds after `base` when a watcher last heard its sentinel answer (0: never).
    heard: AtomicU64,
    base: Instant,
}

impl View {
    fn new() -> View {
        View {
            epoch: AtomicU64::new(1),
            heard: AtomicU64::new(0),
            base: Instant::now(),
        }
    }

    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    fn switched(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }

    fn heard_at(&self, at: Instant) {
        let ns = u64::try_from(at.duration_since(self.base).as_nanos()).unwrap_or(u64::MAX);
        self.heard.fetch_max(ns.max(1), Ordering::AcqRel);
    }

    /// Whether a sentinel was heard within [`HEALTHY`].
    fn healthy(&self) -> bool {
        let ns = self.heard.load(Ordering::Acquire);
        ns != 0 && self.base + Duration::from_nanos(ns) + HEALTHY > Instant::now()
    }
}

impl Sentinel {
    pub(crate) fn new(name: String, sentinels: Vec<ConnectionInfo>) -> Sentinel {
        Sentinel {
            name,
            sentinels,
            view: PerProcess::new(),
        }
    }

    /// This process's view, with its watchers started on first use.
    pub(crate) fn view(&self) -> &View {
        self.view.get(|| {
            let view = Arc::new(View::new());
            for info in &self.sentinels {
                let (name, info, weak) = (self.name.clone(), info.clone(), Arc::downgrade(&view));
                let spawned = std::thread::Builder::new()
                    .name("shmlock-sentinel".into())
                    .spawn(move || watch(&name, &info, &weak));
                // Without a watcher every grant asks the sentinels first (see `vouch`).
                drop(spawned);
            }
            view
        })
    }

    /// The master as the sentinels that answer within `limit` name it: the one named with
    /// the highest configuration epoch (a sentinel cut off from the failover names the old
    /// master with the old epoch), with the settings (password, database, TLS) of the first
    /// sentinel URL. Each sentinel gets its share of the time left, so one that hangs does
    /// not keep the others from being asked.
    fn ask(&self, limit: Instant) -> RedisResult<(Addr, ConnectionInfo)> {
        let mut best: Option<(u64, Addr)> = None;
        let mut last = None;
        for (i, answer) in self.ask_all(limit) {
            match answer {
                Ok(Some((addr, epoch))) if best.as_ref().is_none_or(|(e, _)| epoch > *e) => {
                    best = Some((epoch, addr));
                }
                Ok(_) => {}
                Err(e) => last = Some((i, e)),
            }
        }
        match best {
            Some((_, addr)) => {
                let info = with_addr(&self.sentinels[0], &addr.0, addr.1);
                Ok((addr, info))
            }
            None => Err(last.map(|(_, e)| e).unwrap_or_else(|| {
                redis::RedisError::from(std::io::Error::other(format!(
                    "no sentinel knows a master named {:?}",
                    self.name
                )))
            })),
        }
    }

    /// Every sentinel's answer (the master's address and configuration epoch, or `None`
    /// if it knows no such master), each asked within its share of the time left.
    fn ask_all(&self, limit: Instant) -> Vec<(usize, Answer)> {
        let n = self.sentinels.len();
        (0..n)
            .map(|i| {
                let share = left(limit).map(|d| d / u32::try_from(n - i).unwrap_or(u32::MAX));
                let answer = match share {
                    Some(d) => self.ask_one(i, Instant::now() + d),
                    None => Err(timed_out()),
                };
                (i, answer)
            })
            .collect()
    }

    fn ask_one(&self, i: usize, limit: Instant) -> Answer {
        // (named as a server's errors are: a sentinel stopped said "Resource temporarily
        // unavailable (os error 11)", one down "Connection refused", and nothing whose)
        let started = Instant::now();
        let server = format!("sentinel {}", self.sentinels[i].addr());
        let named = |e| at_server(e, &server, limit.saturating_duration_since(started));
        let mut con = connect_within(&self.sentinels[i], limit).map_err(named)?;
        let reply: RedisResult<Vec<String>> = redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(&self.name)
            .query(&mut con);
        let fields = match reply {
            Ok(fields) => fields,
            // a server that is no sentinel (its data port given by mistake): not "no
            // sentinel knows a master named", which sends the user after the name
            Err(e) if e.to_string().contains("unknown command") => {
                return Err(redis::RedisError::from((
                    redis::ErrorKind::Client,
                    "not a sentinel",
                    format!(
                        "{} is not a sentinel (it does not know the SENTINEL command): \
                         give the sentinels' addresses",
                        self.sentinels[i].addr()
                    ),
                )))
            }
            Err(e) if e.code() == Some("ERR") => return Ok(None), // no master of that name here
            Err(e) => return Err(named(e)),
        };
        let field = |name: &str| {
            fields
                .chunks(2)
                .find(|pair| pair[0] == name)
                .and_then(|pair| pair.get(1))
        };
        let (Some(ip), Some(port)) = (field("ip"), field("port").and_then(|p| p.parse().ok()))
        else {
            return Ok(None);
        };
        let epoch = field("config-epoch")
            .and_then(|e| e.parse().ok())
            .unwrap_or(0);
        Ok(Some(((ip.clone(), port), epoch)))
    }

    /// A connection to the current master, made within `limit`, and the epoch and address
    /// it belongs to. The server must say it is a master: one the sentinels just named
    /// may still be a replica for a moment, and a replica grants nothing.
    pub(crate) fn connect_master(
        &self,
        limit: Instant,
        timeout: Duration,
    ) -> RedisResult<(Connection, u64, Addr)> {
        let (con, _, epoch, addr) = self.master(limit, timeout)?;
        Ok((con, epoch, addr))
    }

    /// [`connect_master`](Self::connect_master)'s checks, for a connection made elsewhere
    /// (async): where the master is, and the epoch.
    #[cfg(feature = "tokio")]
    pub(crate) fn locate(
        &self,
        limit: Instant,
        timeout: Duration,
    ) -> RedisResult<(ConnectionInfo, u64, Addr)> {
        let (_, info, epoch, addr) = self.master(limit, timeout)?;
        Ok((info, epoch, addr))
    }

    fn master(
        &self,
        limit: Instant,
        timeout: Duration,
    ) -> RedisResult<(Connection, ConnectionInfo, u64, Addr)> {
        let epoch = self.view().epoch();
        let (addr, info) = self.ask(limit)?;
        let started = Instant::now();
        let named = |e| at_server(e, &server_name(&addr), allowed(started, limit, timeout));
        let mut con = connect_within(&info, limit).map_err(named)?;
        let role: Vec<Value> = redis::cmd("ROLE").query(&mut con).map_err(named)?;
        match role.first() {
            Some(Value::BulkString(r)) if r == b"master" => Ok((con, info, epoch, addr)),
            Some(Value::SimpleString(r)) if r == "master" => Ok((con, info, epoch, addr)),
            _ => Err(redis::RedisError::from(std::io::Error::other(format!(
                "{}:{} is named master of {:?} by the sentinels but is not one (yet)",
                addr.0, addr.1, self.name
            )))),
        }
    }

    /// [`vouch`](Self::vouch) without asking anyone: `None` if the sentinels must be asked.
    pub(crate) fn vouch_quick(&self, epoch: u64, sent: Instant) -> Option<bool> {
        let view = self.view();
        if view.epoch() != epoch {
            return Some(false);
        }
        (view.healthy() && sent.elapsed() < STALL).then_some(true)
    }

    /// Whether a reply that `addr` sent on a connection of `epoch`, to a request sent at
    /// `sent`, comes from the master *now*: the epoch is current, and either a sentinel
    /// was heard lately and the reply was quick, or every sentinel that answers within
    /// `limit` names `addr`.
    pub(crate) fn vouch(
        &self,
        epoch: u64,
        addr: &Addr,
        sent: Instant,
        limit: Instant,
    ) -> RedisResult<bool> {
        if let Some(verdict) = self.vouch_quick(epoch, sent) {
            return Ok(verdict);
        }
        let view = self.view();
        let mut answered = 0;
        let mut last = None;
        for (_, answer) in self.ask_all(limit) {
            match answer {
                Ok(Some((named, _))) if &named == addr => answered += 1,
                Ok(_) => return Ok(false),
                Err(e) => last = Some(e),
            }
        }
        if answered == 0 {
            return Err(last.unwrap_or_else(|| {
                redis::RedisError::from(std::io::Error::other("no sentinel answered"))
            }));
        }
        Ok(view.epoch() == epoch)
    }
}

/// Whether an event's payload is about the master `name`: `+switch-master NAME ...`, or
/// instance details `master NAME ...` / `TYPE NAME IP PORT @ MASTER-NAME ...`.
fn about(payload: &str, name: &str) -> bool {
    let words: Vec<&str> = payload.split(' ').collect();
    match words.iter().position(|w| *w == "@") {
        Some(at) => words.get(at + 1) == Some(&name),
        None => words.first() == Some(&name) || words.get(1) == Some(&name),
    }
}

/// A watcher thread: listens to one sentinel until the view is gone.
fn watch(name: &str, info: &ConnectionInfo, view: &Weak<View>) {
    let mut pause = Duration::from_millis(50);
    while view.strong_count() > 0 {
        if listen(name, info, view).is_ok() {
            return; // the view is gone
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}

/// Subscribes and pings until an error (`Err`) or until the view is gone (`Ok`).
fn listen(name: &str, info: &ConnectionInfo, view: &Weak<View>) -> RedisResult<()> {
    let mut con = connect_within(info, Instant::now() + Duration::from_secs(1))?;
    let mut pubsub = con.as_pubsub();
    pubsub.subscribe(&EVENTS[..])?;
    loop {
        let Some(v) = view.upgrade() else {
            return Ok(());
        };
        pubsub.set_read_timeout(Some(Duration::from_secs(1)))?;
        // The sentinel answered this ping after every event it published before it: as of
        // the time the ping was sent, at least, this process has heard them all.
        let asked = Instant::now();
        let _: Value = pubsub.ping()?;
        let answered = Instant::now();
        // The events that came before the ping's answer first (they were read with it),
        // then any until the next ping.
        let next = answered + PING_EVERY;
        while let Some(wait) = left(next) {
            pubsub.set_read_timeout(Some(wait.max(Duration::from_millis(1))))?;
            match pubsub.get_message() {
                Ok(msg) => {
                    let payload: String = msg.get_payload().unwrap_or_default();
                    if about(&payload, name) {
                        v.switched();
                    }
                }
                Err(e) if e.is_timeout() => break,
                Err(e) => return Err(e),
            }
        }
        v.heard_at(asked);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_matched_to_their_master() {
        assert!(about("mymaster 127.0.0.1 6379 127.0.0.1 6380", "mymaster"));
        assert!(about(
            "master mymaster 127.0.0.1 6379 #quorum 2/2",
            "mymaster"
        ));
        assert!(about(
            "slave 127.0.0.1:6380 127.0.0.1 6380 @ mymaster 127.0.0.1 6379",
            "mymaster"
        ));
        assert!(!about(
            "slave 127.0.0.1:6380 127.0.0.1 6380 @ other 127.0.0.1 6379",
            "mymaster"
        ));
        assert!(!about("other 127.0.0.1 6379 127.0.0.1 6380", "mymaster"));
        assert!(!about("", "mymaster"));
    }
}
