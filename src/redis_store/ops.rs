//! The operations on one hold, each a script on the master of the key's slot: taking a
//! key (with its deadline and its undo), releasing, renewing, fencing and checking it, and
//! waiting on its release channel. The [`Backend`] implementation of [`RedisLocks`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

use redis::RedisResult;

use crate::error::{Error, HolderSeen, KeyPreview};
use crate::lock::backend::{Backend, Sealed};
use crate::lock::slack::TimerSlack;
use crate::lock::wait::instant_after;
use crate::redis_store::janitor::{self, Job, JobKind};
use crate::redis_store::net::{is_broken, is_interrupted, is_transient, Failed, MAX_INTERRUPTS};
use crate::redis_store::scripts::Call;
use crate::redis_store::server_clock::server_us;
use crate::redis_store::topology::Req;
use crate::redis_store::{identity, RedisLocks};
use crate::shm::counters;
use crate::shm::table::Mode;

/// How long a release handed to a runtime's task may take before the janitor thread makes
/// it instead.
#[cfg(feature = "tokio")]
const RELEASE_FALLBACK: Duration = Duration::from_millis(50);

/// How long a sleeping waiter's mark (see `scripts::BLOCKED`) lives unless renewed: a
/// waiter that timed out, was cancelled or died stops holding others up within this.
const MARK_LAPSE: Duration = Duration::from_millis(500);

/// The longest a marking waiter sleeps between looks (each renews its mark).
const MARK_REFRESH: Duration = Duration::from_millis(150);

/// The step of a sleep: a waiter that marks the key (a writer kept out by shared holds, a
/// reader or permit waiter kept out by a writer) looks, and renews its mark, at least every
/// [`MARK_REFRESH`].
pub(crate) fn mark_step(busy: &RedisBusy, step: Duration) -> Duration {
    let marks = match busy.mode {
        Mode::Exclusive => busy.by_shared,
        Mode::Shared { .. } => !busy.by_shared,
    };
    if marks {
        step.min(MARK_REFRESH)
    } else {
        step
    }
}

/// When a sleep that ends at `end` should end instead, given what `scripts::BLOCKED`
/// answered: a little after what keeps the waiter out lapses by itself, if sooner.
pub(crate) fn lapse_by(blocked: i64, end: Instant) -> Instant {
    match u64::try_from(blocked) {
        Ok(ms) if ms > 0 => end.min(Instant::now() + Duration::from_millis(ms + 1)),
        _ => end,
    }
}

/// The shortest time an attempt of a wait is given, even at the wait's very end (a reply
/// takes a round trip).
pub(crate) const ATTEMPT_FLOOR: Duration = Duration::from_millis(100);

/// The names of one lock's keys: `PREFIX{KEY}`, its fence counter `PREFIX{KEY}:fence`,
/// its release channel `PREFIX{KEY}:free`, its shared holds `PREFIX{KEY}:shared` and
/// `PREFIX{KEY}:leases` (see `scripts`), and the marks of waiters `PREFIX{KEY}:writer` and
/// `PREFIX{KEY}:readers`. The braces make one cluster hash tag, so
/// all of them (and the marks named after a hold's token) land in one slot whatever the
/// key holds: the tag ends at the first `}` after the first `{`, which lies in the part
/// they all share.
#[derive(Clone, Debug)]
pub(crate) struct Names {
    pub(crate) lock: Vec<u8>,
    pub(crate) fence: Vec<u8>,
    pub(crate) channel: Vec<u8>,
    pub(crate) shared: Vec<u8>,
    pub(crate) leases: Vec<u8>,
    pub(crate) writer: Vec<u8>,
    pub(crate) readers: Vec<u8>,
}

impl Names {
    /// `PREFIX{KEY}:WHAT:TOKEN`: a short-lived key about one hold (its release's mark, or
    /// the marker of its cancelled attempt).
    fn mark(&self, what: &str, token: &str) -> Vec<u8> {
        let mut k = self.lock.clone();
        k.push(b':');
        k.extend_from_slice(what.as_bytes());
        k.push(b':');
        k.extend_from_slice(token.as_bytes());
        k
    }

    pub(crate) fn cancel_marker(&self, token: &str) -> Vec<u8> {
        self.mark("cancel", token)
    }

    pub(crate) fn release_mark(&self, token: &str) -> Vec<u8> {
        self.mark("released", token)
    }
}

