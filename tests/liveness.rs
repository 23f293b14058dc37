//! Liveness in real processes: a holder is judged dead only on evidence the kernel vouches
//! for, whatever the namespaces and `/proc` of the processes involved (a main thread that
//! exited, a `/proc` mounted with hidepid and read by another uid, time, pid and boot-id
//! namespaces), and no state a killed or stopped process leaves behind wedges a key (or the
//! dict) for good. Plus the file layer's own cases: dangling symlinks, mode bits, killed
//! creators.
//!
//! Exercises `src/shm/registry.rs` (judging an owner), `src/shm/clock.rs` and
//! `src/shm/process.rs` (clocks and identities across namespaces), `src/shm/file.rs`
//! (creating, the reboot reset, symlinks and modes), `src/shm/table/recover.rs` (breaking stopped
//! claims and renewals) and `src/dict/writer.rs`. More cases of the same promises:
//! `tests/namespaces.rs`, `tests/stalls.rs` (stops and kills at exact points) and
//! `tests/files.rs` (the table file).
//!
//! Its own small harness (`harness = false`): single-threaded, so `fork` copies the whole
//! process. `liveness FILTER` runs the tests whose name contains FILTER. The tests that need
//! root (namespaces, mounts, uid switches) are marked as such and run only as root with
//! `--include-ignored` (or `--ignored`), as `scripts/test.sh` runs them when it is root.
//!
//! Every wait is bounded: children are waited for with a limit and killed after it, and
//! anything that may block for good (a dict write after a wedged writer, creating a table
//! through a dangling symlink) runs in a forked child with a time limit.

mod common;

use std::collections::VecDeque;
use std::ffi::CString;
use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::fork::{fork, xorshift};
use common::harness::{require_root, Test};
use common::TempPath;
use shmlock::{Error, Holder, HolderState, Lock, LockOptions, LockTable, SharedDict, Value};

const HIDEPID: &str =
    "needs root: mounts a hidepid=2 /proc in a mount namespace and switches to uid 65534";
const TIME_NS: &str = "needs root: creates a time namespace with a +3600 s monotonic offset";
const BOOT_ID: &str =
    "needs root: mounts over /proc/sys/kernel/random/boot_id in a mount namespace";
const PID_NS: &str = "needs root: runs workers in new pid namespaces";

const TESTS: &[Test] = &[
    // 1. A holder whose main thread exited.
    Test::new(
        "holder_whose_main_thread_exited_keeps_its_key",
        holder_whose_main_thread_exited_keeps_its_key,
    ),
    // 2. A waiter that cannot read the holder's /proc entry.
    Test::new(
        "waiter_that_cannot_read_the_holders_proc_entry_waits",
        waiter_that_cannot_read_the_holders_proc_entry_waits,
    )
    .needs_root(HIDEPID),
    // 3. Time namespaces.
    Test::new(
        "waiter_in_a_time_namespace_waits_for_a_live_lease",
        waiter_in_a_time_namespace_waits_for_a_live_lease,
    )
    .needs_root(TIME_NS),
    Test::new(
        "lease_taken_in_a_time_namespace_runs_out_for_everyone",
        lease_taken_in_a_time_namespace_runs_out_for_everyone,
    )
    .needs_root(TIME_NS),
    // 4. Boot id.
    Test::new(
        "attaching_with_another_boot_id_keeps_a_live_table",
        attaching_with_another_boot_id_keeps_a_live_table,
    )
    .needs_root(BOOT_ID),
    Test::new(
        "attaching_with_an_empty_boot_id_keeps_a_live_table",
        attaching_with_an_empty_boot_id_keeps_a_live_table,
    )
    .needs_root(BOOT_ID),
    Test::new(
        "attaching_without_a_boot_id_keeps_a_live_table",
        attaching_without_a_boot_id_keeps_a_live_table,
    )
    .needs_root(BOOT_ID),
    // 5. Claimers killed mid-claim and mid-extend: in another pid namespace, and (as a
    //    control for the machinery) in this one.
    Test::new(
        "claimer_in_another_pid_namespace_killed_mid_claim_is_reclaimed",
        claimer_in_another_pid_namespace_killed_mid_claim_is_reclaimed,
    )
    .needs_root(PID_NS),
    Test::new(
        "holder_in_another_pid_namespace_killed_mid_extend_is_reclaimed",
        holder_in_another_pid_namespace_killed_mid_extend_is_reclaimed,
    )
    .needs_root(PID_NS),
    Test::new(
        "claimer_killed_mid_claim_is_reclaimed",
        claimer_killed_mid_claim_is_reclaimed,
    ),
    Test::new(
        "holder_killed_mid_extend_is_reclaimed",
        holder_killed_mid_extend_is_reclaimed,
    ),
    // 6. A dict writer in another pid namespace killed holding the writer lock.
    Test::new(
        "dict_writer_in_another_pid_namespace_killed_does_not_wedge_the_dict",
        dict_writer_in_another_pid_namespace_killed_does_not_wedge_the_dict,
    )
    .needs_root(PID_NS),
    // 7. Stopped claimers and extenders.
    Test::new(
        "stopped_claimer_is_broken_and_backs_out",
        stopped_claimer_is_broken_and_backs_out,
    ),
    Test::new(
        "stopped_extender_is_broken_and_finds_its_lease_lost",
        stopped_extender_is_broken_and_finds_its_lease_lost,
    ),
    // 8. The file layer.
    Test::new(
        "dangling_symlink_at_the_path_is_an_error_not_a_spin",
        dangling_symlink_at_the_path_is_an_error_not_a_spin,
    ),
    Test::new("bad_modes_are_rejected", bad_modes_are_rejected),
    Test::new(
        "creator_killed_mid_creation_leaves_no_temporary_file",
        creator_killed_mid_creation_leaves_no_temporary_file,
    ),
];

fn main() {
    common::harness::run("liveness", TESTS, common::harness::no_roles);
}

/// The key every test fights over, each in a table of its own.
const K: &str = "K";

fn opts(exptime_ms: u64, timeout_ms: u64) -> LockOptions {
    LockOptions {
        exptime: Duration::from_millis(exptime_ms),
        timeout: Duration::from_millis(timeout_ms),
        ..LockOptions::default()
    }
}

fn me() -> u32 {
    std::process::id()
}

// ---------------------------------------------------------------------------------------
// Processes

/// A process to signal and end: one of our children (`ours`, reaped here), or a grandchild
/// that a middle process of ours reaps. Killed (and reaped, if ours) on drop, so a failing
/// test leaves nothing running.
struct Proc {
    pid: libc::pid_t,
    ours: bool,
    ended: bool,
}

impl Proc {
    fn ours(child: common::fork::Child) -> Proc {
        Proc {
            pid: child.0,
            ours: true,
            ended: false,
        }
    }

    fn foreign(pid: libc::pid_t) -> Proc {
        Proc {
            pid,
            ours: false,
            ended: false,
        }
    }

