//! The Redis backend: the same locks, shared by many machines through Redis: one server, a
//! master that Sentinel fails over, or a Cluster.
//!
//! A hold is a key taken by a script that sets it only if absent (`SET NX PX`), where the
//! value starts with a 128-bit token no other acquisition shares and goes on with who holds
//! it (`identity`). The script also refuses an attempt that reaches the server after the
//! attempt's deadline (in the server's own time, see `server_clock`), or that its maker
//! already cancelled, so that an attempt whose reply never came can always be undone (see
//! `scripts::CANCEL`). Release and renewal are scripts that compare the token first, so a
//! holder whose lease ran out never deletes or extends its successor's key. The fencing
//! token is taken when first asked for, as on the table, and never below the server's
//! clock in µs, so it never repeats. All keys of a lock share a cluster hash tag. With
//! [`RedisLocks::with_replicas`], every write that grants something (a hold, a renewal, a
//! token) is acknowledged by replicas before it is handed out.
//!
//! Layout: `topology` (where commands go) and `sentinel` (following a master and hearing
//! of failovers), `conn` (the shared connections, kept per process: see `per_process`)
//! and `aio` (async ones), `server_clock`, `janitor` (releases nobody waits for), `scripts`, `identity` (the stored value), `ops` (the operations on a hold) and
//! `async_ops`.

#[cfg(feature = "tokio")]
mod aio;
#[cfg(feature = "tokio")]
mod async_ops;
#[cfg(feature = "tokio")]
mod async_wait;
mod cluster;
mod conn;
mod identity;
mod janitor;
mod net;
mod ops;

mod scripts;
mod sentinel;
mod server_clock;
pub(crate) mod shared;
mod topology;

use std::borrow::Borrow;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use redis::{Client, IntoConnectionInfo, Value};

use crate::error::Error;
use crate::lock::options::LockOptions;
use crate::lock::wait::CENTURY;
use crate::lock::{self, LockGuard};
use crate::shm::HoldMode;

use conn::Pool;

use scripts::Lua;
use topology::{Shared, Topology};

/// Locks in Redis. A cheap `Clone` handle, `Send + Sync`, meant to be shared: any number
/// of threads may lock, unlock and wait through one handle at once, and a handle opened
/// before `fork()` works in every child (each process makes its own connections).
///
/// The threads of a handle share its connections: a command takes an idle connection (or
/// makes one) and gives it back, so threads running commands at the same time each have
/// their own and never queue behind one another; a waiting thread subscribes to its key's
/// release channel on a connection of its own. A connection that fails is dropped (with
/// the idle ones) and made anew by the next command, on the master that is current then.
///
/// ```no_run
/// use shmlock::{Lock, LockOptions, RedisLocks};
///
/// let redis = RedisLocks::open("redis://127.0.0.1:6379/")?.with_prefix("myapp:");
/// let mut lock = Lock::new(&redis, LockOptions::default())?;
/// let elapsed = lock.lock("report:nightly")?;
/// let token = lock.token(); // fencing token, taken from the server on first ask
/// lock.unlock()?;
/// # Ok::<(), shmlock::Error>(())
/// ```
#[derive(Clone)]
pub struct RedisLocks(Arc<Inner>);

impl std::fmt::Debug for RedisLocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLocks")
            .field("prefix", &String::from_utf8_lossy(&self.0.prefix))
            .field("timeout", &self.0.pool.timeout)
            .field("replicas", &self.0.replicas)
            .field("max_hold", &self.0.max_hold)
            .field("fence_grace", &self.0.fence_grace)
            .finish_non_exhaustive()
    }
}

/// What a [`RedisLocks`] and its clones share.
struct Inner {
    pool: Arc<Pool>,
    prefix: Vec<u8>,
    /// `WAIT` for this many replicas, this long, after every granting write.
    replicas: Option<(u32, Duration)>,
    /// No hold is renewed past this long after it was taken.
    max_hold: Option<Duration>,
    /// How long a fence counter outlives the lease of the hold that last took a token.
    fence_grace: Duration,
    scripts: Arc<Scripts>,
    /// What this handle (and the handles derived from it) did, in this process: one cell
    /// of the counters a table keeps in its file (see `shm/counters.rs`).
    counters: Arc<[AtomicU64]>,
}

