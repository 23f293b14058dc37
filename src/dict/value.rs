//! The values a dict stores: bytes, `i64` numbers, `f64` numbers and booleans (ngx's
//! strings, numbers and booleans), how each is laid out in an entry, the numbers `incr`
//! adds, and how a list lays out its elements.

use super::entry::Kind;

/// A value in the dict: bytes, a number (an `i64`, what an integer [`incr`] makes; an
/// `f64`, what a float one makes), or a boolean.
///
/// Two values are equal when they are the same stored value: floats compare by their
/// bits (a NaN equals itself; `0.0` and `-0.0` differ), so that `Value` is `Eq`.
///
/// [`incr`]: crate::SharedDict::incr
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Value {
    /// Any bytes.
    Bytes(Vec<u8>),
    /// A signed 64-bit integer.
    Int(i64),
    /// A 64-bit float (ngx's numbers are these).
    Float(f64),
    /// A boolean.
    Bool(bool),
}

impl PartialEq for Value {
    fn eq(&self, other: &Value) -> bool {
        ValueRef::from(self) == ValueRef::from(other)
    }
}

impl Eq for Value {}

impl Value {
    /// The bytes, if this is a byte value.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Value::Bytes(b) => Some(b),
            _ => None,
        }
    }

    /// The bytes, taken out; any other value comes back as the error.
    pub fn into_bytes(self) -> Result<Vec<u8>, Value> {
        match self {
            Value::Bytes(b) => Ok(b),
            other => Err(other),
        }
    }

    /// The integer, if this is one.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(n) => Some(*n),
            _ => None,
        }
    }

    /// The number as an `f64`, if this is a number (an integer converted, as ngx has
    /// only doubles).
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Int(n) => Some(*n as f64),
            Value::Float(x) => Some(*x),
            _ => None,
        }
    }

    /// The boolean, if this is one.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// The value of an entry's kind and bytes (as [`ValueRef::encode`] laid them out).
    #[inline]
    pub(crate) fn decode(kind: Kind, bytes: Vec<u8>) -> Value {
        match ValueRef::decode(kind, &bytes) {
            ValueRef::Int(n) => Value::Int(n),
            ValueRef::Float(x) => Value::Float(x),
            ValueRef::Bool(b) => Value::Bool(b),
            ValueRef::Bytes(_) => Value::Bytes(bytes),
        }
    }
}

/// A value to store: bytes (`&[u8]`, `&str`, `&Vec<u8>`, ...), a number (`i64`, `f64`)
/// or a boolean. Equal as [`Value`]s are (floats by their bits).
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum ValueRef<'a> {
    /// Bytes.
    Bytes(&'a [u8]),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A boolean.
    Bool(bool),
}

impl PartialEq for ValueRef<'_> {
    fn eq(&self, other: &ValueRef<'_>) -> bool {
        match (self, other) {
            (ValueRef::Bytes(a), ValueRef::Bytes(b)) => a == b,
            (ValueRef::Int(a), ValueRef::Int(b)) => a == b,
            (ValueRef::Float(a), ValueRef::Float(b)) => a.to_bits() == b.to_bits(),
            (ValueRef::Bool(a), ValueRef::Bool(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for ValueRef<'_> {}

impl<'a> ValueRef<'a> {
    /// The value of an entry's kind and bytes (as [`encode`](Self::encode) laid them out);
    /// a damaged number's missing bytes read as zeros.
    #[inline]
    pub(crate) fn decode(kind: Kind, bytes: &'a [u8]) -> ValueRef<'a> {
        let word = || {
            let mut w = [0u8; 8];
            let n = bytes.len().min(8);
            w[..n].copy_from_slice(&bytes[..n]);
            w
        };
        match kind {
            Kind::Bytes => ValueRef::Bytes(bytes),
            Kind::Int => ValueRef::Int(i64::from_le_bytes(word())),
            Kind::Float => ValueRef::Float(f64::from_bits(u64::from_le_bytes(word()))),
            Kind::Bool => ValueRef::Bool(bytes.first().is_some_and(|&b| b != 0)),
            // (never handed out: a list is read through the list operations)
            Kind::List => ValueRef::Bytes(bytes),
        }
    }

    /// The kind and bytes an entry stores: a number's 8 little-endian bytes, a boolean's
    /// one (0 or 1), put in `buf`, so nothing allocates.
    pub(crate) fn encode(self, buf: &'a mut [u8; 8]) -> (Kind, &'a [u8]) {
        match self {
            ValueRef::Bytes(b) => (Kind::Bytes, b),
            ValueRef::Int(n) => {
                *buf = n.to_le_bytes();
                (Kind::Int, &buf[..])
            }
            ValueRef::Float(x) => {
                *buf = x.to_bits().to_le_bytes();
                (Kind::Float, &buf[..])
            }
            ValueRef::Bool(b) => {
                buf[0] = u8::from(b);
                (Kind::Bool, &buf[..1])
            }
        }
    }
}

impl<'a> From<&'a [u8]> for ValueRef<'a> {
    fn from(b: &'a [u8]) -> Self {
        ValueRef::Bytes(b)
    }
}
impl<'a, const N: usize> From<&'a [u8; N]> for ValueRef<'a> {
    fn from(b: &'a [u8; N]) -> Self {
        ValueRef::Bytes(b)
    }
}
impl<'a> From<&'a Vec<u8>> for ValueRef<'a> {
    fn from(b: &'a Vec<u8>) -> Self {
        ValueRef::Bytes(b)
    }
}
impl<'a> From<&'a str> for ValueRef<'a> {
    fn from(s: &'a str) -> Self {
        ValueRef::Bytes(s.as_bytes())
    }
}
impl<'a> From<&'a String> for ValueRef<'a> {
    fn from(s: &'a String) -> Self {
        ValueRef::Bytes(s.as_bytes())
    }
}
impl From<i64> for ValueRef<'_> {
    fn from(n: i64) -> Self {
        ValueRef::Int(n)
    }
}
impl From<f64> for ValueRef<'_> {
    fn from(x: f64) -> Self {
        ValueRef::Float(x)
    }
}
impl From<bool> for ValueRef<'_> {
    fn from(b: bool) -> Self {
        ValueRef::Bool(b)
    }
}
impl<'a> From<&'a Value> for ValueRef<'a> {
    fn from(v: &'a Value) -> Self {
        match v {
            Value::Bytes(b) => ValueRef::Bytes(b),
            Value::Int(n) => ValueRef::Int(*n),
            Value::Float(x) => ValueRef::Float(*x),
            Value::Bool(b) => ValueRef::Bool(*b),
        }
    }
}

