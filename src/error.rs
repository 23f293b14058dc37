//! Errors.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

use crate::limits::MAX_CAPACITY;

/// Everything that can go wrong, as a value you can match on.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The key is empty.
    EmptyKey,
    /// The key is longer than [`MAX_KEY_LEN`](crate::MAX_KEY_LEN) bytes, or than a
    /// [`SharedDict`](crate::SharedDict)'s longest key.
    #[non_exhaustive]
    KeyTooLong {
        /// The key (its first bytes).
        key: KeyPreview,
        /// The key's length, in bytes.
        len: usize,
        /// The longest key there: [`MAX_KEY_LEN`](crate::MAX_KEY_LEN), or the dict's `max_key_len`.
        max: usize,
    },
    /// The key cannot be used where it was given: on a Redis Cluster, a key (or a prefix)
    /// that would leave the cluster hash tag of its lock's names empty (a key starting with
    /// `}`, a prefix whose first `{` is followed by `}`), so that they would not share a
    /// slot.
    #[non_exhaustive]
    InvalidKey {
        /// The key (its first bytes).
        key: KeyPreview,
        /// Why.
        reason: &'static str,
    },
    /// An option is out of range: of [`LockOptions`](crate::LockOptions), of a table's or
    /// a dict's options (a mode, a count), or an argument that needs another (an `incr`'s
    /// `init_ttl` without `init`). The text says which.
    InvalidOptions(&'static str),
    /// The capacity asked for is 0 or above [`MAX_CAPACITY`].
    InvalidCapacity(u64),
    /// The key or value lengths asked of a new [`SharedDict`](crate::SharedDict) are out
    /// of range.
    InvalidLayout(&'static str),
    /// [`DictOptions::zone_size`](crate::DictOptions::zone_size): the zone is too small
    /// for the dict's entries and fixed parts (its header, its registry of processes, its
    /// counters).
    #[non_exhaustive]
    ZoneTooSmall {
        /// The zone's bytes, as given.
        size: u64,
        /// Bytes the dict needs without a heap.
        needs: u64,
        /// Its entries.
        entries: u64,
    },
    /// The value is longer than the dict's longest value (chosen when it was created).
    #[non_exhaustive]
    ValueTooLong {
        /// The key (its first bytes).
        key: KeyPreview,
        /// Bytes given.
        len: usize,
        /// The dict's limit.
        max: usize,
    },
    /// [`SharedDict::add`](crate::SharedDict::add): the key already has a live value.
    #[non_exhaustive]
    Exists {
        /// The key (its first bytes).
        key: KeyPreview,
    },
    /// The key has no live value ([`replace`](crate::SharedDict::replace),
    /// [`incr`](crate::SharedDict::incr) without `init`, [`ttl`](crate::SharedDict::ttl),
    /// [`expire`](crate::SharedDict::expire)).
    #[non_exhaustive]
    NotFound {
        /// The key (its first bytes).
        key: KeyPreview,
    },
    /// [`SharedDict::incr`](crate::SharedDict::incr) on a value that is not a number.
    #[non_exhaustive]
    NotANumber {
        /// The key (its first bytes).
        key: KeyPreview,
    },
    /// [`SharedDict::incr`](crate::SharedDict::incr) with an `i64` on a float value (add
    /// an `f64`).
    #[non_exhaustive]
    NotAnInteger {
        /// The key (its first bytes).
        key: KeyPreview,
    },
    /// A list operation ([`SharedDict::lpush`](crate::SharedDict::lpush), ...) on a value
    /// that is not a list.
    #[non_exhaustive]
    NotAList {
        /// The key (its first bytes).
        key: KeyPreview,
    },
    /// [`SharedDict::get`](crate::SharedDict::get) (or `get_stale`) of a list: read it
    /// with the list operations.
    #[non_exhaustive]
    IsAList {
        /// The key (its first bytes).
        key: KeyPreview,
    },
    /// A store found no room for the key: a `safe_` store (which evicts nothing) or a new
    /// list found no free entry, or the heap no room; a push would grow the list past the
    /// dict's `max_value_len`; or a store that may evict found nothing it could evict.
    #[non_exhaustive]
    NoMemory {
        /// The key (its first bytes).
        key: KeyPreview,
        /// Which of those it was, in words.
        why: &'static str,
    },
    /// This [`Lock`](crate::Lock) already holds a key.
    Locked,
    /// The key stayed held by someone else for the whole timeout (with a timeout of zero:
    /// it was held at the one attempt).
    #[non_exhaustive]
    Timeout {
        /// The key (its first bytes).
        key: KeyPreview,
        /// The timeout that ran out (capped at the lock's exptime, as the wait is).
        timeout: Duration,
        /// Who held the key when the wait gave up, as far as the backend could tell
        /// (`None`: it was let go at that instant, or nothing could be read).
        holder: Option<HolderSeen>,
    },
    /// This lock holds nothing.
    Unlocked,
    /// The hold was lost before this call: its lease ran out (and someone freed or took
    /// the key), or it was broken by force. Whoever holds the key now was left untouched.
    Expired,
    /// A hold may not be renewed any longer: it has been held for the longest time its
    /// handle allows ([`RedisLocks::with_max_hold`](crate::RedisLocks)). The lease runs
    /// out at its current deadline.
    MaxHoldReached,
    /// Fewer replicas than required acknowledged a write that grants something (a hold,
    /// a renewal, a fencing token) in time: it was not granted (a new hold was released
    /// again). See `RedisLocks::with_replicas`.
    #[non_exhaustive]
    NotReplicated {
        /// Replicas that acknowledged the write.
        acked: u64,
        /// Replicas required.
        wanted: u64,
    },
    /// One of the Redis keys of the lock on `key` holds a value of a type this crate never
    /// writes there (a list where a hold's string goes, a string where the shared holds'
    /// hash goes), or its lock key holds a string that is not a hold's value (which starts
    /// with the hold's 32 hex digits of token): something else wrote it, and a wait for it
    /// could last for ever. Nothing was changed;
    /// [`RedisLocks::force_unlock`](crate::RedisLocks) removes it.
    #[non_exhaustive]
    WrongType {
        /// The lock's key (its first bytes).
        key: KeyPreview,
        /// The Redis key that holds the foreign value (its first bytes).
        redis_key: KeyPreview,
        /// Its Redis type, as `TYPE` names it (`list`, `string`, `hash`, ...).
        found: String,
    },
    /// The hold belongs to another process: this is a copy inherited across `fork`.
    NotOwner,
    /// The table has no room for the key among its live locks: every slot holds a live
    /// hold (an exclusive lock, or one shared or permit holder each); none was evicted.
    /// At least `capacity` holds always fit at once, and up to `slots`: each reader and
    /// each permit holder is a hold of its own, so readers of one key leave fewer keys
    /// room.
    #[non_exhaustive]
    TableFull {
        /// The key that found no room (its first bytes).
        key: KeyPreview,
        /// The table's capacity: how many holds always fit at once.
        capacity: usize,
        /// The table's slots, every one of which held a live hold (four per unit of
        /// capacity).
        slots: usize,
    },
    /// The key is held in shared mode with another count than the one asked for: a
    /// [`Semaphore`](crate::Semaphore) of `held` permits where `asked` were asked for (or
    /// the other way round). 0 stands for read holds
    /// ([`LockTable::lock_shared`](crate::LockTable::lock_shared)). The count of a
    /// semaphore is fixed for as long as any of its permits is held.
    #[non_exhaustive]
    PermitsMismatch {
        /// The key (its first bytes).
        key: KeyPreview,
        /// The count its holders use (0: read holds).
        held: u32,
        /// The count asked for (0: a read hold).
        asked: u32,
    },
    /// The table or dict was opened read-only (for inspection) and cannot be changed.
    ReadOnly,
    /// An async call (`lock_async`, `lock_shared_async`, a semaphore's `acquire_async`,
    /// `get_or_fetch_async`) ran outside a Tokio runtime: its waits sleep on Tokio's timers
    /// (and Redis's requests run on its I/O), so it refuses at once, whether or not it
    /// would have had to wait. (A runtime built without its time driver cannot be told
    /// from one with it: a wait there panics in Tokio, as `tokio::time::sleep` does.)
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    NoRuntime,
    /// Every entry of the file's owner registry is held by a live process: this process
    /// cannot register, so it cannot take locks (create the file with a larger
    /// `max_processes`).
    #[non_exhaustive]
    TooManyProcesses {
        /// The file.
        path: PathBuf,
        /// Its registry's entries.
        max: u32,
    },
    /// This writer stalled past the bound (stopped, or descheduled for that long) while it
    /// held a [`SharedDict`](crate::SharedDict)'s writer lock, and another writer took the
    /// lock over before its write was made: the write was not made (the key keeps the
    /// value it had before). A writer taken over once its write was made reports the
    /// write's own result. One exception: a value of a dict's heap that cannot be kept
    /// beside the value it replaces (even once every other value it may evict is gone)
    /// replaces it only after freeing it, so the key may then have no value (see
    /// [`DictOptions::heap_size`](crate::DictOptions::heap_size)).
    #[non_exhaustive]
    Stalled {
        /// The key the write was for (its first bytes); `None` for an operation on the
        /// whole dict (`flush_all`, `flush_expired`).
        key: Option<KeyPreview>,
    },
    /// The file at `path` is not a usable lock table.
    #[non_exhaustive]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        source: FormatError,
    },
    /// The Redis server could not be reached, or answered with an error.
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    Redis(redis::RedisError),
    /// The file system has no room for the table or dict being created at `path`: it
    /// needs `needed` bytes and `available` are free (a container's `/dev/shm` is often
    /// 64 MiB). Nothing was created.
    #[non_exhaustive]
    NoSpace {
        /// The file.
        path: PathBuf,
        /// Bytes the file needs.
        needed: u64,
        /// Bytes free on its file system.
        available: u64,
    },
    /// A table or dict is not made at `path`: a file of that path was deleted while the
    /// processes `pids` still use it, and a new one would not be theirs (a key could have
    /// a holder in each). `unseen`: processes that could not be looked at (other users,
    /// `hidepid`). Nothing was created.
    #[non_exhaustive]
    DeletedInUse {
        /// The path.
        path: PathBuf,
        /// The live processes that still map the deleted file.
        pids: Vec<u32>,
        /// Processes whose mappings could not be read.
        unseen: usize,
    },
    /// The path this table was opened by no longer leads to its file (`how`: "deleted", or
    /// "replaced by another file"): a process that opens the path gets another table, so
    /// this one takes no new holds. Holds already taken are renewed and released as usual
    /// (the processes that share the file still exclude each other); `check` says this.
    /// A [`SharedDict`](crate::SharedDict) whose path no longer leads to its file makes no
    /// more writes and no more reads of it (`get`, `get_with`, `get_stale`, `ttl`,
    /// `describe`, `llen`, `keys`; within 100 ms: the path is looked at no more often),
    /// where it would read and write what the other processes no longer see. (`len`,
    /// `free_slots` and the other counts, which return no `Result`, still read it.)
    #[non_exhaustive]
    TableGone {
        /// The path.
        path: PathBuf,
        /// What happened to the file.
        how: &'static str,
    },
    /// An operating-system error on `path` (permission denied, no space, ...).
    #[non_exhaustive]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
}

