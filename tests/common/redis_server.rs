//! Private Redis servers for a test, on free loopback ports, no persistence, killed on
//! drop: a plain server, replicas, sentinels, a 3-master Cluster, and a TLS server with a
//! certificate made for it by `openssl`. `scripts/redis-server.sh` installs what they run.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const HINT: &str = "install it with `bash scripts/redis-server.sh` \
                    (Debian/Ubuntu: apt-get install redis-server redis-sentinel redis-tools openssl)";

/// A free loopback port (free when asked: the server binds it right after), never the
/// same one twice in this process: the kernel may give a port just let go to the next
/// asker, and two tests starting servers at once would then share one port, and one
/// server (the other's exits). Not seen to happen; cheap to rule out.
pub fn free_port() -> u16 {
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if claim_port(port) {
            return port;
        }
    }
}

/// Records `port` as this process's: false if it was given out before (by [`free_port`],
/// or to a proxy, which binds a port of its own and must not take one a server is about
/// to bind).
pub fn claim_port(port: u16) -> bool {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    if given.contains(&port) {
        return false;
    }
    given.push(port);
    true
}

/// A directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "shmlock-redis-{}-{}-{name}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One redis-server (or redis-sentinel) process.
pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    program: &'static str,
    args: Vec<String>,
    /// Whether the port speaks TLS (then readiness is only "accepts connections").
    tls: bool,
    pub dir: TempDir,
}

impl RedisServer {
    /// A plain server.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// A server with these extra arguments (`--replicaof ...`, `--cluster-enabled yes`).
    /// A master and one replica of it, once the replica is in sync: (master, replica).
    pub fn with_a_replica() -> (RedisServer, RedisServer) {
        let master = RedisServer::start();
        let port = master.port.to_string();
        let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
        eventually("the replica in sync", Duration::from_secs(20), || {
            master
                .cli(&["INFO", "replication"])
                .contains("state=online")
        });
        (master, replica)
    }

