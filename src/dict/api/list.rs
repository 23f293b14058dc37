//! ngx's list operations (`lpush`, `rpush`, `lpop`, `rpop`, `llen`): a list is one entry
//! whose value holds its elements (see [`List`]), written under the dict's writer lock like
//! any value, so lists are bounded by the dict's `max_value_len` as ngx's are by its zone,
//! and expire, evict and delete as any entry.
//!
//! A list short enough for its entry's own room is written whole. A longer one lives in
//! the heap, and a push or a pop there changes it at its edge. A push writes a fresh
//! block or two, holding the element and what the edge block held of the list, and a new
//! index that names the old data blocks again (never written while named: see
//! `heap.rs`): it costs its element, a block or two and the index (4 bytes for each 256
//! of the list). A pop takes no block at all: at the front it moves the chain's skip on
//! (a skip passes whole data blocks, and a whole index block moves the chain's start to
//! the next), at the back its length; what it passes goes back. The entry counts the
//! elements, so `llen` reads none. The blocks a change leaves go back once the entry names
//! the new chain, as any value's: a writer stopped or killed before that leaves the old
//! chain whole (the undo copy names it: the key keeps its list), and what it took or
//! left to a sweep. The whole-value path still serves a list moving between its entry and
//! the heap, a push of an element of megabytes (whose copy beats), and a damaged element.

use super::*;
use crate::dict::heap::{Chain, BEAT_BYTES, BLOCK, MAX_SKIP, PER_INDEX};
use crate::dict::value::{
    element, element_len, element_value, List, ELEMENT_EXTRA, ELEMENT_HEAD, ELEMENT_TAIL,
};

