//! Looking into a table from outside the library, for the tests that stop processes at
//! exact points: the header's fields, where a key lands, a slot's words, the table's
//! mapping in this process; stopping processes (SIGSTOP, or gdb at an instruction or a
//! system call) and watching them (hang monitors, stacks); and guards that kill what a
//! test started.
#![allow(dead_code)]

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::fork::{Child, Shared};

/// A little-endian u64 of the file's header at byte `at`.
pub fn header_u64(path: &Path, at: u64) -> u64 {
    use std::os::unix::fs::FileExt;
    let f = fs::File::open(path).unwrap();
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, at).unwrap();
    u64::from_le_bytes(b)
}
/// The registry's size in bytes (whole pages), as the header says.
pub fn registry_len(path: &Path) -> u64 {
    use std::os::unix::fs::FileExt;
    let f = fs::File::open(path).unwrap();
    let mut b = [0u8; 4];
    f.read_exact_at(&mut b, 72).unwrap();
    (u64::from(u32::from_le_bytes(b)) * 32).div_ceil(4096) * 4096
}
/// The pids of the registry entries of the table at `path` that are taken or whose
/// liveness lock is held (a registration not yet left).
pub fn registered_pids(path: &Path) -> Vec<u32> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;
    let f = fs::File::open(path).unwrap();
    let mut b = [0u8; 4];
    f.read_exact_at(&mut b, 72).unwrap();
    let n = u64::from(u32::from_le_bytes(b));
    let mut out = Vec::new();
    for i in 0..n {
        let mut e = [0u8; 16];
        f.read_exact_at(&mut e, 4096 + i * 32).unwrap();
        let taken = e[0] & 1 != 0;
        let pid = u32::from_le_bytes(e[8..12].try_into().unwrap());
        // SAFETY: a zeroed flock is valid; F_OFD_GETLK only reads and fills it.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = libc::F_WRLCK as libc::c_short;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        fl.l_start = (4096 + i * 32) as libc::off_t;
        fl.l_len = 1;
        // SAFETY: a valid descriptor and flock.
        let rc = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) };
        let held = rc == 0 && fl.l_type != libc::F_UNLCK as libc::c_short;
        if taken || held {
            out.push(pid);
        }
    }
    out
}

/// (home, tag) of a key in the table at `path`.
pub fn place(seed: u64, n: u64, key: &str) -> (u64, u8) {
    let h = xxhash_rust::xxh3::xxh3_128_with_seed(key.as_bytes(), seed);
    let lo = h as u64;
    let hi = (h >> 64) as u64;
    (
        ((u128::from(lo) * u128::from(n)) >> 64) as u64,
        (hi >> 59) as u8,
    )
}

/// The table's slots, mapped by the test itself.
pub struct Watch {
    map: memmap2::MmapRaw,
    slots_at: usize,
}
impl Watch {
    pub fn new(path: &Path) -> Watch {
        let f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        Watch {
            map: memmap2::MmapRaw::map_raw(&f).unwrap(),
            slots_at: (4096 + registry_len(path)) as usize,
        }
    }
    pub fn at(&self, slot: usize, off: usize) -> &AtomicU64 {
        let at = self.slots_at + slot * 64 + off;
        assert!(at + 8 <= self.map.len());
        // SAFETY: in bounds (asserted), 8-aligned (page-aligned map, 64-byte slots, 8-aligned
        // offsets), and the table only ever accesses this word atomically.
        unsafe { AtomicU64::from_ptr(self.map.as_mut_ptr().add(at).cast::<u64>()) }
    }
    pub fn control(&self, slot: usize) -> u64 {
        self.at(slot, 0).load(Ordering::SeqCst)
    }
}

/// Where this process mapped the table (its slots start a page in).
pub fn mapping_base(path: &Path) -> usize {
    let ino = fs::metadata(path).unwrap().ino().to_string();
    let maps = fs::read_to_string("/proc/self/maps").unwrap();
    for line in maps.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() >= 5 && f[4] == ino && f[2] == "00001000" {
            return usize::from_str_radix(f[0].split('-').next().unwrap(), 16).unwrap();
        }
    }
    panic!("{} is not mapped", path.display());
}

/// The descriptors of this process that name `path`.
pub fn fds_naming(path: &Path) -> Vec<i32> {
    let mut out = Vec::new();
    for e in fs::read_dir("/proc/self/fd").unwrap().flatten() {
        if let (Ok(n), Ok(target)) = (
            e.file_name().to_string_lossy().parse::<i32>(),
            fs::read_link(e.path()),
        ) {
            if target == path {
                out.push(n);
            }
        }
    }
    out.sort();
    out
}

