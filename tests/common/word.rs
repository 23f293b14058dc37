//! The fields of a slot's control word, read from raw words (see `src/shm/slot.rs`, whose
//! layout this mirrors: tests that watch a slot through their own mapping use it).
#![allow(dead_code)]

pub const GEN_MASK: u64 = (1 << 26) - 1;
const WAITERS: u64 = 1 << 3;
const REACH_MASK: u64 = 0xf << 4;
const WRITER_WAITS: u64 = 1 << 8;

/// The control word without its waiters, writer-waits and reach bits (`Word::ident`).
pub fn ident(w: u64) -> u64 {
    w & !(WAITERS | WRITER_WAITS | REACH_MASK)
}

/// The entry's generation: 23 low bits from bit 9, 3 high bits from bit 61.
pub fn gen(w: u64) -> u64 {
    ((w >> 9) & ((1 << 23) - 1)) | (w >> 61) << 23
}

/// The state bits (0 free, 1 claiming, 2 held, 3 extending, 4 broken, 5 stealing).
pub fn state(w: u64) -> u64 {
    w & 7
}
