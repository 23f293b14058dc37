//! The harness of the test binaries that fork (`harness = false`): single-threaded, so a
//! forked child is a copy of the whole process.
//!
//! Tests that need root (namespaces, mounts, uid switches) are marked with the reason and
//! treated as libtest treats `#[ignore]`d tests: they run only when `--include-ignored`
//! (everything) or `--ignored` (only them) is among the arguments, and only as root.
//! Otherwise they print `test NAME ... ignored (REASON)` and count as ignored, never as
//! passed. `scripts/test.sh` passes `--include-ignored` when it runs as root.
//!
//! Two more marks: a *release-only* test (tens of millions of lock operations) is listed as
//! ignored in a debug build unless named on the command line or `SHMLOCK_SLOW` is set; a
//! *known limit* (an attack that still succeeds, as docs/liveness.md's "Known limits" says) is
//! left out of the suite and run only with `--known-limits`, where it is expected to fail.
//!
//! `--list` prints every test of the binary, one `NAME: test` line each (as libtest does),
//! whatever its marks, and runs none.
#![allow(dead_code)]

use std::io::Write;
use std::time::Instant;

pub type TestFn = fn();

/// One test of a harness-less binary.
#[derive(Clone, Copy)]
pub struct Test {
    pub name: &'static str,
    pub run: TestFn,
    /// Why the test needs root, if it does (`"needs root: ..."`).
    pub needs_root: Option<&'static str>,
    /// Needs a release build to run in reasonable time.
    pub release_only: bool,
    /// An attack that still succeeds: run only with `--known-limits`.
    pub known_limit: bool,
}

impl Test {
    pub const fn new(name: &'static str, run: TestFn) -> Test {
        Test {
            name,
            run,
            needs_root: None,
            release_only: false,
            known_limit: false,
        }
    }

    /// Marks the test as needing a release build (see the module docs).
    pub const fn release_only(mut self) -> Test {
        self.release_only = true;
        self
    }

    /// Marks the test as a known limit (see the module docs).
    pub const fn known_limit(mut self) -> Test {
        self.known_limit = true;
        self
    }

    /// Marks the test as needing root, with the reason printed when it is not run.
    pub const fn needs_root(mut self, reason: &'static str) -> Test {
        self.needs_root = Some(reason);
        self
    }
}

/// Whether this process runs as root (effective uid 0).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// For the body of a root-needing test: fails loudly when not root, so that the test can
/// never pass by doing nothing.
pub fn require_root() {
    assert!(
        is_root(),
        "this test needs root (effective uid 0); it was run as uid {}",
        // SAFETY: as above.
        unsafe { libc::geteuid() }
    );
}

/// Runs the tests whose name contains the first bare argument (cargo passes libtest flags
/// such as `--quiet`), printing a line each, and exits 0 if all passed. With
/// `--role NAME ARGS…` runs `role` instead: a test starting this binary as an unrelated
/// process.
pub fn main(binary: &str, tests: &[(&'static str, TestFn)], role: fn(&[String]) -> i32) -> ! {
    let tests: Vec<Test> = tests
        .iter()
        .map(|&(name, run)| Test::new(name, run))
        .collect();
    run(binary, &tests, role)
}

/// [`main`] for tests that may be marked as needing root.
pub fn run(binary: &str, tests: &[Test], role: fn(&[String]) -> i32) -> ! {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--role") {
        std::process::exit(role(&args[i + 1..]));
    }
    let filter = args.iter().skip(1).find(|a| !a.starts_with('-'));
    if args.iter().any(|a| a == "--list") {
        let listed: Vec<&Test> = tests
            .iter()
            .filter(|t| filter.is_none_or(|f| t.name.contains(f.as_str())))
            .collect();
        for test in &listed {
            println!("{}: test", test.name);
        }
        println!("\n{} tests, 0 benchmarks", listed.len());
        std::process::exit(0);
    }
    let include_ignored = args.iter().any(|a| a == "--include-ignored");
    let only_ignored = args.iter().any(|a| a == "--ignored");
    let known_limits = args.iter().any(|a| a == "--known-limits");
    let slow = std::env::var_os("SHMLOCK_SLOW").is_some();
    let root = is_root();
    let (mut passed, mut failed, mut ignored) = (0, 0, 0);
    for test in tests {
        if filter.is_some_and(|f| !test.name.contains(f.as_str())) {
            continue;
        }
        if test.known_limit != known_limits {
            if !known_limits {
                println!(
                    "test {} ... not run (a known limit, see docs/liveness.md; run with \
                     --known-limits)",
                    test.name
                );
            }
            continue;
        }
        if test.release_only && cfg!(debug_assertions) && !slow && filter.is_none() {
            println!(
                "test {} ... ignored (needs a release build: tens of millions of lock \
                 operations; name it, or set SHMLOCK_SLOW=1)",
                test.name
            );
            ignored += 1;
            continue;
        }
        if only_ignored && test.needs_root.is_none() {
            continue; // as libtest: --ignored runs the ignored tests only
        }
        if let Some(reason) = test.needs_root {
            if !(include_ignored || only_ignored) {
                println!("test {} ... ignored ({reason})", test.name);
                ignored += 1;
                continue;
            }
            if !root {
                println!(
                    "test {} ... ignored ({reason}; this process is not root)",
                    test.name
                );
                ignored += 1;
                continue;
            }
        }
        print!("test {} ... ", test.name);
        std::io::stdout().flush().unwrap();
        let started = Instant::now();
        let outcome = std::panic::catch_unwind(test.run);
        let secs = started.elapsed().as_secs_f64();
        match outcome {
            Ok(()) => {
                passed += 1;
                println!("ok ({secs:.2}s)");
            }
            Err(_) => {
                failed += 1;
                println!("FAILED ({secs:.2}s)");
            }
        }
    }
    println!("\n{binary}: {passed} passed, {failed} failed, {ignored} ignored");
    std::process::exit(if failed == 0 { 0 } else { 1 });
}

/// For binaries that start no roles.
pub fn no_roles(args: &[String]) -> i32 {
    eprintln!("unknown role {:?}", args.first());
    2
}
