//! What a key may be: any bytes, 1 to [`MAX_KEY_LEN`] long, for every backend.

use crate::error::{Error, KeyPreview};
use crate::limits::MAX_KEY_LEN;

/// Keys are any bytes, 1 to [`MAX_KEY_LEN`] long. (Inlined: it is on every acquisition,
/// and out of line its result comes back through memory.)
#[inline(always)]
pub(crate) fn check_key(key: &[u8]) -> Result<&[u8], Error> {
    if key.is_empty() {
        Err(Error::EmptyKey)
    } else if key.len() > MAX_KEY_LEN {
        Err(too_long(key, MAX_KEY_LEN))
    } else {
        Ok(key)
    }
}

/// The error for `key`, longer than `max` (out of line: the check is on every hot path).
#[cold]
#[inline(never)]
pub(crate) fn too_long(key: &[u8], max: usize) -> Error {
    Error::KeyTooLong {
        key: KeyPreview::new(key),
        len: key.len(),
        max,
    }
}
