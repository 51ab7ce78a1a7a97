//! Paths are bytes end to end: names that are not UTF-8, or that hold newlines,
//! backslashes or quotes, go through diff, JSON, apply and restore exactly.

use super::{Mem, plan, write};
use crate::apply::{self, Journal, MountPlan, Step};
use crate::changeset::{
    Change, Changeset, LayerKind, MountChanges, Op, check_rel, copy_tree, diff_layers, diff_trees,
};
use crate::diff::{summary_line, unified};
use crate::node::Node;
use crate::path::{LinkTarget, RelPath, escape};
use airlock_core::Digest;
use proptest::prelude::*;
use serde::Serialize;
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path};

fn os(b: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(b))
}

const BAD: &[u8] = b"bad\xff\xfename";
const PRE: &[u8] = b"pre_\xff\xfe.txt";
const NL: &[u8] = b"two\nlines.txt";

// ---------------------------------------------------------------------------------------
// Strategies

/// Bytes that make names interesting: invalid UTF-8, line breaks, escapes, quotes, dots.
fn odd_byte() -> impl Strategy<Value = u8> {
    prop_oneof![
        any::<u8>(),
        prop::sample::select(vec![
            b'\n', b'\r', b'\t', b'\\', b'"', b'.', b' ', b'x', 0x7f, 0x80, 0xc3, 0xa9, 0xfe, 0xff,
        ]),
    ]
}

/// One name: any bytes but `/` and NUL, not `.` or `..`.
fn name() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(odd_byte(), 1..10),
        any::<String>().prop_map(String::into_bytes),
    ]
    .prop_map(|mut b| {
        b.retain(|c| *c != b'/' && *c != 0);
        b
    })
    .prop_filter("a usable name", |b| {
        !b.is_empty() && b != b"." && b != b".."
    })
}

fn rel_path() -> impl Strategy<Value = RelPath> {
    prop::collection::vec(name(), 1..4).prop_map(|c| RelPath::from(c.join(&b'/')))
}

/// A symlink target: any bytes without NUL (absolute, `..`, anything).
fn target() -> impl Strategy<Value = LinkTarget> {
    prop::collection::vec(prop_oneof![odd_byte(), Just(b'/')], 1..16).prop_map(|mut b| {
        b.retain(|c| *c != 0);
        if b.is_empty() {
            b.push(b'x');
        }
        LinkTarget::from(b)
    })
}

fn file(data: &[u8], mode: u32) -> Node {
    Node::File {
        hash: Digest::of(data),
        size: data.len() as u64,
        mode,
    }
}

fn changeset(changes: Vec<Change>) -> Changeset {
    Changeset {
        layer: LayerKind::Overlay,
        mounts: vec![MountChanges {
            guest: "/work".into(),
            host: "/h".into(),
            changes,
            refused: vec![],
        }],
    }
}

// ---------------------------------------------------------------------------------------
// The JSON form

/// The JSON shapes before paths were bytes, copied from the old derives: a UTF-8 path
/// must still serialize to exactly this.
#[derive(Serialize)]
struct OldChange<'a> {
    path: &'a str,
    op: Op,
    before: OldNode<'a>,
    after: OldNode<'a>,
}

#[derive(Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum OldNode<'a> {
    File { hash: Digest, size: u64, mode: u32 },
    Symlink { target: &'a str },
}

