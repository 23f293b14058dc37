//! The Redis backend: the same locks, shared by many machines through one Redis server.
//!
//! A hold is a key set with `SET key token NX PX ttl` (one round trip), where the token is
//! 128 bits no other acquisition shares. Release and renewal are scripts that compare the
//! token first, so a holder whose lease ran out never deletes or extends its successor's
//! key. The fencing token is taken when first asked for, as on the table: a script `INCR`s
//! the key's counter only while the key still holds our token, so a holder that lost its
//! lease gets none. Both keys of a lock share a cluster hash tag.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use redis::{Client, Connection, Script};

use crate::backend::{Backend, Sealed};
use crate::error::Error;
use crate::lock::{self, LockGuard};
use crate::options::LockOptions;

/// Compare-and-delete, waking the waiters: 1 deleted, 0 absent (expired, or deleted by an
/// earlier try whose reply was lost), -1 held by someone else.
const RELEASE: &str = r"
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', KEYS[2], '1')
  return 1
end
if not v then return 0 end
return -1
";

/// The fencing token, only for the current holder: the counter's next value, or 0.
const TOKEN: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('INCR', KEYS[2])
";

/// Compare-and-renew: 1 renewed, 0 no longer ours.
const EXTEND: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '0' then redis.call('PERSIST', KEYS[1])
else redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 1
";

/// Locks in a Redis server. A cheap `Clone` handle, `Send + Sync`; one connection, re-made
/// after an error.
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

/// What a [`RedisLocks`] and its clones share.
struct Inner {
    client: Client,
    conn: Mutex<Option<Connection>>,
    /// For waiting: a connection subscribed to one key's channel at a time.
    subscriber: Mutex<Option<Connection>>,
    prefix: Vec<u8>,
    timeout: Duration,
    release: Script,
    extend: Script,
    fence: Script,
}

/// A hold in Redis: the lock key, this acquisition's token, and its fencing token once
/// asked for (0 before).
#[derive(Clone)]
pub struct RedisHold {
    key: Vec<u8>,
    channel: Vec<u8>,
    token: String,
    fence: std::cell::Cell<u64>,
}

/// A lock held in Redis, as [`RedisLocks::holders`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisHolder {
    /// The key (without the prefix).
    pub key: Vec<u8>,
    /// Time left on the lease; `None` if it never expires.
    pub ttl: Option<Duration>,
    /// The fencing token most recently handed out for the key (the holder's, unless the
    /// lock was broken and not taken again).
    pub last_token: Option<u64>,
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
pub struct RedisBusy {
    key: Vec<u8>,
    channel: Vec<u8>,
}

impl RedisLocks {
    /// Connects to the server at `url` (`redis://host:port/db`). The connection is made now,
    /// so a wrong address is an error here.
    pub fn open(url: &str) -> Result<RedisLocks, Error> {
        let locks = RedisLocks::with(
            Client::open(url)?,
            b"shmlock:".to_vec(),
            Duration::from_secs(5),
        );
        drop(locks.connection()?);
        Ok(locks)
    }

    fn with(client: Client, prefix: Vec<u8>, timeout: Duration) -> RedisLocks {
        RedisLocks(Arc::new(Inner {
            client,
            conn: Mutex::new(None),
            subscriber: Mutex::new(None),
            prefix,
            timeout,
            release: Script::new(RELEASE),
            extend: Script::new(EXTEND),
            fence: Script::new(TOKEN),
        }))
    }

    /// Names every key `PREFIX{KEY}` (default prefix `shmlock:`). Returns a new handle
    /// with connections of its own.
    pub fn with_prefix(&self, prefix: impl AsRef<[u8]>) -> Self {
        RedisLocks::with(
            self.0.client.clone(),
            prefix.as_ref().to_vec(),
            self.0.timeout,
        )
    }

    /// How long one command may take before it fails with a timeout (default 5 s).
    /// Returns a new handle with connections of its own.
    pub fn with_timeout(&self, timeout: Duration) -> Self {
        RedisLocks::with(self.0.client.clone(), self.0.prefix.clone(), timeout)
    }

