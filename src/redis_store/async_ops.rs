//! `lock_async` on Redis (feature `tokio`): woken by the release channel (see
//! `async_wait`), and cancel-safe: a future dropped at any await leaves no hold behind.
//!
//! An attempt's token is made before its request is sent, and a guard ([`Pending`]) holds
//! it until the attempt's outcome is known and handed on: if the future is dropped first,
//! the guard has the janitor cancel the attempt by that token (`scripts::CANCEL`), which
//! releases the key if the attempt took it and otherwise makes sure that it never will.
//! Attempts that must `WAIT` for replicas run on an exclusive connection, so a `WAIT`
//! holds up no other task's commands.

use std::borrow::Borrow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::RedisResult;

use crate::error::Error;
use crate::lock::backend::Slept;
use crate::lock::options::LockOptions;
use crate::lock::wait::instant_after;
use crate::lock::LockGuard;
use crate::redis_store::aio::Aio;
use crate::redis_store::async_wait::Turn;
use crate::redis_store::net::bounded;
use crate::redis_store::net::{allowed, is_unanswered, Failed, MAX_INTERRUPTS};
use crate::redis_store::ops::{
    answer, foreign, lapse_by, mark_step, mismatch, mode_arg, replicated, Answer, Names, RedisBusy,
    RedisHold,
};
use crate::redis_store::{identity, RedisLocks};
use crate::shm::table::Mode;

/// An attempt whose outcome is not settled yet: cancelled by its token if dropped armed.
struct Pending<'a> {
    locks: &'a RedisLocks,
    names: Arc<Names>,
    token: String,
    not_after: i64,
    /// The attempt's lease (0: none).
    ttl: u64,
    armed: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.locks
                .cancel(&self.names, &self.token, self.not_after, self.ttl);
        }
    }
}

