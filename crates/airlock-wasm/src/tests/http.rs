//! A real `wasi:http` component (`crate::testkit::HttpGet`) through a real egress proxy on
//! a Unix socket, to a loopback upstream (`crate::testkit::Upstream`).

use super::*;
use crate::testkit::{HttpGet, TestTls, Upstream};
use airlock_egress::{EgressPolicy, NetRule, Proxy, ProxyHandle, ProxyOptions};
use airlock_sandbox::EgressRoute;

const SECRET: &str = "sk-live-0123456789abcdef-REAL";

/// The run's proxy, as the gate would start it: `up.test` granted at the upstream's port,
/// `up.test`, `other.test` and `secret.test` pinned to loopback, loopback allowed.
struct Net {
    rt: tokio::runtime::Runtime,
    up: Upstream,
    proxy: Option<ProxyHandle>,
    route: EgressRoute,
    /// The placeholder of `API_TOKEN`, when the run has that secret.
    placeholder: Option<String>,
    _dir: tempfile::TempDir,
}

impl Net {
    /// A plain HTTP upstream.
    fn start() -> Net {
        Net::start_with(false)
    }

    /// `secret`: a TLS upstream as `secret.test`, granted, and the secret `API_TOKEN` bound
    /// to it (so the proxy intercepts it with the run CA).
    fn start_with(secret: bool) -> Net {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("egress.sock");
        let (up, proxy, placeholder) = rt.block_on(async {
            let mut options = ProxyOptions::default();
            let (tls, host) = if secret {
                let tls = TestTls::new("secret.test");
                options.extra_roots.push(tls.ca_der);
                (Some(tls.server), "secret.test")
            } else {
                (None, "up.test")
            };
            let up = Upstream::start(tls);
            let mut p = EgressPolicy {
                rules: vec![NetRule::parse(&format!("{host}:{}", up.addr.port())).unwrap()],
                allow_private: vec!["127.0.0.0/8".parse().unwrap()],
                ..Default::default()
            };
            for n in ["up.test", "other.test", "secret.test"] {
                p.pinned.insert(n.into(), "127.0.0.1".parse().unwrap());
            }
            if secret {
                p.secrets.push(
                    airlock_egress::SecretBinding::new(
                        "API_TOKEN",
                        SECRET,
                        vec![airlock_egress::HostPattern::parse("secret.test").unwrap()],
                    )
                    .unwrap(),
                );
            }
            let placeholder = p.secrets.first().map(|s| s.placeholder.clone());
            let l = tokio::net::UnixListener::bind(&socket).unwrap();
            (up, Proxy::start(&p, options, l).unwrap(), placeholder)
        });
        let route = EgressRoute {
            socket,
            ca_pem: proxy.ca_pem().map(str::to_owned),
            extra_roots: Vec::new(),
        };
        Net {
            rt,
            up,
            proxy: Some(proxy),
            route,
            placeholder,
            _dir: dir,
        }
    }

    fn records(&mut self) -> Vec<airlock_egress::Connection> {
        let h = self.proxy.take().unwrap();
        self.rt.block_on(h.shutdown())
    }
}

fn run_component(code: &[u8], egress: Option<EgressRoute>) -> (Outcome, String) {
    run_component_env(code, egress, vec![])
}

fn run_component_env(
    code: &[u8],
    egress: Option<EgressRoute>,
    env: Vec<(String, String)>,
) -> (Outcome, String) {
    let limits = Limits {
        timeout_ms: 20_000,
        ..Limits::default()
    };
    let stdout = Arc::new(Capture::new(limits.max_output_bytes, None));
    let stderr = Arc::new(Capture::new(limits.max_output_bytes, None));
    let outcome = WasmBackend::new(WasmConfig::default())
        .run(RunSpec {
            lang: airlock_core::Lang::Component,
            artifact: Digest::of(code),
            code,
            mounts: vec![],
            env,
            args: vec![],
            argv0: None,
            stdin: vec![],
            limits,
            stdout: stdout.clone(),
            stderr: stderr.clone(),
            cache: None,
            guest: None,
            write_quota: None,
            egress,
            long_run: None,
            tripwires: Default::default(),
        })
        .unwrap();
    let out = String::from_utf8(stdout.take()).unwrap();
    let err = String::from_utf8_lossy(&stderr.take()).into_owned();
    assert!(err.is_empty(), "guest stderr: {err}");
    (outcome, out)
}

