//! The [`SharedDict`] handle and its ngx.shared.DICT operations.

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::entry::{Aborted, Copied, Entry, Geometry, Kind, Look, Out, PackedKey, ValueAt};
use super::filter::{self, Filter};
use super::heap::{blocks_for, map_words, Chain, Heap};
use super::journal::{Journal, Journals, Keep, Settled, State as JournalState, JOURNALS};
use super::recency;
use super::value::{Num, Number, Value, ValueRef};

mod list;
use super::writer::{WriterEnv, WriterLock, Writing};
use crate::error::{Error, KeyPreview};
use crate::shm::attachment::Attachment;
use crate::shm::clock::{deadline, Clock, Monotonic};
use crate::shm::counters::{self, Cells, Fast};
use crate::shm::file::{self, OpenSpec};
use crate::shm::format::{heap_map_len, Header, Layout, HEAP_BLOCK, MAX_HEAP_VALUE};
use crate::shm::primitive::{spin, SETTLE_ROUNDS};
use crate::shm::registry::OwnerId;

/// How far from its home a key may be placed: a lookup reads at most this many entries.
pub(crate) const WINDOW: usize = 64;
/// How many entries near its home a full window offers for eviction (the LRU sample).
const EVICTION_SAMPLE: usize = 8;
/// Bytes of a zone per entry when [`DictOptions::zone_size`] is given without a capacity:
/// a page's, so that most of a zone is heap (a 64 MiB zone of values from 16 B to 64 KiB
/// then holds more of them than nginx's 64m: `benches/dict_memory.rs`).
const ZONE_PER_ENTRY: u64 = 4096;
/// The largest [`DictOptions::zone_size`]: the largest dict body (so any zone up to it
/// makes a dict that `Layout::check` takes).
const MAX_ZONE: u64 = crate::shm::format::MAX_DICT_BODY;

// Words of the control page.
const WRITER: usize = 0;
const WAIT: usize = 1;
const LEN: usize = 2;
const EVICTIONS: usize = 3;
const REPAIRS: usize = 4;
/// The undo copies' words, each followed by the index of the entry its copy is of (see
/// `journal.rs`).
const JOURNAL: usize = 5;
/// Non-zero once `flush_all` has left expired entries anywhere in the dict, until
/// `flush_expired(0)` frees them all: a store into a full dict then looks for one across
/// its whole window before it evicts (ngx's sets reclaim them first: they are its LRU
/// tail). Written under the writer lock. (A word that files made before it have zero.)
const FLUSHED: usize = JOURNAL + 2 * JOURNALS;
/// The heap's tag: the last one drawn and given to every map word (see `heap.rs`), by a
/// holder that took the writer lock over, or by one whose sweep met words of another tag;
/// a sweep expects its hold's tag of the words it frees in.
const HEAP_TAG: usize = FLUSHED + 1;
/// Nonzero once a takeover may have left heap blocks that nothing names (a writer killed
/// or stopped between taking blocks and publishing them), or a chain was dropped: a store
/// that finds the heap short sweeps it only then. Each cause adds one; a sweep that ran,
/// and found every entry and copy settled, clears it with a CAS from the count it read
/// first (a cause since then keeps it).
const SWEEP_DUE: usize = HEAP_TAG + 1;
/// How many values an undo copy's restore stored in another entry than their own: ranks a
/// process kept from a scan name entries, and a move makes them out of date (see
/// `SharedDict::evict_ranked`).
const MOVES: usize = SWEEP_DUE + 1;
/// The writer that asked the writer lock for a turn (see `writer.rs`), in its low half as
/// an `AtomicU32`. (A word that files made before it have zero: nobody asked.)
const TURN: usize = MOVES + 1;
/// The writer lock's epoch in steps of a 64th of the entries' count (a power of two)
/// of holds, as the last hold that crossed a step left it: a read of a key already read
/// in this tick stamps it again once this moved (see `recency.rs`). A line of its own
/// (every hold reads it, every reader of a key read before in the tick does). (A word
/// that files made before it have zero.)
const READ_STEP: usize = 64;
const CONTROL_WORDS: usize = crate::shm::format::DICT_CONTROL_SIZE / 8;
const _: () = assert!(TURN < READ_STEP);

/// How long a waiting writer sleeps before it looks at the holder again.
const RECHECK: Duration = Duration::from_millis(10);
/// How many times one operation starts over when a write was refused because a stale
/// writer (one taken over) marked its entry meanwhile.
const RETRIES: usize = 8;

/// A pass over every entry under the writer lock (a recovery, `flush_all`,
/// `flush_expired`) moves the lock's word on after each this many, so that the writers
/// waiting for it do not take a big dict's working holder for a stalled one.
const BEAT_ENTRIES: usize = 4096;

/// The writer lock's world for one writer that wants it: this process's registration,
/// what it saw of the lock's word and since when (a writer waits until it has the lock,
/// so it watches the holder for the whole stall bound itself), and the futex.
struct DictEnv<'a> {
    att: &'a Attachment,
    owner: OwnerId,
    /// (`None` until a holder is watched: an uncontended lock reads no clock)
    seen: std::cell::Cell<Option<(u64, std::time::Instant)>>,
}

impl WriterEnv for DictEnv<'_> {
    fn owner(&self) -> OwnerId {
        self.owner
    }
    fn is_dead(&self, owner: OwnerId) -> bool {
        self.att.is_dead(owner)
    }
    fn stalled(&self, word: u64) -> bool {
        match self.seen.get() {
            Some((w, since)) if w == word => since.elapsed() >= crate::shm::attachment::STALL_BOUND,
            _ => {
                self.seen.set(Some((word, std::time::Instant::now())));
                false
            }
        }
    }
    fn sleep(&self, wait: &AtomicU32, seen: u32) {
        crate::shm::futex::wait(wait, seen, RECHECK);
    }
}

/// What a write under the lock came to.
enum Outcome<T> {
    Done(T),
    /// An entry it needed was marked by a stale writer: start the operation over.
    Retry,
}

impl<T> Outcome<T> {
    fn map<U>(self, f: impl FnOnce(T) -> U) -> Outcome<U> {
        match self {
            Outcome::Done(t) => Outcome::Done(f(t)),
            Outcome::Retry => Outcome::Retry,
        }
    }
}

impl From<Aborted> for Error {
    fn from(_: Aborted) -> Error {
        Error::Stalled { key: None } // (`writing` names the key)
    }
}

/// A value read from the dict, with the flags it was stored with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    /// The value.
    pub value: Value,
    /// The user flags given to [`SharedDict::put`] (0 otherwise).
    pub flags: u32,
}

/// The kind of a stored value (see [`SharedDict::describe`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ValueKind {
    /// Bytes ([`Value::Bytes`]).
    Bytes,
    /// An integer ([`Value::Int`]).
    Int,
    /// A float ([`Value::Float`]).
    Float,
    /// A boolean ([`Value::Bool`]).
    Bool,
    /// A list ([`SharedDict::lpush`] and the rest).
    List,
}

impl ValueKind {
    /// The kind's name as `shmlock inspect` prints it: `bytes`, `int`, `float`, `bool`,
    /// `list`.
    pub fn name(self) -> &'static str {
        match self {
            ValueKind::Bytes => "bytes",
            ValueKind::Int => "int",
            ValueKind::Float => "float",
            ValueKind::Bool => "bool",
            ValueKind::List => "list",
        }
    }
}

/// What [`SharedDict::describe`] tells of a live value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ValueInfo {
    /// Its kind.
    pub kind: ValueKind,
    /// Bytes of a byte value, elements of a list; 8 for a number, 1 for a boolean.
    pub len: usize,
    /// The user flags it was stored with.
    pub flags: u32,
    /// Time left to live; `None`: never expires.
    pub ttl: Option<Duration>,
}

/// A value read by [`SharedDict::get_with`], borrowed for the call, with its flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ItemRef<'a> {
    /// The value.
    pub value: ValueRef<'a>,
    /// The user flags given to [`SharedDict::put`] (0 otherwise).
    pub flags: u32,
}

thread_local! {
    /// The buffer [`SharedDict::get_with`] reads into, reused by every read of the thread.
    static READ_BUF: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// The largest read buffer a thread keeps between reads.
const KEPT_READ_BUF: usize = 64 * 1024;

/// How a store went: like ngx's third return value, `forcible` says a live entry of
/// another key was evicted to make room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stored {
    /// A live entry of another key was evicted (the least recently used of the sample).
    pub forcible: bool,
}

/// The five ways of storing, as ngx names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Put {
    /// Store whatever is there; evict if there is no room.
    Set,
    /// Store whatever is there; [`Error::NoMemory`] if there is no room.
    SafeSet,
    /// Store only if the key has no live value ([`Error::Exists`]); evict if there is no
    /// room.
    Add,
    /// Like `Add`, but [`Error::NoMemory`] instead of evicting.
    SafeAdd,
    /// Store only if the key has a live value ([`Error::NotFound`]).
    Replace,
}

/// How to open a [`SharedDict`]: the layout and permissions of a dict this call creates.
///
/// ```
/// # let path = std::env::temp_dir().join(format!("shmlock-doc-dopts-{}", std::process::id()));
/// # let _ = std::fs::remove_file(&path);
/// use shmlock::SharedDict;
/// let dict = SharedDict::options()
///     .capacity(4096)
///     .max_key_len(64)
///     .max_value_len(1024)
///     .mode(0o660)
///     .open(&path)?;
/// assert_eq!((dict.capacity(), dict.max_key_len(), dict.max_value_len()), (4096, 64, 1024));
/// // Attaching uses the file's own layout, whatever is asked for.
/// assert_eq!(SharedDict::open(&path, 8, 8)?.max_value_len(), 1024);
/// # std::fs::remove_file(&path).unwrap();
/// # Ok::<(), shmlock::Error>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct DictOptions {
    spec: OpenSpec,
    max_key: usize,
    max_value: usize,
    heap: u64,
    zone: Option<u64>,
    entries_given: bool,
}

impl Default for DictOptions {
    fn default() -> Self {
        DictOptions {
            // The layout is set from the lengths in `open`.
            spec: OpenSpec::new(Layout::Locks),
            max_key: 250,
            max_value: 256,
            heap: 0,
            zone: None,
            entries_given: false,
        }
    }
}

impl DictOptions {
    /// How many entries a dict this call creates has room for (default 1024; with
    /// [`zone_size`](Self::zone_size), one per 4 KiB of the zone): the most keys it
    /// holds at once.
    pub fn capacity(mut self, capacity: usize) -> Self {
        self.spec.capacity = capacity as u64;
        self.entries_given = true;
        self
    }

    /// The longest key of a dict this call creates, 1 to 65535 bytes (default 250).
    pub fn max_key_len(mut self, len: usize) -> Self {
        self.max_key = len;
        self
    }

    /// The longest value of a dict this call creates kept in its entry, at most 1 MiB
    /// (default 256): each entry has that much room. Longer values go in the heap, if
    /// the dict has one ([`heap_size`](Self::heap_size)).
    pub fn max_value_len(mut self, len: usize) -> Self {
        self.max_value = len;
        self
    }

