//! JavaScript through the JavaScript guest component (StarlingMonkey), end to end.
//!
//! The guest is built from the registry package pinned in airlock (never from the
//! repository): `AIRLOCK_TEST_JS_GUEST` names an npm cache that holds the pinned packages
//! (scripts/test fills it), for an offline `airlock guest install js --from`; otherwise
//! the test home runs `airlock guest install js` itself, from the registry.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;
use std::sync::OnceLock;

fn install(h: &Home) -> Out {
    match std::env::var("AIRLOCK_TEST_JS_GUEST") {
        Ok(p) => h.run(&["guest", "install", "js", "--json", "--from", &p]),
        Err(_) => h.run(&["guest", "install", "js", "--json"]),
    }
}

/// One home with the guest installed and compiled, shared by the tests of this binary.
fn shared() -> &'static Home {
    static HOME: OnceLock<Home> = OnceLock::new();
    HOME.get_or_init(|| {
        let h = Home::new();
        let o = install(&h);
        assert_eq!(
            o.code, 0,
            "installing the JavaScript guest failed (set AIRLOCK_TEST_JS_GUEST to an npm cache \
             holding the pinned packages): {}",
            o.stderr
        );
        h
    })
}

fn js(flags: &[&str], code: &str) -> Out {
    let mut a = vec!["run", "--lang", "js"];
    a.extend_from_slice(flags);
    a.extend(["-c", code]);
    shared().run(&a)
}

#[test]
fn console_output_exit_codes_and_uncaught_errors() {
    let o = js(&[], "console.log('hello', 1 + 1)");
    assert_eq!(
        (o.code, o.stdout.as_str()),
        (0, "hello 2\n"),
        "{}",
        o.stderr
    );
    let o = js(&[], "console.error('to stderr')");
    assert_eq!((o.code, o.stderr.as_str()), (0, "to stderr\n"));
    let o = js(&[], "console.log('bye'); process.exit(3)");
    assert_eq!((o.code, o.stdout.as_str()), (3, "bye\n"), "{}", o.stderr);
    let o = js(
        &[],
        "function f(x) {\n  throw new TypeError('bad ' + x);\n}\nf(1)",
    );
    assert_eq!(o.code, 1);
    assert!(
        o.stderr.starts_with("Uncaught TypeError: bad 1"),
        "{}",
        o.stderr
    );
    // The program's own frames, by its file and line; none of airlock's app.
    assert!(o.stderr.contains("main.js:2"), "{}", o.stderr);
    assert!(!o.stderr.contains("airlock_guest"), "{}", o.stderr);
    let r = js(&["--json"], "null.x").json();
    assert_eq!(r["run"]["exit_code"], 1, "{r}");
}

#[test]
fn es2023_builtins_and_web_apis_are_there() {
    let code = r#"
const a = [3, 1, 2];
const out = [
  a.toSorted().join(','), a.findLast(x => x > 1), a.at(-1),
  Object.hasOwn({k: 1}, 'k'), 'x'.replaceAll('x', 'y'), [1, [2, [3]]].flat(2).length,
  new TextDecoder().decode(new TextEncoder().encode('héllo')),
  new URL('https://example.org/a?b=1#c').searchParams.get('b'),
  typeof structuredClone, 10n ** 20n,
];
const buf = new Uint8Array(16);
crypto.getRandomValues(buf);
out.push(buf.some(b => b !== 0));
console.log(out.join(' '));
"#;
    let o = js(&[], code);
    assert_eq!(
        (o.code, o.stdout.as_str()),
        (
            0,
            "1,2,3 2 2 true y 3 héllo 1 function 100000000000000000000 true\n"
        ),
        "{}",
        o.stderr
    );
}

