//! The stampede demo (examples/stampede_server.rs) end to end: a prefork HTTP server on
//! a SharedDict cache, hit by many concurrent requests for a few items.
//!
//! Its own small harness (`harness = false`), so that the process is single-threaded
//! whenever the demo forks its workers. `stampede FILTER` runs the tests whose name
//! contains FILTER.

mod common;

// The test uses the demo's `run`; its command line (`main` and the rest) is dead here.
#[allow(dead_code)]
#[path = "../examples/stampede_server.rs"]
mod demo;

use std::time::Duration;

use common::harness::TestFn;

const TESTS: &[(&str, TestFn)] = &[
    (
        "with_the_lock_each_item_is_fetched_once",
        with_the_lock_each_item_is_fetched_once,
    ),
    (
        "without_the_lock_for_contrast",
        without_the_lock_for_contrast,
    ),
];

fn main() {
    common::harness::main("stampede", TESTS, common::harness::no_roles);
}

fn short_round(lock: bool) -> demo::Config {
    demo::Config {
        workers: 2,
        requests: 200,
        ids: 4,
        delay: Duration::from_millis(100),
        lock,
        ..demo::Config::default()
    }
}

/// 200 concurrent requests for 4 missing items, across 2 processes: every one is
/// answered with its item's value, and the backend is called exactly once per item.
/// (Without the lock, nearly every request calls it.) Nothing here depends on timing:
/// however the requests interleave, the lock allows one fetch per item.
fn with_the_lock_each_item_is_fetched_once() {
    let cfg = short_round(true);
    let report = demo::run(&cfg).expect("the demo round");
    assert_eq!(report.dead_workers, 0, "a worker crashed");
    assert_eq!(
        (report.served, report.failed),
        (cfg.requests, 0),
        "every request answered 200; failures: {:?}",
        report.errors
    );
    assert_eq!(report.wrong_bodies, 0, "every body is its item's value");
    assert_eq!(
        report.calls,
        vec![1; cfg.ids],
        "one backend call per item; sources: {:?}",
        report.sources
    );
    // The one request per item that fetched; all the others found the value.
    assert_eq!(report.source("fetched"), cfg.ids, "{:?}", report.sources);
    assert_eq!(
        report.source("filled") + report.source("cache"),
        cfg.requests - cfg.ids,
        "{:?}",
        report.sources
    );
}

/// The same round without the lock. How many requests miss before the first value is
/// stored depends on scheduling, so only that count is printed; what does not depend on
/// it is asserted: every request is answered with its item's value, and every answer that
/// says `fetched` is exactly one backend call.
fn without_the_lock_for_contrast() {
    let cfg = short_round(false);
    let report = demo::run(&cfg).expect("the demo round");
    print!(
        "{} backend calls for {} requests ({} served) ... ",
        report.total_calls(),
        report.requests,
        report.served
    );
    assert_eq!(report.dead_workers, 0, "a worker crashed");
    assert_eq!(
        (report.served, report.wrong_bodies),
        (cfg.requests, 0),
        "{:?}",
        report.errors
    );
    assert_eq!(report.total_calls(), report.source("fetched") as i64);
    assert!(report.calls.iter().all(|&c| c >= 1), "{:?}", report.calls);
}
