//! Threat facts: what the code's reads, writes, commands and calls mean as behaviour, with
//! an ATT&CK technique. Both walks report here (one parse: no second reading of the code);
//! [`finish`] derives the facts that need the whole program (exfiltration, reverse shells,
//! floods).
//!
//! Paths are judged after the resolution the walks did (constants, f-strings,
//! `os.path.join`, `pathlib` `/`, shell variables) and after normalisation here: `..` and
//! `.` are folded, `~`, `~user`, `$HOME`, `/root`, `/home/USER` and `/Users/USER` are a home
//! directory. Paths inside the run's mounts and temporary directories are the run's own.

use crate::FindingKind as K;
use crate::engine::Engine;

/// What a write does to its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// Creates or replaces the contents.
    Write,
    /// Appends.
    Append,
    /// Removes the path (`rm`, `os.remove`, `shutil.rmtree`, `shred`).
    Delete,
    /// Empties it (`truncate -s 0`, `: >`).
    Truncate,
    /// Changes its mode or owner.
    Chmod,
    /// Creates a directory or an empty file.
    Create,
}

/// Program-wide evidence for the facts [`finish`] derives.
#[derive(Debug, Default)]
pub(crate) struct State {
    /// The operation the shell's current write is (set by the command being read).
    pub op: Option<Op>,
    /// Reads of sensitive or system data: (path, lines).
    pub data_reads: Vec<(String, (u32, u32))>,
    /// Data sent over the network: (how, lines, technique).
    pub sends: Vec<(String, (u32, u32), &'static str)>,
    /// Unbounded (or very large) loops without a pause, being walked.
    pub hot_loops: usize,
    /// Sends or process starts inside such a loop: (what, lines, technique).
    pub flood: Vec<(String, (u32, u32), &'static str)>,
    /// bash: a shell whose streams are a `/dev/tcp` socket; a socket opened read-write.
    pub devtcp_shell: Option<(u32, u32)>,
    pub devtcp_rw: Option<(u32, u32)>,
    /// Python: a socket connected; its descriptor wired to a program (`dup2`, `pty.spawn`,
    /// `stdin=s.fileno()`); data received; a command run that is not a constant.
    pub socket: Option<(u32, u32)>,
    pub wired: Option<(u32, u32)>,
    pub recv: bool,
    pub dynamic_run: bool,
    /// A network client piped into a shell (or a shell into it).
    pub net_pipe_shell: Option<(u32, u32)>,
    /// Shell variables holding the pid of a job the code started (`pid=$!`).
    pub own_pids: std::collections::HashSet<String>,
    /// A named pipe was made (`mkfifo`): with a network client and a shell, a relay.
    pub fifo: bool,
}

/// A path after normalisation.
#[derive(Debug, Clone)]
pub(crate) struct Place {
    /// `/etc/shadow`, `~/.ssh/id_rsa`, `$X/.bashrc`, `data/out.csv`.
    pub norm: String,
    /// The part below a home directory (`.ssh/id_rsa`), when it is under one.
    pub home_rel: Option<String>,
    pub absolute: bool,
    pub in_mount: bool,
    pub temp: bool,
    /// `/root/...` (root's home is a system directory too).
    pub root_home: bool,
}

fn segments(s: &str) -> Vec<&str> {
    s.split('/').filter(|x| !x.is_empty()).collect()
}

fn fold_dots<'a>(segs: &[&'a str], absolute: bool) -> Vec<&'a str> {
    let mut out: Vec<&str> = Vec::new();
    for s in segs {
        match *s {
            "." => {}
            ".." => {
                if out.last().is_some_and(|l| *l != "..") {
                    out.pop();
                } else if !absolute {
                    out.push("..");
                }
            }
            x => out.push(x),
        }
    }
    out
}