/// Who held a key when a wait for it gave up ([`Error::Timeout`]): what the backend saw of
/// the holder at that moment. Each field is `None` when it could not be told (a holder in
/// another pid namespace; a Redis value written by something else).
///
/// ```
/// use shmlock::{Error, LockOptions, LockTable};
/// use std::time::Duration;
///
/// # let path = std::env::temp_dir().join(format!("shmlock-doc-seen-{}", std::process::id()));
/// let table = LockTable::open(&path, 64)?;
/// let _held = table.lock("job", LockOptions::default())?;
/// let now = LockOptions { timeout: Duration::ZERO, ..LockOptions::default() };
/// let err = table.lock("job", now).unwrap_err();
/// let Error::Timeout { holder: Some(h), .. } = &err else { panic!("{err}") };
/// assert_eq!(h.pid, Some(std::process::id()));
/// assert!(h.this_process); // its own hold: `_held`
/// assert!(err.to_string().contains("is held by this process itself"));
/// # drop(_held); std::fs::remove_file(&path)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HolderSeen {
    /// The holder's process id (on its host, for Redis).
    pub pid: Option<u32>,
    /// The holder's host name (Redis; `None` on a lock table, which is this machine's).
    pub host: Option<String>,
    /// How long it had held the key. On a table, by its coarse clock (a tick, 4 ms at
    /// 250 Hz, short at most); on Redis, by the server's clock against the time the
    /// holder's clock wrote (clocks that disagree shift it).
    pub held_for: Option<Duration>,
    /// A reader's wait: a writer waited for the key too, and new readers defer to it
    /// (lock table). With no `pid` and no `held_for`, nobody held the key: its last reader
    /// had left, and it was kept for the writer
    /// ([`HolderState::Kept`](crate::HolderState::Kept)).
    pub writer_waits: bool,
    /// A writer's wait: nobody held the key, which was kept for readers waiting for it
    /// (lock table, [`HolderState::Kept`](crate::HolderState::Kept)).
    pub readers_wait: bool,
    /// The holder is the process that waited (by its pid, and on Redis its host name): a
    /// hold of its own, by another guard, handle or thread, which no wait of the process
    /// outlasts unless something releases it.
    pub this_process: bool,
}

