//! `shmlock`: run commands under a named lock, inspect a table, break a stuck lock.
//!
//! Built on the public API only.

use std::io::{IsTerminal, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::{mpsc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::wait::{waitid, Id, WaitPidFlag};
use nix::unistd::{getpgid, getpgrp, Pid};

use clap::{ArgGroup, Args, Parser, Subcommand};
use shmlock::{
    Backend, Error, FormatError, Holder, HolderState, Lock, LockOptions, LockTable, RedisHolder,
    RedisLocks, SharedDict,
};

/// Where the table is when neither --file nor $SHMLOCK_FILE says.
const DEFAULT_FILE: &str = "/dev/shm/shmlock";
/// Capacity of a table that `run` creates because none existed.
const DEFAULT_CAPACITY: usize = 1024;

#[derive(Parser)]
#[command(
    name = "shmlock",
    version,
    about = "Named locks shared by the processes of one machine",
    long_about = "Named locks shared by the processes of one machine, kept in a lock table \
                  file (by default $SHMLOCK_FILE, else /dev/shm/shmlock). Like flock(1), with \
                  lease expiry, dead-owner recovery and inspection.",
    after_help = concat!(
        "Examples:\n",
        "  shmlock run nightly-report -- ./report.sh\n",
        "  shmlock inspect\n",
        "  shmlock --file /dev/shm/app-cache inspect      # a SharedDict: counters and keys\n",
        "  shmlock --file /dev/shm/app-locks unlock --force user:42\n",
        "  shmlock --redis redis://10.0.0.5:6379/ run nightly-report -- ./report.sh",
    )
)]
struct Cli {
    /// The lock table file [default: $SHMLOCK_FILE, else /dev/shm/shmlock]
    #[arg(long, global = true, value_name = "PATH", conflicts_with = "redis")]
    file: Option<PathBuf>,
    /// Use the locks in Redis instead of a table file: redis://[:PASSWORD@]host:port/db
    /// (rediss:// for TLS). Several URLs, comma-separated, with --redis-cluster or
    /// --redis-sentinel. A password may come from $REDISCLI_AUTH instead of the URL.
    #[arg(long, global = true, value_name = "URL")]
    redis: Option<String>,
    /// The --redis URLs are nodes of a Redis Cluster
    #[arg(
        long,
        global = true,
        requires = "redis",
        conflicts_with = "redis_sentinel"
    )]
    redis_cluster: bool,
    /// The --redis URLs are sentinels; use the master they know by this name
    #[arg(long, global = true, value_name = "MASTER", requires = "redis")]
    redis_sentinel: Option<String>,
    /// Key prefix in Redis
    #[arg(long, global = true, value_name = "PREFIX", default_value = "shmlock:")]
    redis_prefix: String,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    Run(RunArgs),
    Inspect(InspectArgs),
    Unlock(UnlockArgs),
    Create(CreateArgs),
}

/// Take KEY, run COMMAND, release when it exits; exit with its status
#[derive(Args)]
#[command(
    group(ArgGroup::new("what").required(true).args(["shell_command", "args"])),
    after_help = concat!(
    "Examples:\n",
    "  shmlock run backup -- rsync -a /data /backup    # wait as long as it takes\n",
    "  shmlock run -n backup -- ./backup.sh            # exit 1 at once if it is running\n",
    "  shmlock run -w 10 -E 75 deploy -- make deploy   # wait 10 s at most, then exit 75\n",
    "  shmlock run report -c 'make report | mail ops'  # a command line, through /bin/sh -c\n",
    "\n",
    "While shmlock waits with stderr on a terminal, a status line there shows who holds KEY\n",
    "(pid, how long) and how long it has waited; --verbose says the same in plain lines.\n",
    "\n",
    "While COMMAND runs the lease is renewed every EXPTIME/3, so a live job keeps the lock\n",
    "however long it runs and a dead one loses it within EXPTIME. SIGINT, SIGTERM, SIGHUP and\n",
    "SIGQUIT sent to shmlock are passed on to COMMAND, and the lock is released only once\n",
    "COMMAND has exited (its traps and cleanup run under the lock); one that arrives while\n",
    "shmlock still waits ends it with 128+signal, COMMAND not run. If shmlock itself is\n",
    "killed (SIGKILL), COMMAND is killed with it (PR_SET_PDEATHSIG), and the key is free for\n",
    "the next run. If the lease cannot be renewed (the lock was broken, a Redis server\n",
    "restarted empty, or no renewal got through for most of a lease), or COMMAND outlives\n",
    "--max-time, COMMAND is sent SIGTERM (SIGKILL 5 s later) and run exits 2.\n",
    "\n",
    "Exit status (flock(1)'s, <sysexits.h> for errors):\n",
    "  COMMAND's own status, or 128+N if it was killed by signal N\n",
    "  1 (or -E N)  the lock could not be taken (-n, or -w ran out)\n",
    "  2            COMMAND stopped by shmlock (lease lost, --max-time)\n",
    "  64           usage error (EX_USAGE)\n",
    "  65           the file is not a lock table (EX_DATAERR)\n",
    "  66           the file cannot be opened (EX_NOINPUT)\n",
    "  69           Redis unreachable or refusing (EX_UNAVAILABLE)\n",
    "  71, 73, 75   out of memory or descriptors (EX_OSERR), read-only or full file system\n",
    "               (EX_CANTCREAT), table or owner registry full (EX_TEMPFAIL)\n",
    "  126, 127     COMMAND found but not executable, or not found\n",
    "  128+N        shmlock got signal N while waiting for the lock",
))]
struct RunArgs {
    /// The lock name
    key: String,
    /// Give up after this many seconds of waiting [default: wait forever]
    #[arg(short = 'w', long = "timeout", value_name = "SECS")]
    timeout: Option<f64>,
    /// Lease length in seconds; renewed every third of it while COMMAND runs
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    exptime: f64,
    /// Do not wait: exit at once if the lock is held (same as -w 0)
    #[arg(short = 'n', long)]
    nonblock: bool,
    /// Exit code when the lock could not be taken
    #[arg(short = 'E', long, value_name = "N", default_value_t = 1)]
    conflict_exit_code: u8,
    /// Stop renewing after this many seconds: COMMAND is terminated and the lock released
    /// [default: no limit]
    #[arg(long, value_name = "SECS")]
    max_time: Option<f64>,
    /// Say on stderr who held the lock, how long it waited, and when it got it
    #[arg(long)]
    verbose: bool,
    /// Run this command line through /bin/sh -c instead of COMMAND
    #[arg(short = 'c', long = "command", value_name = "STRING")]
    shell_command: Option<String>,
    /// The command and its arguments
    #[arg(last = true, value_name = "COMMAND")]
    args: Vec<String>,
}

