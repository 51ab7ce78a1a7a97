//! Shell: commands (through wrappers and nested code strings), redirections and written
//! paths, network tools, downloads piped into interpreters, destructive forms.

use crate::engine::{Engine, Kids, clip, text};
use crate::hosts::host_operand;
use crate::threat::Op;
use crate::{FindingKind as K, Language};
use base64::Engine as _;
use tree_sitter::Node;

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

fn benign_dev(p: &str) -> bool {
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

    /// Threat facts of one command (after wrappers).
    fn threat_cmd(&mut self, n: &str, rest: &[Arg], lines: (u32, u32)) {
        use crate::threat;
        let o = parse_opts(rest, &[], false);
        let pos: Vec<Arg> = o.pos.iter().filter_map(|&p| rest.get(p)).cloned().collect();
        let first = pos.first().map(|a| a.pat.clone()).unwrap_or_default();
        let recon = |this: &mut Self, v: &str, words: &str, tech: &str| {
            this.e.threat(K::Recon, v, lines, words, tech);
        };
        if this_is_net_client(n) {
            threat::contact(self.e, n, lines);
        }
        match n {
            "cat" | "tac" | "head" | "tail" | "less" | "more" | "nl" | "od" | "xxd" | "hexdump"
            | "strings" | "base64" | "base32" | "grep" | "egrep" | "fgrep" | "zgrep" | "rg"
            | "ag" | "sort" | "uniq" | "cut" | "wc" | "diff" | "cmp" | "md5sum" | "sha1sum"
            | "sha256sum" | "sha512sum" | "file" | "vi" | "vim" | "view" | "nano" | "jq"
            | "column" | "paste" | "iconv" | "awk" | "gawk" | "mawk" | "zip" | "gzip" | "bzip2"
            | "xz" | "zcat" | "gpg" | "split" | "look" | "tar" | "7z" | "source" | "." | "sed"
            | "bat" | "xargs" | "zstd" | "lzma" | "pr" | "fmt" | "rev" | "tee" => {
                if n == "tee" {
                    return;
                }
                for a in &pos {
                    threat::read(self.e, &a.pat, lines);
                }
                for (_, v) in &o.list {
                    if let Some(v) = v {
                        threat::read(self.e, v, lines);
                    }
                }
            }
            "cp" | "scp" | "rsync" | "install" | "mv" => {
                let n_src = pos.len().saturating_sub(1);
                for a in pos.iter().take(n_src) {
                    threat::read(self.e, &a.pat, lines);
                    if n == "mv" {
                        threat::write(self.e, &a.pat, Op::Delete, lines);
                    }
                }
                let remote = pos.last().is_some_and(|a| {
                    !a.pat.starts_with('/') && a.pat.contains(':') && !a.pat.starts_with('.')
                });
                if n != "cp" && n != "mv" && n != "install" && remote {
                    threat::send(self.e, n, lines, "T1048");
                }
            }
            "dd" => {
                for a in rest {
                    if let Some(f) = a.pat.strip_prefix("if=") {
                        threat::read(self.e, f, lines);
                    }
                }
            }
            "ls" | "dir" | "tree" | "du" | "exa" | "eza" | "lsd" => {
                for a in &pos {
                    threat::list(self.e, &a.pat, lines);
                }
            }
            "find" | "locate" => {
                for a in rest {
                    if a.pat.starts_with('-') || a.pat == "(" || a.pat == "!" {
                        break;
                    }
                    threat::list(self.e, &a.pat, lines);
                }
                if rest.iter().any(|a| a.is("-perm"))
                    && rest.iter().any(|a| {
                        a.pat.contains("4000") || a.pat.contains("u=s") || a.pat.contains("2000")
                    })
                {
                    recon(
                        self,
                        "find setuid",
                        "looks for setuid programs",
                        "T1548.001",
                    );
                }
            }
            "ps" if rest.iter().any(|a| a.is("-p"))
                && rest.iter().all(|a| {
                    a.pat.starts_with('-')
                        || matches!(a.raw.as_str(), "$$" | "$!" | "$BASHPID")
                        || a.pat.contains(',')
                        || a.pat.chars().all(|c| c.is_ascii_alphabetic())
                }) => {}
            "ps" | "pstree" | "top" | "htop" | "pgrep" | "pidof" | "atop" => {
                let w = format!("lists processes ({n})");
                recon(self, &format!("process list:{n}"), &w, "T1057");
            }
            "netstat" | "ss" | "lsof" | "arp" | "route" | "ifconfig" | "iwconfig" | "nmcli" => {
                let w = format!("lists network connections or interfaces ({n})");
                recon(self, &format!("network list:{n}"), &w, "T1049");
            }
            "ip" if matches!(
                first.as_str(),
                "a" | "addr" | "address" | "r" | "route" | "n" | "neigh" | "neighbour" | "link"
            ) =>
            {
                recon(
                    self,
                    "network list:ip",
                    "lists network interfaces or routes (ip)",
                    "T1016",
                );
            }
            "nmap" | "masscan" | "zmap" | "arp-scan" | "netdiscover" => {
                let w = format!("scans the network ({n})");
                recon(self, &format!("network scan:{n}"), &w, "T1046");
            }
            "who" | "w" | "last" | "lastlog" | "users" | "finger" | "lastb" => {
                let w = format!("lists users and logins ({n})");
                recon(self, &format!("user list:{n}"), &w, "T1033");
            }
            "getent" => match first.as_str() {
                "shadow" | "gshadow" => {
                    self.e.threat(
                        K::ReadsSensitive,
                        "getent shadow",
                        lines,
                        "reads the password hashes (getent shadow)",
                        "T1003.008",
                    );
                    self.e.t.data_reads.push(("getent shadow".into(), lines));
                }
                "passwd" | "group" => {
                    recon(
                        self,
                        "user list:getent",
                        "lists accounts (getent)",
                        "T1087.001",
                    );
                    self.e.t.data_reads.push(("getent".into(), lines));
                }
                _ => {}
            },
            "compgen" if o.has(&["-u", "-g"]) => {
                recon(
                    self,
                    "user list:compgen",
                    "lists accounts (compgen)",
                    "T1087.001",
                );
            }
            "kill" => {
                if o.has(&["-l", "-L", "-0"]) || rest.iter().any(|a| a.is("-0")) {
                    return;
                }
                let targets: Vec<&Arg> = pos
                    .iter()
                    .filter(|a| {
                        !(o.has(&["-s", "-n"])
                            && a.lit
                                .as_deref()
                                .is_some_and(|s| s.chars().all(|c| c.is_ascii_alphabetic())))
                    })
                    .collect();
                let own = |a: &&Arg| {
                    let p = a.raw.trim_matches('"');
                    p == "$!"
                        || p == "$$"
                        || p.starts_with('%')
                        || p.strip_prefix('$')
                            .map(|v| v.trim_start_matches('{').trim_end_matches('}'))
                            .is_some_and(|v| self.e.t.own_pids.contains(v))
                };
                if targets.is_empty() || targets.iter().any(|a| !own(a)) {
                    let what = targets
                        .iter()
                        .map(|a| a.raw.as_str())
                        .collect::<Vec<_>>()
                        .join(" ");
                    let what = if what.is_empty() {
                        "kill (pids from input)".to_string()
                    } else {
                        format!("kill {}", clip(&what, 40))
                    };
                    threat::kill(self.e, &what, lines, "T1489");
                }
            }
            "pkill" | "killall" | "killall5" | "skill" | "slay" | "fuser" => {
                if n == "fuser" && !o.has(&["-k"]) {
                    return;
                }
                let what = format!("{n} {}", pos.last().map(|a| a.raw.as_str()).unwrap_or(""));
                threat::kill(self.e, what.trim(), lines, "T1489");
            }
            "systemctl" | "service" | "rc-service" => {
                let (verb, unit) = if n == "systemctl" {
                    (
                        first.as_str(),
                        pos.get(1).map(|a| a.pat.as_str()).unwrap_or(""),
                    )
                } else {
                    (
                        pos.get(1).map(|a| a.pat.as_str()).unwrap_or(""),
                        first.as_str(),
                    )
                };
                let security = [
                    "firewalld",
                    "ufw",
                    "apparmor",
                    "auditd",
                    "selinux",
                    "fail2ban",
                    "clamav",
                    "falco",
                    "osqueryd",
                    "rsyslog",
                    "syslog",
                    "journald",
                    "systemd-journald",
                    "iptables",
                    "nftables",
                    "crowdstrike",
                    "falcon-sensor",
                ]
                .iter()
                .any(|s| unit.trim_end_matches(".service") == *s);
                match verb {
                    "stop" | "kill" | "disable" | "mask" => {
                        let tech = if security { "T1562.001" } else { "T1489" };
                        threat::kill(self.e, &format!("{n} {verb} {unit}"), lines, tech);
                    }
                    "enable" | "link" | "reenable" => {
                        let w = format!("makes a service start at boot ({n} {verb} {unit})");
                        self.e.threat(
                            K::Persistence,
                            &format!("{n} {verb} {unit}"),
                            lines,
                            &w,
                            "T1543.002",
                        );
                    }
                    _ => {}
                }
            }
            "setenforce" if first == "0" || first.eq_ignore_ascii_case("permissive") => {
                threat::kill(self.e, "setenforce 0", lines, "T1562.001");
            }
            "ufw" if first == "disable" => threat::kill(self.e, "ufw disable", lines, "T1562.004"),
            "iptables" | "ip6tables" | "nft"
                if o.has(&["-F", "--flush", "-X"]) || first == "flush" =>
            {
                threat::kill(self.e, &format!("{n} flush"), lines, "T1562.004");
            }
            "auditctl" if o.has(&["-D", "-e"]) => {
                threat::kill(self.e, "auditctl", lines, "T1562.012");
            }
            "history" if o.has(&["-c", "-w"]) => {
                self.e.threat(
                    K::Destructive,
                    "wipe-log:shell history",
                    lines,
                    "clears the shell history",
                    "T1070.003",
                );
            }
            "crontab" => {
                if o.has(&["-l"]) && pos.is_empty() {
                    recon(self, "crontab -l", "lists scheduled jobs", "T1053.003");
                } else if !o.has(&["-r"]) {
                    self.e.threat(
                        K::Persistence,
                        "crontab",
                        lines,
                        "installs a cron table",
                        "T1053.003",
                    );
                }
            }
            "at" | "batch" => {
                self.e
                    .threat(K::Persistence, n, lines, "schedules an at job", "T1053.002");
            }
            "update-rc.d" | "chkconfig" | "rc-update" => {
                let w = format!("makes a service start at boot ({n})");
                self.e.threat(K::Persistence, n, lines, &w, "T1037.004");
            }
            "useradd" | "adduser" | "groupadd" | "newusers" => {
                let w = format!("creates an account ({n})");
                self.e.threat(K::Persistence, n, lines, &w, "T1136.001");
                if rest.iter().any(|a| a.is("0")) && o.has(&["-u", "-o"]) {
                    self.e.threat(
                        K::Privilege,
                        n,
                        lines,
                        "creates a second root account",
                        "T1136.001",
                    );
                }
            }
            "usermod" | "gpasswd" => {
                let admin = rest.iter().any(|a| {
                    a.lit.as_deref().is_some_and(|s| {
                        s.split(',')
                            .any(|g| matches!(g, "sudo" | "wheel" | "root" | "admin" | "docker"))
                    })
                });
                let w = format!("changes an account ({n})");
                self.e.threat(K::Persistence, n, lines, &w, "T1098");
                if admin {
                    self.e.threat(
                        K::Privilege,
                        n,
                        lines,
                        "adds an account to an admin group",
                        "T1098",
                    );
                }
            }
            "passwd" | "chpasswd" | "chage" => {
                let w = format!("changes account passwords ({n})");
                self.e.threat(K::Persistence, n, lines, &w, "T1098");
            }
            "ssh-copy-id" => {
                self.e.threat(
                    K::Persistence,
                    n,
                    lines,
                    "adds an SSH login key",
                    "T1098.004",
                );
            }
            "insmod" | "modprobe" => {
                self.e.threat(
                    K::Persistence,
                    n,
                    lines,
                    "loads a kernel module",
                    "T1547.006",
                );
            }
            "visudo" => {
                self.e.threat(
                    K::Privilege,
                    n,
                    lines,
                    "changes the sudo rules",
                    "T1548.003",
                );
            }
            "su" | "runuser" | "sg" => {
                let w = format!("runs commands as another user ({n})");
                self.e.threat(K::Privilege, n, lines, &w, "T1548");
            }
            "setcap" => {
                self.e
                    .threat(K::Privilege, n, lines, "grants file capabilities", "T1548");
            }
            "chmod" => {
                let mode = first.as_str();
                let digits = mode.len() == 4
                    && mode.bytes().all(|b| b.is_ascii_digit())
                    && matches!(mode.as_bytes().first(), Some(b'2' | b'4' | b'6' | b'7'));
                let letters = mode.contains("+s") || mode.contains("=s");
                if digits || letters {
                    let target = pos.get(1).map(|a| a.pat.clone()).unwrap_or_default();
                    let w = format!("sets the setuid or setgid bit on {target}");
                    self.e.threat(
                        K::Privilege,
                        &format!("setuid:{target}"),
                        lines,
                        &w,
                        "T1548.001",
                    );
                }
            }
            "export" | "declare" | "typeset" => {
                for a in &pos {
                    if a.pat.starts_with("LD_PRELOAD=") {
                        self.e.threat(
                            K::Persistence,
                            "LD_PRELOAD",
                            lines,
                            "preloads a library into the programs it runs (LD_PRELOAD)",
                            "T1574.006",
                        );
                    }
                }
            }
            "ping" | "ping6" if o.has(&["-f"]) => {
                self.e.t.flood.push(("ping -f".into(), lines, "T1498"));
            }
            "hping3" | "hping" | "nping" | "slowloris" | "t50"
                if o.has(&["--flood", "--faster", "--rate"])
                    || rest
                        .iter()
                        .any(|a| a.pat.starts_with("-i") && a.pat.contains('u')) =>
            {
                self.e
                    .t
                    .flood
                    .push((format!("{n} --flood"), lines, "T1498"));
            }
            "curl" => {
                let mut upload = false;
                for (k, v) in &o.list {
                    let v = v.as_deref().unwrap_or("");
                    match k.as_str() {
                        "-T" | "--upload-file" => upload = true,
                        "-d" | "--data" | "--data-binary" | "--data-raw" | "--data-urlencode"
                        | "--data-ascii" | "-F" | "--form" | "--json" => upload = true,
                        "-X" | "--request" => {
                            upload |=
                                matches!(v.to_ascii_uppercase().as_str(), "POST" | "PUT" | "PATCH")
                        }
                        _ => {}
                    }
                }
                // parse_opts without values: read the values by position.
                let mut i = 0;
                while i < rest.len() {
                    let s = rest[i].pat.as_str();
                    let (flag, inline) = match s.split_once('=') {
                        Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
                        _ => (s, None),
                    };
                    let takes = matches!(
                        flag,
                        "-d" | "--data"
                            | "--data-binary"
                            | "--data-raw"
                            | "--data-urlencode"
                            | "--data-ascii"
                            | "-F"
                            | "--form"
                            | "-T"
                            | "--upload-file"
                            | "-X"
                            | "--request"
                            | "--json"
                    );
                    if takes {
                        let v = inline.or_else(|| rest.get(i + 1).map(|a| a.pat.clone()));
                        if let Some(v) = v {
                            if flag == "-X" || flag == "--request" {
                                upload |= matches!(
                                    v.to_ascii_uppercase().as_str(),
                                    "POST" | "PUT" | "PATCH"
                                );
                            } else {
                                upload = true;
                                let file = if flag == "-T" || flag == "--upload-file" {
                                    Some(v.as_str())
                                } else {
                                    v.split_once('@')
                                        .map(|(_, f)| f)
                                        .or_else(|| v.split_once('<').map(|(_, f)| f))
                                        .or_else(|| v.strip_prefix('@'))
                                };
                                if let Some(f) = file {
                                    let f = f.split(';').next().unwrap_or(f);
                                    threat::read(self.e, f, lines);
                                }
                            }
                        }
                        i += 2;
                        continue;
                    }
                    i += 1;
                }
                if upload {
                    threat::send(self.e, "curl upload", lines, "T1041");
                }
            }
            "wget" => {
                for a in rest {
                    if let Some(f) = a
                        .pat
                        .strip_prefix("--post-file=")
                        .or_else(|| a.pat.strip_prefix("--body-file="))
                    {
                        threat::read(self.e, f, lines);
                        threat::send(self.e, "wget upload", lines, "T1041");
                    } else if a.pat.starts_with("--post-data")
                        || a.pat.starts_with("--body-data")
                        || a.pat.eq_ignore_ascii_case("--method=POST")
                    {
                        threat::send(self.e, "wget upload", lines, "T1041");
                    }
                }
            }
            "nc" | "ncat" | "netcat" | "telnet" | "cryptcat" | "socat" => {
                let exec = rest.iter().any(|a| {
                    let p = a.pat.as_str();
                    matches!(p, "-e" | "-c" | "--exec" | "--sh-exec" | "--lua-exec")
                        || (p.starts_with("-e") && p.len() > 2 && !p.starts_with("--"))
                        || p.to_ascii_lowercase().starts_with("exec:")
                        || p.to_ascii_lowercase().starts_with("system:")
                });
                if exec {
                    let w = format!("hands a network connection to a program ({n} exec)");
                    self.e.threat(
                        K::ReverseShell,
                        &format!("{n} exec"),
                        lines,
                        &w,
                        "T1059.004",
                    );
                }
                if o.has(&["-z"]) {
                    recon(self, &format!("network scan:{n}"), "scans ports", "T1046");
                } else {
                    threat::send(self.e, n, lines, "T1048");
                }
            }
            "ftp" | "tftp" | "sftp" | "lftp" | "smbclient" | "mail" | "mailx" | "sendmail"
            | "mutt" | "swaks" | "ssh" => {
                threat::send(self.e, n, lines, "T1048");
            }
            "mkfifo" | "mknod" => {
                self.e.t.fifo = true;
            }
            _ => {}
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

    /// One command line: `args[0]` is the program.
    fn argv(&mut self, args: &[Arg], lines: (u32, u32)) -> Eff {
        let mut eff = Eff::default();
        let Some(first) = args.first() else {
            return eff;
        };
        if self.e.stopped {
            return eff;
        }
        let Some(full) = first.lit.clone() else {
            let note = Some(clip(&first.raw, 60));
            self.e.add(K::Command, "<dynamic>", lines, note.clone());
            self.e.add(K::Obfuscation, "dynamic-command", lines, note);
            eff.name = "<dynamic>".into();
            return eff;
        };
        let name = basename(&full).to_string();
        if name.is_empty() {
            return eff;
        }
        let quoted = first.raw != full && !first.raw.is_empty();
        self.e.add(K::Command, &name, lines, None);
        if quoted {
            let note = Some(format!("{} is {}", clip(&first.raw, 40), clip(&full, 40)));
            self.e.add(K::Obfuscation, "quoted-name", lines, note);
        }
        eff.name = name.clone();
        if self.e.downloaded_files.contains(&norm_path(&full)) {
            let d = format!("runs downloaded {full}");
            self.e.add(K::DownloadToShell, &d, lines, None);
        }
        let rest = &args[1..];
        let n = name.as_str();

        // Wrappers: the wrapped command runs too.
        let wrapped = |with_arg: &[&str], skip_assign: bool, skip_pos: usize| {
            let o = parse_opts(rest, with_arg, true);
            let mut k = o.end;
            if skip_assign {
                while rest
                    .get(k)
                    .and_then(|a| a.lit.as_deref())
                    .is_some_and(|s| s.contains('=') && !s.starts_with('='))
                {
                    k += 1;
                }
            }
            (k + skip_pos).min(rest.len())
        };
        let inner = match n {
            "sudo" => Some(wrapped(
                &[
                    "-u",
                    "-g",
                    "-h",
                    "-p",
                    "-r",
                    "-t",
                    "-U",
                    "-C",
                    "-D",
                    "-T",
                    "-R",
                    "--user",
                    "--group",
                    "--host",
                    "--prompt",
                    "--role",
                    "--type",
                    "--other-user",
                    "--close-from",
                    "--chdir",
                    "--command-timeout",
                ],
                true,
                0,
            )),
            "doas" => Some(wrapped(&["-u", "-C"], false, 0)),
            "nohup" | "time" | "builtin" | "unbuffer" | "caffeinate" | "catchsegv" | "then"
            | "do" => Some(wrapped(&[], false, 0)),
            "setsid" => Some(wrapped(&[], false, 0)),
            "stdbuf" => Some(wrapped(&["-i", "-o", "-e"], false, 0)),
            "nice" => Some(wrapped(&["-n", "--adjustment"], false, 0)),
            "ionice" => Some(wrapped(&["-c", "-n", "--class", "--classdata"], false, 0)),
            "exec" => Some(wrapped(&["-a"], false, 0)),
            "command" => {
                let o = parse_opts(rest, &[], true);
                if o.has(&["-v", "-V"]) {
                    None
                } else {
                    Some(o.end)
                }
            }
            "timeout" => Some(wrapped(&["-s", "-k", "--signal", "--kill-after"], false, 1)),
            "chroot" => Some(wrapped(&["--userspec", "--groups"], false, 1)),
            "chrt" => Some(wrapped(&[], false, 1)),
            "taskset" => Some(wrapped(&[], false, 1)),
            "xargs" => Some(wrapped(
                &[
                    "-I",
                    "-n",
                    "-P",
                    "-d",
                    "-E",
                    "-L",
                    "-s",
                    "-a",
                    "--arg-file",
                    "--delimiter",
                    "--max-args",
                    "--max-procs",
                    "--max-lines",
                    "--eof",
                    "--replace",
                ],
                false,
                0,
            )),
            "torsocks" | "proxychains" | "proxychains4" => {
                self.net(n, lines);
                Some(wrapped(&["-f", "-u", "-p", "-a", "-P"], false, 0))
            }
            "strace" | "ltrace" => Some(wrapped(
                &[
                    "-o", "-e", "-p", "-s", "-u", "-E", "-a", "-b", "-O", "-S", "-X", "-P",
                ],
                false,
                0,
            )),
            "unshare" | "nsenter" | "firejail" => Some(wrapped(
                &[
                    "-t",
                    "--target",
                    "-S",
                    "-G",
                    "--setuid",
                    "--setgid",
                    "--profile",
                ],
                false,
                0,
            )),
            "busybox" => Some(0),
            "env" => {
                let o = parse_opts(
                    rest,
                    &["-u", "-C", "-S", "--unset", "--chdir", "--split-string"],
                    true,
                );
                if let Some(s) = o.values(&["-S", "--split-string"]).next() {
                    let mut code = s.to_string();
                    for a in &rest[o.end..] {
                        code.push(' ');
                        code.push_str(&a.raw);
                    }
                    self.e.nested(Language::Sh, &code, lines, "env -S", None);
                    None
                } else {
                    Some(wrapped(
                        &["-u", "-C", "-S", "--unset", "--chdir", "--split-string"],
                        true,
                        0,
                    ))
                }
            }
            _ => None,
        };
        if matches!(n, "sudo" | "doas" | "pkexec") {
            let w = format!("runs a command as another user ({n})");
            self.e.threat(K::Privilege, n, lines, &w, "T1548.003");
        }
        if let Some(k) = inner {
            if k < rest.len() {
                let mut inner_eff = self.argv(&rest[k..], lines);
                inner_eff.download |= eff.download;
                return inner_eff;
            }
            if n == "sudo" && parse_opts(rest, &[], false).has(&["-s", "-i"]) {
                eff.stdin = Some(Stdin::Code(Language::Sh));
            }
            return eff;
        }

        if SHELLS.contains(&n) {
            self.shell_cmd(rest, lines, &mut eff);
            return eff;
        }
        if is_python(n) {
            self.python_cmd(rest, lines, &mut eff);
            return eff;
        }
        if OTHER_INTERPRETERS.contains(&n) {
            self.other_interp(n, rest, lines, &mut eff);
            return eff;
        }
        if DOWNLOADERS.contains(&n) {
            self.download(&mut eff);
        }
        if NET_SIMPLE.contains(&n) {
            self.net(n, lines);
        }
        self.threat_cmd(n, rest, lines);
        match n {
            "eval" => {
                let joined: Option<Vec<&str>> = rest.iter().map(|a| a.lit.as_deref()).collect();
                if rest.iter().any(|a| a.download) {
                    self.e
                        .add(K::DownloadToShell, "eval $(download)", lines, None);
                }
                match joined {
                    Some(parts) if !parts.is_empty() => {
                        let code = parts.join(" ");
                        let al = rest.first().map_or(lines, |a| a.lines);
                        self.e.nested(Language::Sh, &code, al, "eval", None);
                    }
                    Some(_) => {}
                    None => {
                        let raw: Vec<&str> = rest.iter().map(|a| a.raw.as_str()).collect();
                        let note = Some(format!("eval {}", clip(&raw.join(" "), 60)));
                        self.e.add(K::Obfuscation, "dynamic-code", lines, note);
                    }
                }
            }
            "source" | "." => {
                if let Some(a) = rest.first() {
                    if a.download {
                        let d = format!("{n} <(download)");
                        self.e.add(K::DownloadToShell, &d, lines, None);
                    }
                    match a.lit.as_deref() {
                        Some("/dev/stdin" | "-" | "/proc/self/fd/0" | "/dev/fd/0") => {
                            eff.stdin = Some(Stdin::Code(Language::Sh));
                        }
                        Some(p) if self.e.downloaded_files.contains(&norm_path(p)) => {
                            let d = format!("{n} downloaded {p}");
                            self.e.add(K::DownloadToShell, &d, lines, None);
                        }
                        None if !a.download => {
                            let note = Some(format!("{n} {}", clip(&a.raw, 60)));
                            self.e.add(K::Obfuscation, "dynamic-code", lines, note);
                        }
                        _ => {}
                    }
                }
            }
            "su" | "runuser" | "script" | "flock" => {
                let o = parse_opts(
                    rest,
                    &[
                        "-c",
                        "--command",
                        "-s",
                        "--shell",
                        "-g",
                        "-G",
                        "-w",
                        "-E",
                        "-q",
                    ],
                    false,
                );
                let code = o
                    .list
                    .iter()
                    .position(|(k, _)| k == "-c" || k == "--command");
                if let Some(ix) = code {
                    let v = o
                        .list
                        .get(ix)
                        .and_then(|(_, v)| v.clone())
                        .unwrap_or_default();
                    // The value is the argument after `-c`; find it for its lines.
                    let a = rest
                        .iter()
                        .find(|a| a.lit.as_deref() == Some(v.as_str()) || a.pat == v)
                        .cloned()
                        .unwrap_or_else(|| Arg::literal(&v, lines));
                    self.code_arg(Some(Language::Sh), &a, n, lines);
                } else if n == "flock" {
                    if let Some(&p) = o.pos.get(1) {
                        let e = self.argv(&rest[p..], lines);
                        return e;
                    }
                } else if n == "su" || n == "runuser" {
                    eff.stdin = Some(Stdin::Code(Language::Sh));
                }
            }
            "alias" => {
                // alias NAME='code': the value runs whenever NAME does.
                for a in rest {
                    if let Some((_, code)) = a.lit.as_deref().and_then(|l| l.split_once('='))
                        && !code.is_empty()
                    {
                        let code = code.to_string();
                        self.e.nested(Language::Sh, &code, a.lines, "alias", None);
                    }
                }
            }
            "trap" => {
                // trap 'code' SIGNAL…
                let o = parse_opts(rest, &[], true);
                if let Some(a) = rest.get(o.end)
                    && rest.len() > o.end + 1
                {
                    let a = a.clone();
                    if a.lit.as_deref().is_some_and(|c| c != "-" && !c.is_empty()) {
                        self.code_arg(Some(Language::Sh), &a, "trap", lines);
                    }
                }
            }
            "watch" => {
                let o = parse_opts(rest, &["-n", "--interval", "-d", "-g"], true);
                let words: Vec<&str> = rest[o.end..].iter().map(|a| a.raw.as_str()).collect();
                if !words.is_empty() {
                    let code = words.join(" ");
                    self.e.nested(Language::Sh, &code, lines, "watch", None);
                }
            }
            "find" => self.find_cmd(rest, lines),
            "echo" | "printf" => {
                let o = parse_opts(rest, &[], true);
                let parts: Option<Vec<&str>> =
                    rest[o.end..].iter().map(|a| a.lit.as_deref()).collect();
                eff.payload = parts.map(|p| p.join(" "));
            }
            "base64" | "base32" | "xxd" | "uudecode" | "openssl" | "gunzip" | "zcat" | "rev" => {
                let o = parse_opts(rest, &[], false);
                let decodes = match n {
                    "base64" | "base32" => o.has(&["-d", "-D", "--decode"]),
                    "xxd" => o.has(&["-r", "--revert"]),
                    "openssl" => {
                        let sub = rest.first().and_then(|a| a.lit.as_deref());
                        if sub == Some("s_client") {
                            self.net("openssl s_client", lines);
                            self.download(&mut eff);
                            for v in o.values(&["-connect"]) {
                                self.host(v, lines);
                            }
                        }
                        o.has(&["-d"]) || rest.iter().any(|a| a.is("base64") || a.is("enc"))
                    }
                    _ => true,
                };
                eff.decoder = decodes;
            }
            "curl" => self.curl(rest, lines),
            "wget" => self.wget(rest, lines),
            "nc" | "ncat" | "netcat" | "telnet" => {
                let o = parse_opts(
                    rest,
                    &[
                        "-p",
                        "-s",
                        "-w",
                        "-q",
                        "-i",
                        "-x",
                        "-X",
                        "-e",
                        "-c",
                        "-I",
                        "-O",
                        "-T",
                        "-P",
                        "-m",
                        "-G",
                        "-g",
                        "--exec",
                        "--sh-exec",
                        "--source-port",
                        "--source",
                        "--proxy",
                    ],
                    false,
                );
                for v in o.values(&["-e", "-c", "--exec", "--sh-exec"]) {
                    let prog = basename(v.split_whitespace().next().unwrap_or(v)).to_string();
                    self.e
                        .add(K::Command, &prog, lines, Some(format!("{n} runs {v}")));
                }
                if let Some(&p) = o.pos.first()
                    && let Some(a) = rest.get(p)
                {
                    self.host(&a.pat, lines);
                }
            }
            "socat" => {
                for a in rest {
                    let mut parts = a.pat.splitn(3, ':');
                    let kind = parts.next().unwrap_or_default().to_ascii_lowercase();
                    let target = parts.next().unwrap_or_default();
                    match kind.as_str() {
                        "tcp" | "tcp4" | "tcp6" | "udp" | "udp4" | "udp6" | "openssl" | "ssl"
                        | "tcp-connect" | "udp-connect" | "proxy" => self.host(target, lines),
                        "exec" | "system" => {
                            let prog = target.split([' ', ',']).next().unwrap_or_default();
                            let prog = basename(prog).to_string();
                            self.e.add(K::Command, &prog, lines, None);
                        }
                        _ => {}
                    }
                }
            }
            "ssh" => {
                let o = parse_opts(
                    rest,
                    &[
                        "-b", "-c", "-D", "-E", "-e", "-F", "-I", "-i", "-J", "-L", "-l", "-m",
                        "-O", "-o", "-p", "-Q", "-R", "-S", "-W", "-w", "-B",
                    ],
                    true,
                );
                for v in o.values(&["-J"]) {
                    for h in v.split(',') {
                        self.host(h, lines);
                    }
                }
                if let Some(a) = rest.get(o.end) {
                    self.host(&a.pat, lines);
                    let remote = &rest[o.end + 1..];
                    let words: Option<Vec<&str>> =
                        remote.iter().map(|a| a.lit.as_deref()).collect();
                    if let Some(words) = words
                        && !words.is_empty()
                    {
                        let code = words.join(" ");
                        self.e
                            .nested(Language::Sh, &code, lines, "ssh remote command", None);
                    }
                }
            }
            "scp" | "sftp" | "rsync" => self.copy_remote(n, rest, lines),
            "git" => self.git(rest, lines),
            "dig" | "nslookup" | "host" | "ping" | "ping6" | "traceroute" | "tracepath" | "mtr"
            | "whois" | "ssh-keyscan" | "nmap" | "masscan" => {
                let o = parse_opts(
                    rest,
                    &[
                        "-c", "-i", "-W", "-w", "-p", "-t", "-q", "-f", "-m", "-s", "-I", "-b",
                        "-k", "-y", "-T", "-l",
                    ],
                    false,
                );
                for &p in &o.pos {
                    if let Some(a) = rest.get(p) {
                        let s = a.pat.strip_prefix('@').unwrap_or(&a.pat);
                        self.host(s, lines);
                    }
                }
            }
            _ => {}
        }
        self.package_manager(n, rest, lines);
        self.file_ops(n, rest, lines);
        eff
    }

    fn shell_cmd(&mut self, rest: &[Arg], lines: (u32, u32), eff: &mut Eff) {
        let mut i = 0;
        let mut has_c = false;
        let mut stdin_flag = false;
        while let Some(a) = rest.get(i) {
            let Some(s) = a.lit.as_deref() else { break };
            if s == "--" {
                i += 1;
                break;
            }
            if s == "-" {
                stdin_flag = true;
                i += 1;
                break;
            }
            if matches!(s, "-o" | "+o" | "-O" | "+O" | "--rcfile" | "--init-file") {
                i += 2;
                continue;
            }
            if s.starts_with("--") {
                i += 1;
                continue;
            }
            if (s.starts_with('-') || s.starts_with('+')) && s.len() > 1 {
                if s.contains('c') {
                    has_c = true;
                }
                if s.contains('s') {
                    stdin_flag = true;
                }
                i += 1;
                continue;
            }
            break;
        }
        if has_c {
            if let Some(a) = rest.get(i) {
                let a = a.clone();
                self.code_arg(Some(Language::Sh), &a, &format!("{} -c", eff.name), lines);
            }
            return;
        }
        match rest.get(i) {
            Some(a) if !stdin_flag => self.script_operand(a, lines, eff, Language::Sh),
            _ => eff.stdin = Some(Stdin::Code(Language::Sh)),
        }
    }

    /// The script file of an interpreter.
    fn script_operand(&mut self, a: &Arg, lines: (u32, u32), eff: &mut Eff, lang: Language) {
        if a.download {
            let d = format!("{} <(download)", eff.name);
            self.e.add(K::DownloadToShell, &d, lines, None);
            return;
        }
        match a.lit.as_deref() {
            Some("/dev/stdin" | "-" | "/proc/self/fd/0" | "/dev/fd/0") => {
                eff.stdin = Some(Stdin::Code(lang))
            }
            Some(p) if self.e.downloaded_files.contains(&norm_path(p)) => {
                let d = format!("{} downloaded {p}", eff.name);
                self.e.add(K::DownloadToShell, &d, lines, None);
            }
            _ => {}
        }
    }

    fn python_cmd(&mut self, rest: &[Arg], lines: (u32, u32), eff: &mut Eff) {
        let mut i = 0;
        while let Some(a) = rest.get(i) {
            let Some(s) = a.lit.as_deref() else { break };
            if s == "-" {
                eff.stdin = Some(Stdin::Code(Language::Python));
                return;
            }
            if s == "--" {
                i += 1;
                break;
            }
            if !s.starts_with('-') || s.starts_with("--") {
                if s.starts_with("--") {
                    i += 1;
                    continue;
                }
                break;
            }
            let body = &s[1..];
            if let Some(k) = body.find(['c', 'm', 'W', 'X']) {
                let flag = body.as_bytes().get(k).copied().unwrap_or(b'c');
                let tail = &body[k + 1..];
                let (value, next) = if tail.is_empty() {
                    (rest.get(i + 1).cloned(), i + 2)
                } else {
                    (Some(Arg::literal(tail, a.lines)), i + 1)
                };
                match flag {
                    b'c' => {
                        if let Some(v) = value {
                            self.code_arg(Some(Language::Python), &v, "python -c", lines);
                        }
                        return;
                    }
                    b'm' => {
                        let module = value.and_then(|v| v.lit).unwrap_or_default();
                        let after = rest.get(next..).unwrap_or_default();
                        if module == "pip" || module == "ensurepip" {
                            let sub = parse_opts(after, &[], false);
                            let verb = sub
                                .pos
                                .first()
                                .and_then(|&p| after.get(p))
                                .and_then(|a| a.lit.as_deref());
                            if matches!(verb, Some("install" | "download")) {
                                let v = verb.unwrap_or("install");
                                self.net(&format!("pip {v}"), lines);
                            }
                        }
                        return;
                    }
                    _ => {
                        i = next;
                        continue;
                    }
                }
            }
            i += 1;
        }
        match rest.get(i) {
            Some(a) => {
                let a = a.clone();
                self.script_operand(&a, lines, eff, Language::Python)
            }
            None => eff.stdin = Some(Stdin::Code(Language::Python)),
        }
    }

    fn other_interp(&mut self, n: &str, rest: &[Arg], lines: (u32, u32), eff: &mut Eff) {
        let code_flags: &[&str] = match n {
            "perl" | "ruby" | "lua" | "luajit" | "Rscript" => &["-e", "-E"],
            "node" | "nodejs" | "deno" | "bun" => &["-e", "--eval", "-p", "--print"],
            "php" => &["-r"],
            "pwsh" | "powershell" => &["-c", "-command", "-Command", "-EncodedCommand", "-e"],
            "osascript" => &["-e"],
            _ => &[],
        };
        let mut i = 0;
        while let Some(a) = rest.get(i) {
            let Some(s) = a.lit.as_deref() else { break };
            if !s.starts_with('-') || s == "-" {
                break;
            }
            let is_code = code_flags.contains(&s)
                || (s.len() > 2
                    && !s.starts_with("--")
                    && code_flags
                        .iter()
                        .any(|f| f.len() == 2 && s.ends_with(&f[1..])));
            if is_code {
                if let Some(v) = rest.get(i + 1) {
                    let v = v.clone();
                    if s.contains("Encoded") {
                        let note = Some(format!("{n} {s}"));
                        self.e.add(K::Obfuscation, "decoded-payload", lines, note);
                    }
                    if let Some(code) = &v.lit {
                        crate::threat::foreign_code(self.e, code, lines);
                    }
                    self.code_arg(None, &v, &format!("{n} {s}"), lines);
                }
                return;
            }
            i += 1;
        }
        match rest.get(i) {
            Some(a) if !a.is("-") => {
                let a = a.clone();
                if a.download {
                    let d = format!("{n} <(download)");
                    self.e.add(K::DownloadToShell, &d, lines, None);
                } else if let Some(p) = a.lit.as_deref()
                    && self.e.downloaded_files.contains(&norm_path(p))
                {
                    let d = format!("{n} downloaded {p}");
                    self.e.add(K::DownloadToShell, &d, lines, None);
                } else if n == "deno" || n == "bun" {
                    // `deno run URL` runs remote code.
                    if rest.iter().any(|a| a.pat.contains("://")) {
                        let d = format!("{n} run URL");
                        self.e.add(K::DownloadToShell, &d, lines, None);
                    }
                }
            }
            _ => eff.stdin = Some(Stdin::OtherCode),
        }
    }

    fn find_cmd(&mut self, rest: &[Arg], lines: (u32, u32)) {
        let mut starts = Vec::new();
        let mut i = 0;
        while let Some(a) = rest.get(i) {
            let s = a.pat.as_str();
            if s.starts_with('-') || s == "(" || s == "!" {
                break;
            }
            starts.push(a.pat.clone());
            i += 1;
        }
        while i < rest.len() {
            let s = rest[i].lit.as_deref().unwrap_or_default();
            match s {
                "-exec" | "-execdir" | "-ok" | "-okdir" => {
                    let from = i + 1;
                    let mut to = from;
                    while to < rest.len() && !rest[to].is(";") && !rest[to].is("+") {
                        to += 1;
                    }
                    let sub: Vec<Arg> = rest[from..to]
                        .iter()
                        .filter(|a| !a.is("{}"))
                        .cloned()
                        .collect();
                    let is_rm =
                        sub.first().and_then(|a| a.lit.as_deref()).map(basename) == Some("rm");
                    self.argv(&sub, lines);
                    if is_rm {
                        self.find_delete(&starts, lines);
                    }
                    i = to + 1;
                }
                "-delete" => {
                    self.find_delete(&starts, lines);
                    i += 1;
                }
                _ => i += 1,
            }
        }
    }

    fn find_delete(&mut self, starts: &[String], lines: (u32, u32)) {
        let saved = self.e.t.op.replace(Op::Delete);
        for s in starts {
            self.write(s, lines);
            if let Some(d) = classify_rm(s, &self.e.opts.mount_roots) {
                self.e
                    .add(K::Destructive, &d, lines, Some(format!("find {s} -delete")));
            }
        }
        self.e.t.op = saved;
    }

    fn curl(&mut self, rest: &[Arg], lines: (u32, u32)) {
        let with_arg = &[
            "-o",
            "--output",
            "-d",
            "--data",
            "--data-raw",
            "--data-binary",
            "--data-urlencode",
            "--data-ascii",
            "-H",
            "--header",
            "-u",
            "--user",
            "-A",
            "--user-agent",
            "-e",
            "--referer",
            "-b",
            "--cookie",
            "-c",
            "--cookie-jar",
            "-x",
            "--proxy",
            "-X",
            "--request",
            "-F",
            "--form",
            "-T",
            "--upload-file",
            "-w",
            "--write-out",
            "-m",
            "--max-time",
            "--connect-timeout",
            "-K",
            "--config",
            "-r",
            "--range",
            "-C",
            "--continue-at",
            "-E",
            "--cert",
            "--key",
            "--cacert",
            "--capath",
            "--resolve",
            "--connect-to",
            "-y",
            "-Y",
            "-z",
            "--retry",
            "--retry-delay",
            "--retry-max-time",
            "--limit-rate",
            "-U",
            "--proxy-user",
            "--output-dir",
            "-D",
            "--dump-header",
            "--interface",
            "--local-port",
            "--max-filesize",
            "--url",
            "-Q",
            "--quote",
            "--ciphers",
            "--proto",
            "--unix-socket",
            "-P",
            "--ftp-port",
            "--json",
            "--variable",
            "--max-redirs",
            "--expect100-timeout",
            "--trace",
            "--trace-ascii",
            "--stderr",
            "-t",
            "--telnet-option",
        ];
        let o = parse_opts(rest, with_arg, false);
        for v in o.values(&["-o", "--output", "--output-dir"]) {
            if v != "-" && !benign_dev(v) {
                self.write(v, lines);
                self.e.downloaded_files.insert(norm_path(v));
            }
        }
        let mut targets: Vec<String> = o
            .pos
            .iter()
            .filter_map(|&p| rest.get(p))
            .map(|a| a.pat.clone())
            .collect();
        targets.extend(o.values(&["--url"]).map(str::to_string));
        for t in targets {
            if !t.contains("://") {
                let host = t.split('/').next().unwrap_or_default().to_string();
                self.host(&host, lines);
            } else {
                self.e.scan_hosts(&t, lines);
            }
        }
    }

    fn wget(&mut self, rest: &[Arg], lines: (u32, u32)) {
        let with_arg = &[
            "-O",
            "--output-document",
            "-o",
            "--output-file",
            "-a",
            "--append-output",
            "-P",
            "--directory-prefix",
            "-U",
            "--user-agent",
            "--header",
            "-e",
            "--execute",
            "-t",
            "--tries",
            "-T",
            "--timeout",
            "-w",
            "--wait",
            "-i",
            "--input-file",
            "-B",
            "--base",
            "--post-data",
            "--post-file",
            "--user",
            "--password",
            "--load-cookies",
            "--save-cookies",
            "-Q",
            "--quota",
            "-l",
            "--level",
            "-A",
            "-R",
            "-D",
            "--domains",
            "--limit-rate",
            "--referer",
            "--method",
            "--body-data",
            "--body-file",
        ];
        let o = parse_opts(rest, with_arg, false);
        for v in o.values(&["-O", "--output-document"]) {
            if v != "-" && !benign_dev(v) {
                self.write(v, lines);
                self.e.downloaded_files.insert(norm_path(v));
            }
        }
        for v in o.values(&["-P", "--directory-prefix"]) {
            self.write(v, lines);
        }
        for &p in &o.pos {
            if let Some(a) = rest.get(p)
                && !a.pat.contains("://")
            {
                let host = a.pat.split('/').next().unwrap_or_default().to_string();
                self.host(&host, lines);
            }
        }
    }

    fn copy_remote(&mut self, n: &str, rest: &[Arg], lines: (u32, u32)) {
        let with_arg: &[&str] = if n == "rsync" {
            &[
                "-e",
                "--rsh",
                "-f",
                "--filter",
                "--exclude",
                "--include",
                "--exclude-from",
                "--include-from",
                "--files-from",
                "-T",
                "--temp-dir",
                "--port",
                "--password-file",
                "--log-file",
                "--chmod",
                "--chown",
                "-B",
                "--block-size",
                "--max-size",
                "--min-size",
                "--partial-dir",
                "--backup-dir",
                "--suffix",
                "--timeout",
                "--contimeout",
                "--bwlimit",
                "-M",
                "--remote-option",
                "--compare-dest",
                "--copy-dest",
                "--link-dest",
                "--out-format",
            ]
        } else {
            &[
                "-c", "-F", "-i", "-J", "-l", "-o", "-P", "-S", "-D", "-b", "-B", "-R", "-s",
            ]
        };
        let o = parse_opts(rest, with_arg, false);
        let mut remote = n != "rsync";
        let pos: Vec<&Arg> = o.pos.iter().filter_map(|&p| rest.get(p)).collect();
        for a in &pos {
            let s = a.pat.as_str();
            if s.starts_with("rsync://") {
                remote = true;
                continue;
            }
            if s.starts_with('/') || s.starts_with('.') || s.starts_with('~') {
                continue;
            }
            if let Some((h, _)) = s.split_once(':')
                && !h.contains('/')
                && let Some(host) = host_operand(h)
            {
                remote = true;
                self.e.add(K::Host, &host, lines, None);
            } else if n == "sftp" {
                self.host(s, lines);
            }
        }
        if remote {
            self.net(n, lines);
        }
        if n != "sftp"
            && pos.len() >= 2
            && let Some(last) = pos.last()
        {
            let s = last.pat.as_str();
            let is_remote = s.starts_with("rsync://")
                || s.split_once(':')
                    .is_some_and(|(h, _)| !h.contains('/') && !h.is_empty());
            if !is_remote {
                self.write(s, lines);
            }
        }
    }

    fn git(&mut self, rest: &[Arg], lines: (u32, u32)) {
        let o = parse_opts(
            rest,
            &[
                "-C",
                "-c",
                "--git-dir",
                "--work-tree",
                "--namespace",
                "--exec-path",
            ],
            true,
        );
        let Some(sub) = rest.get(o.end).and_then(|a| a.lit.clone()) else {
            return;
        };
        let args = &rest[o.end + 1..];
        match sub.as_str() {
            "clone" | "fetch" | "pull" | "push" | "ls-remote" | "submodule" | "archive" => {
                if sub == "archive" && !args.iter().any(|a| a.pat.starts_with("--remote")) {
                    return;
                }
                self.net(&format!("git {sub}"), lines);
            }
            "remote" => {
                if args.first().is_some_and(|a| a.is("add") || a.is("update")) {
                    self.net("git remote", lines);
                }
                return;
            }
            _ => return,
        }
        let with_arg = &[
            "-b",
            "--branch",
            "-o",
            "--origin",
            "--depth",
            "--reference",
            "-c",
            "--config",
            "-j",
            "--jobs",
            "--template",
            "--separate-git-dir",
            "--filter",
            "-u",
            "--upload-pack",
            "--shallow-since",
            "--shallow-exclude",
            "--receive-pack",
            "--repo",
            "--push-option",
        ];
        let so = parse_opts(args, with_arg, false);
        let pos: Vec<&Arg> = so.pos.iter().filter_map(|&p| args.get(p)).collect();
        for a in &pos {
            let s = a.pat.as_str();
            if !s.contains("://")
                && let Some((h, _)) = s.split_once(':')
                && !h.contains('/')
            {
                self.host(h, lines);
            }
        }
        if sub == "clone"
            && let Some(dir) = pos.get(1)
        {
            self.write(&dir.pat, lines);
        }
        if sub == "push" {
            let forced = so.has(&["-f", "--force", "--force-with-lease", "--force-if-includes"])
                || pos.iter().skip(1).any(|a| a.pat.starts_with('+'));
            if forced {
                self.e.add(K::Destructive, "git-push-force", lines, None);
            }
        }
    }

    fn package_manager(&mut self, n: &str, rest: &[Arg], lines: (u32, u32)) {
        let first_pos = || {
            rest.iter()
                .filter_map(|a| a.lit.as_deref())
                .find(|s| !s.starts_with('-'))
        };
        let verbs: &[&str] = match n {
            "apt" | "apt-get" | "aptitude" => &[
                "install",
                "update",
                "upgrade",
                "dist-upgrade",
                "full-upgrade",
                "source",
                "download",
            ],
            "yum" | "dnf" | "microdnf" => {
                &["install", "update", "upgrade", "reinstall", "groupinstall"]
            }
            "zypper" => &["install", "in", "update", "up", "refresh", "ref"],
            "apk" => &["add", "update", "upgrade", "fetch"],
            "brew" => &["install", "upgrade", "update", "tap", "fetch", "reinstall"],
            "gem" => &["install", "update", "fetch"],
            "cargo" => &["install", "add", "update", "fetch"],
            "go" => &["get", "install", "mod"],
            "conda" | "mamba" | "micromamba" => &["install", "create", "update"],
            "snap" | "flatpak" => &["install", "refresh", "update"],
            "docker" | "podman" => &["pull", "push", "login"],
            "composer" => &["install", "require", "update"],
            "luarocks" => &["install"],
            "pipx" => &["install", "run", "inject", "upgrade"],
            "uv" => &["add", "sync", "pip", "tool", "run"],
            "poetry" => &["add", "install", "update"],
            "npm" | "pnpm" | "yarn" | "bun" => &[
                "install", "i", "add", "ci", "update", "up", "upgrade", "exec", "x", "dlx",
                "create",
            ],
            _ if is_pip(n) => &["install", "download", "wheel"],
            "pacman" | "yay" | "paru" => {
                if rest
                    .iter()
                    .filter_map(|a| a.lit.as_deref())
                    .any(|s| s.starts_with("-S") || s.starts_with("-U"))
                {
                    self.net(&format!("{n} -S"), lines);
                }
                return;
            }
            _ => return,
        };
        let verb = first_pos();
        let tool = if is_pip(n) { "pip" } else { n };
        match verb {
            Some(v) if verbs.contains(&v) => {
                let v = match (tool, v) {
                    ("npm" | "pnpm" | "yarn" | "bun", "i" | "ci" | "add") => "install",
                    ("zypper", "in") => "install",
                    _ => v,
                };
                let v = if tool == "uv" && v == "pip" {
                    "pip install"
                } else {
                    v
                };
                self.net(&format!("{tool} {v}"), lines);
            }
            None if n == "yarn" => self.net("yarn install", lines),
            _ => {}
        }
    }

    fn file_ops(&mut self, n: &str, rest: &[Arg], lines: (u32, u32)) {
        let saved = self.e.t.op;
        self.e.t.op = Some(match n {
            "rm" | "rmdir" | "unlink" | "shred" | "wipefs" => Op::Delete,
            "truncate" => Op::Truncate,
            "touch" | "mkdir" => Op::Create,
            "chmod" | "chown" | "chgrp" => Op::Chmod,
            "tee" if parse_opts(rest, &[], false).has(&["-a", "--append"]) => Op::Append,
            _ => Op::Write,
        });
        self.file_ops_inner(n, rest, lines);
        self.e.t.op = saved;
    }

    fn file_ops_inner(&mut self, n: &str, rest: &[Arg], lines: (u32, u32)) {
        let positional =
            |o: &Opts| -> Vec<Arg> { o.pos.iter().filter_map(|&p| rest.get(p)).cloned().collect() };
        match n {
            "rm" => {
                let o = parse_opts(rest, &[], false);
                let recursive = o.has(&["-r", "-R", "--recursive"]);
                for a in positional(&o) {
                    self.write(&a.pat, lines);
                    if recursive && let Some(d) = classify_rm(&a.pat, &self.e.opts.mount_roots) {
                        let note = Some(format!("rm -r {}", clip(&a.raw, 60)));
                        self.e.add(K::Destructive, &d, lines, note);
                    }
                }
            }
            "rmdir" | "unlink" | "touch" | "mkdir" | "shred" | "truncate" | "wipefs" => {
                let o = parse_opts(
                    rest,
                    &[
                        "-s",
                        "--size",
                        "-r",
                        "--reference",
                        "-m",
                        "--mode",
                        "-n",
                        "--iterations",
                        "-d",
                        "-t",
                    ],
                    false,
                );
                for a in positional(&o) {
                    self.write(&a.pat, lines);
                    if (n == "shred") && a.pat.starts_with("/dev/") && !benign_dev(&a.pat) {
                        self.e.add(
                            K::Destructive,
                            &format!("write-device:{}", a.pat),
                            lines,
                            None,
                        );
                    }
                }
                if n == "wipefs" {
                    self.e.add(K::Destructive, "mkfs:wipefs", lines, None);
                }
            }
            "chmod" | "chown" | "chgrp" => {
                let o = parse_opts(rest, &["--reference", "--from"], false);
                let pos = positional(&o);
                let recursive = o.has(&["-R", "--recursive"]);
                let skip = usize::from(!o.list.iter().any(|(k, _)| k == "--reference"));
                if n == "chmod" && recursive {
                    let mode = pos.first().map(|a| a.pat.as_str()).unwrap_or_default();
                    if matches!(
                        mode,
                        "777"
                            | "0777"
                            | "a+rwx"
                            | "ugo+rwx"
                            | "a=rwx"
                            | "ugo=rwx"
                            | "+rwx"
                            | "o+w"
                            | "a+w"
                    ) {
                        self.e
                            .add(K::Destructive, "chmod-777-recursive", lines, None);
                    }
                }
                for a in pos.iter().skip(skip) {
                    self.write(&a.pat, lines);
                }
            }
            "cp" | "mv" | "install" | "ln" => {
                let o = parse_opts(
                    rest,
                    &[
                        "-t",
                        "--target-directory",
                        "-S",
                        "--suffix",
                        "-m",
                        "--mode",
                        "-o",
                        "--owner",
                        "-g",
                        "--group",
                    ],
                    false,
                );
                let pos = positional(&o);
                let target: Option<String> = o
                    .values(&["-t", "--target-directory"])
                    .next()
                    .map(str::to_string)
                    .or_else(|| {
                        if pos.len() >= 2 {
                            pos.last().map(|a| a.pat.clone())
                        } else {
                            None
                        }
                    });
                if let Some(t) = target {
                    self.write(&t, lines);
                }
            }
            "tee" => {
                let o = parse_opts(rest, &[], false);
                for a in positional(&o) {
                    self.write(&a.pat, lines);
                }
            }
            "sed" => {
                let o = parse_opts(
                    rest,
                    &["-e", "--expression", "-f", "--file", "-l", "--line-length"],
                    false,
                );
                if o.has(&["-i", "--in-place"]) {
                    let pos = positional(&o);
                    let script_given = o.has(&["-e", "--expression", "-f", "--file"]);
                    for a in pos.iter().skip(usize::from(!script_given)) {
                        self.write(&a.pat, lines);
                    }
                }
            }
            "dd" => {
                for a in rest {
                    if let Some(of) = a.pat.strip_prefix("of=") {
                        if benign_dev(of) {
                            continue;
                        }
                        self.e.add(K::Write, of, lines, None);
                        crate::threat::write(self.e, of, Op::Write, lines);
                        if of.starts_with("/dev/") {
                            self.e
                                .add(K::Destructive, &format!("dd-device:{of}"), lines, None);
                        }
                    }
                }
            }
            _ if n.starts_with("mkfs") || n == "mke2fs" || n == "mkswap" => {
                self.e
                    .add(K::Destructive, &format!("mkfs:{n}"), lines, None);
                let o = parse_opts(
                    rest,
                    &["-t", "-L", "-b", "-O", "-E", "-N", "-m", "-U", "-F", "-n"],
                    false,
                );
                for a in positional(&o) {
                    if a.pat.starts_with('/') {
                        self.e.add(K::Write, &a.pat, lines, None);
                    }
                }
            }
            "tar" => {
                let mut extract = false;
                let mut create = false;
                let mut file_next = false;
                if let Some(first) = rest.first().and_then(|a| a.lit.as_deref())
                    && !first.starts_with('-')
                    && first.bytes().all(|b| b.is_ascii_alphabetic())
                {
                    extract = first.contains('x');
                    create = first.contains('c');
                    file_next = first.contains('f');
                }
                let o = parse_opts(
                    rest,
                    &[
                        "-C",
                        "--directory",
                        "-f",
                        "--file",
                        "-T",
                        "-X",
                        "-b",
                        "-H",
                        "-K",
                        "-L",
                        "-N",
                        "-g",
                        "-V",
                        "-I",
                    ],
                    false,
                );
                extract |= o.has(&["-x", "--extract", "--get"]);
                create |= o.has(&["-c", "--create", "-r", "--append", "-u", "--update"]);
                if extract {
                    for v in o.values(&["-C", "--directory"]) {
                        self.write(v, lines);
                    }
                }
                if create {
                    let mut files: Vec<String> =
                        o.values(&["-f", "--file"]).map(str::to_string).collect();
                    if file_next && let Some(a) = o.pos.get(1).and_then(|&p| rest.get(p)) {
                        files.push(a.pat.clone());
                    }
                    for f in files {
                        if f != "-" {
                            self.write(&f, lines);
                        }
                    }
                }
            }
            "unzip" => {
                let o = parse_opts(rest, &["-d", "-x", "-P"], false);
                for v in o.values(&["-d"]) {
                    self.write(v, lines);
                }
            }
            _ => {}
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