/// Whether `p` appeared within `limit`.
pub fn wait_file(p: &Path, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if p.exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    false
}

/// The first non-zero value of shared word `w`; fails after `limit`.
pub fn await_word(s: &Shared, w: usize, limit: Duration) -> u64 {
    let deadline = Instant::now() + limit;
    loop {
        let v = s.word(w).load(Ordering::SeqCst);
        if v != 0 {
            return v;
        }
        assert!(Instant::now() < deadline, "word {w} never set");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// This process's CLOCK_MONOTONIC in ns.
pub fn mono_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// This process's CLOCK_MONOTONIC_COARSE in ns.
pub fn coarse_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC_COARSE)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    // SAFETY: timespec is plain integers, so all-zero bytes are a valid value.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: ts is a valid out-pointer and both clocks callers pass are supported.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The fields of a `/proc/.../stat` line after the command name (which may hold spaces
/// and parentheses): the state is field 0, the parent 1, the process group 2.
pub fn stat_fields(stat: &str) -> Vec<&str> {
    stat.rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect()
}

/// A forked child, killed (and reaped) on drop.
pub struct Proc(pub Option<Child>);
impl Proc {
    pub fn new(c: Child) -> Proc {
        Proc(Some(c))
    }
    pub fn pid(&self) -> libc::pid_t {
        self.0.as_ref().unwrap().0
    }
    /// Waits for the child's exit code; kills it and panics after `limit` (see
    /// [`Child::wait`]).
    pub fn wait(&mut self, limit: Duration) -> i32 {
        let c = self.0.take().unwrap();
        c.wait(limit)
    }
    /// The child's exit code (128 + the signal if it was killed), if it has ended.
    pub fn try_wait(&mut self) -> Option<i32> {
        let pid = self.pid();
        let mut status = 0;
        // SAFETY: our own child; status is a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            self.0 = None;
            return Some(if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                128 + libc::WTERMSIG(status)
            });
        }
        None
    }
    /// SIGKILLs and reaps the child (if it was not waited for already).
    pub fn kill(&mut self) {
        if let Some(c) = self.0.take() {
            c.kill();
        }
    }
}
impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}
/// A spawned program, killed with its process group on drop.
pub struct Spawned(pub std::process::Child);
impl Drop for Spawned {
    fn drop(&mut self) {
        super::signal::send_group(self.0.id() as libc::pid_t, libc::SIGKILL);
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Fails the test at once if gdb is not installed (`scripts/test-tools.sh` installs it).
pub fn require_gdb() {
    if std::process::Command::new("gdb")
        .arg("--version")
        .output()
        .is_err()
    {
        panic!("needs gdb");
    }
}

/// The mangled names of this binary's functions whose names contain every one of `parts`
/// (gdb finds the library's functions by them: they have no debug names in a test build),
/// read with `nm`.
pub fn symbols(parts: &[&str]) -> Vec<String> {
    let out = std::process::Command::new("nm")
        .arg(std::env::current_exe().unwrap())
        .output()
        .expect("nm (binutils) runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .filter(|w| parts.iter().all(|p| w.contains(p)))
        .map(str::to_string)
        .collect()
}

/// The first of [`symbols`] with `part`.
pub fn symbol(part: &str) -> String {
    symbols(&[part])
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("no symbol with {part}"))
}

/// One stop of a process held by gdb (see [`GdbStop::attach_stages`]): the gdb commands
/// that make its breakpoints (and delete earlier ones), and how many hits to run through
/// (`continue`s) before the process is held.
pub struct Stage {
    pub commands: Vec<String>,
    pub hits: usize,
}

impl Stage {
    /// The process is held where the breakpoints `commands` make first hit.
    pub fn new(commands: &[String]) -> Stage {
        Stage {
            commands: commands.to_vec(),
            hits: 1,
        }
    }

    /// Held at the `n`th hit instead of the first.
    pub fn at_hit(mut self, n: usize) -> Stage {
        self.hits = n;
        self
    }
}

/// A process held by gdb at chosen points, until [`release`](GdbStop::release)d: where
/// breakpoint 1 (made by the given gdb commands) first hits, or at each of several
/// [`Stage`]s in turn.
pub struct GdbStop {
    flags: super::TempPath,
    gdb: Spawned,
    stages: usize,
}

impl GdbStop {
    /// Attaches gdb to `pid` with the commands that make breakpoint 1, and waits until it
    /// is attached (the process then runs on to the breakpoint).
    pub fn attach(pid: libc::pid_t, breakpoint: &[String]) -> GdbStop {
        GdbStop::attach_stages(pid, &[Stage::new(breakpoint)])
    }

    /// Attaches gdb to `pid` and waits until it is attached. gdb then holds the process at
    /// each stage in turn: it runs the stage's commands, lets the process run through the
    /// stage's hits, and holds it there until [`resume`](GdbStop::resume)d (or for at most
    /// 10 minutes); after the last stage it deletes every breakpoint and detaches.
    pub fn attach_stages(pid: libc::pid_t, stages: &[Stage]) -> GdbStop {
        use std::os::unix::process::CommandExt;
        let flags = super::TempPath::new("gdb");
        fs::create_dir_all(&flags.0).unwrap();
        let flag = |name: &str| format!("shell touch {}", flags.0.join(name).display());
        let mut cmd = std::process::Command::new("gdb");
        // A gdb that crashes leaves no core file in the working tree.
        // SAFETY: setrlimit is async-signal-safe, and only changes the child's own limit.
        unsafe {
            cmd.pre_exec(|| {
                let none = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                libc::setrlimit(libc::RLIMIT_CORE, &none);
                Ok(())
            });
        }
        cmd.process_group(0)
            .args(["-q", "-nx", "-batch", "-p", &pid.to_string()])
            .args(["-ex", "set pagination off"]);
        for (i, stage) in stages.iter().enumerate() {
            for c in &stage.commands {
                cmd.args(["-ex", c]);
            }
            if i == 0 {
                cmd.args(["-ex", &flag("attached")]);
            }
            for _ in 0..stage.hits {
                cmd.args(["-ex", "continue"]);
            }
            cmd.args(["-ex", &flag(&format!("stopped-{i}"))]).args([
                "-ex",
                &format!(
                    "shell i=0; while [ ! -e {} ] && [ $i -lt 60000 ]; do sleep 0.01; i=$((i+1)); done",
                    flags.0.join(format!("go-{i}")).display()
                ),
            ]);
        }
        cmd.args(["-ex", "delete", "-ex", "detach"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let gdb = Spawned(cmd.spawn().unwrap());
        assert!(
            wait_file(&flags.0.join("attached"), Duration::from_secs(60)),
            "gdb did not attach"
        );
        GdbStop {
            flags,
            gdb,
            stages: stages.len(),
        }
    }

    /// [`attach`](GdbStop::attach) with breakpoint 1 at the process's futex system call on
    /// the word at `addr` (a waiter about to sleep on a slot).
    pub fn at_futex(pid: libc::pid_t, addr: u64) -> GdbStop {
        GdbStop::attach(
            pid,
            &[
                "catch syscall futex".to_string(),
                format!("condition 1 $rdi == {addr:#x}"),
            ],
        )
    }

    /// Whether the process reached the (first) stop within `limit`.
    pub fn stopped(&self, limit: Duration) -> bool {
        self.reached(0, limit)
    }

    /// Whether the process reached stage `stage`'s stop within `limit`.
    pub fn reached(&self, stage: usize, limit: Duration) -> bool {
        wait_file(&self.flags.0.join(format!("stopped-{stage}")), limit)
    }

    /// Lets the process go on from stage `stage`'s stop (to the next stage, if any).
    pub fn resume(&self, stage: usize) {
        fs::write(self.flags.0.join(format!("go-{stage}")), b"").unwrap();
    }

    /// Lets the process go on from every stop left, and waits for gdb to detach.
    pub fn release(mut self) {
        for stage in 0..self.stages {
            self.resume(stage);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.gdb.0.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "gdb did not detach");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for GdbStop {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.flags.0);
    }
}

/// The state letter of `/proc/<pid>/stat` (`R`, `S`, `T`, `Z`, ...); `None` if gone.
pub fn proc_state(pid: libc::pid_t) -> Option<u8> {
    let stat = fs::read(format!("/proc/{pid}/stat")).ok()?;
    let close = stat.iter().rposition(|&b| b == b')')?;
    stat.get(close + 2).copied()
}

/// SIGSTOPs `pid` (a child of the test) and waits until the kernel shows it stopped.
pub fn stop(pid: libc::pid_t) {
    super::signal::send(pid, libc::SIGSTOP);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !matches!(proc_state(pid), Some(b'T' | b't')) {
        assert!(Instant::now() < deadline, "{pid} did not stop");
        std::thread::yield_now();
    }
}

/// SIGCONTs `pid` (a child of the test).
pub fn cont(pid: libc::pid_t) {
    super::signal::send(pid, libc::SIGCONT);
}

/// Closes every descriptor from 3 up, as a daemonizing program does (`close_range`).
pub fn close_from_3() {
    // SAFETY: closes descriptors 3 and up; the caller owns nothing there it still needs
    // (Shared is a mapping, its file is closed).
    let rc = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
    assert_eq!(rc, 0);
}

/// The lines of `/proc/locks` about the file with inode `ino`.
pub fn ofd_locks_on(ino: u64) -> Vec<String> {
    fs::read_to_string("/proc/locks")
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .nth(5)
                .and_then(|f| f.rsplit(':').next())
                .is_some_and(|i| i == ino.to_string())
        })
        .map(str::to_string)
        .collect()
}

/// What each thread of `pid` is doing: its state, its CPU time (utime + stime ticks), its
/// current system call (number and, for the few the tests meet, name) and blocked signals.
pub fn describe_threads(pid: i32) -> String {
    let mut out = Vec::new();
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return format!("no /proc/{pid}/task");
    };
    for t in tasks.flatten() {
        let stat = fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        let f = stat_fields(&stat);
        let ticks = |i: usize| f.get(i).and_then(|u| u.parse::<u64>().ok()).unwrap_or(0);
        let sys = fs::read_to_string(t.path().join("syscall")).unwrap_or_default();
        let nr = sys.split_whitespace().next().unwrap_or("?");
        let name = match nr {
            "24" => "sched_yield",
            "202" => "futex",
            "61" => "wait4",
            "running" => "running",
            _ => "other",
        };
        let blk = fs::read_to_string(t.path().join("status"))
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("SigBlk"))
            .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
            .unwrap_or_default();
        out.push(format!(
            "tid {} {} cpu {} ticks, syscall {nr} ({name}), SigBlk {blk}",
            t.file_name().to_string_lossy(),
            f.first().unwrap_or(&"?"),
            ticks(11) + ticks(12),
        ));
    }
    out.join("; ")
}