/// List the locks held in the table (or, for a SharedDict file, its counters and keys)
#[derive(Args)]
#[command(after_help = concat!(
    "Examples:\n",
    "  shmlock inspect\n",
    "  shmlock inspect --all --json | jq '.holders[] | select(.alive | not)'\n",
    "\n",
    "--json prints one object:\n",
    "  {\"file\", \"format_version\", \"capacity\", \"occupancy\", \"holders\": [{\"key\",\n",
    "   \"key_hex\", \"key_len\", \"truncated\", \"pid\", \"alive\", \"state\", \"age_ms\",\n",
    "   \"ttl_ms\", \"expired\", \"token\", \"waiters\"}]}\n",
    "\"key\" is the preview (first 32 bytes) as UTF-8 with invalid bytes replaced, \"key_hex\"\n",
    "the same bytes in hex; \"ttl_ms\" (never expires) and \"token\" may be null; \"state\" is\n",
    "\"held\", \"claiming\" or \"extending\".\n",
    "\n",
    "--watch prints the table again every second (--interval SECS) until interrupted: on a\n",
    "terminal the screen is cleared before each print, elsewhere a line \"--- TIME ---\"\n",
    "(UTC) comes before each. With --json, one object per line per print (NDJSON).",
))]
struct InspectArgs {
    /// Print JSON for scripts
    #[arg(long)]
    json: bool,
    /// Include expired entries and entries of dead owners
    #[arg(long)]
    all: bool,
    /// Print again every --interval until interrupted
    #[arg(short = 'w', long)]
    watch: bool,
    /// Seconds between two prints; implies --watch [default: 1]
    #[arg(long, value_name = "SECS")]
    interval: Option<f64>,
}

/// Break a lock, whoever holds it (prints who did)
#[derive(Args)]
#[command(after_help = "Example:\n  shmlock unlock --force user:42")]
struct UnlockArgs {
    /// The lock name
    key: String,
    /// Required: breaking a lock its holder still relies on is your decision
    #[arg(long)]
    force: bool,
}

/// Create a table file with a chosen capacity and mode
#[derive(Args)]
#[command(
    after_help = "Example:\n  shmlock --file /dev/shm/app-locks create --capacity 4096 --mode 0660"
)]
struct CreateArgs {
    /// How many keys can be held at once
    #[arg(long, default_value_t = DEFAULT_CAPACITY)]
    capacity: usize,
    /// Permission bits, octal
    #[arg(long, default_value = "0600", value_parser = parse_mode)]
    mode: u32,
}

fn parse_mode(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .ok_or_else(|| format!("{s:?} is not an octal mode"))
}

/// A failure, as one line on stderr and an exit code.
struct Fail(String, u8);

// Exit codes of <sysexits.h>, which flock(1) uses for everything but a lock it could not
// take and the command's own status.
/// The command line is wrong (clap's errors included; clap's own code would be 2).
const EX_USAGE: u8 = 64;
/// The file is not a usable lock table.
const EX_DATAERR: u8 = 65;
/// The file cannot be opened (as flock(1) exits when it cannot open its lock file).
const EX_NOINPUT: u8 = 66;
/// The Redis server cannot be reached or refuses.
const EX_UNAVAILABLE: u8 = 69;
/// Stdout cannot be written.
const EX_IOERR: u8 = 74;
/// Something that should not happen (lost track of the command).
const EX_SOFTWARE: u8 = 70;
/// The system is out of something (memory, file descriptors, processes).
const EX_OSERR: u8 = 71;
/// The file cannot be created (read-only file system, no space; `create` on an existing
/// file).
const EX_CANTCREAT: u8 = 73;
/// Full for now: no free slot in the table, no free entry in its owner registry.
const EX_TEMPFAIL: u8 = 75;
/// The command was found but could not be executed (as shells exit).
const EX_CANNOT_EXECUTE: u8 = 126;
/// The command was not found (as shells exit).
const EX_NOT_FOUND: u8 = 127;
/// `run` stopped its command: the lease was lost or --max-time passed.
const EX_TERMINATED: u8 = 2;