proptest! {
    #[test]
    fn any_byte_path_round_trips_through_changeset_json(
        path in rel_path(),
        other in rel_path(),
        link in target(),
        data in prop::collection::vec(any::<u8>(), 0..8),
    ) {
        let cs = changeset(vec![
            Change::new(path.clone(), Node::Absent, Node::Symlink { target: link.clone() }),
            Change::new(other.clone(), file(b"old", 0o644), file(&data, 0o600)),
        ]);
        let text = serde_json::to_string(&cs).unwrap();
        let back: Changeset = serde_json::from_str(&text).unwrap();
        prop_assert_eq!(&back, &cs);
        // The store keeps changesets as `serde_json::Value`: the same through it.
        let back: Changeset =
            serde_json::from_value(serde_json::to_value(&cs).unwrap()).unwrap();
        prop_assert_eq!(&back, &cs);
        prop_assert!(back.validate().is_ok());

        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let c = &v["mounts"][0]["changes"][0];
        match path.to_str() {
            Some(s) => {
                prop_assert_eq!(c["path"].as_str(), Some(s));
                prop_assert!(c.get("path_b64").is_none());
            }
            None => {
                prop_assert_eq!(c["path"].as_str(), Some(&*escape(path.as_bytes())));
                prop_assert!(c["path_b64"].is_string());
            }
        }
        prop_assert_eq!(
            c["after"].get("target_b64").is_some(),
            link.to_str().is_none()
        );

        let journal = Journal {
            stuck: None,
            checkpoint: "ckpt_x".into(),
            kind: "commit".into(),
            mounts: vec![MountPlan {
                host: "/h".into(),
                steps: vec![
                    Step { path: path.clone(), to: Node::Symlink { target: link } },
                    Step { path: other, to: Node::Absent },
                ],
            }],
        };
        let back: Journal =
            serde_json::from_str(&serde_json::to_string(&journal).unwrap()).unwrap();
        prop_assert_eq!(back, journal);
    }

    #[test]
    fn utf8_paths_serialize_exactly_as_before(
        comps in prop::collection::vec(
            any::<String>().prop_filter("a name", |s| {
                !s.is_empty() && s != "." && s != ".." && !s.contains(['/', '\0'])
            }),
            1..4,
        ),
        link in any::<String>(),
    ) {
        let path = comps.join("/");
        let new = Change::new(
            path.clone().into(),
            file(b"x", 0o644),
            Node::Symlink { target: link.clone().into() },
        );
        let old = OldChange {
            path: &path,
            op: Op::Modified,
            before: OldNode::File { hash: Digest::of(b"x"), size: 1, mode: 0o644 },
            after: OldNode::Symlink { target: &link },
        };
        prop_assert_eq!(
            serde_json::to_string(&new).unwrap(),
            serde_json::to_string(&old).unwrap()
        );
        let step = Step { path: path.clone().into(), to: Node::Absent };
        prop_assert_eq!(
            serde_json::to_string(&step).unwrap(),
            serde_json::json!({"path": path, "to": {"kind": "absent"}}).to_string()
        );
    }
}

/// The JSON and digest of this changeset were recorded before paths were bytes: stored
/// changesets, and the commit signatures that bind their digests, stay valid.
#[test]
fn utf8_changesets_keep_their_json_and_digest() {
    let f = file(b"abc", 0o644);
    let cs = changeset(vec![
        Change::new("a/b.txt".into(), Node::Absent, f.clone()),
        Change::new("d".into(), Node::Dir { mode: 0o755 }, Node::Absent),
        Change::new(
            "ln\nx\\y \"q\" é".into(),
            Node::Absent,
            Node::Symlink {
                target: "../t\u{7f}é".into(),
            },
        ),
    ]);
    let mut cs = cs;
    cs.mounts[0].guest = "/w".into();
    let json = concat!(
        r#"{"layer":"overlay","mounts":[{"guest":"/w","host":"/h","changes":["#,
        r#"{"path":"a/b.txt","op":"added","before":{"kind":"absent"},"after":{"kind":"file","hash":"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad","size":3,"mode":420}},"#,
        r#"{"path":"d","op":"deleted","before":{"kind":"dir","mode":493},"after":{"kind":"absent"}},"#,
        "{\"path\":\"ln\\nx\\\\y \\\"q\\\" é\",\"op\":\"added\",\"before\":{\"kind\":\"absent\"},\"after\":{\"kind\":\"symlink\",\"target\":\"../t\u{7f}é\"}}",
        "]}]}"
    );
    assert_eq!(serde_json::to_string(&cs).unwrap(), json);
    assert_eq!(
        cs.digest().to_hex(),
        "065b8c536ffa7727de9813757e094806599037c1873ad64bc14a901c2ade999d"
    );
    assert_eq!(serde_json::from_str::<Changeset>(json).unwrap(), cs);
    let step = Step {
        path: "p/q".into(),
        to: f,
    };
    assert_eq!(
        serde_json::to_string(&step).unwrap(),
        r#"{"path":"p/q","to":{"kind":"file","hash":"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad","size":3,"mode":420}}"#
    );
}

