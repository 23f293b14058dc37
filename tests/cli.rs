//! The `shmlock` command, run as a separate program.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::command::{code, eventually, holding, is_held, line_written, output, shmlock};
use common::TempPath;
use shmlock::{LockOptions, LockTable, SharedDict};

#[test]
fn run_passes_the_exit_status_through() {
    let file = TempPath::new("cli-status");
    assert_eq!(
        code(shmlock(&file).args(["run", "k", "--", "sh", "-c", "exit 3"])),
        3
    );
    assert_eq!(code(shmlock(&file).args(["run", "k", "--", "true"])), 0);
    // a command killed by a signal: run dies of it too (a_command_killed_by_a_signal_...)
    let out = output(shmlock(&file).args(["run", "k", "--", "sh", "-c", "kill -TERM $$"]));
    assert_eq!(out.status.signal(), Some(libc::SIGTERM), "{out:?}");
    // the key is free after each run
    assert!(!LockTable::open(&file, 1).unwrap().is_locked("k").unwrap());
}

#[test]
fn a_second_run_waits_then_runs_or_gives_up() {
    let file = TempPath::new("cli-wait");
    let out = TempPath::new("cli-wait-out");
    let script = format!("sleep 0.5; echo first >> {}", out.0.display());
    let mut first = holding(&file, "k", &script, &[]);
    // -n: at once, exit 1; -E: the code asked for; -w: after the timeout
    assert_eq!(
        code(shmlock(&file).args(["run", "-n", "k", "--", "true"])),
        1
    );
    assert_eq!(
        code(shmlock(&file).args(["run", "-n", "-E", "7", "k", "--", "true"])),
        7
    );
    assert_eq!(
        code(shmlock(&file).args(["run", "-w", "0.05", "k", "--", "true"])),
        1
    );
    // no flag: waits for the first, then runs
    let second = format!("echo second >> {}", out.0.display());
    assert_eq!(
        code(shmlock(&file).args(["run", "k", "--", "sh", "-c", &second])),
        0
    );
    assert!(first.wait().unwrap().success());
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "first\nsecond\n");
}

/// `shmlock --file FILE inspect --json ARGS`, parsed: one JSON object on one line.
fn inspect_json(file: &TempPath, args: &[&str]) -> serde_json::Value {
    let out = output(shmlock(file).args(["inspect", "--json"]).args(args));
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.lines().count(), 1, "{text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[test]
fn inspect_shows_the_holder_alive_then_dead_and_unlock_force_frees_it() {
    let file = TempPath::new("cli-inspect");
    let mut holder = holding(&file, "job:1", "sleep 30", &[]);
    let json = inspect_json(&file, &[]);
    assert_eq!(json["kind"], "lock table");
    assert_eq!(json["capacity"], 1024);
    assert_eq!(json["slots"], 4096);
    assert_eq!(json["format_version"], 15);
    assert_eq!(json["occupancy"], 1);
    let h = &json["holders"][0];
    assert_eq!(h["key"], "job:1");
    assert_eq!(h["key_hex"], "6a6f623a31");
    assert_eq!(h["key_len"], 5);
    assert_eq!(h["truncated"], false);
    assert_eq!(h["pid"], holder.id());
    assert_eq!(h["alive"], true);
    assert_eq!(h["state"], "held");
    assert!(h["age_ms"].is_u64() && h["ttl_ms"].is_u64(), "{json}");
    assert_eq!(h["expired"], false);
    assert!(h["token"].is_null() || h["token"].is_u64(), "{json}");
    assert_eq!(h["waiters"], false);
    let text = String::from_utf8(output(shmlock(&file).arg("inspect")).stdout).unwrap();
    assert!(
        text.contains("job:1") && text.contains(&holder.id().to_string()),
        "{text}"
    );

    holder.kill().unwrap();
    holder.wait().unwrap();
    // a dead owner's entry is hidden by default and shown, as dead, with --all
    let json = inspect_json(&file, &[]);
    assert_eq!(json["holders"], serde_json::json!([]));
    let json = inspect_json(&file, &["--all"]);
    assert_eq!(json["holders"][0]["pid"], holder.id());
    assert_eq!(json["holders"][0]["alive"], false);
    // (the text says that --all would show it, not just "no locks held")
    let text = String::from_utf8(output(shmlock(&file).arg("inspect")).stdout).unwrap();
    assert!(
        text.ends_with(
            "no locks held (1 expired or dead holder's entry, not yet reaped: --all lists it)\n"
        ),
        "{text}"
    );

    let refused = output(shmlock(&file).args(["unlock", "job:1"]));
    assert_eq!(refused.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--force"));
    let broke = output(shmlock(&file).args(["unlock", "--force", "job:1"]));
    assert!(broke.status.success());
    let said = String::from_utf8_lossy(&broke.stdout);
    assert!(
        said.contains(&format!("pid {} (dead)", holder.id())),
        "{said}"
    );
    assert!(!LockTable::open(&file, 1)
        .unwrap()
        .is_locked("job:1")
        .unwrap());
    assert_eq!(code(shmlock(&file).args(["unlock", "--force", "job:1"])), 1);
}

/// The WAITED column (JSON `waiters`) says that a waiter flagged the hold since it was
/// taken, not that one waits now: one bit on the hold, set by each waiter before it sleeps
/// and cleared only when the hold ends, so it stays after the waiter gave up. A new hold
/// of the key starts without it.
#[test]
fn the_waited_column_says_a_waiter_came_since_the_hold_began() {
    let file = TempPath::new("cli-waited");
    let holder = held_until_stdin_closes(&file, "k");
    // a waiter that sleeps on the hold, then gives up and exits
    assert_eq!(
        code(shmlock(&file).args(["run", "-w", "0.3", "k", "--", "true"])),
        1
    );
    let json = inspect_json(&file, &[]);
    assert_eq!(json["holders"][0]["waiters"], true, "{json}");
    let text = String::from_utf8(output(shmlock(&file).arg("inspect")).stdout).unwrap();
    let header: Vec<&str> = text.lines().nth(1).unwrap().split_whitespace().collect();
    let row: Vec<&str> = text.lines().nth(2).unwrap().split_whitespace().collect();
    let column = header.iter().position(|c| *c == "WAITED");
    assert!(column.is_some() && !header.contains(&"WAITERS"), "{text}");
    assert_eq!(row[column.unwrap()], "yes", "{text}");
    // the next hold of the key starts unflagged
    release(holder);
    let again = held_until_stdin_closes(&file, "k");
    assert_eq!(inspect_json(&file, &[])["holders"][0]["waiters"], false);
    release(again);
}

/// `create --max-processes` sizes the owner registry, and the error of a full one says how
/// to make a bigger one.
#[test]
fn create_sizes_the_owner_registry() {
    let file = TempPath::new("cli-registry");
    let made = output(shmlock(&file).args(["create", "--max-processes", "1"]));
    assert!(made.status.success(), "{made:?}");
    // (watched through inspect, which opens the file read-only and takes no entry)
    let mut run = shmlock(&file)
        .args(["run", "a", "--", "sleep", "30"])
        .stdin(std::process::Stdio::null())
        .spawn()
        .unwrap();
    eventually("run holds a", || {
        inspect_json(&file, &[])["holders"]
            .as_array()
            .is_some_and(|h| !h.is_empty())
    });
    let second = output(shmlock(&file).args(["run", "-n", "b", "true"]));
    let err = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(75), "{err}");
    assert!(
        err.contains("all 1 owner-registry entries") && err.contains("--max-processes"),
        "{err}"
    );
    run.kill().unwrap();
    run.wait().unwrap();
    let refused = TempPath::new("cli-registry-big");
    let big = output(shmlock(&refused).args(["create", "--max-processes", "70000"]));
    assert_eq!(big.status.code(), Some(64), "{big:?}");
}

/// `unlock --force` given the first bytes of a long key, as `inspect` shows them, says that
/// a longer key starting so is held, instead of only "not locked".
#[test]
fn unlocking_a_long_keys_preview_says_the_whole_key_is_needed() {
    let file = TempPath::new("cli-long-key");
    let key = format!("job:{}", "x".repeat(76));
    let mut run = holding(&file, &key, "exec sleep 30", &[]);
    let json = inspect_json(&file, &[]);
    let preview = json["holders"][0]["key"].as_str().unwrap().to_string();
    assert_eq!(json["holders"][0]["truncated"], true, "{json}");
    let out = output(shmlock(&file).args(["unlock", "--force", &preview]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("a key of 80 bytes that starts so is held"),
        "{err}"
    );
    assert!(is_held(&file, &key));
    run.kill().unwrap();
    run.wait().unwrap();
}

/// A key that is not text (here with a NUL byte, which no argument can hold) is broken by
/// its bytes in hex, as `inspect --json` gives them in `key_hex`: before `--hex` only code
/// could break it.
#[test]
fn unlock_force_hex_breaks_a_key_that_is_not_text() {
    let file = TempPath::new("cli-hex-key");
    let table = LockTable::open(&file, 16).unwrap();
    let key = b"\xff\xfe\x00\x01";
    let held = table.lock(key, LockOptions::default()).unwrap();
    let json = inspect_json(&file, &[]);
    let hex = json["holders"][0]["key_hex"].as_str().unwrap().to_string();
    assert_eq!(hex, "fffe0001", "{json}");
    for bad in ["fffe000", "zz", "fffe0001ff"] {
        let out = output(shmlock(&file).args(["unlock", "--force", "--hex", bad]));
        assert_ne!(out.status.code(), Some(0), "{bad}: {out:?}");
    }
    assert!(held.check().is_ok(), "a wrong key broke the hold");
    let out = output(shmlock(&file).args(["unlock", "--force", "--hex", &hex]));
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(said.contains("broke the key of hex fffe0001"), "{said}");
    assert!(matches!(held.check(), Err(shmlock::Error::Expired)));
}

/// `inspect --json` gives each token as a decimal string too, exactly `$SHMLOCK_TOKEN`:
/// a table's tokens pass 2^53, where readers that parse numbers as doubles round them.
#[test]
fn inspect_json_gives_the_token_exactly_as_text() {
    let file = TempPath::new("cli-token-text");
    let seen = TempPath::new("cli-token-text-env");
    let script = format!("echo $SHMLOCK_TOKEN > {}; exec sleep 30", seen.0.display());
    let mut run = holding(&file, "tk", &script, &[]);
    let env = line_written(&seen);
    let json = inspect_json(&file, &[]);
    let h = &json["holders"][0];
    assert_eq!(h["token_text"], env.as_str(), "{json}");
    assert_eq!(
        h["token"].as_u64(),
        Some(env.parse::<u64>().unwrap()),
        "{json}"
    );
    assert!(
        env.parse::<u64>().unwrap() > 1 << 53,
        "a table token: {env}"
    );
    run.kill().unwrap();
    run.wait().unwrap();
}

/// `inspect --watch` stops, saying why, when its file is deleted or truncated under it: it
/// neither shows a table nobody uses any more nor dies of SIGBUS.
#[test]
fn watching_a_file_deleted_or_truncated_stops_with_the_reason() {
    for (how, said) in [("delete", "was deleted"), ("truncate", "was truncated")] {
        let file = TempPath::new("cli-watch-gone");
        drop(LockTable::open(&file, 16).unwrap());
        let mut watch = shmlock(&file)
            .args(["inspect", "--watch", "--interval", "0.05", "--json"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = std::io::BufReader::new(watch.stdout.take().unwrap());
        let mut first = String::new();
        std::io::BufRead::read_line(&mut lines, &mut first).unwrap();
        assert!(first.starts_with('{'), "{first}");
        match how {
            "delete" => std::fs::remove_file(&file).unwrap(),
            _ => std::fs::OpenOptions::new()
                .write(true)
                .open(&file)
                .unwrap()
                .set_len(100)
                .unwrap(),
        }
        // (a watcher that goes on is killed after 20 s, and fails below)
        let pid = watch.id() as libc::pid_t;
        let (done, waited) = std::sync::mpsc::channel::<()>();
        let guard = std::thread::spawn(move || {
            if waited.recv_timeout(Duration::from_secs(20)).is_err() {
                common::signal::send(pid, libc::SIGKILL);
            }
        });
        let status = watch.wait().unwrap();
        let _ = done.send(());
        guard.join().unwrap();
        let mut err = String::new();
        std::io::Read::read_to_string(&mut watch.stderr.take().unwrap(), &mut err).unwrap();
        assert_eq!(status.code(), Some(66), "{how}: {err}");
        assert!(err.contains(said), "{how}: {err}");
    }
}

/// A lock broken while the command runs, which ends before `run`'s next renewal would
/// have noticed: `run` still exits 2 and says so, whatever the command's status.
#[test]
fn a_lock_broken_before_the_command_ends_is_exit_2() {
    let file = TempPath::new("cli-broken-late");
    let done = TempPath::new("cli-broken-late-go");
    // default exptime 30 s: the first renewal would come 10 s in
    let script = format!(
        "while [ ! -e {} ]; do sleep 0.02; done; exit 0",
        done.0.display()
    );
    let run = shmlock(&file)
        .args(["run", "bk", "--", "sh", "-c", &script])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    eventually("run holds the key", || is_held(&file, "bk"));
    assert!(output(shmlock(&file).args(["unlock", "--force", "bk"]))
        .status
        .success());
    std::fs::write(&done, b"").unwrap();
    let out = run.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("lost the lock on \"bk\""), "{err}");
}

#[test]
fn killing_run_kills_its_command_and_frees_the_key() {
    let file = TempPath::new("cli-kill");
    let pidfile = TempPath::new("cli-kill-pid");
    let script = format!("echo $$ > {}; exec sleep 30", pidfile.0.display());
    let mut run = holding(&file, "k", &script, &[]);
    let cmd: u32 = line_written(&pidfile).parse().unwrap();
    run.kill().unwrap(); // SIGKILL
    run.wait().unwrap();
    eventually("the command died with shmlock", || {
        std::fs::read_to_string(format!("/proc/{cmd}/stat")).map_or(true, |s| {
            s.rsplit(')').next().unwrap().trim_start().starts_with('Z')
        })
    });
    // the dead runner's key is free for the next run at once
    assert_eq!(
        code(shmlock(&file).args(["run", "-n", "k", "--", "true"])),
        0
    );
}

#[test]
fn renewal_keeps_a_long_run_locked() {
    let file = TempPath::new("cli-renew");
    // (the command runs until the test says so)
    let go = TempPath::new("cli-renew-go");
    let script = format!("while [ ! -e '{}' ]; do sleep 0.02; done", go.0.display());
    let mut long = holding(&file, "k", &script, &["--exptime", "0.5"]);
    // three leases later the key is still held
    std::thread::sleep(Duration::from_millis(1600));
    assert_eq!(
        code(shmlock(&file).args(["run", "-n", "k", "--", "true"])),
        1
    );
    std::fs::write(&go.0, b"").unwrap();
    assert!(long.wait().unwrap().success());
    assert_eq!(
        code(shmlock(&file).args(["run", "-n", "k", "--", "true"])),
        0
    );
}

/// `--max-time 0` is refused: the command would be stopped before it ran (it was, and
/// `run` said it had terminated it, exit 2).
#[test]
fn a_max_time_of_zero_is_refused() {
    let file = TempPath::new("cli-max-time-0");
    let ran = TempPath::new("cli-max-time-0-ran");
    let mark = format!("touch {}", ran.0.display());
    let out = output(shmlock(&file).args(["run", "--max-time", "0", "k", "-c", &mark]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(err.contains("--max-time must be > 0"), "{err}");
    assert!(!ran.0.exists(), "the command ran");
    assert!(!is_held(&file, "k"));
}

/// A lease shorter than `run`'s renewals can keep (0.1 s) is refused before anything is
/// taken or run, naming the floor; one at the floor is accepted.
#[test]
fn an_exptime_below_what_renewal_can_keep_is_refused() {
    let file = TempPath::new("cli-exptime-floor");
    let ran = TempPath::new("cli-exptime-floor-ran");
    let mark = format!("touch {}", ran.0.display());
    for exptime in ["0.001", "0.05", "0.099"] {
        let out = output(shmlock(&file).args(["run", "--exptime", exptime, "k", "-c", &mark]));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{exptime}: {err}");
        assert_eq!(err.lines().count(), 1, "{exptime}: {err}");
        assert!(
            err.contains(&format!("--exptime {exptime} is below 0.1 s")),
            "{exptime}: {err}"
        );
        assert!(!ran.0.exists(), "{exptime}: the command ran");
        assert!(!is_held(&file, "k"));
    }
    // at the floor it is accepted: -n against a holder gives the conflict code, not 64
    let mut holder = holding(&file, "k", "exec sleep 30", &[]);
    assert_eq!(
        code(shmlock(&file).args(["run", "-n", "--exptime", "0.1", "k", "-c", &mark])),
        1
    );
    holder.kill().unwrap();
    holder.wait().unwrap();
}

#[test]
fn create_makes_a_table_with_the_capacity_and_mode_asked_for() {
    let file = TempPath::new("cli-create");
    let out = output(shmlock(&file).args(["create", "--capacity", "64", "--mode", "0640"]));
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o640
    );
    assert_eq!(LockTable::open(&file, 1).unwrap().capacity(), 64);
    let again = output(shmlock(&file).args(["create", "--capacity", "64"]));
    assert_eq!(again.status.code(), Some(73));
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));
}

/// `create --dict` makes a SharedDict file with the layout asked for (entries, longest key
/// and value), mode and registry; `inspect` and `stats` read it, the library attaches to it
/// and keeps its limits. The dict's options need `--dict`, and an existing file is 73.
#[test]
fn create_dict_makes_a_shared_dict_that_inspect_and_stats_read() {
    let file = TempPath::new("cli-create-dict");
    let out = output(shmlock(&file).args([
        "create",
        "--dict",
        "--capacity",
        "16",
        "--max-key-len",
        "40",
        "--max-value-len",
        "100",
        "--mode",
        "0640",
        "--max-processes",
        "8",
    ]));
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("shared dict"),
        "{out:?}"
    );
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o640
    );
    let json = inspect_json(&file, &[]);
    assert_eq!(json["kind"], "dict", "{json}");
    assert_eq!(json["capacity"], 16, "{json}");
    assert_eq!(json["max_key_len"], 40, "{json}");
    assert_eq!(json["max_value_len"], 100, "{json}");
    assert_eq!(json["entries"], 0, "{json}");
    // --all (a table's expired entries and dead owners' holds) means nothing here: said
    // so, where it was ignored
    let all = output(shmlock(&file).args(["inspect", "--all"]));
    assert_eq!(all.status.code(), Some(64), "{all:?}");
    assert!(
        String::from_utf8_lossy(&all.stderr).contains("--all"),
        "{all:?}"
    );
    let stats = output(shmlock(&file).args(["stats", "--json"]));
    assert!(stats.status.success(), "{stats:?}");
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert_eq!(stats["kind"], "dict", "{stats}");
    assert_eq!(stats["entries"], 0, "{stats}");
    // the library attaches with the file's own layout, whatever it asks for
    let dict = SharedDict::open(&file, 1, 1).unwrap();
    assert!(!dict.created());
    assert_eq!((dict.capacity(), dict.max_value_len()), (16, 100));
    dict.set("k", &[7u8; 100][..], Duration::ZERO).unwrap();
    assert!(dict.set("x".repeat(41), "v", Duration::ZERO).is_err());
    assert_eq!(inspect_json(&file, &[])["live"], 1);
    // a lock table's commands refuse it
    assert_eq!(code(shmlock(&file).args(["run", "k", "--", "true"])), 65);
    // again: it exists
    let again = output(shmlock(&file).args(["create", "--dict"]));
    assert_eq!(again.status.code(), Some(73), "{again:?}");
    // the dict's own options without --dict, and a layout the dict refuses
    let other = TempPath::new("cli-create-dict-2");
    for args in [
        &["create", "--max-value-len", "64"][..],
        &["create", "--max-key-len", "64"],
        &["create", "--dict", "--max-key-len", "0"],
        &["create", "--dict", "--max-value-len", "2000000"],
    ] {
        let out = output(shmlock(&other).args(args));
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
        assert!(!other.0.exists(), "{args:?}");
    }
}

