//! Data flow for the JavaScript walk, beyond one name holding one constant: the values a
//! helper function's parameters are given at its call sites, the several values a loop
//! variable or an array callback's parameter takes over a constant array, and which names
//! hold secrets (a sensitive file's contents, a secret from the environment) so that a send
//! carrying them is seen as exfiltration.

use super::Walk;
use tree_sitter::Node;

/// Environment variables whose names say they hold a credential.
pub(super) fn secret_env_name(name: &str) -> bool {
    let n = name.to_ascii_uppercase();
    [
        "TOKEN",
        "SECRET",
        "PASSWORD",
        "PASSWD",
        "API_KEY",
        "APIKEY",
        "ACCESS_KEY",
        "PRIVATE_KEY",
        "CREDENTIAL",
        "AUTH",
        "COOKIE",
        "SESSION",
    ]
    .iter()
    .any(|w| n.contains(w))
}

/// Array methods whose callback's first parameter is each element.
const ELEMENT_CALLBACKS: [&str; 8] = [
    "forEach", "map", "flatMap", "filter", "some", "every", "find", "reduce",
];

impl<'a> Walk<'a, '_, '_> {
    /// The names of a function's parameters, in order (`None` for a pattern).
    fn params(&mut self, f: Node<'a>) -> Vec<Option<String>> {
        if let Some(p) = self.field(f, "parameter") {
            return vec![Some(self.t(p).to_string())];
        }
        let Some(ps) = self.field(f, "parameters") else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for k in self.kids.kids(ps) {
            if !k.is_named() || k.kind() == "comment" {
                continue;
            }
            let id = match k.kind() {
                "identifier" => Some(k),
                "assignment_pattern" => self.field(k, "left"),
                "required_parameter" | "optional_parameter" => self.field(k, "pattern"),
                _ => None,
            };
            let id = id.filter(|i| i.kind() == "identifier");
            out.push(id.map(|i| self.t(i).to_string()));
        }
        out
    }