    /// Bytes of the heap of a dict this call creates (default 0: none), where values
    /// longer than an entry's room ([`max_value_len`](Self::max_value_len)) are kept, in
    /// blocks of 256 bytes wherever they are free: a value of `n` bytes takes `n / 256`
    /// blocks rounded up, and one more per 62 of those. Such a value may take the whole
    /// heap, up to 64 MiB. With a heap, a store that finds it full evicts the least
    /// recently used values kept there (the `safe_` stores refuse instead,
    /// [`Error::NoMemory`]). A value keeps the one it replaces until it is stored (a
    /// writer killed midway leaves the previous value), so both need room at once; when
    /// only the old one's room can make it, the old one goes first, as ngx does: a writer
    /// killed then, or taken over ([`Error::Stalled`]), leaves the key without a value
    /// (as does, rarely, such a store that a stalled writer's late marks make end in
    /// [`Error::NoMemory`] or start over).
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("shmlock-doc-heap-{}", std::process::id()));
    /// # let _ = std::fs::remove_file(&path);
    /// use shmlock::SharedDict;
    /// use std::time::Duration;
    ///
    /// let dict = SharedDict::options()
    ///     .capacity(1024)
    ///     .max_value_len(64)
    ///     .heap_size(8 << 20)
    ///     .open(&path)?;
    /// assert!(dict.max_value_len() > 8_000_000); // the heap, but for its index blocks
    /// dict.set("page", &vec![b'x'; 100_000][..], Duration::ZERO)?;
    /// assert_eq!(dict.get("page")?.unwrap().value.as_bytes().unwrap().len(), 100_000);
    /// # std::fs::remove_file(&path).unwrap();
    /// # Ok::<(), shmlock::Error>(())
    /// ```
    pub fn heap_size(mut self, bytes: u64) -> Self {
        self.heap = bytes;
        self
    }

    /// Sizes a dict this call creates as nginx sizes a zone (`lua_shared_dict cache 10m`):
    /// its file takes at most `bytes`, and what its entries and fixed parts leave is its
    /// heap ([`heap_size`](Self::heap_size), which is not to be given as well). The
    /// entries are [`capacity`](Self::capacity)'s, or one per 4 KiB of the zone, each
    /// costing its room for a key and a value ([`max_key_len`](Self::max_key_len) and
    /// [`max_value_len`](Self::max_value_len), plus 64 bytes, in whole cache lines) and 8
    /// bytes of filter. Unlike ngx's zone, a dict holds at most that many keys, however
    /// small their values: a zone for many small values (counters, flags) wants a
    /// `capacity` too, and small rooms (and entries of more than 4 KiB each need one). A
    /// zone too small for its entries is [`Error::ZoneTooSmall`], which says what they
    /// need; a zone is at most 64 GiB. What the entries leave, if it could hold no value
    /// longer than an entry's room (a value there takes whole blocks of 256 bytes and an
    /// index block), is no heap at all: the file is then the entries alone. Attaching to
    /// an existing dict keeps its layout, whatever zone is asked.
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("shmlock-doc-zone-{}", std::process::id()));
    /// # let _ = std::fs::remove_file(&path);
    /// use shmlock::SharedDict;
    /// use std::time::Duration;
    ///
    /// let dict = SharedDict::options()
    ///     .zone_size(10 << 20) // 10m
    ///     .max_key_len(32)
    ///     .max_value_len(32)
    ///     .open(&path)?;
    /// assert!(dict.zone_size() <= 10 << 20); // the file's bytes
    /// assert_eq!(dict.capacity(), 2560); // one entry per 4 KiB
    /// assert!(dict.heap_size() > 9 << 20); // the rest
    /// dict.set("page", &vec![b'x'; 1 << 20][..], Duration::ZERO)?;
    /// # std::fs::remove_file(&path).unwrap();
    /// # Ok::<(), shmlock::Error>(())
    /// ```
    pub fn zone_size(mut self, bytes: u64) -> Self {
        self.zone = Some(bytes);
        self
    }

    /// Permission bits of a dict this call creates (default `0o600`; anything beyond
    /// `0o777`, or without owner read and write, is [`Error::InvalidOptions`]).
    pub fn mode(mut self, mode: u32) -> Self {
        self.spec.mode = mode;
        self
    }

    /// How many processes may be attached to a dict this call creates at once (default
    /// 1024, at most 65535); see [`OpenOptions::max_processes`](crate::OpenOptions::max_processes).
    pub fn max_processes(mut self, n: u32) -> Self {
        self.spec.registry = n;
        self
    }

    /// Opens the file for reading only (for inspection): reads work, and every store is
    /// [`Error::ReadOnly`].
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.spec.read_only = read_only;
        self
    }

    /// Whether a missing file is created (default) or an error.
    pub fn create(mut self, create: bool) -> Self {
        self.spec.create = create;
        self
    }

    /// Opens (and maybe creates) the dict at `path`.
    pub fn open(self, path: impl AsRef<Path>) -> Result<SharedDict, Error> {
        let path = path.as_ref();
        if self.zone.is_some() && self.heap > 0 {
            return Err(Error::InvalidOptions(
                "zone_size sizes the heap itself: give zone_size or heap_size, not both",
            ));
        }
        match self.layout() {
            Ok((layout, capacity)) => SharedDict::with_spec(
                path,
                OpenSpec {
                    layout,
                    capacity,
                    ..self.spec
                },
            ),
            // Only a dict this call creates takes the layout asked: an existing one is
            // attached with its own, whatever was asked.
            Err(refused) => {
                let attach = OpenSpec {
                    create: false,
                    layout: Layout::Dict {
                        max_key: 1,
                        max_value: 1,
                        heap_blocks: 0,
                    },
                    ..self.spec
                };
                match SharedDict::with_spec(path, attach) {
                    Err(Error::Io { source, .. })
                        if source.kind() == std::io::ErrorKind::NotFound
                            && self.spec.create
                            && !self.spec.read_only =>
                    {
                        Err(refused)
                    }
                    attached => attached,
                }
            }
        }
    }

    /// The layout and capacity of a dict this call would create, or why it cannot.
    fn layout(&self) -> Result<(Layout, u64), Error> {
        crate::shm::format::check_dict_limits(self.max_key, self.max_value)?;
        let dict = |heap_blocks| Layout::Dict {
            max_key: self.max_key as u32,
            max_value: self.max_value as u32,
            heap_blocks,
        };
        let mut capacity = self.spec.capacity;
        let heap_blocks = if let Some(zone) = self.zone {
            if zone > MAX_ZONE {
                return Err(Error::InvalidLayout("a dict's zone_size is at most 64 GiB"));
            }
            if !self.entries_given {
                if dict(0).slot_size() as u64 + 8 > ZONE_PER_ENTRY {
                    return Err(Error::InvalidLayout(
                        "an entry of these key and value lengths costs more than the 4 KiB of \
                         the zone that zone_size gives each entry: give a capacity too (or \
                         shorter max_key_len and max_value_len)",
                    ));
                }
                capacity = (zone / ZONE_PER_ENTRY).max(1);
            }
            dict(0).check(capacity, self.spec.registry)?;
            let blocks =
                crate::shm::format::heap_for_zone(dict(0), capacity, self.spec.registry, zone)?;
            // What the entries leave may hold no value an entry could not: then no heap
            // (it would be counted free, as `heap_free`, and hold nothing).
            if self.holds_nothing(blocks) {
                0
            } else {
                blocks
            }
        } else {
            let blocks = u32::try_from(self.heap.div_ceil(HEAP_BLOCK as u64))
                .ok()
                .filter(|&b| b < u32::MAX)
                .ok_or(Error::InvalidLayout(
                    "the heap would be larger than a dict can be (64 GiB)",
                ))?;
            if self.holds_nothing(blocks) {
                // A heap that holds no value an entry could not.
                return Err(Error::InvalidLayout(
                    "heap_size is too small to hold a value longer than an entry's room \
                     (max_value_len): a value there takes whole blocks of 256 bytes and an \
                     index block, so give at least max_value_len + 512 bytes (or no heap)",
                ));
            }
            blocks
        };
        Ok((dict(heap_blocks), capacity))
    }

    /// Whether a heap of `blocks` blocks would hold no value an entry could not.
    fn holds_nothing(&self, blocks: u32) -> bool {
        blocks > 0 && longest_heap_value(blocks as usize) <= self.max_value
    }
}

/// The longest value a heap of `blocks` holds: its chain takes data blocks and an index
/// block per 62 of them.
fn longest_heap_value(blocks: usize) -> usize {
    ((blocks - blocks.div_ceil(63)) * HEAP_BLOCK).min(MAX_HEAP_VALUE as usize)
}

/// A key-value cache shared by processes through a memory-mapped file: `lua_shared_dict`
/// for Rust prefork servers.
///
/// Values are bytes or numbers of up to [`max_value_len`](Self::max_value_len) bytes, each
/// with a time to live and 32 user flags. Expired entries read as absent. When a key finds
/// no free slot near its home, [`set`](Self::set) evicts the least recently used entry of a
/// sample and says so ([`Stored::forcible`]); the `safe_` variants refuse instead.
///
/// Reads are lock-free and never see a half-written value, even while a writer in another
/// process rewrites it. Writes are serialized by one writer lock per dict; a writer killed
/// (or stopped for long) in the middle of rewriting a key leaves the key's previous value
/// (and the lock free), never a garbled one: it copied the entry aside first.
///
/// A cheap `Clone` handle; `Send + Sync`.
///
/// ```
/// use shmlock::{Error, SharedDict, Value};
/// use std::time::Duration;
///
/// # let path = std::env::temp_dir().join(format!("shmlock-doc-dict-{}", std::process::id()));
/// # let _ = std::fs::remove_file(&path);
/// let dict = SharedDict::open(&path, 1024, 64)?;
/// dict.set("dog", "bark", Duration::ZERO)?;       // zero: never expires
/// assert_eq!(dict.get("dog")?.unwrap().value, Value::Bytes(b"bark".to_vec()));
///
/// assert!(matches!(dict.add("dog", "woof", Duration::ZERO), Err(Error::Exists { .. })));
/// assert_eq!(dict.incr("hits", 1, Some(0), Duration::from_secs(60))?, 1);
/// assert!(matches!(dict.incr("dog", 1, None, Duration::ZERO), Err(Error::NotANumber { .. })));
/// assert!(matches!(dict.set("big", &[0u8; 65][..], Duration::ZERO),
///                  Err(Error::ValueTooLong { len: 65, max: 64, .. })));
/// # std::fs::remove_file(&path).unwrap();
/// # Ok::<(), shmlock::Error>(())
/// ```
#[derive(Clone)]
pub struct SharedDict {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SharedDict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedDict")
            .field("path", &self.inner.path)
            .field("capacity", &self.capacity())
            .field("max_key_len", &self.max_key_len())
            .field("max_value_len", &self.max_value_len())
            .finish()
    }
}

struct Inner {
    att: Attachment,
    header: Header,
    geometry: Geometry,
    slots: usize,
    /// The writer lock's epochs per `READ_STEP` step, as a shift (see `recency::step_shift`).
    step_shift: u32,
    path: PathBuf,
    created: bool,
    /// The heap's values by rank from this process's last scan of the dict (see
    /// [`SharedDict::evict_ranked`]).
    ranked: std::sync::Mutex<Ranked>,
    /// The heap's map word after this process's last take: the next one looks from there
    /// (where blocks were last found free, or freed by evictions).
    heap_hint: std::sync::atomic::AtomicUsize,
}

impl SharedDict {
    /// Attaches to the dict at `path`, creating it with room for `capacity` entries whose
    /// values are at most `max_value_len` bytes (keys at most 250) if it does not exist.
    /// Creation is atomic: of many processes opening a new path at once, all end up on one
    /// dict. Attaching uses the file's own layout.
    pub fn open(
        path: impl AsRef<Path>,
        capacity: usize,
        max_value_len: usize,
    ) -> Result<SharedDict, Error> {
        SharedDict::options()
            .capacity(capacity)
            .max_value_len(max_value_len)
            .open(path)
    }

    /// Options for opening a dict.
    pub fn options() -> DictOptions {
        DictOptions::default()
    }

    fn with_spec(path: &Path, spec: OpenSpec) -> Result<SharedDict, Error> {
        let opened = file::open(path, spec)?;
        let header = opened.header;
        let Layout::Dict {
            max_key,
            max_value,
            heap_blocks,
        } = header.layout
        else {
            unreachable!("file::open checked the kind");
        };
        let entry_words = header.layout.slot_size() / 8;
        let heap_blocks = heap_blocks as usize;
        let max_heap = longest_heap_value(heap_blocks);
        let slots = header.slot_count as usize;
        // after the entries, the two undo copies and the home filters
        let heap_map = CONTROL_WORDS
            + (slots + JOURNALS) * entry_words
            + (crate::shm::format::dict_filters_len(slots as u64) / 8) as usize;
        let heap_data = heap_map + (heap_map_len(heap_blocks as u32) / 8) as usize;
        let max_heap = if max_heap > max_value as usize {
            max_heap
        } else {
            0
        };
        let geometry = Geometry::new(entry_words, max_key as usize, max_value as usize).with_heap(
            max_heap,
            heap_map,
            heap_data,
            heap_blocks,
        );
        let att = Attachment::new(
            Arc::new(opened.map),
            opened.file,
            opened.id,
            path.to_path_buf(),
            opened.pin,
            true,
        );
        Ok(SharedDict {
            inner: Arc::new(Inner {
                att,
                header,
                geometry,
                slots,
                step_shift: recency::step_shift(slots),
                path: path.to_path_buf(),
                created: opened.created,
                ranked: Default::default(),
                heap_hint: Default::default(),
            }),
        })
    }

    /// How many entries fit (fixed when the file was created).
    pub fn capacity(&self) -> usize {
        self.inner.slots
    }

    /// The longest key (fixed when the file was created).
    pub fn max_key_len(&self) -> usize {
        self.inner.geometry.max_key
    }

    /// The longest value (fixed when the file was created): the room of an entry, or, for
    /// a dict with a heap, the longest value the heap keeps (as long as the heap, but for
    /// its index blocks; at most 64 MiB).
    pub fn max_value_len(&self) -> usize {
        self.inner
            .geometry
            .max_value
            .max(self.inner.geometry.max_heap)
    }

    /// The longest value kept in an entry itself (fixed when the file was created);
    /// longer ones go in the heap.
    pub fn entry_value_len(&self) -> usize {
        self.inner.geometry.max_value
    }

    /// Bytes of the whole file (fixed when it was created): at most the
    /// [`zone_size`](DictOptions::zone_size) it was created with.
    pub fn zone_size(&self) -> u64 {
        self.inner.header.file_len()
    }

    /// Bytes of the heap (fixed when the file was created; 0: none).
    pub fn heap_size(&self) -> u64 {
        (self.inner.geometry.heap_blocks * HEAP_BLOCK) as u64
    }

    /// Bytes of the heap free now: ngx's `free_space`, for the values longer than an
    /// entry's room. A value of `n` bytes needs `n` rounded up to 256, and 256 more per
    /// 62 blocks of those. Blocks that a writer killed in the middle of a store had
    /// taken count as free once the next write has taken its lock over (a sweep runs
    /// then), unless a writer taken over is still alive in the middle of its own store:
    /// then once a later sweep can run (`flush_expired` runs one, and so does a store
    /// that finds the heap short).
    pub fn heap_free(&self) -> u64 {
        (self.heap().free_blocks() * HEAP_BLOCK) as u64
    }

    /// Entries stored, counting expired ones not yet removed (as ngx's memory use does);
    /// [`flush_expired`](Self::flush_expired) removes those.
    pub fn len(&self) -> usize {
        (count_of(self.control(LEN).load(Ordering::Relaxed)) as usize).min(self.capacity())
    }

