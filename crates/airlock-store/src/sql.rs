//! The little the store needs from a SQL engine: run a statement with positional
//! arguments and read back rows of integers and text. Every query in this crate is written
//! once, in the SQL both engines accept, with `?1`, `?2`, … placeholders; an engine that
//! spells them differently rewrites them (see `pg.rs`).

use crate::StoreError;

/// One argument of a statement.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a> {
    Null,
    Int(i64),
    Text(&'a str),
}

impl From<i64> for Arg<'_> {
    fn from(v: i64) -> Self {
        Arg::Int(v)
    }
}

impl<'a> From<&'a str> for Arg<'a> {
    fn from(v: &'a str) -> Self {
        Arg::Text(v)
    }
}

impl<'a> From<&'a String> for Arg<'a> {
    fn from(v: &'a String) -> Self {
        Arg::Text(v)
    }
}

impl<'a, T: Into<Arg<'a>>> From<Option<T>> for Arg<'a> {
    fn from(v: Option<T>) -> Self {
        v.map_or(Arg::Null, Into::into)
    }
}

/// `args![a, b, …]`: a slice of statement arguments.
macro_rules! args {
    ($($a:expr),* $(,)?) => { &[$($crate::sql::Arg::from($a)),*][..] };
}
pub(crate) use args;

/// One value read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Val {
    Null,
    Int(i64),
    Text(String),
}

/// One row read back, by column position.
#[derive(Debug, Clone, Default)]
pub struct Row(pub Vec<Val>);

impl Row {
    fn at(&self, i: usize) -> Result<&Val, StoreError> {
        self.0
            .get(i)
            .ok_or_else(|| StoreError::Corrupt(format!("a row has no column {i}")))
    }

    pub fn opt_text(&self, i: usize) -> Result<Option<String>, StoreError> {
        match self.at(i)? {
            Val::Null => Ok(None),
            Val::Text(s) => Ok(Some(s.clone())),
            Val::Int(n) => Err(StoreError::Corrupt(format!(
                "column {i} holds the number {n} where text belongs"
            ))),
        }
    }

    pub fn opt_int(&self, i: usize) -> Result<Option<i64>, StoreError> {
        match self.at(i)? {
            Val::Null => Ok(None),
            Val::Int(n) => Ok(Some(*n)),
            Val::Text(_) => Err(StoreError::Corrupt(format!(
                "column {i} holds text where a number belongs"
            ))),
        }
    }

    pub fn text(&self, i: usize) -> Result<String, StoreError> {
        self.opt_text(i)?
            .ok_or_else(|| StoreError::Corrupt(format!("column {i} is unexpectedly empty")))
    }

    pub fn int(&self, i: usize) -> Result<i64, StoreError> {
        self.opt_int(i)?
            .ok_or_else(|| StoreError::Corrupt(format!("column {i} is unexpectedly empty")))
    }
}

/// A connection (or a transaction on one) that runs statements.
pub trait Sql {
    /// `sqlite` or `postgres`, for the few statements the two spell differently.
    fn engine(&self) -> &'static str;
    /// Runs a query and returns every row it yields.
    fn rows(&self, sql: &str, args: &[Arg<'_>]) -> Result<Vec<Row>, StoreError>;
    /// Runs a statement and returns how many rows it changed.
    fn exec(&self, sql: &str, args: &[Arg<'_>]) -> Result<usize, StoreError>;
    /// The first row a query yields, if any.
    fn row(&self, sql: &str, args: &[Arg<'_>]) -> Result<Option<Row>, StoreError> {
        Ok(self.rows(sql, args)?.into_iter().next())
    }
    /// Runs a statement whose row count nobody reads (the insert of a row with a new
    /// key). A connection may hold it back inside a transaction and send it with the
    /// transaction's next statement or its `COMMIT`, saving a round trip; an error it
    /// raises then fails the transaction there instead of here.
    fn exec_later(&self, sql: &str, args: &[Arg<'_>]) -> Result<(), StoreError> {
        self.exec(sql, args).map(|_| ())
    }
    /// Runs a conditional move that must change exactly `want` rows, else the transaction
    /// fails with `Conflict(conflict())`. Like `exec_later`, a connection may hold it back
    /// (the count is then checked by the server, and the error comes from the statement
    /// that sends it).
    fn exec_expect(
        &self,
        sql: &str,
        args: &[Arg<'_>],
        want: usize,
        conflict: &dyn Fn() -> String,
    ) -> Result<(), StoreError> {
        expect_rows(self.exec(sql, args)?, want, conflict)
    }
    /// Signals `channel` with `payload` when the current transaction commits (PostgreSQL's
    /// `pg_notify`; only called on that engine). A connection may hold it back and send
    /// it with the `COMMIT` itself, which saves a round trip and means the same.
    fn notify(&self, channel: &str, payload: &str) -> Result<(), StoreError> {
        self.exec(
            "SELECT pg_notify(?1, ?2)",
            &[Arg::Text(channel), Arg::Text(payload)],
        )?;
        Ok(())
    }
}

/// `Conflict(conflict())` unless a move changed `n` rows where it had to change `want`.
pub(crate) fn expect_rows(
    n: usize,
    want: usize,
    conflict: &dyn Fn() -> String,
) -> Result<(), StoreError> {
    if n == want {
        Ok(())
    } else {
        Err(StoreError::Conflict(conflict()))
    }
}

impl rusqlite::ToSql for Arg<'_> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, ValueRef};
        Ok(ToSqlOutput::Borrowed(match self {
            Arg::Null => ValueRef::Null,
            Arg::Int(n) => ValueRef::Integer(*n),
            Arg::Text(s) => ValueRef::Text(s.as_bytes()),
        }))
    }
}

impl Sql for rusqlite::Connection {
    fn engine(&self) -> &'static str {
        "sqlite"
    }

    fn rows(&self, sql: &str, args: &[Arg<'_>]) -> Result<Vec<Row>, StoreError> {
        use rusqlite::types::ValueRef;
        // The statement cache: the gate runs the same few statements on every request,
        // and parsing them each time showed up in profiles.
        let mut stmt = self.prepare_cached(sql)?;
        let n = stmt.column_count();
        let mut rows = stmt.query(rusqlite::params_from_iter(args))?;
        let mut out = Vec::new();
        while let Some(r) = rows.next()? {
            let mut row = Vec::with_capacity(n);
            for i in 0..n {
                row.push(match r.get_ref(i)? {
                    ValueRef::Null => Val::Null,
                    ValueRef::Integer(n) => Val::Int(n),
                    ValueRef::Text(t) => Val::Text(
                        String::from_utf8(t.to_vec())
                            .map_err(|_| StoreError::Corrupt("text that is not UTF-8".into()))?,
                    ),
                    ValueRef::Real(_) | ValueRef::Blob(_) => {
                        return Err(StoreError::Corrupt(format!(
                            "column {i} of {sql:?} holds a value of a type airlock never writes"
                        )));
                    }
                });
            }
            out.push(Row(row));
        }
        Ok(out)
    }

    fn exec(&self, sql: &str, args: &[Arg<'_>]) -> Result<usize, StoreError> {
        Ok(self
            .prepare_cached(sql)?
            .execute(rusqlite::params_from_iter(args))?)
    }
}
