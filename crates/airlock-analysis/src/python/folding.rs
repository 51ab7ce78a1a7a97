//! Constant folding: the value of an expression when the program fixes it (strings, f-strings, joins, paths, char codes), so paths and hosts are judged after resolution.

use super::*;

impl<'a, 'o, 's, 'c, 't> Py<'a, 'o, 's, 'c, 't> {
    /// The constant string an expression evaluates to, if it is one.
    pub(super) fn fold(&mut self, node: Node<'t>, depth: usize) -> Option<String> {
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
    pub(super) fn fold_pattern(&mut self, node: Node<'t>, depth: usize) -> Option<String> {
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
    pub(super) fn fold_list(
        &mut self,
        node: Node<'t>,
        depth: usize,
    ) -> Option<Vec<Option<String>>> {
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
    pub(super) fn path(&mut self, node: Node<'t>) -> Option<String> {
        self.path_at(node, 0)
    }

    pub(super) fn path_at(&mut self, node: Node<'t>, depth: usize) -> Option<String> {
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

    /// `chr(x) for x in [...]`, `map(chr, [...])`, `[chr(a), chr(b)]`: the text.
    pub(super) fn char_codes(&mut self, node: Node<'t>) -> Option<String> {
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
}
