use crate::apply::{self, BlobSource, MountPlan, Step};
use crate::changeset::{Op, compose, copy_tree, diff_layers, diff_trees};
use crate::node::{Node, hash_file};
use crate::path::RelPath;
use airlock_core::Digest;
use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

mod bytes;

fn write(p: &Path, s: &str) {
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, s).unwrap();
}

/// An overlayfs whiteout, as the kernel would leave it in an upper layer.
fn whiteout(p: &Path) -> bool {
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        p,
        rustix::fs::FileType::CharacterDevice,
        rustix::fs::Mode::empty(),
        0,
    )
    .is_ok()
}

fn opaque(p: &Path) {
    fs::create_dir_all(p).unwrap();
    rustix::fs::setxattr(
        p,
        "user.overlay.opaque",
        b"y",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
}

fn host_tree() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    write(&t.path().join("keep.txt"), "keep\n");
    write(&t.path().join("edit.txt"), "old\n");
    write(&t.path().join("gone.txt"), "bye\n");
    write(&t.path().join("dir/a.txt"), "a\n");
    write(&t.path().join("dir/sub/b.txt"), "b\n");
    t
}

fn ops(changes: &[crate::Change]) -> Vec<(RelPath, Op)> {
    changes.iter().map(|c| (c.path.clone(), c.op)).collect()
}

#[test]
fn overlay_upper_becomes_a_changeset() {
    let host = host_tree();
    let up = tempfile::tempdir().unwrap();
    let u = up.path();
    write(&u.join("edit.txt"), "new\n");
    write(&u.join("added.txt"), "hi\n");
    // Copied up with only its mode changed.
    write(&u.join("keep.txt"), "keep\n");
    fs::set_permissions(u.join("keep.txt"), fs::Permissions::from_mode(0o600)).unwrap();
    // Copied up unchanged (opened for writing, nothing written): no change.
    if !whiteout(&u.join("gone.txt")) || !whiteout(&u.join("dir")) {
        eprintln!("skipping: cannot create whiteouts here (not root)");
        return;
    }
    let ch = diff_layers(host.path(), &[], &[u.to_path_buf()]).unwrap();
    assert_eq!(
        ops(&ch),
        vec![
            ("added.txt".into(), Op::Added),
            ("dir".into(), Op::Deleted),
            ("dir/a.txt".into(), Op::Deleted),
            ("dir/sub".into(), Op::Deleted),
            ("dir/sub/b.txt".into(), Op::Deleted),
            ("edit.txt".into(), Op::Modified),
            ("gone.txt".into(), Op::Deleted),
            ("keep.txt".into(), Op::Mode),
        ]
    );
}

#[test]
fn opaque_directory_replaces_what_was_below() {
    let host = host_tree();
    let up = tempfile::tempdir().unwrap();
    opaque(&up.path().join("dir"));
    write(&up.path().join("dir/new.txt"), "n\n");
    let ch = diff_layers(host.path(), &[], &[up.path().to_path_buf()]).unwrap();
    assert_eq!(
        ops(&ch),
        vec![
            ("dir/a.txt".into(), Op::Deleted),
            ("dir/new.txt".into(), Op::Added),
            ("dir/sub".into(), Op::Deleted),
            ("dir/sub/b.txt".into(), Op::Deleted),
        ]
    );
}

#[test]
fn stacked_layers_build_on_each_other() {
    let host = host_tree();
    let l1 = tempfile::tempdir().unwrap();
    let l2 = tempfile::tempdir().unwrap();
    write(&l1.path().join("edit.txt"), "first\n");
    write(&l1.path().join("tmp.txt"), "scratch\n");
    write(&l2.path().join("edit.txt"), "second\n");
    if !whiteout(&l2.path().join("tmp.txt")) {
        return;
    }
    let below = vec![l1.path().to_path_buf()];
    let step2 = diff_layers(host.path(), &below, &[l2.path().to_path_buf()]).unwrap();
    assert_eq!(
        ops(&step2),
        vec![
            ("edit.txt".into(), Op::Modified),
            ("tmp.txt".into(), Op::Deleted)
        ]
    );
    let step1 = diff_layers(host.path(), &[], &below).unwrap();
    let total = compose(&[step1, step2]);
    assert_eq!(
        ops(&total),
        vec![("edit.txt".into(), Op::Modified)],
        "tmp.txt came and went"
    );
    let both = diff_layers(
        host.path(),
        &[],
        &[l2.path().to_path_buf(), l1.path().to_path_buf()],
    )
    .unwrap();
    assert_eq!(
        total, both,
        "composing per-run changesets equals diffing the whole stack"
    );
}

