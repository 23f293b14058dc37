//! The Redis backend: the same locks, shared by many machines through Redis: one server, a
//! master that Sentinel fails over, or a Cluster.
//!
//! A hold is a key set with `SET key value NX PX ttl` (one round trip), where the value
//! starts with a 128-bit token no other acquisition shares and goes on with who holds it
//! (`identity`). Release and renewal are scripts that compare the token first, so a holder
//! whose lease ran out never deletes or extends its successor's key. The fencing token is
//! taken when first asked for, as on the table: a script `INCR`s the key's counter only
//! while the key still holds our token, so a holder that lost its lease gets none. All keys
//! of a lock share a cluster hash tag. With [`RedisLocks::with_replicas`], every write that
//! grants something (a hold, a renewal, a token) is acknowledged by replicas before it is
//! handed out.
//!
//! Layout: `conn` (topologies and the shared connections), `scripts`, `identity` (the
//! stored value).

mod conn;
mod identity;
mod scripts;

use std::borrow::Borrow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use redis::{Client, ConnectionLike, IntoConnectionInfo, Script, Value};

use crate::error::Error;
use crate::lock::backend::{Backend, Sealed};
use crate::lock::options::LockOptions;
use crate::lock::slack::TimerSlack;
use crate::lock::{self, LockGuard};

use conn::{Pool, Topology};

/// Locks in Redis. A cheap `Clone` handle, `Send + Sync`, meant to be shared: any number
/// of threads may lock, unlock and wait through one handle at once.
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
            .field("replicas", &self.0.replicas)
            .field("max_hold", &self.0.max_hold)
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
    release: Script,
    extend: Script,
    fence: Script,
    force: Script,
}

/// A hold in Redis: the lock key, this acquisition's token, when it was taken, and its
/// fencing token once asked for (0 before).
#[derive(Clone, Debug)]
pub struct RedisHold {
    key: Vec<u8>,
    channel: Vec<u8>,
    token: String,
    taken: Instant,
    fence: Arc<AtomicU64>,
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
    /// lock was broken and not taken again). `None` if none was, or if the counter holds
    /// something that is not a number.
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

/// A busy attempt on Redis: the key to wait for and its release channel.
#[derive(Debug)]
pub struct RedisBusy {
    key: Vec<u8>,
    channel: Vec<u8>,
}

/// The default time one command may take.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

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