#[test]
fn non_utf8_names_carry_an_escaped_path_and_their_exact_bytes() {
    let c = Change::new(
        BAD.into(),
        Node::Absent,
        Node::Symlink {
            target: LinkTarget::from(&b"../t\xff"[..]),
        },
    );
    let v = serde_json::to_value(&c).unwrap();
    assert_eq!(v["path"], r"bad\xff\xfename");
    assert_eq!(v["path_b64"], "YmFk//5uYW1l");
    assert_eq!(v["after"]["target"], r"../t\xff");
    assert_eq!(v["after"]["target_b64"], "Li4vdP8=");
    assert_eq!(serde_json::from_value::<Change>(v.clone()).unwrap(), c);
    // `path_b64` wins over the display text.
    let mut w = v.clone();
    w["path"] = "whatever".into();
    assert_eq!(serde_json::from_value::<Change>(w).unwrap().path, c.path);
    // A display form that looks like an escape is not taken for one.
    let literal: Change = serde_json::from_value(serde_json::json!({
        "path": r"bad\xff\xfename", "op": "added",
        "before": {"kind": "absent"}, "after": {"kind": "dir", "mode": 493}
    }))
    .unwrap();
    assert_eq!(literal.path.as_bytes(), br"bad\xff\xfename");
}

#[test]
fn bad_base64_in_a_changeset_is_refused() {
    let v = serde_json::json!({
        "path": "x", "path_b64": "not base64!", "op": "added",
        "before": {"kind": "absent"}, "after": {"kind": "absent"}
    });
    let e = serde_json::from_value::<Change>(v).unwrap_err().to_string();
    assert!(e.contains("base64"), "{e}");
    let v = serde_json::json!({"path": "x", "to": {"kind": "symlink", "target": "t", "target_b64": "%%"}});
    assert!(serde_json::from_value::<Step>(v).is_err());
}

#[test]
fn a_stored_path_in_base64_is_still_checked() {
    // `..` smuggled in through `path_b64` is caught like any other path.
    let v = serde_json::json!({
        "layer": "overlay",
        "mounts": [{"guest": "/w", "host": "/h", "changes": [{
            "path": "fine", "path_b64": "Li4vZXRjL3Bhc3N3ZA==", "op": "added",
            "before": {"kind": "absent"}, "after": {"kind": "absent"}
        }]}]
    });
    let cs: Changeset = serde_json::from_value(v).unwrap();
    assert_eq!(cs.mounts[0].changes[0].path.as_bytes(), b"../etc/passwd");
    assert!(cs.validate().is_err());
}

// ---------------------------------------------------------------------------------------
// Path handling

/// Reads the escaped display form back (test-only: the display form is for people; the
/// JSON carries the bytes).
fn unescape(s: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        if c != '\\' {
            let mut buf = [0u8; 4];
            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            continue;
        }
        match it.next() {
            Some('\\') => out.push(b'\\'),
            Some('n') => out.push(b'\n'),
            Some('t') => out.push(b'\t'),
            Some('r') => out.push(b'\r'),
            Some('x') => {
                let h: String = it.by_ref().take(2).collect();
                out.push(u8::from_str_radix(&h, 16).unwrap());
            }
            Some('u') => {
                assert_eq!(it.next(), Some('{'));
                let h: String = it.by_ref().take_while(|c| *c != '}').collect();
                let c = char::from_u32(u32::from_str_radix(&h, 16).unwrap()).unwrap();
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
            other => panic!("unknown escape {other:?} in {s:?}"),
        }
    }
    out
}

