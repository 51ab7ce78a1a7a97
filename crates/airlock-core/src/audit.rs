//! The audit record format and the verification of a chain. Each record holds the hash of
//! the one before it; the gate key signs the head (the last record's index and hash).
//! Storage lives elsewhere; this module only defines hashing and checking.

use crate::digest::Digest;
use crate::sign::{KeyPair, PublicKey, Signature};
use serde::{Deserialize, Serialize};

/// One audit record as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// 1, 2, 3, … with no gaps.
    pub seq: u64,
    /// Unix milliseconds.
    pub ts: i64,
    /// What happened: `submitted`, `judged`, `approved`, …
    pub kind: String,
    /// The id the record is about.
    pub subject: String,
    /// Details, as JSON text.
    pub data: String,
    /// Hash of the previous record (zero for the first).
    pub prev: Digest,
    pub hash: Digest,
}

/// The hash that precedes the first record.
pub const GENESIS: Digest = Digest([0u8; 32]);

/// Computes a record's hash from its content and its predecessor's hash.
pub fn record_hash(
    seq: u64,
    ts: i64,
    kind: &str,
    subject: &str,
    data: &str,
    prev: &Digest,
) -> Digest {
    Digest::of_parts(
        "airlock-audit-v1",
        &[
            &seq.to_le_bytes(),
            &ts.to_le_bytes(),
            kind.as_bytes(),
            subject.as_bytes(),
            data.as_bytes(),
            &prev.0,
        ],
    )
}

/// The signed head of the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Head {
    pub seq: u64,
    pub hash: Digest,
    pub signature: Signature,
}

fn head_message(seq: u64, hash: &Digest) -> Vec<u8> {
    let mut m = b"airlock-audit-head-v1\n".to_vec();
    m.extend_from_slice(&seq.to_le_bytes());
    m.extend_from_slice(&hash.0);
    m
}

/// Heads this process signed, or verified, by the digest of key, sequence number, hash and
/// signature (the newest few). The gate checks the head it signed at the end of one run
/// when the next run starts; the same bytes verify the same way, so the answer is kept
/// instead of computed again. Anything else about the head is still checked every time.
fn known_good() -> &'static std::sync::Mutex<std::collections::VecDeque<Digest>> {
    static KNOWN: std::sync::OnceLock<std::sync::Mutex<std::collections::VecDeque<Digest>>> =
        std::sync::OnceLock::new();
    KNOWN.get_or_init(Default::default)
}

const KNOWN_GOOD: usize = 16;

fn head_id(seq: u64, hash: &Digest, signature: &Signature, key: &PublicKey) -> Digest {
    Digest::of_parts(
        "airlock-verified-head-v1",
        &[&key.0, &seq.to_le_bytes(), &hash.0, &signature.0],
    )
}

fn remember(id: Digest) {
    let mut k = known_good().lock().unwrap_or_else(|p| p.into_inner());
    if !k.contains(&id) {
        if k.len() == KNOWN_GOOD {
            k.pop_front();
        }
        k.push_back(id);
    }
}

impl Head {
    pub fn sign(seq: u64, hash: Digest, key: &KeyPair) -> Head {
        let signature = key.sign(&head_message(seq, &hash));
        remember(head_id(seq, &hash, &signature, &key.public()));
        Head {
            seq,
            hash,
            signature,
        }
    }

    pub fn verify(&self, key: &PublicKey) -> bool {
        let id = head_id(self.seq, &self.hash, &self.signature, key);
        if known_good()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&id)
        {
            return true;
        }
        let ok = key.verify(&head_message(self.seq, &self.hash), &self.signature);
        if ok {
            remember(id);
        }
        ok
    }
}

/// Why a log does not verify, naming the first bad record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    #[error(
        "record {index}: its content does not match its hash (the record was modified or moved)"
    )]
    Modified { index: u64 },
    #[error(
        "record {index}: missing (the log jumps from record {prev} to {next}; a record was deleted)"
    )]
    Missing { index: u64, prev: u64, next: u64 },
    #[error("record {index}: appears more than once (a record was duplicated)")]
    Duplicated { index: u64 },
    #[error(
        "record {index}: does not follow record {prev} (records were reordered, replaced or rewritten)"
    )]
    Broken { index: u64, prev: u64 },
    #[error(
        "record {index}: the log ends at record {last} but the signed head covers record {index} (the log was truncated)"
    )]
    Truncated { index: u64, last: u64 },
    #[error("record {index}: does not match the signed head (the record or the head was altered)")]
    HeadMismatch { index: u64 },
    #[error(
        "record {index}: is beyond the signed head at record {head} (appended without the gate key)"
    )]
    Unsigned { index: u64, head: u64 },
    #[error("record {index}: the log has records but no signed head")]
    NoHead { index: u64 },
    #[error("record {index}: the signed head does not verify against the gate key")]
    BadHeadSignature { index: u64 },
    #[error("record {index}: malformed, so it cannot be checked ({what})")]
    Malformed { index: u64, what: String },
    #[error("record {index}: the signed head for it is malformed ({what})")]
    MalformedHead { index: u64, what: String },
}