/// `create --dict --zone-size 1m` makes a dict whose file takes at most a MiB, one entry
/// per 4 KiB (or `--capacity`), the rest heap; a zone too small says what its entries
/// need, and beside `--heap-size` or without `--dict` it is a usage error. None of those
/// makes a file.
#[test]
fn create_dict_zone_size_sizes_the_whole_file() {
    let file = TempPath::new("cli-create-zone");
    let out = output(shmlock(&file).args([
        "create",
        "--dict",
        "--zone-size",
        "1m",
        "--max-key-len",
        "16",
        "--max-value-len",
        "16",
    ]));
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("256 entries"),
        "{out:?}"
    );
    let len = std::fs::metadata(&file).unwrap().len();
    assert!(len <= 1 << 20 && len > (1 << 20) - 320, "{len}");
    let dict = SharedDict::open(&file, 1, 1).unwrap();
    assert_eq!((dict.capacity(), dict.zone_size()), (256, len));
    assert!(dict.heap_size() > 900 << 10, "{}", dict.heap_size());
    let stats = output(shmlock(&file).args(["stats", "--json"]));
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert_eq!(stats["heap_bytes"], dict.heap_size(), "{stats}");
    let sized = TempPath::new("cli-create-zone-2");
    let out = output(shmlock(&sized).args([
        "create",
        "--dict",
        "--zone-size",
        "2m",
        "--capacity",
        "1000",
    ]));
    assert!(out.status.success(), "{out:?}");
    assert_eq!(SharedDict::open(&sized, 1, 1).unwrap().capacity(), 1000);
    let other = TempPath::new("cli-create-zone-3");
    for (args, says) in [
        (&["create", "--dict", "--zone-size", "64k"][..], "too small"),
        (
            &["create", "--dict", "--zone-size", "1m", "--heap-size", "1m"],
            "--heap-size",
        ),
        (&["create", "--zone-size", "1m"], "--dict"),
        (&["create", "--dict", "--zone-size", "1x"], "unit"),
    ] {
        let out = output(shmlock(&other).args(args));
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(says),
            "{args:?}: {out:?}"
        );
        assert!(!other.0.exists(), "{args:?}");
    }
}

