//! The block heap: where a dict keeps the values too long for an entry's own room, in
//! blocks of [`BLOCK`] bytes that any entry's value may use (the first step of a zone sized
//! in bytes: entries as small heads, the bytes in one pool).
//!
//! A value in the heap is a chain of index blocks, each naming up to [`PER_INDEX`] data
//! blocks and the next index block; its entry keeps the first index block and the length.
//! Any free blocks serve, wherever they are: there is no contiguous run to find, so a heap
//! with room never refuses a value for want of one (a slab's or an arena's fragmentation),
//! at the cost of one index block in 63.
//!
//! Who may change what (the dict's writer lock orders the writers):
//!
//! - The map (a bit per block) changes by atomic RMWs only, so that a writer taken over
//!   and resuming (which may still allocate or free, late) and its successor never lose
//!   each other's changes, and a block is never handed to two.
//! - A value's blocks are written once, after they are taken and before the entry that
//!   names them is published, and never again while any entry or undo copy names them:
//!   they are freed after the entry has moved on (a rewrite, a delete, an eviction), and
//!   only then taken again.
//! - A reader copies the blocks an entry named, then validates the entry's `seq` once more
//!   (see `Entry::validate`): a block freed and rewritten under it means the entry moved
//!   on first, so the second look sees a new `seq` and the copy is dropped. [`Heap::write`]
//!   begins with a release fence for that: the reader's acquire fence after its copy then
//!   sees every write before the fence, the entry's move included (the free that gave the
//!   block back came after it, and the take that got it synchronised with the free).
//!   Model `heap_a_reader_never_accepts_a_block_reused_under_it` (`loom_tests.rs`) runs
//!   the reuse against a reader; it passes without the fence too (loom does not return
//!   the older `seq` to that load), so the fence rests on the argument above.
//!   `heap_two_writers_never_take_one_block`: a taken-over writer and its successor
//!   taking at once never share a block.
//! - Blocks taken by a writer that died before its entry named them (or named by no entry
//!   or undo copy for another reason) are found by [`Heap::sweep`], made by a holder of the
//!   writer lock when no writer that was taken over may still write into its own (the dict
//!   counts each registration's operations in progress for that: see `SharedDict`).
//! - Each map word is 32 blocks' bits under a 32-bit tag. Whoever takes the writer lock
//!   over gives every word a new tag ([`Heap::retag`]) before it moves any value (a holder
//!   whose sweep meets words of another tag draws a newer one too: a retag moves nothing,
//!   it only fails sweeps begun before), and a
//!   sweep frees a word's lost blocks only with a CAS from the word it read before it
//!   looked for what is named: so a sweeper taken over in the middle, resuming, frees
//!   nothing once its successor may have moved a value (a takeover's restore moves a
//!   chain between an undo copy and an entry without touching the map). Takes and frees
//!   leave the tag as it is. Model `heap_a_sweeper_taken_over_frees_nothing_its_successor_names`.

use super::words::{load_packed, store_packed};
use crate::shm::primitive::{fence, AtomicU64, Ordering};

/// Bytes of a block.
pub(crate) const BLOCK: usize = crate::shm::format::HEAP_BLOCK;
/// Words of a block.
pub(crate) const BLOCK_WORDS: usize = BLOCK / 8;

/// How much of a value [`Heap::write_beating`] copies between two beats: 4 MiB, a few
/// milliseconds, far inside the stall bound even in a debug build.
pub(crate) const BEAT_BYTES: usize = 4 << 20;
/// Data blocks an index block names (two to a word, after the word of the next index
/// block and the count).
pub(crate) const PER_INDEX: usize = 2 * (BLOCK_WORDS - 1);
/// No block: the end of a chain.
const NONE: u32 = u32::MAX;
/// Blocks a map word stands for (its low half; the high half is the tag).
pub(crate) const PER_WORD: usize = 32;
const BITS: u64 = (1 << PER_WORD) - 1;

/// Blocks a value of `len` bytes takes, index blocks included.
pub(crate) fn blocks_for(len: usize) -> usize {
    let data = len.div_ceil(BLOCK);
    data + data.div_ceil(PER_INDEX)
}

