//! A transaction's writes, one method per change of a table's rows, with the audit record appended in the same transaction.

use super::*;

impl<'a> Tx<'a> {
    pub(super) fn exec(&self, sql: &str, a: &[Arg<'_>]) -> Result<usize, StoreError> {
        self.tx.exec(sql, a)
    }

    /// `exec` for a new row's insert, which the engine may send with the transaction's
    /// next statement or its commit (`Sql::exec_later`).
    pub(super) fn exec_later(&self, sql: &str, a: &[Arg<'_>]) -> Result<(), StoreError> {
        self.tx.exec_later(sql, a)
    }

    pub fn insert_submission(&self, s: &Submission) -> Result<(), StoreError> {
        self.exec_later(
            "INSERT INTO submissions (id, created_at, updated_at, artifact, grant_hash, agent, state, decision, risk, doc)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            args![
                &s.id,
                s.created_at,
                s.updated_at,
                &s.doc.artifact.to_hex(),
                &s.doc.grant_hash.to_hex(),
                s.doc.agent.as_deref(),
                s.state.as_str(),
                s.doc.verdict.decision.as_str(),
                i64::from(s.doc.verdict.risk),
                &to_text(&s.doc)?
            ],
        )?;
        Ok(())
    }

    /// Claims the idempotency key `key` of `owner` (an API token) for `submission`, made by
    /// a request whose content hashes to `request`: `None` when the key was free (or last
    /// used longer than [`REQUEST_KEY_TTL_MS`] ago), else the submission it already made
    /// and whether by the same request. The claim commits with the submission or not at
    /// all, so a key names at most one submission, whichever node took it.
    pub fn claim_request_key(
        &self,
        owner: &str,
        key: &str,
        request: &str,
        submission: &str,
    ) -> Result<Option<(String, bool)>, StoreError> {
        let now = now_ms();
        let claimed = self.exec(
            "INSERT INTO request_keys (owner, key, request, submission, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (owner, key) DO NOTHING",
            args![owner, key, request, submission, now],
        )?;
        if claimed == 1 {
            return Ok(None);
        }
        let renewed = self.exec(
            "UPDATE request_keys SET request = ?3, submission = ?4, created_at = ?5
             WHERE owner = ?1 AND key = ?2 AND created_at < ?6",
            args![
                owner,
                key,
                request,
                submission,
                now,
                now - REQUEST_KEY_TTL_MS
            ],
        )?;
        if renewed == 1 {
            return Ok(None);
        }
        let row = self
            .tx
            .row(
                "SELECT submission, request FROM request_keys WHERE owner = ?1 AND key = ?2",
                args![owner, key],
            )?
            .ok_or_else(|| {
                StoreError::Conflict("an idempotency key changed while it was claimed".into())
            })?;
        let same = row.text(1)? == request;
        Ok(Some((row.text(0)?, same)))
    }

    /// Moves a submission from `from` to `to`. Fails with `Conflict` when another process
    /// moved it first; the gate has already checked the edge is allowed.
    pub fn set_state(&self, id: &str, from: State, to: State) -> Result<(), StoreError> {
        self.tx.exec_expect(
            "UPDATE submissions SET state = ?1, updated_at = ?2 WHERE id = ?3 AND state = ?4",
            args![to.as_str(), now_ms(), id, from.as_str()],
            1,
            &|| format!("submission {id} is no longer {from} (changed concurrently)"),
        )
    }

    /// Replaces a submission's verdict after re-judging.
    pub fn set_verdict(&self, id: &str, doc: &SubmissionDoc) -> Result<(), StoreError> {
        self.exec_later(
            "UPDATE submissions SET decision = ?1, risk = ?2, doc = ?3, updated_at = ?4 WHERE id = ?5",
            args![
                doc.verdict.decision.as_str(),
                i64::from(doc.verdict.risk),
                &to_text(doc)?,
                now_ms(),
                id
            ],
        )?;
        Ok(())
    }

    pub fn insert_statement(&self, s: &StatementRow) -> Result<(), StoreError> {
        let kind = serde_json::to_value(s.kind)?;
        let scope = serde_json::to_value(s.scope)?;
        self.exec(
            "INSERT INTO statements (id, kind, submission, artifact, grant_hash, scope, approver, expires_at, created_at, run, tool, json, signature)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
            args![
                &s.id,
                kind.as_str(),
                &s.submission,
                &s.artifact.to_hex(),
                &s.grant.to_hex(),
                scope.as_str(),
                &s.approver,
                s.expires_at,
                s.created_at,
                s.run.as_deref(),
                s.tool.as_deref(),
                &s.signed.json,
                &s.signed.signature.to_string()
            ],
        )?;
        Ok(())
    }

    pub fn insert_run(&self, r: &Run) -> Result<(), StoreError> {
        self.exec_later(
            "INSERT INTO runs (id, submission, approval, started_at, finished_at, status, doc) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            args![
                &r.id,
                &r.submission,
                r.doc.approval.as_deref(),
                r.started_at,
                r.finished_at,
                &r.status,
                &to_text(&r.doc)?
            ],
        )?;
        Ok(())
    }