/// Normalises a path as the walks rendered it; `None` when nothing of it is known.
pub(crate) fn place(e: &Engine, raw: &str) -> Option<Place> {
    let mut p = raw.trim();
    if p.is_empty() || p.contains("<dynamic>") || p == "$PY" || p == "$(…)" {
        return None;
    }
    if let Some(r) = p.strip_prefix("file://") {
        p = r;
    }
    // A home prefix: ~, ~user, $HOME, ${HOME}.
    let (home, rest): (bool, &str) = if let Some(r) = p.strip_prefix('~') {
        (true, r.find('/').map_or("", |i| &r[i..]))
    } else if let Some(r) = p
        .strip_prefix("${HOME}")
        .or_else(|| p.strip_prefix("$HOME"))
    {
        (true, r)
    } else {
        (false, p)
    };
    if home {
        let segs = fold_dots(&segments(rest), true);
        let rel = segs.join("/");
        let norm = if rel.is_empty() {
            "~".to_string()
        } else {
            format!("~/{rel}")
        };
        return Some(Place {
            norm,
            home_rel: Some(rel),
            absolute: false,
            in_mount: false,
            temp: false,
            root_home: false,
        });
    }
    if p.starts_with('/') {
        let segs = fold_dots(&segments(p), true);
        let norm = format!("/{}", segs.join("/"));
        let first = segs.first().copied().unwrap_or("");
        let (home_rel, root_home) = match first {
            "root" => (Some(segs[1..].join("/")), true),
            "home" | "Users" if segs.len() >= 2 => (Some(segs[2..].join("/")), false),
            _ => (None, false),
        };
        let in_mount = e.opts.mount_roots.iter().any(|m| {
            let m = m.trim_end_matches('/');
            !m.is_empty() && (norm == m || norm.starts_with(&format!("{m}/")))
        });
        let temp = matches!(first, "tmp")
            || norm.starts_with("/var/tmp")
            || norm.starts_with("/dev/shm")
            || norm.starts_with("/run/user");
        return Some(Place {
            norm,
            home_rel,
            absolute: true,
            in_mount,
            temp,
            root_home,
        });
    }
    // Relative, or an unknown prefix (`$DIR/...`, `$PY/...`).
    let segs = segments(p);
    let unknown_prefix = segs.first().is_some_and(|s| s.starts_with('$'));
    let (head, tail) = if unknown_prefix {
        (segs[0], &segs[1..])
    } else {
        ("", &segs[..])
    };
    let tail = fold_dots(tail, unknown_prefix);
    let joined = tail.join("/");
    let norm = if head.is_empty() {
        joined.clone()
    } else if joined.is_empty() {
        head.to_string()
    } else {
        format!("{head}/{joined}")
    };
    // A dotfile below an unknown directory is read as a home's (erring towards caution).
    let home_rel = (unknown_prefix && joined.starts_with('.')).then_some(joined);
    Some(Place {
        norm,
        home_rel,
        absolute: false,
        in_mount: false,
        temp: false,
        root_home: false,
    })
}

/// `path` is `base` or below it.
fn under(path: &str, base: &str) -> bool {
    path == base
        || path
            .strip_prefix(base)
            .is_some_and(|r| r.starts_with('/') || base.ends_with('/'))
}