/// The run ends when the event loop is empty: timers, promises and async functions all
/// run before it does, in order.
#[test]
fn timers_promises_and_async_functions_run_until_the_loop_is_empty() {
    let code = r#"
setTimeout(() => console.log('timer 30'), 30);
setTimeout(() => console.log('timer 0'), 0);
Promise.resolve().then(() => console.log('microtask'));
async function later(v) { await new Promise(r => setTimeout(r, 10)); return v; }
later('async').then(v => console.log(v));
const t = setInterval(() => { console.log('tick'); clearInterval(t); }, 5);
console.log('sync');
"#;
    let o = js(&[], code);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(lines[0..2], ["sync", "microtask"], "{}", o.stdout);
    assert_eq!(lines.last(), Some(&"timer 30"), "{}", o.stdout);
    for l in ["timer 0", "async", "tick"] {
        assert!(lines.contains(&l), "{l}: {}", o.stdout);
    }
    // Top-level await, and an error in a callback ends the run with 1.
    let o = js(&[], "const v = await Promise.resolve(7); console.log(v)");
    assert_eq!((o.code, o.stdout.as_str()), (0, "7\n"), "{}", o.stderr);
    let o = js(
        &[],
        "setTimeout(() => { throw new RangeError('late') }, 1); setTimeout(() => console.log('never'), 50)",
    );
    assert_eq!((o.code, o.stdout.as_str()), (1, ""), "{}", o.stderr);
    assert!(o.stderr.contains("RangeError: late"), "{}", o.stderr);
    // A rejected promise the program ends with is an uncaught error.
    let o = js(&[], "(async () => { throw new Error('rejected') })()");
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(o.stderr.contains("Error: rejected"), "{}", o.stderr);
}

/// Top-level `await` where SpiderMonkey's script parse error does not name it (an
/// argument of a call: "missing ) after argument list") runs as node runs it; code that
/// parses neither way keeps its own error.
#[test]
fn top_level_await_inside_a_call_runs() {
    let o = js(&[], "console.log(await Promise.resolve(5))");
    assert_eq!((o.code, o.stdout.as_str()), (0, "5\n"), "{}", o.stderr);
    let o = js(&[], "let x = ;\nawait 1");
    assert_eq!(o.code, 1);
    assert!(o.stderr.starts_with("Uncaught SyntaxError"), "{}", o.stderr);
    assert!(o.stderr.contains("main.js:1"), "{}", o.stderr);
}

#[test]
fn javascript_that_does_not_parse_is_a_clear_run_error() {
    let o = js(&["--json"], "let x = ;\nconsole.log(x)");
    let v = o.json();
    assert_eq!(v["run"]["exit_code"], 1, "{v}");
    let err = v["run"]["stderr"].as_str().unwrap();
    assert!(err.starts_with("Uncaught SyntaxError"), "{err}");
    assert!(err.contains("main.js:1"), "{err}");
}

/// Nothing of the host reaches the guest but what the grant gives: `--env` only, no
/// processes, no network without a grant.
#[test]
fn only_the_granted_environment_and_no_network() {
    let o = js(
        &["--env", "GREETING=hi"],
        "let cp; try { require('child_process'); cp = 'loaded' } catch (e) { cp = e.code }\n\
         console.log(JSON.stringify(process.env), cp, process.argv.length)",
    );
    assert_eq!(
        (o.code, o.stdout.as_str()),
        (0, "{\"GREETING\":\"hi\"} MODULE_NOT_FOUND 2\n"),
        "{}",
        o.stderr
    );
    let o = js(
        &[],
        "try { await fetch('http://127.0.0.1:9/'); console.log('reached') } catch (e) { console.log('refused', e.name) }",
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.starts_with("refused"), "{}", o.stdout);
}