/// A hold left to expire has no owner: `inspect` and `unlock --force` say so, not
/// "pid 0, alive" (its owner field names nobody; this process holds a key beside it).
#[test]
fn a_hold_left_to_expire_is_shown_and_broken_as_nobodys() {
    let file = TempPath::new("cli-unlock-left");
    let table = LockTable::open(&file, 16).unwrap();
    let hold = table
        .try_lock_with_lease("k", Duration::from_secs(600))
        .unwrap()
        .expect("k is free");
    hold.leave_to_expire();
    let _mine = table.lock("mine", LockOptions::default()).unwrap();
    let json = inspect_json(&file, &[]);
    let row = |key: &str| {
        json["holders"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["key"] == key)
            .unwrap_or_else(|| panic!("no {key}: {json}"))
            .clone()
    };
    let (left, mine) = (row("k"), row("mine"));
    assert_eq!(
        (&left["left_to_expire"], &left["pid"]),
        (&serde_json::json!(true), &serde_json::json!(0)),
        "{json}"
    );
    assert_eq!(
        (&mine["left_to_expire"], &mine["pid"], &mine["alive"]),
        (
            &serde_json::json!(false),
            &serde_json::json!(std::process::id()),
            &serde_json::json!(true)
        ),
        "{json}"
    );
    let text = String::from_utf8(output(shmlock(&file).arg("inspect")).stdout).unwrap();
    let line = |key: &str| {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(key))
            .unwrap_or_else(|| panic!("no {key}: {text}"))
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
    };
    assert_eq!(line("k"), ["k", "-", "-"], "{text}");
    let me = std::process::id().to_string();
    assert_eq!(line("mine"), ["mine", me.as_str(), "yes"], "{text}");

    let out = output(shmlock(&file).args(["unlock", "--force", "k"]));
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("by no process (it was left to expire)") && !said.contains("pid 0"),
        "{said}"
    );
    assert!(!table.is_locked("k").unwrap());
}

/// `unlock --force` takes no entry of the owner registry: it breaks a key while every
/// entry is taken by a live process (here the one entry of `--max-processes 1`, by the
/// holder), where another `run` is refused (75).
#[test]
fn unlock_force_works_while_every_registry_entry_is_taken() {
    let file = TempPath::new("cli-unlock-full");
    let made = output(shmlock(&file).args(["create", "--max-processes", "1"]));
    assert!(made.status.success(), "{made:?}");
    let mut holder = holding(&file, "k", "sleep 30", &[]);
    let other = output(shmlock(&file).args(["run", "other", "--", "true"]));
    assert_eq!(other.status.code(), Some(75), "{other:?}");
    let out = output(shmlock(&file).args(["unlock", "--force", "k"]));
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("broke \"k\""),
        "{out:?}"
    );
    assert!(!is_held(&file, "k"));
    holder.kill().unwrap();
    holder.wait().unwrap();
}

/// A mode that does not let the owner read and write the file would make a table nobody
/// but root can open: `create` refuses it (EX_USAGE), naming the mode, and makes nothing.
#[test]
fn create_refuses_a_mode_the_owner_cannot_read_and_write() {
    for (mode, shown) in [
        ("0", "0000"),
        ("0400", "0400"),
        ("0200", "0200"),
        ("0066", "0066"),
        ("0o500", "0500"),
    ] {
        let file = TempPath::new("cli-create-mode");
        let out = output(shmlock(&file).args(["create", "--mode", mode]));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{mode}: {err}");
        assert!(
            err.contains(&format!(
                "mode {shown} does not let the owner read and write"
            )) && err.contains("at least 0600"),
            "{mode}: {err}"
        );
        assert!(!file.0.exists(), "{mode}: a file was made");
    }
    let file = TempPath::new("cli-create-mode-ok");
    let out = output(shmlock(&file).args(["create", "--mode", "0600"]));
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
}

/// An empty file at the path (`touch`) is not a table being made: a table appears at its
/// path only once whole. The error says the file is empty, that something else made it,
/// and how to get a table; the file is left as it is.
#[test]
fn an_empty_file_says_it_is_empty_and_how_to_make_the_table() {
    let file = TempPath::new("cli-empty");
    std::fs::write(&file, b"").unwrap();
    for args in [&["inspect"][..], &["stats"], &["run", "k", "--", "true"]] {
        let out = output(shmlock(&file).args(args));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(65), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        for needle in [
            "empty file (0 bytes)",
            "something else made or emptied it",
            "remove it",
            "shmlock create",
        ] {
            assert!(err.contains(needle), "{args:?}: no {needle:?} in {err}");
        }
    }
    assert_eq!(
        std::fs::metadata(&file).unwrap().len(),
        0,
        "the file was changed"
    );
    // as it says: removed, the path gets a table
    std::fs::remove_file(&file).unwrap();
    assert_eq!(code(shmlock(&file).args(["run", "k", "--", "true"])), 0);
}

#[test]
fn errors_are_one_line_on_stderr_with_a_sysexits_code() {
    let file = TempPath::new("cli-errors");
    let one_line = |o: Output, code: i32, needle: &str| {
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(o.status.code(), Some(code), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.starts_with("shmlock: ") && err.contains(needle),
            "{err}"
        );
    };
    // EX_NOINPUT, as flock(1) exits when it cannot open its file
    one_line(
        output(shmlock(&file).arg("inspect")),
        66,
        "no table there yet",
    );
    // a directory that is not there: no `run` would make a table in it (the advice to run
    // one led to a second error)
    let nowhere = TempPath(TempPath::new("cli-no-dir").0.join("table"));
    one_line(
        output(shmlock(&nowhere).arg("inspect")),
        66,
        "no such directory",
    );
    std::fs::write(&file, "not a table\n".repeat(500)).unwrap();
    // EX_DATAERR
    one_line(
        output(shmlock(&file).arg("inspect")),
        65,
        "not a shmlock file",
    );
    one_line(
        output(shmlock(&file).args(["run", "k", "--", "true"])),
        65,
        "not a shmlock file",
    );
    // EX_USAGE for values the parser let through
    let other = TempPath::new("cli-errors-2");
    one_line(
        output(shmlock(&other).args(["create", "--capacity", "0"])),
        64,
        "capacity 0",
    );
    one_line(
        output(shmlock(&other).args(["run", "--exptime=-1", "k", "--", "true"])),
        64,
        "--exptime",
    );
    one_line(
        output(shmlock(&other).args(["run", "--exptime", "0", "k", "--", "true"])),
        64,
        "--exptime",
    );
    // an empty key is a bad key
    one_line(
        output(shmlock(&other).args(["run", "", "--", "true"])),
        64,
        "empty key",
    );
    // EX_CANTCREAT: create on an existing file
    one_line(
        output(shmlock(&file).args(["create", "--capacity", "4"])),
        73,
        "already exists",
    );
}

#[test]
fn usage_errors_exit_64_as_flock_does() {
    let file = TempPath::new("cli-usage");
    for args in [
        &["--bogus"][..],
        &["run", "k"],                             // no command
        &["run", "k", "-c", "true", "--", "true"], // both forms
        &["run", "-E", "256", "k", "--", "true"],  // not 0..=255
        &["run", "-w", "soon", "k", "--", "true"],
        &["unlock", "k"], // --force is required
    ] {
        let out = output(shmlock(&file).args(args));
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
        assert!(!out.stderr.is_empty(), "{args:?}");
    }
    // a negative number is a bad value of its option, not an unknown argument
    for (option, value) in [
        ("--capacity", "-1"),
        ("--max-processes", "-3"),
        ("--zone-size", "-5m"),
        ("--max-key-len", "-2"),
    ] {
        let mut args = vec!["create", option, value];
        if option != "--capacity" && option != "--max-processes" {
            args.push("--dict");
        }
        let out = output(shmlock(&file).args(&args));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
        assert!(
            err.contains(&format!("invalid value '{value}' for '{option} ")),
            "{args:?}: {err}"
        );
    }
    // --help and --version are no errors
    let help = output(shmlock(&file).args(["run", "--help"]));
    assert_eq!(help.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&help.stdout).contains("Exit status"));
    assert_eq!(code(shmlock(&file).arg("--version")), 0);
    // nothing ran, nothing was created
    assert!(!file.0.exists());
}

#[test]
fn a_command_that_cannot_run_exits_126_or_127_and_frees_the_key() {
    let file = TempPath::new("cli-exec");
    let not_executable = TempPath::new("cli-exec-file");
    std::fs::write(&not_executable, "#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(&not_executable, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = output(
        shmlock(&file)
            .args(["run", "k", "--"])
            .arg(&not_executable.0),
    );
    assert_eq!(out.status.code(), Some(126), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("ermission denied"));
    let out =
        output(shmlock(&file).args(["run", "k", "--", "/nonexistent/shmlock-no-such-command"]));
    assert_eq!(out.status.code(), Some(127), "{out:?}");
    let out = output(shmlock(&file).args(["run", "k", "--", "shmlock-no-such-command-in-path"]));
    assert_eq!(out.status.code(), Some(127), "{out:?}");
    // -c: the shell's own codes
    assert_eq!(
        code(shmlock(&file).args(["run", "k", "-c", "shmlock-no-such-command-in-path"])),
        127
    );
    assert!(!LockTable::open(&file, 1).unwrap().is_locked("k").unwrap());
}

/// `inspect` only reads, so read access to the file is enough. The table is
/// root's, mode 0644, with a holder; `shmlock inspect` runs as uid 65534 (nobody), and a
/// `run` of nobody's is refused saying how a reader opens it.
#[test]
#[ignore = "needs root: creates a root-owned table and runs `shmlock inspect` as uid 65534 through setpriv"]
fn inspect_needs_read_access_only() {
    common::harness::require_root();
    let file = TempPath::new("cli-read-only");
    let table = LockTable::options()
        .capacity(64)
        .mode(0o644)
        .open(&file)
        .unwrap();
    let guard = table.lock("job:ro", LockOptions::default()).unwrap();
    let nobody = |program: &str| {
        let mut c = Command::new("setpriv");
        c.args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
            .arg(program)
            .env_remove("SHMLOCK_FILE");
        c
    };
    // The setup: nobody may read the file and run the command, and may not write the file.
    let bin = env!("CARGO_BIN_EXE_shmlock");
    let script = "test -r \"$1\" && test ! -w \"$1\" && test -x \"$2\"";
    let setup = output(
        nobody("sh")
            .args(["-c", script, "sh"])
            .arg(&file.0)
            .arg(bin),
    );
    assert!(
        setup.status.success(),
        "setup: uid 65534's access: {setup:?}"
    );

    let out = output(nobody(bin).arg("--file").arg(&file.0).arg("inspect"));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "inspect with read access only: {:?}; stderr: {stderr}",
        out.status
    );
    assert!(
        stdout.contains("job:ro") && stdout.contains(&std::process::id().to_string()),
        "{stdout}"
    );
    // A `run`, which must write, is refused, and told how a reader opens the file.
    let out =
        output(
            nobody(bin)
                .arg("--file")
                .arg(&file.0)
                .args(["run", "job:other", "--", "true"]),
        );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(66), "{stderr}"); // EX_NOINPUT, as any file it cannot open
    assert!(
        stderr.contains("may read the file but not write it") && stderr.contains("read_only(true)"),
        "{stderr}"
    );
    guard.unlock().unwrap();
}