/// The scripts, loaded once per handle family.
struct Scripts {
    acquire: Lua,
    cancel: Lua,
    release: Lua,
    extend: Lua,
    token: Lua,
    check: Lua,
    force: Lua,
    blocked: Lua,
    held: Lua,
    downgrade: Lua,
    force_process: Lua,
}

/// A lock held in Redis, as [`RedisLocks::holders`] reports it. The identity fields are
/// `None` when the stored value does not tell (written by something else, or by an older
/// version).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisHolder {
    /// The key (without the prefix).
    pub key: Vec<u8>,
    /// Time left on the lease; `None` if it never expires.
    pub ttl: Option<Duration>,
    /// The fencing token most recently handed out for the key (the holder's, unless the
    /// lock was broken and not taken again). `None` if none was (or the counter expired),
    /// or if the counter holds something that is not a number.
    pub last_token: Option<u64>,
    /// The holder's own fencing token, if it took one.
    pub token: Option<u64>,
    /// The holder's host name.
    pub host: Option<String>,
    /// The holder's process id (on its host).
    pub pid: Option<u32>,
    /// When the hold was taken, by the holder's clock.
    pub since: Option<SystemTime>,
    /// The address of the master that holds the key (a Cluster); empty otherwise.
    pub node: String,
    /// How it holds the key: exclusively, as a reader, or as one of a semaphore's permits.
    pub mode: HoldMode,
    /// The Redis type of the value at the lock key when it is not a hold this crate wrote
    /// there (`list`, `hash`, ..., or `string` for a string that is not a hold's value:
    /// something else wrote it, and the identity fields are `None`).
    pub foreign_type: Option<String>,
}

/// A key's shared holds as `holders` reads them: the leases (token, end), the hash of
/// values, and the fence counter.
type SharedKeys = (
    Vec<(Vec<u8>, String)>,
    Vec<(Vec<u8>, Vec<u8>)>,
    Option<Vec<u8>>,
);

/// The holder of `key`'s exclusive hold, from its lock key's `value` and PTTL (`-1`: no
/// expiry) and the fence counter, on master `node`.
fn exclusive_holder(
    key: Vec<u8>,
    value: &[u8],
    pttl: i64,
    fence: Option<&[u8]>,
    node: &str,
) -> RedisHolder {
    let id = identity::parse(value);
    RedisHolder {
        key,
        ttl: u64::try_from(pttl).ok().map(Duration::from_millis),
        last_token: fence.and_then(|f| std::str::from_utf8(f).ok()?.parse().ok()),
        token: id.token,
        host: id.host,
        pid: id.pid,
        since: id.since,
        node: node.to_string(),
        mode: HoldMode::Exclusive,
        foreign_type: None,
    }
}

/// Adds to `out` the live shared holds of `key` (readers or permits) in `read`, whose
/// leases end at server times in µs, `now` being the server's time, on master `node`.
fn shared_entries(
    key: &[u8],
    (holds, values, fence): SharedKeys,
    now: f64,
    node: &str,
    out: &mut Vec<RedisHolder>,
) {
    let field = |f: &[u8]| values.iter().find(|(k, _)| k == f).map(|(_, v)| v);
    let limit = field(b"limit")
        .and_then(|l| std::str::from_utf8(l).ok()?.parse::<u32>().ok())
        .unwrap_or(0);
    let mode = match limit {
        0 => HoldMode::Shared,
        permits => HoldMode::Permit { permits },
    };
    for (token, end) in holds {
        let ttl = match end.as_str() {
            "inf" => None,
            end => match end.parse::<f64>() {
                Ok(end) if end > now => Some(Duration::from_micros((end - now) as u64)),
                _ => continue, // lapsed, not yet dropped
            },
        };
        let id = field(&token)
            .map(|v| identity::parse(v))
            .unwrap_or_default();
        out.push(RedisHolder {
            key: key.to_vec(),
            ttl,
            last_token: fence
                .as_deref()
                .and_then(|f| std::str::from_utf8(f).ok()?.parse().ok()),
            token: None,
            host: id.host,
            pid: id.pid,
            since: id.since,
            node: node.to_string(),
            mode,
            foreign_type: None,
        });
    }
}

/// A lock key's `TYPE` reply, if its value (`value`, for a string) is not a hold this crate
/// wrote there (nor `none`).
fn foreign_type(kind: &Value, value: &Value) -> Option<String> {
    let kind: String = redis::from_redis_value(kind.clone()).ok()?;
    let hold = match value {
        Value::BulkString(v) => identity::is_hold(v),
        _ => false,
    };
    (kind != "none" && !(kind == "string" && hold)).then_some(kind)
}

