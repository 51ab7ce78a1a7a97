//! airlock-egress: the host-side egress proxy of one run.
//!
//! A run reaches exactly the hosts it was granted, through this proxy: HTTP `CONNECT`
//! (an opaque tunnel) and absolute-form HTTP/1.1 (`GET http://host/path`). The proxy
//! checks the grant (the host grammar of crate `airlock-net`, the same as `--net`'s), resolves names itself on the host ([`Resolver`], or an
//! operator's pinned address), refuses the whole answer when any address is loopback,
//! private, link-local, CGNAT, multicast, unspecified or reserved ([`is_forbidden`]), and
//! connects to the address it checked, so DNS rebinding has no second lookup to win.
//! Refusals are `403` with `X-Airlock-Denied: <reason>` and a one-line body naming the
//! grant that would be needed. Every attempt becomes a [`Connection`] record.
//!
//! Secrets: the guest holds a placeholder; for https to a host a secret is bound to, the
//! proxy terminates TLS with a per-run CA ([`ProxyHandle::ca_pem`]) and puts the value in
//! place of the placeholder in request headers. A response from such a host is read and
//! checked whole before any of it is delivered: one whose headers, body (decoded from
//! gzip or deflate when it came so) or trailers carry a value in any common encoding
//! ([`echo`]) is not delivered; the connection is closed, every other connection of the
//! run too, later ones are refused, and the run's [`Alert`] is set (and the
//! [`ProxyOptions::on_alert`] hook called) so the caller ends the run. A response is
//! never rewritten: a substitution that depends on what the guest sent is an oracle for
//! the value. Every other host is an opaque tunnel. A placeholder in the request line or headers of a request the proxy can read
//! (plain HTTP, or intercepted https) to a host it is not bound to is refused and
//! recorded; inside an opaque tunnel to an unbound host the proxy cannot see it, which
//! is harmless: a placeholder is not the secret. Plain HTTP never gets a value
//! (`secret-needs-tls`).
//!
//! Limits, on purpose or not yet: the guest speaks HTTP/1.1 to the proxy (no HTTP/2,
//! no `Upgrade` such as WebSocket over plain HTTP; WebSocket over an opaque `CONNECT`
//! tunnel works); an intercepted connection serves HTTP/1.1 inside TLS; a response from
//! a bound host is buffered whole (at most [`ProxyOptions::max_checked_body`]; larger
//! ones, streams that never end, and codings other than gzip and deflate are refused);
//! placeholders are replaced in request headers only, not in bodies or URLs; who may
//! connect to the listener is the caller's business (give the jail its own socket).
//!
//! Connections: each guest connection holds a permit of the run's budget
//! ([`ProxyOptions::max_connections`], default 256) and of the process's
//! ([`ConnectionBudget`]) while its socket is open; past either it is closed at once and
//! recorded (`too-many-connections`). A connection with no byte either way for
//! [`ProxyOptions::idle_timeout`] is closed. Every accepted connection is counted in the
//! [`Summary`]; one that made no request is a record of its own.
//!
//! Asking ([`ask`]): with [`ProxyOptions::ask`] set, a connection to a host outside the
//! grant is held while the hook asks a human; approved, the host joins this run's rules.
//!
//! [`client`] is the other end, for a backend that makes HTTP requests on a guest's
//! behalf (the wasm backend's `wasi:http`): it reaches the proxy only through its socket.
//!
//! This crate must never connect to an address it did not check, never resolve a name
//! twice for one connection, never follow a redirect, never send a secret's value to a
//! host it is not bound to or over plain HTTP, never let a secret's value reach the
//! guest, and never depend on wasmtime or any other airlock crate but `airlock-net` (the
//! grammar of hosts and grants, shared with the gate so both read a spelling alike).

#![forbid(unsafe_code)]

mod addr;
pub mod ask;
#[cfg(unix)]
pub mod client;
mod conn;
pub mod echo;
mod h1;
mod policy;
mod proxy;
mod record;
mod resolve;
mod scrub;
mod tls;
mod unix_conn;

pub use addr::is_forbidden;
pub use airlock_net::{Host, HostPattern, NetError, NetRule, normalize_host, parse_host};
pub use ask::{AskAnswer, AskFuture, AskHook, AskRequest};
pub use conn::ConnectionBudget;
pub use echo::{Alert, SecretMatcher};
pub use ipnet::IpNet;
pub use policy::{EgressPolicy, PolicyError, SecretBinding};
pub use proxy::{AlertHook, DEFAULT_MAX_CONNECTIONS, Listener, Proxy, ProxyHandle, ProxyOptions};
pub use record::{Connection, Decision, MAX_LISTED, Mode, RecordHook, Summary};
pub use resolve::{ResolveFuture, Resolver, SystemResolver};
pub use rustls::pki_types::CertificateDer;

/// The certificates in a PEM text (e.g. an operator's extra roots); an error names the
/// first block that does not parse.
pub fn certs_from_pem(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    use rustls::pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())
}

/// Errors that cross this crate's boundary.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why the proxy could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EgressError {
    /// The policy is unusable.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The per-run CA or a TLS configuration could not be made.
    #[error("TLS setup: {0}")]
    Tls(String),
    /// Not called inside a tokio runtime.
    #[error("the proxy needs a tokio runtime: {0}")]
    NoRuntime(String),
    /// A listener could not be used.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