/// `create` with a capacity bigger than the filesystem's free room exits 73 (EX_CANTCREAT)
/// and says the bytes it needs and the bytes free; nothing is left behind.
#[test]
#[ignore = "needs root: mounts a 1 MiB tmpfs in a mount namespace (unshare -m)"]
fn create_on_a_filesystem_without_room_says_how_much_it_needs() {
    common::harness::require_root();
    let dir = TempPath::new("cli-full");
    std::fs::create_dir_all(&dir.0).unwrap();
    // In its own mount namespace: the tmpfs vanishes with the shell.
    let script = "mount -t tmpfs -o size=1m tmpfs \"$1\" || exit 99; \
                  \"$2\" --file \"$1/table\" create --capacity 100000; code=$?; \
                  ls -A \"$1\" >&2; exit $code";
    let out = output(
        Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c", script, "sh"])
            .arg(&dir.0)
            .arg(env!("CARGO_BIN_EXE_shmlock"))
            .env_remove("SHMLOCK_FILE"),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let _ = std::fs::remove_dir_all(&dir.0);
    assert_eq!(out.status.code(), Some(73), "{stderr}");
    assert!(
        stderr.contains("needs") && stderr.contains("free") && !stderr.contains("table\n"),
        "{stderr}"
    );
    // (a table has no zone: the hint names the table's option alone)
    assert!(
        stderr.contains("with a smaller --capacity,") && !stderr.contains("--zone-size"),
        "{stderr}"
    );
}

/// systemd's `RemoveIPC` (the default for users other than system ones) deletes every
/// `/dev/shm` file of a user whose last session ends, while that user's services run on:
/// two `run`s as uid 65534 hold keys on two tables, every file of the uid is deleted, and a
/// newcomer of that uid is refused the path (73, naming the holder), instead of making a
/// table where it would take the held key. Once the holders are gone it runs.
#[test]
#[ignore = "needs root: runs the holders as uid 65534 through setpriv"]
fn a_cleanup_of_every_file_of_a_uid_splits_no_table() {
    common::harness::require_root();
    let dir = TempPath::new("cli-uid-cleanup");
    std::fs::create_dir_all(&dir.0).unwrap();
    std::os::unix::fs::chown(&dir.0, Some(65534), Some(65534)).unwrap();
    let bin = env!("CARGO_BIN_EXE_shmlock");
    let as_nobody = |file: &std::path::Path, script: &str| {
        let mut c = Command::new("setpriv");
        c.args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
            .arg(bin)
            .arg("--file")
            .arg(file)
            .args(["run", "K", "--", "sh", "-c", script])
            .env_remove("SHMLOCK_FILE")
            .stdin(Stdio::null());
        c
    };
    let tables = [dir.0.join("a"), dir.0.join("b")];
    let mut holders: Vec<Child> = tables
        .iter()
        .map(|t| as_nobody(t, "sleep 60").spawn().unwrap())
        .collect();
    for t in &tables {
        eventually("the holder holds K", || {
            LockTable::options()
                .read_only(true)
                .open(t)
                .is_ok_and(|table| table.is_locked("K").unwrap())
        });
    }
    // the cleanup: every file the uid owns
    let mut deleted = 0;
    for e in std::fs::read_dir(&dir.0).unwrap() {
        let e = e.unwrap();
        if std::os::unix::fs::MetadataExt::uid(&e.metadata().unwrap()) == 65534 {
            std::fs::remove_file(e.path()).unwrap();
            deleted += 1;
        }
    }
    assert_eq!(deleted, 2);
    let out = output(&mut as_nobody(&tables[0], "true"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(73), "{stderr}");
    assert!(
        stderr.contains(&holders[0].id().to_string()) && stderr.contains("deleted"),
        "{stderr}"
    );
    assert!(
        !tables[0].exists(),
        "a table was made beside the deleted one"
    );
    // inspect finds nothing to open there, and says who still uses the deleted one
    let out = output(
        Command::new(bin)
            .arg("--file")
            .arg(&tables[0])
            .arg("inspect"),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(66), "{stderr}");
    assert!(stderr.contains(&holders[0].id().to_string()), "{stderr}");
    for h in &mut holders {
        h.kill().unwrap();
        h.wait().unwrap();
    }
    let out = output(&mut as_nobody(&tables[0], "true"));
    assert!(out.status.success(), "{out:?}");
    let _ = std::fs::remove_dir_all(&dir.0);
}

#[test]
fn the_file_comes_from_shmlock_file_when_not_given() {
    let file = TempPath::new("cli-env");
    let status = Command::new(env!("CARGO_BIN_EXE_shmlock"))
        .env("SHMLOCK_FILE", &file.0)
        .args(["run", "k", "--", "true"])
        .status()
        .unwrap();
    assert!(status.success());
    assert!(file.0.exists());
}

#[test]
fn the_redis_backend_runs_inspects_and_unlocks() {
    let server = common::redis_server::RedisServer::start();
    let url = server.url();
    let cli = || {
        let mut c = Command::new(env!("CARGO_BIN_EXE_shmlock"));
        c.env_remove("SHMLOCK_FILE").args(["--redis", &url]);
        c
    };
    let redis = shmlock::RedisLocks::open(&url).unwrap();
    // (the command runs until the test says so: the CLI calls below may take long on a
    // busy machine)
    let go = TempPath::new("cli-redis-go");
    let mut first = cli()
        .args(["run", "--exptime", "1", "job", "--", "sh", "-c"])
        .arg(format!(
            "while [ ! -e '{}' ]; do sleep 0.02; done",
            go.0.display()
        ))
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    eventually("the run holds the key in Redis", || {
        redis.is_locked("job").unwrap()
    });
    assert_eq!(
        code(cli().args(["run", "-n", "-E", "9", "job", "--", "true"])),
        9
    );
    let json = String::from_utf8(output(cli().args(["inspect", "--json"])).stdout).unwrap();
    assert!(
        json.contains("\"key\":\"job\"") && json.contains("\"ttl_ms\":"),
        "{json}"
    );
    let text = String::from_utf8(output(cli().arg("inspect")).stdout).unwrap();
    assert!(text.starts_with(&format!("{url}: 1 lock held")), "{text}");
    assert_eq!(code(cli().args(["inspect", "--all"])), 64);
    // renewed past its 1 s lease while the command runs
    std::thread::sleep(Duration::from_millis(1500));
    assert!(redis.is_locked("job").unwrap());
    std::fs::write(&go.0, b"").unwrap();
    assert!(first.wait().unwrap().success());
    assert!(!redis.is_locked("job").unwrap());
    // a stuck lock (its holder gone without unlocking) is broken by force
    let stuck = redis
        .try_lock_with_lease("stuck", Duration::from_secs(60))
        .unwrap()
        .unwrap();
    std::mem::forget(stuck);
    assert_eq!(code(cli().args(["unlock", "stuck"])), 64);
    assert_eq!(code(cli().args(["unlock", "--force", "stuck"])), 0);
    assert_eq!(code(cli().args(["run", "-n", "stuck", "--", "true"])), 0);
    assert_eq!(code(cli().args(["create", "--capacity", "4"])), 64);
    // an unreachable server is one line and EX_UNAVAILABLE
    let down = output(Command::new(env!("CARGO_BIN_EXE_shmlock")).args([
        "--redis",
        "redis://127.0.0.1:1/",
        "inspect",
    ]));
    assert_eq!(down.status.code(), Some(69));
    assert_eq!(String::from_utf8_lossy(&down.stderr).lines().count(), 1);
}

#[test]
fn inspect_shows_a_shared_dicts_counters_and_live_keys() {
    let file = TempPath::new("cli-dict");
    let dict = SharedDict::open(&file, 16, 32).unwrap();
    dict.set("item:1", "v", Duration::ZERO).unwrap();
    dict.set("item:2", "v", Duration::from_secs(3600)).unwrap();
    dict.set("gone", "v", Duration::from_millis(1)).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let text = String::from_utf8(output(shmlock(&file).arg("inspect")).stdout).unwrap();
    assert!(
        text.contains("shared dict, capacity 16, entries 3 (2 live)"),
        "{text}"
    );
    assert!(text.contains("writer none"), "{text}");
    let lines: Vec<&str> = text.lines().skip(2).collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].starts_with("item:1") && lines[0].ends_with("never"),
        "{text}"
    );
    assert!(
        lines[1].starts_with("item:2") && lines[1].ends_with('s'),
        "{text}"
    );
    let json = inspect_json(&file, &[]);
    assert_eq!(json["kind"], "dict");
    assert_eq!(json["capacity"], 16);
    assert_eq!(json["entries"], 3);
    assert_eq!(json["live"], 2);
    assert_eq!(json["max_key_len"], 250);
    assert!(
        json["max_value_len"].is_u64() && json["evictions"].is_u64(),
        "{json}"
    );
    assert_eq!(json["repairs"], 0);
    assert_eq!(json["writer_pid"], serde_json::Value::Null);
    assert_eq!(json["writer_alive"], serde_json::Value::Null);
    assert_eq!(
        (&json["heap_size"], &json["heap_free"]),
        (&0.into(), &0.into())
    );
    assert_eq!(json["zone_size"], std::fs::metadata(&file.0).unwrap().len());
    // a dict with a heap says where long values go and how much of it is free
    let zone = TempPath::new("cli-dict-zone");
    let d = SharedDict::options()
        .zone_size(1 << 20)
        .max_value_len(64)
        .open(&zone)
        .unwrap();
    d.set("long", &[7u8; 5000][..], Duration::ZERO).unwrap();
    let (heap, free) = (d.heap_size(), d.heap_free());
    assert!(free < heap && heap > 0);
    let text = String::from_utf8(output(shmlock(&zone).arg("inspect")).stdout).unwrap();
    assert!(
        text.contains(&format!(
            " (64 in the entry, longer in a heap of {heap} B, {free} B free)"
        )),
        "{text}"
    );
    let zjson = inspect_json(&zone, &[]);
    assert_eq!(zjson["entry_value_len"], 64);
    assert_eq!(
        (zjson["heap_size"].as_u64(), zjson["heap_free"].as_u64()),
        (Some(heap), Some(free))
    );
    assert_eq!(zjson["zone_size"], d.zone_size());
    assert_eq!(
        json["keys"][0],
        serde_json::json!({"key": "item:1", "key_hex": "6974656d3a31", "value_kind": "bytes",
            "len": 1, "ttl_ms": null})
    );
    assert!(json["keys"][1]["ttl_ms"].is_u64(), "{json}");
}

