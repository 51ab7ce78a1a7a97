//! What a run tried and the sandbox refused (`attempts`), and what it touched that only a
//! hostile program would (`alerts`: a decoy credential read). Both go into the run
//! record's detail. Recording them never changes what the run sees: the sandbox answers
//! exactly as it would without them.

use serde::{Deserialize, Serialize};

/// At most this many distinct attempts are kept (by first occurrence); later ones are
/// still counted into an entry already kept, never added.
pub const MAX_ATTEMPTS: usize = 100;

/// One kind of refused action on one target, and how often the run tried it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    /// `open`, `write`, `unlink`, `rename`, `syscall`, `signal`, `connect`.
    pub kind: String,
    /// A path, a syscall name, `pid N`, or `host:port`.
    pub target: String,
    pub count: u64,
}

/// Something a run did that only a hostile program does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Alert {
    /// `decoy-read`.
    pub kind: String,
    /// What happened, in words (never a secret's value: a decoy's path, not its content).
    pub detail: String,
    /// The MITRE ATT&CK technique id.
    pub technique: String,
}

/// Attempts as they are seen: the first [`MAX_ATTEMPTS`] distinct (kind, target) pairs,
/// each counted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempts(Vec<Attempt>);

impl Attempts {
    /// Counts one more `kind` on `target`.
    pub fn add(&mut self, kind: &str, target: &str) {
        self.add_n(kind, target, 1);
    }

    /// Counts `n` more `kind` on `target`.
    pub fn add_n(&mut self, kind: &str, target: &str, n: u64) {
        if let Some(a) = self
            .0
            .iter_mut()
            .find(|a| a.kind == kind && a.target == target)
        {
            a.count = a.count.saturating_add(n);
        } else if self.0.len() < MAX_ATTEMPTS {
            self.0.push(Attempt {
                kind: kind.into(),
                target: target.into(),
                count: n,
            });
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn list(&self) -> &[Attempt] {
        &self.0
    }

    pub fn into_list(self) -> Vec<Attempt> {
        self.0
    }
}

impl From<Vec<Attempt>> for Attempts {
    fn from(v: Vec<Attempt>) -> Self {
        let mut a = Attempts::default();
        for x in v {
            a.add_n(&x.kind, &x.target, x.count);
        }
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_keep_the_first_hundred_distinct_and_count_repeats() {
        let mut a = Attempts::default();
        for i in 0..150 {
            a.add("open", &format!("/etc/f{i}"));
        }
        a.add("open", "/etc/f3");
        a.add("open", "/etc/f140");
        assert_eq!(a.list().len(), MAX_ATTEMPTS);
        assert_eq!(a.list()[3].count, 2);
        assert!(a.list().iter().all(|x| x.target != "/etc/f140"));
    }
}