impl HolderSeen {
    /// Nobody held the key: it was kept for a waiting writer, or waiting readers.
    fn kept(&self) -> bool {
        (self.writer_waits || self.readers_wait) && self.pid.is_none() && self.held_for.is_none()
    }

    fn kept_for(&self) -> &'static str {
        if self.readers_wait {
            "kept for waiting readers"
        } else {
            "kept for a waiting writer"
        }
    }
}

/// How long a holder had held its key, as messages say it: a table's coarse clock says 0
/// for a hold taken within its tick ("for 0.0ns" read as no hold at all).
fn held_for(d: Duration) -> String {
    if d < Duration::from_millis(1) {
        "under 1ms".to_string()
    } else {
        format!("{d:.1?}")
    }
}

impl fmt::Display for HolderSeen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.kept() {
            return f.write_str(self.kept_for());
        }
        f.write_str("held by ")?;
        match self.pid {
            Some(pid) if self.this_process => write!(f, "this process, pid {pid}")?,
            Some(pid) => write!(f, "pid {pid}")?,
            None => f.write_str("an unknown process")?,
        }
        if let Some(host) = &self.host {
            write!(f, " on {host}")?;
        }
        if let Some(d) = self.held_for {
            write!(f, " for {}", held_for(d))?;
        }
        if self.writer_waits {
            f.write_str(", with a writer waiting, which new readers defer to")?;
        }
        Ok(())
    }
}