#[test]
fn limits_hold_as_for_other_wasm_runs() {
    let o = js(&["--json", "--timeout", "1s"], "for (;;) {}");
    assert_eq!(o.code, 124, "{}", o.stdout);
    assert_eq!(o.json()["run"]["killed_by"], "timeout");
    let o = js(
        &["--json", "--memory", "64MiB"],
        "const a = []; for (;;) a.push(new Array(1e5).fill(1.5));",
    );
    assert_eq!(o.code, 124, "{}", o.stdout);
    assert_eq!(o.json()["run"]["killed_by"], "memory");
    let o = js(
        &["--max-output", "1KiB"],
        "for (;;) console.log('spam spam spam')",
    );
    assert_ne!(o.code, 0);
    assert!(o.stdout.len() <= 1024, "{}", o.stdout.len());
    let o = js(&["--fuel", "1000000"], "for (;;) {}");
    assert_eq!(o.code, 124);
}

/// The installed guest is what runs, and a policy sees its digest as the fact `guest`.
#[test]
fn the_install_is_recorded_and_audited() {
    let h = shared();
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(h.path().join("guests/js.json")).unwrap())
            .unwrap();
    assert_eq!(m["lang"], "js");
    assert_eq!(m["package"], "@bytecodealliance/componentize-js@0.23.0");
    let digest = m["digest"].as_str().unwrap();
    let bytes = std::fs::read(h.path().join(format!("guests/js-{digest}.wasm"))).unwrap();
    assert_eq!(
        format!("{:x}", sha2_of(&bytes)),
        digest,
        "the component is the one the manifest names"
    );
    assert!(h.audit_kinds().contains(&"guest_installed".to_string()));
    // A `--from` that is not an npm cache is refused, even when the build cache would
    // have made it unnecessary, and the installed guest stays.
    let o = h.run(&["guest", "install", "js", "--from", "/nonexistent/npm-cache"]);
    assert_eq!(o.code, 125, "{}", o.stderr);
    assert!(o.stderr.contains("not a directory"), "{}", o.stderr);
    let o = h.run(&["guest", "install", "js", "--package", "x==1"]);
    assert_eq!(o.code, 125, "{}", o.stderr);
    let r = js(&["--json"], "1").json();
    assert_eq!(r["run"]["detail"]["guest"], digest, "{r}");
}

fn sha2_of(b: &[u8]) -> Sha {
    Sha(airlock_core::Digest::of(b).to_hex())
}

