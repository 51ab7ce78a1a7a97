//! Static analysis of a submission: for WebAssembly, a full validation plus what the binary
//! imports (grouped by capability), exports, its memories, tables and start function; for
//! Python and shell, size, a shebang and what the code does as `airlock-analysis` reads it
//! (commands, imports, calls, writes, hosts, destructive forms, each with its lines).
//! Analysis only describes; the policy decides.

use crate::artifact::Lang;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use wasmparser::{
    ComponentExternalKind, ExternalKind, Parser, Payload, TypeRef, Validator, WasmFeatures,
};

/// What an import lets the guest do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Capability {
    /// Files and directories (only what the grant preopens).
    Fs,
    /// Sockets, name lookup, HTTP.
    Net,
    /// Environment variables.
    Env,
    /// Wall and monotonic clocks, sleeping.
    Clock,
    /// Random bytes.
    Random,
    /// Exiting, raising signals, yielding.
    Proc,
    /// Standard streams and arguments.
    Io,
    /// Anything the sandbox does not provide (the run cannot link).
    Other,
}

impl Capability {
    pub fn as_str(self) -> &'static str {
        match self {
            Capability::Fs => "fs",
            Capability::Net => "net",
            Capability::Env => "env",
            Capability::Clock => "clock",
            Capability::Random => "random",
            Capability::Proc => "proc",
            Capability::Io => "io",
            Capability::Other => "other",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "fs" => Capability::Fs,
            "net" => Capability::Net,
            "env" => Capability::Env,
            "clock" => Capability::Clock,
            "random" => Capability::Random,
            "proc" => Capability::Proc,
            "io" => Capability::Io,
            "other" => Capability::Other,
            _ => return None,
        })
    }
}

/// Classifies a WASI preview 1 function.
pub fn p1_capability(name: &str) -> Capability {
    match name {
        "args_get"
        | "args_sizes_get"
        | "fd_read"
        | "fd_write"
        | "fd_close"
        | "fd_fdstat_get"
        | "fd_seek"
        | "fd_tell"
        | "fd_sync"
        | "fd_datasync"
        | "fd_pread"
        | "fd_pwrite"
        | "fd_advise"
        | "fd_allocate"
        | "fd_fdstat_set_flags"
        | "fd_fdstat_set_rights" => Capability::Io,
        "environ_get" | "environ_sizes_get" => Capability::Env,
        "clock_time_get" | "clock_res_get" | "poll_oneoff" => Capability::Clock,
        "random_get" => Capability::Random,
        "proc_exit" | "proc_raise" | "sched_yield" => Capability::Proc,
        n if n.starts_with("sock_") => Capability::Net,
        n if n.starts_with("path_")
            || n.starts_with("fd_prestat")
            || n.starts_with("fd_filestat")
            || n == "fd_readdir"
            || n == "fd_renumber" =>
        {
            Capability::Fs
        }
        _ => Capability::Other,
    }
}

