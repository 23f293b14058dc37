//! Cache-stampede protection in a prefork HTTP server, measured by its own load client.
//!
//! A parent process forks N workers that accept on one listening socket and answer
//! `GET /item/<id>` from a cache (a [`SharedDict`] they all map) in front of a slow backend
//! (a sleep). When a popular item is missing, every request for it misses at once and
//! would call the backend: a *cache stampede*. With the lock
//! ([`SharedDict::get_or_fetch_with`], lua-resty-lock's recipe), one request per item, in
//! whichever worker, calls the backend; the others wait for the item's lock and then find
//! the value it stored. Without it (`--no-lock`: get, on a miss fetch and set) nearly
//! every request calls the backend.
//!
//! The default run fires 200 requests for 4 items at once, first with the lock, then
//! without it on a fresh cache, and compares the backend calls:
//!
//! ```sh
//! cargo run --release --example stampede_server
//! cargo run --release --example stampede_server -- --workers 8 --requests 500 --ids 10 --delay-ms 300
//! cargo run --release --example stampede_server -- --serve --port 8080   # then, elsewhere:
//! curl -i http://127.0.0.1:8080/item/42
//! ```
//!
//! Every response says where its value came from, in `X-Source`: `fetched` (this request
//! called the backend), `filled` (it waited for the lock and found the value another
//! request had stored meanwhile) or `cache` (a plain hit).

use std::collections::BTreeMap;
use std::error::Error;
use std::fmt::Display;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::ops::RangeInclusive;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use shmlock::{LockOptions, LockTable, SharedDict, Source};

type BoxError = Box<dyn Error + Send + Sync>;

/// The client's connect, read and write timeout: nothing in the demo can hang.
const NET_TIMEOUT: Duration = Duration::from_secs(30);
/// Failures kept word for word in a [`Report`] (all are counted).
const ERRORS_KEPT: usize = 5;

/// One round of the demo.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Worker processes.
    pub workers: usize,
    /// Requests the client fires at once.
    pub requests: usize,
    /// Distinct items they ask for: request `i` asks for item `i % ids`.
    pub ids: usize,
    /// How long one backend call takes.
    pub delay: Duration,
    /// How long a fetched value stays in the cache.
    pub ttl: Duration,
    /// Read through `get_or_fetch_with` (true), or get-fetch-set with no lock (false).
    pub lock: bool,
    /// The port to listen on, on 127.0.0.1 (0: any free one).
    pub port: u16,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            workers: 4,
            requests: 200,
            ids: 4,
            delay: Duration::from_millis(200),
            ttl: Duration::from_secs(60),
            lock: true,
            port: 0,
        }
    }
}

/// What one round saw.
#[derive(Debug)]
pub struct Report {
    /// Where the server listened.
    pub addr: SocketAddr,
    /// Requests fired.
    pub requests: usize,
    /// Requests answered 200.
    pub served: usize,
    /// Requests not answered 200: network errors, timeouts, 404s, 500s.
    pub failed: usize,
    /// 200 answers whose body was not the item's value.
    pub wrong_bodies: usize,
    /// The first few failures, as text.
    pub errors: Vec<String>,
    /// Backend calls per item id, as the workers counted them in the dict.
    pub calls: Vec<i64>,
    /// The latency of each 200 answer, sorted.
    pub latencies: Vec<Duration>,
    /// 200 answers by `X-Source`.
    pub sources: BTreeMap<String, usize>,
    /// From the start signal to the last answer.
    pub wall: Duration,
    /// Workers that had exited on their own (crashed) before the round stopped them.
    pub dead_workers: usize,
}

impl Report {
    /// All backend calls.
    pub fn total_calls(&self) -> i64 {
        self.calls.iter().sum()
    }

    /// The `p`th percentile latency of the 200 answers (nearest rank; zero if none).
    pub fn percentile(&self, p: f64) -> Duration {
        let n = self.latencies.len();
        if n == 0 {
            return Duration::ZERO;
        }
        let rank = ((p / 100.0 * n as f64).ceil() as usize).clamp(1, n);
        self.latencies[rank - 1]
    }

    /// How many 200 answers had this `X-Source`.
    pub fn source(&self, name: &str) -> usize {
        self.sources.get(name).copied().unwrap_or(0)
    }
}

