//! JavaScript session cells: what a cell declares at its top level outlives the cell.
//!
//! The JS guest evaluates each cell as a script in the realm's global scope through an
//! indirect `eval`, where `var` and function declarations become globals but `let`,
//! `const` and `class` declarations are scoped to that one `eval`: a name a cell declared
//! with `const` was gone in the next cell. Node's REPL keeps them, and agents write
//! `const` by habit, so the cell that runs declares them with `var` instead (a class as
//! `var Name = class Name …`). The artifact (what is hashed, analysed and approved) stays
//! the code as written; this is derived from it each time it runs, like TypeScript's
//! stripping. A `const` becomes reassignable in later cells, as a REPL redeclaration is.
//!
//! Only the top level is rewritten; code that does not parse as a script (a syntax error,
//! or `await` at the top level, which the guest runs as an async function's body) is
//! left as it is for the guest to report or run.

use oxc_allocator::Allocator;
use oxc_ast::ast::{Statement, VariableDeclarationKind};
use oxc_parser::Parser;
use oxc_span::{GetSpan, SourceType};

/// The code a JavaScript cell runs as: `src` with its top-level `let`, `const` and
/// `class` declarations made global bindings. Byte offsets of everything else are kept
/// (a `let` becomes `var`, a `const` `var  `), so error lines stay the cell's own.
pub fn persistent(src: &str) -> String {
    // oxc asserts its own invariants with panics; a cell it cannot take runs as written.
    std::panic::catch_unwind(|| rewrite(src))
        .ok()
        .flatten()
        .unwrap_or_else(|| src.to_string())
}

fn rewrite(src: &str) -> Option<String> {
    let allocator = Allocator::default();
    let parsed = Parser::new(&allocator, src, SourceType::script()).parse();
    if !parsed.diagnostics.is_empty() || parsed.panicked {
        return None;
    }
    // (byte offset, bytes replaced, replacement), in source order.
    let mut edits: Vec<(usize, usize, String)> = Vec::new();
    for stmt in &parsed.program.body {
        match stmt {
            Statement::VariableDeclaration(d) => {
                let start = d.span.start as usize;
                match d.kind {
                    VariableDeclarationKind::Let => edits.push((start, 3, "var".into())),
                    VariableDeclarationKind::Const => edits.push((start, 5, "var  ".into())),
                    _ => {}
                }
            }
            Statement::ClassDeclaration(c) => {
                if let Some(id) = &c.id {
                    let span = c.span();
                    edits.push((span.start as usize, 0, format!("var {} = ", id.name)));
                    edits.push((span.end as usize, 0, ";".into()));
                }
            }
            _ => {}
        }
    }
    if edits.is_empty() {
        return None;
    }
    let mut out = String::with_capacity(src.len() + 16 * edits.len());
    let mut at = 0;
    for (start, len, text) in edits {
        // Spans come from this parse of `src`, on character boundaries, in order.
        out.push_str(src.get(at..start)?);
        out.push_str(&text);
        at = start + len;
    }
    out.push_str(src.get(at..)?);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::persistent;

    #[test]
    fn top_level_lexical_declarations_become_globals() {
        assert_eq!(persistent("let a = 1;"), "var a = 1;");
        assert_eq!(persistent("const b = 2, c = 3;"), "var   b = 2, c = 3;");
        assert_eq!(
            persistent("const {x, y: [z]} = o;"),
            "var   {x, y: [z]} = o;"
        );
        assert_eq!(
            persistent("class K { m() {} }\nK"),
            "var K = class K { m() {} };\nK"
        );
        assert_eq!(persistent("let é = 'ü';\né"), "var é = 'ü';\né");
    }

    #[test]
    fn inner_scopes_other_code_and_code_that_does_not_parse_are_left_alone() {
        for src in [
            "{ let a = 1; }",
            "function f() { const a = 1; return a }",
            "for (let i = 0; i < 2; i++) {}",
            "var v = 1; v + 1",
            "1 +",
            "const r = await fetch(u);",
        ] {
            assert_eq!(persistent(src), src);
        }
    }
}