/// The lowest `k` set bits of `bits` (all of them if it has no more).
fn lowest_bits(bits: u64, k: usize) -> u64 {
    if bits.count_ones() as usize <= k {
        return bits;
    }
    let (mut left, mut want) = (bits, 0);
    for _ in 0..k {
        let low = left & left.wrapping_neg();
        want |= low;
        left &= !low;
    }
    want
}

/// Map words of a heap of `blocks` blocks.
pub(crate) fn map_words(blocks: usize) -> usize {
    blocks.div_ceil(PER_WORD)
}

/// A value's chain as its entry names it: the first (index) block, the value's length,
/// and the owner tag every index block of it carries (the low half of its key's hash), so
/// that an entry that names another key's chain (a damaged file) finds it `Moved` rather
/// than reading, or freeing, that key's blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Chain {
    pub first: u32,
    pub len: usize,
    pub owner: u32,
    /// Bytes of the first index block's data before the value (a list's front, popped:
    /// see `api/list.rs`; 0 for every other value), under [`MAX_SKIP`]. The data blocks it
    /// passes whole are not the chain's: a walk starts after them.
    pub skip: usize,
}

/// A skip ends within the data blocks of the first index block.
pub(crate) const MAX_SKIP: usize = PER_INDEX * BLOCK;

impl Chain {
    /// Positions of data blocks up to the value's end, the first index block's names
    /// counted from its first (those the skip passes whole included).
    pub(crate) fn data_blocks(&self) -> usize {
        (self.skip + self.len).div_ceil(BLOCK)
    }

    /// The position of the chain's first data block (the skip's whole blocks passed).
    pub(crate) fn first_data(&self) -> usize {
        self.skip / BLOCK
    }

    /// Blocks the chain takes, index blocks included.
    pub(crate) fn blocks(&self) -> usize {
        let data = self.data_blocks();
        data - self.first_data() + data.div_ceil(PER_INDEX)
    }
}

/// What a [`Heap::sweep`] did: blocks freed, and words where it left lost blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Swept {
    pub freed: usize,
    pub left: usize,
}

/// Why a copy out of the heap could not be made: what the entry named has moved on (the
/// caller validates the entry and retries, or finds the file damaged).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Moved;

/// The heap's map and blocks, as words of the mapping.
#[derive(Clone, Copy)]
pub(crate) struct Heap<'a> {
    map: &'a [AtomicU64],
    data: &'a [AtomicU64],
}

