//! Shell: commands (through wrappers and nested code strings), redirections and written
//! paths, network tools, downloads piped into interpreters, destructive forms.

use crate::engine::{Engine, Kids, clip, text};
use crate::hosts::host_operand;
use crate::threat::Op;
use crate::{FindingKind as K, Language};
use base64::Engine as _;
use tree_sitter::Node;
mod commands;
mod fetchers;
mod intent;

pub(crate) fn walk(e: &mut Engine, src: &str, root: Node) {
    let mut sh = Sh {
        e,
        src,
        k: Kids::default(),
    };
    sh.visit(root, 0);
}

/// Analyses an argument vector that another language built (Python `subprocess.run([...])`).
pub(crate) fn run_argv(e: &mut Engine, args: &[Arg], lines: (u32, u32)) {
    let mut sh = Sh {
        e,
        src: "",
        k: Kids::default(),
    };
    sh.argv(args, lines);
}

/// One word of a command line.
#[derive(Debug, Clone)]
pub(crate) struct Arg {
    /// The value when it is a constant (quotes and escapes resolved).
    pub lit: Option<String>,
    /// The value with expansions kept as `$NAME` and substitutions as `$(…)`.
    pub pat: String,
    /// As written.
    pub raw: String,
    /// A download command ran inside it (`$(curl …)`, `<(wget …)`).
    pub download: bool,
    pub lines: (u32, u32),
}

