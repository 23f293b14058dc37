//! The command line: its subcommands and options (clap derive), with the help texts that
//! document them, and the checks of option values clap cannot do.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgGroup, Args, Parser, Subcommand};

use crate::exit::{Fail, EX_USAGE};

/// The Redis key prefix when --redis-prefix does not say.
pub const DEFAULT_REDIS_PREFIX: &str = "shmlock:";
/// Where the table is when neither --file nor $SHMLOCK_FILE says.
pub const DEFAULT_FILE: &str = "/dev/shm/shmlock";
/// Capacity of a table that `run` creates because none existed.
pub const DEFAULT_CAPACITY: usize = 1024;

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
pub struct Cli {
    // These global options show in every subcommand's help too: --file after the
    // subcommand's own options (display_order), the Redis ones under a heading of theirs.
    /// The lock table file [default: $SHMLOCK_FILE, else /dev/shm/shmlock]
    #[arg(
        long,
        global = true,
        value_name = "PATH",
        conflicts_with = "redis",
        display_order = 100
    )]
    pub file: Option<PathBuf>,
    /// Use the locks in Redis instead of a table file: redis://[:PASSWORD@]host:port/db
    /// (rediss:// for TLS). Several URLs, comma-separated, with --redis-cluster or
    /// --redis-sentinel. A password may come from $REDISCLI_AUTH instead of the URL.
    #[arg(long, global = true, value_name = "URL", help_heading = "Redis")]
    pub redis: Option<String>,
    /// The --redis URLs are nodes of a Redis Cluster
    #[arg(
        long,
        global = true,
        requires = "redis",
        conflicts_with = "redis_sentinel",
        help_heading = "Redis"
    )]
    pub redis_cluster: bool,
    /// The --redis URLs are sentinels; use the master they know by this name
    #[arg(
        long,
        global = true,
        value_name = "MASTER",
        requires = "redis",
        help_heading = "Redis"
    )]
    pub redis_sentinel: Option<String>,
    /// Key prefix in Redis (with --redis only) [default: shmlock:]
    #[arg(long, global = true, value_name = "PREFIX", help_heading = "Redis")]
    pub redis_prefix: Option<String>,
    #[command(subcommand)]
    pub command: Cmd,
}

#[derive(Subcommand)]
pub enum Cmd {
    Run(RunArgs),
    Inspect(InspectArgs),
    Stats(StatsArgs),
    Unlock(UnlockArgs),
    Create(CreateArgs),
}