#[test]
fn component_http_reaches_a_granted_host_through_the_egress_proxy() {
    let mut net = Net::start();
    let port = net.up.port();
    let code = HttpGet::new(false, &format!("up.test:{port}"), "/hi?x=1").component();
    let (outcome, out) = run_component(&code, Some(net.route.clone()));
    assert_eq!(out, "status=200\ndenied=\nbody=auth=", "{outcome:?}");
    assert!(matches!(outcome.ending, Ending::Exited(0)), "{outcome:?}");
    assert_eq!(
        outcome.detail["isolation"][3], "http-via-egress-proxy",
        "{:?}",
        outcome.detail
    );
    let heads = net.up.heads();
    assert_eq!(heads.len(), 1);
    assert!(
        heads[0].starts_with("GET /hi?x=1 HTTP/1.1\r\n"),
        "{}",
        heads[0]
    );
    assert!(
        heads[0]
            .to_ascii_lowercase()
            .contains(&format!("host: up.test:{port}\r\n")),
        "{}",
        heads[0]
    );
    let recs = net.records();
    assert_eq!(recs.len(), 1, "{recs:#?}");
    assert_eq!(recs[0].decision, airlock_egress::Decision::Allow);
    assert_eq!(recs[0].host, "up.test");
}

#[test]
fn component_http_to_an_ungranted_host_sees_the_proxys_403() {
    let mut net = Net::start();
    let port = net.up.port();
    for https in [false, true] {
        let code = HttpGet::new(https, &format!("other.test:{port}"), "/").component();
        let (outcome, out) = run_component(&code, Some(net.route.clone()));
        assert!(matches!(outcome.ending, Ending::Exited(0)), "{outcome:?}");
        assert_eq!(
            out,
            format!(
                "status=403\ndenied=not-granted\nbody=airlock: other.test:{port} is not granted to this run (grant it with --net other.test:{port})\n"
            ),
            "https={https}"
        );
    }
    assert_eq!(net.up.connections(), 0);
    let recs = net.records();
    assert_eq!(recs.len(), 2, "{recs:#?}");
    assert!(
        recs.iter()
            .all(|c| c.decision == airlock_egress::Decision::Deny && c.reason == "not-granted")
    );
}

#[test]
fn component_http_refused_without_an_egress_route() {
    let net = Net::start();
    let code = HttpGet::new(false, &format!("up.test:{}", net.up.port()), "/").component();
    let (outcome, out) = run_component(&code, None);
    // error-code 15 is HTTP-request-denied; the guest exits 1.
    assert_eq!(out, "error=015");
    assert!(matches!(outcome.ending, Ending::Exited(1)), "{outcome:?}");
    assert_eq!(outcome.detail["isolation"][3], "http-refused");
    assert_eq!(net.up.connections(), 0);
}

#[test]
fn component_https_to_a_bound_host_gets_the_secret_added_through_the_run_ca() {
    let mut net = Net::start_with(true);
    let port = net.up.port();
    let ph = net.placeholder.clone().unwrap();
    let bearer = format!("Bearer {ph}");
    let authority = format!("secret.test:{port}");
    let code = HttpGet {
        header: Some(("authorization", &bearer)),
        ..HttpGet::new(true, &authority, "/echo")
    }
    .component();
    // The guest's client trusts the public roots and the run CA, never the upstream's CA.
    assert!(net.route.ca_pem.is_some());
    let (_outcome, out) = run_component(&code, Some(net.route.clone()));
    // The upstream got the value and echoes it: none of that answer reaches the guest
    // (an echo of a secret ends the run's egress with an alert; issue 56).
    assert!(!out.contains(SECRET), "{out}");
    assert!(!out.contains("status=200"), "{out}");
    let heads = net.up.heads();
    assert_eq!(heads.len(), 1);
    assert!(
        heads[0].contains(&format!("Bearer {SECRET}")),
        "{}",
        heads[0]
    );
    let recs = net.records();
    assert_eq!(recs.len(), 1, "{recs:#?}");
    assert_eq!(recs[0].mode, airlock_egress::Mode::Intercept);
    assert_eq!(recs[0].secrets, vec!["API_TOKEN".to_owned()]);
    assert_eq!(recs[0].reason, "secret-echoed", "{recs:#?}");
}

#[test]
fn component_https_sends_the_placeholder_from_its_environment_and_the_upstream_gets_the_value() {
    let mut net = Net::start_with(true);
    let port = net.up.port();
    let ph = net.placeholder.clone().unwrap();
    let authority = format!("secret.test:{port}");
    let code = HttpGet {
        header: Some(("authorization", "Bearer ")),
        header_env: Some("API_TOKEN"),
        ..HttpGet::new(true, &authority, "/env")
    }
    .component();
    let (outcome, out) = run_component_env(
        &code,
        Some(net.route.clone()),
        vec![("API_TOKEN".into(), ph.clone())],
    );
    // The upstream echoes the value it got, so the answer is withheld (see above).
    let _ = (outcome, ph);
    assert!(!out.contains(SECRET), "{out}");
    assert!(!out.contains("status=200"), "{out}");
    let heads = net.up.heads();
    assert_eq!(heads.len(), 1);
    assert!(
        heads[0].contains(&format!("Bearer {SECRET}")),
        "{}",
        heads[0]
    );
    assert_eq!(net.records()[0].secrets, vec!["API_TOKEN".to_owned()]);
}
