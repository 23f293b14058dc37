//! The harness of the test binaries that fork (`harness = false`): single-threaded, so a
//! forked child is a copy of the whole process.
#![allow(dead_code)]

use std::io::Write;
use std::time::Instant;

pub type TestFn = fn();

/// Runs the tests whose name contains the first bare argument (cargo passes libtest flags
/// such as `--quiet`), printing a line each, and exits 0 if all passed. With
/// `--role NAME ARGS…` runs `role` instead: a test starting this binary as an unrelated
/// process.
pub fn main(binary: &str, tests: &[(&'static str, TestFn)], role: fn(&[String]) -> i32) -> ! {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--role") {
        std::process::exit(role(&args[i + 1..]));
    }
    let filter = args.iter().skip(1).find(|a| !a.starts_with('-'));
    let (mut passed, mut failed) = (0, 0);
    for &(name, test) in tests {
        if filter.is_some_and(|f| !name.contains(f.as_str())) {
            continue;
        }
        print!("test {name} ... ");
        std::io::stdout().flush().unwrap();
        let started = Instant::now();
        match std::panic::catch_unwind(test) {
            Ok(()) => {
                passed += 1;
                println!("ok ({:.2}s)", started.elapsed().as_secs_f64());
            }
            Err(_) => {
                failed += 1;
                println!("FAILED");
            }
        }
    }
    println!("\n{binary}: {passed} passed, {failed} failed");
    std::process::exit(if failed == 0 { 0 } else { 1 });
}

/// For binaries that start no roles.
pub fn no_roles(args: &[String]) -> i32 {
    eprintln!("unknown role {:?}", args.first());
    2
}