#[test]
fn inspect_shows_each_dict_values_kind_and_length() {
    let file = TempPath::new("cli-dict-kinds");
    let dict = SharedDict::open(&file, 16, 64).unwrap();
    dict.set("a:bytes", "twelve bytes", Duration::ZERO).unwrap();
    dict.set("b:int", 7i64, Duration::ZERO).unwrap();
    dict.set("c:float", 0.5f64, Duration::ZERO).unwrap();
    dict.set("d:bool", true, Duration::ZERO).unwrap();
    for element in ["x", "y", "z"] {
        dict.rpush("e:queue", element).unwrap();
    }
    let text = String::from_utf8(output(shmlock(&file).arg("inspect")).stdout).unwrap();
    let rows: Vec<Vec<&str>> = text
        .lines()
        .skip(2)
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows,
        [
            ["a:bytes", "bytes", "12", "never"],
            ["b:int", "int", "8", "never"],
            ["c:float", "float", "8", "never"],
            ["d:bool", "bool", "1", "never"],
            ["e:queue", "list", "3", "never"],
        ],
        "{text}"
    );
    assert!(text.lines().nth(1).unwrap().contains("KIND"), "{text}");
    let json = inspect_json(&file, &[]);
    let kinds: Vec<(String, u64)> = json["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            (
                k["value_kind"].as_str().unwrap().to_string(),
                k["len"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            ("bytes".to_string(), 12),
            ("int".to_string(), 8),
            ("float".to_string(), 8),
            ("bool".to_string(), 1),
            ("list".to_string(), 3),
        ]
    );
    // a popped list is shorter
    dict.lpop("e:queue").unwrap();
    let json = inspect_json(&file, &[]);
    assert_eq!(json["keys"][4]["len"], 2, "{json}");
}

/// Starts `shmlock run KEY -- cat` (which holds KEY until its stdin is closed) and waits
/// until it holds KEY.
fn held_until_stdin_closes(file: &TempPath, key: &str) -> Child {
    let child = shmlock(file)
        .args(["run", key, "--", "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    eventually("the holder holds the key", || {
        LockTable::options()
            .create(false)
            .open(file)
            .is_ok_and(|t| t.is_locked(key).unwrap())
    });
    child
}

/// Whether someone waits (asleep) for `key`, as the table says.
fn someone_waits(file: &TempPath, key: &str) -> bool {
    LockTable::options()
        .read_only(true)
        .open(file)
        .unwrap()
        .holders()
        .iter()
        .any(|h| h.key_preview == key.as_bytes() && h.waiters)
}

fn release(mut holder: Child) {
    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
}

#[test]
fn run_c_runs_the_string_through_sh() {
    let file = TempPath::new("cli-c");
    let out = output(shmlock(&file).args(["run", "k", "-c", "echo $0 | tr a-z A-Z; exit 4"]));
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "/BIN/SH\n");
    // the long form, before the key
    let out = output(shmlock(&file).args(["run", "--command", "echo \"$((6 * 7))\"", "k"]));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "42\n", "{out:?}");
}

#[test]
fn verbose_says_who_held_the_key_how_long_it_waited_and_that_it_got_it() {
    let file = TempPath::new("cli-verbose");
    let holder = held_until_stdin_closes(&file, "k");
    // gives up: says who holds it, and after how long it gave up
    let out = output(shmlock(&file).args(["run", "--verbose", "-w", "0.2", "k", "--", "true"]));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("\"k\" is held by pid {} for ", holder.id())),
        "{err}"
    );
    let gave_up: f64 = err
        .split("gave up on \"k\" after waiting ")
        .nth(1)
        .and_then(|rest| rest.split("s; held by ").next()?.parse().ok())
        .unwrap_or_else(|| panic!("{err}"));
    assert!(gave_up >= 0.2, "{err}");
    assert!(
        err.contains(&format!("s; held by pid {} for ", holder.id())),
        "{err}"
    );
    release(holder);

    // (another key: the waiters flag of "k" may still be set by the run that gave up)
    let holder = held_until_stdin_closes(&file, "k2");
    let waiter = shmlock(&file)
        .args(["run", "--verbose", "k2", "--", "true"])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    eventually("the second run waits", || someone_waits(&file, "k2"));
    let holder_pid = holder.id();
    release(holder);
    let out = waiter.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 3, "{err}");
    assert!(
        lines[0].starts_with(&format!("shmlock: \"k2\" is held by pid {holder_pid} for ")),
        "{err}"
    );
    assert!(
        lines[1].starts_with("shmlock: got \"k2\" after waiting "),
        "{err}"
    );
    assert_eq!(lines[2], "shmlock: running true");
    // no wait: it got the key at once
    let out = output(shmlock(&file).args(["run", "--verbose", "k", "--", "true"]));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        err.starts_with("shmlock: got \"k\" after waiting 0.0"),
        "{err}"
    );
    assert!(!err.contains("held by"), "{err}");
}

