//! `shmlock --redis`: inspect with hostile data and a password, and `run` stopping its
//! command when the lease cannot be kept (a server restarted empty, a server gone, and
//! --max-time).

mod common;

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::redis_server::{eventually, RedisServer};
use shmlock::{Lock, LockOptions, RedisLocks};

fn shmlock(url: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_shmlock"));
    c.env_remove("SHMLOCK_FILE")
        .env_remove("REDISCLI_AUTH")
        .args(["--redis", url])
        .stdin(Stdio::null());
    c
}

fn output(c: &mut Command) -> Output {
    c.output().unwrap()
}

#[test]
fn inspect_shows_holders_escapes_keys_redacts_the_password_and_survives_garbage() {
    let server = RedisServer::start_with(&["--requirepass", "s3cret-pw"]);
    let url = format!("redis://:s3cret-pw@127.0.0.1:{}/", server.port);
    let bare = format!("redis://127.0.0.1:{}/", server.port);
    let redis = RedisLocks::open(&url).unwrap();
    let mut job = Lock::new(&redis, LockOptions::default()).unwrap();
    job.lock("job").unwrap();
    let token = job.try_token().unwrap();
    let evil = redis
        .lock("evil\x1b[2J\x07", LockOptions::default())
        .unwrap();
    let garbled = redis.lock("garbled", LockOptions::default()).unwrap();
    // someone else's writes: a fence counter that is no number, a lock value of another
    // format
    let cli = |args: &[&str]| {
        let mut all = vec!["-a", "s3cret-pw", "--no-auth-warning"];
        all.extend(args);
        server.cli(&all)
    };
    cli(&["SET", "shmlock:{garbled}:fence", "not a number"]);
    cli(&["SET", "shmlock:{foreign}", "written by another tool"]);

    let text = output(shmlock(&url).arg("inspect"));
    assert!(text.status.success(), "{text:?}");
    let stdout = String::from_utf8(text.stdout).unwrap();
    assert!(!stdout.contains("s3cret-pw"), "{stdout}");
    assert!(
        stdout.starts_with(&format!(
            "redis://:***@127.0.0.1:{}/: 4 locks held",
            server.port
        )),
        "{stdout}"
    );
    assert!(
        !stdout.contains(['\x1b', '\x07']),
        "raw control bytes: {stdout:?}"
    );
    assert!(stdout.contains("evil?[2J?"), "{stdout}");
    let line = |key: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(key))
            .unwrap_or_else(|| panic!("no {key}: {stdout}"))
            .to_string()
    };
    let ours = format!(":{}", std::process::id());
    assert!(line("job ").contains(&ours), "{stdout}");
    assert!(
        line("job ").ends_with(&format!(" {token}  exclusive")),
        "{stdout}"
    );
    assert!(line("garbled").contains(&ours), "{stdout}");
    assert!(line("foreign").contains(" ? "), "{stdout}");

    let json = output(shmlock(&url).args(["inspect", "--json"]));
    assert!(json.status.success());
    let json = String::from_utf8(json.stdout).unwrap();
    assert!(!json.contains("s3cret-pw"), "{json}");
    let parsed: serde_json::Value =
        serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"));
    assert!(parsed["redis"].as_str().unwrap().contains("***"), "{json}");
    let by_key = |k: &str| {
        parsed["holders"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["key"] == k)
            .unwrap_or_else(|| panic!("no {k:?} in {json}"))
            .clone()
    };
    // control characters come through JSON escaped, and nothing else is lost
    assert_eq!(
        by_key("evil\u{1b}[2J\u{7}")["key_hex"],
        "6576696c1b5b324a07"
    );
    let shown = by_key("job");
    assert_eq!(shown["key_hex"], "6a6f62");
    assert!(
        shown["ttl_ms"].is_u64() && shown["age_ms"].is_u64(),
        "{json}"
    );
    assert_eq!(shown["token"], token);
    assert_eq!(shown["holder_token"], token);
    assert!(shown["host"].is_string(), "{json}");
    assert_eq!(shown["pid"], std::process::id());
    // (a single server: no node to name; it was "")
    assert_eq!(shown["node"], serde_json::Value::Null, "{json}");
    let shown = by_key("garbled");
    assert_eq!(shown["key_hex"], "676172626c6564");
    assert_eq!(shown["token"], serde_json::Value::Null);
    assert_eq!(shown["holder_token"], serde_json::Value::Null);

    // the password from the environment, as redis-cli takes it
    let from_env = output(
        shmlock(&bare)
            .env("REDISCLI_AUTH", "s3cret-pw")
            .arg("inspect"),
    );
    assert!(from_env.status.success(), "{from_env:?}");
    let no_password = output(shmlock(&bare).arg("inspect"));
    assert_eq!(no_password.status.code(), Some(69)); // EX_UNAVAILABLE
    assert_eq!(
        String::from_utf8_lossy(&no_password.stderr).lines().count(),
        1
    );
    drop((evil, garbled));
    job.unlock().unwrap();
}