/// One round: starts a server of `cfg.workers` processes on a fresh cache, fires
/// `cfg.requests` requests at it at once, stops it and reports.
///
/// It forks, so call it while the process has no other thread: a child is a copy of the
/// forking thread only, and a lock some other thread held would stay held in it forever.
pub fn run(cfg: &Config) -> Result<Report, Box<dyn Error>> {
    let server = Prefork::start(cfg)?;
    let (outcomes, wall) = fire(server.addr, cfg);
    let calls = (0..cfg.ids)
        .map(|id| backend_calls(&server.dict, &id.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    let addr = server.addr;
    let dead_workers = server.stop();

    let mut report = Report {
        addr,
        requests: cfg.requests,
        served: 0,
        failed: 0,
        wrong_bodies: 0,
        errors: Vec::new(),
        calls,
        latencies: Vec::new(),
        sources: BTreeMap::new(),
        wall,
        dead_workers,
    };
    for outcome in outcomes {
        let failure = match outcome.reply {
            Ok(reply) if reply.status == 200 => {
                report.served += 1;
                report.latencies.push(outcome.latency);
                let source = reply.source.unwrap_or_else(|| "(none)".to_owned());
                *report.sources.entry(source).or_default() += 1;
                if reply.body != item_value(&outcome.id.to_string()) {
                    report.wrong_bodies += 1;
                }
                continue;
            }
            Ok(reply) => format!(
                "item {}: HTTP {}: {}",
                outcome.id,
                reply.status,
                String::from_utf8_lossy(&reply.body).trim()
            ),
            Err(e) => format!("item {}: {e}", outcome.id),
        };
        report.failed += 1;
        if report.errors.len() < ERRORS_KEPT {
            report.errors.push(failure);
        }
    }
    report.latencies.sort();
    Ok(report)
}

// ---------------------------------------------------------------------------------------
// The server

/// A running server: the cache, the worker processes and the scratch directory of the
/// cache and lock files. Dropping it stops the workers, then removes the directory.
struct Prefork {
    addr: SocketAddr,
    dict: SharedDict,
    workers: Workers,
    // Declared last so it is dropped last, once no worker uses the files.
    _dir: ScratchDir,
}

impl Prefork {
    fn start(cfg: &Config) -> Result<Prefork, Box<dyn Error>> {
        let dir = ScratchDir::new()?;
        // Room for an item and a call counter per id, with values far below 256 bytes.
        let dict = SharedDict::open(dir.0.join("cache"), 4096, 256)?;
        let locks = LockTable::open(dir.0.join("locks"), 1024)?;
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, cfg.port))
            .map_err(|e| format!("cannot listen on 127.0.0.1:{}: {e}", cfg.port))?;
        deepen_backlog(&listener)?;
        let addr = listener.local_addr()?;
        let handler = Handler {
            dict: dict.clone(),
            locks,
            cfg: *cfg,
        };
        // The workers inherit the listening socket: the kernel hands each connection to
        // one of them. The parent's copy is closed when `listener` drops at the end.
        let workers = Workers::fork(cfg.workers, || serve(&listener, &handler))?;
        Ok(Prefork {
            addr,
            dict,
            workers,
            _dir: dir,
        })
    }

    /// Stops the workers; returns how many had crashed before.
    fn stop(mut self) -> usize {
        self.workers.stop()
    }
}

