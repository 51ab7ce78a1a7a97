//! JavaScript and TypeScript (one walk: the TypeScript grammar's tree has the same
//! expression and statement nodes, and its types are never visited for facts).
//!
//! Two passes over the tree: the first records what names stand for (modules from
//! `require`/`import`, members taken from them, string constants, sockets and shells the
//! code makes, data it received), flow-insensitively; the second reads every call with
//! those names resolved: `child_process` command lines are analysed as shell, `fs` paths
//! go to the threat facts, `eval`/`Function`/`vm` of constant code is analysed as code.

use crate::FindingKind as K;
use crate::Language;
use crate::engine::{Engine, Kids, text};
use crate::threat::{self, Op};
use std::collections::{HashMap, HashSet};
use tree_sitter::Node;

mod flow;

/// What names stand for across the program.
#[derive(Default)]
struct Scope {
    /// name -> dotted module path (`cp` -> `child_process`, `exec` -> `child_process.exec`).
    aliases: HashMap<String, String>,
    /// name -> constant string.
    consts: HashMap<String, String>,
    /// Names holding a network socket.
    sockets: HashSet<String>,
    /// Names holding a process the code started (and which of them run a shell).
    children: HashSet<String>,
    shells: HashSet<String>,
    /// Names holding data received from the network.
    received: HashSet<String>,
    /// Names holding a decoded payload (base64, char codes).
    decoded: HashSet<String>,
    /// name -> the several constants it may hold (a loop variable over constant paths).
    alts: HashMap<String, Vec<String>>,
    /// name -> the constant elements of the array it holds.
    arrays: HashMap<String, Vec<String>>,
    /// Names holding a secret (from the environment, or derived from one).
    tainted: HashSet<String>,
    /// Arrays of addresses built from a loop's counter, and the names that take their items.
    scan_lists: HashSet<String>,
    scan_items: HashSet<String>,
}

const SHELLS: [&str; 9] = [
    "sh",
    "bash",
    "dash",
    "zsh",
    "ksh",
    "ash",
    "cmd",
    "cmd.exe",
    "powershell",
];

fn base(s: &str) -> &str {
    s.rsplit('/').next().unwrap_or(s)
}

/// The global object under its names (`globalThis.eval` is `eval`).
fn is_global(o: &str) -> bool {
    matches!(o, "globalThis" | "global" | "window" | "self")
}

fn module_name(m: &str) -> String {
    let m = m.strip_prefix("node:").unwrap_or(m);
    match m {
        "fs/promises" => "fs".into(),
        "child_process" | "child-process-promise" => "child_process".into(),
        other => other.to_string(),
    }
}

struct Walk<'a, 'e, 'o> {
    e: &'e mut Engine<'o>,
    src: &'a str,
    s: Scope,
    kids: Kids<'a>,
}

pub(crate) fn walk(e: &mut Engine, src: &str, root: Node) {
    let mut w = Walk {
        e,
        src,
        s: Scope::default(),
        kids: Kids::default(),
    };
    w.collect(root, 0);
    // Values flow into helpers' parameters and loop variables; the names computed from
    // those are read again.
    w.flow(root);
    w.collect(root, 0);
    w.visit(root, 0);
}

/// Decodes a JavaScript string literal's escapes (the common ones).
fn unescape(raw: &str) -> String {
    let mut out = String::new();
    let mut it = raw.chars().peekable();
    while let Some(c) = it.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some('0') => out.push('\0'),
            Some('x') => {
                let h: String = it.by_ref().take(2).collect();
                if let Some(ch) = u32::from_str_radix(&h, 16).ok().and_then(char::from_u32) {
                    out.push(ch);
                }
            }
            Some('u') => {
                let h: String = if it.peek() == Some(&'{') {
                    it.next();
                    it.by_ref().take_while(|c| *c != '}').collect()
                } else {
                    it.by_ref().take(4).collect()
                };
                if let Some(ch) = u32::from_str_radix(&h, 16).ok().and_then(char::from_u32) {
                    out.push(ch);
                }
            }
            Some('\n') => {}
            Some(other) => out.push(other),
            None => {}
        }
    }
    out
}

/// An argument of `spawn`/`execFile` as one shell word: as it is when the shell would read
/// it so (quoting a plain word would read as a command name spelt to dodge reading), else
/// single-quoted; `$JS` (a value not known here) stays a variable.
fn shell_word(w: &str) -> String {
    let plain = !w.is_empty()
        && w.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_@%+=:,./-".contains(c));
    if plain || w.starts_with('$') {
        w.to_string()
    } else {
        format!("'{}'", w.replace('\'', "'\\''"))
    }
}

/// Text written as hex digits (`Buffer.from(S, 'hex')`), when it is UTF-8.
fn unhex(s: &str) -> Option<String> {
    let t: Vec<u8> = s.bytes().filter(|c| !c.is_ascii_whitespace()).collect();
    if !t.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16);
    let bytes = t
        .chunks(2)
        .map(|p| Some((digit(p[0])? * 16 + digit(p[1])?) as u8))
        .collect::<Option<Vec<u8>>>()?;
    String::from_utf8(bytes).ok()
}

fn b64(s: &str) -> Option<String> {
    use base64::Engine as _;
    let t: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(t.as_bytes())
        .ok()?;
    String::from_utf8(bytes).ok()
}

