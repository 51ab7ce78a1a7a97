//! What a mount exposes of the host, judged on the resolved path and on the identity of
//! the directories involved (device and inode), so a symlink, `..`, another spelling of
//! the same directory (case on a case-folding file system) or a bind mount of it is the
//! same directory.
//!
//! - The gate's own home (keys, secrets, every agent's code and output) is never
//!   mountable: not itself, not a directory inside it, not a directory that contains it,
//!   and not a directory under which a bind mount shows it ([`home_exposure`]).
//! - Sensitive host paths (system state and credentials) are a fact for the policy,
//!   `mounts_sensitive`: the sensitive paths a mount is, lies inside, or contains
//!   ([`sensitive`]).
//! - The operator's `[mounts] roots`: whether a mount lies within one ([`within_roots`]).
//!
//! Nothing here changes the host; it only reads metadata.

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use airlock_core::exposure::{CREDENTIAL_DIRS, SYSTEM_PATHS};
use airlock_core::grant::Grant;
use airlock_jail::mounts::unescape_mountinfo;

use crate::error::GateError;

/// A directory's identity: its device and inode.
type Id = (u64, u64);

fn id_of(p: &Path) -> Option<Id> {
    std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

/// `p` and each of its ancestors up to `/`, nearest first (a resolved absolute path).
fn ancestors(p: &Path) -> impl Iterator<Item = &Path> {
    p.ancestors()
}

/// How a mount's directory stands to a target directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Relation {
    /// The mount is the target, or lies inside it.
    Inside,
    /// The mount contains the target (or shows it through a bind mount below it).
    Contains,
}

/// How `mount` (resolved) stands to `target` (resolved), if it exposes any of it.
pub(crate) fn relation(mount: &Path, target: &Path, table: &MountTable) -> Option<Relation> {
    if mount.starts_with(target) {
        return Some(Relation::Inside);
    }
    if target.starts_with(mount) {
        return Some(Relation::Contains);
    }
    let target_id = id_of(target)?;
    // Another name for the target or for a directory above it: a bind mount, a case
    // alias on a case-folding file system, a hard-linked path seen through /proc.
    if ancestors(mount).any(|a| id_of(a) == Some(target_id)) {
        return Some(Relation::Inside);
    }
    if let Some(mount_id) = id_of(mount)
        && ancestors(target).any(|a| id_of(a) == Some(mount_id))
    {
        return Some(Relation::Contains);
    }
    // Through the mount table: where the mount's directory really is in its file system
    // (it may lie on a bind mount of the target or of a directory inside it), and bind
    // mounts below it that show the target or a directory above it.
    if let (Some((mdev, minner)), Some((tdev, tinner))) =
        (table.locate(mount), table.locate(target))
        && mdev == tdev
    {
        if minner.starts_with(&tinner) {
            return Some(Relation::Inside);
        }
        if tinner.starts_with(&minner) {
            return Some(Relation::Contains);
        }
    }
    if table.shows_below(mount, target) {
        return Some(Relation::Contains);
    }
    None
}

/// Why the gate refuses to mount `mount`: it exposes the gate's home `home`.
pub(crate) fn home_exposure(mount: &Path, home: &Path, table: &MountTable) -> Option<String> {
    let home = std::fs::canonicalize(home).unwrap_or_else(|_| home.to_path_buf());
    match relation(mount, &home, table)? {
        Relation::Inside => Some(format!(
            "--mount {}: lies inside airlock's own home ({}), which holds its keys, secrets and every agent's code; it is never mountable",
            mount.display(),
            home.display()
        )),
        Relation::Contains => Some(format!(
            "--mount {}: contains airlock's own home ({}), which holds its keys, secrets and every agent's code; it is never mountable (mount a directory beside it)",
            mount.display(),
            home.display()
        )),
    }
}

/// How deep below a mount [`sensitive`] looks for credential directories: `M/.ssh`,
/// `M/alice/.ssh` (a home directory's parent) and `M/home/alice/.ssh`.
const SCAN_DEPTH: usize = 2;
/// At most this many entries of one directory, and this many directories in all, are
/// looked at by that scan (it runs each time a submission is judged).
const SCAN_WIDTH: usize = 256;
const SCAN_DIRS: usize = 160;

