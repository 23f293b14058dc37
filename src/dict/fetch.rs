//! The cache-stampede recipe of lua-resty-lock, as one call.

use std::time::Duration;

use super::api::SharedDict;
use super::value::Value;
use crate::error::Error;
use crate::lock;
use crate::lock::backend::Backend;
use crate::lock::options::LockOptions;

/// Where [`SharedDict::get_or_fetch`] got its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The cache had it: no lock was taken.
    Cache,
    /// Missing at first; another process stored it while this one waited for the lock
    /// (or, where this one's lease ran out while it fetched, before it could store what it
    /// fetched: the stored value, which a later holder fetched, is returned instead).
    Filled,
    /// This process called `fetch` and stored the result.
    Fetched,
}

/// A value from [`SharedDict::get_or_fetch`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fetched {
    /// The value.
    pub value: Value,
    /// Where it came from.
    pub source: Source,
    /// How long the lock was waited for (zero on a cache hit).
    pub waited: Duration,
}

/// [`Error::InvalidOptions`] for a lock that lets several holders in: under it, several
/// processes would fetch one miss.
fn refuse_shared<B: Backend>(locks: &B) -> Result<(), Error> {
    if locks.exclusive() {
        return Ok(());
    }
    Err(Error::InvalidOptions(
        "get_or_fetch needs an exclusive lock (a LockTable or RedisLocks, or a semaphore of \
         1 permit): under a shared view, or a semaphore of several permits, several \
         processes would fetch the same miss at once",
    ))
}

impl SharedDict {
    /// Reads `key` through the cache, so that of all the processes that miss it at once
    /// only one calls `fetch`: resty.lock's recipe. On a miss, takes `key` in `locks`
    /// (default [`LockOptions`]), looks in the dict again (someone may have filled it
    /// meanwhile), and only if it is still missing calls `fetch`, stores the result for
    /// `ttl` and unlocks. `fetch` returns anything a [`Value`] is made from: bytes (a
    /// `Vec<u8>` or `&[u8]`), a `String` or `&str`, an `i64`, an `f64`, a `bool`.
    ///
    /// Errors of the dict or the lock (a lock [`Timeout`](Error::Timeout), a value longer
    /// than the dict's limit) come back through `E: From<Error>`, as do `fetch`'s own.
    /// `locks` must keep other holders out: a view of readers (`table.shared()`) or a
    /// semaphore of several permits is [`Error::InvalidOptions`]. On a handle opened
    /// [`read_only`](crate::DictOptions::read_only), a hit is returned and a miss is
    /// [`Error::ReadOnly`] before the lock is taken or `fetch` called: the value could not
    /// be stored.
    /// Nothing is stored when `fetch` fails (or its value cannot be stored), so each
    /// waiter then takes the lock in turn and tries again, as in resty's recipe: one
    /// backend call at a time, never a stampede.
    ///
    /// A fetch that outlasts its lease (a stopped process, a slow backend) does not
    /// overwrite what the next holder stored meanwhile: the lease is checked once `fetch`
    /// returns (one more round trip on Redis), and a lost one stores only if the key has
    /// no value yet (an [`add`](Self::add)), else returns the stored value as
    /// [`Source::Filled`]. A process stopped between that check and its store can still
    /// store over a successor's value: the dict does not fence stores.
    ///
    /// The default options wait 5 s for the process that is fetching and give it a 30 s
    /// lease; a slower backend needs [`get_or_fetch_with`](Self::get_or_fetch_with).
    ///
    /// ```
    /// use shmlock::{LockTable, SharedDict, Source};
    /// use std::time::Duration;
    ///
    /// # let dir = std::env::temp_dir().join(format!("shmlock-doc-fetch-{}", std::process::id()));
    /// # let _ = std::fs::remove_dir_all(&dir);
    /// # std::fs::create_dir_all(&dir).unwrap();
    /// let cache = SharedDict::open(dir.join("cache"), 1024, 256)?;
    /// let locks = LockTable::open(dir.join("locks"), 1024)?;
    ///
    /// let slow_backend = || Ok::<_, shmlock::Error>(String::from("row 42"));
    /// let first = cache.get_or_fetch(&locks, "item:42", Duration::from_secs(60), slow_backend)?;
    /// assert_eq!(first.source, Source::Fetched);
    /// let never = || -> Result<Vec<u8>, shmlock::Error> { unreachable!("cached") };
    /// let again = cache.get_or_fetch(&locks, "item:42", Duration::from_secs(60), never)?;
    /// assert_eq!((again.source, again.value.as_bytes()), (Source::Cache, Some(&b"row 42"[..])));
    /// # std::fs::remove_dir_all(&dir).unwrap();
    /// # Ok::<(), shmlock::Error>(())
    /// ```
    pub fn get_or_fetch<B, E, F, V>(
        &self,
        locks: &B,
        key: impl AsRef<[u8]>,
        ttl: Duration,
        fetch: F,
    ) -> Result<Fetched, E>
    where
        B: Backend,
        E: From<Error>,
        F: FnOnce() -> Result<V, E>,
        V: Into<Value>,
    {
        self.get_or_fetch_with(locks, key, ttl, &LockOptions::default(), fetch)
    }

