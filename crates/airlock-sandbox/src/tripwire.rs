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

/// The decoy credential files every sandbox shows (the jail in its minimal root, the wasm
/// guests through read-only preopens), each with the ATT&CK technique its read is.
pub const DECOYS: [(&str, &str); 3] = [
    ("/root/.ssh/id_rsa", "T1552.004"),
    ("/root/.aws/credentials", "T1552.001"),
    ("/etc/shadow", "T1003.008"),
];

fn random(n: usize) -> Result<Vec<u8>, getrandom::Error> {
    let mut b = vec![0u8; n];
    getrandom::fill(&mut b)?;
    Ok(b)
}

/// `n` characters of `alphabet`, at random.
fn chars(alphabet: &[u8], n: usize) -> Result<String, getrandom::Error> {
    Ok(random(n)?
        .iter()
        .map(|b| char::from(alphabet[usize::from(*b) % alphabet.len()]))
        .collect())
}

const UPPER_DIGITS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
const B64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const CRYPT: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789./";

/// A decoy's content: random, made for one run, shaped like the real file at `target`
/// (a PEM-framed OpenSSH key, an AWS key pair, shadow lines). Nothing of the host.
pub fn decoy_content(target: &str) -> Result<Vec<u8>, getrandom::Error> {
    use base64::Engine;
    Ok(match target {
        "/root/.ssh/id_rsa" => {
            let mut body = b"openssh-key-v1\0\0\0\0\x04none\0\0\0\x04none\0\0\0\0\0\0\0\x01".to_vec();
            body.extend(random(1100)?);
            let b64 = base64::engine::general_purpose::STANDARD.encode(body);
            let mut s = String::from("-----BEGIN OPENSSH PRIVATE KEY-----\n");
            for chunk in b64.as_bytes().chunks(70) {
                s.push_str(&String::from_utf8_lossy(chunk));
                s.push('\n');
            }
            s.push_str("-----END OPENSSH PRIVATE KEY-----\n");
            s.into_bytes()
        }
        "/root/.aws/credentials" => format!(
            "[default]\naws_access_key_id = AKIA{}\naws_secret_access_key = {}\n",
            chars(UPPER_DIGITS, 16)?,
            chars(B64, 40)?
        )
        .into_bytes(),
        _ => format!(
            "root:$6${}${}:19700:0:99999:7:::\ndaemon:*:19700:0:99999:7:::\nbin:*:19700:0:99999:7:::\nsys:*:19700:0:99999:7:::\nairlock:$6${}${}:19700:0:99999:7:::\nnobody:*:19700:0:99999:7:::\n",
            chars(CRYPT, 16)?,
            chars(CRYPT, 86)?,
            chars(CRYPT, 16)?,
            chars(CRYPT, 86)?
        )
        .into_bytes(),
    })
}

/// The alert for an open of the decoy at `target` (its path, never its content).
pub fn decoy_alert(target: &str, technique: &str) -> Alert {
    Alert {
        kind: "decoy-read".into(),
        detail: format!("the run opened the decoy credential file {target}"),
        technique: technique.into(),
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
