//! `shmlock`: run commands under a named lock, inspect a table, show its counters, break a
//! stuck lock.
//!
//! Built on the public API only. This file parses the command line, sets up `run`'s signal
//! handling, picks the table file or Redis, and turns the result into the exit code.

/// A line to stderr. A write that fails is dropped, where `eprintln!` panics (a closed
/// pipe, EPIPE, as Rust ignores SIGPIPE): there is nowhere else to report it, and `run`
/// must not die of its `--verbose` lines. The line goes in one write, where `eprintln!`
/// writes it piece by piece, between which the command's own output on the same stderr
/// could land; a status line on the screen is erased first (`status::say_line`).
macro_rules! say {
    ($($arg:tt)*) => {{
        let mut line = format!($($arg)*);
        line.push('\n');
        crate::status::say_line(&line);
    }};
}

/// A line of the command's output to stdout, as `println!` writes it; a write that fails
/// is an error (`Err(Fail)`, 74 EX_IOERR, as `inspect` and `stats` fail), not a panic.
macro_rules! tell {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout(), $($arg)*).map_err(crate::exit::stdout_failed)
    }};
}

mod args;
mod create;
mod exit;
mod inspect;
mod json;
mod redis_cmd;
mod run;
mod show;
mod signals;
mod stats;
mod status;
mod text;
mod unlock;

use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use shmlock::LockTable;

use crate::args::{Cli, Cmd, DEFAULT_CAPACITY, DEFAULT_FILE, DEFAULT_REDIS_PREFIX};
use crate::exit::{Fail, EX_USAGE};
use crate::redis_cmd::Topology;
use crate::signals::Signals;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version go to stdout with 0; errors to stderr with EX_USAGE.
            let printed = e.print().and_then(|()| std::io::stdout().flush());
            if e.use_stderr() {
                return ExitCode::from(EX_USAGE);
            }
            // A help that could not be written fails as any output does; a reader that
            // went away (`shmlock --help | head`) had what it wanted.
            return match printed {
                Err(err) if err.kind() != std::io::ErrorKind::BrokenPipe => {
                    let Fail(msg, code) = exit::stdout_failed(err);
                    say!("shmlock: {msg}");
                    ExitCode::from(code)
                }
                _ => ExitCode::SUCCESS,
            };
        }
    };
    if let Cmd::Run(a) = &cli.command {
        // Before anything could start a thread.
        if let Err(Fail(msg, code)) = Signals::start(a.verbose, !a.close) {
            say!("shmlock: {msg}");
            return ExitCode::from(code);
        }
    }
    if cli.redis.is_none() && cli.redis_prefix.is_some() {
        // (not clap's `requires`, which --file, conflicting with --redis, turns off)
        say!(
            "shmlock: --redis-prefix needs --redis: it names keys in Redis, and a table file \
             has no prefix"
        );
        return ExitCode::from(EX_USAGE);
    }
    let file = cli
        .file
        // (set but empty, as `SHMLOCK_FILE= cmd` leaves it: unset)
        .or_else(|| {
            std::env::var_os("SHMLOCK_FILE")
                .filter(|f| !f.is_empty())
                .map(PathBuf::from)
        })
        .unwrap_or_else(|| PathBuf::from(DEFAULT_FILE));
    // Usage errors first: before a table file is made or a server is asked.
    let usage = match &cli.command {
        Cmd::Run(a) => run::check_args(a).map(|_| ()),
        command if cli.redis.is_some() => redis_cmd::usage(command),
        _ => Ok(()),
    };
    if let Err(Fail(msg, code)) = usage {
        say!("shmlock: {}", exit::one_line(&msg));
        return ExitCode::from(code);
    }
    let result = match (&cli.redis, cli.command) {
        (None, Cmd::Run(a)) => LockTable::open(&file, DEFAULT_CAPACITY)
            .map_err(Fail::from)
            .and_then(|t| match (a.shared, a.permits) {
                (true, _) => run::run(t.shared(), a),
                (false, Some(n)) => {
                    let sem = t.semaphore(a.key.as_bytes(), n).map_err(|e| match e {
                        shmlock::Error::InvalidOptions(_) => Fail(
                            format!(
                                "--permits must be between 1 and the table's capacity ({})",
                                t.capacity()
                            ),
                            EX_USAGE,
                        ),
                        e => Fail::from(e),
                    })?;
                    run::run(&sem, a)
                }
                (false, None) => run::run(&t, a),
            }),
        (None, Cmd::Inspect(a)) => {
            inspect::open_inspected(&file).and_then(|t| inspect::inspect(&t, &a))
        }
        (None, Cmd::Stats(a)) => {
            inspect::open_inspected(&file).and_then(|t| stats::stats(&t, &file, &a))
        }
        (None, Cmd::Unlock(a)) => unlock::unlock(&file, a),
        (None, Cmd::Create(a)) => create::create(&file, a),
        (Some(url), command) => {
            let topology = match (&cli.redis_sentinel, cli.redis_cluster) {
                (Some(master), _) => Topology::Sentinel(master),
                (None, true) => Topology::Cluster,
                (None, false) => Topology::Single,
            };
            let prefix = cli.redis_prefix.as_deref().unwrap_or(DEFAULT_REDIS_PREFIX);
            redis_cmd::dispatch(url, topology, prefix, command)
        }
    };
    match result {
        Ok(code) => {
            // (the lock is released, and every table and connection dropped, by now)
            if let Some(sig) = run::to_die_of() {
                signals::die_of(sig);
            }
            ExitCode::from(code)
        }
        Err(Fail(msg, code)) => {
            say!("shmlock: {}", exit::one_line(&msg));
            ExitCode::from(code)
        }
    }
}
