//! Looking without taking: where a key's live entry is, whether an entry's owner is dead,
//! and consistent snapshots of the occupied slots.

use super::hold::token_label;
use super::{busy, Busy, Entry, Env, KeyHash, Seen, Slots, Table};
use crate::shm::primitive::{fence, Ordering};
use crate::shm::slot::{State, Word};

impl<S: Slots, E: Env> Table<S, E> {
    /// The live entry of a key, if any (no side effects).
    pub(crate) fn find(&self, hash: KeyHash) -> Option<Busy> {
        let slots = self.slots();
        let home = hash.home(slots.len());
        let now = self.now();
        let reach = self.reach(home, Ordering::Acquire);
        let mut d = 0;
        while d <= reach {
            let i = self.at(home, d);
            let c = self.word(i, Ordering::Acquire);
            match self.examine(&slots[i], c, hash, now) {
                Seen::Changed => continue,
                // held until the check ends, and most likely after it
                Seen::Key | Seen::Stealing => return Some(busy(i, home, c, hash)),
                _ => {}
            }
            d += 1;
        }
        None
    }

    /// How many live shared holds the key has (a snapshot).
    pub(crate) fn shared_holds(&self, hash: KeyHash) -> usize {
        let mut n = 0;
        self.for_shared_holds(hash, |_, _, expired| n += usize::from(!expired));
        n
    }

    /// A snapshot of the live entry of a key, if any (what a wait that gave up saw of the
    /// holder).
    pub(crate) fn entry_of(&self, hash: KeyHash) -> Option<Entry> {
        let found = self.find(hash)?;
        self.entry(found.slot).filter(|e| e.hash == hash)
    }

    /// Whether the owner recorded in an entry is dead, as the registry judges it.
    pub(crate) fn is_owner_dead(&self, e: &Entry) -> bool {
        match e.word.state() {
            State::Free => false,
            State::Held | State::Extending | State::Stealing => {
                self.env.is_holder_dead(e.word.owner(), e.lease)
            }
            _ => self.env.is_dead(e.word.owner()),
        }
    }

    /// Snapshots every occupied slot (for inspection; consistent per slot).
    pub(crate) fn entries(&self) -> Vec<Entry> {
        (0..self.slots().len())
            .filter_map(|i| self.entry(i))
            .collect()
    }

    /// Snapshots of the keys kept for a writer or for readers (see `idle.rs`): no holds,
    /// but what keeps the others out meanwhile, which inspection shows.
    pub(crate) fn kept_keys(&self) -> Vec<Entry> {
        (0..self.slots().len())
            .filter_map(|i| {
                let c = self.word(i, Ordering::Acquire);
                self.kept(i, c).then(|| self.read_entry(i, c)).flatten()
            })
            .collect()
    }

    /// Whether the busy key of `b` is kept for a writer or readers now (the entry `b` saw
    /// still is).
    pub(crate) fn is_kept(&self, b: &Busy) -> bool {
        let c = self.word(b.slot, Ordering::Acquire);
        c.ident() == b.word.ident() && self.kept(b.slot, c)
    }

    /// Whether readers wait for the hold `e` now: a writer's hold they marked lately (its
    /// release keeps the key for them).
    pub(crate) fn readers_wait_for(&self, e: &Entry) -> bool {
        e.word.readers_wait() && self.readers_active(e.slot as usize, e.word)
    }

    /// Whether a writer waits for the hold `e` now: a reader's hold whose writer's mark is
    /// fresh (new readers of its key defer to it).
    pub(crate) fn writer_waits_for(&self, e: &Entry) -> bool {
        e.word.is_shared() && e.word.writer_waits() && !self.writer_gone(e.slot as usize, e.word)
    }

    /// A consistent snapshot of slot `i`, if it is occupied.
    pub(super) fn entry(&self, i: usize) -> Option<Entry> {
        let c = self.word(i, Ordering::Acquire);
        // (an idle entry is nobody's hold: see `idle.rs`)
        if matches!(c.state(), State::Free | State::Idle) {
            return None;
        }
        self.read_entry(i, c)
    }

    /// A snapshot of slot `i` as its word `c` (read with acquire) says, if it still does
    /// after the fields are read.
    fn read_entry(&self, i: usize, c: Word) -> Option<Entry> {
        let slot = &self.slots()[i];
        let cold = self.cold(i);
        let hash = KeyHash {
            lo: slot.hash_lo.load(Ordering::Relaxed),
            hi: slot.hash_hi.load(Ordering::Relaxed),
        };
        let deadline = slot.deadline.load(Ordering::Relaxed);
        let acquired_at = slot.acquired_at.load(Ordering::Relaxed);
        let lease = slot.lease.load(Ordering::Relaxed);
        let limit = slot.limit.load(Ordering::Relaxed);
        let token_of = cold.token_of.load(Ordering::Acquire);
        let token = cold.token.load(Ordering::Relaxed);
        let (key_len, preview) = cold.read_preview();
        fence(Ordering::Acquire);
        if Word(slot.control.load(Ordering::Relaxed)).ident() != c.ident() {
            return None; // moved while read: not a consistent snapshot
        }
        Some(Entry {
            slot: i as u32,
            word: c,
            hash,
            deadline,
            acquired_at,
            lease,
            token: (token_of == token_label(c, lease, acquired_at)).then_some(token),
            key_len,
            preview,
            limit,
        })
    }
}
