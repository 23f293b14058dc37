//! The file formats: a 4 KiB header, the owner registry, then the body.
//!
//! ```text
//! offset  size  field
//!      0     8  magic  "SHMLOCK\0" (lock table) or "SHMDICT\0" (shared dict)
//!      8     4  format version (lock table: `VERSION`, 15; shared dict: `DICT_VERSION`, 16)
//!     12     4  header size (4096)
//!     16     8  slot count
//!     24     4  slot size (lock table: 64)
//!     28     4  flags (0)
//!     32     8  hash seed
//!     40    16  boot id of the boot whose monotonic clock the deadlines use (zeros: unknown)
//!     56     8  creation time (unix ns, informational)
//!     64     8  capacity: keys that can be held (or stored) at once
//!     72     4  registry entries
//!     76     4  reserved (0)
//!     80     8  token base: every fencing token is above it (unix ns at creation or reset)
//!     88     4  shared dict: longest key, bytes (lock table: 0)
//!     92     4  shared dict: longest value, bytes (lock table: 0)
//!     96     8  xxh3-64 of bytes 0..96
//! ```
//!
//! All integers little-endian; the rest of the header page is zero. One byte of it,
//! [`ATTACHED_LOCK_BYTE`], only ever carries open-file-description locks (never data).
//!
//! After the header come the owner registry ([`REGISTRY_ENTRY`] bytes an entry, rounded up
//! to whole pages; see `registry.rs`), then the body: for a lock table the hot slots
//! (64 bytes each, see `slot.rs`) followed by as many cold slots (what only inspection
//! reads); for a shared dict a 4 KiB control page, its entries, two more entries' room
//! for the undo copies (`dict/journal.rs`) and a word per entry for the home filters
//! (`dict/filter.rs`), rounded to 64 bytes. Last come the counters
//! ([`STATS_SIZE`] bytes: cells of 64 words that the processes add to, see `counters.rs`).
//!
//! The header is written once, before the file becomes visible under its path, and
//! rewritten only when a table from an earlier boot is reset. A reader accepts exactly
//! what this module writes: anything else is a typed error.

use std::fmt;

use crate::error::{Error, FormatError};
use crate::limits;

pub(crate) const MAGIC: [u8; 8] = *b"SHMLOCK\0";
pub(crate) const DICT_MAGIC: [u8; 8] = *b"SHMDICT\0";
pub(crate) const VERSION: u32 = 15;
/// A shared dict's format version (16: a list's elements carry their length at both ends,
/// and a list in the heap is named with its skip and count, see `dict/api/list.rs`).
pub(crate) const DICT_VERSION: u32 = 16;
pub(crate) const HEADER_SIZE: usize = 4096;
const PAGE: u64 = 4096;
/// Bytes of a lock table's hot slot, and of its cold one.
pub(crate) const SLOT_SIZE: usize = 64;
pub(crate) const COLD_SIZE: usize = 64;
/// Upper bound on capacity: 2^24 keys (a lock table of 8 GiB, with its headroom).
pub(crate) const MAX_CAPACITY: u64 = limits::MAX_CAPACITY as u64;
/// A lock table has this many slots per key of capacity: at most a quarter full, so most
/// keys sit at their home and take it by one CAS however full the user fills it (a key
/// whose home is taken costs a scan, a second line and a second locked operation: at half
/// full, a pair at 90 % of the capacity cost 1.6x one at 10 %; at a quarter, 1.3x).
pub(crate) const HEADROOM: u64 = 4;
/// A shared dict's control page (writer lock, counters), between registry and slots.
pub(crate) const DICT_CONTROL_SIZE: usize = 4096;
/// A dict slot's fixed part, before the key and value bytes.
pub(crate) const DICT_SLOT_HEAD: usize = 64;
/// Upper bound on the value room of a dict's entry (1 MiB) and on its whole body (64 GiB).
pub(crate) const MAX_VALUE_LEN: u32 = 1 << 20;
/// Bytes of a block of a dict's heap.
pub(crate) const HEAP_BLOCK: usize = 256;
/// Upper bound on a value kept in a dict's heap (64 MiB).
pub(crate) const MAX_HEAP_VALUE: u64 = 64 << 20;
pub(crate) const MAX_DICT_BODY: u64 = 1 << 36;
/// Bytes of the counters at the end of the file: [`STATS_CELLS`] process cells of 512
/// bytes, then [`THREAD_CELLS`] thread cells of 64 (see `counters.rs`).
pub(crate) const STATS_SIZE: u64 = STATS_CELLS as u64 * 512 + THREAD_CELLS as u64 * 64;
/// Cells of counters: each process adds to one, a reader sums them.
pub(crate) const STATS_CELLS: usize = 16;
/// Thread cells in the counters: threads counting in one file at once with a cell each
/// (those beyond add to their process cell).
pub(crate) const THREAD_CELLS: usize = 256;
/// Bytes of one owner-registry entry.
pub(crate) const REGISTRY_ENTRY: u64 = 32;
/// The most registry entries a file can have: entry numbers are 16 bits, and the last
/// number means "no entry".
pub(crate) const MAX_REGISTRY: u32 = 0xffff;
/// Registry entries of a file created without saying how many processes may attach.
pub(crate) const DEFAULT_REGISTRY: u32 = 1024;
/// The byte every process that opened the file for writing keeps read-locked while it
/// has it open: while any is, the table is in use and is never reset (a reset holds it
/// locked for writing, which keeps anyone from attaching meanwhile).
pub(crate) const ATTACHED_LOCK_BYTE: u64 = 4001;
/// Bytes of the checked part of the header; the checksum follows it.
const CHECKED: usize = 96;

