//! A table file mapped into this process: the registry, the body and the counters, reached
//! only through atomics. The mapping is made from the descriptor the file was opened with, which holds
//! no lock: a forked child inherits it like any other memory, and a child's use of it
//! decides nothing about anyone's liveness (the registration is the anchor's, see
//! `anchor.rs`).

use std::fs::File;
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::{MmapOptions, MmapRaw};

use crate::shm::format::{Header, HEADER_SIZE, STATS_SIZE};
use crate::shm::registry::{self, Registry};

/// Everything after the header of a mapped table file: the registry, the body, the
/// counters.
pub(crate) struct Mapping {
    base: NonNull<AtomicU64>,
    registry_words: usize,
    /// Where the body starts: the registry takes whole pages.
    body_at: usize,
    body_words: usize,
    /// This mapping among all this process has made (never reused): what a thread's
    /// pending counts name (see `counters.rs`).
    id: u64,
    // Keeps the mapping (and so `base`) valid; unmapped on drop.
    _map: MmapRaw,
}

// SAFETY: the mapping is only reached through atomics (`&[AtomicU64]`, or structs whose
// fields are all atomics), so sharing it across threads is as sound as sharing the atomics;
// the mapping itself is owned and unmapped exactly once.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps everything after the header of the table file `file`, whose size was checked
    /// against `header`.
    pub(crate) fn new(file: &File, header: &Header, writable: bool) -> io::Result<Mapping> {
        let mut options = MmapOptions::new();
        options
            .offset(HEADER_SIZE as u64)
            .len(header.mapped_len() as usize);
        let map = if writable {
            options.map_raw(file)
        } else {
            options.map_raw_read_only(file)
        }?;
        let base = NonNull::new(map.as_mut_ptr().cast::<AtomicU64>()).expect("mmap returned null");
        static IDS: AtomicU64 = AtomicU64::new(1);
        Ok(Mapping {
            base,
            registry_words: header.registry as usize * registry::ENTRY_WORDS,
            body_at: (header.registry_len() / 8) as usize,
            body_words: (header.layout.body_len(header.slot_count) / 8) as usize,
            id: IDS.fetch_add(1, Ordering::Relaxed),
            _map: map,
        })
    }

    /// The registry's words (its entries; padding excluded).
    #[inline]
    pub(crate) fn registry(&self) -> Registry<'_> {
        // SAFETY: the registry starts one page into the mapping (aligned) and is
        // `registry_words` long, inside the mapping (its length was checked against the
        // file before mapping); every bit pattern is a valid `AtomicU64`; all mutation, by
        // us or others, is atomic; `self` keeps the mapping alive for the lifetime.
        Registry::new(unsafe {
            std::slice::from_raw_parts(self.base.as_ptr(), self.registry_words)
        })
    }

    /// The body as words. Every layout is made of 8-byte-aligned atomics.
    #[inline]
    pub(crate) fn words(&self) -> &[AtomicU64] {
        // SAFETY: as for `all`, of which the body is a part: `body_words` words from word
        // `body_at` (8-byte aligned), inside the mapping. Made directly rather than sliced
        // from `all`: a dict reaches its words through here several times an operation,
        // and the slice's bounds checks cost ~10 instructions a call.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(self.body_at), self.body_words) }
    }

    /// The counters' words (see `counters.rs`).
    #[inline]
    pub(crate) fn stats(&self) -> &[AtomicU64] {
        &self.all()[self.body_at + self.body_words..]
    }

    /// This mapping's number in this process.
    #[inline]
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Everything mapped: registry pages, the body, the counters.
    pub(crate) fn all(&self) -> &[AtomicU64] {
        let words = self.body_at + self.body_words + STATS_SIZE as usize / 8;
        // SAFETY: as for `registry`: the mapping is exactly `words` words (checked against
        // the file); page-aligned; atomics only; borrowed from `self`.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr(), words) }
    }
}