/// A hold in Redis: the lock's keys, this acquisition's token, and when it was taken.
#[derive(Clone, Debug)]
pub struct RedisHold {
    pub(crate) names: Arc<Names>,
    pub(crate) token: String,
    pub(crate) taken: Instant,
    /// The process that asked for it (see `Backend::is_ours`): read before the attempt,
    /// so that a child forked in the middle of it does not take its parent's for its own.
    pub(crate) process: u64,
    /// The token this hold was first given (0: none yet). A reader's token is the key's
    /// fence counter as it first read it: the counter, lapsed while the hold lasts and set
    /// again to the server's clock, would give a later one at the next ask.
    pub(crate) first_token: Arc<AtomicU64>,
}

/// A busy attempt on Redis: the keys of the lock to wait for, or why the server could not
/// be asked (a wait goes on through a failover or a stall until its deadline).
#[derive(Debug)]
pub struct RedisBusy {
    pub(crate) names: Arc<Names>,
    pub(crate) failed: Option<Error>,
    /// Who held the key, as the attempt's reply showed, and when it arrived.
    pub(crate) seen: Option<(HolderSeen, Instant)>,
    /// The mode the waiter asks for.
    pub(crate) mode: Mode,
    /// Kept out by shared holds (or, for a reader, by a writer's mark), not by a writer.
    pub(crate) by_shared: bool,
}

impl RedisBusy {
    pub(crate) fn held(names: Arc<Names>) -> RedisBusy {
        RedisBusy {
            names,
            failed: None,
            seen: None,
            mode: Mode::Exclusive,
            by_shared: false,
        }
    }

    /// The same, for a waiter in `mode`.
    pub(crate) fn in_mode(self, mode: Mode) -> RedisBusy {
        RedisBusy { mode, ..self }
    }

    /// Kept out by shared holds (one of them, as the attempt's reply showed).
    pub(crate) fn kept_by(names: Arc<Names>, seen: Option<HolderSeen>) -> RedisBusy {
        RedisBusy {
            by_shared: true,
            ..RedisBusy::held_by(names, seen)
        }
    }

    /// Held by the holder an attempt's reply showed.
    pub(crate) fn held_by(names: Arc<Names>, seen: Option<HolderSeen>) -> RedisBusy {
        RedisBusy {
            seen: seen.map(|h| (h, Instant::now())),
            ..RedisBusy::held(names)
        }
    }

    /// The holder last seen, with the time it has held the key counted up to now.
    fn holder(seen: Option<(HolderSeen, Instant)>) -> Option<HolderSeen> {
        seen.map(|(mut h, at)| {
            h.held_for = h.held_for.map(|d| d + at.elapsed());
            h
        })
    }

    /// An attempt that failed with `error`: a busy key to wait on while `deadline` allows
    /// another try and the error is one a new connection may not meet or one the server
    /// says will pass (a slot migrating, a cluster failing over); else the error.
    pub(crate) fn or_error(
        names: &Arc<Names>,
        error: Error,
        deadline: Option<Instant>,
    ) -> Result<RedisBusy, Error> {
        // (a server that kept saying to try again, to the end: the wait ends with
        // `Timeout`, see `gave_up`)
        let retry = match &error {
            Error::Redis(e) if is_transient(e) => deadline.is_some(),
            Error::Redis(e) if is_broken(e) => deadline.is_some_and(|d| Instant::now() < d),
            _ => false,
        };
        if retry {
            Ok(RedisBusy {
                failed: Some(error),
                ..RedisBusy::held(names.clone())
            })
        } else {
            Err(error)
        }
    }
}

/// What the acquire script answered.
pub(crate) enum Answer {
    Taken,
    /// Held, by whom the holder's value says.
    Busy(Option<HolderSeen>),
    /// Kept out by shared holds (one of them, as its value says), or a writer's mark.
    Kept(Option<HolderSeen>),
    /// The key's shared holds are of this other count.
    Mismatch(u32),
    /// The lock key holds a string that is not a hold's value.
    Foreign,
    /// The server ran it after its deadline: the bound on the server's clock was behind
    /// (corrected by this reply's clock).
    TooLate,
    Cancelled,
}

/// The acquire script's reply: its verdict and the server's clock when it ran.
pub(crate) fn answer(reply: (i64, String, String, Vec<u8>)) -> (Answer, Option<i64>) {
    let clock = server_us(&reply.1, &reply.2);
    let verdict = match reply.0 {
        1 => Answer::Taken,
        0 => Answer::Busy(seen(&reply.3, clock)),
        -1 => Answer::Kept(seen(&reply.3, clock)),
        -4 => Answer::Mismatch(
            std::str::from_utf8(&reply.3)
                .ok()
                .and_then(|n| n.parse().ok())
                .unwrap_or(u32::MAX),
        ),
        -2 => Answer::TooLate,
        -5 => Answer::Foreign,
        _ => Answer::Cancelled,
    };
    (verdict, clock)
}