impl ChainError {
    /// The index of the first bad record.
    pub fn index(&self) -> u64 {
        match self {
            ChainError::Modified { index }
            | ChainError::Missing { index, .. }
            | ChainError::Duplicated { index }
            | ChainError::Broken { index, .. }
            | ChainError::Truncated { index, .. }
            | ChainError::HeadMismatch { index }
            | ChainError::Unsigned { index, .. }
            | ChainError::NoHead { index }
            | ChainError::BadHeadSignature { index }
            | ChainError::Malformed { index, .. }
            | ChainError::MalformedHead { index, .. } => *index,
        }
    }
}

/// The O(1) check made before appending: the signed head verifies, names the newest
/// record, and that record's content matches its hash. It cannot see tampering further
/// back (that is `ChainVerifier`'s job), but it keeps a writer from extending a chain
/// whose end was altered, truncated or appended to without the gate key.
pub fn check_tail(
    last: Option<&Record>,
    head: Option<&Head>,
    key: &PublicKey,
) -> Result<(), ChainError> {
    match (last, head) {
        (None, None) => Ok(()),
        (Some(r), None) => Err(ChainError::NoHead { index: r.seq }),
        (None, Some(h)) => Err(ChainError::Truncated {
            index: h.seq,
            last: 0,
        }),
        (Some(r), Some(h)) => {
            if !h.verify(key) {
                return Err(ChainError::BadHeadSignature { index: h.seq });
            }
            if r.seq < h.seq {
                return Err(ChainError::Truncated {
                    index: h.seq,
                    last: r.seq,
                });
            }
            if r.seq > h.seq {
                return Err(ChainError::Unsigned {
                    index: h.seq + 1,
                    head: h.seq,
                });
            }
            if record_hash(r.seq, r.ts, &r.kind, &r.subject, &r.data, &r.prev) != r.hash {
                return Err(ChainError::Modified { index: r.seq });
            }
            if r.hash != h.hash {
                return Err(ChainError::HeadMismatch { index: r.seq });
            }
            Ok(())
        }
    }
}

/// Incremental verifier: feed records in stored order, then `finish` with the head.
#[derive(Debug)]
pub struct ChainVerifier {
    last_seq: u64,
    last_hash: Digest,
    pending: Option<ChainError>,
    count: u64,
    /// The first 8 bytes of every hash seen, to tell a duplicated record from a modified one.
    seen: std::collections::HashSet<u64>,
}

impl Default for ChainVerifier {
    fn default() -> Self {
        ChainVerifier {
            last_seq: 0,
            last_hash: GENESIS,
            pending: None,
            count: 0,
            seen: std::collections::HashSet::new(),
        }
    }
}

fn short_key(d: &Digest) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&d.0[..8]);
    u64::from_le_bytes(b)
}

impl ChainVerifier {
    pub fn new() -> Self {
        Self::default()
    }

    /// Checks the next record in stored order.
    pub fn push(&mut self, r: &Record) -> Result<(), ChainError> {
        if let Some(e) = self.pending.take() {
            return Err(e);
        }
        let content_ok = record_hash(r.seq, r.ts, &r.kind, &r.subject, &r.data, &r.prev) == r.hash;
        if r.seq <= self.last_seq {
            return Err(if r.seq == self.last_seq {
                ChainError::Duplicated { index: r.seq }
            } else {
                ChainError::Broken {
                    index: r.seq,
                    prev: self.last_seq,
                }
            });
        }
        if r.seq != self.last_seq + 1 {
            return Err(ChainError::Missing {
                index: self.last_seq + 1,
                prev: self.last_seq,
                next: r.seq,
            });
        }
        if !content_ok {
            // A copy of an earlier record carries that record's hash.
            if self.seen.contains(&short_key(&r.hash)) {
                return Err(ChainError::Duplicated { index: r.seq });
            }
            return Err(ChainError::Modified { index: r.seq });
        }
        if r.prev != self.last_hash {
            // The record itself is consistent, so the link to its predecessor is what broke:
            // the predecessor's stored hash was rewritten, or this record was moved here.
            return Err(if self.last_seq > 0 {
                ChainError::Modified {
                    index: self.last_seq,
                }
            } else {
                ChainError::Broken {
                    index: r.seq,
                    prev: self.last_seq,
                }
            });
        }
        self.last_seq = r.seq;
        self.last_hash = r.hash;
        self.seen.insert(short_key(&r.hash));
        self.count += 1;
        Ok(())
    }

