//! Bytes packed into the mapping's atomic words (little-endian, the last word
//! zero-padded), and back: entries keep their keys and values so, heap blocks too. Every
//! word is an atomic because other processes write the same memory; these move whole
//! words, never a byte at a time.

use crate::shm::primitive::{AtomicU64, Ordering};

/// Copies the first `len` bytes of `words` (little-endian; `words` holds at least
/// `len.div_ceil(8)` of them, else this panics) into `out`, replacing what it held: a word
/// per store.
#[inline(always)]
pub(crate) fn copy_words(words: &[AtomicU64], len: usize, out: &mut Vec<u8>) {
    let words = &words[..words_for(len)];
    let n = words.len() * 8;
    out.clear();
    if out.capacity() < n {
        *out = Vec::with_capacity(n); // (straight to the allocator: no growth policy)
    }
    let dst = out.spare_capacity_mut()[..n].as_mut_ptr().cast::<u8>();
    for (j, word) in words.iter().enumerate() {
        let bytes = word.load(Ordering::Relaxed).to_le_bytes();
        // SAFETY: `dst` points at `n` = 8 * `words.len()` bytes of the buffer's spare
        // capacity (the slice just taken), so bytes 8j..8j+8 are inside it for every `j`;
        // an unaligned write of plain bytes needs no alignment nor initialised target.
        unsafe { dst.add(8 * j).cast::<[u8; 8]>().write_unaligned(bytes) };
    }
    // SAFETY: the loop wrote all `n` bytes of the spare capacity's start; `len` <= `n`.
    unsafe { out.set_len(len) };
}

/// Fills `out` with the first `out.len()` bytes of `words` (little-endian; `words` holds
/// at least `out.len().div_ceil(8)` of them, else this panics): whole words, then the
/// tail. (Not a copy of a slice of unknown length per word: that was a call to memcpy per
/// 8 bytes, most of a long value's cost.)
#[inline(always)]
pub(crate) fn load_packed(words: &[AtomicU64], out: &mut [u8]) {
    let mut whole = out.chunks_exact_mut(8);
    let mut words = words.iter();
    for (bytes, word) in whole.by_ref().zip(words.by_ref()) {
        bytes.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
    }
    let tail = whole.into_remainder();
    if !tail.is_empty() {
        let word = words.next().expect("a word for the tail");
        tail.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes()[..tail.len()]);
    }
}

/// Stores `bytes` as little-endian words, the last one zero-padded, into the first words
/// of `words` (as many as there are, if fewer), calling `after` after each. Whole words,
/// then the tail: not an iterator chained onto the tail's `Option`, which tests at every
/// word which half it is in (no allocation either: every store runs this).
#[inline(always)]
pub(crate) fn store_packed(words: &[AtomicU64], bytes: &[u8], after: impl Fn()) {
    let whole = bytes.chunks_exact(8);
    let tail = whole.remainder();
    let mut words = words.iter();
    // (the chunks first: a zip that ran out of them must not have taken a word)
    for (chunk, word) in whole.zip(words.by_ref()) {
        word.store(
            u64::from_le_bytes(chunk.try_into().expect("8-byte chunk")),
            Ordering::Relaxed,
        );
        after();
    }
    if !tail.is_empty() {
        if let Some(word) = words.next() {
            word.store(tail_word(bytes), Ordering::Relaxed);
            after();
        }
    }
}

/// The last partial word of `bytes` (its last `len % 8` bytes, which must be some),
/// zero-padded. Read with loads that end at the last byte and shifted into place, not
/// copied into a zeroed array (whose 8-byte load after a byte-wise copy stalls on store
/// forwarding, a third of a short key's lookup), nor shifted in a byte at a time (a chain
/// of a dependent shift per byte).
#[inline(always)]
pub(crate) fn tail_word(bytes: &[u8]) -> u64 {
    let len = bytes.len();
    let rem = len % 8;
    debug_assert!(rem != 0);
    let load4 = |at: usize| {
        u64::from(u32::from_le_bytes(
            bytes[at..at + 4].try_into().expect("4 bytes"),
        ))
    };
    if len >= 8 {
        // The last 8 bytes, the whole words' part shifted out.
        u64::from_le_bytes(bytes[len - 8..].try_into().expect("8 bytes")) >> (8 * (8 - rem))
    } else if len >= 4 {
        // Two 4-byte loads that overlap (or meet) in the middle: the bytes they share
        // land on the same bits with the same values.
        load4(0) | load4(len - 4) << (8 * (len - 4))
    } else {
        bytes.iter().rev().fold(0, |w, &b| w << 8 | u64::from(b))
    }
}

pub(crate) const fn words_for(len: usize) -> usize {
    len.div_ceil(8)
}
