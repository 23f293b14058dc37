//! The shared-memory backend: a lock table in a memory-mapped file.
//!
//! - `lock_table`: [`LockTable`], the backend's public face (open, inspect, the
//!   [`Backend`](crate::Backend) it implements); `guards`: its calls that hand out guards
//!   (`lock`, `lock_async`, `try_lock_with_lease`); `shared`: read locks and semaphores;
//!   `idle_cache`: where this process's idle shared entries are, to take them again.
//! - `table/`: the slot protocol, a file per part (`claim`, `hold`, `idle`, `recover`,
//!   `wait`, `inspect`), model-checked by `loom_tests`.
//! - `slot`: a slot's 64-byte hot line, its control word, and the cold side array.
//! - `registry`: the owner registry (who is attached, and whether the kernel says they
//!   are alive); `attachment`: one process's registration, its descriptor and lock.
//! - `format`: the file's header and layout; `file`: creating and checking it;
//!   `mapping`: mapping it; `anchor`: what keeps this process's registration alive;
//!   `deleted`: a file deleted or replaced while in use (who still maps it, whether a
//!   path still leads to it); `counters`: the counters at the end of the file.
//! - `clock`: the shared monotonic clock; `futex`: sleeping and waking; `process`: this
//!   process's identity (pid, start time, fork detection); `primitive`: spin helpers.
//!
//! The [`SharedDict`](crate::SharedDict) reuses the file, format, registry and clock
//! layers for its own table.

#[cfg(not(loom))]
pub(crate) mod anchor;
#[cfg(all(feature = "tokio", not(loom)))]
pub(crate) mod async_wait;
#[cfg(not(loom))]
pub(crate) mod attachment;
pub(crate) mod clock;
#[cfg(not(loom))]
pub(crate) mod counters;
#[cfg(not(loom))]
pub(crate) mod deleted;
#[cfg(not(loom))]
pub(crate) mod file;
pub(crate) mod format;
#[cfg(not(loom))]
pub(crate) mod futex;
#[cfg(not(loom))]
mod guards;
#[cfg(not(loom))]
mod idle_cache;
#[cfg(not(loom))]
mod lock_table;
#[cfg(not(loom))]
pub(crate) mod mapping;
pub(crate) mod primitive;
#[cfg(not(loom))]
pub(crate) mod process;
pub(crate) mod registry;
#[cfg(not(loom))]
mod shared;
pub(crate) mod slot;
pub(crate) mod table;

#[cfg(all(test, loom))]
mod loom_tests;

#[cfg(not(loom))]
pub use lock_table::{HoldMode, Holder, HolderState, LockTable, OpenOptions};
#[cfg(not(loom))]
pub use shared::{Semaphore, Shared};