/// The stack of every thread of `pid` (12 frames each), by gdb in a process group of its
/// own, given 15 s.
pub fn backtrace(pid: i32) -> String {
    use std::os::unix::process::CommandExt;
    let bt = std::process::Command::new("timeout")
        .args([
            "-k",
            "2",
            "15",
            "gdb",
            "-p",
            &pid.to_string(),
            "-batch",
            "-nx",
        ])
        .args(["-ex", "thread apply all bt 12"])
        .process_group(0)
        .output();
    match bt {
        Ok(o) => String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| l.starts_with('#') || l.starts_with("Thread"))
            .collect::<Vec<_>>()
            .join("\n    "),
        Err(e) => format!("no backtrace: {e}"),
    }
}

/// A hung process, for the message of the test that found it: its threads and stacks.
pub fn describe_hang(pid: i32) -> String {
    format!("{}\n    {}", describe_threads(pid), backtrace(pid))
}

/// Waits for child `c`, which counts its progress in word `w`: its exit code; `Err` with a
/// description (and the child killed) if the word stood still for `stall`; `Ok(-1)` (and
/// the child killed) if it ran on past `limit`.
pub fn monitor(
    c: &Child,
    shared: &Shared,
    w: usize,
    stall: Duration,
    limit: Duration,
) -> Result<i32, String> {
    let start = Instant::now();
    let mut last = (shared.word(w).load(Ordering::SeqCst), Instant::now());
    loop {
        let mut st = 0;
        // SAFETY: c is our own child; st is a valid out-pointer.
        let r = unsafe { libc::waitpid(c.0, &mut st, libc::WNOHANG) };
        if r == c.0 {
            return Ok(if libc::WIFEXITED(st) {
                libc::WEXITSTATUS(st)
            } else {
                128 + libc::WTERMSIG(st)
            });
        }
        let v = shared.word(w).load(Ordering::SeqCst);
        if v != last.0 {
            last = (v, Instant::now());
        } else if last.1.elapsed() > stall {
            let d = describe_hang(c.0);
            c.kill();
            return Err(format!("no progress for {stall:?} after {v} rounds: {d}"));
        }
        if start.elapsed() > limit {
            c.kill();
            return Ok(-1);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A process that waits (up to 20 s) for `key` in the table at `path`, and so flags its
/// holder's entry; returned once the flag shows in `slot`'s word.
pub fn flagging_waiter(path: &Path, key: &str, watch: &Watch, slot: usize) -> Proc {
    let x = Proc(Some(super::fork::fork(|| {
        let t = shmlock::LockTable::open(path, 64).unwrap();
        let o = shmlock::LockOptions {
            exptime: Duration::from_secs(60),
            timeout: Duration::from_secs(20),
            ..shmlock::LockOptions::default()
        };
        let _ = t.lock(key, o);
        0
    })));
    let deadline = Instant::now() + Duration::from_secs(10);
    while watch.control(slot) & 8 == 0 {
        assert!(
            Instant::now() < deadline,
            "the waiter never flagged {key:?}'s hold"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    x
}