    /// Follows the master that the sentinels at `sentinel_urls` know as `master_name`:
    /// each new connection asks them which server is master now, so after a failover
    /// the next command (after the one that failed with [`Error::Redis`]) goes to the
    /// promoted replica. The masters' password, database and TLS come from the first
    /// sentinel URL (`redis://:password@sentinel-host:26379/db`).
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
        let client = conn::sentinel_client(master_name, infos)?;
        RedisLocks::with_topology(Topology::Sentinel(std::sync::Mutex::new(client)))
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
        let mut builder = redis::cluster::ClusterClientBuilder::new(nodes.clone());
        // a failing node is given up on after about a second, not redis-rs's default
        // sixteen tries
        builder = builder.retries(3).min_retry_wait(50).max_retry_wait(500);
        let client = builder.build()?;
        RedisLocks::with_topology(Topology::Cluster { client, nodes })
    }

    fn with_topology(topology: Topology) -> Result<RedisLocks, Error> {
        let pool = Arc::new(Pool::new(Arc::new(topology), DEFAULT_TIMEOUT));
        pool.check()?;
        Ok(RedisLocks::with(pool, b"shmlock:".to_vec(), None, None))
    }

    fn with(
        pool: Arc<Pool>,
        prefix: Vec<u8>,
        replicas: Option<(u32, Duration)>,
        max_hold: Option<Duration>,
    ) -> RedisLocks {
        RedisLocks(Arc::new(Inner {
            pool,
            prefix,
            replicas,
            max_hold,
            release: Script::new(scripts::RELEASE),
            extend: Script::new(scripts::EXTEND),
            fence: Script::new(scripts::TOKEN),
            force: Script::new(scripts::FORCE),
        }))
    }

    fn derive(
        &self,
        pool: Arc<Pool>,
        prefix: Option<&[u8]>,
        replicas: Option<Option<(u32, Duration)>>,
        max_hold: Option<Option<Duration>>,
    ) -> RedisLocks {
        RedisLocks::with(
            pool,
            prefix.map_or_else(|| self.0.prefix.clone(), <[u8]>::to_vec),
            replicas.unwrap_or(self.0.replicas),
            max_hold.unwrap_or(self.0.max_hold),
        )
    }

    /// Names every key `PREFIX{KEY}` (default prefix `shmlock:`). Returns a new handle
    /// sharing this one's connections.
    pub fn with_prefix(&self, prefix: impl AsRef<[u8]>) -> Self {
        self.derive(self.0.pool.clone(), Some(prefix.as_ref()), None, None)
    }

    /// How long one command may take before it fails with a timeout (default 5 s).
    /// Returns a new handle with connections of its own.
    pub fn with_timeout(&self, timeout: Duration) -> Self {
        self.derive(Arc::new(self.0.pool.renew(timeout)), None, None, None)
    }

    /// Replicated grants: every acquisition, renewal and fencing token waits (`WAIT`)
    /// until `replicas` replicas have the write, for at most `timeout`. If fewer
    /// acknowledge it in time the request fails with [`Error::NotReplicated`]; an
    /// acquisition then releases the key it took, and a token is not handed out.
    ///
    /// What this buys, with Sentinel (see the README's "Many machines"): a hold or token
    /// handed out is on `replicas` replicas, so if the master dies and one of those is
    /// promoted, the key is still held for the rest of its lease and the fence counter
    /// does not go backwards. Require every replica (or set `min-replicas-to-write` on
    /// the servers) for that to hold whichever replica is promoted. It does not make
    /// Redis a consensus system: a holder paused past its lease still believes it holds
    /// the key, which is what fencing tokens are for.
    ///
    /// The command timeout is raised to `timeout` + 1 s if it is shorter, so that the
    /// `WAIT` is not cut off by it. With a Cluster, the `WAIT` goes to every master and the
    /// fewest acknowledgements count.
    pub fn with_replicas(&self, replicas: u32, timeout: Duration) -> Self {
        let timeout = timeout.max(Duration::from_millis(1));
        let pool = if self.0.pool.timeout < timeout + Duration::from_secs(1) {
            Arc::new(self.0.pool.renew(timeout + Duration::from_secs(1)))
        } else {
            self.0.pool.clone()
        };
        let replicas = (replicas > 0).then_some((replicas, timeout));
        self.derive(pool, None, Some(replicas), None)
    }

    /// Caps how long any hold taken through the returned handle may be kept by renewing:
    /// no lease is set or renewed past `max_hold` after the hold was taken, and a renewal
    /// at or after that point fails with [`Error::MaxHoldReached`] (so
    /// [`LockGuard::keep_alive`] stops renewing and reports it). A hung job cannot keep a
    /// lock forever.
    pub fn with_max_hold(&self, max_hold: Duration) -> Self {
        self.derive(self.0.pool.clone(), None, None, Some(Some(max_hold)))
    }

    /// Takes `key`, waiting as `opts` says; released when the guard drops.
    pub fn lock(
        &self,
        key: impl AsRef<[u8]>,
        opts: impl Borrow<LockOptions>,
    ) -> Result<LockGuard<'_, RedisLocks>, Error> {
        let opts = opts.borrow();
        lock::guard(self, key.as_ref(), opts, Some(opts.timeout))
    }

    /// [`lock`](Self::lock) for async code (tokio): attempts go over the handle's
    /// multiplexed async connection (one socket shared by every task of the runtime, no
    /// thread per waiter), the waits are `tokio::time::sleep` on resty's schedule
    /// (elapsed = the sum of the steps). A guard dropped inside a runtime releases on a
    /// spawned task (see [`LockGuard`]'s drop).
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub async fn lock_async(
        &self,
        key: impl AsRef<[u8]>,
        opts: impl Borrow<LockOptions>,
    ) -> Result<LockGuard<'_, RedisLocks>, Error> {
        let opts = opts.borrow();
        let resolved = opts.resolve()?;
        let key = key.as_ref();
        let exptime = resolved.exptime_ns;
        let (hold, elapsed) = crate::lock::backend::acquire_async(
            key,
            &resolved,
            opts.timeout,
            || self.try_acquire_async(key, exptime),
            |_: &RedisBusy| false,
        )
        .await?;
        Ok(LockGuard::new(self, hold, elapsed, exptime))
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

    /// Whether someone holds `key` right now (a snapshot).
    pub fn is_locked(&self, key: impl AsRef<[u8]>) -> Result<bool, Error> {
        let (lock_key, _) = self.keys(crate::check_key(key.as_ref())?);
        let n: u64 = self
            .0
            .pool
            .run(|c| redis::cmd("EXISTS").arg(&lock_key).query(c))?;
        Ok(n == 1)
    }

    /// The locks held under this prefix, on every master (SCAN: a snapshot, fine for
    /// inspection). A key or fence counter holding something else than this crate writes
    /// gives a holder with the unknown fields `None`, not an error.
    pub fn holders(&self) -> Result<Vec<RedisHolder>, Error> {
        let mut pattern = escape_glob(&self.0.prefix);
        pattern.extend_from_slice(b"{*}");
        let mut out = Vec::new();
        for (node, mut conn) in self.0.pool.masters()? {
            let keys: Vec<Vec<u8>> = redis::cmd("SCAN")
                .cursor_arg(0)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .clone()
                .iter(&mut conn)?
                .collect::<redis::RedisResult<Vec<Vec<u8>>>>()?;
            for lock_key in keys {
                let name = lock_key[self.0.prefix.len() + 1..lock_key.len() - 1].to_vec();
                let (_, fence_key) = self.keys(&name);
                let replies: Vec<Value> = redis::pipe()
                    .ignore_errors()
                    .cmd("PTTL")
                    .arg(&lock_key)
                    .cmd("GET")
                    .arg(&lock_key)
                    .cmd("GET")
                    .arg(&fence_key)
                    .query(&mut conn)?;
                let [pttl, value, fence] = <[Value; 3]>::try_from(replies)
                    .map_err(|_| Error::InvalidOptions("unexpected reply to PTTL/GET/GET"))?;
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
                let id = bytes(&value)
                    .map(|v| identity::parse(&v))
                    .unwrap_or_default();
                out.push(RedisHolder {
                    key: name,
                    ttl: u64::try_from(pttl).ok().map(Duration::from_millis),
                    last_token: bytes(&fence)
                        .and_then(|f| std::str::from_utf8(&f).ok()?.parse().ok()),
                    token: id.token,
                    host: id.host,
                    pid: id.pid,
                    since: id.since,
                    node: node.clone(),
                });
            }
        }
        Ok(out)
    }

    /// Breaks the lock on `key`, whoever holds it; `true` if it was held. Its holder finds
    /// out at its next unlock or renewal ([`Error::Expired`]).
    pub fn force_unlock(&self, key: impl AsRef<[u8]>) -> Result<bool, Error> {
        let (lock_key, channel) = self.channel_keys(crate::check_key(key.as_ref())?);
        let n: u64 = self
            .0
            .pool
            .retrying(|c| self.0.force.key(&lock_key).key(&channel).invoke(c))?;
        Ok(n == 1)
    }

    /// `PREFIX{KEY}` and `PREFIX{KEY}:fence`: the braces make one cluster hash tag, so both
    /// land in one slot whatever the key holds (the tag ends at the first `}` after the
    /// first `{`, which lies in the part both names share).
    fn keys(&self, key: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let mut lock_key = Vec::with_capacity(self.0.prefix.len() + key.len() + 2);
        lock_key.extend_from_slice(&self.0.prefix);
        lock_key.push(b'{');
        lock_key.extend_from_slice(key);
        lock_key.push(b'}');
        let mut fence_key = lock_key.clone();
        fence_key.extend_from_slice(b":fence");
        (lock_key, fence_key)
    }

    /// The lock key and the channel its releases are published on.
    fn channel_keys(&self, key: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let (lock_key, _) = self.keys(key);
        let mut channel = lock_key.clone();
        channel.extend_from_slice(b":free");
        (lock_key, channel)
    }

    /// The lease to set for a hold taken `taken` ago, in ms (0: never expires), within
    /// `max_hold`; `None` once `max_hold` is spent.
    fn lease_ms(&self, exptime_ns: u64, held: Duration) -> Option<u64> {
        let ttl = ttl_ms(exptime_ns);
        let Some(max) = self.0.max_hold else {
            return Some(ttl);
        };
        let left = max.saturating_sub(held);
        if left.is_zero() {
            return None;
        }
        let left = u64::try_from(left.as_millis()).unwrap_or(u64::MAX).max(1);
        Some(if ttl == 0 { left } else { ttl.min(left) })
    }

    /// The `WAIT` that follows a granting write on the same connection, if replicas are
    /// required: `Ok(())` when enough acknowledged it.
    fn wait_replicas(&self, c: &mut dyn ConnectionLike) -> redis::RedisResult<Result<(), Error>> {
        let Some((n, timeout)) = self.0.replicas else {
            return Ok(Ok(()));
        };
        let acked: u64 = redis::cmd("WAIT")
            .arg(n)
            .arg(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX))
            .query(c)?;
        Ok(replicated(acked, n))
    }

    /// The fencing token of `hold`, or why there is none.
    fn take_token(&self, hold: &RedisHold) -> Result<u64, Error> {
        let known = hold.fence.load(Ordering::Relaxed);
        if known != 0 {
            return Ok(known);
        }
        let mut fence_key = hold.key.clone();
        fence_key.extend_from_slice(b":fence");
        let (t, enough) = self.0.pool.run(|c| {
            let t: u64 = self
                .0
                .fence
                .key(&hold.key)
                .key(&fence_key)
                .arg(&hold.token)
                .invoke(c)?;
            if t == 0 {
                return Ok((0, Ok(())));
            }
            Ok((t, self.wait_replicas(c)?))
        })?;
        if t == 0 {
            return Err(Error::Expired);
        }
        enough?;
        hold.fence.store(t, Ordering::Relaxed);
        Ok(t)
    }

    /// Subscribes to the release channel of `busy` on `con`, looks once more whether the
    /// key is still held (a release just before the subscription would be missed), and
    /// waits for a message on that channel for at most `step`.
    fn wait_for_release(
        &self,
        con: &mut redis::Connection,
        busy: &RedisBusy,
        step: Duration,
        started: Instant,
    ) -> redis::RedisResult<()> {
        let mut pubsub = con.as_pubsub();
        pubsub.subscribe(&busy.channel)?;
        // (cannot tell: count it as held and wait the step out)
        let held: u64 = self
            .0
            .pool
            .run(|c| redis::cmd("EXISTS").arg(&busy.key).query(c))
            .unwrap_or(1);
        let mut outcome = Ok(());
        if held != 0 {
            loop {
                let left = step.saturating_sub(started.elapsed());
                if left.is_zero() {
                    break;
                }
                pubsub.set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
                match pubsub.get_message() {
                    Ok(msg) => {
                        if msg.get_channel::<Vec<u8>>().ok().as_ref() == Some(&busy.channel) {
                            break;
                        }
                    }
                    Err(e) if e.is_timeout() => break,
                    Err(e) => {
                        outcome = Err(e);
                        break;
                    }
                }
            }
        }
        // dropping `pubsub` unsubscribes, with the command timeout for the replies
        pubsub.set_read_timeout(Some(self.0.pool.timeout))?;
        outcome
    }

    #[cfg(feature = "tokio")]
    async fn try_acquire_async(
        &self,
        key: &[u8],
        exptime_ns: u64,
    ) -> Result<Result<RedisHold, RedisBusy>, Error> {
        let (key, channel) = self.channel_keys(crate::check_key(key)?);
        let (token, value) = identity::new_hold();
        let ttl = self.lease_ms(exptime_ns, Duration::ZERO).unwrap_or(1);
        let mut conn = self.0.pool.aio().await?;
        let set: redis::RedisResult<Option<String>> =
            set_nx(&key, &value, ttl).query_async(&mut conn).await;
        let set = match set {
            Ok(set) => set,
            Err(e) => {
                self.0.pool.aio_failed(&e).await;
                return Err(e.into());
            }
        };
        if set.is_none() {
            return Ok(Err(RedisBusy { key, channel }));
        }
        let hold = RedisHold {
            key,
            channel,
            token,
            taken: Instant::now(),
            fence: Arc::new(AtomicU64::new(0)),
        };
        if let Some((n, timeout)) = self.0.replicas {
            let acked: redis::RedisResult<u64> = redis::cmd("WAIT")
                .arg(n)
                .arg(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX))
                .query_async(&mut conn)
                .await;
            let verdict = match acked {
                Ok(acked) => replicated(acked, n),
                Err(e) => {
                    self.0.pool.aio_failed(&e).await;
                    Err(e.into())
                }
            };
            if let Err(e) = verdict {
                let _ = self.release_async(&hold).await;
                return Err(e);
            }
        }
        Ok(Ok(hold))
    }

    #[cfg(feature = "tokio")]
    async fn release_async(&self, hold: &RedisHold) -> Result<(), Error> {
        let mut conn = self.0.pool.aio().await?;
        let outcome: redis::RedisResult<i64> = self
            .0
            .release
            .key(&hold.key)
            .key(&hold.channel)
            .arg(&hold.token)
            .invoke_async(&mut conn)
            .await;
        match outcome {
            Ok(-1) => Err(Error::Expired),
            Ok(_) => Ok(()),
            Err(e) => {
                self.0.pool.aio_failed(&e).await;
                Err(e.into())
            }
        }
    }
}

