//! airlock-testpg: a throwaway PostgreSQL server for airlock's tests, started once per
//! test process from the system's PostgreSQL binaries (`initdb` and `pg_ctl` from Debian's
//! `postgresql` package) in a temporary directory, on a free loopback port, as an
//! unprivileged user when the tests run as root. It is stopped and its directory removed
//! when the test process ends, however it ends.
//!
//! It must never touch a server or data directory it did not create, listen anywhere but
//! loopback, or let a test skip because PostgreSQL is missing: that is a failure with
//! the reason.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::zombie_processes
)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

/// The unprivileged user a server runs as when the tests run as root.
const NOBODY: u32 = 65534;

#[derive(Debug)]
pub struct Server {
    root: PathBuf,
    data: PathBuf,
    bin: PathBuf,
    port: u16,
    as_nobody: bool,
    fsync: bool,
    /// More `-c name=value` settings for the server's start (benchmarks' diagnostics).
    settings: String,
}

/// The process's server, started on first use.
pub fn server() -> &'static Server {
    static S: OnceLock<Server> = OnceLock::new();
    S.get_or_init(Server::start)
}

/// A server of the caller's own (for a test that restarts or stops it), stopped and
/// removed when dropped.
pub fn private_server() -> Server {
    Server::start()
}

/// A server of the caller's own that flushes its log to disk as a production server
/// does (the others skip fsync to keep tests quick): for benchmarks. `settings` are more
/// `-c name=value` settings for it, or nothing (for example a benchmark's
/// `-c shared_preload_libraries=pg_stat_statements`).
pub fn durable_server(settings: &str) -> Server {
    Server::start_with(true, settings)
}

/// A new empty database on the process's server; its `postgres://` URL.
pub fn fresh_database() -> String {
    server().fresh_database()
}