/// A reply of another shape than the command's (a server that is not Redis, or a script
/// of another version under the same name): a Redis error, not the caller's.
fn unexpected_reply(what: &'static str) -> Error {
    Error::Redis(redis::RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        what,
    )))
}

/// `*`, `?`, `[`, `]` and `\` are glob syntax in SCAN MATCH: escape them in the prefix.
fn escape_glob(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    for &b in s {
        if matches!(b, b'*' | b'?' | b'[' | b']' | b'\\') {
            out.push(b'\\');
        }
        out.push(b);
    }
    out
}

/// The default time one command may take.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// The default time a fence counter outlives the lease of the last hold that was fenced.
const DEFAULT_FENCE_GRACE: Duration = Duration::from_secs(60);

impl RedisLocks {
    /// Connects to the server at `url` (`redis://[user:password@]host:port/db`, or
    /// `rediss://` for TLS with the `redis-tls` feature, checked against the system's
    /// root certificates or those in `$SSL_CERT_FILE`). A connection is made now, so a
    /// wrong address or password is an error here.
    pub fn open(url: &str) -> Result<RedisLocks, Error> {
        RedisLocks::with_topology(Topology::Single(Client::open(url)?))
    }

    /// [`open`](Self::open) for a `rediss://` URL whose server certificate is signed by
    /// `root_cert_pem` (a PEM file's contents), such as a private certificate authority.
    ///
    /// ```no_run
    /// # use shmlock::RedisLocks;
    /// let ca = std::fs::read("/etc/redis/ca.crt").unwrap();
    /// let redis = RedisLocks::open_with_root_cert("rediss://:secret@redis.internal:6380/", &ca)?;
    /// # Ok::<(), shmlock::Error>(())
    /// ```
    #[cfg(feature = "redis-tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-tls")))]
    pub fn open_with_root_cert(url: &str, root_cert_pem: &[u8]) -> Result<RedisLocks, Error> {
        let certs = redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(root_cert_pem.to_vec()),
        };
        RedisLocks::with_topology(Topology::Single(Client::build_with_tls(url, certs)?))
    }

    /// Follows the master that the sentinels at `sentinel_urls` know as `master_name`.
    /// A new connection asks them which server is master now (and checks that it says so),
    /// and one thread per sentinel listens for their failover announcements: a connection
    /// to a master the sentinels have given up on is dropped, and a grant that comes back
    /// on one is not accepted (see the README's topology table for what remains possible
    /// without [`with_replicas`](Self::with_replicas)). The masters' password, database and
    /// TLS come from the first sentinel URL (`redis://:password@sentinel-host:26379/db`).
    ///
    /// ```no_run
    /// # use shmlock::RedisLocks;
    /// let redis = RedisLocks::open_sentinel(
    ///     "mymaster",
    ///     &["redis://10.0.0.1:26379/", "redis://10.0.0.2:26379/", "redis://10.0.0.3:26379/"],
    /// )?;
    /// # Ok::<(), shmlock::Error>(())
    /// ```
    pub fn open_sentinel(
        master_name: &str,
        sentinel_urls: &[impl AsRef<str>],
    ) -> Result<RedisLocks, Error> {
        if sentinel_urls.is_empty() {
            return Err(Error::InvalidOptions("open_sentinel needs a sentinel URL"));
        }
        let infos = sentinel_urls
            .iter()
            .map(|u| u.as_ref().into_connection_info())
            .collect::<Result<Vec<_>, _>>()?;
        RedisLocks::with_topology(conn::sentinel_topology(master_name, infos))
    }

    /// Uses the Redis Cluster that `node_urls` (some of its nodes) belong to. Each
    /// command goes to the master of its key's slot (all keys of one lock share a hash
    /// tag); [`holders`](Self::holders) asks every master.
    ///
    /// ```no_run
    /// # use shmlock::RedisLocks;
    /// let redis = RedisLocks::open_cluster(&["redis://10.0.0.1:7000/", "redis://10.0.0.2:7000/"])?;
    /// # Ok::<(), shmlock::Error>(())
    /// ```
    pub fn open_cluster(node_urls: &[impl AsRef<str>]) -> Result<RedisLocks, Error> {
        if node_urls.is_empty() {
            return Err(Error::InvalidOptions("open_cluster needs a node URL"));
        }
        let nodes = node_urls
            .iter()
            .map(|u| u.as_ref().into_connection_info())
            .collect::<Result<Vec<_>, _>>()?;
        RedisLocks::with_topology(Topology::Cluster(Arc::new(cluster::Slots::new(nodes))))
    }

    fn with_topology(topology: Topology) -> Result<RedisLocks, Error> {
        let pool = Arc::new(Pool::new(Arc::new(Shared::new(topology)), DEFAULT_TIMEOUT));
        pool.check()?;
        let scripts = Arc::new(Scripts {
            acquire: Lua::new(scripts::ACQUIRE),
            cancel: Lua::new(scripts::CANCEL),
            release: Lua::new(scripts::RELEASE),
            extend: Lua::new(scripts::EXTEND),
            token: Lua::new(scripts::TOKEN),
            check: Lua::new(scripts::CHECK),
            force: Lua::new(scripts::FORCE),
            blocked: Lua::new(scripts::BLOCKED),
            held: Lua::new(scripts::HELD),
            downgrade: Lua::new(scripts::DOWNGRADE),
            force_process: Lua::new(scripts::FORCE_PROCESS),
        });
        Ok(RedisLocks(Arc::new(Inner {
            pool,
            prefix: b"shmlock:".to_vec(),
            replicas: None,
            max_hold: None,
            fence_grace: DEFAULT_FENCE_GRACE,
            scripts,
            counters: (0..crate::shm::counters::CELL_WORDS)
                .map(|_| AtomicU64::new(0))
                .collect(),
        })))
    }

    /// A new handle with `change` made to a copy of this one's settings.
    fn derive(&self, change: impl FnOnce(&mut Inner)) -> RedisLocks {
        let mut inner = Inner {
            pool: self.0.pool.clone(),
            prefix: self.0.prefix.clone(),
            replicas: self.0.replicas,
            max_hold: self.0.max_hold,
            fence_grace: self.0.fence_grace,
            scripts: self.0.scripts.clone(),
            counters: self.0.counters.clone(),
        };
        change(&mut inner);
        RedisLocks(Arc::new(inner))
    }

    /// Names every key `PREFIX{KEY}` (default prefix `shmlock:`). Returns a new handle
    /// sharing this one's connections.
    pub fn with_prefix(&self, prefix: impl AsRef<[u8]>) -> Self {
        self.derive(|i| i.prefix = prefix.as_ref().to_vec())
    }

    /// How long one command may take before it fails with a timeout (default 5 s): the
    /// connection it needs, a master lookup, the request and its reply. Returns a new
    /// handle with connections of its own. Longer than a century (`Duration::MAX`) is a
    /// century, as for [`with_fence_grace`](Self::with_fence_grace) and
    /// [`with_replicas`](Self::with_replicas)' timeout.
    pub fn with_timeout(&self, timeout: Duration) -> Self {
        let timeout = timeout.clamp(Duration::from_millis(1), CENTURY);
        self.derive(|i| i.pool = Arc::new(i.pool.renew(timeout)))
    }

    /// How long a key's fence counter is kept after the lease of the last hold that took a
    /// token (default 60 s), so that Redis does not keep one counter for every key name
    /// ever fenced. A counter that expired costs nothing: tokens are never below the
    /// server's clock in µs, so the next one is still greater than every earlier one (as
    /// long as the server's clock has not been set back by more than this grace).
    pub fn with_fence_grace(&self, grace: Duration) -> Self {
        self.derive(|i| i.fence_grace = grace.clamp(Duration::from_millis(1), CENTURY))
    }

    /// Replicated grants: every acquisition, renewal and fencing token waits (`WAIT`)
    /// until `replicas` replicas have the write, for at most `timeout`. If fewer
    /// acknowledge it in time the request fails with [`Error::NotReplicated`]; an
    /// acquisition then releases the key it took, and a token is not handed out.
    ///
    /// What this buys, with Sentinel (see docs/redis.md, "Replicated grants"): a hold or
    /// token handed out is on `replicas` replicas, so if the master dies and one of those
    /// is promoted, the key is still held for the rest of its lease and the fence counter
    /// does not go backwards. Require every replica for that to hold whichever replica is
    /// promoted, and for "never two holders" across a failover that leaves the old master
    /// serving for a while (a planned `SENTINEL FAILOVER`): with fewer, a renewal the old
    /// master serves after the promotion can be acknowledged by a replica that then
    /// follows the new master without it, and another client gets the key during a lease
    /// its holder was told it has. It does not make Redis a consensus system: a holder
    /// paused past its lease still believes it holds the key, which is what fencing
    /// tokens are for.
    ///
    /// The command timeout is raised to `timeout` + 1 s if it is shorter, so that the
    /// `WAIT` is not cut off by it. With a Cluster, the `WAIT` goes to the master of the
    /// key's slot, on the connection that made the write.
    pub fn with_replicas(&self, replicas: u32, timeout: Duration) -> Self {
        let timeout = timeout.clamp(Duration::from_millis(1), CENTURY);
        self.derive(|i| {
            if i.pool.timeout < timeout + Duration::from_secs(1) {
                i.pool = Arc::new(i.pool.renew(timeout + Duration::from_secs(1)));
            }
            i.replicas = (replicas > 0).then_some((replicas, timeout));
        })
    }

    /// Caps how long any hold taken through the returned handle may be kept by renewing:
    /// no lease is set or renewed past `max_hold` after the hold was taken, and a renewal
    /// at or after that point fails with [`Error::MaxHoldReached`] (so
    /// [`LockGuard::keep_alive`] stops renewing and reports it). A hung job cannot keep a
    /// lock forever.
    pub fn with_max_hold(&self, max_hold: Duration) -> Self {
        self.derive(|i| i.max_hold = Some(max_hold))
    }

    /// Takes `key`, waiting as `opts` says; released when the guard drops. With a timeout
    /// T and `notify` (the default), it returns within T and 200 ms, whatever the server
    /// does (stopped, slow, behind a proxy that holds replies back): every connect, lookup,
    /// reply and sleep of the wait is held to its end, but for the last attempt and the
    /// last sleep's unsubscribe, 100 ms each. Polling (`notify: false`) counts resty's steps
    /// and ends by the wall clock within 200 ms past T. See docs/redis.md, "Deadlines", for
    /// what a Cluster and a reply trickled a byte at a time can still stretch.
    pub fn lock(
        &self,
        key: impl AsRef<[u8]>,
        opts: impl Borrow<LockOptions>,
    ) -> Result<LockGuard<'_, RedisLocks>, Error> {
        let opts = opts.borrow();
        lock::guard(self, key.as_ref(), opts, Some(opts.timeout))
    }

    /// Takes `key` if nobody holds it, without waiting, for a lease of `lease` (zero:
    /// never expires). `Ok(None)` if it is held.
    pub fn try_lock_with_lease(
        &self,
        key: impl AsRef<[u8]>,
        lease: Duration,
    ) -> Result<Option<LockGuard<'_, RedisLocks>>, Error> {
        lock::try_guard(self, key.as_ref(), lease)
    }

    /// The old name of [`try_lock_with_lease`](Self::try_lock_with_lease): its duration
    /// is the lease, not a wait.
    #[deprecated(
        since = "0.2.0",
        note = "the duration is a lease, not a wait: use try_lock_with_lease"
    )]
    pub fn try_lock(
        &self,
        key: impl AsRef<[u8]>,
        exptime: Duration,
    ) -> Result<Option<LockGuard<'_, RedisLocks>>, Error> {
        self.try_lock_with_lease(key, exptime)
    }

    /// Whether someone holds `key` right now, exclusively or shared (a snapshot).
    pub fn is_locked(&self, key: impl AsRef<[u8]>) -> Result<bool, Error> {
        let names = self.names_of(key.as_ref())?;
        let n: u64 = self
            .0
            .pool
            .run_through_stops(|r| {
                r.query(redis::cmd("EXISTS").arg(&names.lock).arg(&names.leases))
            })?
            .value;
        Ok(n == 1)
    }

    /// What this handle, the handles derived from it (`with_prefix`, ...) and their clones
    /// did in this process: keys taken, contended, timed out, holds found lost at renewal,
    /// how long waits and holds took (every hold, from its grant to its release). Kept in
    /// the process, not on the server: each process counts its own.
    pub fn stats(&self) -> crate::stats::LockStats {
        crate::stats::LockStats::from_totals(&self.counters().totals())
    }

    pub(crate) fn counters(&self) -> crate::shm::counters::Cells<'_> {
        crate::shm::counters::Cells(&self.0.counters)
    }

    /// The locks held under this prefix, on every master (SCAN: a snapshot, fine for
    /// inspection): each exclusive holder, reader and permit holder. A key or fence counter
    /// holding something else than this crate writes gives a holder with the unknown
    /// fields `None`, not an error. Readers and permit holders have no token of their own
    /// (`token` is `None`).
    pub fn holders(&self) -> Result<Vec<RedisHolder>, Error> {
        let mut out = Vec::new();
        for (node, server, mut conn) in self.0.pool.masters()? {
            // (errors named by the master that failed, as a command's are)
            self.holders_on(&node, &mut conn, &mut out)
                .map_err(|e| match e {
                    Error::Redis(e) => {
                        Error::Redis(net::at_server(e, &server, self.0.pool.timeout))
                    }
                    e => e,
                })?;
        }
        Ok(out)
    }

    /// The holders on one master (see [`holders`](Self::holders)).
    fn holders_on(
        &self,
        node: &str,
        conn: &mut redis::Connection,
        out: &mut Vec<RedisHolder>,
    ) -> Result<(), Error> {
        for lock_key in self.scan(conn, b"")? {
            let name = self.key_of(&lock_key);
            let names = self.names(&name);
            let replies: Vec<Value> = redis::pipe()
                .ignore_errors()
                .cmd("PTTL")
                .arg(&lock_key)
                .cmd("GET")
                .arg(&lock_key)
                .cmd("GET")
                .arg(&names.fence)
                .cmd("TYPE")
                .arg(&lock_key)
                .query(conn)?;
            let [pttl, value, fence, kind] = <[Value; 4]>::try_from(replies)
                .map_err(|_| unexpected_reply("unexpected reply to PTTL/GET/GET/TYPE"))?;
            let pttl = match pttl {
                Value::Int(n) => n,
                _ => -1,
            };
            if pttl == -2 {
                continue; // gone since the scan
            }
            let bytes = |v: &Value| match v {
                Value::BulkString(b) => Some(b.clone()),
                _ => None,
            };
            let mut holder = exclusive_holder(
                name,
                &bytes(&value).unwrap_or_default(),
                pttl,
                bytes(&fence).as_deref(),
                node,
            );
            holder.foreign_type = foreign_type(&kind, &value);
            out.push(holder);
        }
        self.shared_holders(node, conn, out)
    }

    /// The names on `conn`'s master of this prefix's lock keys followed by `suffix`
    /// (`PREFIX{KEY}SUFFIX`; SCAN: a snapshot).
    fn scan(&self, conn: &mut redis::Connection, suffix: &[u8]) -> Result<Vec<Vec<u8>>, Error> {
        let mut pattern = escape_glob(&self.0.prefix);
        pattern.extend_from_slice(b"{*}");
        pattern.extend_from_slice(suffix);
        Ok(redis::cmd("SCAN")
            .cursor_arg(0)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .clone()
            .iter(conn)?
            .collect::<redis::RedisResult<Vec<Vec<u8>>>>()?)
    }

    /// The key of a lock key `PREFIX{KEY}`.
    fn key_of(&self, lock_key: &[u8]) -> Vec<u8> {
        lock_key[self.0.prefix.len() + 1..lock_key.len() - 1].to_vec()
    }

    /// The readers and permit holders on one master (see [`holders`](Self::holders)).
    fn shared_holders(
        &self,
        node: &str,
        conn: &mut redis::Connection,
        out: &mut Vec<RedisHolder>,
    ) -> Result<(), Error> {
        const LEASES: &[u8] = b":leases";
        let keys = self.scan(conn, LEASES)?;
        let (s, us): (String, String) = redis::cmd("TIME").query(&mut *conn)?;
        let now = server_clock::server_us(&s, &us).unwrap_or(0) as f64;
        for leases in keys {
            let name = self.key_of(&leases[..leases.len() - LEASES.len()]);
            let names = self.names(&name);
            let read: SharedKeys = redis::pipe()
                .cmd("ZRANGE")
                .arg(&leases)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES")
                .cmd("HGETALL")
                .arg(&names.shared)
                .cmd("GET")
                .arg(&names.fence)
                .query(&mut *conn)?;
            shared_entries(&name, read, now, node, out);
        }
        Ok(())
    }

    /// Breaks the lock on `key`, whoever holds it (every reader or permit holder of it
    /// too); `true` if it was held. Its holders find out at their next unlock or renewal
    /// ([`Error::Expired`]).
    pub fn force_unlock(&self, key: impl AsRef<[u8]>) -> Result<bool, Error> {
        Ok(self.force(key.as_ref())?.0 > 0)
    }

    /// [`force_unlock`](Self::force_unlock), returning whom the key was taken from: each
    /// hold as [`holders`](Self::holders) would have listed it (`node` empty), read in the
    /// same step as it was broken; none if the key was not held.
    ///
    /// ```no_run
    /// # use shmlock::RedisLocks;
    /// let redis = RedisLocks::open("redis://127.0.0.1/")?;
    /// for h in redis.force_unlock_holders("nightly-report")? {
    ///     println!("broke the hold of pid {:?} on {:?}", h.pid, h.host);
    /// }
    /// # Ok::<(), shmlock::Error>(())
    /// ```
    pub fn force_unlock_holders(&self, key: impl AsRef<[u8]>) -> Result<Vec<RedisHolder>, Error> {
        Ok(self.force(key.as_ref())?.1)
    }

    /// Breaks every hold of `key`: how many holds there were (lapsed leases not yet
    /// dropped included), and the live ones.
    fn force(&self, key: &[u8]) -> Result<(u64, Vec<RedisHolder>), Error> {
        let names = self.names_of(key)?;
        let reply: Value = self.run_script(
            &self
                .0
                .scripts
                .force
                .call()
                .key(&names.lock)
                .key(&names.channel)
                .key(&names.shared)
                .key(&names.leases)
                .key(&names.writer)
                .key(&names.readers)
                .key(&names.fence),
        )?;
        let unexpected = || unexpected_reply("unexpected reply to the force script");
        let Value::Array(parts) = reply else {
            return Err(unexpected());
        };
        let [n, value, pttl, shared, leases, fence, time, kind] =
            <[Value; 8]>::try_from(parts).map_err(|_| unexpected())?;
        let (Value::Int(n), Value::Int(pttl)) = (n, pttl) else {
            return Err(unexpected());
        };
        let values: Vec<(Vec<u8>, Vec<u8>)> =
            redis::from_redis_value(shared).map_err(|_| unexpected())?;
        let holds: Vec<(Vec<u8>, String)> =
            redis::from_redis_value(leases).map_err(|_| unexpected())?;
        let fence: Option<Vec<u8>> = redis::from_redis_value(fence).map_err(|_| unexpected())?;
        let (s, us): (String, String) = redis::from_redis_value(time).map_err(|_| unexpected())?;
        let now = server_clock::server_us(&s, &us).unwrap_or(0) as f64;
        let mut out = Vec::new();
        let foreign = foreign_type(&kind, &value);
        if let Value::BulkString(v) = &value {
            let mut h = exclusive_holder(key.to_vec(), v, pttl, fence.as_deref(), "");
            h.foreign_type = foreign;
            out.push(h);
        } else if foreign.is_some() {
            // a value of another type, which the script removed all the same
            let mut h = exclusive_holder(key.to_vec(), b"", pttl, fence.as_deref(), "");
            h.foreign_type = foreign;
            out.push(h);
        }
        shared_entries(key, (holds, values, fence), now, "", &mut out);
        Ok((u64::try_from(n).unwrap_or(0), out))
    }

    /// Breaks the holds of `key` that process `pid` on `host` (`None`: this host, named as
    /// this crate names it in the values it writes) took: its exclusive hold, or its read
    /// holds and permits, leaving every other holder of the key alone. How many were
    /// broken. Their holder finds out at its next unlock or renewal.
    pub fn force_unlock_process(
        &self,
        key: impl AsRef<[u8]>,
        host: Option<&str>,
        pid: u32,
    ) -> Result<usize, Error> {
        let names = self.names_of(key.as_ref())?;
        let host = host.unwrap_or_else(|| identity::host_name());
        let n: u64 = self
            .run_script(
                &self
                    .0
                    .scripts
                    .force_process
                    .call()
                    .key(&names.lock)
                    .key(&names.channel)
                    .key(&names.shared)
                    .key(&names.leases)
                    .arg(pid)
                    .arg(host),
            )
            .map_err(|e| self.wrong_type(key.as_ref(), e, None))?;
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }

    /// Runs a script that grants nothing, once more on a fresh connection if the first
    /// one broke.
    pub(crate) fn run_script<T: redis::FromRedisValue>(
        &self,
        call: &scripts::Call<'_>,
    ) -> Result<T, Error> {
        Ok(self.0.pool.retrying(|r| r.call(call))?.value)
    }
}