/// The exit code for an operating-system error, as flock(1) chooses it for its lock file.
fn os_error_code(e: &std::io::Error) -> u8 {
    match e.raw_os_error() {
        Some(libc::ENOMEM | libc::EMFILE | libc::ENFILE | libc::EAGAIN) => EX_OSERR,
        Some(libc::EROFS | libc::ENOSPC) => EX_CANTCREAT,
        _ => EX_NOINPUT,
    }
}

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        let code = match &e {
            Error::Io { source, .. } => os_error_code(source),
            Error::Format { .. } => EX_DATAERR,
            Error::EmptyKey
            | Error::KeyTooLong(_)
            | Error::InvalidOptions(_)
            | Error::InvalidCapacity(_)
            | Error::InvalidLayout(_) => EX_USAGE,
            Error::Redis(_) | Error::NotReplicated { .. } => EX_UNAVAILABLE,
            Error::TableFull { .. } | Error::TooManyProcesses { .. } | Error::NoMemory => {
                EX_TEMPFAIL
            }
            _ => EX_SOFTWARE,
        };
        Fail(e.to_string(), code)
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version go to stdout with 0; errors to stderr with EX_USAGE.
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { EX_USAGE } else { 0 });
        }
    };
    if let Cmd::Run(a) = &cli.command {
        // Before anything could start a thread.
        if let Err(Fail(msg, code)) = Signals::start(a.verbose) {
            eprintln!("shmlock: {msg}");
            return ExitCode::from(code);
        }
    }
    let file = cli
        .file
        .or_else(|| std::env::var_os("SHMLOCK_FILE").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_FILE));
    let result = match (&cli.redis, cli.command) {
        (None, Cmd::Run(a)) => LockTable::open(&file, DEFAULT_CAPACITY)
            .map_err(Fail::from)
            .and_then(|t| run(&t, a)),
        (None, Cmd::Inspect(a)) => open_inspected(&file).and_then(|t| inspect(&t, &a)),
        (None, Cmd::Unlock(a)) => unlock(&file, a),
        (None, Cmd::Create(a)) => create(&file, a),
        (Some(url), command) => {
            let topology = match (&cli.redis_sentinel, cli.redis_cluster) {
                (Some(master), _) => Topology::Sentinel(master),
                (None, true) => Topology::Cluster,
                (None, false) => Topology::Single,
            };
            redis(url, topology, &cli.redis_prefix, command)
        }
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(Fail(msg, code)) => {
            eprintln!("shmlock: {msg}");
            ExitCode::from(code)
        }
    }
}

fn secs(v: f64, what: &str) -> Result<Duration, Fail> {
    Duration::try_from_secs_f64(v)
        .map_err(|_| Fail(format!("{what} must be a number of seconds >= 0"), EX_USAGE))
}

/// What the --redis URLs name.
enum Topology<'a> {
    Single,
    Cluster,
    Sentinel(&'a str),
}

/// `url` with the password from $REDISCLI_AUTH if it has none (as redis-cli does), so a
/// password need not be on the command line. URLs that do not parse are left as they are
/// (opening them reports why).
fn with_env_password(url: &str) -> String {
    let Ok(password) = std::env::var("REDISCLI_AUTH") else {
        return url.to_string();
    };
    match redis::parse_redis_url(url) {
        Some(mut parsed) if parsed.password().is_none() => {
            if parsed.set_password(Some(&password)).is_ok() {
                parsed.to_string()
            } else {
                url.to_string()
            }
        }
        _ => url.to_string(),
    }
}

/// `url` for printing: any password replaced by `***`.
fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let Some(at) = authority.rfind('@') else {
        return url.to_string();
    };
    let userinfo = &authority[..at];
    let user = match userinfo.find(':') {
        Some(colon) => format!("{}:***", &userinfo[..colon]),
        None => userinfo.to_string(),
    };
    format!("{}{user}{}", &url[..scheme_end + 3], &rest[at..])
}

fn redis(url: &str, topology: Topology<'_>, prefix: &str, command: Cmd) -> Result<u8, Fail> {
    let urls: Vec<String> = url.split(',').map(with_env_password).collect();
    let redis = match topology {
        Topology::Single => RedisLocks::open(&urls[0])?,
        Topology::Cluster => RedisLocks::open_cluster(&urls)?,
        Topology::Sentinel(master) => RedisLocks::open_sentinel(master, &urls)?,
    }
    .with_prefix(prefix);
    match command {
        Cmd::Run(a) => run(&redis, a),
        Cmd::Inspect(a) => {
            let shown: Vec<String> = url.split(',').map(redact_url).collect();
            inspect(&Inspected::Redis(redis, shown.join(",")), &a)
        }
        Cmd::Unlock(a) => {
            refuse_without_force(&a)?;
            if redis.force_unlock(&a.key)? {
                println!("broke {:?}", a.key);
                Ok(0)
            } else {
                Err(Fail(format!("{:?} is not locked", a.key), 1))
            }
        }
        Cmd::Create(_) => Err(Fail(
            "create makes table files; a Redis server needs no creating".into(),
            EX_USAGE,
        )),
    }
}

fn write_redis(
    out: &mut impl Write,
    url: &str,
    held: &[RedisHolder],
    json: bool,
) -> std::io::Result<()> {
    let age = |h: &RedisHolder| {
        h.since
            .map(|t| SystemTime::now().duration_since(t).unwrap_or_default())
    };
    if json {
        let report = RedisReport {
            redis: url,
            holders: held
                .iter()
                .map(|h| RedisEntry {
                    key: String::from_utf8_lossy(&h.key).into_owned(),
                    key_hex: hex(&h.key),
                    ttl_ms: h.ttl.map(|d| d.as_millis() as u64),
                    token: h.last_token,
                    holder_token: h.token,
                    host: h.host.clone(),
                    pid: h.pid,
                    age_ms: age(h).map(|d| d.as_millis() as u64),
                    node: h.node.clone(),
                })
                .collect(),
        };
        return print_json(out, &report);
    }
    writeln!(
        out,
        "{}: {} locks held",
        printable(url.as_bytes()),
        held.len()
    )?;
    if held.is_empty() {
        return Ok(());
    }
    let cluster = held.iter().any(|h| !h.node.is_empty());
    write!(
        out,
        "{:<32} {:>24} {:>10} {:>10} {:>8}",
        "KEY", "HOLDER", "AGE", "TTL", "TOKEN"
    )?;
    writeln!(out, "{}", if cluster { "  NODE" } else { "" })?;
    for h in held {
        let holder = match (&h.host, h.pid) {
            (Some(host), Some(pid)) => format!("{}:{pid}", printable(host.as_bytes())),
            _ => "?".to_string(),
        };
        let secs = |d: Option<Duration>, none: &str| {
            d.map_or(none.to_string(), |d| format!("{:.3}s", d.as_secs_f64()))
        };
        write!(
            out,
            "{:<32} {:>24} {:>10} {:>10} {:>8}",
            printable(&h.key),
            holder,
            secs(age(h), "?"),
            secs(h.ttl, "never"),
            h.token
                .or(h.last_token)
                .map_or("-".to_string(), |t| t.to_string()),
        )?;
        writeln!(
            out,
            "{}",
            if cluster {
                format!("  {}", h.node)
            } else {
                String::new()
            }
        )?;
    }
    Ok(())
}

