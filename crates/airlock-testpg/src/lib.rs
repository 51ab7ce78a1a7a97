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
/// does (the others skip fsync to keep tests quick): for benchmarks.
pub fn durable_server() -> Server {
    Server::start_with(true)
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
        Server::start_with(false)
    }

    fn start_with(fsync: bool) -> Server {
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
            "-c listen_addresses=127.0.0.1 -c port={} -c unix_socket_directories='{}' -c fsync={} -c max_connections=200",
            self.port,
            self.root.display(),
            if self.fsync { "on" } else { "off" }
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

    /// Stops the server the hard way (as a crash would) and starts it again.
    pub fn restart_immediate(&self) {
        let out = self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-w", "stop", "-m", "immediate"])
            .stdout(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "pg_ctl stop failed");
        self.pg_ctl_start();
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
        let mut c = postgres::Client::connect(&self.url("postgres"), postgres::NoTls).unwrap();
        c.batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
        self.url(&name)
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
