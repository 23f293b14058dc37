//! The limits every backend and file obeys: the public API exports them, the checks of
//! keys and layouts enforce them, and error messages name them.

/// The longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 65535;

/// The largest capacity a table can be created with.
pub const MAX_CAPACITY: usize = 1 << 24;
