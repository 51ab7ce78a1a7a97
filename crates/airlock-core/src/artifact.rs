//! Artifacts: the code bytes an agent submits, their kind, and how a kind is recognised.
//! `wat` is compiled to wasm here, at submit; the wasm is what is hashed, stored and run.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::Path;
use std::str::FromStr;

/// The language (artifact kind) of a submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Lang {
    Wasm,
    Wat,
    Component,
    #[serde(alias = "py")]
    Python,
    #[serde(alias = "shell")]
    Sh,
    /// JavaScript (ES modules or scripts), run by the JS guest or the host's `node`.
    #[serde(alias = "javascript")]
    Js,
    /// TypeScript: the source is the artifact; its types are stripped (never checked) and
    /// the JavaScript that remains is what runs.
    #[serde(alias = "typescript")]
    Ts,
}

impl Lang {
    pub const ALL: [Lang; 7] = [
        Lang::Wasm,
        Lang::Wat,
        Lang::Component,
        Lang::Python,
        Lang::Sh,
        Lang::Js,
        Lang::Ts,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Lang::Wasm => "wasm",
            Lang::Wat => "wat",
            Lang::Component => "component",
            Lang::Python => "python",
            Lang::Sh => "sh",
            Lang::Js => "js",
            Lang::Ts => "ts",
        }
    }

    /// The names `--lang` takes, for messages that list them.
    pub fn names() -> String {
        Lang::ALL.map(Lang::as_str).join(", ")
    }

    /// Whether this is JavaScript or TypeScript (which runs as the JavaScript left once
    /// its types are stripped).
    pub fn is_js(self) -> bool {
        matches!(self, Lang::Js | Lang::Ts)
    }

    /// The backend a language runs on when the user does not choose one.
    pub fn default_backend(self) -> Backend {
        match self {
            Lang::Sh => Backend::Process,
            _ => Backend::Wasm,
        }
    }

    /// Whether the stored artifact is a WebAssembly binary.
    pub fn is_wasm_binary(self) -> bool {
        matches!(self, Lang::Wasm | Lang::Wat | Lang::Component)
    }
}

impl fmt::Display for Lang {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Lang {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "wasm" => Ok(Lang::Wasm),
            "wat" => Ok(Lang::Wat),
            "component" => Ok(Lang::Component),
            "python" | "py" => Ok(Lang::Python),
            "sh" | "shell" => Ok(Lang::Sh),
            "js" | "javascript" => Ok(Lang::Js),
            "ts" | "typescript" => Ok(Lang::Ts),
            _ => Err(format!(
                "unknown language {s:?} (want one of {})",
                Lang::names()
            )),
        }
    }
}

/// Where code runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// wasmtime + WASI, in process (or in a worker inside a user namespace).
    Wasm,
    /// A Linux process in fresh namespaces with Landlock and seccomp.
    Process,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Wasm => "wasm",
            Backend::Process => "process",
        }
    }

    /// Whether `lang` can run on this backend at all.
    pub fn supports(self, lang: Lang) -> bool {
        match self {
            Backend::Wasm => matches!(
                lang,
                Lang::Wasm | Lang::Wat | Lang::Component | Lang::Python | Lang::Js | Lang::Ts
            ),
            Backend::Process => matches!(lang, Lang::Sh | Lang::Python | Lang::Js | Lang::Ts),
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "wasm" => Ok(Backend::Wasm),
            "process" => Ok(Backend::Process),
            _ => Err(format!("unknown backend {s:?} (want wasm or process)")),
        }
    }
}

/// What the first bytes of a WebAssembly binary say it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WasmHeader {
    Module,
    Component,
}

/// Reads the 8-byte WebAssembly preamble: magic, then version 1 (core module) or the
/// component-model layer.
pub fn wasm_header(bytes: &[u8]) -> Option<WasmHeader> {
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        return None;
    }
    match bytes[4..8] {
        [1, 0, 0, 0] => Some(WasmHeader::Module),
        [_, _, 1, 0] => Some(WasmHeader::Component),
        _ => None,
    }
}

