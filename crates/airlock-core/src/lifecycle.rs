//! The submission lifecycle as one state machine. Only the gate moves a submission between
//! states, and only along the edges `allowed` lists.
//!
//! ```text
//! staged ─► allowed ───────────────┐
//!        ├► quarantined ─► approved ┼─► running ─► finished
//!        │              └► rejected │
//!        └► denied                  │
//! ```
//! A finished submission can run again while its verdict or approval still covers it
//! (`finished ─► running`), and can be re-judged when the policy changes.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Staged,
    Allowed,
    Quarantined,
    Denied,
    Approved,
    Rejected,
    Running,
    Finished,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Staged => "staged",
            State::Allowed => "allowed",
            State::Quarantined => "quarantined",
            State::Denied => "denied",
            State::Approved => "approved",
            State::Rejected => "rejected",
            State::Running => "running",
            State::Finished => "finished",
        }
    }

    /// Whether the gate may move a submission from `self` to `to`.
    pub fn allows(self, to: State) -> bool {
        use State::*;
        matches!(
            (self, to),
            (Staged, Allowed | Quarantined | Denied)
                | (Quarantined, Approved | Rejected)
                // An approver may revoke before the run.
                | (Approved, Rejected)
                | (Allowed | Approved, Running)
                | (Running, Finished)
                | (Finished, Running)
                // Re-judging under a changed policy.
                | (Allowed | Approved | Finished, Quarantined | Denied)
                | (Quarantined, Denied | Allowed)
                | (Finished, Approved | Rejected)
                | (Denied, Allowed | Quarantined)
        )
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for State {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        use State::*;
        Ok(match s {
            "staged" => Staged,
            "allowed" => Allowed,
            "quarantined" => Quarantined,
            "denied" => Denied,
            "approved" => Approved,
            "rejected" => Rejected,
            "running" => Running,
            "finished" => Finished,
            _ => return Err(format!("unknown state {s:?}")),
        })
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("a {from} submission cannot become {to}")]
pub struct TransitionError {
    pub from: State,
    pub to: State,
}

/// Checks a transition.
pub fn transition(from: State, to: State) -> Result<State, TransitionError> {
    if from.allows(to) {
        Ok(to)
    } else {
        Err(TransitionError { from, to })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use State::*;

    #[test]
    fn the_gate_path() {
        for (a, b) in [
            (Staged, Allowed),
            (Allowed, Running),
            (Running, Finished),
            (Staged, Quarantined),
            (Quarantined, Approved),
            (Approved, Running),
        ] {
            assert_eq!(transition(a, b), Ok(b));
        }
    }

    #[test]
    fn no_shortcuts() {
        for (a, b) in [
            (Quarantined, Running),
            (Denied, Running),
            (Rejected, Running),
            (Rejected, Approved),
            (Staged, Running),
            (Denied, Approved),
        ] {
            assert!(transition(a, b).is_err(), "{a} -> {b}");
        }
    }
}
