//! `run`'s signal forwarding: SIGINT, SIGTERM, SIGHUP and SIGQUIT are blocked in every
//! thread and taken by one thread of their own, which remembers the first while `run`
//! waits for the lock and passes each on to the command once it runs (and once it has
//! exited, to the processes it left running, which `run` adopted). SIGTSTP is taken by
//! that thread too, only to erase the status line before `run` stops as it would have.

use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use nix::sys::signal::{kill, signal, SigHandler, SigSet, Signal};
use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::{getpgid, getpgrp, getpid, getsid, Pid};

use crate::exit::{Fail, EX_OSERR};

/// The signals `run` passes on to its command.
const FORWARDED: [Signal; 4] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
];

/// Where `run` is, as its signal thread needs to know.
pub enum Phase {
    /// Waiting for the lock; the first forwarded signal that arrived meanwhile.
    Waiting(Option<Signal>),
    /// The command runs as this child, not yet reaped (so the pid is still its).
    Running(Pid),
    /// The command has exited; the processes it left running (now `run`'s children) hold
    /// the lock until they exit. A child is reaped only under the phase lock, so a pid
    /// listed under it is still that child's.
    Leftovers,
    /// The command has exited and may be reaped at any moment: its pid is no longer ours.
    Exited,
}

/// `run`'s signal handling: FORWARDED are blocked in every thread and taken, one by one,
/// by a thread of their own, which passes them on to the command.
pub struct Signals {
    pub set: SigSet,
    phase: Mutex<Phase>,
    verbose: bool,
    /// `run` holds the lock for what the command leaves running too (no `-o`).
    inherit: bool,
}

/// Set once, by `main`, before any other thread starts.
pub static SIGNALS: OnceLock<Signals> = OnceLock::new();

impl Signals {
    /// Blocks FORWARDED in this thread, and so in every thread started after (the mask is
    /// inherited), then starts the thread that takes them. Must run before any other
    /// thread exists: a thread with them unblocked would die of them instead.
    pub fn start(verbose: bool, inherit: bool) -> Result<&'static Signals, Fail> {
        let mut set = SigSet::empty();
        for sig in FORWARDED {
            set.add(sig);
        }
        set.add(Signal::SIGTSTP);
        set.thread_block()
            .map_err(|e| Fail(format!("blocking signals: {e}"), EX_OSERR))?;
        // An ignored SIGCHLD, inherited from whoever started us, would have the kernel
        // reap the command and what it leaves, and `run` could not wait for them.
        // SAFETY: SIG_DFL installs no handler; no other thread exists yet.
        unsafe { signal(Signal::SIGCHLD, SigHandler::SigDfl) }
            .map_err(|e| Fail(format!("resetting SIGCHLD: {e}"), EX_OSERR))?;
        let signals = SIGNALS.get_or_init(|| Signals {
            set,
            phase: Mutex::new(Phase::Waiting(None)),
            verbose,
            inherit,
        });
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(|| signals.forward())
            .map_err(|e| Fail(format!("starting a thread: {e}"), EX_OSERR))?;
        Ok(signals)
    }

    pub fn phase(&self) -> MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The signal thread: forever takes the next signal and passes it on.
    fn forward(&self) {
        loop {
            let Some((sig, by_kernel)) = next_signal(&self.set) else {
                continue;
            };
            if sig == Signal::SIGTSTP {
                // (a terminal's SUSP sends it to the command too, if it runs: not passed on)
                crate::status::erase_then(stop_this_process);
                continue;
            }
            let mut phase = self.phase();
            // A terminal sends the signals of its INTR and QUIT characters to its whole
            // foreground process group, and so does the kernel SIGHUP when the session
            // leader exits: a process still in ours has it already, and a second one could
            // cut its cleanup short. But a terminal's hangup sends SIGHUP to the session
            // leader alone: if that is `run`, the command has not got it.
            let to_group = match sig {
                Signal::SIGINT | Signal::SIGQUIT => true,
                Signal::SIGHUP => getsid(None).is_ok_and(|s| s != getpid()),
                _ => false,
            };
            let has_it = |pid: Pid| {
                by_kernel && to_group && getpgid(Some(pid)).is_ok_and(|g| g == getpgrp())
            };
            let pass_on = |pid: Pid| {
                if !has_it(pid) {
                    if self.verbose {
                        say!("shmlock: passing {sig} on to pid {pid}");
                    }
                    let _ = kill(pid, sig);
                }
            };
            match &mut *phase {
                Phase::Waiting(got) => {
                    got.get_or_insert(sig);
                }
                // The command has exited, and `run` is about to wait for what it left:
                // the signal is theirs.
                Phase::Running(pid) if self.inherit && has_exited(*pid) => {
                    children().into_iter().for_each(pass_on);
                }
                Phase::Running(pid) => pass_on(*pid),
                Phase::Leftovers => children().into_iter().for_each(pass_on),
                Phase::Exited => {}
            }
        }
    }

    /// Sends `sig` to the command if it has not exited and to every process of it that
    /// `run` adopted, each once, but those in `skip`; returns whom it sent it to.
    pub fn signal_all(&self, sig: Signal, skip: &[Pid]) -> Vec<Pid> {
        let phase = self.phase();
        let mut to = match *phase {
            Phase::Running(pid) => {
                let mut all = children();
                if !all.contains(&pid) {
                    all.push(pid);
                }
                all
            }
            Phase::Leftovers => children(),
            Phase::Waiting(_) | Phase::Exited => Vec::new(),
        };
        to.retain(|pid| !skip.contains(pid));
        for &pid in &to {
            let _ = kill(pid, sig);
        }
        to
    }
}

