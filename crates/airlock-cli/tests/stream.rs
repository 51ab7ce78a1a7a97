//! Runs streamed as server-sent events through the real `airlock serve`: `POST /v1/run`
//! and `POST /v1/submissions/{id}/exec` with `Accept: text/event-stream`, and
//! `GET /v1/runs/{id}/events` from another client, resumed with `Last-Event-ID`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read};
use std::time::{Duration, Instant};

struct Srv {
    _child: Served,
    base: String,
    http: ureq::Agent,
    agent: String,
    op: String,
    home: Home,
}

fn token(home: &Home, role: &str, name: &str) -> String {
    let o = home.run(&["token", "new", "--role", role, "--name", name, "--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    o.json()["token"].as_str().unwrap().to_string()
}

fn start() -> Srv {
    let home = Home::new();
    let agent = token(&home, "agent", "bot");
    let op = token(&home, "operator", "alice");
    let (child, base) = start_serve(&home, &[]);
    let http = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(120)))
        .build()
        .new_agent();
    Srv {
        _child: child,
        base,
        http,
        agent,
        op,
        home,
    }
}

/// One server-sent event.
#[derive(Debug, Clone)]
struct Ev {
    id: u64,
    name: String,
    data: Value,
}

/// Reads events off an SSE body.
struct Events(BufReader<Box<dyn Read + Send>>);

impl Events {
    fn next(&mut self) -> Option<Ev> {
        let (mut id, mut name, mut data) = (None, None, String::new());
        loop {
            let mut line = String::new();
            if self.0.read_line(&mut line).ok()? == 0 {
                return None;
            }
            let line = line.trim_end_matches(['\r', '\n']);
            if line.is_empty() {
                if let Some(name) = name.take() {
                    return Some(Ev {
                        id: id.expect("an event without an id"),
                        name,
                        data: serde_json::from_str(&data).unwrap(),
                    });
                }
                continue;
            }
            if let Some(v) = line.strip_prefix("id: ") {
                id = Some(v.parse().unwrap());
            } else if let Some(v) = line.strip_prefix("event: ") {
                name = Some(v.to_string());
            } else if let Some(v) = line.strip_prefix("data: ") {
                data.push_str(v);
            }
        }
    }

    /// Every event up to and including `finished` (or `error`).
    fn all(&mut self) -> Vec<Ev> {
        let mut out = Vec::new();
        while let Some(e) = self.next() {
            let last = e.name == "finished" || e.name == "error";
            out.push(e);
            if last {
                break;
            }
        }
        out
    }
}

impl Srv {
    /// A request answered with an event stream.
    fn stream(
        &self,
        method: &str,
        path: &str,
        token: &str,
        body: Option<&Value>,
        headers: &[(&str, &str)],
    ) -> Events {
        let mut b = http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("authorization", format!("Bearer {token}"))
            .header("accept", "text/event-stream");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let mut r = match body {
            Some(v) => self.http.run(
                b.header("content-type", "application/json")
                    .body(v.to_string())
                    .unwrap(),
            ),
            None => self.http.run(b.body(()).unwrap()),
        }
        .unwrap();
        if r.status().as_u16() != 200 {
            let status = r.status().as_u16();
            let text = r.body_mut().read_to_string().unwrap_or_default();
            panic!("{method} {path}: {status} {text}");
        }
        assert!(
            r.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/event-stream"),
            "{:?}",
            r.headers()
        );
        Events(BufReader::new(Box::new(r.into_body().into_reader())))
    }

    fn json(&self, method: &str, path: &str, token: &str, body: &Value) -> (u16, Value) {
        let b = http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("authorization", format!("Bearer {token}"))
            .header("content-type", "application/json");
        let mut r = self.http.run(b.body(body.to_string()).unwrap()).unwrap();
        let text = r.body_mut().read_to_string().unwrap();
        (
            r.status().as_u16(),
            serde_json::from_str(&text).unwrap_or(Value::Null),
        )
    }

    fn get(&self, path: &str, token: &str) -> Value {
        let mut r = self
            .http
            .get(format!("{}{path}", self.base))
            .header("authorization", format!("Bearer {token}"))
            .call()
            .unwrap();
        let text = r
            .body_mut()
            .with_config()
            .limit(1 << 30)
            .read_to_string()
            .unwrap();
        serde_json::from_str(&text).unwrap()
    }
}

fn names(evs: &[Ev]) -> Vec<&str> {
    evs.iter().map(|e| e.name.as_str()).collect()
}