    /// [`get_or_fetch`](Self::get_or_fetch) with the lock's options: how long to wait for
    /// the process that is fetching (`timeout`), and the lease it gets (`exptime`, which
    /// should outlast the slowest fetch).
    pub fn get_or_fetch_with<B, E, F, V>(
        &self,
        locks: &B,
        key: impl AsRef<[u8]>,
        ttl: Duration,
        opts: &LockOptions,
        fetch: F,
    ) -> Result<Fetched, E>
    where
        B: Backend,
        E: From<Error>,
        F: FnOnce() -> Result<V, E>,
        V: Into<Value>,
    {
        let key = key.as_ref();
        refuse_shared(locks)?;
        if let Some(hit) = self.get(key)? {
            return Ok(Fetched {
                value: hit.value,
                source: Source::Cache,
                waited: Duration::ZERO,
            });
        }
        self.refuse_read_only()?;
        let guard = lock::guard(locks, key, opts, Some(opts.timeout))?;
        let waited = guard.elapsed();
        // The double check: whoever held the lock before us may have stored the value.
        if let Some(hit) = self.get_uncounted(key)? {
            return Ok(Fetched {
                value: hit.value,
                source: Source::Filled,
                waited,
            });
        }
        let value = fetch()?.into();
        // (stored before the unlock: a waiter let in first would miss, and fetch again)
        let stored = self.store_fetched(key, value, ttl, guard.check().is_ok(), waited);
        drop(guard);
        Ok(stored?)
    }

    /// Stores what `fetch` returned: over anything if the lease was `held` until now; if
    /// not, only where no later holder stored the key's value first (that one is newer,
    /// and returned instead).
    fn store_fetched(
        &self,
        key: &[u8],
        value: Value,
        ttl: Duration,
        held: bool,
        waited: Duration,
    ) -> Result<Fetched, Error> {
        let fetched = |value| Fetched {
            value,
            source: Source::Fetched,
            waited,
        };
        if held {
            self.set(key, &value, ttl)?;
            return Ok(fetched(value));
        }
        // (a value that lapses or is deleted between the `add` and the `get` is looked
        // for again; a key churned that fast by others gets this value stored over it)
        for _ in 0..8 {
            match self.add(key, &value, ttl) {
                Ok(_) => return Ok(fetched(value)),
                Err(Error::Exists { .. }) => {}
                Err(e) => return Err(e),
            }
            if let Some(hit) = self.get_uncounted(key)? {
                return Ok(Fetched {
                    value: hit.value,
                    source: Source::Filled,
                    waited,
                });
            }
        }
        self.set(key, &value, ttl)?;
        Ok(fetched(value))
    }

    /// [`get_or_fetch`](Self::get_or_fetch) for async code (feature `tokio`): the lock is
    /// taken with `lock_async` on either backend, so a waiting task blocks no runtime
    /// thread and is woken when the fetching task stores the value and unlocks; `fetch` is
    /// a future. Of all the tasks and processes that miss the key at once, one fetches.
    ///
    /// ```
    /// use shmlock::{LockTable, SharedDict, Source};
    /// use std::time::Duration;
    ///
    /// # let dir = std::env::temp_dir().join(format!("shmlock-doc-fetch-async-{}", std::process::id()));
    /// # let _ = std::fs::remove_dir_all(&dir);
    /// # std::fs::create_dir_all(&dir).unwrap();
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let cache = SharedDict::open(dir.join("cache"), 1024, 256)?;
    /// let locks = LockTable::open(dir.join("locks"), 1024)?;
    /// let got = cache
    ///     .get_or_fetch_async(&locks, "item:42", Duration::from_secs(60), || async {
    ///         Ok::<_, shmlock::Error>(b"row 42".to_vec())
    ///     })
    ///     .await?;
    /// assert_eq!(got.source, Source::Fetched);
    /// # std::fs::remove_dir_all(&dir).unwrap();
    /// # Ok::<(), shmlock::Error>(())
    /// # }).unwrap();
    /// ```
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub async fn get_or_fetch_async<B, E, F, Fut, V>(
        &self,
        locks: &B,
        key: impl AsRef<[u8]>,
        ttl: Duration,
        fetch: F,
    ) -> Result<Fetched, E>
    where
        B: crate::lock::AsyncBackend,
        E: From<Error>,
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<V, E>>,
        V: Into<Value>,
    {
        self.get_or_fetch_async_with(locks, key, ttl, &LockOptions::default(), fetch)
            .await
    }

    /// [`get_or_fetch_async`](Self::get_or_fetch_async) with the lock's options (see
    /// [`get_or_fetch_with`](Self::get_or_fetch_with)).
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub async fn get_or_fetch_async_with<B, E, F, Fut, V>(
        &self,
        locks: &B,
        key: impl AsRef<[u8]>,
        ttl: Duration,
        opts: &LockOptions,
        fetch: F,
    ) -> Result<Fetched, E>
    where
        B: crate::lock::AsyncBackend,
        E: From<Error>,
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<V, E>>,
        V: Into<Value>,
    {
        let key = key.as_ref();
        refuse_shared(locks)?;
        if let Some(hit) = self.get(key)? {
            return Ok(Fetched {
                value: hit.value,
                source: Source::Cache,
                waited: Duration::ZERO,
            });
        }
        self.refuse_read_only()?;
        let guard = locks.lock_boxed(key, opts).await?;
        let waited = guard.elapsed();
        // The double check, as in `get_or_fetch_with`.
        if let Some(hit) = self.get_uncounted(key)? {
            return Ok(Fetched {
                value: hit.value,
                source: Source::Filled,
                waited,
            });
        }
        let value = fetch().await?.into();
        let stored = self.store_fetched(key, value, ttl, guard.check().is_ok(), waited);
        drop(guard);
        Ok(stored?)
    }
}