impl<'a> Heap<'a> {
    /// A heap of no blocks (a dict made without one).
    pub(crate) const NONE: Heap<'static> = Heap {
        map: &[],
        data: &[],
    };

    /// The heap over `map` (a word per [`PER_WORD`] blocks) and `data` (its blocks).
    pub(crate) fn new(map: &'a [AtomicU64], data: &'a [AtomicU64]) -> Heap<'a> {
        let blocks = data.len() / BLOCK_WORDS;
        assert!(map.len() >= map_words(blocks) && blocks < NONE as usize);
        Heap { map, data }
    }

    /// Blocks in all.
    #[inline]
    pub(crate) fn blocks(&self) -> usize {
        self.data.len() / BLOCK_WORDS
    }

    /// Blocks free now (a snapshot).
    pub(crate) fn free_blocks(&self) -> usize {
        let taken: usize = self
            .map
            .iter()
            .map(|w| (w.load(Ordering::Relaxed) & BITS).count_ones() as usize)
            .sum();
        self.blocks() - taken.min(self.blocks())
    }

    fn block(&self, b: u32) -> &'a [AtomicU64] {
        let at = b as usize * BLOCK_WORDS;
        &self.data[at..at + BLOCK_WORDS]
    }

    /// The bits of map word `w` that stand for blocks (the last word's tail stands for
    /// none).
    fn real_bits(&self, w: usize) -> u64 {
        let first = w * PER_WORD;
        match self.blocks().saturating_sub(first) {
            n if n >= PER_WORD => BITS,
            n => (1u64 << n) - 1,
        }
    }

    /// Takes `n` free blocks, looking from map word `*hint` on (and moving it past what
    /// was taken), into `out`. `false`, with nothing taken, if fewer are free.
    pub(crate) fn take(&self, n: usize, hint: &mut usize, out: &mut Vec<u32>) -> bool {
        out.clear();
        let words = self.map.len().min(map_words(self.blocks()));
        let mut w = *hint % words.max(1);
        for _ in 0..words {
            if out.len() == n {
                break;
            }
            let mut cur = self.map[w].load(Ordering::Relaxed);
            loop {
                let free = !cur & self.real_bits(w);
                if free == 0 {
                    break;
                }
                let want = lowest_bits(free, n - out.len());
                // AcqRel: the acquire takes the block after whoever freed it (see the
                // module's head); a bit someone else set meanwhile stays theirs.
                let old = self.map[w].fetch_or(want, Ordering::AcqRel);
                // (the broken variant takes what it asked for, whoever set it first)
                let got = if crate::broken::broken(crate::broken::Broken::Protocol) {
                    want
                } else {
                    want & !old
                };
                let mut g = got;
                while g != 0 {
                    out.push((w * PER_WORD) as u32 + g.trailing_zeros());
                    g &= g - 1;
                }
                if out.len() == n || got == want {
                    break;
                }
                cur = old | want;
            }
            *hint = w;
            // (a compare, not a division: a short heap is looked over whole)
            w += 1;
            if w == words {
                w = 0;
            }
        }
        if out.len() < n {
            self.free(out);
            out.clear();
            return false;
        }
        true
    }

    /// Gives `blocks` back. Release: whoever takes one next sees every write before this
    /// (the entry that named it moved on first).
    pub(crate) fn free(&self, blocks: &[u32]) {
        for &b in blocks {
            let (w, bit) = (b as usize / PER_WORD, 1u64 << (b as usize % PER_WORD));
            if w < self.map.len() {
                self.map[w].fetch_and(!bit, Ordering::Release);
            }
        }
    }

    /// [`write_beating`](Self::write_beating) with no beat, for the tests.
    #[cfg(any(test, loom))]
    pub(crate) fn write(&self, blocks: &[u32], bytes: &[u8], owner: u32) -> u32 {
        self.write_beating(blocks, bytes, owner, || {})
    }

    /// Writes `bytes` into `blocks` (from [`take`](Self::take), `blocks_for(bytes.len())`
    /// of them) as a chain whose index blocks carry `owner`: index blocks first in
    /// `blocks`, then data blocks. Returns the chain's first block, for the entry to name.
    /// Calls `beat` after each [`BEAT_BYTES`] of data: a writer copying a big value shows
    /// the writers waiting for its lock that it is not stalled.
    pub(crate) fn write_beating(
        &self,
        blocks: &[u32],
        bytes: &[u8],
        owner: u32,
        mut beat: impl FnMut(),
    ) -> u32 {
        debug_assert_eq!(blocks.len(), blocks_for(bytes.len()));
        // Orders the take (and, through it, the free and the entry's move before it)
        // before these writes: see the module's head.
        fence(Ordering::Release);
        let data_n = bytes.len().div_ceil(BLOCK);
        let index_n = blocks.len() - data_n;
        let (index, data) = blocks.split_at(index_n);
        for (n, (chunk, &b)) in bytes.chunks(BLOCK).zip(data).enumerate() {
            if n % (BEAT_BYTES / BLOCK) == BEAT_BYTES / BLOCK - 1 {
                beat();
            }
            store_packed(self.block(b), chunk, || {});
        }
        self.write_names(index, data, owner);
        index.first().copied().unwrap_or(NONE)
    }

    /// Index block `at` of a chain of `owner`: its words, and the next index block. `Moved`
    /// if it lies outside the heap or carries another owner's tag (unvalidated, as
    /// `walk`).
    fn index_block(&self, at: u32, owner: u32) -> Result<(&'a [AtomicU64], u32), Moved> {
        if at as usize >= self.blocks() {
            return Err(Moved);
        }
        let words = self.block(at);
        let head = words[0].load(Ordering::Relaxed);
        if (head >> 32) as u32 != owner {
            return Err(Moved);
        }
        Ok((words, head as u32))
    }

    /// Visits the blocks of `chain`: each index block, then the data blocks it names, in
    /// order. Unvalidated (an entry's copy is validated by its caller): a chain that
    /// leaves the heap, or has an index block of another owner, is `Moved`.
    fn walk(
        &self,
        chain: Chain,
        mut index: impl FnMut(u32),
        mut data: impl FnMut(usize, u32),
    ) -> Result<(), Moved> {
        if chain.skip >= MAX_SKIP {
            return Err(Moved);
        }
        let data_n = chain.data_blocks();
        let mut at = chain.first;
        let mut pos = 0;
        while pos < data_n {
            let (words, next) = self.index_block(at, chain.owner)?;
            index(at);
            // (names before the chain's first data block are not its own)
            for n in pos.max(chain.first_data())..(pos + PER_INDEX).min(data_n) {
                let pair = words[1 + (n - pos) / 2].load(Ordering::Relaxed);
                let b = if (n - pos) % 2 == 0 {
                    pair as u32
                } else {
                    (pair >> 32) as u32
                };
                if b as usize >= self.blocks() {
                    return Err(Moved);
                }
                data(n, b);
            }
            pos += PER_INDEX;
            at = next;
        }
        Ok(())
    }

    /// Copies the bytes of `chain` into `out` (replacing what it held). Unvalidated: the
    /// caller validates the entry that named the chain afterwards.
    pub(crate) fn read(&self, chain: Chain, out: &mut Vec<u8>) -> Result<(), Moved> {
        let (skip, len) = (chain.skip, chain.len);
        out.clear();
        out.resize(len, 0);
        let mut part = [0u8; BLOCK];
        self.walk(
            chain,
            |_| {},
            |i, b| {
                // (`walk` names no blocks but those the value fills)
                let from = (i * BLOCK).max(skip);
                let to = (i * BLOCK + BLOCK).min(skip + len);
                if from == i * BLOCK {
                    load_packed(self.block(b), &mut out[from - skip..to - skip]);
                } else {
                    // (the first block of a chain with a skip: its words that hold the
                    // part, then the part)
                    let (lo, hi) = (from - i * BLOCK, to - i * BLOCK);
                    let (w0, w1) = (lo / 8, hi.div_ceil(8));
                    load_packed(&self.block(b)[w0..w1], &mut part[w0 * 8..w1 * 8]);
                    out[..to - from].copy_from_slice(&part[lo..hi]);
                }
            },
        )
    }

    /// The index blocks of `chain`, and its data blocks at positions `from..to`, from its
    /// first data block on (only the index blocks that name those have their names read:
    /// a list's pop at one end costs a load an index block, not one a data block). Caller
    /// holds the writer lock.
    pub(crate) fn parts_in(
        &self,
        chain: Chain,
        (from, to): (usize, usize),
        index: &mut Vec<u32>,
        data: &mut Vec<u32>,
    ) -> Result<(), Moved> {
        index.clear();
        data.clear();
        if chain.skip >= MAX_SKIP {
            return Err(Moved);
        }
        let data_n = chain.data_blocks();
        let from = from.max(chain.first_data());
        data.reserve(to.min(data_n).saturating_sub(from));
        let mut at = chain.first;
        for k in 0..data_n.div_ceil(PER_INDEX) {
            let (words, next) = self.index_block(at, chain.owner)?;
            index.push(at);
            let (lo, hi) = (k * PER_INDEX, ((k + 1) * PER_INDEX).min(data_n));
            let (first, last) = (lo.max(from) - lo, hi.min(to).saturating_sub(lo));
            if first < last {
                // (whole words, two names each, then the ones asked for)
                let mut names = [0u32; PER_INDEX + 1];
                let words = &words[1 + first / 2..1 + last.div_ceil(2)];
                for (pair, word) in names.chunks_exact_mut(2).zip(words) {
                    let both = word.load(Ordering::Relaxed);
                    pair.copy_from_slice(&[both as u32, (both >> 32) as u32]);
                }
                let asked = &names[first % 2..first % 2 + (last - first)];
                if asked.iter().any(|&b| b as usize >= self.blocks()) {
                    return Err(Moved);
                }
                data.extend_from_slice(asked);
            }
            at = next;
        }
        Ok(())
    }

    /// Block `b`'s bytes.
    pub(crate) fn load_block(&self, b: u32) -> [u8; BLOCK] {
        let mut bytes = [0u8; BLOCK];
        load_packed(self.block(b), &mut bytes);
        bytes
    }

    /// Writes a chain that names `data` (blocks already written, or named by another
    /// chain of the same value: they are only named here, never written) with the index
    /// blocks `index` (from [`take`](Self::take), `data.len().div_ceil(PER_INDEX)` of
    /// them), and `fresh`'s bytes into its blocks first (taken too, each in `data`).
    /// Returns the chain's first block.
    pub(crate) fn write_index(
        &self,
        index: &[u32],
        data: &[u32],
        fresh: &[(u32, [u8; BLOCK])],
        owner: u32,
    ) -> u32 {
        debug_assert_eq!(index.len(), data.len().div_ceil(PER_INDEX));
        // Orders the take before these writes, as in `write_beating`.
        fence(Ordering::Release);
        for (b, bytes) in fresh {
            store_packed(self.block(*b), bytes, || {});
        }
        self.write_names(index, data, owner);
        index.first().copied().unwrap_or(NONE)
    }

    /// The index blocks `index`, naming `data` in order.
    fn write_names(&self, index: &[u32], data: &[u32], owner: u32) {
        for (i, (&ib, names)) in index.iter().zip(data.chunks(PER_INDEX)).enumerate() {
            let words = self.block(ib);
            let next = index.get(i + 1).copied().unwrap_or(NONE);
            words[0].store(u64::from(owner) << 32 | u64::from(next), Ordering::Relaxed);
            for (word, pair) in words[1..].iter().zip(names.chunks(2)) {
                let lo = u64::from(pair[0]);
                let hi = u64::from(pair.get(1).copied().unwrap_or(NONE));
                word.store(lo | hi << 32, Ordering::Relaxed);
            }
        }
    }

    /// The blocks of `chain` (to free them once the entry that named them moved on).
    /// Caller holds the writer lock, so the chain does not change under it.
    pub(crate) fn blocks_of(&self, chain: Chain, out: &mut Vec<u32>) -> Result<(), Moved> {
        out.clear();
        let mut index = Vec::new();
        self.walk(chain, |b| index.push(b), |_, b| out.push(b))?;
        out.extend(index);
        Ok(())
    }

    /// Gives every map word the tag `tag`: done by whoever takes the writer lock over,
    /// before it moves any value, so that a sweep begun before (by the writer taken over,
    /// which may resume) frees nothing after (see the module's head).
    pub(crate) fn retag(&self, tag: u32) {
        for word in self.map {
            let mut cur = word.load(Ordering::Relaxed);
            loop {
                // Never back to an older tag: a retagger taken over in the middle, resuming
                // after its successor retagged, would make the words it reaches
                // unsweepable (tags only grow; compared with wrapping arithmetic).
                if ((cur >> 32) as u32).wrapping_sub(tag) as i32 >= 0
                    && !crate::broken::broken(crate::broken::Broken::Protocol)
                {
                    break;
                }
                let next = u64::from(tag) << 32 | (cur & BITS);
                match word.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed) {
                    Ok(_) => break,
                    Err(now) => cur = now,
                }
            }
        }
    }

    /// The map as it is now, for a sweep: read before the sweeper looks for what is named.
    pub(crate) fn snapshot(&self) -> Vec<u64> {
        self.map.iter().map(|w| w.load(Ordering::Acquire)).collect()
    }

    /// Frees every block taken in `before` (a [`snapshot`](Self::snapshot) whose words all
    /// carry `tag`) that `named` does not hold (a bit per block: the blocks of every value
    /// an entry or an undo copy names, found after the snapshot), in each word that has not
    /// changed since. Caller holds the writer lock, and no writer taken over may still
    /// write into blocks it took. Returns how many it freed, and in how many words it
    /// left lost blocks (a word of another tag, or one that changed since).
    pub(crate) fn sweep(&self, before: &[u64], tag: u32, named: &[u64]) -> Swept {
        let mut swept = Swept::default();
        for (w, word) in self.map.iter().enumerate() {
            let Some(&was) = before.get(w) else { break };
            let keep = named.get(w).copied().unwrap_or(0);
            let lost = was & BITS & !keep & self.real_bits(w);
            if lost == 0 {
                continue;
            }
            if was >> 32 != u64::from(tag)
                && !crate::broken::broken(crate::broken::Broken::Protocol)
            {
                swept.left += 1; // retagged before the snapshot: a successor's map
                continue;
            }
            let done = if crate::broken::broken(crate::broken::Broken::Protocol) {
                // (the broken variant frees whatever the word holds now)
                word.fetch_and(!lost, Ordering::Release);
                true
            } else {
                word.compare_exchange(was, was & !lost, Ordering::Release, Ordering::Relaxed)
                    .is_ok()
            };
            if done {
                swept.freed += lost.count_ones() as usize;
            } else {
                swept.left += 1;
            }
        }
        swept
    }

    /// Sets the bits of the blocks of `chain` in `named` (a bit per block, as
    /// [`sweep`](Self::sweep) takes them). A chain that leaves the heap marks what it
    /// named until then.
    pub(crate) fn mark(&self, chain: Chain, named: &mut [u64]) {
        let mut set = |b: u32| {
            if let Some(word) = named.get_mut(b as usize / PER_WORD) {
                *word |= 1 << (b as usize % PER_WORD);
            }
        };
        let mut data = Vec::new();
        let _ = self.walk(chain, &mut set, |_, b| data.push(b));
        data.into_iter().for_each(set);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn heap(blocks: usize) -> (Vec<AtomicU64>, Vec<AtomicU64>) {
        let map = (0..map_words(blocks)).map(|_| AtomicU64::new(0)).collect();
        let data = (0..blocks * BLOCK_WORDS)
            .map(|_| AtomicU64::new(0))
            .collect();
        (map, data)
    }

    fn bytes(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn lowest_bits_takes_as_many_as_asked_from_the_bottom() {
        assert_eq!(lowest_bits(0b1011_0110, 2), 0b0000_0110);
        assert_eq!(lowest_bits(0b1011_0110, 4), 0b0011_0110);
        assert_eq!(lowest_bits(0b1011_0110, 5), 0b1011_0110);
        assert_eq!(lowest_bits(0b1011_0110, 9), 0b1011_0110);
        assert_eq!(lowest_bits(0b1011_0110, 0), 0);
        assert_eq!(lowest_bits(u64::MAX, 64), u64::MAX);
        assert_eq!(lowest_bits(1 << 63 | 1, 1), 1);
    }

    #[test]
    fn a_chain_named_again_from_a_skip_reads_from_there_and_gives_its_parts_by_position() {
        let (map, data) = heap(1000);
        let h = Heap::new(&map, &data);
        // 150 data blocks (three index blocks), the value's bytes numbered
        let v: Vec<u8> = (0..150 * BLOCK).map(|i| (i % 251) as u8).collect();
        let mut blocks = Vec::new();
        assert!(h.take(blocks_for(v.len()), &mut 0, &mut blocks));
        let first = h.write(&blocks, &v, 9);
        let whole = Chain {
            first,
            len: v.len(),
            owner: 9,
            skip: 0,
        };
        let (mut index, mut all) = (Vec::new(), Vec::new());
        h.parts_in(whole, (0, usize::MAX), &mut index, &mut all)
            .unwrap();
        assert_eq!(index, blocks[..3]);
        assert_eq!(all, blocks[3..]);
        for (from, to) in [
            (0, 1),
            (1, 2),
            (61, 63),
            (62, 62),
            (5, 130),
            (149, 200),
            (150, 151),
        ] {
            let mut part = Vec::new();
            h.parts_in(whole, (from, to), &mut index, &mut part)
                .unwrap();
            assert_eq!(part, all[from.min(150)..to.min(150)], "{from}..{to}");
            assert_eq!(index.len(), 3);
        }
        // the same index from a skip past whole blocks: they are not the chain's
        for skip in [256, 300, 61 * BLOCK + 5] {
            let chain = Chain {
                first,
                len: v.len() - skip,
                owner: 9,
                skip,
            };
            let mut out = Vec::new();
            h.read(chain, &mut out).unwrap();
            assert_eq!(out, v[skip..], "skip {skip}");
            let mut part = Vec::new();
            h.parts_in(chain, (0, usize::MAX), &mut index, &mut part)
                .unwrap();
            assert_eq!(part, all[skip / BLOCK..], "skip {skip}");
            let mut owned = Vec::new();
            h.blocks_of(chain, &mut owned).unwrap();
            assert_eq!(owned.len(), 150 - skip / BLOCK + 3, "skip {skip}");
            assert!(!owned.contains(&all[0]), "skip {skip}");
            assert_eq!(chain.blocks(), owned.len());
        }
        let past = Chain {
            first,
            len: 10,
            owner: 9,
            skip: MAX_SKIP,
        };
        assert_eq!(h.read(past, &mut Vec::new()), Err(Moved));
        // a new index naming blocks 1..150 from a skip of 100: the value from byte 356
        let mut fresh = Vec::new();
        assert!(h.take(3, &mut 0, &mut fresh));
        let popped = h.write_index(&fresh, &all[1..], &[], 9);
        for (skip, len) in [
            (100, 149 * BLOCK - 100),
            (255, 10),
            (0, 1),
            (7, 148 * BLOCK),
        ] {
            let chain = Chain {
                first: popped,
                len,
                owner: 9,
                skip,
            };
            let mut out = Vec::new();
            h.read(chain, &mut out).unwrap();
            assert_eq!(
                out,
                v[BLOCK + skip..BLOCK + skip + len],
                "skip {skip}, len {len}"
            );
        }
    }

    #[test]
    fn values_of_every_length_go_in_and_come_back() {
        let (map, data) = heap(1000);
        let h = Heap::new(&map, &data);
        let mut hint = 0;
        for len in [
            1,
            7,
            8,
            255,
            256,
            257,
            62 * 256,
            62 * 256 + 1,
            100_000,
            200_000,
        ] {
            let v = bytes(len, len as u8);
            let mut blocks = Vec::new();
            assert!(h.take(blocks_for(len), &mut hint, &mut blocks), "{len}");
            let first = h.write(&blocks, &v, 9);
            let mut out = Vec::new();
            h.read(
                Chain {
                    first,
                    len,
                    owner: 9,
                    skip: 0,
                },
                &mut out,
            )
            .unwrap();
            assert_eq!(out, v, "{len}");
            let mut chain = Vec::new();
            h.blocks_of(
                Chain {
                    first,
                    len,
                    owner: 9,
                    skip: 0,
                },
                &mut chain,
            )
            .unwrap();
            let (mut a, mut b) = (chain.clone(), blocks.clone());
            a.sort_unstable();
            b.sort_unstable();
            assert_eq!(a, b, "{len}: the chain is what was taken");
            h.free(&chain);
            assert_eq!(h.free_blocks(), 1000, "{len}");
        }
    }

    #[test]
    fn a_full_heap_refuses_and_keeps_nothing_then_any_freed_blocks_serve() {
        let (map, data) = heap(130); // a last map word only partly blocks
        let h = Heap::new(&map, &data);
        let mut hint = 0;
        let mut all = Vec::new();
        let mut taken = Vec::new();
        while h.take(3, &mut hint, &mut taken) {
            all.extend_from_slice(&taken);
        }
        assert_eq!(all.len(), 129, "43 values of 3 blocks");
        assert!(all.iter().all(|&b| b < 130));
        assert_eq!(h.free_blocks(), 1, "the refused take kept nothing");
        // free every other block: scattered room serves a long value all the same
        let scattered: Vec<u32> = all.iter().copied().step_by(2).collect();
        h.free(&scattered);
        let len = (scattered.len() - 2) * BLOCK; // with its index blocks, all that is free
        let n = blocks_for(len);
        assert!(n <= h.free_blocks());
        let mut blocks = Vec::new();
        assert!(h.take(n, &mut hint, &mut blocks));
        let v = bytes(len, 9);
        let first = h.write(&blocks, &v, 9);
        let mut out = Vec::new();
        h.read(
            Chain {
                first,
                len,
                owner: 9,
                skip: 0,
            },
            &mut out,
        )
        .unwrap();
        assert_eq!(out, v);
    }

    #[test]
    fn a_sweep_frees_what_nothing_names() {
        let (map, data) = heap(200);
        let h = Heap::new(&map, &data);
        let mut hint = 0;
        let (mut kept, mut lost) = (Vec::new(), Vec::new());
        assert!(h.take(blocks_for(5000), &mut hint, &mut kept));
        let first = h.write(&kept, &bytes(5000, 1), 9);
        assert!(h.take(blocks_for(3000), &mut hint, &mut lost)); // a dead writer's
        let before = h.snapshot();
        let mut named = vec![0u64; map_words(200)];
        h.mark(
            Chain {
                first,
                len: 5000,
                owner: 9,
                skip: 0,
            },
            &mut named,
        );
        let mut chain = Vec::new();
        h.blocks_of(
            Chain {
                first,
                len: 5000,
                owner: 9,
                skip: 0,
            },
            &mut chain,
        )
        .unwrap();
        let marked: usize = named.iter().map(|w| w.count_ones() as usize).sum();
        assert_eq!(marked, chain.len(), "mark names the chain's blocks");
        // a sweep from a snapshot of another tag frees nothing
        assert_eq!(h.sweep(&before, 1, &named).freed, 0);
        // nor one whose word changed since its snapshot
        let mut late = Vec::new();
        assert!(h.take(1, &mut 0, &mut late));
        let moved = late[0] as usize / PER_WORD;
        let lost_elsewhere = lost
            .iter()
            .filter(|&&b| b as usize / PER_WORD != moved)
            .count();
        assert_eq!(h.sweep(&before, 0, &named).freed, lost_elsewhere);
        h.free(&late);
        let before = h.snapshot();
        assert_eq!(
            h.sweep(&before, 0, &named).freed,
            lost.len() - lost_elsewhere
        );
        assert_eq!(h.free_blocks(), 200 - kept.len());
        let mut out = Vec::new();
        h.read(
            Chain {
                first,
                len: 5000,
                owner: 9,
                skip: 0,
            },
            &mut out,
        )
        .unwrap();
        assert_eq!(out, bytes(5000, 1));
    }

    #[test]
    fn a_retag_after_a_snapshot_makes_its_sweep_free_nothing() {
        let (map, data) = heap(100);
        let h = Heap::new(&map, &data);
        let mut lost = Vec::new();
        assert!(h.take(40, &mut 0, &mut lost));
        let before = h.snapshot();
        h.retag(7);
        let named = vec![0u64; map_words(100)];
        assert_eq!(h.sweep(&before, 0, &named).freed, 0, "a successor retagged");
        assert_eq!(h.free_blocks(), 60, "takes and tags leave each other alone");
        let before = h.snapshot();
        assert_eq!(h.sweep(&before, 7, &named).freed, 40);
    }

    #[test]
    fn a_chain_named_with_another_owner_is_moved() {
        let (map, data) = heap(100);
        let h = Heap::new(&map, &data);
        let mut blocks = Vec::new();
        assert!(h.take(blocks_for(5000), &mut 0, &mut blocks));
        let first = h.write(&blocks, &bytes(5000, 3), 7);
        let mut out = Vec::new();
        let other = Chain {
            first,
            len: 5000,
            owner: 8,
            skip: 0,
        };
        assert_eq!(h.read(other, &mut out), Err(Moved));
        assert_eq!(h.blocks_of(other, &mut Vec::new()), Err(Moved));
        let mut named = vec![0u64; map_words(100)];
        h.mark(other, &mut named);
        assert!(
            named.iter().all(|&w| w == 0),
            "marked another owner's chain"
        );
        h.read(
            Chain {
                first,
                len: 5000,
                owner: 7,
                skip: 0,
            },
            &mut out,
        )
        .unwrap();
        assert_eq!(out, bytes(5000, 3));
    }

    #[test]
    fn a_retag_never_goes_back_to_an_older_tag() {
        let (map, data) = heap(100);
        let h = Heap::new(&map, &data);
        h.retag(5);
        h.retag(4); // a retagger taken over, resuming
        assert!(map.iter().all(|w| w.load(Ordering::Relaxed) >> 32 == 5));
        for tag in [0x7fff_fff0, 0xffff_fff0, 2] {
            h.retag(tag); // each newer than the last, the last across the wrap
            assert!(map
                .iter()
                .all(|w| w.load(Ordering::Relaxed) >> 32 == u64::from(tag)));
        }
    }

    #[test]
    fn a_chain_that_leaves_the_heap_is_moved_not_a_panic() {
        let (map, data) = heap(64);
        let h = Heap::new(&map, &data);
        // garbage index words (a reader's view of a block being rewritten)
        for w in &data[..BLOCK_WORDS] {
            w.store(u64::MAX - 1, Ordering::Relaxed);
        }
        let mut out = Vec::new();
        assert_eq!(
            h.read(
                Chain {
                    first: 0,
                    len: 10_000,
                    owner: 9,
                    skip: 0,
                },
                &mut out
            ),
            Err(Moved)
        );
        assert_eq!(
            h.read(
                Chain {
                    first: 64,
                    len: 10,
                    owner: 9,
                    skip: 0,
                },
                &mut out
            ),
            Err(Moved)
        );
        let mut chain = Vec::new();
        assert_eq!(
            h.blocks_of(
                Chain {
                    first: 0,
                    len: 10_000,
                    owner: 9,
                    skip: 0,
                },
                &mut chain
            ),
            Err(Moved)
        );
    }
}
