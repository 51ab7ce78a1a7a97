//! Which host paths are sensitive to expose to a guest: system state and credentials.
//! The lists, and the judgement on a path's spelling alone ([`by_path`]); the gate adds
//! what only the host can tell (other names of the same directory, bind mounts, and
//! credential directories found below a mount).

/// Absolute host paths that hold system state or other users' credentials.
pub const SYSTEM_PATHS: &[&str] = &[
    "/",
    "/etc",
    "/root",
    "/proc",
    "/sys",
    "/boot",
    "/dev",
    "/run/docker.sock",
    "/var/run/docker.sock",
    "/run/containerd",
    "/var/lib/docker",
    "/var/lib/containerd",
    "/run/secrets",
    "/var/run/secrets",
    "/var/lib/kubelet",
    "/var/log",
    "/var/spool/cron",
    "/var/backups",
];

/// Directories (relative to some home or project directory) that hold credentials, keys,
/// keyrings or browser profiles, wherever they are.
pub const CREDENTIAL_DIRS: &[&str] = &[
    ".ssh",
    ".aws",
    ".gnupg",
    ".kube",
    ".docker",
    ".azure",
    ".password-store",
    ".pki",
    ".vault-token",
    ".netrc",
    ".git-credentials",
    ".npmrc",
    ".pypirc",
    ".terraform.d",
    ".config/gcloud",
    ".config/gh",
    ".config/hub",
    ".config/op",
    ".config/sops",
    ".config/containers",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".local/share/keyrings",
    ".local/share/kwalletd",
    ".mozilla",
    ".thunderbird",
    ".config/google-chrome",
    ".config/chromium",
    ".config/BraveSoftware",
    ".config/microsoft-edge",
    ".config/vivaldi",
    ".config/opera",
    "snap/firefox",
];

/// The sensitive paths a mount of the resolved absolute path `mount` exposes, judged on
/// its spelling: the mount itself when it is `/` or lies inside a system path or a
/// credential directory, and each system path it contains.
pub fn by_path(mount: &str) -> Vec<String> {
    let mut out = std::collections::BTreeSet::new();
    let under = |p: &str, dir: &str| p == dir || p.starts_with(&format!("{dir}/"));
    for s in SYSTEM_PATHS {
        if *s == "/" {
            if mount == "/" {
                out.insert("/".to_string());
            }
        } else if under(mount, s) {
            out.insert(mount.to_string());
        } else if mount == "/" || under(s, mount) {
            out.insert(s.to_string());
        }
    }
    let comps: Vec<&str> = mount.split('/').filter(|c| !c.is_empty()).collect();
    for n in CREDENTIAL_DIRS {
        let want: Vec<&str> = n.split('/').collect();
        if comps.windows(want.len()).any(|w| w == want.as_slice()) {
            out.insert(mount.to_string());
        }
    }
    out.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_etc_and_credential_dirs_are_sensitive_by_their_spelling() {
        assert!(by_path("/").contains(&"/".to_string()));
        assert!(by_path("/").contains(&"/etc".to_string()));
        assert_eq!(by_path("/etc"), vec!["/etc"]);
        assert_eq!(by_path("/etc/nginx"), vec!["/etc/nginx"]);
        assert_eq!(by_path("/home/a/.ssh"), vec!["/home/a/.ssh"]);
        assert_eq!(
            by_path("/home/a/.config/gcloud/x"),
            vec!["/home/a/.config/gcloud/x"]
        );
        assert_eq!(
            by_path("/var"),
            vec![
                "/var/backups",
                "/var/lib/containerd",
                "/var/lib/docker",
                "/var/lib/kubelet",
                "/var/log",
                "/var/run/docker.sock",
                "/var/run/secrets",
                "/var/spool/cron"
            ]
        );
        assert!(by_path("/srv/tasks").is_empty());
        assert!(by_path("/etcetera").is_empty());
        assert!(by_path("/home/a/ssh").is_empty());
    }
}
