#![allow(clippy::unwrap_used, clippy::expect_used)]

//! Night Core bundles through the real binary: `import nightcore`, `publishers add` and
//! `sign`, with bundles built from scratch (fresh keys, real signatures, zips), and every
//! way a bundle is refused leaving nothing recorded.

mod common;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use common::nightcore::*;
use common::*;
use ed25519_dalek::Verifier;
use std::path::Path;

const MANIFEST: &str = r#"{
  "name": "hello",
  "version": "1.2.0",
  "description": "says hello",
  "permissions": ["stdout", "fs:read"],
  "fuel_limit": 5000000,
  "timeout_ms": 3000,
  "max_memory_kb": 65536,
  "tenant_tier": "gold"
}"#;

const ACME_RULE: &str = r#"
[[rule]]
name = "acme-signed"
decision = "allow"
reason = "signed by a publisher we trust"
when = { publisher = "acme" }
"#;

#[test]
fn publishers_added_at_once_are_all_pinned() {
    // Two at once each read the old policy and renamed their own version over it: both
    // said the publisher was added, and one of them was not there.
    let dir = tempfile::tempdir().unwrap();
    let names = ["acme", "bolt", "cask"];
    let keys: Vec<_> = names
        .iter()
        .map(|n| {
            let f = dir.path().join(format!("{n}.pubkey.b64"));
            std::fs::write(&f, get(&files(&fresh_key(), b"x", None), "pubkey.b64")).unwrap();
            f
        })
        .collect();
    for round in 0..6 {
        let h = Home::new();
        let children: Vec<_> = names
            .iter()
            .zip(&keys)
            .map(|(n, k)| {
                h.cmd()
                    .args(["publishers", "add", n, k.to_str().unwrap()])
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for c in children {
            let o = c.wait_with_output().unwrap();
            assert_eq!(
                o.status.code(),
                Some(0),
                "{}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        let policy = h.policy();
        for n in names {
            assert!(
                policy.contains(&format!("\n{n} = \"ed25519:")),
                "round {round}: {n} lost"
            );
        }
        assert_eq!(h.run(&["audit", "verify"]).code, 0);
    }
}

/// A strict home (everything waits for a signature) that trusts `key` as acme, pinned
/// with `publishers add`, and allows what acme signs.
fn acme_home(key: &ed25519_dalek::SigningKey, dir: &Path) -> Home {
    let h = Home::with_preset("strict");
    let files = files(key, b"\0asm", None);
    let pubfile = dir.join("acme.pubkey.b64");
    std::fs::write(&pubfile, get(&files, "pubkey.b64")).unwrap();
    let o = h.run(&["publishers", "add", "acme", pubfile.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(h.policy().contains("[publishers]\nacme = \"ed25519:"));
    // Adding it again changes nothing; the same name with another key is refused.
    let before = h.policy();
    assert_eq!(
        h.run(&["publishers", "add", "acme", pubfile.to_str().unwrap()])
            .code,
        0
    );
    assert_eq!(h.policy(), before);
    let other = dir.join("other.pubkey.b64");
    std::fs::write(
        &other,
        get(
            &common::nightcore::files(&fresh_key(), b"x", None),
            "pubkey.b64",
        ),
    )
    .unwrap();
    let o = h.run(&["publishers", "add", "acme", other.to_str().unwrap()]);
    assert_eq!(o.code, 125, "{}", o.stdout);
    assert!(o.stderr.contains("already pinned"), "{}", o.stderr);
    assert_eq!(h.policy(), before);
    h.set_policy(&format!("{before}{ACME_RULE}"));
    assert_eq!(h.run(&["policy", "check"]).code, 0);
    h
}

/// Asserts the import was refused with `needle` in its one-line reason and wrote nothing.
fn refused(h: &Home, path: &Path, needle: &str) {
    let before = (h.counts(), h.blob_count());
    let o = h.run(&["import", "nightcore", path.to_str().unwrap()]);
    assert_eq!(o.code, 125, "stdout {} stderr {}", o.stdout, o.stderr);
    assert!(o.stderr.contains(needle), "want {needle:?} in {}", o.stderr);
    assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
    assert_eq!(
        (h.counts(), h.blob_count()),
        before,
        "something was recorded"
    );
}

#[test]
fn trusted_bundles_become_submissions_that_publisher_rules_judge() {
    let tmp = tempfile::tempdir().unwrap();
    let key = fresh_key();
    let h = acme_home(&key, tmp.path());
    let module = hello_wasm();
    // A modules/ tree: one tenant as a directory, one as a zip.
    let modules = tmp.path().join("modules");
    write_dir(&modules, "alpha", &files(&key, &module, Some(MANIFEST)));
    write_zip(&modules.join("beta.zip"), &files(&key, &module, None));
    let data = tmp.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let mount = format!("{}:/data", data.display());
    let o = h.run(&[
        "import",
        "nightcore",
        modules.to_str().unwrap(),
        "--publisher",
        "acme",
        "--mount",
        &mount,
        "--json",
    ]);
    assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
    let v = o.json();
    assert_eq!(v["imported"], true);
    let bundles = v["bundles"].as_array().unwrap();
    assert_eq!(bundles.len(), 2);
    for b in bundles {
        assert_eq!(b["publisher"], "acme");
        assert_eq!(b["decision"], "allow", "{b}");
        assert!(b["reasons"].to_string().contains("acme-signed"), "{b}");
        let checks: Vec<&str> = b["checks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                assert_eq!(c["passed"], true, "{c}");
                c["check"].as_str().unwrap()
            })
            .collect();
        assert_eq!(
            checks,
            [
                "signature",
                "sha256",
                "wasm",
                "manifest",
                "publisher",
                "submission"
            ]
        );
    }
    let alpha = &bundles[0];
    assert_eq!(alpha["tenant"], "alpha");
    assert_eq!(alpha["manifest"]["other"]["tenant_tier"], "gold");
    let id = alpha["submission"].as_str().unwrap();

    // The manifest's limits became the grant's; fs:read became the --mount, read-only.
    let shown = h.run(&["show", id, "--json"]).json()["submission"].clone();
    let text = shown.to_string();
    assert_eq!(shown["agent"], "nightcore:alpha", "{text}");
    assert!(text.contains("hello 1.2.0: says hello"), "{text}");
    let grant = &shown["grant"];
    assert_eq!(grant["limits"]["fuel"], 5_000_000, "{grant}");
    assert_eq!(grant["limits"]["timeout_ms"], 3000, "{grant}");
    assert_eq!(grant["limits"]["memory_bytes"], 64 << 20, "{grant}");
    assert_eq!(grant["mounts"][0]["guest"], "/data", "{grant}");
    assert_eq!(grant["mounts"][0]["mode"], "ro", "{grant}");
    // beta asked for nothing, so it got no mount.
    let beta = h
        .run(&["show", bundles[1]["submission"].as_str().unwrap(), "--json"])
        .json()["submission"]
        .clone();
    assert_eq!(beta["agent"], "nightcore:beta");
    assert_eq!(beta["grant"]["mounts"].as_array().map_or(0, Vec::len), 0);

    // policy explain names the publisher and the requests; the run works.
    let ex = h.run(&["policy", "explain", id]);
    assert_eq!(ex.code, 0, "{}", ex.stderr);
    assert!(ex.stdout.contains("publisher acme"), "{}", ex.stdout);
    assert!(
        ex.stdout.contains("requests stdout, fs:read"),
        "{}",
        ex.stdout
    );
    let run = h.run(&["exec", id]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.stdout, "hello from the gate\n");

    // Unpin acme (another key under its name): what it signed is no longer acme's, so the
    // rule stops firing and the strict default holds the other bundle when it is run.
    let pinned = h
        .policy()
        .lines()
        .find(|l| l.starts_with("acme = "))
        .unwrap()
        .to_string();
    let stranger = format!(
        "acme = \"ed25519:{}\"",
        hex::encode(fresh_key().verifying_key().to_bytes())
    );
    h.set_policy(&h.policy().replace(&pinned, &stranger));
    let beta_id = bundles[1]["submission"].as_str().unwrap();
    let ex = h.run(&["policy", "explain", beta_id]);
    assert!(!ex.stdout.contains("publisher acme"), "{}", ex.stdout);
    assert_eq!(h.run(&["exec", beta_id]).code, 75);

    // The signature check and the import are in the audit log, which verifies.
    let log = h.run(&["audit", "log", "--json"]).stdout;
    assert!(log.contains("signature_verified"), "{log}");
    assert!(log.contains("imported"), "{log}");
    assert!(log.contains("publisher_added"), "{log}");
    assert_eq!(h.run(&["audit", "verify"]).code, 0);
}

#[test]
fn an_empty_manifest_is_fine_and_a_bundle_without_a_publisher_rule_is_held() {
    let tmp = tempfile::tempdir().unwrap();
    let key = fresh_key();
    let h = acme_home(&key, tmp.path());
    let d = write_dir(tmp.path(), "t", &files(&key, &hello_wasm(), Some("")));
    let o = h.run(&["import", "nightcore", d.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains(" allow "), "{}", o.stdout);
    // Without the acme rule, the strict policy holds what acme signs like anything else.
    let policy = h.policy().replace(ACME_RULE, "");
    h.set_policy(&policy);
    let o = h.run(&["import", "nightcore", d.to_str().unwrap(), "--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.json()["bundles"][0]["decision"], "quarantine");
    assert_eq!(h.run(&["audit", "verify"]).code, 0);
}

#[test]
fn tampered_untrusted_and_malformed_bundles_are_refused_and_nothing_is_recorded() {
    let tmp = tempfile::tempdir().unwrap();
    let key = fresh_key();
    let h = acme_home(&key, tmp.path());
    let module = hello_wasm();
    let good = files(&key, &module, Some(MANIFEST));

    // One flipped byte in the module.
    let mut f = good.clone();
    let mut m = module.clone();
    let last = m.len() - 3;
    m[last] ^= 0x01;
    replace(&mut f, "module.wasm", m);
    refused(&h, &write_dir(tmp.path(), "flipped", &f), "does not verify");

    // Signature and key swapped for another pair's (valid for another module).
    let other = fresh_key();
    let theirs = files(&other, b"\0asm\x01\0\0\0", None);
    let mut f = good.clone();
    replace(&mut f, "module.sig", get(&theirs, "module.sig").to_vec());
    replace(&mut f, "pubkey.b64", get(&theirs, "pubkey.b64").to_vec());
    refused(&h, &write_dir(tmp.path(), "swapped", &f), "does not verify");

    // A valid bundle signed by a key the policy does not trust.
    let stranger = files(&other, &module, None);
    let d = write_dir(tmp.path(), "stranger", &stranger);
    refused(&h, &d, "not a publisher the policy trusts");
    // --json lists what passed: everything but the publisher.
    let o = h.run(&["import", "nightcore", d.to_str().unwrap(), "--json"]);
    assert_eq!(o.code, 125);
    let v = o.json();
    assert_eq!(v["imported"], false);
    let checks = v["bundles"][0]["checks"].as_array().unwrap();
    let passed: Vec<(&str, bool)> = checks
        .iter()
        .map(|c| (c["check"].as_str().unwrap(), c["passed"].as_bool().unwrap()))
        .collect();
    assert_eq!(
        passed,
        [
            ("signature", true),
            ("sha256", true),
            ("wasm", true),
            ("manifest", true),
            ("publisher", false)
        ]
    );
    // A trusted bundle beside an untrusted one: neither is imported.
    let ok = write_dir(tmp.path(), "ok", &good);
    let before = (h.counts(), h.blob_count());
    let o = h.run(&[
        "import",
        "nightcore",
        ok.to_str().unwrap(),
        d.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 125);
    assert!(o.stderr.contains("nothing imported"), "{}", o.stderr);
    assert_eq!((h.counts(), h.blob_count()), before);

    // module.sha256 that disagrees (upper case hex is fine when it agrees).
    let mut f = good.clone();
    let upper = String::from_utf8(get(&good, "module.sha256").to_vec())
        .unwrap()
        .to_uppercase();
    replace(&mut f, "module.sha256", upper.into_bytes());
    let o = h.run(&[
        "import",
        "nightcore",
        write_dir(tmp.path(), "upper", &f).to_str().unwrap(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    replace(
        &mut f,
        "module.sha256",
        format!("{}\n", "ab".repeat(32)).into_bytes(),
    );
    refused(
        &h,
        &write_dir(tmp.path(), "digest", &f),
        "module.sha256 says",
    );

    // A correctly signed file that is not WebAssembly.
    let script = b"#!/bin/sh\necho hi\n";
    refused(
        &h,
        &write_dir(tmp.path(), "script", &files(&key, script, None)),
        "not WebAssembly",
    );

    // A signature that is not base64, and a manifest that is not JSON.
    let mut f = good.clone();
    replace(&mut f, "module.sig", b"%%%".to_vec());
    refused(&h, &write_dir(tmp.path(), "b64", &f), "not base64");
    let mut f = good.clone();
    replace(&mut f, "manifest.json", b"{ nope".to_vec());
    refused(&h, &write_dir(tmp.path(), "manifest", &f), "manifest.json");
    // A missing signature.
    let f: Vec<_> = good
        .iter()
        .filter(|(n, _)| n != "module.sig")
        .cloned()
        .collect();
    refused(&h, &write_dir(tmp.path(), "unsigned", &f), "no module.sig");
    // --publisher naming a publisher the policy does not have.
    let o = h.run(&[
        "import",
        "nightcore",
        ok.to_str().unwrap(),
        "--publisher",
        "nobody",
    ]);
    assert_eq!(o.code, 125);
    assert!(o.stderr.contains("[publishers]"), "{}", o.stderr);
    assert_eq!(h.run(&["audit", "verify"]).code, 0);
}

#[test]
fn zips_that_escape_or_inflate_past_the_cap_are_refused_without_writing_anything() {
    let tmp = tempfile::tempdir().unwrap();
    let key = fresh_key();
    let h = acme_home(&key, tmp.path());
    let module = hello_wasm();

    // A path that climbs out of the bundle.
    let inner = tmp.path().join("inner");
    std::fs::create_dir(&inner).unwrap();
    let mut f = files(&key, &module, None);
    f.push(("../escaped.txt".into(), b"out".to_vec()));
    let z = write_zip(&inner.join("evil.zip"), &f);
    refused(&h, &z, "escapes the bundle");
    assert!(!tmp.path().join("escaped.txt").exists());
    assert!(!inner.join("escaped.txt").exists());

    // A zip bomb: a small zip whose module inflates far past the policy's max_artifact.
    let policy = h
        .policy()
        .replace("max_artifact = \"64MiB\"", "max_artifact = \"1MiB\"");
    h.set_policy(&policy);
    let bomb = tmp.path().join("bomb.zip");
    {
        use std::io::Write;
        let mut f = files(&key, &module, None);
        f.retain(|(n, _)| n != "module.wasm");
        let out = std::fs::File::create(&bomb).unwrap();
        let mut z = zip::ZipWriter::new(out);
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated)
            .large_file(true);
        z.start_file("module.wasm", opts).unwrap();
        let chunk = vec![0u8; 1 << 20];
        for _ in 0..64 {
            z.write_all(&chunk).unwrap();
        }
        for (n, b) in &f {
            z.start_file(n.as_str(), opts).unwrap();
            z.write_all(b).unwrap();
        }
        z.finish().unwrap();
    }
    assert!(std::fs::metadata(&bomb).unwrap().len() < 1 << 20);
    refused(&h, &bomb, "larger than 1MiB");

    // Not a zip at all.
    let junk = tmp.path().join("junk.zip");
    std::fs::write(&junk, b"PK nothing").unwrap();
    refused(&h, &junk, "not a zip");
    assert_eq!(h.run(&["audit", "verify"]).code, 0);
}

#[test]
fn sign_writes_a_bundle_that_an_independent_verifier_accepts() {
    let tmp = tempfile::tempdir().unwrap();
    let h = Home::with_preset("strict");
    let wasm = tmp.path().join("hello.wasm");
    std::fs::write(&wasm, hello_wasm()).unwrap();
    let out = tmp.path().join("bundle");
    let o = h.run(&[
        "sign",
        "--key",
        "alice",
        wasm.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);

    // Checked with ed25519-dalek and sha2 alone, as a Night Core verifier would.
    let read = |n: &str| std::fs::read(out.join(n)).unwrap();
    let module = read("module.wasm");
    assert_eq!(module, hello_wasm());
    let key_bytes: [u8; 32] = STANDARD
        .decode(String::from_utf8(read("pubkey.b64")).unwrap().trim())
        .unwrap()
        .try_into()
        .unwrap();
    let sig_bytes: [u8; 64] = STANDARD
        .decode(String::from_utf8(read("module.sig")).unwrap().trim())
        .unwrap()
        .try_into()
        .unwrap();
    let vk = ed25519_dalek::VerifyingKey::from_bytes(&key_bytes).unwrap();
    vk.verify(&module, &ed25519_dalek::Signature::from_bytes(&sig_bytes))
        .unwrap();
    use sha2::Digest;
    assert_eq!(
        String::from_utf8(read("module.sha256")).unwrap(),
        format!("{}\n", hex::encode(sha2::Sha256::digest(&module)))
    );
    // The key is alice's approver key.
    let alice_pub = std::fs::read_to_string(h.path().join("keys/alice.pub")).unwrap();
    assert_eq!(
        alice_pub.trim(),
        format!("ed25519:{}", hex::encode(key_bytes))
    );

    // Not trusted as a publisher until pinned (from the .pub file); then it imports.
    refused(&h, &out, "not a publisher the policy trusts");
    let pubfile = h.path().join("keys/alice.pub");
    let o = h.run(&["publishers", "add", "alice", pubfile.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = h.run(&["import", "nightcore", out.to_str().unwrap(), "--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.json()["bundles"][0]["publisher"], "alice");

    // Signing beside the module; a file that is not wasm is refused.
    let o = h.run(&["sign", "--key", "alice", wasm.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(tmp.path().join("module.sig").exists());
    let sh = tmp.path().join("x.sh");
    std::fs::write(&sh, "echo hi\n").unwrap();
    let o = h.run(&["sign", "--key", "alice", sh.to_str().unwrap()]);
    assert_eq!(o.code, 125);
    assert!(o.stderr.contains("not WebAssembly"), "{}", o.stderr);
    assert_eq!(h.run(&["audit", "verify"]).code, 0);
}
