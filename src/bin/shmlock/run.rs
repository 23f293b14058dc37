//! `run`: waits for the lock (with the status line and the signals that may end the wait),
//! runs the command, renews the lease while it and the processes it left running run, and
//! exits with its status.

use std::ffi::{OsStr, OsString};
use std::io;
use std::ops::ControlFlow;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::sys::signal::{SigSet, Signal};
use nix::sys::wait::{waitid, Id, WaitPidFlag};
use nix::unistd::Pid;

use shmlock::{Backend, Error, Lock, LockOptions};

use crate::args::{secs, RunArgs};
use crate::exit::{
    describe, spawn_error_code, Fail, EX_OSERR, EX_SOFTWARE, EX_TERMINATED, EX_USAGE,
};
use crate::show::{human, printable};
use crate::signals::{children, Phase, Signals, SIGNALS};
use crate::status::{HolderInfo, StatusLine, WhoHolds};

/// How long one wait for the lock lasts before `run` looks at signals and its status line.
const SLICE: Duration = Duration::from_millis(250);
/// How often the holder is looked up again while `run` waits (Redis: a SCAN).
const LOOKUP_EVERY: Duration = Duration::from_secs(1);
/// The shortest lease `run` takes. It renews every third of the lease and stops the
/// command a tenth of a lease before the last renewed one could lapse, so a renewal may be
/// late by about half a lease (57 ms here) and the margin must be longer than a tick of the
/// coarse clock the table's deadlines are read with (up to 10 ms at 100 Hz). Below this
/// the command's start and a busy machine's ordinary scheduling delays stop it (measured:
/// docs/cli.md).
const MIN_EXPTIME: Duration = Duration::from_millis(100);

/// The signal `run` ends by: the command's, or one that came while `run` waited. `main`
/// raises it once every table and connection is dropped.
static DIE_OF: OnceLock<i32> = OnceLock::new();

/// Records that `run` is to die of `sig` (`main` does it, `signals::die_of`); the exit code
/// if it survives it, 128 + `sig`.
fn died_of(sig: i32) -> u8 {
    let _ = DIE_OF.set(sig);
    128u8.wrapping_add(sig as u8)
}

/// The signal `run` is to die of, if it is.
pub fn to_die_of() -> Option<i32> {
    DIE_OF.get().copied()
}

/// `run`'s options as checked, before anything is opened.
pub struct Checked {
    exptime: Duration,
    /// How long to wait for the key (`None`: for good).
    wait_for: Option<Duration>,
    max_time: Option<Duration>,
}

/// Checks what can be checked of `a` alone: a usage error is said (EX_USAGE) before a
/// table file is created or a server is asked, whatever is at the path or the URL.
pub fn check_args(a: &RunArgs) -> Result<Checked, Fail> {
    if a.key.is_empty() {
        return Err(shmlock::Error::EmptyKey.into());
    }
    if a.permits == Some(0) {
        return Err(Fail("--permits must be at least 1".into(), EX_USAGE));
    }
    if a.no_fork {
        return Err(Fail(
            "-F/--no-fork cannot be had: a hold lives as long as a process that keeps the \
             table mapped, and exec unmaps it, so the key would be free while COMMAND runs \
             in shmlock's place. Without -F, COMMAND runs as shmlock's child, gets the \
             signals sent to shmlock, and shmlock exits with its status"
                .into(),
            EX_USAGE,
        ));
    }
    if a.unlock {
        return Err(Fail(
            "-u/--unlock has no meaning here: flock(1)'s -u unlocks a descriptor the shell \
             holds, and a hold belongs to the `shmlock run` that took it. It ends when that \
             run exits; `shmlock unlock --force KEY` breaks it from outside"
                .into(),
            EX_USAGE,
        ));
    }
    if a.fcntl {
        return Err(Fail(
            "--fcntl has no meaning here: shmlock takes no file lock (its locks live in the \
             table's shared memory), so there is no fcntl(2) lock to choose"
                .into(),
            EX_USAGE,
        ));
    }
    let exptime = secs(a.exptime, "--exptime")?;
    if exptime.is_zero() {
        return Err(Fail(
            "--exptime must be > 0: the lock is renewed while the command runs".into(),
            EX_USAGE,
        ));
    }
    if u64::try_from(exptime.as_nanos()).is_err() {
        return Err(Fail(
            format!(
                "--exptime {} is too long: a lease is counted in nanoseconds, below 584 years",
                a.exptime
            ),
            EX_USAGE,
        ));
    }
    if exptime < MIN_EXPTIME {
        return Err(Fail(
            format!(
                "--exptime {} is below 0.1 s, the shortest lease run can keep: it renews the \
                 lease every third of it, and a renewal late by half a lease (a busy machine, \
                 the command's start) would stop the command; give 0.1 or more",
                a.exptime
            ),
            EX_USAGE,
        ));
    }
    // As flock(1): -n wins over -w, in either order (flock's -n makes its flock(2) call
    // non-blocking whatever timer -w set), and -w's value is checked all the same.
    let timeout = a.timeout.map(|t| secs(t, "--timeout")).transpose()?;
    let wait_for = if a.nonblock {
        Some(Duration::ZERO)
    } else {
        timeout
    };
    let max_time = a.max_time.map(|m| secs(m, "--max-time")).transpose()?;
    if max_time == Some(Duration::ZERO) {
        return Err(Fail(
            "--max-time must be > 0: COMMAND would be stopped before it ran (leave it out \
             for no limit)"
                .into(),
            EX_USAGE,
        ));
    }
    Ok(Checked {
        exptime,
        wait_for,
        max_time,
    })
}

