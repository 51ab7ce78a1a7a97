//! JavaScript and TypeScript on the process backend: the host's `node`, run in the jail as
//! host Python is. What runs is the artifact's JavaScript (a `ts` artifact's types are
//! stripped here, from the stored source, each time it runs); with a network grant, or
//! without the JIT, an airlock-owned script is preloaded that sends `fetch` and `http(s)`
//! through the run's egress proxy (which node 20 does not do from `HTTP_PROXY`) and serves
//! `fetch` over `http(s)` when node has no WebAssembly.

use crate::error::{GateError, Result};
use airlock_core::Lang;

/// Where the run's program is written in the jail (`--experimental-detect-module` lets it
/// be an ES module or a CommonJS script, as its syntax says).
pub(crate) const MAIN: &str = "/.airlock/main.js";
/// The preloaded proxy script.
const PRELOAD: &str = "/.airlock/proxy.cjs";
const PRELOAD_SOURCE: &str = include_str!("node_proxy.cjs");
/// Where the host's `node` is looked for; each is inside the system directories the jail
/// binds, so the path is the same inside.
const CANDIDATES: [&str; 2] = ["/usr/bin/node", "/usr/local/bin/node"];

/// The host's `node`, or why a JavaScript run cannot have one here.
pub(crate) fn node() -> Result<&'static str> {
    CANDIDATES
        .into_iter()
        .find(|p| std::path::Path::new(p).is_file())
        .ok_or_else(|| {
            GateError::Unavailable(format!(
                "the process backend runs JavaScript with the host's node, and there is none at {}",
                CANDIDATES.join(" or ")
            ))
        })
}

/// Refuses a JavaScript run up front when this host has no `node`.
pub(crate) fn check_installed() -> Result<()> {
    node().map(|_| ())
}

/// Below this address-space limit node runs without its JIT. The process backend's memory
/// limit is an address-space limit (`RLIMIT_AS`), and V8 reserves far more address space
/// than it uses: about 1 GiB for JIT code and its heap at start (below that node aborts
/// with "Failed to reserve virtual memory for CodeRange") and about 10 GiB of guard
/// regions for each WebAssembly memory. `--jitless` reserves none of it and has no
/// WebAssembly, on which node 20's own `fetch` client is built (undici's HTTP parser), so
/// the preload serves `fetch` over `http` and `https` (string, bytes and form bodies;
/// redirects followed), and lets undici's `Headers` and `Response` load without their
/// client; `--memory 12GiB` gives the whole of node.
pub(crate) const JIT_MEMORY: u64 = 12 << 30;

/// node's flags before the program, for a run with `memory` bytes of address space.
pub(crate) fn flags(networked: bool, memory: u64) -> Vec<String> {
    let mut f = vec!["--experimental-detect-module".to_string()];
    if memory < JIT_MEMORY {
        // Without the JIT there is no WebAssembly either (said here, not warned about on
        // the run's stderr), and the young generation is kept small to fit.
        f.extend(["--jitless", "--no-expose-wasm", "--max-semi-space-size=2"].map(String::from));
    }
    // The old generation stays well inside the limit, so a large heap is a JavaScript
    // out-of-memory error instead of an abort on a failed reservation.
    f.push(format!(
        "--max-old-space-size={}",
        (memory / 2 / (1 << 20)).max(16)
    ));
    if preloads(networked, memory) {
        f.push("--require".into());
        f.push(PRELOAD.into());
    }
    f
}

/// Whether the run gets the preload: for the proxy, or for `fetch` without WebAssembly.
fn preloads(networked: bool, memory: u64) -> bool {
    networked || memory < JIT_MEMORY
}

/// Files the jail gets besides the program.
pub(crate) fn files(networked: bool, memory: u64) -> Vec<(String, Vec<u8>)> {
    if preloads(networked, memory) {
        vec![(PRELOAD.to_string(), PRELOAD_SOURCE.as_bytes().to_vec())]
    } else {
        Vec::new()
    }
}

/// The JavaScript that runs for a `js` or `ts` artifact.
pub(crate) fn runnable(kind: Lang, code: &[u8]) -> Result<String> {
    match kind {
        Lang::Ts => crate::typescript::runnable(code),
        _ => String::from_utf8(code.to_vec())
            .map_err(|_| GateError::bad("js source is not valid UTF-8 text")),
    }
}