/// The signals `run` passes on to its command.
const FORWARDED: [Signal; 4] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
];

/// How long one wait for the lock lasts before `run` looks at signals and its status line.
const SLICE: Duration = Duration::from_millis(250);
/// How often the holder is looked up again while `run` waits (Redis: a SCAN).
const LOOKUP_EVERY: Duration = Duration::from_secs(1);

/// Where `run` is, as its signal thread needs to know.
enum Phase {
    /// Waiting for the lock; the first forwarded signal that arrived meanwhile.
    Waiting(Option<Signal>),
    /// The command runs as this child, not yet reaped (so the pid is still its).
    Running(Pid),
    /// The command has exited and may be reaped at any moment: its pid is no longer ours.
    Exited,
}

/// `run`'s signal handling: FORWARDED are blocked in every thread and taken, one by one,
/// by a thread of their own, which passes them on to the command.
struct Signals {
    set: SigSet,
    phase: Mutex<Phase>,
    verbose: bool,
}

/// Set once, by `main`, before any other thread starts.
static SIGNALS: OnceLock<Signals> = OnceLock::new();

impl Signals {
    /// Blocks FORWARDED in this thread, and so in every thread started after (the mask is
    /// inherited), then starts the thread that takes them. Must run before any other
    /// thread exists: a thread with them unblocked would die of them instead.
    fn start(verbose: bool) -> Result<&'static Signals, Fail> {
        let mut set = SigSet::empty();
        for sig in FORWARDED {
            set.add(sig);
        }
        set.thread_block()
            .map_err(|e| Fail(format!("blocking signals: {e}"), EX_OSERR))?;
        let signals = SIGNALS.get_or_init(|| Signals {
            set,
            phase: Mutex::new(Phase::Waiting(None)),
            verbose,
        });
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(|| signals.forward())
            .map_err(|e| Fail(format!("starting a thread: {e}"), EX_OSERR))?;
        Ok(signals)
    }

    fn phase(&self) -> MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The signal thread: forever takes the next signal and passes it on.
    fn forward(&self) {
        loop {
            let Some((sig, by_kernel)) = next_signal(&self.set) else {
                continue;
            };
            let mut phase = self.phase();
            match &mut *phase {
                Phase::Waiting(got) => {
                    got.get_or_insert(sig);
                }
                Phase::Running(pid) => {
                    // A terminal sends the signals of its INTR and QUIT characters to its
                    // whole foreground process group: a command still in ours has it
                    // already, and a second one could cut its cleanup short.
                    let has_it = by_kernel
                        && matches!(sig, Signal::SIGINT | Signal::SIGQUIT)
                        && getpgid(Some(*pid)).is_ok_and(|g| g == getpgrp());
                    if !has_it {
                        if self.verbose {
                            eprintln!("shmlock: passing {sig} on to pid {pid}");
                        }
                        let _ = kill(*pid, sig);
                    }
                }
                Phase::Exited => {}
            }
        }
    }

    /// Sends `sig` to the command if it has not exited.
    fn signal_command(&self, sig: Signal) {
        if let Phase::Running(pid) = *self.phase() {
            let _ = kill(pid, sig);
        }
    }
}

/// The next of `set`'s signals, and whether the kernel sent it (a terminal's INTR or QUIT
/// character, a hangup) rather than a process. `None`: interrupted, ask again.
fn next_signal(set: &SigSet) -> Option<(Signal, bool)> {
    let mut info = std::mem::MaybeUninit::<libc::siginfo_t>::zeroed();
    // SAFETY: `set` is an initialised signal set and `info` points to writable memory of
    // the size of a siginfo_t, which lives across the call.
    let n = unsafe { libc::sigwaitinfo(set.as_ref(), info.as_mut_ptr()) };
    if n < 0 {
        return None;
    }
    // SAFETY: zeroed is a valid siginfo_t (plain integers), and sigwaitinfo filled it in.
    let info = unsafe { info.assume_init() };
    let sig = Signal::try_from(n).ok()?;
    Some((sig, info.si_code == libc::SI_KERNEL))
}

/// Who holds a key, as far as the backend tells, for people waiting on it.
struct HolderInfo {
    /// "pid 1234", "host:1234" or "an unknown process".
    who: String,
    /// How long it had held the key when it was looked up.
    held: Option<Duration>,
    /// When it was looked up.
    seen: Instant,
}

impl HolderInfo {
    fn describe(&self) -> String {
        match self.held {
            Some(held) => format!("{} for {}", self.who, human(held + self.seen.elapsed())),
            None => self.who.clone(),
        }
    }
}

/// The backends `run` can tell the holder of a key of.
trait WhoHolds {
    fn who_holds(&self, key: &str) -> Option<HolderInfo>;
}

impl WhoHolds for LockTable {
    fn who_holds(&self, key: &str) -> Option<HolderInfo> {
        let key = key.as_bytes();
        // The preview is the first 32 bytes: a longer key is matched by them and its length.
        let h = self
            .holders()
            .into_iter()
            .find(|h| h.key_len == key.len() && key.starts_with(&h.key_preview))?;
        Some(HolderInfo {
            who: if h.pid == 0 {
                "an unknown process".into()
            } else {
                format!("pid {}", h.pid)
            },
            held: Some(h.age),
            seen: Instant::now(),
        })
    }
}