/// Takes `a.key`, runs the command, releases the key when it exits; the exit code.
pub fn run<B>(backend: &B, a: RunArgs) -> Result<u8, Fail>
where
    B: Backend + WhoHolds + Sync,
    B::Hold: Send,
{
    let signals = SIGNALS
        .get()
        .ok_or_else(|| Fail("signal handling was not set up".into(), EX_SOFTWARE))?;
    let Checked {
        exptime,
        wait_for,
        max_time,
    } = check_args(&a)?;
    let opts = LockOptions {
        exptime,
        timeout: Duration::ZERO,
        ..LockOptions::default()
    };
    // It waits in slices: the whole wait, not each slice, goes to the counters.
    let mut lock = Lock::new(backend, opts)?.uncounted();
    let (program, args): (&OsStr, &[OsString]) = match &a.shell_command {
        Some(line) => (OsStr::new("/bin/sh"), std::slice::from_ref(line)),
        None => (&a.args[0], &a.args[1..]),
    };
    // (as they are shown: keys and commands may be any bytes)
    let (key_text, program_text) = (a.key.to_string_lossy(), program.to_string_lossy());

    if let ControlFlow::Break(code) = wait_for_lock(backend, &mut lock, &a, wait_for, signals)? {
        return Ok(code);
    }
    if a.verbose {
        say!("shmlock: running {program_text}");
    }

    // The lease was set by the server a round trip at most before this (far less than the
    // margin `supervise` keeps).
    let locked_at = Instant::now();
    let mut cmd = command(program, args, a.shell_command.is_some(), signals.set);
    cmd.env("SHMLOCK_KEY", &a.key);
    match lock.token() {
        Some(token) => cmd.env("SHMLOCK_TOKEN", token.to_string()),
        None => cmd.env_remove("SHMLOCK_TOKEN"),
    };
    // The processes the command leaves running are reparented here, and hold the lock
    // until they exit, as they would hold an inherited flock(1) descriptor.
    let inherit = !a.close;
    if inherit {
        nix::sys::prctl::set_child_subreaper(true)
            .map_err(|e| Fail(format!("becoming a child subreaper: {e}"), EX_OSERR))?;
    }
    // Under the phase lock, so that a signal is either seen here or passed on to the child.
    let mut phase = signals.phase();
    if let Phase::Waiting(Some(sig)) = *phase {
        drop(phase);
        let _ = lock.unlock();
        return Ok(died_of(sig as i32));
    }
    let child = cmd.spawn().map_err(|e| {
        Fail(
            format!("{:?}: {e}", printable(program.as_bytes())),
            spawn_error_code(&e),
        )
    })?;
    let pid = Pid::from_raw(child.id() as libc::pid_t);
    *phase = Phase::Running(pid);
    drop(phase);

    let (events, happened) = mpsc::channel();
    reap_on_thread(child, pid, inherit, signals, events.clone());
    let lease = Lease {
        exptime,
        locked_at,
        max_time,
    };
    let (status, vouched) = supervise(
        &mut lock,
        (&key_text, &program_text),
        lease,
        &happened,
        events,
        a.verbose,
        signals,
    );
    if !vouched {
        // The lease lapses within a tenth of it: a release would only wait on the
        // server that could not renew it (two command timeouts in a partition). Not
        // `leave_to_expire` either, which asks a Redis server for the hold's token; the
        // process exits next, and nothing of the hold is needed before.
        std::mem::forget(lock);
        return Err(status
            .err()
            .unwrap_or_else(|| Fail("lost track of the lease".into(), EX_SOFTWARE)));
    }
    let released = lock.unlock();
    let status = status?;
    match released {
        Ok(()) => {}
        // Broken (or lapsed) after the last renewal: the command ran on without the lock
        // for a while, which its status must not hide.
        Err(Error::Expired) => {
            return Err(Fail(
                format!(
                    "lost the lock on {:?} before the command ended (broken with unlock --force, or its lease lapsed)",
                    key_text
                ),
                EX_TERMINATED,
            ))
        }
        Err(e) => say!("shmlock: releasing {:?}: {}", key_text, describe(&e)),
    }
    Ok(match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(sig)) => died_of(sig),
        _ => 2,
    })
}