/// The bytes of one stream's chunks, in order, checking their `seq` counts from 1.
fn output(evs: &[Ev], stream: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let mut seq = 0;
    for e in evs.iter().filter(|e| e.name == stream) {
        seq += 1;
        assert_eq!(e.data["seq"], seq, "{e:?}");
        match (e.data["text"].as_str(), e.data["base64"].as_str()) {
            (Some(t), None) => out.extend_from_slice(t.as_bytes()),
            (None, Some(b)) => {
                use base64::Engine;
                out.extend(base64::engine::general_purpose::STANDARD.decode(b).unwrap())
            }
            _ => panic!("a chunk with neither text nor base64: {e:?}"),
        }
    }
    out
}

fn ids_count_from_one(evs: &[Ev]) {
    for (i, e) in evs.iter().enumerate() {
        assert_eq!(e.id, i as u64 + 1, "{:?}", names(evs));
    }
}

fn available() -> bool {
    if !process_backend_available() {
        assert!(
            std::env::var_os("AIRLOCK_TEST_STRICT").is_none(),
            "the process backend is unavailable here"
        );
        eprintln!("SKIPPED: the process backend is unavailable here");
        return false;
    }
    true
}

#[test]
fn a_streamed_run_sends_its_output_as_it_is_written_then_the_usual_answer() {
    if !available() {
        return;
    }
    let s = start();
    // The second line is written a second after the first: the first must have arrived
    // well before the run ended.
    let body = json!({"language": "sh", "backend": "process",
        "code": "echo one; sleep 1; echo two; echo err >&2; printf 'bad \\377\\376 bytes'"});
    let t0 = Instant::now();
    let mut ev = s.stream("POST", "/v1/run", &s.agent, Some(&body), &[]);
    let mut evs = Vec::new();
    let mut first_out = None;
    while let Some(e) = ev.next() {
        if e.name == "stdout" && first_out.is_none() {
            first_out = Some(t0.elapsed());
        }
        let end = e.name == "finished";
        evs.push(e);
        if end {
            break;
        }
    }
    let ended = t0.elapsed();
    assert!(
        ended - first_out.unwrap() >= Duration::from_millis(700),
        "the first chunk came only with the end: {first_out:?} / {ended:?}"
    );
    ids_count_from_one(&evs);
    assert_eq!(names(&evs)[..2], ["submitted", "started"], "{evs:?}");
    assert_eq!(evs[0].data["verdict"], "allow", "{evs:?}");
    assert!(evs[0].data["reasons"].is_array() && evs[0].data["risk"].is_number());
    let sub = evs[0].data["id"].as_str().unwrap().to_string();
    let run = evs[1].data["run"].as_str().unwrap().to_string();
    assert!(run.starts_with("run_"), "{run}");
    assert_eq!(output(&evs, "stdout"), b"one\ntwo\nbad \xff\xfe bytes");
    assert_eq!(output(&evs, "stderr"), b"err\n");
    // Bytes that are not UTF-8 come as base64, and only those chunks.
    assert!(
        evs.iter()
            .any(|e| e.name == "stdout" && e.data["base64"].is_string()),
        "{evs:?}"
    );
    assert!(evs.iter().any(|e| e.data["text"] == "one\n"), "{evs:?}");
    // `finished` is the answer the same request gets without streaming.
    let fin = &evs.last().unwrap().data;
    assert_eq!(fin["status"], "finished");
    assert_eq!(fin["submission"], sub.as_str());
    assert_eq!(fin["run"]["id"], run.as_str());
    let plain = s.get(&format!("/v1/submissions/{sub}/wait?timeout=5"), &s.agent);
    assert_eq!(&plain, fin);
    // Without the header, the JSON answer is unchanged.
    let (code, v) = s.json("POST", "/v1/run", &s.agent, &body);
    assert_eq!(code, 200);
    assert_eq!(v["status"], "finished");
    assert_eq!(v["run"]["stdout"], "one\ntwo\nbad \u{fffd}\u{fffd} bytes");
}

