//! The lock API, written once over any backend: the resty-style [`Lock`] object and the
//! [`LockGuard`] (`api`), the [`Backend`] trait and the waiting loop every backend shares
//! (`backend`), the [`LockOptions`] (`options`), resty's step/ratio schedule (`wait`) and
//! how late a waiter's sleeps may end (`slack`).

#[cfg(not(loom))]
mod api;
#[cfg(not(loom))]
pub(crate) mod backend;
pub(crate) mod options;
#[cfg(not(loom))]
pub(crate) mod slack;
pub(crate) mod wait;

#[cfg(feature = "tokio")]
pub use api::AsyncBackend;
#[cfg(not(loom))]
pub(crate) use api::{guard, try_guard};
#[cfg(not(loom))]
pub use api::{KeepAlive, Lock, LockGuard};
#[cfg(not(loom))]
pub use backend::Backend;
pub use options::LockOptions;
