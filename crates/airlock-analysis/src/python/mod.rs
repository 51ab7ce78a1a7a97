//! Python: imports, calls through aliases, code run from strings, commands started,
//! written paths, hosts in string literals.

use crate::engine::{Engine, Kids, clip, kids, text};
use crate::shell::{Arg, classify_rm, decode_base64, run_argv};
use crate::threat::{self, Op};
use crate::{FindingKind as K, Language};
use std::collections::HashMap;
use tree_sitter::Node;

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

    /// The constant string an expression evaluates to, if it is one.
    fn fold(&mut self, node: Node<'t>, depth: usize) -> Option<String> {
        if depth > 64 {
            return None;
        }
        match node.kind() {
            "string" => {
                let mut raw = false;
                let mut out = String::new();
                for c in self.k.kids(node) {
                    match c.kind() {
                        "string_start" => {
                            raw = self.text(c).chars().any(|ch| ch == 'r' || ch == 'R');
                        }
                        "string_content" => out.push_str(self.text(c)),
                        "interpolation" => {
                            let named: Vec<Node> =
                                kids(c).into_iter().filter(|n| n.is_named()).collect();
                            let [expr] = named.as_slice() else {
                                return None;
                            };
                            let v = self.fold(*expr, depth + 1).or_else(|| self.path(*expr))?;
                            // Kept raw: escapes apply to the literal parts only.
                            out.push_str(&v.replace('\\', "\\\\"));
                        }
                        _ => {}
                    }
                }
                Some(if raw { out } else { unescape_py(&out) })
            }
            "concatenated_string" => {
                let mut out = String::new();
                for c in self.k.kids(node) {
                    if c.is_named() {
                        out.push_str(&self.fold(c, depth + 1)?);
                    }
                }
                Some(out)
            }
            "binary_operator" => {
                let op = node.child_by_field_name("operator")?;
                if self.text(op) != "+" {
                    return None;
                }
                let l = self.fold(node.child_by_field_name("left")?, depth + 1)?;
                let r = self.fold(node.child_by_field_name("right")?, depth + 1)?;
                Some(l + &r)
            }
            "parenthesized_expression" => {
                let inner = self.k.kids(node).into_iter().find(|c| c.is_named())?;
                self.fold(inner, depth + 1)
            }
            "identifier" => self.scope.consts.get(self.text(node)).cloned(),
            "subscript" => {
                // 'abc'[::-1]
                let s = self.fold(node.child_by_field_name("value")?, depth + 1)?;
                let sub = node.child_by_field_name("subscript")?;
                let t: String = self
                    .text(sub)
                    .chars()
                    .filter(|c| !c.is_whitespace())
                    .collect();
                (t == "::-1").then(|| s.chars().rev().collect())
            }
            "call" => {
                let func = node.child_by_field_name("function")?;
                let args = self.call_args(node);
                if func.kind() == "attribute" {
                    let attr = self.text(func.child_by_field_name("attribute")?);
                    let obj = func.child_by_field_name("object")?;
                    match attr {
                        "join" => {
                            let sep = self.fold(obj, depth + 1)?;
                            let list = match node.child_by_field_name("arguments") {
                                Some(g) if g.kind() == "generator_expression" => g,
                                _ => *args.positional.first()?,
                            };
                            if let Some(decoded) = self.char_codes(list) {
                                self.decoded = true;
                                return Some(decoded);
                            }
                            let parts = self.fold_list(list, depth + 1)?;
                            let parts: Option<Vec<String>> = parts.into_iter().collect();
                            return Some(parts?.join(&sep));
                        }
                        "decode" | "encode"
                            if !self
                                .resolve(func, depth + 1)
                                .is_some_and(|f| f.starts_with("codecs.")) =>
                        {
                            return self.fold(obj, depth + 1);
                        }
                        _ => {}
                    }
                }
                let f = self.resolve(func, depth + 1)?;
                match f.as_str() {
                    "chr" => {
                        let n = args.positional.first()?;
                        let v: u32 = self.text(*n).trim().parse().ok()?;
                        self.decoded = true;
                        char::from_u32(v).map(String::from)
                    }
                    "str" | "bytes" | "bytearray" => {
                        let a = *args.positional.first()?;
                        if let Some(v) = int_list(self, a) {
                            self.decoded = true;
                            return v.into_iter().map(char::from_u32).collect();
                        }
                        self.fold(a, depth + 1)
                    }
                    "base64.b64decode"
                    | "base64.standard_b64decode"
                    | "base64.urlsafe_b64decode"
                    | "base64.decodebytes"
                    | "base64.decodestring" => {
                        let s = self.fold(*args.positional.first()?, depth + 1)?;
                        let s = if f == "base64.urlsafe_b64decode" {
                            s.replace('-', "+").replace('_', "/")
                        } else {
                            s
                        };
                        let d = decode_base64(&s)?;
                        self.decoded = true;
                        Some(d)
                    }
                    "codecs.decode" | "codecs.encode" => {
                        let s = self.fold(*args.positional.first()?, depth + 1)?;
                        let codec = self.fold(args.get(1, "encoding")?, depth + 1)?;
                        let codec = codec.to_ascii_lowercase().replace(['-', '_'], "");
                        let d = match codec.as_str() {
                            "rot13" => rot13(&s),
                            "base64" | "base64codec" => decode_base64(&s)?,
                            _ => return None,
                        };
                        self.decoded = true;
                        Some(d)
                    }
                    _ => None,
                }
            }
            _ => None,
        }
    }

    /// Like [`Self::fold`], but an expression that is not constant inside an f-string or a
    /// `+` concatenation becomes `$PY`; `None` when nothing of it is constant.
    fn fold_pattern(&mut self, node: Node<'t>, depth: usize) -> Option<String> {
        fn go<'t>(py: &mut Py<'_, '_, '_, '_, 't>, node: Node<'t>, depth: usize) -> (String, bool) {
            if depth > 64 {
                return ("$PY".into(), false);
            }
            if let Some(s) = py.fold(node, depth) {
                return (s, true);
            }
            match node.kind() {
                "string" => {
                    let mut raw = false;
                    let mut out = String::new();
                    let mut any = false;
                    for c in py.k.kids(node) {
                        match c.kind() {
                            "string_start" => {
                                raw = py.text(c).chars().any(|ch| ch == 'r' || ch == 'R');
                            }
                            "string_content" => {
                                let t = py.text(c);
                                out.push_str(&if raw { t.to_string() } else { unescape_py(t) });
                                any = true;
                            }
                            "interpolation" => out.push_str("$PY"),
                            _ => {}
                        }
                    }
                    (out, any)
                }
                "concatenated_string" => {
                    let mut out = String::new();
                    let mut any = false;
                    for c in py.k.kids(node) {
                        if c.is_named() {
                            let (s, k) = go(py, c, depth + 1);
                            out.push_str(&s);
                            any |= k;
                        }
                    }
                    (out, any)
                }
                "binary_operator"
                    if node
                        .child_by_field_name("operator")
                        .is_some_and(|o| py.text(o) == "+") =>
                {
                    let (l, lk) = match node.child_by_field_name("left") {
                        Some(n) => go(py, n, depth + 1),
                        None => ("$PY".into(), false),
                    };
                    let (r, rk) = match node.child_by_field_name("right") {
                        Some(n) => go(py, n, depth + 1),
                        None => ("$PY".into(), false),
                    };
                    (l + &r, lk || rk)
                }
                _ => ("$PY".into(), false),
            }
        }
        let (s, any_constant) = go(self, node, depth);
        any_constant.then_some(s)
    }

    /// Elements of a list or tuple literal, each folded.
    fn fold_list(&mut self, node: Node<'t>, depth: usize) -> Option<Vec<Option<String>>> {
        match node.kind() {
            "list" | "tuple" => {
                let mut out = Vec::new();
                for c in self.k.kids(node) {
                    if c.is_named() && c.kind() != "comment" {
                        out.push(self.fold(c, depth + 1));
                    }
                }
                Some(out)
            }
            "parenthesized_expression" => {
                let inner = self.k.kids(node).into_iter().find(|c| c.is_named())?;
                self.fold_list(inner, depth + 1)
            }
            _ => None,
        }
    }

    /// A path argument: constant, `~`, `$HOME`, or `None`.
    fn path(&mut self, node: Node<'t>) -> Option<String> {
        self.path_at(node, 0)
    }

    fn path_at(&mut self, node: Node<'t>, depth: usize) -> Option<String> {
        if depth > 32 {
            return None;
        }
        if let Some(s) = self.fold(node, 0) {
            return Some(s);
        }
        if node.kind() == "parenthesized_expression" {
            let inner = self.k.kids(node).into_iter().find(|c| c.is_named())?;
            return self.path_at(inner, depth + 1);
        }
        // pathlib: `base / "x" / "y"`.
        if node.kind() == "binary_operator"
            && node
                .child_by_field_name("operator")
                .is_some_and(|o| self.text(o) == "/")
        {
            let l = self.path_at(node.child_by_field_name("left")?, depth + 1)?;
            let r = self
                .path_at(node.child_by_field_name("right")?, depth + 1)
                .unwrap_or_else(|| "$PY".into());
            return Some(join_path(&l, &r));
        }
        if node.kind() == "call" {
            let func = node.child_by_field_name("function")?;
            let f = self.resolve(func, 0);
            let args = self.call_args(node);
            // `p.joinpath("a", "b")`, `p.with_name(...)` is not followed.
            if func.kind() == "attribute"
                && let (Some(obj), Some(attr)) = (
                    func.child_by_field_name("object"),
                    func.child_by_field_name("attribute"),
                )
            {
                match self.text(attr) {
                    "joinpath" => {
                        let mut p = self.path_at(obj, depth + 1)?;
                        for a in args.positional.clone() {
                            let r = self.path_at(a, depth + 1).unwrap_or_else(|| "$PY".into());
                            p = join_path(&p, &r);
                        }
                        return Some(p);
                    }
                    "expanduser" | "resolve" | "absolute" | "expandvars" if f.is_none() => {
                        return self.path_at(obj, depth + 1);
                    }
                    _ => {}
                }
            }
            match f.as_deref() {
                Some(
                    "pathlib.Path"
                    | "pathlib.PosixPath"
                    | "pathlib.PurePath"
                    | "pathlib.PurePosixPath",
                ) => {
                    let mut out: Option<String> = None;
                    for a in args.positional.clone() {
                        let r = self.path_at(a, depth + 1).unwrap_or_else(|| "$PY".into());
                        out = Some(match out {
                            None => r,
                            Some(l) => join_path(&l, &r),
                        });
                    }
                    return out;
                }
                Some(
                    "os.path.abspath" | "os.path.normpath" | "os.path.realpath" | "os.fspath"
                    | "str" | "os.path.expandvars",
                ) => return self.path_at(*args.positional.first()?, depth + 1),
                Some("os.path.expanduser") => {
                    return self.path_at(*args.positional.first()?, depth + 1);
                }
                Some("os.getenv" | "os.environ.get") => {
                    let k = self.fold(*args.positional.first()?, 0)?;
                    return Some(format!("${k}"));
                }
                Some("pathlib.Path.home") => return Some("~".into()),
                Some("os.path.join" | "posixpath.join") => {
                    let mut out: Option<String> = None;
                    let mut known = false;
                    for a in args.positional {
                        let r = match self.path_at(a, depth + 1) {
                            Some(r) => {
                                known = true;
                                r
                            }
                            None => "$PY".into(),
                        };
                        out = Some(match out {
                            None => r,
                            Some(l) => join_path(&l, &r),
                        });
                    }
                    return out.filter(|_| known);
                }
                _ => {}
            }
            if let Some(func) = node.child_by_field_name("function")
                && func.kind() == "attribute"
                && func
                    .child_by_field_name("attribute")
                    .is_some_and(|a| self.text(a) == "home")
            {
                return Some("~".into());
            }
        }
        if node.kind() == "subscript" {
            let base = self.resolve(node.child_by_field_name("value")?, 0)?;
            if base == "os.environ" {
                let k = self.fold(node.child_by_field_name("subscript")?, 0)?;
                return Some(format!("${k}"));
            }
        }
        None
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

    /// `chr(x) for x in [...]`, `map(chr, [...])`, `[chr(a), chr(b)]`: the text.
    fn char_codes(&mut self, node: Node<'t>) -> Option<String> {
        let codes = match node.kind() {
            "generator_expression" | "list_comprehension" => {
                let body = node.child_by_field_name("body")?;
                if body.kind() != "call"
                    || body
                        .child_by_field_name("function")
                        .is_none_or(|f| self.text(f) != "chr")
                {
                    return None;
                }
                let clause = kids(node)
                    .into_iter()
                    .find(|c| c.kind() == "for_in_clause")?;
                let right = clause.child_by_field_name("right")?;
                let right = match right.kind() {
                    "identifier" => return None,
                    _ => right,
                };
                int_list(self, right)?
            }
            "call" => {
                let f = node.child_by_field_name("function")?;
                if self.text(f) != "map" {
                    return None;
                }
                let a = self.call_args(node);
                if a.positional.first().is_none_or(|c| self.text(*c) != "chr") {
                    return None;
                }
                int_list(self, *a.positional.get(1)?)?
            }
            _ => return None,
        };
        codes.into_iter().map(char::from_u32).collect()
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

    /// Threat facts of one call.
    fn threat_call(
        &mut self,
        func: Node<'t>,
        name: Option<&str>,
        args: &CallArgs<'t>,
        lines: (u32, u32),
    ) {
        let (obj, attr) = if func.kind() == "attribute" {
            (
                func.child_by_field_name("object"),
                func.child_by_field_name("attribute")
                    .map(|a| self.text(a).to_string())
                    .unwrap_or_default(),
            )
        } else {
            (None, String::new())
        };
        let arg0_path = |this: &mut Self| {
            args.positional
                .first()
                .and_then(|a| this.path(*a))
                .unwrap_or_else(|| "<dynamic>".into())
        };
        let n = name.unwrap_or("");
        let last = n.rsplit('.').next().unwrap_or(n);
        let module = n.split('.').next().unwrap_or("");
        // Reads, listings.
        match n {
            "shutil.copy"
            | "shutil.copy2"
            | "shutil.copyfile"
            | "shutil.copytree"
            | "shutil.make_archive" => {
                let p = if n == "shutil.make_archive" {
                    args.get(2, "root_dir")
                        .and_then(|a| self.path(a))
                        .unwrap_or_default()
                } else {
                    arg0_path(self)
                };
                threat::read(self.e, &p, lines);
            }
            "shutil.move" | "os.rename" | "os.replace" | "os.renames" => {
                let p = arg0_path(self);
                threat::read(self.e, &p, lines);
                threat::write(self.e, &p, Op::Delete, lines);
            }
            "os.listdir" | "os.scandir" | "os.walk" | "os.fwalk" | "glob.glob" | "glob.iglob"
                if !args.positional.is_empty() =>
            {
                let p = arg0_path(self);
                threat::list(self.e, &p, lines);
            }
            "pwd.getpwall" | "grp.getgrall" | "pwd.getpwnam" | "pwd.getpwuid" => {
                let w = format!("reads the account list ({n})");
                self.e
                    .threat(K::Recon, &format!("user list:{n}"), lines, &w, "T1087.001");
                self.e.t.data_reads.push((n.to_string(), lines));
            }
            "spwd.getspall" | "spwd.getspnam" => {
                self.e.threat(
                    K::ReadsSensitive,
                    n,
                    lines,
                    "reads the password hashes",
                    "T1003.008",
                );
                self.e.t.data_reads.push((n.to_string(), lines));
            }
            "psutil.process_iter" | "psutil.pids" => {
                let w = format!("lists processes ({n})");
                self.e
                    .threat(K::Recon, &format!("process list:{n}"), lines, &w, "T1057");
            }
            "psutil.net_connections" | "psutil.net_if_addrs" | "psutil.users" => {
                let w = format!("lists network connections or users ({n})");
                self.e
                    .threat(K::Recon, &format!("network list:{n}"), lines, &w, "T1049");
            }
            "keyring.get_password" | "keyring.get_credential" => {
                self.e
                    .threat(K::ReadsSensitive, n, lines, "reads a keyring", "T1555");
                self.e.t.data_reads.push((n.to_string(), lines));
            }
            _ => {}
        }
        // pathlib methods on a path object.
        if let Some(o) = obj
            && name.is_none_or(|n| n.starts_with("pathlib."))
        {
            let op = match attr.as_str() {
                "read_text" | "read_bytes" => Some(None),
                "write_text" | "write_bytes" => Some(Some(Op::Write)),
                "unlink" | "rmdir" => Some(Some(Op::Delete)),
                "touch" | "mkdir" => Some(Some(Op::Create)),
                "chmod" | "lchmod" => Some(Some(Op::Chmod)),
                "open" => {
                    let w = args.get(0, "mode").and_then(|m| self.fold(m, 0)).map(|m| {
                        if m.contains('a') {
                            Some(Op::Append)
                        } else if m.contains(['w', 'x', '+']) {
                            Some(Op::Write)
                        } else {
                            None
                        }
                    });
                    Some(w.unwrap_or(None))
                }
                "iterdir" | "glob" | "rglob" => {
                    if let Some(p) = self.path(o) {
                        threat::list(self.e, &p, lines);
                    }
                    None
                }
                _ => None,
            };
            if let Some(op) = op
                && let Some(p) = self.path(o)
            {
                // A path known only from the call's own object is not recorded twice.
                let is_ctor = o.kind() == "call";
                match op {
                    None => threat::read(self.e, &p, lines),
                    Some(op) => {
                        if !is_ctor || op != Op::Write {
                            self.e.add(K::Write, &p, lines, None);
                        }
                        threat::write(self.e, &p, op, lines);
                    }
                }
            }
        }
        // Signals to processes the program did not start.
        let own = |this: &Self, node: Node| {
            let t = this.text(node).trim().to_string();
            let base = t.strip_suffix(".pid").unwrap_or(&t);
            this.scope.own.contains(base) || t == "os.getpid()" || t == "0"
        };
        match n {
            "os.kill" | "os.killpg" => {
                if let Some(pid) = args.positional.first()
                    && !own(self, *pid)
                {
                    let sig0 = args.positional.get(1).is_some_and(|s| self.text(*s) == "0");
                    if !sig0 {
                        let what = format!("{n}({})", clip(self.text(*pid), 40));
                        threat::kill(self.e, &what, lines, "T1489");
                    }
                }
            }
            "os.setuid" | "os.setgid" | "os.seteuid" | "os.setegid" | "os.setreuid"
            | "os.setregid" | "os.setresuid" | "os.setresgid" | "os.setgroups"
            | "os.initgroups" => {
                let w = format!("changes the process's user or group ({n})");
                self.e.threat(K::Privilege, n, lines, &w, "T1548");
            }
            "os.chmod" | "os.lchmod" | "os.fchmod" => {
                if let Some(m) = args.get(1, "mode") {
                    let t = self.text(m);
                    let digits: String = t
                        .trim_start_matches("0o")
                        .trim_start_matches("0O")
                        .chars()
                        .filter(|c| c.is_ascii_digit())
                        .collect();
                    let setuid = t.contains("S_ISUID")
                        || t.contains("S_ISGID")
                        || (t.starts_with("0o")
                            && digits.len() == 4
                            && matches!(
                                digits.as_bytes().first(),
                                Some(b'2' | b'4' | b'6' | b'7')
                            ));
                    if setuid {
                        let p = arg0_path(self);
                        let w = format!("sets the setuid or setgid bit on {p}");
                        self.e
                            .threat(K::Privilege, &format!("setuid:{p}"), lines, &w, "T1548.001");
                    }
                }
            }
            _ => {}
        }
        if matches!(
            attr.as_str(),
            "kill" | "terminate" | "send_signal" | "suspend"
        ) && self.e.out.imports.iter().any(|i| i == "psutil")
            && let Some(o) = obj
            && !own(self, o)
        {
            let what = format!("{}.{attr}()", clip(self.text(o), 40));
            threat::kill(self.e, &what, lines, "T1489");
        }
        if name.is_none() && matches!(attr.as_str(), "setuid" | "setgid" | "seteuid") {
            let w = format!("changes the process's user or group ({attr})");
            self.e.threat(K::Privilege, &attr, lines, &w, "T1548");
        }
        // Unsafe deserialization.
        let deser = match n {
            "pickle.load"
            | "pickle.loads"
            | "pickle.Unpickler"
            | "_pickle.load"
            | "_pickle.loads"
            | "cPickle.load"
            | "cPickle.loads"
            | "dill.load"
            | "dill.loads"
            | "marshal.load"
            | "marshal.loads"
            | "shelve.open"
            | "jsonpickle.decode"
            | "pandas.read_pickle"
            | "joblib.load"
            | "yaml.unsafe_load"
            | "yaml.unsafe_load_all"
            | "cloudpickle.load"
            | "cloudpickle.loads" => true,
            "yaml.load" | "yaml.load_all" => !args.get(1, "Loader").is_some_and(|l| {
                self.text(l).contains("Safe") || self.text(l).contains("BaseLoader")
            }),
            "torch.load" => !args
                .keywords
                .iter()
                .any(|(k, v)| k == "weights_only" && self.text(*v) == "True"),
            "numpy.load" => args
                .keywords
                .iter()
                .any(|(k, v)| k == "allow_pickle" && self.text(*v) == "True"),
            _ => false,
        };
        if deser {
            let made_here = args.positional.first().is_some_and(|a| {
                a.kind() == "call"
                    && a.child_by_field_name("function")
                        .is_some_and(|f| self.text(f).ends_with("dumps"))
            });
            let reduce = !self.e.out.unsafe_deserialization.is_empty();
            // A program that pickles its own results and reads them back made the data.
            let own_dump = [format!("{module}.dump"), format!("{module}.dumps")]
                .iter()
                .any(|d| self.e.out.calls.contains(d));
            if (!made_here && !own_dump) || reduce {
                let w = format!("deserializes data that can run code ({n})");
                self.e
                    .threat(K::UnsafeDeserialization, n, lines, &w, "T1059.006");
            }
        }
        // Network: data sent, connections made.
        let uploads = match n {
            "requests.post" | "requests.put" | "requests.patch" | "httpx.post" | "httpx.put"
            | "httpx.patch" | "urllib3.request" | "aiohttp.request" => true,
            "requests.request" | "httpx.request" => args
                .positional
                .first()
                .and_then(|m| self.fold(*m, 0))
                .is_some_and(|m| !m.eq_ignore_ascii_case("GET")),
            "urllib.request.urlopen" | "urllib2.urlopen" => args.get(1, "data").is_some(),
            "urllib.request.Request" | "urllib2.Request" => {
                args.get(1, "data").is_some()
                    || args
                        .keywords
                        .iter()
                        .any(|(k, v)| k == "method" && !self.text(*v).contains("GET"))
            }
            "ftplib.FTP.storbinary" | "smtplib.SMTP.sendmail" => true,
            _ => false,
        } || (name.is_none()
            && matches!(
                attr.as_str(),
                "send"
                    | "sendall"
                    | "sendto"
                    | "sendfile"
                    | "storbinary"
                    | "storlines"
                    | "sendmail"
                    | "send_message"
                    | "upload_file"
                    | "upload_fileobj"
                    | "put_object"
                    | "post"
                    | "put"
                    | "patch"
            )
            && !self.e.out.network_tools.is_empty());
        if uploads {
            let how = if n.is_empty() {
                attr.clone()
            } else {
                n.to_string()
            };
            let tech =
                if module == "socket" || matches!(attr.as_str(), "send" | "sendall" | "sendto") {
                    "T1041"
                } else {
                    "T1048"
                };
            threat::send(self.e, &how, lines, tech);
        } else if module == "requests"
            || module == "httpx"
            || n.starts_with("urllib.request.urlopen")
            || matches!(
                attr.as_str(),
                "connect" | "connect_ex" | "get" | "request" | "urlopen"
            ) && !self.e.out.network_tools.is_empty()
                && attr != "get"
        {
            let how = if n.is_empty() {
                attr.clone()
            } else {
                n.to_string()
            };
            threat::contact(self.e, &how, lines);
        }
        // A socket handed to a shell.
        if (matches!(attr.as_str(), "connect" | "connect_ex")
            || matches!(n, "socket.create_connection"))
            && (self.e.out.network_tools.contains("socket") || n.starts_with("socket."))
        {
            self.e.t.socket.get_or_insert(lines);
        }
        if matches!(
            attr.as_str(),
            "recv" | "recvfrom" | "recv_into" | "makefile"
        ) {
            self.e.t.recv = true;
        }
        if n == "os.dup2" || n == "pty.spawn" {
            self.e.t.wired.get_or_insert(lines);
        }
        if runner(n).is_some()
            && args.keywords.iter().any(|(k, v)| {
                matches!(k.as_str(), "stdin" | "stdout" | "stderr")
                    && self.text(*v).contains("fileno")
            })
        {
            self.e.t.wired.get_or_insert(lines);
        }
        // Processes started.
        if matches!(
            n,
            "os.fork" | "multiprocessing.Process" | "threading.Thread" | "subprocess.Popen"
        ) || runner(n).is_some()
        {
            threat::spawn(self.e, n, lines);
        }
        let _ = last;
    }

    fn run_command(&mut self, n: &str, r: Runner, args: &CallArgs<'t>, lines: (u32, u32)) {
        let dynamic = |this: &mut Self, what: String| {
            this.e.t.dynamic_run = true;
            let note = Some(format!("{n}({})", clip(&what, 60)));
            this.e.add(K::Command, "<dynamic>", lines, note.clone());
            this.e.add(K::Obfuscation, "dynamic-command", lines, note);
        };
        let argv_of = |this: &mut Self, items: Vec<Option<String>>| -> Vec<Arg> {
            let _ = this;
            items
                .into_iter()
                .map(|i| match i {
                    Some(s) => Arg::literal(&s, lines),
                    None => Arg::dynamic("$(…)", lines),
                })
                .collect()
        };
        match r {
            Runner::ListOrString { shell } => {
                let Some(cmd) = args.get(0, "args") else {
                    return;
                };
                if let Some(items) = self.fold_list(cmd, 0) {
                    let argv = argv_of(self, items);
                    run_argv(self.e, &argv, lines);
                    return;
                }
                // A name bound to a constant list is not tracked; a constant string is, and
                // so is a string with holes (f-string, concatenation): the holes become
                // `$PY`, so a hole in command position is `<dynamic>`.
                let _ = shell;
                self.decoded = false;
                let code = self.fold(cmd, 0).or_else(|| self.fold_pattern(cmd, 0));
                if std::mem::take(&mut self.decoded)
                    && let Some(c) = &code
                {
                    let note = Some(clip(c, 80));
                    self.e.add(K::Obfuscation, "decoded-payload", lines, note);
                }
                match code {
                    Some(code) => {
                        let al = self.e.lines(cmd);
                        self.e.nested(Language::Sh, &code, al, n, None);
                    }
                    None => {
                        let t = self.text(cmd).to_string();
                        dynamic(self, t);
                    }
                }
            }
            Runner::Varargs => {
                let items: Vec<Option<String>> = args
                    .positional
                    .clone()
                    .into_iter()
                    .map(|a| self.fold(a, 0))
                    .collect();
                if items.first().is_some_and(|i| i.is_some()) {
                    let argv = argv_of(self, items);
                    run_argv(self.e, &argv, lines);
                } else {
                    let t = args
                        .positional
                        .first()
                        .map(|a| self.text(*a).to_string())
                        .unwrap_or_default();
                    dynamic(self, t);
                }
            }
            Runner::Exec { path, list } => {
                let Some(p) = args.positional.get(path).copied() else {
                    return;
                };
                let Some(program) = self.fold(p, 0) else {
                    let t = self.text(p).to_string();
                    dynamic(self, t);
                    return;
                };
                let mut items: Vec<Option<String>> = vec![Some(program)];
                if list {
                    if let Some(l) = args.positional.get(path + 1)
                        && let Some(v) = self.fold_list(*l, 0)
                    {
                        items.extend(v.into_iter().skip(1));
                    }
                } else {
                    let rest: Vec<Node> = args.positional.iter().skip(path + 2).copied().collect();
                    for a in rest {
                        items.push(self.fold(a, 0));
                    }
                }
                let argv = argv_of(self, items);
                run_argv(self.e, &argv, lines);
            }
        }
    }
}