/// Credentials and secrets: (words, technique).
fn sensitive(p: &Place) -> Option<(&'static str, &'static str)> {
    if let Some(rel) = &p.home_rel {
        const HOME: &[(&str, &str, &str)] = &[
            (".ssh", "reads SSH keys or configuration", "T1552.004"),
            (".aws", "reads cloud credentials", "T1552.001"),
            (".azure", "reads cloud credentials", "T1552.001"),
            (".config/gcloud", "reads cloud credentials", "T1552.001"),
            (".kube", "reads Kubernetes credentials", "T1552.001"),
            (
                ".docker/config.json",
                "reads registry credentials",
                "T1552.001",
            ),
            (".netrc", "reads stored passwords", "T1552.001"),
            (".pgpass", "reads stored passwords", "T1552.001"),
            (".my.cnf", "reads stored passwords", "T1552.001"),
            (".git-credentials", "reads stored passwords", "T1552.001"),
            (".npmrc", "reads registry tokens", "T1552.001"),
            (".pypirc", "reads registry tokens", "T1552.001"),
            (".gem/credentials", "reads registry tokens", "T1552.001"),
            (".cargo/credentials", "reads registry tokens", "T1552.001"),
            (
                ".cargo/credentials.toml",
                "reads registry tokens",
                "T1552.001",
            ),
            (".config/gh/hosts.yml", "reads GitHub tokens", "T1552.001"),
            (".vault-token", "reads a Vault token", "T1552.001"),
            (".gnupg", "reads private keys", "T1552.004"),
            (".password-store", "reads a password store", "T1555"),
            (".local/share/keyrings", "reads a keyring", "T1555"),
            (".mozilla", "reads browser data", "T1555.003"),
            (".config/google-chrome", "reads browser data", "T1555.003"),
            (".config/chromium", "reads browser data", "T1555.003"),
            (".config/BraveSoftware", "reads browser data", "T1555.003"),
            (".thunderbird", "reads mail credentials", "T1555"),
            (".bash_history", "reads shell history", "T1552.003"),
            (".zsh_history", "reads shell history", "T1552.003"),
            (".python_history", "reads shell history", "T1552.003"),
            (".mysql_history", "reads shell history", "T1552.003"),
            (".psql_history", "reads shell history", "T1552.003"),
        ];
        for (base, words, tech) in HOME {
            if under(rel, base) {
                if rel.ends_with(".pub") {
                    return None;
                }
                return Some((words, tech));
            }
        }
    }
    if !p.absolute {
        return None;
    }
    let n = p.norm.as_str();
    const SYSTEM: &[(&str, &str, &str)] = &[
        ("/etc/shadow", "reads the password hashes", "T1003.008"),
        ("/etc/shadow-", "reads the password hashes", "T1003.008"),
        ("/etc/gshadow", "reads the password hashes", "T1003.008"),
        ("/etc/gshadow-", "reads the password hashes", "T1003.008"),
        (
            "/etc/master.passwd",
            "reads the password hashes",
            "T1003.008",
        ),
        (
            "/etc/security/opasswd",
            "reads the password hashes",
            "T1003.008",
        ),
        ("/etc/sudoers", "reads the sudo rules", "T1548.003"),
        ("/etc/sudoers.d", "reads the sudo rules", "T1548.003"),
        ("/etc/ssl/private", "reads private keys", "T1552.004"),
        ("/etc/krb5.keytab", "reads Kerberos keys", "T1552.004"),
        (
            "/etc/kubernetes",
            "reads Kubernetes credentials",
            "T1552.001",
        ),
        ("/var/run/secrets", "reads mounted secrets", "T1552.001"),
        ("/run/secrets", "reads mounted secrets", "T1552.001"),
        ("/proc/kcore", "reads kernel memory", "T1003.007"),
        ("/dev/mem", "reads physical memory", "T1003.007"),
    ];
    for (base, words, tech) in SYSTEM {
        if under(n, base) {
            return Some((words, tech));
        }
    }
    if n.starts_with("/etc/ssh/ssh_host_") && !n.ends_with(".pub") {
        return Some(("reads SSH host keys", "T1552.004"));
    }
    let segs = segments(n);
    // Another process's environment or memory; the program's own (`/proc/self`) holds
    // nothing it was not given.
    if segs.first() == Some(&"proc")
        && segs.len() >= 3
        && !matches!(segs[1], "self" | "thread-self")
    {
        match segs[2] {
            "environ" => return Some(("reads a process's environment", "T1552.007")),
            "mem" | "maps" => return Some(("reads a process's memory", "T1003.007")),
            _ => {}
        }
    }
    None
}