/// What the slots of a file hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    /// Lock entries: [`SLOT_SIZE`]-byte hot slots, then as many cold ones.
    Locks,
    /// Shared-dict entries with room for a key and a value of at most these lengths, and
    /// a block heap of `heap_blocks` blocks for longer values (see `dict/heap.rs`).
    Dict {
        max_key: u32,
        max_value: u32,
        heap_blocks: u32,
    },
}

/// Bytes of a dict's home filters: a word per entry, whole cache lines.
pub(crate) fn dict_filters_len(slot_count: u64) -> u64 {
    (slot_count * 8).div_ceil(64) * 64
}

/// Bytes of a dict heap's map: a word per 32 blocks (their bits, under a tag), whole
/// cache lines.
pub(crate) fn heap_map_len(blocks: u32) -> u64 {
    u64::from(blocks).div_ceil(256) * 64
}

/// Bytes of a dict heap of `blocks` blocks: its map, then the blocks.
pub(crate) fn heap_len(blocks: u32) -> u64 {
    heap_map_len(blocks) + u64::from(blocks) * HEAP_BLOCK as u64
}

/// The most heap blocks that a dict of `layout` (heap aside), `capacity` entries and
/// `registry` processes can have in a file of at most `zone` bytes.
pub(crate) fn heap_for_zone(
    layout: Layout,
    capacity: u64,
    registry: u32,
    zone: u64,
) -> Result<u32, Error> {
    let Layout::Dict {
        max_key, max_value, ..
    } = layout
    else {
        unreachable!("a lock table has no heap")
    };
    let file = |heap_blocks: u32| {
        let layout = Layout::Dict {
            max_key,
            max_value,
            heap_blocks,
        };
        Header::new(layout, capacity, registry).file_len()
    };
    let needs = file(0);
    if needs > zone {
        return Err(Error::ZoneTooSmall {
            size: zone,
            needs,
            entries: capacity,
        });
    }
    // 256 bytes a block and 64 bytes of map per 256 blocks: 1025/4 bytes a block but for
    // the map's rounding, which the steps below settle.
    let most = u64::from(u32::MAX - 1);
    let mut blocks = (u128::from(zone - needs) * 4 / 1025).min(u128::from(most)) as u32;
    while u64::from(blocks) < most && file(blocks + 1) <= zone {
        blocks += 1;
    }
    while blocks > 0 && file(blocks) > zone {
        blocks -= 1;
    }
    Ok(blocks)
}

impl Layout {
    pub(crate) fn magic(self) -> [u8; 8] {
        match self {
            Layout::Locks => MAGIC,
            Layout::Dict { .. } => DICT_MAGIC,
        }
    }

