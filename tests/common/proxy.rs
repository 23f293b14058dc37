//! A TCP proxy in front of a Redis server that injects the faults of a lossy network: it
//! can forward a request and then cut the connection before the reply comes back (the
//! server ran the command; the client never hears of it), hold replies back, freeze the
//! link for a while right after a request went through, and hold everything (a partition
//! that leaves the connections open).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::redis_server::claim_port;

/// What the proxy does to the traffic now.
#[derive(Default)]
struct Faults {
    /// Cut the next client connection whose request contains this, once it is forwarded.
    cut_after: Option<Vec<u8>>,
    /// Hold each reply back this long.
    delay: Duration,
    /// Once a request that contains this is forwarded, hold everything (both ways, on
    /// every connection) for this long.
    freeze_after: Option<(Vec<u8>, Duration)>,
    /// Everything is held until then.
    frozen_until: Option<Instant>,
    /// Everything is held (until this is cleared).
    blackhole: bool,
    /// Every reply is replaced by an HTTP error (a server that is not Redis).
    garble: bool,
}

/// A proxy on a free loopback port; stops (and cuts every connection) when dropped.
pub struct Proxy {
    pub port: u16,
    faults: Arc<Mutex<Faults>>,
    stop: Arc<AtomicBool>,
    /// Requests cut so far.
    cuts: Arc<AtomicU64>,
    /// Freezes begun so far.
    freezes: Arc<AtomicU64>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Proxy {
    pub fn start(upstream: u16) -> Proxy {
        Proxy::start_on(0, upstream)
    }

    /// On `port` (0: any free one), e.g. the port of a proxy just dropped, whose listener
    /// may take a moment to let it go.
    pub fn start_on(port: u16, upstream: u16) -> Proxy {
        allow_many_descriptors();
        let deadline = Instant::now() + Duration::from_secs(5);
        let listener = loop {
            match TcpListener::bind(("127.0.0.1", port)) {
                // (a port given to a server about to bind it is left to it)
                Ok(l) if port == 0 && !claim_port(l.local_addr().unwrap().port()) => {}
                Ok(l) => break l,
                Err(e) if Instant::now() > deadline => panic!("binding port {port}: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        };
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let faults = Arc::new(Mutex::new(Faults::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let cuts = Arc::new(AtomicU64::new(0));
        let freezes = Arc::new(AtomicU64::new(0));
        let counts = Counts {
            cuts: cuts.clone(),
            freezes: freezes.clone(),
        };
        let (f, s) = (faults.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                            continue;
                        };
                        client.set_nonblocking(false).unwrap();
                        pipe(client, server, f.clone(), s.clone(), counts.clone());
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        Proxy {
            port,
            faults,
            stop,
            cuts,
            freezes,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The next request that contains `pattern` reaches the server, and its connection is
    /// cut before the reply comes back.
    pub fn cut_after(&self, pattern: &[u8]) {
        lock(&self.faults).cut_after = Some(pattern.to_vec());
    }

    /// Holds every reply back for `d` (zero: none).
    pub fn delay_replies(&self, d: Duration) {
        lock(&self.faults).delay = d;
    }

    /// How many connections were cut after a request.
    pub fn cuts(&self) -> u64 {
        self.cuts.load(Ordering::SeqCst)
    }

    /// The next request that contains `pattern` reaches the server, and then nothing goes
    /// through, either way on any connection, for `d` (what was sent meanwhile is delivered
    /// afterwards): a link that stalls right after the request.
    pub fn freeze_after(&self, pattern: &[u8], d: Duration) {
        lock(&self.faults).freeze_after = Some((pattern.to_vec(), d));
    }

    /// How many freezes `freeze_after` began.
    pub fn freezes(&self) -> u64 {
        self.freezes.load(Ordering::SeqCst)
    }

    /// While on, nothing goes through, either way on any connection, and connections stay
    /// open (what was sent meanwhile is delivered once it is off): a partition.
    pub fn blackhole(&self, on: bool) {
        lock(&self.faults).blackhole = on;
    }

    /// While on, every reply is replaced by an HTTP error: a server that stopped speaking
    /// the Redis protocol (a port taken over by something else).
    pub fn garble(&self, on: bool) {
        lock(&self.faults).garble = on;
    }
}

/// Raises this process's soft limit of open descriptors towards its hard limit, once: the
/// tests of a binary run at once, and each connection a held link keeps costs two (a CI
/// run reached its soft limit with two partition tests side by side, at six each).
fn allow_many_descriptors() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        let enough: libc::rlim_t = 1 << 16;
        // SAFETY: `lim` is a valid, writable `rlimit` for the call's duration.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 && lim.rlim_cur < enough {
            lim.rlim_cur = lim.rlim_max.min(enough);
            // SAFETY: `lim` is a valid `rlimit`; a refusal leaves the limit as it was.
            unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
        }
    });
}

/// The proxy's counters, shared with its connections.
#[derive(Clone)]
struct Counts {
    cuts: Arc<AtomicU64>,
    freezes: Arc<AtomicU64>,
}

/// Waits while the link is frozen or blackholed (or until the proxy stops).
fn await_passage(faults: &Mutex<Faults>, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        let held = {
            let f = lock(faults);
            f.blackhole || f.frozen_until.is_some_and(|until| Instant::now() < until)
        };
        if !held {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Bytes of a connection's requests kept to match patterns across reads.
const KEPT: usize = 4096;

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

/// Copies both ways between `client` and `server`, with the faults. Both threads share the
/// two sockets, two descriptors in all: a link held for a long partition keeps every
/// connection made through it meanwhile (a client that gave up on one opens another, and
/// what it sent is still delivered once the link is back), and a copy of each socket per
/// thread made a 36 s partition cost this process hundreds of descriptors.
fn pipe(
    client: TcpStream,
    server: TcpStream,
    faults: Arc<Mutex<Faults>>,
    stop: Arc<AtomicBool>,
    counts: Counts,
) {
    let (client, server) = (Arc::new(client), Arc::new(server));
    let (c_in, s_out) = (client.clone(), server.clone());
    let (s_in, c_out) = (server, client);
    let (f, s) = (faults.clone(), stop.clone());
    // Set before a request to be cut is written: its reply is never passed on, however
    // soon it comes (on a busy machine it came back through the other thread before the
    // cut in 2 of 30 runs of a test).
    let cutting = Arc::new(AtomicBool::new(false));
    let cut_reply = cutting.clone();
    let cut_both = {
        let (c, s) = (c_in.clone(), s_out.clone());
        move || {
            let _ = c.shutdown(Shutdown::Both);
            let _ = s.shutdown(Shutdown::Both);
        }
    };
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        // The end of what came before, so that a pattern split between two reads is seen
        // (a loaded machine delivers a long request in pieces).
        let mut seen: Vec<u8> = Vec::new();
        loop {
            let n = match (&*c_in).read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            seen.extend_from_slice(&buf[..n]);
            let window = &seen[..];
            await_passage(&f, &s);
            let cut = {
                let mut f = lock(&f);
                if let Some((p, d)) = &f.freeze_after {
                    if contains(window, p) {
                        // frozen from before the request is written: its reply is held too
                        f.frozen_until = Some(Instant::now() + *d);
                        f.freeze_after = None;
                        counts.freezes.fetch_add(1, Ordering::SeqCst);
                    }
                }
                match &f.cut_after {
                    Some(p) if contains(window, p) => {
                        f.cut_after = None;
                        true
                    }
                    _ => false,
                }
            };
            // (patterns are far shorter than what is kept; a match is not seen twice, as
            // each fault is cleared once it fires)
            let keep = seen.len().saturating_sub(KEPT);
            seen.drain(..keep);
            if cut {
                cutting.store(true, Ordering::SeqCst);
                counts.cuts.fetch_add(1, Ordering::SeqCst);
            }
            if s.load(Ordering::Relaxed) || (&*s_out).write_all(&buf[..n]).is_err() {
                break;
            }
            if cut {
                cut_both();
                break;
            }
        }
        let _ = s_out.shutdown(Shutdown::Write);
    });
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match (&*s_in).read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            await_passage(&faults, &stop);
            if cut_reply.load(Ordering::SeqCst) {
                break;
            }
            let (delay, garble) = {
                let f = lock(&faults);
                (f.delay, f.garble)
            };
            if !delay.is_zero() {
                std::thread::sleep(delay);
            }
            let reply: &[u8] = if garble {
                b"HTTP/1.1 400 Bad Request\r\n\r\n"
            } else {
                &buf[..n]
            };
            if stop.load(Ordering::Relaxed) || (&*c_out).write_all(reply).is_err() {
                break;
            }
        }
        let _ = c_out.shutdown(Shutdown::Both);
    });
}