/// Waits for `a.key` in slices, between which it looks at signals and redraws the status
/// line. `Break(code)`: `run` exits with `code` without running the command (a signal
/// came, or the wait ran out).
fn wait_for_lock<B: Backend + WhoHolds>(
    backend: &B,
    lock: &mut Lock<'_, B>,
    a: &RunArgs,
    wait_for: Option<Duration>,
    signals: &Signals,
) -> Result<ControlFlow<u8>, Fail> {
    let shown_key = printable(a.key.as_bytes());
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
        match lock.lock_with_timeout(a.key.as_bytes(), slice) {
            Ok(_) => break,
            Err(Error::Timeout { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        if let Phase::Waiting(Some(sig)) = *signals.phase() {
            status.clear();
            if a.verbose {
                say!("shmlock: got {sig} while waiting for {shown_key:?}; not running the command");
            }
            return Ok(ControlFlow::Break(died_of(sig as i32)));
        }
        let waited = started.elapsed();
        let stale = holder
            .as_ref()
            .is_none_or(|h| h.seen.elapsed() >= LOOKUP_EVERY);
        if (status.on || a.verbose) && stale {
            holder = backend.who_holds(a.key.as_bytes()).or(holder);
        }
        let describe = || {
            holder
                .as_ref()
                .map_or("someone".to_string(), HolderInfo::describe)
        };
        if first && a.verbose {
            say!("shmlock: {shown_key:?} is held by {}", describe());
        }
        first = false;
        if wait_for.is_some_and(|w| waited >= w) {
            backend.waited(false, waited);
            // A status line on a terminal is replaced by the reason, not just erased.
            let shown = status.shown();
            status.clear();
            if a.verbose || shown {
                say!(
                    "shmlock: gave up on {shown_key:?} after waiting {:.3}s; held by {}",
                    waited.as_secs_f64(),
                    describe()
                );
            }
            return Ok(ControlFlow::Break(a.conflict_exit_code));
        }
        status.show(&format!(
            "shmlock: waiting for {shown_key:?}, held by {}; waited {}",
            describe(),
            human(waited)
        ));
    }
    status.clear();
    if !first {
        backend.waited(true, started.elapsed());
    }
    if a.verbose {
        say!(
            "shmlock: got {shown_key:?} after waiting {:.3}s",
            started.elapsed().as_secs_f64()
        );
    }
    Ok(ControlFlow::Continue(()))
}

/// `program` with `args` (after `-c` for a shell command line), set up to get the signals
/// `blocked` in this process and to die with it.
fn command(program: &OsStr, args: &[OsString], shell: bool, blocked: SigSet) -> Command {
    let mut cmd = Command::new(program);
    if shell {
        cmd.arg("-c");
    }
    cmd.args(args);
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
    cmd
}

/// What the reaping and the renewing threads tell `supervise`.
enum Event {
    /// The command exited, with this status.
    Command(io::Result<ExitStatus>),
    /// The last of the processes it left running exited (with `inherit` only).
    Leftovers,
    /// A renewal asked for, sent at `sent`, returned this.
    Renewed {
        sent: Instant,
        result: Result<(), Error>,
    },
}

/// Waits for the child on a helper thread, whose channel gets its exit status, then
/// (`inherit`) for every process it left running that was reparented here; the calling
/// thread (the child's parent thread, which PR_SET_PDEATHSIG watches) is left free to
/// renew the lease meanwhile.
fn reap_on_thread(
    child: Child,
    pid: Pid,
    inherit: bool,
    signals: &'static Signals,
    done: Sender<Event>,
) {
    std::thread::spawn(move || {
        let mut command = Some(child);
        loop {
            // Waits without reaping first, then reaps under the phase lock: the signal
            // thread never signals a pid that is no longer a child's. Every child is
            // reaped as it exits, the command's leftovers too while it runs.
            match waitid(Id::All, WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT) {
                Err(nix::errno::Errno::EINTR) => {}
                Ok(status) => {
                    let Some(exited) = status.pid() else { continue };
                    let mut phase = signals.phase();
                    match command.take_if(|_| exited == pid) {
                        Some(mut child) => {
                            *phase = if inherit {
                                Phase::Leftovers
                            } else {
                                Phase::Exited
                            };
                            let status = child.wait();
                            drop(phase);
                            let _ = done.send(Event::Command(status));
                            if !inherit {
                                return;
                            }
                        }
                        None => {
                            let _ = nix::sys::wait::waitpid(exited, None);
                        }
                    }
                }
                // ECHILD: none left
                Err(_) => break,
            }
        }
        *signals.phase() = Phase::Exited;
        if let Some(mut child) = command {
            // (not met: SIGCHLD is at its default, so the command is ours to reap)
            let _ = done.send(Event::Command(child.wait()));
        }
        let _ = done.send(Event::Leftovers);
    });
}

/// The lease `supervise` keeps, and for how long.
struct Lease {
    exptime: Duration,
    /// When the lock was taken.
    locked_at: Instant,
    /// --max-time, counted from `locked_at`.
    max_time: Option<Duration>,
}

/// Renews the lease on `key` every third of it until the command exits (its status
/// comes on `happened`), and the processes it left running (if `run` waits for them).
/// Stops them and fails when the lease is lost, cannot be renewed in time, or --max-time
/// passes. The caller releases the lock after.
///
/// Renewals run on a thread of their own, which sends their outcome on `renewed`: one
/// that hangs on an unreachable server (a Redis call may take two command timeouts,
/// longer than a lease) must not keep this thread from stopping the command when the
/// lease could lapse. Also says whether the lease is still vouched for (a renewal got
/// through in time): if not, the caller leaves the hold to lapse; and if a renewal still
/// hangs then, the process exits here with the failure, without waiting for it.
fn supervise<B>(
    lock: &mut Lock<'_, B>,
    (key, program): (&str, &str),
    lease: Lease,
    happened: &Receiver<Event>,
    renewed: Sender<Event>,
    verbose: bool,
    signals: &Signals,
) -> (Result<ExitStatus, Fail>, bool)
where
    B: Backend + Sync,
    B::Hold: Send,
{
    let (ask, asks) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        s.spawn(move || {
            for () in asks {
                let sent = Instant::now();
                let result = lock.expire(None);
                if renewed.send(Event::Renewed { sent, result }).is_err() {
                    break;
                }
            }
        });
        let mut renewals = Renewals {
            ask,
            busy: false,
            lease_end: None, // (`watch` sets it first)
        };
        let watched = watch(
            (key, program),
            lease,
            happened,
            &mut renewals,
            verbose,
            signals,
        );
        // (a command's status is returned only while the lease was vouched for)
        let vouched = watched.is_ok() || renewals.lease_end.is_some_and(|end| Instant::now() < end);
        if let (Err(Fail(msg, code)), false, true) = (&watched, vouched, renewals.busy) {
            // The command has ended; the scope would wait for the renewal in flight (up to
            // two command timeouts on a silent server) only to leave the hold to lapse.
            say!("shmlock: {}", crate::exit::one_line(msg));
            std::process::exit(i32::from(*code));
        }
        // (the renewing thread ends with `renewals`, once a renewal in flight returns)
        (watched, vouched)
    })
}