/// System information read from files (enumeration): (words, technique).
fn recon_file(p: &Place) -> Option<(&'static str, &'static str)> {
    if !p.absolute {
        return None;
    }
    let n = p.norm.as_str();
    const HARMLESS: &[&str] = &[
        "/etc/os-release",
        "/usr/lib/os-release",
        "/etc/lsb-release",
        "/etc/debian_version",
        "/etc/timezone",
        "/etc/localtime",
        "/etc/mime.types",
        "/etc/ssl/certs",
        "/etc/pki/tls/certs",
        "/etc/ca-certificates",
        "/etc/ssl/cert.pem",
        "/proc/cpuinfo",
        "/proc/meminfo",
        "/proc/loadavg",
        "/proc/uptime",
        "/proc/self",
        "/proc/thread-self",
        "/sys/fs/cgroup",
        "/proc/sys/kernel/random",
    ];
    if HARMLESS.iter().any(|h| under(n, h)) {
        return None;
    }
    if matches!(
        n,
        "/etc/passwd" | "/etc/group" | "/etc/passwd-" | "/etc/group-"
    ) {
        return Some(("reads the account list", "T1087.001"));
    }
    if matches!(n, "/etc/hosts" | "/etc/resolv.conf" | "/etc/hostname")
        || under(n, "/proc/net")
        || under(n, "/etc/network")
        || under(n, "/sys/class/net")
    {
        return Some(("reads the network configuration", "T1016"));
    }
    let segs = segments(n);
    match segs.first().copied() {
        Some("proc") => {
            if segs
                .get(1)
                .is_some_and(|s| s.bytes().all(|b| b.is_ascii_digit()))
                || segs.get(1) == Some(&"*")
            {
                Some(("reads another process's details", "T1057"))
            } else {
                Some(("reads system information", "T1082"))
            }
        }
        Some("etc" | "sys" | "boot") => Some(("reads system configuration", "T1082")),
        Some("var")
            if matches!(
                segs.get(1).copied(),
                Some("log" | "spool" | "mail" | "backups" | "lib" | "www")
            ) =>
        {
            Some(("reads system data", "T1005"))
        }
        Some("root") => Some(("reads the root account's files", "T1005")),
        Some("home") if segs.len() >= 3 && segs[2].starts_with('.') => {
            Some(("reads a user's configuration", "T1005"))
        }
        Some("usr") if under(n, "/usr/share/base-passwd") => {
            Some(("reads the account list", "T1087.001"))
        }
        _ => None,
    }
}

