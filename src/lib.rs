//! Named locks shared by the processes of one machine, with the API of OpenResty's
//! `lua-resty-lock`.
//!
//! A [`LockTable`] lives in a memory-mapped file (on `/dev/shm` for speed): a fixed-slot
//! hash table of lock entries with lease deadlines. Forked workers inherit it; unrelated
//! processes attach to it by path. A [`Lock`] takes one key at a time and waits on resty's
//! step/ratio schedule; a [`LockGuard`] releases its key when dropped.
//!
//! Beyond resty.lock: unlock and renewal are owner-checked (a holder whose lease ran out
//! and was taken over gets [`Error::Expired`] and never touches the new owner's entry),
//! every hold can have a fencing [`token`](Lock::token), a dead holder's key is reclaimed
//! as soon as a waiter sees it dead, a full table never evicts a live lock, and a guard
//! copied into a forked child never releases its parent's hold.
//!
//! ```
//! use shmlock::{LockOptions, LockTable};
//!
//! # let path = std::env::temp_dir().join(format!("shmlock-doc-lib-{}", std::process::id()));
//! # let _ = std::fs::remove_file(&path);
//! let table = LockTable::open(&path, 1024)?;
//! {
//!     let guard = table.lock("cache:item:7", &LockOptions::default())?;
//!     // ... look in the cache again, fetch, store: one process at a time ...
//!     assert_eq!(guard.elapsed(), std::time::Duration::ZERO);
//! } // released here
//! # std::fs::remove_file(&path).unwrap();
//! # Ok::<(), shmlock::Error>(())
//! ```
//!
//! Layout of the source, the lock API on top and the backends below:
//!
//! - `lock/`: the [`Lock`] and [`LockGuard`] API (`api`), the [`Backend`] trait and the
//!   waiting loop (`backend`), [`LockOptions`] (`options`), resty's schedule (`wait`).
//! - `shm/`: the shared-memory backend, [`LockTable`] (`lock_table`, and `guards` for its
//!   calls that hand out guards), its slot protocol (`table`, `slot`, model-checked in
//!   `loom_tests`), owner registry (`registry`, `attachment`), file format (`format`,
//!   `file`), clock, futex and process identity.
//! - `dict/`: [`SharedDict`], ngx.shared.DICT on the same file machinery.
//! - `redis_store/` (feature `redis`): the [`RedisLocks`] backend: one server, Sentinel
//!   or Cluster; its read locks and semaphores (`shared`, their Lua in `scripts`).
//! - `key`: what a key may be; `limits`: [`MAX_KEY_LEN`] and [`MAX_CAPACITY`]; `error`:
//!   [`Error`]; `broken`: the deliberately broken variants the loom models must catch.

#![deny(unsafe_op_in_unsafe_fn)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs, missing_debug_implementations)]
// Loom builds compile only the protocol; the file and API layers sit unused.
#![cfg_attr(loom, allow(dead_code, unused_imports))]

#[cfg(not(target_has_atomic = "64"))]
compile_error!("shmlock needs 64-bit atomics");
#[cfg(not(target_os = "linux"))]
compile_error!(
    "shmlock builds on Linux only: it needs open-file-description locks (F_OFD_SETLK) for \
     its owner registry, MADV_WIPEONFORK to tell a forked child from its parent, futexes \
     in shared mappings, CLOCK_MONOTONIC_COARSE and /proc/self/timens_offsets"
);

mod broken;
mod dict;
mod error;
mod key;
mod limits;
mod lock;
#[cfg(not(loom))]
mod per_process;
#[cfg(all(feature = "redis", not(loom)))]
mod redis_store;
mod shm;
#[cfg(not(loom))]
mod stats;

#[cfg(not(loom))]
pub use dict::{
    DictOptions, Fetched, Item, ItemRef, Number, Put, SharedDict, Source, Stored, Value, ValueInfo,
    ValueKind, ValueRef,
};
pub use error::{Error, FormatError, HolderSeen, KeyPreview};
pub use limits::{MAX_CAPACITY, MAX_KEY_LEN};
#[cfg(all(feature = "tokio", not(loom)))]
pub use lock::AsyncBackend;
pub use lock::LockOptions;
#[cfg(not(loom))]
pub use lock::{Backend, KeepAlive, Lock, LockGuard};
#[cfg(all(feature = "redis", not(loom)))]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use redis_store::shared::{RedisSemaphore, RedisShared};
#[cfg(all(feature = "redis", not(loom)))]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use redis_store::{RedisHolder, RedisLocks};
#[cfg(not(loom))]
pub use shm::{HoldMode, Holder, HolderState, LockTable, OpenOptions, Semaphore, Shared};
#[cfg(not(loom))]
pub use stats::{DictStats, Histogram, LockStats};