/// Owned values from what [`set`](crate::SharedDict::set) takes by reference: what a
/// [`get_or_fetch`](crate::SharedDict::get_or_fetch) fetch may return.
impl From<Vec<u8>> for Value {
    fn from(b: Vec<u8>) -> Self {
        Value::Bytes(b)
    }
}
impl From<&[u8]> for Value {
    fn from(b: &[u8]) -> Self {
        Value::Bytes(b.to_vec())
    }
}
impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::Bytes(s.into_bytes())
    }
}
impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::Bytes(s.as_bytes().to_vec())
    }
}
impl From<i64> for Value {
    fn from(n: i64) -> Self {
        Value::Int(n)
    }
}
impl From<f64> for Value {
    fn from(x: f64) -> Self {
        Value::Float(x)
    }
}
impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}

/// A number stored by `incr`: an integer or a float.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub enum Num {
    Int(i64),
    Float(f64),
}

impl Num {
    /// `self + by`: integers wrap; a float on either side makes a float.
    pub(crate) fn add(self, by: Num) -> Num {
        match (self, by) {
            (Num::Int(a), Num::Int(b)) => Num::Int(a.wrapping_add(b)),
            (Num::Int(a), Num::Float(b)) => Num::Float(a as f64 + b),
            (Num::Float(a), Num::Int(b)) => Num::Float(a + b as f64),
            (Num::Float(a), Num::Float(b)) => Num::Float(a + b),
        }
    }

    /// The number a value holds, if it is one.
    pub(crate) fn of(value: &Value) -> Option<Num> {
        match value {
            Value::Int(n) => Some(Num::Int(*n)),
            Value::Float(x) => Some(Num::Float(*x)),
            _ => None,
        }
    }

    pub(crate) fn value_ref(self) -> ValueRef<'static> {
        match self {
            Num::Int(n) => ValueRef::Int(n),
            Num::Float(x) => ValueRef::Float(x),
        }
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for i64 {}
    impl Sealed for f64 {}
}

/// What [`SharedDict::incr`](crate::SharedDict::incr) adds: an `i64` (the sum of two
/// integers is an integer, wrapping on overflow) or an `f64` (ngx's numbers: the sum is a
/// float, whatever the stored number was). Sealed: these two only.
pub trait Number: Copy + sealed::Sealed {
    #[doc(hidden)]
    fn num(self) -> Num;
    /// The sum as this type; `None` for an `i64` increment of a float value.
    #[doc(hidden)]
    fn of_sum(sum: Num) -> Option<Self>;
}

impl Number for i64 {
    fn num(self) -> Num {
        Num::Int(self)
    }
    fn of_sum(sum: Num) -> Option<i64> {
        match sum {
            Num::Int(n) => Some(n),
            Num::Float(_) => None,
        }
    }
}