    /// The format version of a file of this layout.
    pub(crate) fn version(self) -> u32 {
        match self {
            Layout::Locks => VERSION,
            Layout::Dict { .. } => DICT_VERSION,
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
            Layout::Dict {
                max_key, max_value, ..
            } => {
                let raw = DICT_SLOT_HEAD + round8(max_key) + round8(max_value);
                raw.div_ceil(64) * 64
            }
        }
    }

    /// Slots that back `capacity` keys.
    pub(crate) fn slots_for(self, capacity: u64) -> u64 {
        match self {
            Layout::Locks => capacity * HEADROOM,
            Layout::Dict { .. } => capacity,
        }
    }

    /// Bytes of the body after the registry: control page, slots (and cold slots).
    pub(crate) fn body_len(self, slot_count: u64) -> u64 {
        match self {
            Layout::Locks => slot_count * (SLOT_SIZE + COLD_SIZE) as u64,
            // Two slots more than the entries (the undo copies), the home filters, then
            // the heap.
            Layout::Dict { heap_blocks, .. } => {
                DICT_CONTROL_SIZE as u64
                    + (slot_count + 2) * self.slot_size() as u64
                    + dict_filters_len(slot_count)
                    + heap_len(heap_blocks)
            }
        }
    }

    /// Whether a file for `capacity` keys and `registry` processes can be made.
    pub(crate) fn check(self, capacity: u64, registry: u32) -> Result<(), Error> {
        if capacity == 0 || capacity > MAX_CAPACITY {
            return Err(Error::InvalidCapacity(capacity));
        }
        if registry == 0 || registry > MAX_REGISTRY {
            return Err(Error::InvalidOptions(
                "max_processes must be 1..=65535 (the owner registry's entries)",
            ));
        }
        if let Layout::Dict {
            max_key,
            max_value,
            heap_blocks,
        } = self
        {
            check_dict_limits(max_key as usize, max_value as usize)?;
            if heap_blocks == u32::MAX {
                return Err(Error::InvalidLayout("the dict's heap would be too large"));
            }
            if self.body_len(self.slots_for(capacity)) > MAX_DICT_BODY {
                return Err(Error::InvalidLayout("the dict would be larger than 64 GiB"));
            }
        }
        Ok(())
    }
}

/// A dict's longest key and value, as `DictOptions` asks them and a header says them.
pub(crate) fn check_dict_limits(max_key: usize, max_value: usize) -> Result<(), Error> {
    if max_key == 0 || max_key > limits::MAX_KEY_LEN {
        return Err(Error::InvalidLayout("max_key_len must be 1 to 65535 bytes"));
    }
    if max_value == 0 || max_value > MAX_VALUE_LEN as usize {
        return Err(Error::InvalidLayout(
            "max_value_len must be 1 byte to 1 MiB (1048576)",
        ));
    }
    Ok(())
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
    /// Keys that can be held at once (a lock table has [`HEADROOM`] slots per key).
    pub capacity: u64,
    /// Entries of the owner registry.
    pub registry: u32,
    /// Every fencing token handed out is above this.
    pub token_base: u64,
}

impl Header {
    /// A header for a new file.
    pub(crate) fn new(layout: Layout, capacity: u64, registry: u32) -> Header {
        Header {
            layout,
            slot_count: layout.slots_for(capacity),
            seed: 0,
            boot_id: [0; 16],
            created_ns: 0,
            capacity,
            registry,
            token_base: 0,
        }
    }

    /// Total file size for this layout.
    pub(crate) fn file_len(&self) -> u64 {
        HEADER_SIZE as u64 + self.mapped_len()
    }

    /// Bytes of the registry, whole pages.
    pub(crate) fn registry_len(&self) -> u64 {
        (u64::from(self.registry) * REGISTRY_ENTRY).div_ceil(PAGE) * PAGE
    }

    /// Bytes after the header: registry, body and counters.
    pub(crate) fn mapped_len(&self) -> u64 {
        self.registry_len() + self.layout.body_len(self.slot_count) + STATS_SIZE
    }