/// std listens with a backlog of 128 or so: 200 connections in the same millisecond
/// overflow it, and the overflow waits a second or more for a SYN retransmit, which is
/// noise in the latencies, not stampede. Listening again deepens the queue.
fn deepen_backlog(listener: &TcpListener) -> io::Result<()> {
    // SAFETY: listen() on a socket this process owns, open for the whole call.
    if unsafe { libc::listen(listener.as_raw_fd(), 4096) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A worker process's life: serve HTTP on the inherited socket until it is killed.
fn serve(listener: &TcpListener, handler: &Handler) -> i32 {
    let server = match listener.try_clone() {
        Ok(listener) => tiny_http::Server::from_listener(listener, None),
        Err(e) => Err(e.into()),
    };
    let server = match server {
        Ok(server) => server,
        Err(e) => {
            eprintln!("worker {}: cannot serve: {e}", std::process::id());
            return 1;
        }
    };
    for request in server.incoming_requests() {
        let handler = handler.clone();
        // A thread per request: a request waiting for the backend or for a lock must not
        // hold up the others, or the demo would measure queueing instead of the stampede.
        // (If the spawn fails, the request is dropped, which answers 500.)
        if let Err(e) = thread::Builder::new().spawn(move || handler.respond(request)) {
            eprintln!("worker {}: cannot start a thread: {e}", std::process::id());
        }
    }
    0
}

/// What a worker needs to answer a request.
#[derive(Clone)]
struct Handler {
    dict: SharedDict,
    locks: LockTable,
    cfg: Config,
}

impl Handler {
    fn respond(&self, request: tiny_http::Request) {
        let id = request
            .url()
            .strip_prefix("/item/")
            .filter(|id| is_item_id(id))
            .map(str::to_owned);
        let response = match (request.method(), id) {
            (tiny_http::Method::Get, Some(id)) => match self.item(&id) {
                Ok((value, source)) => tiny_http::Response::from_data(value)
                    .with_header(header("X-Source", source))
                    .with_header(header("Content-Type", "text/plain")),
                Err(e) => {
                    tiny_http::Response::from_string(format!("error: {e}\n")).with_status_code(500)
                }
            },
            _ => tiny_http::Response::from_string("not found: try GET /item/<id>\n")
                .with_status_code(404),
        };
        let _ = request.respond(response); // fails only if the client has gone
    }

    /// The item's value and where it came from.
    fn item(&self, id: &str) -> Result<(Vec<u8>, &'static str), BoxError> {
        let key = format!("item:{id}");
        if !self.cfg.lock {
            // The naive read: every request that misses calls the backend.
            if let Some(hit) = self.dict.get(&key)? {
                return Ok((bytes(&hit.value)?, "cache"));
            }
            let value = self.backend(id)?;
            self.dict.set(&key, &value, self.cfg.ttl)?;
            return Ok((value, "fetched"));
        }
        // The lease must outlast the slowest fetch, or a second request would take the
        // lock over and fetch too; waiters give up (500) after `timeout`.
        let lease = Duration::from_secs(10).max(self.cfg.delay * 10);
        let opts = LockOptions {
            exptime: lease,
            timeout: lease,
            ..LockOptions::default()
        };
        let got = self
            .dict
            .get_or_fetch_with(&self.locks, &key, self.cfg.ttl, &opts, || self.backend(id))?;
        let source = match got.source {
            Source::Cache => "cache",
            Source::Filled => "filled",
            Source::Fetched => "fetched",
        };
        Ok((bytes(&got.value)?, source))
    }

    /// The slow backend: counts its calls in the dict, where every process sees them.
    fn backend(&self, id: &str) -> Result<Vec<u8>, shmlock::Error> {
        self.dict
            .incr(format!("calls:{id}"), 1, Some(0), Duration::ZERO)?;
        thread::sleep(self.cfg.delay);
        Ok(item_value(id))
    }
}

/// What the backend answers for an item: the client checks every body against it.
fn item_value(id: &str) -> Vec<u8> {
    format!("value of item {id}\n").into_bytes()
}

/// Ids are short words, so that a key stays far below the dict's 250-byte limit.
fn is_item_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn bytes(value: &shmlock::Value) -> Result<Vec<u8>, BoxError> {
    Ok(value
        .as_bytes()
        .ok_or("the cached value is a number")?
        .to_vec())
}

fn header(name: &str, value: &str) -> tiny_http::Header {
    tiny_http::Header::from_bytes(name, value).expect("an ASCII header")
}

/// How many times the backend was called for `id` (zero if never).
fn backend_calls(dict: &SharedDict, id: &str) -> Result<i64, shmlock::Error> {
    Ok(dict
        .get(format!("calls:{id}"))?
        .and_then(|item| item.value.as_int())
        .unwrap_or(0))
}

// ---------------------------------------------------------------------------------------
// Processes and files

/// The forked workers. Dropping them stops them, so that they are reaped on every path.
struct Workers(Vec<libc::pid_t>);

impl Workers {
    /// Forks `n` children that run `child` and exit with its result (101 if it panics).
    fn fork(n: usize, child: impl Fn() -> i32) -> io::Result<Workers> {
        let mut workers = Workers(Vec::with_capacity(n));
        for _ in 0..n {
            // SAFETY: `run`'s caller has no other thread, so the child is a consistent
            // copy of the whole process; it runs `child` and leaves through `_exit`.
            match unsafe { libc::fork() } {
                // `workers` drops on the way out and stops those forked so far.
                -1 => return Err(io::Error::last_os_error()),
                0 => {
                    let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(&child))
                        .unwrap_or(101);
                    // SAFETY: _exit ends the child at once, without running the destructors
                    // of the parent's state it copied (which would remove the parent's
                    // scratch directory and stop the parent's workers).
                    unsafe { libc::_exit(code) };
                }
                pid => workers.0.push(pid),
            }
        }
        Ok(workers)
    }

    /// SIGTERM, then SIGKILL after 2 s, and reap all. Returns how many had already exited
    /// (crashed) before they were told to stop.
    fn stop(&mut self) -> usize {
        let mut crashed = 0;
        let mut running = Vec::new();
        for pid in self.0.drain(..) {
            if reaped(pid) {
                crashed += 1;
            } else {
                // SAFETY: kill() has no memory effects; `pid` is our unreaped child, so the
                // number cannot have been reused by another process.
                unsafe { libc::kill(pid, libc::SIGTERM) };
                running.push(pid);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while !running.is_empty() {
            running.retain(|&pid| !reaped(pid));
            if Instant::now() >= deadline {
                for &pid in &running {
                    // SAFETY: as above: our unreaped child.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    let mut status = 0;
                    // SAFETY: waiting for our own child; `status` is a valid out-pointer.
                    while unsafe { libc::waitpid(pid, &mut status, 0) } == -1
                        && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
                    {
                    }
                }
                break;
            }
            thread::sleep(Duration::from_millis(5));
        }
        crashed
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Reaps `pid` if it has exited (or is somehow no longer our child).
fn reaped(pid: libc::pid_t) -> bool {
    let mut status = 0;
    // SAFETY: waiting for our own child without blocking; `status` is a valid out-pointer.
    unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) != 0 }
}

/// A fresh directory for a round's cache and lock table, removed on drop. Under /dev/shm
/// where there is one: memory, so the mapped files never touch a disk.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new() -> io::Result<ScratchDir> {
        static ROUND: AtomicU32 = AtomicU32::new(0);
        let base = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let path = base.join(format!(
            "shmlock-stampede-{}-{}",
            std::process::id(),
            ROUND.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path); // left by a killed run with our pid
        std::fs::create_dir(&path)?;
        Ok(ScratchDir(path))
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// ---------------------------------------------------------------------------------------
// The load client

/// One request's fate.
struct Outcome {
    id: usize,
    latency: Duration,
    reply: Result<Reply, String>,
}

/// An HTTP answer.
struct Reply {
    status: u16,
    source: Option<String>,
    body: Vec<u8>,
}

/// Fires `cfg.requests` requests at once, a thread each, and waits for all the answers.
/// Returns them with the time from the start signal to the last one.
fn fire(addr: SocketAddr, cfg: &Config) -> (Vec<Outcome>, Duration) {
    let gate = Gate::default();
    thread::scope(|scope| {
        let mut outcomes = Vec::with_capacity(cfg.requests);
        let mut threads = Vec::with_capacity(cfg.requests);
        for i in 0..cfg.requests {
            let id = i % cfg.ids;
            let gate = &gate;
            let spawned =
                thread::Builder::new()
                    .stack_size(128 * 1024)
                    .spawn_scoped(scope, move || {
                        gate.wait();
                        let started = Instant::now();
                        let reply = get(addr, &format!("/item/{id}")).map_err(|e| e.to_string());
                        (reply, started.elapsed())
                    });
            match spawned {
                Ok(thread) => threads.push((id, thread)),
                Err(e) => outcomes.push(Outcome {
                    id,
                    latency: Duration::ZERO,
                    reply: Err(format!("cannot start a client thread: {e}")),
                }),
            }
        }
        let started = Instant::now();
        gate.open();
        for (id, thread) in threads {
            let (reply, latency) = thread
                .join()
                .unwrap_or_else(|_| (Err("client thread panicked".to_owned()), Duration::ZERO));
            outcomes.push(Outcome { id, latency, reply });
        }
        (outcomes, started.elapsed())
    })
}

/// Holds the client threads until all are started, then lets them go together. (A
/// Barrier would do, but would hang for good if one thread failed to start.)
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    fn wait(&self) {
        let open = self.open.lock().unwrap();
        drop(self.opened.wait_while(open, |open| !*open).unwrap());
    }

    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }
}

/// A plain HTTP/1.0 GET on a fresh connection: the answer ends when the server closes.
fn get(addr: SocketAddr, path: &str) -> io::Result<Reply> {
    let mut stream = TcpStream::connect_timeout(&addr, NET_TIMEOUT)?;
    stream.set_read_timeout(Some(NET_TIMEOUT))?;
    stream.set_write_timeout(Some(NET_TIMEOUT))?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    if raw.is_empty() {
        let closed = "the server closed the connection without an answer";
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, closed));
    }
    parse_reply(&raw).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed answer"))
}