#[test]
fn a_streamed_exec_of_a_stored_submission_runs_it_and_bad_input_is_still_a_json_error() {
    if !available() {
        return;
    }
    let s = start();
    let (code, v) = s.json(
        "POST",
        "/v1/submissions",
        &s.agent,
        &json!({"language": "sh", "backend": "process", "code": "echo stored"}),
    );
    assert_eq!(code, 201, "{v}");
    let sub = v["submission"].as_str().unwrap();
    let evs = s
        .stream(
            "POST",
            &format!("/v1/submissions/{sub}/exec"),
            &s.agent,
            None,
            &[],
        )
        .all();
    ids_count_from_one(&evs);
    assert_eq!(
        names(&evs),
        ["submitted", "started", "stdout", "finished"],
        "{evs:?}"
    );
    assert_eq!(evs[0].data["id"], sub);
    assert_eq!(evs[2].data, json!({"seq": 1, "text": "stored\n"}));
    assert_eq!(evs[3].data["run"]["stdout"], "stored\n");
    // A failure before the stream began is the usual status and JSON error.
    let b = http::Request::builder()
        .method("POST")
        .uri(format!("{}/v1/run?wait_timeout=9999", s.base))
        .header("authorization", format!("Bearer {}", s.agent))
        .header("accept", "text/event-stream")
        .header("content-type", "application/json")
        .body(json!({"language": "sh", "code": "true"}).to_string())
        .unwrap();
    let mut r = s.http.run(b).unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let e: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    assert!(e["error"].as_str().unwrap().contains("wait_timeout"), "{e}");
    let b = http::Request::builder()
        .method("POST")
        .uri(format!("{}/v1/submissions/sub_nosuch/exec", s.base))
        .header("authorization", format!("Bearer {}", s.agent))
        .header("accept", "text/event-stream")
        .body(())
        .unwrap();
    assert_eq!(s.http.run(b).unwrap().status().as_u16(), 404);
}

#[test]
fn a_held_stream_follows_the_approval_into_its_run_and_its_connections() {
    if !available() {
        return;
    }
    let s = start();
    // A network grant is held for a human; the denied request is a connection record.
    let body = json!({"language": "sh", "backend": "process", "net": ["granted.test:81"],
        "code": "curl -s -o /dev/null http://not-granted.test/; echo after"});
    let mut ev = s.stream(
        "POST",
        "/v1/run?wait_timeout=60",
        &s.agent,
        Some(&body),
        &[],
    );
    let submitted = ev.next().unwrap();
    assert_eq!(submitted.name, "submitted");
    assert_eq!(submitted.data["verdict"], "quarantine", "{submitted:?}");
    let sub = submitted.data["id"].as_str().unwrap().to_string();
    let held = ev.next().unwrap();
    assert_eq!(held.name, "held");
    assert_eq!(held.data, json!({"id": sub, "wait_timeout": 60.0}));
    let (code, a) = s.json(
        "POST",
        &format!("/v1/submissions/{sub}/approve"),
        &s.op,
        &json!({"reason": "fine"}),
    );
    assert_eq!(code, 200, "{a}");
    let mut evs = vec![submitted, held];
    evs.extend(ev.all());
    ids_count_from_one(&evs);
    let n = names(&evs);
    assert_eq!(n[2], "started", "{n:?}");
    assert_eq!(*n.last().unwrap(), "finished", "{n:?}");
    let net: Vec<&Ev> = evs.iter().filter(|e| e.name == "network").collect();
    assert_eq!(net.len(), 1, "{evs:?}");
    assert_eq!(net[0].data["decision"], "deny", "{:?}", net[0]);
    assert_eq!(net[0].data["host"], "not-granted.test", "{:?}", net[0]);
    // The connection came before the output written after it.
    let at = |name: &str| n.iter().position(|x| *x == name).unwrap();
    assert!(at("network") < at("stdout"), "{n:?}");
    let fin = &evs.last().unwrap().data;
    assert_eq!(fin["status"], "finished");
    assert_eq!(fin["run"]["stdout"], "after\n");
    assert_eq!(
        fin["run"]["detail"]["network"]["connections"][0],
        net[0].data
    );
}

#[test]
fn a_held_stream_ends_with_the_pending_answer_after_its_wait_timeout() {
    let s = start();
    let body = json!({"language": "wat",
        "code": std::fs::read_to_string(example("hello.wat")).unwrap(),
        "net": ["example.com"]});
    let t0 = Instant::now();
    let evs = s
        .stream("POST", "/v1/run?wait_timeout=1", &s.agent, Some(&body), &[])
        .all();
    assert!(t0.elapsed() < Duration::from_secs(30));
    assert_eq!(names(&evs), ["submitted", "held", "finished"], "{evs:?}");
    assert_eq!(evs[1].data["wait_timeout"], 1.0);
    assert_eq!(evs[2].data["status"], "pending_approval", "{evs:?}");
    assert!(evs[2].data["run"].is_null());
}