/// Take KEY, run COMMAND, release when it and what it left running have exited; exit
/// with its status
#[derive(Args)]
#[command(
    group(ArgGroup::new("what").required(true).args(["shell_command", "args"])),
    // as flock(1): an option given again (a wrapper's default, then the user's) is no
    // error, the last one counts
    args_override_self = true,
    override_usage = "shmlock run [OPTIONS] KEY [--] COMMAND [ARGS]...\n       \
                      shmlock run [OPTIONS] KEY -c STRING",
    after_help = concat!(
    "Examples:\n",
    "  shmlock run backup -- rsync -a /data /backup    # wait as long as it takes\n",
    "  shmlock run -n backup ./backup.sh               # exit 1 at once if it is running\n",
    "  shmlock run -w 10 -E 75 deploy -- make deploy   # wait 10 s at most, then exit 75\n",
    "  shmlock run report -c 'make report | mail ops'  # a command line, through /bin/sh -c\n",
    "  shmlock run -s config cat /etc/app.conf         # readers together, never beside a writer\n",
    "  shmlock run --permits 4 gpu ./train.sh          # at most 4 of these at once\n",
    "\n",
    "COMMAND is the first argument after KEY (or after --); the options of run come before\n",
    "it, and everything from it on is COMMAND's. COMMAND finds the key in $SHMLOCK_KEY and\n",
    "its hold's fencing token in $SHMLOCK_TOKEN (greater than that of any earlier hold of the\n",
    "key): a script can stamp what it writes with it. A reader's (-s) or permit holder's is\n",
    "the key's counter as it read it: at least the token of every exclusive hold of the key\n",
    "before it and less than that of any after it, so the write it read is the exclusive\n",
    "hold with the greatest token not above its own.\n",
    "\n",
    "As with flock(1), processes COMMAND leaves running keep the lock: shmlock adopts them\n",
    "(a child subreaper) and releases KEY when the last has exited, then exits with\n",
    "COMMAND's status. With -o the lock is released as soon as COMMAND itself exits.\n",
    "\n",
    "While shmlock waits with stderr on a terminal (not as a background job), a status line\n",
    "there shows who holds KEY (pid, how long) and how long it has waited; --verbose says\n",
    "the same in plain lines.\n",
    "Another, while it waits for what COMMAND left running, names those processes.\n",
    "\n",
    "While COMMAND runs the lease is renewed every EXPTIME/3, so a live job keeps the lock\n",
    "however long it runs and a dead one loses it within EXPTIME. SIGINT, SIGTERM, SIGHUP and\n",
    "SIGQUIT sent to shmlock are passed on to COMMAND (once it has exited, to the processes\n",
    "it left), and the lock is released only once they have exited (their traps and cleanup\n",
    "run under the lock); one that arrives while shmlock still waits ends it (shmlock dies\n",
    "of it), COMMAND not run. If shmlock itself is killed (SIGKILL), COMMAND is killed with\n",
    "it (PR_SET_PDEATHSIG), and the key is free for the next run. If the lease cannot be\n",
    "renewed (the lock was broken, a Redis server restarted empty, or no renewal got through\n",
    "for most of a lease), or COMMAND outlives --max-time, COMMAND and what it left running\n",
    "are sent SIGTERM (SIGKILL 5 s later, or before the lease could lapse) and run exits 2.\n",
    "\n",
    "Exit status (flock(1)'s, <sysexits.h> for errors):\n",
    "  COMMAND's own status; if it was killed by signal N, shmlock releases KEY and dies\n",
    "               of N too (no core dump), so that a shell sees it (128+N if it survives)\n",
    "  1 (or -E N)  the lock could not be taken (-n, or -w ran out)\n",
    "  2            COMMAND stopped by shmlock (lease lost, --max-time)\n",
    "  64           usage error (EX_USAGE)\n",
    "  65           the file is not a lock table, or a lock's Redis key holds a value\n",
    "               of another type than shmlock writes there (EX_DATAERR)\n",
    "  66           the file cannot be opened (EX_NOINPUT)\n",
    "  69           Redis unreachable or refusing (EX_UNAVAILABLE)\n",
    "  71, 73, 75   out of memory or descriptors (EX_OSERR), read-only or full file system\n",
    "               (EX_CANTCREAT), table or owner registry full (EX_TEMPFAIL)\n",
    "  126, 127     COMMAND found but not executable, or not found\n",
    "  killed by N  shmlock got signal N while waiting for the lock (128+N if it survives)",
))]
pub struct RunArgs {
    /// The lock name (any bytes but NUL, as the command line passes them)
    pub key: OsString,
    /// Give up after this many seconds of waiting [default: wait forever]
    #[arg(
        short = 'w',
        long = "timeout",
        visible_alias = "wait",
        value_name = "SECS",
        allow_hyphen_values = true
    )]
    pub timeout: Option<f64>,
    /// Lease length in seconds, at least 0.1; renewed every third of it while COMMAND runs
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 30.0,
        allow_hyphen_values = true
    )]
    pub exptime: f64,
    /// Do not wait: exit at once if the lock is held (same as -w 0; with -w, -n wins, as
    /// in flock(1))
    #[arg(short = 'n', long, visible_aliases = ["nonblocking", "nb"])]
    pub nonblock: bool,
    /// An exclusive lock (the default), as flock(1)'s -x/-e
    #[arg(
        short = 'x',
        short_alias = 'e',
        long,
        conflicts_with = "permits",
        overrides_with = "shared"
    )]
    pub exclusive: bool,
    /// A shared (read) lock: held beside other shared holders of KEY, never beside an
    /// exclusive one; a waiting exclusive holder goes first
    #[arg(
        short = 's',
        long,
        conflicts_with = "permits",
        overrides_with = "exclusive"
    )]
    pub shared: bool,
    /// One of N permits of KEY: at most N such commands run at once machine-wide (a
    /// jobserver); a dead one's permit comes back when a waiter next looks (within half a
    /// second; with --redis, at its lease's end: --exptime)
    #[arg(
        long,
        value_name = "N",
        allow_hyphen_values = true,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub permits: Option<u32>,
    /// Release the lock when COMMAND exits, even if processes it started still run
    #[arg(short = 'o', long)]
    pub close: bool,
    /// Refused, with the reason: a hold cannot outlive an exec of shmlock's own process
    #[arg(short = 'F', long, hide = true)]
    pub no_fork: bool,
    /// Refused, with the reason: flock(1)'s -u unlocks a descriptor, and a hold is not one
    #[arg(short = 'u', long, hide = true)]
    pub unlock: bool,
    /// Refused, with the reason: no file lock is taken
    #[arg(long, hide = true)]
    pub fcntl: bool,
    /// Exit code when the lock could not be taken
    #[arg(
        short = 'E',
        long,
        value_name = "N",
        default_value_t = 1,
        allow_hyphen_values = true
    )]
    pub conflict_exit_code: u8,
    /// Stop renewing after this many seconds: COMMAND is terminated and the lock released
    /// [default: no limit]
    #[arg(long, value_name = "SECS", allow_hyphen_values = true)]
    pub max_time: Option<f64>,
    /// Say on stderr who held the lock, how long it waited, and when it got it
    #[arg(long)]
    pub verbose: bool,
    /// Run this command line through /bin/sh -c instead of COMMAND
    #[arg(short = 'c', long = "command", value_name = "STRING")]
    pub shell_command: Option<OsString>,
    /// The command and its arguments
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "COMMAND"
    )]
    pub args: Vec<OsString>,
}

