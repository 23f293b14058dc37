//! What a key may be: any bytes, 1 to [`MAX_KEY_LEN`] long, for every backend.

use crate::error::Error;
use crate::limits::MAX_KEY_LEN;

/// Keys are any bytes, 1 to [`MAX_KEY_LEN`] long.
pub(crate) fn check_key(key: &[u8]) -> Result<&[u8], Error> {
    if key.is_empty() {
        Err(Error::EmptyKey)
    } else if key.len() > MAX_KEY_LEN {
        Err(Error::KeyTooLong {
            len: key.len(),
            max: MAX_KEY_LEN,
        })
    } else {
        Ok(key)
    }
}