    pub fn start_with(extra: &[&str]) -> RedisServer {
        let port = free_port();
        let dir = TempDir::new("server");
        let mut args: Vec<String> = [
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--dir",
            dir.0.to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(
            ["--save", "", "--appendonly", "no", "--loglevel", "warning"]
                .iter()
                .map(|s| s.to_string()),
        );
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut server = RedisServer {
            child: None,
            port,
            program: "redis-server",
            args,
            tls: false,
            dir,
        };
        server.spawn();
        server
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Starts the process and waits until it answers on its port. A server that exits
    /// at once (its port taken meanwhile, e.g. as the local end of another test's
    /// connection) is started again; and the one that answers must be this one, alive
    /// (by the pid it gives, where it can be asked).
    fn spawn(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let child = Command::new(self.program)
                .args(&self.args)
                .stdout(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {} ({e}): {HINT}", self.program));
            self.child = Some(child);
            let exited = loop {
                if let Some(status) = self.exited() {
                    break status;
                }
                if self.answers() && self.exited().is_none() {
                    return;
                }
                assert!(
                    Instant::now() < deadline,
                    "{} on {} never answered",
                    self.program,
                    self.port
                );
                std::thread::sleep(Duration::from_millis(10));
            };
            assert!(
                Instant::now() < deadline,
                "{} on {} exited at once ({exited})",
                self.program,
                self.port
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// How the process ended, if it did.
    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }

    /// Whether the server answers on its port; a server of another process there is a
    /// test's error, said at once.
    fn answers(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        if self.tls {
            return true;
        }
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        if s.write_all(b"INFO server\r\n").is_err() {
            return false;
        }
        let mut reply = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => return false,
                Ok(n) => reply.extend_from_slice(&buf[..n]),
            }
            // a server with a password answers -NOAUTH: up all the same
            if reply.starts_with(b"-NOAUTH") {
                return true;
            }
            let text = String::from_utf8_lossy(&reply);
            if let Some(at) = text.find("process_id:") {
                let rest = &text[at + "process_id:".len()..];
                let Some(end) = rest.find("\r\n") else {
                    continue;
                };
                let pid: u32 = rest[..end].trim().parse().unwrap_or(0);
                assert_eq!(
                    pid,
                    self.pid(),
                    "{} on {}: another process's server answers there",
                    self.program,
                    self.port
                );
                return true;
            }
            if reply.starts_with(b"-") && reply.ends_with(b"\r\n") {
                return false; // (loading, or the like: not up yet)
            }
        }
    }

    /// Kills the server (SIGKILL, by pid) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port and directory, empty.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    /// SIGSTOP / SIGCONT.
    pub fn pause(&self, paused: bool) {
        let sig = if paused { libc::SIGSTOP } else { libc::SIGCONT };
        let pid = self.pid() as libc::pid_t;
        // a pid of 0 would signal the test's whole process group
        assert!(pid > 0, "no server pid to signal");
        // SAFETY: kill(2) of the server this handle started; it touches no memory of ours.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
    }

    /// A command's reply, by redis-cli.
    pub fn cli(&self, args: &[&str]) -> String {
        cli(self.port, args)
    }

    /// Closes the connections of the clients whose name starts with `prefix` (a
    /// sentinel's links are named `sentinel-<the first 8 of its id>-cmd` and `-pubsub`);
    /// how many.
    pub fn kill_clients_named(&self, prefix: &str) -> usize {
        let mut killed = 0;
        for line in self.cli(&["CLIENT", "LIST"]).lines() {
            let field = |f: &str| line.split(' ').find_map(|x| x.strip_prefix(f));
            if field("name=").is_some_and(|n| n.starts_with(prefix)) {
                if let Some(id) = field("id=") {
                    killed += usize::from(self.cli(&["CLIENT", "KILL", "ID", id]).trim() == "1");
                }
            }
        }
        killed
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `redis-cli -p port args...`'s output.
pub fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run redis-cli ({e}): {HINT}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Polls `f` every 50 ms until it holds; panics with `what` after `limit`.
pub fn eventually(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A master with two replicas and three sentinels watching it as `mymaster`, failing it
/// over after 500 ms of silence.
pub struct SentinelSetup {
    pub master: RedisServer,
    pub replicas: Vec<RedisServer>,
    pub sentinels: Vec<RedisServer>,
}

pub const MASTER_NAME: &str = "mymaster";

impl SentinelSetup {
    pub fn start() -> SentinelSetup {
        SentinelSetup::start_announcing(None)
    }

    /// As [`start`](Self::start), but with `Some((port, announced))` the last sentinel
    /// listens on `port` and tells the others to reach it on `announced` (where a
    /// [`Proxy`](super::proxy::Proxy) to `port` stands for its network link).
    pub fn start_announcing(last: Option<(u16, u16)>) -> SentinelSetup {
        let fast_sync = [
            "--repl-diskless-sync",
            "yes",
            "--repl-diskless-sync-delay",
            "0",
        ];
        let master = RedisServer::start_with(&fast_sync);
        let port = master.port.to_string();
        let replicas: Vec<RedisServer> = (0..2)
            .map(|_| {
                let mut args = vec!["--replicaof", "127.0.0.1", &port];
                args.extend(fast_sync);
                RedisServer::start_with(&args)
            })
            .collect();
        eventually("both replicas in sync", Duration::from_secs(20), || {
            let info = master.cli(&["INFO", "replication"]);
            info.contains("connected_slaves:2") && info.matches("state=online").count() == 2
        });
        let sentinels: Vec<RedisServer> = (0..3)
            .map(|i| match last {
                Some((port, announced)) if i == 2 => {
                    start_sentinel(master.port, port, Some(announced))
                }
                _ => start_sentinel(master.port, free_port(), None),
            })
            .collect();
        eventually(
            "the sentinels know each other and both replicas",
            Duration::from_secs(20),
            || {
                sentinels.iter().all(|s| {
                    let info = s.cli(&["SENTINEL", "MASTER", MASTER_NAME]);
                    field_after(&info, "num-other-sentinels") == Some("2")
                        && field_after(&info, "num-slaves") == Some("2")
                })
            },
        );
        SentinelSetup {
            master,
            replicas,
            sentinels,
        }
    }

    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(|s| s.url()).collect()
    }

    /// The port of the master the first live sentinel names.
    pub fn master_port(&self) -> Option<u16> {
        for s in &self.sentinels {
            let out = s.cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME]);
            if let Some(port) = out.lines().nth(1).and_then(|p| p.trim().parse().ok()) {
                return Some(port);
            }
        }
        None
    }
}

/// Waits until every sentinel names a promoted replica (not `old_port`) as the master,
/// with the failover over (flags plain `master`), and that server says it is master;
/// returns its port. (Within a minute: an election the sentinels split is tried again
/// after twice the failover timeout, 10 s, and on a busy machine one failover took more
/// than 30 s.)
pub fn await_failover(sentinels: &[RedisServer], old_port: u16) -> u16 {
    let mut new = 0;
    eventually("a replica promoted", Duration::from_secs(60), || {
        let ports: Vec<Option<u16>> = sentinels
            .iter()
            .map(|s| {
                let info = s.cli(&["SENTINEL", "MASTER", MASTER_NAME]);
                if field_after(&info, "flags") != Some("master") {
                    return None;
                }
                field_after(&info, "port").and_then(|p| p.parse().ok())
            })
            .collect();
        match ports[0] {
            Some(p) if p != old_port && ports.iter().all(|q| *q == Some(p)) => {
                new = p;
                cli(p, &["ROLE"]).starts_with("master")
            }
            _ => false,
        }
    });
    new
}

/// The value after `name` in redis-cli's one-per-line listing of a reply's fields.
fn field_after<'a>(listing: &'a str, name: &str) -> Option<&'a str> {
    let mut lines = listing.lines();
    while let Some(l) = lines.next() {
        if l.trim() == name {
            return lines.next().map(str::trim);
        }
    }
    None
}