/// The first bytes of a key, kept by an error to name it: at most
/// [`KeyPreview::MAX`] bytes, displayed quoted with anything unprintable escaped.
///
/// ```
/// use shmlock::KeyPreview;
///
/// let p = KeyPreview::new(b"user:42\x1b[2J");
/// assert_eq!(p.to_string(), r#""user:42\x1b[2J""#);
/// assert_eq!(KeyPreview::new("café\u{202e}".as_bytes()).to_string(), r#""café\u{202e}""#);
/// assert_eq!(KeyPreview::new(b"\xff\"q\"").to_string(), r#""\xff\"q\"""#);
/// assert_eq!(p.as_bytes(), b"user:42\x1b[2J");
/// let long = KeyPreview::new(&[b'k'; 300]);
/// assert_eq!((long.as_bytes().len(), long.len(), long.is_truncated()), (KeyPreview::MAX, 300, true));
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct KeyPreview {
    bytes: Box<[u8]>,
    len: usize,
}

impl KeyPreview {
    /// The most bytes of a key a preview keeps.
    pub const MAX: usize = 64;

    /// The preview of `key`.
    pub fn new(key: impl AsRef<[u8]>) -> KeyPreview {
        let key = key.as_ref();
        KeyPreview {
            bytes: key[..key.len().min(Self::MAX)].into(),
            len: key.len(),
        }
    }