impl WhoHolds for RedisLocks {
    fn who_holds(&self, key: &str) -> Option<HolderInfo> {
        let h = self
            .holders()
            .ok()?
            .into_iter()
            .find(|h| h.key == key.as_bytes())?;
        Some(HolderInfo {
            who: match (&h.host, h.pid) {
                (Some(host), Some(pid)) => format!("pid {pid} on {}", printable(host.as_bytes())),
                (None, Some(pid)) => format!("pid {pid}"),
                _ => "an unknown process".into(),
            },
            held: h
                .since
                .map(|t| SystemTime::now().duration_since(t).unwrap_or_default()),
            seen: Instant::now(),
        })
    }
}

/// A duration for people: 4.2s, 3m07s, 2h05m.
fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{:.1}s", d.as_secs_f64()),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

/// The live line on stderr while `run` waits, if stderr is a terminal: rewritten in place
/// (carriage return, ANSI erase-line), erased when done.
struct StatusLine {
    on: bool,
    shown: bool,
}

impl StatusLine {
    fn new() -> StatusLine {
        StatusLine {
            on: std::io::stderr().is_terminal(),
            shown: false,
        }
    }

    fn show(&mut self, text: &str) {
        if !self.on {
            return;
        }
        // One line that never wraps, or the carriage return would not get back to its start.
        let text: String = text
            .chars()
            .take(terminal_width().saturating_sub(1))
            .collect();
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K{text}");
        let _ = err.flush();
        self.shown = true;
    }

    fn clear(&mut self) {
        if self.shown {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
            self.shown = false;
        }
    }
}

impl Drop for StatusLine {
    fn drop(&mut self) {
        self.clear();
    }
}

/// Columns of the terminal on stderr (80 if it does not say).
fn terminal_width() -> usize {
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one winsize into the struct pointed to, which lives across
    // the call; on failure it writes nothing.
    let r = unsafe { libc::ioctl(libc::STDERR_FILENO, libc::TIOCGWINSZ, &mut ws) };
    if r == 0 && ws.ws_col > 0 {
        usize::from(ws.ws_col)
    } else {
        80
    }
}

/// The exit code for a command that could not be started, as shells choose it.
fn spawn_error_code(e: &std::io::Error) -> u8 {
    match e.raw_os_error() {
        Some(libc::ENOENT | libc::ENOTDIR) => EX_NOT_FOUND,
        Some(libc::EAGAIN | libc::ENOMEM) => EX_OSERR,
        _ => EX_CANNOT_EXECUTE,
    }
}