/// A hold whose release task has not run: if the runtime drops the task unrun (it is
/// shutting down), the release is made in place, where blocking is allowed again.
#[cfg(feature = "tokio")]
struct ReleaseOnCancel(RedisLocks, Option<RedisHold>);

#[cfg(feature = "tokio")]
impl ReleaseOnCancel {
    fn disarm(&mut self) {
        self.1 = None;
    }
}

#[cfg(feature = "tokio")]
impl Drop for ReleaseOnCancel {
    fn drop(&mut self) {
        if let Some(hold) = self.1.take() {
            let _ = self.0.release(&hold);
        }
    }
}

/// `SET key value NX [PX ttl]` for a new hold.
fn set_nx(key: &[u8], value: &str, ttl_ms: u64) -> redis::Cmd {
    let mut set = redis::cmd("SET");
    set.arg(key).arg(value).arg("NX");
    if ttl_ms != 0 {
        set.arg("PX").arg(ttl_ms);
    }
    set
}

fn replicated(acked: u64, wanted: u32) -> Result<(), Error> {
    if acked >= u64::from(wanted) {
        Ok(())
    } else {
        Err(Error::NotReplicated {
            acked,
            wanted: u64::from(wanted),
        })
    }
}

/// Milliseconds for PX: rounded up, so a lease is never shorter than asked; 0 = no expiry.
fn ttl_ms(exptime_ns: u64) -> u64 {
    exptime_ns.div_ceil(1_000_000)
}