/// Starts `shmlock run KEY -- sleep 30` with these options and waits until it holds KEY.
fn run_sleeping(url: &str, key: &str, opts: &[&str]) -> Child {
    let redis = RedisLocks::open(url).unwrap();
    let child = shmlock(url)
        .arg("run")
        .args(opts)
        .args([key, "--", "sleep", "30"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    eventually("the run holds its key", Duration::from_secs(10), || {
        redis.is_locked(key).unwrap()
    });
    child
}

/// Waits for `child` (at most 10 s): its exit code, stderr and how long it took.
fn finish(child: Child, since: Instant) -> (Option<i32>, String, Duration) {
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        since.elapsed(),
    )
}

#[test]
fn run_stops_its_command_when_a_server_restarts_empty() {
    let mut server = RedisServer::start();
    let run = run_sleeping(&server.url(), "job", &["--exptime", "1.5"]);
    let since = Instant::now();
    server.restart(); // empty: the hold is gone
    let (code, stderr, took) = finish(run, since);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("lost the lock on \"job\"; command terminated"),
        "{stderr}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
}

#[test]
fn run_stops_its_command_before_an_unrenewed_lease_could_lapse() {
    let mut server = RedisServer::start();
    let run = run_sleeping(&server.url(), "job", &["--exptime", "3"]);
    let since = Instant::now();
    server.stop(); // no renewal gets through any more
    let (code, stderr, took) = finish(run, since);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("could not renew the lock on \"job\" in time; command terminated"),
        "{stderr}"
    );
    // the last renewal was at most 1 s before the stop; the lease would end 3 s after it,
    // and the command is stopped 0.3 s before that (at 1.7-2.7 s: with a lease of 1.5 s,
    // a busy machine's exit and reaping had 0.15 s in the worst case)
    assert!(took < Duration::from_millis(3000), "{took:?}");
}

#[test]
fn run_max_time_stops_a_command_that_runs_too_long() {
    let server = RedisServer::start();
    let started = Instant::now();
    let run = run_sleeping(
        &server.url(),
        "job",
        &["--exptime", "5", "--max-time", "0.5"],
    );
    let (code, stderr, took) = finish(run, started);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("\"job\" held for --max-time; command terminated"),
        "{stderr}"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(!RedisLocks::open(&server.url())
        .unwrap()
        .is_locked("job")
        .unwrap());
}