    /// Our child's exit code, if it has ended (128 + the signal if it was killed).
    fn try_wait(&mut self) -> Option<i32> {
        assert!(self.ours, "only our own children can be waited for");
        if self.ended {
            return None;
        }
        let mut status = 0;
        // SAFETY: our own child; status is a valid out-pointer.
        let r = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
        if r == self.pid {
            self.ended = true;
            return Some(exit_code(status));
        }
        assert_eq!(
            r,
            0,
            "waitpid({}): {}",
            self.pid,
            io::Error::last_os_error()
        );
        None
    }

    /// Waits for our child's exit code; `None` if it still ran after `limit` (it is then
    /// killed and reaped).
    fn wait(&mut self, limit: Duration) -> Option<i32> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(code) = self.try_wait() {
                return Some(code);
            }
            if Instant::now() > deadline {
                self.kill();
                return None;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// SIGKILL (a stopped process dies too), and reap it if it is ours.
    fn kill(&mut self) {
        if self.ended {
            return;
        }
        common::signal::send(self.pid, libc::SIGKILL);
        if self.ours {
            let mut status = 0;
            // SAFETY: reaping our own child.
            unsafe { libc::waitpid(self.pid, &mut status, 0) };
        }
        self.ended = true;
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

fn exit_code(status: libc::c_int) -> i32 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    }
}

/// The state letter of `/proc/<pid>/stat` (`R`, `S`, `T`, `Z`, ...); `None` if gone.
fn proc_state(pid: libc::pid_t) -> Option<u8> {
    let stat = fs::read(format!("/proc/{pid}/stat")).ok()?;
    let close = stat.iter().rposition(|&b| b == b')')?;
    stat.get(close + 2).copied()
}

/// SIGSTOPs `pid` and waits until the kernel shows it stopped.
fn stop(pid: libc::pid_t) -> Result<(), String> {
    common::signal::send(pid, libc::SIGSTOP);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match proc_state(pid) {
            Some(b'T' | b't') => return Ok(()),
            None | Some(b'Z' | b'X') => return Err(format!("process {pid} ended")),
            _ if Instant::now() > deadline => {
                return Err(format!("process {pid} did not stop within 5 s"))
            }
            _ => std::thread::yield_now(),
        }
    }
}

fn cont(pid: libc::pid_t) {
    common::signal::send(pid, libc::SIGCONT);
}

/// Writes one line to a channel (one `write`, so lines of several writers never mix).
fn tell(chan: &UnixStream, line: &str) {
    let _ = (&*chan).write_all(format!("{line}\n").as_bytes());
}

/// A forked child running a check that reports instead of panicking: the lines it told
/// on the way (`tell`), and its error.
struct Running {
    child: Proc,
    here: UnixStream,
}

/// Forks a child that runs `f`; see [`Running::finish_by`].
fn start(f: impl FnOnce(&UnixStream) -> Result<(), String>) -> Running {
    let (here, there) = UnixStream::pair().unwrap();
    let child = fork(|| match f(&there) {
        Ok(()) => 0,
        Err(e) if e.contains("error: ") => {
            tell(&there, &e); // a nested check's report, already labelled
            1
        }
        Err(e) => {
            tell(&there, &format!("error: {e}"));
            1
        }
    });
    Running {
        child: Proc::ours(child),
        here,
    }
}

impl Running {
    /// `Ok` with what the child said if it returned `Ok`; otherwise what it said and why it
    /// failed (its error, a panic, a signal, or still running at `deadline`: then killed).
    fn finish_by(mut self, deadline: Instant) -> Result<String, String> {
        let code = self
            .child
            .wait(deadline.saturating_duration_since(Instant::now()));
        self.here.set_nonblocking(true).unwrap();
        let mut said = Vec::new();
        let _ = self.here.read_to_end(&mut said);
        let mut said: Vec<String> = String::from_utf8_lossy(&said)
            .lines()
            .map(str::to_string)
            .collect();
        let outcome = match code {
            Some(0) => None,
            Some(1) => Some(String::new()),
            Some(101) => Some("the child panicked (its message is above)".to_string()),
            Some(c) => Some(format!("the child ended with status {c}")),
            None => Some("still running at its time limit: killed".to_string()),
        };
        match outcome {
            None => Ok(said.join(" | ")),
            Some(why) => {
                if !why.is_empty() {
                    said.push(why);
                }
                Err(said.join(" | "))
            }
        }
    }
}

/// Runs `f` in a forked child with a hang limit.
fn in_child(
    limit: Duration,
    f: impl FnOnce(&UnixStream) -> Result<(), String>,
) -> Result<String, String> {
    start(f).finish_by(Instant::now() + limit)
}

/// A process forked by a middle process of ours after `enter` ran in the middle: for
/// namespaces that only the caller's children join (pid, time). The middle reports the
/// inner process's pid (the same here, since the middle itself stays in our namespaces),
/// then waits for it and exits with its status. Both end when this is dropped.
struct Nested {
    inner: Proc,
    middle: Proc,
    said: BufReader<UnixStream>,
    early: VecDeque<String>,
}

impl Nested {
    fn spawn(
        enter: impl FnOnce() -> Result<u64, String>,
        body: impl FnOnce(u64, &UnixStream) -> i32,
    ) -> Nested {
        let (here, there) = UnixStream::pair().unwrap();
        let middle = fork(|| {
            let value = match enter() {
                Ok(v) => v,
                Err(e) => {
                    tell(&there, &format!("error: {e}"));
                    return 1;
                }
            };
            let chan = &there;
            let inner = fork(move || body(value, chan));
            tell(&there, &format!("pid {}", inner.0));
            let mut status = 0;
            // SAFETY: waiting for our own child.
            unsafe { libc::waitpid(inner.0, &mut status, 0) };
            exit_code(status)
        });
        let mut middle = Proc::ours(middle);
        here.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut said = BufReader::new(here);
        let mut early = VecDeque::new();
        let pid = loop {
            let line = match read_line(&mut said) {
                Ok(line) => line,
                Err(e) => panic!(
                    "the middle process never said its child's pid ({e}); it ended with {:?}",
                    middle.wait(Duration::from_secs(5))
                ),
            };
            match line.strip_prefix("pid ") {
                Some(p) => break p.parse().unwrap(),
                None if line.starts_with("error: ") => panic!(
                    "{line} (the middle process ended with {:?})",
                    middle.wait(Duration::from_secs(5))
                ),
                None => early.push_back(line),
            }
        };
        Nested {
            inner: Proc::foreign(pid),
            middle,
            said,
            early,
        }
    }

    /// The next line the inner process said.
    fn next_line(&mut self) -> Result<String, String> {
        match self.early.pop_front() {
            Some(line) => Ok(line),
            None => read_line(&mut self.said),
        }
    }