impl Number for f64 {
    fn num(self) -> Num {
        Num::Float(self)
    }
    fn of_sum(sum: Num) -> Option<f64> {
        match sum {
            Num::Int(n) => Some(n as f64),
            Num::Float(x) => Some(x),
        }
    }
}

/// A list's value: its elements one after the other, each a kind byte, its length (4 bytes,
/// little-endian), its bytes as [`ValueRef::encode`] lays them out, and its length again
/// (so that the last element is found from the end, as a pop at the back of a list kept
/// in the heap does without reading the rest: see `api/list.rs`). The elements are those
/// that fit whole from the start, with both lengths the same: a reader stops at the first
/// that does not (a damaged file), so it never reads past the value.
///
/// Each operation walks the element heads once and allocates only for what it adds or
/// takes. This is the whole-value form, for a list kept in its entry (or moving between
/// the entry and the heap); a list in the heap changes by its edge blocks.
pub(crate) struct List {
    bytes: Vec<u8>,
    /// Where the list starts in `bytes` (a pop at the front moves it on rather than
    /// shifting every byte after the element).
    from: usize,
}

/// Bytes of an element before its value: the kind and the length.
pub(crate) const ELEMENT_HEAD: usize = 5;
/// Bytes of an element after its value: the length again.
pub(crate) const ELEMENT_TAIL: usize = 4;
/// Bytes of an element besides its value.
pub(crate) const ELEMENT_EXTRA: usize = ELEMENT_HEAD + ELEMENT_TAIL;

// (a list's count fits the 32 bits its entry keeps it in)
const _: () = assert!(crate::shm::format::MAX_HEAP_VALUE / ELEMENT_EXTRA as u64 <= 1 << 32);

/// The element `value` as a list holds it.
pub(crate) fn element(value: ValueRef<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    put_element(&mut out, value);
    out
}

/// Appends the element `value` to `out`.
fn put_element(out: &mut Vec<u8>, value: ValueRef<'_>) {
    let mut buf = [0u8; 8];
    let (kind, bytes) = value.encode(&mut buf);
    let len = (bytes.len() as u32).to_le_bytes();
    out.reserve(ELEMENT_EXTRA + bytes.len());
    out.push(kind as u8);
    out.extend_from_slice(&len);
    out.extend_from_slice(bytes);
    out.extend_from_slice(&len);
}

/// The value length an element's head (its first [`ELEMENT_HEAD`] bytes) or tail (its
/// last [`ELEMENT_TAIL`]) names.
pub(crate) fn element_len(head_or_tail: &[u8]) -> usize {
    let at = head_or_tail.len() - 4;
    u32::from_le_bytes(head_or_tail[at..].try_into().expect("4 bytes")) as usize
}

/// The value of a whole element (its head, bytes and tail, as [`element`] made it).
pub(crate) fn element_value(element: &[u8]) -> Value {
    // (an element is never a list: a damaged kind reads as a boolean, as before)
    let kind = match Kind::of(u64::from(element[0])) {
        Kind::List => Kind::Bool,
        kind => kind,
    };
    Value::decode(
        kind,
        element[ELEMENT_HEAD..element.len() - ELEMENT_TAIL].to_vec(),
    )
}

/// The end of the element that starts at `at` in `bytes`, if it fits whole.
fn element_end(bytes: &[u8], at: usize) -> Option<usize> {
    let head = bytes.get(at..at.checked_add(ELEMENT_HEAD)?)?;
    let len = element_len(head);
    let end = at.checked_add(ELEMENT_EXTRA)?.checked_add(len)?;
    let tail = bytes.get(end - ELEMENT_TAIL..end)?;
    (element_len(tail) == len).then_some(end)
}

/// How many whole elements the list `bytes` holds.
pub(crate) fn count_elements(bytes: &[u8]) -> usize {
    let (mut n, mut at) = (0, 0);
    while let Some(end) = element_end(bytes, at) {
        n += 1;
        at = end;
    }
    n
}

/// What one walk of a list finds: how many whole elements, where the last one starts and
/// where it ends (0 and 0 for none).
struct Walk {
    count: usize,
    last: usize,
    end: usize,
}

impl List {
    pub(crate) fn new(bytes: Vec<u8>) -> List {
        List { bytes, from: 0 }
    }

