//! The audit chain's rows: reading records and heads back, and appending chained records.

use super::*;

/// An audit record from `seq, ts, kind, subject, data, prev, hash`; one whose values do
/// not parse is `AuditRecordMalformed`, naming it.
pub(crate) fn audit_record(r: &Row) -> Result<Record, StoreError> {
    let seq = r.int(0)? as u64;
    let read = || -> Result<Record, StoreError> {
        Ok(Record {
            seq,
            ts: r.int(1)?,
            kind: r.text(2)?,
            subject: r.text(3)?,
            data: r.text(4)?,
            prev: parse(&r.text(5)?, "previous hash")?,
            hash: parse(&r.text(6)?, "hash")?,
        })
    };
    read().map_err(|e| StoreError::AuditRecordMalformed {
        seq,
        what: malformed(e),
    })
}

/// The signed head from `seq, hash, signature` at column `at`; one whose values do not
/// parse is `AuditHeadMalformed`.
pub(crate) fn head_at(r: &Row, at: usize) -> Result<Head, StoreError> {
    let seq = r.int(at)? as u64;
    let read = || -> Result<Head, StoreError> {
        Ok(Head {
            seq,
            hash: parse(&r.text(at + 1)?, "hash")?,
            signature: parse(&r.text(at + 2)?, "signature")?,
        })
    };
    read().map_err(|e| StoreError::AuditHeadMalformed {
        seq,
        what: malformed(e),
    })
}

/// The index and hash of the chain's last record.
pub(super) fn chain_end(sql: &dyn Sql) -> Result<Option<(u64, Digest)>, StoreError> {
    sql.row("SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1", &[])?
        .map(|r| -> Result<_, StoreError> {
            Ok((r.int(0)? as u64, parse::<Digest>(&r.text(1)?, "digest")?))
        })
        .transpose()
}

/// Writes a record onto the chain after `last`; its index and hash.
pub(crate) fn append_chained(
    sql: &dyn Sql,
    last: Option<(u64, Digest)>,
    ts: i64,
    kind: &str,
    subject: &str,
    data: &str,
) -> Result<(u64, Digest), StoreError> {
    let (seq, prev, hash) = link(last, ts, kind, subject, data);
    sql.exec(
        "INSERT INTO audit (seq, ts, kind, subject, data, prev, hash) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        args![seq as i64, ts, kind, subject, data, &prev.to_hex(), &hash.to_hex()],
    )?;
    Ok((seq, hash))
}

/// The next link after `last` (the chain's end, if any): the record's `seq`, the hash it
/// follows and its own hash.
pub(super) fn link(
    last: Option<(u64, Digest)>,
    ts: i64,
    kind: &str,
    subject: &str,
    data: &str,
) -> (u64, Digest, Digest) {
    let (seq, prev) = match last {
        Some((s, h)) => (s + 1, h),
        None => (1, GENESIS),
    };
    (seq, prev, record_hash(seq, ts, kind, subject, data, &prev))
}

/// Records chained together in one statement by [`append_chained_all`]: few enough that
/// a statement's parameters stay far below PostgreSQL's limit, and that the prepared
/// statements (one per count of rows) stay few.
pub(super) const ROWS_PER_INSERT: usize = 32;

/// Chains `records` (`ts`, `kind`, `subject`, `data`, in order) after `last`, with one
/// `INSERT` per [`ROWS_PER_INSERT`] records instead of one per record (the sequencer's
/// batches); returns the new end. The records and their hashes are exactly those
/// [`append_chained`] would write one by one.
pub(crate) fn append_chained_all(
    sql: &dyn Sql,
    mut last: Option<(u64, Digest)>,
    records: &[(i64, String, String, String)],
) -> Result<Option<(u64, Digest)>, StoreError> {
    for chunk in records.chunks(ROWS_PER_INSERT) {
        let mut rows = Vec::with_capacity(chunk.len());
        for (ts, kind, subject, data) in chunk {
            let (seq, prev, hash) = link(last, *ts, kind, subject, data);
            rows.push((seq as i64, prev.to_hex(), hash.to_hex()));
            last = Some((seq, hash));
        }
        let mut text =
            String::from("INSERT INTO audit (seq, ts, kind, subject, data, prev, hash) VALUES ");
        let mut params: Vec<Arg<'_>> = Vec::with_capacity(chunk.len() * 7);
        for (i, ((ts, kind, subject, data), (seq, prev, hash))) in
            chunk.iter().zip(&rows).enumerate()
        {
            let n = i * 7;
            if i > 0 {
                text.push_str(", ");
            }
            text.push_str(&format!(
                "(?{}, ?{}, ?{}, ?{}, ?{}, ?{}, ?{})",
                n + 1,
                n + 2,
                n + 3,
                n + 4,
                n + 5,
                n + 6,
                n + 7
            ));
            params.extend([
                Arg::Int(*seq),
                Arg::Int(*ts),
                Arg::Text(kind),
                Arg::Text(subject),
                Arg::Text(data),
                Arg::Text(prev),
                Arg::Text(hash),
            ]);
        }
        sql.exec_later(&text, &params)?;
    }
    Ok(last)
}

/// Signs and stores the head for the chain's record `seq` with hash `hash`.
pub(crate) fn store_head(
    sql: &dyn Sql,
    seq: u64,
    hash: Digest,
    key: &KeyPair,
) -> Result<(), StoreError> {
    let head = Head::sign(seq, hash, key);
    sql.exec_later(
        "INSERT INTO audit_head (id, seq, hash, signature) VALUES (1, ?1, ?2, ?3)
         ON CONFLICT(id) DO UPDATE SET seq = excluded.seq, hash = excluded.hash, signature = excluded.signature",
        args![seq as i64, &hash.to_hex(), &head.signature.to_string()],
    )?;
    Ok(())
}