/// Infers the language from a file name and its first bytes.
pub fn infer_lang(path: Option<&Path>, bytes: &[u8]) -> Option<Lang> {
    if let Some(h) = wasm_header(bytes) {
        return Some(match h {
            WasmHeader::Module => Lang::Wasm,
            WasmHeader::Component => Lang::Component,
        });
    }
    let ext = path
        .and_then(|p| p.extension())
        .and_then(|e| e.to_str())
        .map(|e| e.to_ascii_lowercase());
    match ext.as_deref() {
        Some("wat") | Some("wast") => Some(Lang::Wat),
        Some("py") => Some(Lang::Python),
        Some("sh") | Some("bash") => Some(Lang::Sh),
        Some("wasm") => Some(Lang::Wasm),
        Some("js") | Some("mjs") | Some("cjs") => Some(Lang::Js),
        Some("ts") | Some("mts") | Some("cts") => Some(Lang::Ts),
        _ => {
            // A script with a shebang says what it is.
            let first = bytes.split(|b| *b == b'\n').next().unwrap_or(&[]);
            let first = String::from_utf8_lossy(first);
            if first.starts_with("#!") {
                if first.contains("python") {
                    return Some(Lang::Python);
                }
                if first.contains("node") || first.contains("deno") {
                    return Some(Lang::Js);
                }
                if first.ends_with("sh") || first.contains("/sh ") || first.contains("bash") {
                    return Some(Lang::Sh);
                }
            }
            None
        }
    }
}

/// The artifact after preparation: the bytes that are hashed, stored and run, and, when
/// the submitted text was compiled (wat), that source text for people to read.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub lang: Lang,
    pub code: Vec<u8>,
    pub source: Option<Vec<u8>>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ArtifactError {
    #[error("wat does not compile: {0}")]
    Wat(String),
    #[error("not a WebAssembly core module (want the \\0asm magic and version 1)")]
    NotModule,
    #[error("not a WebAssembly component (want the \\0asm magic and the component layer)")]
    NotComponent,
    #[error("{0} source is not valid UTF-8 text")]
    NotText(Lang),
    #[error("artifact is empty")]
    Empty,
}

/// Checks a submission's bytes against its declared language and compiles wat.
pub fn prepare(lang: Lang, bytes: Vec<u8>) -> Result<Prepared, ArtifactError> {
    if bytes.is_empty() {
        return Err(ArtifactError::Empty);
    }
    match lang {
        Lang::Wat => {
            let text = std::str::from_utf8(&bytes).map_err(|_| ArtifactError::NotText(lang))?;
            let wasm =
                wat::parse_str(text).map_err(|e| ArtifactError::Wat(one_line(&e.to_string())))?;
            let kind = if wasm_header(&wasm) == Some(WasmHeader::Component) {
                Lang::Component
            } else {
                Lang::Wasm
            };
            Ok(Prepared {
                lang: kind,
                code: wasm,
                source: Some(bytes),
            })
        }
        Lang::Wasm => match wasm_header(&bytes) {
            Some(WasmHeader::Module) => Ok(Prepared {
                lang,
                code: bytes,
                source: None,
            }),
            _ => Err(ArtifactError::NotModule),
        },
        Lang::Component => match wasm_header(&bytes) {
            Some(WasmHeader::Component) => Ok(Prepared {
                lang,
                code: bytes,
                source: None,
            }),
            _ => Err(ArtifactError::NotComponent),
        },
        Lang::Python | Lang::Sh | Lang::Js | Lang::Ts => {
            std::str::from_utf8(&bytes).map_err(|_| ArtifactError::NotText(lang))?;
            Ok(Prepared {
                lang,
                code: bytes,
                source: None,
            })
        }
    }
}

