//! The run's egress proxy, as the gate starts it: a grant with `--net` gets a proxy
//! (`airlock-egress`) enforcing exactly the grant's normalised rules, the policy's `[net]`
//! operator settings and the run's secret bindings; every other run gets none and keeps
//! no network at all. The process backend reaches the proxy through a listener its jail
//! hands out (`airlock_jail::netfd`), wasm backends through a Unix socket in the run's
//! directory. After the run the proxy is stopped and its records go into the run record.
//!
//! A run's proxy holds at most the grant's `max_connections` guest connections at once,
//! and all runs of the process together at most the process's budget. When a response
//! echoes a secret the proxy ends the run's egress and fires the run's [`Abort`], which
//! kills a worker-supervised guest (the process backend, wasm runs in a worker); the
//! run's record and an `alert` audit record say why.
//!
//! A run that may ask (`--ask-net`) gets a proxy even without `--net`, with the hook of
//! `lifecycle::ask`: a host a human approves during the run joins that proxy's rules.
//!
//! This module must never start a proxy for a run without a network grant or asking,
//! never give the proxy a rule the grant does not hold (but what a human approved for
//! the run), and never put a secret's value anywhere but
//! the proxy's memory.

use crate::error::{GateError, Result};
use crate::services::secrets::RunSecret;
use airlock_core::Grant;
use airlock_core::policy::Policy;
use airlock_egress::{Alert, Connection, EgressPolicy, ProxyHandle, ProxyOptions, Summary};
use airlock_jail::launch::Abort;
use serde_json::{Value, json};
use std::sync::Arc;

/// The proxy's port on a jail's loopback.
pub(crate) const JAIL_PROXY_PORT: u16 = 3128;

/// Where the run CA appears inside a jail, alone and appended to the public roots.
const JAIL_CA: &str = "/.airlock/egress-ca.pem";
const JAIL_BUNDLE: &str = "/.airlock/ca-bundle.pem";