/// List the locks held in the table (or, for a SharedDict file, its counters and keys)
#[derive(Args)]
#[command(after_help = concat!(
    "Examples:\n",
    "  shmlock inspect\n",
    "  shmlock inspect --all --json | jq '.holders[] | select(.alive | not)'\n",
    "\n",
    "--json prints one object:\n",
    "  {\"file\", \"kind\": \"lock table\", \"format_version\", \"capacity\", \"slots\",\n",
    "   \"occupancy\", \"holders\": [{\"key\", \"key_hex\", \"key_len\", \"truncated\", \"pid\",\n",
    "   \"alive\", \"left_to_expire\",\n",
    "   \"state\", \"age_ms\", \"ttl_ms\", \"expired\", \"token\", \"token_text\", \"waiters\",\n",
    "   \"writer_waits\", \"readers_wait\", \"mode\", \"permits\"}]}\n",
    "\"pid\" is 0 for no process known here: a hold left to expire (\"left_to_expire\": it\n",
    "has no owner, and \"alive\" says nothing; PID and ALIVE show -), or one of another pid\n",
    "namespace (PID shows -, ALIVE as judged);\n",
    "\"key\" is the preview (first 32 bytes) as UTF-8 with invalid bytes replaced, \"key_hex\"\n",
    "the same bytes in hex; \"ttl_ms\" (never expires) and \"token\" may be null; tokens pass\n",
    "2^53, which jq and JavaScript round: compare \"token_text\" (the token in decimal, as in\n",
    "$SHMLOCK_TOKEN) or use an exact parser; \"state\" is\n",
    "\"held\", \"claiming\", \"extending\", \"broken\" (a stalled claim or renewal broken:\n",
    "the key is free, the slot out of use until its owner goes on or dies) or \"kept\" (no\n",
    "hold: the last reader left while a writer waited, and new readers wait until that\n",
    "writer has held the key, or the writer left while readers waited, and writers wait\n",
    "until a reader has taken it; no pid, age, lease or token); \"mode\" is \"exclusive\",\n",
    "\"shared\" (a reader) or \"permit\" (one of a semaphore's \"permits\"; null otherwise).\n",
    "A shared key has a row per holder. \"waiters\" (WAITED yes) is true once a waiter has\n",
    "flagged the hold since it was taken, and stays true after that waiter gave up: not a\n",
    "sign that one waits now. \"writer_waits\" (WAITED writer) is: a writer waits for this\n",
    "reader's hold now (or the key is kept for it), and new readers defer to it;\n",
    "\"readers_wait\" (WAITED readers): readers wait for this writer's hold now (or the\n",
    "key is kept for them, \"kept\" with mode \"shared\"), and they go next.\n",
    "On a SharedDict file, --json prints:\n",
    "  {\"file\", \"kind\": \"dict\", \"capacity\", \"entries\", \"live\", \"max_key_len\",\n",
    "   \"max_value_len\", \"entry_value_len\", \"zone_size\", \"heap_size\", \"heap_free\",\n",
    "   \"evictions\", \"repairs\", \"writer_pid\", \"writer_alive\",\n",
    "   \"keys\": [{\"key\",\n",
    "   \"key_hex\", \"value_kind\", \"len\", \"ttl_ms\"}]}\n",
    "\"value_kind\" is \"bytes\", \"int\", \"float\", \"bool\" or \"list\"; \"len\" counts the bytes of\n",
    "a byte value, the elements of a list (8 for a number, 1 for a boolean).\n",
    "\n",
    "--watch prints the table again every second (--interval SECS) until interrupted: on a\n",
    "terminal the screen is cleared before each print, elsewhere a line \"--- TIME ---\"\n",
    "(UTC) comes before each. With --json, one object per line per print (NDJSON).",
))]
pub struct InspectArgs {
    /// Print JSON for scripts
    #[arg(long)]
    pub json: bool,
    /// Include expired entries and entries of dead owners
    #[arg(long)]
    pub all: bool,
    /// Print again every --interval until interrupted
    #[arg(short = 'w', long)]
    pub watch: bool,
    /// Seconds between two prints; implies --watch [default: 1]
    #[arg(long, value_name = "SECS", allow_hyphen_values = true)]
    pub interval: Option<f64>,
}