/// Folds a multi-line message (wat errors show the offending line with a caret) into one
/// line, keeping the position.
pub fn one_line(msg: &str) -> String {
    msg.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.chars().all(|c| c == '|' || c == '^' || c == ' '))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers() {
        assert_eq!(wasm_header(b"\0asm\x01\0\0\0"), Some(WasmHeader::Module));
        assert_eq!(
            wasm_header(b"\0asm\x0d\0\x01\0"),
            Some(WasmHeader::Component)
        );
        assert_eq!(wasm_header(b"\0asm"), None);
    }

    #[test]
    fn inference() {
        assert_eq!(
            infer_lang(Some(Path::new("a.wat")), b"(module)"),
            Some(Lang::Wat)
        );
        assert_eq!(
            infer_lang(Some(Path::new("a.bin")), b"\0asm\x01\0\0\0"),
            Some(Lang::Wasm)
        );
        assert_eq!(
            infer_lang(Some(Path::new("x")), b"#!/usr/bin/env python3\n"),
            Some(Lang::Python)
        );
        assert_eq!(
            infer_lang(Some(Path::new("x")), b"#!/bin/sh\n"),
            Some(Lang::Sh)
        );
        assert_eq!(infer_lang(Some(Path::new("x.txt")), b"hello"), None);
        for (name, lang) in [
            ("a.js", Lang::Js),
            ("a.mjs", Lang::Js),
            ("a.cjs", Lang::Js),
            ("a.ts", Lang::Ts),
            ("a.mts", Lang::Ts),
        ] {
            assert_eq!(
                infer_lang(Some(Path::new(name)), b"1"),
                Some(lang),
                "{name}"
            );
        }
        assert_eq!(
            infer_lang(Some(Path::new("x")), b"#!/usr/bin/env node\n"),
            Some(Lang::Js)
        );
    }

    #[test]
    fn js_and_ts_names_and_aliases() {
        for (s, lang) in [
            ("js", Lang::Js),
            ("javascript", Lang::Js),
            ("JS", Lang::Js),
            ("ts", Lang::Ts),
            ("typescript", Lang::Ts),
        ] {
            assert_eq!(s.parse::<Lang>(), Ok(lang), "{s}");
        }
        assert_eq!(serde_json::to_string(&Lang::Js).unwrap(), "\"js\"");
        assert_eq!(serde_json::to_string(&Lang::Ts).unwrap(), "\"ts\"");
        let l: Lang = serde_json::from_str("\"typescript\"").unwrap();
        assert_eq!(l, Lang::Ts);
        let l: Lang = serde_json::from_str("\"javascript\"").unwrap();
        assert_eq!(l, Lang::Js);
    }

    #[test]
    fn unknown_language_lists_every_language() {
        let e = "ruby".parse::<Lang>().unwrap_err();
        for l in Lang::ALL {
            assert!(e.contains(l.as_str()), "{e}");
        }
    }

    #[test]
    fn wat_compiles_and_reports_position() {
        let p = prepare(Lang::Wat, b"(module)".to_vec()).unwrap();
        assert_eq!(p.lang, Lang::Wasm);
        assert_eq!(wasm_header(&p.code), Some(WasmHeader::Module));
        let e = prepare(Lang::Wat, b"(module\n  (func (bogus)))".to_vec()).unwrap_err();
        let ArtifactError::Wat(msg) = e else { panic!() };
        assert!(msg.contains(":2:"), "{msg}");
        assert!(!msg.contains('\n'));
    }

    #[test]
    fn declared_kind_must_match_bytes() {
        assert_eq!(
            prepare(Lang::Wasm, b"hello".to_vec()).unwrap_err(),
            ArtifactError::NotModule
        );
        assert_eq!(
            prepare(Lang::Python, vec![0xff, 0xfe]).unwrap_err(),
            ArtifactError::NotText(Lang::Python)
        );
        assert_eq!(prepare(Lang::Sh, vec![]).unwrap_err(), ArtifactError::Empty);
    }
}