/// Asks the renewing thread for renewals, one at a time.
struct Renewals {
    ask: Sender<()>,
    /// A renewal was asked for and has not returned.
    busy: bool,
    /// When the command is stopped unless a renewal gets through (a tenth of a lease
    /// before the last renewed lease could lapse); `None` once the hold is known lost.
    lease_end: Option<Instant>,
}

impl Renewals {
    fn start(&mut self) {
        if !self.busy {
            self.busy = self.ask.send(()).is_ok();
        }
    }
}

/// `supervise`'s loop. While it waits for what the command left running, a status line
/// on a terminal says so (the command's own end may look like the end of `run`'s work).
fn watch(
    (key, program): (&str, &str),
    lease: Lease,
    happened: &Receiver<Event>,
    renewals: &mut Renewals,
    verbose: bool,
    signals: &Signals,
) -> Result<ExitStatus, Fail> {
    let Lease {
        exptime,
        locked_at,
        max_time,
    } = lease;
    let every = exptime / 3;
    // A lease is counted from just before the command that set it was sent; the command
    // is stopped a tenth of a lease before the last one could lapse.
    let margin = exptime / 10;
    let mut lease_end = locked_at + exptime - margin;
    renewals.lease_end = Some(lease_end);
    let mut next_renewal = locked_at + every;
    // (past what an `Instant` holds, --max-time is no limit: 1e19 s is not a panic)
    let stop_at = max_time.and_then(|m| locked_at.checked_add(m));
    let mut command_status: Option<ExitStatus> = None;
    let mut status_line = StatusLine::new();
    // (the leftovers the line names: redrawn when they change)
    let mut shown: Vec<Pid> = Vec::new();
    let terminate = |why: String, renewals: &mut Renewals, lease: Option<Instant>| {
        terminate(why, happened, renewals, (exptime, margin, lease), signals)
    };
    // An end seen after the lease could have lapsed: the lease may have been lost while
    // they ran, which their status must not hide.
    let unvouched = || {
        Fail(
            format!(
                "could not renew the lock on {key:?} before the lease could lapse; the \
                 command ended meanwhile"
            ),
            EX_TERMINATED,
        )
    };
    loop {
        let renew_at = if renewals.busy {
            lease_end
        } else {
            next_renewal.min(lease_end)
        };
        let mut wake = stop_at.map_or(renew_at, |s| s.min(renew_at));
        if let (Some(status), true) = (&command_status, status_line.on) {
            let left = children();
            // (drawn again when they change, once `run` is back in the foreground, or
            // after a line of its own took its place)
            if (left != shown || !status_line.shown())
                && !left.is_empty()
                && status_line.show(&leftovers_line(program, key, status, &left))
            {
                shown = left;
            }
            // (no event says that one of them exited: look again soon)
            wake = wake.min(Instant::now() + SLICE);
        }
        match happened.recv_timeout(wake.saturating_duration_since(Instant::now())) {
            Ok(Event::Command(status)) => {
                let status = status.map_err(|e| Fail(format!("wait: {e}"), EX_OSERR))?;
                if !matches!(*signals.phase(), Phase::Leftovers) {
                    if Instant::now() >= lease_end {
                        return Err(unvouched());
                    }
                    return Ok(status);
                }
                if verbose {
                    let left = children().len();
                    if left > 0 {
                        say!(
                            "shmlock: the command exited; {key:?} stays held until the {left} \
                             process(es) it left running exit"
                        );
                    }
                }
                command_status = Some(status);
            }
            Ok(Event::Leftovers) => {
                if Instant::now() >= lease_end {
                    return Err(unvouched());
                }
                return command_status
                    .ok_or_else(|| Fail("lost track of the command".into(), EX_SOFTWARE));
            }
            Ok(Event::Renewed { sent, result }) => {
                renewals.busy = false;
                match result {
                    Ok(()) => {
                        lease_end = sent + exptime - margin;
                        renewals.lease_end = Some(lease_end);
                        next_renewal = sent + every;
                    }
                    // Broken by force, or gone with a server that restarted empty.
                    Err(Error::Expired) => {
                        renewals.lease_end = None;
                        status_line.clear();
                        return Err(terminate(
                            format!("lost the lock on {key:?}"),
                            renewals,
                            None,
                        ));
                    }
                    // Unreachable for now (a Redis outage, a failover, replicas missing):
                    // try again soon; the command is stopped if no renewal gets through
                    // before the lease could lapse.
                    Err(e) => {
                        status_line.clear();
                        shown.clear();
                        say!("shmlock: renewing {key:?}: {}", describe(&e));
                        next_renewal = Instant::now() + every / 4;
                    }
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                let now = Instant::now();
                if stop_at.is_some_and(|s| now >= s) {
                    status_line.clear();
                    return Err(terminate(
                        format!("{key:?} held for --max-time"),
                        renewals,
                        Some(lease_end),
                    ));
                }
                if now >= lease_end {
                    status_line.clear();
                    return Err(terminate(
                        format!("could not renew the lock on {key:?} in time"),
                        renewals,
                        Some(lease_end),
                    ));
                }
                if now >= next_renewal {
                    renewals.start();
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err(Fail("lost track of the command".into(), EX_SOFTWARE))
            }
        }
    }
}

/// The status line while `run` waits for the processes `left` its command left running.
fn leftovers_line(program: &str, key: &str, status: &ExitStatus, left: &[Pid]) -> String {
    let how = match (status.code(), status.signal()) {
        (Some(code), _) => format!("status {code}"),
        (None, Some(sig)) => match Signal::try_from(sig) {
            Ok(sig) => format!("killed by {sig}"),
            Err(_) => format!("killed by signal {sig}"),
        },
        _ => format!("{status}"),
    };
    let pids: Vec<String> = left.iter().map(Pid::to_string).collect();
    // What matters first, for a line cut to the terminal's width: the key, and whom it
    // waits for.
    let program = printable(program.as_bytes());
    format!(
        "shmlock: {:?} held until what {program} left running exits: pid{} {} ({program} \
         exited, {how}; -o releases at its exit)",
        printable(key.as_bytes()),
        if left.len() == 1 { "" } else { "s" },
        pids.join(" ")
    )
}

/// Stops the command and what it left running (SIGTERM, once to each, then SIGKILL to
/// whatever is still there 5 s later, until nothing is), renewing the lease meanwhile if
/// it is still ours (so that the key is not free while they end), and fails with `why`.
/// The SIGKILL comes sooner if the lease could lapse first: at once for a lease known
/// lost (`lease` is `None`, or a renewal says so), else half a margin before the lease
/// could lapse with no renewal through (`lease`, the time `watch` stops at, is a margin
/// before that). A command that traps SIGTERM must not run on beside the key's next
/// holder.
fn terminate(
    why: String,
    happened: &Receiver<Event>,
    renewals: &mut Renewals,
    (exptime, margin, lease): (Duration, Duration, Option<Instant>),
    signals: &Signals,
) -> Fail {
    let mut termed = signals.signal_all(Signal::SIGTERM, &[]);
    let started = Instant::now();
    let grace = started + Duration::from_secs(5);
    let mut lapse = lease.map(|end| end + margin / 2);
    let mut next_renewal = started + exptime / 3;
    loop {
        let now = Instant::now();
        let kill_at = lapse.map_or(now, |l| l.min(grace));
        if now >= kill_at {
            signals.signal_all(Signal::SIGKILL, &[]);
        } else {
            // processes adopted since (their parent ended) get it too
            let more = signals.signal_all(Signal::SIGTERM, &termed);
            termed.extend(more);
        }
        if now >= next_renewal {
            renewals.start();
            next_renewal = now + exptime / 3;
        }
        let poll = Duration::from_millis(100);
        let wait = match kill_at.checked_duration_since(now) {
            Some(left) if !left.is_zero() => left.min(poll),
            _ => poll,
        };
        match happened.recv_timeout(wait) {
            // Without leftovers to wait for, the command's end is the end.
            Ok(Event::Command(_)) if !matches!(*signals.phase(), Phase::Leftovers) => break,
            Ok(Event::Leftovers) | Err(RecvTimeoutError::Disconnected) => break,
            Ok(Event::Renewed { sent, result }) => {
                renewals.busy = false;
                match result {
                    Ok(()) if lapse.is_some() => {
                        lapse = Some(sent + exptime - margin / 2);
                        renewals.lease_end = Some(sent + exptime - margin);
                    }
                    Ok(()) => {}
                    Err(Error::Expired) => {
                        lapse = None;
                        renewals.lease_end = None;
                    }
                    Err(_) => {}
                }
            }
            Ok(Event::Command(_)) | Err(RecvTimeoutError::Timeout) => {}
        }
    }
    Fail(format!("{why}; command terminated"), EX_TERMINATED)
}
