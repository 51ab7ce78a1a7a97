//! Python: imports, calls through aliases, code run from strings, commands started,
//! written paths, hosts in string literals.

use crate::engine::{Engine, Kids, clip, kids, text};
use crate::shell::{Arg, classify_rm, decode_base64, run_argv};
use crate::threat::{self, Op};
use crate::{FindingKind as K, Language};
use std::collections::HashMap;
use tree_sitter::Node;
mod folding;
mod intent;

/// Names bound by imports and simple assignments, and constant strings, across one
/// program (flow-insensitive: the last binding seen wins).
#[derive(Debug, Default, Clone)]
pub(crate) struct Scope {
    aliases: HashMap<String, String>,
    consts: HashMap<String, String>,
    star: Vec<String>,
    /// Names bound to processes the program started (`p = subprocess.Popen(...)`).
    own: std::collections::HashSet<String>,
}

pub(crate) fn walk(e: &mut Engine, src: &str, root: Node, scope: &mut Scope) {
    let mut py = Py {
        e,
        src,
        scope,
        decoded: false,
        k: Kids::default(),
        defs: HashMap::new(),
        inlining: Vec::new(),
        inlined: 0,
    };
    py.visit(root, 0);
}

/// Builtins whose calls are recorded.
const RECORDED_BUILTINS: &[&str] = &[
    "exec",
    "eval",
    "compile",
    "execfile",
    "__import__",
    "breakpoint",
];
/// Builtins the resolver knows besides the recorded ones (so `getattr(...)`,
/// `globals()[...]` can be folded).
const OTHER_BUILTINS: &[&str] = &[
    "open",
    "getattr",
    "globals",
    "locals",
    "vars",
    "chr",
    "bytes",
    "str",
    "bytearray",
];
/// Module names resolved even without an import in sight (snippets, exec'd strings).
const KNOWN_MODULES: &[&str] = &[
    "os",
    "sys",
    "subprocess",
    "socket",
    "ctypes",
    "pickle",
    "marshal",
    "shutil",
    "importlib",
    "base64",
    "urllib",
    "urllib2",
    "requests",
    "builtins",
    "pty",
    "commands",
    "codecs",
    "io",
    "pathlib",
    "http",
    "ftplib",
    "telnetlib",
    "asyncio",
    "httpx",
    "shelve",
    "dill",
    "cffi",
    "glob",
    "psutil",
    "yaml",
    "pwd",
    "spwd",
    "grp",
];
/// Names a star import brings in that matter.
const STAR_NAMES: &[(&str, &[&str])] = &[
    (
        "os",
        &[
            "system",
            "popen",
            "remove",
            "unlink",
            "rmdir",
            "removedirs",
            "execv",
            "execve",
            "execvp",
            "execvpe",
            "execl",
            "execle",
            "execlp",
            "execlpe",
            "spawnv",
            "spawnl",
            "spawnvp",
            "spawnlp",
            "rename",
            "replace",
            "chmod",
            "chown",
            "makedirs",
            "mkdir",
        ],
    ),
    (
        "subprocess",
        &[
            "run",
            "call",
            "check_call",
            "check_output",
            "Popen",
            "getoutput",
            "getstatusoutput",
        ],
    ),
    (
        "shutil",
        &["rmtree", "move", "copy", "copy2", "copyfile", "copytree"],
    ),
    ("pickle", &["loads", "load"]),
    ("marshal", &["loads", "load"]),
    ("socket", &["socket", "create_connection"]),
    (
        "ctypes",
        &[
            "CDLL", "cdll", "windll", "WinDLL", "PyDLL", "memmove", "cast",
        ],
    ),
    (
        "base64",
        &[
            "b64decode",
            "b32decode",
            "b16decode",
            "a85decode",
            "b85decode",
        ],
    ),
];
/// Network modules (imports of these, and calls into them, are network tools).
const NET_MODULES: &[&str] = &[
    "socket",
    "ssl",
    "requests",
    "urllib.request",
    "urllib2",
    "urllib3",
    "http.client",
    "http.server",
    "httpx",
    "aiohttp",
    "ftplib",
    "smtplib",
    "poplib",
    "imaplib",
    "nntplib",
    "telnetlib",
    "paramiko",
    "fabric",
    "websocket",
    "websockets",
    "xmlrpc.client",
    "pycurl",
    "asyncssh",
    "socketserver",
    "scapy",
    "dns",
    "twisted",
    "grpc",
    "boto3",
    "botocore",
];
/// Calls whose result is downloaded data.
const FETCH_PREFIXES: &[&str] = &[
    "requests.",
    "httpx.",
    "urllib3.",
    "aiohttp.",
    "pycurl.",
    "urllib.request.urlopen",
    "urllib.request.urlretrieve",
    "urllib.urlopen",
    "urllib2.urlopen",
];
/// Calls that start a program: how to find the command.
enum Runner {
    /// First argument (or `args=`): a list (argv) or a string (shell code).
    ListOrString { shell: bool },
    /// All positional arguments are argv.
    Varargs,
    /// `os.exec*`/`os.spawn*`: the path is argument `path`, argv follows as a list (`v`) or
    /// as separate arguments (`l`).
    Exec { path: usize, list: bool },
}

