//! `shmlock run` against util-linux's own flock(1) cases (`tests/ts/flock`), named after
//! them where they have a meaning here (`fd`, `fcntl-*`, `unlock` and `range-lock` have
//! none: docs/cli.md says why), with flock's
//! spellings; and flock's inheritance: what the command leaves running keeps the lock
//! (with `-o` it does not), gets the signals and is stopped with the lease.

mod common;

use std::process::{Child, Stdio};
use std::time::Duration;

use common::command::{code, eventually, holding, is_held, output, shmlock};
use common::TempPath;

/// Upstream's general lock, a shared one: holds `lockfile` for as long as the test needs
/// it, then is killed with its command.
fn general_lock(file: &TempPath) -> Child {
    holding(file, "lockfile", "exec sleep 60", &["--shared"])
}

fn end(mut holder: Child) {
    holder.kill().unwrap();
    holder.wait().unwrap();
}

/// `shmlock run OPTS lockfile echo MESSAGE` (flock's form, without `--`): its exit code
/// and what it printed.
fn do_lock(file: &TempPath, opts: &[&str], mesg: &str) -> (i32, String) {
    let out = output(
        shmlock(file)
            .arg("run")
            .args(opts)
            .args(["lockfile", "echo", mesg]),
    );
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// upstream `non-block`: `--nonblock --conflict-exit-code 123` exits 123, command not run.
#[test]
fn non_block() {
    let file = TempPath::new("flock-non-block");
    let holder = general_lock(&file);
    let got = do_lock(
        &file,
        &["--nonblock", "--conflict-exit-code", "123"],
        "You will never see this!",
    );
    assert_eq!(got, (123, String::new()));
    end(holder);
}

/// upstream `shared`: `--shared --nonblock` runs beside the general (shared) lock; so do
/// `-s` and `-sn`; an exclusive one does not.
#[test]
fn shared() {
    let file = TempPath::new("flock-shared");
    let holder = general_lock(&file);
    let got = do_lock(
        &file,
        &["--shared", "--nonblock", "--conflict-exit-code", "123"],
        "Have shared lock",
    );
    assert_eq!(got, (0, "Have shared lock\n".into()));
    assert_eq!(do_lock(&file, &["-sn"], "too"), (0, "too\n".into()));
    assert_eq!(do_lock(&file, &["-xn"], "never"), (1, String::new()));
    // (`-s -x`: the last counts, as in flock: see the_last_of_an_option_given_again_counts)
    assert_eq!(
        code(shmlock(&file).args(["run", "-n", "-s", "-x", "lockfile", "true"])),
        1
    );
    end(holder);
}

/// `--permits N`: at most N commands hold the key at once; the N+1st waits or, with -n,
/// exits with the conflict code; a count other than the running ones' is refused.
#[test]
fn permits() {
    let file = TempPath::new("flock-permits");
    let a = holding(&file, "gpu", "exec sleep 60", &["--permits", "2"]);
    let b = holding(&file, "gpu", "exec sleep 60", &["--permits", "2"]);
    let table = shmlock::LockTable::options()
        .create(false)
        .open(&file)
        .unwrap();
    let sem = table.semaphore("gpu", 2).unwrap();
    eventually("both permits are held", || sem.held() == 2);
    let got = do_lock_on(&file, "gpu", &["--permits", "2", "-n", "-E", "9"], "third");
    assert_eq!(got, (9, String::new()));
    let out = output(shmlock(&file).args(["run", "--permits", "3", "-n", "gpu", "true"]));
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("a semaphore of 2 permits"),
        "{out:?}"
    );
    assert_eq!(
        code(shmlock(&file).args(["run", "--permits", "0", "gpu", "true"])),
        64
    );
    end(a);
    assert_eq!(
        do_lock_on(&file, "gpu", &["--permits", "2", "-n"], "in"),
        (0, "in\n".into())
    );
    end(b);
}