impl SharedDict {
    /// Adds `value` at the head of the list under `key` and returns its length, as ngx's
    /// `lpush`. A key with no live value gets a new list (that never expires; `expire`
    /// sets a time to live, as for any value) in a free or expired entry: like ngx's, a
    /// push never evicts a live value, it is [`Error::NoMemory`] when there is no room. A
    /// list kept in the heap ([`heap_size`](crate::DictOptions::heap_size)) changes at its
    /// edge: a push takes a block or two and a new index (4 bytes for each 256 of the
    /// list) beside the old one, which goes once the new one is in place; a pop takes no
    /// block, and so evicts nothing.
    /// [`Error::NotAList`] if the value is not a list; [`Error::NoMemory`] too if the list
    /// would be longer than the dict's `max_value_len` (each element takes 9 bytes besides
    /// its value).
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("shmlock-doc-list-{}", std::process::id()));
    /// # let _ = std::fs::remove_file(&path);
    /// use shmlock::{SharedDict, Value};
    ///
    /// let queue = SharedDict::open(&path, 64, 4096)?;
    /// assert_eq!(queue.rpush("jobs", "a")?, 1);
    /// assert_eq!(queue.rpush("jobs", 7i64)?, 2);
    /// assert_eq!(queue.lpop("jobs")?, Some(Value::Bytes(b"a".to_vec())));
    /// assert_eq!(queue.llen("jobs")?, 1);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn lpush<'v>(
        &self,
        key: impl AsRef<[u8]>,
        value: impl Into<ValueRef<'v>>,
    ) -> Result<usize, Error> {
        self.push(key.as_ref(), value.into(), true)
    }

    /// Adds `value` at the tail of the list under `key` (see [`lpush`](Self::lpush)).
    pub fn rpush<'v>(
        &self,
        key: impl AsRef<[u8]>,
        value: impl Into<ValueRef<'v>>,
    ) -> Result<usize, Error> {
        self.push(key.as_ref(), value.into(), false)
    }

    /// Takes the element at the head of the list under `key`: `None` if there is no live
    /// list (or it is empty). A list whose last element is taken is deleted.
    /// [`Error::NotAList`] if the value is not a list.
    pub fn lpop(&self, key: impl AsRef<[u8]>) -> Result<Option<Value>, Error> {
        self.pop(key.as_ref(), true)
    }

    /// Takes the element at the tail of the list under `key` (see [`lpop`](Self::lpop)).
    pub fn rpop(&self, key: impl AsRef<[u8]>) -> Result<Option<Value>, Error> {
        self.pop(key.as_ref(), false)
    }

    /// How many elements the list under `key` has: 0 if there is no live value.
    /// [`Error::NotAList`] if the value is not a list.
    pub fn llen(&self, key: impl AsRef<[u8]>) -> Result<usize, Error> {
        let k = self.pack(key.as_ref())?;
        let now = self.now();
        self.inner.att.look_at_path(now)?;
        if let Some(n) = self.heap_list_len(&k, now) {
            return Ok(n);
        }
        let mut value = Vec::new();
        let mut c = Copied::NONE;
        let found = self.lookup(&k, Some(&mut value), &mut c);
        if let Some(i) = found.filter(|_| c.deadline > now) {
            self.touch(i, now); // (ngx's look-up makes the key the most recently used)
        }
        match found {
            Some(_) if c.deadline > now && c.kind != Kind::List => {
                Err(Error::NotAList { key: k.preview() })
            }
            Some(_) if c.deadline > now => Ok(List::new(value).len()),
            _ => Ok(0),
        }
    }

    fn push(&self, key: &[u8], value: ValueRef<'_>, front: bool) -> Result<usize, Error> {
        let k = self.pack(key)?;
        let mut buf = [0u8; 8];
        let size = ELEMENT_EXTRA + value.encode(&mut buf).1.len();
        self.writing(Some(&k), |w| {
            let now = w.now.get();
            let found = self.lookup_locked(w, &k, None);
            if let Some(old) = self.list_in_heap(found, now) {
                if let Some(done) = self.push_at_edge(w, &k, old, value, size, front, now)? {
                    return Ok(done);
                }
            }
            let mut bytes = Vec::new();
            // (`live`: the entry holds the list itself, which must stay until its new copy
            // is in place; an expired value there, the key's or another's, may go first)
            let (i, list, until, flags, live) = match self.list_of(w, &k, found, now, &mut bytes) {
                Some((i, c)) if c.deadline > now && c.kind != Kind::List => {
                    self.used(w, i, now);
                    return Err(Error::NotAList { key: k.preview() });
                }
                Some((i, c)) if c.deadline > now => (i, bytes, c.deadline, c.flags, true),
                // an expired value of the key: a new list in its place
                Some((i, _)) => (i, Vec::new(), u64::MAX, 0, false),
                // as ngx: room from a free or expired entry, never by evicting a live one
                None => {
                    let (i, _) = self.place(w, &k, now, false)?;
                    (i, Vec::new(), u64::MAX, 0, false)
                }
            };
            let mut list = List::new(list);
            if list.bytes().len() + size > self.max_value_len() {
                return Err(Error::NoMemory {
                    key: k.preview(),
                    why: if list.is_empty() {
                        "a list of this one element would be longer than the dict's \
                         max_value_len"
                    } else {
                        "the list would be longer than the dict's max_value_len"
                    },
                });
            }
            self.beat_if_big(w, list.bytes().len());
            let len = list.push(value, front);
            // (the new copy beside the old, or NoMemory: dropping the old first would show
            // readers no list, and leave none if the writer died)
            let at = (Kind::List, list.bytes());
            let room = if live { Room::Push } else { Room::Expired };
            let stored = self.store_at(w, i, &k, at, flags, until, now, room)?;
            let written = self.write(stored)?;
            if matches!(written, Outcome::Done(())) {
                self.count_set();
            }
            Ok(written.map(|()| len))
        })
    }

    fn pop(&self, key: &[u8], front: bool) -> Result<Option<Value>, Error> {
        let k = self.pack(key)?;
        self.writing(Some(&k), |w| {
            let now = w.now.get();
            let found = self.lookup_locked(w, &k, None);
            if let Some(old) = self.list_in_heap(found, now) {
                if let Some(done) = self.pop_at_edge(w, &k, old, front, now)? {
                    return Ok(done);
                }
            }
            let mut value = Vec::new();
            let (i, c) = match self.list_of(w, &k, found, now, &mut value) {
                Some((i, c)) if c.deadline > now => (i, c),
                _ => return Ok(Outcome::Done(None)),
            };
            if c.kind != Kind::List {
                self.used(w, i, now);
                return Err(Error::NotAList { key: k.preview() });
            }
            self.beat_if_big(w, value.len());
            let mut list = List::new(value);
            let Some(value) = list.pop(front) else {
                return Ok(Outcome::Done(None));
            };
            if list.is_empty() {
                let freed = self.write(self.free_at(w, i, Some(&self.keep(i))))?;
                return Ok(freed.map(|()| {
                    self.uncount(w, 1);
                    self.going(w, self.home(&k));
                    Some(value)
                }));
            }
            self.beat_if_big(w, list.bytes().len());
            let at = (Kind::List, list.bytes());
            // (a shorter list, written beside the longer one: values that are not lists
            // may go for it)
            let stored = self.store_at(w, i, &k, at, c.flags, c.deadline, now, Room::Pop)?;
            Ok(self.write(stored)?.map(|()| Some(value)))
        })
    }

    /// `llen` of a live list kept in the heap, from its entry's count (no element read),
    /// the entry marked used; `None` if the key holds something else (or nothing), or the
    /// entry changed under both looks: the reader that copies the value answers then.
    fn heap_list_len(&self, k: &PackedKey<'_>, now: u64) -> Option<usize> {
        let mut c = Copied::NONE;
        for _ in 0..2 {
            let i = self.lookup(k, None, &mut c)?;
            if c.kind != Kind::List || c.deadline <= now {
                return None;
            }
            match self.entry(i).read_count(k) {
                (Look::Found(c), Some(n)) if c.kind == Kind::List && c.deadline > now => {
                    self.touch(i, now); // (ngx's look-up makes the key the most recently used)
                    return Some(n as usize);
                }
                (Look::Found(_), _) => return None,
                _ => {}
            }
        }
        None
    }

    /// What a writer's lookup `found` found, with its value's bytes in `out` if it is a
    /// live list (the only value a push or a pop reads); the entry is read again, not
    /// looked up (a stale writer's mark on it meanwhile: looked up anew).
    fn list_of(
        &self,
        w: &Locked<'_>,
        k: &PackedKey<'_>,
        found: Option<(usize, Copied)>,
        now: u64,
        out: &mut Vec<u8>,
    ) -> Option<(usize, Copied)> {
        match found {
            Some((i, c)) if c.deadline > now && c.kind == Kind::List => {
                let again = self.read_locked(w, i, |e| match e.read(k, Some(&mut *out)) {
                    Look::Found(c) => Ok(Some(c)),
                    Look::Free | Look::Other | Look::Parked => Ok(None),
                    busy => Err(busy),
                });
                match again {
                    Some(c) => Some((i, c)),
                    None => self.lookup_locked(w, k, Some(out)),
                }
            }
            found => found,
        }
    }

    /// The live list that a writer's lookup `found` found, if it is kept in the heap (its
    /// blocks are read by [`fetch`](Self::fetch), as far as the change needs): else the
    /// whole-value path serves.
    fn list_in_heap(&self, found: Option<(usize, Copied)>, now: u64) -> Option<Old> {
        let (i, c) = found?;
        if c.deadline <= now || c.kind != Kind::List {
            return None;
        }
        let e = self.entry(i);
        Some(Old {
            i,
            c,
            chain: e.heap_value()?,
            count: e.heap_count(),
            index: Vec::new(),
            data: Vec::new(),
            data_from: 0,
        })
    }

    /// Reads `old`'s index blocks and its data blocks at positions `from..to` (from its
    /// first data block on: all of them with `0..usize::MAX`); `false` if the chain does
    /// not walk (a damaged file: the whole-value path deals).
    fn fetch(&self, old: &mut Old, from: usize, to: usize) -> bool {
        old.data_from = from.max(old.chain.first_data());
        self.heap()
            .parts_in(old.chain, (from, to), &mut old.index, &mut old.data)
            .is_ok()
    }

    /// `push` at the edge of a list kept in the heap: `None` if the key holds no such
    /// list.
    #[allow(clippy::too_many_arguments)]
    fn push_at_edge(
        &self,
        w: &Locked<'_>,
        k: &PackedKey<'_>,
        old: Old,
        value: ValueRef<'_>,
        size: usize,
        front: bool,
        now: u64,
    ) -> Result<Option<Outcome<usize>>, Error> {
        // (an element of megabytes is copied by the whole-value path, which shows the
        // writers waiting that the lock's holder works as it copies)
        if size >= BEAT_BYTES {
            return Ok(None);
        }
        let element = element(value);
        let mut old = old;
        if !self.fetch(&mut old, 0, usize::MAX) {
            return Ok(None);
        }
        let (chain, data) = (old.chain, &old.data[..]);
        if chain.len + size > self.max_value_len() {
            return Err(Error::NoMemory {
                key: k.preview(),
                why: "the list would be longer than the dict's max_value_len",
            });
        }
        let heap = self.heap();
        // (the new index names the list's data blocks from its first: `data[0]`, where
        // the list starts `skip` bytes in)
        let skip = chain.skip % BLOCK;
        let end = skip + chain.len;
        let mut bytes = element.to_vec();
        let edge = if front {
            // The element, then what the first block holds of the list, on fresh blocks
            // that end where the second block begins (or the list ends).
            let (shared, kept) = match data.len() {
                1 => (0..0, skip..end),
                n if skip == 0 => (0..n, 0..0),
                n => (1..n, skip..BLOCK),
            };
            bytes.extend_from_slice(&heap.load_block(data[0])[kept]);
            let pad = bytes.len().next_multiple_of(BLOCK) - bytes.len();
            let mut padded = vec![0u8; pad];
            padded.extend_from_slice(&bytes);
            Edge::new(&padded, shared, true, pad, chain.len + element.len())
        } else {
            // What the last block holds (unless it is full), then the element.
            let last = data.len() - 1;
            let shared = if end.is_multiple_of(BLOCK) {
                0..data.len()
            } else {
                let mut tail = heap.load_block(data[last])[..end - last * BLOCK].to_vec();
                tail.extend_from_slice(&element);
                bytes = tail;
                0..last
            };
            Edge::new(&bytes, shared, false, skip, chain.len + element.len())
        };
        let stored = self.store_edge(w, k, &old, edge, old.count + 1, now)?;
        let written = self.write(stored)?;
        if matches!(written, Outcome::Done(())) {
            self.count_set();
        }
        Ok(Some(written.map(|()| old.count as usize + 1)))
    }

    /// `pop` at the edge of a list kept in the heap: `None` if the key holds no such list,
    /// if what the pop leaves is short enough for its entry (the whole-value path moves it
    /// there) or nothing, or if the element there is damaged. A pop takes no block: at the
    /// front it moves the chain's skip on (to the next index block once it passes the
    /// first's data), at the back its length, and the blocks it passes go.
    fn pop_at_edge(
        &self,
        w: &Locked<'_>,
        k: &PackedKey<'_>,
        old: Old,
        front: bool,
        now: u64,
    ) -> Result<Option<Outcome<Option<Value>>>, Error> {
        let mut old = old;
        let chain = old.chain;
        if chain.len < ELEMENT_EXTRA {
            return Ok(None);
        }
        // Only the blocks of the element taken are read: first those of its length (the
        // head at the front, the tail at the back), then those of the whole element.
        let blocks = |from: usize, len: usize| {
            let at = chain.skip + from;
            (at / BLOCK, (at + len).div_ceil(BLOCK))
        };
        let near = if front { 0 } else { chain.len - ELEMENT_TAIL };
        let near_len = if front { ELEMENT_HEAD } else { ELEMENT_TAIL };
        let (lo, hi) = blocks(near, near_len);
        if !self.fetch(&mut old, lo, hi) {
            return Ok(None);
        }
        let heap = self.heap();
        let size = ELEMENT_EXTRA + element_len(&read_span(&heap, &old, near, near_len));
        let left = match chain.len.checked_sub(size) {
            Some(left) if left > self.inner.geometry.max_value && old.count >= 2 => left,
            _ => return Ok(None),
        };
        let at = if front { 0 } else { left };
        // (at the back, every block from the element's first on: the blocks that go)
        let (lo, hi) = blocks(at, size);
        if !self.fetch(&mut old, lo, if front { hi } else { usize::MAX }) {
            return Ok(None);
        }
        let whole = read_span(&heap, &old, at, size);
        // (an element of megabytes took a while to read: the writers waiting see why)
        self.beat_if_big(w, size);
        let value_len = size - ELEMENT_EXTRA;
        if element_len(&whole[..ELEMENT_HEAD]) != value_len
            || element_len(&whole[size - ELEMENT_TAIL..]) != value_len
        {
            return Ok(None);
        }
        let value = element_value(&whole);
        // What goes: the data blocks the pop passes whole, and index blocks left behind.
        let n = chain.data_blocks();
        let (first, skip, gone, index_gone) = if front {
            let start = chain.skip + size;
            // (`old.data` starts at the first data block: those before the new start go)
            let gone = &old.data[..start / BLOCK - old.data_from];
            let passed = start / MAX_SKIP; // (index blocks the start passes whole)
            (
                old.index[passed],
                start % MAX_SKIP,
                gone,
                &old.index[..passed],
            )
        } else {
            let end = (chain.skip + left).div_ceil(BLOCK);
            let gone = &old.data[end - old.data_from..n - old.data_from];
            (
                chain.first,
                chain.skip,
                gone,
                &old.index[end.div_ceil(PER_INDEX)..],
            )
        };
        let stored = self.store_list(w, k, &old, (first, skip, left), old.count - 1, now);
        if stored.is_ok() {
            heap.free(gone);
            heap.free(index_gone);
        }
        Ok(Some(self.write(stored)?.map(|()| Some(value))))
    }

    /// Writes `old`'s entry (copied aside first) to name the chain `(first, skip, len)`
    /// with `count` elements, its flags and deadline as they were: a push's or a pop's
    /// one entry write.
    fn store_list(
        &self,
        w: &Locked<'_>,
        k: &PackedKey<'_>,
        old: &Old,
        (first, skip, len): (u32, usize, usize),
        count: u32,
        now: u64,
    ) -> Result<(), Aborted> {
        let keep = self.keep(old.i);
        let at = ValueAt::Heap {
            first,
            len,
            skip,
            count,
        };
        let (flags, deadline) = (old.c.flags, old.c.deadline);
        self.entry(old.i).store(
            &w.writing,
            Some(&keep),
            k,
            Kind::List,
            at,
            flags,
            deadline,
            w.stamp(now),
        )
    }

    /// Stores the list a push's `edge` makes in its entry (copied aside first), with
    /// `count` elements: a new index (and the fresh blocks) taken and written, the entry's
    /// write, then the old index and the data blocks dropped go back (or, if the write was
    /// not made, what was taken). A push evicts nothing for its blocks.
    fn store_edge(
        &self,
        w: &Locked<'_>,
        k: &PackedKey<'_>,
        old: &Old,
        edge: Edge,
        count: u32,
        now: u64,
    ) -> Result<Result<(), Aborted>, Error> {
        let heap = self.heap();
        let (i, data) = (old.i, &old.data);
        let fresh = edge.fresh.len();
        let index = (edge.shared.len() + fresh).div_ceil(PER_INDEX);
        let mut blocks = Vec::new();
        match self.take_blocks(w, k, index + fresh, i, Room::Push, now, &mut blocks)? {
            Taken::Fresh => {}
            // (a push never lets the list itself go: a stale writer's mark, start over)
            Taken::OwnFreed | Taken::Retry => {
                heap.free(&blocks);
                return Ok(Err(Aborted::NotStable));
            }
        }
        let (index_blocks, fresh_blocks) = blocks.split_at(index);
        let written: Vec<(u32, [u8; BLOCK])> = fresh_blocks
            .iter()
            .zip(&edge.fresh)
            .map(|(&b, bytes)| (b, *bytes))
            .collect();
        // (`data` is every data block of the list, from its first)
        let shared = &data[edge.shared.clone()];
        let mut named = Vec::with_capacity(shared.len() + fresh);
        let (before, after) = if edge.front {
            (fresh_blocks, shared)
        } else {
            (shared, fresh_blocks)
        };
        named.extend_from_slice(before);
        named.extend_from_slice(after);
        let first = heap.write_index(index_blocks, &named, &written, k.hash as u32);
        let stored = self.store_list(w, k, old, (first, edge.skip, edge.len), count, now);
        if stored.is_ok() {
            // (with the data blocks the new chain does not name: before and after its run)
            heap.free(&old.index);
            heap.free(&data[..edge.shared.start]);
            heap.free(&data[edge.shared.end..]);
        } else {
            heap.free(&blocks); // never named by a stable entry
        }
        Ok(stored)
    }
}