/// Show the counters of a lock table or a dict: keys taken, waits, timeouts, hits...
#[derive(Args)]
#[command(after_help = concat!(
    "Examples:\n",
    "  shmlock stats\n",
    "  shmlock --file /dev/shm/app-cache stats --watch     # a dict; rates every second\n",
    "  shmlock stats --prometheus > /var/lib/node_exporter/textfile/shmlock.prom\n",
    "\n",
    "The counters are kept in the file by every process that uses it, since it was made:\n",
    "a lock table counts keys taken (and those taken after waiting), timeouts, keys taken\n",
    "from dead holders or after their lease ran out, refusals of a full table, renewals\n",
    "of lost holds, how long contended waits took and how long the holds that made others\n",
    "wait were held (log2 buckets from 1 µs); a dict counts hits, misses, sets and\n",
    "evictions, and shows its entries and bytes. A process adds its uncontended\n",
    "acquisitions and its reads to the file every 100 ms it goes on, and when it ends.\n",
    "\n",
    "--watch prints them again every second (--interval SECS), with the rate of each\n",
    "since the print before. --json prints one object (a line per print); --prometheus\n",
    "the Prometheus text exposition format (shmlock_*_total counters, shmlock_wait_seconds\n",
    "and shmlock_contended_hold_seconds histograms, shmlock_dict_* for a dict), labelled\n",
    "with the file. A Redis handle's counters are kept by the process that uses it\n",
    "(RedisLocks::stats).",
))]
pub struct StatsArgs {
    /// Print JSON for scripts
    #[arg(long)]
    pub json: bool,
    /// Print the Prometheus text exposition format
    #[arg(long)]
    pub prometheus: bool,
    /// Print again every --interval, with rates, until interrupted
    #[arg(short = 'w', long)]
    pub watch: bool,
    /// Seconds between two prints; implies --watch [default: 1]
    #[arg(long, value_name = "SECS", allow_hyphen_values = true)]
    pub interval: Option<f64>,
}

/// Break a lock, whoever holds it (prints who did)
#[derive(Args)]
#[command(after_help = concat!(
    "Examples:\n",
    "  shmlock unlock --force user:42\n",
    "  shmlock unlock --force --pid 4242 config   # only that reader of a shared key",
))]
pub struct UnlockArgs {
    /// The lock name
    pub key: String,
    /// KEY is the key's bytes in hex, as `inspect --json` gives them (`key_hex`): for a
    /// key that is not text, or holds a NUL byte
    #[arg(long)]
    pub hex: bool,
    /// Required: breaking a lock its holder still relies on is your decision
    #[arg(long)]
    pub force: bool,
    /// Break only the holds of this process (a shared key has a holder per reader or
    /// permit) [default: every holder of KEY]
    #[arg(long, value_name = "PID", allow_hyphen_values = true)]
    pub pid: Option<u32>,
    /// With --redis and --pid: the host of that process [default: this host]
    #[arg(long, value_name = "HOST", requires = "pid")]
    pub host: Option<String>,
}