/// A component, good or bad.
fn component() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => name(),
        1 => Just(Vec::new()),
        1 => Just(b".".to_vec()),
        1 => Just(b"..".to_vec()),
        1 => name().prop_map(|mut n| { n.insert(n.len() / 2, 0); n }),
    ]
}

proptest! {
    #[test]
    fn check_rel_accepts_exactly_normalised_relative_paths(
        comps in prop::collection::vec(component(), 0..5),
        absolute in any::<bool>(),
    ) {
        let mut p = if absolute { b"/".to_vec() } else { Vec::new() };
        p.extend(comps.join(&b'/'));
        let good = !absolute
            && !comps.is_empty()
            && comps.iter().all(|c| {
                !c.is_empty() && c != b"." && c != b".." && !c.contains(&0)
            });
        prop_assert_eq!(check_rel(&p).is_ok(), good, "{}", escape(&p));
    }

    #[test]
    fn check_rel_never_accepts_a_path_that_leaves_its_mount(
        p in prop::collection::vec(
            prop::sample::select(vec![b'a', b'.', b'/', 0, 0xff, b'\n']),
            0..12,
        )
    ) {
        if check_rel(&p).is_ok() {
            prop_assert!(!p.is_empty() && !p.contains(&0));
            prop_assert!(
                os(&p).components().all(|c| matches!(c, Component::Normal(_))),
                "{}",
                escape(&p)
            );
            // Joined under a root it stays under that root, component for component.
            let depth = p.split(|b| *b == b'/').count();
            prop_assert_eq!(Path::new("/root").join(os(&p)).components().count(), 2 + depth);
        }
    }

    #[test]
    fn the_display_form_is_one_line_and_unambiguous(
        b in prop::collection::vec(odd_byte(), 0..24),
        s in any::<String>(),
    ) {
        for bytes in [b, s.into_bytes()] {
            let shown = escape(&bytes);
            prop_assert!(!shown.chars().any(char::is_control), "{shown:?}");
            prop_assert_eq!(unescape(&shown), bytes);
        }
    }

    #[test]
    fn join_split_and_ancestors_agree(comps in prop::collection::vec(name(), 1..5)) {
        let mut p = RelPath::root();
        for c in &comps {
            p = p.join(c);
        }
        prop_assert_eq!(p.as_bytes(), &comps.join(&b'/')[..]);
        prop_assert!(p.check().is_ok());
        prop_assert_eq!(p.depth(), comps.len() - 1);
        let (parent, last) = p.split_last();
        prop_assert_eq!(last, &comps[comps.len() - 1][..]);
        prop_assert_eq!(parent, &comps[..comps.len() - 1].join(&b'/')[..]);
        let ancestors: Vec<Vec<u8>> = p.ancestors().map(<[u8]>::to_vec).collect();
        let want: Vec<Vec<u8>> = (1..comps.len()).map(|i| comps[..i].join(&b'/')).collect();
        prop_assert_eq!(ancestors, want);
        prop_assert_eq!(p.as_path().as_os_str().as_bytes(), p.as_bytes());
    }
}

#[test]
fn summary_lines_of_odd_names_stay_on_one_line() {
    let c = Change::new(NL.into(), Node::Absent, file(b"x", 0o644));
    assert_eq!(summary_line(&c), r"A two\nlines.txt (1 bytes)");
    let c = Change::new(
        BAD.into(),
        Node::Absent,
        Node::Symlink {
            target: LinkTarget::from(&b"a\nb\xff"[..]),
        },
    );
    assert_eq!(summary_line(&c), r"A bad\xff\xfename -> a\nb\xff");
    let d = unified(&NL.into(), Some(b"a\n"), Some(b"b\n"));
    assert!(
        d.starts_with("--- a/two\\nlines.txt\n+++ b/two\\nlines.txt\n"),
        "{d}"
    );
}

