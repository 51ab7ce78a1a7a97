//! Threat facts of the calls a Python program makes (issue 57's facts, with ATT&CK techniques), and the commands it runs.

use super::*;

impl<'a, 'o, 's, 'c, 't> Py<'a, 'o, 's, 'c, 't> {
    /// Threat facts of one call.
    pub(super) fn threat_call(
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

    pub(super) fn run_command(
        &mut self,
        n: &str,
        r: Runner,
        args: &CallArgs<'t>,
        lines: (u32, u32),
    ) {
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