fn do_lock_on(file: &TempPath, key: &str, opts: &[&str], mesg: &str) -> (i32, String) {
    let out = output(
        shmlock(file)
            .arg("run")
            .args(opts)
            .args([key, "echo", mesg]),
    );
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// upstream `no-fork`: flock execs the command in its own place. shmlock cannot (exec
/// unmaps the table the hold lives by): it refuses with the reason and EX_USAGE, and
/// never runs the command unlocked.
#[test]
fn no_fork() {
    let file = TempPath::new("flock-no-fork");
    let holder = general_lock(&file);
    let out = output(shmlock(&file).args([
        "run",
        "--no-fork",
        "--nonblock",
        "--conflict-exit-code",
        "123",
        "lockfile",
        "echo",
        "You will never see this!",
    ]));
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(out.stdout.is_empty());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("exec unmaps"),
        "{out:?}"
    );
    assert_eq!(code(shmlock(&file).args(["run", "-F", "k", "true"])), 64);
    end(holder);
}

/// upstream `exclusive`: `--exclusive` (the default, said explicitly) with `--nonblock`
/// exits with the conflict code; flock's other spellings of the same (`-x`, `-e`, `-xn`,
/// `--nb`, `--nonblocking`) too.
#[test]
fn exclusive() {
    let file = TempPath::new("flock-exclusive");
    let holder = general_lock(&file);
    let got = do_lock(
        &file,
        &["--nonblock", "--exclusive", "--conflict-exit-code", "123"],
        "You will never see this!",
    );
    assert_eq!(got, (123, String::new()));
    for opts in [
        &["-xn"][..],
        &["-en"],
        &["-x", "--nb"],
        &["-e", "--nonblocking"],
        &["--wait", "0"],
        &["-w", "0.01"],
    ] {
        assert_eq!(
            do_lock(&file, opts, "never"),
            (1, String::new()),
            "{opts:?}"
        );
    }
    end(holder);
    // and with the key free, each of them runs its command
    assert_eq!(do_lock(&file, &["-xn"], "ran"), (0, "ran\n".into()));
}

/// An option given again, or `-s` and `-x` both, as flock(1) takes them: no error, the
/// last one counts (a wrapper's default before the user's own). The general lock is a
/// shared one: `-x -s` joins it, `-s -x` conflicts; a repeated `-E` or `-w` is its last
/// value. (They were usage errors, 64.)
#[test]
fn the_last_of_an_option_given_again_counts() {
    let file = TempPath::new("flock-last-wins");
    let holder = general_lock(&file);
    assert_eq!(
        do_lock(&file, &["-n", "-x", "-s"], "shared"),
        (0, "shared\n".into())
    );
    assert_eq!(
        do_lock(&file, &["-n", "-s", "-x"], "never"),
        (1, String::new())
    );
    assert_eq!(
        do_lock(&file, &["-n", "-s", "-s", "-e", "-x"], "never"),
        (1, String::new())
    );
    assert_eq!(
        do_lock(&file, &["-n", "-n", "-E", "3", "-E", "4", "-x"], "never"),
        (4, String::new())
    );
    let started = std::time::Instant::now();
    assert_eq!(
        do_lock(&file, &["-w", "30", "-w", "0.01"], "never"),
        (1, String::new())
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "waited {:?}",
        started.elapsed()
    );
    end(holder);
    assert_eq!(
        do_lock(&file, &["-o", "-o", "-x", "-x"], "ran"),
        (0, "ran\n".into())
    );
}

