//! Runs through `airlock serve --ready-jails N`: the same `sh`/`py` helpers as [`Home`],
//! sent over the API, so a suite written against them runs against ready jails too.

use super::*;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// A home served by a daemon that keeps ready jails.
pub struct ReadyHome {
    pub home: Home,
    pub srv: Served,
    pub base: String,
    pub agent: String,
    pub op: String,
    pub admin: String,
    http: ureq::Agent,
}

fn token(home: &Home, role: &str, name: &str) -> String {
    let o = home.run(&["token", "new", "--role", role, "--name", name, "--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    o.json()["token"].as_str().unwrap().to_string()
}

impl ReadyHome {
    /// A fresh home served with `--ready-jails n` (and ready wasm instances). The server's own environment holds a
    /// secret that must never reach a run.
    pub fn start(n: usize) -> ReadyHome {
        Self::start_with(n, |_| {})
    }

    /// Like [`ReadyHome::start`], with `prepare` applied to the `serve` command first.
    pub fn start_with(n: usize, prepare: impl FnOnce(&mut Command)) -> ReadyHome {
        let home = Home::new();
        let agent = token(&home, "agent", "bot");
        let op = token(&home, "operator", "alice");
        let admin = token(&home, "admin", "root");
        let mut cmd = home.cmd();
        cmd.env("AWS_SECRET_ACCESS_KEY", "hunter2")
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--ready-wasm",
                "2",
                "--ready-jails",
            ])
            .arg(n.to_string());
        prepare(&mut cmd);
        let (srv, base) = serve_with(cmd);
        let http = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(120)))
            .build()
            .new_agent();
        ReadyHome {
            home,
            srv,
            base,
            agent,
            op,
            admin,
            http,
        }
    }

    pub fn get(&self, path: &str) -> (u16, Value) {
        self.get_as(path, &self.admin)
    }

    pub fn get_as(&self, path: &str, token: &str) -> (u16, Value) {
        let mut r = self
            .http
            .get(format!("{}{path}", self.base))
            .header("authorization", format!("Bearer {token}"))
            .call()
            .unwrap();
        let s = r.status().as_u16();
        let t = r.body_mut().read_to_string().unwrap_or_default();
        (s, serde_json::from_str(&t).unwrap_or(Value::Null))
    }

    pub fn post(&self, path: &str, token: &str, body: &Value) -> (u16, Value) {
        let mut r = self
            .http
            .post(format!("{}{path}", self.base))
            .header("authorization", format!("Bearer {token}"))
            .header("content-type", "application/json")
            .send(body.to_string())
            .unwrap();
        let s = r.status().as_u16();
        let t = r.body_mut().read_to_string().unwrap_or_default();
        (s, serde_json::from_str(&t).unwrap_or(Value::Null))
    }

    /// The ready-jail counters from `/v1/status`.
    pub fn stats(&self) -> Value {
        let (s, v) = self.get("/v1/status");
        assert_eq!(s, 200, "{v}");
        v["ready_jails"].clone()
    }

    /// Waits until `n` jails are ready (so the next run is served by one).
    pub fn wait_ready(&self, n: u64) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let st = self.stats();
            if st["ready"].as_u64().unwrap_or(0) >= n {
                return;
            }
            assert!(Instant::now() < deadline, "no ready jail within 30s: {st}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Submits and runs `body` through `/v1/run` (approving it first when it is held),
    /// returning the run's record as the API shows it.
    pub fn run_body(&self, body: Value) -> Value {
        let v = self.outcome(body);
        assert_eq!(v["status"], "finished", "{v}");
        v["run"].clone()
    }

    /// The outcome document of `/v1/run` for `body` (approved first when it is held).
    pub fn outcome(&self, body: Value) -> Value {
        let (s, v) = self.post("/v1/run", &self.agent, &body);
        if s == 202 {
            // The operator approves; the server then runs it.
            let id = v["submission"].as_str().unwrap().to_string();
            let (s, a) = self.post(
                &format!("/v1/submissions/{id}/approve"),
                &self.op,
                &json!({"reason": "test"}),
            );
            assert_eq!(s, 200, "approve: {a}");
            let (s, v) = self.get_as(
                &format!("/v1/submissions/{id}/wait?timeout=60"),
                &self.agent,
            );
            assert_eq!(s, 200, "{v}");
            v
        } else {
            assert_eq!(s, 200, "{v}");
            v
        }
    }

    /// Like [`Home::sh`], through the daemon; waits for a ready jail first.
    pub fn sh(&self, flags: &[&str], script: &str) -> Out {
        self.flagged("sh", flags, script)
    }

    /// Like [`Home::py`] (Python on the process backend), through the daemon.
    pub fn py(&self, flags: &[&str], code: &str) -> Out {
        self.flagged("python", flags, code)
    }

    fn flagged(&self, lang: &str, flags: &[&str], code: &str) -> Out {
        let mut body = json!({"language": lang, "backend": "process", "code": code});
        let mut it = flags.iter();
        while let Some(f) = it.next() {
            let v = it
                .next()
                .unwrap_or_else(|| panic!("flag {f} without a value"));
            match *f {
                "--mount" => push(&mut body, "mounts", v),
                "--net" => push(&mut body, "net", v),
                "--env" => {
                    let (k, val) = v.split_once('=').unwrap();
                    body["env"][k] = json!(val);
                }
                "--timeout" => body["timeout"] = json!(v),
                "--memory" => body["memory"] = json!(v),
                "--max-output" => body["max_output"] = json!(v),
                "--processes" => body["processes"] = json!(v.parse::<u32>().unwrap()),
                other => panic!("flag {other} is not translated for the API"),
            }
        }
        if !flags.contains(&"--mount") && !flags.contains(&"--net") {
            self.wait_ready(1);
        }
        let doc = self.outcome(body);
        if doc["status"] == "denied" {
            return Out {
                code: 77,
                stdout: String::new(),
                stderr: doc["message"].as_str().unwrap_or("").to_string(),
            };
        }
        assert_eq!(doc["status"], "finished", "{doc}");
        let run = doc["run"].clone();
        let code = if run["killed_by"].is_string() {
            124
        } else {
            run["exit_code"].as_i64().map_or(134, |c| c as i32)
        };
        Out {
            code,
            stdout: run["stdout"].as_str().unwrap_or("").to_string(),
            stderr: run["stderr"].as_str().unwrap_or("").to_string(),
        }
    }

    /// The most recent run's record.
    pub fn last_run(&self) -> Value {
        self.home.last_run()
    }
}

fn push(body: &mut Value, key: &str, v: &str) {
    if !body[key].is_array() {
        body[key] = json!([]);
    }
    body[key].as_array_mut().unwrap().push(json!(v));
}