    /// Whether no entry is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Slots not holding an entry: ngx's `free_space`, counted in entries. A key can use
    /// only those within 64 slots of its home, so a store that evicts nothing
    /// ([`safe_set`](Self::safe_set)) may be refused while this is not 0 (a table filled
    /// with distinct keys holds about 96 % of its capacity before stores evict).
    pub fn free_slots(&self) -> usize {
        self.capacity() - self.len()
    }

    /// How many live entries stores have evicted since the file was created.
    pub fn evictions(&self) -> u64 {
        self.control(EVICTIONS).load(Ordering::Relaxed)
    }

    /// What every process did with this dict since its file was made (reads that hit and
    /// missed, stores, evictions), and what it holds now (see
    /// [`DictStats`](crate::stats::DictStats)). Looks at every entry for the bytes in use.
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("shmlock-doc-dstats-{}", std::process::id()));
    /// use shmlock::SharedDict;
    /// use std::time::Duration;
    ///
    /// let dict = SharedDict::open(&path, 64, 16)?;
    /// dict.set("k", "value", Duration::ZERO)?;
    /// dict.get("k")?;
    /// dict.get("absent")?;
    /// let s = dict.stats();
    /// assert_eq!((s.hits, s.misses, s.sets, s.entries, s.bytes_in_use), (1, 1, 1, 1, 6));
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stats(&self) -> crate::stats::DictStats {
        let t = self.counters().totals();
        let evictions = self.evictions();
        let g = &self.inner.geometry;
        crate::stats::DictStats {
            hits: t[counters::HITS],
            misses: t[counters::MISSES],
            sets: t[counters::SETS],
            evictions,
            forcible_sets: evictions,
            entries: self.len() as u64,
            capacity: self.capacity() as u64,
            bytes_in_use: (0..self.inner.slots)
                .map(|i| self.entry(i).stored_bytes())
                .sum(),
            bytes_capacity: (self.capacity() * (g.max_key + g.max_value)) as u64 + self.heap_size(),
            heap_bytes: self.heap_size(),
            heap_free: self.heap_free(),
        }
    }

    fn counters(&self) -> Cells<'_> {
        Cells::of(&self.inner.att.map)
    }

    /// Counts a store, in the thread's cell.
    fn count_set(&self) {
        let att = &self.inner.att;
        counters::count(att.map_id(), &att.map, Fast::Set);
    }

    /// Counts a read, in the thread first (reads are the fast path: see `counters`).
    #[inline]
    fn count_read(&self, hit: bool) {
        let att = &self.inner.att;
        if att.read_only() {
            return; // its mapping cannot be written: a count there would fault
        }
        let event = if hit { Fast::Hit } else { Fast::Miss };
        counters::count(att.map_id(), &att.map, event);
    }

    /// How many times a writer took the writer lock over from a writer that died or
    /// stalled past the bound, and recovered after it.
    pub fn repairs(&self) -> u64 {
        self.control(REPAIRS).load(Ordering::Relaxed)
    }

    /// The pid of the process that holds the writer lock right now, if any (a snapshot;
    /// 0 when the registry does not know it, or it is in another pid namespace). Writers
    /// hold it for one copy.
    pub fn writer_pid(&self) -> Option<u32> {
        let owner = self.writer_lock().holder()?;
        let here = crate::shm::process::pid_namespace();
        Some(
            self.inner
                .att
                .identity(owner, None)
                .filter(|id| id.pid_ns == here || id.pid_ns == 0 || here == 0)
                .map_or(0, |id| id.pid),
        )
    }

    /// Whether the process holding the writer lock right now lives (`None`: nobody holds
    /// it). `Some(false)`: it died holding it, on the kernel's word, and the next write
    /// takes the lock over (the value it was writing keeps its previous one).
    pub fn writer_alive(&self) -> Option<bool> {
        let owner = self.writer_lock().holder()?;
        Some(!self.inner.att.is_dead_now(owner, None))
    }

    /// The file this dict lives in.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Whether this handle's `open` created the file.
    pub fn created(&self) -> bool {
        self.inner.created
    }

    // -----------------------------------------------------------------------------------
    // Reads

    /// The live value of `key`, or `None` if it has none (absent or expired).
    pub fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<Item>, Error> {
        let item = self.get_uncounted(key.as_ref())?;
        self.count_read(item.is_some());
        Ok(item)
    }

    /// [`get`](Self::get) that counts neither a hit nor a miss: `get_or_fetch`'s looks
    /// after its first, which counted the call's one.
    #[inline(always)]
    pub(crate) fn get_uncounted(&self, key: &[u8]) -> Result<Option<Item>, Error> {
        let k = self.pack(key)?;
        let mut value = Vec::new();
        Ok(self.read_live(&k, &mut value)?.map(|c| Item {
            value: Value::decode(c.kind, value),
            flags: c.flags,
        }))
    }

    /// Like [`get`](Self::get), but hands the value to `f` instead of returning an owned
    /// copy: the bytes are copied out of the shared memory into a buffer this thread reuses
    /// (a lock-free read must copy before it can tell that no writer changed them), so a
    /// read allocates nothing once the buffer has grown to the values read. `f` runs after
    /// the read, outside every lock; what it returns is returned.
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("shmlock-doc-getwith-{}", std::process::id()));
    /// # let _ = std::fs::remove_file(&path);
    /// use shmlock::{SharedDict, ValueRef};
    /// use std::time::Duration;
    ///
    /// let dict = SharedDict::open(&path, 64, 64)?;
    /// dict.set("page", "<html>…</html>", Duration::ZERO)?;
    /// let len = dict.get_with("page", |item| match item.value {
    ///     ValueRef::Bytes(b) => b.len(),
    ///     _ => 0,
    /// })?;
    /// assert_eq!(len, Some("<html>…</html>".len()));
    /// assert_eq!(dict.get_with("other", |_| ())?, None);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn get_with<R>(
        &self,
        key: impl AsRef<[u8]>,
        f: impl FnOnce(ItemRef<'_>) -> R,
    ) -> Result<Option<R>, Error> {
        let k = self.pack(key.as_ref())?;
        let read = |buf: &mut Vec<u8>| -> Result<Option<R>, Error> {
            let found = self.read_live(&k, buf)?;
            self.count_read(found.is_some());
            Ok(found.map(|c| {
                f(ItemRef {
                    value: ValueRef::decode(c.kind, buf),
                    flags: c.flags,
                })
            }))
        };
        // (taken out while in use: a read inside `f` finds it empty and uses its own)
        let mut buf = READ_BUF.try_with(Cell::take).unwrap_or_default();
        let found = read(&mut buf);
        if buf.capacity() <= KEPT_READ_BUF {
            let _ = READ_BUF.try_with(|b| b.set(buf)); // (fails only as the thread exits)
        }
        found
    }

    /// The live value of `k` into `value`, with its kind and flags: marks the entry used
    /// (the caller counts the read).
    #[inline(always)]
    fn read_live(&self, k: &PackedKey, value: &mut Vec<u8>) -> Result<Option<Copied>, Error> {
        let mut c = Copied::NONE;
        // (the clock first: its call overlaps the lookup's loads, 3 ns less a hit, where a
        // miss, which needs no clock, pays 3 ns more)
        let now = self.now();
        // (a dict replaced under its path holds what the others no longer read or write)
        self.inner.att.look_at_path(now)?;
        let at = self.lookup(k, Some(value), &mut c);
        let found = match at.map(|i| (i, now)) {
            Some((_, now)) if c.deadline > now && c.kind == Kind::List => {
                return Err(Error::IsAList { key: k.preview() })
            }
            Some((i, now)) if c.deadline > now => {
                self.touch(i, now);
                Some(c)
            }
            _ => None,
        };
        Ok(found)
    }

    /// Like [`get`](Self::get), but an expired value that is still stored is returned too,
    /// flagged `true` (stale), as ngx's `get_stale` does.
    pub fn get_stale(&self, key: impl AsRef<[u8]>) -> Result<Option<(Item, bool)>, Error> {
        let k = self.pack(key.as_ref())?;
        let now = self.now();
        self.inner.att.look_at_path(now)?;
        let mut value = Vec::new();
        let mut c = Copied::NONE;
        let found = match self.lookup(&k, Some(&mut value), &mut c) {
            Some(_) if c.kind == Kind::List => return Err(Error::IsAList { key: k.preview() }),
            found => found.map(|i| {
                self.touch(i, now);
                let stale = c.deadline <= now;
                let item = Item {
                    value: Value::decode(c.kind, value),
                    flags: c.flags,
                };
                (item, stale)
            }),
        };
        // (a stale value is no hit: the counters count reads that found a live value)
        self.count_read(found.as_ref().is_some_and(|(_, stale)| !stale));
        Ok(found)
    }

    /// Time left to live of `key`'s value: `None` if it never expires,
    /// [`Error::NotFound`] if there is no live value.
    pub fn ttl(&self, key: impl AsRef<[u8]>) -> Result<Option<Duration>, Error> {
        let key = key.as_ref();
        let k = self.pack(key)?;
        let now = self.now();
        self.inner.att.look_at_path(now)?;
        let mut c = Copied::NONE;
        let found = self.lookup(&k, None, &mut c);
        if let Some(i) = found.filter(|_| c.deadline > now) {
            self.touch(i, now); // (ngx's look-up makes the key the most recently used)
        }
        match found {
            Some(_) if c.deadline == u64::MAX => Ok(None),
            Some(_) if c.deadline > now => Ok(Some(Duration::from_nanos(c.deadline - now))),
            _ => Err(Error::NotFound {
                key: KeyPreview::new(key),
            }),
        }
    }

    /// What `key`'s live value is, without handing it out: its kind, its length (bytes of
    /// a byte value, elements of a list; 8 for a number, 1 for a boolean), its flags and
    /// its time to live. `None` if it has no live value. For inspection (`shmlock inspect`
    /// lists this for every key).
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("shmlock-doc-describe-{}", std::process::id()));
    /// # let _ = std::fs::remove_file(&path);
    /// use shmlock::{SharedDict, ValueKind};
    /// use std::time::Duration;
    ///
    /// let dict = SharedDict::open(&path, 64, 64)?;
    /// dict.rpush("jobs", "a")?;
    /// dict.rpush("jobs", "b")?;
    /// let info = dict.describe("jobs")?.unwrap();
    /// assert_eq!((info.kind, info.len, info.ttl), (ValueKind::List, 2, None));
    /// assert_eq!(dict.describe("absent")?, None);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn describe(&self, key: impl AsRef<[u8]>) -> Result<Option<ValueInfo>, Error> {
        let k = self.pack(key.as_ref())?;
        let mut value = Vec::new();
        let mut c = Copied::NONE;
        let now = self.now();
        self.inner.att.look_at_path(now)?;
        if self.lookup(&k, Some(&mut value), &mut c).is_none() || c.deadline <= now {
            return Ok(None);
        }
        let (kind, len) = match c.kind {
            Kind::Bytes => (ValueKind::Bytes, value.len()),
            Kind::Int => (ValueKind::Int, value.len()),
            Kind::Float => (ValueKind::Float, value.len()),
            Kind::Bool => (ValueKind::Bool, value.len()),
            Kind::List => (ValueKind::List, super::value::List::new(value).len()),
        };
        Ok(Some(ValueInfo {
            kind,
            len,
            flags: c.flags,
            ttl: (c.deadline != u64::MAX).then(|| Duration::from_nanos(c.deadline - now)),
        }))
    }

    /// Up to `max` keys with live values (0: all), in table order. Like ngx, this reads
    /// the whole table: not for a hot path.
    pub fn keys(&self, max: usize) -> Result<Vec<Vec<u8>>, Error> {
        let now = self.now();
        self.inner.att.look_at_path(now)?;
        let mut out = Vec::new();
        for i in 0..self.capacity() {
            if max != 0 && out.len() >= max {
                break;
            }
            let found = self.read_stable(i, None, |e| e.read_key());
            if let Some((key, deadline)) = found {
                if deadline > now {
                    out.push(key);
                }
            }
        }
        Ok(out)
    }

    // -----------------------------------------------------------------------------------
    // Writes

    /// Stores `value` under `key` for `ttl` (zero: never expires), whatever was there.
    /// Evicts the least recently used entry of the key's neighbourhood if there is no room.
    pub fn set<'v>(
        &self,
        key: impl AsRef<[u8]>,
        value: impl Into<ValueRef<'v>>,
        ttl: Duration,
    ) -> Result<Stored, Error> {
        self.put(Put::Set, key, value, ttl, 0)
    }

    /// [`set`](Self::set) that never evicts: [`Error::NoMemory`] instead.
    pub fn safe_set<'v>(
        &self,
        key: impl AsRef<[u8]>,
        value: impl Into<ValueRef<'v>>,
        ttl: Duration,
    ) -> Result<Stored, Error> {
        self.put(Put::SafeSet, key, value, ttl, 0)
    }

    /// Stores only if `key` has no live value, else [`Error::Exists`]. May evict.
    pub fn add<'v>(
        &self,
        key: impl AsRef<[u8]>,
        value: impl Into<ValueRef<'v>>,
        ttl: Duration,
    ) -> Result<Stored, Error> {
        self.put(Put::Add, key, value, ttl, 0)
    }

    /// [`add`](Self::add) that never evicts: [`Error::NoMemory`] instead.
    pub fn safe_add<'v>(
        &self,
        key: impl AsRef<[u8]>,
        value: impl Into<ValueRef<'v>>,
        ttl: Duration,
    ) -> Result<Stored, Error> {
        self.put(Put::SafeAdd, key, value, ttl, 0)
    }

    /// Stores only if `key` has a live value, else [`Error::NotFound`].
    pub fn replace<'v>(
        &self,
        key: impl AsRef<[u8]>,
        value: impl Into<ValueRef<'v>>,
        ttl: Duration,
    ) -> Result<Stored, Error> {
        self.put(Put::Replace, key, value, ttl, 0)
    }

    /// The general store, with ngx's user `flags` (read back in [`Item::flags`]).
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("shmlock-doc-put-{}", std::process::id()));
    /// # let _ = std::fs::remove_file(&path);
    /// use shmlock::{Put, SharedDict};
    /// use std::time::Duration;
    ///
    /// let dict = SharedDict::open(&path, 64, 16)?;
    /// dict.put(Put::Set, "k", "v", Duration::from_secs(10), 0xbeef)?;
    /// assert_eq!(dict.get("k")?.unwrap().flags, 0xbeef);
    /// # std::fs::remove_file(&path).unwrap();
    /// # Ok::<(), shmlock::Error>(())
    /// ```
    pub fn put<'v>(
        &self,
        how: Put,
        key: impl AsRef<[u8]>,
        value: impl Into<ValueRef<'v>>,
        ttl: Duration,
        flags: u32,
    ) -> Result<Stored, Error> {
        let key = key.as_ref();
        let k = self.pack(key)?;
        let mut int = [0u8; 8];
        let (kind, bytes) = self.encode(&k, value.into(), &mut int)?;
        self.writing(Some(&k), |w| {
            let now = w.now.get();
            let until = deadline(now, ttl_ns(ttl));
            let existing = self.find_locked(w, &k);
            let live = existing.as_ref().is_some_and(|(_, d)| *d > now);
            match (how, existing) {
                (Put::Add | Put::SafeAdd, Some((i, _))) if live => {
                    self.used(w, i, now);
                    return Err(Error::Exists {
                        key: KeyPreview::new(key),
                    });
                }
                (Put::Replace, _) if !live => {
                    return Err(Error::NotFound {
                        key: KeyPreview::new(key),
                    })
                }
                _ => {}
            }
            let (i, stored) = match existing {
                Some((i, _)) => (i, Stored { forcible: false }),
                None => self.place(w, &k, now, matches!(how, Put::Set | Put::Add))?,
            };
            let room = match how {
                Put::Set | Put::Add | Put::Replace => Room::Evict,
                _ => Room::Expired,
            };
            let written =
                self.write(self.store_at(w, i, &k, (kind, bytes), flags, until, now, room)?)?;
            if matches!(written, Outcome::Done(())) {
                self.count_set();
            }
            Ok(written.map(|()| Stored {
                forcible: stored.forcible || w.evicted.get(),
            }))
        })
    }

    /// Adds `by` to the number under `key` and returns the sum, keeping the value's time to
    /// live. With no live value: [`Error::NotFound`] if `init` is `None`, else stores
    /// `init + by` for `init_ttl` (zero: never expires), evicting if need be.
    /// [`Error::NotANumber`] if the value is not a number. An `init_ttl` without an `init`
    /// is [`Error::InvalidOptions`], as ngx refuses it: it would apply to nothing.
    ///
    /// `by` is an `i64` or an `f64` ([`Number`]). Integers add up to an integer, wrapping
    /// on overflow; an `f64` increment makes the value a float, as in ngx (whose numbers
    /// are all doubles); an `i64` increment of a float value is [`Error::NotAnInteger`]
    /// (nothing changes: add an `f64`).
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("shmlock-doc-incr-{}", std::process::id()));
    /// # let _ = std::fs::remove_file(&path);
    /// use shmlock::{SharedDict, Value};
    /// use std::time::Duration;
    ///
    /// let dict = SharedDict::open(&path, 64, 16)?;
    /// assert_eq!(dict.incr("hits", 1, Some(0), Duration::ZERO)?, 1);
    /// assert_eq!(dict.incr("hits", 0.5, None, Duration::ZERO)?, 1.5);
    /// assert_eq!(dict.get("hits")?.unwrap().value, Value::Float(1.5));
    /// assert!(dict.incr("hits", 1, None, Duration::ZERO).is_err()); // a float now
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn incr<N: Number>(
        &self,
        key: impl AsRef<[u8]>,
        by: N,
        init: Option<N>,
        init_ttl: Duration,
    ) -> Result<N, Error> {
        let key = key.as_ref();
        let k = self.pack(key)?;
        if init.is_none() && !init_ttl.is_zero() {
            return Err(Error::InvalidOptions(
                "incr: an init_ttl needs an init (the value it would apply to)",
            ));
        }
        if self.max_value_len() < 8 {
            return Err(Error::ValueTooLong {
                key: k.preview(),
                len: 8,
                max: self.max_value_len(),
            });
        }
        self.writing(Some(&k), |w| {
            let now = w.now.get();
            let mut value = Vec::new();
            let existing = self.lookup_locked(w, &k, Some(&mut value));
            let (i, sum, until, flags) = match existing {
                Some((i, c)) if c.deadline > now => {
                    let flags = c.flags;
                    let Some(n) = Num::of(&Value::decode(c.kind, value)) else {
                        self.used(w, i, now);
                        return Err(Error::NotANumber { key: k.preview() });
                    };
                    (i, n.add(by.num()), c.deadline, flags)
                }
                existing => {
                    let init = init.ok_or_else(|| Error::NotFound {
                        key: KeyPreview::new(key),
                    })?;
                    let i = match existing {
                        Some((i, _)) => i,
                        None => self.place(w, &k, now, true)?.0,
                    };
                    let sum = init.num().add(by.num());
                    (i, sum, deadline(now, ttl_ns(init_ttl)), 0)
                }
            };
            let Some(result) = N::of_sum(sum) else {
                // (only ever a float value found: an init and its increment are of one type)
                if existing.is_some_and(|(_, c)| c.deadline > now) {
                    self.used(w, i, now);
                }
                return Err(Error::NotAnInteger { key: k.preview() });
            };
            let mut buf = [0u8; 8];
            let (kind, bytes) = sum.value_ref().encode(&mut buf);
            let stored = self.store_at(w, i, &k, (kind, bytes), flags, until, now, Room::Evict)?;
            let written = self.write(stored)?;
            if matches!(written, Outcome::Done(())) {
                self.count_set();
            }
            Ok(written.map(|()| result))
        })
    }

    /// Sets a new time to live on `key`'s live value (zero: never expires), or
    /// [`Error::NotFound`].
    pub fn expire(&self, key: impl AsRef<[u8]>, ttl: Duration) -> Result<(), Error> {
        let key = key.as_ref();
        let k = self.pack(key)?;
        self.writing(Some(&k), |w| {
            let now = w.now.get();
            match self.find_locked(w, &k) {
                Some((i, d)) if d > now => {
                    self.used(w, i, now);
                    let until = deadline(now, ttl_ns(ttl));
                    let done = self
                        .entry(i)
                        .set_deadline(&w.writing, Some(&self.keep(i)), until);
                    self.write(done)
                }
                _ => Err(Error::NotFound {
                    key: KeyPreview::new(key),
                }),
            }
        })
    }

    /// Removes `key`'s entry. Returns whether it had a live value.
    pub fn delete(&self, key: impl AsRef<[u8]>) -> Result<bool, Error> {
        let k = self.pack(key.as_ref())?;
        self.writing(Some(&k), |w| {
            let now = w.now.get();
            match self.find_locked(w, &k) {
                Some((i, d)) => {
                    Ok(self
                        .write(self.free_at(w, i, Some(&self.keep(i))))?
                        .map(|()| {
                            self.uncount(w, 1);
                            self.gone(w, self.home(&k));
                            d > now
                        }))
                }
                None => Ok(Outcome::Done(false)),
            }
        })
    }

    /// Makes every entry expired, as ngx's `flush_all` does: reads miss at once, and
    /// [`flush_expired`](Self::flush_expired) frees the slots. (A writer taken over midway,
    /// having stalled past the bound, stops where it was.) `Err(ReadOnly)` on a read-only
    /// handle.
    pub fn flush_all(&self) -> Result<(), Error> {
        self.writing(None, |w| {
            self.control(FLUSHED).store(1, Ordering::Relaxed);
            for i in 0..self.capacity() {
                // (a dict of millions of entries takes longer than the stall bound)
                if i % BEAT_ENTRIES == BEAT_ENTRIES - 1 && !self.beat(w) {
                    return Err(Error::Stalled { key: None });
                }
                let e = self.entry(i);
                if e.is_stable() && e.is_used() && e.deadline() != 0 {
                    if let Outcome::Retry =
                        self.write(e.set_deadline(&w.writing, Some(&self.keep(i)), 0))?
                    {
                        return Ok(Outcome::Retry);
                    }
                }
            }
            Ok(Outcome::Done(()))
        })
    }

    /// Removes up to `max` expired entries (0: all) and returns how many it removed.
    /// `Err(ReadOnly)` on a read-only handle.
    pub fn flush_expired(&self, max: usize) -> Result<usize, Error> {
        self.writing(None, |w| {
            let now = w.now.get();
            let mut removed = 0;
            // (every expired entry freed: `flush_all`'s are gone)
            let mut all = max == 0;
            for i in 0..self.capacity() {
                if max != 0 && removed >= max {
                    break;
                }
                if i % BEAT_ENTRIES == BEAT_ENTRIES - 1 && !self.beat(w) {
                    all = false; // taken over: what is left is the next holder's
                    break;
                }
                let e = self.entry(i);
                if e.is_used() && e.deadline() <= now {
                    if !e.is_stable() {
                        all = false;
                        continue;
                    }
                    let home = self.home_of(e.hash());
                    match self.free_at(w, i, None) {
                        Ok(()) => {
                            removed += 1;
                            self.gone(w, home);
                        }
                        Err(Aborted::NotStable) => all = false,
                        Err(Aborted::TakenOver) => {
                            all = false;
                            break;
                        }
                    }
                }
            }
            self.uncount(w, removed as u64);
            if all {
                self.control(FLUSHED).store(0, Ordering::Relaxed);
            }
            self.sweep_if_due(w);
            Ok(Outcome::Done(removed))
        })
    }

    // -----------------------------------------------------------------------------------
    // Internals

    fn now(&self) -> u64 {
        Monotonic.now()
    }

    #[inline(always)]
    fn pack<'k>(&self, key: &'k [u8]) -> Result<PackedKey<'k>, Error> {
        crate::shm::process::check_clock()?;
        if key.is_empty() {
            return Err(Error::EmptyKey);
        }
        if key.len() > self.max_key_len() {
            return Err(crate::key::too_long(key, self.max_key_len()));
        }
        let hash = xxhash_rust::xxh3::xxh3_64_with_seed(key, self.inner.header.seed);
        Ok(PackedKey::new(key, hash))
    }

    /// The kind and bytes to store; a number's bytes go in `buf`, so nothing allocates.
    fn encode<'v>(
        &self,
        k: &PackedKey,
        value: ValueRef<'v>,
        buf: &'v mut [u8; 8],
    ) -> Result<(Kind, &'v [u8]), Error> {
        let (kind, bytes) = value.encode(buf);
        if bytes.len() > self.max_value_len() {
            return Err(Error::ValueTooLong {
                key: k.preview(),
                len: bytes.len(),
                max: self.max_value_len(),
            });
        }
        Ok((kind, bytes))
    }

    fn words(&self) -> &[AtomicU64] {
        self.inner.att.map.words()
    }

    fn control(&self, word: usize) -> &AtomicU64 {
        &self.words()[word]
    }

    fn writer_lock(&self) -> WriterLock<'_> {
        let wait = &self.words()[WAIT];
        // SAFETY: the control page's WAIT word is only ever accessed as this one AtomicU32
        // (its low half, in every process), so there are no mixed-size accesses; the
        // pointer is 8-byte aligned, in bounds, and lives as long as `self`'s mapping.
        let wait = unsafe { AtomicU32::from_ptr(wait.as_ptr().cast::<u32>()) };
        let turn = &self.words()[TURN];
        // SAFETY: as WAIT's, for the control page's TURN word.
        let turn = unsafe { AtomicU32::from_ptr(turn.as_ptr().cast::<u32>()) };
        WriterLock {
            word: &self.words()[WRITER],
            wait,
            turn,
        }
    }

    /// Moves the lock's word on (see [`Writing::heartbeat`]), for a hold that works long:
    /// the writers waiting for it see that it is not stalled. `false` if it was taken over.
    fn beat(&self, w: &Locked<'_>) -> bool {
        let beat = w.writing.heartbeat();
        if beat {
            self.note_step(w.writing.epoch()); // (a heartbeat moves the epoch on)
        }
        beat
    }

    /// [`beat`](Self::beat) after a step over a value of `len` bytes that may have taken
    /// a while (a list's copy, read or rewritten whole); a short one moves nothing.
    fn beat_if_big(&self, w: &Locked<'_>, len: usize) {
        if len >= super::heap::BEAT_BYTES {
            self.beat(w);
        }
    }

    /// Writes the step of lock epoch `epoch` to `READ_STEP`, if it moved on.
    fn note_step(&self, epoch: u32) {
        let step = recency::step_of(epoch, self.inner.step_shift);
        if self.control(READ_STEP).load(Ordering::Relaxed) != step {
            self.control(READ_STEP).store(step, Ordering::Relaxed);
        }
    }

    /// Marks entry `i` read now (its LRU stamp), unless this handle is read-only.
    fn touch(&self, i: usize, now: u64) {
        if !self.inner.att.read_only() {
            let e = self.entry(i);
            let old = e.used_at();
            if recency::read_in_tick(old, now)
                && recency::in_step(
                    old,
                    self.control(READ_STEP).load(Ordering::Relaxed),
                    self.inner.step_shift,
                )
            {
                return;
            }
            let epoch = self.writer_lock().epoch();
            e.touch(recency::of_read(now, epoch));
        }
    }

    /// Marks entry `i` used by a writer's operation that found its key but stored nothing
    /// (an `add` of a present key, an `expire`, an `incr` or a push refused for the
    /// value's kind): ngx's look-up makes such a key the most recently used too.
    fn used(&self, w: &Locked<'_>, i: usize, now: u64) {
        self.entry(i).touch(w.stamp(now));
    }

    /// Takes the writer lock, recovering after a writer that died or stalled holding it.
    fn write_lock(&self) -> Result<Locked<'_>, Error> {
        Ok(self.lock_as(self.writer()?))
    }

    /// [`Error::ReadOnly`] for a read-only handle.
    pub(crate) fn refuse_read_only(&self) -> Result<(), Error> {
        if self.inner.att.read_only() {
            return Err(Error::ReadOnly);
        }
        Ok(())
    }

    /// The owner id this process writes as: [`Error::ReadOnly`] for a read-only handle.
    fn writer(&self) -> Result<OwnerId, Error> {
        if self.inner.att.read_only() {
            return Err(Error::ReadOnly);
        }
        self.inner.att.owner()
    }

    /// [`write_lock`](Self::write_lock) for `owner`. Inlined, and not wrapped in a
    /// `Result`: a `Locked` moved out of a result or a call's return is read back in wider
    /// loads than the stores that built it, which stalled on store forwarding (a tenth of
    /// a `set`).
    #[inline(always)]
    fn lock_as(&self, owner: OwnerId) -> Locked<'_> {
        let env = DictEnv {
            att: &self.inner.att,
            owner,
            seen: std::cell::Cell::new(None),
        };
        let ops = self.count_op(owner);
        let (writing, took_over) = self.writer_lock().lock(&env);
        let heap_tag = if self.inner.geometry.heap_blocks == 0 {
            0
        } else if took_over {
            // Before anything moves: a sweep the writer taken over began frees nothing
            // after this (see `heap.rs`).
            let tag = self.new_heap_tag(self.control(HEAP_TAG).load(Ordering::Acquire) as u32);
            self.control(SWEEP_DUE).fetch_add(1, Ordering::AcqRel);
            tag
        } else {
            self.control(HEAP_TAG).load(Ordering::Acquire) as u32
        };
        self.note_step(writing.epoch());
        let w = Locked {
            epoch: writing.epoch(),
            writing,
            heap_tag: std::cell::Cell::new(heap_tag),
            _ops: ops,
            evicted: std::cell::Cell::new(false),
            restoring: std::cell::Cell::new(false),
            going: Spot::none(),
            placed: std::cell::Cell::new(0),
            recovering: std::cell::Cell::new(false),
            pass_at: Spot::none(),
            behind: std::cell::Cell::new(0),
            now: std::cell::Cell::new(0),
        };
        if took_over {
            // Before the recount: a writer taken over changes the count no more. (A hold
            // that took the lock free tags the count at its first change of it.)
            self.update_len(&w, |count| count);
        }
        // The undo copy first: the entry it covers must get its value back before any
        // write looks for room or for the key.
        self.settle_journal(&w);
        if took_over {
            self.recover(&w);
        }
        w.now.set(self.now());
        w
    }

    /// The undo copies (see `journal.rs`): two control words each, and the slots after
    /// the last entry.
    fn journals(&self) -> Journals<'_> {
        let words = self.inner.geometry.entry_words;
        let at = CONTROL_WORDS + self.capacity() * words;
        Journals {
            control: &self.words()[JOURNAL..JOURNAL + 2 * JOURNALS],
            copies: &self.words()[at..at + JOURNALS * words],
            geometry: &self.inner.geometry,
            all: self.words(),
        }
    }

    /// Stores `key`'s value in entry `i` (copied aside first if it holds the key's value).
    /// A value longer than the entry's room goes in the heap first, which may make room
    /// by evicting the least recently used values kept there (if `evict`, else
    /// [`Error::NoMemory`]). Once the entry has moved on, the chain of the value it held
    /// goes back to the heap; if the store was not made, the new one does.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn store_at(
        &self,
        w: &Locked<'_>,
        i: usize,
        key: &PackedKey<'_>,
        (kind, value): (Kind, &[u8]),
        flags: u32,
        until: u64,
        now: u64,
        room: Room,
    ) -> Result<Result<(), Aborted>, Error> {
        if self.inner.geometry.heap_blocks == 0 {
            let at = ValueAt::Inline(value);
            let keep = self.keep(i);
            let stored = self.entry(i).store(
                &w.writing,
                Some(&keep),
                key,
                kind,
                at,
                flags,
                until,
                w.stamp(now),
            );
            return Ok(stored);
        }
        self.store_with_heap(w, i, key, (kind, value), flags, until, now, room)
    }

    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn store_with_heap(
        &self,
        w: &Locked<'_>,
        i: usize,
        key: &PackedKey<'_>,
        (kind, value): (Kind, &[u8]),
        flags: u32,
        until: u64,
        now: u64,
        room: Room,
    ) -> Result<Result<(), Aborted>, Error> {
        let keep = self.keep(i);
        let e = self.entry(i);
        let heap = self.heap();
        let mut old = e.heap_value();
        let mut blocks = Vec::new();
        let at = if value.len() > self.inner.geometry.max_value {
            let n = blocks_for(value.len());
            if until != u64::MAX {
                self.expiring(until);
            }
            match self.take_blocks(w, key, n, i, room, now, &mut blocks)? {
                Taken::Fresh => {}
                // the key's own value made the room: its chain went back
                Taken::OwnFreed => old = None,
                Taken::Retry => return Ok(Err(Aborted::NotStable)),
            }
            ValueAt::Heap {
                // (a big value takes a while: its copy shows that the lock's holder works)
                first: heap.write_beating(&blocks, value, key.hash as u32, || {
                    self.beat(w);
                }),
                len: value.len(),
                skip: 0,
                count: match kind {
                    Kind::List => crate::dict::value::count_elements(value) as u32,
                    _ => 0,
                },
            }
        } else {
            ValueAt::Inline(value)
        };
        let stored = e.store(
            &w.writing,
            Some(&keep),
            key,
            kind,
            at,
            flags,
            until,
            w.stamp(now),
        );
        if stored.is_ok() {
            if let Some(chain) = old {
                self.free_chain(chain);
            }
        } else {
            heap.free(&blocks); // never named by a stable entry
        }
        Ok(stored)
    }

    /// Empties entry `i` (copying it aside first with `keep`), and gives its value's heap
    /// chain back once it has.
    fn free_at(&self, w: &Locked<'_>, i: usize, keep: Option<&Keep<'_>>) -> Result<(), Aborted> {
        let e = self.entry(i);
        let old = e.heap_value();
        let freed = e.free(&w.writing, keep.map(|k| k as &dyn super::entry::Undo));
        if freed.is_ok() {
            if let Some(chain) = old {
                self.free_chain(chain);
            }
        }
        freed
    }

    /// Gives back the blocks of a chain no entry or undo copy names any more (a chain that
    /// does not walk, in a damaged file, is left to a sweep).
    fn free_chain(&self, chain: Chain) {
        let heap = self.heap();
        let mut blocks = Vec::new();
        if heap.blocks_of(chain, &mut blocks).is_ok() {
            heap.free(&blocks);
        } else {
            self.control(SWEEP_DUE).fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Draws the next heap tag, newer than the last drawn and than `seen` (a tag found on
    /// the map: tags only grow, so a retag to an older one would change nothing), and
    /// gives it to every map word (see `heap.rs`).
    fn new_heap_tag(&self, seen: u32) -> u32 {
        let word = self.control(HEAP_TAG);
        let mut cur = word.load(Ordering::Acquire);
        let tag = loop {
            let drawn = cur as u32;
            let base = if (seen.wrapping_sub(drawn) as i32) > 0 {
                seen
            } else {
                drawn
            };
            let next = base.wrapping_add(1);
            match word.compare_exchange(cur, u64::from(next), Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break next,
                Err(now) => cur = now,
            }
        };
        self.heap().retag(tag);
        tag
    }

    /// Counts a write under way in this registration's registry entry (see [`HeapOps`]).
    #[inline(always)]
    fn count_op(&self, owner: OwnerId) -> HeapOps<'_> {
        if self.inner.geometry.heap_blocks == 0 {
            return HeapOps(None);
        }
        let reg = self.inner.att.map.registry();
        let i = owner.entry() as usize;
        if i >= reg.len() {
            return HeapOps(None);
        }
        let word = reg.ops(i);
        // Before the lock is asked for: a holder that takes it over sees the count.
        word.fetch_add(1 << 32, Ordering::SeqCst);
        HeapOps(Some(word))
    }

    /// Takes `n` blocks of the heap into `blocks` for a value to be stored in entry `i`:
    /// if the heap is short, sweeps it (when a sweep is due and safe), then frees the
    /// expired values kept there and the least recently used ones that `room` lets go,
    /// never entry `i`'s. If even that cannot make room but the key's own value (entry
    /// `i`'s) would, and `room` allows, that goes first ([`Taken::OwnFreed`]: the store
    /// then goes without the undo copy's promise, as ngx frees a value before it stores
    /// its successor), and the others only as far as still needed. [`Error::NoMemory`] if
    /// it cannot.
    #[allow(clippy::too_many_arguments)]
    fn take_blocks(
        &self,
        w: &Locked<'_>,
        key: &PackedKey<'_>,
        n: usize,
        i: usize,
        room: Room,
        now: u64,
        blocks: &mut Vec<u32>,
    ) -> Result<Taken, Error> {
        let heap = self.heap();
        let mut hint = NextFit::new(&self.inner.heap_hint);
        let hint = &mut hint.at;
        if heap.take(n, hint, blocks) {
            return Ok(Taken::Fresh);
        }
        if self.control(SWEEP_DUE).load(Ordering::Relaxed) != 0
            && self.sweep(w, false) > 0
            && heap.take(n, hint, blocks)
        {
            return Ok(Taken::Fresh);
        }
        let no_memory = || Error::NoMemory {
            key: key.preview(),
            why: room.no_room(),
        };
        if n > heap.blocks() {
            return Err(Error::NoMemory {
                key: key.preview(),
                why: "the value needs more than the whole heap",
            });
        }
        // (the kept ranks are of every value: a pop, which spares lists, scans)
        if room == Room::Evict {
            if let Some(taken) = self.evict_ranked(w, n, i, now, hint, blocks)? {
                return Ok(taken);
            }
        }
        // Values of the heap, expired ones first, then (if `evict`) live ones, least
        // recently used first, with their blocks.
        let mut made = Ranked {
            moves: self.control(MOVES).load(Ordering::Relaxed),
            made_at: now,
            next_expiry: u64::MAX,
            ..Ranked::default()
        };
        let mut held: Vec<Rank> = (0..self.capacity())
            .filter(|&j| j != i)
            .filter_map(|j| {
                let e = self.entry(j);
                let chain = e.heap_value()?;
                let deadline = e.deadline();
                let live = deadline > now;
                if live {
                    made.next_expiry = made.next_expiry.min(deadline);
                }
                (e.is_stable() && (!live || room.may_evict(&e))).then(|| Rank {
                    live,
                    stamp: e.used_at(),
                    entry: j as u32,
                    first: chain.first,
                    blocks: chain.blocks() as u32,
                })
            })
            .collect();
        held.sort_unstable();
        let others: usize = held.iter().map(|h| h.blocks as usize).sum();
        let own = self.entry(i).heap_value().map(|c| c.blocks());
        // Frees the key's own value (counted again once the store is made, as a free
        // entry's).
        let free_own = || match self.free_at(w, i, None) {
            Ok(()) => {
                self.uncount(w, 1);
                w.placed.set(w.placed.get() + 1);
                Ok(Taken::OwnFreed)
            }
            Err(Aborted::TakenOver) => Err(Error::Stalled { key: None }),
            Err(Aborted::NotStable) => Ok(Taken::Retry),
        };
        let mut taken = Taken::Fresh;
        // (counting the free blocks reads the whole map: once, and then what each eviction
        // frees is added)
        let mut free = heap.free_blocks();
        if free + others < n {
            // Only the key's own value can make the room: it goes first, and no other
            // value goes for nothing.
            if !room.own_first() || own.is_none_or(|b| free + others + b < n) {
                return Err(no_memory());
            }
            taken = free_own()?;
            if matches!(taken, Taken::Retry) || heap.take(n, hint, blocks) {
                return Ok(taken);
            }
            free = heap.free_blocks();
        }
        // As few as make room, the least recently used first, and then (unless the key's
        // own value went, or for a pop) until 1/64 of the heap is free besides: the next
        // long values then need no scan of their own.
        let slack = if matches!(taken, Taken::OwnFreed) || room == Room::Pop {
            0 // (a pop evicts no more than its own copy needs)
        } else {
            heap.blocks() / 64
        };
        let mut next = 0;
        while let Some(h) = held.get(next) {
            next += 1;
            if !self.evict_value(w, h.entry as usize, h.live)? {
                continue;
            }
            free += h.blocks as usize;
            // (counted again once the estimate says enough: a damaged chain frees less
            // than its length says)
            if free >= n + slack {
                free = heap.free_blocks();
                if free >= n + slack {
                    break;
                }
            }
        }
        if room == Room::Evict {
            // The least recently used of what is left, for the next stores that need room.
            held.drain(..next);
            self.keep_ranked(held, heap.blocks() / 8, made);
        }
        if heap.take(n, hint, blocks) {
            return Ok(taken);
        }
        // Fewer went than were counted on (marked by a stale writer, or damaged): the key's
        // own value, if it is still there and makes the room.
        if matches!(taken, Taken::Fresh)
            && room.own_first()
            && own.is_some_and(|b| heap.free_blocks() + b >= n)
        {
            taken = free_own()?;
            if matches!(taken, Taken::Retry) || heap.take(n, hint, blocks) {
                return Ok(taken);
            }
        }
        Err(no_memory())
    }

    /// Evicts the heap value of entry `j` (`live`: not expired). `false` if it was not
    /// stable (marked by a stale writer).
    fn evict_value(&self, w: &Locked<'_>, j: usize, live: bool) -> Result<bool, Error> {
        let home = self.home_of(self.entry(j).hash());
        match self.free_at(w, j, None) {
            Ok(()) => {
                self.uncount(w, 1);
                self.going(w, home);
                if live {
                    self.control(EVICTIONS).fetch_add(1, Ordering::Relaxed);
                    w.evicted.set(true);
                }
                Ok(true)
            }
            Err(Aborted::TakenOver) => Err(Error::Stalled { key: None }),
            Err(Aborted::NotStable) => Ok(false),
        }
    }

    /// [`take_blocks`](Self::take_blocks)'s usual way to make room without reading the
    /// whole dict: evicts from the ranks this process kept from its last scan, the least
    /// recently used first, each only if its entry still holds the value ranked, with the
    /// same stamp. Those that changed since were used since: every value whose rank was
    /// kept is older than they are, and than any value stored since, so this evicts in the
    /// order a new scan would. Only if the ranks that still hold make all the room (the
    /// slack included), so that no value goes for nothing where only the key's own could
    /// make it; and not once a value moved, one expired that the ranks know of, or a
    /// second passed (a value another process stored since may have expired). `None` to
    /// scan.
    fn evict_ranked(
        &self,
        w: &Locked<'_>,
        n: usize,
        i: usize,
        now: u64,
        hint: &mut usize,
        blocks: &mut Vec<u32>,
    ) -> Result<Option<Taken>, Error> {
        let heap = self.heap();
        // (only ever taken under the writer lock, so never contended but through a fork
        // from a thread in the middle of it: then scan)
        let mut ranked = match self.inner.ranked.try_lock() {
            Ok(r) => r,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Ok(None),
        };
        let fresh = ranked.moves == self.control(MOVES).load(Ordering::Relaxed)
            && now.saturating_sub(ranked.made_at) < RANKS_LAST
            && now < ranked.next_expiry;
        if !fresh {
            ranked.ranks.clear();
            return Ok(None);
        }
        // The ranks that still hold their value, the least recently used first, as many as
        // make the room and the slack; none is evicted unless they all make it (else a
        // scan decides, and may find that only the key's own value can).
        let need = n + heap.blocks() / 64;
        let mut room = heap.free_blocks(); // (and what each eviction frees)
        let (mut looked, mut going) = (0, Vec::new());
        for r in ranked.ranks.iter().rev() {
            if room >= need {
                break;
            }
            looked += 1;
            let j = r.entry as usize;
            let e = self.entry(j);
            let holds = j != i
                && j < self.capacity()
                && e.is_stable()
                && e.used_at() == r.stamp
                && e.heap_value().is_some_and(|c| c.first == r.first);
            if holds {
                room += r.blocks as usize;
                going.push(*r);
            }
        }
        if room < need {
            ranked.ranks.clear();
            return Ok(None);
        }
        let left = ranked.ranks.len() - looked;
        ranked.ranks.truncate(left);
        drop(ranked);
        for r in going {
            let live = self.entry(r.entry as usize).deadline() > now;
            self.evict_value(w, r.entry as usize, live)?;
        }
        // (a damaged chain frees less than its length says: then a scan goes on)
        Ok(heap.take(n, hint, blocks).then_some(Taken::Fresh))
    }

    /// Notes that this process stores a heap value that expires at `until`: ranks kept from
    /// an earlier scan are out of date from then (an expired value goes first).
    fn expiring(&self, until: u64) {
        if let Ok(mut ranked) = self.inner.ranked.try_lock() {
            ranked.next_expiry = ranked.next_expiry.min(until);
        }
    }

    /// Keeps the first of `ranks` (the least recently used first), as many as hold
    /// `blocks` (and at most [`KEPT_RANKS`]: a process's memory), for
    /// [`evict_ranked`](Self::evict_ranked), with what makes them out of date.
    fn keep_ranked(&self, mut ranks: Vec<Rank>, blocks: usize, made: Ranked) {
        let mut kept = 0;
        let n = ranks
            .iter()
            .take(KEPT_RANKS)
            .take_while(|r| {
                let under = kept < blocks;
                kept += r.blocks as usize;
                under
            })
            .count();
        ranks.truncate(n);
        ranks.shrink_to_fit();
        ranks.reverse(); // (the least recently used last)
        if let Ok(mut ranked) = self.inner.ranked.try_lock() {
            *ranked = Ranked { ranks, ..made };
        }
    }

    /// Gives back the heap's blocks that no entry and no undo copy names (a writer that
    /// died between taking them and publishing, or before it freed an old value's), if no
    /// writer taken over may still write into its own (see [`HeapOps`]); how many.
    /// `fresh`: whether such a writer lives is asked of the registry now (a writer killed
    /// a moment ago reads as alive for a millisecond otherwise): for the sweeps that run
    /// once (a takeover's, `flush_expired`'s), not for a store's, which may come again
    /// and again while one lives.
    #[cold]
    fn sweep(&self, w: &Locked<'_>, fresh: bool) -> usize {
        let due = self.control(SWEEP_DUE).load(Ordering::Acquire);
        let heap = self.heap();
        let reg = self.inner.att.map.registry();
        let me = w.writing.owner().entry() as usize;
        for j in 0..reg.len() {
            let under_way = reg.ops(j).load(Ordering::SeqCst) >> 32;
            let alive = || {
                reg.owner_at(j).is_some_and(|(o, g)| {
                    let att = &self.inner.att;
                    !if fresh {
                        att.is_dead_now(o, Some(g))
                    } else {
                        att.is_dead_at(o, Some(g))
                    }
                })
            };
            if (j == me && under_way > 1) || (j != me && under_way > 0 && alive()) {
                return 0;
            }
        }
        let before = heap.snapshot();
        if !w.writing.still_mine() {
            return 0;
        }
        let (named, unsettled) = self.named_blocks(&heap);
        let mut swept = heap.sweep(&before, w.heap_tag.get(), &named);
        if swept.left > 0 && w.writing.still_mine() {
            // Words it left: of another tag (a taker taken over before it drew its tag
            // drew a newer one on resuming, and retagged), or changed. A tag newer than
            // any on the map (a retag moves nothing: it only fails stale sweeps), and the
            // sweep again, from a new snapshot and what is named after it.
            let newest =
                before
                    .iter()
                    .map(|&word| (word >> 32) as u32)
                    .fold(w.heap_tag.get(), |a, b| {
                        if (b.wrapping_sub(a) as i32) > 0 {
                            b
                        } else {
                            a
                        }
                    });
            let tag = self.new_heap_tag(newest);
            w.heap_tag.set(tag);
            let before = heap.snapshot();
            if w.writing.still_mine() {
                let (named, _) = self.named_blocks(&heap);
                let again = heap.sweep(&before, tag, &named);
                swept.freed += again.freed;
                swept.left = again.left;
            }
        }
        let freed = swept.freed;
        if !unsettled && swept.left == 0 && w.writing.still_mine() {
            let _ = self.control(SWEEP_DUE).compare_exchange(
                due,
                0,
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
        }
        freed
    }

    /// The blocks every entry and undo copy names (a bit each, for [`Heap::sweep`]), and
    /// whether any of them is unsettled: an entry out of use (a stale writer's) or a copy
    /// in use may drop the chain it names once settled, and the sweep is due again then.
    fn named_blocks(&self, heap: &Heap<'_>) -> (Vec<u64>, bool) {
        let mut named = vec![0u64; map_words(heap.blocks())];
        let mut unsettled = false;
        let mut mark = |e: &Entry<'_>, settled: bool| {
            if let Some(chain) = e.heap_value() {
                heap.mark(chain, &mut named);
                unsettled |= !settled;
            }
        };
        (0..self.capacity()).for_each(|i| {
            let e = self.entry(i);
            mark(&e, e.is_stable());
        });
        let journals = self.journals();
        for n in 0..JOURNALS {
            let j = journals.get(n);
            if !matches!(j.state(j.load()), JournalState::Idle) {
                mark(&j.copy, false);
            }
        }
        (named, unsettled)
    }

    /// Where entry `i`'s value goes before it is rewritten.
    fn keep(&self, i: usize) -> Keep<'_> {
        Keep {
            journals: self.journals(),
            at: i,
        }
    }

    /// Deals with an undo copy a writer left (it died, or was taken over): writes it back
    /// where its write was interrupted, or stores it elsewhere if that entry is out of use,
    /// or drops it if its write was made or never began; quarantines one that a writer
    /// taken over may still be filling. Caller holds the lock, before any write.
    fn settle_journal(&self, w: &Locked<'_>) {
        let journals = self.journals();
        if journals.any_busy() {
            for n in 0..JOURNALS {
                self.settle(w, journals.get(n));
            }
        }
    }

    fn settle(&self, w: &Locked<'_>, j: Journal<'_>) {
        for _ in 0..RETRIES {
            let entry = |at| (at < self.capacity()).then(|| self.entry(at));
            match j.settle(entry, |o| self.inner.att.is_dead(o)) {
                Settled::Idle | Settled::InUse => return,
                Settled::Covers { at, word } => {
                    if !w.writing.still_mine() {
                        return; // taken over: the copy may be the new holder's own
                    }
                    self.clean(w, at); // writes it back, or stores it elsewhere
                    if j.load() == word {
                        return; // could not (taken over, or no room): the next tries
                    }
                }
            }
        }
    }

    /// Stores the undo copy's key and value in an entry of their own, for a key whose
    /// entry is out of use (its writer taken over in the middle of rewriting it), unless
    /// the key has an entry already (a store of this that ended before the copy was
    /// dropped) or the value has expired; then drops the copy.
    #[cold]
    fn restore_elsewhere(&self, w: &Locked<'_>, j: Journal<'_>) {
        if !w.writing.still_mine() {
            return; // taken over: the holder now does it
        }
        let word = j.load();
        let JournalState::Kept { .. } = j.state(word) else {
            return;
        };
        let Ok(Some((key, _))) = j.copy.read_key() else {
            // not a key: a damaged file (a chain it named is the sweep's)
            if j.release(word) {
                self.control(SWEEP_DUE).fetch_add(1, Ordering::AcqRel);
            }
            return;
        };
        let k = PackedKey::new(&key, j.copy.hash());
        let mut value = Vec::new();
        // A value in the heap moves by its chain: the copy names it until the new entry
        // does (the chain is never copied, nor freed in between).
        let chain = j.copy.heap_value();
        let out = if chain.is_some() {
            None
        } else {
            Some(&mut value)
        };
        let Look::Found(c) = j.copy.peek(&k, out) else {
            if j.release(word) {
                self.control(SWEEP_DUE).fetch_add(1, Ordering::AcqRel);
            }
            return;
        };
        w.restoring.set(true);
        let now = self.now();
        let mut done = true;
        let mut moved = false;
        if c.deadline > now && self.lookup_locked(w, &k, None).is_none() {
            // (this may run in the middle of an operation that placed a key already: only
            // this store's entry is counted here)
            let pending = w.placed.get();
            let mut at = None;
            done = match self.place(w, &k, now, true) {
                Ok((f, _)) => {
                    at = Some(f);
                    let e = self.entry(f);
                    let old = e.heap_value(); // an expired or evicted value's
                    let value = match chain {
                        Some(c) => ValueAt::Heap {
                            first: c.first,
                            len: c.len,
                            skip: c.skip,
                            count: j.copy.heap_count(),
                        },
                        None => ValueAt::Inline(&value),
                    };
                    // (the key keeps its rank: a restore is not a use)
                    let stamp = j.copy.used_at();
                    let stored = e.store(
                        &w.writing, None, &k, c.kind, value, c.flags, c.deadline, stamp,
                    );
                    let made = stored.is_ok();
                    if let (true, Some(old)) = (made, old) {
                        self.free_chain(old);
                    }
                    if made && chain.is_some() {
                        self.control(MOVES).fetch_add(1, Ordering::Relaxed);
                    }
                    moved = made;
                    made
                }
                Err(_) => true, // every entry near its home is out of use: lost
            };
            let mine = w.placed.replace(pending) - pending;
            if done {
                self.update_len(w, |n| n + mine);
                // A counting pass (see `clean_all`) has gone past that entry already.
                if let (Some(f), Some(pass)) = (at, w.pass_at.get()) {
                    if f < pass {
                        w.behind.set(w.behind.get() + mine);
                    }
                }
            }
        }
        w.restoring.set(false);
        if done && j.release(word) && chain.is_some() && !moved {
            // The copy's chain, named by nothing now (expired, or the key stored since): a
            // sweep finds it. (Freed here, it could be one another restorer, which took
            // this lock over and stored the copy, names.)
            self.control(SWEEP_DUE).fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Runs `op` under the writer lock, starting over (a few times) when a write found its
    /// entry marked by a writer that was taken over. [`Error::Stalled`] if this writer was
    /// taken over itself before its writes were made: it stalled past the bound while
    /// holding the lock (taken over after them, it has done the operation); it names
    /// `key`, the operation's.
    fn writing<T>(
        &self,
        key: Option<&PackedKey<'_>>,
        mut op: impl FnMut(&Locked<'_>) -> Result<Outcome<T>, Error>,
    ) -> Result<T, Error> {
        let stalled = || Error::Stalled {
            key: key.map(PackedKey::preview),
        };
        let owner = self.writer()?;
        for _ in 0..RETRIES {
            let w = self.lock_as(owner);
            // A dict whose path now leads to another file (replaced by a rename) is
            // written no more: the processes that open the path use the other one.
            self.inner.att.look_at_path(w.now.get())?;
            let outcome = op(&w);
            let placed = w.placed.take();
            if let (Ok(Outcome::Done(_)), 1..) = (&outcome, placed) {
                // (a store that was not made, to be tried again or given up, took no entry)
                self.update_len(&w, |c| c + placed);
            }
            if let (Ok(Outcome::Done(_)), Some(home)) = (&outcome, w.going.take()) {
                self.refilter(&w, home);
            }
            let released = w.writing.release();
            match outcome {
                // Every write of the operation was made, each checked under this writer's
                // mark: a takeover after them (the release finds the lock taken over)
                // changes none of them, so the operation happened.
                Ok(Outcome::Done(t)) => return Ok(t),
                Ok(Outcome::Retry) if released.is_err() => return Err(stalled()),
                Ok(Outcome::Retry) => {}
                Err(Error::Stalled { key: None }) => return Err(stalled()),
                Err(e) => return Err(e),
            }
        }
        Err(stalled())
    }

    /// What an entry write under the lock came to: done, start over (its entry was marked
    /// by a stale writer meanwhile), or [`Error::Stalled`] (we were taken over).
    fn write(&self, done: Result<(), Aborted>) -> Result<Outcome<()>, Error> {
        match done {
            Ok(()) => Ok(Outcome::Done(())),
            Err(Aborted::NotStable) => Ok(Outcome::Retry),
            Err(Aborted::TakenOver) => Err(Error::Stalled { key: None }),
        }
    }

    #[inline(always)]
    fn entry(&self, i: usize) -> Entry<'_> {
        let n = self.inner.geometry.entry_words;
        let at = CONTROL_WORDS + i * n;
        let words = self.words();
        Entry::with_heap(&words[at..at + n], &self.inner.geometry, words)
    }

    /// The heap (see `heap.rs`): empty in a dict made without one.
    #[inline(always)]
    fn heap(&self) -> Heap<'_> {
        self.inner.geometry.heap(self.words())
    }

    fn home(&self, k: &PackedKey) -> usize {
        self.home_of(k.hash)
    }

    /// The home of a key of this hash: from its high bits (the filter bit is from its low
    /// ones).
    #[inline]
    fn home_of(&self, hash: u64) -> usize {
        ((u128::from(hash) * self.capacity() as u128) >> 64) as usize
    }

    /// The filter of `home`: a word of the filters' array after the undo copies, apart
    /// from the entries, so that the filters of a big dict stay in cache (8 homes a line)
    /// and a miss reads one of them alone.
    fn filter(&self, home: usize) -> Filter<'_> {
        let words = self.inner.geometry.entry_words;
        let at = CONTROL_WORDS + (self.capacity() + JOURNALS) * words;
        Filter(&self.words()[at + home])
    }

    /// Rebuilds the filter of `home` after one of its keys went (see [`Filter::rebuild`]),
    /// from the entries within its reach.
    fn refilter(&self, w: &Locked<'_>, home: usize) {
        self.filter(home).rebuild(&w.writing, || {
            if self.journals().any_busy() {
                return None; // a copy may hold a key of this home
            }
            let mut bits = 0;
            for d in 0..=self.reach(home) {
                match self.entry(self.at(home, d)).stable_hash()? {
                    Some(hash) if self.home_of(hash) == home => bits |= filter::bit(hash),
                    _ => {}
                }
            }
            Some(bits)
        });
    }

    /// Notes that a key of `home` goes in an operation that stores a key: its filter is
    /// rebuilt once the operation's writes are made. One home at a time: an earlier one
    /// keeps its bits (a bit too many only makes a miss there look further). It is not
    /// rebuilt now: the key being stored may have no entry yet (a new key placed, or one
    /// whose own heap value went first), and the rebuild would clear its bit for good.
    fn going(&self, w: &Locked<'_>, home: usize) {
        w.going.set(Some(home));
    }

    /// [`going`](Self::going) for an operation that only removes keys: an earlier pending
    /// home is rebuilt now, between writes.
    fn gone(&self, w: &Locked<'_>, home: usize) {
        if let Some(earlier) = w.going.replace(Some(home)) {
            if earlier != home {
                self.refilter(w, earlier);
            }
        }
    }

    fn window(&self) -> usize {
        WINDOW.min(self.capacity())
    }

    /// Entry `d` places after `home` (`d` < the capacity), wrapping around: a compare, not
    /// a division, on the read path.
    #[inline]
    fn at(&self, home: usize, d: usize) -> usize {
        let i = home + d;
        if i >= self.capacity() {
            i - self.capacity()
        } else {
            i
        }
    }

    fn reach(&self, home: usize) -> usize {
        let r = self.entry(home).reach().load(Ordering::Acquire) as usize;
        r.min(self.window() - 1)
    }

    /// Reads entry `i` until a read is not torn; after a bounded spin (a writer
    /// descheduled mid-copy, or dead, or stopped), reads it under the writer lock instead
    /// (a read-only handle, which cannot take it, reads the entry as absent then).
    fn read_stable<T>(
        &self,
        i: usize,
        absent: T,
        mut read: impl FnMut(&Entry<'_>) -> Result<T, Look>,
    ) -> T {
        let e = self.entry(i);
        for round in 0..SETTLE_ROUNDS {
            match read(&e) {
                Ok(t) => return t,
                Err(_) => spin(round),
            }
        }
        match self.write_lock() {
            Ok(w) => self.read_locked(&w, i, read),
            Err(_) => absent,
        }
    }

    /// Reads an entry while holding the writer lock. No write of ours is in progress then,
    /// so one in progress is a stale writer's (taken over, or dead), or damage to the
    /// file: the entry is cleaned first (see [`Entry::clean`]).
    #[inline(always)]
    fn read_locked<T>(
        &self,
        w: &Locked<'_>,
        i: usize,
        mut read: impl FnMut(&Entry<'_>) -> Result<T, Look>,
    ) -> T {
        let e = self.entry(i);
        let mut round = 0;
        loop {
            self.clean(w, i);
            match read(&e) {
                Ok(t) => return t,
                // A stable entry whose heap chain is broken: a damaged file. The entry
                // goes (its blocks are lost until a sweep finds them).
                Err(Look::Damaged) => {
                    self.control(SWEEP_DUE).fetch_add(1, Ordering::AcqRel);
                    if e.free(&w.writing, None).is_ok() {
                        self.uncount(w, 1);
                        self.control(REPAIRS).fetch_add(1, Ordering::Relaxed);
                    }
                }
                // Only a process writing outside the protocol gets here.
                Err(_) => spin(round.min(SETTLE_ROUNDS)),
            }
            round += 1;
        }
    }

    /// Cleans entry `i` under the writer lock (see [`Entry::clean`]); whether it is
    /// usable. An entry out of use whose key's value is in the undo copy gets that value
    /// stored elsewhere first.
    fn clean(&self, w: &Locked<'_>, i: usize) -> bool {
        let e = self.entry(i);
        if e.is_stable() {
            return true; // nearly always: before the copies are looked at
        }
        self.clean_unstable(w, i, &e)
    }

    #[cold]
    #[inline(never)]
    fn clean_unstable(&self, w: &Locked<'_>, i: usize, e: &Entry<'_>) -> bool {
        let is_dead = |o| self.inner.att.is_dead(o);
        let keep = self.keep(i);
        let mut c = e.clean(&w.writing, is_dead, Some(&keep));
        let mut emptied = c.emptied;
        if c.orphan && !w.restoring.get() {
            if let Some((j, _)) = keep.covering(e.seq()) {
                self.restore_elsewhere(w, j);
                c = e.clean(&w.writing, is_dead, Some(&keep));
                emptied += c.emptied;
            }
        }
        // An entry out of use is not in the count (a takeover's recount leaves it out),
        // and whether its meta says "used" is whatever a stale writer left there: the
        // count is taken again rather than guessed (rare: after a takeover that found a
        // writer alive, or a stale writer's late mark).
        if emptied != 0 && !w.recovering.get() {
            self.recount(w);
        }
        c.usable
    }

    /// Counts the stable entries in use, anew (a big dict's count shows the writers
    /// waiting that this holder is not stalled, as `recover` does).
    #[cold]
    fn recount(&self, w: &Locked<'_>) {
        // The pass cleans each entry it counts (see `clean_all`); nested, its cleans do not
        // count again.
        let outer = (w.recovering.replace(true), w.pass_at.get(), w.behind.get());
        let used = self.clean_all(w);
        w.recovering.set(outer.0);
        w.pass_at.set(outer.1);
        w.behind.set(outer.2);
        if let Some(used) = used {
            self.update_len(w, |_| used);
        }
    }

    /// Takes `n` from the entry count (never below zero: the file may have damaged it).
    fn uncount(&self, w: &Locked<'_>, n: u64) {
        if n != 0 {
            self.update_len(w, |c| c.saturating_sub(n));
        }
    }

    /// Changes the entry count, if this hold still owns it: the count's word carries the
    /// epoch of the hold that last wrote it. A writer that was taken over changes nothing
    /// (its successor tagged the count and recounted), so the count does not drift with
    /// stalled writers' late additions (an `evict` decision rests on it).
    ///
    /// A hold tags the count at its first change of it (a takeover's at once, with the
    /// count as it is): an overwrite, which changes no count, pays no read-modify-write
    /// for it. The tag it replaces is an earlier hold's (or damage, or a file written
    /// before the tag): a later hold's would mean this one was taken over, which the lock
    /// check says; and a successor that wrote the word after that check wrote it after
    /// the load the CAS is from, so the CAS fails.
    fn update_len(&self, w: &Locked<'_>, f: impl Fn(u64) -> u64) {
        let word = self.control(LEN);
        let tag = u64::from(w.epoch) << 32;
        let mut cur = word.load(Ordering::Relaxed);
        loop {
            // Another hold's tag: an earlier one's (this hold's first change), or a
            // successor's, when the lock check says this hold was taken over.
            if cur & !COUNT_BITS != tag && !w.writing.still_mine() {
                return; // taken over: the count is the successor's
            }
            let next = tag | f(count_of(cur)).min(self.capacity() as u64);
            match word.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(seen) => cur = seen,
            }
        }
    }

    /// The key's entry, expired or not: lock-free. A look that met an entry out of use
    /// whose key's value the undo copy no longer holds looks once more: the value was
    /// stored elsewhere before the copy was dropped, maybe behind the look.
    ///
    /// What it found goes to `found`, not up the frames in the result: a `Copied` built on
    /// the stack field by field and then moved whole stalls on store forwarding.
    fn lookup(&self, k: &PackedKey, mut value: Out<'_>, found: &mut Copied) -> Option<usize> {
        let home = self.home(k);
        if !self.filter(home).may_hold(k.hash) {
            return None;
        }
        let mut parked = false;
        for _ in 0..2 {
            for d in 0..=self.reach(home) {
                let i = self.at(home, d);
                match self.read_entry(i, k, value.as_deref_mut(), found) {
                    Read::Found => return Some(i),
                    Read::Miss => {}
                    Read::Parked => parked = true,
                    // A read-only handle cannot settle it: that entry reads as absent.
                    Read::Stuck if self.inner.att.read_only() => {}
                    Read::Stuck => {
                        let (i, c) = self.lookup_under_lock(k, value)?;
                        *found = c;
                        return Some(i);
                    }
                }
            }
            if !parked {
                return None;
            }
        }
        None
    }

    /// Entry `i` for `k`, lock-free. A write in progress is waited for a little, then the
    /// undo copy is read if it covers that write (the value before it); an entry out of
    /// use is read from the copy at once.
    #[inline(always)]
    fn read_entry(&self, i: usize, k: &PackedKey, mut value: Out<'_>, found: &mut Copied) -> Read {
        match self.entry(i).read(k, value.as_deref_mut()) {
            Look::Found(c) => {
                *found = c;
                Read::Found
            }
            Look::Free | Look::Other => Read::Miss,
            _ => self.read_unsettled(i, k, value, found),
        }
    }

    /// [`read_entry`](Self::read_entry) of an entry being written or out of use.
    #[cold]
    #[inline(never)]
    fn read_unsettled(
        &self,
        i: usize,
        k: &PackedKey,
        mut value: Out<'_>,
        found: &mut Copied,
    ) -> Read {
        let e = self.entry(i);
        let from_copy = |or: Read, value: Out<'_>, found: &mut Copied| {
            let seq = e.seq();
            match self.journals().read(i, seq, k, value) {
                Some(Look::Found(c)) => {
                    *found = c;
                    Read::Found
                }
                Some(_) => Read::Miss,
                None => or,
            }
        };
        let mut round = 0;
        loop {
            match e.read(k, value.as_deref_mut()) {
                Look::Found(c) => {
                    *found = c;
                    return Read::Found;
                }
                Look::Free | Look::Other => return Read::Miss,
                Look::Parked => return from_copy(Read::Parked, value, found),
                Look::Busy | Look::Changed | Look::Damaged if round >= SETTLE_ROUNDS => {
                    return from_copy(Read::Stuck, value, found)
                }
                Look::Busy | Look::Changed | Look::Damaged => {
                    spin(round);
                    round += 1;
                }
            }
        }
    }

    /// A lookup under the writer lock, for a reader that found an entry mid-write for too
    /// long with no undo copy of it: taking the lock over from a dead or stalled writer
    /// settles the entry.
    #[cold]
    fn lookup_under_lock(&self, k: &PackedKey, value: Out<'_>) -> Option<(usize, Copied)> {
        let w = self.write_lock().ok()?;
        self.lookup_locked(&w, k, value)
    }

    /// [`lookup`](Self::lookup) for a writer: nothing but stale writers can change under it.
    fn lookup_locked(
        &self,
        w: &Locked<'_>,
        k: &PackedKey<'_>,
        value: Out<'_>,
    ) -> Option<(usize, Copied)> {
        let home = self.home(k);
        // The filter's rule holds for a writer too: a clear bit means no entry and no undo
        // copy holds the key (stale writers' entries included), so a new key costs no scan.
        if !self.filter(home).may_hold(k.hash) {
            return None;
        }
        let mut value = value;
        // (a loop, not `find_map`: its closure, not inlined, returned the find through
        // memory, and reading it back stalled on store forwarding)
        for d in 0..=self.reach(home) {
            let i = self.at(home, d);
            let found = self.read_locked(w, i, |e| match e.read(k, value.as_deref_mut()) {
                Look::Found(c) => Ok(Some(c)),
                // out of use: its key's value was stored elsewhere, when there was one
                Look::Free | Look::Other | Look::Parked => Ok(None),
                busy => Err(busy),
            });
            if let Some(c) = found {
                return Some((i, c));
            }
        }
        None
    }

    /// The key's entry and its deadline, for a writer.
    fn find_locked(&self, w: &Locked<'_>, k: &PackedKey) -> Option<(usize, u64)> {
        self.lookup_locked(w, k, None).map(|(i, c)| (i, c.deadline))
    }

    /// Finds a slot for a key that has no entry: the nearest free or expired slot of its
    /// window, else (if `evict`) the least recently used of the first few. Quarantined
    /// entries are out of use. Raises the home's reach before the caller writes there.
    fn place(
        &self,
        w: &Locked<'_>,
        k: &PackedKey,
        now: u64,
        evict: bool,
    ) -> Result<(usize, Stored), Error> {
        let home = self.home(k);
        let mut chosen = None;
        // A dict with every entry in use has no free one to find, and expired entries are
        // looked for where the LRU sample is taken, as ngx looks at its LRU tail: an
        // evicting store reads the sample, not the whole window (a third of its time).
        let full =
            evict && count_of(self.control(LEN).load(Ordering::Relaxed)) >= self.capacity() as u64;
        let scan = if full && self.control(FLUSHED).load(Ordering::Relaxed) == 0 {
            EVICTION_SAMPLE.min(self.window())
        } else {
            self.window()
        };
        for d in 0..scan {
            let i = self.at(home, d);
            let e = self.entry(i);
            if !self.clean(w, i) {
                continue;
            }
            if !e.is_used() {
                w.placed.set(w.placed.get() + 1); // counted once it is stored
                chosen = Some((d, false));
                break;
            }
            if e.deadline() <= now {
                chosen = Some((d, false));
                break;
            }
        }
        if chosen.is_none() && evict {
            chosen = (0..EVICTION_SAMPLE.min(self.window()))
                .filter(|&d| self.entry(self.at(home, d)).is_stable())
                .min_by_key(|&d| self.entry(self.at(home, d)).used_at())
                .map(|d| (d, true));
            if chosen.is_some() {
                self.control(EVICTIONS).fetch_add(1, Ordering::Relaxed);
            }
        }
        let (d, forcible) = chosen.ok_or_else(|| Error::NoMemory {
            key: k.preview(),
            why: if evict {
                "every entry near its home is being written: none could be evicted"
            } else {
                "no free or expired entry near its home (a safe_ store, and a new list, evict no live key)"
            },
        })?;
        let at = self.at(home, d);
        if let Some(Some(hash)) = self.entry(at).stable_hash() {
            self.going(w, self.home_of(hash)); // an expired or evicted entry's key
        }
        // Only ever raised, and by an RMW: a writer taken over in the middle of this (that
        // resumes later) must not lower a reach its successor raised. The filter's bit is
        // set, like the reach raised, before the key is stored.
        self.entry(home)
            .reach()
            .fetch_max(d as u64, Ordering::Release);
        self.filter(home).add(k.hash);
        Ok((at, Stored { forcible }))
    }

    /// After taking the writer lock over: cleans every entry (empties the dead writer's,
    /// quarantines a live one's) and recounts the entries.
    #[cold]
    fn recover(&self, w: &Locked<'_>) {
        w.recovering.set(true);
        let used = self.clean_all(w);
        w.recovering.set(false);
        if let Some(used) = used {
            self.update_len(w, |_| used);
            self.control(REPAIRS).fetch_add(1, Ordering::Relaxed);
            self.sweep_if_due(w);
        }
    }

    /// Sweeps the heap if blocks may be lost (to a writer that died holding them, or was
    /// taken over), and no writer taken over may still write into its own: after a
    /// takeover, and at `flush_expired`, so that `heap_free` counts what dead writers took
    /// as free at once rather than at the next store that finds the heap short.
    #[cold]
    fn sweep_if_due(&self, w: &Locked<'_>) {
        if self.inner.geometry.heap_blocks != 0
            && self.control(SWEEP_DUE).load(Ordering::Relaxed) != 0
        {
            self.sweep(w, true);
        }
    }

    /// `recover`'s pass: cleans every entry, and counts the stable ones in use (`None`:
    /// taken over meanwhile).
    ///
    /// An entry counts by what its clean saw (stable, so usable), not by a second look at
    /// its state: a taken-over writer may mark it between the two, and put it back when it
    /// finds the lock lost. A key that a clean stores elsewhere (from an undo copy) in an
    /// entry the pass has gone past is added.
    fn clean_all(&self, w: &Locked<'_>) -> Option<u64> {
        let mut used = 0;
        w.behind.set(0);
        let mut done = true;
        for i in 0..self.capacity() {
            // A big dict takes a while: show the writers waiting that we are not stalled.
            if i % BEAT_ENTRIES == BEAT_ENTRIES - 1 && !self.beat(w) {
                done = false; // taken over: the new holder recovers
                break;
            }
            w.pass_at.set(Some(i));
            let usable = self.clean(w, i);
            used += u64::from(usable && self.entry(i).is_used());
        }
        w.pass_at.set(None);
        done.then(|| used + w.behind.take())
    }
}