/// The holder a busy reply shows: its value past the token, and the server's clock (µs)
/// for how long it has held the key (by the time its own clock wrote).
fn seen(after_token: &[u8], clock: Option<i64>) -> Option<HolderSeen> {
    let id = identity::parse_after_token(after_token);
    if id == identity::Identity::default() {
        return None;
    }
    let held_for = id.since.zip(clock).and_then(|(since, us)| {
        let now = UNIX_EPOCH + Duration::from_micros(u64::try_from(us).ok()?);
        now.duration_since(since).ok()
    });
    let this_process = id.pid == Some(crate::shm::process::current_pid())
        && id.host.as_deref() == Some(identity::host_name());
    Some(HolderSeen {
        pid: id.pid,
        host: id.host,
        held_for,
        writer_waits: false,
        readers_wait: false,
        this_process,
    })
}

/// The error of an attempt on a key whose lock key holds a string this crate did not write.
pub(crate) fn foreign(key: &[u8], lock: &[u8]) -> Error {
    Error::WrongType {
        key: KeyPreview::new(key),
        redis_key: KeyPreview::new(lock),
        found: "string".into(),
    }
}

/// The acquire script's mode argument: -1 exclusive, else the count (0: a reader).
pub(crate) fn mode_arg(mode: Mode) -> i64 {
    match mode {
        Mode::Exclusive => -1,
        Mode::Shared { limit } => i64::from(limit),
    }
}

/// The error of a shared attempt on a key whose shared holds are of another count.
pub(crate) fn mismatch(key: &[u8], held: u32, mode: Mode) -> Error {
    Error::PermitsMismatch {
        key: KeyPreview::new(key),
        held,
        asked: mode_arg(mode).max(0) as u32,
    }
}

