//! The file format: a 4 KiB header followed by `slot_count` slots of [`SLOT_SIZE`] bytes.
//!
//! ```text
//! offset  size  field
//!      0     8  magic  "SHMLOCK\0"
//!      8     4  format version (1)
//!     12     4  header size (4096)
//!     16     8  slot count
//!     24     4  slot size (128)
//!     28     4  flags (0)
//!     32     8  hash seed
//!     40    16  boot id of the boot whose monotonic clock the deadlines use
//!     56     8  creation time (unix ns, informational)
//!     64     8  pid namespace of the creator (0: unknown)
//!     72     8  xxh3-64 of bytes 0..72
//! ```
//!
//! All integers little-endian. The header is written once, before the file becomes visible
//! under its path, and rewritten only when a table from an earlier boot is reset. A reader
//! accepts exactly what this module writes: anything else is a typed error.

use crate::error::{Error, FormatError};
use crate::slot::Slot;

pub(crate) const MAGIC: [u8; 8] = *b"SHMLOCK\0";
pub(crate) const VERSION: u32 = 1;
pub(crate) const HEADER_SIZE: usize = 4096;
pub(crate) const SLOT_SIZE: usize = std::mem::size_of::<Slot>();
/// Upper bound on capacity: 2^24 slots is a 2 GiB file.
pub(crate) const MAX_CAPACITY: u64 = 1 << 24;
const CHECKED: usize = 72;

/// What the header says about a table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub slot_count: u64,
    pub seed: u64,
    pub boot_id: [u8; 16],
    pub created_ns: u64,
    /// The creator's pid namespace: pids in the table are only judged by processes of it.
    pub pid_ns: u64,
}

impl Header {
    /// Total file size for this layout.
    pub(crate) fn file_len(&self) -> u64 {
        file_len(self.slot_count)
    }

    pub(crate) fn encode(&self) -> [u8; HEADER_SIZE] {
        let mut b = [0u8; HEADER_SIZE];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(HEADER_SIZE as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.slot_count.to_le_bytes());
        b[24..28].copy_from_slice(&(SLOT_SIZE as u32).to_le_bytes());
        // 28..32: flags, all clear
        b[32..40].copy_from_slice(&self.seed.to_le_bytes());
        b[40..56].copy_from_slice(&self.boot_id);
        b[56..64].copy_from_slice(&self.created_ns.to_le_bytes());
        b[64..72].copy_from_slice(&self.pid_ns.to_le_bytes());
        let sum = xxhash_rust::xxh3::xxh3_64(&b[..CHECKED]);
        b[CHECKED..CHECKED + 8].copy_from_slice(&sum.to_le_bytes());
        b
    }

    /// Parses and validates a header. `bytes` may be any length (a short file is an error).
    pub(crate) fn decode(bytes: &[u8]) -> Result<Header, Error> {
        if bytes.len() < CHECKED + 8 {
            return Err(FormatError::Truncated {
                len: bytes.len() as u64,
                expected: HEADER_SIZE as u64,
            }
            .into());
        }
        let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
        if bytes[0..8] != MAGIC {
            return Err(FormatError::NotATable.into());
        }
        let version = u32_at(8);
        if version != VERSION {
            return Err(FormatError::UnsupportedVersion(version).into());
        }
        if xxhash_rust::xxh3::xxh3_64(&bytes[..CHECKED]) != u64_at(CHECKED) {
            return Err(FormatError::Corrupt("header checksum mismatch").into());
        }
        if u32_at(12) as usize != HEADER_SIZE || u32_at(24) as usize != SLOT_SIZE {
            return Err(FormatError::Corrupt("unknown header or slot size").into());
        }
        if u32_at(28) != 0 {
            return Err(FormatError::Corrupt("unknown flags").into());
        }
        // The rest of the header is reserved and written as zeros; a shorter read is caught
        // by the size check after decoding.
        if bytes[CHECKED + 8..].iter().any(|&b| b != 0) {
            return Err(FormatError::Corrupt("reserved header bytes are not zero").into());
        }
        let slot_count = u64_at(16);
        if slot_count == 0 || slot_count > MAX_CAPACITY {
            return Err(FormatError::Corrupt("slot count out of range").into());
        }
        let mut boot_id = [0u8; 16];
        boot_id.copy_from_slice(&bytes[40..56]);
        Ok(Header {
            slot_count,
            seed: u64_at(32),
            boot_id,
            created_ns: u64_at(56),
            pid_ns: u64_at(64),
        })
    }
}

pub(crate) fn file_len(slot_count: u64) -> u64 {
    HEADER_SIZE as u64 + slot_count * SLOT_SIZE as u64
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn sample() -> Header {
        Header {
            slot_count: 1024,
            seed: 0x1234_5678_9abc_def0,
            boot_id: [7; 16],
            created_ns: 42,
            pid_ns: 99,
        }
    }

    #[test]
    fn round_trips() {
        let h = sample();
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
    }

    #[test]
    fn rejects_what_it_did_not_write() {
        let good = sample().encode();
        let err = |b: &[u8]| Header::decode(b).unwrap_err().to_string();

        assert!(err(&[0u8; HEADER_SIZE]).contains("not a shmlock table"));
        assert!(err(&good[..10]).contains("truncated"));

        let mut v = good;
        v[8] = 2;
        assert!(err(&v).contains("version 2"));

        // every single-bit flip anywhere in the header is caught
        for byte in 0..HEADER_SIZE {
            for bit in 0..8 {
                let mut b = good;
                b[byte] ^= 1 << bit;
                assert!(Header::decode(&b).is_err(), "flip at {byte}:{bit} accepted");
            }
        }
    }

    #[test]
    fn rejects_out_of_range_layout_even_with_valid_checksum() {
        for count in [0, MAX_CAPACITY + 1, u64::MAX] {
            let h = Header {
                slot_count: count,
                ..sample()
            };
            assert!(Header::decode(&h.encode()).is_err());
        }
    }
}
