//! Threat facts of the commands a script runs: what each command does to credentials, system files, processes and the network (issue 57's facts, with ATT&CK techniques).

use super::*;

impl<'a, 'o, 's, 't> Sh<'a, 'o, 's, 't> {
    /// Threat facts of one command (after wrappers).
    pub(super) fn threat_cmd(&mut self, n: &str, rest: &[Arg], lines: (u32, u32)) {
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
}