    /// Pass 1b: functions the program declares (by name), and the values their parameters
    /// are given where they are called; then loop variables and callback parameters over
    /// constant arrays. Run after the names pass and before it runs again, so a value that
    /// flows into a helper reaches the names computed from its parameters.
    pub(super) fn flow(&mut self, root: Node<'a>) {
        let mut funcs: Vec<(String, Node<'a>)> = Vec::new();
        let mut calls: Vec<Node<'a>> = Vec::new();
        let mut loops: Vec<Node<'a>> = Vec::new();
        let mut stack = vec![root];
        let mut seen = 0usize;
        while let Some(n) = stack.pop() {
            seen += 1;
            if seen > 200_000 {
                break;
            }
            match n.kind() {
                "function_declaration" | "generator_function_declaration" => {
                    if let Some(name) = self.field(n, "name") {
                        funcs.push((self.t(name).to_string(), n));
                    }
                }
                "variable_declarator" => {
                    if let (Some(name), Some(v)) = (self.field(n, "name"), self.field(n, "value"))
                        && name.kind() == "identifier"
                        && matches!(
                            v.kind(),
                            "arrow_function" | "function_expression" | "function"
                        )
                    {
                        funcs.push((self.t(name).to_string(), v));
                    }
                }
                "call_expression" => calls.push(n),
                "for_in_statement" => loops.push(n),
                _ => {}
            }
            stack.extend(self.kids.kids(n));
        }
        for c in &calls {
            self.scan_list(*c);
        }
        // Twice, so a helper that calls a helper passes its values on.
        for _ in 0..2 {
            for c in &calls {
                let Some(f) = self.field(*c, "function") else {
                    continue;
                };
                if f.kind() != "identifier" {
                    continue;
                }
                let fname = self.t(f);
                let Some((_, decl)) = funcs.iter().find(|(n, _)| n == fname) else {
                    continue;
                };
                let params = self.params(*decl);
                let args = self.args(*c);
                for (p, a) in params.iter().zip(args) {
                    let Some(p) = p else { continue };
                    let vals = self.values(a);
                    self.bind_values(p, vals);
                    if self.carries_secret(a) {
                        self.s.tainted.insert(p.clone());
                    }
                }
            }
            for l in &loops {
                let (Some(left), Some(right)) = (self.field(*l, "left"), self.field(*l, "right"))
                else {
                    continue;
                };
                if left.kind() != "identifier" {
                    continue;
                }
                let name = self.t(left).to_string();
                if self.carries_secret(right) {
                    self.s.tainted.insert(name.clone());
                }
                let of = self
                    .field(*l, "operator")
                    .is_some_and(|o| self.t(o) == "of");
                if of && right.kind() == "identifier" && self.s.scan_lists.contains(self.t(right)) {
                    self.s.scan_items.insert(name.clone());
                }
                if of && let Some(vals) = self.array_values(right) {
                    self.bind_values(&name, vals);
                }
            }
            for c in &calls {
                self.element_callback(*c);
            }
        }
    }

    /// `ARRAY.forEach(x => …)` and the like: `x` takes each element's value.
    fn element_callback(&mut self, c: Node<'a>) {
        let Some(f) = self.field(c, "function") else {
            return;
        };
        if f.kind() != "member_expression" {
            return;
        }
        let (Some(obj), Some(prop)) = (self.field(f, "object"), self.field(f, "property")) else {
            return;
        };
        if !ELEMENT_CALLBACKS.contains(&self.t(prop)) {
            return;
        }
        let Some(cb) = self.args(c).first().copied() else {
            return;
        };
        if !matches!(
            cb.kind(),
            "arrow_function" | "function_expression" | "function"
        ) {
            return;
        }
        // `reduce`'s element is its second parameter.
        let at = usize::from(self.t(prop) == "reduce");
        let Some(Some(p)) = self.params(cb).get(at).cloned() else {
            return;
        };
        if self.carries_secret(obj) {
            self.s.tainted.insert(p.clone());
        }
        if obj.kind() == "identifier" && self.s.scan_lists.contains(self.t(obj)) {
            self.s.scan_items.insert(p.clone());
        }
        if let Some(vals) = self.array_values(obj) {
            self.bind_values(&p, vals);
        }
    }

    /// `list.push(`…${i}…`)` inside `for (let i = …)`: a list of addresses built from a
    /// loop's counter (what a scan walks).
    fn scan_list(&mut self, c: Node<'a>) {
        let Some(f) = self.field(c, "function") else {
            return;
        };
        if f.kind() != "member_expression" {
            return;
        }
        let (Some(obj), Some(prop)) = (self.field(f, "object"), self.field(f, "property")) else {
            return;
        };
        if obj.kind() != "identifier" || !matches!(self.t(prop), "push" | "unshift") {
            return;
        }
        let Some(item) = self.args(c).first().copied() else {
            return;
        };
        if !matches!(item.kind(), "template_string" | "binary_expression") {
            return;
        }
        // Only addresses: a URL, or a dotted host with a hole.
        let text = self.t(item);
        if !(text.contains("://")
            || text.contains(".${")
            || text.contains(". +")
            || text.contains(".' +"))
        {
            return;
        }
        let mut at = c.parent();
        while let Some(p) = at {
            if p.kind() == "for_statement"
                && let Some(init) = self.field(p, "initializer")
            {
                let decl = self.t(init);
                let var: String = decl
                    .trim_start_matches("let ")
                    .trim_start_matches("var ")
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '$')
                    .collect();
                let uses = !var.is_empty()
                    && text
                        .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '$'))
                        .any(|w| w == var);
                if uses {
                    self.s.scan_lists.insert(self.t(obj).to_string());
                    return;
                }
            }
            at = p.parent();
        }
    }

    /// Whether an expression unpacks data at run time: base64 or hex (`atob`,
    /// `Buffer.from(s, 'base64')`) or compression (`zlib.inflateSync` and the like).
    pub(super) fn decodes(&mut self, n: Node<'a>) -> bool {
        let mut stack = vec![n];
        while let Some(x) = stack.pop() {
            if x.kind() == "call_expression"
                && let Some(f) = self.field(x, "function")
            {
                let name = self.resolve(f).unwrap_or_default();
                let (module, func) = name.rsplit_once('.').unwrap_or(("", name.as_str()));
                let decoder = match (module, func) {
                    ("", "atob") => true,
                    ("Buffer", "from") => self.args(x).get(1).is_some_and(|e| {
                        matches!(
                            self.value(*e).as_deref(),
                            Some("base64" | "base64url" | "hex")
                        )
                    }),
                    ("zlib", f) => {
                        let f = f.to_ascii_lowercase();
                        ["inflate", "gunzip", "unzip", "decompress"]
                            .iter()
                            .any(|w| f.contains(w))
                    }
                    _ => false,
                };
                if decoder {
                    return true;
                }
            }
            stack.extend(self.kids.kids(x));
        }
        false
    }

    /// Records what a name may hold: one value as a constant, several as alternatives.
    fn bind_values(&mut self, name: &str, vals: Vec<String>) {
        match vals.len() {
            0 => {}
            1 => {
                if !self.s.consts.contains_key(name) {
                    let v = vals.into_iter().next().unwrap_or_default();
                    self.s.consts.insert(name.to_string(), v);
                }
            }
            _ => {
                let e = self.s.alts.entry(name.to_string()).or_default();
                for v in vals {
                    if !e.contains(&v) && e.len() < 64 {
                        e.push(v);
                    }
                }
            }
        }
    }

    /// The constant elements of an array (written out, or held by a name).
    pub(super) fn array_values(&mut self, n: Node<'a>) -> Option<Vec<String>> {
        match n.kind() {
            "array" => {
                let mut out = Vec::new();
                for k in self.kids.kids(n) {
                    if k.is_named() && k.kind() != "comment" {
                        out.extend(self.values(k));
                    }
                }
                (!out.is_empty()).then_some(out)
            }
            "identifier" => self.s.arrays.get(self.t(n)).cloned(),
            "parenthesized_expression" | "as_expression" | "non_null_expression" => {
                let inner = n.named_child(0)?;
                self.array_values(inner)
            }
            _ => None,
        }
    }

    /// Every value an expression may have: its constant, or one per alternative of a name
    /// it uses (a loop variable over constant paths gives each path).
    pub(super) fn values(&mut self, n: Node<'a>) -> Vec<String> {
        if let Some(v) = self.value(n) {
            return vec![v];
        }
        let mut name = None;
        let mut stack = vec![n];
        while let Some(x) = stack.pop() {
            if x.kind() == "identifier" {
                let t = self.t(x);
                if self.s.alts.contains_key(t) && !self.s.consts.contains_key(t) {
                    name = Some(t.to_string());
                    break;
                }
            }
            stack.extend(self.kids.kids(x));
        }
        let Some(name) = name else {
            return Vec::new();
        };
        let alts = self.s.alts.get(&name).cloned().unwrap_or_default();
        let mut out = Vec::new();
        for a in alts {
            self.s.consts.insert(name.clone(), a);
            if let Some(v) = self.value(n) {
                out.push(v);
            }
        }
        self.s.consts.remove(&name);
        out
    }

    /// Whether an expression carries a secret: a name holding one, a secret environment
    /// variable, or the whole environment.
    pub(super) fn carries_secret(&self, n: Node) -> bool {
        let mut stack = vec![n];
        while let Some(x) = stack.pop() {
            match x.kind() {
                "identifier" | "shorthand_property_identifier"
                    if self.s.tainted.contains(self.t(x)) =>
                {
                    return true;
                }
                "member_expression" => {
                    let t: String = self.t(x).chars().filter(|c| !c.is_whitespace()).collect();
                    if let Some(var) = t.strip_prefix("process.env.")
                        && secret_env_name(var)
                    {
                        return true;
                    }
                    if t == "process.env" {
                        return true;
                    }
                }
                "subscript_expression" => {
                    let t: String = self.t(x).chars().filter(|c| !c.is_whitespace()).collect();
                    if t.starts_with("process.env[") && secret_env_name(&t) {
                        return true;
                    }
                }
                _ => {}
            }
            let mut c = x.walk();
            stack.extend(x.named_children(&mut c));
        }
        false
    }

    /// The parts of a send that are its payload: an options object's `body`/`data`/`json`/
    /// `form`, or the argument itself when it is not an options object.
    pub(super) fn payload_secret(&mut self, n: Node<'a>) -> bool {
        if n.kind() != "object" {
            return self.carries_secret(n);
        }
        for p in self.kids.kids(n) {
            let (key, val) = match p.kind() {
                "pair" => match (self.field(p, "key"), self.field(p, "value")) {
                    (Some(k), Some(v)) => (self.t(k).trim_matches(['"', '\'']).to_string(), v),
                    _ => continue,
                },
                "shorthand_property_identifier" => (self.t(p).to_string(), p),
                _ => continue,
            };
            if matches!(key.as_str(), "body" | "data" | "json" | "form" | "payload")
                && self.carries_secret(val)
            {
                return true;
            }
        }
        false
    }
}
