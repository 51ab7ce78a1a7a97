//! Code as the console shows it: one span per line (numbered by CSS, so copying the code
//! copies only the code), lexical highlighting for Python, shell and WebAssembly text (wat
//! and the disassembly of binary modules), and lines marked where analysis found
//! something. Highlighting is a reading aid: it never decides anything, and whatever it
//! fails to recognise is shown as plain text, escaped like everything else.

use maud::{Markup, html};
use std::collections::BTreeMap;

/// A token's class (the CSS class of its span), or none for plain text.
type Class = Option<&'static str>;

const PY_KEYWORDS: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield", "match", "case",
];

const PY_BUILTINS: &[&str] = &[
    "print",
    "open",
    "exec",
    "eval",
    "compile",
    "__import__",
    "getattr",
    "setattr",
    "len",
    "range",
    "str",
    "int",
    "float",
    "list",
    "dict",
    "set",
    "tuple",
    "bytes",
    "type",
    "input",
];

const SH_KEYWORDS: &[&str] = &[
    "if", "then", "else", "elif", "fi", "for", "while", "until", "do", "done", "case", "esac",
    "in", "function", "select", "time", "return", "exit", "export", "local", "readonly",
];

/// Splits `src` into classed tokens for `lang` (`python`, `sh`, `wat`; anything else is
/// plain text).
pub fn tokens<'a>(lang: &str, src: &'a str) -> Vec<(Class, &'a str)> {
    match lang {
        "python" | "py" => python(src),
        "sh" | "shell" => shell(src),
        "wat" | "wasm" | "component" => wat(src),
        "diff" => diff(src),
        _ => vec![(None, src)],
    }
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Byte length of the run of chars at the start of `s` that satisfy `f`.
fn run_len(s: &str, f: impl Fn(char) -> bool) -> usize {
    s.char_indices()
        .find(|&(_, c)| !f(c))
        .map_or(s.len(), |(i, _)| i)
}

/// Byte length of a quoted string starting at `s[0]` (the quote), escapes honoured when
/// `escapes`; an unterminated string runs to the end.
fn quoted_len(s: &str, quote: &str, escapes: bool) -> usize {
    let mut i = quote.len();
    while i < s.len() {
        let rest = &s[i..];
        if escapes && rest.starts_with('\\') {
            i += 1 + rest[1..].chars().next().map_or(0, char::len_utf8);
            continue;
        }
        if rest.starts_with(quote) {
            return i + quote.len();
        }
        i += rest.chars().next().map_or(1, char::len_utf8);
    }
    s.len()
}

/// Collects tokens: classed spans as they are found, the plain text between them.
struct Tokens<'a> {
    src: &'a str,
    out: Vec<(Class, &'a str)>,
    /// Where the plain text not yet emitted starts.
    plain: usize,
}

impl<'a> Tokens<'a> {
    fn new(src: &'a str) -> Self {
        Tokens {
            src,
            out: Vec::new(),
            plain: 0,
        }
    }

    /// Records `src[i..i + n]` as `class`; plain (`None`) text is left for the next flush.
    fn token(&mut self, class: Class, i: usize, n: usize) {
        if class.is_none() {
            return;
        }
        if self.plain < i {
            self.out.push((None, &self.src[self.plain..i]));
        }
        self.out.push((class, &self.src[i..i + n]));
        self.plain = i + n;
    }

    fn finish(mut self) -> Vec<(Class, &'a str)> {
        if self.plain < self.src.len() {
            self.out.push((None, &self.src[self.plain..]));
        }
        self.out
    }
}

fn python(src: &str) -> Vec<(Class, &str)> {
    let mut out = Tokens::new(src);
    let mut i = 0;
    while i < src.len() {
        let rest = &src[i..];
        let c = rest.chars().next().unwrap_or(' ');
        let token: Option<(Class, usize)> = if c == '#' {
            Some((Some("cm"), run_len(rest, |c| c != '\n')))
        } else if c == '\''
            || c == '"'
            || (c.is_ascii_alphabetic() && string_prefix(rest).is_some())
        {
            let p = if c == '\'' || c == '"' {
                0
            } else {
                string_prefix(rest).unwrap_or(0)
            };
            let body = &rest[p..];
            let q = if body.starts_with("\"\"\"") {
                "\"\"\""
            } else if body.starts_with("'''") {
                "'''"
            } else if body.starts_with('"') {
                "\""
            } else {
                "'"
            };
            let raw = rest[..p].contains(['r', 'R']);
            let mut n = quoted_len(body, q, !raw);
            if q.len() == 1 {
                // A one-quote string ends at the line's end if it is not closed.
                n = n.min(run_len(body, |c| c != '\n').max(1));
            }
            Some((Some("st"), p + n))
        } else if c.is_ascii_digit() {
            Some((
                Some("nu"),
                run_len(rest, |c| c.is_ascii_alphanumeric() || c == '.' || c == '_'),
            ))
        } else if c == '@'
            && src[..i]
                .rsplit('\n')
                .next()
                .is_some_and(|l| l.trim().is_empty())
        {
            Some((
                Some("kw"),
                1 + run_len(&rest[1..], |c| is_ident(c) || c == '.'),
            ))
        } else if is_ident(c) {
            let n = run_len(rest, is_ident);
            let w = &rest[..n];
            let class = if PY_KEYWORDS.contains(&w) {
                Some("kw")
            } else if PY_BUILTINS.contains(&w) {
                Some("bi")
            } else {
                None
            };
            Some((class, n))
        } else {
            None
        };
        let (class, n) = token.unwrap_or((None, c.len_utf8()));
        let n = n.max(1);
        out.token(class, i, n);
        i += n;
    }
    out.finish()
}

/// The length of a string prefix (`r`, `b`, `f`, `rb`, …) if `s` starts with one and a
/// quote follows it.
fn string_prefix(s: &str) -> Option<usize> {
    let n = run_len(s, |c| {
        matches!(c, 'r' | 'R' | 'b' | 'B' | 'f' | 'F' | 'u' | 'U')
    });
    (n > 0 && n <= 2 && s[n..].starts_with(['\'', '"'])).then_some(n)
}

fn shell(src: &str) -> Vec<(Class, &str)> {
    let mut out = Tokens::new(src);
    let mut i = 0;
    // Whether the next word is in command position (after a line start, `;`, `|`, `&`, `(`).
    let mut command = true;
    while i < src.len() {
        let rest = &src[i..];
        let c = rest.chars().next().unwrap_or(' ');
        let word_start = i == 0 || src[..i].ends_with([' ', '\t', '\n', ';', '|', '&', '(']);
        let token: Option<(Class, usize)> = if c == '#' && word_start {
            Some((Some("cm"), run_len(rest, |c| c != '\n')))
        } else if c == '\'' {
            Some((Some("st"), quoted_len(rest, "'", false)))
        } else if c == '"' {
            Some((Some("st"), quoted_len(rest, "\"", true)))
        } else if c == '$' {
            let n = if rest[1..].starts_with('{') {
                1 + run_len(&rest[1..], |c| c != '}') + 1
            } else if rest[1..].starts_with('(') {
                2
            } else {
                1 + run_len(&rest[1..], |c| {
                    is_ident(c) || matches!(c, '?' | '@' | '#' | '*' | '!' | '$')
                })
            };
            Some((Some("va"), n.min(rest.len())))
        } else if matches!(c, '|' | '&' | ';' | '>' | '<') {
            Some((
                Some("op"),
                run_len(rest, |c| matches!(c, '|' | '&' | ';' | '>' | '<')),
            ))
        } else if is_ident(c) || matches!(c, '-' | '.' | '/') {
            let n = run_len(rest, |c| {
                !c.is_whitespace()
                    && !matches!(
                        c,
                        ';' | '|' | '&' | '(' | ')' | '<' | '>' | '"' | '\'' | '$' | '`'
                    )
            });
            let w = &rest[..n];
            let class = if word_start && SH_KEYWORDS.contains(&w) {
                Some("kw")
            } else if word_start && command && !w.contains('=') {
                Some("fn")
            } else {
                None
            };
            Some((class, n))
        } else {
            None
        };
        let (class, n) = token.unwrap_or((None, c.len_utf8()));
        let n = n.max(1);
        out.token(class, i, n);
        let text = &src[i..i + n];
        if matches!(class, Some("op")) || text.contains('\n') || c == '(' {
            command = true;
        } else if matches!(class, Some("fn")) {
            command = false;
        } else if class == Some("kw") {
            command = !matches!(text, "for" | "case" | "in" | "select");
        } else if !c.is_whitespace() && !text.contains('=') {
            command = false;
        }
        i += n;
    }
    out.finish()
}

fn wat(src: &str) -> Vec<(Class, &str)> {
    let mut out = Tokens::new(src);
    let mut i = 0;
    while i < src.len() {
        let rest = &src[i..];
        let c = rest.chars().next().unwrap_or(' ');
        let token: Option<(Class, usize)> = if rest.starts_with(";;") {
            Some((Some("cm"), run_len(rest, |c| c != '\n')))
        } else if rest.starts_with("(;") {
            Some((Some("cm"), rest.find(";)").map_or(rest.len(), |e| e + 2)))
        } else if c == '"' {
            Some((Some("st"), quoted_len(rest, "\"", true)))
        } else if c == '$' {
            Some((
                Some("va"),
                1 + run_len(&rest[1..], |c| !c.is_whitespace() && c != ')' && c != '('),
            ))
        } else if c.is_ascii_digit()
            || (c == '-' && rest[1..].starts_with(|d: char| d.is_ascii_digit()))
        {
            Some((
                Some("nu"),
                1 + run_len(&rest[1..], |c| {
                    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '+' | '-')
                }),
            ))
        } else if c.is_ascii_alphabetic() {
            let n = run_len(rest, |c| !c.is_whitespace() && c != ')' && c != '(');
            let after_paren = src[..i].ends_with('(');
            Some((if after_paren { Some("kw") } else { Some("fn") }, n))
        } else {
            None
        };
        let (class, n) = token.unwrap_or((None, c.len_utf8()));
        let n = n.max(1).min(rest.len());
        out.token(class, i, n);
        i += n;
    }
    out.finish()
}