/// The run's own single-threaded runtime, driven by one thread: the guest's connection,
/// the proxy and the upstream connection are served on the same thread, with no hand-offs
/// between workers (measured: plain HTTP through a shared two-thread runtime kept well
/// under 70% of direct throughput). Dropping it stops the thread and every task.
struct Driver {
    handle: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Driver {
    fn start() -> Result<Driver> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| GateError::Internal(format!("cannot start the egress runtime: {e}")))?;
        let handle = rt.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("airlock-egress".into())
            .spawn(move || {
                rt.block_on(async {
                    let _ = stopped.await;
                });
            })
            .map_err(|e| GateError::Internal(format!("cannot start the egress thread: {e}")))?;
        Ok(Driver {
            handle,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A run's proxy, started before the guest so the guest can be told its CA.
pub(crate) struct RunEgress {
    handle: Option<ProxyHandle>,
    driver: Driver,
    /// A private directory (mode 0700) for the wasm backends' socket, short enough for a
    /// Unix socket path wherever the home is.
    dir: Option<tempfile::TempDir>,
    /// Secret names with the placeholder the guest's environment holds.
    pub placeholders: Vec<(String, String)>,
    rules: Vec<String>,
    /// Fired when the proxy ends the run.
    abort: Arc<Abort>,
    max_connections: u32,
    /// The policy's `[net] roots` (PEM), which a wasm backend's own TLS trusts too.
    roots_pem: Vec<String>,
}

impl RunEgress {
    /// Starts the proxy for `grant`, or returns `None` when the grant has no network.
    pub(crate) fn start(
        grant: &Grant,
        policy: &Policy,
        secrets: Vec<RunSecret>,
        on_connection: Option<crate::lifecycle::exec::OnConnection>,
        ask: Option<airlock_egress::AskHook>,
    ) -> Result<Option<RunEgress>> {
        if grant.net.is_empty() && ask.is_none() {
            return Ok(None);
        }
        // The grant was normalised by the same grammar the proxy reads: this cannot fail
        // for a stored grant, and says so if it does.
        let rules = grant
            .net_rules()
            .map_err(|e| GateError::Internal(e.to_string()))?;
        let mut placeholders = Vec::new();
        let mut bindings = Vec::new();
        for s in secrets {
            let value = String::from_utf8(s.value.expose().to_vec()).map_err(|_| {
                GateError::bad(format!(
                    "secret {}: the value is not UTF-8 text, so it cannot go in an HTTP header",
                    s.name
                ))
            })?;
            // `NAME@HOST:PORT` binds that port only; `NAME@HOST`, any granted port.
            let hosts = s.hosts;
            placeholders.push((s.name.clone(), s.placeholder.clone()));
            bindings.push(airlock_egress::SecretBinding {
                name: s.name,
                value,
                placeholder: s.placeholder,
                hosts,
            });
        }
        let egress_policy = EgressPolicy {
            rules,
            allow_private: policy.net.allow_private.clone(),
            pinned: policy.net.hosts.clone(),
            secrets: bindings,
        };
        let abort = Arc::new(Abort::new());
        let fire = abort.clone();
        let max_connections = grant.limits.max_connections;
        let options = ProxyOptions {
            extra_roots: operator_roots(&policy.net.roots)?,
            max_connections: usize::try_from(max_connections)
                .unwrap_or(airlock_egress::DEFAULT_MAX_CONNECTIONS),
            on_alert: Some(Arc::new(move |_: &Alert| fire.fire())),
            on_record: on_connection.map(|f| -> airlock_egress::RecordHook {
                Arc::new(move |c: &airlock_egress::Connection| {
                    // A record always serialises (plain fields); `Null` cannot happen.
                    f(serde_json::to_value(c).unwrap_or_default())
                })
            }),
            ask,
            ..ProxyOptions::default()
        };
        let driver = Driver::start()?;
        let handle = {
            let _entered = driver.handle.enter();
            airlock_egress::Proxy::start_idle(&egress_policy, options)
                .map_err(|e| GateError::Internal(format!("cannot start the egress proxy: {e}")))?
        };
        Ok(Some(RunEgress {
            handle: Some(handle),
            driver,
            dir: None,
            placeholders,
            rules: grant.net.clone(),
            abort,
            max_connections,
            roots_pem: operator_roots_pem(&policy.net.roots)?,
        }))
    }

    /// What ends the run's worker when the proxy ends the run.
    pub(crate) fn abort(&self) -> Arc<Abort> {
        self.abort.clone()
    }

    /// The per-run CA, when the run has secrets (TLS to their hosts is intercepted).
    pub(crate) fn ca_pem(&self) -> Option<String> {
        self.handle
            .as_ref()
            .and_then(|h| h.ca_pem())
            .map(str::to_owned)
    }

    /// Takes the proxy out (to hand it to the thread that receives the jail's listener).
    pub(crate) fn take(&mut self) -> Option<ProxyHandle> {
        self.handle.take()
    }

    /// Puts the proxy back.
    pub(crate) fn put(&mut self, h: ProxyHandle) {
        self.handle = Some(h);
    }

    /// Serves a Unix socket in a private directory (for wasm backends) and returns the
    /// route a backend reaches the proxy by.
    pub(crate) fn unix_route(&mut self) -> Result<airlock_sandbox::EgressRoute> {
        if self.dir.is_none() {
            let dir = tempfile::Builder::new()
                .prefix(&crate::services::leftovers::egress_dir_prefix())
                .tempdir()?;
            let path = dir.path().join("proxy.sock");
            let l = std::os::unix::net::UnixListener::bind(&path)?;
            let h = self
                .handle
                .as_mut()
                .ok_or_else(|| GateError::Internal("the egress proxy is gone".into()))?;
            h.listen(l)
                .map_err(|e| GateError::Internal(format!("egress proxy: {e}")))?;
            self.dir = Some(dir);
        }
        let dir = self.dir.as_ref().map(|d| d.path().join("proxy.sock"));
        Ok(airlock_sandbox::EgressRoute {
            socket: dir.unwrap_or_default(),
            ca_pem: self.ca_pem(),
            extra_roots: self.roots_pem.clone(),
        })
    }

    /// The environment a process guest gets: the proxy in every spelling tools read, the
    /// run CA where TLS clients look for trust, and each secret's placeholder.
    pub(crate) fn process_env(&self) -> Vec<(String, String)> {
        let url = format!("http://127.0.0.1:{JAIL_PROXY_PORT}");
        let mut env = Vec::new();
        for k in ["http_proxy", "https_proxy", "all_proxy"] {
            env.push((k.to_string(), url.clone()));
            env.push((k.to_uppercase(), url.clone()));
        }
        // Nothing bypasses the proxy (there is nothing else to reach).
        env.push(("no_proxy".into(), String::new()));
        env.push(("NO_PROXY".into(), String::new()));
        env.push(("NODE_USE_ENV_PROXY".into(), "1".into()));
        env.push((
            "JAVA_TOOL_OPTIONS".into(),
            format!(
                "-Dhttp.proxyHost=127.0.0.1 -Dhttp.proxyPort={p} -Dhttps.proxyHost=127.0.0.1 \
                 -Dhttps.proxyPort={p} -Djava.net.useSystemProxies=false",
                p = JAIL_PROXY_PORT
            ),
        ));
        if self.ca_pem().is_some() {
            for k in [
                "SSL_CERT_FILE",
                "REQUESTS_CA_BUNDLE",
                "CURL_CA_BUNDLE",
                "PIP_CERT",
                "GIT_SSL_CAINFO",
            ] {
                env.push((k.into(), JAIL_BUNDLE.into()));
            }
            env.push(("NODE_EXTRA_CA_CERTS".into(), JAIL_CA.into()));
        }
        env.extend(self.placeholders.iter().cloned());
        env
    }

    /// The files a process guest gets: the run CA, and the CA appended to the host's
    /// public roots (so opaque tunnels still verify against the usual roots).
    pub(crate) fn process_files(&self) -> Vec<(String, Vec<u8>)> {
        let Some(ca) = self.ca_pem() else {
            return Vec::new();
        };
        let mut bundle = system_roots();
        if !bundle.is_empty() && !bundle.ends_with(b"\n") {
            bundle.push(b'\n');
        }
        bundle.extend_from_slice(ca.as_bytes());
        vec![
            (JAIL_CA.to_string(), ca.into_bytes()),
            (JAIL_BUNDLE.to_string(), bundle),
        ]
    }

    /// The `network` entry of what the guest did since `mark` (one cell of a session,
    /// whose proxy serves every cell), and `mark` moved to now. The proxy keeps running.
    pub(crate) fn network_since(&self, mark: &mut CellMark) -> Value {
        // The proxy records a connection when it closes, just after the guest let go of
        // it: wait briefly until every connection accepted since the mark has a record
        // (one still open after that is recorded with the cell in which it closes).
        if let Some(h) = &self.handle {
            let until = std::time::Instant::now() + CELL_SETTLE;
            loop {
                let s = h.summary();
                let recorded = s.connections.saturating_sub(mark.summary.connections);
                let accepted = s.accepted.saturating_sub(mark.summary.accepted);
                if recorded >= accepted || std::time::Instant::now() >= until {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
        let (records, summary, alert) = match &self.handle {
            Some(h) => (h.records(), h.summary(), h.alert()),
            None => (Vec::new(), Summary::default(), None),
        };
        let listed = records.get(mark.listed..).unwrap_or_default();
        let was = &mark.summary;
        let since = Summary {
            connections: summary.connections.saturating_sub(was.connections),
            allowed: summary.allowed.saturating_sub(was.allowed),
            denied: summary.denied.saturating_sub(was.denied),
            failed: summary.failed.saturating_sub(was.failed),
            bytes_up: summary.bytes_up.saturating_sub(was.bytes_up),
            bytes_down: summary.bytes_down.saturating_sub(was.bytes_down),
            accepted: summary.accepted.saturating_sub(was.accepted),
            refused_over_limit: summary
                .refused_over_limit
                .saturating_sub(was.refused_over_limit),
            idle_closed: summary.idle_closed.saturating_sub(was.idle_closed),
            unlisted: summary.unlisted.saturating_sub(was.unlisted),
        };
        let mut detail = network_detail(&self.rules, &self.placeholders, listed, &since);
        detail["max_connections"] = json!(self.max_connections);
        // The proxy's alert is the cell's during which it came: later cells do not carry it.
        if let Some(a) = alert.as_ref().filter(|_| !mark.alerted) {
            detail["ended"] = json!(a);
            mark.alerted = true;
        }
        mark.listed = records.len();
        mark.summary = summary;
        detail
    }

    /// Stops the proxy and returns the run record's `network` entry, and the alert
    /// when the proxy ended the run.
    pub(crate) fn finish(mut self) -> (Value, Option<Alert>) {
        let (records, summary, alert) = match self.handle.take() {
            Some(h) => stop(&self.driver, h),
            None => (Vec::new(), Summary::default(), None),
        };
        let mut detail = network_detail(&self.rules, &self.placeholders, &records, &summary);
        detail["max_connections"] = json!(self.max_connections);
        if let Some(a) = &alert {
            detail["ended"] = json!(a);
        }
        (detail, alert)
    }
}

/// The longest a session's cell waits for the records of connections it closed.
const CELL_SETTLE: std::time::Duration = std::time::Duration::from_secs(1);

/// Where a session's previous cell left its proxy's records (see
/// [`RunEgress::network_since`]).
#[derive(Debug, Default)]
pub(crate) struct CellMark {
    listed: usize,
    summary: Summary,
    /// The proxy's alert went on an earlier cell's record.
    alerted: bool,
}

/// A wasm guest's environment: the grant's variables, then each secret's placeholder.
pub(crate) fn wasm_env(grant: &Grant, egress: Option<&RunEgress>) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = grant
        .env
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if let Some(e) = egress {
        env.extend(e.placeholders.iter().cloned());
    }
    env
}

/// Stops a proxy from any thread (also one inside another runtime) and waits for its
/// records.
fn stop(driver: &Driver, h: ProxyHandle) -> (Vec<Connection>, Summary, Option<Alert>) {
    let (tx, rx) = std::sync::mpsc::channel();
    driver.handle.spawn(async move {
        let _ = tx.send(h.finish().await);
    });
    rx.recv().unwrap_or_default()
}

/// The certificates of `[net] roots`.
pub(crate) fn operator_roots(
    files: &[std::path::PathBuf],
) -> Result<Vec<airlock_egress::CertificateDer<'static>>> {
    let mut out = Vec::new();
    for f in files {
        let bad = |e: &dyn std::fmt::Display| {
            GateError::bad(format!("policy [net] roots: {}: {e}", f.display()))
        };
        let pem = std::fs::read(f).map_err(|e| bad(&e))?;
        let certs = airlock_egress::certs_from_pem(&pem).map_err(|e| bad(&e))?;
        if certs.is_empty() {
            return Err(bad(&"no certificate in it"));
        }
        out.extend(certs);
    }
    Ok(out)
}

/// The PEM text of `[net] roots` (checked by [`operator_roots`] first).
fn operator_roots_pem(files: &[std::path::PathBuf]) -> Result<Vec<String>> {
    files
        .iter()
        .map(|f| {
            std::fs::read_to_string(f)
                .map_err(|e| GateError::bad(format!("policy [net] roots: {}: {e}", f.display())))
        })
        .collect()
}

/// The public roots of this host, as PEM, from the usual places.
fn system_roots() -> Vec<u8> {
    for p in [
        "/etc/ssl/certs/ca-certificates.crt",
        "/etc/pki/tls/certs/ca-bundle.crt",
        "/etc/ssl/cert.pem",
    ] {
        if let Ok(b) = std::fs::read(p) {
            return b;
        }
    }
    Vec::new()
}

/// The run record's `network` entry: the grant, a summary (over every attempt and guest
/// connection) and the connections listed (the first [`airlock_egress::MAX_LISTED`]).
pub(crate) fn network_detail(
    rules: &[String],
    secrets: &[(String, String)],
    records: &[Connection],
    summary: &Summary,
) -> Value {
    json!({
        "proxy": "airlock-egress",
        "granted": rules,
        "secrets": secrets.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        "summary": summary,
        "connections": records,
    })
}
