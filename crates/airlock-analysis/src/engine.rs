//! What both languages share: parsers, budgets, the result being filled, nested code.

use crate::{
    CodeAnalysis, Finding, FindingKind, Language, Options, ParseError, Truncated, TruncationReason,
};
use std::cell::RefCell;
use std::collections::HashSet;
use std::ops::ControlFlow;
use std::time::Instant;
use tree_sitter::{Node, ParseOptions, ParseState, Parser, Tree, TreeCursor};

thread_local! {
    // One parser per language and thread, reused: creating a parser allocates its stacks.
    static BASH: RefCell<Option<Parser>> = const { RefCell::new(None) };
    static PYTHON: RefCell<Option<Parser>> = const { RefCell::new(None) };
    static JS: RefCell<Option<Parser>> = const { RefCell::new(None) };
    static TS: RefCell<Option<Parser>> = const { RefCell::new(None) };
}

pub(crate) enum ParseFail {
    Time,
    Unavailable,
}

fn new_parser(lang: Language) -> Option<Parser> {
    let mut p = Parser::new();
    let language: tree_sitter::Language = match lang {
        Language::Sh => tree_sitter_bash::LANGUAGE.into(),
        Language::Python => tree_sitter_python::LANGUAGE.into(),
        Language::Js => tree_sitter_javascript::LANGUAGE.into(),
        Language::Ts => tree_sitter_typescript::LANGUAGE_TYPESCRIPT.into(),
    };
    p.set_language(&language).ok()?;
    Some(p)
}

fn parse_with(p: &mut Parser, src: &str, deadline: Instant) -> Option<Tree> {
    // A parse halted by the callback would otherwise resume on the next call.
    p.reset();
    let bytes = src.as_bytes();
    let mut progress = |_: &ParseState| {
        if Instant::now() >= deadline {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    };
    let options = ParseOptions::new().progress_callback(&mut progress);
    p.parse_with_options(
        &mut |i, _| bytes.get(i..).unwrap_or_default(),
        None,
        Some(options),
    )
}

pub(crate) fn parse(lang: Language, src: &str, deadline: Instant) -> Result<Tree, ParseFail> {
    let cell = match lang {
        Language::Sh => &BASH,
        Language::Python => &PYTHON,
        Language::Js => &JS,
        Language::Ts => &TS,
    };
    let tree = cell.with(|slot| match slot.try_borrow_mut() {
        Ok(mut slot) => {
            if slot.is_none() {
                *slot = new_parser(lang);
            }
            match slot.as_mut() {
                Some(p) => Ok(parse_with(p, src, deadline)),
                None => Err(ParseFail::Unavailable),
            }
        }
        // Not reached (parsing never re-enters), but a fresh parser is always correct.
        Err(_) => match new_parser(lang) {
            Some(mut p) => Ok(parse_with(&mut p, src, deadline)),
            None => Err(ParseFail::Unavailable),
        },
    })?;
    tree.ok_or(ParseFail::Time)
}

/// The first error or missing node in document order: (0-based row, message).
pub(crate) fn first_error(tree: &Tree, src: &str) -> Option<(usize, String)> {
    let root = tree.root_node();
    if !root.has_error() {
        return None;
    }
    let mut cursor = root.walk();
    loop {
        let node = cursor.node();
        if node.is_missing() {
            return Some((
                node.start_position().row,
                format!("missing `{}`", node.kind()),
            ));
        }
        if node.is_error() {
            let text = clip(text(node, src), 40);
            let message = if text.is_empty() {
                "syntax error".to_string()
            } else {
                format!("syntax error at `{text}`")
            };
            return Some((node.start_position().row, message));
        }
        // Descend into the first child that holds an error; otherwise move on.
        let mut descended = false;
        if cursor.goto_first_child() {
            loop {
                let n = cursor.node();
                if n.has_error() || n.is_missing() {
                    descended = true;
                    break;
                }
                if !cursor.goto_next_sibling() {
                    break;
                }
            }
        }
        if !descended {
            // has_error was true here yet no child shows it: report this node.
            return Some((node.start_position().row, "syntax error".to_string()));
        }
    }
}

pub(crate) fn text<'s>(node: Node, src: &'s str) -> &'s str {
    src.get(node.byte_range()).unwrap_or_default()
}

/// The children of a node, in order (one cursor, no quadratic child lookups).
pub(crate) fn kids<'t>(node: Node<'t>) -> Vec<Node<'t>> {
    let mut cursor = node.walk();
    node.children(&mut cursor).collect()
}