    pub(crate) fn encode(&self) -> [u8; HEADER_SIZE] {
        let mut b = [0u8; HEADER_SIZE];
        b[0..8].copy_from_slice(&self.layout.magic());
        b[8..12].copy_from_slice(&self.layout.version().to_le_bytes());
        b[12..16].copy_from_slice(&(HEADER_SIZE as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.slot_count.to_le_bytes());
        b[24..28].copy_from_slice(&(self.layout.slot_size() as u32).to_le_bytes());
        // 28..32: flags, all clear
        b[32..40].copy_from_slice(&self.seed.to_le_bytes());
        b[40..56].copy_from_slice(&self.boot_id);
        b[56..64].copy_from_slice(&self.created_ns.to_le_bytes());
        b[64..72].copy_from_slice(&self.capacity.to_le_bytes());
        b[72..76].copy_from_slice(&self.registry.to_le_bytes());
        // 76..80: a dict's heap blocks (reserved in a lock table)
        b[80..88].copy_from_slice(&self.token_base.to_le_bytes());
        if let Layout::Dict {
            max_key,
            max_value,
            heap_blocks,
        } = self.layout
        {
            b[76..80].copy_from_slice(&heap_blocks.to_le_bytes());
            b[88..92].copy_from_slice(&max_key.to_le_bytes());
            b[92..96].copy_from_slice(&max_value.to_le_bytes());
        }
        let sum = xxhash_rust::xxh3::xxh3_64(&b[..CHECKED]);
        b[CHECKED..CHECKED + 8].copy_from_slice(&sum.to_le_bytes());
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
        if bytes.len() < 12 {
            // (a short file that does not start as one of ours is not ours: a pid file
            // given by mistake is not a "truncated" table to be removed)
            let ours = |magic: &[u8]| magic.starts_with(&bytes[..bytes.len().min(8)]);
            return Err(if ours(&MAGIC) || ours(&DICT_MAGIC) {
                truncated()
            } else {
                FormatError::NotATable.into()
            });
        }
        let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
        let dict = if bytes[0..8] == MAGIC {
            false
        } else if bytes[0..8] == DICT_MAGIC {
            true
        } else {
            return Err(FormatError::NotATable.into());
        };
        let version = u32_at(8);
        if version != if dict { DICT_VERSION } else { VERSION } {
            return Err(FormatError::UnsupportedVersion(version).into());
        }
        if bytes.len() < HEADER_SIZE {
            return Err(truncated());
        }
        if xxhash_rust::xxh3::xxh3_64(&bytes[..CHECKED]) != u64_at(CHECKED) {
            return Err(FormatError::Corrupt("header checksum mismatch").into());
        }
        let layout = if dict {
            Layout::Dict {
                max_key: u32_at(88),
                max_value: u32_at(92),
                heap_blocks: u32_at(76),
            }
        } else {
            if u64_at(88) != 0 || u32_at(76) != 0 {
                return Err(FormatError::Corrupt("reserved header bytes are not zero").into());
            }
            Layout::Locks
        };
        let capacity = u64_at(64);
        let registry = u32_at(72);
        if let Err(e) = layout.check(capacity, registry) {
            return Err(match e {
                Error::InvalidCapacity(_) => FormatError::Corrupt("capacity out of range"),
                Error::InvalidOptions(_) => FormatError::Corrupt("registry size out of range"),
                _ => FormatError::Corrupt("key or value length out of range"),
            }
            .into());
        }
        let slot_count = u64_at(16);
        if slot_count != layout.slots_for(capacity) {
            return Err(FormatError::Corrupt("slot count does not match the capacity").into());
        }
        if u32_at(12) as usize != HEADER_SIZE || u32_at(24) as usize != layout.slot_size() {
            return Err(FormatError::Corrupt("unknown header or slot size").into());
        }
        if u32_at(28) != 0 {
            return Err(FormatError::Corrupt("unknown flags").into());
        }
        if bytes[CHECKED + 8..HEADER_SIZE].iter().any(|&b| b != 0) {
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
            capacity,
            registry,
            token_base: u64_at(80),
        })
    }
}