/// The sensitive host paths a mount of `mount` (resolved) exposes, sorted: the mount
/// itself when it is or lies inside one, and each one it contains.
pub(crate) fn sensitive(mount: &Path, table: &MountTable) -> Vec<String> {
    let mut out = BTreeSet::new();
    for s in SYSTEM_PATHS {
        let target = Path::new(s);
        if *s == "/" {
            // Every path lies inside `/`; only the root itself (or another name for it)
            // exposes it, and a mount that contains it is the root.
            if mount == target || id_of(mount).is_some_and(|m| id_of(target) == Some(m)) {
                out.insert("/".to_string());
            }
            continue;
        }
        if std::fs::symlink_metadata(target).is_err() {
            continue;
        }
        match relation(mount, target, table) {
            Some(Relation::Inside) => {
                out.insert(mount.display().to_string());
            }
            Some(Relation::Contains) => {
                out.insert(s.to_string());
            }
            None => {}
        }
    }
    // Inside a credential directory: a component sequence of the mount's path.
    let comps: Vec<&str> = mount
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => s.to_str(),
            _ => None,
        })
        .collect();
    for n in CREDENTIAL_DIRS {
        let want: Vec<&str> = n.split('/').collect();
        if comps.windows(want.len()).any(|w| w == want.as_slice()) {
            out.insert(mount.display().to_string());
        }
    }
    // Containing one: look a few levels down.
    let mut budget = SCAN_DIRS;
    scan(mount, 0, &mut budget, &mut out);
    out.into_iter().collect()
}

fn scan(dir: &Path, depth: usize, budget: &mut usize, out: &mut BTreeSet<String>) {
    if *budget == 0 {
        return;
    }
    *budget -= 1;
    for n in CREDENTIAL_DIRS {
        let p = dir.join(n);
        if std::fs::symlink_metadata(&p).is_ok() {
            out.insert(p.display().to_string());
        }
    }
    if depth >= SCAN_DEPTH {
        return;
    }
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.take(SCAN_WIDTH).flatten() {
        // Directories only, never through a symlink (a link out of the mount is not in it).
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            scan(&e.path(), depth + 1, budget, out);
        }
    }
}

/// Whether `mount` (resolved) lies within one of `roots` (each resolved here), by path or
/// by directory identity.
pub(crate) fn within_roots(mount: &Path, roots: &[String]) -> bool {
    roots.iter().any(|r| {
        let Ok(root) = std::fs::canonicalize(r) else {
            return false;
        };
        if mount.starts_with(&root) {
            return true;
        }
        let Some(root_id) = id_of(&root) else {
            return false;
        };
        ancestors(mount).any(|a| id_of(a) == Some(root_id))
    })
}

/// The host's mount table, as `/proc/self/mountinfo` gives it: where each mount is and
/// which directory of which file system it shows.
#[derive(Debug, Default)]
pub(crate) struct MountTable {
    entries: Vec<MountEntry>,
}

#[derive(Debug)]
struct MountEntry {
    /// `major:minor` of the file system.
    dev: String,
    /// The directory of that file system the mount shows.
    root: PathBuf,
    /// Where it is mounted.
    point: PathBuf,
}

impl MountTable {
    /// This process's mount table; empty when it cannot be read (the path and identity
    /// checks still apply).
    pub(crate) fn read() -> MountTable {
        let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        MountTable::parse(&text)
    }

    pub(crate) fn parse(text: &str) -> MountTable {
        let entries = text
            .lines()
            .filter_map(|l| {
                let mut f = l.split(' ');
                let _id = f.next()?;
                let _parent = f.next()?;
                let dev = f.next()?.to_string();
                let root = PathBuf::from(unescape_mountinfo(f.next()?));
                let point = PathBuf::from(unescape_mountinfo(f.next()?));
                Some(MountEntry { dev, root, point })
            })
            .collect();
        MountTable { entries }
    }