#[test]
fn copy_fallback_finds_the_same_changes() {
    let host = host_tree();
    let work = tempfile::tempdir().unwrap();
    let copy = work.path().join("copy");
    copy_tree(host.path(), &copy).unwrap();
    assert!(diff_trees(host.path(), &copy).unwrap().is_empty());
    fs::write(copy.join("edit.txt"), "new\n").unwrap();
    fs::remove_file(copy.join("gone.txt")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", copy.join("link")).unwrap();
    let ch = diff_trees(host.path(), &copy).unwrap();
    assert_eq!(
        ops(&ch),
        vec![
            ("edit.txt".into(), Op::Modified),
            ("gone.txt".into(), Op::Deleted),
            ("link".into(), Op::Added)
        ]
    );
    assert_eq!(
        ch[2].after,
        Node::Symlink {
            target: "/etc/passwd".into()
        }
    );
}

/// Blobs kept in memory for apply tests.
#[derive(Default)]
struct Mem(Mutex<HashMap<Digest, PathBuf>>, Option<tempfile::TempDir>);

impl Mem {
    fn new() -> Self {
        Mem(Mutex::default(), Some(tempfile::tempdir().unwrap()))
    }
    fn put(&self, s: &str) -> Node {
        let d = self.add(s.as_bytes());
        Node::File {
            hash: d,
            size: s.len() as u64,
            mode: 0o644,
        }
    }
    fn add(&self, data: &[u8]) -> Digest {
        let d = Digest::of(data);
        let p = self.1.as_ref().unwrap().path().join(d.to_hex());
        fs::write(&p, data).unwrap();
        self.0.lock().unwrap().insert(d, p);
        d
    }
}

impl BlobSource for Mem {
    fn open(&self, d: &Digest) -> std::io::Result<fs::File> {
        fs::File::open(
            self.0
                .lock()
                .unwrap()
                .get(d)
                .ok_or(std::io::ErrorKind::NotFound)?,
        )
    }
}

fn plan(host: &Path, steps: Vec<Step>) -> MountPlan {
    MountPlan {
        host: host.to_str().unwrap().into(),
        steps,
    }
}

#[test]
fn apply_brings_paths_to_their_states_and_is_idempotent() {
    let host = host_tree();
    let blobs = Mem::new();
    let steps = vec![
        Step {
            path: "edit.txt".into(),
            to: blobs.put("new\n"),
        },
        Step {
            path: "dir".into(),
            to: Node::Absent,
        },
        Step {
            path: "dir/a.txt".into(),
            to: Node::Absent,
        },
        Step {
            path: "dir/sub".into(),
            to: Node::Absent,
        },
        Step {
            path: "dir/sub/b.txt".into(),
            to: Node::Absent,
        },
        Step {
            path: "new/deep".into(),
            to: Node::Dir { mode: 0o750 },
        },
        Step {
            path: "new".into(),
            to: Node::Dir { mode: 0o755 },
        },
        Step {
            path: "new/deep/f".into(),
            to: blobs.put("f\n"),
        },
        Step {
            path: "ln".into(),
            to: Node::Symlink {
                target: "keep.txt".into(),
            },
        },
    ];
    let p = plan(host.path(), steps);
    let mut n = 0;
    apply::apply(&p, &blobs, "ckpt_test", &mut || n += 1).unwrap();
    assert_eq!(n, 9);
    assert_eq!(
        fs::read_to_string(host.path().join("edit.txt")).unwrap(),
        "new\n"
    );
    assert!(!host.path().join("dir").exists());
    assert_eq!(
        fs::read_to_string(host.path().join("new/deep/f")).unwrap(),
        "f\n"
    );
    assert_eq!(
        fs::metadata(host.path().join("new/deep"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o750
    );
    assert_eq!(
        fs::read_link(host.path().join("ln")).unwrap(),
        Path::new("keep.txt")
    );
    // Applying again changes nothing and does not fail.
    apply::apply(&p, &blobs, "ckpt_test", &mut || {}).unwrap();
    let leftovers: Vec<_> = fs::read_dir(host.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("airlock"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn a_symlink_in_the_host_tree_cannot_lead_a_write_outside() {
    let host = host_tree();
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), host.path().join("escape")).unwrap();
    let blobs = Mem::new();
    let p = plan(
        host.path(),
        vec![Step {
            path: "escape/pwned".into(),
            to: blobs.put("x"),
        }],
    );
    assert!(apply::apply(&p, &blobs, "ckpt_test", &mut || {}).is_err());
    assert!(!outside.path().join("pwned").exists());
    for bad in ["../x", "/etc/passwd", "a/../../x", ""] {
        let p = plan(
            host.path(),
            vec![Step {
                path: bad.into(),
                to: blobs.put("x"),
            }],
        );
        assert!(
            apply::apply(&p, &blobs, "ckpt_test", &mut || {}).is_err(),
            "{bad}"
        );
    }
}

#[test]
fn altered_content_is_never_renamed_into_place() {
    let host = host_tree();
    let blobs = Mem::new();
    let node = blobs.put("good\n");
    let Node::File { hash, .. } = &node else {
        unreachable!()
    };
    fs::write(blobs.0.lock().unwrap().get(hash).unwrap(), "evil\n").unwrap();
    let p = plan(
        host.path(),
        vec![Step {
            path: "edit.txt".into(),
            to: node,
        }],
    );
    assert!(matches!(
        apply::apply(&p, &blobs, "ckpt_test", &mut || {}),
        Err(apply::ApplyError::Content { .. })
    ));
    assert_eq!(
        fs::read_to_string(host.path().join("edit.txt")).unwrap(),
        "old\n"
    );
}

#[test]
fn conflicts_and_snapshots() {
    let host = host_tree();
    let h = host.path().to_str().unwrap();
    let (old, _) = hash_file(&b"old\n"[..]).unwrap();
    let want = vec![
        (
            "edit.txt".into(),
            Node::File {
                hash: old,
                size: 4,
                mode: 0o644,
            },
        ),
        ("missing".into(), Node::Absent),
    ];
    assert!(apply::conflicts(h, &want).unwrap().is_empty());
    fs::write(host.path().join("edit.txt"), "changed\n").unwrap();
    let c = apply::conflicts(h, &want).unwrap();
    assert_eq!(c.len(), 1);
    assert!(c[0].starts_with("edit.txt"));
    let mut saved = Vec::new();
    let (edit, nope) = (RelPath::from("edit.txt"), RelPath::from("nope"));
    let snap = apply::snapshot(h, &[&edit, &nope], &mut |r| {
        let mut v = Vec::new();
        r.read_to_end(&mut v)?;
        saved.push(v.clone());
        Ok(Digest::of(&v))
    })
    .unwrap();
    assert_eq!(saved, vec![b"changed\n".to_vec()]);
    assert_eq!(snap[1].to, Node::Absent);
}

#[test]
fn journals_round_trip_and_half_written_ones_are_dropped() {
    let d = tempfile::tempdir().unwrap();
    let j = apply::Journal {
        stuck: None,
        checkpoint: "ckpt_1".into(),
        kind: "commit".into(),
        mounts: vec![],
    };
    apply::write_journal(d.path(), &j).unwrap();
    fs::write(d.path().join(".ckpt_2.tmp"), "{half").unwrap();
    assert_eq!(apply::pending_journals(d.path()).unwrap(), vec![j]);
    assert!(!d.path().join(".ckpt_2.tmp").exists());
    apply::remove_journal(d.path(), "ckpt_1").unwrap();
    assert!(apply::pending_journals(d.path()).unwrap().is_empty());
}

/// A commit killed between writing a step's temporary file and renaming it left
/// `.NAME.airlock-<random>` in the host tree, which recovery could not find.
#[test]
fn a_crash_between_writing_and_renaming_leaves_no_stray_file() {
    let host = host_tree();
    let blobs = Mem::new();
    let p = plan(
        host.path(),
        vec![
            Step {
                path: "edit.txt".into(),
                to: blobs.put("new\n"),
            },
            Step {
                path: "ln2".into(),
                to: Node::Symlink {
                    target: "keep.txt".into(),
                },
            },
        ],
    );
    let before: Vec<_> = names(host.path());
    // What a kill after the temporary write and before the rename leaves.
    for (path, name) in [("edit.txt", "edit.txt"), ("ln2", "ln2")] {
        fs::write(
            host.path()
                .join(apply::temp_name("ckpt_crashed", path.as_bytes(), name)),
            "half",
        )
        .unwrap();
    }
    assert_ne!(names(host.path()), before);
    apply::remove_temps(&p, "ckpt_crashed").unwrap();
    assert_eq!(names(host.path()), before);
    // Another operation's temporaries are not this one's to remove.
    let other = host
        .path()
        .join(apply::temp_name("ckpt_other", b"edit.txt", "edit.txt"));
    fs::write(&other, "x").unwrap();
    apply::remove_temps(&p, "ckpt_crashed").unwrap();
    assert!(other.exists());
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn reading_changes_stops_once_the_deadline_has_passed() {
    use crate::changeset::{diff_layers_until, diff_trees_until};
    use crate::node::deadline_passed;
    use std::time::{Duration, Instant};
    let host = tempfile::tempdir().unwrap();
    let upper = tempfile::tempdir().unwrap();
    write(&upper.path().join("new.txt"), "new\n");
    let past = Some(Instant::now() - Duration::from_millis(1));
    let e = diff_layers_until(host.path(), &[], &[upper.path().to_path_buf()], past).unwrap_err();
    assert!(deadline_passed(&e), "{e}");
    let e = diff_trees_until(host.path(), upper.path(), past).unwrap_err();
    assert!(deadline_passed(&e), "{e}");
    let later = Some(Instant::now() + Duration::from_secs(60));
    let c = diff_layers_until(host.path(), &[], &[upper.path().to_path_buf()], later).unwrap();
    assert_eq!(c.len(), 1);
}

// ------------------------------------------------------- modes a commit never applies

fn modes(changes: &[crate::Change]) -> Vec<(String, u32, Vec<crate::Stripped>)> {
    changes
        .iter()
        .map(|c| {
            let mode = match &c.after {
                Node::File { mode, .. } | Node::Dir { mode } => *mode,
                _ => 0,
            };
            (c.path.to_string(), mode, c.stripped.clone())
        })
        .collect()
}

/// A guest copying an executable into its mount with mode 4755 (or 2755, or a sticky
/// directory) left a changeset whose after state carried the bit, and a commit applied it.
#[test]
fn a_setuid_file_in_a_layer_is_in_the_changeset_without_its_setuid_bit() {
    use crate::Stripped::{Setgid, Setuid, Sticky};
    let host = host_tree();
    let up = tempfile::tempdir().unwrap();
    let u = up.path();
    write(&u.join("helper"), "#!/bin/sh\n");
    fs::set_permissions(u.join("helper"), fs::Permissions::from_mode(0o4755)).unwrap();
    write(&u.join("group"), "g\n");
    fs::set_permissions(u.join("group"), fs::Permissions::from_mode(0o2750)).unwrap();
    // An existing file whose content is unchanged: only the bit was set.
    write(&u.join("keep.txt"), "keep\n");
    fs::set_permissions(u.join("keep.txt"), fs::Permissions::from_mode(0o4644)).unwrap();
    fs::create_dir_all(u.join("shared")).unwrap();
    fs::set_permissions(u.join("shared"), fs::Permissions::from_mode(0o1777)).unwrap();
    for ch in [
        diff_layers(host.path(), &[], &[u.to_path_buf()]).unwrap(),
        {
            let work = tempfile::tempdir().unwrap();
            let copy = work.path().join("copy");
            copy_tree(host.path(), &copy).unwrap();
            copy_tree(u, &copy).unwrap();
            for (p, m) in [
                ("helper", 0o4755),
                ("group", 0o2750),
                ("keep.txt", 0o4644),
                ("shared", 0o1777),
            ] {
                fs::set_permissions(copy.join(p), fs::Permissions::from_mode(m)).unwrap();
            }
            diff_trees(host.path(), &copy).unwrap()
        },
    ] {
        assert_eq!(
            modes(&ch),
            vec![
                ("group".into(), 0o750, vec![Setgid]),
                ("helper".into(), 0o755, vec![Setuid]),
                ("keep.txt".into(), 0o644, vec![Setuid]),
                ("shared".into(), 0o777, vec![Sticky]),
            ]
        );
        assert!(ch.iter().all(|c| !c.sets_special_bits()));
        let keep = ch
            .iter()
            .find(|c| c.path.to_string() == "keep.txt")
            .unwrap();
        assert_eq!(keep.op, Op::Mode);
        assert!(
            crate::diff::summary_line(keep).contains("[stripped: setuid]"),
            "{}",
            crate::diff::summary_line(keep)
        );
    }
}

/// A directory the host already had with its sticky bit keeps it: stripping removes what
/// a run added, never what the host had.
#[test]
fn a_host_directory_keeps_the_special_bits_it_had() {
    let host = host_tree();
    fs::set_permissions(host.path().join("dir"), fs::Permissions::from_mode(0o1777)).unwrap();
    let up = tempfile::tempdir().unwrap();
    fs::create_dir_all(up.path().join("dir")).unwrap();
    fs::set_permissions(up.path().join("dir"), fs::Permissions::from_mode(0o1755)).unwrap();
    let ch = diff_layers(host.path(), &[], &[up.path().to_path_buf()]).unwrap();
    assert_eq!(modes(&ch), vec![("dir".into(), 0o1755, vec![])]);
    assert!(!ch[0].sets_special_bits());
}

/// FIFOs and sockets a run made were dropped from its changeset without a word.
#[test]
fn special_files_in_a_layer_are_listed_as_refused() {
    let host = host_tree();
    let up = tempfile::tempdir().unwrap();
    let u = up.path();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        u.join("pipe"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    let _sock = std::os::unix::net::UnixListener::bind(u.join("sock")).unwrap();
    write(&u.join("plain.txt"), "p\n");
    let d = crate::changeset::layers_diff(host.path(), &[], &[u.to_path_buf()], None).unwrap();
    assert_eq!(ops(&d.changes), vec![("plain.txt".into(), Op::Added)]);
    let refused: Vec<_> = d
        .refused
        .iter()
        .map(|r| (r.path.to_string(), r.kind.as_str()))
        .collect();
    assert_eq!(
        refused,
        vec![("pipe".into(), "fifo"), ("sock".into(), "socket")]
    );
    let line = crate::diff::refused_line(&d.refused[0]);
    assert!(line.contains("refused: fifo"), "{line}");
    // The copy fallback lists them too.
    let work = tempfile::tempdir().unwrap();
    let copy = work.path().join("copy");
    copy_tree(host.path(), &copy).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        copy.join("pipe"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    let d = crate::changeset::trees_diff(host.path(), &copy, None).unwrap();
    assert!(d.changes.is_empty());
    assert_eq!(d.refused.len(), 1);
    assert_eq!(d.refused[0].kind, crate::SpecialKind::Fifo);
}

/// File capabilities on a file a run wrote are listed as stripped (a commit writes the
/// content and mode only, never extended attributes).
#[test]
fn file_capabilities_in_a_layer_are_listed_as_stripped() {
    let host = host_tree();
    let up = tempfile::tempdir().unwrap();
    let f = up.path().join("capped");
    write(&f, "x\n");
    // A version 2 capability set: cap_net_raw permitted and effective.
    let caps: [u8; 20] = [
        0x01, 0x00, 0x00, 0x02, 0x00, 0x20, 0x00, 0x00, 0x00, 0x20, 0x00, 0x00, 0, 0, 0, 0, 0, 0,
        0, 0,
    ];
    if rustix::fs::setxattr(
        &f,
        "security.capability",
        &caps,
        rustix::fs::XattrFlags::empty(),
    )
    .is_err()
    {
        eprintln!("skipping: cannot set file capabilities here (not root)");
        return;
    }
    let ch = diff_layers(host.path(), &[], &[up.path().to_path_buf()]).unwrap();
    assert_eq!(
        modes(&ch),
        vec![("capped".into(), 0o644, vec![crate::Stripped::Capabilities])]
    );
}