    /// Takes `key`, waiting as `opts` says; released when the guard drops.
    pub fn lock(
        &self,
        key: impl AsRef<[u8]>,
        opts: &LockOptions,
    ) -> Result<LockGuard<'_, RedisLocks>, Error> {
        lock::guard(self, key.as_ref(), opts, Some(opts.timeout))
    }

    /// [`lock`](Self::lock) for async code (tokio): each attempt runs on tokio's blocking
    /// pool, the waits are `tokio::time::sleep` on resty's schedule (elapsed = the sum of the
    /// steps), so no runtime thread is ever blocked. A guard dropped inside a runtime hands
    /// its release to the blocking pool too (see [`LockGuard`]'s drop).
    #[cfg(feature = "tokio")]
    pub async fn lock_async(
        &self,
        key: impl AsRef<[u8]>,
        opts: &LockOptions,
    ) -> Result<LockGuard<'_, RedisLocks>, Error> {
        let resolved = opts.resolve()?;
        let key = key.as_ref().to_vec();
        let exptime = resolved.exptime_ns;
        let (hold, elapsed) = crate::backend::acquire_async(
            &resolved,
            opts.timeout,
            || {
                let (me, key) = (self.clone(), key.clone());
                async move {
                    match tokio::task::spawn_blocking(move || me.try_acquire(&key, exptime)).await {
                        Ok(attempt) => attempt,
                        Err(e) => match e.try_into_panic() {
                            Ok(panic) => std::panic::resume_unwind(panic),
                            Err(_) => Err(Error::Timeout), // the runtime is shutting down
                        },
                    }
                }
            },
            |_: &RedisBusy| false,
        )
        .await?;
        Ok(LockGuard::new(self, hold, elapsed, exptime))
    }

    /// Takes `key` if nobody holds it, without waiting. `Ok(None)` if it is held.
    pub fn try_lock(
        &self,
        key: impl AsRef<[u8]>,
        exptime: Duration,
    ) -> Result<Option<LockGuard<'_, RedisLocks>>, Error> {
        lock::try_guard(self, key.as_ref(), exptime)
    }

    /// Whether someone holds `key` right now (a snapshot).
    pub fn is_locked(&self, key: impl AsRef<[u8]>) -> Result<bool, Error> {
        let (lock_key, _) = self.keys(crate::check_key(key.as_ref())?);
        let n: u64 = self.run(|c| redis::cmd("EXISTS").arg(&lock_key).query(c))?;
        Ok(n == 1)
    }

    /// The locks held under this prefix (SCAN: a snapshot, fine for inspection).
    pub fn holders(&self) -> Result<Vec<RedisHolder>, Error> {
        let mut pattern = escape_glob(&self.0.prefix);
        pattern.extend_from_slice(b"{*}");
        let keys: Vec<Vec<u8>> = self.run(|c| {
            redis::cmd("SCAN")
                .cursor_arg(0)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .clone()
                .iter(c)?
                .collect::<redis::RedisResult<Vec<Vec<u8>>>>()
        })?;
        let mut out = Vec::new();
        for lock_key in keys {
            let name = lock_key[self.0.prefix.len() + 1..lock_key.len() - 1].to_vec();
            let (_, fence_key) = self.keys(&name);
            let (pttl, fence): (i64, Option<u64>) = self.run(|c| {
                redis::pipe()
                    .cmd("PTTL")
                    .arg(&lock_key)
                    .cmd("GET")
                    .arg(&fence_key)
                    .query(c)
            })?;
            if pttl == -2 {
                continue; // gone since the scan
            }
            out.push(RedisHolder {
                key: name,
                ttl: u64::try_from(pttl).ok().map(Duration::from_millis),
                last_token: fence,
            });
        }
        Ok(out)
    }

    /// Breaks the lock on `key`, whoever holds it; `true` if it was held. Its holder finds
    /// out at its next unlock or renewal ([`Error::Expired`]).
    pub fn force_unlock(&self, key: impl AsRef<[u8]>) -> Result<bool, Error> {
        let (lock_key, channel) = self.channel_keys(crate::check_key(key.as_ref())?);
        let (n, _): (u64, u64) = self.run(|c| {
            redis::pipe()
                .cmd("DEL")
                .arg(&lock_key)
                .cmd("PUBLISH")
                .arg(&channel)
                .arg(1)
                .query(c)
        })?;
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

    /// Subscribes to the release channel of `busy`, looks once more whether the key is
    /// still held (a release just before the subscription would be missed), and waits for
    /// a message for at most `step`.
    fn wait_for_release(
        &self,
        con: &mut Connection,
        busy: &RedisBusy,
        step: Duration,
    ) -> redis::RedisResult<()> {
        let mut pubsub = con.as_pubsub();
        pubsub.subscribe(&busy.channel)?;
        // (cannot tell: count it as held and wait the step out)
        let held: u64 = self
            .run(|c| redis::cmd("EXISTS").arg(&busy.key).query(c))
            .unwrap_or(1);
        if held == 0 {
            return Ok(());
        }
        pubsub.set_read_timeout(Some(step.max(Duration::from_millis(1))))?;
        match pubsub.get_message() {
            Ok(_) => Ok(()),
            Err(e) if e.is_timeout() => Ok(()),
            Err(e) => Err(e),
        }
        // dropping `pubsub` unsubscribes
    }

    fn connection(&self) -> Result<MutexGuard<'_, Option<Connection>>, Error> {
        let mut guard = self.0.conn.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            let c = self.0.client.get_connection_with_timeout(self.0.timeout)?;
            c.set_read_timeout(Some(self.0.timeout))?;
            c.set_write_timeout(Some(self.0.timeout))?;
            *guard = Some(c);
        }
        Ok(guard)
    }

    /// Runs `f` on the connection; a connection that failed is dropped, to be made anew
    /// by the next call.
    fn run<T>(&self, f: impl FnOnce(&mut Connection) -> redis::RedisResult<T>) -> Result<T, Error> {
        let mut guard = self.connection()?;
        let result = f(guard.as_mut().expect("connected above"));
        if let Err(e) = &result {
            if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() {
                *guard = None;
            }
        }
        Ok(result?)
    }
}