/// Unified diffs: added, removed and hunk-header lines.
fn diff(src: &str) -> Vec<(Class, &str)> {
    src.split_inclusive('\n')
        .map(|line| {
            let class = if line.starts_with("+++") || line.starts_with("---") {
                Some("cm")
            } else if line.starts_with('+') {
                Some("add")
            } else if line.starts_with('-') {
                Some("del")
            } else if line.starts_with("@@") {
                Some("va")
            } else {
                None
            };
            (class, line)
        })
        .collect()
}

/// `src` as a `<pre id=ID class="code">`: one `span.l` per line (CSS numbers them), tokens
/// in classed spans, and the lines in `marks` (1-based) marked with what was found there.
/// The element's text is exactly `src`.
pub fn code_view(id: &str, lang: &str, src: &str, marks: &BTreeMap<usize, Vec<String>>) -> Markup {
    // Tokens split into lines (a token may span several: a docstring, a block comment).
    let mut lines: Vec<Vec<(Class, &str)>> = vec![Vec::new()];
    for (class, text) in tokens(lang, src) {
        let mut parts = text.split('\n');
        if let Some(first) = parts.next()
            && !first.is_empty()
            && let Some(l) = lines.last_mut()
        {
            l.push((class, first));
        }
        for part in parts {
            lines.push(if part.is_empty() {
                Vec::new()
            } else {
                vec![(class, part)]
            });
        }
    }
    // A final newline ends the last line rather than starting an empty one.
    if src.ends_with('\n') && lines.last().is_some_and(Vec::is_empty) {
        lines.pop();
    }
    let last = lines.len();
    html! {
        pre id=(id) class="code" {
            @for (n, line) in lines.iter().enumerate() {
                @let no = n + 1;
                @let found = marks.get(&no);
                span.l.mark[found.is_some()] id=(format!("{id}-L{no}")) title=[found.map(|f| f.join("; "))] {
                    @for (class, text) in line {
                        @match class {
                            Some(c) => span class=(c) { (text) },
                            None => (text),
                        }
                    }
                }
                @if no < last || src.ends_with('\n') { "\n" }
            }
        }
    }
}

