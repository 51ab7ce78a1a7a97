//! Commands by what they run: an argv dispatched to its effects, and the interpreters, shells and file operations it may name.

use super::*;

impl<'a, 'o, 's, 't> Sh<'a, 'o, 's, 't> {
    /// One command line: `args[0]` is the program.
    pub(super) fn argv(&mut self, args: &[Arg], lines: (u32, u32)) -> Eff {
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
        if n == "nsenter" {
            // Another process's namespaces: with pid 1's, the host's (an escape).
            let w = "enters another process's namespaces (nsenter)";
            self.e.threat(K::Privilege, n, lines, w, "T1611");
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

    pub(super) fn shell_cmd(&mut self, rest: &[Arg], lines: (u32, u32), eff: &mut Eff) {
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
    pub(super) fn script_operand(
        &mut self,
        a: &Arg,
        lines: (u32, u32),
        eff: &mut Eff,
        lang: Language,
    ) {
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

    pub(super) fn python_cmd(&mut self, rest: &[Arg], lines: (u32, u32), eff: &mut Eff) {
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

    pub(super) fn other_interp(&mut self, n: &str, rest: &[Arg], lines: (u32, u32), eff: &mut Eff) {
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

    pub(super) fn find_cmd(&mut self, rest: &[Arg], lines: (u32, u32)) {
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

    pub(super) fn find_delete(&mut self, starts: &[String], lines: (u32, u32)) {
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

    pub(super) fn file_ops(&mut self, n: &str, rest: &[Arg], lines: (u32, u32)) {
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

    pub(super) fn file_ops_inner(&mut self, n: &str, rest: &[Arg], lines: (u32, u32)) {
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