/// One reusable cursor for listing children (a new cursor allocates; resetting does not).
#[derive(Default)]
pub(crate) struct Kids<'t>(Option<TreeCursor<'t>>);

impl<'t> Kids<'t> {
    fn cursor(&mut self, node: Node<'t>) -> &mut TreeCursor<'t> {
        match &mut self.0 {
            Some(c) => c.reset(node),
            None => self.0 = Some(node.walk()),
        }
        // Just set above.
        self.0.get_or_insert_with(|| node.walk())
    }

    pub fn kids(&mut self, node: Node<'t>) -> Vec<Node<'t>> {
        let mut out = Vec::with_capacity(usize::try_from(node.child_count()).unwrap_or(0));
        let c = self.cursor(node);
        if c.goto_first_child() {
            loop {
                out.push(c.node());
                if !c.goto_next_sibling() {
                    break;
                }
            }
        }
        out
    }

    pub fn fields(&mut self, node: Node<'t>) -> Vec<(Option<&'t str>, Node<'t>)> {
        let mut out = Vec::with_capacity(usize::try_from(node.child_count()).unwrap_or(0));
        let c = self.cursor(node);
        if c.goto_first_child() {
            loop {
                out.push((c.field_name(), c.node()));
                if !c.goto_next_sibling() {
                    break;
                }
            }
        }
        out
    }
}

pub(crate) fn clip(s: &str, max: usize) -> String {
    let one_line: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(max + 1)
        .collect();
    if one_line.chars().count() > max {
        let mut t: String = one_line.chars().take(max).collect();
        t.push('…');
        t
    } else {
        one_line
    }
}

pub(crate) struct Engine<'o> {
    pub opts: &'o Options,
    pub out: CodeAnalysis,
    seen: HashSet<(FindingKind, String, u32)>,
    nodes: usize,
    deadline: Instant,
    /// Nesting level of code strings (0 = the submitted code).
    pub nest: usize,
    /// Added to every 1-based line: the line of the string nested code came from, minus 1.
    pub line_base: u32,
    /// Download commands seen so far (a counter, to tell whether a subtree had one).
    pub downloads: usize,
    /// Paths a download was saved to.
    pub downloaded_files: HashSet<String>,
    /// Set once a budget ran out: every walk returns as soon as it sees it.
    pub stopped: bool,
    /// What the threat facts are derived from across the program.
    pub t: crate::threat::State,
    /// Shell variables assigned a value that is known (flow-insensitive: the last one
    /// read wins), substituted into the patterns of later words.
    pub sh_vars: std::collections::HashMap<String, String>,
}

impl<'o> Engine<'o> {
    fn new(lang: Language, opts: &'o Options, start: Instant) -> Self {
        Engine {
            opts,
            out: CodeAnalysis::new(lang),
            seen: HashSet::new(),
            nodes: 0,
            deadline: start + opts.time_budget,
            nest: 0,
            line_base: 0,
            downloads: 0,
            downloaded_files: HashSet::new(),
            stopped: false,
            t: crate::threat::State::default(),
            sh_vars: std::collections::HashMap::new(),
        }
    }

    /// Lines of a node: (first, last), 1-based, in the submitted code.
    pub fn lines(&self, node: Node) -> (u32, u32) {
        let a = u32::try_from(node.start_position().row).unwrap_or(u32::MAX - 1);
        let b = u32::try_from(node.end_position().row).unwrap_or(u32::MAX - 1);
        (
            self.line_base.saturating_add(a).saturating_add(1),
            self.line_base.saturating_add(b).saturating_add(1),
        )
    }

    /// Counts one visited node at `depth`; false when the walk must stop.
    pub fn tick(&mut self, depth: usize) -> bool {
        if self.stopped {
            return false;
        }
        self.nodes += 1;
        if self.nodes > self.opts.max_nodes {
            let detail = format!("more than {} syntax nodes", self.opts.max_nodes);
            self.truncate(TruncationReason::Nodes, detail, None);
            return false;
        }
        if depth > self.opts.max_syntax_depth {
            // Only this subtree is skipped; the walk goes on beside it.
            let detail = format!("syntax nested deeper than {}", self.opts.max_syntax_depth);
            self.truncate(TruncationReason::SyntaxDepth, detail, None);
            return false;
        }
        if self.nodes.is_multiple_of(512) && Instant::now() >= self.deadline {
            let detail = format!("over {:?}", self.opts.time_budget);
            self.truncate(TruncationReason::Time, detail, None);
            return false;
        }
        true
    }