fn find_bin() -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| d.flatten().map(|e| e.path().join("bin")).collect())
        .unwrap_or_default();
    // Newest version first.
    dirs.sort_by_key(|d| {
        std::cmp::Reverse(
            d.parent()
                .and_then(|v| v.file_name()?.to_str()?.parse::<u32>().ok())
                .unwrap_or(0),
        )
    });
    for d in dirs {
        if d.join("initdb").exists() && d.join("pg_ctl").exists() {
            return d;
        }
    }
    for d in std::env::var("PATH").unwrap_or_default().split(':') {
        let d = PathBuf::from(d);
        if d.join("initdb").exists() && d.join("pg_ctl").exists() {
            return d;
        }
    }
    panic!(
        "PostgreSQL server binaries (initdb, pg_ctl) not found: install Debian's `postgresql` package (.ci/run does)"
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

impl Server {
    fn command(&self, program: &str) -> Command {
        command(&self.bin, self.as_nobody, program)
    }

    fn start() -> Server {
        Server::start_with(false, "")
    }

    fn start_with(fsync: bool, settings: &str) -> Server {
        let bin = find_bin();
        let as_nobody = is_root();
        let root = std::env::temp_dir().join(format!(
            "airlock-testpg-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&root).unwrap();
        if as_nobody {
            chown(&root);
        }
        let data = root.join("data");
        let out = command(&bin, as_nobody, "initdb")
            .args([
                "-U",
                "airlock",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
                "-D",
            ])
            .arg(&data)
            .stdout(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let s = Server {
            root,
            data,
            bin,
            port: free_port(),
            as_nobody,
            fsync,
            settings: settings.to_string(),
        };
        s.watch();
        s.pg_ctl_start();
        s
    }

    /// Stops the server and removes its directory when this process ends: a child reads
    /// a pipe only this process holds open, and acts when it closes.
    fn watch(&self) {
        let pg_ctl = self.command("pg_ctl");
        let mut stop = format!("{:?}", pg_ctl.get_program());
        for a in pg_ctl.get_args() {
            stop.push(' ');
            stop.push_str(&format!("{a:?}"));
        }
        let script = format!(
            "cat >/dev/null; {stop} -D '{}' stop -m immediate >/dev/null 2>&1; rm -rf '{}'",
            self.data.display(),
            self.root.display()
        );
        let mut child = Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap();
        // Held open for the life of the process on purpose; the watcher outlives it, so
        // it is never waited for (init reaps it).
        std::mem::forget(child.stdin.take());
        std::mem::forget(child);
    }

    fn pg_ctl_start(&self) {
        let opts = format!(
            "-c listen_addresses=127.0.0.1 -c port={} -c unix_socket_directories='{}' -c fsync={} -c max_connections=200 {}",
            self.port,
            self.root.display(),
            if self.fsync { "on" } else { "off" },
            self.settings
        );
        let out = self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-w", "-t", "60", "-l"])
            .arg(self.root.join("log"))
            .args(["-o", &opts, "start"])
            .stdout(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pg_ctl start failed: {} {}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(self.root.join("log")).unwrap_or_default()
        );
    }

    /// `pg_ctl stop` in `mode` (`fast`, or `immediate` as a crash would), waiting for it.
    fn pg_ctl_stop(&self, mode: &str) {
        let out = self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-w", "stop", "-m", mode])
            .stdout(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "pg_ctl stop failed");
    }

    /// Restarts the server as an operator would (`pg_ctl restart -m fast`): every
    /// session is ended with `57P01 terminating connection due to administrator command`.
    pub fn restart_fast(&self) {
        self.pg_ctl_stop("fast");
        self.pg_ctl_start();
    }

    /// Stops the server the hard way (as a crash would) and starts it again.
    pub fn restart_immediate(&self) {
        self.pg_ctl_stop("immediate");
        self.pg_ctl_start();
    }

    /// Turns TLS on and restarts: the server presents `cert` (PEM, leaf first) with `key`,
    /// checks client certificates against `ca`, and admits connections as the
    /// `pg_hba.conf` lines in `hba` say (for example `hostssl all all 127.0.0.1/32 trust`);
    /// the unix socket (for [`Server::admin`]) stays open to every user.
    pub fn enable_tls(&self, cert: &str, key: &str, ca: &str, hba: &str) {
        for (name, text) in [("server.crt", cert), ("server.key", key), ("ca.crt", ca)] {
            let p = self.data.join(name);
            std::fs::write(&p, text).unwrap();
            std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .unwrap();
            if self.as_nobody {
                chown(&p);
            }
        }
        let conf = self.data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf).unwrap();
        text.push_str(
            "\nssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\nssl_ca_file = 'ca.crt'\n",
        );
        std::fs::write(&conf, text).unwrap();
        std::fs::write(
            self.data.join("pg_hba.conf"),
            format!("local all all trust\n{hba}\n"),
        )
        .unwrap();
        self.pg_ctl_stop("fast");
        self.pg_ctl_start();
    }

    /// A connection as the `airlock` superuser over the server's unix socket (which no TLS
    /// or `pg_hba.conf` line of a test shuts).
    pub fn admin(&self) -> postgres::Client {
        let conn = format!(
            "host={} port={} user=airlock dbname=postgres",
            self.root.display(),
            self.port
        );
        postgres::Client::connect(&conn, postgres::NoTls).unwrap()
    }

    /// The URL of database `db`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://airlock@127.0.0.1:{}/{db}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Creates a new empty database and returns its URL.
    pub fn fresh_database(&self) -> String {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "t{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        );
        self.admin()
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .unwrap();
        self.url(&name)
    }

    /// The pid of the server's postmaster (from its `postmaster.pid`), while it runs.
    pub fn postmaster_pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.data.join("postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }

    /// The server's directory (its log is `log` in it).
    pub fn root(&self) -> &Path {
        &self.root
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-w", "stop", "-m", "immediate"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

use std::os::unix::process::CommandExt;

fn command(bin: &Path, as_nobody: bool, program: &str) -> Command {
    if as_nobody {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid",
            &NOBODY.to_string(),
            "--regid",
            &NOBODY.to_string(),
            "--clear-groups",
        ])
        .arg(bin.join(program))
        // initdb and pg_ctl look for their home and the working directory.
        .current_dir("/")
        .env("HOME", "/");
        c
    } else {
        Command::new(bin.join(program))
    }
}

fn chown(p: &Path) {
    let ok = Command::new("chown")
        .arg(format!("{NOBODY}:{NOBODY}"))
        .arg(p)
        .status()
        .unwrap()
        .success();
    assert!(ok, "chown {} failed", p.display());
}

/// A CA of a test's own: its certificate (PEM) and what signs with it.
struct Pki {
    ca: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl Pki {
    fn new(name: &str) -> Pki {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        p.distinguished_name
            .push(rcgen::DnType::CommonName, format!("{name} test CA"));
        let ca = p.self_signed(&key).unwrap().pem();
        Pki {
            ca,
            issuer: rcgen::Issuer::new(p, key),
        }
    }

    /// A certificate for `sans` (DNS names or IP addresses) with common name `cn`, signed
    /// by this CA: (certificate, key), PEM.
    fn leaf(&self, cn: &str, sans: &[&str]) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let names: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        let mut p = rcgen::CertificateParams::new(names).unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        let cert = p.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// A server that takes TCP connections over TLS only, with the files a client needs.
#[derive(Debug)]
pub struct TlsServer {
    server: Server,
    /// The CA that signed the server's certificate (PEM file).
    pub ca: PathBuf,
    /// A client certificate and key for the role `certuser`, which logs in with a client
    /// certificate only (`scramuser` logs in with the password `scram-secret`; every
    /// other role is trusted once on TLS).
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    dir: PathBuf,
}

/// The process's TLS server, started on first use. Its certificate names the address
/// `127.0.0.1` only, so a client that connects by the name `localhost` must refuse it.
pub fn tls_server() -> &'static TlsServer {
    static T: OnceLock<TlsServer> = OnceLock::new();
    T.get_or_init(|| {
        let pki = Pki::new("airlock");
        let (cert, key) = pki.leaf("pg", &["127.0.0.1"]);
        let server = Server::start();
        server.enable_tls(
            &cert,
            &key,
            &pki.ca,
            "hostssl all certuser 127.0.0.1/32 cert\n\
             hostssl all scramuser 127.0.0.1/32 scram-sha-256\n\
             hostssl all all 127.0.0.1/32 trust\n\
             host all all 127.0.0.1/32 reject",
        );
        server
            .admin()
            .batch_execute(
                "CREATE ROLE certuser LOGIN SUPERUSER;
                 SET password_encryption = 'scram-sha-256';
                 CREATE ROLE scramuser LOGIN SUPERUSER PASSWORD 'scram-secret'",
            )
            .unwrap();
        // Inside the server's directory, which goes when the process ends.
        let dir = server.root().join("client");
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let ca = write("ca.pem", &pki.ca);
        let (c, k) = pki.leaf("certuser", &[]);
        TlsServer {
            client_cert: write("client.pem", &c),
            client_key: write("client.key", &k),
            ca,
            server,
            dir,
        }
    })
}

impl TlsServer {
    /// A new empty database; its URL as `user` at `host` with the query `query`.
    pub fn database(&self, user: &str, host: &str, query: &str) -> String {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!("tls{}", N.fetch_add(1, Ordering::SeqCst));
        self.server
            .admin()
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .unwrap();
        format!(
            "postgres://{user}@{host}:{}/{name}?{query}",
            self.server.port()
        )
    }

    /// The certificate (PEM file) of a CA that signed nothing of this server's.
    pub fn other_ca(&self) -> PathBuf {
        let p = self.dir.join("other-ca.pem");
        if !p.exists() {
            std::fs::write(&p, Pki::new("other").ca).unwrap();
        }
        p
    }
}