    /// The bytes kept (the whole key unless it was longer than [`MAX`](Self::MAX)).
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The length of the whole key.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the key was longer than what is kept.
    pub fn is_truncated(&self) -> bool {
        self.len > self.bytes.len()
    }
}

impl fmt::Display for KeyPreview {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // UTF-8 shown as its characters (a key "café" reads so, not as "caf\xc3\xa9"),
        // controls and bidirectional overrides escaped (they would rewrite the line
        // shown), other bytes as `\xNN`.
        f.write_str("\"")?;
        for chunk in self.bytes.utf8_chunks() {
            for c in chunk.valid().chars() {
                match c {
                    '"' | '\\' => write!(f, "\\{c}")?,
                    ' '..='~' => write!(f, "{c}")?,
                    c if c.is_ascii() => write!(f, "{}", [c as u8].escape_ascii())?,
                    c if c.is_control() || is_bidi_control(c) => {
                        write!(f, "{}", c.escape_unicode())?
                    }
                    c => write!(f, "{c}")?,
                }
            }
            write!(f, "{}", chunk.invalid().escape_ascii())?;
        }
        f.write_str("\"")?;
        if self.is_truncated() {
            write!(f, "... ({} bytes)", self.len)?;
        }
        Ok(())
    }
}

/// The characters that reorder the text around them (Unicode's bidirectional controls).
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

impl fmt::Debug for KeyPreview {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Why a file is not a lock table this version can use.
// Its messages are written beside the format they describe (and whose version they name),
// in `shm/format.rs`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FormatError {
    /// No shmlock magic: another kind of file (or an all-zero one).
    NotATable,
    /// A shmlock table of another format version.
    UnsupportedVersion(u32),
    /// The file is shorter than its header says it must be. With `len` 0, an empty file:
    /// never a table still being made (one appears at its path only once whole), and its
    /// message says so.
    Truncated {
        /// Bytes present.
        len: u64,
        /// Bytes the layout needs.
        expected: u64,
    },
    /// The header is damaged or describes a layout this version does not write.
    Corrupt(&'static str),
    /// A shmlock file of the other kind: a shared dict opened as a lock table, or the
    /// other way round.
    WrongKind {
        /// What the file is.
        found: &'static str,
        /// What it was opened as.
        expected: &'static str,
    },
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: io::Error) -> Error {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn timeout(key: &[u8], timeout: Duration, holder: Option<HolderSeen>) -> Error {
        Error::Timeout {
            key: KeyPreview::new(key),
            timeout,
            holder,
        }
    }

    pub(crate) fn at(self, path: impl Into<PathBuf>) -> Error {
        match self {
            Error::Format { source, .. } => Error::Format {
                path: path.into(),
                source,
            },
            other => other,
        }
    }
}

#[cfg(feature = "redis")]
impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Error {
        Error::Redis(e)
    }
}