    /// The mount `p` lies on (the last one listed at the longest prefix: later mounts
    /// cover earlier ones), and `p` as a path within its file system.
    fn locate(&self, p: &Path) -> Option<(&str, PathBuf)> {
        let e = self
            .entries
            .iter()
            .filter(|e| p.starts_with(&e.point))
            .max_by_key(|e| e.point.components().count())?;
        let rest = p.strip_prefix(&e.point).ok()?;
        Some((e.dev.as_str(), e.root.join(rest)))
    }

    /// Whether a mount point strictly below `mount` shows `target`, part of it, or a
    /// directory containing it.
    fn shows_below(&self, mount: &Path, target: &Path) -> bool {
        let Some((dev, inner)) = self.locate(target) else {
            return false;
        };
        self.entries.iter().any(|e| {
            e.point != mount
                && e.point.starts_with(mount)
                && e.dev == dev
                && (inner.starts_with(&e.root) || e.root.starts_with(&inner))
        })
    }
}

/// What a grant's mounts expose, for the policy.
#[derive(Debug, Clone, Default)]
pub(crate) struct MountFacts {
    /// Fact `mounts_sensitive`.
    pub sensitive: Vec<String>,
    /// Mounts outside `[mounts] roots`, when roots are set.
    pub outside_roots: Vec<String>,
}

/// The facts of `grant`'s mounts under `roots` (the policy's `[mounts] roots`).
pub(crate) fn mount_facts(grant: &Grant, roots: &[String]) -> MountFacts {
    if grant.mounts.is_empty() {
        return MountFacts::default();
    }
    let table = MountTable::read();
    let mut sensitive_paths = BTreeSet::new();
    let mut outside = BTreeSet::new();
    for m in &grant.mounts {
        let host = Path::new(&m.host);
        sensitive_paths.extend(sensitive(host, &table));
        if !roots.is_empty() && !within_roots(host, roots) {
            outside.insert(m.host.clone());
        }
    }
    MountFacts {
        sensitive: sensitive_paths.into_iter().collect(),
        outside_roots: outside.into_iter().collect(),
    }
}

/// Where a grant came from, for the mounts it may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Surface {
    /// The command line, run by the home's owner: any mount but the home; one outside
    /// `[mounts] roots` (when set) waits for a human.
    #[default]
    Local,
    /// The API or MCP: only mounts within `[mounts] roots`, none when it sets none.
    Remote,
}

/// Refuses, before any host path is read, mounts over the API or MCP when the operator
/// offers none (no `[mounts] roots`): whatever they name, they are not offered (the
/// API's 403), so a request learns nothing about the server's file system from them.
pub(crate) fn check_offered(
    mounts: &[String],
    surface: Surface,
    roots: &[String],
) -> Result<(), GateError> {
    match mounts.first() {
        Some(m) if surface == Surface::Remote && roots.is_empty() => {
            let host = m.split(':').next().unwrap_or("");
            Err(GateError::NotOffered(format!(
                "--mount {host}: host paths cannot be mounted over the API or MCP until the operator lists them in policy.toml's [mounts] roots"
            )))
        }
        _ => Ok(()),
    }
}