impl Sealed for RedisLocks {}

impl Backend for RedisLocks {
    type Hold = RedisHold;
    type Busy = RedisBusy;

    fn acquire_fast(
        &self,
        _key: &[u8],
        _exptime_ns: u64,
    ) -> Result<Result<RedisHold, Option<RedisBusy>>, Error> {
        Ok(Err(None)) // every attempt is a round trip: there is no cheaper first try
    }

    fn try_acquire(
        &self,
        key: &[u8],
        exptime_ns: u64,
    ) -> Result<Result<RedisHold, RedisBusy>, Error> {
        let (key, channel) = self.channel_keys(crate::check_key(key)?);
        let (token, value) = identity::new_hold();
        let ttl = self.lease_ms(exptime_ns, Duration::ZERO).unwrap_or(1);
        let mut took = false;
        let outcome = self.0.pool.run(|c| {
            let set: Option<String> = set_nx(&key, &value, ttl).query(c)?;
            if set.is_none() {
                return Ok(None);
            }
            took = true;
            Ok(Some(self.wait_replicas(c)?))
        });
        let taken = Instant::now();
        let hold = |key, channel, token| RedisHold {
            key,
            channel,
            token,
            taken,
            fence: Arc::new(AtomicU64::new(0)),
        };
        match outcome {
            Ok(None) => Ok(Err(RedisBusy { key, channel })),
            Ok(Some(Ok(()))) => Ok(Ok(hold(key, channel, token))),
            Ok(Some(Err(e))) | Err(e) => {
                if took {
                    // not granted after all: give back what was taken
                    let _ = self.release(&hold(key, channel, token));
                }
                Err(e)
            }
        }
    }