impl RedisLocks {
    /// [`run`](Self::run), once more on a fresh connection if the first one broke: for
    /// commands that are safe to repeat (compare-and-delete, compare-and-renew).
    fn retrying<T>(
        &self,
        f: impl Fn(&mut Connection) -> redis::RedisResult<T>,
    ) -> Result<T, Error> {
        match self.run(&f) {
            Err(Error::Redis(e)) if e.is_io_error() || e.is_connection_dropped() => self.run(&f),
            other => other,
        }
    }
}

/// Milliseconds for PX: rounded up, so a lease is never shorter than asked; 0 = no expiry.
fn ttl_ms(exptime_ns: u64) -> u64 {
    exptime_ns.div_ceil(1_000_000)
}

/// A token no other acquisition anywhere shares: 128 bits, the high 64 and a base for the
/// low 64 drawn at random once per process (again after `fork`), plus a per-process count.
fn random_token() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEED: Mutex<Option<(u32, u64, u64)>> = Mutex::new(None);
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let pid = std::process::id();
    let (hi, lo) = {
        let mut seed = SEED.lock().unwrap_or_else(|e| e.into_inner());
        match *seed {
            Some((p, hi, lo)) if p == pid => (hi, lo),
            _ => {
                let mut buf = [0u8; 16];
                // SAFETY: writes at most 16 bytes into `buf`.
                let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
                assert_eq!(n, 16, "getrandom failed");
                let hi = u64::from_le_bytes(buf[..8].try_into().unwrap());
                let lo = u64::from_le_bytes(buf[8..].try_into().unwrap());
                *seed = Some((pid, hi, lo));
                (hi, lo)
            }
        }
    };
    let n = COUNT.fetch_add(1, Ordering::Relaxed);
    format!("{hi:016x}{:016x}", lo.wrapping_add(n))
}