fn run<B: Backend + WhoHolds>(backend: &B, a: RunArgs) -> Result<u8, Fail> {
    let signals = SIGNALS
        .get()
        .ok_or_else(|| Fail("signal handling was not set up".into(), EX_SOFTWARE))?;
    let exptime = secs(a.exptime, "--exptime")?;
    if exptime.is_zero() {
        return Err(Fail(
            "--exptime must be > 0: the lock is renewed while the command runs".into(),
            EX_USAGE,
        ));
    }
    let wait_for = match (a.nonblock, a.timeout) {
        (true, _) => Some(Duration::ZERO),
        (false, Some(t)) => Some(secs(t, "--timeout")?),
        (false, None) => None,
    };
    let opts = LockOptions {
        exptime,
        timeout: Duration::ZERO,
        ..LockOptions::default()
    };
    let max_time = a.max_time.map(|m| secs(m, "--max-time")).transpose()?;
    let mut lock = Lock::new(backend, opts)?;
    let (program, args): (&str, &[String]) = match &a.shell_command {
        Some(line) => ("/bin/sh", std::slice::from_ref(line)),
        None => (&a.args[0], &a.args[1..]),
    };
    let shown_key = printable(a.key.as_bytes());

    // Waits in slices, between which it looks at signals and redraws the status line.
    let started = Instant::now();
    let mut status = StatusLine::new();
    let mut holder: Option<HolderInfo> = None;
    let mut first = true;
    loop {
        let left = wait_for.map_or(SLICE, |w| w.saturating_sub(started.elapsed()));
        let slice = if first {
            Duration::ZERO
        } else {
            left.min(SLICE)
        };
        match lock.lock_with_timeout(&a.key, slice) {
            Ok(_) => break,
            Err(Error::Timeout { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        if let Phase::Waiting(Some(sig)) = *signals.phase() {
            status.clear();
            if a.verbose {
                eprintln!(
                    "shmlock: got {sig} while waiting for {shown_key:?}; not running the command"
                );
            }
            return Ok(128u8.wrapping_add(sig as u8));
        }
        let waited = started.elapsed();
        let stale = holder
            .as_ref()
            .is_none_or(|h| h.seen.elapsed() >= LOOKUP_EVERY);
        if (status.on || a.verbose) && stale {
            holder = backend.who_holds(&a.key).or(holder);
        }
        let describe = || {
            holder
                .as_ref()
                .map_or("someone".to_string(), HolderInfo::describe)
        };
        if first && a.verbose {
            eprintln!("shmlock: {shown_key:?} is held by {}", describe());
        }
        first = false;
        if wait_for.is_some_and(|w| waited >= w) {
            status.clear();
            if a.verbose {
                eprintln!(
                    "shmlock: gave up on {shown_key:?} after waiting {:.3}s",
                    waited.as_secs_f64()
                );
            }
            return Ok(a.conflict_exit_code);
        }
        status.show(&format!(
            "shmlock: waiting for {shown_key:?}, held by {}; waited {}",
            describe(),
            human(waited)
        ));
    }
    status.clear();
    if a.verbose {
        eprintln!(
            "shmlock: got {shown_key:?} after waiting {:.3}s",
            started.elapsed().as_secs_f64()
        );
        eprintln!("shmlock: running {program}");
    }

    // The lease was set by the server a round trip at most before this (far less than the
    // margin below).
    let locked_at = Instant::now();
    let mut cmd = Command::new(program);
    if a.shell_command.is_some() {
        cmd.arg("-c");
    }
    cmd.args(args);
    let blocked = signals.set;
    // SAFETY: the closure runs in the forked child before exec and only makes
    // async-signal-safe system calls (pthread_sigmask, prctl, getppid, _exit).
    unsafe {
        cmd.pre_exec(move || {
            // The command gets the signals we block (std resets the mask too; this does not
            // rely on it).
            blocked.thread_unblock()?;
            // Die with us: the key must never be free while the command still runs.
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            if nix::unistd::getppid().as_raw() == 1 {
                // we already died between fork and prctl
                libc::_exit(137);
            }
            Ok(())
        });
    }
    // Under the phase lock, so that a signal is either seen here or passed on to the child.
    let mut phase = signals.phase();
    if let Phase::Waiting(Some(sig)) = *phase {
        drop(phase);
        let _ = lock.unlock();
        return Ok(128u8.wrapping_add(sig as u8));
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| Fail(format!("{program}: {e}"), spawn_error_code(&e)))?;
    let pid = Pid::from_raw(child.id() as libc::pid_t);
    *phase = Phase::Running(pid);
    drop(phase);

    // The child is waited for on a helper thread; this thread (the child's parent thread,
    // which PR_SET_PDEATHSIG watches) renews the lease meanwhile.
    let (done, exited) = mpsc::channel();
    std::thread::spawn(move || {
        // Waits without reaping first, so that the pid stays the child's until the signal
        // thread knows not to use it any more.
        while let Err(nix::errno::Errno::EINTR) =
            waitid(Id::Pid(pid), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT)
        {}
        *signals.phase() = Phase::Exited;
        let _ = done.send(child.wait());
    });
    // Stops the command (SIGTERM, SIGKILL if it is still there 5 s later), releases what
    // is left of the lock, and fails with `why`.
    let terminate = |lock: &mut Lock<'_, B>, why: String| -> Fail {
        signals.signal_command(Signal::SIGTERM);
        if exited.recv_timeout(Duration::from_secs(5)).is_err() {
            signals.signal_command(Signal::SIGKILL);
            let _ = exited.recv();
        }
        let _ = lock.unlock();
        Fail(format!("{why}; command terminated"), EX_TERMINATED)
    };
    let every = exptime / 3;
    // A lease is counted from just before the command that set it was sent; the command
    // is stopped a tenth of a lease before the last one could lapse.
    let margin = exptime / 10;
    let mut lease_end = locked_at + exptime - margin;
    let mut next_renewal = locked_at + every;
    let stop_at = max_time.map(|m| locked_at + m);
    let status = loop {
        let wake = stop_at.map_or(next_renewal.min(lease_end), |s| {
            s.min(next_renewal).min(lease_end)
        });
        match exited.recv_timeout(wake.saturating_duration_since(Instant::now())) {
            Ok(status) => break status.map_err(|e| Fail(format!("wait: {e}"), EX_OSERR))?,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let now = Instant::now();
                if stop_at.is_some_and(|s| now >= s) {
                    return Err(terminate(
                        &mut lock,
                        format!("{:?} held for --max-time", a.key),
                    ));
                }
                if now >= lease_end {
                    return Err(terminate(
                        &mut lock,
                        format!("could not renew the lock on {:?} in time", a.key),
                    ));
                }
                if now < next_renewal {
                    continue;
                }
                let sent = Instant::now();
                match lock.expire(None) {
                    Ok(()) => {
                        lease_end = sent + exptime - margin;
                        next_renewal = sent + every;
                    }
                    // Broken by force, or gone with a server that restarted empty.
                    Err(Error::Expired) => {
                        return Err(terminate(
                            &mut lock,
                            format!("lost the lock on {:?}", a.key),
                        ))
                    }
                    // Unreachable for now (a Redis outage, a failover, replicas missing):
                    // try again soon; the command is stopped if no renewal gets through
                    // before the lease could lapse.
                    Err(e) => {
                        eprintln!("shmlock: renewing {:?}: {e}", a.key);
                        next_renewal = now + every / 4;
                    }
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(Fail("lost track of the command".into(), EX_SOFTWARE))
            }
        }
    };
    match lock.unlock() {
        Ok(()) => {}
        Err(e) => eprintln!("shmlock: releasing {:?}: {e}", a.key),
    }
    Ok(match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(sig)) => 128u8.wrapping_add(sig as u8),
        _ => 2,
    })
}

/// What `inspect` looks at.
enum Inspected {
    Table(LockTable, PathBuf),
    Dict(SharedDict, PathBuf),
    /// With the URLs as printed (passwords redacted).
    Redis(RedisLocks, String),
}

/// Opens `file` read-only (anyone who can read it can inspect it), as a lock table or as a
/// shared dict, whichever it is.
fn open_inspected(file: &Path) -> Result<Inspected, Fail> {
    match LockTable::options().read_only(true).open(file) {
        Ok(table) => Ok(Inspected::Table(table, file.to_path_buf())),
        Err(Error::Format {
            source: FormatError::WrongKind { .. },
            ..
        }) => Ok(Inspected::Dict(
            SharedDict::options().read_only(true).open(file)?,
            file.to_path_buf(),
        )),
        Err(e) => Err(e.into()),
    }
}