#[test]
fn run_shared_and_permits_on_redis_and_inspect_shows_their_mode() {
    let server = RedisServer::start();
    let url = server.url();
    let redis = RedisLocks::open(&url).unwrap();
    // two readers at once, each a `run -s` holding the key
    let readers: Vec<Child> = (0..2)
        .map(|_| {
            shmlock(&url)
                .args(["run", "-s", "--exptime", "3", "cfg", "--", "sleep", "30"])
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    eventually("two readers in", Duration::from_secs(10), || {
        redis
            .holders()
            .unwrap()
            .iter()
            .filter(|h| h.key == b"cfg" && h.mode == shmlock::HoldMode::Shared)
            .count()
            == 2
    });
    // a writer cannot get in; a third reader can
    let w = output(shmlock(&url).args(["run", "-n", "cfg", "--", "true"]));
    assert_eq!(w.status.code(), Some(1), "{w:?}");
    let r = output(shmlock(&url).args(["run", "-s", "-n", "cfg", "--", "true"]));
    assert_eq!(r.status.code(), Some(0), "{r:?}");
    // a jobserver of 1: a second `--permits 1` waits its turn, another count is refused
    let job = shmlock(&url)
        .args(["run", "--permits", "1", "gpu", "--", "sleep", "30"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    eventually("the permit held", Duration::from_secs(10), || {
        redis.is_locked("gpu").unwrap()
    });
    let busy = output(shmlock(&url).args(["run", "--permits", "1", "-n", "gpu", "--", "true"]));
    assert_eq!(busy.status.code(), Some(1), "{busy:?}");
    let other = output(shmlock(&url).args(["run", "--permits", "2", "-n", "gpu", "--", "true"]));
    assert_eq!(other.status.code(), Some(64), "{other:?}");
    assert!(
        String::from_utf8_lossy(&other.stderr).contains("permits"),
        "{other:?}"
    );
    let zero = output(shmlock(&url).args(["run", "--permits", "0", "gpu", "--", "true"]));
    assert_eq!(zero.status.code(), Some(64), "{zero:?}");
    // inspect lists every holder with its mode
    let text = output(shmlock(&url).arg("inspect"));
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    assert!(text.contains("MODE"), "{text}");
    assert_eq!(
        text.lines().filter(|l| l.starts_with("cfg ")).count(),
        2,
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("gpu ") && l.ends_with("permit/1")),
        "{text}"
    );
    let json = output(shmlock(&url).args(["inspect", "--json"]));
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let modes: Vec<(String, String, Option<u64>)> = v["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["key"].as_str().unwrap().to_string(),
                h["mode"].as_str().unwrap().to_string(),
                h["permits"].as_u64(),
            )
        })
        .collect();
    assert!(
        modes.contains(&("gpu".into(), "permit".into(), Some(1))),
        "{modes:?}"
    );
    assert_eq!(
        modes
            .iter()
            .filter(|m| m.0 == "cfg" && m.1 == "shared")
            .count(),
        2,
        "{modes:?}"
    );
    // unlock --force --pid breaks one reader (named by the pid of its `shmlock run`), then
    // unlock --force the other: each run stops its command
    let mut readers = readers;
    let first = readers.remove(0);
    let pid = first.id().to_string();
    let other_host = output(shmlock(&url).args([
        "unlock",
        "--force",
        "--pid",
        &pid,
        "--host",
        "elsewhere",
        "cfg",
    ]));
    assert_eq!(other_host.status.code(), Some(1), "{other_host:?}");
    let one = output(shmlock(&url).args(["unlock", "--force", "--pid", &pid, "cfg"]));
    assert_eq!(one.status.code(), Some(0), "{one:?}");
    let (code, stderr, _) = finish(first, Instant::now());
    assert_eq!(code, Some(2), "{stderr}");
    let left = redis.holders().unwrap();
    assert_eq!(
        left.iter().filter(|h| h.key == b"cfg").count(),
        1,
        "{left:?}"
    );
    let broken = output(shmlock(&url).args(["unlock", "--force", "cfg"]));
    assert_eq!(broken.status.code(), Some(0), "{broken:?}");
    for r in readers {
        let (code, stderr, _) = finish(r, Instant::now());
        assert_eq!(code, Some(2), "{stderr}");
    }
    let mut job = job;
    job.kill().unwrap();
    job.wait().unwrap();
}

/// A `--redis` that is no Redis URL is a usage error (64), not "unavailable" (69); an
/// error from a server names it, as a file's errors name the file, with its password
/// redacted: in each subcommand, and in a renewal's warning.
#[test]
fn a_malformed_url_is_a_usage_error_and_redis_errors_name_the_server() {
    let subcommands: [&[&str]; 3] = [
        &["inspect"],
        &["run", "k", "true"],
        &["unlock", "--force", "k"],
    ];
    for bad in [
        "notaurl",
        "http://127.0.0.1:6379/",
        "redis://127.0.0.1:notaport/",
        "redis://:s3cret@/",
    ] {
        for args in subcommands {
            let out = output(shmlock(bad).args(args));
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(64), "{bad} {args:?}: {err}");
            assert_eq!(err.lines().count(), 1, "{bad} {args:?}: {err}");
            assert!(
                err.contains("is not a Redis URL") && err.contains("redis://"),
                "{bad} {args:?}: {err}"
            );
            assert!(!err.contains("s3cret"), "{bad} {args:?}: {err}");
        }
    }
    // nothing listens on port 1
    let down = "redis://:s3cret@127.0.0.1:1/";
    for args in subcommands {
        let out = output(shmlock(down).args(args));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(69), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.starts_with("shmlock: redis://:***@127.0.0.1:1/: "),
            "{args:?}: {err}"
        );
        assert!(!err.contains("s3cret"), "{args:?}: {err}");
    }
    // a renewal that cannot get through says where it could not
    let mut server = RedisServer::start();
    let run = run_sleeping(&server.url(), "job", &["--exptime", "1.5"]);
    server.stop();
    let (code, stderr, _) = finish(run, Instant::now());
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("shmlock: renewing \"job\": {}: ", server.url())),
        "{stderr}"
    );
}

