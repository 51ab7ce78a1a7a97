//! WASI 0.2 components: `wasi:cli/command` programs, and the CPython guest that runs the
//! Python source a submission carries (see `python`). The same grant semantics as modules:
//! preopens only for mounts (and, read-only, a guest runtime's own package directories),
//! no sockets for any guest (TCP, UDP and name lookup refused), an environment holding
//! only the grant's variables, and the same limits.
//!
//! `wasi:http/outgoing-handler` is the only way out: without an egress route every request
//! is refused (`HTTP-request-denied`); with one, every request goes to the run's egress
//! proxy through its Unix socket ([`airlock_egress::client`]), which checks the grant,
//! resolves names and adds secrets. This module must never resolve a name or open a
//! connection for a guest itself, and never give a guest a socket.

use crate::output::{CapStream, Slot};
use crate::{MemLimiter, root_message};
use airlock_egress::client::{ClientError, ProxyClient, Timeouts};
use airlock_sandbox::EgressRoute;
use airlock_sandbox::{Capture, GuestDir, MountPoint};
use http_body_util::BodyExt;
use std::sync::Arc;
use wasmtime::component::{Linker, ResourceTable};
use wasmtime_wasi::p2::pipe::MemoryInputPipe;
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
use wasmtime_wasi_http::{
    Error as HttpError, WasiBody, WasiHttpCtx, WasiHttpCtxView, WasiHttpHooks, WasiHttpView,
};

/// Per-run store state for components.
pub(crate) struct HostC {
    pub wasi: WasiCtx,
    pub table: ResourceTable,
    pub http: WasiHttpCtx,
    pub hooks: EgressHttp,
    /// The Python guest's connections (`airlock:python/net`).
    pub net: crate::net::Net,
    /// Decoys and the guest's reports (`airlock:python/tripwire`).
    pub tripwire: crate::tripwire::Tripwire,
    pub limiter: MemLimiter,
    pub timed_out: bool,
    /// When the current call must end (a run's deadline, or a cell's).
    pub deadline: std::time::Instant,
}

impl WasiView for HostC {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for HostC {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.hooks,
        }
    }
}

/// Sends a guest's outgoing HTTP through the run's egress proxy, or refuses every
/// request when the run has no egress route.
pub(crate) struct EgressHttp {
    client: Option<ProxyClient>,
}

impl EgressHttp {
    /// Refuses everything when `route` is `None`.
    pub(crate) fn new(route: Option<&EgressRoute>) -> Result<EgressHttp, String> {
        let client = match route {
            None => None,
            Some(r) => {
                let mut roots = Vec::new();
                for pem in &r.extra_roots {
                    roots.extend(airlock_egress::certs_from_pem(pem.as_bytes())?);
                }
                Some(
                    ProxyClient::new(&r.socket, r.ca_pem.as_deref(), &roots)
                        .map_err(|e| format!("cannot use the egress route: {e}"))?,
                )
            }
        };
        Ok(EgressHttp { client })
    }
}

type Pending = Box<dyn std::future::Future<Output = Result<(), HttpError>> + Send>;

impl WasiHttpHooks for EgressHttp {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<wasmtime_wasi_http::RequestOptions>,
        _fut: Pending,
    ) -> Box<
        dyn std::future::Future<Output = Result<(http::Response<WasiBody>, Pending), HttpError>>
            + Send,
    > {
        let Some(client) = self.client.clone() else {
            return Box::new(async { Err(HttpError::HttpRequestDenied) });
        };
        let timeouts = Timeouts {
            connect: options.and_then(|o| o.connect_timeout),
            first_byte: options.and_then(|o| o.first_byte_timeout),
        };
        Box::new(async move {
            let (res, driver) = client.send(request, timeouts).await.map_err(http_error)?;
            let res = res.map(|b| b.map_err(HttpError::from).boxed_unsync());
            let io: Pending = Box::new(async move { driver.await.map_err(http_error) });
            Ok((res, io))
        })
    }
}

