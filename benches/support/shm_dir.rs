//! Where the benches put their files: /dev/shm (tmpfs, as a deployment would), or the
//! temp dir where there is none.

use std::path::PathBuf;

pub fn dir() -> PathBuf {
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() {
        shm
    } else {
        std::env::temp_dir()
    }
}