/// Stops this process as a SIGTSTP at its default action does (a shell then reports the
/// job "Stopped", not "Stopped (signal)"), and returns once it is continued. Called by the
/// signal thread, which took the SIGTSTP that asked for it.
fn stop_this_process() {
    // A signal raised here (tgkill to this thread), where SIGTSTP is blocked, stays pending
    // on this thread, and is delivered here, to its default action, once this thread
    // unblocks it; blocked again once continued, for the next sigwaitinfo.
    // SAFETY: raise sends a signal to the calling thread; nothing is handed to it.
    unsafe { libc::raise(libc::SIGTSTP) };
    let mut tstp = SigSet::empty();
    tstp.add(Signal::SIGTSTP);
    let _ = tstp.thread_unblock();
    let _ = tstp.thread_block();
}

/// Whether the child `pid`, not yet reaped, has exited.
fn has_exited(pid: Pid) -> bool {
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    !matches!(waitid(Id::Pid(pid), flags), Ok(WaitStatus::StillAlive))
}

/// This process's children: the command, and the processes it left running that were
/// reparented here (`run` is their child subreaper). Empty without `/proc`.
pub fn children() -> Vec<Pid> {
    let mut pids = Vec::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return pids;
    };
    for task in tasks.flatten() {
        if let Ok(list) = std::fs::read_to_string(task.path().join("children")) {
            pids.extend(
                list.split_ascii_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .map(Pid::from_raw),
            );
        }
    }
    pids.sort_unstable();
    pids.dedup();
    pids
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

/// Ends this process by `sig`, as its command ended (or as it would have ended itself had
/// it not waited for the signal): a shell sees a death by signal (bash stops a loop only
/// when its child died of SIGINT) where an exit with 128 + N reads as an ordinary status,
/// as timeout(1) and sudo do. Returns only if `sig` does not end a process by default.
pub fn die_of(sig: i32) {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    // A SIGQUIT or SIGSEGV of the command must not dump shmlock's core.
    let no_core = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: setrlimit only reads the struct, which lives across the call.
    unsafe { libc::setrlimit(libc::RLIMIT_CORE, &no_core) };
    // The default action, which ends the process: Rust's runtime ignores SIGPIPE, and
    // FORWARDED have no handler (the signal thread waits for them). Fails, harmlessly,
    // for SIGKILL and SIGSTOP, which are always at their default.
    // SAFETY: SIG_DFL installs no handler, so no code of ours runs on the signal.
    unsafe { libc::signal(sig, libc::SIG_DFL) };
    // FORWARDED are blocked in every thread and the signal thread takes them with
    // sigwaitinfo, which takes only signals pending on the process or on its own thread:
    // a signal sent to this thread (raise is tgkill to the caller) stays pending here
    // until this thread unblocks it, and is then delivered here, to its default action.
    // SAFETY: raise sends a signal to the calling thread; nothing is handed to it.
    unsafe { libc::raise(sig) };
    let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigemptyset initialises the set it points to, which lives across these
    // calls; sigaddset and pthread_sigmask read it only after that.
    unsafe {
        libc::sigemptyset(set.as_mut_ptr());
        libc::sigaddset(set.as_mut_ptr(), sig);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, set.as_ptr(), std::ptr::null_mut());
    }
}
