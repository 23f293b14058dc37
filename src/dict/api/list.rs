//! ngx's list operations (`lpush`, `rpush`, `lpop`, `rpop`, `llen`): a list is one entry
//! whose value holds its elements (see [`List`]), written under the dict's writer lock like
//! any value, so lists are bounded by the dict's `max_value_len` as ngx's are by its zone,
//! and expire, evict and delete as any entry.

use super::*;
use crate::dict::value::{List, ELEMENT_HEAD};

impl SharedDict {
    /// Adds `value` at the head of the list under `key` and returns its length, as ngx's
    /// `lpush`. A key with no live value gets a new list (that never expires; `expire`
    /// sets a time to live, as for any value) in a free or expired entry: like ngx's, a
    /// push never evicts a live value, it is [`Error::NoMemory`] when there is no room. A
    /// list kept in the heap ([`heap_size`](crate::DictOptions::heap_size)) is written
    /// anew beside the old copy, which goes once the new one is in place: a push needs
    /// room for both (where ngx's grows the list by a node), and a pop may evict the least
    /// recently used values that are not lists for its shorter copy.
    /// [`Error::NotAList`] if the value is not a list; [`Error::NoMemory`] too if the list
    /// would be longer than the dict's `max_value_len` (each element takes 5 bytes besides
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
        let size = ELEMENT_HEAD + value.encode(&mut buf).1.len();
        if size > self.max_value_len() {
            return Err(Error::NoMemory {
                key: k.preview(),
                why: "a list of this one element would be longer than the dict's max_value_len",
            });
        }
        self.writing(Some(&k), |w| {
            let now = w.now.get();
            let mut bytes = Vec::new();
            // (`live`: the entry holds the list itself, which must stay until its new copy
            // is in place; an expired value there, the key's or another's, may go first)
            let (i, list, until, flags, live) = match self.lookup_locked(w, &k, Some(&mut bytes)) {
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
                    why: "the list would be longer than the dict's max_value_len",
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
            let mut value = Vec::new();
            let (i, c) = match self.lookup_locked(w, &k, Some(&mut value)) {
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
}