impl RedisLocks {
    /// [`lock`](Self::lock) for async code (tokio): attempts go over the handle's
    /// multiplexed async connection (one socket shared by every task of the runtime, no
    /// thread per waiter); a waiting task is woken by the release channel, heard on one
    /// pub/sub connection per handle and process, with resty's schedule as its budget
    /// (elapsed = the time waited; with `notify: false`, polling, the sum of the steps).
    /// The tasks of a process waiting for one key take it in the order they asked (a
    /// release wakes the first only). Cancel-safe: dropping the future at any point
    /// (`select!`, `tokio::time::timeout`) leaves the key as it found it, within a round
    /// trip of the janitor thread. A guard dropped inside a runtime is released by a task
    /// of the runtime, or by that thread if the task does not run (see [`LockGuard`]'s
    /// drop).
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub async fn lock_async(
        &self,
        key: impl AsRef<[u8]>,
        opts: impl Borrow<LockOptions>,
    ) -> Result<LockGuard<'_, RedisLocks>, Error> {
        let (hold, elapsed, exptime) = self
            .acquire_async_in(key.as_ref(), opts.borrow(), Mode::Exclusive)
            .await?;
        Ok(LockGuard::new(self, hold, elapsed, exptime))
    }

    /// The async wait of [`lock_async`](Self::lock_async) in `mode`: the hold, the time
    /// waited, the lease.
    pub(crate) async fn acquire_async_in(
        &self,
        key: &[u8],
        opts: &LockOptions,
        mode: Mode,
    ) -> Result<(RedisHold, Duration, u64), Error> {
        let resolved = opts.resolve()?;
        let names = Arc::new(self.names_of(key)?);
        let exptime = resolved.exptime_ns;
        let passes_on = mode != Mode::Exclusive;
        let started = Instant::now();
        let r = crate::lock::backend::acquire_async(
            key,
            &resolved,
            opts.timeout,
            || {
                // a place at once, in the order of asking (the first attempt is a round
                // trip, which later askers would overtake)
                let turn = self.0.pool.turn(&names.channel, passes_on);
                let ahead =
                    (!turn.is_first()).then(|| RedisBusy::held(names.clone()).in_mode(mode));
                (ahead, Some(Some(turn)))
            },
            |deadline| {
                let names = names.clone();
                async move {
                    let r = self
                        .attempt_async(key, names.clone(), exptime, deadline, mode)
                        .await
                        // (a few blocking round trips, on the error path only)
                        .map_err(|e| self.wrong_type(key, e, deadline));
                    match &r {
                        Ok(Ok(_)) => self.counters().add(crate::shm::counters::ACQUISITIONS, 1),
                        Ok(Err(RedisBusy { seen: Some(s), .. })) => {
                            self.0.pool.saw(&names.channel, s);
                        }
                        _ => {}
                    }
                    r
                }
            },
            |_: &RedisBusy| false,
            |busy: &RedisBusy, step, place| {
                let look = RedisBusy {
                    by_shared: busy.by_shared,
                    ..RedisBusy::held(busy.names.clone()).in_mode(busy.mode)
                };
                let failed = busy.failed.is_some();
                async move { self.sleep_async(look, failed, step, place).await }
            },
            |mut busy: RedisBusy, key, waited| {
                // a task behind others in the queue did not ask: what the first one saw
                if busy.seen.is_none() {
                    busy.seen = self.0.pool.last_seen(&busy.names.channel);
                }
                crate::lock::backend::Backend::gave_up(self, busy, key, waited)
            },
        )
        .await;
        crate::lock::backend::note_wait(self, &r, started);
        let (hold, elapsed) = r?;
        Ok((hold, elapsed, exptime))
    }

    async fn attempt_async(
        &self,
        key: &[u8],
        names: Arc<Names>,
        exptime_ns: u64,
        deadline: Option<Instant>,
        mode: Mode,
    ) -> Result<Result<RedisHold, RedisBusy>, Error> {
        let pool = &self.0.pool;
        let ttl = self.lease_ms(exptime_ns, Duration::ZERO).unwrap_or(1);
        let mut limit = self.attempt_limit(deadline);
        let exclusive = self.0.replicas.is_some();
        let mut corrected = false;
        let mut cuts = 0;
        loop {
            if Instant::now() >= limit {
                // Drawn just before, and passed before anything was asked: this process
                // was stopped (or not run) meanwhile, which says nothing of the server. A
                // new try, while the wait's deadline allows; a wait past it ends with
                // `Timeout` (see `gave_up`).
                let again = cuts < MAX_INTERRUPTS && deadline.is_none_or(|d| Instant::now() < d);
                if again {
                    cuts += 1;
                    limit = self.attempt_limit(deadline);
                    continue;
                }
                let late = Error::Redis(crate::redis_store::net::late());
                return match deadline {
                    Some(_) => Ok(Err(RedisBusy {
                        failed: Some(late),
                        ..RedisBusy::held(names).in_mode(mode)
                    })),
                    None => Err(late),
                };
            }
            let process = crate::shm::process::token();
            let (token, value) = identity::new_hold();
            let not_after = pool.shared.clock.at(limit).unwrap_or(0);
            let aio = if exclusive {
                pool.aio_exclusive(limit).await
            } else {
                pool.aio(limit).await
            };
            let mut aio = match aio {
                Ok(aio) => aio,
                Err(f) => return RedisBusy::or_error(&names, f.error, deadline).map(Err),
            };
            let mut pending = Pending {
                locks: self,
                names: names.clone(),
                token,
                not_after,
                ttl,
                armed: true,
            };
            let sent = Instant::now();
            let call = self
                .0
                .scripts
                .acquire
                .call()
                .key(&names.lock)
                .key(names.cancel_marker(&pending.token))
                .key(&names.shared)
                .key(&names.leases)
                .key(&names.writer)
                .key(&names.readers)
                .arg(&value)
                .arg(ttl)
                .arg(not_after)
                .arg(mode_arg(mode));
            let reply = bounded(limit, call.invoke_async(&mut aio.conn)).await;
            let reply = match reply {
                Ok(reply) => reply,
                Err(e) => {
                    let e = self.failed(
                        &aio,
                        e,
                        &mut pending,
                        false,
                        allowed(sent, limit, self.0.pool.timeout),
                    );
                    return RedisBusy::or_error(&names, e, deadline).map(Err);
                }
            };
            let (verdict, clock) = answer(reply);
            if let Some(us) = clock {
                pool.shared.clock.observe(us, Instant::now());
            }
            match verdict {
                Answer::Taken => {}
                // (the server answers: a new try, with a limit of its own)
                Answer::TooLate if !corrected => {
                    pending.armed = false;
                    corrected = true;
                    limit = self.attempt_limit(deadline);
                    self.give_back(exclusive, aio);
                    continue;
                }
                Answer::Busy(seen) => {
                    pending.armed = false;
                    self.give_back(exclusive, aio);
                    return Ok(Err(RedisBusy::held_by(names, seen).in_mode(mode)));
                }
                Answer::Kept(seen) => {
                    pending.armed = false;
                    self.give_back(exclusive, aio);
                    return Ok(Err(RedisBusy::kept_by(names, seen).in_mode(mode)));
                }
                Answer::Mismatch(held) => {
                    pending.armed = false;
                    self.give_back(exclusive, aio);
                    return Err(mismatch(key, held, mode));
                }
                Answer::Foreign => {
                    pending.armed = false;
                    self.give_back(exclusive, aio);
                    return Err(foreign(key, &names.lock));
                }
                _ => {
                    pending.armed = false;
                    self.give_back(exclusive, aio);
                    return Ok(Err(RedisBusy::held(names).in_mode(mode)));
                }
            }
            if let Some((n, timeout)) = self.0.replicas {
                let acked = bounded(
                    limit,
                    redis::cmd("WAIT")
                        .arg(n)
                        .arg(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX))
                        .query_async(&mut aio.conn),
                )
                .await;
                match acked {
                    // not granted after all: the guard gives back what was taken
                    Ok(acked) => replicated(acked, n)?,
                    Err(e) => {
                        return Err(self.failed(
                            &aio,
                            e,
                            &mut pending,
                            true,
                            allowed(sent, limit, self.0.pool.timeout),
                        ))
                    }
                }
            }
            match self.vouch_async(&aio, sent, limit).await {
                Ok(true) => {}
                // granted by a master that was replaced meanwhile: not a hold (the guard
                // cancels it)
                Ok(false) => return Ok(Err(RedisBusy::held(names).in_mode(mode))),
                // no sentinel could vouch: given back here, on the connection that took it
                // (the janitor's own connection needs a sentinel to find the master, and
                // none answers: the grant stayed until its lease ended, for ever without
                // one); a wait goes on through a sentinel's connection error as through
                // the master's
                Err(e) => {
                    if self.cancel_on(&mut aio, &pending, limit).await {
                        pending.armed = false;
                    }
                    return RedisBusy::or_error(&names, e, deadline).map(Err);
                }
            }
            pending.armed = false;
            let token = std::mem::take(&mut pending.token);
            drop(pending);
            self.give_back(exclusive, aio);
            return Ok(Ok(RedisHold {
                names,
                token,
                taken: sent,
                process,
                first_token: Default::default(),
            }));
        }
    }

    /// An async waiter's sleep of at most `step` on a busy key: in the key's queue of the
    /// process's listener, woken by a release's message (see `async_wait`), in the place
    /// its last sleep had (`place`) if any. Returns the time slept, whether it was woken,
    /// and its place.
    async fn sleep_async(
        &self,
        busy: RedisBusy,
        failed: bool,
        step: Duration,
        place: Option<Option<Turn>>,
    ) -> Slept<Option<Turn>> {
        let names = &busy.names;
        let step = mark_step(&busy, step);
        let started = Instant::now();
        let end = instant_after(started, step);
        let pool = &self.0.pool;
        // the place in the key's queue: kept from the last sleep, else at the back
        let mut turn = match place.flatten() {
            Some(mut turn) => {
                turn.again();
                turn
            }
            None => pool.turn(&names.channel, busy.mode != Mode::Exclusive),
        };
        let listening = !failed
            && pool
                .listen_on(&names.channel, self.attempt_limit(Some(end)))
                .await
                .is_ok();
        if !listening {
            // nobody to hear a release from: the step is slept out, keeping the place
            tokio::time::sleep_until(end.into()).await;
            return Slept {
                used: started.elapsed(),
                moved: false,
                attempt: turn.is_first(),
                place: Some(turn),
            };
        }
        // a release between the attempt that found the key held and the subscription sent
        // its message to nobody: the first of the queue looks once (the others wait for
        // their turn)
        // (and sleeps no longer than what keeps it out takes to lapse by itself)
        let mut until = end;
        if turn.is_first() {
            let aio = pool.aio(end).await;
            if let Ok(aio) = aio {
                let mut conn = aio.conn.clone();
                let held: RedisResult<i64> =
                    bounded(end, self.blocked(&busy).invoke_async(&mut conn)).await;
                match held {
                    Ok(0) => {
                        return Slept {
                            used: started.elapsed(),
                            moved: true,
                            attempt: true,
                            place: Some(turn),
                        }
                    }
                    Ok(held) => until = lapse_by(held, end),
                    Err(_) => {}
                }
            }
        }
        let woken =
            crate::lock::backend::first_of(&mut turn, tokio::time::sleep_until(until.into())).await;
        let lapsed = !woken && until < end;
        Slept {
            used: started.elapsed(),
            moved: woken || lapsed,
            // a step that ran out: only the first of the queue tries (a lease that lapses
            // sends no message), the others keep their turn
            attempt: woken || turn.is_first(),
            place: Some(turn),
        }
    }

    /// Releases `hold` over the async connection: `Ok` if it was ours and is released (by
    /// this call; a lost reply is left to the janitor's fallback).
    pub(crate) async fn release_async(&self, hold: &RedisHold) -> Result<(), Error> {
        let limit = self.0.pool.limit(None);
        let aio = self.0.pool.aio(limit).await?;
        let mut conn = aio.conn.clone();
        let mark = hold.names.release_mark(&hold.token);
        let call = self
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
            .arg(self.mark_ms());
        match bounded(limit, call.invoke_async::<i64>(&mut conn)).await {
            Ok(1 | 2) => Ok(()),
            Ok(_) => Err(Error::Expired),
            Err(e) => {
                self.0.pool.aio_failed(&aio, &e);
                Err(e.into())
            }
        }
    }

    /// An error on `aio`: the connection is forgotten if it broke, and the attempt stays
    /// armed for cancelling if it `took` the key or the server may have run it; the error
    /// names the server and, for a timeout, the time the request was `allowed`.
    fn failed(
        &self,
        aio: &Aio,
        e: redis::RedisError,
        pending: &mut Pending<'_>,
        took: bool,
        allowed: Duration,
    ) -> Error {
        self.0.pool.aio_failed(aio, &e);
        pending.armed = took || is_unanswered(&e);
        // named by its server, as a plain connection's errors are (a deadline that passed
        // mid-request said "the deadline passed")
        let e = match aio.server() {
            Some(server) => crate::redis_store::net::at_server(e, &server, allowed),
            None => e,
        };
        Failed {
            unknown: pending.armed,
            error: e.into(),
        }
        .into()
    }

    fn give_back(&self, exclusive: bool, aio: Aio) {
        if exclusive {
            self.0.pool.put_back_exclusive(aio);
        }
    }

    /// Undoes `pending`'s attempt on `aio` (the acquire's own connection), by `limit` but
    /// never less than the attempt floor from now: whether the server answered.
    async fn cancel_on(&self, aio: &mut Aio, pending: &Pending<'_>, limit: Instant) -> bool {
        let call = self.cancel_call(&pending.names, &pending.token, pending.not_after);
        let limit = limit.max(Instant::now() + crate::redis_store::ops::ATTEMPT_FLOOR);
        bounded(limit, call.invoke_async::<i64>(&mut aio.conn))
            .await
            .is_ok()
    }

    /// `Sentinel::vouch` for an async reply: asking the sentinels, when it must, on the
    /// blocking pool.
    async fn vouch_async(&self, aio: &Aio, sent: Instant, limit: Instant) -> Result<bool, Error> {
        let shared = &self.0.pool.shared;
        if let Some(verdict) = shared.vouch_quick(&aio.tag, sent) {
            return Ok(verdict);
        }
        let (shared, tag) = (shared.clone(), aio.tag.clone());
        tokio::task::spawn_blocking(move || shared.vouch(&tag, sent, limit))
            .await
            .map_err(|e| Error::Redis(redis::RedisError::from(std::io::Error::other(e))))?
            .map_err(Error::Redis)
    }
}

impl crate::lock::AsyncBackend for RedisLocks {
    fn lock_boxed<'a>(
        &'a self,
        key: &'a [u8],
        opts: &'a LockOptions,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<LockGuard<'a, RedisLocks>, Error>> + Send + 'a>,
    > {
        Box::pin(self.lock_async(key, opts))
    }
}