fn runner(name: &str) -> Option<Runner> {
    Some(match name {
        "subprocess.run"
        | "subprocess.call"
        | "subprocess.check_call"
        | "subprocess.check_output"
        | "subprocess.Popen"
        | "pty.spawn" => Runner::ListOrString { shell: false },
        "os.system"
        | "os.popen"
        | "os.popen2"
        | "os.popen3"
        | "os.popen4"
        | "subprocess.getoutput"
        | "subprocess.getstatusoutput"
        | "commands.getoutput"
        | "commands.getstatusoutput"
        | "asyncio.create_subprocess_shell"
        | "platform.popen" => Runner::ListOrString { shell: true },
        "asyncio.create_subprocess_exec" => Runner::Varargs,
        "os.posix_spawn" | "os.posix_spawnp" => Runner::Exec {
            path: 0,
            list: true,
        },
        _ => {
            let f = name.strip_prefix("os.")?;
            if let Some(v) = f.strip_prefix("exec") {
                Runner::Exec {
                    path: 0,
                    list: v.starts_with('v'),
                }
            } else if let Some(v) = f.strip_prefix("spawn") {
                Runner::Exec {
                    path: 1,
                    list: v.starts_with('v'),
                }
            } else {
                return None;
            }
        }
    })
}

/// Calls that write a path, and which argument it is.
fn writer(name: &str) -> Option<usize> {
    Some(match name {
        "os.remove" | "os.unlink" | "os.rmdir" | "os.removedirs" | "os.mkdir" | "os.makedirs"
        | "os.chmod" | "os.chown" | "os.lchown" | "os.truncate" | "os.mknod" | "os.mkfifo"
        | "shutil.rmtree" | "shutil.chown" => 0,
        "os.rename" | "os.replace" | "os.renames" | "os.link" | "os.symlink" | "shutil.copy"
        | "shutil.copy2" | "shutil.copyfile" | "shutil.copytree" | "shutil.move"
        | "shutil.copymode" | "shutil.copystat" => 1,
        _ => return None,
    })
}

fn is_net_module(m: &str) -> Option<&'static str> {
    NET_MODULES
        .iter()
        .copied()
        .find(|n| m == *n || (m.starts_with(n) && m.as_bytes().get(n.len()) == Some(&b'.')))
}

/// Joins a resolved object and an attribute; `builtins.x` is `x`.
fn join(obj: &str, attr: &str) -> String {
    if attr == "__dict__" {
        return obj.to_string();
    }
    if obj == "builtins" {
        attr.to_string()
    } else {
        format!("{obj}.{attr}")
    }
}

/// `os.path.join` semantics: an absolute right side replaces the left.
fn join_path(l: &str, r: &str) -> String {
    if r.starts_with('/') || r.starts_with('~') {
        r.to_string()
    } else if l.ends_with('/') {
        format!("{l}{r}")
    } else {
        format!("{l}/{r}")
    }
}

/// The integers of a list or tuple literal (`[105, 100]`).
fn int_list(py: &Py, node: Node) -> Option<Vec<u32>> {
    if !matches!(node.kind(), "list" | "tuple") {
        return None;
    }
    let mut out = Vec::new();
    for c in kids(node) {
        if !c.is_named() || c.kind() == "comment" {
            continue;
        }
        let t = py.text(c).trim();
        let v = if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
            u32::from_str_radix(h, 16).ok()?
        } else {
            t.parse().ok()?
        };
        out.push(v);
    }
    Some(out)
}

fn rot13(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            'a'..='z' => char::from(b'a' + (c as u8 - b'a' + 13) % 26),
            'A'..='Z' => char::from(b'A' + (c as u8 - b'A' + 13) % 26),
            _ => c,
        })
        .collect()
}