/// What a lock-free look at one entry found.
enum Read {
    /// Found: what it found is in the caller's `Copied`.
    Found,
    Miss,
    /// Out of use, and not covered by the undo copy.
    Parked,
    /// Mid-write past the spin, and not covered by the undo copy.
    Stuck,
}

/// The writer lock, held: what the functions that need it take as proof.
struct Locked<'a> {
    writing: Writing<'a>,
    /// The heap's tag this hold expects of the map words it sweeps (see `heap.rs`).
    heap_tag: std::cell::Cell<u32>,
    /// This registration's count of writes under way, dropped after `writing` (released).
    _ops: HeapOps<'a>,
    /// A store made room in the heap by evicting a live value.
    evicted: std::cell::Cell<bool>,
    /// An undo copy is being stored elsewhere ([`SharedDict::restore_elsewhere`]): the
    /// entries it meets are not to start another.
    restoring: std::cell::Cell<bool>,
    /// A key of this home goes in the operation: its filter is to be rebuilt at its end.
    going: Spot,
    /// The lock epoch this hold took (before any heartbeat): the entry count's tag.
    epoch: u32,
    /// Free entries `place` gave out, to count once a store to them is made.
    placed: std::cell::Cell<u64>,
    /// `recover` is cleaning every entry, and counts them all at its end.
    recovering: std::cell::Cell<bool>,
    /// Where a counting pass (`clean_all`) is, and the entries a restore took behind it.
    pass_at: Spot,
    behind: std::cell::Cell<u64>,
    /// The clock once the lock was taken (and a takeover's recovery done): what the
    /// operation calls now.
    now: std::cell::Cell<u64>,
}

