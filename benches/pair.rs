//! Uncontended lock+unlock pair: one key, 1000 rotating keys, a new `Lock` per pair.
//!
//! `cargo bench --bench pair`

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, Criterion};
use shmlock::{Lock, LockOptions, LockTable};

fn table_path(name: &str) -> PathBuf {
    let dir = if std::path::Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let path = dir.join(format!("shmlock-bench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

fn pair(c: &mut Criterion) {
    let path = table_path("pair");
    let table = LockTable::open(&path, 4096).unwrap();
    let opts = LockOptions::default();
    let keys: Vec<String> = (0..1000).map(|i| format!("bench:key:{i}")).collect();

    let mut group = c.benchmark_group("uncontended_pair");
    group.bench_function("one_key", |b| {
        let mut lock = Lock::new(&table, opts).unwrap();
        b.iter(|| {
            lock.lock(black_box("bench:hot")).unwrap();
            lock.unlock().unwrap();
        })
    });
    group.bench_function("rotating_1000_keys", |b| {
        let mut lock = Lock::new(&table, opts).unwrap();
        let mut i = 0;
        b.iter(|| {
            lock.lock(black_box(&keys[i])).unwrap();
            lock.unlock().unwrap();
            i = if i == 999 { 0 } else { i + 1 };
        })
    });
    group.bench_function("new_lock_per_pair", |b| {
        b.iter(|| {
            let mut lock = Lock::new(&table, opts).unwrap();
            lock.lock(black_box("bench:hot")).unwrap();
            lock.unlock().unwrap();
        })
    });
    group.bench_function("guard", |b| {
        b.iter(|| drop(table.lock(black_box("bench:hot"), &opts).unwrap()))
    });
    group.bench_function("baseline_robust_pthread_mutex", |b| {
        let m = RobustMutex::new();
        b.iter(|| {
            m.lock();
            m.unlock();
        })
    });
    group.finish();
    drop(table);
    let _ = std::fs::remove_file(&path);
}

/// A process-shared robust `pthread_mutex_t` in a shared anonymous mapping: the kernel's
/// own crash-safe inter-process lock, for scale.
struct RobustMutex {
    ptr: *mut libc::pthread_mutex_t,
}

impl RobustMutex {
    fn new() -> RobustMutex {
        let len = std::mem::size_of::<libc::pthread_mutex_t>();
        // SAFETY: a fresh shared anonymous mapping, checked below; the mutex is initialised
        // in place with process-shared, robust attributes before any use.
        unsafe {
            let ptr = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(ptr, libc::MAP_FAILED);
            let mut attr = std::mem::zeroed::<libc::pthread_mutexattr_t>();
            libc::pthread_mutexattr_init(&mut attr);
            libc::pthread_mutexattr_setpshared(&mut attr, libc::PTHREAD_PROCESS_SHARED);
            libc::pthread_mutexattr_setrobust(&mut attr, libc::PTHREAD_MUTEX_ROBUST);
            let m = ptr.cast::<libc::pthread_mutex_t>();
            assert_eq!(libc::pthread_mutex_init(m, &attr), 0);
            RobustMutex { ptr: m }
        }
    }

    fn lock(&self) {
        // SAFETY: an initialised mutex that outlives the call.
        assert_eq!(unsafe { libc::pthread_mutex_lock(self.ptr) }, 0);
    }

    fn unlock(&self) {
        // SAFETY: held by this thread (locked just before).
        unsafe { libc::pthread_mutex_unlock(self.ptr) };
    }
}

criterion_group!(benches, pair);
criterion_main!(benches);