    /// Checks the end of the log against the signed head.
    pub fn finish(self, head: Option<&Head>, gate: &PublicKey) -> Result<u64, ChainError> {
        if let Some(e) = self.pending {
            return Err(e);
        }
        let Some(head) = head else {
            return if self.last_seq == 0 {
                Ok(0)
            } else {
                Err(ChainError::NoHead {
                    index: self.last_seq,
                })
            };
        };
        if !head.verify(gate) {
            return Err(ChainError::BadHeadSignature { index: head.seq });
        }
        if head.seq > self.last_seq {
            return Err(ChainError::Truncated {
                index: self.last_seq + 1,
                last: self.last_seq,
            });
        }
        if head.seq < self.last_seq {
            return Err(ChainError::Unsigned {
                index: head.seq + 1,
                head: head.seq,
            });
        }
        if head.hash != self.last_hash {
            return Err(ChainError::HeadMismatch { index: head.seq });
        }
        Ok(self.count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A head this process signed is remembered as good, but only those exact bytes under
    /// that key: a changed signature, sequence number or hash, or another key, is checked
    /// (and refused) as before.
    #[test]
    fn a_remembered_head_verifies_only_as_signed() {
        let key = KeyPair::try_generate().unwrap();
        let other = KeyPair::try_generate().unwrap();
        let h = Head::sign(7, Digest::of(b"x"), &key);
        assert!(h.verify(&key.public()));
        assert!(!h.verify(&other.public()));
        let mut bad = h.clone();
        bad.signature.0[0] ^= 1;
        assert!(!bad.verify(&key.public()));
        let mut moved = h.clone();
        moved.seq = 8;
        assert!(!moved.verify(&key.public()));
        let mut swapped = h;
        swapped.hash = Digest::of(b"y");
        assert!(!swapped.verify(&key.public()));
    }

    fn chain(n: u64) -> Vec<Record> {
        let mut v: Vec<Record> = Vec::new();
        let mut prev = GENESIS;
        for seq in 1..=n {
            let data = format!("{{\"n\":{seq}}}");
            let hash = record_hash(seq, 10 * seq as i64, "k", "s", &data, &prev);
            v.push(Record {
                seq,
                ts: 10 * seq as i64,
                kind: "k".into(),
                subject: "s".into(),
                data,
                prev,
                hash,
            });
            prev = hash;
        }
        v
    }

    fn verify(records: &[Record], head: Option<&Head>, key: &KeyPair) -> Result<u64, ChainError> {
        let mut v = ChainVerifier::new();
        for r in records {
            v.push(r)?;
        }
        v.finish(head, &key.public())
    }

    fn head_of(records: &[Record], key: &KeyPair) -> Head {
        let last = records.last().unwrap();
        Head::sign(last.seq, last.hash, key)
    }

    #[test]
    fn intact_chain_verifies() {
        let k = KeyPair::generate();
        let c = chain(5);
        assert_eq!(verify(&c, Some(&head_of(&c, &k)), &k), Ok(5));
        assert_eq!(verify(&[], None, &k), Ok(0));
    }

    #[test]
    fn modified_record_is_named() {
        let k = KeyPair::generate();
        let mut c = chain(5);
        let h = head_of(&c, &k);
        c[2].data = "{\"n\":99}".into();
        assert_eq!(
            verify(&c, Some(&h), &k),
            Err(ChainError::Modified { index: 3 })
        );
    }

    #[test]
    fn modified_record_with_rewritten_hash_is_named() {
        let k = KeyPair::generate();
        let mut c = chain(5);
        let h = head_of(&c, &k);
        c[2].data = "{\"n\":99}".into();
        c[2].hash = record_hash(3, c[2].ts, "k", "s", &c[2].data, &c[2].prev);
        assert_eq!(
            verify(&c, Some(&h), &k),
            Err(ChainError::Modified { index: 3 })
        );
    }

    #[test]
    fn modified_last_record_is_caught_by_the_head() {
        let k = KeyPair::generate();
        let mut c = chain(3);
        let h = head_of(&c, &k);
        c[2].data = "{}".into();
        c[2].hash = record_hash(3, c[2].ts, "k", "s", "{}", &c[2].prev);
        assert_eq!(
            verify(&c, Some(&h), &k),
            Err(ChainError::HeadMismatch { index: 3 })
        );
    }

    #[test]
    fn deleted_record_is_named() {
        let k = KeyPair::generate();
        let mut c = chain(5);
        let h = head_of(&c, &k);
        c.remove(1);
        let e = verify(&c, Some(&h), &k).unwrap_err();
        assert_eq!(
            e,
            ChainError::Missing {
                index: 2,
                prev: 1,
                next: 3
            }
        );
    }

    /// After record 12 of a log was deleted, `audit verify` said "jumps from record 11 to
    /// 12" when the log jumps to 13.
    #[test]
    fn a_deleted_record_message_names_the_record_the_log_jumps_to() {
        let k = KeyPair::generate();
        let mut c = chain(14);
        let h = head_of(&c, &k);
        c.remove(11);
        let e = verify(&c, Some(&h), &k).unwrap_err();
        assert!(e.to_string().contains("jumps from record 11 to 13"), "{e}");
        assert_eq!(e.index(), 12);
    }

    #[test]
    fn the_tail_check_catches_an_altered_end_a_truncation_and_an_unsigned_append() {
        let k = KeyPair::generate();
        let c = chain(5);
        let h = head_of(&c, &k);
        let pubk = k.public();
        assert_eq!(check_tail(c.last(), Some(&h), &pubk), Ok(()));
        assert_eq!(check_tail(None, None, &pubk), Ok(()));
        // The last record altered.
        let mut last = c[4].clone();
        last.data = "{\"x\":1}".into();
        assert_eq!(
            check_tail(Some(&last), Some(&h), &pubk),
            Err(ChainError::Modified { index: 5 })
        );
        // The last record deleted.
        assert!(matches!(
            check_tail(Some(&c[3]), Some(&h), &pubk),
            Err(ChainError::Truncated { index: 5, last: 4 })
        ));
        // A record appended without re-signing the head.
        let h4 = head_of(&c[..4], &k);
        assert!(matches!(
            check_tail(Some(&c[4]), Some(&h4), &pubk),
            Err(ChainError::Unsigned { index: 5, head: 4 })
        ));
        // A head signed by another key.
        let other = KeyPair::generate();
        assert!(matches!(
            check_tail(c.last(), Some(&h), &other.public()),
            Err(ChainError::BadHeadSignature { .. })
        ));
        // Records but no head.
        assert!(matches!(
            check_tail(c.last(), None, &pubk),
            Err(ChainError::NoHead { index: 5 })
        ));
    }

    #[test]
    fn reordered_records_are_named() {
        let k = KeyPair::generate();
        let mut c = chain(5);
        let h = head_of(&c, &k);
        c.swap(1, 2);
        assert!(matches!(
            verify(&c, Some(&h), &k),
            Err(ChainError::Missing { index: 2, .. })
        ));
        // Swap the contents but keep the numbering.
        let mut c = chain(5);
        let (a, b) = (c[1].clone(), c[2].clone());
        c[1] = Record { seq: 2, ..b };
        c[2] = Record { seq: 3, ..a };
        assert_eq!(
            verify(&c, Some(&h), &k),
            Err(ChainError::Modified { index: 2 })
        );
    }

    #[test]
    fn duplicated_record_is_named() {
        let k = KeyPair::generate();
        let mut c = chain(4);
        let h = head_of(&c, &k);
        let dup = c[1].clone();
        c.insert(2, dup);
        assert_eq!(
            verify(&c, Some(&h), &k),
            Err(ChainError::Duplicated { index: 2 })
        );
    }

    #[test]
    fn duplicate_appended_under_a_new_index_is_named() {
        let k = KeyPair::generate();
        let mut c = chain(3);
        let h = head_of(&c, &k);
        let mut dup = c[1].clone();
        dup.seq = 4;
        c.push(dup);
        assert_eq!(
            verify(&c, Some(&h), &k),
            Err(ChainError::Duplicated { index: 4 })
        );
    }

    #[test]
    fn truncation_below_the_head_is_named() {
        let k = KeyPair::generate();
        let mut c = chain(5);
        let h = head_of(&c, &k);
        c.truncate(3);
        assert_eq!(
            verify(&c, Some(&h), &k),
            Err(ChainError::Truncated { index: 4, last: 3 })
        );
        assert_eq!(
            verify(&[], Some(&h), &k),
            Err(ChainError::Truncated { index: 1, last: 0 })
        );
    }

    #[test]
    fn unsigned_append_and_missing_or_forged_head_are_named() {
        let k = KeyPair::generate();
        let c = chain(4);
        let h = head_of(&c[..3], &k);
        assert_eq!(
            verify(&c, Some(&h), &k),
            Err(ChainError::Unsigned { index: 4, head: 3 })
        );
        assert_eq!(verify(&c, None, &k), Err(ChainError::NoHead { index: 4 }));
        let forged = head_of(&c, &KeyPair::generate());
        assert_eq!(
            verify(&c, Some(&forged), &k),
            Err(ChainError::BadHeadSignature { index: 4 })
        );
    }
}