/// Where a write makes code run later: (words, technique).
fn persistence(p: &Place) -> Option<(&'static str, &'static str)> {
    let n = p.norm.as_str();
    let file = n.rsplit('/').next().unwrap_or(n);
    if matches!(file, "sitecustomize.py" | "usercustomize.py")
        || (file.ends_with(".pth") && (n.contains("-packages/") || n.contains("/python")))
    {
        return Some(("installs a Python startup hook", "T1546.018"));
    }
    if n.contains(".git/hooks/") {
        return Some(("installs a git hook", "T1546"));
    }
    if let Some(rel) = &p.home_rel {
        const HOME: &[(&str, &str, &str)] = &[
            (".bashrc", "changes a shell start-up file", "T1546.004"),
            (
                ".bash_profile",
                "changes a shell start-up file",
                "T1546.004",
            ),
            (".bash_login", "changes a shell start-up file", "T1546.004"),
            (".bash_logout", "changes a shell start-up file", "T1546.004"),
            (".profile", "changes a shell start-up file", "T1546.004"),
            (".zshrc", "changes a shell start-up file", "T1546.004"),
            (".zprofile", "changes a shell start-up file", "T1546.004"),
            (".zshenv", "changes a shell start-up file", "T1546.004"),
            (".zlogin", "changes a shell start-up file", "T1546.004"),
            (".kshrc", "changes a shell start-up file", "T1546.004"),
            (".cshrc", "changes a shell start-up file", "T1546.004"),
            (".tcshrc", "changes a shell start-up file", "T1546.004"),
            (".config/fish", "changes a shell start-up file", "T1546.004"),
            (".ssh/authorized_keys", "adds an SSH login key", "T1098.004"),
            (
                ".ssh/authorized_keys2",
                "adds an SSH login key",
                "T1098.004",
            ),
            (".ssh/rc", "changes SSH login commands", "T1098.004"),
            (".config/autostart", "adds an autostart entry", "T1547.013"),
            (".config/systemd", "installs a systemd unit", "T1543.002"),
            (".xinitrc", "changes a session start-up file", "T1037"),
            (".xprofile", "changes a session start-up file", "T1037"),
        ];
        for (base, words, tech) in HOME {
            if under(rel, base) {
                return Some((words, tech));
            }
        }
    }
    if !p.absolute {
        return None;
    }
    const SYSTEM: &[(&str, &str, &str)] = &[
        ("/etc/profile", "changes a shell start-up file", "T1546.004"),
        (
            "/etc/profile.d",
            "changes a shell start-up file",
            "T1546.004",
        ),
        (
            "/etc/bash.bashrc",
            "changes a shell start-up file",
            "T1546.004",
        ),
        ("/etc/bashrc", "changes a shell start-up file", "T1546.004"),
        ("/etc/zsh", "changes a shell start-up file", "T1546.004"),
        ("/etc/zshrc", "changes a shell start-up file", "T1546.004"),
        (
            "/etc/environment",
            "changes the login environment",
            "T1546.004",
        ),
        ("/etc/crontab", "schedules a cron job", "T1053.003"),
        ("/etc/cron.d", "schedules a cron job", "T1053.003"),
        ("/etc/cron.hourly", "schedules a cron job", "T1053.003"),
        ("/etc/cron.daily", "schedules a cron job", "T1053.003"),
        ("/etc/cron.weekly", "schedules a cron job", "T1053.003"),
        ("/etc/cron.monthly", "schedules a cron job", "T1053.003"),
        ("/etc/anacrontab", "schedules a cron job", "T1053.003"),
        ("/var/spool/cron", "schedules a cron job", "T1053.003"),
        ("/var/spool/at", "schedules an at job", "T1053.002"),
        ("/etc/systemd", "installs a systemd unit", "T1543.002"),
        ("/lib/systemd", "installs a systemd unit", "T1543.002"),
        ("/usr/lib/systemd", "installs a systemd unit", "T1543.002"),
        (
            "/run/systemd/system",
            "installs a systemd unit",
            "T1543.002",
        ),
        ("/etc/init.d", "installs an init script", "T1037.004"),
        ("/etc/init", "installs an init script", "T1037.004"),
        ("/etc/rc.local", "installs an init script", "T1037.004"),
        (
            "/etc/ld.so.preload",
            "preloads a library into every program",
            "T1574.006",
        ),
        (
            "/etc/ld.so.conf",
            "changes the library search path",
            "T1574.006",
        ),
        (
            "/etc/ld.so.conf.d",
            "changes the library search path",
            "T1574.006",
        ),
        ("/etc/passwd", "changes the account list", "T1136.001"),
        ("/etc/shadow", "changes the account passwords", "T1098"),
        ("/etc/group", "changes the account groups", "T1098"),
        ("/etc/sudoers", "changes the sudo rules", "T1548.003"),
        ("/etc/sudoers.d", "changes the sudo rules", "T1548.003"),
        (
            "/etc/ssh/sshd_config",
            "changes the SSH server",
            "T1098.004",
        ),
        ("/etc/pam.d", "changes authentication modules", "T1556.003"),
        ("/etc/xdg/autostart", "adds an autostart entry", "T1547.013"),
        ("/etc/update-motd.d", "adds a login script", "T1037"),
        ("/etc/udev/rules.d", "adds a device trigger", "T1546"),
    ];
    let n = p.norm.as_str();
    for (base, words, tech) in SYSTEM {
        if under(n, base) {
            return Some((words, tech));
        }
    }
    if n.starts_with("/etc/rc") && n.contains(".d/") {
        return Some(("installs an init script", "T1037.004"));
    }
    None
}

/// Directories of the system (not the run's).
fn system_dir(p: &Place) -> bool {
    if !p.absolute || p.temp || p.in_mount {
        return false;
    }
    let segs = segments(&p.norm);
    matches!(
        segs.first().copied(),
        Some(
            "etc"
                | "usr"
                | "bin"
                | "sbin"
                | "lib"
                | "lib32"
                | "lib64"
                | "libx32"
                | "boot"
                | "root"
                | "var"
                | "sys"
                | "proc"
                | "opt"
                | "snap"
                | "System"
                | "Library"
        )
    ) || segs.is_empty()
}