/// `-n` with `-w`, in either order: as flock(1) (whose `-n` makes its flock(2) call
/// non-blocking whatever timer `-w` set), `-n` wins: the conflict code at once, not after
/// the wait. `-w`'s value is still checked, as flock checks it: a bad one is a usage error.
#[test]
fn nonblock_wins_over_a_timeout() {
    let file = TempPath::new("flock-nonblock-timeout");
    let holder = general_lock(&file);
    for opts in [
        &["-n", "-w", "5"][..],
        &["-w", "5", "-n"],
        &["--timeout", "5", "--nonblock", "-E", "7"],
    ] {
        let started = std::time::Instant::now();
        let (rc, out) = do_lock(&file, opts, "never");
        assert_eq!(out, "", "{opts:?}");
        assert_eq!(rc, if opts.contains(&"-E") { 7 } else { 1 }, "{opts:?}");
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{opts:?} waited {:?}",
            started.elapsed()
        );
    }
    for bad in ["--timeout=-1", "--timeout=nan", "--timeout=inf"] {
        let out = output(shmlock(&file).args(["run", "-n", bad, "lockfile", "true"]));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{bad}: {err}");
        assert!(err.contains("--timeout"), "{bad}: {err}");
    }
    end(holder);
}

/// upstream `timeout` and `time-check`: `--timeout 5 --conflict-exit-code 5` waits for the
/// general lock's end and runs; what the holder wrote on its way out comes before.
#[test]
fn timeout_and_time_check() {
    let file = TempPath::new("flock-timeout");
    let log = TempPath::new("flock-timeout-log");
    let log_path = log.0.display();
    let mut holder = holding(
        &file,
        "lockfile",
        &format!("echo Locking >> '{log_path}'; sleep 1; echo Unlocking >> '{log_path}'"),
        &[],
    );
    let waiter = format!("echo 'After timeout.' >> '{log_path}'");
    let rc = code(shmlock(&file).args([
        "run",
        "--timeout",
        "5",
        "--conflict-exit-code",
        "5",
        "lockfile",
        "sh",
        "-c",
        &waiter,
    ]));
    assert_eq!(rc, 0);
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "Locking\nUnlocking\nAfter timeout.\n"
    );
    assert!(holder.wait().unwrap().success());
}

/// The command's arguments are its own from COMMAND on, options included (flock's `+`
/// getopt): `run k echo -n -w 1 -- x` runs `echo -n -w 1 -- x`.
#[test]
fn options_after_the_command_are_the_commands() {
    let file = TempPath::new("flock-argv");
    let out = output(shmlock(&file).args(["run", "k", "echo", "-n", "-w", "1", "--", "x"]));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "-w 1 -- x");
    assert_eq!(
        code(shmlock(&file).args(["run", "-n", "k", "sh", "-c", "exit 4"])),
        4
    );
}

/// `$SHMLOCK_KEY` and `$SHMLOCK_TOKEN`: the key, and the token the table shows for this
/// hold, greater at every run.
#[test]
fn the_command_finds_its_key_and_fencing_token() {
    let file = TempPath::new("flock-token");
    let bin = env!("CARGO_BIN_EXE_shmlock");
    let script = format!(
        "echo \"$SHMLOCK_KEY\"; echo \"$SHMLOCK_TOKEN\"; \
         '{bin}' --file '{}' inspect --json",
        file.0.display()
    );
    let mut last = 0u64;
    for _ in 0..3 {
        let out = output(shmlock(&file).args(["run", "job:7", "sh", "-c", &script]));
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some("job:7"));
        let token: u64 = lines.next().unwrap().parse().unwrap();
        let table: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
        assert_eq!(table["holders"][0]["token"], token, "{table}");
        assert!(token > last, "{token} after {last}");
        last = token;
    }
}

/// Starts `run [EXTRA] k -- sh -c 'LEFTOVER & echo $! > PIDFILE; exit CODE'` and returns it
/// with the pid of the process its command left running (once the command has exited).
fn leaving(file: &TempPath, leftover: &str, exit: i32, extra: &[&str]) -> (Child, i32) {
    let pidfile = TempPath::new("flock-leftover-pid");
    let script = format!(
        "{leftover} </dev/null >/dev/null 2>&1 & echo $! > '{}'; exit {exit}",
        pidfile.0.display()
    );
    let runner = shmlock(file)
        .arg("run")
        .args(extra)
        .args(["k", "--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let mut pid = 0;
    eventually("the command left a process running", || {
        pid = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        pid > 0
    });
    (runner, pid)
}

fn parent_of(pid: i32) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|p| p.trim().parse().ok())
}