    /// Kills the inner process; the middle reaps it and ends with its status (returned).
    fn kill(&mut self) -> Option<i32> {
        if self.middle.ended {
            return None;
        }
        if let Some(code) = self.middle.try_wait() {
            self.inner.ended = true; // it ended by itself and was reaped: do not signal
            return Some(code);
        }
        self.inner.kill();
        self.middle.wait(Duration::from_secs(10))
    }
}

impl Drop for Nested {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

fn read_line(r: &mut BufReader<UnixStream>) -> Result<String, String> {
    let mut line = String::new();
    match r.read_line(&mut line) {
        Ok(0) => Err("the other end closed".into()),
        Ok(_) => Ok(line.trim_end().to_string()),
        Err(e) => Err(format!("no word within the time limit ({e})")),
    }
}

// ---------------------------------------------------------------------------------------
// Namespaces, mounts, identities (in forked children only)

fn check(rc: libc::c_int, what: &str) -> Result<(), String> {
    if rc == 0 {
        Ok(())
    } else {
        Err(format!("setup: {what}: {}", io::Error::last_os_error()))
    }
}

fn cstr(s: &str) -> CString {
    CString::new(s).unwrap()
}

/// A private mount namespace for the calling (single-threaded, forked) process.
fn private_mount_namespace() -> Result<(), String> {
    // SAFETY: plain system call; the process is single-threaded.
    check(
        unsafe { libc::unshare(libc::CLONE_NEWNS) },
        "unshare(CLONE_NEWNS)",
    )?;
    // SAFETY: a valid NUL-terminated target and null pointers where mount(2) allows them.
    check(
        unsafe {
            libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            )
        },
        "making / private",
    )
}