fn parse_reply(raw: &[u8]) -> Option<Reply> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let source = lines
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("x-source"))
        .map(|(_, value)| value.trim().to_owned());
    Some(Reply {
        status,
        source,
        body: raw[end + 4..].to_vec(),
    })
}

// ---------------------------------------------------------------------------------------
// The command line

const USAGE: &str = "\
usage: stampede_server [OPTIONS]

Runs a prefork HTTP server with a shared cache in front of a slow backend, fires
concurrent requests at it and counts the backend calls: first with the lock
(get_or_fetch_with), then without (--no-lock), each on a fresh cache.

options:
  --workers N     worker processes (default 4)
  --requests R    requests fired at once (default 200)
  --ids K         distinct items they ask for (default 4)
  --delay-ms D    how long one backend call takes (default 200)
  --no-lock       only the round without the lock (with --serve: serve without it)
  --serve         only serve, until Ctrl-C, for curl: GET /item/<id>
  --port P        the port on 127.0.0.1 (default: any free one)
  -h, --help      this message";

enum Mode {
    /// Both rounds and the comparison, or only the no-lock round.
    Demo,
    /// Serve until Ctrl-C.
    Serve,
}

fn parse_args(args: &[String]) -> Result<Option<(Config, Mode)>, String> {
    let mut cfg = Config::default();
    let mut mode = Mode::Demo;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--workers" => cfg.workers = number(arg, value()?, 1..=64)?,
            "--requests" => cfg.requests = number(arg, value()?, 1..=2000)?,
            "--ids" => cfg.ids = number(arg, value()?, 1..=1000)?,
            "--delay-ms" => cfg.delay = Duration::from_millis(number(arg, value()?, 0..=60_000)?),
            "--port" => cfg.port = number(arg, value()?, 0..=u16::MAX)?,
            "--no-lock" => cfg.lock = false,
            "--serve" => mode = Mode::Serve,
            "-h" | "--help" => return Ok(None),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Some((cfg, mode)))
}