/// A list kept in the heap, before a change at its edge.
struct Old {
    /// The list's entry, and what the writer's lookup found there.
    i: usize,
    c: Copied,
    chain: Chain,
    /// The elements, as the entry counts them.
    count: u32,
    /// Its index blocks, and the data blocks read (from position `data_from` on).
    index: Vec<u32>,
    data: Vec<u32>,
    data_from: usize,
}

/// What a change at a list's edge makes of its chain: the run of the old data blocks it
/// names again (`shared`: the others go), fresh blocks' bytes before them (`front`) or
/// after, and the new skip and length.
struct Edge {
    shared: std::ops::Range<usize>,
    fresh: Vec<[u8; BLOCK]>,
    front: bool,
    skip: usize,
    len: usize,
}

impl Edge {
    /// `bytes` cut into fresh blocks (the last one zero-padded), beside `shared`.
    fn new(
        bytes: &[u8],
        shared: std::ops::Range<usize>,
        front: bool,
        skip: usize,
        len: usize,
    ) -> Edge {
        let fresh = bytes
            .chunks(BLOCK)
            .map(|chunk| {
                let mut block = [0u8; BLOCK];
                block[..chunk.len()].copy_from_slice(chunk);
                block
            })
            .collect();
        Edge {
            shared,
            fresh,
            front,
            skip,
            len,
        }
    }
}

/// `len` bytes of `old`'s list from its byte `from` (the skip not counted). Caller holds
/// the writer lock and has read the data blocks they lie in.
fn read_span(heap: &Heap<'_>, old: &Old, from: usize, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let (start, end) = (old.chain.skip + from, old.chain.skip + from + len);
    let mut at = start;
    while at < end {
        let (b, off) = (at / BLOCK - old.data_from, at % BLOCK);
        let n = (BLOCK - off).min(end - at);
        out.extend_from_slice(&heap.load_block(old.data[b])[off..off + n]);
        at += n;
    }
    out
}