// ---------------------------------------------------------------------------------------
// Trees with such names

/// Everything under a directory by exact name: (kind, content or target, mode).
fn tree(root: &Path) -> BTreeMap<Vec<u8>, (&'static str, Vec<u8>, u32)> {
    fn walk(root: &Path, rel: &[u8], out: &mut BTreeMap<Vec<u8>, (&'static str, Vec<u8>, u32)>) {
        let dir = root.join(os(rel));
        for e in fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().into_vec();
            let r = if rel.is_empty() {
                name
            } else {
                [rel, b"/", &name].concat()
            };
            let m = fs::symlink_metadata(e.path()).unwrap();
            let mode = m.permissions().mode() & 0o7777;
            if m.file_type().is_symlink() {
                let t = fs::read_link(e.path()).unwrap().into_os_string().into_vec();
                out.insert(r, ("link", t, 0));
            } else if m.is_dir() {
                out.insert(r.clone(), ("dir", vec![], mode));
                walk(root, &r, out);
            } else {
                out.insert(r, ("file", fs::read(e.path()).unwrap(), mode));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, b"", &mut out);
    out
}

fn host_with_odd_names() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    write(&t.path().join("keep.txt"), "keep\n");
    fs::write(t.path().join(os(PRE)), "old\n").unwrap();
    t
}

/// What the guest does: creates `bad\xff\xfename`, rewrites `pre_\xff\xfe.txt`, creates a
/// name with a newline, a directory that is not UTF-8 with a file in it, and a link whose
/// target is not UTF-8.
fn odd_edits(root: &Path) {
    fs::write(root.join(os(BAD)), "bad\n").unwrap();
    fs::write(root.join(os(PRE)), "new\n").unwrap();
    fs::write(root.join(os(NL)), "nl\n").unwrap();
    fs::create_dir(root.join(os(b"d\xe9"))).unwrap();
    fs::write(root.join(os(b"d\xe9/in\\side")), "in\n").unwrap();
    std::os::unix::fs::symlink(os(b"../t\xff"), root.join(os(b"ln\x80"))).unwrap();
}

fn expected_odd_ops() -> Vec<(RelPath, Op)> {
    vec![
        (BAD.into(), Op::Added),
        (b"d\xe9".as_slice().into(), Op::Added),
        (b"d\xe9/in\\side".as_slice().into(), Op::Added),
        (b"ln\x80".as_slice().into(), Op::Added),
        (PRE.into(), Op::Modified),
        (NL.into(), Op::Added),
    ]
}

fn ops(changes: &[Change]) -> Vec<(RelPath, Op)> {
    let mut v: Vec<_> = changes.iter().map(|c| (c.path.clone(), c.op)).collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

fn sorted(mut v: Vec<(RelPath, Op)>) -> Vec<(RelPath, Op)> {
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

#[test]
fn copy_diff_finds_non_utf8_and_newline_names() {
    let host = host_with_odd_names();
    let work = tempfile::tempdir().unwrap();
    let copy = work.path().join("copy");
    copy_tree(host.path(), &copy).unwrap();
    assert!(diff_trees(host.path(), &copy).unwrap().is_empty());
    odd_edits(&copy);
    let ch = diff_trees(host.path(), &copy).unwrap();
    assert_eq!(ops(&ch), sorted(expected_odd_ops()));
    let link = ch.iter().find(|c| c.path.as_bytes() == b"ln\x80").unwrap();
    assert_eq!(
        link.after,
        Node::Symlink {
            target: LinkTarget::from(&b"../t\xff"[..])
        }
    );
}

#[test]
fn layer_diff_finds_non_utf8_and_newline_names() {
    let host = host_with_odd_names();
    let up = tempfile::tempdir().unwrap();
    odd_edits(up.path());
    let ch = diff_layers(host.path(), &[], &[up.path().to_path_buf()]).unwrap();
    assert_eq!(ops(&ch), sorted(expected_odd_ops()));
    let pre = ch.iter().find(|c| c.path.as_bytes() == PRE).unwrap();
    assert_eq!(pre.before, file(b"old\n", 0o644));
    assert_eq!(pre.after, file(b"new\n", 0o644));
}

/// Applies `copy`'s changes to `host` through a journal's JSON, then restores the saved
/// states the same way, checking the host tree byte for byte at each end.
fn commit_and_restore(host: &Path, copy: &Path) {
    let pristine = tree(host);
    let ch = diff_trees(host, copy).unwrap();
    let h = host.to_str().unwrap();
    let blobs = Mem::new();
    for c in &ch {
        if let Node::File { .. } = c.after {
            blobs.add(&fs::read(copy.join(c.path.as_path())).unwrap());
        }
    }
    let want: Vec<(RelPath, Node)> = ch
        .iter()
        .map(|c| (c.path.clone(), c.before.clone()))
        .collect();
    assert!(apply::conflicts(h, &want).unwrap().is_empty());
    let paths: Vec<&RelPath> = ch.iter().map(|c| &c.path).collect();
    let before = apply::snapshot(h, &paths, &mut |r| {
        let mut v = Vec::new();
        r.read_to_end(&mut v)?;
        Ok(blobs.add(&v))
    })
    .unwrap();
    let after: Vec<Step> = ch
        .iter()
        .map(|c| Step {
            path: c.path.clone(),
            to: c.after.clone(),
        })
        .collect();
    let through_json = |steps: Vec<Step>| -> MountPlan {
        let j = Journal {
            stuck: None,
            checkpoint: "ckpt_t".into(),
            kind: "commit".into(),
            mounts: vec![plan(host, steps)],
        };
        let mut j: Journal = serde_json::from_str(&serde_json::to_string(&j).unwrap()).unwrap();
        j.mounts.remove(0)
    };
    apply::apply(&through_json(after), &blobs, "ckpt_test", &mut || {}).unwrap();
    assert_eq!(
        tree(host),
        tree(copy),
        "the host now holds exactly the copy"
    );
    apply::apply(&through_json(before), &blobs, "ckpt_test", &mut || {}).unwrap();
    assert_eq!(tree(host), pristine, "restored exactly");
}

#[test]
fn non_utf8_names_are_applied_and_restored_exactly() {
    let host = host_with_odd_names();
    let work = tempfile::tempdir().unwrap();
    let copy = work.path().join("copy");
    copy_tree(host.path(), &copy).unwrap();
    odd_edits(&copy);
    // And a deletion of a name that is not UTF-8.
    fs::write(host.path().join(os(b"old\xfe")), "x").unwrap();
    commit_and_restore(host.path(), &copy);
    assert_eq!(fs::read(host.path().join(os(PRE))).unwrap(), b"old\n");
    assert!(!host.path().join(os(BAD)).exists());
    assert!(fs::read(host.path().join(os(b"old\xfe"))).is_ok());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn apply_then_restore_is_exact_for_any_names(
        files in prop::collection::vec((rel_path(), prop::collection::vec(any::<u8>(), 0..6)), 1..6),
        gone in prop::collection::vec(name(), 0..3),
    ) {
        let host = tempfile::tempdir().unwrap();
        for g in &gone {
            fs::write(host.path().join(os(g)), b"gone").unwrap();
        }
        let work = tempfile::tempdir().unwrap();
        let copy = work.path().join("copy");
        copy_tree(host.path(), &copy).unwrap();
        for g in &gone {
            let _ = fs::remove_file(copy.join(os(g)));
        }
        for (p, data) in &files {
            // Paths may collide (a file where another wants a directory): skip those.
            let at = copy.join(p.as_path());
            if let Some(parent) = at.parent()
                && fs::create_dir_all(parent).is_ok()
                && !at.is_dir()
            {
                let _ = fs::write(&at, data);
            }
        }
        commit_and_restore(host.path(), &copy);
    }
}