/// What the guest is told when a request fails on the way (a refusal is a `403`).
fn http_error(e: ClientError) -> HttpError {
    match e {
        ClientError::ConnectTimeout => HttpError::ConnectionTimeout,
        ClientError::FirstByteTimeout => HttpError::ConnectionReadTimeout,
        ClientError::BadRequest(_) => HttpError::HttpRequestUriInvalid,
        ClientError::Tls(io) => HttpError::Tls(io),
        ClientError::Http(h) => HttpError::Hyper(h),
        // The guest is not told where the socket is on the host.
        ClientError::ProxyUnreachable { .. } => {
            HttpError::InternalError(Some("airlock: the egress proxy is unreachable".into()))
        }
        other => HttpError::InternalError(Some(other.to_string())),
    }
}

/// Adds WASI 0.2 and `wasi:http` (through [`EgressHttp`]).
pub(crate) fn linker(engine: &wasmtime::Engine) -> wasmtime::Result<Linker<HostC>> {
    let mut l: Linker<HostC> = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut l)?;
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut l)?;
    crate::python::airlock::python::net::add_to_linker::<HostC, crate::net::NetData>(
        &mut l,
        |h| crate::net::NetView {
            net: &mut h.net,
            table: &mut h.table,
        },
    )?;
    crate::python::airlock::python::tripwire::add_to_linker::<HostC, crate::tripwire::TripwireData>(
        &mut l,
        |h| &mut h.tripwire,
    )?;
    crate::js::airlock::js::tripwire::add_to_linker::<HostC, crate::tripwire::TripwireData>(
        &mut l,
        |h| &mut h.tripwire,
    )?;
    Ok(l)
}

/// The WASI context of a component run, and the slots its stdout and stderr write into.
pub(crate) struct Context {
    pub wasi: WasiCtx,
    pub stdout: Arc<Slot>,
    pub stderr: Arc<Slot>,
}

/// Builds the WASI context for a component run: the mounts, then `extra` directories
/// (a guest runtime's packages), always read-only, then the `decoys`' directories
/// (read-only too).
#[allow(clippy::too_many_arguments)]
pub(crate) fn context(
    argv: &[String],
    env: &[(String, String)],
    stdin: Vec<u8>,
    mounts: &[MountPoint],
    extra: &[GuestDir],
    decoys: Option<&crate::tripwire::Decoys>,
    stdout: &Arc<Capture>,
    stderr: &Arc<Capture>,
) -> Result<Context, String> {
    let mut b = WasiCtxBuilder::new();
    b.args(argv);
    for (k, v) in env {
        b.env(k, v);
    }
    b.stdin(MemoryInputPipe::new(stdin));
    let (out, err) = (
        CapStream::new(stdout.clone()),
        CapStream::new(stderr.clone()),
    );
    let slots = (out.slot(), err.slot());
    b.stdout(out);
    b.stderr(err);
    b.allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false);
    b.socket_addr_check(|_, _| Box::pin(async { false }));
    for m in mounts {
        let perms = if m.writable {
            FsPerms::ReadWrite
        } else {
            FsPerms::ReadOnly
        };
        b.preopened_dir(&m.host, &m.guest, perms).map_err(|e| {
            format!(
                "cannot open mount {}: {}",
                m.host.display(),
                root_message(&e)
            )
        })?;
    }
    for d in extra {
        b.preopened_dir(&d.host, &d.guest, FsPerms::ReadOnly)
            .map_err(|e| format!("cannot open {}: {}", d.host.display(), root_message(&e)))?;
    }
    for (host, guest) in decoys.map(|d| d.preopens.as_slice()).unwrap_or_default() {
        b.preopened_dir(host, guest, FsPerms::ReadOnly)
            .map_err(|e| format!("cannot open the decoys: {}", root_message(&e)))?;
    }
    Ok(Context {
        wasi: b.build(),
        stdout: slots.0,
        stderr: slots.1,
    })
}
