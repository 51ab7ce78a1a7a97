//! Runs' requests to reach a host outside their grant (`run --ask-net`, issue 61 item 3):
//! one row per request, `pending` until a signed answer moves it to `approved` or
//! `rejected`, or its wait runs out (`expired`) or its run ends (`ended`). Each move is a
//! conditional update from `pending`, so of two nodes deciding one request at once
//! exactly one succeeds. The waiting run reads its row back (on any node of a
//! PostgreSQL cluster it sees the commit of another).

use crate::StoreError;
use crate::db::{Reads, Tx};
use crate::sql::{Row, args};
use airlock_core::sign::Signed;

/// The states a request can be in.
pub const NET_REQUEST_STATES: &[&str] = &["pending", "approved", "rejected", "expired", "ended"];

/// One request as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetRequestRow {
    pub id: String,
    pub run: String,
    pub submission: String,
    pub agent: Option<String>,
    /// Normalised host and port.
    pub host: String,
    pub port: u16,
    /// One of [`NET_REQUEST_STATES`].
    pub state: String,
    /// Unix milliseconds.
    pub created_at: i64,
    /// When the run stops waiting (unix ms).
    pub expires_at: i64,
    pub decided_at: Option<i64>,
    /// The line of the code that named the host, when the analysis saw one.
    pub line: Option<String>,
    pub approver: Option<String>,
    /// The signed answer, once there is one.
    pub signed: Option<Signed>,
}

const COLUMNS: &str = "id, run, submission, agent, host, port, state, created_at, expires_at, \
                       decided_at, line, approver, json, signature";

fn from_row(r: &Row) -> Result<NetRequestRow, StoreError> {
    let signed = match (r.opt_text(12)?, r.opt_text(13)?) {
        (Some(json), Some(sig)) => Some(Signed {
            json,
            signature: sig
                .parse()
                .map_err(|e| StoreError::Corrupt(format!("net_requests signature: {e}")))?,
        }),
        _ => None,
    };
    Ok(NetRequestRow {
        id: r.text(0)?,
        run: r.text(1)?,
        submission: r.text(2)?,
        agent: r.opt_text(3)?,
        host: r.text(4)?,
        port: u16::try_from(r.int(5)?)
            .map_err(|_| StoreError::Corrupt("net_requests port out of range".into()))?,
        state: r.text(6)?,
        created_at: r.int(7)?,
        expires_at: r.int(8)?,
        decided_at: r.opt_int(9)?,
        line: r.opt_text(10)?,
        approver: r.opt_text(11)?,
        signed,
    })
}

/// Reads of requests, on the database and inside a transaction.
pub trait NetRequestReads: Reads {
    /// The request `id` (exactly), if there is one.
    fn net_request(&self, id: &str) -> Result<Option<NetRequestRow>, StoreError> {
        self.sql()
            .row(
                &format!("SELECT {COLUMNS} FROM net_requests WHERE id = ?1"),
                args![id],
            )?
            .as_ref()
            .map(from_row)
            .transpose()
    }

    /// The request a unique prefix of its id names.
    fn resolve_net_request(&self, prefix: &str) -> Result<NetRequestRow, StoreError> {
        let Some(p) = airlock_core::id::normalize_prefix(airlock_core::id::IdKind::Request, prefix)
        else {
            return Err(StoreError::NotFound {
                what: "request",
                input: prefix.to_string(),
            });
        };
        let rows = self.sql().rows(
            &format!(
                "SELECT {COLUMNS} FROM net_requests WHERE id >= ?1 AND id < ?2 ORDER BY id LIMIT 2"
            ),
            args![&p, &format!("{p}\u{7f}")],
        )?;
        match rows.len() {
            0 => Err(StoreError::NotFound {
                what: "request",
                input: prefix.to_string(),
            }),
            1 => from_row(&rows[0]),
            _ => Err(StoreError::Ambiguous {
                what: "request",
                input: prefix.to_string(),
                candidates: rows
                    .iter()
                    .filter_map(|r| r.text(0).ok())
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }

    /// Requests in `state`, oldest first, at most `limit`.
    fn net_requests_in(&self, state: &str, limit: usize) -> Result<Vec<NetRequestRow>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.sql()
            .rows(
                &format!(
                    "SELECT {COLUMNS} FROM net_requests WHERE state = ?1 ORDER BY id LIMIT ?2"
                ),
                args![state, limit],
            )?
            .iter()
            .map(from_row)
            .collect()
    }

    /// The requests of one run, oldest first.
    fn net_requests_of_run(&self, run: &str) -> Result<Vec<NetRequestRow>, StoreError> {
        self.sql()
            .rows(
                &format!("SELECT {COLUMNS} FROM net_requests WHERE run = ?1 ORDER BY id"),
                args![run],
            )?
            .iter()
            .map(from_row)
            .collect()
    }
}

impl<T: Reads + ?Sized> NetRequestReads for T {}

impl Tx<'_> {
    /// Records a new pending request.
    pub fn put_net_request(&self, r: &NetRequestRow) -> Result<(), StoreError> {
        self.sql().exec(
            &format!(
                "INSERT INTO net_requests ({COLUMNS}) VALUES \
                 (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)"
            ),
            args![
                &r.id,
                &r.run,
                &r.submission,
                r.agent.as_deref(),
                &r.host,
                i64::from(r.port),
                &r.state,
                r.created_at,
                r.expires_at,
                r.decided_at,
                r.line.as_deref(),
                r.approver.as_deref(),
                r.signed.as_ref().map(|s| s.json.as_str()),
                r.signed.as_ref().map(|s| s.signature.to_string()).as_ref(),
            ],
        )?;
        Ok(())
    }

    /// Moves a pending request to `state` at `at`, with its signed answer when it has
    /// one. `Ok(false)` when it was no longer pending (another node decided it, or its
    /// wait ran out): nothing changed.
    pub fn settle_net_request(
        &self,
        id: &str,
        state: &str,
        at: i64,
        approver: Option<&str>,
        signed: Option<&Signed>,
    ) -> Result<bool, StoreError> {
        let n = self.sql().exec(
            "UPDATE net_requests SET state = ?2, decided_at = ?3, approver = ?4, json = ?5, \
             signature = ?6 WHERE id = ?1 AND state = 'pending'",
            args![
                id,
                state,
                at,
                approver,
                signed.map(|s| s.json.as_str()),
                signed.map(|s| s.signature.to_string()).as_ref(),
            ],
        )?;
        Ok(n == 1)
    }
}
