//! How much of a cache of mixed value sizes a `SharedDict` of 64 MiB holds: the memory row
//! of issue #26 (item 1), beside `ngx.shared.DICT`'s figure from `scripts/nginx-zone.sh`.
//!
//! ```sh
//! cargo bench --bench dict_memory     # about 10 s
//! bash scripts/nginx-zone.sh          # nginx's lua_shared_dict 64m, the same fill
//! ```
//!
//! The fill: values of `x` whose sizes are log-uniform from 16 B to 64 KiB (Park-Miller LCG,
//! x = 48271 x mod 2^31-1, seed 42; u = (x-1)/(2^31-2); size = floor(16 * 4096^u)), keys
//! `k:1`, `k:2`, ... — the sequence the nginx script draws (its first ten sizes are printed
//! by both, to compare).
//!
//! Two dicts of a file of at most 64 MiB each, filled the same way:
//!
//! - **entries only**: every entry with room for the largest value (65,535 B), as many
//!   entries as the file takes;
//! - **a zone** (`zone_size(64 MiB)`): 16,384 entries (one per 4 KiB of the zone) with 16
//!   bytes of room (keys of up to 16 bytes), and the rest of the file a heap, which keeps
//!   every value longer than that.
//!
//! 1. **Fill**: `set` until the first forcible set (the dict is full): the values stored,
//!    their bytes of key + value, and the file's resident bytes (`st_blocks` on tmpfs) per
//!    byte stored.
//! 2. **Churn**: 100,000 more `set`s: how many failed, and the bytes of keys and values
//!    live at the end.
//!
//! The file goes to /dev/shm (or the temp dir) and is removed at the end.

#[path = "support/shm_dir.rs"]
mod shm_dir;

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::Duration;

use shmlock::{Error, SharedDict};

const ZONE: u64 = 64 << 20;
const MAX_VALUE: usize = 65_535;
const CHURN: usize = 100_000;

/// The fill's sizes, as the nginx script draws them.
struct Sizes {
    x: u64,
}

impl Sizes {
    const MOD: u64 = 2_147_483_647;

    fn new() -> Sizes {
        Sizes { x: 42 }
    }

    fn next_size(&mut self) -> usize {
        self.x = self.x * 48_271 % Sizes::MOD;
        let u = (self.x - 1) as f64 / (Sizes::MOD - 1) as f64;
        (16.0 * 4096f64.powf(u)).floor() as usize
    }
}

/// The dict of a 64 MiB zone (`zone_size`): entries with 16 bytes of room, one per 4 KiB
/// of the zone (16,384), and the rest of the file a heap.
fn open_heap(path: &PathBuf) -> SharedDict {
    let _ = std::fs::remove_file(path);
    SharedDict::options()
        .zone_size(ZONE)
        .max_key_len(16)
        .max_value_len(16)
        .open(path)
        .expect("open the dict")
}

/// The largest dict of 65,535-byte values whose file is at most 64 MiB.
fn open_largest(path: &PathBuf) -> SharedDict {
    let mut capacity = (ZONE / MAX_VALUE as u64) as usize;
    loop {
        let _ = std::fs::remove_file(path);
        let dict = SharedDict::options()
            .capacity(capacity)
            .max_key_len(16)
            .max_value_len(MAX_VALUE)
            .open(path)
            .expect("open the dict");
        if std::fs::metadata(path).unwrap().len() <= ZONE {
            return dict;
        }
        drop(dict);
        capacity -= 1;
    }
}

fn resident(path: &PathBuf) -> u64 {
    std::fs::metadata(path).unwrap().blocks() * 512
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("memory: bench");
        return;
    }
    let first: Vec<String> = {
        let mut s = Sizes::new();
        (0..10).map(|_| s.next_size().to_string()).collect()
    };
    println!("first 10 sizes (seed 42): {}", first.join(" "));
    let path = shm_dir::dir().join(format!("shmlock-bench-dict-memory-{}", std::process::id()));
    for (name, open) in [
        ("entries only", open_largest as fn(&PathBuf) -> SharedDict),
        ("a zone of 64 MiB (zone_size)", open_heap),
    ] {
        let dict = open(&path);
        run(name, &dict, &path);
        drop(dict);
        let _ = std::fs::remove_file(&path);
    }
}

fn run(name: &str, dict: &SharedDict, path: &PathBuf) {
    let mut sizes = Sizes::new();
    println!(
        "{name}: {} entries of up to {} B in the entry, a heap of {} B; file {} B",
        dict.capacity(),
        dict.entry_value_len(),
        dict.heap_size(),
        std::fs::metadata(path).unwrap().len()
    );
    let value = vec![b'x'; MAX_VALUE];
    let mut i = 0u64;
    let mut set = |dict: &SharedDict, i: &mut u64| -> (usize, Result<bool, Error>) {
        *i += 1;
        let n = sizes.next_size();
        let key = format!("k:{i}");
        let r = dict
            .set(&key, &value[..n], Duration::ZERO)
            .map(|s| s.forcible);
        (key.len() + n, r)
    };

    // 1. Fill
    let (mut stored, mut bytes) = (0u64, 0u64);
    loop {
        let (b, r) = set(dict, &mut i);
        match r {
            Ok(false) => {
                stored += 1;
                bytes += b as u64;
            }
            Ok(true) | Err(_) => break,
        }
    }
    let fill_resident = resident(path);
    println!(
        "  fill: {stored} values, {bytes} B of keys + values before the first forcible set; \
         64 MiB / stored = {:.3}; resident {} B = {:.3} per byte stored",
        ZONE as f64 / bytes as f64,
        fill_resident,
        fill_resident as f64 / bytes as f64
    );

    // 2. Churn
    let (mut failed, mut forcible) = (0u64, 0u64);
    let started = std::time::Instant::now();
    for _ in 0..CHURN {
        match set(dict, &mut i).1 {
            Ok(true) => forcible += 1,
            Ok(false) => {}
            Err(_) => failed += 1,
        }
    }
    let per_set = started.elapsed() / CHURN as u32;
    let live = dict.stats().bytes_in_use;
    let churn_resident = resident(path);
    println!(
        "  churn: {CHURN} more sets ({per_set:?} each), {forcible} forcible, {failed} failed; \
         live {} values, {live} B; resident {churn_resident} B = {:.3} per byte live; heap \
         free {} B",
        dict.len(),
        churn_resident as f64 / live as f64,
        dict.heap_free()
    );
}
