//! The file formats: a 4 KiB header, then the body: `slot_count` slots of the layout's
//! slot size (a shared dict has a 4 KiB control page before its slots).
//!
//! ```text
//! offset  size  field
//!      0     8  magic  "SHMLOCK\0" (lock table) or "SHMDICT\0" (shared dict)
//!      8     4  format version (1)
//!     12     4  header size (4096)
//!     16     8  slot count
//!     24     4  slot size (lock table: 128)
//!     28     4  flags (0)
//!     32     8  hash seed
//!     40    16  boot id of the boot whose monotonic clock the deadlines use
//!     56     8  creation time (unix ns, informational)
//!     64     8  pid namespace of the creator (0: unknown)
//! lock table:
//!     72     8  xxh3-64 of bytes 0..72
//! shared dict:
//!     72     4  longest key, bytes
//!     76     4  longest value, bytes
//!     80     8  xxh3-64 of bytes 0..80
//! ```
//!
//! All integers little-endian. The header is written once, before the file becomes visible
//! under its path, and rewritten only when a table from an earlier boot is reset. A reader
//! accepts exactly what this module writes: anything else is a typed error.

use crate::error::{Error, FormatError};
use crate::slot::Slot;

pub(crate) const MAGIC: [u8; 8] = *b"SHMLOCK\0";
pub(crate) const DICT_MAGIC: [u8; 8] = *b"SHMDICT\0";
pub(crate) const VERSION: u32 = 1;
pub(crate) const HEADER_SIZE: usize = 4096;
pub(crate) const SLOT_SIZE: usize = std::mem::size_of::<Slot>();
/// Upper bound on capacity: 2^24 slots is a 2 GiB lock table.
pub(crate) const MAX_CAPACITY: u64 = 1 << 24;
/// A shared dict's control page (writer lock, counters), between header and slots.
pub(crate) const DICT_CONTROL_SIZE: usize = 4096;
/// A dict slot's fixed part, before the key and value bytes.
pub(crate) const DICT_SLOT_HEAD: usize = 64;
/// Upper bound on a dict's value length (1 MiB) and on its whole body (64 GiB).
pub(crate) const MAX_VALUE_LEN: u32 = 1 << 20;
pub(crate) const MAX_DICT_BODY: u64 = 1 << 36;

/// What the slots of a file hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    /// Lock entries of [`SLOT_SIZE`] bytes.
    Locks,
    /// Shared-dict entries with room for a key and a value of at most these lengths.
    Dict { max_key: u32, max_value: u32 },
}

impl Layout {
    pub(crate) fn magic(self) -> [u8; 8] {
        match self {
            Layout::Locks => MAGIC,
            Layout::Dict { .. } => DICT_MAGIC,
        }
    }

    /// What a user would call a file of this layout.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Layout::Locks => "lock table",
            Layout::Dict { .. } => "shared dict",
        }
    }

    pub(crate) fn slot_size(self) -> usize {
        match self {
            Layout::Locks => SLOT_SIZE,
            Layout::Dict { max_key, max_value } => {
                let raw = DICT_SLOT_HEAD + round8(max_key) + round8(max_value);
                raw.div_ceil(64) * 64
            }
        }
    }

    /// Bytes between the header and the first slot.
    pub(crate) fn control_size(self) -> usize {
        match self {
            Layout::Locks => 0,
            Layout::Dict { .. } => DICT_CONTROL_SIZE,
        }
    }

    /// Bytes of the checked part of the header (the checksum follows it).
    fn checked(self) -> usize {
        match self {
            Layout::Locks => 72,
            Layout::Dict { .. } => 80,
        }
    }

    /// Whether a table of `slot_count` slots of this layout can be made.
    pub(crate) fn check(self, slot_count: u64) -> Result<(), Error> {
        if slot_count == 0 || slot_count > MAX_CAPACITY {
            return Err(Error::InvalidCapacity(slot_count));
        }
        if let Layout::Dict { max_key, max_value } = self {
            if max_key == 0 || max_key as usize > crate::MAX_KEY_LEN {
                return Err(Error::InvalidLayout(
                    "the longest key must be 1..=65535 bytes",
                ));
            }
            if max_value > MAX_VALUE_LEN {
                return Err(Error::InvalidLayout(
                    "the longest value must be at most 1 MiB",
                ));
            }
            if slot_count * self.slot_size() as u64 > MAX_DICT_BODY {
                return Err(Error::InvalidLayout("the dict would be larger than 64 GiB"));
            }
        }
        Ok(())
    }
}

fn round8(n: u32) -> usize {
    (n as usize).div_ceil(8) * 8
}

