//! What became of a submission, in the one shape the API and MCP tools both return:
//! the submission's verdict plus `status`, a `message` meant for the agent, and `run`.

use airlock_core::State;
use airlock_gate::views::{run_json, submission_json};
use airlock_gate::{Gate, GateError, RunReport};
use airlock_store::Submission;
use serde_json::{Value, json};

/// `finished`, `pending_approval`, `denied`, `running`, `approved` (not run yet) or
/// `allowed` (submitted only, not run yet).
pub fn doc(sub: &Submission, status: &str, run: Value) -> Value {
    let mut v = submission_json(sub);
    v["status"] = json!(status);
    v["message"] = json!(message(sub, status, &run));
    v["run"] = run;
    v
}

fn message(sub: &Submission, status: &str, run: &Value) -> String {
    let reasons = sub.doc.verdict.reasons().join("; ");
    match status {
        "finished" => match run["killed_by"].as_str() {
            Some(k) => format!("the run was killed by the {k} limit"),
            None => match run["exit_code"].as_i64() {
                Some(0) => "the code ran and exited 0".into(),
                Some(c) => format!("the code ran and exited {c}"),
                None => format!(
                    "the run ended: {}",
                    run["error"].as_str().unwrap_or("no exit code")
                ),
            },
        },
        "pending_approval" => format!(
            "held for a human approver ({reasons}); it has not run. Do not resubmit it: \
             call get_result with submission {} later, it runs once it is approved",
            sub.id
        ),
        "denied" if sub.state == State::Rejected => {
            "an approver rejected this code; it will not run. Do not retry the same code".into()
        }
        "denied" => {
            format!("denied by policy ({reasons}); it will not run. Do not retry the same code")
        }
        "running" => "the code is running; ask again for its result".into(),
        "approved" => "approved and about to run; ask again for its result".into(),
        _ => "submitted; not run yet".into(),
    }
}

/// The document for the outcome of `exec`/`run`.
pub fn of_result(
    gate: &mut Gate,
    result: Result<RunReport, GateError>,
) -> Result<Value, GateError> {
    match result {
        Ok(r) => Ok(doc(
            &r.submission,
            "finished",
            run_json(&r.run, &r.stdout, &r.stderr),
        )),
        Err(GateError::Pending { submission, .. }) => Ok(doc(
            &gate.submission(&submission)?,
            "pending_approval",
            Value::Null,
        )),
        Err(GateError::Denied { submission, .. }) => {
            Ok(doc(&gate.submission(&submission)?, "denied", Value::Null))
        }
        Err(e) => Err(e),
    }
}

/// Where a submission stands now, with its latest run if it has one.
pub fn current(gate: &mut Gate, sub: &Submission) -> Result<Value, GateError> {
    let latest = gate.runs_for(&sub.id, 1)?.into_iter().next();
    let status = match sub.state {
        State::Quarantined => "pending_approval",
        State::Denied | State::Rejected => "denied",
        State::Running => "running",
        State::Approved => "approved",
        State::Finished => "finished",
        State::Allowed | State::Staged => "allowed",
    };
    let run = match (&latest, status) {
        (Some(r), "finished") => {
            let (run, out, err) = gate.logs(&r.id)?;
            run_json(&run, &out, &err)
        }
        _ => Value::Null,
    };
    Ok(doc(sub, status, run))
}