fn alive(pid: i32) -> bool {
    common::signal::send(pid, 0) == 0
}

/// flock's inheritance: a process the command left running keeps the lock. `run` adopts
/// it, holds the key while it lives (other runs get the conflict code), then releases and
/// exits with the command's status.
#[test]
fn a_process_the_command_left_running_keeps_the_lock() {
    let file = TempPath::new("flock-inherit");
    let (mut runner, leftover) = leaving(&file, "sleep 60", 3, &[]);
    eventually("the runner adopted it", || {
        parent_of(leftover) == Some(runner.id() as i32)
    });
    for _ in 0..3 {
        assert_eq!(code(shmlock(&file).args(["run", "-n", "k", "true"])), 1);
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(runner.try_wait().unwrap().is_none(), "run exited early");
    assert!(is_held(&file, "k"));
    common::signal::send(leftover, libc::SIGKILL);
    assert_eq!(runner.wait().unwrap().code(), Some(3));
    assert!(!is_held(&file, "k"));
    assert_eq!(code(shmlock(&file).args(["run", "-n", "k", "true"])), 0);
}

/// upstream `close` (flock `-o`): the lock is released when the command exits; what it
/// left running does not keep it.
#[test]
fn close() {
    let file = TempPath::new("flock-close");
    let (mut runner, leftover) = leaving(&file, "sleep 60", 0, &["-o"]);
    assert_eq!(runner.wait().unwrap().code(), Some(0));
    assert!(alive(leftover), "the leftover still runs");
    assert_eq!(code(shmlock(&file).args(["run", "-n", "k", "true"])), 0);
    common::signal::send(leftover, libc::SIGKILL);
}

/// A signal sent to `run` after its command exited goes to what the command left
/// running, whose cleanup runs under the lock; then `run` exits with the command's status.
#[test]
fn signals_reach_what_the_command_left_running() {
    let file = TempPath::new("flock-leftover-signal");
    let done = TempPath::new("flock-leftover-done");
    let ready = TempPath::new("flock-leftover-ready");
    let leftover = format!(
        "sh -c 'trap \"echo cleaned > {}; exit 0\" TERM; : > {}; \
         while :; do sleep 0.05; done'",
        done.0.display(),
        ready.0.display()
    );
    let (mut runner, pid) = leaving(&file, &leftover, 5, &[]);
    eventually("the runner adopted it", || {
        parent_of(pid) == Some(runner.id() as i32)
    });
    eventually("its trap is set", || ready.0.exists());
    common::signal::send(runner.id() as i32, libc::SIGTERM);
    assert_eq!(runner.wait().unwrap().code(), Some(5));
    assert_eq!(std::fs::read_to_string(&done).unwrap(), "cleaned\n");
    assert!(!is_held(&file, "k"));
}

/// A lease lost while only what the command left runs (the hold broken by force): `run`
/// stops it (SIGTERM) and exits 2.
#[test]
fn a_lost_lease_stops_what_the_command_left_running() {
    let file = TempPath::new("flock-leftover-lost");
    let (mut runner, pid) = leaving(&file, "sleep 60", 0, &["--exptime", "0.6"]);
    eventually("the runner adopted it", || {
        parent_of(pid) == Some(runner.id() as i32)
    });
    assert_eq!(code(shmlock(&file).args(["unlock", "--force", "k"])), 0);
    assert_eq!(runner.wait().unwrap().code(), Some(2));
    assert!(!alive(pid), "the leftover was stopped");
}

/// `run` started with SIGCHLD ignored (an inheritance some supervisors pass on, which has
/// the kernel reap children by itself): it still waits for its command and what it left,
/// keeps the key meanwhile, and exits with the command's status.
#[test]
fn an_inherited_ignored_sigchld_changes_nothing() {
    use std::os::unix::process::CommandExt;
    let file = TempPath::new("flock-sigchld");
    let pidfile = TempPath::new("flock-sigchld-pid");
    let script = format!(
        "sleep 60 </dev/null >/dev/null 2>&1 & echo $! > '{}'; exit 3",
        pidfile.0.display()
    );
    let mut cmd = shmlock(&file);
    cmd.args(["run", "k", "--", "sh", "-c", &script])
        .stdin(Stdio::null());
    // SAFETY: signal(2) with SIG_IGN in the forked child before exec: async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGCHLD, libc::SIG_IGN);
            Ok(())
        });
    }
    let mut runner = cmd.spawn().unwrap();
    let mut leftover = 0;
    eventually("the command left a process running", || {
        leftover = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        leftover > 0
    });
    eventually("the runner adopted it", || {
        parent_of(leftover) == Some(runner.id() as i32)
    });
    assert!(runner.try_wait().unwrap().is_none(), "run exited early");
    assert_eq!(code(shmlock(&file).args(["run", "-n", "k", "true"])), 1);
    common::signal::send(leftover, libc::SIGKILL);
    assert_eq!(runner.wait().unwrap().code(), Some(3));
}