impl Locked<'_> {
    /// The LRU stamp of a use of an entry by this hold, now.
    fn stamp(&self, now: u64) -> u64 {
        recency::of_store(now, self.writing.epoch())
    }
}

/// What a store may do to find room in the heap for its value (see
/// [`SharedDict::take_blocks`]). Expired values always go first.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Room {
    /// `set`, `add`, `replace`, `incr`: the least recently used values go.
    Evict,
    /// The `safe_` stores: no live value goes.
    Expired,
    /// A list's push: no live value goes, and the list never goes first: its new copy is
    /// written beside it, or the push is `NoMemory` (a full zone's answer in ngx too).
    Push,
    /// A list's pop: the least recently used values that are not lists go (a pop must not
    /// cost another queue its elements), for the shorter copy beside the list.
    Pop,
}

impl Room {
    /// Whether the live value of entry `e` may go.
    fn may_evict(self, e: &Entry<'_>) -> bool {
        match self {
            Room::Evict => true,
            Room::Pop => !e.is_list(),
            Room::Expired | Room::Push => false,
        }
    }

    /// Whether the key's own value may go first, when only it can make the room.
    fn own_first(self) -> bool {
        self != Room::Push
    }

    /// `NoMemory`'s words when the heap cannot make the room this way.
    fn no_room(self) -> &'static str {
        match self {
            Room::Evict => "the heap has no room for the value, even evicting every other value",
            Room::Expired => {
                "the heap has no room for the value without evicting (a safe_ store, and a \
                 push, evict nothing)"
            }
            Room::Push => {
                "the heap has no room for the list's new copy beside it (a push evicts nothing)"
            }
            Room::Pop => {
                "the heap has no room for the list's shorter copy, even evicting every value \
                 that is not a list"
            }
        }
    }
}