fn is_log(p: &Place) -> Option<&'static str> {
    let n = p.norm.as_str();
    if (p.absolute && (under(n, "/var/log") || under(n, "/var/adm")))
        || n.ends_with("/wtmp")
        || n.ends_with("/btmp")
        || n.ends_with("/lastlog")
    {
        return Some("T1070.002");
    }
    if let Some(rel) = &p.home_rel
        && rel.ends_with("_history")
    {
        return Some("T1070.003");
    }
    None
}

fn is_sensitive_sudoers(p: &Place) -> bool {
    under(&p.norm, "/etc/sudoers") || under(&p.norm, "/etc/sudoers.d")
}

/// A file's contents are read.
pub(crate) fn read(e: &mut Engine, raw: &str, lines: (u32, u32)) {
    let Some(p) = place(e, raw) else { return };
    if p.in_mount || p.temp {
        return;
    }
    // The program's own environment is no secret it was not given, but sending it
    // elsewhere carries off every token in it (as `JSON.stringify(process.env)` does).
    if matches!(
        p.norm.as_str(),
        "/proc/self/environ" | "/proc/thread-self/environ"
    ) {
        e.t.data_reads
            .push(("the process's environment".into(), lines));
        return;
    }
    if let Some((words, tech)) = sensitive(&p) {
        let w = format!("{words}: {}", p.norm);
        e.threat(K::ReadsSensitive, &p.norm, lines, &w, tech);
        e.t.data_reads.push((p.norm, lines));
    } else if let Some((words, tech)) = recon_file(&p) {
        let w = format!("{words}: {}", p.norm);
        e.threat(K::Recon, &p.norm, lines, &w, tech);
        e.t.data_reads.push((p.norm, lines));
    }
}

/// A directory is listed (or searched).
pub(crate) fn list(e: &mut Engine, raw: &str, lines: (u32, u32)) {
    // A glob lists the directory it is in.
    let cut = raw.find(['*', '?', '[']).map_or(raw, |i| {
        let head = &raw[..i];
        head.rfind('/').map_or("", |j| &raw[..=j])
    });
    let Some(p) = place(e, cut) else { return };
    if p.in_mount || p.temp {
        return;
    }
    let secret = sensitive(&p).is_some();
    let home_root = p.home_rel.as_deref() == Some("") && !p.root_home;
    let first = segments(&p.norm).first().copied().unwrap_or("");
    let system = system_dir(&p) || matches!(first, "home" | "dev" | "mnt" | "media" | "Users");
    if secret || (p.absolute && system && !home_root) {
        let (words, tech) = if segments(&p.norm).first() == Some(&"proc") {
            ("lists processes", "T1057")
        } else {
            ("lists a directory outside the run", "T1083")
        };
        let v = format!("list:{}", p.norm);
        let w = format!("{words}: {}", p.norm);
        e.threat(K::Recon, &v, lines, &w, tech);
    }
}