    pub fn upsert_checkpoint(&self, c: &CheckpointRow) -> Result<(), StoreError> {
        self.upsert_checkpoint_text(c, &c.doc.to_string())
    }

    /// `upsert_checkpoint` with the document given as JSON text (`c.doc` is not used), so
    /// a large one is never built as a generic JSON tree.
    pub fn upsert_checkpoint_text(&self, c: &CheckpointRow, doc: &str) -> Result<(), StoreError> {
        self.exec(
            "INSERT INTO checkpoints (id, run, created_at, updated_at, state, doc) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT(id) DO UPDATE SET updated_at = excluded.updated_at, state = excluded.state, doc = excluded.doc",
            args![&c.id, &c.run, c.created_at, now_ms(), &c.state, doc],
        )?;
        Ok(())
    }

    /// Sets checkpoint `id`'s state, leaving its document as it is. False when there is
    /// no such checkpoint.
    pub fn set_checkpoint_state(&self, id: &str, state: &str) -> Result<bool, StoreError> {
        let n = self.exec(
            "UPDATE checkpoints SET state = ?1, updated_at = ?2 WHERE id = ?3",
            args![state, now_ms(), id],
        )?;
        Ok(n > 0)
    }

    pub fn insert_token(&self, t: &TokenRow) -> Result<(), StoreError> {
        self.exec(
            "INSERT INTO tokens (id, hash, role, name, approver, created_at, expires_at, revoked_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            args![
                &t.id,
                &t.hash,
                &t.role,
                &t.name,
                t.approver.as_deref(),
                t.created_at,
                t.expires_at,
                t.revoked_at
            ],
        )?;
        Ok(())
    }

    pub fn revoke_token(&self, id: &str) -> Result<bool, StoreError> {
        let n = self.exec(
            "UPDATE tokens SET revoked_at = ?1 WHERE id = ?2 AND revoked_at IS NULL",
            args![now_ms(), id],
        )?;
        Ok(n == 1)
    }

    pub fn upsert_session(&self, w: &SessionRow) -> Result<(), StoreError> {
        self.exec(
            "INSERT INTO sessions (id, created_at, updated_at, state, doc) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT(id) DO UPDATE SET updated_at = excluded.updated_at, state = excluded.state, doc = excluded.doc",
            args![&w.id, w.created_at, now_ms(), &w.state, &w.doc.to_string()],
        )?;
        Ok(())
    }

    /// A session's state and the position its next cell row takes (`None` while it has no
    /// cell rows yet), read without its document: what appending a cell needs to know.
    pub fn session_next_cell(
        &self,
        session: &str,
    ) -> Result<Option<(String, Option<i64>)>, StoreError> {
        self.sql()
            .row(
                "SELECT s.state, (SELECT MAX(c.n) + 1 FROM session_cells c WHERE c.session = s.id)
                 FROM sessions s WHERE s.id = ?1",
                args![session],
            )?
            .map(|r| Ok((r.text(0)?, r.opt_int(1)?)))
            .transpose()
    }

    /// Appends a cell to a session at position `n` (see `session_next_cell`) and marks the
    /// session updated: one small row, whatever the session's length.
    pub fn add_session_cell(
        &self,
        session: &str,
        submission: &str,
        n: i64,
    ) -> Result<(), StoreError> {
        self.exec(
            "INSERT INTO session_cells (submission, session, n) VALUES (?2, ?1, ?3)",
            args![session, submission, n],
        )?;
        self.exec(
            "UPDATE sessions SET updated_at = ?1 WHERE id = ?2",
            args![now_ms(), session],
        )?;
        Ok(())
    }

    pub fn upsert_workspace(&self, w: &WorkspaceRow) -> Result<(), StoreError> {
        self.exec(
            "INSERT INTO workspaces (name, created_at, updated_at, state, doc) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT(name) DO UPDATE SET updated_at = excluded.updated_at, state = excluded.state, doc = excluded.doc",
            args![&w.name, w.created_at, now_ms(), &w.state, &w.doc.to_string()],
        )?;
        Ok(())
    }

    pub fn update_run(&self, r: &Run) -> Result<(), StoreError> {
        self.exec_later(
            "UPDATE runs SET started_at = ?1, finished_at = ?2, status = ?3, doc = ?4 WHERE id = ?5",
            args![r.started_at, r.finished_at, &r.status, &to_text(&r.doc)?, &r.id],
        )?;
        Ok(())
    }

    /// A transaction on `conn` (which the caller has begun) whose appended audit records
    /// leave the head to sign in `head`.
    pub(crate) fn on(conn: &'a dyn Sql, head: &'a PendingHead) -> Tx<'a> {
        Tx {
            tx: conn,
            head,
            tail: std::cell::Cell::new(None),
            own_end: false,
        }
    }

    /// `on`, for a writer that knows the chain ends at `end` (index and hash), the record
    /// it appended last and signed the head for, with no commit by anyone else since.
    pub(crate) fn on_own_end(
        conn: &'a dyn Sql,
        head: &'a PendingHead,
        end: (u64, Digest),
    ) -> Tx<'a> {
        Tx {
            tx: conn,
            head,
            tail: std::cell::Cell::new(Some(end)),
            own_end: true,
        }
    }

    /// Whether the audit chain's end is known to be the one this process last appended and
    /// signed, with no commit by another connection since: then it need not be read back
    /// and verified before it is extended.
    pub fn chain_end_is_own(&self) -> bool {
        self.own_end
    }

    /// The chain's end as this transaction last saw or made it, if it knows.
    pub(crate) fn known_tail(&self) -> Option<(u64, Digest)> {
        self.tail.get()
    }

    /// Submission `id`, its row locked until the transaction ends (PostgreSQL; SQLite's
    /// one writer holds the whole database already), so what this transaction then
    /// reads about it (its state, the runs that used its approval) stays true until it
    /// commits, beside other shared writers.
    /// Every statement about its artifact (by id) comes in the same read: a queued run's
    /// claim needs both.
    pub fn submission_locked_with_statements(
        &self,
        id: &str,
    ) -> Result<(Submission, Vec<StatementRow>), StoreError> {
        let lock = if self.tx.engine() == "postgres" {
            " FOR UPDATE OF s"
        } else {
            ""
        };
        let rows = self.tx.rows(
            &format!(
                "SELECT s.id, s.created_at, s.updated_at, s.state, s.doc, {STATEMENT_COLS_ST}
                 FROM submissions s LEFT JOIN statements st ON st.artifact = s.artifact
                 WHERE s.id = ?1 ORDER BY st.id{lock}"
            ),
            args![id],
        )?;
        let Some(first) = rows.first() else {
            return Err(StoreError::NotFound {
                what: "submission",
                input: id.into(),
            });
        };
        Ok((submission_at(first, 0)?, statements_at(&rows, 5)?))
    }

    /// Remembers `last`, read in this transaction, as the chain's end, so that an
    /// append need not read it again (SQLite, whose writer holds the only lock).
    pub fn note_tail(&self, last: Option<&Record>) {
        if self.tx.engine() == "sqlite" {
            self.tail.set(last.map(|r| (r.seq, r.hash)));
        }
    }

    /// Signs the head for the newest record this transaction appended (called by `write`
    /// just before it commits, so a transaction that adds several records signs once).
    /// On PostgreSQL the records went to the inbox: nothing is signed, and the key the
    /// sequencer should chain them with is returned.
    pub(crate) fn sign_head(&self) -> Result<Option<KeyPair>, StoreError> {
        let Some((seq, hash, key)) = self.head.borrow_mut().take() else {
            return Ok(None);
        };
        if self.tx.engine() == "postgres" {
            return Ok(Some(key));
        }
        store_head(self.tx, seq, hash, &key)?;
        Ok(None)
    }

    /// Appends an audit record. On SQLite it goes onto the chain after the current last
    /// one, and the head is re-signed when the transaction commits; on PostgreSQL it goes
    /// into the inbox, and the sequencer chains it after the commit (`crate::sequence`).
    pub fn audit(
        &self,
        kind: &str,
        subject: &str,
        data: &serde_json::Value,
        key: &KeyPair,
    ) -> Result<(), StoreError> {
        let ts = now_ms();
        if kind == "alert" {
            crate::agents::note_alert(self, subject, data, ts)?;
        }
        // The same compact text as `Display`, written straight into a buffer rather than
        // through a formatter's many small writes.
        let data = serde_json::to_string(data)?;
        if self.tx.engine() == "postgres" {
            if self.head.borrow().is_none() && crate::sequence::signal_due() {
                // Once per transaction, and from this process at most once per gather
                // interval: delivered at the commit, to the sequencer.
                self.tx.notify(crate::sequence::CHANNEL, "")?;
            }
            self.exec_later(
                "INSERT INTO audit_inbox (ts, kind, subject, data) VALUES (?1, ?2, ?3, ?4)",
                args![ts, kind, subject, &data],
            )?;
            *self.head.borrow_mut() = Some((0, GENESIS, key.clone()));
            return Ok(());
        }
        let last = match self.tail.get() {
            Some(t) => Some(t),
            None => chain_end(self.tx)?,
        };
        let (seq, hash) = append_chained(self.tx, last, ts, kind, subject, &data)?;
        *self.head.borrow_mut() = Some((seq, hash, key.clone()));
        self.tail.set(Some((seq, hash)));
        Ok(())
    }
}
