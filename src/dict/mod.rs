//! [`SharedDict`]: ngx's `lua_shared_dict` for processes, a key-value cache in a mapped file.
//!
//! The same machinery as the lock table (a fixed-slot table in a file that forked workers
//! inherit and other processes attach to by path), with entries that carry a value. Reads
//! are lock-free (a per-entry seqlock, see [`entry`]); writes take the dict's writer lock
//! (see [`writer`]), one per dict as in ngx, held for one entry's copy. A writer copies an
//! entry aside before it rewrites it (see [`journal`]), so that one killed or stalled in
//! the middle leaves the key's previous value.
//!
//! Entries never move: a key lives within [`WINDOW`] slots of its home, and each home
//! records the farthest distance at which one of its keys was placed (`reach`), so a
//! lookup reads at most `reach + 1` entries and never stops at a gap. Each home also has a
//! [`filter`] of the keys it may hold, so that a lookup of an absent key usually reads only
//! the home.

pub(crate) mod entry;
#[cfg(not(loom))]
mod fetch;
mod filter;
// The block heap: values longer than an entry's room.
pub(crate) mod heap;
mod journal;
#[cfg(all(test, loom))]
mod loom_tests;
// LRU stamps: how an entry's uses are ranked for eviction.
mod recency;
#[cfg(not(loom))]
mod value;
// Bytes packed into atomic words and back.
mod words;
mod writer;

#[cfg(not(loom))]
pub use api::*;
#[cfg(not(loom))]
pub use fetch::{Fetched, Source};
#[cfg(not(loom))]
pub use value::{Number, Value, ValueRef};

#[cfg(not(loom))]
mod api;