/// What the header says about a table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub layout: Layout,
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
        HEADER_SIZE as u64 + self.body_len()
    }

    /// Bytes after the header: control page and slots.
    pub(crate) fn body_len(&self) -> u64 {
        self.layout.control_size() as u64 + self.slot_count * self.layout.slot_size() as u64
    }

    pub(crate) fn encode(&self) -> [u8; HEADER_SIZE] {
        let mut b = [0u8; HEADER_SIZE];
        b[0..8].copy_from_slice(&self.layout.magic());
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(HEADER_SIZE as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.slot_count.to_le_bytes());
        b[24..28].copy_from_slice(&(self.layout.slot_size() as u32).to_le_bytes());
        // 28..32: flags, all clear
        b[32..40].copy_from_slice(&self.seed.to_le_bytes());
        b[40..56].copy_from_slice(&self.boot_id);
        b[56..64].copy_from_slice(&self.created_ns.to_le_bytes());
        b[64..72].copy_from_slice(&self.pid_ns.to_le_bytes());
        if let Layout::Dict { max_key, max_value } = self.layout {
            b[72..76].copy_from_slice(&max_key.to_le_bytes());
            b[76..80].copy_from_slice(&max_value.to_le_bytes());
        }
        let checked = self.layout.checked();
        let sum = xxhash_rust::xxh3::xxh3_64(&b[..checked]);
        b[checked..checked + 8].copy_from_slice(&sum.to_le_bytes());
        b
    }

    /// Parses and validates a header. `bytes` may be any length (a short file is an error).
    pub(crate) fn decode(bytes: &[u8]) -> Result<Header, Error> {
        let truncated = || -> Error {
            FormatError::Truncated {
                len: bytes.len() as u64,
                expected: HEADER_SIZE as u64,
            }
            .into()
        };
        if bytes.len() < 88 {
            return Err(truncated());
        }
        let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
        let layout = if bytes[0..8] == MAGIC {
            Layout::Locks
        } else if bytes[0..8] == DICT_MAGIC {
            Layout::Dict {
                max_key: u32_at(72),
                max_value: u32_at(76),
            }
        } else {
            return Err(FormatError::NotATable.into());
        };
        let version = u32_at(8);
        if version != VERSION {
            return Err(FormatError::UnsupportedVersion(version).into());
        }
        let checked = layout.checked();
        if xxhash_rust::xxh3::xxh3_64(&bytes[..checked]) != u64_at(checked) {
            return Err(FormatError::Corrupt("header checksum mismatch").into());
        }
        let slot_count = u64_at(16);
        if let Err(e) = layout.check(slot_count) {
            return Err(match e {
                Error::InvalidCapacity(_) => FormatError::Corrupt("slot count out of range"),
                _ => FormatError::Corrupt("key or value length out of range"),
            }
            .into());
        }
        if u32_at(12) as usize != HEADER_SIZE || u32_at(24) as usize != layout.slot_size() {
            return Err(FormatError::Corrupt("unknown header or slot size").into());
        }
        if u32_at(28) != 0 {
            return Err(FormatError::Corrupt("unknown flags").into());
        }
        // The rest of the header is reserved and written as zeros; a shorter read is caught
        // by the size check after decoding.
        if bytes[checked + 8..].iter().any(|&b| b != 0) {
            return Err(FormatError::Corrupt("reserved header bytes are not zero").into());
        }
        let mut boot_id = [0u8; 16];
        boot_id.copy_from_slice(&bytes[40..56]);
        Ok(Header {
            layout,
            slot_count,
            seed: u64_at(32),
            boot_id,
            created_ns: u64_at(56),
            pid_ns: u64_at(64),
        })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn sample() -> Header {
        Header {
            layout: Layout::Locks,
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

    fn dict() -> Header {
        Header {
            layout: Layout::Dict {
                max_key: 250,
                max_value: 64,
            },
            ..sample()
        }
    }

    #[test]
    fn dict_header_round_trips_and_keeps_the_lock_format() {
        let h = dict();
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
        assert_eq!(h.layout.slot_size(), 384);
        assert_eq!(&h.encode()[..8], b"SHMDICT\0");
        // The lock table's bytes are those of format 1 before dicts existed.
        let locks = sample().encode();
        assert_eq!(&locks[..8], b"SHMLOCK\0");
        assert!(locks[80..].iter().all(|&b| b == 0));
    }

    #[test]
    fn rejects_what_it_did_not_write() {
        for good in [sample().encode(), dict().encode()] {
            rejects_damage_to(good);
        }
    }

    fn rejects_damage_to(good: [u8; HEADER_SIZE]) {
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
        for (max_key, max_value) in [(0, 64), (65536, 64), (250, MAX_VALUE_LEN + 1)] {
            let h = Header {
                layout: Layout::Dict { max_key, max_value },
                ..sample()
            };
            assert!(
                Header::decode(&h.encode()).is_err(),
                "{max_key} {max_value}"
            );
        }
    }
}