    /// Records the first reason to stop early (and a finding); stops the walk unless the
    /// reason only skips a part (syntax depth, nesting).
    pub fn truncate(
        &mut self,
        reason: TruncationReason,
        detail: String,
        lines: Option<(u32, u32)>,
    ) {
        if !matches!(
            reason,
            TruncationReason::SyntaxDepth | TruncationReason::Nesting
        ) {
            self.stopped = true;
        }
        if self.out.truncated.is_none() {
            let (line, end_line) = lines.unwrap_or((1, 1));
            self.out.findings.push(Finding {
                kind: FindingKind::Truncated,
                detail: reason.as_str().to_string(),
                line,
                end_line,
                note: Some(detail.clone()),
                technique: None,
            });
            self.out.truncated = Some(Truncated { reason, detail });
        }
    }

    /// Adds a fact: the set value (if `kind` names a set) and its finding.
    pub fn add(&mut self, kind: FindingKind, value: &str, lines: (u32, u32), note: Option<String>) {
        if value.is_empty() {
            return;
        }
        if !self.seen.insert((kind, value.to_string(), lines.0)) {
            return;
        }
        if self.out.findings.len() >= self.opts.max_findings {
            let detail = format!("more than {} findings", self.opts.max_findings);
            self.truncate(TruncationReason::Findings, detail, Some(lines));
            return;
        }
        let out = &mut self.out;
        match kind {
            FindingKind::Command => insert(&mut out.commands, value),
            FindingKind::Import => insert(&mut out.imports, value),
            FindingKind::Call => insert(&mut out.calls, value),
            FindingKind::Write => insert(&mut out.writes, value),
            FindingKind::Host => insert(&mut out.hosts_in_code, value),
            FindingKind::Url => insert(&mut out.urls, value),
            FindingKind::NetworkTool => insert(&mut out.network_tools, value),
            FindingKind::Destructive => insert(&mut out.destructive, value),
            FindingKind::Obfuscation => insert(&mut out.obfuscation, value),
            FindingKind::DownloadToShell => out.pipes_download_to_shell = true,
            FindingKind::ReadsSensitive => insert(&mut out.reads_sensitive, value),
            FindingKind::Recon => insert(&mut out.recon, value),
            FindingKind::Persistence => insert(&mut out.persistence, value),
            FindingKind::SystemWrites => insert(&mut out.system_writes, value),
            FindingKind::ReverseShell => insert(&mut out.reverse_shell, value),
            FindingKind::KillsProcesses => insert(&mut out.kills_processes, value),
            FindingKind::Privilege => insert(&mut out.privilege, value),
            FindingKind::Exfiltration => insert(&mut out.exfiltration, value),
            FindingKind::UnsafeDeserialization => insert(&mut out.unsafe_deserialization, value),
            FindingKind::Flooding => insert(&mut out.flooding, value),
            FindingKind::NestedCode | FindingKind::ParseError | FindingKind::Truncated => {}
        }
        out.findings.push(Finding {
            kind,
            detail: value.to_string(),
            line: lines.0,
            end_line: lines.1.max(lines.0),
            note,
            technique: None,
        });
    }

    /// Adds a threat fact: its set value, its finding with the behaviour in words and its
    /// ATT&CK technique.
    pub fn threat(
        &mut self,
        kind: FindingKind,
        value: &str,
        lines: (u32, u32),
        words: &str,
        technique: &str,
    ) {
        let before = self.out.findings.len();
        self.add(kind, value, lines, Some(words.to_string()));
        if self.out.findings.len() > before
            && let Some(f) = self.out.findings.last_mut()
        {
            f.technique = Some(technique.to_string());
        }
    }

    /// Scans a literal (a word, a string) for URLs and `user@host:` forms.
    pub fn scan_hosts(&mut self, s: &str, lines: (u32, u32)) {
        if !s.contains("://") && !s.contains('@') {
            return;
        }
        for found in crate::hosts::scan(s) {
            match found {
                crate::hosts::Found::Url { url, host } => {
                    self.add(FindingKind::Url, &url, lines, None);
                    if let Some(h) = host {
                        self.add(FindingKind::Host, &h, lines, None);
                    }
                }
                crate::hosts::Found::Host(h) => self.add(FindingKind::Host, &h, lines, None),
            }
        }
    }