/// Prints what `what` holds, once or (--watch) until interrupted.
fn inspect(what: &Inspected, a: &InspectArgs) -> Result<u8, Fail> {
    let stdout_err = |e: std::io::Error| Fail(format!("stdout: {e}"), EX_IOERR);
    let mut buf = Vec::new();
    snapshot(&mut buf, what, a)?;
    if !a.watch && a.interval.is_none() {
        std::io::stdout().write_all(&buf).map_err(stdout_err)?;
        return Ok(0);
    }
    let interval = secs(a.interval.unwrap_or(1.0), "--interval")?;
    if interval.is_zero() {
        return Err(Fail("--interval must be > 0".into(), EX_USAGE));
    }
    let terminal = std::io::stdout().is_terminal();
    let mut first = true;
    loop {
        if !first {
            std::thread::sleep(interval);
            buf.clear();
            // A snapshot that fails (a Redis outage) is reported, and the next one tried.
            if let Err(Fail(msg, _)) = snapshot(&mut buf, what, a) {
                let _ = writeln!(buf, "shmlock: {msg}");
            }
        }
        first = false;
        let mut out = std::io::stdout().lock();
        let written = if a.json {
            // NDJSON: each snapshot is one line already.
            out.write_all(&buf)
        } else if terminal {
            // Home, erase the screen, then the whole snapshot in one write: no flicker.
            writeln!(
                out,
                "\x1b[H\x1b[2J{}  (every {}s; Ctrl-C to stop)",
                utc_now(),
                interval.as_secs_f64()
            )
            .and_then(|()| out.write_all(&buf))
        } else {
            writeln!(out, "--- {} ---", utc_now()).and_then(|()| out.write_all(&buf))
        };
        match written.and_then(|()| out.flush()) {
            Ok(()) => {}
            // The reader went away (`| head`): that is the end of watching, not an error.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(0),
            Err(e) => return Err(stdout_err(e)),
        }
    }
}

/// Now in UTC, as `2026-01-31 23:59:59 UTC` (from the Unix time: days to a civil date by
/// Howard Hinnant's algorithm).
fn utc_now() -> String {
    let t = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let (days, rem) = ((t / 86_400) as i64, t % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// One print of `what` into `out`.
fn snapshot(out: &mut Vec<u8>, what: &Inspected, a: &InspectArgs) -> Result<(), Fail> {
    let written = match what {
        Inspected::Table(table, file) => {
            let mut holders: Vec<Holder> = table
                .holders()
                .into_iter()
                .filter(|h| a.all || (!h.expired && h.owner_alive))
                .collect();
            holders.sort_by(|x, y| x.key_preview.cmp(&y.key_preview));
            if a.json {
                write_json(out, file, table, &holders)
            } else {
                write_table(out, file, table, &holders)
            }
        }
        Inspected::Dict(dict, file) => return inspect_dict(out, file, dict, a),
        Inspected::Redis(redis, url) => {
            let mut held = redis.holders()?;
            held.sort_by(|x, y| x.key.cmp(&y.key));
            write_redis(out, url, &held, a.json)
        }
    };
    written.map_err(|e| Fail(format!("stdout: {e}"), EX_IOERR))
}

fn state_name(s: HolderState) -> &'static str {
    match s {
        HolderState::Claiming => "claiming",
        HolderState::Extending => "extending",
        _ => "held",
    }
}

/// Key bytes in hex, for JSON (the exact bytes, whatever they are).
fn hex(key: &[u8]) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

/// Key bytes for a terminal: UTF-8 with invalid bytes replaced, control characters as `?`.
fn printable(key: &[u8]) -> String {
    String::from_utf8_lossy(key)
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

fn shown_key(h: &Holder) -> String {
    let mut k = printable(&h.key_preview);
    if h.key_len > h.key_preview.len() {
        k.push('…');
    }
    k
}

fn write_table(
    out: &mut impl Write,
    file: &Path,
    t: &LockTable,
    hs: &[Holder],
) -> std::io::Result<()> {
    writeln!(
        out,
        "{}: format {}, capacity {}, occupancy {}",
        file.display(),
        t.format_version(),
        t.capacity(),
        t.occupancy()
    )?;
    if hs.is_empty() {
        return writeln!(out, "no locks held");
    }
    writeln!(
        out,
        "{:<32} {:>8} {:>6} {:>9} {:>10} {:>10} {:>8} {:>7}",
        "KEY", "PID", "ALIVE", "STATE", "AGE", "TTL", "TOKEN", "WAITERS"
    )?;
    for h in hs {
        let ttl = match h.ttl {
            _ if h.expired => "expired".to_string(),
            Some(d) => format!("{:.3}s", d.as_secs_f64()),
            None => "never".to_string(),
        };
        writeln!(
            out,
            "{:<32} {:>8} {:>6} {:>9} {:>9.3}s {:>10} {:>8} {:>7}",
            shown_key(h),
            h.pid,
            if h.owner_alive { "yes" } else { "no" },
            state_name(h.state),
            h.age.as_secs_f64(),
            ttl,
            h.token.map_or("-".to_string(), |t| t.to_string()),
            if h.waiters { "yes" } else { "no" },
        )?;
    }
    Ok(())
}

/// One JSON object on a line, as `--json` promises.
fn print_json(out: &mut impl Write, value: &impl serde::Serialize) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, value)?;
    writeln!(out)
}

/// `inspect --json` of a lock table (the schema `inspect --help` describes).
#[derive(serde::Serialize)]
struct TableReport<'a> {
    file: std::borrow::Cow<'a, str>,
    format_version: u32,
    capacity: usize,
    occupancy: usize,
    holders: Vec<TableEntry>,
}

#[derive(serde::Serialize)]
struct TableEntry {
    key: String,
    key_hex: String,
    key_len: usize,
    truncated: bool,
    pid: u32,
    alive: bool,
    state: &'static str,
    age_ms: u64,
    ttl_ms: Option<u64>,
    expired: bool,
    token: Option<u64>,
    waiters: bool,
}

/// `inspect --json` of a shared dict.
#[derive(serde::Serialize)]
struct DictReport<'a> {
    file: std::borrow::Cow<'a, str>,
    kind: &'static str,
    capacity: usize,
    entries: usize,
    live: usize,
    max_key_len: usize,
    max_value_len: usize,
    evictions: u64,
    repairs: u64,
    writer_pid: Option<u32>,
    keys: Vec<DictKey>,
}