/// `unlock --force KEY` on Redis says whom it broke the key from, a line per hold as for a
/// table: the holder's pid and host, how long it held the key, and how (alone, shared, as
/// one of N permits); a value something else wrote is an unknown holder.
#[test]
fn unlock_force_says_whom_it_broke_the_key_from() {
    let server = RedisServer::start();
    let url = server.url();
    let redis = RedisLocks::open(&url).unwrap();
    let run = run_sleeping(&url, "job", &[]);
    let run_pid = run.id();
    let host = redis
        .holders()
        .unwrap()
        .into_iter()
        .find(|h| h.key == b"job")
        .and_then(|h| h.host)
        .expect("the run's host");
    std::thread::sleep(Duration::from_millis(100));
    let out = output(shmlock(&url).args(["unlock", "--force", "job"]));
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(said.lines().count(), 1, "{said}");
    let prefix = format!("broke \"job\": held by pid {run_pid} on {host}, for ");
    assert!(said.starts_with(&prefix), "{said}");
    let secs: f64 = said.trim()[prefix.len()..]
        .trim_end_matches('s')
        .parse()
        .unwrap_or_else(|e| panic!("{e}: {said}"));
    assert!(secs >= 0.1, "{said}");
    let (code, stderr, _) = finish(run, Instant::now());
    assert_eq!(code, Some(2), "{stderr}");

    // readers: a line each; a permit: its count
    let me = std::process::id();
    let long = Duration::from_secs(60);
    let r1 = redis.try_lock_shared("cfg", long).unwrap().unwrap();
    let r2 = redis.try_lock_shared("cfg", long).unwrap().unwrap();
    let out = output(shmlock(&url).args(["unlock", "--force", "cfg"]));
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let lines: Vec<&str> = said.lines().collect();
    assert_eq!(lines.len(), 2, "{said}");
    for line in lines {
        assert!(
            line.starts_with(&format!(
                "broke \"cfg\": held shared by pid {me} on {host}, for "
            )),
            "{said}"
        );
    }
    let sem = redis.semaphore("gpu", 2).unwrap();
    let permit = sem.try_acquire(long).unwrap().unwrap();
    let out = output(shmlock(&url).args(["unlock", "--force", "gpu"]));
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        said.starts_with(&format!(
            "broke \"gpu\": held as one of 2 permits by pid {me} on {host}, for "
        )),
        "{out:?}"
    );
    // a value written by something else
    server.cli(&["SET", "shmlock:{foreign}", "written by another tool"]);
    let out = output(shmlock(&url).args(["unlock", "--force", "foreign"]));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "broke \"foreign\": removed a string at shmlock:{foreign} (a value shmlock did not write)\n",
        "{out:?}"
    );
    // nothing left to break
    let out = output(shmlock(&url).args(["unlock", "--force", "cfg"]));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("\"cfg\" is not locked"));
    drop((r1, r2, permit));
}