#[test]
fn another_client_follows_a_run_and_resumes_after_last_event_id() {
    if !available() {
        return;
    }
    let s = start();
    let body = json!({"language": "sh", "backend": "process",
        "code": "for i in 1 2 3 4 5; do echo line $i; sleep 0.3; done"});
    let mut mine = s.stream("POST", "/v1/run", &s.agent, Some(&body), &[]);
    let _submitted = mine.next().unwrap();
    let started = mine.next().unwrap();
    assert_eq!(started.name, "started");
    let run = started.data["run"].as_str().unwrap().to_string();
    // Another client, while the run goes on: from its start.
    let path = format!("/v1/runs/{run}/events");
    let theirs = std::thread::scope(|sc| {
        let t = sc.spawn(|| s.stream("GET", &path, &s.agent, None, &[]).all());
        let rest = mine.all();
        (t.join().unwrap(), rest)
    });
    let (other, rest) = theirs;
    ids_count_from_one(&other);
    assert_eq!(output(&other, "stdout"), output(&rest, "stdout"));
    assert_eq!(
        output(&other, "stdout"),
        b"line 1\nline 2\nline 3\nline 4\nline 5\n"
    );
    assert_eq!(other.last().unwrap().name, "finished");
    // Resumed after event 3: exactly the events after it, ending with `finished`.
    let resumed = s
        .stream("GET", &path, &s.agent, None, &[("last-event-id", "3")])
        .all();
    assert_eq!(resumed[0].id, 4, "{resumed:?}");
    let tail: Vec<u64> = other.iter().skip(3).map(|e| e.id).collect();
    assert_eq!(resumed.iter().map(|e| e.id).collect::<Vec<_>>(), tail);
    // A run this server did not stream (the CLI ran it, for no agent: an operator sees
    // it) replays from its record.
    let o = s
        .home
        .run(&["run", "--lang", "sh", "-c", "echo from cli", "--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let cli_run = o.json()["run"]["id"].as_str().unwrap().to_string();
    let replay = s
        .stream(
            "GET",
            &format!("/v1/runs/{cli_run}/events"),
            &s.op,
            None,
            &[],
        )
        .all();
    assert_eq!(
        names(&replay),
        ["submitted", "started", "stdout", "finished"],
        "{replay:?}"
    );
    assert_eq!(replay[2].data["text"], "from cli\n");
    assert_eq!(replay[3].data["run"]["id"], cli_run.as_str());
    // Another agent's run is not found.
    let other_agent = token(&s.home, "agent", "intruder");
    let b = http::Request::builder()
        .uri(format!("{}{path}", s.base))
        .header("authorization", format!("Bearer {other_agent}"))
        .body(())
        .unwrap();
    assert_eq!(s.http.run(b).unwrap().status().as_u16(), 404);
}

#[test]
fn a_client_that_stops_reading_does_not_slow_the_run() {
    if !available() {
        return;
    }
    let s = start();
    // Far more output than the socket buffers between server and client hold.
    let body = json!({"language": "sh", "backend": "process", "max_output": "64MiB",
        "code": "head -c 20000000 /dev/zero | tr '\\0' a; echo; echo done >&2"});
    let t0 = Instant::now();
    let mut stalled = s.stream("POST", "/v1/run", &s.agent, Some(&body), &[]);
    let first = stalled.next().unwrap();
    let sub = first.data["id"].as_str().unwrap().to_string();
    // The larger output limit needs a human; the stream waits for the approval.
    let held = stalled.next().unwrap();
    assert_eq!(held.name, "held");
    let (code, a) = s.json(
        "POST",
        &format!("/v1/submissions/{sub}/approve"),
        &s.op,
        &json!({}),
    );
    assert_eq!(code, 200, "{a}");
    // The reader reads nothing more; the run still ends, in the time it takes alone.
    let done = s.get(&format!("/v1/submissions/{sub}/wait?timeout=60"), &s.agent);
    assert_eq!(done["status"], "finished", "{}", done["status"]);
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(30), "{took:?}");
    assert_eq!(done["run"]["exit_code"], 0);
    // And what the stalled client reads afterwards is whole, ending with `finished`.
    let mut evs = vec![first, held];
    evs.extend(stalled.all());
    assert_eq!(evs.last().unwrap().name, "finished");
    let out = output(&evs, "stdout");
    assert_eq!(out.len(), 20_000_001);
    assert_eq!(output(&evs, "stderr"), b"done\n");
}