    fn release(&self, hold: &RedisHold) -> Result<(), Error> {
        // Safe to retry: it only ever deletes the key while it holds our token.
        let outcome: i64 = self.0.pool.retrying(|c| {
            self.0
                .release
                .key(&hold.key)
                .key(&hold.channel)
                .arg(&hold.token)
                .invoke(c)
        })?;
        match outcome {
            -1 => Err(Error::Expired),
            _ => Ok(()), // deleted, or already gone with nobody else holding it
        }
    }

    /// Inside a tokio runtime the release goes to a spawned task over the async connection
    /// (the guard's owner cannot be told the outcome anyway); elsewhere it is made in place.
    fn release_on_drop(&self, hold: &RedisHold) {
        #[cfg(feature = "tokio")]
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let mut pending = ReleaseOnCancel(self.clone(), Some(hold.clone()));
            runtime.spawn(async move {
                if let Some(hold) = pending.1.clone() {
                    let _ = pending.0.release_async(&hold).await;
                }
                pending.disarm(); // released (or told why not): nothing left to do
            });
            return;
        }
        let _ = self.release(hold);
    }

    fn extend(&self, hold: &mut RedisHold, exptime_ns: u64) -> Result<(), Error> {
        let ttl = self
            .lease_ms(exptime_ns, hold.taken.elapsed())
            .ok_or(Error::MaxHoldReached)?;
        let (renewed, enough) = self.0.pool.retrying(|c| {
            let renewed: i64 = self
                .0
                .extend
                .key(&hold.key)
                .arg(&hold.token)
                .arg(ttl)
                .invoke(c)?;
            if renewed != 1 {
                return Ok((renewed, Ok(())));
            }
            Ok((renewed, self.wait_replicas(c)?))
        })?;
        if renewed != 1 {
            return Err(Error::Expired);
        }
        enough
    }

    /// A connection error counts as "no token": nothing proves the hold is still ours.
    fn token(&self, hold: &RedisHold) -> Option<u64> {
        self.take_token(hold).ok()
    }

    fn try_token(&self, hold: &RedisHold) -> Result<u64, Error> {
        self.take_token(hold)
    }

    fn spins(&self) -> bool {
        false
    }

    fn can_notify(&self) -> bool {
        true
    }

    fn reap(&self, _busy: &RedisBusy) -> bool {
        false // the server expires keys itself
    }

    /// Waits on the key's release channel, woken by the release script's PUBLISH; the step
    /// bounds the wait, so a lease that lapses (no message) is seen as when polling. Each
    /// waiting thread subscribes on a connection of its own (from the handle's list of
    /// subscriber connections), so any number can wait at once, each for its own key; any
    /// pub/sub trouble falls back to polling. The thread's timer slack is left as it is.
    fn sleep(
        &self,
        busy: &RedisBusy,
        step: Duration,
        _late: Duration,
        _slack: &mut TimerSlack,
    ) -> (Duration, bool) {
        let started = Instant::now();
        let poll = |started: Instant| {
            std::thread::sleep(step.saturating_sub(started.elapsed()));
            (started.elapsed(), false)
        };
        let Ok(mut con) = self.0.pool.subscriber() else {
            return poll(started);
        };
        match self.wait_for_release(&mut con, busy, step, started) {
            Ok(()) => {
                self.0.pool.put_back_subscriber(con);
                let used = started.elapsed();
                (used, used < step)
            }
            Err(_) => poll(started), // the connection is dropped: a fresh one next time
        }
    }
}