// What is wrong with a file, as a user reads it.
impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FormatError::NotATable => {
                f.write_str("not a shmlock file (bad magic): neither a lock table nor a dict")
            }
            FormatError::UnsupportedVersion(v) => {
                write!(
                    f,
                    "shmlock file format version {v} is not supported (this build uses \
                     version {VERSION} for lock tables, {DICT_VERSION} for dicts: remove the \
                     file once no process uses it)"
                )
            }
            // Never a table being made: one appears at its path only once whole (built in
            // an unnamed file, then linked; see `file.rs`).
            FormatError::Truncated { len: 0, .. } => f.write_str(
                "empty file (0 bytes), not a shmlock file: no shmlock process is making it \
                 (a table appears at its path only once whole), so something else made or \
                 emptied it (touch?): remove it, and the next open creates the table \
                 (`shmlock run`, `LockTable::open`, `SharedDict::open`), or make one with \
                 `shmlock create`",
            ),
            FormatError::Truncated { len, expected } if *expected == HEADER_SIZE as u64 => {
                write!(
                    f,
                    "truncated shmlock file: {len} bytes, shorter than its {expected}-byte header"
                )
            }
            FormatError::Truncated { len, expected } => {
                write!(
                    f,
                    "truncated shmlock file: {len} bytes, expected {expected}"
                )
            }
            FormatError::Corrupt(why) => write!(f, "corrupt shmlock file: {why}"),
            FormatError::WrongKind { found, expected } => {
                write!(f, "this file is a shmlock {found}, not a {expected}")
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn sample() -> Header {
        Header {
            seed: 0x1234_5678_9abc_def0,
            boot_id: [7; 16],
            created_ns: 42,
            token_base: 1_700_000_000_000_000_000,
            ..Header::new(Layout::Locks, 1024, 64)
        }
    }

    #[test]
    fn round_trips() {
        let h = sample();
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
        assert_eq!(h.slot_count, 4096);
        assert_eq!(h.registry_len(), 4096);
        assert_eq!(h.file_len(), 4096 + 4096 + 4096 * 128 + STATS_SIZE);
    }

    fn dict() -> Header {
        Header {
            layout: Layout::Dict {
                max_key: 250,
                max_value: 64,
                heap_blocks: 100,
            },
            slot_count: 1024,
            ..sample()
        }
    }

    #[test]
    fn dict_header_round_trips() {
        let h = dict();
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
        assert_eq!(h.layout.slot_size(), 384);
        assert_eq!(&h.encode()[..8], b"SHMDICT\0");
        assert_eq!(&sample().encode()[..8], b"SHMLOCK\0");
    }

    #[test]
    fn rejects_what_it_did_not_write() {
        for good in [sample().encode(), dict().encode()] {
            rejects_damage_to(good);
        }
    }

    fn rejects_damage_to(good: [u8; HEADER_SIZE]) {
        let err = |b: &[u8]| Header::decode(b).unwrap_err().to_string();

        assert!(err(&[0u8; HEADER_SIZE]).contains("not a shmlock file"));
        assert!(err(&good[..10]).contains("truncated"));
        assert!(err(&good[..100]).contains("truncated"));

        let mut v = good;
        v[8] = 1;
        assert!(err(&v).contains("version 1"));

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
        for capacity in [0, MAX_CAPACITY + 1, u64::MAX / 4] {
            let h = Header {
                capacity,
                slot_count: capacity.wrapping_mul(HEADROOM),
                ..sample()
            };
            assert!(Header::decode(&h.encode()).is_err(), "{capacity}");
        }
        for registry in [0, MAX_REGISTRY + 1] {
            let h = Header {
                registry,
                ..sample()
            };
            assert!(Header::decode(&h.encode()).is_err(), "{registry}");
        }
        // slots that do not back the capacity
        let h = Header {
            slot_count: 1024,
            ..sample()
        };
        assert!(Header::decode(&h.encode()).is_err());
        for (max_key, max_value) in [(0, 64), (65536, 64), (250, MAX_VALUE_LEN + 1)] {
            let h = Header {
                layout: Layout::Dict {
                    max_key,
                    max_value,
                    heap_blocks: 0,
                },
                slot_count: 1024,
                ..sample()
            };
            assert!(
                Header::decode(&h.encode()).is_err(),
                "{max_key} {max_value}"
            );
        }
    }
}