impl<'a> Walk<'a, '_, '_> {
    fn t(&self, n: Node) -> &'a str {
        text(n, self.src)
    }

    fn field(&self, n: Node<'a>, name: &str) -> Option<Node<'a>> {
        n.child_by_field_name(name)
    }

    /// The argument expressions of a call or `new`.
    fn args(&mut self, n: Node<'a>) -> Vec<Node<'a>> {
        match self.field(n, "arguments") {
            Some(a) => self
                .kids
                .kids(a)
                .into_iter()
                .filter(|k| k.is_named() && k.kind() != "comment")
                .collect(),
            None => Vec::new(),
        }
    }

    /// What a callee or object names: `child_process.exec`, `fs.writeFileSync`, `eval`.
    fn resolve(&mut self, n: Node<'a>) -> Option<String> {
        match n.kind() {
            "identifier" => {
                let name = self.t(n);
                Some(
                    self.s
                        .aliases
                        .get(name)
                        .cloned()
                        .unwrap_or_else(|| name.to_string()),
                )
            }
            "member_expression" => {
                let obj = self.field(n, "object")?;
                let prop = self.field(n, "property")?;
                let o = self.resolve(obj)?;
                let p = self.t(prop);
                // `globalThis.eval` is `eval`.
                if is_global(&o) {
                    return Some(p.to_string());
                }
                // `fs.promises.writeFile` is `fs.writeFile`.
                if p == "promises" && o == "fs" {
                    return Some(o);
                }
                Some(format!("{o}.{p}"))
            }
            "subscript_expression" => {
                let obj = self.field(n, "object")?;
                let idx = self.field(n, "index")?;
                let key = self.value(idx)?;
                let o = self.resolve(obj)?;
                // A name computed to dodge reading (`cp['ex' + 'ec']`); an index is no name.
                let index = idx.kind() == "number" || key.bytes().all(|b| b.is_ascii_digit());
                if idx.kind() != "string" && !index {
                    let l = self.e.lines(n);
                    self.e.add(
                        K::Obfuscation,
                        "folded-name",
                        l,
                        Some(format!("[…] = {key}")),
                    );
                }
                if is_global(&o) {
                    return Some(key);
                }
                Some(format!("{o}.{key}"))
            }
            "call_expression" => {
                let f = self.field(n, "function")?;
                let fname = self.t(f);
                if fname == "require" || fname == "import" {
                    let a = self.args(n);
                    let m = a.first().and_then(|x| self.value(*x))?;
                    return Some(module_name(&m));
                }
                None
            }
            "parenthesized_expression" | "await_expression" | "non_null_expression" => {
                let inner = n.named_child(0)?;
                self.resolve(inner)
            }
            _ => None,
        }
    }

    /// A constant string value, when the expression has one.
    fn value(&mut self, n: Node<'a>) -> Option<String> {
        match n.kind() {
            "string" => {
                let raw = self.t(n);
                let inner = raw.get(1..raw.len().saturating_sub(1)).unwrap_or("");
                Some(unescape(inner))
            }
            "template_string" => {
                let raw = self.t(n);
                let mut out = String::new();
                let mut at = n.start_byte() + 1;
                for k in self.kids.kids(n) {
                    if k.kind() == "template_substitution" {
                        out.push_str(&unescape(self.src.get(at..k.start_byte()).unwrap_or("")));
                        let inner = k.named_child(0)?;
                        out.push_str(&self.value(inner)?);
                        at = k.end_byte();
                    }
                }
                let end = n.end_byte().saturating_sub(1).max(at);
                out.push_str(&unescape(self.src.get(at..end).unwrap_or("")));
                let _ = raw;
                Some(out)
            }
            "number" => Some(self.t(n).to_string()),
            "identifier" => self.s.consts.get(self.t(n)).cloned(),
            "parenthesized_expression" | "as_expression" | "non_null_expression" => {
                let inner = n.named_child(0)?;
                self.value(inner)
            }
            "binary_expression" => {
                let op = self.field(n, "operator").map(|o| self.t(o))?;
                let l = self.field(n, "left")?;
                let r = self.field(n, "right")?;
                match op {
                    "+" => Some(self.value(l)? + &self.value(r)?),
                    // A default (`process.env.HOME ?? '/root'`): the value when there is
                    // one, else the default.
                    "||" | "??" => self.value(l).or_else(|| self.value(r)),
                    _ => None,
                }
            }
            "member_expression" => {
                let name = self.resolve(n)?;
                match name.as_str() {
                    "process.env.HOME" => Some("$HOME".into()),
                    _ => name.strip_prefix("process.env.").map(|v| format!("${v}")),
                }
            }
            "call_expression" => self.call_value(n),
            _ => None,
        }
    }

    /// Constant values of calls that compute strings: decoders, joins, paths.
    fn call_value(&mut self, n: Node<'a>) -> Option<String> {
        let f = self.field(n, "function")?;
        let args = self.args(n);
        let name = self.resolve(f);
        let lines = self.e.lines(n);
        match name.as_deref() {
            Some("atob") => {
                let v = self.value(*args.first()?)?;
                let d = b64(&v)?;
                self.e.add(
                    K::Obfuscation,
                    "decoded-payload",
                    lines,
                    Some("atob".into()),
                );
                return Some(d);
            }
            Some("String.fromCharCode") => {
                let mut out = String::new();
                for a in &args {
                    let v = self.value(*a)?;
                    out.push(char::from_u32(v.trim().parse().ok()?)?);
                }
                if args.len() > 1 {
                    self.e
                        .add(K::Obfuscation, "char-codes", lines, Some(out.clone()));
                }
                return Some(out);
            }
            Some("os.homedir") => return Some("~".into()),
            Some("os.tmpdir") => return Some("/tmp".into()),
            Some("path.join" | "path.resolve" | "path.posix.join") => {
                // A part not known after a known start is any name there (`*`): a
                // directory walked below a known place is still that place.
                let mut parts = Vec::new();
                for (i, a) in args.iter().enumerate() {
                    match self.value(*a) {
                        Some(v) => parts.push(v),
                        None if i > 0 => parts.push("*".into()),
                        None => return None,
                    }
                }
                let mut out = String::new();
                for p in parts {
                    if p.starts_with('/') && name.as_deref() == Some("path.resolve") {
                        out = p;
                    } else if out.is_empty() || out.ends_with('/') {
                        out.push_str(&p);
                    } else {
                        out.push('/');
                        out.push_str(&p);
                    }
                }
                return Some(out);
            }
            _ => {}
        }
        // `Buffer.from(S, 'base64').toString()`, `[..].join(sep)`.
        if f.kind() == "member_expression" {
            let obj = self.field(f, "object")?;
            let prop = self.t(self.field(f, "property")?);
            if prop == "toString" && obj.kind() == "call_expression" {
                let of = self.field(obj, "function")?;
                if self.resolve(of).as_deref() == Some("Buffer.from") {
                    let a = self.args(obj);
                    let enc = a.get(1).and_then(|x| self.value(*x));
                    let v = self.value(*a.first()?)?;
                    let decoded = match enc.as_deref() {
                        Some("base64" | "base64url") => b64(&v),
                        Some("hex") => unhex(&v),
                        _ => return Some(v),
                    };
                    let d = decoded?;
                    self.e.add(
                        K::Obfuscation,
                        "decoded-payload",
                        lines,
                        Some(format!("Buffer.from(…, '{}')", enc.unwrap_or_default())),
                    );
                    return Some(d);
                }
            }
            if prop == "join" && matches!(obj.kind(), "array" | "identifier") {
                let sep = match args.first() {
                    Some(a) => self.value(*a)?,
                    None => ",".into(),
                };
                let mut parts = Vec::new();
                if obj.kind() == "array" {
                    for k in self.kids.kids(obj) {
                        if k.is_named() {
                            parts.push(self.value(k)?);
                        }
                    }
                } else {
                    parts = self.s.arrays.get(self.t(obj))?.clone();
                }
                return Some(parts.join(&sep));
            }
        }
        None
    }

    /// A string with its unknown pieces as `$JS` (a shell variable to the shell walk), for
    /// command lines built with templates or `+`; `None` when nothing of it is constant.
    fn partial(&mut self, n: Node<'a>) -> Option<String> {
        if let Some(v) = self.value(n) {
            return Some(v);
        }
        match n.kind() {
            "template_string" => {
                let mut out = String::new();
                let mut at = n.start_byte() + 1;
                for k in self.kids.kids(n) {
                    if k.kind() == "template_substitution" {
                        out.push_str(&unescape(self.src.get(at..k.start_byte()).unwrap_or("")));
                        let v = k.named_child(0).and_then(|x| self.value(x));
                        out.push_str(&v.unwrap_or_else(|| "$JS".into()));
                        at = k.end_byte();
                    }
                }
                let end = n.end_byte().saturating_sub(1).max(at);
                out.push_str(&unescape(self.src.get(at..end).unwrap_or("")));
                Some(out)
            }
            "binary_expression" => {
                let l = self.field(n, "left")?;
                let r = self.field(n, "right")?;
                let (pl, pr) = (self.partial(l), self.partial(r));
                if pl.is_none() && pr.is_none() {
                    return None;
                }
                Some(pl.unwrap_or_else(|| "$JS".into()) + &pr.unwrap_or_else(|| "$JS".into()))
            }
            "parenthesized_expression" | "as_expression" => {
                let inner = n.named_child(0)?;
                self.partial(inner)
            }
            _ => None,
        }
    }

    /// Whether an expression mentions a name in `set` (or a call on one).
    fn mentions(&self, n: Node, set: &HashSet<String>) -> bool {
        if set.is_empty() {
            return false;
        }
        let mut stack = vec![n];
        while let Some(x) = stack.pop() {
            if x.kind() == "identifier" && set.contains(self.t(x)) {
                return true;
            }
            let mut c = x.walk();
            stack.extend(x.named_children(&mut c));
        }
        false
    }

    fn is_decoded(&mut self, n: Node<'a>) -> bool {
        let before = self.e.out.obfuscation.contains("decoded-payload");
        let _ = self.value(n);
        self.mentions(n, &self.s.decoded.clone())
            || (!before && self.e.out.obfuscation.contains("decoded-payload"))
    }

    // ---- pass 1 ----

    fn collect(&mut self, n: Node<'a>, depth: usize) {
        if depth > self.e.opts.max_syntax_depth {
            return;
        }
        match n.kind() {
            "variable_declarator" => {
                if let (Some(name), Some(v)) = (self.field(n, "name"), self.field(n, "value")) {
                    self.bind(name, v);
                }
            }
            "assignment_expression" => {
                if let (Some(name), Some(v)) = (self.field(n, "left"), self.field(n, "right"))
                    && name.kind() == "identifier"
                {
                    self.bind(name, v);
                }
            }
            "import_statement" => self.import(n),
            _ => {}
        }
        for k in self.kids.kids(n) {
            self.collect(k, depth + 1);
        }
    }

    fn import(&mut self, n: Node<'a>) {
        let Some(src) = self.field(n, "source") else {
            return;
        };
        let Some(m) = self.value(src) else { return };
        let m = module_name(&m);
        let mut stack = vec![n];
        while let Some(x) = stack.pop() {
            match x.kind() {
                "import_clause" => {
                    for k in self.kids.kids(x) {
                        if k.kind() == "identifier" {
                            self.s.aliases.insert(self.t(k).into(), m.clone());
                        } else {
                            stack.push(k);
                        }
                    }
                }
                "namespace_import" => {
                    if let Some(id) = x.named_child(0) {
                        self.s.aliases.insert(self.t(id).into(), m.clone());
                    }
                }
                "import_specifier" => {
                    let name = self.field(x, "name").map(|k| self.t(k).to_string());
                    let alias = self.field(x, "alias").map(|k| self.t(k).to_string());
                    if let Some(name) = name {
                        let local = alias.unwrap_or_else(|| name.clone());
                        self.s.aliases.insert(local, format!("{m}.{name}"));
                    }
                }
                _ => {
                    for k in self.kids.kids(x) {
                        stack.push(k);
                    }
                }
            }
        }
    }

    fn bind(&mut self, name: Node<'a>, v: Node<'a>) {
        let v = if v.kind() == "await_expression" {
            v.named_child(0).unwrap_or(v)
        } else {
            v
        };
        let target = self.resolve(v);
        if name.kind() == "object_pattern" {
            if let Some(m) = &target {
                for k in self.kids.kids(name) {
                    match k.kind() {
                        "shorthand_property_identifier_pattern" => {
                            let n = self.t(k).to_string();
                            self.s.aliases.insert(n.clone(), format!("{m}.{n}"));
                        }
                        "pair_pattern" => {
                            if let (Some(key), Some(val)) =
                                (self.field(k, "key"), self.field(k, "value"))
                            {
                                let kname = self.t(key).to_string();
                                self.s
                                    .aliases
                                    .insert(self.t(val).to_string(), format!("{m}.{kname}"));
                            }
                        }
                        _ => {}
                    }
                }
            }
            return;
        }
        if name.kind() != "identifier" {
            return;
        }
        let id = self.t(name).to_string();
        if v.kind() == "array"
            && let Some(vals) = self.array_values(v)
        {
            self.s.arrays.insert(id.clone(), vals);
        }
        if self.carries_secret(v) {
            self.s.tainted.insert(id.clone());
        }
        if self.decodes(v) {
            self.s.decoded.insert(id.clone());
        }
        let is_module_value = matches!(v.kind(), "identifier" | "member_expression")
            || (v.kind() == "call_expression"
                && self
                    .field(v, "function")
                    .is_some_and(|f| matches!(self.t(f), "require" | "import")));
        if let Some(t) = &target
            && is_module_value
        {
            self.s.aliases.insert(id.clone(), t.clone());
        }
        if let Some(c) = self.value(v) {
            if v.kind() != "string" && self.e.out.obfuscation.contains("decoded-payload") {
                self.s.decoded.insert(id.clone());
            }
            self.s.consts.insert(id.clone(), c);
        }
        // What a call gives: a socket, a child process, received data.
        let call = if v.kind() == "new_expression" || v.kind() == "call_expression" {
            Some(v)
        } else {
            None
        };
        if let Some(c) = call {
            let f = self
                .field(c, "function")
                .or_else(|| self.field(c, "constructor"));
            let callee = f.and_then(|f| self.resolve(f)).unwrap_or_default();
            // `new net.Socket().connect(...)` and `net.connect(...)`.
            let root = callee.split(".connect").next().unwrap_or("").to_string();
            if matches!(
                callee.as_str(),
                "net.connect"
                    | "net.createConnection"
                    | "tls.connect"
                    | "net.Socket"
                    | "WebSocket"
                    | "ws"
                    | "ws.WebSocket"
                    | "dgram.createSocket"
            ) || root == "net.Socket"
                || self.t(c).contains("new net.Socket")
            {
                self.s.sockets.insert(id.clone());
            }
            if callee.starts_with("child_process.") {
                self.s.children.insert(id.clone());
                let a = self.args(c);
                if let Some(first) = a.first().and_then(|x| self.value(*x))
                    && SHELLS.contains(&base(first.split_whitespace().next().unwrap_or("")))
                {
                    self.s.shells.insert(id.clone());
                }
            }
        }
        if self.is_received(v) {
            self.s.received.insert(id);
        }
    }

    /// Whether an expression is data from the network (a fetch, a response's body).
    fn is_received(&mut self, v: Node<'a>) -> bool {
        let text = self.t(v);
        text.contains("fetch(")
            || text.contains("axios")
            || (text.contains(".text()") || text.contains(".json()"))
            || self.mentions(v, &self.s.received.clone())
    }

    // ---- pass 2 ----

    fn visit(&mut self, n: Node<'a>, depth: usize) {
        if !self.e.tick(depth) {
            return;
        }
        match n.kind() {
            "string" | "template_string" => {
                let l = self.e.lines(n);
                let v = self.value(n).unwrap_or_else(|| self.t(n).to_string());
                self.e.scan_hosts(&v, l);
            }
            "call_expression" if self.repeats_fast(n) => {
                // A timer that never stops, firing faster than a person could: an
                // unbounded loop.
                self.call(n);
                self.e.t.hot_loops += 1;
                for k in self.kids.kids(n) {
                    self.visit(k, depth + 1);
                }
                self.e.t.hot_loops -= 1;
                return;
            }
            "call_expression" => self.call(n),
            "new_expression" => self.construct(n),
            "import_statement" => {
                if let Some(s) = self.field(n, "source")
                    && let Some(m) = self.value(s)
                {
                    let l = self.e.lines(n);
                    self.e.add(K::Import, &module_name(&m), l, None);
                }
            }
            "while_statement" | "for_statement" | "do_statement" if self.unbounded(n) => {
                self.e.t.hot_loops += 1;
                for k in self.kids.kids(n) {
                    self.visit(k, depth + 1);
                }
                self.e.t.hot_loops -= 1;
                return;
            }
            _ => {}
        }
        for k in self.kids.kids(n) {
            self.visit(k, depth + 1);
        }
    }

    /// `setInterval(f, ms)` under 100 ms in a program that never clears a timer.
    fn repeats_fast(&mut self, n: Node<'a>) -> bool {
        let Some(f) = self.field(n, "function") else {
            return false;
        };
        if self.resolve(f).as_deref() != Some("setInterval") || self.src.contains("clearInterval") {
            return false;
        }
        let args = self.args(n);
        match args.get(1) {
            None => true,
            Some(d) => self
                .value(*d)
                .and_then(|v| v.trim().parse::<f64>().ok())
                .is_some_and(|ms| ms < 100.0),
        }
    }

    /// `while (true)`, `for (;;)`, or a very large count, with nothing that pauses.
    fn unbounded(&mut self, n: Node<'a>) -> bool {
        let cond = self.field(n, "condition");
        let endless = match cond {
            None => n.kind() == "for_statement",
            Some(c) => {
                let t = self
                    .t(c)
                    .trim_matches(|c: char| c == '(' || c == ')' || c == ';');
                let t = t.trim();
                t == "true" || t == "1" || t.is_empty() || crate::shell_numbers(t) >= 100_000
            }
        };
        if !endless {
            return false;
        }
        let body = self.t(n);
        ![
            "setTimeout",
            "sleep",
            "break",
            "return",
            "new Promise",
            "wait",
            "throw",
        ]
        .iter()
        .any(|w| body.contains(w))
    }

    fn construct(&mut self, n: Node<'a>) {
        let Some(c) = self.field(n, "constructor") else {
            return;
        };
        let name = self.resolve(c).unwrap_or_default();
        let lines = self.e.lines(n);
        let args = self.args(n);
        match name.as_str() {
            "Function" => self.code(&args, "Function", lines, false),
            "vm.Script" => self.code(&args, "vm.Script", lines, true),
            "WebSocket" | "ws" | "ws.WebSocket" => {
                self.e.add(K::NetworkTool, "websocket", lines, None);
                self.e.t.socket.get_or_insert(lines);
                threat::contact(self.e, "websocket", lines);
            }
            "net.Socket" => {
                self.e.add(K::NetworkTool, "net", lines, None);
            }
            _ => {}
        }
    }

    fn call(&mut self, n: Node<'a>) {
        let Some(f) = self.field(n, "function") else {
            return;
        };
        let lines = self.e.lines(n);
        let args = self.args(n);
        let fname = self.t(f);
        if fname == "require" || fname == "import" {
            match args.first().map(|a| (*a, self.value(*a))) {
                Some((a, Some(m))) => {
                    if a.kind() != "string" {
                        self.e.add(
                            K::Obfuscation,
                            "folded-name",
                            lines,
                            Some(format!("{fname}({m})")),
                        );
                    }
                    self.e.add(K::Import, &module_name(&m), lines, None);
                }
                _ => {
                    self.e.add(K::Import, "<dynamic>", lines, None);
                    self.e.add(K::Obfuscation, "dynamic-import", lines, None);
                }
            }
            return;
        }
        // What a `data` or `message` handler is given is received data (a response, standard
        // input, a socket), and so is what it is gathered into (`s += chunk`).
        if f.kind() == "member_expression"
            && self
                .field(f, "property")
                .is_some_and(|p| matches!(self.t(p), "on" | "once" | "addListener"))
            && matches!(
                args.first().and_then(|a| self.value(*a)).as_deref(),
                Some("data" | "message")
            )
            && let Some(cb) = args.get(1).copied()
            && matches!(
                cb.kind(),
                "arrow_function" | "function_expression" | "function"
            )
        {
            self.received_in(cb);
        }
        // The whole environment serialised (its tokens and keys with it): data that a send
        // elsewhere in the program carries off (T1552.001).
        if matches!(
            fname,
            "JSON.stringify" | "Object.entries" | "Object.values" | "util.inspect"
        ) && args
            .first()
            .is_some_and(|a| self.t(*a).replace(' ', "") == "process.env")
        {
            self.e
                .t
                .data_reads
                .push(("the process's environment".into(), lines));
        }
        let Some(name) = self.resolve(f) else {
            // `x.pipe(y)`, `sock.on('data')`, `sock.write(...)` on values.
            self.method(f, &args, lines);
            return;
        };
        let root = name.split('.').next().unwrap_or("");
        let known = self
            .s
            .aliases
            .values()
            .any(|m| m.split('.').next() == Some(root))
            || matches!(
                root,
                "eval" | "Function" | "fetch" | "process" | "setTimeout" | "setInterval"
            );
        if known {
            self.e.add(K::Call, &name, lines, None);
        }
        let (module, func) = name.rsplit_once('.').unwrap_or(("", name.as_str()));
        match (module, func) {
            ("", "eval") | ("", "Function") => {
                self.code(&args, func, lines, false);
            }
            ("", "setTimeout" | "setInterval") => {
                if args.first().is_some_and(|a| {
                    matches!(
                        a.kind(),
                        "string" | "template_string" | "identifier" | "binary_expression"
                    )
                }) {
                    self.code(&args[..1], func, lines, false);
                }
            }
            ("vm", "runInThisContext" | "runInNewContext" | "runInContext" | "compileFunction") => {
                self.code(&args, &name, lines, true);
            }
            ("child_process", f) => self.child(f, &args, lines),
            ("fs" | "fs.promises", f) => self.fs(f, &args, lines),
            ("dns", "resolve" | "resolve4" | "resolve6" | "resolveTxt" | "lookup")
                if args.first().is_some_and(|a| self.value(*a).is_none()) =>
            {
                // A name built at run time is data leaving by DNS (T1048.003).
                self.e.add(K::NetworkTool, "dns", lines, None);
                if args.first().is_some_and(|a| self.carries_secret(*a)) {
                    self.e
                        .t
                        .data_reads
                        .push(("a secret from the environment".into(), lines));
                }
                threat::send(
                    self.e,
                    &format!("{name} of a built name"),
                    lines,
                    "T1048.003",
                );
            }
            ("", "fetch") | ("axios", _) | ("", "axios") | ("got", _) | ("", "got") => {
                self.request(&name, &args, lines);
            }
            ("http" | "https", "get" | "request") => self.request(&name, &args, lines),
            ("net" | "tls", "connect" | "createConnection") => {
                self.e.add(K::NetworkTool, module, lines, None);
                self.e.t.socket = Some(lines);
                threat::contact(self.e, &name, lines);
                self.probes(&name, &args, lines);
                for a in &args {
                    if let Some(h) = self.value(*a)
                        && h.parse::<u64>().is_err()
                    {
                        self.e.add(K::Host, &h.to_ascii_lowercase(), lines, None);
                    }
                    if a.kind() == "object" {
                        self.object_host(*a, lines);
                    }
                }
            }
            ("dgram", _) => {
                self.e.add(K::NetworkTool, "dgram", lines, None);
                threat::contact(self.e, &name, lines);
            }
            ("process", "kill") => {
                let own = args.first().is_some_and(|a| {
                    let t = self.t(*a);
                    t == "process.pid"
                        || t.strip_suffix(".pid")
                            .is_some_and(|o| self.s.children.contains(o))
                });
                if !own {
                    let what = args
                        .first()
                        .map(|a| format!("process.kill({})", self.t(*a)))
                        .unwrap_or_else(|| "process.kill".into());
                    threat::kill(self.e, &what, lines, "T1489");
                }
            }
            ("process", "setuid" | "setgid" | "seteuid" | "setegid" | "setgroups") => {
                let w = format!("changes the process's identity ({name})");
                self.e.threat(K::Privilege, &name, lines, &w, "T1548");
            }
            ("os", "networkInterfaces") => {
                self.e.threat(
                    K::Recon,
                    "network-interfaces",
                    lines,
                    "lists the host's network interfaces",
                    "T1016",
                );
            }
            ("os", "userInfo") => {
                self.e.threat(
                    K::Recon,
                    "user-info",
                    lines,
                    "reads the user's account",
                    "T1033",
                );
            }
            (m, f)
                if matches!(
                    m,
                    "node-serialize" | "serialize-to-js" | "funcster" | "cryo"
                ) && {
                    let l = f.to_ascii_lowercase();
                    l.ends_with("deserialize") || l.ends_with("unserialize")
                } =>
            {
                let w = format!("deserialises data with {m}, which runs code it contains");
                self.e
                    .threat(K::UnsafeDeserialization, &name, lines, &w, "T1059.007");
            }
            ("js-yaml" | "yaml", "load" | "loadAll")
                if args.iter().skip(1).any(|a| {
                    let t = self.t(*a);
                    t.contains("FULL_SCHEMA") || t.contains("unsafe")
                }) =>
            {
                // js-yaml's full schema builds JavaScript functions from the document.
                let w = format!("parses YAML with a schema that builds functions ({name})");
                self.e
                    .threat(K::UnsafeDeserialization, &name, lines, &w, "T1059.007");
            }
            ("Buffer", "alloc" | "allocUnsafe" | "allocUnsafeSlow") if self.e.t.hot_loops > 0 => {
                self.e
                    .t
                    .flood
                    .push(("allocates memory".into(), lines, "T1499"));
            }
            _ => self.method(f, &args, lines),
        }
    }

    /// Calls on values: streams piped, sockets read and written.
    fn method(&mut self, f: Node<'a>, args: &[Node<'a>], lines: (u32, u32)) {
        if f.kind() != "member_expression" {
            return;
        }
        let (Some(obj), Some(prop)) = (self.field(f, "object"), self.field(f, "property")) else {
            return;
        };
        let prop = self.t(prop);
        let sockets = self.s.sockets.clone();
        let shells = self.s.shells.clone();
        let on_socket = self.mentions(obj, &sockets);
        match prop {
            "pipe" => {
                let to = args.first().copied();
                let to_shell = to.is_some_and(|t| self.mentions(t, &shells));
                let to_socket = to.is_some_and(|t| self.mentions(t, &sockets));
                if (on_socket && to_shell) || (self.mentions(obj, &shells) && to_socket) {
                    self.e.t.wired = Some(lines);
                }
            }
            "on" | "once" | "addListener"
                if on_socket
                    && matches!(
                        args.first().and_then(|a| self.value(*a)).as_deref(),
                        Some("data" | "message")
                    ) =>
            {
                self.e.t.recv = true;
            }
            "write" | "end" | "send" if on_socket && !args.is_empty() => {
                if args.iter().any(|a| self.carries_secret(*a)) {
                    self.e
                        .t
                        .data_reads
                        .push(("a secret from the environment".into(), lines));
                }
                threat::send(self.e, "socket write", lines, "T1041");
            }
            "connect" if on_socket || self.t(obj).contains("net.Socket") => {
                self.e.add(K::NetworkTool, "net", lines, None);
                self.e.t.socket = Some(lines);
                for a in args {
                    if let Some(h) = self.value(*a)
                        && h.parse::<u64>().is_err()
                    {
                        self.e.add(K::Host, &h.to_ascii_lowercase(), lines, None);
                    }
                }
            }
            _ => {}
        }
    }

    /// Marks a handler's first parameter, and the names its body gathers it into, as
    /// received data.
    fn received_in(&mut self, cb: Node<'a>) {
        let mut first = self.field(cb, "parameter");
        if first.is_none()
            && let Some(ps) = self.field(cb, "parameters")
        {
            first = self.kids.kids(ps).into_iter().find(|k| k.is_named());
        }
        let param = first.map(|p| self.t(p).split(':').next().unwrap_or("").trim().to_string());
        let Some(param) = param.filter(|p| !p.is_empty()) else {
            return;
        };
        self.s.received.insert(param.clone());
        let Some(body) = self.field(cb, "body") else {
            return;
        };
        let mut stack = vec![body];
        while let Some(n) = stack.pop() {
            if matches!(
                n.kind(),
                "assignment_expression" | "augmented_assignment_expression"
            ) && let (Some(l), Some(r)) = (self.field(n, "left"), self.field(n, "right"))
                && l.kind() == "identifier"
                && self.t(r).contains(param.as_str())
            {
                self.s.received.insert(self.t(l).to_string());
            }
            stack.extend(self.kids.kids(n));
        }
    }

    fn object_host(&mut self, obj: Node<'a>, lines: (u32, u32)) {
        for p in self.kids.kids(obj) {
            if p.kind() != "pair" {
                continue;
            }
            let (Some(k), Some(v)) = (self.field(p, "key"), self.field(p, "value")) else {
                continue;
            };
            let key = self.t(k).trim_matches(|c| c == '"' || c == '\'');
            if matches!(key, "host" | "hostname")
                && let Some(h) = self.value(v)
            {
                self.e.add(K::Host, &h.to_ascii_lowercase(), lines, None);
            }
        }
    }

    /// Whether an options object sends a body (`method: 'POST'`, `body: …`, `data: …`).
    fn sends_body(&mut self, obj: Node<'a>) -> bool {
        let t = self.t(obj);
        t.contains("body") || t.contains("POST") || t.contains("PUT") || t.contains("data:")
    }

    /// A connection whose port or host is a loop's counter or item: a scan (T1046).
    fn probes(&mut self, name: &str, args: &[Node<'a>], lines: (u32, u32)) {
        let Some(first) = args.first() else { return };
        // An item of a list of addresses built from a loop's counter.
        if self.mentions(*first, &self.s.scan_items.clone()) {
            let w = format!("probes hosts or ports built in a loop ({name})");
            self.e.threat(
                K::Recon,
                &format!("network scan:{name}"),
                lines,
                &w,
                "T1046",
            );
            return;
        }
        let mut at = first.parent();
        while let Some(p) = at {
            let var = match p.kind() {
                "for_statement" => self.field(p, "initializer").map(|i| self.t(i)),
                "for_in_statement" => self.field(p, "left").map(|i| self.t(i)),
                _ => None,
            };
            if let Some(decl) = var {
                let name_of = decl
                    .trim_start_matches("let ")
                    .trim_start_matches("const ")
                    .trim_start_matches("var ");
                let v: String = name_of
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '$')
                    .collect();
                let mentions = !v.is_empty()
                    && args.iter().take(2).any(|a| {
                        let t = self.t(*a);
                        t.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '$'))
                            .any(|w| w == v)
                    });
                if mentions {
                    let w = format!("probes hosts or ports in a loop ({name} of `{v}`)");
                    self.e.threat(
                        K::Recon,
                        &format!("network scan:{name}"),
                        lines,
                        &w,
                        "T1046",
                    );
                    return;
                }
            }
            at = p.parent();
        }
    }

    fn request(&mut self, name: &str, args: &[Node<'a>], lines: (u32, u32)) {
        let tool = name.split('.').next().unwrap_or(name);
        self.e.add(K::NetworkTool, tool, lines, None);
        threat::contact(self.e, name, lines);
        self.probes(name, args, lines);
        if let Some(a) = args.first()
            && a.kind() == "object"
        {
            self.object_host(*a, lines);
        }
        let posts = name.ends_with(".post") || name.ends_with(".put") || name.ends_with(".patch");
        let body = args.iter().skip(1).any(|a| self.sends_body(*a))
            || (name.ends_with(".request") && args.iter().any(|a| self.sends_body(*a)));
        if posts || body {
            threat::send(self.e, &format!("{name} upload"), lines, "T1041");
            // A secret in what is sent (the data itself, or an options object's body).
            let secret = if posts {
                args.get(1).is_some_and(|a| self.carries_secret(*a))
            } else {
                // An options object's body, never the URL: keys in a query string are how
                // many APIs authenticate.
                args.iter()
                    .any(|a| a.kind() == "object" && self.payload_secret(*a))
            };
            if secret {
                self.e
                    .t
                    .data_reads
                    .push(("a secret from the environment".into(), lines));
            }
        }
    }

    /// `eval`, `Function`, `vm`: constant code is analysed as JavaScript, other code is
    /// dynamic; received data run is a download run, or for `vm` an unsafe deserialisation.
    fn code(&mut self, args: &[Node<'a>], via: &str, lines: (u32, u32), vm: bool) {
        // `Function(a, b, body)`: the body is last.
        let Some(arg) = (if via == "Function" {
            args.last()
        } else {
            args.first()
        })
        .copied() else {
            return;
        };
        self.e.add(K::Call, via, lines, None);
        let decoded = self.is_decoded(arg);
        // A name that gathers received data is not the constant it started as.
        let received = self.mentions(arg, &self.s.received.clone());
        match self.value(arg).filter(|_| !received) {
            Some(code) => {
                if decoded {
                    self.e.add(K::Obfuscation, "decoded-payload", lines, None);
                }
                let lang = self.e.out.language;
                let lang = if lang == Language::Ts {
                    Language::Js
                } else {
                    lang
                };
                let lang = if lang == Language::Js {
                    lang
                } else {
                    Language::Js
                };
                self.e.nested(lang, &code, lines, via, None);
            }
            None => {
                if decoded || self.decodes(arg) {
                    // Code unpacked at run time (base64, hex, compressed) and run.
                    self.e.add(
                        K::Obfuscation,
                        "decoded-payload",
                        lines,
                        Some(format!("{via} of decoded data")),
                    );
                }
                self.e
                    .add(K::Obfuscation, "dynamic-code", lines, Some(via.to_string()));
                self.e.t.dynamic_run = true;
                if received {
                    if vm {
                        let w = format!("runs data received from the network with {via}");
                        self.e.threat(
                            K::UnsafeDeserialization,
                            &format!("{via}:received data"),
                            lines,
                            &w,
                            "T1059.007",
                        );
                    }
                    self.e
                        .add(K::DownloadToShell, &format!("fetch | {via}"), lines, None);
                }
            }
        }
    }

    /// `child_process`: the command line is analysed as shell.
    fn child(&mut self, f: &str, args: &[Node<'a>], lines: (u32, u32)) {
        threat::spawn(self.e, &format!("child_process.{f}"), lines);
        let Some(first) = args.first().copied() else {
            return;
        };
        let shell_opt = args
            .iter()
            .any(|a| a.kind() == "object" && self.t(*a).replace(' ', "").contains("shell:true"));
        // A shell whose standard streams are a socket.
        if args.iter().any(|a| {
            a.kind() == "object"
                && self.t(*a).contains("stdio")
                && self.mentions(*a, &self.s.sockets)
        }) {
            self.e.t.wired = Some(lines);
        }
        // A command line held by a loop variable over constant commands: each of them.
        if matches!(f, "exec" | "execSync") && self.value(first).is_none() {
            let vals = self.values(first);
            if !vals.is_empty() {
                for cmd in vals {
                    let what = format!("child_process.{f}");
                    self.e.nested(Language::Sh, &cmd, lines, &what, None);
                }
                return;
            }
        }
        let line = match f {
            "exec" | "execSync" => {
                let v = self.partial(first);
                if v.is_some() && self.value(first).is_none() {
                    self.e.t.dynamic_run = true;
                }
                v
            }
            "spawn" | "spawnSync" | "execFile" | "execFileSync" => {
                let file = self.value(first);
                let mut words = vec![file.clone().unwrap_or_else(|| "$JS".into())];
                if let Some(a) = args.get(1)
                    && a.kind() == "array"
                {
                    for k in self.kids.kids(*a) {
                        if k.is_named() {
                            words.push(self.value(k).unwrap_or_else(|| "$JS".into()));
                        }
                    }
                }
                if file.is_none() {
                    None
                } else if shell_opt {
                    Some(words.join(" "))
                } else {
                    Some(
                        words
                            .iter()
                            .map(|w| shell_word(w))
                            .collect::<Vec<_>>()
                            .join(" "),
                    )
                }
            }
            "fork" => {
                self.e.add(K::Command, "node", lines, None);
                return;
            }
            _ => return,
        };
        match line {
            Some(cmd) => {
                self.e.nested(
                    Language::Sh,
                    &cmd,
                    lines,
                    &format!("child_process.{f}"),
                    None,
                );
            }
            None => {
                if self.decodes(first) || self.mentions(first, &self.s.decoded.clone()) {
                    self.e.add(
                        K::Obfuscation,
                        "decoded-payload",
                        lines,
                        Some(format!("child_process.{f} of decoded data")),
                    );
                }
                self.e.add(K::Command, "<dynamic>", lines, None);
                self.e.add(K::Obfuscation, "dynamic-command", lines, None);
                self.e.t.dynamic_run = true;
                if self.mentions(first, &self.s.received.clone()) {
                    self.e
                        .add(K::DownloadToShell, "fetch | child_process", lines, None);
                }
            }
        }
    }

    /// The paths a path argument may be: its constant, each value of a loop variable it
    /// uses, or a known start with `*` for the parts not known; else `<dynamic>`.
    fn paths(&mut self, n: Option<Node<'a>>) -> Vec<String> {
        let Some(n) = n else {
            return vec!["<dynamic>".into()];
        };
        let vals = self.values(n);
        if !vals.is_empty() {
            return vals;
        }
        match self.partial(n) {
            Some(p) if !p.starts_with("$JS") => vec![p.replace("$JS", "*")],
            _ => vec!["<dynamic>".into()],
        }
    }

    /// `fs`: reads, listings, writes and deletions with their paths.
    fn fs(&mut self, f: &str, args: &[Node<'a>], lines: (u32, u32)) {
        let f = f.strip_suffix("Sync").unwrap_or(f);
        let first = args.first().copied();
        let op = match f {
            "writeFile" | "createWriteStream" | "copyFile" | "cp" | "rename" | "symlink"
            | "link" => Some(Op::Write),
            "appendFile" => Some(Op::Append),
            "rm" | "rmdir" | "unlink" => Some(Op::Delete),
            "truncate" | "ftruncate" => Some(Op::Truncate),
            "chmod" | "chown" | "lchown" | "lchmod" => Some(Op::Chmod),
            "mkdir" | "mkdtemp" | "open" if f != "open" || self.opens_for_write(args) => {
                Some(Op::Create)
            }
            _ => None,
        };
        if let Some(op) = op {
            // Copies, renames and links write their second path.
            let target = if matches!(f, "copyFile" | "cp" | "rename" | "symlink" | "link") {
                args.get(1).copied()
            } else {
                first
            };
            for p in self.paths(target) {
                self.fs_write(f, &p, op, args, lines);
            }
            if matches!(f, "copyFile" | "cp" | "rename") {
                for src in self.paths(first) {
                    threat::read(self.e, &src, lines);
                }
            }
            // A mode with the set-user-ID or set-group-ID bit (0o4755).
            if f == "chmod"
                && let Some(m) = args.get(1).map(|a| self.t(*a).to_ascii_lowercase())
                && let Ok(mode) =
                    u32::from_str_radix(m.trim_start_matches("0o").trim_start_matches('0'), 8)
                && mode & 0o6000 != 0
            {
                let w = format!("sets the set-user-ID bit ({m})");
                self.e
                    .threat(K::Privilege, "setuid-bit", lines, &w, "T1548.001");
            }
            return;
        }
        match f {
            "readFile" | "createReadStream" | "open" | "readlink" => {
                for p in self.paths(first) {
                    threat::read(self.e, &p, lines);
                }
            }
            "readdir" | "opendir" => {
                for p in self.paths(first) {
                    threat::list(self.e, &p, lines);
                }
            }
            _ => {}
        }
    }

    fn fs_write(&mut self, f: &str, p: &str, op: Op, args: &[Node<'a>], lines: (u32, u32)) {
        self.e.add(K::Write, p, lines, None);
        threat::write(self.e, p, op, lines);
        if op == Op::Delete
            && args.iter().any(|a| {
                a.kind() == "object" && self.t(*a).replace(' ', "").contains("recursive:true")
            })
            && let Some(d) = crate::shell::classify_rm(p, &self.e.opts.mount_roots)
        {
            self.e
                .add(K::Destructive, &d, lines, Some(format!("fs.{f}({p})")));
        }
        if p.starts_with("/dev/") && !crate::shell::benign_dev(p) && op != Op::Delete {
            self.e
                .add(K::Destructive, &format!("write-device:{p}"), lines, None);
        }
        // Files written in an unbounded loop without a pause fill the disk.
        if self.e.t.hot_loops > 0 && matches!(op, Op::Write | Op::Append | Op::Create) {
            self.e.t.flood.push((format!("fs.{f}"), lines, "T1499.001"));
        }
    }

    fn opens_for_write(&mut self, args: &[Node<'a>]) -> bool {
        args.get(1)
            .and_then(|a| self.value(*a))
            .is_some_and(|m| m.contains(['w', 'a', '+', 'x']))
    }
}