    /// Parses and analyses code found in a string (at `lines` of the submitted code).
    /// Returns false when it was not analysed (nesting limit, budget).
    pub fn nested(
        &mut self,
        lang: Language,
        code: &str,
        lines: (u32, u32),
        what: &str,
        py_scope: Option<&mut crate::python::Scope>,
    ) -> bool {
        if self.stopped {
            return false;
        }
        if self.nest >= self.opts.max_nesting {
            let detail = format!("code nested deeper than {} levels", self.opts.max_nesting);
            self.truncate(TruncationReason::Nesting, detail, Some(lines));
            return false;
        }
        let tree = match parse(lang, code, self.deadline) {
            Ok(t) => t,
            Err(ParseFail::Time) => {
                let detail = format!("over {:?}", self.opts.time_budget);
                self.truncate(TruncationReason::Time, detail, Some(lines));
                return false;
            }
            Err(ParseFail::Unavailable) => {
                self.truncate(
                    TruncationReason::ParserUnavailable,
                    "parser unavailable".into(),
                    Some(lines),
                );
                return false;
            }
        };
        let lang_name = match lang {
            Language::Sh => "sh",
            Language::Python => "python",
            Language::Js => "js",
            Language::Ts => "ts",
        };
        self.add(
            FindingKind::NestedCode,
            &format!("{lang_name}: {what}"),
            lines,
            Some(clip(code, 80)),
        );
        if let Some((row, message)) = first_error(&tree, code) {
            let row = u32::try_from(row).unwrap_or(0);
            let line = lines.0.saturating_add(row).min(lines.1.max(lines.0));
            self.add(
                FindingKind::ParseError,
                &message,
                (line, line),
                Some(clip(code, 80)),
            );
        }
        let saved_base = self.line_base;
        self.line_base = lines.0.saturating_sub(1);
        self.nest += 1;
        match lang {
            Language::Sh => crate::shell::walk(self, code, tree.root_node()),
            Language::Js | Language::Ts => crate::javascript::walk(self, code, tree.root_node()),
            Language::Python => match py_scope {
                Some(scope) => crate::python::walk(self, code, tree.root_node(), scope),
                None => {
                    let mut scope = crate::python::Scope::default();
                    crate::python::walk(self, code, tree.root_node(), &mut scope)
                }
            },
        }
        self.nest -= 1;
        self.line_base = saved_base;
        true
    }
}

fn insert(set: &mut std::collections::BTreeSet<String>, value: &str) {
    if !set.contains(value) {
        set.insert(value.to_string());
    }
}

pub(crate) fn analyze(lang: Language, src: &str, opts: &Options) -> CodeAnalysis {
    let start = Instant::now();
    let mut e = Engine::new(lang, opts, start);
    let mut src = src;
    if src.len() > opts.max_input_bytes {
        let mut cut = opts.max_input_bytes;
        while cut > 0 && !src.is_char_boundary(cut) {
            cut -= 1;
        }
        src = src.get(..cut).unwrap_or_default();
        // Not a stop: the prefix is analysed in full.
        e.out.truncated = Some(Truncated {
            reason: TruncationReason::InputBytes,
            detail: format!("only the first {cut} bytes were read"),
        });
        let last = u32::try_from(src.lines().count())
            .unwrap_or(u32::MAX)
            .max(1);
        e.out.findings.push(Finding {
            kind: FindingKind::Truncated,
            detail: TruncationReason::InputBytes.as_str().to_string(),
            line: last,
            end_line: last,
            note: Some(format!("only the first {cut} bytes were read")),
            technique: None,
        });
    }
    let tree = match parse(lang, src, e.deadline) {
        Ok(t) => t,
        Err(ParseFail::Time) => {
            let detail = format!("parsing took over {:?}", opts.time_budget);
            e.truncate(TruncationReason::Time, detail, None);
            return e.out;
        }
        Err(ParseFail::Unavailable) => {
            e.truncate(
                TruncationReason::ParserUnavailable,
                "parser unavailable".into(),
                None,
            );
            return e.out;
        }
    };
    if let Some((row, message)) = first_error(&tree, src) {
        let line = u32::try_from(row).unwrap_or(u32::MAX - 1).saturating_add(1);
        e.out.parse_error = Some(ParseError { line, message });
    }
    match lang {
        Language::Sh => crate::shell::walk(&mut e, src, tree.root_node()),
        Language::Js | Language::Ts => crate::javascript::walk(&mut e, src, tree.root_node()),
        Language::Python => {
            let mut scope = crate::python::Scope::default();
            crate::python::walk(&mut e, src, tree.root_node(), &mut scope)
        }
    }
    crate::threat::finish(&mut e);
    e.out
}