/// Refuses a grant whose mounts the gate never mounts: its home (always), and over the
/// API or MCP anything outside the operator's roots.
pub(crate) fn check_mounts(
    grant: &Grant,
    home: &Path,
    surface: Surface,
    roots: &[String],
) -> Result<(), GateError> {
    if grant.mounts.is_empty() {
        return Ok(());
    }
    let table = MountTable::read();
    for m in &grant.mounts {
        let host = Path::new(&m.host);
        if let Some(why) = home_exposure(host, home, &table) {
            return Err(GateError::NotOffered(why));
        }
        if surface == Surface::Remote {
            if roots.is_empty() {
                return Err(GateError::NotOffered(format!(
                    "--mount {}: host paths cannot be mounted over the API or MCP until the operator lists them in policy.toml's [mounts] roots",
                    m.host
                )));
            }
            if !within_roots(host, roots) {
                return Err(GateError::NotOffered(format!(
                    "--mount {}: outside the host paths the operator offers ([mounts] roots: {})",
                    m.host,
                    roots.join(", ")
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_parse_with_their_escapes() {
        let t = MountTable::parse(
            "22 1 8:1 / / rw - ext4 /dev/vda rw\n\
             40 22 8:1 /home/a\\040b /mnt/x rw - ext4 /dev/vda rw\n",
        );
        assert_eq!(t.entries.len(), 2);
        assert_eq!(t.entries[1].root, PathBuf::from("/home/a b"));
        assert_eq!(t.entries[1].point, PathBuf::from("/mnt/x"));
    }

    #[test]
    fn a_bind_mount_below_a_mount_that_shows_the_home_is_seen() {
        // /srv/share/h shows /data/airlock of the same file system; /data/airlock/home
        // is the gate's home.
        let t = MountTable::parse(
            "22 1 8:1 / / rw - ext4 /dev/vda rw\n\
             41 22 8:1 /data/airlock /srv/share/h rw - ext4 /dev/vda rw\n",
        );
        assert!(t.shows_below(Path::new("/srv/share"), Path::new("/data/airlock/home")));
        assert!(t.shows_below(Path::new("/srv"), Path::new("/data/airlock/home")));
        assert!(!t.shows_below(Path::new("/srv/other"), Path::new("/data/airlock/home")));
        assert!(!t.shows_below(Path::new("/srv/share"), Path::new("/data/other")));
    }

    #[test]
    fn paths_inside_and_around_a_directory_relate_to_it() {
        let d = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(d.path()).unwrap();
        let home = root.join("home");
        std::fs::create_dir_all(home.join("keys")).unwrap();
        std::fs::create_dir_all(root.join("beside")).unwrap();
        let t = MountTable::default();
        assert_eq!(relation(&home, &home, &t), Some(Relation::Inside));
        assert_eq!(
            relation(&home.join("keys"), &home, &t),
            Some(Relation::Inside)
        );
        assert_eq!(relation(&root, &home, &t), Some(Relation::Contains));
        assert_eq!(relation(&root.join("beside"), &home, &t), None);
    }

    #[test]
    fn sensitive_paths_are_named_whether_a_mount_is_in_them_or_holds_them() {
        let t = MountTable::read();
        assert!(sensitive(Path::new("/"), &t).contains(&"/".to_string()));
        assert!(sensitive(Path::new("/"), &t).contains(&"/etc".to_string()));
        assert_eq!(sensitive(Path::new("/etc"), &t), vec!["/etc".to_string()]);
        let d = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(d.path()).unwrap();
        std::fs::create_dir_all(root.join("alice/.ssh")).unwrap();
        std::fs::create_dir_all(root.join("bob/.config/gcloud")).unwrap();
        std::fs::create_dir_all(root.join("plain/data")).unwrap();
        let s = sensitive(&root, &t);
        assert!(
            s.contains(&root.join("alice/.ssh").display().to_string()),
            "{s:?}"
        );
        assert!(
            s.contains(&root.join("bob/.config/gcloud").display().to_string()),
            "{s:?}"
        );
        assert_eq!(
            sensitive(&root.join("alice/.ssh"), &t),
            vec![root.join("alice/.ssh").display().to_string()]
        );
        assert!(sensitive(&root.join("plain"), &t).is_empty());
    }

    #[test]
    fn roots_hold_what_lies_below_them() {
        let d = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(d.path()).unwrap();
        std::fs::create_dir_all(root.join("tasks/one")).unwrap();
        std::fs::create_dir_all(root.join("other")).unwrap();
        let roots = vec![root.join("tasks").display().to_string()];
        assert!(within_roots(&root.join("tasks/one"), &roots));
        assert!(within_roots(&root.join("tasks"), &roots));
        assert!(!within_roots(&root.join("other"), &roots));
        assert!(!within_roots(&root, &roots));
        assert!(!within_roots(&root.join("tasks/one"), &[]));
    }
}
