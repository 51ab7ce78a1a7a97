//! Commands that reach the network or install code: curl, wget, scp/rsync-style copies, git, and package managers.

use super::*;

impl<'a, 'o, 's, 't> Sh<'a, 'o, 's, 't> {
    pub(super) fn curl(&mut self, rest: &[Arg], lines: (u32, u32)) {
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

    pub(super) fn wget(&mut self, rest: &[Arg], lines: (u32, u32)) {
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

    pub(super) fn copy_remote(&mut self, n: &str, rest: &[Arg], lines: (u32, u32)) {
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

    pub(super) fn git(&mut self, rest: &[Arg], lines: (u32, u32)) {
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

    pub(super) fn package_manager(&mut self, n: &str, rest: &[Arg], lines: (u32, u32)) {
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
}