/// How [`SharedDict::take_blocks`] made room.
enum Taken {
    /// From free blocks, or others' values.
    Fresh,
    /// The key's own value went first.
    OwnFreed,
    /// The key's entry was marked by a stale writer: start the operation over.
    Retry,
}

/// Where a process's next take from the heap looks first: the map word its last one
/// ended at, kept when the take is done.
struct NextFit<'a> {
    at: usize,
    kept: &'a std::sync::atomic::AtomicUsize,
}

impl<'a> NextFit<'a> {
    fn new(kept: &'a std::sync::atomic::AtomicUsize) -> Self {
        NextFit {
            at: kept.load(Ordering::Relaxed),
            kept,
        }
    }
}

impl Drop for NextFit<'_> {
    fn drop(&mut self) {
        self.kept.store(self.at, Ordering::Relaxed);
    }
}

/// A heap value as a scan ranked it: expired ones first, then by stamp (see `recency.rs`).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Rank {
    live: bool,
    stamp: u64,
    entry: u32,
    first: u32,
    blocks: u32,
}

/// At most how many ranks a process keeps from a scan of the heap's values (24 bytes each).
const KEPT_RANKS: usize = 1 << 16;

/// How long ranks kept from a scan are used: a value that expires is evicted first only
/// as far as the last scan knows, so at most this late.
const RANKS_LAST: u64 = 1_000_000_000;