#[test]
fn sigterm_reaches_the_command_whose_cleanup_runs_under_the_lock() {
    let file = TempPath::new("cli-sigterm");
    let ready = TempPath::new("cli-sigterm-ready");
    let trapped = TempPath::new("cli-sigterm-trapped");
    // The trap records whether the key is still held while it cleans up (a `run -n` of
    // the same key: 1 if held), then exits 3.
    let script = r#"sleep 30 & sleeper=$!
trap 'kill $sleeper; "$SHMLOCK" --file "$F" run -n k -- true; echo $? > "$T"; exit 3' TERM
echo ready > "$R"
wait $sleeper"#;
    let run = shmlock(&file)
        .args(["run", "k", "-c", script])
        .env("SHMLOCK", env!("CARGO_BIN_EXE_shmlock"))
        .env("F", &file.0)
        .env("T", &trapped.0)
        .env("R", &ready.0)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    eventually("the command is ready", || {
        std::fs::read_to_string(&ready).is_ok_and(|s| s == "ready\n")
    });
    let pid = nix::unistd::Pid::from_raw(run.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let out = run.wait_with_output().unwrap();
    // run passed SIGTERM on, waited for the trap, and exited with the command's status
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_eq!(
        std::fs::read_to_string(&trapped).unwrap(),
        "1\n",
        "the key was not held while the command cleaned up"
    );
    // released once the command exited
    assert_eq!(
        code(shmlock(&file).args(["run", "-n", "k", "--", "true"])),
        0
    );
}

#[test]
fn a_signal_while_waiting_ends_run_without_running_the_command() {
    let file = TempPath::new("cli-sigint-wait");
    let ran = TempPath::new("cli-sigint-ran");
    let holder = held_until_stdin_closes(&file, "k");
    let waiter = shmlock(&file)
        .args(["run", "k", "--", "touch"])
        .arg(&ran.0)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    eventually("the second run waits", || someone_waits(&file, "k"));
    let pid = nix::unistd::Pid::from_raw(waiter.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let out = waiter.wait_with_output().unwrap();
    // run died of it, as flock(1) would have at a terminal's Ctrl-C
    assert_eq!(out.status.signal(), Some(libc::SIGINT), "{out:?}");
    assert!(!ran.0.exists());
    // the holder was not disturbed
    assert!(LockTable::open(&file, 1).unwrap().is_locked("k").unwrap());
    release(holder);
    assert!(!ran.0.exists());
}

/// A command killed by a signal ends `run` by the same signal once the key is released, so
/// that a shell sees it (bash ends `while :; do shmlock run k -- cmd; done` on Ctrl-C only
/// if its child died of SIGINT). SIGPIPE too, which Rust's runtime ignores; and a SIGQUIT
/// dumps no core of shmlock.
#[test]
fn a_command_killed_by_a_signal_ends_run_by_that_signal() {
    let file = TempPath::new("cli-die-of");
    let cwd = TempPath::new("cli-die-of-cwd");
    std::fs::create_dir(&cwd.0).unwrap();
    for (sig, name) in [
        (libc::SIGINT, "INT"),
        (libc::SIGPIPE, "PIPE"),
        (libc::SIGQUIT, "QUIT"),
    ] {
        // (the shell dumps no core of its own, and shmlock would be let to dump one)
        let script = format!("ulimit -c 0; kill -{name} $$");
        let mut c = shmlock(&file);
        c.args(["run", "k", "--", "sh", "-c", &script])
            .current_dir(&cwd.0);
        // SAFETY: setrlimit is async-signal-safe, and the struct lives across the call.
        unsafe {
            c.pre_exec(|| {
                let core = libc::rlimit {
                    rlim_cur: libc::RLIM_INFINITY,
                    rlim_max: libc::RLIM_INFINITY,
                };
                libc::setrlimit(libc::RLIMIT_CORE, &core);
                Ok(())
            });
        }
        let out = output(&mut c);
        assert_eq!(out.status.signal(), Some(sig), "{name}: {out:?}");
        assert!(!out.status.core_dumped(), "{name}: {out:?}");
        assert!(!is_held(&file, "k"), "{name}: the key is still held");
    }
    let left: Vec<_> = std::fs::read_dir(&cwd.0).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

/// A closed stderr (a pipe nobody reads: EPIPE, as Rust ignores SIGPIPE) drops `run`'s
/// messages and changes nothing else; a closed stdout fails a command that prints there
/// with 74 (EX_IOERR), not a panic (101).
#[test]
fn a_broken_stderr_or_stdout_is_no_panic() {
    let file = TempPath::new("cli-broken-pipe");
    let ran = TempPath::new("cli-broken-pipe-ran");
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = shmlock(&file)
        .args(["run", "--verbose", "k", "--", "touch"])
        .arg(&ran.0)
        .stdin(Stdio::null())
        .stderr(writer.try_clone().unwrap())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(ran.0.exists());

    let made = TempPath::new("cli-broken-pipe-made");
    let out = shmlock(&made)
        .arg("create")
        .stdin(Stdio::null())
        .stdout(writer)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(74), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).starts_with("shmlock: stdout: "),
        "{out:?}"
    );

    // a help that cannot be written fails; one whose reader went away does not
    for (args, full) in [
        (&["--help"][..], true),
        (&["run", "--help"], true),
        (&["--version"], true),
        (&["--help"], false),
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let stdout = if full {
            Stdio::from(
                std::fs::OpenOptions::new()
                    .write(true)
                    .open("/dev/full")
                    .unwrap(),
            )
        } else {
            Stdio::from(writer)
        };
        let out = shmlock(&made)
            .args(args)
            .stdin(Stdio::null())
            .stdout(stdout)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        if full {
            assert_eq!(out.status.code(), Some(74), "{args:?}: {out:?}");
            assert!(said.starts_with("shmlock: stdout: "), "{args:?}: {out:?}");
        } else {
            assert_eq!(out.status.code(), Some(0), "{args:?}: {out:?}");
            assert!(said.is_empty(), "{args:?}: {out:?}");
        }
    }
}

#[test]
fn a_status_line_shows_on_a_terminal_while_run_waits() {
    let file = TempPath::new("cli-status-line");
    let holder = held_until_stdin_closes(&file, "job:7");
    let holder_pid = holder.id();
    // (close-on-exec: what other tests spawn meanwhile must not keep it)
    let (master, slave) = cloexec_pty();
    let waiter = shmlock(&file)
        .args(["run", "job:7", "--", "true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(slave)) // the Command, and this copy, are dropped here
        .spawn()
        .unwrap();
    // (EIO once every copy of the slave is closed: the waiter exited)
    let (rx, reader) = read_pty(master);
    let mut seen = Vec::new();
    let expected = format!("waiting for \"job:7\", held by pid {holder_pid} for ");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !String::from_utf8_lossy(&seen).contains(&expected) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(chunk) => seen.extend(chunk),
            Err(_) => panic!("no status line: {:?}", String::from_utf8_lossy(&seen)),
        }
    }
    release(holder);
    let out = waiter.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    reader.join().unwrap();
    seen.extend(rx.try_iter().flatten());
    let text = String::from_utf8_lossy(&seen).into_owned();
    // each line drawn over the last, and erased once the lock was got
    assert!(
        text.starts_with("\r\x1b[2Kshmlock: waiting for"),
        "{text:?}"
    );
    assert!(text.contains("; waited "), "{text:?}");
    assert!(text.ends_with("\r\x1b[2K"), "{text:?}");
    assert!(!text.contains('\n'), "{text:?}");
}

#[test]
fn no_status_line_when_stderr_is_not_a_terminal() {
    let file = TempPath::new("cli-no-status-line");
    let holder = held_until_stdin_closes(&file, "k");
    let waiter = shmlock(&file)
        .args(["run", "k", "--", "true"])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    eventually("the second run waits", || someone_waits(&file, "k"));
    // long enough for a status line to be drawn, if one were (it is, every 250 ms)
    std::thread::sleep(Duration::from_millis(700));
    release(holder);
    let out = waiter.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}

/// Reads lines of `child`'s stdout until `enough` says so (the hang guard: the test's
/// timeout kills it); then kills it.
fn read_until(mut child: Child, mut enough: impl FnMut(&[String]) -> bool) -> Vec<String> {
    use std::io::BufRead;
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    while !enough(&lines) {
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(line) => lines.push(line),
            Err(_) => {
                let _ = child.kill();
                panic!("stopped at {lines:?}");
            }
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    lines
}

#[test]
fn inspect_watch_prints_the_table_again_until_killed() {
    let file = TempPath::new("cli-watch");
    let holder = held_until_stdin_closes(&file, "job:w");
    let pid = holder.id().to_string();
    let watch = shmlock(&file)
        .args(["inspect", "--watch", "--interval", "0.1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // not a terminal: a "--- TIME ---" line before each snapshot
    let lines = read_until(watch, |l| {
        l.iter().filter(|l| l.starts_with("--- ")).count() == 3
    });
    let snapshots: Vec<&[String]> = lines
        .split(|l| l.starts_with("--- ") && l.ends_with(" UTC ---"))
        .skip(1)
        .take(2)
        .collect();
    assert_eq!(snapshots.len(), 2, "{lines:?}");
    for s in snapshots {
        assert!(s[0].ends_with("occupancy 1"), "{lines:?}");
        assert!(
            s[2].starts_with("job:w") && s[2].contains(&pid),
            "{lines:?}"
        );
    }
    // --json: one object per line per snapshot
    let watch = shmlock(&file)
        .args(["inspect", "--json", "-w", "--interval", "0.1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = read_until(watch, |l| l.len() == 2);
    for line in lines {
        let json: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(json["holders"][0]["key"], "job:w");
        assert_eq!(json["holders"][0]["pid"], holder.id());
    }
    release(holder);
    // zero, and anything below 10 ms (1e-9 printed 48,000 tables in 10 s)
    for short in ["0", "1e-9", "0.005"] {
        for cmd in ["inspect", "stats"] {
            let out = output(shmlock(&file).args([cmd, "--interval", short]));
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(
                out.status.code(),
                Some(64),
                "{cmd} --interval {short}: {err}"
            );
            assert!(err.contains("at least 0.01"), "{err}");
        }
    }
}

/// Out of descriptors: `run` under limits that leave it one, two, ... descriptors short
/// exits 71 (EX_OSERR), whether it ran out opening the table or starting the command,
/// never 66 (the file) or 126 (the command).
#[test]
fn run_out_of_descriptors_exits_with_ex_oserr() {
    let file = TempPath::new("cli-emfile");
    let mut codes = Vec::new();
    for limit in 4..=12 {
        let mut c = Command::new("sh");
        c.arg("-c").arg(format!(
            "ulimit -n {limit}; exec \"$0\" --file \"$1\" run k -- true",
        ));
        c.arg(env!("CARGO_BIN_EXE_shmlock")).arg(&file.0);
        let code = code(&mut c);
        codes.push(code);
        if code == 0 {
            break;
        }
    }
    assert!(codes.contains(&71), "no limit was too small: {codes:?}");
    assert!(
        codes.iter().all(|&c| c == 71 || c == 0),
        "exit codes under descriptor limits: {codes:?}"
    );
}

#[test]
fn inspect_lists_every_shared_and_permit_holder_and_unlock_force_breaks_them_all() {
    let file = TempPath::new("cli-inspect-shared");
    let r1 = holding(&file, "conf", "sleep 30", &["-s"]);
    let r2 = holding(&file, "conf", "sleep 30", &["--shared"]);
    let p1 = holding(&file, "gpu", "sleep 30", &["--permits", "3"]);
    let table = LockTable::options().create(false).open(&file).unwrap();
    eventually("every holder holds", || table.holders().len() == 3);
    let json = inspect_json(&file, &[]);
    let holders = json["holders"].as_array().unwrap();
    let mut readers: Vec<u64> = holders
        .iter()
        .filter(|h| h["key"] == "conf")
        .map(|h| {
            assert_eq!(h["mode"], "shared", "{h}");
            assert!(h["permits"].is_null());
            h["pid"].as_u64().unwrap()
        })
        .collect();
    readers.sort_unstable();
    let mut want = vec![u64::from(r1.id()), u64::from(r2.id())];
    want.sort_unstable();
    assert_eq!(readers, want, "{json}");
    let permit = holders.iter().find(|h| h["key"] == "gpu").unwrap();
    assert_eq!(permit["mode"], "permit");
    assert_eq!(permit["permits"], 3);
    assert_eq!(permit["pid"], p1.id());
    let text = String::from_utf8(output(shmlock(&file).arg("inspect")).stdout).unwrap();
    assert!(text.contains("MODE") && text.contains("permit/3"), "{text}");
    assert_eq!(text.matches(" shared").count(), 2, "{text}");

    // one reader, by pid
    let one =
        output(shmlock(&file).args(["unlock", "--force", "--pid", &r1.id().to_string(), "conf"]));
    assert!(one.status.success(), "{one:?}");
    let said = String::from_utf8_lossy(&one.stdout);
    assert_eq!(said.lines().count(), 1, "{said}");
    assert!(
        said.contains(&format!("held shared by pid {}", r1.id())),
        "{said}"
    );
    assert!(
        table.is_locked("conf").unwrap(),
        "the other reader still holds"
    );
    let none = output(shmlock(&file).args(["unlock", "--force", "--pid", "1", "conf"]));
    assert_eq!(none.status.code(), Some(1), "{none:?}");
    // then every holder
    let broke = output(shmlock(&file).args(["unlock", "--force", "conf"]));
    assert!(broke.status.success(), "{broke:?}");
    assert!(String::from_utf8_lossy(&broke.stdout).contains(&format!("pid {}", r2.id())));
    assert!(!table.is_locked("conf").unwrap());
    assert!(table.is_locked("gpu").unwrap());
    for mut c in [r1, r2, p1] {
        c.kill().unwrap();
        c.wait().unwrap();
    }
}

/// Odd numbers and flock habits get the option's own words: `--max-time 1e19` panicked
/// (101) and ran nothing; a negative number got clap's tip to pass it after `--`, which
/// makes it the key or the command (`-inf`, `-.5` and `-1e-400` still did, and
/// `--permits -1` said 0 was allowed); `-u` and `--fcntl` were "unexpected arguments".
#[test]
fn odd_numbers_and_flock_habits_get_the_options_own_words() {
    let file = TempPath::new("cli-odd-numbers");
    let out = output(shmlock(&file).args(["run", "--max-time", "1e19", "k", "echo", "ran"]));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ran\n");
    for (args, says) in [
        (&["run", "-w", "-1", "k", "true"][..], "--timeout"),
        (&["run", "--exptime", "-1", "k", "true"], "--exptime"),
        (&["run", "--exptime", "1e12", "k", "true"], "--exptime"),
        (&["run", "--max-time", "-2", "k", "true"], "--max-time"),
        // (numbers clap does not take for negative ones)
        (&["run", "-w", "-inf", "k", "true"], "--timeout"),
        (&["run", "-w", "-.5", "k", "true"], "--timeout"),
        (&["run", "--exptime", "-1e-400", "k", "true"], "--exptime"),
        (&["run", "--permits", "-1", "k", "true"], "--permits"),
        (&["run", "--permits", "0", "k", "true"], "--permits"),
        (
            &["run", "-u", "k", "true"],
            "-u/--unlock has no meaning here",
        ),
        (
            &["run", "--fcntl", "k", "true"],
            "--fcntl has no meaning here",
        ),
        (&["unlock", "--force", "--pid", "-3", "k"], "--pid"),
        (&["inspect", "--interval", "-1"], "--interval"),
    ] {
        let out = output(shmlock(&file).args(args));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
        assert!(
            err.contains(says) && !err.contains("tip:"),
            "{args:?}: {err}"
        );
    }
}

/// `inspect`'s columns stay in line under keys whose characters are not one terminal
/// column each: a CJK key (two columns a character) pushed its row's PID two columns per
/// character to the right, and a combining accent (none) pulled it one to the left.
#[test]
fn inspect_columns_line_up_for_wide_and_combining_characters() {
    let file = TempPath::new("cli-wide-keys");
    let table = LockTable::open(&file, 16).unwrap();
    let keys = ["plain", "日本語キー", "e\u{301}te"];
    let _held: Vec<_> = keys
        .iter()
        .map(|k| table.lock(k, LockOptions::default()).unwrap())
        .collect();
    let out = output(shmlock(&file).arg("inspect"));
    let text = String::from_utf8(out.stdout).unwrap();
    let pid = std::process::id().to_string();
    // (the key column is 32 columns wide, then a space, then the PID right-aligned in 8)
    for (key, columns) in [("plain", 5), ("日本語キー", 10), ("e\u{301}te", 3)] {
        let row = text
            .lines()
            .find(|l| l.starts_with(key))
            .unwrap_or_else(|| panic!("no row for {key}: {text}"));
        let want = format!("{key}{} {pid:>8} ", " ".repeat(32 - columns));
        assert!(row.starts_with(&want), "{key:?}: {row:?}\n{text}");
    }
}

/// A key longer than its column is cut short with `…` within it: the columns after it
/// start where the header's do, in every row (a lock table's 32-byte preview, a dict's
/// whole key at 48 columns).
#[test]
fn inspect_cuts_a_long_key_to_its_column() {
    let file = TempPath::new("cli-long-key");
    let table = LockTable::open(&file, 16).unwrap();
    let long = "x".repeat(40);
    // 41 bytes: the stored preview of 32 ends inside the 16th "é"
    let accented = format!("y{}", "é".repeat(20));
    let _held: Vec<_> = [long.as_str(), "short", accented.as_str(), "rtl\u{202E}key"]
        .iter()
        .map(|k| table.lock(k, LockOptions::default()).unwrap())
        .collect();
    let text = String::from_utf8(output(shmlock(&file).arg("inspect")).stdout).unwrap();
    let pid = std::process::id().to_string();
    // where the PID column ends, in characters (each one column here)
    let end_of = |line: &str, field: &str| {
        let at = line
            .find(field)
            .unwrap_or_else(|| panic!("{field}: {text}"));
        line[..at].chars().count() + field.len()
    };
    let lines: Vec<&str> = text.lines().skip(1).collect();
    assert_eq!(lines.len(), 5, "{text}");
    // a right-to-left override would reorder the rest of its row on a terminal
    assert!(
        text.contains("rtl?key") && !text.contains('\u{202E}'),
        "{text}"
    );
    let header = end_of(lines[0], "PID");
    for row in &lines[1..] {
        assert_eq!(end_of(row, &pid), header, "{row:?}\n{text}");
    }
    let cut = format!("{}… ", "x".repeat(31));
    assert!(lines.iter().any(|l| l.starts_with(&cut)), "{text}");
    // a character the preview cuts is left out, not shown as a replacement character
    let cut = format!("y{}… ", "é".repeat(15));
    assert!(lines.iter().any(|l| l.starts_with(&cut)), "{text}");
    let json =
        String::from_utf8(output(shmlock(&file).args(["inspect", "--json"])).stdout).unwrap();
    assert!(json.contains(&format!("\"y{}\"", "é".repeat(15))), "{json}");
    assert!(
        !text.contains('\u{FFFD}') && !json.contains('\u{FFFD}'),
        "{text}{json}"
    );

    let dict_file = TempPath::new("cli-long-dict-key");
    let dict = SharedDict::open(&dict_file, 16, 32).unwrap();
    dict.set("k".repeat(60), "v", Duration::ZERO).unwrap();
    dict.set("short", "v", Duration::ZERO).unwrap();
    let text = String::from_utf8(output(shmlock(&dict_file).arg("inspect")).stdout).unwrap();
    let lines: Vec<&str> = text.lines().skip(1).collect();
    assert_eq!(lines.len(), 3, "{text}");
    let header = end_of(lines[0], "KIND");
    for row in &lines[1..] {
        assert_eq!(end_of(row, "bytes"), header, "{row:?}\n{text}");
    }
}

/// While `run` waits for what its command left running, with stderr on a terminal, a
/// status line says why the key is still held, and by which processes; it is drawn again
/// when one of them exits, and erased at the end.
#[test]
fn a_status_line_shows_on_a_terminal_while_leftovers_hold_the_key() {
    let file = TempPath::new("cli-leftovers-line");
    let pids = TempPath::new("cli-leftovers-pids");
    let (master, slave) = wide_pty();
    let script = format!(
        "sleep 30 & a=$!; sleep 30 & echo $a $! > {}",
        pids.0.display()
    );
    let run = shmlock(&file)
        .args(["run", "k", "--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(slave))
        .spawn()
        .unwrap();
    // (EIO once every copy of the slave is closed: run and the sleeps exited)
    let (rx, reader) = read_pty(master);
    let left = line_written(&pids);
    let left: Vec<i32> = left.split(' ').map(|p| p.parse().unwrap()).collect();
    let mut seen = Vec::new();
    let mut read_until = |expected: &str| pty_until(&rx, &mut seen, expected);
    read_until(&format!(
        "\r\x1b[2Kshmlock: \"k\" held until what sh left running exits: pids {} {} (sh \
         exited, status 0; -o releases at its exit)",
        left[0].min(left[1]),
        left[0].max(left[1])
    ));
    let kill = |pid: i32| {
        let pid = nix::unistd::Pid::from_raw(pid);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
    };
    kill(left[0]);
    read_until(&format!(
        "\r\x1b[2Kshmlock: \"k\" held until what sh left running exits: pid {} (sh",
        left[1]
    ));
    assert!(is_held(&file, "k"));
    kill(left[1]);
    let out = run.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    reader.join().unwrap();
    seen.extend(rx.try_iter().flatten());
    let text = String::from_utf8_lossy(&seen).into_owned();
    assert!(text.ends_with("\r\x1b[2K"), "{text:?}");
    assert!(!text.contains('\n'), "{text:?}");
    assert!(!is_held(&file, "k"));
}

/// A `--verbose` line written while the status line is shown (here: a signal passed on to
/// what the command left running) takes the status line's place instead of being written
/// into it, and the status line is drawn again below it.
#[test]
fn a_verbose_line_replaces_the_status_line_and_it_comes_back() {
    let file = TempPath::new("cli-verbose-over-line");
    let pids = TempPath::new("cli-verbose-over-line-pid");
    let (master, slave) = wide_pty();
    // (the sleep ignores SIGTERM, as the shell set it before starting it)
    let script = format!("trap '' TERM; sleep 30 & echo $! > {}", pids.0.display());
    let run = shmlock(&file)
        .args(["run", "--verbose", "k", "--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(slave))
        .spawn()
        .unwrap();
    let (rx, reader) = read_pty(master);
    let left: i32 = line_written(&pids).parse().unwrap();
    let mut seen = Vec::new();
    let mut read_until = |expected: &str| pty_until(&rx, &mut seen, expected);
    let line = format!("shmlock: \"k\" held until what sh left running exits: pid {left} (sh");
    read_until(&line);
    let run_pid = nix::unistd::Pid::from_raw(run.id() as i32);
    nix::sys::signal::kill(run_pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let passing = format!("shmlock: passing SIGTERM on to pid {left}\r\n"); // (the pty makes \\n \\r\\n)
    let (text, at) = read_until(&passing);
    assert!(text[..at].ends_with("\r\x1b[2K"), "{text:?}");
    // drawn again after it
    let (text, again) = read_until(&format!("{passing}\r\x1b[2K{line}"));
    assert_eq!(again, at, "{text:?}");
    assert!(is_held(&file, "k"));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(left),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let out = run.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    reader.join().unwrap();
    assert!(!is_held(&file, "k"));
}

/// A pty 400 columns wide, so that a status line is not cut to the terminal's width.
fn wide_pty() -> (std::os::fd::OwnedFd, std::os::fd::OwnedFd) {
    use std::os::fd::AsRawFd;
    let (master, slave) = cloexec_pty();
    let size = libc::winsize {
        ws_row: 24,
        ws_col: 400,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize from the struct, which lives across the call.
    let set = unsafe { libc::ioctl(slave.as_raw_fd(), libc::TIOCSWINSZ, &size) };
    assert_eq!(set, 0, "{}", std::io::Error::last_os_error());
    (master, slave)
}

/// Adds what `rx` (from [`read_pty`]) sends to `seen` until its text holds `expected` (10 s
/// at most): that text, and where `expected` starts in it.
fn pty_until(
    rx: &std::sync::mpsc::Receiver<Vec<u8>>,
    seen: &mut Vec<u8>,
    expected: &str,
) -> (String, usize) {
    pty_until_from(rx, seen, expected, 0)
}

/// [`pty_until`] for an `expected` that starts at `from` or later in the text.
fn pty_until_from(
    rx: &std::sync::mpsc::Receiver<Vec<u8>>,
    seen: &mut Vec<u8>,
    expected: &str,
    from: usize,
) -> (String, usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = String::from_utf8_lossy(seen).into_owned();
        if let Some(at) = text.get(from..).and_then(|t| t.find(expected)) {
            return (text, from + at);
        }
        let wait = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(wait) {
            Ok(chunk) => seen.extend(chunk),
            Err(_) => panic!("no {expected:?} in {text:?}"),
        }
    }
}

/// Reads the pty `master` on a thread, sending what it reads, until every copy of the slave
/// is closed (EIO); the thread's handle, to join.
fn read_pty(
    master: std::os::fd::OwnedFd,
) -> (
    std::sync::mpsc::Receiver<Vec<u8>>,
    std::thread::JoinHandle<()>,
) {
    use std::io::Read;
    let mut master = std::fs::File::from(master);
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut buf = [0; 4096];
        while let Ok(n @ 1..) = master.read(&mut buf) {
            if tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    (rx, reader)
}

/// A pseudo-terminal's master and slave, both close-on-exec from the start (openpty's are
/// not: a child would keep the master open, and the terminal would not hang up when the
/// test closes it).
fn cloexec_pty() -> (std::os::fd::OwnedFd, std::os::fd::OwnedFd) {
    use nix::fcntl::OFlag;
    let flags = OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC;
    let master = nix::pty::posix_openpt(flags).unwrap();
    nix::pty::grantpt(&master).unwrap();
    nix::pty::unlockpt(&master).unwrap();
    let name = nix::pty::ptsname_r(&master).unwrap();
    let slave = nix::fcntl::open(name.as_str(), flags, nix::sys::stat::Mode::empty()).unwrap();
    (master.into(), slave)
}

/// `shmlock run k -- sh -c TRAPS`, its stdin the pty slave `tty`, started by a `sh -c
/// OUTER` that `pre_exec` makes a session leader with `tty` as its controlling terminal.
/// The command writes `hup` or `term` to `count` on each of those, and its parent's (run's)
/// pid to `ready` once its traps are set; OUTER finds `run --verbose`'s stderr in `$E`.
fn on_a_terminal(
    file: &TempPath,
    tty: std::os::fd::OwnedFd,
    outer: &str,
    [ready, count, said]: [&TempPath; 3],
) -> Child {
    let traps = r#"trap 'echo hup >> "$C"' HUP
trap 'echo term >> "$C"; exit 0' TERM
echo $PPID > "$R"
while :; do sleep 0.05; done"#;
    let mut c = Command::new("sh");
    c.args(["-c", outer])
        .env("SHMLOCK", env!("CARGO_BIN_EXE_shmlock"))
        .env("F", &file.0)
        .env("CMD", traps)
        .env("C", &count.0)
        .env("R", &ready.0)
        .env("E", &said.0)
        .stdin(Stdio::from(tty))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: setsid and ioctl are async-signal-safe; fd 0 is the pty slave by now.
    unsafe {
        c.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    c.spawn().unwrap()
}

/// The kernel's SIGHUP reaches the command once, as a terminal's Ctrl-C does: when the
/// session leader exits, the kernel sends it to the terminal's whole foreground process
/// group (run and its command here), and run does not pass it on again. When run is the
/// session leader, a hangup of the terminal signals run alone, and run passes it on.
/// (What run passes on is read from its `--verbose` lines: a second SIGHUP sent while the
/// first is still pending at the command merges with it, so the command's trap cannot
/// count it.)
#[test]
fn a_terminal_hangup_reaches_the_command_once() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    // the session leader (a shell that started run) exits once the command is ready
    let file = TempPath::new("cli-hup-leader");
    let ready = TempPath::new("cli-hup-leader-ready");
    let count = TempPath::new("cli-hup-leader-count");
    let said = TempPath::new("cli-hup-leader-said");
    let (master, slave) = cloexec_pty();
    let outer = r#""$SHMLOCK" --file "$F" run --verbose k -- sh -c "$CMD" 2> "$E" &
while [ ! -s "$R" ]; do sleep 0.05; done"#;
    let mut leader = on_a_terminal(&file, slave, outer, [&ready, &count, &said]);
    let run: i32 = line_written(&ready).parse().unwrap();
    assert!(leader.wait().unwrap().success());
    // (the kernel's SIGHUP is pending at run by now, and a lower signal than SIGTERM:
    // run takes it first, and passes SIGTERM on after whatever it did with it)
    kill(Pid::from_raw(run), Signal::SIGTERM).unwrap();
    eventually("the command got SIGTERM", || {
        std::fs::read_to_string(&count).is_ok_and(|s| s.ends_with("term\n"))
    });
    assert_eq!(std::fs::read_to_string(&count).unwrap(), "hup\nterm\n");
    eventually("the key is free", || !is_held(&file, "k"));
    let passed = std::fs::read_to_string(&said).unwrap();
    assert!(passed.contains("passing SIGTERM on"), "{passed}");
    assert!(!passed.contains("passing SIGHUP on"), "{passed}");
    drop(master);

    // run is the session leader: a hangup (the master closed) signals run only
    let file = TempPath::new("cli-hup-run");
    let ready = TempPath::new("cli-hup-run-ready");
    let count = TempPath::new("cli-hup-run-count");
    let said = TempPath::new("cli-hup-run-said");
    let (master, slave) = cloexec_pty();
    let outer = r#"exec "$SHMLOCK" --file "$F" run --verbose k -- sh -c "$CMD" 2> "$E""#;
    let run = on_a_terminal(&file, slave, outer, [&ready, &count, &said]);
    line_written(&ready);
    drop(master);
    eventually("the command got SIGHUP", || {
        std::fs::read_to_string(&count).is_ok_and(|s| s.ends_with("hup\n"))
    });
    kill(Pid::from_raw(run.id() as i32), Signal::SIGTERM).unwrap();
    let out = run.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(std::fs::read_to_string(&count).unwrap(), "hup\nterm\n");
    let passed = std::fs::read_to_string(&said).unwrap();
    assert!(passed.contains("passing SIGHUP on"), "{passed}");
}

/// `sh -c SCRIPT` with job control (`set -m`: each `&` job gets a process group of its own,
/// in the terminal's background) as the session leader of a new pty, with `env`; the
/// shell, and a thread that returns all the terminal showed once the shell has exited.
fn job_control_shell(
    script: &str,
    env: &[(&str, &std::ffi::OsStr)],
) -> (Child, std::thread::JoinHandle<String>) {
    let (shell, _keys, rx, reader) = job_control_shell_on_pty(script, env);
    let text = std::thread::spawn(move || {
        let seen: Vec<u8> = rx.iter().flatten().collect();
        reader.join().unwrap();
        String::from_utf8_lossy(&seen).into_owned()
    });
    (shell, text)
}

/// [`job_control_shell`] with the terminal's keyboard (the master, to type on) and what
/// its screen shows as it comes (see [`read_pty`]).
fn job_control_shell_on_pty(
    script: &str,
    env: &[(&str, &std::ffi::OsStr)],
) -> (
    Child,
    std::fs::File,
    std::sync::mpsc::Receiver<Vec<u8>>,
    std::thread::JoinHandle<()>,
) {
    let (master, slave) = cloexec_pty();
    let mut c = Command::new("sh");
    c.args(["-c", &format!("set -m; stty tostop\n{script}")])
        .env("SHMLOCK", env!("CARGO_BIN_EXE_shmlock"))
        .envs(env.iter().copied())
        .stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave));
    // SAFETY: setsid and ioctl are async-signal-safe; fd 0 is the pty slave by now.
    unsafe {
        c.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let shell = c.spawn().unwrap();
    drop(c); // (the Command's copies of the slave)
    let keys = std::fs::File::from(master.try_clone().unwrap());
    let (rx, reader) = read_pty(master);
    (shell, keys, rx, reader)
}

/// A `run` in the background of its terminal, under `stty tostop`, draws no status line:
/// it would be drawn over the foreground, and its write would stop the job (`run` with
/// it: the lease could lapse meanwhile). It waits for the key, gets it when the holder
/// lets go, and exits 0. (Before, it was stopped at its first status line: the shell's
/// `wait` said 150, 128 + SIGTTOU.)
#[test]
fn a_background_run_under_tostop_draws_no_status_line_and_is_not_stopped() {
    let file = TempPath::new("cli-tostop");
    let go = TempPath::new("cli-tostop-go");
    let holder = held_until_stdin_closes(&file, "k");
    let script = r#""$SHMLOCK" --file "$F" run k -- true & job=$!
while [ ! -e "$G" ]; do sleep 0.05; done
wait $job; echo "exit $?""#;
    let env = [("F", file.0.as_os_str()), ("G", go.0.as_os_str())];
    let (mut shell, text) = job_control_shell(script, &env);
    // the background run waits (several status line slices), then the holder lets go
    eventually("the background run waits", || someone_waits(&file, "k"));
    std::thread::sleep(Duration::from_millis(600));
    release(holder);
    std::fs::write(&go, "").unwrap();
    assert!(shell.wait().unwrap().success());
    let text = text.join().unwrap();
    assert!(text.contains("exit 0"), "{text:?}");
    assert!(!text.contains("waiting for"), "{text:?}");
}

/// Ctrl-Z while `run` waits: the status line is erased before `run` stops (the terminal's
/// `^Z` and what the shell says come on a clean line, not at the end of the line), the job
/// is stopped as by SIGTSTP (status 128 + 20), and once in the foreground again (`fg`)
/// `run` draws its line again, gets the key when the holder lets go and exits 0. (Before,
/// the line was left on the screen with `^Z` at its end.)
#[test]
fn ctrl_z_while_waiting_erases_the_status_line_then_stops_run() {
    use std::io::Write;
    let file = TempPath::new("cli-ctrl-z");
    let holder = held_until_stdin_closes(&file, "k");
    let script = r#""$SHMLOCK" --file "$F" run k -- true; echo "stopped $?"
fg %1 > /dev/null; echo "exit $?""#;
    let env = [("F", file.0.as_os_str())];
    let (mut shell, mut keys, rx, reader) = job_control_shell_on_pty(script, &env);
    let mut seen = Vec::new();
    pty_until(&rx, &mut seen, "waiting for");
    keys.write_all(b"\x1a").unwrap();
    let (text, at) = pty_until(&rx, &mut seen, "stopped ");
    let before = &text[..at];
    let line = before.rfind("waiting for").unwrap();
    assert!(
        before[line..].contains("\r\x1b[2K"),
        "the status line was left on the screen: {:?}",
        &before[line..]
    );
    let (_, stopped) = pty_until(&rx, &mut seen, "stopped 148");
    // back in the foreground, it draws its line again
    pty_until_from(&rx, &mut seen, "waiting for", stopped);
    release(holder);
    pty_until_from(&rx, &mut seen, "exit 0", stopped);
    drop(keys);
    assert!(shell.wait().unwrap().success());
    drop(rx);
    let _ = reader.join();
    assert!(!is_held(&file, "k"));
}

/// Job control is as without `run`: a command that writes to the terminal from the
/// background under `stty tostop` stops its job, and `run` with it, so that the shell says
/// the job stopped (with `run` not stopping, the shell said it ran, and bash's `fg`, which
/// sends no SIGCONT to a running job, hung holding the key). Brought to the foreground, it
/// ends.
#[test]
fn a_background_command_writing_under_tostop_stops_its_job_run_included() {
    let file = TempPath::new("cli-tostop-cmd");
    let script = r#""$SHMLOCK" --file "$F" run k -- sh -c 'echo said-hi' & job=$!
i=0; while jobs > "$J" && ! grep -q Stopped "$J" && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done
jobs; ps -o stat= -p $job
fg %1 > /dev/null; echo "exit $?""#;
    let jobs = TempPath::new("cli-tostop-jobs");
    let env = [("F", file.0.as_os_str()), ("J", jobs.0.as_os_str())];
    let (mut shell, text) = job_control_shell(script, &env);
    assert!(shell.wait().unwrap().success());
    let text = text.join().unwrap();
    assert!(text.contains("Stopped"), "{text:?}");
    assert!(
        text.contains("said-hi") && text.contains("exit 0"),
        "{text:?}"
    );
    assert!(!is_held(&file, "k"));
}

/// Keys and commands are bytes, as flock(1)'s file names and commands are: a key that is
/// not UTF-8 is taken (the library's and `unlock --hex`'s keys are any bytes), passed in
/// `$SHMLOCK_KEY` as it was given, and a second `run -n` on it finds it held; a command's
/// arguments reach it unchanged. (Both were refused: "invalid UTF-8 was detected".)
#[test]
fn keys_and_commands_that_are_not_utf8_run_as_given() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let file = TempPath::new("cli-bytes");
    let key = OsStr::from_bytes(b"\xff\xfe job");
    let out = output(
        shmlock(&file)
            .arg("run")
            .arg(key)
            .args([
                "--",
                "sh",
                "-c",
                "printf '%s' \"$SHMLOCK_KEY\"; printf '|%s' \"$1\"",
                "sh",
            ])
            .arg(OsStr::from_bytes(b"a\xffb")),
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(out.stdout, b"\xff\xfe job|a\xffb");
    // held by one run, the other finds it held (exit 1), and the library sees the bytes
    let mut holder = shmlock(&file)
        .arg("run")
        .arg(key)
        .args(["--", "sleep", "30"])
        .spawn()
        .unwrap();
    let table = LockTable::open(&file, 64).unwrap();
    eventually("the run holds the key", || {
        table.is_locked(b"\xff\xfe job").unwrap()
    });
    let again = output(shmlock(&file).args(["run", "-n"]).arg(key).arg("true"));
    assert_eq!(again.status.code(), Some(1), "{again:?}");
    holder.kill().unwrap();
    holder.wait().unwrap();
}

/// `inspect`'s header shows the file's path as it shows keys: a control character (an
/// escape sequence in a name) as `?`, never raw to the terminal.
#[test]
fn inspect_shows_a_path_with_control_characters_as_it_shows_keys() {
    let base = TempPath::new("cli-path");
    let file = TempPath(std::path::PathBuf::from(format!(
        "{}\x1b[2J",
        base.0.display()
    )));
    assert_eq!(code(shmlock(&file).arg("create")), 0);
    for args in [&["inspect"][..], &["inspect", "--all"]] {
        let out = output(shmlock(&file).args(args));
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(!text.contains('\x1b'), "{text:?}");
        assert!(
            text.starts_with(&format!("{}?[2J: format", base.0.display())),
            "{text:?}"
        );
    }
}

/// A usage error of `run` is said (64) before the table is opened: no file is made at a
/// path where there was none, and a file that is no table does not turn it into 65.
/// `unlock --force` of an empty key is a usage error too, and of a key in a table that
/// does not exist says there is no table there yet.
#[test]
fn usage_errors_are_said_before_a_table_is_made_or_read() {
    let missing = TempPath::new("cli-usage-none");
    let text = TempPath::new("cli-usage-text");
    std::fs::write(&text, "not a table\n").unwrap();
    for args in [
        &["run", "-F", "k", "--", "true"][..],
        &["run", "--exptime", "0.01", "k", "--", "true"],
        &["run", "-w", "-1", "k", "--", "true"],
        &["run", "-w", "nan", "k", "--", "true"],
        &["run", "--max-time", "0", "k", "--", "true"],
        &["run", "", "--", "true"],
        &["unlock", "--force", ""],
    ] {
        for file in [&missing, &text] {
            let out = output(shmlock(file).args(args));
            assert_eq!(
                out.status.code(),
                Some(64),
                "{args:?} on {:?}: {out:?}",
                file.0
            );
        }
        assert!(
            !missing.0.exists(),
            "{args:?} made a table at {:?}",
            missing.0
        );
    }
    let out = output(shmlock(&missing).args(["unlock", "--force", "k"]));
    assert_eq!(out.status.code(), Some(66), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("no table there yet"), "{said}");
}