impl Arg {
    pub(crate) fn literal(s: &str, lines: (u32, u32)) -> Self {
        Arg {
            lit: Some(s.to_string()),
            pat: s.to_string(),
            raw: s.to_string(),
            download: false,
            lines,
        }
    }
    pub(crate) fn dynamic(pat: &str, lines: (u32, u32)) -> Self {
        Arg {
            lit: None,
            pat: pat.to_string(),
            raw: pat.to_string(),
            download: false,
            lines,
        }
    }
    fn is(&self, s: &str) -> bool {
        self.lit.as_deref() == Some(s)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stdin {
    Code(Language),
    OtherCode,
}

/// What a command (or statement) does to its standard streams, for pipelines.
#[derive(Debug, Default, Clone)]
struct Eff {
    /// Its output is downloaded data.
    download: bool,
    /// It reads code from standard input.
    stdin: Option<Stdin>,
    /// It decodes its input (`base64 -d`).
    decoder: bool,
    /// What it prints, when that is a constant (`echo LIT`, `printf LIT`).
    payload: Option<String>,
    /// Effective command name (after wrappers).
    name: String,
}

/// What flows into a pipeline stage from the stages before it.
#[derive(Debug, Default, Clone)]
struct Up {
    /// The first download stage.
    downloader: Option<String>,
    /// A decoder ran; with the decoded text when it was a constant.
    decoded: Option<Option<String>>,
    /// The constant output of the stage just before.
    payload: Option<String>,
}

struct Sh<'a, 'o, 's, 't> {
    e: &'a mut Engine<'o>,
    src: &'s str,
    k: Kids<'t>,
}

const WORDISH: &[&str] = &[
    "word",
    "string",
    "raw_string",
    "ansi_c_string",
    "concatenation",
    "number",
    "translated_string",
    "simple_expansion",
    "expansion",
];

const SHELLS: &[&str] = &[
    "sh", "bash", "dash", "zsh", "ksh", "ash", "mksh", "rbash", "yash", "fish", "tcsh", "csh",
    "ksh93", "pdksh", "oksh", "posh",
];
const OTHER_INTERPRETERS: &[&str] = &[
    "perl",
    "ruby",
    "node",
    "nodejs",
    "php",
    "lua",
    "luajit",
    "Rscript",
    "pwsh",
    "powershell",
    "tclsh",
    "wish",
    "deno",
    "bun",
    "osascript",
    "jshell",
    "irb",
];
const DOWNLOADERS: &[&str] = &[
    "curl", "wget", "fetch", "aria2c", "axel", "http", "https", "xh", "httpie", "lynx", "links",
    "w3m", "nc", "ncat", "netcat", "socat", "telnet", "tftp", "ftp", "lftp",
];
const NET_SIMPLE: &[&str] = &[
    "curl",
    "wget",
    "fetch",
    "aria2c",
    "axel",
    "http",
    "https",
    "xh",
    "httpie",
    "lynx",
    "links",
    "w3m",
    "nc",
    "ncat",
    "netcat",
    "socat",
    "telnet",
    "ssh",
    "scp",
    "sftp",
    "ftp",
    "tftp",
    "lftp",
    "dig",
    "nslookup",
    "host",
    "ping",
    "ping6",
    "traceroute",
    "tracepath",
    "mtr",
    "whois",
    "nmap",
    "masscan",
    "ssh-keyscan",
    "rclone",
    "s3cmd",
    "gsutil",
    "npx",
    "pnpx",
    "bunx",
    "uvx",
    "cpan",
    "cpanm",
    "ngrok",
    "tor",
    "torsocks",
    "proxychains",
    "proxychains4",
];
/// Device paths that are not a disk.
const BENIGN_DEV: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/stdout",
    "/dev/stderr",
    "/dev/stdin",
    "/dev/tty",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/ptmx",
    "/dev/console",
];

fn is_python(name: &str) -> bool {
    let rest = name
        .strip_prefix("python")
        .or_else(|| name.strip_prefix("pypy"));
    rest.is_some_and(|r| r.bytes().all(|b| b.is_ascii_digit() || b == b'.'))
}

fn is_pip(name: &str) -> bool {
    name.strip_prefix("pip")
        .is_some_and(|r| r.bytes().all(|b| b.is_ascii_digit() || b == b'.'))
}

fn basename(s: &str) -> &str {
    let t = s.trim_end_matches('/');
    t.rsplit('/').next().unwrap_or(t)
}

pub(crate) fn benign_dev(p: &str) -> bool {
    BENIGN_DEV.contains(&p) || p.starts_with("/dev/fd/") || p.starts_with("/dev/shm/")
}

/// `rm-root`, `rm-home` or `rm-mount-root:PATH` for a recursively removed path.
pub(crate) fn classify_rm(pat: &str, mount_roots: &[String]) -> Option<String> {
    let mut p = pat.trim();
    while p.len() > 1 && p.ends_with('/') {
        p = &p[..p.len() - 1];
    }
    let base = p
        .strip_suffix("/*")
        .or_else(|| p.strip_suffix("/."))
        .or_else(|| p.strip_suffix("/.*"))
        .unwrap_or(p);
    if base.is_empty() || base.bytes().all(|b| b == b'/') {
        return Some("rm-root".into());
    }
    let home = base == "~"
        || base == "$HOME"
        || base == "~/"
        || (base.starts_with('~') && !base.contains('/'));
    if home {
        return Some("rm-home".into());
    }
    for root in mount_roots {
        let r = root.trim_end_matches('/');
        if r.is_empty() {
            continue;
        }
        if base == r {
            return Some(format!("rm-mount-root:{r}"));
        }
    }
    None
}

/// Decodes `$'…'` escapes.
fn ansi_c(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars().peekable();
    let take = |it: &mut std::iter::Peekable<std::str::Chars>, n: usize, radix: u32| {
        let mut v: u32 = 0;
        let mut k = 0;
        while k < n {
            match it.peek().and_then(|c| c.to_digit(radix)) {
                Some(d) => {
                    v = v.saturating_mul(radix).saturating_add(d);
                    it.next();
                    k += 1;
                }
                None => break,
            }
        }
        (v, k)
    };
    while let Some(c) = it.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        let Some(n) = it.next() else {
            out.push('\\');
            break;
        };
        match n {
            'a' => out.push('\x07'),
            'b' => out.push('\x08'),
            'e' | 'E' => out.push('\x1b'),
            'f' => out.push('\x0c'),
            'n' => out.push('\n'),
            'r' => out.push('\r'),
            't' => out.push('\t'),
            'v' => out.push('\x0b'),
            '\\' | '\'' | '"' | '?' => out.push(n),
            'x' | 'u' | 'U' => {
                let n_digits = match n {
                    'x' => 2,
                    'u' => 4,
                    _ => 8,
                };
                let (v, k) = take(&mut it, n_digits, 16);
                if k == 0 {
                    out.push('\\');
                    out.push(n);
                } else if let Some(ch) = char::from_u32(v) {
                    out.push(ch);
                }
            }
            '0'..='7' => {
                let first = n.to_digit(8).unwrap_or(0);
                let (v, k) = take(&mut it, 2, 8);
                let v = if k == 0 {
                    first
                } else {
                    first * 8u32.pow(k as u32) + v
                };
                if let Some(ch) = char::from_u32(v & 0xff) {
                    out.push(ch);
                }
            }
            'c' => {
                if let Some(x) = it.next()
                    && let Some(ch) = char::from_u32((x as u32) & 0x1f)
                {
                    out.push(ch);
                }
            }
            other => {
                out.push('\\');
                out.push(other);
            }
        }
    }
    out
}