/// Create a table file (or, with --dict, a SharedDict file) with a chosen capacity and mode
#[derive(Args)]
#[command(after_help = concat!(
    "Examples:\n",
    "  shmlock --file /dev/shm/app-locks create --capacity 4096 --mode 0660\n",
    "  shmlock --file /dev/shm/app-cache create --dict --capacity 10000 --max-value-len 1024\n",
    "  shmlock --file /dev/shm/app-pages create --dict --capacity 10000 --max-value-len 64 --heap-size 64m\n",
    "  shmlock --file /dev/shm/app-zone create --dict --zone-size 64m --max-key-len 32 --max-value-len 32",
))]
pub struct CreateArgs {
    /// How many holds always fit at once (a key locked, or each reader or permit holder of
    /// a key): the table has four slots per unit, so up to four times as many may fit, but
    /// only this many are sure to (with --dict:
    /// how many entries the dict holds; with --zone-size, one per 4k of the zone by
    /// default) [default: 1024]
    #[arg(long, allow_hyphen_values = true)]
    pub capacity: Option<usize>,
    /// Make a SharedDict file (the key-value cache of the library's SharedDict) instead of
    /// a lock table; inspect and stats read it
    #[arg(long)]
    pub dict: bool,
    /// With --dict: the longest key, 1 to 65535 bytes [default: 250]
    #[arg(
        long,
        value_name = "BYTES",
        requires = "dict",
        allow_hyphen_values = true
    )]
    pub max_key_len: Option<usize>,
    /// With --dict: the longest value kept in an entry, at most 1048576 bytes (1 MiB)
    /// [default: 256]; longer ones go in the heap (--heap-size)
    #[arg(
        long,
        value_name = "BYTES",
        requires = "dict",
        allow_hyphen_values = true
    )]
    pub max_value_len: Option<usize>,
    /// With --dict: bytes of the heap for values longer than --max-value-len: 10m, 512k,
    /// 1g or a number of bytes; a value may take all of it but its index blocks (one
    /// 256-byte block per 62), and values are at most 64m whatever the heap [default:
    /// none, or what --zone-size leaves]
    #[arg(
        long,
        value_name = "SIZE",
        requires = "dict",
        allow_hyphen_values = true,
        value_parser = parse_size
    )]
    pub heap_size: Option<u64>,
    /// With --dict: the whole file's size, as nginx sizes a zone (10m, 512k, 1g or bytes):
    /// what the entries leave is the heap
    #[arg(
        long,
        value_name = "SIZE",
        requires = "dict",
        conflicts_with = "heap_size",
        allow_hyphen_values = true,
        value_parser = parse_size
    )]
    pub zone_size: Option<u64>,
    /// Permission bits, octal; the owner must be able to read and write (at least 0600)
    #[arg(long, default_value = "0600", value_parser = parse_mode)]
    pub mode: u32,
    /// How many processes may use the table (or dict) at once (its owner registry's
    /// entries, at most 65535)
    #[arg(long, default_value_t = 1024, allow_hyphen_values = true)]
    pub max_processes: u32,
}

/// A size as nginx writes one (`lua_shared_dict cache 10m`): bytes, or a number with `k`,
/// `m` or `g` (binary multiples, either case).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (digits, unit) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&t[..i], c.to_ascii_lowercase()),
        _ => (t, ' '),
    };
    let shift = match unit {
        ' ' => 0,
        'k' => 10,
        'm' => 20,
        'g' => 30,
        _ => {
            return Err(format!(
                "{s:?}: the unit must be k, m or g (or none: bytes)"
            ))
        }
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a size (such as 10m, 512k or 1048576)"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// An octal mode that lets the owner read and write the file: without both, nobody but
/// root could open the table (a user opens it for reading and writing to lock).
fn parse_mode(s: &str) -> Result<u32, String> {
    let mode = u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .ok_or_else(|| format!("{s:?} is not an octal mode"))?;
    if mode & 0o600 != 0o600 {
        return Err(format!(
            "mode {mode:04o} does not let the owner read and write the file, so nobody but \
             root could use it: give at least 0600 (0660 to share it with a group)"
        ));
    }
    Ok(mode)
}

/// `v` seconds as a Duration; `what` names the option in the error.
pub fn secs(v: f64, what: &str) -> Result<Duration, Fail> {
    Duration::try_from_secs_f64(v).map_err(|_| {
        let why = if v.is_nan() {
            "a number of seconds"
        } else if v < 0.0 {
            "a number of seconds that is not negative"
        } else {
            "a number of seconds below 2^64"
        };
        Fail(format!("{what} must be {why}, not {v}"), EX_USAGE)
    })
}
