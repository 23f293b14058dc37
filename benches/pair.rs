//! Uncontended lock+unlock pair: one key, 1000 rotating keys, a new `Lock` per pair.
//!
//! `cargo bench --bench pair`

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, Criterion};

mod common;
use common::RobustMutex;
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
        b.iter(|| drop(table.lock(black_box("bench:hot"), opts).unwrap()))
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

criterion_group!(benches, pair);
criterion_main!(benches);