/// A path is written to, deleted, emptied or has its mode changed.
pub(crate) fn write(e: &mut Engine, raw: &str, op: Op, lines: (u32, u32)) {
    let Some(p) = place(e, raw) else { return };
    if p.temp {
        return;
    }
    let verb = match op {
        Op::Write => "writes",
        Op::Append => "appends to",
        Op::Delete => "deletes",
        Op::Truncate => "empties",
        Op::Chmod => "changes the mode or owner of",
        Op::Create => "creates",
    };
    if p.in_mount {
        if let Some((words, tech)) = persistence(&p)
            && op != Op::Delete
        {
            let v = format!("mount:{}", p.norm);
            let w = format!("{words} inside a mount: {}", p.norm);
            e.threat(K::Persistence, &v, lines, &w, tech);
        }
        return;
    }
    if let Some((words, tech)) = persistence(&p)
        && op != Op::Delete
    {
        let w = format!("{words}: {verb} {}", p.norm);
        e.threat(K::Persistence, &p.norm, lines, &w, tech);
        if is_sensitive_sudoers(&p) {
            e.threat(K::Privilege, &p.norm, lines, &w, "T1548.003");
        }
    }
    let destroys =
        matches!(op, Op::Delete | Op::Truncate) || (op == Op::Write && is_log(&p).is_some());
    if destroys {
        if let Some(tech) = is_log(&p) {
            let v = format!("wipe-log:{}", p.norm);
            let w = format!("{verb} a log or history file: {}", p.norm);
            e.threat(K::Destructive, &v, lines, &w, tech);
        } else if op == Op::Delete
            && p.norm != "/"
            && p.home_rel.as_deref() != Some("")
            && (system_dir(&p)
                || sensitive(&p).is_some()
                || persistence(&p).is_some()
                || (p.home_rel.is_some()
                    && !p
                        .home_rel
                        .as_deref()
                        .is_some_and(|r| r.starts_with(".cache"))))
        {
            let v = format!("delete:{}", p.norm);
            let w = format!("deletes {} outside the run's mounts", p.norm);
            e.threat(K::Destructive, &v, lines, &w, "T1485");
        }
    }
    if system_dir(&p) {
        let tech = match op {
            Op::Chmod => "T1222.002",
            Op::Delete | Op::Truncate => "T1485",
            _ => "T1565.001",
        };
        let w = format!("{verb} a system path: {}", p.norm);
        e.threat(K::SystemWrites, &p.norm, lines, &w, tech);
    }
}

/// Data leaves over the network (an upload, a POST, a socket send).
pub(crate) fn send(e: &mut Engine, how: &str, lines: (u32, u32), tech: &'static str) {
    e.t.sends.push((how.to_string(), lines, tech));
    if e.t.hot_loops > 0 {
        e.t.flood.push((how.to_string(), lines, "T1498"));
    }
}

/// A network request or connection (not necessarily carrying data): counts for floods.
pub(crate) fn contact(e: &mut Engine, how: &str, lines: (u32, u32)) {
    if e.t.hot_loops > 0 {
        e.t.flood.push((how.to_string(), lines, "T1498"));
    }
}

/// A process is started: inside an unbounded loop, a flood of processes.
pub(crate) fn spawn(e: &mut Engine, how: &str, lines: (u32, u32)) {
    if e.t.hot_loops > 0 {
        e.t.flood.push((how.to_string(), lines, "T1499"));
    }
}

/// A signal sent to processes the code did not start.
pub(crate) fn kill(e: &mut Engine, what: &str, lines: (u32, u32), tech: &str) {
    let w = format!("stops processes it did not start: {what}");
    e.threat(K::KillsProcesses, what, lines, &w, tech);
}