fn start_sentinel(master_port: u16, port: u16, announced: Option<u16>) -> RedisServer {
    let dir = TempDir::new("sentinel");
    let conf = dir.0.join("sentinel.conf");
    let mut text = format!(
        "port {port}\nbind 127.0.0.1\ndir {}\nloglevel warning\n\
         sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n\
         sentinel down-after-milliseconds {MASTER_NAME} 500\n\
         sentinel failover-timeout {MASTER_NAME} 5000\n\
         sentinel parallel-syncs {MASTER_NAME} 2\n",
        dir.0.display()
    );
    if let Some(p) = announced {
        text.push_str(&format!(
            "sentinel announce-ip 127.0.0.1\nsentinel announce-port {p}\n"
        ));
    }
    std::fs::write(&conf, text).unwrap();
    let mut s = RedisServer {
        child: None,
        port,
        program: "redis-sentinel",
        args: vec![conf.to_str().unwrap().to_string()],
        tls: false,
        dir,
    };
    s.spawn();
    s
}

/// Three masters (no replicas) in a Cluster, 16384 slots split evenly.
pub struct ClusterSetup {
    pub nodes: Vec<RedisServer>,
}

impl ClusterSetup {
    pub fn start() -> ClusterSetup {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                let bus = free_port().to_string();
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-port",
                    &bus,
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ])
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli ({e}): {HINT}"));
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let setup = ClusterSetup { nodes };
        setup.await_ok();
        setup
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url()).collect()
    }

    /// Waits until every node says the cluster is ok.
    pub fn await_ok(&self) {
        eventually(
            "cluster_state:ok on every node",
            Duration::from_secs(30),
            || {
                self.nodes
                    .iter()
                    .all(|n| n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"))
            },
        );
    }

    /// The node serving `key`'s slot.
    pub fn node_of(&self, key: &str) -> usize {
        let slot: u16 = self.nodes[0]
            .cli(&["CLUSTER", "KEYSLOT", key])
            .trim()
            .parse()
            .unwrap();
        let id = |n: &RedisServer| n.cli(&["CLUSTER", "MYID"]).trim().to_string();
        let shards = self.nodes[0].cli(&["CLUSTER", "NODES"]);
        for line in shards.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            let serves = fields[8..].iter().any(|r| match r.split_once('-') {
                Some((a, b)) => {
                    (a.parse().unwrap_or(u16::MAX)..=b.parse().unwrap_or(0)).contains(&slot)
                }
                None => r.parse() == Ok(slot),
            });
            if serves {
                return self.nodes.iter().position(|n| id(n) == fields[0]).unwrap();
            }
        }
        panic!("no node serves slot {slot}");
    }
}

/// A server speaking only TLS, with a certificate for 127.0.0.1 signed by a CA that
/// `openssl` made for this test, and a password.
pub struct TlsSetup {
    pub server: RedisServer,
    pub ca_pem: Vec<u8>,
    pub password: &'static str,
}

impl TlsSetup {
    pub fn start() -> TlsSetup {
        let certs = TempDir::new("tls");
        make_certificates(&certs.0);
        let port = free_port();
        let dir = TempDir::new("tls-server");
        let p = |f: &str| certs.0.join(f).to_str().unwrap().to_string();
        let password = "tls-test-secret";
        let args: Vec<String> = [
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--dir",
            dir.0.to_str().unwrap(),
            "--tls-cert-file",
            &p("server.crt"),
            "--tls-key-file",
            &p("server.key"),
            "--tls-ca-cert-file",
            &p("ca.crt"),
            "--tls-auth-clients",
            "no",
            "--requirepass",
            password,
            "--save",
            "",
            "--appendonly",
            "no",
            "--loglevel",
            "warning",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut server = RedisServer {
            child: None,
            port,
            program: "redis-server",
            args,
            tls: true,
            dir,
        };
        server.spawn();
        let ca_pem = std::fs::read(certs.0.join("ca.crt")).unwrap();
        TlsSetup {
            server,
            ca_pem,
            password,
        }
    }

    /// `rediss://:password@127.0.0.1:port/`
    pub fn url(&self) -> String {
        format!(
            "rediss://:{}@127.0.0.1:{}/",
            self.password, self.server.port
        )
    }
}

/// A CA, and a server certificate for 127.0.0.1 and localhost that it signed (P-256 keys:
/// quick to make), in `dir`.
fn make_certificates(dir: &Path) {
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .current_dir(dir)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run openssl ({e}): {HINT}"));
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
    let mut ca = vec!["req", "-x509", "-nodes", "-days", "2"];
    ca.extend(ec);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-subj",
        "/CN=shmlock test CA",
    ]);
    openssl(&ca);
    let mut csr = vec!["req", "-nodes"];
    csr.extend(ec);
    csr.extend([
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    openssl(&csr);
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "san.ext",
        "-out",
        "server.crt",
    ]);
}