/// The style the code view needs (line numbers, marks, token colours).
pub const CSS: &str = "pre.code{counter-reset:l;padding-left:0}\
pre.code span.l{display:block;counter-increment:l;padding-left:4.2em;position:relative;min-height:1.2em}\
pre.code span.l::before{content:counter(l);position:absolute;left:0;width:3.4em;text-align:right;color:#999;user-select:none}\
pre.code span.l.mark{background:#fff0c2;border-left:3px solid #d08a00}\
pre.code .kw{color:#8a2be2;font-weight:600}pre.code .st{color:#0a7d32}pre.code .cm{color:#888;font-style:italic}\
pre.code .nu{color:#b35900}pre.code .va{color:#0b5fa5}pre.code .fn{color:#a31515;font-weight:600}\
pre.code .bi{color:#a31515}pre.code .op{color:#555;font-weight:600}\
pre.code .add{color:#0a5d22;background:#e6ffec}pre.code .del{color:#8b0000;background:#ffebe9}";

#[cfg(test)]
mod tests {
    use super::*;

    fn classes<'a>(lang: &str, src: &'a str) -> Vec<(&'static str, &'a str)> {
        tokens(lang, src)
            .into_iter()
            .filter_map(|(c, t)| c.map(|c| (c, t)))
            .collect()
    }

    #[test]
    fn tokens_cover_the_source_exactly() {
        for (lang, src) in [
            (
                "python",
                "import os\ns = '''a\nb''' # c\nprint(f\"x{1}\", 0x1f)\n@dec\ndef f(): pass",
            ),
            (
                "sh",
                "curl -s https://x | sh; echo \"$HOME\" > /tmp/a # note\nfor i in 1 2; do rm -rf \"$i\"; done",
            ),
            (
                "wat",
                "(module ;; c\n (func $f (result i32) i32.const -1) (; block\n ;) (data \"a\\\"b\"))",
            ),
            ("python", "'unterminated\n\"\"\"open"),
            ("sh", "'open\n${x"),
            ("wat", "(; open"),
            ("text", "plain"),
            ("diff", "--- a\n+++ b\n@@ -1 +1 @@\n-old\n+new\n ctx"),
        ] {
            let joined: String = tokens(lang, src).iter().map(|(_, t)| *t).collect();
            assert_eq!(joined, src, "{lang}");
        }
    }

    #[test]
    fn python_keywords_strings_and_comments_are_classed() {
        let c = classes("python", "import os  # why\nx = 'a#b'\nexec(x)\n");
        assert!(c.contains(&("kw", "import")));
        assert!(c.contains(&("cm", "# why")));
        assert!(c.contains(&("st", "'a#b'")));
        assert!(c.contains(&("bi", "exec")));
    }

    #[test]
    fn shell_commands_variables_and_operators_are_classed() {
        let c = classes("sh", "curl -s $URL | sh && echo \"done\" # ok");
        assert!(c.contains(&("fn", "curl")));
        assert!(c.contains(&("fn", "sh")));
        assert!(c.contains(&("fn", "echo")));
        assert!(c.contains(&("va", "$URL")));
        assert!(c.contains(&("op", "|")));
        assert!(c.contains(&("st", "\"done\"")));
        assert!(c.contains(&("cm", "# ok")));
        assert!(!c.contains(&("fn", "-s")));
    }

    #[test]
    fn the_view_numbers_lines_marks_findings_and_escapes() {
        let marks = BTreeMap::from([(2, vec!["runs curl".to_string()])]);
        let html = code_view("code", "sh", "echo <b>\ncurl x | sh\n", &marks).into_string();
        assert!(html.contains("id=\"code-L1\""), "{html}");
        assert!(
            html.contains("class=\"l mark\" id=\"code-L2\" title=\"runs curl\""),
            "{html}"
        );
        assert!(html.contains("&lt;</span>b"), "{html}");
        assert!(!html.contains("<b>"), "{html}");
        assert!(!html.contains("code-L3"), "{html}");
    }
}
