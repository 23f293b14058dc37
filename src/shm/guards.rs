//! The calls of [`LockTable`] that take a key and hand out a [`LockGuard`]: `lock`,
//! `lock_async` and `try_lock_with_lease`. They live apart from `lock_table.rs` because the
//! guard names the lock table as its default backend: the table itself is below the lock
//! API, and these calls above both.

use std::borrow::Borrow;
use std::time::Duration;

use crate::error::Error;
#[cfg(feature = "tokio")]
use crate::lock::backend::{acquire_async, Backend};
use crate::lock::options::LockOptions;
use crate::lock::{self, LockGuard};
use crate::shm::lock_table::LockTable;
#[cfg(feature = "tokio")]
use crate::shm::lock_table::{ShmBusy, ShmHold};
#[cfg(feature = "tokio")]
use crate::shm::table::Mode;

impl LockTable {
    /// Takes `key`, waiting as `opts` says; released when the guard drops.
    #[inline]
    pub fn lock(
        &self,
        key: impl AsRef<[u8]>,
        opts: impl Borrow<LockOptions>,
    ) -> Result<LockGuard<'_>, Error> {
        let opts = opts.borrow();
        lock::guard(self, key.as_ref(), opts, Some(opts.timeout))
    }

    /// [`lock`](Self::lock) for async code (tokio): the runtime thread is never blocked.
    /// Each attempt is a few atomic operations, made in place; a waiting task is woken by
    /// the release that frees its key (through one thread per table and process that sleeps
    /// on every word the process's tasks wait for), the first task of the process waiting
    /// for that key first, with resty's schedule as its budget: the elapsed time is the time
    /// actually waited. With `notify: false` it polls on resty's schedule with
    /// `tokio::time::sleep`, elapsed = the sum of the steps. Dropping the guard releases with
    /// one CAS, which never blocks either.
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("shmlock-doc-async-{}", std::process::id()));
    /// # let _ = std::fs::remove_file(&path);
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// use shmlock::{LockOptions, LockTable};
    ///
    /// let table = LockTable::open(&path, 64)?;
    /// let guard = table.lock_async("user:42", &LockOptions::default()).await?;
    /// drop(guard);
    /// # std::fs::remove_file(&path).unwrap();
    /// # Ok::<(), shmlock::Error>(())
    /// # }).unwrap();
    /// ```
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub async fn lock_async(
        &self,
        key: impl AsRef<[u8]>,
        opts: impl Borrow<LockOptions>,
    ) -> Result<LockGuard<'_>, Error> {
        let opts = opts.borrow();
        let (hold, elapsed, exptime) = self
            .acquire_async_in(key.as_ref(), opts, Mode::Exclusive)
            .await?;
        Ok(LockGuard::new(self, hold, elapsed, exptime))
    }

    /// The async wait of [`lock_async`](Self::lock_async), in any mode: the hold, the
    /// elapsed time and the lease length.
    #[cfg(feature = "tokio")]
    pub(crate) async fn acquire_async_in(
        &self,
        key: &[u8],
        opts: &LockOptions,
        mode: Mode,
    ) -> Result<(ShmHold, std::time::Duration, u64), Error> {
        let resolved = opts.resolve()?;
        let started = std::time::Instant::now();
        // A writer's wait dropped while it waited for readers (it marked them), or a
        // reader's for a writer, takes its marks back, as one that times out does (see
        // `Table::writer_withdraws`, `Table::readers_withdraw`).
        let marked = WaitMarks {
            table: self,
            marked: std::sync::OnceLock::new(),
            ended: std::sync::atomic::AtomicBool::new(false),
        };
        let r = acquire_async(
            key,
            &resolved,
            opts.timeout,
            || self.ticket_async(key),
            |_| std::future::ready(self.try_acquire_in(key, resolved.exptime_ns, mode)),
            |busy: &ShmBusy| Backend::reap(self, busy),
            |busy: &ShmBusy, step, place| {
                marked.saw(busy);
                self.sleep_async(busy, step, place)
            },
            |busy, key, waited| Backend::gave_up(self, busy, key, waited),
        )
        .await;
        // (ended: acquired, or gave up and took them back)
        marked
            .ended
            .store(true, std::sync::atomic::Ordering::Relaxed);
        crate::lock::backend::note_wait(self, &r, started);
        let (hold, elapsed) = r?;
        Ok((hold, elapsed, resolved.exptime_ns))
    }

    /// Takes `key` if nobody holds it, without waiting, for a lease of `lease` (zero:
    /// never expires). `Ok(None)` if it is held.
    #[inline]
    pub fn try_lock_with_lease(
        &self,
        key: impl AsRef<[u8]>,
        lease: Duration,
    ) -> Result<Option<LockGuard<'_>>, Error> {
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
    ) -> Result<Option<LockGuard<'_>>, Error> {
        self.try_lock_with_lease(key, exptime)
    }
}

#[cfg(feature = "tokio")]
impl crate::lock::AsyncBackend for LockTable {
    fn lock_boxed<'a>(
        &'a self,
        key: &'a [u8],
        opts: &'a LockOptions,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<LockGuard<'a>, Error>> + Send + 'a>,
    > {
        Box::pin(self.lock_async(key, opts))
    }
}

/// The holds an async wait marked (a writer's, the readers'; a reader's, the writer's),
/// taken back if the wait is dropped before it ends (a cancelled `lock_async`): otherwise
/// the others would wait for the marks to lapse, and for the keys the holds' ends kept
/// for a waiter that is gone.
#[cfg(feature = "tokio")]
struct WaitMarks<'a> {
    table: &'a LockTable,
    /// The key's hash once the wait slept marking holds, whether it was a reader's, and
    /// the process whose wait it was (`process::token`): a forked child that drops its
    /// copy of the future takes nothing of its parent's, which still waits.
    marked: std::sync::OnceLock<(crate::shm::table::KeyHash, bool, u64)>,
    /// The wait ended (not dropped).
    ended: std::sync::atomic::AtomicBool,
}

#[cfg(feature = "tokio")]
impl WaitMarks<'_> {
    fn saw(&self, busy: &ShmBusy) {
        if busy.marks() && self.marked.get().is_none() {
            let reader = busy.waits_for_writer();
            let _ = self
                .marked
                .set((busy.hash(), reader, crate::shm::process::token()));
        }
    }
}

#[cfg(feature = "tokio")]
impl Drop for WaitMarks<'_> {
    fn drop(&mut self) {
        if self.ended.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        match self.marked.get() {
            Some(&(hash, reader, process)) if process == crate::shm::process::token() => {
                if reader {
                    self.table.readers_withdraw(hash);
                } else {
                    self.table.writer_withdraws(hash);
                }
            }
            _ => {}
        }
    }
}