impl From<FormatError> for Error {
    fn from(source: FormatError) -> Error {
        Error::Format {
            path: PathBuf::new(),
            source,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::EmptyKey => f.write_str("empty key"),
            // (a preview cut short says the length itself)
            Error::KeyTooLong { key, max, .. } if key.is_truncated() => {
                write!(f, "key {key} is too long (at most {max} bytes here)")
            }
            Error::KeyTooLong { key, len, max } => {
                write!(
                    f,
                    "key {key} of {len} bytes is too long (at most {max} bytes here)"
                )
            }
            Error::InvalidKey { key, reason } => write!(f, "key {key} cannot be used: {reason}"),
            Error::InvalidOptions(why) => write!(f, "invalid options: {why}"),
            Error::InvalidCapacity(n) => {
                write!(f, "capacity {n} is out of range 1..={}", MAX_CAPACITY)
            }
            Error::InvalidLayout(why) => write!(f, "invalid dict layout: {why}"),
            Error::ZoneTooSmall {
                size,
                needs,
                entries,
            } => write!(
                f,
                "a dict zone of {size} bytes is too small: its {entries} entr{} and fixed \
                 parts take {needs} bytes (give a larger zone, or fewer entries, smaller \
                 ones or fewer processes)",
                if *entries == 1 { "y" } else { "ies" }
            ),
            Error::ValueTooLong { key, len, max } => write!(
                f,
                "key {key}: value of {len} bytes is longer than the dict's {max}"
            ),
            Error::Exists { key } => write!(f, "key {key} exists: it has a live value"),
            Error::NotFound { key } => write!(f, "key {key} not found: it has no live value"),
            Error::NotANumber { key } => write!(f, "key {key}: not a number"),
            Error::NotAList { key } => write!(f, "key {key}: value not a list"),
            Error::IsAList { key } => write!(f, "key {key}: value is a list"),
            Error::NotAnInteger { key } => write!(
                f,
                "key {key}: not an integer: the value is a float (add an f64 to it)"
            ),
            Error::NoMemory { key, why } => write!(f, "key {key}: no memory: {why}"),
            Error::Locked => f.write_str("locked: this lock already holds a key"),
            Error::Timeout {
                key,
                timeout,
                holder,
            } => {
                if let Some(h) = holder.as_ref().filter(|h| h.kept()) {
                    // nobody's hold to name
                    let kept = h.kept_for();
                    return if timeout.is_zero() {
                        write!(f, "timeout: key {key} is {kept}")
                    } else {
                        write!(
                            f,
                            "timeout: key {key} stayed busy for the whole {timeout:?} (at the \
                             end, {kept})"
                        )
                    };
                }
                if let Some(h) = holder.as_ref().filter(|h| h.this_process) {
                    write!(f, "timeout: key {key} ")?;
                    if timeout.is_zero() {
                        f.write_str("is held")?;
                    } else {
                        write!(f, "stayed held for the whole {timeout:?}")?;
                    }
                    f.write_str(" by this process itself (")?;
                    if let Some(pid) = h.pid {
                        write!(f, "pid {pid}")?;
                    }
                    if let Some(host) = &h.host {
                        write!(f, " on {host}")?;
                    }
                    if let Some(d) = h.held_for {
                        write!(f, ", for {}", held_for(d))?;
                    }
                    return f.write_str("): another guard, handle or thread of it holds the key");
                }
                if timeout.is_zero() {
                    write!(f, "timeout: key {key} is held by someone else")?;
                } else {
                    write!(
                        f,
                        "timeout: key {key} stayed held by someone else for the whole {timeout:?}"
                    )?;
                }
                match holder {
                    Some(h) => write!(f, " ({h})"),
                    None => Ok(()),
                }
            }
            Error::Unlocked => f.write_str("unlocked: this lock holds nothing"),
            Error::Expired => f.write_str(
                "expired: the hold was lost before this call (its lease ran out, or it was \
                 broken by force); whoever holds the key now was left untouched",
            ),
            Error::MaxHoldReached => {
                f.write_str("the hold reached its longest allowed time and is not renewed")
            }
            Error::NotReplicated { acked, wanted } => write!(
                f,
                "not replicated: {acked} of {wanted} required replicas acknowledged in time"
            ),
            Error::WrongType {
                key,
                redis_key,
                found,
            } => write!(
                f,
                "key {key}: its Redis key {redis_key} holds a {found} shmlock did not write \
                 (something else wrote it, or another program uses this prefix; \
                 force_unlock, `shmlock unlock --force`, removes it)"
            ),
            Error::NotOwner => f.write_str("not owner: the hold belongs to the parent process"),
            Error::TableFull {
                key,
                capacity,
                slots,
            } => write!(
                f,
                "lock table full: no room for key {key}: each of its {slots} slots holds a \
                 live lock (capacity {capacity}: at least {capacity} holds always fit at once, \
                 each reader or permit holder one); none was evicted (create the table with a \
                 larger capacity)"
            ),
            Error::PermitsMismatch { key, held, asked } => {
                let says = |n: &u32| match n {
                    0 => "read holds".to_string(),
                    n => format!("a semaphore of {n} permits"),
                };
                write!(
                    f,
                    "key {key} is held as {} but was asked for as {}",
                    says(held),
                    says(asked)
                )
            }
            Error::ReadOnly => f.write_str("opened read-only: this handle cannot change it"),
            #[cfg(feature = "tokio")]
            Error::NoRuntime => f.write_str(
                "no Tokio runtime: the async calls must run inside one, with its time \
                 driver enabled (`#[tokio::main]`, or a runtime `Builder` with `enable_all`)",
            ),
            Error::TooManyProcesses { path, max } => write!(
                f,
                "{}: all {max} owner-registry entries are held by live processes \
                 (create the file with a larger max_processes: `shmlock create \
                 --max-processes N`, or the options' `max_processes`)",
                path.display()
            ),
            Error::Stalled { key: Some(key) } => write!(
                f,
                "key {key}: stalled: this writer held the dict's writer lock past the bound \
                 and was taken over; the write was not made"
            ),
            Error::Stalled { key: None } => f.write_str(
                "stalled: this writer held the dict's writer lock past the bound and was \
                 taken over; the write was not made",
            ),
            Error::Format { path, source } => write!(f, "{}: {source}", path.display()),
            Error::NoSpace {
                path,
                needed,
                available,
            } => write!(
                f,
                "{}: needs {needed} bytes ({:.1} MiB) and its file system has {available} free \
                 ({:.1} MiB): create it with a smaller capacity, or on a file system with more \
                 room (a container's /dev/shm is often 64 MiB)",
                path.display(),
                *needed as f64 / 1_048_576.0,
                *available as f64 / 1_048_576.0
            ),
            Error::DeletedInUse { path, pids, unseen } => {
                write!(
                    f,
                    "{}: a shmlock file of this path was deleted while processes {} still use it; \
                     one made here now would not be theirs (a key could be held twice): \
                     stop them first, or use another path",
                    path.display(),
                    pids.iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                )?;
                if *unseen > 0 {
                    let n = if *unseen == 1 { "process" } else { "processes" };
                    write!(f, " ({unseen} other {n} could not be looked at)")?;
                }
                f.write_str(
                    ". Keep tables where cleaners do not reach them: /run/APP/ (systemd's \
                     RuntimeDirectory=), or set RemoveIPC=no",
                )
            }
            Error::TableGone { path, how } => write!(
                f,
                "{}: the file was {how} while in use; a process that opens the path gets \
                 the other file, so this handle takes no new holds (a lock table) and \
                 makes no more reads or writes (a dict) of this one (open the path again)",
                path.display()
            ),
            Error::Io { path, source } => write!(f, "{}: {source}", path.display()),
            #[cfg(feature = "redis")]
            Error::Redis(e) => write!(f, "redis: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            Error::Format { source, .. } => Some(source),
            #[cfg(feature = "redis")]
            Error::Redis(e) => Some(e),
            _ => None,
        }
    }
}

impl std::error::Error for FormatError {}