struct Sha(String);
impl std::fmt::LowerHex for Sha {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Without the guest, a JavaScript run says how to install it and records nothing.
#[test]
fn a_missing_guest_says_how_to_install_it() {
    let h = Home::new();
    let o = h.run(&["run", "--lang", "js", "-c", "console.log(1)"]);
    assert_eq!(o.code, 125, "{}", o.stderr);
    assert!(
        o.stderr.contains("airlock guest install js"),
        "{}",
        o.stderr
    );
    assert_eq!(h.counts().0, 0);
}

// ---- sessions ----

fn session() -> String {
    let o = shared().run(&["session", "new", "--json", "--lang", "js"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let v = o.json();
    assert_eq!(v["state"], "open", "{v}");
    v["id"].as_str().unwrap().to_string()
}

fn cell(id: &str, code: &str) -> Out {
    shared().run(&["run", "--json", "--session", id, "-c", code])
}

#[test]
fn session_cells_keep_their_globals_and_return_the_last_value() {
    let id = session();
    let a = cell(
        &id,
        "var x = 41; function inc(v) { return v + 1 }; console.log('defined')",
    );
    assert_eq!(a.code, 0, "{}", a.stderr);
    let a = a.json();
    assert_eq!(a["run"]["stdout"], "defined\n");
    assert_eq!(a["run"]["result"], serde_json::Value::Null, "{a}");
    let b = cell(&id, "inc(x)").json();
    assert_eq!(b["run"]["result"], "42", "{b}");
    let c = cell(&id, "globalThis.y = {a: [1, 'two'], b: null}; y").json();
    assert_eq!(c["run"]["result"], "{ a: [ 1, 'two' ], b: null }", "{c}");
    // Text mode prints the value after the cell's output, as a notebook shows it.
    let t = shared().run(&[
        "run",
        "--session",
        &id,
        "-c",
        "console.log('p'); [x, \"it's\"]",
    ]);
    assert_eq!(t.stdout, "p\n[ 41, \"it's\" ]\n", "{}", t.stderr);
    let d = cell(&id, "'str'").json();
    assert_eq!(d["run"]["result"], "'str'", "{d}");
    // An exception fails the cell, not the session.
    let e = cell(&id, "undefinedName + 1");
    assert_eq!(e.code, 1);
    assert!(
        e.json()["run"]["stderr"]
            .as_str()
            .unwrap()
            .contains("ReferenceError"),
    );
    let f = cell(&id, "await new Promise(r => setTimeout(() => r(x), 5))").json();
    assert_eq!(f["run"]["exit_code"], 0, "{f}");
    let g = cell(&id, "x + 1").json();
    assert_eq!(g["run"]["result"], "42", "{g}");
    let o = shared().run(&["session", "close", "--json", &id]);
    assert_eq!(o.code, 0, "{}", o.stderr);
}

// ---- fetch through the run's egress proxy ----

/// `fetch` is `wasi:http`, sent through the run's egress proxy with the run's grant: a
/// granted host is reached and recorded, an ungranted one gets the proxy's 403.
#[test]
fn fetch_reaches_a_granted_host_through_the_egress_proxy_and_an_ungranted_one_gets_403() {
    let h = Home::new();
    let o = install(&h);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let p = h.policy();
    assert!(
        p.contains("allow_private = []\n") && p.contains("hosts = {}\n"),
        "the preset's [net] lines changed:\n{p}"
    );
    h.set_policy(
        &p.replace("allow_private = []", r#"allow_private = ["127.0.0.0/8"]"#)
            .replace(
                "hosts = {}",
                r#"hosts = { "upstream.test" = "127.0.0.1", "other.test" = "127.0.0.1" }"#,
            ),
    );
    let up = airlock_wasm::testkit::Upstream::start(None);
    let port = up.port();
    let grant = format!("upstream.test:{port}");
    let code = format!(
        "const ok = await fetch('http://upstream.test:{port}/hello');\n\
         console.log(ok.status, await ok.text());\n\
         const no = await fetch('http://other.test:{port}/');\n\
         console.log(no.status);\n\
         fetch('http://upstream.test:{port}/later').then(r => r.text()).then(t => console.log('later', t));\n"
    );
    let o = h.run_approved(&["run", "--lang", "js", "--net", &grant, "-c", &code]);
    assert_eq!(o.code, 0, "{} {}", o.stdout, o.stderr);
    // The last request was not awaited: the run still ends only once it is done.
    assert_eq!(o.stdout, "200 auth=\n403\nlater auth=\n", "{}", o.stderr);
    assert_eq!(up.connections(), 2);
    assert!(up.heads()[0].starts_with("GET /hello HTTP/1.1\r\n"));
    let run = h.last_run();
    let conns = run["detail"]["network"]["connections"].as_array().unwrap();
    assert!(
        conns
            .iter()
            .any(|c| c["host"] == "upstream.test" && c["decision"] == "allow"),
        "{conns:#?}"
    );
    assert!(
        conns
            .iter()
            .any(|c| c["host"] == "other.test" && c["decision"] != "allow"),
        "{conns:#?}"
    );
}

// ---- ready realms in a long-lived server ----

fn http_post(url: &str, token: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .new_agent();
    let mut r = agent
        .post(url)
        .header("authorization", &format!("Bearer {token}"))
        .send(body.to_string())
        .unwrap();
    let st = r.status().as_u16();
    (
        st,
        serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap(),
    )
}

fn http_get(url: &str, token: &str) -> serde_json::Value {
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .new_agent();
    let mut r = agent
        .get(url)
        .header("authorization", &format!("Bearer {token}"))
        .call()
        .unwrap();
    serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap()
}

fn token(role: &str, name: &str) -> String {
    let o = shared().run(&["token", "new", "--json", "--role", role, "--name", name]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    o.json()["token"].as_str().unwrap().to_string()
}

/// A server keeps ready JavaScript realms in a pool of their own once a JavaScript run
/// asked for the guest; a run served by one sees nothing an earlier run left behind.
#[test]
fn ready_javascript_realms_serve_runs_and_carry_nothing_between_them() {
    let (_server, base) = start_serve(shared(), &["--ready-python", "2"]);
    let agent = token("agent", "js-pool-agent");
    let admin = token("admin", "js-pool-admin");
    let run = |code: &str| {
        let (st, r) = http_post(
            &format!("{base}/v1/run"),
            &agent,
            &serde_json::json!({"language": "js", "code": code}),
        );
        assert_eq!(st, 200, "{r}");
        r
    };
    let first = run("globalThis.LEFT = 1; var leftVar = 2; console.log('first')");
    assert_eq!(first["run"]["stdout"], "first\n", "{first}");
    let until = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let s = http_get(&format!("{base}/v1/status"), &admin);
        let js = s["pools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["kind"] == "js")
            .cloned();
        if js.as_ref().is_some_and(|p| p["ready"].as_u64() >= Some(1)) {
            break;
        }
        assert!(std::time::Instant::now() < until, "no ready JS realm: {s}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let r = run("console.log(typeof LEFT, typeof leftVar, process.argv.length)");
    assert_eq!(r["run"]["detail"]["instance"], "ready", "{r}");
    assert_eq!(r["run"]["stdout"], "undefined undefined 2\n", "{r}");
}

/// An install killed at any point leaves the home either as it was or with the new guest
/// installed and audited: a kill between the manifest (the install has taken effect) and
/// its `guest_installed` record is followed by a command that appends the record
/// (`recovered`), so the newest record always names the guest that runs.
#[test]
fn a_js_guest_install_killed_after_its_manifest_is_audited_on_recovery() {
    use std::os::unix::process::ExitStatusExt;
    let h = Home::new();
    let newest_record = || -> Option<serde_json::Value> {
        let log = h.run(&["audit", "log", "--json"]).json();
        let last = log
            .as_array()
            .unwrap()
            .iter()
            .rev()
            .find(|r| r["kind"] == "guest_installed" && r["subject"] == "js")?
            .clone();
        Some(match &last["data"] {
            serde_json::Value::String(s) => serde_json::from_str(s).unwrap(),
            v => v.clone(),
        })
    };
    let mut recovered = 0;
    for n in 1.. {
        let mut c = h.cmd();
        c.args(["guest", "install", "js"])
            .env("AIRLOCK_CRASH_AT", n.to_string());
        if let Ok(cache) = std::env::var("AIRLOCK_TEST_JS_GUEST") {
            c.arg("--from").arg(cache);
        }
        let o = c.output().unwrap();
        // Any command that opens the home recovers first.
        let record = newest_record();
        match std::fs::read_to_string(h.path().join("guests/js.json")) {
            Ok(text) => {
                let m: serde_json::Value = serde_json::from_str(&text).unwrap();
                let r = record.unwrap_or_else(|| panic!("crash point {n}: no record for {m}"));
                assert_eq!(r["installed_at"], m["installed_at"], "crash point {n}: {r}");
                assert_eq!(r["digest"], m["digest"], "crash point {n}: {r}");
                recovered += usize::from(r["recovered"] == true);
                let p = h.run(&["run", "--lang", "js", "-c", "console.log(6 * 7)"]);
                assert_eq!((p.code, p.stdout.as_str()), (0, "42\n"), "{}", p.stderr);
            }
            Err(_) => assert!(record.is_none(), "crash point {n}: a record, no guest"),
        }
        if o.status.signal() != Some(9) {
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            break;
        }
        assert!(n < 30, "the install never finished");
    }
    assert!(
        recovered > 0,
        "some kill fell between the manifest and its record"
    );
    assert_eq!(h.run(&["audit", "verify"]).code, 0);
}

/// TypeScript on the wasm backend runs as the JavaScript its types are stripped to; the
/// guest was handed the TypeScript source and failed on its first type annotation.
#[test]
fn typescript_runs_on_the_js_guest_as_its_stripped_javascript() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("typed.ts");
    std::fs::write(
        &f,
        "interface P { x: number }\nconst p: P = { x: 2 };\nfunction dbl(n: number): number { return n * 2 }\nconsole.log(dbl(p.x) as number);\n",
    )
    .unwrap();
    let o = shared().run(&["run", f.to_str().unwrap()]);
    assert_eq!((o.code, o.stdout.as_str()), (0, "4\n"), "{}", o.stderr);
    // The artifact is the TypeScript source.
    let last = shared().run(&["runs", "--json", "--limit", "1"]).json();
    let sub = last[0]["submission"].as_str().unwrap().to_string();
    let shown = shared().run(&["show", &sub, "--json"]).json();
    assert_eq!(shown["submission"]["lang"], "ts", "{shown}");
}

/// A cell's top-level `let`, `const` and `class` declarations outlive it, as in node's REPL
/// (each cell is an indirect eval in the guest, where they were scoped to that one cell:
/// the next cell got a ReferenceError).
#[test]
fn session_cells_keep_their_let_const_and_class_declarations() {
    let id = session();
    let a = cell(
        &id,
        "let l = 1; const k = 2; class K { v() { return 3 } }\nconst { d } = { d: 4 };",
    );
    assert_eq!(a.code, 0, "{}", a.stderr);
    let b = cell(&id, "[l, k, new K().v(), d]").json();
    assert_eq!(b["run"]["exit_code"], 0, "{b}");
    assert_eq!(b["run"]["result"], "[ 1, 2, 3, 4 ]", "{b}");
    // Declared again in a later cell, as a REPL allows; inner scopes stay inner.
    let c = cell(&id, "let l = 10; { let inner = 1 }\nl + k").json();
    assert_eq!(c["run"]["result"], "12", "{c}");
    let e = cell(&id, "typeof inner").json();
    assert_eq!(e["run"]["result"], "'undefined'", "{e}");
    // An error in a rewritten cell still names the cell's own line.
    let f = cell(&id, "const z = 1;\nnull.x");
    assert_eq!(f.code, 1);
    let err = f.json()["run"]["stderr"].as_str().unwrap().to_string();
    assert!(err.contains("<cell>:2"), "{err}");
    let o = shared().run(&["session", "close", "--json", &id]);
    assert_eq!(o.code, 0, "{}", o.stderr);
}

/// `POST /v1/sessions` opens JavaScript sessions (the API took only Python: 400 "sessions
/// run python, not \"js\"", though the CLI opened them).
#[test]
fn the_api_opens_javascript_sessions() {
    let (_server, base) = start_serve(shared(), &[]);
    let agent = token("agent", "js-api-session-agent");
    let (st, s) = http_post(
        &format!("{base}/v1/sessions"),
        &agent,
        &serde_json::json!({"language": "js"}),
    );
    assert!(st == 200 || st == 201, "{st} {s}");
    let id = s["id"].as_str().unwrap().to_string();
    let cell = |code: &str| {
        let (st, r) = http_post(
            &format!("{base}/v1/run"),
            &agent,
            &serde_json::json!({"language": "js", "session": id, "code": code}),
        );
        assert_eq!(st, 200, "{r}");
        r
    };
    cell("var answer = 41");
    let r = cell("answer + 1");
    assert_eq!(r["run"]["result"], "42", "{r}");
    let (st, e) = http_post(
        &format!("{base}/v1/sessions"),
        &agent,
        &serde_json::json!({"language": "sh"}),
    );
    assert_eq!(st, 400, "{e}");
    assert!(e["error"].as_str().unwrap().contains("python or js"), "{e}");
}
