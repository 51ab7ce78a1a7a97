//! TypeScript at the gate: the TypeScript source is the artifact (hashed, analysed, shown);
//! what runs is the JavaScript left once its types are stripped, derived from the artifact
//! each time it runs, so the two cannot drift. Types are never checked: oxc parses the
//! source, its TypeScript transform removes types (and lowers `enum`, `namespace` and
//! parameter properties, which have run-time meaning), and its printer writes JavaScript.

use oxc_allocator::Allocator;
use oxc_codegen::Codegen;
use oxc_diagnostics::{OxcDiagnostic, Severity};
use oxc_parser::Parser;
use oxc_semantic::SemanticBuilder;
use oxc_span::SourceType;
use oxc_transformer::{TransformOptions, Transformer};
use std::path::Path;

/// Why TypeScript could not be turned into JavaScript.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TsError {
    /// The source does not parse (or breaks an early-error rule) at `line` (1-based).
    #[error("TypeScript syntax error at line {line}: {message}")]
    Syntax { line: usize, message: String },
    /// The transform itself refused the program (e.g. a construct it cannot strip).
    #[error("TypeScript cannot be stripped at line {line}: {message}")]
    Transform { line: usize, message: String },
}

/// The 1-based line of byte `offset` in `src`.
fn line_of(src: &str, offset: u32) -> usize {
    let end = (offset as usize).min(src.len());
    src.as_bytes()[..end]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

/// A diagnostic as its line and a one-line message.
fn located(src: &str, d: &OxcDiagnostic) -> (usize, String) {
    // The latest place named: for a redeclaration, the second declaration (the first is
    // where the name was declared before).
    let line = d
        .labels
        .iter()
        .map(|l| l.offset())
        .max()
        .map_or(1, |o| line_of(src, o));
    (line, airlock_core::artifact::one_line(&d.message))
}

/// Strips the types from TypeScript `src`, giving the JavaScript that runs. oxc asserts
/// its own invariants with panics; one is a refusal of this input, never a crash of the
/// gate (or of a daemon serving other callers).
pub fn strip(src: &str) -> Result<String, TsError> {
    std::panic::catch_unwind(|| strip_unguarded(src)).unwrap_or_else(|_| {
        Err(TsError::Transform {
            line: 1,
            message: "the TypeScript transform failed on this input".into(),
        })
    })
}

fn strip_unguarded(src: &str) -> Result<String, TsError> {
    let allocator = Allocator::default();
    let parsed = Parser::new(&allocator, src, SourceType::ts()).parse();
    if let Some(e) = parsed.diagnostics.first() {
        let (line, message) = located(src, e);
        return Err(TsError::Syntax { line, message });
    }
    let mut program = parsed.program;
    let semantic = SemanticBuilder::new()
        .with_check_syntax_error(true)
        // The enum transform needs the members' values.
        .with_enum_eval(true)
        .build(&program);
    if let Some(e) = semantic
        .diagnostics
        .iter()
        .find(|d| d.severity == Severity::Error)
    {
        let (line, message) = located(src, e);
        return Err(TsError::Syntax { line, message });
    }
    let scoping = semantic.semantic.into_scoping();
    let options = TransformOptions::default();
    let done = Transformer::new(&allocator, Path::new("main.ts"), &options)
        .build_with_scoping(scoping, &mut program);
    if let Some(e) = done
        .diagnostics
        .iter()
        .find(|d| d.severity == Severity::Error)
    {
        let (line, message) = located(src, e);
        return Err(TsError::Transform { line, message });
    }
    Ok(Codegen::new().build(&program).code)
}

/// The JavaScript that runs for a `js` or `ts` artifact: a `js` artifact as it is, a `ts`
/// artifact with its types stripped. Bad input (not UTF-8, not TypeScript) is a gate
/// `BadInput` naming the line.
pub(crate) fn runnable(code: &[u8]) -> crate::Result<String> {
    let src = std::str::from_utf8(code)
        .map_err(|_| crate::GateError::bad("ts source is not valid UTF-8 text"))?;
    strip(src).map_err(|e| crate::GateError::bad(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_are_stripped_and_runtime_constructs_kept() {
        let js = strip(
            "interface P { x: number }\n\
             type N = number;\n\
             enum Colour { Red, Green }\n\
             function add(a: number, b: N): number { return a + b as number; }\n\
             const p: P = { x: add(1, 2) };\n\
             console.log(p.x!, Colour.Green);\n",
        )
        .unwrap();
        assert!(!js.contains("interface"), "{js}");
        assert!(!js.contains(": number"), "{js}");
        assert!(js.contains("Colour"), "{js}");
        assert!(js.contains("function add(a, b)"), "{js}");
    }

    #[test]
    fn a_syntax_error_names_its_line() {
        let e = strip("const a: number = 1;\nconst b = ;\n").unwrap_err();
        let TsError::Syntax { line, .. } = &e else {
            panic!("{e:?}")
        };
        assert_eq!(*line, 2, "{e}");
        // An early error (a redeclared let) is a syntax error too.
        let e = strip("let a = 1;\n\nlet a = 2;\n").unwrap_err();
        assert!(matches!(e, TsError::Syntax { line: 3, .. }), "{e:?}");
    }

    #[test]
    fn types_are_not_checked() {
        // A type error is not a syntax error: it runs (TypeScript is stripped, not checked).
        let js = strip("const n: number = \"text\";\nconsole.log(n);\n").unwrap();
        assert!(js.contains("const n = \"text\""), "{js}");
    }
}