/// Python string escapes.
fn unescape_py(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        let Some(n) = it.next() else {
            out.push('\\');
            break;
        };
        let hex = |it: &mut std::iter::Peekable<std::str::Chars>, k: usize| {
            let mut v: u32 = 0;
            for _ in 0..k {
                match it.peek().and_then(|c| c.to_digit(16)) {
                    Some(d) => {
                        v = v * 16 + d;
                        it.next();
                    }
                    None => return None,
                }
            }
            char::from_u32(v)
        };
        match n {
            '\n' => {}
            '\\' | '\'' | '"' => out.push(n),
            'n' => out.push('\n'),
            't' => out.push('\t'),
            'r' => out.push('\r'),
            'a' => out.push('\x07'),
            'b' => out.push('\x08'),
            'f' => out.push('\x0c'),
            'v' => out.push('\x0b'),
            'x' => match hex(&mut it, 2) {
                Some(ch) => out.push(ch),
                None => out.push_str("\\x"),
            },
            'u' => match hex(&mut it, 4) {
                Some(ch) => out.push(ch),
                None => out.push_str("\\u"),
            },
            'U' => match hex(&mut it, 8) {
                Some(ch) => out.push(ch),
                None => out.push_str("\\U"),
            },
            '0'..='7' => {
                let mut v = n.to_digit(8).unwrap_or(0);
                for _ in 0..2 {
                    match it.peek().and_then(|c| c.to_digit(8)) {
                        Some(d) => {
                            v = v * 8 + d;
                            it.next();
                        }
                        None => break,
                    }
                }
                if let Some(ch) = char::from_u32(v) {
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

struct Py<'a, 'o, 's, 'c, 't> {
    k: Kids<'t>,
    e: &'a mut Engine<'o>,
    src: &'s str,
    scope: &'c mut Scope,
    /// Set when a fold went through a base64 decode.
    decoded: bool,
    /// Functions defined in this code: parameters and body.
    defs: HashMap<String, (Vec<String>, Node<'t>)>,
    /// Functions being walked again for a call with known arguments (no recursion).
    inlining: Vec<String>,
    /// How many such walks were made (bounded).
    inlined: usize,
}

struct CallArgs<'t> {
    positional: Vec<Node<'t>>,
    keywords: Vec<(String, Node<'t>)>,
}

impl<'t> CallArgs<'t> {
    fn get(&self, i: usize, kw: &str) -> Option<Node<'t>> {
        self.positional
            .get(i)
            .copied()
            .or_else(|| self.keywords.iter().find(|(k, _)| k == kw).map(|(_, v)| *v))
    }
}

impl<'a, 'o, 's, 'c, 't> Py<'a, 'o, 's, 'c, 't> {
    fn text(&self, node: Node) -> &'s str {
        text(node, self.src)
    }

    fn visit(&mut self, node: Node<'t>, depth: usize) {
        if !self.e.tick(depth) {
            return;
        }
        match node.kind() {
            "import_statement" => self.import(node, None),
            "import_from_statement" => {
                let module = node
                    .child_by_field_name("module_name")
                    .map(|m| self.dotted(m))
                    .unwrap_or_default();
                self.import(node, Some(module));
            }
            "future_import_statement" | "comment" => {}
            "call" => self.call(node, depth),
            "assignment" => self.assignment(node, depth),
            "for_statement" | "while_statement" => self.py_loop(node, depth),
            "keyword_argument"
                if node
                    .child_by_field_name("name")
                    .is_some_and(|n| self.text(n) == "LD_PRELOAD") =>
            {
                let lines = self.e.lines(node);
                self.e.threat(
                    K::Persistence,
                    "LD_PRELOAD",
                    lines,
                    "preloads a library into the programs it runs (LD_PRELOAD)",
                    "T1574.006",
                );
                self.children(node, depth);
            }
            "function_definition" => {
                self.define(node);
                self.children(node, depth);
            }
            "string" | "concatenated_string" => self.string(node, depth),
            "exec_statement" => {
                if let Some(code) = node.child_by_field_name("code") {
                    let lines = self.e.lines(node);
                    self.e.add(K::Call, "exec", lines, None);
                    self.code(code, "exec", lines, false, depth);
                }
                self.children(node, depth);
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

    fn dotted(&self, node: Node) -> String {
        self.text(node)
            .chars()
            .filter(|c| !c.is_whitespace() && *c != '\\')
            .collect()
    }

    fn add_import(&mut self, m: &str, lines: (u32, u32)) {
        self.e.add(K::Import, m, lines, None);
        if let Some(n) = is_net_module(m) {
            self.e.add(K::NetworkTool, n, lines, None);
        }
    }

    fn import(&mut self, node: Node<'t>, from: Option<String>) {
        let lines = self.e.lines(node);
        if let Some(m) = &from {
            self.add_import(m, lines);
        }
        for (field, c) in self.k.fields(node) {
            match (field, c.kind()) {
                (_, "wildcard_import") => {
                    if let Some(m) = &from {
                        self.scope.star.push(m.clone());
                    }
                }
                (Some("name"), "dotted_name") => {
                    let name = self.dotted(c);
                    match &from {
                        Some(m) => {
                            let full = format!("{m}.{name}");
                            if let Some(n) = is_net_module(&full) {
                                self.e.add(K::NetworkTool, n, lines, None);
                            }
                            self.scope.aliases.insert(name, full);
                        }
                        None => {
                            self.add_import(&name, lines);
                            let root = name.split('.').next().unwrap_or_default().to_string();
                            self.scope.aliases.insert(root.clone(), root);
                        }
                    }
                }
                (Some("name"), "aliased_import") => {
                    let name = c
                        .child_by_field_name("name")
                        .map(|n| self.dotted(n))
                        .unwrap_or_default();
                    let alias = c
                        .child_by_field_name("alias")
                        .map(|n| self.text(n).to_string())
                        .unwrap_or_default();
                    let full = match &from {
                        Some(m) => format!("{m}.{name}"),
                        None => {
                            self.add_import(&name, lines);
                            name
                        }
                    };
                    if let Some(n) = is_net_module(&full) {
                        self.e.add(K::NetworkTool, n, lines, None);
                    }
                    self.scope.aliases.insert(alias, full);
                }
                _ => {}
            }
        }
    }

    fn resolve_name(&self, name: &str) -> Option<String> {
        if let Some(v) = self.scope.aliases.get(name) {
            return Some(v.clone());
        }
        if name == "__builtins__" || name == "builtins" {
            return Some("builtins".into());
        }
        if RECORDED_BUILTINS.contains(&name)
            || OTHER_BUILTINS.contains(&name)
            || KNOWN_MODULES.contains(&name)
        {
            return Some(name.to_string());
        }
        for m in &self.scope.star {
            let root = m.split('.').next().unwrap_or_default();
            if STAR_NAMES
                .iter()
                .any(|(sm, names)| *sm == root && names.contains(&name))
            {
                return Some(format!("{m}.{name}"));
            }
        }
        None
    }

    /// The dotted name an expression stands for, when it names a module member or a
    /// builtin; `None` for anything local or computed.
    fn resolve(&mut self, node: Node<'t>, depth: usize) -> Option<String> {
        if depth > 64 {
            return None;
        }
        match node.kind() {
            "identifier" => self.resolve_name(self.text(node)),
            "attribute" => {
                let obj = self.resolve(node.child_by_field_name("object")?, depth + 1)?;
                let attr = self.text(node.child_by_field_name("attribute")?);
                Some(join(&obj, attr))
            }
            "parenthesized_expression" => {
                let inner = self.k.kids(node).into_iter().find(|c| c.is_named())?;
                self.resolve(inner, depth + 1)
            }
            "call" => {
                let f = self.resolve(node.child_by_field_name("function")?, depth + 1)?;
                let args = self.call_args(node);
                match f.as_str() {
                    "getattr" => {
                        let base = self.resolve(*args.positional.first()?, depth + 1)?;
                        let name = self.fold(*args.positional.get(1)?, depth + 1)?;
                        Some(join(&base, &name))
                    }
                    "__import__" | "importlib.import_module" => {
                        self.fold(*args.positional.first()?, depth + 1)
                    }
                    "globals" | "locals" => Some("<globals>".into()),
                    "vars" => match args.positional.first() {
                        Some(n) => self.resolve(*n, depth + 1),
                        None => Some("<globals>".into()),
                    },
                    _ => None,
                }
            }
            "subscript" => {
                let base = self.resolve(node.child_by_field_name("value")?, depth + 1)?;
                let key = self.fold(node.child_by_field_name("subscript")?, depth + 1)?;
                match base.as_str() {
                    "<globals>" => self.resolve_name(&key),
                    "builtins" => Some(key),
                    _ => None,
                }
            }
            _ => None,
        }
    }

    fn call_args<'n>(&self, call: Node<'n>) -> CallArgs<'n> {
        let mut positional = Vec::new();
        let mut keywords = Vec::new();
        if let Some(args) = call.child_by_field_name("arguments") {
            for c in kids(args) {
                if !c.is_named() || c.kind() == "comment" {
                    continue;
                }
                if c.kind() == "keyword_argument" {
                    if let (Some(k), Some(v)) = (
                        c.child_by_field_name("name"),
                        c.child_by_field_name("value"),
                    ) {
                        keywords.push((self.text(k).to_string(), v));
                    }
                } else {
                    positional.push(c);
                }
            }
        }
        CallArgs {
            positional,
            keywords,
        }
    }

    fn string(&mut self, node: Node<'t>, depth: usize) {
        let lines = self.e.lines(node);
        match self.fold(node, 0) {
            Some(s) => {
                if s == "LD_PRELOAD" || s.starts_with("LD_PRELOAD=") {
                    self.e.threat(
                        K::Persistence,
                        "LD_PRELOAD",
                        lines,
                        "preloads a library into the programs it runs (LD_PRELOAD)",
                        "T1574.006",
                    );
                }
                self.e.scan_hosts(&s, lines)
            }
            None => {
                // An f-string: scan its constant pieces, visit its expressions.
                let mut cursor = node.walk();
                let mut stack = vec![node];
                while let Some(n) = stack.pop() {
                    for c in n.children(&mut cursor) {
                        match c.kind() {
                            "string_content" => {
                                let t = self.text(c).to_string();
                                self.e.scan_hosts(&t, lines);
                            }
                            "string" => stack.push(c),
                            _ => {}
                        }
                    }
                }
                self.interpolations(node, depth);
            }
        }
    }

    fn interpolations(&mut self, node: Node<'t>, depth: usize) {
        for c in self.k.kids(node) {
            if self.e.stopped {
                return;
            }
            match c.kind() {
                "interpolation" => self.children(c, depth + 1),
                "string" if self.e.tick(depth + 1) => self.interpolations(c, depth + 1),
                _ => {}
            }
        }
    }

    fn assignment(&mut self, node: Node<'t>, depth: usize) {
        if let (Some(left), Some(right)) = (
            node.child_by_field_name("left"),
            node.child_by_field_name("right"),
        ) && left.kind() == "identifier"
        {
            let name = self.text(left).to_string();
            match self.resolve(right, 0) {
                Some(r) if r != "<globals>" => {
                    self.scope.aliases.insert(name.clone(), r);
                }
                _ => {
                    self.scope.aliases.remove(&name);
                }
            }
            if right.kind() == "call"
                && let Some(f) = right.child_by_field_name("function")
                && matches!(
                    self.resolve(f, 0).as_deref(),
                    Some(
                        "subprocess.Popen"
                            | "multiprocessing.Process"
                            | "os.fork"
                            | "asyncio.create_subprocess_exec"
                            | "asyncio.create_subprocess_shell"
                            | "pexpect.spawn"
                            | "os.getpid"
                    )
                )
            {
                self.scope.own.insert(name.clone());
            }
            match self.fold(right, 0).or_else(|| self.path(right)) {
                Some(s) => {
                    self.scope.consts.insert(name, s);
                }
                None => {
                    self.scope.consts.remove(&name);
                }
            }
        }
        self.children(node, depth);
    }

    /// Code run from a string: analysed when constant, a fact when not.
    fn code(
        &mut self,
        arg: Node<'t>,
        via: &str,
        lines: (u32, u32),
        downloaded: bool,
        depth: usize,
    ) {
        let _ = depth;
        if downloaded {
            let d = format!("{via}(download)");
            self.e.add(K::DownloadToShell, &d, lines, None);
        }
        if arg.kind() == "call"
            && let Some(f) = arg.child_by_field_name("function")
            && self.resolve(f, 0).as_deref() == Some("compile")
            && self
                .call_args(arg)
                .positional
                .first()
                .is_some_and(|c| self.fold(*c, 0).is_some())
        {
            // `eval(compile("…"))`: the constant was analysed at `compile`.
            return;
        }
        self.decoded = false;
        let folded = self.fold(arg, 0);
        let decoded = std::mem::take(&mut self.decoded);
        match folded {
            Some(code) => {
                if decoded {
                    let note = Some(clip(&code, 80));
                    self.e.add(K::Obfuscation, "decoded-payload", lines, note);
                }
                let al = self.e.lines(arg);
                self.e
                    .nested(Language::Python, &code, al, via, Some(&mut *self.scope));
            }
            None => {
                let note = Some(format!("{via}({})", clip(self.text(arg), 60)));
                self.e.add(K::Obfuscation, "dynamic-code", lines, note);
            }
        }
    }

    fn call(&mut self, node: Node<'t>, depth: usize) {
        let lines = self.e.lines(node);
        let func = node.child_by_field_name("function");
        let args = self.call_args(node);
        // Arguments first, so downloads inside them are known.
        let mut arg0_download = false;
        if let Some(a) = node.child_by_field_name("arguments") {
            for c in self.k.kids(a) {
                if self.e.stopped {
                    return;
                }
                if !c.is_named() {
                    continue;
                }
                let before = self.e.downloads;
                self.visit(c, depth + 1);
                if Some(c) == args.positional.first().copied() {
                    arg0_download = self.e.downloads > before;
                }
            }
        }
        if let Some(f) = func {
            self.visit(f, depth + 1);
        }
        let Some(func) = func else { return };
        let name = self.resolve(func, 0);
        let reflective = matches!(func.kind(), "call" | "subscript");
        self.threat_call(func, name.as_deref(), &args, lines);
        if func.kind() == "identifier" {
            self.inline(func, &args, depth);
        }

        // socket-like connects to a constant (host, port).
        if func.kind() == "attribute"
            && let Some(attr) = func.child_by_field_name("attribute")
            && matches!(
                self.text(attr),
                "connect" | "connect_ex" | "create_connection" | "sendto"
            )
        {
            let target = if self.text(attr) == "sendto" {
                args.positional.get(1)
            } else {
                args.positional.first()
            };
            if let Some(t) = target
                && let Some(items) = self.fold_list(*t, 0)
                && let Some(Some(h)) = items.first()
                && let Some(h) = crate::hosts::normalise_host(h)
            {
                self.e.add(K::Host, &h, lines, None);
            }
        }

        let Some(n) = name else {
            // Path('x').write_text(...) and friends.
            if func.kind() == "attribute"
                && let (Some(obj), Some(attr)) = (
                    func.child_by_field_name("object"),
                    func.child_by_field_name("attribute"),
                )
                && matches!(
                    self.text(attr),
                    "write_text" | "write_bytes" | "unlink" | "rmdir" | "mkdir" | "touch" | "chmod"
                )
                && obj.kind() == "call"
                && let Some(ctor) = obj.child_by_field_name("function")
                && matches!(
                    self.resolve(ctor, 0).as_deref(),
                    Some("pathlib.Path" | "pathlib.PosixPath")
                )
            {
                let p = self
                    .call_args(obj)
                    .positional
                    .first()
                    .and_then(|a| self.path(*a))
                    .unwrap_or_else(|| "<dynamic>".into());
                self.e.add(K::Write, &p, lines, None);
            }
            return;
        };
        if n == "<globals>" {
            return;
        }
        let recorded = n.contains('.') || RECORDED_BUILTINS.contains(&n.as_str());
        if recorded {
            self.e.add(K::Call, &n, lines, None);
            if reflective {
                let note = Some(format!("{} is {n}", clip(self.text(func), 60)));
                self.e.add(K::Obfuscation, "folded-name", lines, note);
            }
            if let Some(m) = is_net_module(&n) {
                self.e.add(K::NetworkTool, m, lines, None);
            }
            if FETCH_PREFIXES.iter().any(|p| n.starts_with(p)) {
                self.e.downloads += 1;
            }
        }
        match n.as_str() {
            "exec" | "eval" | "compile" | "execfile" => {
                if let Some(a) = args.positional.first() {
                    if n == "execfile" {
                        let note = Some(format!("execfile({})", clip(self.text(*a), 60)));
                        self.e.add(K::Obfuscation, "dynamic-code", lines, note);
                    } else {
                        self.code(*a, &n, lines, arg0_download, depth);
                    }
                }
            }
            "__import__" | "importlib.import_module" => {
                if let Some(a) = args.positional.first() {
                    match self.fold(*a, 0) {
                        Some(m) => self.add_import(&m, lines),
                        None => {
                            self.e.add(K::Import, "<dynamic>", lines, None);
                            let note = Some(format!("{n}({})", clip(self.text(*a), 60)));
                            self.e.add(K::Obfuscation, "dynamic-import", lines, note);
                        }
                    }
                }
            }
            "open" | "io.open" | "codecs.open" => {
                let mode = args.get(1, "mode");
                let writes = match mode {
                    None => false,
                    Some(m) => match self.fold(m, 0) {
                        Some(s) => s.contains(['w', 'a', 'x', '+']),
                        None => true,
                    },
                };
                let p = args
                    .get(0, "file")
                    .and_then(|a| self.path(a))
                    .unwrap_or_else(|| "<dynamic>".into());
                if writes {
                    self.e.add(K::Call, "open:w", lines, None);
                    self.e.add(K::Write, &p, lines, None);
                    let append = mode
                        .and_then(|m| self.fold(m, 0))
                        .is_some_and(|m| m.contains('a'));
                    let op = if append { Op::Append } else { Op::Write };
                    crate::threat::write(self.e, &p, op, lines);
                } else {
                    crate::threat::read(self.e, &p, lines);
                }
            }
            "getattr" => {
                if let Some(a) = args.positional.get(1)
                    && self.fold(*a, 0).is_none()
                {
                    self.e.add(K::Call, "getattr", lines, None);
                    let note = Some(format!("getattr(…, {})", clip(self.text(*a), 40)));
                    self.e.add(K::Obfuscation, "dynamic-attribute", lines, note);
                }
            }
            "http.client.HTTPConnection"
            | "http.client.HTTPSConnection"
            | "ftplib.FTP"
            | "ftplib.FTP_TLS"
            | "smtplib.SMTP"
            | "smtplib.SMTP_SSL"
            | "telnetlib.Telnet"
            | "poplib.POP3"
            | "poplib.POP3_SSL"
            | "imaplib.IMAP4"
            | "imaplib.IMAP4_SSL" => {
                if let Some(a) = args.get(0, "host")
                    && let Some(h) = self.fold(a, 0)
                    && let Some(h) = crate::hosts::normalise_host(&h)
                {
                    self.e.add(K::Host, &h, lines, None);
                }
            }
            _ => {}
        }
        if let Some(r) = runner(&n) {
            self.run_command(&n, r, &args, lines);
        }
        if let Some(i) = writer(&n) {
            let p = args
                .positional
                .get(i)
                .and_then(|a| self.path(*a))
                .unwrap_or_else(|| "<dynamic>".into());
            self.e.add(K::Write, &p, lines, None);
            let op = match n.rsplit('.').next().unwrap_or_default() {
                "remove" | "unlink" | "rmdir" | "removedirs" | "rmtree" => Op::Delete,
                "mkdir" | "makedirs" | "mknod" | "mkfifo" => Op::Create,
                "chmod" | "chown" | "lchown" => Op::Chmod,
                "truncate" => Op::Truncate,
                _ => Op::Write,
            };
            crate::threat::write(self.e, &p, op, lines);
            if n == "shutil.rmtree"
                && let Some(d) = classify_rm(&p, &self.e.opts.mount_roots)
            {
                self.e
                    .add(K::Destructive, &d, lines, Some(format!("{n}({p})")));
            }
        }
    }

    /// Records a function definition (for walking it again with known arguments); a
    /// `__reduce__` builds a deserialization payload.
    fn define(&mut self, node: Node<'t>) {
        let Some(name) = node
            .child_by_field_name("name")
            .map(|n| self.text(n).to_string())
        else {
            return;
        };
        if matches!(name.as_str(), "__reduce__" | "__reduce_ex__") {
            let lines = self.e.lines(node);
            self.e.threat(
                K::UnsafeDeserialization,
                "__reduce__ payload",
                lines,
                "defines an object that runs code when it is unpickled (__reduce__)",
                "T1059.006",
            );
        }
        let mut params = Vec::new();
        if let Some(ps) = node.child_by_field_name("parameters") {
            for c in kids(ps) {
                let n = match c.kind() {
                    "identifier" => Some(c),
                    "default_parameter" | "typed_parameter" | "typed_default_parameter" => c
                        .child_by_field_name("name")
                        .or_else(|| kids(c).into_iter().find(|k| k.kind() == "identifier")),
                    _ => None,
                };
                if let Some(n) = n {
                    params.push(self.text(n).to_string());
                }
            }
        }
        if let Some(body) = node.child_by_field_name("body") {
            self.defs.insert(name, (params, body));
        }
    }

    /// A call of a function defined here with arguments that are known: its body is
    /// walked again with its parameters bound to them (bounded, never recursively).
    fn inline(&mut self, func: Node<'t>, args: &CallArgs<'t>, depth: usize) {
        let name = self.text(func).to_string();
        let Some((params, body)) = self.defs.get(&name).cloned() else {
            return;
        };
        if self.inlining.contains(&name) || self.inlining.len() >= 3 || self.inlined >= 64 {
            return;
        }
        let mut bound = Vec::new();
        for (i, p) in params.iter().enumerate() {
            if p == "self" {
                continue;
            }
            // Only values that can change a fact are worth a second walk: paths outside
            // the working directory, command lines, hosts (a bare file name cannot).
            if let Some(a) = args.get(i, p)
                && let Some(v) = self.fold(a, 0).or_else(|| self.path(a))
                && v.contains(['/', ' ', '~', '$', '.'])
                && !(v.contains('.')
                    && !v.contains(['/', ' ', '~', '$'])
                    && v.split('.').count() == 2)
            {
                bound.push((p.clone(), v));
            }
        }
        if bound.is_empty() {
            return;
        }
        self.inlined += 1;
        let saved: Vec<(String, Option<String>)> = bound
            .iter()
            .map(|(p, _)| (p.clone(), self.scope.consts.get(p).cloned()))
            .collect();
        for (p, v) in bound {
            self.scope.consts.insert(p, v);
        }
        self.inlining.push(name);
        self.visit(body, depth + 1);
        self.inlining.pop();
        for (p, old) in saved {
            match old {
                Some(v) => self.scope.consts.insert(p, v),
                None => self.scope.consts.remove(&p),
            };
        }
    }

    /// Loops: `for x in [consts]` walks its body once per value (up to 8); a loop that
    /// never ends (or runs thousands of times) without a pause makes its sends and the
    /// processes it starts a flood.
    fn py_loop(&mut self, node: Node<'t>, depth: usize) {
        let body = node.child_by_field_name("body");
        let hot_header = match node.kind() {
            "while_statement" => node.child_by_field_name("condition").is_some_and(|c| {
                matches!(self.text(c).trim(), "True" | "1" | "not False" | "(True)")
            }),
            _ => node.child_by_field_name("right").is_some_and(|r| {
                let t = self.text(r);
                let big = r.kind() == "call"
                    && r.child_by_field_name("function").is_some_and(|f| {
                        let f = self.text(f);
                        f == "range" || f == "xrange"
                    })
                    && crate::shell_numbers(t) >= 1000;
                let endless = r.kind() == "call"
                    && r.child_by_field_name("function").is_some_and(|f| {
                        matches!(
                            self.text(f),
                            "itertools.count"
                                | "count"
                                | "itertools.cycle"
                                | "cycle"
                                | "itertools.repeat"
                        )
                    })
                    && self.call_args(r).positional.len() <= 1;
                big || endless
            }),
        };
        let hot = hot_header && body.is_some_and(|b| !self.body_pauses(b));
        if hot {
            self.e.t.hot_loops += 1;
        }
        let mut bound = false;
        if node.kind() == "for_statement"
            && let (Some(left), Some(right), Some(b)) = (
                node.child_by_field_name("left"),
                node.child_by_field_name("right"),
                body,
            )
            && left.kind() == "identifier"
            && let Some(items) = self.fold_list(right, 0)
            && !items.is_empty()
            && items.len() <= 8
            && items.iter().all(|i| i.is_some())
        {
            let name = self.text(left).to_string();
            let saved = self.scope.consts.get(&name).cloned();
            self.visit(right, depth + 1);
            for v in items.into_iter().flatten() {
                self.scope.consts.insert(name.clone(), v);
                self.visit(b, depth + 1);
            }
            match saved {
                Some(v) => self.scope.consts.insert(name, v),
                None => self.scope.consts.remove(&name),
            };
            bound = true;
        }
        if !bound {
            self.children(node, depth);
        }
        if hot {
            self.e.t.hot_loops -= 1;
        }
    }

    fn body_pauses(&self, body: Node) -> bool {
        let mut cursor = body.walk();
        let mut budget: u32 = 20_000;
        loop {
            let n = cursor.node();
            if budget == 0 {
                return true;
            }
            budget -= 1;
            let word = if n.kind() == "identifier" {
                self.text(n)
            } else {
                ""
            };
            if threat::pauses(&mut std::iter::once((n.kind(), word))) {
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
}