fn number<T: FromStr + PartialOrd + Display>(
    flag: &str,
    text: &str,
    range: RangeInclusive<T>,
) -> Result<T, String> {
    match text.parse() {
        Ok(n) if range.contains(&n) => Ok(n),
        _ => Err(format!(
            "{flag} wants a number from {} to {}, not {text:?}",
            range.start(),
            range.end()
        )),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match parse_args(&args) {
        Ok(Some((cfg, Mode::Demo))) => demo(&cfg),
        Ok(Some((cfg, Mode::Serve))) => serve_until_interrupted(&cfg),
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("stampede_server: {message}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    result.unwrap_or_else(|e| {
        eprintln!("stampede_server: {e}");
        ExitCode::FAILURE
    })
}

/// Runs the round(s) and prints them, and the comparison after both.
fn demo(cfg: &Config) -> Result<ExitCode, Box<dyn Error>> {
    println!(
        "{} worker processes, {} requests fired at once for {} items, backend call {} ms",
        cfg.workers,
        cfg.requests,
        cfg.ids,
        cfg.delay.as_millis()
    );
    println!(
        "X-Source: fetched = called the backend, filled = waited for the lock and found the \
         value, cache = plain hit"
    );
    let rounds: &[bool] = if cfg.lock { &[true, false] } else { &[false] };
    let mut reports = Vec::new();
    for &lock in rounds {
        let report = run(&Config { lock, ..*cfg })?;
        print_report(lock, &report);
        reports.push(report);
    }
    if let [with, without] = &reports[..] {
        println!(
            "\nwith the lock: {} backend calls for {} requests; without: {}",
            with.total_calls(),
            with.requests,
            without.total_calls()
        );
    }
    let clean = reports.iter().all(|r| r.failed == 0 && r.wrong_bodies == 0);
    Ok(if clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn print_report(lock: bool, r: &Report) {
    let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1000.0);
    println!(
        "\n{}, fresh cache, http://{}",
        if lock {
            "with the lock (get_or_fetch_with)"
        } else {
            "without the lock (--no-lock: get, on a miss fetch and set)"
        },
        r.addr
    );
    println!(
        "  served    {} of {} in {} ({} failed, {} wrong bodies)",
        r.served,
        r.requests,
        ms(r.wall),
        r.failed,
        r.wrong_bodies
    );
    let mut per_id: Vec<String> = (r.calls.iter().enumerate())
        .take(8)
        .map(|(id, n)| format!("item {id}: {n}"))
        .collect();
    if r.calls.len() > 8 {
        per_id.push("...".to_owned());
    }
    println!(
        "  backend   {} calls ({})",
        r.total_calls(),
        per_id.join(", ")
    );
    println!(
        "  latency   p50 {}, p90 {}, p99 {}, max {}",
        ms(r.percentile(50.0)),
        ms(r.percentile(90.0)),
        ms(r.percentile(99.0)),
        ms(r.percentile(100.0))
    );
    let sources: Vec<String> = ["fetched", "filled", "cache"]
        .iter()
        .map(|s| format!("{s} {}", r.source(s)))
        .chain(
            (r.sources.iter())
                .filter(|(s, _)| !["fetched", "filled", "cache"].contains(&s.as_str()))
                .map(|(s, n)| format!("{s} {n}")),
        )
        .collect();
    println!("  X-Source  {}", sources.join(", "));
    for e in &r.errors {
        println!("  failure   {e}");
    }
    if r.dead_workers > 0 {
        println!("  {} worker(s) crashed", r.dead_workers);
    }
}

/// `--serve`: starts the server and waits for Ctrl-C (or SIGTERM), then stops it.
fn serve_until_interrupted(cfg: &Config) -> Result<ExitCode, Box<dyn Error>> {
    let server = Prefork::start(cfg)?;
    println!(
        "serving http://{}/item/<id> with {} worker processes, {}, backend call {} ms",
        server.addr,
        cfg.workers,
        if cfg.lock {
            "with the lock"
        } else {
            "without the lock"
        },
        cfg.delay.as_millis()
    );
    println!(
        "try: curl -i http://{}/item/42    (Ctrl-C to stop)",
        server.addr
    );
    let signal = wait_for_ctrl_c()?;
    let mut calls: Vec<String> = (server.dict.keys(0)?.iter())
        .filter_map(|key| std::str::from_utf8(key).ok()?.strip_prefix("calls:"))
        .map(|id| Ok(format!("item {id}: {}", backend_calls(&server.dict, id)?)))
        .collect::<Result<_, shmlock::Error>>()?;
    calls.sort();
    // Ctrl-C reaches the workers too (they share our process group): no crash to report.
    server.stop();
    println!(
        "\nstopped by signal {signal}; backend calls: {}",
        if calls.is_empty() {
            "none".to_owned()
        } else {
            calls.join(", ")
        }
    );
    Ok(ExitCode::SUCCESS)
}

/// Waits for SIGINT or SIGTERM and returns which came. Blocked, they stay pending for
/// sigwait instead of killing the process, so the caller gets to stop the workers and
/// remove the files. The workers, forked before, keep the default action.
fn wait_for_ctrl_c() -> io::Result<libc::c_int> {
    // SAFETY: sigset_t is plain data, initialised by sigemptyset before any other use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t; the signal numbers are valid.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
    }
    // SAFETY: blocks signals in this thread only; a null old-set pointer is allowed.
    let r = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    let mut signal = 0;
    // SAFETY: `set` and `signal` are valid for the call.
    let r = unsafe { libc::sigwait(&set, &mut signal) };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    Ok(signal)
}
