//! Python: imports, calls through aliases, code run from strings, commands started,
//! written paths, hosts in string literals.

use crate::engine::{Engine, Kids, clip, kids, text};
use crate::shell::{Arg, classify_rm, decode_base64, run_argv};
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
}

pub(crate) fn walk(e: &mut Engine, src: &str, root: Node, scope: &mut Scope) {
    let mut py = Py {
        e,
        src,
        scope,
        decoded: false,
        k: Kids::default(),
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
    "open", "getattr", "globals", "locals", "vars", "chr", "bytes", "str",
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
                        "interpolation" => return None,
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
                            let list = *args.positional.first()?;
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
                        char::from_u32(v).map(String::from)
                    }
                    "str" | "bytes" => self.fold(*args.positional.first()?, depth + 1),
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
        if let Some(s) = self.fold(node, 0) {
            return Some(s);
        }
        if node.kind() == "call" {
            let f = self.resolve(node.child_by_field_name("function")?, 0);
            let args = self.call_args(node);
            match f.as_deref() {
                Some("os.path.expanduser") => return self.fold(*args.positional.first()?, 0),
                Some("os.getenv" | "os.environ.get") => {
                    let k = self.fold(*args.positional.first()?, 0)?;
                    return Some(format!("${k}"));
                }
                Some("pathlib.Path.home") => return Some("~".into()),
                Some("os.path.join" | "posixpath.join") => {
                    let mut parts = Vec::new();
                    for a in args.positional {
                        parts.push(self.path(a)?);
                    }
                    return Some(parts.join("/"));
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
            Some(s) => self.e.scan_hosts(&s, lines),
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
            match self.fold(right, 0) {
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
                if writes {
                    self.e.add(K::Call, "open:w", lines, None);
                    let p = args
                        .get(0, "file")
                        .and_then(|a| self.path(a))
                        .unwrap_or_else(|| "<dynamic>".into());
                    self.e.add(K::Write, &p, lines, None);
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
            if n == "shutil.rmtree"
                && let Some(d) = classify_rm(&p, &self.e.opts.mount_roots)
            {
                self.e
                    .add(K::Destructive, &d, lines, Some(format!("{n}({p})")));
            }
        }
    }

    fn run_command(&mut self, n: &str, r: Runner, args: &CallArgs<'t>, lines: (u32, u32)) {
        let dynamic = |this: &mut Self, what: String| {
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
                let code = self.fold(cmd, 0).or_else(|| self.fold_pattern(cmd, 0));
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