#[derive(serde::Serialize)]
struct DictKey {
    key: String,
    key_hex: String,
    ttl_ms: Option<u64>,
}

/// `inspect --redis --json`.
#[derive(serde::Serialize)]
struct RedisReport<'a> {
    redis: &'a str,
    holders: Vec<RedisEntry>,
}

#[derive(serde::Serialize)]
struct RedisEntry {
    key: String,
    key_hex: String,
    ttl_ms: Option<u64>,
    token: Option<u64>,
    holder_token: Option<u64>,
    host: Option<String>,
    pid: Option<u32>,
    age_ms: Option<u64>,
    node: String,
}

fn write_json(
    out: &mut impl Write,
    file: &Path,
    t: &LockTable,
    hs: &[Holder],
) -> std::io::Result<()> {
    let report = TableReport {
        file: file.to_string_lossy(),
        format_version: t.format_version(),
        capacity: t.capacity(),
        occupancy: t.occupancy(),
        holders: hs
            .iter()
            .map(|h| TableEntry {
                key: String::from_utf8_lossy(&h.key_preview).into_owned(),
                key_hex: hex(&h.key_preview),
                key_len: h.key_len,
                truncated: h.key_len > h.key_preview.len(),
                pid: h.pid,
                alive: h.owner_alive,
                state: state_name(h.state),
                age_ms: h.age.as_millis() as u64,
                ttl_ms: h.ttl.map(|d| d.as_millis() as u64),
                expired: h.expired,
                token: h.token,
                waiters: h.waiters,
            })
            .collect(),
    };
    print_json(out, &report)
}

/// A shared dict's counters, and its live keys with their time to live.
fn inspect_dict(
    out: &mut Vec<u8>,
    file: &Path,
    dict: &SharedDict,
    a: &InspectArgs,
) -> Result<(), Fail> {
    let mut keys: Vec<(Vec<u8>, Option<Duration>)> = dict
        .keys(0)?
        .into_iter()
        // a key may expire or go between the two looks
        .filter_map(|k| dict.ttl(&k).ok().map(|ttl| (k, ttl)))
        .collect();
    keys.sort();
    let writer = dict.writer_pid();
    let result = if a.json {
        let report = DictReport {
            file: file.to_string_lossy(),
            kind: "dict",
            capacity: dict.capacity(),
            entries: dict.len(),
            live: keys.len(),
            max_key_len: dict.max_key_len(),
            max_value_len: dict.max_value_len(),
            evictions: dict.evictions(),
            repairs: dict.repairs(),
            writer_pid: writer,
            keys: keys
                .iter()
                .map(|(k, ttl)| DictKey {
                    key: String::from_utf8_lossy(k).into_owned(),
                    key_hex: hex(k),
                    ttl_ms: ttl.map(|d| d.as_millis() as u64),
                })
                .collect(),
        };
        print_json(out, &report)
    } else {
        (|| {
            writeln!(
                out,
                "{}: shared dict, capacity {}, entries {} ({} live), keys up to {} B, values up to {} B, evictions {}, repairs {}, writer {}",
                file.display(),
                dict.capacity(),
                dict.len(),
                keys.len(),
                dict.max_key_len(),
                dict.max_value_len(),
                dict.evictions(),
                dict.repairs(),
                writer.map_or("none".to_string(), |p| format!("pid {p}"))
            )?;
            if keys.is_empty() {
                return writeln!(out, "no live keys");
            }
            writeln!(out, "{:<48} {:>10}", "KEY", "TTL")?;
            for (k, ttl) in &keys {
                let ttl = ttl.map_or("never".to_string(), |d| format!("{:.3}s", d.as_secs_f64()));
                writeln!(out, "{:<48} {:>10}", printable(k), ttl)?;
            }
            Ok(())
        })()
    };
    result.map_err(|e| Fail(format!("stdout: {e}"), EX_IOERR))
}

fn refuse_without_force(a: &UnlockArgs) -> Result<(), Fail> {
    if a.force {
        return Ok(());
    }
    Err(Fail(
        format!(
            "refusing to break {:?} without --force (its holder may still rely on it)",
            a.key
        ),
        EX_USAGE,
    ))
}

fn unlock(file: &Path, a: UnlockArgs) -> Result<u8, Fail> {
    refuse_without_force(&a)?;
    let table = LockTable::options().create(false).open(file)?;
    match table.force_unlock(&a.key)? {
        Some(h) => {
            println!(
                "broke {:?}: held by pid {} ({}), for {:.3}s",
                a.key,
                h.pid,
                if h.owner_alive { "alive" } else { "dead" },
                h.age.as_secs_f64()
            );
            Ok(0)
        }
        None => Err(Fail(format!("{:?} is not locked", a.key), 1)),
    }
}

fn create(file: &Path, a: CreateArgs) -> Result<u8, Fail> {
    if file.exists() {
        return Err(Fail(
            format!("{}: already exists", file.display()),
            EX_CANTCREAT,
        ));
    }
    let table = LockTable::options()
        .capacity(a.capacity)
        .mode(a.mode)
        .open(file)?;
    if !table.created() {
        return Err(Fail(
            format!("{}: already exists", file.display()),
            EX_CANTCREAT,
        ));
    }
    println!(
        "created {} with capacity {}",
        file.display(),
        table.capacity()
    );
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn passwords_in_urls_are_redacted_and_the_rest_kept() {
        for (url, shown) in [
            ("redis://127.0.0.1:6379/", "redis://127.0.0.1:6379/"),
            ("redis://:pw@h:1/0", "redis://:***@h:1/0"),
            ("rediss://user:p%40ss@h:1/", "rediss://user:***@h:1/"),
            ("redis://user@h:1/", "redis://user@h:1/"),
            ("redis://:a@b@h:1/?x=@", "redis://:***@h:1/?x=@"),
            ("redis://:pw@h", "redis://:***@h"),
            ("not a url", "not a url"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }
}