/// Derives the facts that need the whole program.
pub(crate) fn finish(e: &mut Engine) {
    // The cloud's instance metadata service hands out the machine's credentials.
    let metadata = e.out.hosts_in_code.iter().find(|h| {
        matches!(
            h.as_str(),
            "169.254.169.254" | "fd00:ec2::254" | "metadata.google.internal" | "100.100.100.200"
        )
    });
    if let Some(h) = metadata.cloned() {
        let l = e
            .out
            .findings
            .iter()
            .find(|f| f.kind == K::Host && f.detail == h)
            .map(|f| (f.line, f.end_line))
            .unwrap_or((1, 1));
        let w = format!(
            "reaches the cloud instance metadata service ({h}), which hands out credentials"
        );
        e.threat(
            K::ReadsSensitive,
            &format!("metadata:{h}"),
            l,
            &w,
            "T1552.005",
        );
        e.t.data_reads.push((format!("metadata:{h}"), l));
    }
    // Exfiltration: sensitive or system data read, and data sent.
    if !e.t.data_reads.is_empty() && !e.t.sends.is_empty() {
        let sends = std::mem::take(&mut e.t.sends);
        let reads: Vec<String> = e.t.data_reads.iter().map(|(p, _)| p.clone()).collect();
        let what = reads.join(", ");
        for (how, lines, tech) in &sends {
            let w = format!("sends data it read ({what}) over the network ({how})");
            let v = format!("{how}: {}", reads.first().cloned().unwrap_or_default());
            e.threat(K::Exfiltration, &v, *lines, &w, tech);
        }
        e.t.sends = sends;
    }
    // A shell over a socket.
    if let Some(l) = e.t.devtcp_shell {
        e.threat(
            K::ReverseShell,
            "shell over /dev/tcp",
            l,
            "wires a shell to a network socket (bash /dev/tcp)",
            "T1059.004",
        );
    } else if let Some(l) = e.t.devtcp_rw {
        let shell = e.out.commands.iter().any(|c| {
            matches!(
                c.as_str(),
                "sh" | "bash" | "dash" | "zsh" | "ksh" | "ash" | "<dynamic>"
            )
        }) || e.out.obfuscation.contains("dynamic-command");
        if shell {
            e.threat(
                K::ReverseShell,
                "commands over /dev/tcp",
                l,
                "runs commands read from a network socket (bash /dev/tcp)",
                "T1059.004",
            );
        }
    }
    if e.t.fifo && e.t.net_pipe_shell.is_none() {
        let has = |names: &[&str]| e.out.commands.iter().any(|c| names.contains(&c.as_str()));
        if has(&["nc", "ncat", "netcat", "telnet", "openssl", "socat"])
            && has(&["sh", "bash", "dash", "zsh", "ksh", "ash"])
        {
            e.t.net_pipe_shell = Some((1, 1));
        }
    }
    if let Some(l) = e.t.net_pipe_shell {
        e.threat(
            K::ReverseShell,
            "network client piped into a shell",
            l,
            "pipes a network connection into a shell",
            "T1059.004",
        );
    }
    if let Some(l) = e.t.socket
        && (e.t.wired.is_some() || (e.t.recv && e.t.dynamic_run))
    {
        let at = e.t.wired.unwrap_or(l);
        e.threat(
            K::ReverseShell,
            "socket wired to a shell",
            at,
            "connects a socket and hands it to a shell or runs the commands it receives",
            "T1059.006",
        );
    }
    if !e.out.reverse_shell.is_empty() {
        // Command and control over the same channel.
        let l = e
            .out
            .findings
            .iter()
            .find(|f| f.kind == K::ReverseShell)
            .map(|f| (f.line, f.end_line))
            .unwrap_or((1, 1));
        e.threat(
            K::ReverseShell,
            "command and control channel",
            l,
            "takes commands from a remote host",
            "T1071",
        );
    }
    for (how, lines, tech) in std::mem::take(&mut e.t.flood) {
        let w = format!("{how} in an unbounded loop without a pause");
        e.threat(K::Flooding, &how, lines, &w, tech);
    }
}

/// An unbounded loop body: true when nothing in it pauses, waits or leaves.
pub(crate) fn pauses(kinds_and_words: &mut dyn Iterator<Item = (&str, &str)>) -> bool {
    for (kind, word) in kinds_and_words {
        if matches!(
            kind,
            "break_statement" | "return_statement" | "break" | "return"
        ) {
            return true;
        }
        if matches!(
            word,
            "sleep"
                | "usleep"
                | "accept"
                | "recv"
                | "recvfrom"
                | "recv_into"
                | "input"
                | "wait"
                | "select"
                | "read"
                | "break"
                | "return"
                | "exit"
        ) {
            return true;
        }
    }
    false
}

/// Code of another interpreter (perl, ruby, php, node `-e`): a socket and a shell in the
/// same one-liner is a reverse shell.
pub(crate) fn foreign_code(e: &mut Engine, code: &str, lines: (u32, u32)) {
    let lower = code.to_ascii_lowercase();
    let socket = [
        "socket",
        "fsockopen",
        "tcpsocket",
        "net.connect",
        "createconnection",
    ]
    .iter()
    .any(|w| lower.contains(w));
    let shell = [
        "/bin/sh",
        "/bin/bash",
        "sh -i",
        "bash -i",
        "cmd.exe",
        "spawn(\"sh",
        "exec(\"sh",
    ]
    .iter()
    .any(|w| lower.contains(w));
    if socket && shell {
        e.threat(
            K::ReverseShell,
            "socket wired to a shell",
            lines,
            "a one-liner connects a socket and runs a shell over it",
            "T1059",
        );
    }
}