/// Several `--redis` URLs without `--redis-cluster` or `--redis-sentinel` are a usage
/// error (64), not a command on the first URL alone (which, down here, failed with 69
/// although the second server was up).
#[test]
fn several_urls_without_a_topology_are_a_usage_error() {
    let server = RedisServer::start();
    let urls = format!("redis://127.0.0.1:1/,{}", server.url());
    for args in [
        &["run", "k", "true"][..],
        &["inspect"],
        &["unlock", "--force", "k"],
    ] {
        let out = output(shmlock(&urls).args(args));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.contains("--redis-cluster") && err.contains("--redis-sentinel"),
            "{args:?}: {err}"
        );
    }
}
/// `--redis-prefix` without `--redis` is a usage error (64): it was silently ignored.
#[test]
fn a_redis_prefix_without_redis_is_a_usage_error() {
    let missing = std::env::temp_dir().join(format!("shmlock-no-table-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_shmlock"))
        .env_remove("SHMLOCK_FILE")
        .args(["--redis-prefix", "foo:", "--file"])
        .arg(&missing)
        .arg("inspect")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(err.contains("--redis"), "{err}");
    assert!(!missing.exists());
}
/// A listener on a free port that accepts connections and, for each, does `serve` with it
/// on a thread of its own (the listener lives as long as the test process).
fn fake_server(serve: fn(std::net::TcpStream)) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in listener.incoming().flatten() {
            std::thread::spawn(move || serve(s));
        }
    });
    port
}

/// Accepts and never answers (as a stopped server's kernel does).
fn silent(s: std::net::TcpStream) {
    std::thread::sleep(Duration::from_secs(60));
    drop(s);
}

/// Answers whatever comes as an HTTP server does.
fn http(mut s: std::net::TcpStream) {
    use std::io::{Read, Write};
    let mut buf = [0u8; 1024];
    let _ = s.read(&mut buf);
    let _ = s.write_all(
        b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: 11\r\n\r\nBad Request",
    );
}

/// A server that accepts and never answers: the error says it did not answer in time and
/// names the limit (it said `Resource temporarily unavailable (os error 11)`).
#[test]
fn a_server_that_never_answers_is_said_to_have_not_answered_in_time() {
    let port = fake_server(silent);
    let url = format!("redis://:s3cret@127.0.0.1:{port}/");
    let started = Instant::now();
    let out = output(shmlock(&url).args(["run", "k", "true"]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(started.elapsed() < Duration::from_secs(15), "{err}");
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with(&format!("shmlock: redis://:***@127.0.0.1:{port}/: ")),
        "{err}"
    );
    assert!(err.contains("did not answer within 5s"), "{err}");
    assert!(
        !err.contains("os error 11") && !err.contains("s3cret"),
        "{err}"
    );
}

/// A server that is not Redis: one line that says so (the parser's error took several).
#[test]
fn a_server_that_is_not_redis_is_said_so_in_one_line() {
    let port = fake_server(http);
    let url = format!("redis://127.0.0.1:{port}/");
    for args in [&["run", "k", "true"][..], &["inspect"]] {
        let out = output(shmlock(&url).args(args));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(69), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.contains(&format!(
                "127.0.0.1:{port} does not speak the Redis protocol"
            )),
            "{args:?}: {err}"
        );
    }
}

