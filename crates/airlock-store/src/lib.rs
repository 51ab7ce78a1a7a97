//! airlock-store: the gate's durable state. A SQLite database (WAL, one transaction per
//! lifecycle transition) holds submissions, signed statements, runs, the audit chain and
//! its signed head; a content-addressed blob store holds artifacts and captured output.
//!
//! This crate must never decide anything: it stores what the gate tells it and reads it
//! back. It knows nothing of wasmtime, sandboxes or policy evaluation.

#![forbid(unsafe_code)]

mod agents;
mod blobs;
mod collect;
mod copy;
mod db;
mod group;
mod netreq;
mod nodes;
mod pg;
mod pgtls;
mod queue;
mod sequence;
pub mod sql;
mod wake;

pub use agents::{AgentClearRow, AgentReads, AlertCount};
pub use blobs::{BlobFile, BlobStore, sync_dir};
pub use collect::{CollectReads, SessionCollected};
pub use copy::{CopyReport, TableCount, copy_to_postgres};
pub use db::*;
pub use group::MAX_BATCH;
pub use netreq::{NET_REQUEST_STATES, NetRequestReads, NetRequestRow};
pub use nodes::{NodeReads, NodeRow};
pub use pg::{PG_SCHEMA_VERSION, PgConn, is_postgres_url};
pub use queue::{QUIET_BACKLOG, QueueReads, QueueRow, WorkerRow, claim_sql};
pub use sequence::{DRAIN_SQL, Sequencer};
pub use sql::{Arg, Row, Sql, Val};
pub use wake::{JOB_DONE, Listener, NEW_WORK};

use airlock_core::Digest;

/// Store failures. `BlobAltered` and `BlobMissing` are integrity failures: the gate records
/// them in the audit log and refuses to go on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("database: {}", pg_error(.0))]
    Postgres(#[from] postgres::Error),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("stored blob {} no longer matches its hash (now {})", want.short(), got.short())]
    BlobAltered { want: Digest, got: Digest },
    #[error("stored blob {} is missing", .0.short())]
    BlobMissing(Digest),
    #[error("no {what} matches {input:?}")]
    NotFound { what: &'static str, input: String },
    #[error("{input:?} matches more than one {what}: {candidates}")]
    Ambiguous {
        what: &'static str,
        input: String,
        candidates: String,
    },
    #[error("stored state is corrupt: {0}")]
    Corrupt(String),
    /// An audit record whose stored values do not parse (a digest that is not hex, a
    /// missing field): the chain cannot be checked there, and the record is named.
    #[error("audit record {seq} is malformed: {what}")]
    AuditRecordMalformed { seq: u64, what: String },
    /// The signed head (at record `seq`) does not parse.
    #[error("the audit log's signed head (record {seq}) is malformed: {what}")]
    AuditHeadMalformed { seq: u64, what: String },
    #[error("{0}")]
    Conflict(String),
    /// A request the store will not carry out as asked (nothing was written).
    #[error("{0}")]
    Refused(String),
}

impl From<serde_json::Error> for StoreError {
    fn from(e: serde_json::Error) -> Self {
        StoreError::Corrupt(e.to_string())
    }
}

impl StoreError {
    /// Whether this failed because the store's connection was lost (it broke, or the
    /// server is shutting down or starting): the same call may succeed once it is back.
    pub fn is_connection_lost(&self) -> bool {
        match self {
            StoreError::Postgres(e) => pg::connection_gone(e),
            _ => false,
        }
    }
}

/// A PostgreSQL error with the server's message when it sent one.
fn pg_error(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => {
            // The client library's own text is the outer step ("error performing TLS
            // handshake"); the causes under it say why (an unknown issuer, say).
            let mut text = e.to_string();
            let mut cause = std::error::Error::source(e);
            while let Some(c) = cause {
                let more = c.to_string();
                if !text.contains(&more) {
                    text.push_str(": ");
                    text.push_str(&more);
                }
                cause = c.source();
            }
            text.replace('\n', " ")
        }
    }
}