    /// The list's bytes, as they are to be stored.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.bytes[self.from..]
    }

    fn walk(&self) -> Walk {
        let bytes = self.bytes();
        let mut walk = Walk {
            count: 0,
            last: 0,
            end: 0,
        };
        while let Some(end) = element_end(bytes, walk.end) {
            walk.count += 1;
            walk.last = walk.end;
            walk.end = end;
        }
        walk
    }

    pub(crate) fn len(&self) -> usize {
        self.walk().count
    }

    /// Adds an element at the front or the back, and returns the new length.
    pub(crate) fn push(&mut self, value: ValueRef<'_>, front: bool) -> usize {
        let walk = self.walk();
        // (what a damaged file left past the last whole element goes)
        let whole = self.from + walk.end;
        if front {
            let mut out = Vec::with_capacity(ELEMENT_EXTRA + 8 + walk.end);
            put_element(&mut out, value);
            out.extend_from_slice(&self.bytes[self.from..whole]);
            *self = List::new(out);
        } else {
            self.bytes.truncate(whole);
            put_element(&mut self.bytes, value);
        }
        walk.count + 1
    }

    /// Takes the element at the front or the back; `None` if the list has none.
    pub(crate) fn pop(&mut self, front: bool) -> Option<Value> {
        let (start, end) = if front {
            (0, element_end(self.bytes(), 0)?)
        } else {
            let walk = self.walk();
            if walk.count == 0 {
                return None;
            }
            (walk.last, walk.end)
        };
        let (start, end) = (self.from + start, self.from + end);
        let value = element_value(&self.bytes[start..end]);
        if front {
            self.from = end;
        } else {
            self.bytes.truncate(start);
        }
        Some(value)
    }

    /// Whether the list has no whole element left.
    pub(crate) fn is_empty(&self) -> bool {
        element_end(self.bytes(), 0).is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(v: &[u8]) -> Option<Value> {
        Some(Value::Bytes(v.to_vec()))
    }

    #[test]
    fn a_list_pushes_and_pops_at_both_ends_and_counts_its_elements() {
        let mut list = List::new(Vec::new());
        assert!(list.is_empty());
        assert_eq!(list.pop(true), None);
        assert_eq!(list.pop(false), None);
        assert_eq!(list.push(ValueRef::Bytes(b"b"), false), 1);
        assert_eq!(list.push(ValueRef::Bytes(b"a"), true), 2);
        assert_eq!(list.push(ValueRef::Int(7), false), 3);
        assert_eq!(list.push(ValueRef::Bytes(b""), true), 4);
        assert_eq!(list.len(), 4);
        assert_eq!(list.pop(true), bytes(b""));
        assert_eq!(list.pop(false), Some(Value::Int(7)));
        // what a pop at the front leaves is what is stored, and reads back as such
        let stored = List::new(list.bytes().to_vec());
        assert_eq!(stored.len(), 2);
        assert_eq!(list.push(ValueRef::Bool(true), false), 3);
        assert_eq!(list.pop(true), bytes(b"a"));
        assert_eq!(list.pop(true), bytes(b"b"));
        assert!(!list.is_empty());
        assert_eq!(list.pop(false), Some(Value::Bool(true)));
        assert!(list.is_empty());
        assert_eq!(list.bytes(), b"");
    }

    #[test]
    fn a_damaged_list_reads_as_its_whole_elements_and_never_past_its_bytes() {
        let mut whole = List::new(Vec::new());
        whole.push(ValueRef::Bytes(b"one"), false);
        whole.push(ValueRef::Bytes(b"two"), false);
        let mut damaged = whole.bytes().to_vec();
        // an element whose length runs past the value, then stray bytes
        damaged.extend_from_slice(&[0, 0xff, 0xff, 0, 0, b'x', b'y']);
        let list = List::new(damaged.clone());
        assert_eq!(list.len(), 2);
        // a push at the back drops the stray bytes, one at the front keeps only the whole
        let mut back = List::new(damaged.clone());
        assert_eq!(back.push(ValueRef::Bytes(b"three"), false), 3);
        let mut front = List::new(damaged.clone());
        assert_eq!(front.push(ValueRef::Bytes(b"zero"), true), 3);
        for mut l in [back, front] {
            let mut n = 0;
            while l.pop(true).is_some() {
                n += 1;
            }
            assert_eq!(n, 3);
            assert!(l.is_empty());
        }
        let mut popped = List::new(damaged);
        assert_eq!(popped.pop(false), bytes(b"two"));
        assert_eq!(popped.pop(true), bytes(b"one"));
        assert!(popped.is_empty());
        // a head cut short, stray bytes, a tail that names another length: no element
        let tail_differs = [0, 1, 0, 0, 0, b'x', 2, 0, 0, 0];
        for cut in [&[0u8, 3, 0][..], &[1, 2, 0, 0, 0, 9], &tail_differs] {
            let mut l = List::new(cut.to_vec());
            assert!(l.is_empty());
            assert_eq!(l.len(), 0);
            assert_eq!(l.pop(true), None);
            assert_eq!(l.pop(false), None);
        }
    }
}