pub(crate) fn replicated(acked: u64, wanted: u32) -> Result<(), Error> {
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

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The master changed under a request twice in a row.
fn unsettled() -> Error {
    Error::Redis(redis::RedisError::from(std::io::Error::other(
        "the master changed during the request",
    )))
}

/// The cluster hash tag of a key name as Redis finds it: the bytes between the first `{`
/// and the first `}` after it, if there are any (else the whole name is hashed).
fn hash_tag(name: &[u8]) -> Option<&[u8]> {
    let open = name.iter().position(|&b| b == b'{')?;
    let len = name[open + 1..].iter().position(|&b| b == b'}')?;
    (len > 0).then(|| &name[open + 1..open + 1 + len])
}

impl RedisLocks {
    /// The names of `key`'s lock, once the key is checked: on a Cluster, every name of a
    /// lock must hash to the same slot, which needs a tag that is not empty.
    pub(crate) fn names_of(&self, key: &[u8]) -> Result<Names, Error> {
        let key = crate::key::check_key(key)?;
        let names = self.names(key);
        if self.0.pool.is_cluster() && hash_tag(&names.lock).is_none() {
            return Err(Error::InvalidKey {
                key: crate::error::KeyPreview::new(key),
                reason: "on a Redis Cluster its lock's names would hash to different slots \
                         (a key may not start with '}', nor a prefix have '{}' as its first \
                         braces)",
            });
        }
        Ok(names)
    }

    /// `e`, or, if it is a `WRONGTYPE` reply (a script met a value of another type than
    /// it writes at one of `key`'s Redis keys), [`Error::WrongType`] naming the first of
    /// them whose `TYPE` is not the one this crate writes there. The look takes one
    /// command timeout at most, and ends by the caller's `deadline` (`e` as it was, if it
    /// runs out first).
    pub(crate) fn wrong_type(&self, key: &[u8], e: Error, deadline: Option<Instant>) -> Error {
        if !matches!(&e, Error::Redis(r) if r.code() == Some("WRONGTYPE")) {
            return e;
        }
        let limit = self.0.pool.limit(deadline);
        let names = self.names(key);
        let ours: [(&[u8], &str); 6] = [
            (&names.lock, "string"),
            (&names.shared, "hash"),
            (&names.leases, "zset"),
            (&names.fence, "string"),
            (&names.writer, "string"),
            (&names.readers, "string"),
        ];
        for (name, theirs) in ours {
            if limit <= Instant::now() {
                return e;
            }
            let found = self
                .0
                .pool
                .run(limit, |r| r.query::<String>(redis::cmd("TYPE").arg(name)));
            match found {
                Ok(ran) if ran.value != theirs && ran.value != "none" => {
                    return Error::WrongType {
                        key: KeyPreview::new(key),
                        redis_key: KeyPreview::new(name),
                        found: ran.value,
                    }
                }
                Ok(_) => {}
                Err(_) => return e,
            }
        }
        e
    }

    pub(crate) fn names(&self, key: &[u8]) -> Names {
        let mut lock = Vec::with_capacity(self.0.prefix.len() + key.len() + 2);
        lock.extend_from_slice(&self.0.prefix);
        lock.push(b'{');
        lock.extend_from_slice(key);
        lock.push(b'}');
        let named = |what: &[u8]| {
            let mut n = Vec::with_capacity(lock.len() + what.len());
            n.extend_from_slice(&lock);
            n.extend_from_slice(what);
            n
        };
        Names {
            fence: named(b":fence"),
            channel: named(b":free"),
            shared: named(b":shared"),
            leases: named(b":leases"),
            writer: named(b":writer"),
            readers: named(b":readers"),
            lock,
        }
    }

    /// The lease to set for a hold taken `held` ago, in ms (0: never expires), within
    /// `max_hold`; `None` once `max_hold` is spent.
    pub(crate) fn lease_ms(&self, exptime_ns: u64, held: Duration) -> Option<u64> {
        let ttl = ttl_ms(exptime_ns);
        let Some(max) = self.0.max_hold else {
            return Some(ttl);
        };
        let left = max.saturating_sub(held);
        if left.is_zero() {
            return None;
        }
        let left = millis(left).max(1);
        Some(if ttl == 0 { left } else { ttl.min(left) })
    }

    /// When an attempt must be answered by: the command timeout, or the wait's deadline
    /// but never less than [`ATTEMPT_FLOOR`] from now.
    pub(crate) fn attempt_limit(&self, deadline: Option<Instant>) -> Instant {
        let pool = &self.0.pool;
        match deadline {
            None => pool.limit(None),
            Some(d) => pool.limit(Some(d.max(Instant::now() + ATTEMPT_FLOOR))),
        }
    }

    /// The `WAIT` that follows a granting write on the same connection, if replicas are
    /// required: `Ok(())` when enough acknowledged it.
    pub(crate) fn wait_replicas(&self, r: &mut Req<'_>) -> RedisResult<Result<(), Error>> {
        let Some((n, timeout)) = self.0.replicas else {
            return Ok(Ok(()));
        };
        let acked: u64 = r.query(redis::cmd("WAIT").arg(n).arg(millis(timeout)))?;
        Ok(replicated(acked, n))
    }

    /// Undoes an attempt whose outcome is unknown (or a grant that must not stand), by
    /// its token, on the janitor's thread (see `scripts::CANCEL`).
    /// `ttl_ms`: the attempt's lease (0: none), after which a grant lapses by itself.
    pub(crate) fn cancel(&self, names: &Names, token: &str, not_after: i64, ttl_ms: u64) {
        self.0.pool.janitor(Job {
            keys: [
                names.lock.clone(),
                names.channel.clone(),
                names.cancel_marker(token),
                names.shared.clone(),
                names.leases.clone(),
            ],
            token: token.to_string(),
            kind: JobKind::Cancel {
                not_after,
                cap_ms: self.marker_cap_ms(),
            },
            until: janitor::until(ttl_ms),
        });
    }

    /// [`cancel`](Self::cancel) made in place, by `limit`, so that the caller's error comes
    /// after the key is free again; left to the janitor if the server does not answer.
    fn cancel_now(
        &self,
        names: &Names,
        token: &str,
        (not_after, ttl_ms): (i64, u64),
        limit: Instant,
    ) {
        let call = self.cancel_call(names, token, not_after);
        let done = self
            .0
            .pool
            .run(limit.max(Instant::now() + ATTEMPT_FLOOR), |r| {
                r.call::<i64>(&call)
            });
        if done.is_err() {
            self.cancel(names, token, not_after, ttl_ms);
        }
    }

    /// The cancel script's call for the attempt of `token` (see `scripts::CANCEL`), as
    /// [`cancel_now`](Self::cancel_now) and an async attempt's give-back send it.
    pub(crate) fn cancel_call(&self, names: &Names, token: &str, not_after: i64) -> Call<'_> {
        self.0
            .scripts
            .cancel
            .call()
            .key(&names.lock)
            .key(&names.channel)
            .key(names.cancel_marker(token))
            .key(&names.shared)
            .key(&names.leases)
            .arg(token)
            .arg(not_after)
            .arg(self.marker_cap_ms())
    }

    /// The longest a cancel marker lives: its attempt's deadline ends it sooner, unless
    /// the bound on the server's clock was far off.
    fn marker_cap_ms(&self) -> u64 {
        millis(self.0.pool.timeout.saturating_mul(10)).max(1000)
    }

    /// How long a release's mark lives: long enough for the retry of a release whose reply
    /// was lost to find it.
    pub(crate) fn mark_ms(&self) -> u64 {
        millis(self.0.pool.timeout.saturating_mul(2)).saturating_add(1000)
    }

    /// Runs a granting `f` and accepts its reply only from the master now; once more on
    /// the new master if the old one was replaced meanwhile.
    pub(crate) fn granted<T>(
        &self,
        f: impl Fn(&mut Req<'_>) -> RedisResult<T>,
        retry_broken: bool,
    ) -> Result<T, Error> {
        let pool = &self.0.pool;
        for _ in 0..2 {
            let limit = pool.limit(None);
            // (a grant not retried when broken, a token, is retried when only cut by a stop
            // of this process: the token is kept with its hold, and asked again is the same)
            let ran = if retry_broken {
                pool.retrying(&f)?
            } else {
                pool.run_through_stops(&f)?
            };
            if pool.vouch(&ran.tag, ran.sent, limit)? {
                return Ok(ran.value);
            }
        }
        Err(unsettled())
    }

    /// Runs a script that answers 1 if the hold is (still) ours, as [`granted`](Self::granted)
    /// does: `Ok`, or [`Error::Expired`].
    pub(crate) fn granted_ours(&self, call: &Call<'_>) -> Result<(), Error> {
        let ours: i64 = self.granted(|r| r.call(call), true)?;
        if ours == 1 {
            Ok(())
        } else {
            Err(Error::Expired)
        }
    }

    /// One attempt to take the key, answered by `limit`.
    fn attempt(
        &self,
        key: &[u8],
        names: &Arc<Names>,
        exptime_ns: u64,
        deadline: Option<Instant>,
        mode: Mode,
    ) -> Result<Result<RedisHold, RedisBusy>, Error> {
        let pool = &self.0.pool;
        let ttl = self.lease_ms(exptime_ns, Duration::ZERO).unwrap_or(1);
        let mut limit = self.attempt_limit(deadline);
        let busy = || Ok(Err(RedisBusy::held(names.clone())));
        let mut corrected = false;
        let mut cuts = 0;
        loop {
            let process = crate::shm::process::token();
            let (token, value) = identity::new_hold();
            let not_after = pool.shared.clock.at(limit).unwrap_or(0);
            let ran = pool.run(limit, |r| {
                let reply = r.call(
                    &self
                        .0
                        .scripts
                        .acquire
                        .call()
                        .key(&names.lock)
                        .key(names.cancel_marker(&token))
                        .key(&names.shared)
                        .key(&names.leases)
                        .key(&names.writer)
                        .key(&names.readers)
                        .arg(&value)
                        .arg(ttl)
                        .arg(not_after)
                        .arg(mode_arg(mode)),
                )?;
                let arrived = Instant::now();
                let (verdict, clock) = answer(reply);
                let replicas = match verdict {
                    Answer::Taken => Some(self.wait_replicas(r)?),
                    _ => None,
                };
                Ok((verdict, clock, arrived, replicas))
            });
            let ran = match ran {
                Ok(ran) => ran,
                Err(Failed { error, unknown }) => {
                    // This process was stopped and continued mid-request: the server is
                    // fine, so try again at once, once the request (if it ran) is undone
                    // in place, so that the next try does not find it holding the key. A
                    // try gets a fresh limit (a stop, however long, is not the server's
                    // slowness); a wait's deadline that passed meanwhile ends the wait.
                    let cut = matches!(&error, Error::Redis(e) if is_interrupted(e));
                    let again =
                        cut && cuts < MAX_INTERRUPTS && deadline.is_none_or(|d| Instant::now() < d);
                    if unknown && again {
                        self.cancel_now(names, &token, (not_after, ttl), limit);
                    } else if unknown {
                        self.cancel(names, &token, not_after, ttl);
                    }
                    if again {
                        cuts += 1;
                        limit = self.attempt_limit(deadline);
                        continue;
                    }
                    if cut && deadline.is_some() {
                        // (the wait ends with `Timeout`, see `gave_up`)
                        return Ok(Err(RedisBusy {
                            failed: Some(error),
                            ..RedisBusy::held(names.clone())
                        }));
                    }
                    return RedisBusy::or_error(names, error, deadline).map(Err);
                }
            };
            let (tag, sent) = (ran.tag, ran.sent);
            let (verdict, clock, arrived, replicas) = ran.value;
            if let Some(us) = clock {
                pool.shared.clock.observe(us, arrived);
            }
            match verdict {
                Answer::Taken => {
                    let hold = RedisHold {
                        names: names.clone(),
                        token,
                        taken: sent,
                        process,
                        first_token: Arc::default(),
                    };
                    let verdict = match replicas {
                        Some(Err(e)) => Err(e),
                        _ => pool.vouch(&tag, sent, limit).map(|now| now.then_some(())),
                    };
                    return match verdict {
                        Ok(Some(())) => Ok(Ok(hold)),
                        // granted by a master that was replaced meanwhile: not a hold
                        Ok(None) => {
                            self.cancel_now(names, &hold.token, (not_after, ttl), limit);
                            busy()
                        }
                        // not granted after all (too few replicas, or no sentinel could
                        // vouch for the master): given back first; a wait goes on through
                        // a sentinel's connection error as through the master's
                        Err(e) => {
                            self.cancel_now(names, &hold.token, (not_after, ttl), limit);
                            RedisBusy::or_error(names, e, deadline).map(Err)
                        }
                    };
                }
                // (the server answers: a new try, with a limit of its own)
                Answer::TooLate if !corrected => {
                    corrected = true;
                    limit = self.attempt_limit(deadline);
                }
                Answer::Busy(seen) => return Ok(Err(RedisBusy::held_by(names.clone(), seen))),
                Answer::Kept(seen) => return Ok(Err(RedisBusy::kept_by(names.clone(), seen))),
                Answer::Mismatch(held) => return Err(mismatch(key, held, mode)),
                Answer::Foreign => return Err(foreign(key, &names.lock)),
                _ => return busy(),
            }
        }
    }

    /// Releases `hold`: `Ok` if this call (or an earlier try of it whose reply was lost)
    /// deleted it, [`Error::Expired`] if it was no longer ours.
    pub(crate) fn release_hold(&self, hold: &RedisHold) -> Result<(), Error> {
        let mark = hold.names.release_mark(&hold.token);
        let mark_ms = self.mark_ms();
        let outcome: i64 = self.granted(
            |r| {
                r.call(
                    &self
                        .0
                        .scripts
                        .release
                        .call()
                        .key(&hold.names.lock)
                        .key(&hold.names.channel)
                        .key(&mark)
                        .key(&hold.names.shared)
                        .key(&hold.names.leases)
                        .arg(&hold.token)
                        .arg(mark_ms),
                )
            },
            true,
        )?;
        match outcome {
            1 | 2 => Ok(()),
            _ => Err(Error::Expired),
        }
    }

    /// The fencing token of `hold`, or why there is none. Asked of the server every time:
    /// a hold that was lost gets none, even if it had one.
    fn take_token(&self, hold: &RedisHold) -> Result<u64, Error> {
        let grace = millis(self.0.fence_grace);
        let (t, enough) = self.granted(
            |r| {
                let t: i64 = r.call(
                    &self
                        .0
                        .scripts
                        .token
                        .call()
                        .key(&hold.names.lock)
                        .key(&hold.names.fence)
                        .key(&hold.names.shared)
                        .key(&hold.names.leases)
                        .arg(&hold.token)
                        .arg(grace),
                )?;
                if t < 0 {
                    return Ok((t, Ok(())));
                }
                Ok((t, self.wait_replicas(r)?))
            },
            false,
        )?;
        let Ok(t) = u64::try_from(t) else {
            return Err(Error::Expired);
        };
        enough?;
        // (the hold is still ours: the script said so; Relaxed: the word publishes nothing
        // but itself, and every copy of the hold keeps whichever token came first)
        Ok(
            match hold
                .first_token
                .compare_exchange(0, t, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => t,
                Err(first) => first,
            },
        )
    }

    /// The call that tells whether `busy`'s waiter is still kept out (see
    /// `scripts::BLOCKED`), made by a waiter that sleeps: it marks the key as it looks.
    pub(crate) fn blocked<'s>(&'s self, busy: &'s RedisBusy) -> Call<'s> {
        self.0
            .scripts
            .blocked
            .call()
            .key(&busy.names.lock)
            .key(&busy.names.shared)
            .key(&busy.names.leases)
            .key(&busy.names.writer)
            .key(&busy.names.readers)
            .arg(mode_arg(busy.mode))
            .arg(millis(MARK_LAPSE))
    }

    /// Waits on the key's release channel for at most `step`.
    fn wait_for_release(&self, busy: &RedisBusy, step: Duration) -> (Duration, bool) {
        let step = mark_step(busy, step);
        let started = Instant::now();
        let end = instant_after(started, step);
        let poll = |started: Instant| {
            std::thread::sleep(step.saturating_sub(started.elapsed()));
            (started.elapsed(), false)
        };
        if busy.failed.is_some() {
            return poll(started); // nobody to subscribe to: the next attempt reconnects
        }
        let pool = &self.0.pool;
        let Ok((mut con, tag)) = pool.subscriber(end) else {
            return poll(started);
        };
        match self.listen(&mut con, busy, end) {
            Ok(()) => {
                pool.put_back_subscriber(con, tag);
                let used = started.elapsed();
                (used, used < step)
            }
            Err(_) => {
                // (dropped: a fresh one next time, on another node of a cluster)
                pool.shared.cluster_node_failed(tag.server.as_ref());
                poll(started)
            }
        }
    }

    /// Subscribes to the release channel of `busy` on `con`, looks once more whether the
    /// key is still held (a release just before the subscription would be missed), and
    /// waits for a message on that channel until `end`.
    fn listen(
        &self,
        con: &mut redis::Connection,
        busy: &RedisBusy,
        end: Instant,
    ) -> RedisResult<()> {
        let timeout = self.0.pool.timeout;
        let wait = |d: Option<Duration>| Some(d.unwrap_or_default().max(Duration::from_millis(1)));
        con.set_read_timeout(wait(crate::redis_store::net::left(end)))?;
        con.set_write_timeout(Some(timeout))?;
        let mut pubsub = con.as_pubsub();
        pubsub.subscribe(&busy.names.channel)?;
        // (cannot tell: count it as held and wait the step out)
        let held: i64 = self
            .0
            .pool
            .run(end, |r| r.call(&self.blocked(busy)))
            .map_or(-1, |r| r.value);
        let end = lapse_by(held, end);
        let mut outcome = Ok(());
        if held != 0 {
            while let Some(left) = crate::redis_store::net::left(end) {
                pubsub.set_read_timeout(wait(Some(left)))?;
                match pubsub.get_message() {
                    Ok(msg) => {
                        if msg.get_channel::<Vec<u8>>().ok().as_ref() == Some(&busy.names.channel) {
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
        // Dropping `pubsub` unsubscribes and reads the replies: within an attempt's floor, so
        // that a stalled server holds the waiter up no longer; a connection whose
        // unsubscribe went unanswered that long is not given back.
        let wait = timeout.min(ATTEMPT_FLOOR);
        pubsub.set_read_timeout(Some(wait))?;
        let unsubscribing = Instant::now();
        drop(pubsub);
        if unsubscribing.elapsed() >= wait {
            return Err(crate::redis_store::net::timed_out());
        }
        outcome
    }
}

impl RedisLocks {
    /// One attempt to take `key` in `mode` (see [`Backend::try_acquire`]).
    pub(crate) fn try_acquire_in(
        &self,
        key: &[u8],
        exptime_ns: u64,
        deadline: Option<Instant>,
        mode: Mode,
    ) -> Result<Result<RedisHold, RedisBusy>, Error> {
        let names = Arc::new(self.names_of(key)?);
        let r = self
            .attempt(key, &names, exptime_ns, deadline, mode)
            .map_err(|e| self.wrong_type(key, e, deadline));
        match r {
            Ok(Ok(hold)) => {
                self.counters().add(counters::ACQUISITIONS, 1);
                Ok(Ok(hold))
            }
            Ok(Err(busy)) => Ok(Err(busy.in_mode(mode))),
            Err(e) => Err(e),
        }
    }

    /// Times a hold, from its grant to its release.
    pub(crate) fn time_hold(&self, hold: &RedisHold) {
        let cells = self.counters();
        let ns = u64::try_from(hold.taken.elapsed().as_nanos()).unwrap_or(u64::MAX);
        cells.time(counters::HOLD_BUCKETS, counters::HOLD_NS, ns);
        cells.add(counters::HOLD_SAMPLES, 1);
    }
}

impl Sealed for RedisLocks {}

impl Backend for RedisLocks {
    type Hold = RedisHold;
    type Busy = RedisBusy;

    fn is_ours(&self, hold: &RedisHold) -> bool {
        hold.process == crate::shm::process::token()
    }

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
        deadline: Option<Instant>,
    ) -> Result<Result<RedisHold, RedisBusy>, Error> {
        self.try_acquire_in(key, exptime_ns, deadline, Mode::Exclusive)
    }

    fn release(&self, hold: &RedisHold) -> Result<(), Error> {
        self.time_hold(hold);
        self.release_hold(hold)
    }

    fn waited(&self, took: bool, waited: Duration) {
        let cells = self.counters();
        if took {
            cells.add(counters::CONTENDED, 1);
            let ns = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
            cells.time(counters::WAIT_BUCKETS, counters::WAIT_NS, ns);
        } else {
            cells.add(counters::TIMEOUTS, 1);
        }
    }

    /// Inside an async runtime a runtime thread must not block: the release goes to a task
    /// of the runtime (over the async connection, the quickest way), and to the handle's
    /// janitor thread as a fallback a little later, should that task not run by then (the
    /// runtime is stopping, or nothing drives it any more after `block_on` returned).
    /// Elsewhere it is made in place.
    fn release_on_drop(&self, hold: &RedisHold) {
        self.time_hold(hold);
        #[cfg(feature = "tokio")]
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
            self.0.pool.janitor(Job {
                keys: [
                    hold.names.lock.clone(),
                    hold.names.channel.clone(),
                    hold.names.release_mark(&hold.token),
                    hold.names.shared.clone(),
                    hold.names.leases.clone(),
                ],
                token: hold.token.clone(),
                kind: JobKind::Release {
                    mark_ms: self.mark_ms(),
                    unless: Some((Instant::now() + RELEASE_FALLBACK, done.clone())),
                },
                // (its lease may have been renewed to none since it was taken)
                until: None,
            });
            let (locks, hold) = (self.clone(), hold.clone());
            runtime.spawn(async move {
                if locks.release_async(&hold).await.is_ok() {
                    done.store(true, std::sync::atomic::Ordering::Release);
                }
            });
            return;
        }
        let _ = self.release_hold(hold);
    }

    fn lease_ns(&self, hold: &RedisHold, exptime_ns: u64) -> u64 {
        // (past the longest hold: a lease of 0 ms, which `keep_alive` counts as lapsed)
        match self.lease_ms(exptime_ns, hold.taken.elapsed()) {
            Some(ms) => ms.saturating_mul(1_000_000),
            None => 1,
        }
    }

    fn past_longest_hold(&self, hold: &RedisHold) -> bool {
        self.0
            .max_hold
            .is_some_and(|max| hold.taken.elapsed() >= max)
    }

    fn extend(&self, hold: &mut RedisHold, exptime_ns: u64) -> Result<(), Error> {
        let ttl = self
            .lease_ms(exptime_ns, hold.taken.elapsed())
            .ok_or(Error::MaxHoldReached)?;
        let (renewed, enough) = self.granted(
            |r| {
                let renewed: i64 = r.call(
                    &self
                        .0
                        .scripts
                        .extend
                        .call()
                        .key(&hold.names.lock)
                        .key(&hold.names.shared)
                        .key(&hold.names.leases)
                        .arg(&hold.token)
                        .arg(ttl),
                )?;
                if renewed != 1 {
                    return Ok((renewed, Ok(())));
                }
                Ok((renewed, self.wait_replicas(r)?))
            },
            true,
        )?;
        if renewed != 1 {
            self.counters().add(counters::LOST, 1);
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

    fn check(&self, hold: &RedisHold) -> Result<(), Error> {
        self.granted_ours(
            &self
                .0
                .scripts
                .check
                .call()
                .key(&hold.names.lock)
                .key(&hold.names.shared)
                .key(&hold.names.leases)
                .arg(&hold.token),
        )
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

    /// A wait that ran out while the server could not be asked ends with why; one whose
    /// server said to try again later, with `Timeout`.
    fn gave_up(&self, busy: RedisBusy, key: &[u8], waited: Duration) -> Error {
        match busy.failed {
            // (a request cut short by this process's own stop: the wait simply ran out)
            Some(Error::Redis(e)) if is_interrupted(&e) => Error::timeout(key, waited, None),
            // (the server answered, saying to try again later: a slot migrating, a cluster
            // failing over: the key could not be had in time)
            Some(Error::Redis(e)) if is_transient(&e) => Error::timeout(key, waited, None),
            Some(failed) => failed,
            None => Error::timeout(key, waited, RedisBusy::holder(busy.seen)),
        }
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
        self.wait_for_release(busy, step)
    }
}

#[cfg(test)]
mod tests {
    use super::hash_tag;

    #[test]
    fn hash_tags_as_redis_finds_them() {
        assert_eq!(hash_tag(b"shmlock:{job}"), Some(&b"job"[..]));
        assert_eq!(hash_tag(b"shmlock:{job}:fence"), Some(&b"job"[..]));
        assert_eq!(hash_tag(b"shmlock:{}abc}"), None);
        assert_eq!(hash_tag(b"app{}{k}"), None);
        assert_eq!(hash_tag(b"a{b{k}"), Some(&b"b{k"[..]));
        assert_eq!(hash_tag(b"plain"), None);
    }
}