/// The ranks a process kept from its last scan of the heap's values (the least recently
/// used last), and what makes them out of date.
#[derive(Default)]
struct Ranked {
    ranks: Vec<Rank>,
    /// The dict's `MOVES` when the scan began.
    moves: u64,
    /// When the scan was made, and when the first live value it saw expires.
    made_at: u64,
    next_expiry: u64,
}

/// A write under way, counted in the writer's registry entry (see `Registry::ops`) for a
/// dict with a heap, from before it asks for the writer lock until after it lets go: the
/// heap is swept only when no other live registration counts one, so that no writer taken
/// over may still write into blocks it took, or free its own.
struct HeapOps<'a>(Option<&'a AtomicU64>);

impl Drop for HeapOps<'_> {
    fn drop(&mut self) {
        if let Some(word) = self.0 {
            // Release: the sweeper that reads the count down sees this writer's writes.
            word.fetch_sub(1 << 32, Ordering::Release);
        }
    }
}

/// An `Option<usize>` in one word (`usize::MAX` for `None`, never an entry's index): a
/// `Cell<Option<usize>>` is two words, written one at a time and read back in one wider
/// load, which stalls on store forwarding.
struct Spot(std::cell::Cell<usize>);

impl Spot {
    const NONE: usize = usize::MAX;

    fn none() -> Spot {
        Spot(std::cell::Cell::new(Self::NONE))
    }

    fn get(&self) -> Option<usize> {
        Some(self.0.get()).filter(|&i| i != Self::NONE)
    }

    fn set(&self, at: Option<usize>) {
        self.0.set(at.unwrap_or(Self::NONE));
    }

    fn replace(&self, at: Option<usize>) -> Option<usize> {
        let was = self.get();
        self.set(at);
        was
    }

    fn take(&self) -> Option<usize> {
        self.replace(None)
    }
}

/// The entry count's bits of its control word (the tag of the hold that wrote it above).
const COUNT_BITS: u64 = 0xffff_ffff;

fn count_of(word: u64) -> u64 {
    word & COUNT_BITS
}

fn ttl_ns(ttl: Duration) -> u64 {
    ttl.as_nanos().min(u128::from(u64::MAX - 1)) as u64
}