fn mount(
    source: &str,
    target: &str,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> Result<(), String> {
    let (source_c, target_c) = (cstr(source), cstr(target));
    let fstype_c = fstype.map(cstr);
    let data_c = data.map(cstr);
    // SAFETY: valid NUL-terminated strings (or null where mount(2) allows it) that outlive
    // the call.
    let rc = unsafe {
        libc::mount(
            source_c.as_ptr(),
            target_c.as_ptr(),
            fstype_c.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            flags,
            data_c
                .as_ref()
                .map_or(std::ptr::null(), |s| s.as_ptr().cast()),
        )
    };
    check(rc, &format!("mount {source} on {target}"))
}

/// Drops root: uid and gid 65534 (nobody), no supplementary groups.
fn become_nobody() -> Result<(), String> {
    // SAFETY: plain system calls in a single-threaded process.
    unsafe {
        check(libc::setgroups(0, std::ptr::null()), "setgroups")?;
        check(libc::setresgid(65534, 65534, 65534), "setresgid")?;
        check(libc::setresuid(65534, 65534, 65534), "setresuid")?;
        if libc::getuid() != 65534 || libc::geteuid() != 65534 || libc::getegid() != 65534 {
            return Err("setup: still not uid/gid 65534".into());
        }
    }
    Ok(())
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

const OFFSET_SECS: u64 = 3600;

/// In a middle process: a new time namespace for its children, with the monotonic clock
/// 3600 s ahead. Returns the middle's own monotonic time, for the child to compare with.
fn enter_time_namespace() -> Result<u64, String> {
    // SAFETY: plain system call; the process is single-threaded.
    check(
        unsafe { libc::unshare(libc::CLONE_NEWTIME) },
        "unshare(CLONE_NEWTIME)",
    )?;
    fs::write(
        "/proc/self/timens_offsets",
        format!("monotonic {OFFSET_SECS} 0"),
    )
    .map_err(|e| format!("setup: writing /proc/self/timens_offsets: {e}"))?;
    Ok(monotonic_ns())
}

/// In a child of a middle process that ran [`enter_time_namespace`]: checks that the
/// offset really applies here.
fn check_time_offset(middle_ns: u64) -> Result<(), String> {
    let offsets = fs::read_to_string("/proc/self/timens_offsets")
        .map_err(|e| format!("setup: /proc/self/timens_offsets: {e}"))?;
    let monotonic = offsets
        .lines()
        .find(|l| l.starts_with("monotonic"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse::<u64>().ok());
    if monotonic != Some(OFFSET_SECS) {
        return Err(format!("setup: not in the time namespace: {offsets:?}"));
    }
    let ahead = monotonic_ns().saturating_sub(middle_ns);
    if ahead < (OFFSET_SECS - 10) * 1_000_000_000 {
        return Err(format!(
            "setup: the monotonic clock is only {ahead} ns ahead of the root namespace's"
        ));
    }
    Ok(())
}

/// In a middle process: a new pid namespace for its children.
fn enter_pid_namespace() -> Result<u64, String> {
    // SAFETY: plain system call; the process is single-threaded.
    check(
        unsafe { libc::unshare(libc::CLONE_NEWPID) },
        "unshare(CLONE_NEWPID)",
    )?;
    Ok(0)
}

/// A directory removed with its contents when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let path = TempPath::new(name).0.clone(); // a fresh name; the TempPath is gone
        fs::create_dir(&path).unwrap();
        TempDir(path)
    }

    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    fn empty(&self) {
        for name in self.names() {
            fs::remove_file(self.0.join(name)).unwrap();
        }
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// The entries of a table that only the test's key K is ever taken in.
fn entries(table: &LockTable) -> Vec<String> {
    table
        .holders()
        .iter()
        .map(|h| {
            format!(
                "{:?} pid {} alive {} ttl {:?} expired {} token {:?}",
                h.state, h.pid, h.owner_alive, h.ttl, h.expired, h.token
            )
        })
        .collect()
}

/// The entries that hold (not a claim in passing, not a lapsed lease).
fn holds(table: &LockTable) -> Vec<Holder> {
    table
        .holders()
        .into_iter()
        .filter(|h| h.state != HolderState::Claiming && !h.expired)
        .collect()
}

/// Asserts that the test's own hold is the only one.
fn assert_only_mine(table: &LockTable, when: &str) {
    let holds = holds(table);
    assert!(
        holds.len() == 1 && holds[0].pid == me() && holds[0].state == HolderState::Held,
        "{when}: the test (pid {}) should be K's only holder; entries: {:?}",
        me(),
        entries(table)
    );
}

// ---------------------------------------------------------------------------------------
// 1. A holder whose main thread exited

/// A process whose main thread has exited shows state `Z` while its other threads run.
/// One of those threads holds K (30 s lease): a waiter must time out, and gets K once the
/// holder releases it.
///
/// The main thread ends with the `exit` system call, which is what `pthread_exit` does at
/// the end: it ends the calling thread only. (`pthread_exit` itself force-unwinds the stack,
/// which Rust's `catch_unwind` under the forked child refuses: the process aborts.)
fn holder_whose_main_thread_exited_keeps_its_key() {
    let path = TempPath::new("leader-exit");
    let table = LockTable::open(&path, 16).unwrap();
    let (here, there) = UnixStream::pair().unwrap();
    let mut holder = Proc::ours(fork(|| {
        let table = table.clone();
        let mut chan = there.try_clone().unwrap();
        std::thread::spawn(move || {
            let mut lock = Lock::new(&table, opts(30_000, 0)).unwrap();
            let mut run = || {
                if lock.lock(K).is_err() {
                    return 10;
                }
                if chan.write_all(b"H").is_err() {
                    return 11;
                }
                let mut b = [0u8; 1];
                if chan.read_exact(&mut b).is_err() {
                    return 12;
                }
                match lock.unlock() {
                    Ok(()) => 0,
                    Err(Error::Expired) => 13,
                    Err(_) => 14,
                }
            };
            let code = run();
            // SAFETY: ends the whole process from its last running thread, at once.
            unsafe { libc::_exit(code) }
        });
        // SAFETY: SYS_exit ends the calling thread only (not the thread group, unlike
        // exit_group); the other thread goes on. Nothing on this stack is used again.
        unsafe { libc::syscall(libc::SYS_exit, 0) };
        unreachable!("the main thread has exited");
    }));
    let mut chan = here;
    chan.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut b = [0u8; 1];
    if chan.read_exact(&mut b).is_err() {
        panic!(
            "the holder never took K (it ended with {:?})",
            holder.wait(Duration::from_secs(5))
        );
    }
    // The leader is a zombie while the process lives on.
    let deadline = Instant::now() + Duration::from_secs(5);
    while proc_state(holder.pid) != Some(b'Z') {
        assert!(
            Instant::now() < deadline,
            "setup: the holder's main thread did not exit: state {:?}",
            proc_state(holder.pid).map(char::from)
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let running: Vec<u8> = fs::read_dir(format!("/proc/{}/task", holder.pid))
        .unwrap()
        .filter_map(|t| {
            let tid: libc::pid_t = t.ok()?.file_name().to_str()?.parse().ok()?;
            let state = fs::read(format!("/proc/{}/task/{tid}/stat", holder.pid)).ok()?;
            let close = state.iter().rposition(|&b| b == b')')?;
            Some(state[close + 2])
        })
        .filter(|&s| s != b'Z')
        .collect();
    assert!(
        !running.is_empty(),
        "setup: the holder has no live thread left"
    );
    assert!(table.is_locked(K).unwrap());

    let mut waiter = Lock::new(&table, opts(30_000, 1_000)).unwrap();
    let t0 = Instant::now();
    match waiter.lock(K) {
        Err(Error::Timeout { .. }) => {}
        Ok(_) => panic!(
            "acquired K after {:.1?} while its holder (pid {}) was alive: its main thread had \
             exited (state Z) and its other thread held K with a 30 s lease",
            t0.elapsed(),
            holder.pid
        ),
        Err(e) => panic!("lock(K): {e}"),
    }
    let timed_out = t0.elapsed();
    assert_eq!(proc_state(holder.pid), Some(b'Z'), "setup: holder changed");

    chan.write_all(b"R").unwrap();
    let code = holder.wait(Duration::from_secs(10));
    assert_eq!(
        code,
        Some(0),
        "the holder's unlock (0: Ok, 13: Expired, 14: another error; None: hung)"
    );
    let t1 = Instant::now();
    waiter
        .lock_with_timeout(K, Duration::from_secs(5))
        .expect("K once its holder released it");
    note!(
        "[timed out after {timed_out:.2?}; K {:.2?} after the release] ",
        t1.elapsed()
    );
    waiter.unlock().unwrap();
}

// ---------------------------------------------------------------------------------------
// 2. A waiter that cannot read the holder's /proc entry

/// The holder (this process, root) holds K for 30 s in a table of mode 0666. The waiter
/// has a private `/proc` mounted with `hidepid=2` and runs as uid 65534: it cannot read the
/// holder's `/proc` entry, and must time out all the same.
fn waiter_that_cannot_read_the_holders_proc_entry_waits() {
    require_root();
    let path = TempPath::new("hidepid");
    let table = LockTable::options()
        .capacity(16)
        .mode(0o666)
        .open(&path)
        .unwrap();
    let mut mine = Lock::new(&table, opts(30_000, 0)).unwrap();
    mine.lock(K).unwrap();
    let holder = me();
    let pid_ns = fs::metadata("/proc/self/ns/pid").unwrap().ino();
    let result = in_child(Duration::from_secs(30), |chan| {
        private_mount_namespace()?;
        mount(
            "proc",
            "/proc",
            Some("proc"),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            Some("hidepid=2"),
        )?;
        become_nobody()?;
        if let Ok(stat) = fs::read_to_string(format!("/proc/{holder}/stat")) {
            return Err(format!(
                "setup: uid 65534 still reads the holder's {stat:?}"
            ));
        }
        // The same pid namespace as the table's creator: the library does judge pids here.
        let ns = fs::metadata("/proc/self/ns/pid").map_err(|e| format!("setup: {e}"))?;
        if ns.ino() != pid_ns {
            return Err("setup: not in the creator's pid namespace".into());
        }
        tell(chan, "cannot read the holder's /proc entry");
        let table = LockTable::open(&path, 16).map_err(|e| format!("open: {e}"))?;
        let mut waiter = Lock::new(&table, opts(30_000, 1_000)).unwrap();
        let t0 = Instant::now();
        match waiter.lock(K) {
            Err(Error::Timeout { .. }) => Ok(()),
            Ok(_) => Err(format!(
                "acquired K after {:.1?} while its holder (pid {holder}, root, hidden by \
                 hidepid=2) was alive with a 30 s lease",
                t0.elapsed()
            )),
            Err(e) => Err(format!("lock(K): {e}")),
        }
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    mine.unlock().expect("the holder's own unlock");
}

// ---------------------------------------------------------------------------------------
// 3. Time namespaces

/// A live holder in the root time namespace holds K for 30 s; a waiter whose monotonic
/// clock is 3600 s ahead must time out.
fn waiter_in_a_time_namespace_waits_for_a_live_lease() {
    require_root();
    let path = TempPath::new("timens-waiter");
    let table = LockTable::open(&path, 16).unwrap();
    let mut mine = Lock::new(&table, opts(30_000, 0)).unwrap();
    mine.lock(K).unwrap();
    let result = in_child(Duration::from_secs(30), |_| {
        let middle_ns = enter_time_namespace()?;
        in_child(Duration::from_secs(20), |chan| {
            check_time_offset(middle_ns)?;
            tell(chan, "monotonic clock 3600 s ahead");
            let table = LockTable::open(&path, 16).map_err(|e| format!("open: {e}"))?;
            let mut waiter = Lock::new(&table, opts(30_000, 1_000)).unwrap();
            let t0 = Instant::now();
            match waiter.lock(K) {
                Err(Error::Timeout { .. }) => Ok(()),
                Ok(_) => Err(format!(
                    "acquired K after {:.1?} in a time namespace 3600 s ahead, while its \
                     holder was alive with a 30 s lease",
                    t0.elapsed()
                )),
                Err(e) => Err(format!("lock(K): {e}")),
            }
        })
        .map(|_| ())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    mine.unlock().expect("the holder's own unlock");
}

/// A holder in a time namespace 3600 s ahead takes K with a 1 s lease and stays alive
/// without renewing: a waiter in the root namespace gets K after about a second, not an
/// hour.
fn lease_taken_in_a_time_namespace_runs_out_for_everyone() {
    require_root();
    let path = TempPath::new("timens-holder");
    let table = LockTable::open(&path, 16).unwrap();
    let mut holder = Nested::spawn(enter_time_namespace, |middle_ns, chan| {
        if let Err(e) = check_time_offset(middle_ns) {
            tell(chan, &format!("error: {e}"));
            return 1;
        }
        let table = match LockTable::open(&path, 16) {
            Ok(t) => t,
            Err(e) => {
                tell(chan, &format!("error: open: {e}"));
                return 1;
            }
        };
        match table.lock(K, opts(1_000, 0)) {
            Ok(guard) => {
                let _ = guard.leave_to_expire();
            }
            Err(e) => {
                tell(chan, &format!("error: lock(K): {e}"));
                return 1;
            }
        }
        tell(chan, "held");
        std::thread::sleep(Duration::from_secs(60)); // alive, never renewing
        0
    });
    let said = holder.next_line();
    assert_eq!(
        said.as_deref(),
        Ok("held"),
        "the holder in the time namespace"
    );
    let mut waiter = Lock::new(&table, opts(30_000, 10_000)).unwrap();
    let t0 = Instant::now();
    let got = waiter.lock(K);
    let took = t0.elapsed();
    let alive = proc_state(holder.inner.pid);
    assert!(
        matches!(alive, Some(b'S' | b'R')),
        "setup: the holder should still be alive, state {alive:?}"
    );
    match got {
        Ok(_) => {}
        Err(e) => panic!(
            "lock(K) failed after {took:.1?} ({e}): the 1 s lease taken in a time namespace \
             3600 s ahead had not run out for the root namespace; entries: {:?}",
            entries(&table)
        ),
    }
    assert!(
        took < Duration::from_secs(5),
        "K came only after {took:.1?} for a 1 s lease"
    );
    note!("[K after {took:.2?}] ");
    waiter.unlock().unwrap();
}

// ---------------------------------------------------------------------------------------
// 4. Boot id

#[derive(Clone, Copy, Debug)]
enum BootId {
    /// Another UUID, bind-mounted over the boot id file.
    Other,
    /// An empty file bind-mounted over it.
    Empty,
    /// A tmpfs over /proc/sys/kernel/random: no boot id file at all.
    Missing,
}

fn attaching_with_another_boot_id_keeps_a_live_table() {
    attach_with_boot_id(BootId::Other);
}

fn attaching_with_an_empty_boot_id_keeps_a_live_table() {
    attach_with_boot_id(BootId::Empty);
}

fn attaching_without_a_boot_id_keeps_a_live_table() {
    attach_with_boot_id(BootId::Missing);
}

/// A live holder (this process) holds K for 30 s with fencing token T; a process that
/// reads another boot id, or none, attaches to the table by path. K must still be held by
/// the same holder, its unlock must succeed, and the next token must exceed T.
fn attach_with_boot_id(kind: BootId) {
    require_root();
    const BOOT_ID_FILE: &str = "/proc/sys/kernel/random/boot_id";
    let real = fs::read_to_string(BOOT_ID_FILE).unwrap();
    let path = TempPath::new("boot-id");
    let table = LockTable::open(&path, 16).unwrap();
    // A few holders first, so that a counter that restarts shows.
    for _ in 0..3 {
        let guard = table.lock(K, LockOptions::default()).unwrap();
        assert!(guard.token().is_some());
        guard.unlock().unwrap();
    }
    let mut mine = Lock::new(&table, opts(30_000, 0)).unwrap();
    mine.lock(K).unwrap();
    let t = mine.token().unwrap();
    let fake = TempPath::new("boot-id-file");
    fs::write(
        &fake,
        match kind {
            BootId::Other => "0badc0de-1111-4222-8333-444455556666\n",
            _ => "",
        },
    )
    .unwrap();
    let result = in_child(Duration::from_secs(30), |chan| {
        private_mount_namespace()?;
        match kind {
            BootId::Other | BootId::Empty => mount(
                fake.0.to_str().unwrap(),
                BOOT_ID_FILE,
                None,
                libc::MS_BIND,
                None,
            )?,
            BootId::Missing => mount("tmpfs", "/proc/sys/kernel/random", Some("tmpfs"), 0, None)?,
        }
        let seen = fs::read_to_string(BOOT_ID_FILE);
        let took_effect = match (kind, &seen) {
            (BootId::Other, Ok(s)) => s.starts_with("0badc0de") && *s != real,
            (BootId::Empty, Ok(s)) => s.is_empty(),
            (BootId::Missing, Err(_)) => true,
            _ => false,
        };
        if !took_effect {
            return Err(format!("setup: the boot id reads {seen:?}"));
        }
        tell(chan, &format!("boot id reads {seen:?}"));
        LockTable::open(&path, 16)
            .map(drop)
            .map_err(|e| format!("open: {e}"))
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let mut wrong = Vec::new();
    let taken = table
        .try_lock_with_lease(K, Duration::from_secs(30))
        .unwrap();
    if let Some(g) = taken {
        wrong.push(format!(
            "K was free after a process with {kind:?} boot id attached (the live table was \
             reset); took it with token {:?}",
            g.token()
        ));
        drop(g);
    }
    let holds = holds(&table);
    if !(holds.len() == 1 && holds[0].pid == me()) {
        wrong.push(format!(
            "holders() no longer lists the holder (pid {}): {:?}",
            me(),
            entries(&table)
        ));
    }
    if let Err(e) = mine.unlock() {
        wrong.push(format!("the holder's unlock: {e}"));
    }
    let next = table.lock(K, LockOptions::default()).unwrap();
    let next_token = next.token().unwrap();
    if next_token <= t {
        wrong.push(format!(
            "the next holder's token {next_token} is not above the live holder's {t}"
        ));
    }
    next.unlock().unwrap();
    assert!(wrong.is_empty(), "{}", wrong.join("; "));
    note!("[tokens {t} then {next_token}] ");
}

// ---------------------------------------------------------------------------------------
// 5. Killed mid-claim and mid-extend

fn claimer_in_another_pid_namespace_killed_mid_claim_is_reclaimed() {
    require_root();
    killed_mid_state_is_reclaimed(HolderState::Claiming, true);
}

fn holder_in_another_pid_namespace_killed_mid_extend_is_reclaimed() {
    require_root();
    killed_mid_state_is_reclaimed(HolderState::Extending, true);
}

/// The same in this pid namespace: a control for the machinery above (stopping a worker
/// in a given state, killing it, reclaiming).
fn claimer_killed_mid_claim_is_reclaimed() {
    killed_mid_state_is_reclaimed(HolderState::Claiming, false);
}

fn holder_killed_mid_extend_is_reclaimed() {
    killed_mid_state_is_reclaimed(HolderState::Extending, false);
}

/// Exit codes of the workers.
const NOT_PID_1: i32 = 91;
const OPEN_FAILED: i32 = 92;
const LOCK_FAILED: i32 = 93;
const UNLOCK_FAILED: i32 = 94;
const EXPIRE_FAILED: i32 = 95;

/// Takes and releases K for good.
fn claim_loop(path: &Path) -> i32 {
    let Ok(table) = LockTable::open(path, 16) else {
        return OPEN_FAILED;
    };
    // The lease alternates between two lengths: a thread taking its key again within one
    // clock tick with the same lease finds the slot's fields already right and publishes
    // HELD with one CAS, never passing through CLAIMING, which these tests must catch.
    for i in 0u64.. {
        let Ok(g) = table.lock(K, opts(30_000 + i % 2, 30_000)) else {
            return LOCK_FAILED;
        };
        if g.unlock().is_err() {
            return UNLOCK_FAILED;
        }
    }
    0
}

/// Holds K and renews the lease for good (`lease_ms` each time). Ends with 0 once a
/// renewal says the lease was lost.
fn extend_loop(path: &Path, lease_ms: u64) -> i32 {
    let Ok(table) = LockTable::open(path, 16) else {
        return OPEN_FAILED;
    };
    let mut lock = Lock::new(&table, opts(lease_ms, 30_000)).unwrap();
    if lock.lock(K).is_err() {
        return LOCK_FAILED;
    }
    loop {
        match lock.expire(None) {
            Ok(()) => {}
            Err(Error::Expired) => return 0,
            Err(_) => return EXPIRE_FAILED,
        }
    }
}

/// A worker in this pid namespace (our child) or, as pid 1, in a new one.
enum Worker {
    Here(Proc),
    InNewPidNs(Nested),
}

impl Worker {
    fn spawn(new_pid_ns: bool, body: impl FnOnce() -> i32) -> Worker {
        if new_pid_ns {
            Worker::InNewPidNs(Nested::spawn(enter_pid_namespace, |_, _| {
                // SAFETY: getpid has no preconditions.
                if unsafe { libc::getpid() } != 1 {
                    return NOT_PID_1;
                }
                body()
            }))
        } else {
            Worker::Here(Proc::ours(fork(body)))
        }
    }

    fn pid(&self) -> libc::pid_t {
        match self {
            Worker::Here(p) => p.pid,
            Worker::InNewPidNs(n) => n.inner.pid,
        }
    }

    /// SIGKILL, reaped (by us or by its middle process); its exit status.
    fn kill(&mut self) -> Option<i32> {
        match self {
            Worker::Here(p) => {
                if let Some(code) = p.try_wait() {
                    return Some(code);
                }
                p.kill();
                Some(128 + libc::SIGKILL)
            }
            Worker::InNewPidNs(n) => n.kill(),
        }
    }
}

/// SIGSTOPs `pid` until the table (where only K is ever taken) shows an entry in `state`,
/// SIGCONTing it between looks, at most `tries` times. Returns whether it was caught (then
/// it is left stopped) and how many stops it took.
fn catch_in_state(
    table: &LockTable,
    pid: libc::pid_t,
    state: HolderState,
    tries: usize,
    x: &mut u64,
) -> Result<(bool, usize), String> {
    for i in 1..=tries {
        stop(pid)?;
        if table.holders().iter().any(|h| h.state == state) {
            return Ok((true, i));
        }
        cont(pid);
        // A varying pause, so that the stops land at different points of the worker's loop.
        let until = Instant::now() + Duration::from_nanos(xorshift(x) % 20_000);
        while Instant::now() < until {
            std::hint::spin_loop();
        }
    }
    Ok((false, tries))
}

/// Workers that loop lock/unlock (Claiming) or hold and renew (Extending) are stopped
/// until caught in `state`, then SIGKILLed and reaped; each time the test's `lock(K)` with
/// a 5 s timeout must succeed and leave the test as K's only holder. At least 10 kills in
/// `state` are made. A renewal is a few instructions between two system calls (signals
/// are blocked around it), so a stop lands in it once in thousands, and in tens of
/// thousands on some machines: workers come until 10 are caught, within a cap of
/// workers and of time that is a hang guard.
fn killed_mid_state_is_reclaimed(state: HolderState, new_pid_ns: bool) {
    const WANTED: usize = 10;
    const MAX_WORKERS: usize = 1_000;
    const MAX_TIME: Duration = Duration::from_secs(300);
    const STOPS_PER_WORKER: usize = 3_000;
    let began = Instant::now();
    let path = TempPath::new("killed-mid");
    let table = LockTable::open(&path, 16).unwrap();
    let (mut caught, mut elsewhere, mut stops) = (0, 0, 0);
    let mut longest = Duration::ZERO;
    let mut x = 0x9e37_79b9_7f4a_7c15;
    let place = if new_pid_ns {
        "in a new pid namespace"
    } else {
        "in this pid namespace"
    };
    for n in 1..=MAX_WORKERS {
        if caught >= WANTED || began.elapsed() > MAX_TIME {
            break;
        }
        let mut worker = Worker::spawn(new_pid_ns, || match state {
            HolderState::Claiming => claim_loop(&path.0),
            _ => extend_loop(&path.0, 30_000),
        });
        let (hit, tries) =
            match catch_in_state(&table, worker.pid(), state, STOPS_PER_WORKER, &mut x) {
                Ok(r) => r,
                Err(e) => panic!(
                    "worker {n} {place}: {e}; it ended with {:?}; entries: {:?}",
                    worker.kill(),
                    entries(&table)
                ),
            };
        stops += tries;
        let at_kill = entries(&table);
        let status = worker.kill();
        assert_eq!(status, Some(128 + libc::SIGKILL), "worker {n}'s status");
        if hit {
            caught += 1;
        } else {
            elsewhere += 1;
        }
        let mut lock = Lock::new(&table, opts(30_000, 5_000)).unwrap();
        let t0 = Instant::now();
        if let Err(e) = lock.lock(K) {
            panic!(
                "worker {n} {place} was SIGKILLed {} and reaped; then lock(K) failed after \
                 {:.1?}: {e}. Entries at the kill: {at_kill:?}; now: {:?}",
                if hit {
                    format!("in {state:?}")
                } else {
                    format!("without being caught in {state:?}")
                },
                t0.elapsed(),
                entries(&table)
            );
        }
        longest = longest.max(t0.elapsed());
        let all = table.holders();
        assert!(
            all.len() == 1 && all[0].pid == me() && all[0].state == HolderState::Held,
            "after reclaiming K from worker {n}, the test's hold should be K's only entry: {:?}",
            entries(&table)
        );
        lock.unlock().unwrap();
    }
    note!(
        "[{caught} kills in {state:?}, {elsewhere} elsewhere, {stops} stops in {:.1?}; K \
         reclaimed within {longest:.2?}] ",
        began.elapsed()
    );
    assert!(
        caught >= WANTED,
        "only {caught} of {WANTED} workers {place} were caught in {state:?} \
         ({elsewhere} workers, {stops} stops, {:.1?})",
        began.elapsed()
    );
    assert_eq!(
        table.holders(),
        vec![],
        "entries left: {:?}",
        entries(&table)
    );
}

// ---------------------------------------------------------------------------------------
// 6. A dict writer in another pid namespace killed holding the writer lock

const DICT_KEYS: [(&str, usize); 3] = [
    ("big:0", 256 << 10),
    ("big:1", 512 << 10),
    ("big:2", 1 << 20),
];

/// Stores large values on a few keys for good: every byte of a value is the same.
fn dict_writer_loop(path: &Path) -> i32 {
    let Ok(dict) = SharedDict::open(path, 16, 1 << 20) else {
        return OPEN_FAILED;
    };
    let mut values: Vec<Vec<u8>> = DICT_KEYS.iter().map(|&(_, len)| vec![0; len]).collect();
    for round in 0u64.. {
        for (i, &(key, _)) in DICT_KEYS.iter().enumerate() {
            values[i].fill((round % 251) as u8 + 1);
            if dict.set(key, &values[i], Duration::ZERO).is_err() {
                return LOCK_FAILED;
            }
        }
    }
    0
}

/// A writer in a new pid namespace is SIGKILLed while it holds the dict's writer lock;
/// then a `set` of another key and a `get` of each key it wrote must complete (within
/// 20 s, in a child), and every value read is whole: the key it was rewriting gets its
/// previous value back from the undo copy (every key had one before the writer began).
fn dict_writer_in_another_pid_namespace_killed_does_not_wedge_the_dict() {
    require_root();
    let path = TempPath::new("dict-writer");
    let dict = SharedDict::options()
        .capacity(16)
        .max_value_len(1 << 20)
        .open(&path)
        .unwrap();
    for (key, len) in DICT_KEYS {
        dict.set(key, &vec![b'0'; len], Duration::ZERO).unwrap();
    }
    let mut worker = Worker::spawn(true, || dict_writer_loop(&path.0));
    let mut x = 0x2545_f491_4f6c_dd1d;
    let mut writer = None;
    for _ in 0..5_000 {
        if let Err(e) = stop(worker.pid()) {
            panic!("the writer: {e}; it ended with {:?}", worker.kill());
        }
        writer = dict.writer_pid();
        if writer.is_some() {
            break;
        }
        cont(worker.pid());
        for _ in 0..xorshift(&mut x) % 20_000 {
            std::hint::spin_loop();
        }
    }
    let writer = writer.expect("never caught the worker holding the writer lock");
    assert_eq!(worker.kill(), Some(128 + libc::SIGKILL));
    let result = in_child(Duration::from_secs(20), |chan| {
        tell(chan, "set(other)");
        let _ = dict
            .set("other", "v", Duration::ZERO)
            .map_err(|e| format!("set(other): {e}"))?;
        tell(chan, "done");
        for (key, len) in DICT_KEYS {
            tell(chan, &format!("get({key})"));
            match dict.get(key).map_err(|e| format!("get({key}): {e}"))? {
                None => return Err(format!("get({key}) found no value")),
                Some(item) => match item.value {
                    Value::Bytes(b) if b.len() == len && b.iter().all(|&c| c == b[0]) => {
                        tell(chan, "whole")
                    }
                    other => {
                        return Err(format!(
                            "get({key}) read a torn value: {:?}…",
                            other.as_bytes().map(|b| &b[..b.len().min(16)])
                        ))
                    }
                },
            }
        }
        match dict.get("other").map_err(|e| format!("get(other): {e}"))? {
            Some(item) if item.value == Value::Bytes(b"v".to_vec()) => Ok(()),
            other => Err(format!("get(other) read {other:?}")),
        }
    });
    match result {
        Ok(said) => note!("[writer pid {writer} killed; then {said}] "),
        Err(e) => panic!(
            "after the writer (recorded as pid {writer}) was killed holding the writer lock: \
             {e}"
        ),
    }
}

// ---------------------------------------------------------------------------------------
// 7. Stopped claimers and extenders

/// A claimer stopped (SIGSTOP) in the middle of claiming K is left stopped: the test must
/// get K within 10 s (the design bounds a stalled claim at about 0.5 s). When the claimer
/// resumes, the test's hold must be intact.
fn stopped_claimer_is_broken_and_backs_out() {
    let path = TempPath::new("stopped-claimer");
    let table = LockTable::open(&path, 16).unwrap();
    let mut worker = Proc::ours(fork(|| claim_loop(&path.0)));
    let mut x = 0x5eed;
    let (hit, tries) =
        catch_in_state(&table, worker.pid, HolderState::Claiming, 20_000, &mut x).unwrap();
    assert!(hit, "never caught the claimer in Claiming in {tries} stops");
    let stalled = entries(&table);
    let mut mine = Lock::new(&table, opts(30_000, 10_000)).unwrap();
    let t0 = Instant::now();
    let got = mine.lock(K);
    let took = t0.elapsed();
    if let Err(e) = got {
        panic!(
            "lock(K) failed after {took:.1?} ({e}) while a claimer of K (pid {}) was stopped \
             in Claiming: {stalled:?}",
            worker.pid
        );
    }
    assert!(
        took < Duration::from_secs(5),
        "K came only after {took:.1?} past a stopped claim"
    );
    cont(worker.pid);
    std::thread::sleep(Duration::from_millis(200));
    assert_only_mine(&table, "200 ms after the stopped claimer resumed");
    mine.unlock()
        .expect("the test's unlock after the stopped claimer resumed");
    note!("[caught after {tries} stops; K after {took:.2?}] ");
    assert_eq!(worker.try_wait(), None, "the claimer failed");
}

/// A holder renewing a 1 s lease in a loop is stopped in the middle of a renewal
/// (Extending) and left stopped: the test must get K within 10 s. When it resumes, its
/// renewal must report the lease lost (`Expired`), and the test's hold must be intact.
fn stopped_extender_is_broken_and_finds_its_lease_lost() {
    let path = TempPath::new("stopped-extender");
    let table = LockTable::open(&path, 16).unwrap();
    let mut worker = Proc::ours(fork(|| extend_loop(&path.0, 1_000)));
    let mut x = 0x5eed;
    // A renewal blocks the thread's signals around its two CAS (since f3ef423), so a stop
    // lands inside it about once in 2,000-12,000 (four runs); 20,000 missed once in CI. A
    // budget this large is a hang guard: the loop ends at the first catch.
    let (hit, tries) =
        catch_in_state(&table, worker.pid, HolderState::Extending, 200_000, &mut x).unwrap();
    assert!(hit, "never caught the holder in Extending in {tries} stops");
    let stalled = entries(&table);
    let mut mine = Lock::new(&table, opts(30_000, 10_000)).unwrap();
    let t0 = Instant::now();
    let got = mine.lock(K);
    let took = t0.elapsed();
    if let Err(e) = got {
        panic!(
            "lock(K) failed after {took:.1?} ({e}) while its holder (pid {}, 1 s lease) was \
             stopped in Extending: {stalled:?}",
            worker.pid
        );
    }
    assert!(
        took < Duration::from_secs(5),
        "K came only after {took:.1?} past a stopped renewal of a 1 s lease"
    );
    cont(worker.pid);
    let code = worker.wait(Duration::from_secs(3));
    assert_eq!(
        code,
        Some(0),
        "the resumed holder's renewal should report Expired (exit 0; {EXPIRE_FAILED}: another \
         error; None: its renewals kept succeeding for 3 s after K was taken)"
    );
    assert_only_mine(&table, "after the stopped holder resumed");
    mine.unlock()
        .expect("the test's unlock after the stopped holder resumed");
    note!("[caught after {tries} stops; K after {took:.2?}] ");
}

// ---------------------------------------------------------------------------------------
// 8. The file layer

/// A dangling symlink at the path (to a missing file in a directory that exists): opening
/// a table or a dict there must end with an error, not spin.
fn dangling_symlink_at_the_path_is_an_error_not_a_spin() {
    let dir = TempDir::new("symlink");
    let link = dir.0.join("table");
    std::os::unix::fs::symlink(dir.0.join("missing"), &link).unwrap();
    let as_table = start(|chan| match LockTable::open(&link, 16) {
        Err(e) => {
            tell(chan, &e.to_string());
            Ok(())
        }
        Ok(_) => Err("made a table through a dangling symlink".into()),
    });
    let as_dict = start(|chan| match SharedDict::open(&link, 16, 64) {
        Err(e) => {
            tell(chan, &e.to_string());
            Ok(())
        }
        Ok(_) => Err("made a dict through a dangling symlink".into()),
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let results = [
        ("LockTable::open", as_table.finish_by(deadline)),
        ("SharedDict::open", as_dict.finish_by(deadline)),
    ];
    let mut failed = Vec::new();
    for (what, result) in &results {
        match result {
            Ok(said) => note!("[{what}: {said}] "),
            Err(e) => failed.push(format!("{what}: {e}")),
        }
    }
    assert!(
        failed.is_empty(),
        "on a dangling symlink (within 10 s): {}; the directory holds {:?}",
        failed.join("; "),
        dir.names()
    );
}

/// setuid, setgid and sticky bits are refused, for tables and dicts alike, and nothing is
/// created; so are modes that do not let the owner read and write (nobody but root could
/// open such a file to lock: they made one, as the command did not).
fn bad_modes_are_rejected() {
    let mut accepted = Vec::new();
    for mode in [0o4777, 0o2666, 0o1666, 0o000, 0o400, 0o200, 0o066] {
        let path = TempPath::new("mode");
        match LockTable::options().capacity(4).mode(mode).open(&path) {
            Err(e) => {
                note!("[LockTable {mode:#o}: {e}] ");
                assert!(!path.0.exists(), "a rejected mode left a file");
            }
            Ok(_) => accepted.push(format!(
                "LockTable {mode:#o} (file mode {:#o})",
                fs::metadata(&path).unwrap().permissions().mode() & 0o7777
            )),
        }
        let path = TempPath::new("mode-dict");
        match SharedDict::options().capacity(4).mode(mode).open(&path) {
            Err(e) => {
                note!("[SharedDict {mode:#o}: {e}] ");
                assert!(!path.0.exists(), "a rejected mode left a file");
            }
            Ok(_) => accepted.push(format!(
                "SharedDict {mode:#o} (file mode {:#o})",
                fs::metadata(&path).unwrap().permissions().mode() & 0o7777
            )),
        }
    }
    assert!(
        accepted.is_empty(),
        "bad modes were accepted: {}",
        accepted.join(", ")
    );
}

/// Free bytes of the filesystem holding `dir`.
fn free_bytes(dir: &Path) -> u64 {
    let c = cstr(dir.to_str().unwrap());
    // SAFETY: statvfs is plain old data; zeroes are a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid path and a valid out-pointer.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    st.f_bavail as u64 * st.f_frsize as u64
}

/// A process SIGKILLed while it creates a large table (reserving 2 GiB takes a while on
/// tmpfs) leaves nothing behind in the directory but, at most, a finished table.
fn creator_killed_mid_creation_leaves_no_temporary_file() {
    const UNDER_WAY: u64 = 64 << 20;
    let dir = TempDir::new("create-kill");
    let path = dir.0.join("big");
    let (mut mid, mut leftovers) = (0, Vec::new());
    // The first kill comes at once; the others once the space reservation is under way
    // (the free space of the filesystem drops), plus a little.
    for (attempt, extra_ms) in [None, Some(0), Some(1), Some(3), Some(10), Some(30)]
        .into_iter()
        .enumerate()
    {
        let free_before = free_bytes(&dir.0);
        let (mut here, there) = UnixStream::pair().unwrap();
        let mut creator = Proc::ours(fork(|| {
            let _ = (&there).write_all(b"S");
            LockTable::open(&path, shmlock::MAX_CAPACITY).map_or(1, |_| 0)
        }));
        here.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        here.read_exact(&mut [0u8; 1]).unwrap();
        if let Some(extra) = extra_ms {
            let deadline = Instant::now() + Duration::from_secs(3);
            while free_before.saturating_sub(free_bytes(&dir.0)) < UNDER_WAY
                && Instant::now() < deadline
                && proc_state(creator.pid).is_some_and(|s| s != b'Z')
            {
                std::thread::yield_now();
            }
            std::thread::sleep(Duration::from_millis(extra));
        }
        let reserving = free_before.saturating_sub(free_bytes(&dir.0)) >= UNDER_WAY;
        let status = creator.try_wait();
        creator.kill();
        let finished = path.exists();
        if reserving && !finished && status.is_none() {
            mid += 1;
        }
        let left: Vec<String> = dir.names().into_iter().filter(|n| n != "big").collect();
        if !left.is_empty() {
            leftovers.push(format!(
                "attempt {attempt} (killed {}): {left:?}",
                if reserving {
                    "while reserving space"
                } else {
                    "early"
                }
            ));
        }
        dir.empty();
    }
    note!("[{mid} of 6 kills during the space reservation] ");
    assert!(
        leftovers.is_empty(),
        "creators SIGKILLed while creating a table left files behind: {}",
        leftovers.join("; ")
    );
    assert!(
        mid >= 1,
        "no kill landed while the table was being created: the test proved nothing"
    );
}