/// `--redis-cluster` against a server that is no cluster node: `run` gives the server's
/// reason, as `inspect` did (`run` said `No connections found - ClusterConnectionNotFound`),
/// and says it is the flag that is wrong: a usage error (64), not an unreachable server (69).
#[test]
fn a_cluster_flag_on_a_plain_server_gives_the_servers_reason() {
    let server = RedisServer::start();
    for args in [
        &["run", "k", "true"][..],
        &["inspect"],
        &["unlock", "--force", "k"],
    ] {
        let out = output(shmlock(&server.url()).arg("--redis-cluster").args(args));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.contains("cluster support disabled")
                && err.contains("not a Redis Cluster node")
                && err.contains("without --redis-cluster")
                && !err.contains("RedisLocks"),
            "{args:?}: {err}"
        );
    }
}
/// A value something else wrote at a lock's Redis key, of a type shmlock never writes
/// there: `run` says which key holds what (65, not 69 "cannot reach Redis"), `inspect`
/// shows its type, and `unlock --force` says it removed it (it said "not locked", exit 1,
/// after deleting it).
#[test]
fn a_foreign_value_at_a_lock_key_is_named_and_removed_truthfully() {
    let server = RedisServer::start();
    let url = server.url();
    server.cli(&["LPUSH", "shmlock:{lst}", "x"]);
    let out = output(shmlock(&url).args(["run", "-n", "lst", "true"]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(65), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("\"lst\"") && err.contains("shmlock:{lst}") && err.contains("list"),
        "{err}"
    );

    let text = output(shmlock(&url).arg("inspect"));
    let stdout = String::from_utf8_lossy(&text.stdout);
    let row = stdout
        .lines()
        .find(|l| l.starts_with("lst "))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(row.ends_with(" list"), "{stdout}");
    let json = output(shmlock(&url).args(["inspect", "--json"]));
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let h = &v["holders"][0];
    assert_eq!(h["key"], "lst", "{v}");
    assert_eq!(h["foreign_type"], "list", "{v}");
    // a foreign value tells no mode (it said "exclusive")
    assert!(h["mode"].is_null(), "{v}");

    let out = output(shmlock(&url).args(["unlock", "--force", "lst"]));
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        said,
        "broke \"lst\": removed a list at shmlock:{lst} (a value shmlock did not write)\n"
    );
    assert_eq!(server.cli(&["EXISTS", "shmlock:{lst}"]).trim(), "0");

    // a string at the lock key that is not a hold's value, with no expiry: `run` waited on
    // it as on "an unknown process", silently and for ever (here until -w, which is only
    // there to end the test if it waits)
    server.cli(&["SET", "shmlock:{str}", "garbage"]);
    let out = output(shmlock(&url).args(["run", "-w", "60", "str", "true"]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(65), "{err}");
    assert!(
        err.contains("\"str\"") && err.contains("shmlock:{str}") && err.contains("string"),
        "{err}"
    );
    let text = output(shmlock(&url).arg("inspect"));
    let stdout = String::from_utf8_lossy(&text.stdout);
    let row = stdout.lines().find(|l| l.starts_with("str ")).unwrap();
    assert!(row.ends_with(" string"), "{stdout}");
    let out = output(shmlock(&url).args(["unlock", "--force", "str"]));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "broke \"str\": removed a string at shmlock:{str} (a value shmlock did not write)\n"
    );

    // a shared key's hash replaced by a string
    server.cli(&["SET", "shmlock:{shw}:shared", "notahash"]);
    let out = output(shmlock(&url).args(["run", "-s", "-n", "shw", "true"]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(65), "{err}");
    assert!(
        err.contains("\"shw\"") && err.contains("shmlock:{shw}:shared") && err.contains("string"),
        "{err}"
    );
}

/// A key a Redis Cluster cannot use (one that would empty its names' hash tag) is a usage
/// error, 64, as an empty or oversized key is (it fell through to 70, "an error shmlock did
/// not expect").
#[test]
fn a_key_a_cluster_cannot_use_is_a_usage_error() {
    let cluster = common::redis_server::ClusterSetup::start();
    let urls = cluster.urls().join(",");
    for args in [&["run", "}k", "true"][..], &["unlock", "--force", "}k"]] {
        let out = output(shmlock(&urls).arg("--redis-cluster").args(args));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
        assert!(err.contains("cannot be used"), "{args:?}: {err}");
    }
}

/// A `run` whose renewals hang on a silent link (a partition that keeps the connection
/// open: each renewal then takes two command timeouts, 10 s, longer than the lease) stops
/// its command when the lease could lapse, before the next holder starts, and exits 2.
/// The supervisor waited in the renewal: the command ran on beside the next holder, to
/// its end, and `run` exited with its status. A command that traps SIGTERM is killed
/// before the lease could lapse (it ran on for the 5 s before the SIGKILL).
#[test]
fn a_run_whose_renewals_hang_stops_its_command_before_the_next_holder_starts() {
    for trap in ["", "trap 'echo TERM >&2' TERM; "] {
        renewals_hang(trap);
    }
}

fn renewals_hang(trap: &str) {
    let server = RedisServer::start();
    let link = common::proxy::Proxy::start(server.port);
    let dir = std::env::temp_dir().join(format!("shmlock-run-hang-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let a_log = dir.join("a.log");
    let b_log = dir.join("b.log");
    // A stamps the time (ns, the realtime clock both read) every 20 ms while it runs.
    let mut a = shmlock(&link.url())
        .args(["run", "--exptime", "2", "job", "sh", "-c"])
        .arg(format!(
            "{trap}while :; do date +%s%N >> {}; sleep 0.02; done",
            a_log.display()
        ))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    eventually("A's command", Duration::from_secs(10), || a_log.exists());
    std::thread::sleep(Duration::from_millis(300));
    link.blackhole(true);
    let b = output(
        shmlock(&server.url())
            .args(["run", "-w", "30", "job", "sh", "-c"])
            .arg(format!("date +%s%N > {}", b_log.display())),
    );
    assert_eq!(b.status.code(), Some(0), "{b:?}");
    // (A's run then finishes its renewal in flight and its release without waiting out
    // their timeouts)
    link.blackhole(false);
    let a_exit = a.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut a.stderr.take().unwrap(), &mut stderr).unwrap();
    let stamps = |p: &std::path::Path| -> Vec<u128> {
        std::fs::read_to_string(p)
            .unwrap()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    };
    let a_last = *stamps(&a_log).iter().max().unwrap();
    let b_start = stamps(&b_log)[0];
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        a_last < b_start,
        "A's command ({trap:?}) ran {} ms beside B's; A: {a_exit:?} {stderr}",
        (a_last - b_start) / 1_000_000
    );
    assert_eq!(a_exit.code(), Some(2), "{stderr}");
    assert!(stderr.contains("could not renew"), "{stderr}");
}

/// A `run` cut off from its server for good (a partition that keeps the connection open)
/// exits 2 once it has stopped its command, without waiting out the renewal that hangs
/// (two command timeouts, 10 s) nor a release that would hang as long: the lease lapses
/// on its own within a tenth of it. It exited about 20 s after the stop.
#[test]
fn a_run_cut_off_for_good_exits_once_its_command_is_stopped() {
    let server = RedisServer::start();
    let link = common::proxy::Proxy::start(server.port);
    let started = std::env::temp_dir().join(format!("shmlock-run-cut-off-{}", std::process::id()));
    let _ = std::fs::remove_file(&started);
    let mut a = shmlock(&link.url())
        .args(["run", "--exptime", "2", "job", "sh", "-c"])
        .arg(format!("touch {}; sleep 60", started.display()))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    eventually("A's command", Duration::from_secs(10), || started.exists());
    link.blackhole(true);
    let cut = Instant::now();
    // (a hang guard far above the lease, and below the 20 s of the old wait)
    let exited = loop {
        if let Some(status) = a.try_wait().unwrap() {
            break status;
        }
        if cut.elapsed() > Duration::from_secs(12) {
            let _ = a.kill();
            let _ = a.wait();
            let _ = std::fs::remove_file(&started);
            panic!("run still waits {:?} after the cut", cut.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    link.blackhole(false);
    let _ = std::fs::remove_file(&started);
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut a.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(exited.code(), Some(2), "{stderr}");
    assert!(stderr.contains("could not renew"), "{stderr}");
    // the hold was left to its lease, which lapses on its own
    let direct = RedisLocks::open(&server.url()).unwrap();
    eventually("the lease lapsed", Duration::from_secs(10), || {
        !direct.is_locked("job").unwrap()
    });
}

/// The usage errors that need no server are said (64) without one: against a port where
/// nothing listens they are not turned into "connection refused" (69).
#[test]
fn usage_errors_need_no_server() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "redis://127.0.0.1:{}/",
        listener.local_addr().unwrap().port()
    );
    drop(listener); // (nothing listens there now)
    for args in [
        &["stats"][..],
        &["create"],
        &["inspect", "--all"],
        &["unlock", "k"],
        &["unlock", "--force", ""],
        &["run", "--exptime", "0.01", "k", "--", "true"],
        &["run", "", "--", "true"],
    ] {
        let out = output(shmlock(&url).args(args));
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
    }
    // (and one that needs the server says it is unreachable)
    let out = output(shmlock(&url).args(["inspect"]));
    assert_eq!(out.status.code(), Some(69), "{out:?}");
}