impl Sealed for RedisLocks {}

impl Backend for RedisLocks {
    type Hold = RedisHold;
    type Busy = RedisBusy;

    fn acquire_fast(&self, _key: &[u8], _exptime_ns: u64) -> Result<Option<RedisHold>, Error> {
        Ok(None) // every attempt is a round trip: there is no cheaper first try
    }

    fn try_acquire(
        &self,
        key: &[u8],
        exptime_ns: u64,
    ) -> Result<Result<RedisHold, RedisBusy>, Error> {
        let (key, channel) = self.channel_keys(crate::check_key(key)?);
        let token = random_token();
        let ttl = ttl_ms(exptime_ns);
        let set: Option<String> = self.run(|c| {
            let mut set = redis::cmd("SET");
            set.arg(&key).arg(&token).arg("NX");
            if ttl != 0 {
                set.arg("PX").arg(ttl);
            }
            set.query(c)
        })?;
        if set.is_none() {
            return Ok(Err(RedisBusy { key, channel }));
        }
        Ok(Ok(RedisHold {
            key,
            channel,
            token,
            fence: std::cell::Cell::new(0),
        }))
    }

    fn release(&self, hold: &RedisHold) -> Result<(), Error> {
        // Safe to retry: it only ever deletes the key while it holds our token.
        let outcome: i64 = self.retrying(|c| {
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

    /// Inside a tokio runtime the release goes to the blocking pool (the guard's owner cannot
    /// be told the outcome anyway); elsewhere it is made in place.
    fn release_on_drop(&self, hold: &RedisHold) {
        #[cfg(feature = "tokio")]
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (me, hold) = (self.clone(), hold.clone());
            runtime.spawn_blocking(move || {
                let _ = me.release(&hold);
            });
            return;
        }
        let _ = self.release(hold);
    }

    fn extend(&self, hold: &mut RedisHold, exptime_ns: u64) -> Result<(), Error> {
        let ttl = ttl_ms(exptime_ns);
        let renewed: i64 = self.retrying(|c| {
            self.0
                .extend
                .key(&hold.key)
                .arg(&hold.token)
                .arg(ttl)
                .invoke(c)
        })?;
        if renewed == 1 {
            Ok(())
        } else {
            Err(Error::Expired)
        }
    }

    /// A connection error counts as "no token": nothing proves the hold is still ours.
    fn token(&self, hold: &RedisHold) -> Option<u64> {
        if hold.fence.get() == 0 {
            let mut fence_key = hold.key.clone();
            fence_key.extend_from_slice(b":fence");
            let t: u64 = self
                .run(|c| {
                    self.0
                        .fence
                        .key(&hold.key)
                        .key(&fence_key)
                        .arg(&hold.token)
                        .invoke(c)
                })
                .ok()?;
            if t == 0 {
                return None;
            }
            hold.fence.set(t);
        }
        Some(hold.fence.get())
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
    /// bounds the wait, so a lease that lapses (no message) is seen as when polling. One
    /// waiter at a time per `RedisLocks` subscribes; others, and any pub/sub trouble, poll.
    fn sleep(&self, busy: &RedisBusy, step: Duration) -> Duration {
        let started = std::time::Instant::now();
        let poll = |started: std::time::Instant| {
            std::thread::sleep(step.saturating_sub(started.elapsed()));
            started.elapsed()
        };
        let Ok(mut slot) = self.0.subscriber.try_lock() else {
            return poll(started);
        };
        if slot.is_none() {
            match self.0.client.get_connection_with_timeout(self.0.timeout) {
                Ok(c) => *slot = Some(c),
                Err(_) => return poll(started),
            }
        }
        let con = slot.as_mut().expect("connected above");
        if self.wait_for_release(con, busy, step).is_err() {
            *slot = None; // start afresh next time
            return poll(started);
        }
        started.elapsed()
    }
}