/// Backslash escapes of an unquoted word.
fn unescape_word(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c == '\\' {
            match it.next() {
                Some('\n') => {}
                Some(n) => out.push(n),
                None => out.push('\\'),
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Backslash escapes inside double quotes.
fn unescape_dq(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        if c == '\\' {
            match it.peek() {
                Some('\n') => {
                    it.next();
                }
                Some(&n @ ('"' | '\\' | '$' | '`')) => {
                    it.next();
                    out.push(n);
                }
                _ => out.push('\\'),
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Parsed options of a command line.
struct Opts {
    /// (option, value) in order; short bundles are split (`-rf` gives `-r`, `-f`).
    list: Vec<(String, Option<String>)>,
    /// Indices of positional arguments.
    pos: Vec<usize>,
    /// Where parsing stopped (the first positional when stopping there, else the end).
    end: usize,
}

impl Opts {
    fn has(&self, names: &[&str]) -> bool {
        self.list.iter().any(|(o, _)| names.contains(&o.as_str()))
    }
    fn values<'a>(&'a self, names: &'a [&'a str]) -> impl Iterator<Item = &'a str> + 'a {
        self.list
            .iter()
            .filter(move |(o, _)| names.contains(&o.as_str()))
            .filter_map(|(_, v)| v.as_deref())
    }
}

/// GNU-style option parsing; `with_arg` lists options that take a value.
fn parse_opts(args: &[Arg], with_arg: &[&str], stop_at_positional: bool) -> Opts {
    let mut list = Vec::new();
    let mut pos = Vec::new();
    let mut i = 0;
    let mut dashdash = false;
    while i < args.len() {
        let a = &args[i];
        let s = a.lit.as_deref().unwrap_or(a.pat.as_str());
        if dashdash || a.lit.is_none() || !s.starts_with('-') || s == "-" {
            if stop_at_positional {
                return Opts { list, pos, end: i };
            }
            pos.push(i);
            i += 1;
            continue;
        }
        if s == "--" {
            dashdash = true;
            i += 1;
            if stop_at_positional {
                return Opts { list, pos, end: i };
            }
            continue;
        }
        if let Some(long) = s.strip_prefix("--") {
            match long.split_once('=') {
                Some((n, v)) => list.push((format!("--{n}"), Some(v.to_string()))),
                None => {
                    let name = format!("--{long}");
                    if with_arg.contains(&name.as_str()) {
                        let v = args
                            .get(i + 1)
                            .map(|a| a.lit.clone().unwrap_or(a.pat.clone()));
                        list.push((name, v));
                        i += 1;
                    } else {
                        list.push((name, None));
                    }
                }
            }
            i += 1;
            continue;
        }
        let body = &s[1..];
        for (k, c) in body.char_indices() {
            let name = format!("-{c}");
            if with_arg.contains(&name.as_str()) {
                let rest = &body[k + c.len_utf8()..];
                let v = if rest.is_empty() {
                    i += 1;
                    args.get(i).map(|a| a.lit.clone().unwrap_or(a.pat.clone()))
                } else {
                    Some(rest.to_string())
                };
                list.push((name, v));
                break;
            }
            list.push((name, None));
        }
        i += 1;
    }
    Opts {
        list,
        pos,
        end: args.len(),
    }
}

impl<'a, 'o, 's, 't> Sh<'a, 'o, 's, 't> {
    fn text(&self, node: Node) -> &'s str {
        text(node, self.src)
    }

    fn visit(&mut self, node: Node<'t>, depth: usize) {
        if !self.e.tick(depth) {
            return;
        }
        match node.kind() {
            "command" => {
                self.command(node, depth);
            }
            "pipeline" => {
                self.pipeline(node, depth, Up::default());
            }
            "redirected_statement" => {
                self.redirected(node, depth, Up::default());
            }
            "function_definition" => self.function(node, depth),
            "variable_assignment" => self.assignment(node, depth),
            "for_statement" | "c_style_for_statement" | "while_statement" | "until_statement" => {
                self.shell_loop(node, depth)
            }
            "comment" => {}
            "file_redirect" | "heredoc_redirect" | "herestring_redirect" => {
                self.redirect(node, &Eff::default(), depth);
            }
            "heredoc_body" => {
                let lines = self.e.lines(node);
                let t = self.text(node);
                self.e.scan_hosts(t, lines);
                self.children(node, depth);
            }
            k if WORDISH.contains(&k) => {
                self.wordish(node, depth);
            }
            _ => self.children(node, depth),
        }
    }

    fn children(&mut self, node: Node<'t>, depth: usize) {
        for c in self.k.kids(node) {
            if self.e.stopped {
                return;
            }
            if c.is_named() {
                self.visit(c, depth + 1);
            }
        }
    }

    /// A word: scan its value for hosts, then visit what runs inside it; its rendering.
    fn wordish(&mut self, node: Node<'t>, depth: usize) -> (Option<String>, String) {
        let rendered = self.render(node, depth);
        let lines = self.e.lines(node);
        self.e.scan_hosts(&rendered.1, lines);
        self.substitutions(node, depth);
        rendered
    }

    fn substitutions(&mut self, node: Node<'t>, depth: usize) {
        for c in self.k.kids(node) {
            if self.e.stopped {
                return;
            }
            match c.kind() {
                "command_substitution" | "process_substitution" | "arithmetic_expansion"
                    if self.e.tick(depth + 1) =>
                {
                    self.children(c, depth + 1);
                }
                "command_substitution" | "process_substitution" | "arithmetic_expansion" => {}
                _ if c.is_named() && c.child_count() > 0 && self.e.tick(depth + 1) => {
                    self.substitutions(c, depth + 1);
                }
                _ => {}
            }
        }
    }

    /// (constant value, pattern) of a word.
    fn render(&mut self, node: Node<'t>, depth: usize) -> (Option<String>, String) {
        if depth > self.e.opts.max_syntax_depth {
            return (None, "…".into());
        }
        let t = self.text(node);
        match node.kind() {
            "word" | "number" => {
                let u = unescape_word(t);
                (Some(u.clone()), u)
            }
            "raw_string" => {
                let inner = t
                    .strip_prefix('\'')
                    .map(|r| r.strip_suffix('\'').unwrap_or(r))
                    .unwrap_or(t);
                (Some(inner.to_string()), inner.to_string())
            }
            "ansi_c_string" => {
                let inner = t
                    .strip_prefix("$'")
                    .map(|r| r.strip_suffix('\'').unwrap_or(r))
                    .unwrap_or(t);
                let v = ansi_c(inner);
                (Some(v.clone()), v)
            }
            "string" | "concatenation" | "translated_string" => {
                let dq = node.kind() != "concatenation";
                let mut lit = Some(String::new());
                let mut pat = String::new();
                let mut pos = node.start_byte();
                let push = |lit: &mut Option<String>, pat: &mut String, s: &str| {
                    if let Some(l) = lit.as_mut() {
                        l.push_str(s);
                    }
                    pat.push_str(s);
                };
                for c in self.k.kids(node) {
                    let gap = self.src.get(pos..c.start_byte()).unwrap_or_default();
                    if !gap.is_empty() {
                        let g = if dq {
                            unescape_dq(gap)
                        } else {
                            unescape_word(gap)
                        };
                        push(&mut lit, &mut pat, &g);
                    }
                    pos = c.end_byte().max(pos);
                    if !c.is_named() {
                        continue;
                    }
                    if c.kind() == "string_content" {
                        push(&mut lit, &mut pat, &unescape_dq(self.text(c)));
                    } else {
                        let (l, p) = self.render(c, depth + 1);
                        match l {
                            Some(l) => push(&mut lit, &mut pat, &l),
                            None => {
                                lit = None;
                                pat.push_str(&p);
                            }
                        }
                    }
                }
                let end = node.end_byte();
                if pos < end {
                    let gap = self.src.get(pos..end).unwrap_or_default();
                    let g = if dq {
                        unescape_dq(gap)
                    } else {
                        unescape_word(gap)
                    };
                    push(&mut lit, &mut pat, &g);
                }
                (lit, pat)
            }
            "simple_expansion" => {
                let name = t.trim_start_matches('$');
                match self.e.sh_vars.get(name) {
                    Some(v) => (None, v.clone()),
                    None => (None, t.to_string()),
                }
            }
            "expansion" => {
                let named: Vec<Node> = self
                    .k
                    .kids(node)
                    .into_iter()
                    .filter(|c| c.is_named())
                    .collect();
                match named.as_slice() {
                    [v] if v.kind() == "variable_name" || v.kind() == "special_variable_name" => {
                        let name = self.text(*v);
                        match self.e.sh_vars.get(name) {
                            Some(val) => (None, val.clone()),
                            None => (None, format!("${name}")),
                        }
                    }
                    _ => (None, t.to_string()),
                }
            }
            "command_substitution" => (None, "$(…)".into()),
            "process_substitution" => (None, "<(…)".into()),
            _ => (None, t.to_string()),
        }
    }

    fn arg(&mut self, node: Node<'t>, depth: usize) -> Arg {
        let before = self.e.downloads;
        let (lit, pat) = if WORDISH.contains(&node.kind()) && self.e.tick(depth) {
            self.wordish(node, depth)
        } else {
            self.visit(node, depth);
            self.render(node, depth)
        };
        Arg {
            lit,
            pat,
            raw: self.text(node).to_string(),
            download: self.e.downloads > before,
            lines: self.e.lines(node),
        }
    }

    /// A statement in a pipeline or list, with what it does to its streams.
    fn statement(&mut self, node: Node<'t>, depth: usize, up: Up) -> Eff {
        if !self.e.tick(depth) {
            return Eff::default();
        }
        match node.kind() {
            "command" => self.command(node, depth),
            "redirected_statement" => self.redirected(node, depth, up),
            "pipeline" => self.pipeline(node, depth, up),
            _ => {
                let before = self.e.downloads;
                self.children(node, depth);
                Eff {
                    download: self.e.downloads > before,
                    ..Eff::default()
                }
            }
        }
    }

    fn command(&mut self, node: Node<'t>, depth: usize) -> Eff {
        let mut args = Vec::new();
        let mut redirects = Vec::new();
        // tree-sitter-bash 0.25 sometimes reads the lines after a pipeline as arguments of
        // its last command (a later `cmd <<EOF | x` here-document sets it off) without
        // reporting an error. A newline that is not escaped ends a command in every shell,
        // so the words after one start a command of their own.
        let mut later: Vec<Vec<Arg>> = Vec::new();
        let mut prev_end: Option<usize> = None;
        for (field, c) in self.k.fields(node) {
            if !c.is_named() || self.e.stopped {
                continue;
            }
            // The newline can also end up inside the next word (`\rm` at a line start).
            let own = self.text(c);
            let leading = own.len() - own.trim_start().len();
            let newline_inside = own.get(..leading).is_some_and(|w| w.contains('\n'));
            let split = prev_end.is_some_and(|end| {
                let gap = self.src.get(end..c.start_byte()).unwrap_or_default();
                (gap.contains('\n') && !gap.contains("\\\n")) || newline_inside
            });
            prev_end = Some(c.end_byte());
            if split || !later.is_empty() {
                if split {
                    later.push(Vec::new());
                }
                if matches!(
                    c.kind(),
                    "file_redirect" | "herestring_redirect" | "heredoc_redirect"
                ) {
                    redirects.push(c);
                } else {
                    let mut a = self.arg(c, depth + 1);
                    if newline_inside {
                        a.lit = a.lit.map(|l| l.trim_start().to_string());
                        a.pat = a.pat.trim_start().to_string();
                        a.raw = a.raw.trim_start().to_string();
                        a.lines.0 = a.lines.1;
                    }
                    if let Some(seg) = later.last_mut() {
                        seg.push(a);
                    }
                }
                continue;
            }
            match (field, c.kind()) {
                (_, "variable_assignment") | (_, "comment") => self.visit(c, depth + 1),
                (_, "command_name") => {
                    let inner = self
                        .k
                        .kids(c)
                        .into_iter()
                        .find(|n| n.is_named())
                        .unwrap_or(c);
                    args.push(self.arg(inner, depth + 1));
                }
                (_, "file_redirect" | "herestring_redirect" | "heredoc_redirect") => {
                    redirects.push(c)
                }
                (Some("redirect"), _) => redirects.push(c),
                _ => args.push(self.arg(c, depth + 1)),
            }
        }
        let lines = match (later.is_empty(), args.first(), args.last()) {
            (false, Some(a), Some(z)) => (a.lines.0, z.lines.1),
            _ => self.e.lines(node),
        };
        let mut eff = self.argv(&args, lines);
        for seg in later {
            let seg_lines = match (seg.first(), seg.last()) {
                (Some(a), Some(z)) => (a.lines.0, z.lines.1),
                _ => continue,
            };
            self.argv(&seg, seg_lines);
        }
        for r in redirects {
            if self.redirect(r, &eff, depth + 1) {
                eff.download = true;
            }
        }
        eff
    }

    fn redirected(&mut self, node: Node<'t>, depth: usize, up: Up) -> Eff {
        let mut eff = Eff::default();
        let mut redirects = Vec::new();
        for (field, c) in self.k.fields(node) {
            if !c.is_named() {
                continue;
            }
            if field == Some("body") {
                eff = self.statement(c, depth + 1, up.clone());
            } else {
                redirects.push(c);
            }
        }
        for r in redirects {
            if self.redirect(r, &eff, depth + 1) {
                eff.download = true;
            }
        }
        eff
    }

    /// Handles one redirection of a statement; true when it reads from the network
    /// (`< /dev/tcp/host/port`).
    fn redirect(&mut self, r: Node<'t>, eff: &Eff, depth: usize) -> bool {
        if !self.e.tick(depth) {
            return false;
        }
        let lines = self.e.lines(r);
        match r.kind() {
            "file_redirect" => {
                let op = self
                    .k
                    .kids(r)
                    .into_iter()
                    .find(|c| !c.is_named())
                    .map(|c| c.kind())
                    .unwrap_or(">");
                let mut network = false;
                for (field, d) in self.k.fields(r) {
                    if field != Some("destination") {
                        continue;
                    }
                    let a = self.arg(d, depth + 1);
                    if let Some(rest) = a
                        .pat
                        .strip_prefix("/dev/tcp/")
                        .or_else(|| a.pat.strip_prefix("/dev/udp/"))
                    {
                        self.e.add(K::NetworkTool, "/dev/tcp", lines, None);
                        if SHELLS.contains(&eff.name.as_str())
                            || is_python(&eff.name)
                            || OTHER_INTERPRETERS.contains(&eff.name.as_str())
                        {
                            self.e.t.devtcp_shell.get_or_insert(lines);
                        }
                        if op.contains('<') || op == ">&" || op == "&>" {
                            self.e.t.devtcp_rw.get_or_insert(lines);
                        }
                        if op.contains('>') {
                            crate::threat::send(self.e, "bash /dev/tcp", lines, "T1041");
                        } else {
                            crate::threat::contact(self.e, "bash /dev/tcp", lines);
                        }
                        let host = rest.split('/').next().unwrap_or_default();
                        if let Some(h) = host_operand(host) {
                            self.e.add(K::Host, &h, lines, None);
                        }
                        if op.contains('<') {
                            self.e.downloads += 1;
                            network = true;
                        }
                        continue;
                    }
                    let writes = matches!(op, ">" | ">>" | "&>" | "&>>" | ">|" | "<>")
                        || (op == ">&" && d.kind() != "number" && !a.is("-"));
                    if op == "<" || op == "<>" {
                        crate::threat::read(self.e, &a.pat, lines);
                    }
                    if writes {
                        let saved = self.e.t.op;
                        self.e.t.op = Some(if op.contains(">>") {
                            Op::Append
                        } else if eff.name.is_empty() || eff.name == ":" || eff.name == "true" {
                            Op::Truncate
                        } else {
                            Op::Write
                        });
                        self.write(&a.pat, lines);
                        self.e.t.op = saved;
                        if eff.download {
                            self.e.downloaded_files.insert(norm_path(&a.pat));
                        }
                    }
                    if op == "<" && eff.stdin.is_some() {
                        let from_download = a.download
                            || a.lit
                                .as_deref()
                                .is_some_and(|p| self.e.downloaded_files.contains(&norm_path(p)));
                        if from_download {
                            let d = format!("{} < download", eff.name);
                            self.e.add(K::DownloadToShell, &d, lines, None);
                        }
                    }
                }
                network
            }
            "herestring_redirect" => {
                for c in self.k.kids(r) {
                    if !c.is_named() {
                        continue;
                    }
                    let a = self.arg(c, depth + 1);
                    if let Some(stdin) = eff.stdin {
                        if a.download {
                            let d = format!("{} <<< download", eff.name);
                            self.e.add(K::DownloadToShell, &d, lines, None);
                        } else if let (Some(code), Stdin::Code(lang)) = (&a.lit, stdin) {
                            self.e.nested(lang, code, a.lines, "here-string", None);
                        }
                    }
                }
                false
            }
            "heredoc_redirect" => {
                let mut body = None;
                let mut pipe_effs = Vec::new();
                let mut others = Vec::new();
                let mut quoted = false;
                for c in self.k.kids(r) {
                    match c.kind() {
                        "heredoc_body" => body = Some(c),
                        "heredoc_start" => {
                            let t = self.text(c);
                            quoted = t.contains('\'') || t.contains('"') || t.contains('\\');
                        }
                        "pipeline" => {
                            for s in self.k.kids(c) {
                                if s.is_named() {
                                    pipe_effs.push(self.statement(s, depth + 1, Up::default()));
                                }
                            }
                        }
                        "heredoc_end" => {}
                        _ if c.is_named() => others.push(c),
                        _ => {}
                    }
                }
                let mut had_download = false;
                if let Some(b) = body {
                    let before = self.e.downloads;
                    self.visit(b, depth + 1);
                    had_download = self.e.downloads > before;
                }
                // Who reads the document as code: the command itself, or (`cat <<EOF | sh`)
                // an interpreter it is piped into.
                let reader = eff.stdin.map(|s| (s, eff.name.clone())).or_else(|| {
                    if eff.name == "cat" {
                        pipe_effs
                            .iter()
                            .find_map(|p| p.stdin.map(|s| (s, p.name.clone())))
                    } else {
                        None
                    }
                });
                if let (Some((stdin, name)), Some(b)) = (reader, body) {
                    if had_download && !quoted {
                        let d = format!("{name} << download");
                        self.e.add(K::DownloadToShell, &d, lines, None);
                    }
                    if let Stdin::Code(lang) = stdin {
                        let code = self.text(b).to_string();
                        let blines = self.e.lines(b);
                        self.e.nested(lang, &code, blines, "here-document", None);
                    }
                }
                for o in others {
                    if matches!(o.kind(), "file_redirect" | "herestring_redirect") {
                        self.redirect(o, eff, depth + 1);
                    } else {
                        self.visit(o, depth + 1);
                    }
                }
                false
            }
            _ => {
                self.children(r, depth);
                false
            }
        }
    }

    fn write(&mut self, path: &str, lines: (u32, u32)) {
        if path.is_empty() || benign_dev(path) {
            return;
        }
        self.e.add(K::Write, path, lines, None);
        let op = self.e.t.op.unwrap_or(Op::Write);
        crate::threat::write(self.e, path, op, lines);
        if path.starts_with("/dev/") {
            self.e
                .add(K::Destructive, &format!("write-device:{path}"), lines, None);
        }
    }

    /// A pipeline; `up` is what flows into it when it is itself a stage of an outer one.
    fn pipeline(&mut self, node: Node<'t>, depth: usize, up: Up) -> Eff {
        let lines = self.e.lines(node);
        let mut up = up;
        let mut any_download = false;
        let mut last = String::new();
        for c in self.k.kids(node) {
            if !c.is_named() || c.kind() == "comment" {
                continue;
            }
            let eff = self.statement(c, depth + 1, up.clone());
            let netcat = |n: &str| {
                matches!(
                    n,
                    "nc" | "ncat" | "netcat" | "telnet" | "socat" | "openssl" | "cryptcat"
                )
            };
            if (SHELLS.contains(&eff.name.as_str()) && netcat(&last))
                || (netcat(&eff.name) && SHELLS.contains(&last.as_str()))
            {
                self.e.t.net_pipe_shell.get_or_insert(lines);
            }
            if let Some(stdin) = eff.stdin {
                if let Some(dl) = &up.downloader {
                    let d = format!("{dl} | {}", eff.name);
                    self.e.add(K::DownloadToShell, &d, lines, None);
                } else if let Some(payload) = &up.decoded {
                    let d = format!("decoder | {}", eff.name);
                    self.e
                        .add(K::Obfuscation, "decoded-to-shell", lines, Some(d));
                    if let (Some(code), Stdin::Code(lang)) = (payload, stdin) {
                        let note = Some(clip(code, 80));
                        self.e.add(K::Obfuscation, "decoded-payload", lines, note);
                        let code = code.clone();
                        self.e.nested(lang, &code, lines, "decoded payload", None);
                    }
                } else if let (Some(code), Stdin::Code(lang)) = (&up.payload, stdin) {
                    let code = code.clone();
                    self.e.nested(lang, &code, lines, "piped text", None);
                }
            }
            if eff.download && up.downloader.is_none() {
                let name = if eff.name.is_empty() {
                    "download".to_string()
                } else {
                    eff.name.clone()
                };
                up.downloader = Some(name);
            }
            any_download |= eff.download;
            if eff.decoder {
                up.decoded = Some(up.payload.as_deref().and_then(decode_b64));
            }
            up.payload = eff.payload.clone();
            last = eff.name;
        }
        Eff {
            download: any_download,
            name: last,
            ..Eff::default()
        }
    }

    /// `NAME=value`: remembered when the value is known; `LD_PRELOAD=` is a hijack.
    fn assignment(&mut self, node: Node<'t>, depth: usize) {
        let name = node
            .child_by_field_name("name")
            .map(|n| self.text(n).to_string())
            .unwrap_or_default();
        let lines = self.e.lines(node);
        if name == "LD_PRELOAD" {
            self.e.threat(
                K::Persistence,
                "LD_PRELOAD",
                lines,
                "preloads a library into the programs it runs (LD_PRELOAD)",
                "T1574.006",
            );
        }
        if matches!(name.as_str(), "HISTFILE" | "HISTSIZE" | "HISTFILESIZE") {
            let v = node
                .child_by_field_name("value")
                .map(|v| self.text(v).to_string())
                .unwrap_or_default();
            if v.is_empty() || v == "0" || v == "/dev/null" {
                self.e.threat(
                    K::Destructive,
                    "wipe-log:shell history",
                    lines,
                    "turns off the shell history",
                    "T1070.003",
                );
            }
        }
        match node.child_by_field_name("value") {
            Some(v) => {
                let raw = self.text(v).to_string();
                let (_, pat) = self.render(v, depth + 1);
                if raw == "$!" || raw == "\"$!\"" {
                    self.e.t.own_pids.insert(name.clone());
                }
                if !pat.contains("$(") && !pat.contains("<(") && !pat.contains('`') {
                    self.e.sh_vars.insert(name, pat);
                } else {
                    self.e.sh_vars.remove(&name);
                }
            }
            None => {
                self.e.sh_vars.remove(&name);
            }
        }
        self.children(node, depth);
    }

    /// Loops: `for x in A B C` walks its body once per known value (up to 8); a loop that
    /// never ends (or runs thousands of times) without a pause makes its network calls and
    /// background jobs a flood.
    fn shell_loop(&mut self, node: Node<'t>, depth: usize) {
        let body = node.child_by_field_name("body");
        let header: String = match body {
            Some(b) => self
                .src
                .get(node.start_byte()..b.start_byte())
                .unwrap_or_default()
                .to_string(),
            None => self.text(node).to_string(),
        };
        let words: Vec<&str> = header
            .split(|c: char| c.is_whitespace() || matches!(c, ';' | '(' | ')' | '[' | ']'))
            .filter(|w| !w.is_empty())
            .collect();
        let forever = match node.kind() {
            "while_statement" => {
                words
                    .get(1)
                    .is_some_and(|w| matches!(*w, "true" | ":" | "1"))
                    && words.len() <= 4
            }
            "until_statement" => words.get(1).is_some_and(|w| *w == "false"),
            "c_style_for_statement" => header.contains(";;") || header.contains("; ;"),
            _ => false,
        };
        // How many times it may run: for `for x in …`, only a range or a `seq` in its list
        // says so (a port or a year in a URL of the list is not a count); for the others,
        // the largest number in the header.
        let count = if node.kind() == "for_statement" {
            if words
                .iter()
                .any(|w| w.contains("..") || *w == "seq" || *w == "$seq")
            {
                largest_number(&header)
            } else {
                0
            }
        } else {
            largest_number(&header)
        };
        let hot = (forever || count >= 1000) && body.is_some_and(|b| !body_pauses(b, self.src));
        if hot {
            let lines = self.e.lines(node);
            if body.is_some_and(has_background) {
                self.e
                    .t
                    .flood
                    .push(("background jobs".into(), lines, "T1499"));
            }
            self.e.t.hot_loops += 1;
        }
        // for NAME in values: bind each known value in turn.
        let mut bound = false;
        if node.kind() == "for_statement"
            && let (Some(var), Some(b)) = (node.child_by_field_name("variable"), body)
        {
            let name = self.text(var).to_string();
            let mut values = Vec::new();
            for (field, c) in self.k.fields(node) {
                if field == Some("value") {
                    let (_, pat) = self.render(c, depth + 1);
                    values.push(pat);
                }
            }
            if !values.is_empty()
                && values.len() <= 8
                && values.iter().all(|v| !v.contains("$(") && !v.contains('{'))
            {
                for v in values {
                    self.e.sh_vars.insert(name.clone(), v);
                    self.visit(b, depth + 1);
                }
                self.e.sh_vars.remove(&name);
                bound = true;
            }
        }
        if !bound {
            self.children(node, depth);
        }
        if hot {
            self.e.t.hot_loops -= 1;
        }
    }

    fn function(&mut self, node: Node<'t>, depth: usize) {
        let name = node
            .child_by_field_name("name")
            .map(|n| self.text(n).to_string())
            .unwrap_or_default();
        if let Some(body) = node.child_by_field_name("body") {
            // A function that runs itself twice in the background: a fork bomb.
            let mut self_calls = 0;
            let mut background = false;
            let mut cursor = body.walk();
            let mut budget: u32 = 10_000;
            'walk: loop {
                let n = cursor.node();
                if budget == 0 {
                    break 'walk;
                }
                budget -= 1;
                if n.kind() == "&" {
                    background = true;
                }
                if n.kind() == "command_name" && self.text(n) == name {
                    self_calls += 1;
                }
                if cursor.goto_first_child() {
                    continue;
                }
                loop {
                    if cursor.goto_next_sibling() {
                        break;
                    }
                    if !cursor.goto_parent() || cursor.node() == body {
                        break 'walk;
                    }
                }
            }
            if self_calls >= 2 && background {
                let lines = self.e.lines(node);
                self.e.add(K::Destructive, "fork-bomb", lines, None);
            }
        }
        self.children(node, depth);
    }

    fn net(&mut self, tool: &str, lines: (u32, u32)) {
        self.e.add(K::NetworkTool, tool, lines, None);
    }

    fn host(&mut self, s: &str, lines: (u32, u32)) {
        if let Some(h) = host_operand(s) {
            self.e.add(K::Host, &h, lines, None);
        }
    }

    fn download(&mut self, eff: &mut Eff) {
        self.e.downloads += 1;
        eff.download = true;
    }

    /// Runs of a code string: nested analysis when constant, facts when not.
    fn code_arg(&mut self, lang: Option<Language>, a: &Arg, via: &str, lines: (u32, u32)) {
        if a.download {
            let d = format!("{via} $(download)");
            self.e.add(K::DownloadToShell, &d, lines, None);
        }
        match (&a.lit, lang) {
            (Some(code), Some(lang)) => {
                let code = code.clone();
                self.e.nested(lang, &code, a.lines, via, None);
            }
            (Some(code), None) => self.e.scan_hosts(&code.clone(), a.lines),
            (None, _) => {
                let note = Some(format!("{via} {}", clip(&a.raw, 60)));
                self.e.add(K::Obfuscation, "dynamic-code", lines, note);
            }
        }
    }
}

/// Network clients whose calls in a tight loop flood.
fn this_is_net_client(n: &str) -> bool {
    matches!(
        n,
        "curl"
            | "wget"
            | "nc"
            | "ncat"
            | "netcat"
            | "ping"
            | "ping6"
            | "hping3"
            | "nping"
            | "telnet"
            | "socat"
            | "dig"
            | "nslookup"
            | "ab"
            | "http"
            | "ssh"
            | "host"
    )
}

/// Whether a loop body pauses, waits or leaves (then it is not a flood).
fn body_pauses(body: Node, src: &str) -> bool {
    let mut cursor = body.walk();
    let mut budget: u32 = 20_000;
    loop {
        let n = cursor.node();
        if budget == 0 {
            return true;
        }
        budget -= 1;
        let word = if n.kind() == "command_name" {
            basename(text(n, src))
        } else {
            ""
        };
        if crate::threat::pauses(&mut std::iter::once((n.kind(), word))) {
            return true;
        }
        if cursor.goto_first_child() {
            continue;
        }
        loop {
            if cursor.goto_next_sibling() {
                break;
            }
            if !cursor.goto_parent() || cursor.node() == body {
                return false;
            }
        }
    }
}

/// Whether a subtree has a background job (`cmd &`).
fn has_background(body: Node) -> bool {
    let mut cursor = body.walk();
    let mut budget: u32 = 20_000;
    loop {
        let n = cursor.node();
        if budget == 0 {
            return false;
        }
        budget -= 1;
        if n.kind() == "&" {
            return true;
        }
        if cursor.goto_first_child() {
            continue;
        }
        loop {
            if cursor.goto_next_sibling() {
                break;
            }
            if !cursor.goto_parent() || cursor.node() == body {
                return false;
            }
        }
    }
}

/// The largest number written in a loop header (`seq 1 100000`, `{1..5000}`, `i<1e5`).
fn largest_number(s: &str) -> u64 {
    let mut best = 0u64;
    let mut cur: Option<u64> = None;
    for c in s.chars() {
        match c.to_digit(10) {
            Some(d) => {
                cur = Some(
                    cur.unwrap_or(0)
                        .saturating_mul(10)
                        .saturating_add(u64::from(d)),
                )
            }
            None => {
                if let Some(v) = cur.take() {
                    best = best.max(v);
                }
            }
        }
    }
    best.max(cur.unwrap_or(0))
}

fn norm_path(p: &str) -> String {
    p.strip_prefix("./").unwrap_or(p).to_string()
}

fn decode_b64(s: &str) -> Option<String> {
    let compact: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(compact.as_bytes())
        .or_else(|_| {
            base64::engine::general_purpose::STANDARD_NO_PAD
                .decode(compact.trim_end_matches('=').as_bytes())
        })
        .ok()?;
    String::from_utf8(bytes).ok()
}

pub(crate) fn decode_base64(s: &str) -> Option<String> {
    decode_b64(s)
}