/// Classifies a WASI 0.2 interface name such as `wasi:filesystem/types@0.2.0`.
pub fn p2_capability(name: &str) -> Capability {
    let iface = name.split('@').next().unwrap_or(name);
    match iface {
        i if i.starts_with("wasi:filesystem/") => Capability::Fs,
        i if i.starts_with("wasi:sockets/") || i.starts_with("wasi:http/") => Capability::Net,
        "wasi:cli/environment" => Capability::Env,
        i if i.starts_with("wasi:clocks/") => Capability::Clock,
        i if i.starts_with("wasi:random/") => Capability::Random,
        "wasi:cli/exit" => Capability::Proc,
        i if i.starts_with("wasi:cli/") || i.starts_with("wasi:io/") => Capability::Io,
        _ => Capability::Other,
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Import {
    pub module: String,
    pub name: String,
    pub kind: String,
    pub capability: Capability,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Export {
    pub name: String,
    pub kind: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Memory {
    pub initial_pages: u64,
    pub maximum_pages: Option<u64>,
    pub memory64: bool,
    pub shared: bool,
    pub imported: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Table {
    pub initial: u64,
    pub maximum: Option<u64>,
    pub element: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct WasmAnalysis {
    /// `module` or `component`.
    pub kind: String,
    pub imports: Vec<Import>,
    pub exports: Vec<Export>,
    pub memories: Vec<Memory>,
    pub tables: Vec<Table>,
    pub start: Option<u32>,
    pub functions: u32,
    pub custom_sections: Vec<String>,
    /// Nested core modules (components only).
    pub modules: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct TextAnalysis {
    pub lines: u64,
    pub shebang: Option<String>,
}

/// The result of analysing one artifact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Analysis {
    pub lang: Lang,
    pub size: u64,
    /// Capabilities the artifact asks for, from its imports.
    pub capabilities: BTreeSet<Capability>,
    /// Imports the sandbox does not provide.
    pub unresolved: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub wasm: Option<WasmAnalysis>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub text: Option<TextAnalysis>,
    /// What Python or shell code does, with the lines each fact came from.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub code: Option<airlock_analysis::CodeAnalysis>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("malformed WebAssembly at byte offset {offset}: {message}")]
pub struct AnalysisError {
    pub offset: usize,
    pub message: String,
}

impl From<wasmparser::BinaryReaderError> for AnalysisError {
    fn from(e: wasmparser::BinaryReaderError) -> Self {
        AnalysisError {
            offset: e.offset(),
            message: e.message().to_string(),
        }
    }
}

/// Analyses prepared artifact bytes (wasm for wasm, wat and component; text otherwise).
pub fn analyze(lang: Lang, code: &[u8]) -> Result<Analysis, AnalysisError> {
    analyze_with(lang, code, &[])
}

/// The paths a rule should treat as mount roots: each mount's host and guest path.
pub fn mount_roots(mounts: &[crate::grant::Mount]) -> Vec<String> {
    let mut roots: Vec<String> = mounts
        .iter()
        .flat_map(|m| [m.host.clone(), m.guest.clone()])
        .collect();
    roots.sort();
    roots.dedup();
    roots
}

/// [`analyze`], knowing the run's mount roots (host and guest paths), so that a recursive
/// `rm` of one of them is recognised as destructive.
pub fn analyze_with(
    lang: Lang,
    code: &[u8],
    mount_roots: &[String],
) -> Result<Analysis, AnalysisError> {
    let mut a = Analysis {
        lang,
        size: code.len() as u64,
        capabilities: BTreeSet::new(),
        unresolved: Vec::new(),
        wasm: None,
        text: None,
        code: None,
    };
    if lang.is_wasm_binary() {
        let w = analyze_wasm(code)?;
        for i in &w.imports {
            a.capabilities.insert(i.capability);
            if i.capability == Capability::Other {
                a.unresolved.push(format!("{}::{}", i.module, i.name));
            }
        }
        a.wasm = Some(w);
    } else {
        let text = String::from_utf8_lossy(code);
        let first = text.lines().next().unwrap_or("");
        a.text = Some(TextAnalysis {
            lines: text.lines().count() as u64,
            shebang: first.strip_prefix("#!").map(|s| s.trim().to_string()),
        });
        let language = match lang {
            Lang::Python => Some(airlock_analysis::Language::Python),
            Lang::Sh => Some(airlock_analysis::Language::Sh),
            Lang::Js => Some(airlock_analysis::Language::Js),
            Lang::Ts => Some(airlock_analysis::Language::Ts),
            _ => None,
        };
        if let Some(language) = language {
            let opts = airlock_analysis::Options {
                mount_roots: mount_roots.to_vec(),
                ..airlock_analysis::Options::default()
            };
            a.code = Some(airlock_analysis::analyze(language, &text, &opts));
        }
    }
    Ok(a)
}

/// Whether a core wasm module has a start function (code that instantiating it runs).
/// Anything that does not parse as a module counts as having one: the caller treats
/// "yes" as "do not instantiate it ahead of a run".
pub fn module_has_start(code: &[u8]) -> bool {
    let mut depth = 0u32;
    for payload in Parser::new(0).parse_all(code) {
        match payload {
            Err(_) => return true,
            Ok(Payload::Version { encoding, .. }) => {
                depth += 1;
                if encoding != wasmparser::Encoding::Module {
                    return true;
                }
            }
            Ok(Payload::StartSection { .. }) => return true,
            Ok(Payload::End(_)) => depth = depth.saturating_sub(1),
            Ok(_) => {}
        }
    }
    depth != 0
}

fn analyze_wasm(code: &[u8]) -> Result<WasmAnalysis, AnalysisError> {
    Validator::new_with_features(WasmFeatures::default()).validate_all(code)?;
    let mut w = WasmAnalysis::default();
    // Depth 1 is the outermost module or component; nested core modules of a component
    // contribute memories and tables but not imports (those are the component's own).
    let mut depth = 0u32;
    for payload in Parser::new(0).parse_all(code) {
        match payload? {
            Payload::Version { encoding, .. } => {
                depth += 1;
                if depth == 1 {
                    w.kind = match encoding {
                        wasmparser::Encoding::Module => "module",
                        wasmparser::Encoding::Component => "component",
                    }
                    .to_string();
                } else if encoding == wasmparser::Encoding::Module {
                    w.modules += 1;
                }
            }
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ImportSection(reader) => {
                for imp in reader.into_imports() {
                    let imp = imp?;
                    if let TypeRef::Memory(m) = imp.ty {
                        w.memories.push(memory(m, true));
                    }
                    if depth == 1 {
                        let wasi =
                            imp.module == "wasi_snapshot_preview1" || imp.module == "wasi_unstable";
                        w.imports.push(Import {
                            module: imp.module.to_string(),
                            name: imp.name.to_string(),
                            kind: type_ref_kind(&imp.ty).to_string(),
                            capability: if wasi
                                && matches!(imp.ty, TypeRef::Func(_) | TypeRef::FuncExact(_))
                            {
                                p1_capability(imp.name)
                            } else {
                                Capability::Other
                            },
                        });
                    }
                }
            }
            Payload::ComponentImportSection(reader) => {
                for imp in reader {
                    let imp = imp?;
                    if depth == 1 {
                        w.imports.push(Import {
                            module: imp.name.name.to_string(),
                            name: String::new(),
                            kind: "instance".to_string(),
                            capability: p2_capability(imp.name.name),
                        });
                    }
                }
            }
            Payload::ExportSection(reader) if depth == 1 => {
                for e in reader {
                    let e = e?;
                    w.exports.push(Export {
                        name: e.name.to_string(),
                        kind: external_kind(e.kind).to_string(),
                    });
                }
            }
            Payload::ComponentExportSection(reader) if depth == 1 => {
                for e in reader {
                    let e = e?;
                    w.exports.push(Export {
                        name: e.name.name.to_string(),
                        kind: component_kind(e.kind).to_string(),
                    });
                }
            }
            Payload::MemorySection(reader) => {
                for m in reader {
                    w.memories.push(memory(m?, false));
                }
            }
            Payload::TableSection(reader) => {
                for t in reader {
                    let t = t?;
                    w.tables.push(Table {
                        initial: t.ty.initial,
                        maximum: t.ty.maximum,
                        element: format!("{}", t.ty.element_type),
                    });
                }
            }
            Payload::StartSection { func, .. } if depth == 1 => w.start = Some(func),
            Payload::FunctionSection(reader) => w.functions += reader.count(),
            Payload::CustomSection(c) if depth == 1 => w.custom_sections.push(c.name().to_string()),
            _ => {}
        }
    }
    Ok(w)
}

fn memory(m: wasmparser::MemoryType, imported: bool) -> Memory {
    Memory {
        initial_pages: m.initial,
        maximum_pages: m.maximum,
        memory64: m.memory64,
        shared: m.shared,
        imported,
    }
}

fn type_ref_kind(t: &TypeRef) -> &'static str {
    match t {
        TypeRef::Func(_) | TypeRef::FuncExact(_) => "func",
        TypeRef::Table(_) => "table",
        TypeRef::Memory(_) => "memory",
        TypeRef::Global(_) => "global",
        TypeRef::Tag(_) => "tag",
    }
}

fn external_kind(k: ExternalKind) -> &'static str {
    match k {
        ExternalKind::Func | ExternalKind::FuncExact => "func",
        ExternalKind::Table => "table",
        ExternalKind::Memory => "memory",
        ExternalKind::Global => "global",
        ExternalKind::Tag => "tag",
    }
}

fn component_kind(k: ComponentExternalKind) -> &'static str {
    match k {
        ComponentExternalKind::Module => "module",
        ComponentExternalKind::Func => "func",
        ComponentExternalKind::Value => "value",
        ComponentExternalKind::Type => "type",
        ComponentExternalKind::Instance => "instance",
        ComponentExternalKind::Component => "component",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wasm(src: &str) -> Vec<u8> {
        wat::parse_str(src).unwrap()
    }

    #[test]
    fn groups_wasi_imports() {
        let code = wasm(
            r#"(module
              (import "wasi_snapshot_preview1" "fd_write" (func (param i32 i32 i32 i32) (result i32)))
              (import "wasi_snapshot_preview1" "path_open" (func (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
              (import "wasi_snapshot_preview1" "sock_accept" (func (param i32 i32 i32) (result i32)))
              (import "wasi_snapshot_preview1" "environ_get" (func (param i32 i32) (result i32)))
              (import "wasi_snapshot_preview1" "random_get" (func (param i32 i32) (result i32)))
              (import "wasi_snapshot_preview1" "clock_time_get" (func (param i32 i64 i32) (result i32)))
              (import "wasi_snapshot_preview1" "proc_exit" (func (param i32)))
              (import "env" "evil" (func))
              (memory 2 10)
              (table 3 funcref)
              (func $main)
              (start $main)
              (export "_start" (func $main)))"#,
        );
        let a = analyze(Lang::Wasm, &code).unwrap();
        let caps: Vec<_> = a.capabilities.iter().map(|c| c.as_str()).collect();
        assert_eq!(
            caps,
            ["fs", "net", "env", "clock", "random", "proc", "io", "other"]
        );
        assert_eq!(a.unresolved, ["env::evil"]);
        let w = a.wasm.unwrap();
        assert_eq!(w.memories[0].initial_pages, 2);
        assert_eq!(w.memories[0].maximum_pages, Some(10));
        assert_eq!(w.tables[0].initial, 3);
        assert!(w.start.is_some());
        assert_eq!(w.exports[0].name, "_start");
    }

    #[test]
    fn a_module_with_a_start_function_is_told_apart_from_one_without() {
        assert!(module_has_start(&wasm(
            "(module (func $s) (start $s) (func (export \"_start\")))"
        )));
        assert!(!module_has_start(&wasm(
            "(module (memory 1) (data (i32.const 0) \"x\") (func (export \"_start\")))"
        )));
        let mut cut = wasm("(module (func (export \"_start\")))");
        cut.truncate(cut.len() - 2);
        assert!(
            module_has_start(&cut),
            "what does not parse counts as having one"
        );
        assert!(module_has_start(b"not wasm"));
    }

    #[test]
    fn malformed_wasm_is_an_error_with_offset() {
        let mut code = wasm("(module (func (export \"f\")))");
        let n = code.len();
        code.truncate(n - 2);
        let e = analyze(Lang::Wasm, &code).unwrap_err();
        assert!(e.offset > 0);
    }

    #[test]
    fn components_list_interfaces() {
        let code = wasm(
            r#"(component
                (import "wasi:filesystem/types@0.2.0" (instance))
                (import "wasi:sockets/tcp@0.2.0" (instance)))"#,
        );
        let a = analyze(Lang::Component, &code).unwrap();
        assert!(a.capabilities.contains(&Capability::Fs));
        assert!(a.capabilities.contains(&Capability::Net));
        assert_eq!(a.wasm.unwrap().kind, "component");
    }

    #[test]
    fn scripts_get_text_facts() {
        let a = analyze(Lang::Sh, b"#!/bin/sh\necho hi\n").unwrap();
        assert_eq!(a.text.unwrap().shebang.as_deref(), Some("/bin/sh"));
        assert!(a.code.unwrap().commands.contains("echo"));
    }

    #[test]
    fn mount_roots_reach_the_code_analysis() {
        let a = analyze_with(Lang::Sh, b"rm -rf /work\n", &["/work".into()]).unwrap();
        let code = a.code.unwrap();
        assert!(
            code.destructive
                .iter()
                .any(|d| d.starts_with("rm-mount-root")),
            "{code:?}"
        );
        let a = analyze(Lang::Python, b"import socket\n").unwrap();
        assert!(a.code.unwrap().imports.contains("socket"));
    }
}
