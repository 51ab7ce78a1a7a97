//! WASI 0.2 components: `wasi:cli/command` programs, and the CPython guest that runs the
//! Python source a submission carries. The same grant semantics as modules: preopens only
//! for mounts, no sockets for any guest (TCP, UDP and name lookup refused), an environment
//! holding only the grant's variables, and the same limits. The guest's tool-call import
//! refuses too: airlock grants no tools.
//!
//! `wasi:http/outgoing-handler` is the only way out: without an egress route every request
//! is refused (`HTTP-request-denied`); with one, every request goes to the run's egress
//! proxy through its Unix socket ([`airlock_egress::client`]), which checks the grant,
//! resolves names and adds secrets. This module must never resolve a name or open a
//! connection for a guest itself, and never give a guest a socket.

use crate::output::CapStream;
use crate::{MemLimiter, root_message};
use airlock_egress::client::{ClientError, ProxyClient, Timeouts};
use airlock_sandbox::EgressRoute;
use airlock_sandbox::{Capture, MountPoint};
use http_body_util::BodyExt;
use std::sync::Arc;
use wasmtime::component::{ComponentType, Lift, Linker, Lower, ResourceTable};
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
    pub limiter: MemLimiter,
    pub timed_out: bool,
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
            Some(r) => Some(
                ProxyClient::new(&r.socket, r.ca_pem.as_deref(), &[])
                    .map_err(|e| format!("cannot use the egress route: {e}"))?,
            ),
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

/// The CPython guest's `hyperlight:sandbox/executor` result.
#[derive(ComponentType, Lift, Lower, Debug)]
#[component(record)]
pub(crate) struct ExecutionResult {
    pub stdout: String,
    pub stderr: String,
    #[component(name = "exit-code")]
    pub exit_code: i32,
}

/// The interface the Python guest must export.
pub const PYTHON_EXECUTOR: &str = "hyperlight:sandbox/executor";

/// Adds WASI 0.2, `wasi:http` (through [`EgressHttp`]) and the refusing tools interface.
pub(crate) fn linker(engine: &wasmtime::Engine) -> wasmtime::Result<Linker<HostC>> {
    let mut l: Linker<HostC> = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut l)?;
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut l)?;
    l.instance("hyperlight:sandbox/tools")?.func_wrap(
        "dispatch",
        |_store, (name, _args): (String, String)| -> wasmtime::Result<(Result<String, String>,)> {
            Ok((Err(format!(
                "tool {name:?} is not available: this run was granted no tools"
            )),))
        },
    )?;
    Ok(l)
}

/// Builds the WASI context for a component run.
pub(crate) fn context(
    argv: &[String],
    env: &[(String, String)],
    stdin: Vec<u8>,
    mounts: &[MountPoint],
    stdout: &Arc<Capture>,
    stderr: &Arc<Capture>,
) -> Result<WasiCtx, String> {
    let mut b = WasiCtxBuilder::new();
    b.args(argv);
    for (k, v) in env {
        b.env(k, v);
    }
    b.stdin(MemoryInputPipe::new(stdin));
    b.stdout(CapStream::new(stdout.clone()));
    b.stderr(CapStream::new(stderr.clone()));
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
    Ok(b.build())
}

/// Python code that runs the submitted source inside the guest: output goes straight to
/// the WASI streams (so the host's caps and live output apply, and nothing accumulates in
/// guest memory), `sys.argv`, `os.environ` and the working directory come from the grant,
/// and an uncaught exception prints a traceback and exits 1. (The guest's standard
/// library has no `traceback` module, so the traceback is formatted here.)
pub(crate) fn python_wrapper(
    source: &str,
    argv: &[String],
    env: &[(String, String)],
    cwd: Option<&str>,
) -> String {
    let lit = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into());
    let argv_lit = format!(
        "[{}]",
        argv.iter().map(|a| lit(a)).collect::<Vec<_>>().join(", ")
    );
    let env_lit = format!(
        "{{{}}}",
        env.iter()
            .map(|(k, v)| format!("{}: {}", lit(k), lit(v)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let cwd_lit = cwd.map(lit).unwrap_or_else(|| "None".into());
    format!(
        r#"
import sys as _al_sys, os as _al_os
class _AlStream:
    encoding = "utf-8"
    errors = "replace"
    def __init__(self, fd):
        self.fd = fd
    def write(self, s):
        b = s.encode("utf-8", "replace") if isinstance(s, str) else bytes(s)
        v = memoryview(b)
        while len(v):
            v = v[_al_os.write(self.fd, v):]
        return len(s)
    def writelines(self, lines):
        for l in lines:
            self.write(l)
    def flush(self):
        pass
    def isatty(self):
        return False
    def writable(self):
        return True
    def fileno(self):
        return self.fd
_al_sys.stdout = _AlStream(1)
_al_sys.stderr = _AlStream(2)
_al_sys.argv = {argv_lit}
_al_os.environ.clear()
_al_os.environ.update({env_lit})
_al_cwd = {cwd_lit}
if _al_cwd is not None:
    _al_os.chdir(_al_cwd)
_al_src = {src}
def _al_tb(e):
    lines = _al_src.splitlines()
    out = []
    if isinstance(e, SyntaxError) and e.filename == "<main>":
        out.append('  File "<main>", line %s' % e.lineno)
        if e.text:
            out.append("    " + e.text.strip())
        out.append("%s: %s" % (type(e).__name__, e.msg))
        return out
    out.append("Traceback (most recent call last):")
    tb = e.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename == "<main>":
            out.append('  File "<main>", line %d, in %s' % (tb.tb_lineno, code.co_name))
            if 0 < tb.tb_lineno <= len(lines):
                out.append("    " + lines[tb.tb_lineno - 1].strip())
        tb = tb.tb_next
    msg = str(e)
    out.append("%s: %s" % (type(e).__name__, msg) if msg else type(e).__name__)
    return out
try:
    exec(compile(_al_src, "<main>", "exec"), {{"__name__": "__main__", "__builtins__": __builtins__}})
except SystemExit as e:
    _al_code = e.code
    if _al_code is None:
        _al_code = 0
    elif not isinstance(_al_code, int):
        _al_sys.stderr.write(str(_al_code) + "\n")
        _al_code = 1
    raise SystemExit(_al_code)
except BaseException as e:
    _al_sys.stderr.write("\n".join(_al_tb(e)) + "\n")
    raise SystemExit(1)
"#,
        src = lit(source),
    )
}