/// The state letter of a process (`Z`: a zombie), if it exists.
fn state_of(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

/// What the command leaves and then ends is reaped at once, while the command still runs:
/// no zombies pile up under a long command that keeps starting helpers.
#[test]
fn leftovers_that_end_while_the_command_runs_are_reaped() {
    let file = TempPath::new("flock-zombies");
    let script = "for i in 1 2 3 4 5 6 7 8 9 10; do (true &); done; exec sleep 60";
    let mut runner = holding(&file, "k", script, &[]);
    let me = runner.id();
    let zombies = || {
        std::fs::read_to_string(format!("/proc/{me}/task/{me}/children"))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .filter(|&p| state_of(p) == Some('Z'))
            .count()
    };
    // the ten subshells' children were adopted and ended: none is left a zombie
    std::thread::sleep(Duration::from_millis(300));
    eventually("no zombie under run", || zombies() == 0);
    runner.kill().unwrap();
    runner.wait().unwrap();
}

/// --max-time: the command gets SIGTERM once; a process adopted after the command was
/// killed (its parent ignored SIGTERM and was SIGKILLed 5 s later) is stopped too, and the
/// key stays held until all of them are gone, however short the lease.
#[test]
fn max_time_stops_everything_once_and_keeps_the_key_until_then() {
    let file = TempPath::new("flock-maxtime");
    let terms = TempPath::new("flock-maxtime-terms");
    let grandchild = TempPath::new("flock-maxtime-grandchild");
    let script = format!(
        "trap 'echo TERM >> {t}' TERM; \
         sh -c 'trap \"\" TERM; sleep 60 & echo $! > {g}; wait' </dev/null >/dev/null 2>&1 & \
         while :; do sleep 0.05; done",
        t = terms.0.display(),
        g = grandchild.0.display()
    );
    let mut runner = shmlock(&file)
        .args(["run", "--exptime", "0.6", "--max-time", "0.5", "k", "--"])
        .args(["sh", "-c", &script])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let mut sleeper = 0;
    eventually("the grandchild runs", || {
        sleeper = std::fs::read_to_string(&grandchild)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        sleeper > 0
    });
    // while run terminates them (5 s until SIGKILL), the key stays held
    let running = || alive(sleeper) && state_of(sleeper) != Some('Z');
    let mut looked = 0;
    while runner.try_wait().unwrap().is_none() {
        if running() {
            let got = code(shmlock(&file).args(["run", "-n", "k", "true"]));
            // (only a process still running once the try is over ran when it got the key:
            // on a loaded machine the try may start after run stopped everything)
            assert!(
                got == 1 || !running(),
                "the key was free while a process of the command ran (exit {got})"
            );
            looked += 1;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(runner.wait().unwrap().code(), Some(2));
    assert!(looked > 5, "looked {looked} times");
    assert!(!alive(sleeper), "the adopted grandchild was stopped");
    assert_eq!(std::fs::read_to_string(&terms).unwrap(), "TERM\n");
}
