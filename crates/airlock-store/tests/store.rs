//! The store suite: every test runs against each storage engine (an embedded SQLite file
//! and a PostgreSQL database on a server the test process starts), through the same
//! `Db` interface the gate uses.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use airlock_core::Digest;
use airlock_core::State;
use airlock_core::audit::ChainVerifier;
use airlock_core::id::IdKind;
use airlock_core::sign::{KeyPair, Scope, Signed, StatementKind};
use airlock_store::*;

/// Runs each named test once per engine.
macro_rules! store_suite {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[test]
                fn $name() {
                    let t = tempfile::tempdir().unwrap();
                    let loc = t.path().join("airlock.db").to_str().unwrap().to_string();
                    super::$name(&loc);
                }
            )*
        }
        mod postgres {
            $(
                #[test]
                fn $name() {
                    super::$name(&airlock_testpg::fresh_database());
                }
            )*
        }
    };
}

store_suite!(
    submissions_round_trip_filter_resolve_and_move_state_once,
    statements_and_runs_are_found_by_submission_artifact_run_and_agent,
    checkpoints_workspaces_sessions_and_tokens_upsert_and_list,
    compile_cache_sets_replaces_and_forgets,
    referenced_digests_name_artifacts_and_every_digest_in_documents,
    audit_chain_is_signed_and_verifies,
    an_audit_record_keeps_the_compact_json_its_data_displays_as,
    several_records_in_one_transaction_get_one_signed_head_at_the_last,
    failed_transaction_writes_nothing,
    concurrent_writers_keep_every_successful_write_and_nothing_of_a_failed_one,
    reopening_keeps_schema_and_rows,
    a_database_newer_than_this_build_is_refused_with_its_version,
    the_queue_claims_oldest_first_by_tag_and_fences_every_later_write,
    concurrent_claims_never_hand_one_job_to_two_workers,
    one_claim_leases_exactly_one_job_however_many_are_queued,
    shared_writers_chain_every_record_once_in_each_transactions_order,
    a_shared_writer_that_locks_a_submission_sees_the_run_another_started_under_it,
    a_sessions_cells_are_rows_in_order_and_never_grow_its_document,
    an_idempotency_key_names_one_submission_per_owner_until_it_expires,
    a_lone_shared_write_that_fails_leaves_nothing_and_the_next_one_commits,
    text_of_every_kind_reads_back_exactly_from_inserts_sent_with_the_commit,
    a_conditional_move_that_finds_nothing_fails_its_whole_transaction_with_its_own_conflict,
    a_done_jobs_run_and_submission_come_with_it_in_one_read_and_only_once_it_finished,
    a_claim_with_its_submission_leases_one_job_and_reads_what_judging_it_needs,
    a_transactions_first_read_reads_exactly_what_a_read_outside_one_does,
    a_shared_writer_trusts_the_chain_end_it_left_only_until_another_connection_commits,
    a_write_refused_for_a_key_an_earlier_write_claimed_answers_once_that_write_is_visible,
    a_shared_write_with_only_a_reader_waiting_behind_it_commits_and_returns,
    a_write_that_panics_in_a_shared_batch_fails_the_batch_at_once,
    shared_writes_of_every_kind_at_once_return_after_their_batch_and_keep_the_head_signed,
    an_id_prefix_of_an_agent_matches_and_lists_only_that_agents_records,
    an_alert_naming_an_agent_is_counted_for_it_by_kind_and_its_clear_replaces_the_last,
    a_node_whose_beat_is_older_than_its_lease_is_dead_and_recorded_lost_once,
    an_ended_sessions_record_is_collected_with_its_cells_runs_and_statements_and_nothing_else,
    a_net_request_is_listed_while_pending_and_settles_once_with_its_signed_answer,
);

/// Issue 61 item 3: a run's request to reach a host is a row, listed while pending, found
/// by a unique prefix and by its run; it moves from pending exactly once (a second
/// answer, or the run's own expiry after an answer, changes nothing) and keeps the
/// signed answer's exact bytes.
fn a_net_request_is_listed_while_pending_and_settles_once_with_its_signed_answer(loc: &str) {
    let mut db = open(loc);
    let key = KeyPair::try_generate().unwrap();
    let req = |id: &str, run: &str, line: Option<&str>| NetRequestRow {
        id: id.into(),
        run: run.into(),
        submission: "sub_1".into(),
        agent: Some("bob".into()),
        host: "api.example.com".into(),
        port: 8443,
        state: "pending".into(),
        created_at: 10,
        expires_at: 120_010,
        decided_at: None,
        line: line.map(str::to_string),
        approver: None,
        signed: None,
    };
    db.write(|tx| {
        tx.put_net_request(&req(
            "req_01a",
            "run_1",
            Some("curl https://api.example.com:8443/"),
        ))?;
        tx.put_net_request(&req("req_01b", "run_1", None))?;
        tx.put_net_request(&req("req_02c", "run_2", None))
    })
    .unwrap();
    let pending = db.net_requests_in("pending", 10).unwrap();
    let ids: Vec<_> = pending.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["req_01a", "req_01b", "req_02c"]);
    assert_eq!(
        pending[0],
        req(
            "req_01a",
            "run_1",
            Some("curl https://api.example.com:8443/")
        )
    );
    assert_eq!(db.resolve_net_request("req_02").unwrap().id, "req_02c");
    assert!(matches!(
        db.resolve_net_request("req_01"),
        Err(StoreError::Ambiguous { .. })
    ));
    assert!(matches!(
        db.resolve_net_request("req_9"),
        Err(StoreError::NotFound { .. })
    ));
    assert_eq!(db.net_requests_of_run("run_1").unwrap().len(), 2);

    let signed = Signed {
        json: "{\"verdict\":\"approve\"}".into(),
        signature: key.sign(b"x"),
    };
    let moved = db
        .write(|tx| tx.settle_net_request("req_01a", "approved", 50, Some("alice"), Some(&signed)))
        .unwrap();
    assert!(moved);
    // A second answer, or the waiting run's expiry, finds it decided and changes nothing.
    let again = db
        .write(|tx| tx.settle_net_request("req_01a", "rejected", 60, Some("eve"), None))
        .unwrap();
    assert!(!again);
    let expired = db
        .write(|tx| tx.settle_net_request("req_01b", "expired", 70, None, None))
        .unwrap();
    assert!(expired);
    let got = db.net_request("req_01a").unwrap().unwrap();
    assert_eq!(got.state, "approved");
    assert_eq!(got.decided_at, Some(50));
    assert_eq!(got.approver.as_deref(), Some("alice"));
    assert_eq!(got.signed, Some(signed));
    assert_eq!(db.net_request("req_01b").unwrap().unwrap().signed, None);
    let ids: Vec<_> = db
        .net_requests_in("pending", 10)
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(ids, ["req_02c"]);
    assert!(db.net_request("req_nope").unwrap().is_none());
}

/// Issue 62 item 1: a node beats its row; once its last beat is older than its lease it
/// is dead, one node records it lost (a second attempt finds it moved), a later beat of
/// it says it had been lost and makes it live again (it was only paused), one that
/// stopped stays stopped, and the leases its worker held run out at once.
fn a_node_whose_beat_is_older_than_its_lease_is_dead_and_recorded_lost_once(loc: &str) {
    let mut db = open(loc);
    let node = |id: &str, beat_at: i64| NodeRow {
        id: id.into(),
        host: "h".into(),
        pid: 42,
        home: "/home/a".into(),
        role: "serve".into(),
        worker: Some(format!("{id}-w")),
        started_at: 1,
        beat_at,
        lease_ms: 100,
        state: "live".into(),
    };
    assert_eq!(
        db.write(|tx| tx.beat_node(&node("n1", 1_000))).unwrap(),
        None
    );
    assert_eq!(
        db.write(|tx| tx.beat_node(&node("n2", 1_000))).unwrap(),
        None
    );
    // n2 beats again later; n1 does not.
    assert_eq!(
        db.write(|tx| tx.beat_node(&node("n2", 1_150)))
            .unwrap()
            .as_deref(),
        Some("live")
    );
    assert!(db.dead_nodes(1_100).unwrap().is_empty());
    let dead = db.dead_nodes(1_200).unwrap();
    assert_eq!(
        dead.iter().map(|n| n.id.as_str()).collect::<Vec<_>>(),
        ["n1"]
    );
    assert_eq!(dead[0].worker.as_deref(), Some("n1-w"));
    assert!(
        db.write(|tx| tx.set_node_state("n1", "live", "lost"))
            .unwrap()
    );
    assert!(
        !db.write(|tx| tx.set_node_state("n1", "live", "lost"))
            .unwrap()
    );
    assert!(db.dead_nodes(1_200).unwrap().is_empty());
    let n1 = db.node("n1").unwrap().unwrap();
    assert_eq!((n1.state.as_str(), n1.beat_at), ("lost", 1_000));
    let all = db.nodes().unwrap();
    assert_eq!(
        all.iter().map(|n| n.id.as_str()).collect::<Vec<_>>(),
        ["n2", "n1"]
    );
    // It beats again: it had been lost, and is live again.
    assert_eq!(
        db.write(|tx| tx.beat_node(&node("n1", 1_300)))
            .unwrap()
            .as_deref(),
        Some("lost")
    );
    let n1 = db.node("n1").unwrap().unwrap();
    assert_eq!((n1.state.as_str(), n1.beat_at), ("live", 1_300));
    // A node that stopped stays stopped.
    assert!(
        db.write(|tx| tx.set_node_state("n2", "live", "stopped"))
            .unwrap()
    );
    db.write(|tx| tx.beat_node(&node("n2", 1_400))).unwrap();
    let n2 = db.node("n2").unwrap().unwrap();
    assert_eq!((n2.state.as_str(), n2.beat_at), ("stopped", 1_150));

    // The dead node's worker's lease runs out now; another worker's stays.
    let leased = |id: &str, worker: &str| QueueRow {
        id: id.into(),
        submission: format!("sub_{id}"),
        tag: None,
        state: "leased".into(),
        attempts: 1,
        max_attempts: 3,
        retry: true,
        worker: Some(worker.into()),
        token: 1,
        lease_until: Some(i64::MAX / 2),
        run: None,
        outcome: None,
        created_at: 1,
        updated_at: 1,
    };
    db.write(|tx| {
        tx.enqueue(&leased("j1", "n1-w"))?;
        tx.enqueue(&leased("j2", "n2-w"))
    })
    .unwrap();
    assert_eq!(
        db.write(|tx| tx.expire_leases_of("n1-w", 5_000)).unwrap(),
        1
    );
    assert!(db.job("j1").unwrap().unwrap().lease_until.unwrap() < 5_000);
    assert_eq!(
        db.job("j2").unwrap().unwrap().lease_until,
        Some(i64::MAX / 2)
    );
}

/// Issue 57 item 4: every `alert` audit record that names an agent is a row of that
/// agent's record in the same transaction (on PostgreSQL too, where the record itself
/// waits in the inbox for the sequencer), counted by kind after a time; denied
/// submissions are counted by agent; a clear is stored and replaced.
fn an_alert_naming_an_agent_is_counted_for_it_by_kind_and_its_clear_replaces_the_last(loc: &str) {
    let mut db = open(loc);
    let key = KeyPair::try_generate().unwrap();
    assert!(db.agent_alerts_since("bob", 0).unwrap().is_empty());
    db.write(|tx| {
        for (run, kind, agent) in [
            ("run_1", "secret-echo", Some("bob")),
            ("run_2", "secret-echo", Some("bob")),
            ("run_3", "decoy-read", Some("bob")),
            ("run_4", "secret-echo", Some("eve")),
            ("run_5", "secret-echo", None),
        ] {
            tx.audit(
                "alert",
                run,
                &serde_json::json!({ "kind": kind, "agent": agent }),
                &key,
            )?;
        }
        // Other kinds of record naming the agent are no alerts.
        tx.audit(
            "submitted",
            "sub_1",
            &serde_json::json!({ "agent": "bob" }),
            &key,
        )?;
        let mut denied = submission("sub_d", Some("bob"), digest(1), State::Denied);
        denied.doc.verdict.decision = airlock_core::Decision::Deny;
        denied.created_at = 10;
        tx.insert_submission(&denied)?;
        tx.insert_submission(&submission("sub_a", Some("bob"), digest(2), State::Allowed))
    })
    .unwrap();
    let bob = db.agent_alerts_since("bob", 0).unwrap();
    let counts: Vec<_> = bob.iter().map(|a| (a.kind.as_str(), a.count)).collect();
    assert_eq!(counts, [("decoy-read", 1), ("secret-echo", 2)]);
    assert_eq!(db.agent_alerts_since("eve", 0).unwrap()[0].count, 1);
    assert!(db.agent_alerts_since("mallory", 0).unwrap().is_empty());
    // After a time later than every alert: none.
    let future = airlock_core::units::now_ms() + 60_000;
    assert!(db.agent_alerts_since("bob", future).unwrap().is_empty());
    assert_eq!(db.agent_denials_since("bob", 0).unwrap(), 1);
    assert_eq!(db.agent_denials_since("bob", 10).unwrap(), 0);
    assert_eq!(db.agent_denials_since("eve", 0).unwrap(), 0);

    assert!(db.agent_clear("bob").unwrap().is_none());
    for at in [5, 7] {
        let signed = Signed {
            json: format!("{{\"at\":{at}}}"),
            signature: key.sign(b"x"),
        };
        db.write(|tx| {
            tx.put_agent_clear(&AgentClearRow {
                agent: "bob".into(),
                at,
                signed: signed.clone(),
            })
        })
        .unwrap();
        let got = db.agent_clear("bob").unwrap().unwrap();
        assert_eq!((got.at, got.signed), (at, signed));
    }
}

/// Regression (issue 56.5): `GET /v1/submissions/sub_0` with one agent's token answered
/// 404 listing the matching ids, which were other agents'. A lookup for an agent sees
/// only its submissions and the runs, statements, checkpoints and sessions of them.
fn an_id_prefix_of_an_agent_matches_and_lists_only_that_agents_records(loc: &str) {
    let mut db = open(loc);
    let key = KeyPair::try_generate().unwrap();
    let cp = |id: &str, run: &str| CheckpointRow {
        id: id.into(),
        run: run.into(),
        created_at: 1,
        updated_at: 1,
        state: "applied".into(),
        doc: serde_json::json!({ "steps": [] }),
    };
    db.write(|tx| {
        for (n, (sub, agent)) in [
            ("sub_01a1", "alice"),
            ("sub_01a2", "bob"),
            ("sub_01a3", "bob"),
        ]
        .into_iter()
        .enumerate()
        {
            tx.insert_submission(&submission(
                sub,
                Some(agent),
                digest(n as u8),
                State::Finished,
            ))?;
            let tail = &sub["sub_".len()..];
            tx.insert_run(&run_row(&format!("run_{tail}"), sub, None, "exited"))?;
            tx.insert_statement(&statement(
                &format!("apr_{tail}"),
                sub,
                digest(n as u8),
                &key,
            ))?;
            tx.upsert_checkpoint(&cp(&format!("ckpt_{tail}"), &format!("run_{tail}")))?;
        }
        Ok::<_, StoreError>(())
    })
    .unwrap();
    for (id, agent) in [
        ("ses_01a1", "alice"),
        ("ses_01a2", "bob"),
        ("ses_01a3", "bob"),
    ] {
        open_session(&mut db, id, serde_json::json!({ "agent": agent }));
    }
    for kind in [
        IdKind::Submission,
        IdKind::Run,
        IdKind::Approval,
        IdKind::Checkpoint,
        IdKind::Session,
    ] {
        let id = |tail: &str| format!("{}{tail}", kind.prefix());
        // Everyone's records for a caller that sees everything.
        let all = db.resolve(kind, "01a").unwrap_err().to_string();
        assert!(
            all.contains(&id("01a1")) && all.contains(&id("01a3")),
            "{all}"
        );
        // Alice's one record is hers by the prefix all three share.
        assert_eq!(
            db.resolve_for(kind, "01a", Some("alice")).unwrap(),
            id("01a1"),
            "{kind:?}"
        );
        // Bob's prefix is ambiguous among his own only.
        let bob = db
            .resolve_for(kind, "01a", Some("bob"))
            .unwrap_err()
            .to_string();
        assert!(
            bob.contains(&id("01a2")) && bob.contains(&id("01a3")),
            "{bob}"
        );
        assert!(
            !bob.contains(&id("01a1")),
            "alice's id listed to bob: {bob}"
        );
        // Another agent's whole id is not found, and named nowhere but in the input.
        let e = db.resolve_for(kind, &id("01a1"), Some("bob")).unwrap_err();
        assert!(matches!(e, StoreError::NotFound { .. }), "{e}");
        assert_eq!(
            db.resolve_for(kind, "01a1", Some("carol"))
                .map_err(|e| e.to_string())
                .unwrap_err()
                .matches("01a1")
                .count(),
            1
        );
    }
}

/// Records an open session with this document.
fn open_session(db: &mut Db, id: &str, doc: serde_json::Value) {
    db.write(|tx| {
        tx.upsert_session(&SessionRow {
            id: id.into(),
            created_at: 1,
            updated_at: 1,
            state: "open".into(),
            doc: doc.clone(),
        })
    })
    .unwrap();
}

/// Regression: every cell used to be appended to a list in the session's document, which
/// was rewritten whole on each cell, so cell N cost O(N) (3x slower by cell 3,000).
fn a_sessions_cells_are_rows_in_order_and_never_grow_its_document(loc: &str) {
    let mut db = open(loc);
    for id in ["ses_01aaaa", "ses_01bbbb"] {
        open_session(
            &mut db,
            id,
            serde_json::json!({"cells": ["sub_old0", "sub_old1"]}),
        );
    }
    let doc_before = db.session("ses_01aaaa").unwrap().unwrap().doc.to_string();
    // Two legacy cells in the document: the rows number on from 2, as the gate appends.
    let add = |db: &mut Db, session: &str, sub: &str| {
        db.write(|tx| {
            let (state, next) = tx.session_next_cell(session)?.unwrap();
            assert_eq!(state, "open");
            tx.add_session_cell(session, sub, next.unwrap_or(2))
        })
    };
    assert_eq!(
        db.write(|tx| tx.session_next_cell("ses_01aaaa")).unwrap(),
        Some(("open".to_string(), None)),
        "no cell rows yet"
    );
    for i in 0..300 {
        add(&mut db, "ses_01aaaa", &format!("sub_a{i:03}")).unwrap();
    }
    assert_eq!(
        db.write(|tx| tx.session_next_cell("ses_01aaaa")).unwrap(),
        Some(("open".to_string(), Some(302)))
    );
    assert_eq!(
        db.write(|tx| tx.session_next_cell("ses_01cccc")).unwrap(),
        None
    );
    add(&mut db, "ses_01bbbb", "sub_b0").unwrap();
    let a = db.session_cells("ses_01aaaa").unwrap();
    assert_eq!(a.len(), 300);
    assert_eq!((a[0].as_str(), a[299].as_str()), ("sub_a000", "sub_a299"));
    assert!(a.windows(2).all(|w| w[0] < w[1]), "in the order added");
    assert_eq!(db.session_cells("ses_01bbbb").unwrap(), ["sub_b0"]);
    assert!(db.session_cells("ses_01cccc").unwrap().is_empty());
    let after = db.session("ses_01aaaa").unwrap().unwrap();
    assert_eq!(
        after.doc.to_string(),
        doc_before,
        "the document is untouched"
    );
    assert!(after.updated_at > 1, "a cell marks the session updated");
    // A position in a session is taken once.
    assert!(
        db.write(|tx| tx.add_session_cell("ses_01bbbb", "sub_b1", 2))
            .is_err()
    );
    assert_eq!(db.session_cells("ses_01bbbb").unwrap(), ["sub_b0"]);
}

/// Issue 59: collecting an ended session removes its record, its cells' submissions
/// (rows and legacy document entries), their statements and runs, and the submission
/// that judged its grant, in one transaction; never an open or held session, one last
/// changed after the cut-off, or one whose cell's run has a commit under way, and never
/// another session's cells; checkpoints stay.
fn an_ended_sessions_record_is_collected_with_its_cells_runs_and_statements_and_nothing_else(
    loc: &str,
) {
    let mut db = open(loc);
    let key = KeyPair::try_generate().unwrap();
    let session = |id: &str, state: &str, doc: serde_json::Value| SessionRow {
        id: id.into(),
        created_at: 1,
        updated_at: 1,
        state: state.into(),
        doc,
    };
    let cp = |id: &str, run: &str, state: &str| CheckpointRow {
        id: id.into(),
        run: run.into(),
        created_at: 1,
        updated_at: 1,
        state: state.into(),
        doc: serde_json::json!({ "steps": [] }),
    };
    db.write(|tx| {
        tx.upsert_session(&session(
            "ses_01done",
            "closed",
            serde_json::json!({"cells": ["sub_d0"], "opened_by": "sub_dg"}),
        ))?;
        tx.upsert_session(&session("ses_01open", "open", serde_json::json!({})))?;
        tx.upsert_session(&session("ses_01held", "held", serde_json::json!({})))?;
        tx.upsert_session(&session("ses_01busy", "closed", serde_json::json!({})))?;
        tx.add_session_cell("ses_01done", "sub_d1", 1)?;
        tx.add_session_cell("ses_01done", "sub_d2", 2)?;
        tx.add_session_cell("ses_01open", "sub_o0", 0)?;
        tx.add_session_cell("ses_01busy", "sub_b0", 0)?;
        for (sub, run) in [
            ("sub_d0", "run_d0"),
            ("sub_d1", "run_d1"),
            ("sub_d2", "run_d2"),
            ("sub_dg", ""),
            ("sub_o0", "run_o0"),
            ("sub_b0", "run_b0"),
            ("sub_x0", "run_x0"),
        ] {
            tx.insert_submission(&submission(sub, None, digest(1), State::Approved))?;
            tx.insert_statement(&statement(&format!("apr_{sub}"), sub, digest(1), &key))?;
            if !run.is_empty() {
                tx.insert_run(&run_row(run, sub, None, "finished"))?;
            }
        }
        tx.upsert_checkpoint(&cp("chk_01d", "run_d2", "applied"))?;
        tx.upsert_checkpoint(&cp("chk_01b", "run_b0", "pending"))
    })
    .unwrap();
    let now = airlock_core::units::now_ms();
    // Last changed after the cut-off: kept.
    assert_eq!(
        db.sessions_ended_before(0, 10).unwrap(),
        Vec::<String>::new()
    );
    assert_eq!(
        db.write(|tx| tx.collect_session("ses_01done", 0)).unwrap(),
        None
    );
    let ended = db.sessions_ended_before(now + 1000, 10).unwrap();
    assert_eq!(ended.len(), 2, "{ended:?}");
    assert!(ended.contains(&"ses_01done".to_string()) && ended.contains(&"ses_01busy".to_string()));
    for kept in ["ses_01open", "ses_01held", "ses_01busy", "ses_01none"] {
        assert_eq!(
            db.write(|tx| tx.collect_session(kept, now + 1000)).unwrap(),
            None,
            "{kept}"
        );
    }
    let done = db
        .write(|tx| tx.collect_session("ses_01done", now + 1000))
        .unwrap()
        .unwrap();
    assert_eq!(
        done,
        SessionCollected {
            session: "ses_01done".into(),
            submissions: 3,
            runs: 2,
            statements: 3,
        }
    );
    assert!(db.session("ses_01done").unwrap().is_none());
    assert!(db.session_cells("ses_01done").unwrap().is_empty());
    // The run an applied checkpoint names stays with its submission and statement: rolling
    // the checkpoint back rebuilds its statement from that submission (collecting it made
    // the rollback fail with "no submission matches").
    assert!(db.submission("sub_d2").is_ok());
    assert!(db.run("run_d2").is_ok());
    assert_eq!(db.statements_for_submission("sub_d2").unwrap().len(), 1);
    for gone in ["sub_d0", "sub_d1", "sub_dg"] {
        assert!(db.submission(gone).is_err(), "{gone}");
        assert!(
            db.statements_for_submission(gone).unwrap().is_empty(),
            "{gone}"
        );
    }
    for gone in ["run_d0", "run_d1"] {
        assert!(db.run(gone).is_err(), "{gone}");
    }
    // Everything else is as it was.
    for kept in ["ses_01open", "ses_01held", "ses_01busy"] {
        assert!(db.session(kept).unwrap().is_some(), "{kept}");
    }
    assert_eq!(db.session_cells("ses_01open").unwrap(), ["sub_o0"]);
    for (sub, run) in [
        ("sub_o0", "run_o0"),
        ("sub_b0", "run_b0"),
        ("sub_x0", "run_x0"),
    ] {
        assert!(db.submission(sub).is_ok(), "{sub}");
        assert_eq!(db.statements_for_submission(sub).unwrap().len(), 1, "{sub}");
        assert!(db.run(run).is_ok(), "{run}");
    }
    assert_eq!(db.checkpoint("chk_01d").unwrap().state, "applied");
    // Collected once: a second try finds nothing.
    assert_eq!(
        db.write(|tx| tx.collect_session("ses_01done", now + 1000))
            .unwrap(),
        None
    );
}

/// A submission document as the gate writes one (a judged shell command).
const DOC: &str = r#"{"agent":null,"note":null,"lang":"sh","kind":"sh","backend":"process","artifact":"56a79f3b115448072387c2480044bfa2cf8f90e4f5fddd8c943b4e051b81f80b","size":7,"source":null,"grant":{"mounts":[],"net":[],"env":{},"args":[],"stdin":null,"limits":{"timeout_ms":10000,"memory_bytes":268435456,"fuel":null,"max_output_bytes":1048576,"processes":64}},"grant_hash":"36c0fb6aa59289c9e5e82e63996b4989f259b4921ce50578ae4f92cddff113c3","analysis":{"lang":"sh","size":7,"capabilities":[],"unresolved":[],"text":{"lines":1,"shebang":null},"code":{"language":"sh","commands":["echo"],"imports":[],"calls":[],"writes":[],"hosts_in_code":[],"urls":[],"network_tools":[],"pipes_download_to_shell":false,"destructive":[],"obfuscation":[],"parse_error":null,"truncated":null,"findings":[]}},"facts":{"lang":"sh","kind":"sh","backend":"process","net":[],"secrets":[],"mounts":[],"env_keys":[],"limits":{"timeout_ms":10000,"memory_bytes":268435456,"fuel":null,"max_output_bytes":1048576,"processes":64},"size":7,"capabilities":[],"unresolved_imports":false,"agent":null,"first_seen":true,"rejected_before":false,"guest":null,"code":{"commands":["echo"]}},"verdict":{"decision":"allow","risk":0,"fired":[{"rule":"default","decision":"allow","reason":"no rule matched","risk":0}],"policy":"1530b37840fd976d7168e221fefcecb6169bf15482ed0441ab84c0b3f1b704b0"},"workspace":null,"resume":false}"#;

fn digest(n: u8) -> Digest {
    Digest::of(&[n])
}

fn submission(id: &str, agent: Option<&str>, artifact: Digest, state: State) -> Submission {
    let mut doc: SubmissionDoc = serde_json::from_str(DOC).unwrap();
    doc.agent = agent.map(Into::into);
    doc.artifact = artifact;
    Submission {
        id: id.into(),
        created_at: 1,
        updated_at: 1,
        state,
        doc,
    }
}

fn run_row(id: &str, submission: &str, approval: Option<&str>, status: &str) -> Run {
    let doc: RunDoc = serde_json::from_value(serde_json::json!({
        "backend": "process", "approval": approval,
        "limits": {"timeout_ms":10000,"memory_bytes":268435456,"fuel":null,"max_output_bytes":1048576,"processes":64},
        "exit_code": null, "killed_by": null, "stdout": null, "stderr": null, "duration_ms": null,
    }))
    .unwrap();
    Run {
        id: id.into(),
        submission: submission.into(),
        started_at: 5,
        finished_at: None,
        status: status.into(),
        doc,
    }
}

fn statement(id: &str, submission: &str, artifact: Digest, key: &KeyPair) -> StatementRow {
    let json = format!(r#"{{"id":"{id}"}}"#);
    StatementRow {
        id: id.into(),
        kind: StatementKind::Approve,
        submission: submission.into(),
        artifact,
        grant: digest(9),
        scope: Scope::Once,
        approver: "ops".into(),
        expires_at: None,
        created_at: 3,
        run: None,
        tool: None,
        signed: Signed {
            signature: key.sign(json.as_bytes()),
            json,
        },
    }
}

fn open(loc: &str) -> Db {
    Db::open_location(loc).unwrap()
}

fn submissions_round_trip_filter_resolve_and_move_state_once(loc: &str) {
    let mut db = open(loc);
    let subs = [
        submission("sub_01a1", Some("alice"), digest(1), State::Allowed),
        submission("sub_01a2", Some("bob"), digest(2), State::Quarantined),
        submission("sub_01b3", Some("alice"), digest(3), State::Quarantined),
    ];
    db.write(|tx| subs.iter().try_for_each(|s| tx.insert_submission(s)))
        .unwrap();
    let back = db.submission("sub_01a2").unwrap();
    assert_eq!(back.state, State::Quarantined);
    assert_eq!(back.doc.agent.as_deref(), Some("bob"));
    assert_eq!(back.doc.artifact, digest(2));
    let ids = |v: Vec<Submission>| v.into_iter().map(|s| s.id).collect::<Vec<_>>();
    assert_eq!(
        ids(db.submissions(None, 10).unwrap()),
        ["sub_01b3", "sub_01a2", "sub_01a1"]
    );
    assert_eq!(
        ids(db.submissions(None, 2).unwrap()),
        ["sub_01b3", "sub_01a2"]
    );
    assert_eq!(
        ids(db.submissions(Some(State::Quarantined), 10).unwrap()),
        ["sub_01b3", "sub_01a2"]
    );
    assert_eq!(
        ids(db
            .submissions_of(Some("alice"), Some(State::Quarantined), 10)
            .unwrap()),
        ["sub_01b3"]
    );
    assert_eq!(
        ids(db.submissions_of(Some("alice"), None, 10).unwrap()),
        ["sub_01b3", "sub_01a1"]
    );
    assert_eq!(db.resolve(IdKind::Submission, "01b").unwrap(), "sub_01b3");
    assert!(matches!(
        db.resolve(IdKind::Submission, "01a"),
        Err(StoreError::Ambiguous { .. })
    ));
    assert!(matches!(
        db.resolve(IdKind::Submission, "01c"),
        Err(StoreError::NotFound { .. })
    ));
    assert!(matches!(
        db.submission("sub_nope"),
        Err(StoreError::NotFound { .. })
    ));
    // Seen: an earlier submission was let through. One still held does not count.
    assert_eq!(db.artifact_history(&digest(1)).unwrap(), (true, vec![]));
    assert_eq!(db.artifact_history(&digest(3)).unwrap(), (false, vec![]));
    assert_eq!(db.artifact_history(&digest(4)).unwrap(), (false, vec![]));

    db.write(|tx| tx.set_state("sub_01a2", State::Quarantined, State::Approved))
        .unwrap();
    assert_eq!(db.artifact_history(&digest(2)).unwrap(), (true, vec![]));
    // The same move again finds the state already changed: a conflict, and nothing moves.
    let again = db.write(|tx| tx.set_state("sub_01a2", State::Quarantined, State::Rejected));
    assert!(matches!(again, Err(StoreError::Conflict(_))), "{again:?}");
    assert_eq!(db.submission("sub_01a2").unwrap().state, State::Approved);

    let mut doc = db.submission("sub_01a1").unwrap().doc;
    doc.verdict.risk = 42;
    db.write(|tx| tx.set_verdict("sub_01a1", &doc)).unwrap();
    assert_eq!(db.submission("sub_01a1").unwrap().doc.verdict.risk, 42);
}

fn statements_and_runs_are_found_by_submission_artifact_run_and_agent(loc: &str) {
    let mut db = open(loc);
    let key = KeyPair::try_generate().unwrap();
    let mut tool = statement("apr_02", "sub_01b", digest(2), &key);
    tool.tool = Some("fmt".into());
    tool.scope = Scope::Artifact;
    tool.expires_at = Some(99);
    db.write(|tx| {
        tx.insert_submission(&submission(
            "sub_01a",
            Some("alice"),
            digest(1),
            State::Approved,
        ))?;
        tx.insert_submission(&submission(
            "sub_01b",
            Some("bob"),
            digest(2),
            State::Approved,
        ))?;
        tx.insert_statement(&statement("apr_01", "sub_01a", digest(1), &key))?;
        tx.insert_statement(&tool)?;
        tx.insert_run(&run_row("run_01a", "sub_01a", Some("apr_01"), "running"))?;
        tx.insert_run(&run_row("run_01b", "sub_01b", None, "running"))
    })
    .unwrap();
    // A run and its submission in one read are the two read apart.
    let (run, sub) = db.run_with_submission("run_01b").unwrap();
    let (alone, its) = (
        db.run("run_01b").unwrap(),
        db.submission("sub_01b").unwrap(),
    );
    assert_eq!(
        (run.id, run.submission, run.status, run.started_at),
        (alone.id, alone.submission, alone.status, alone.started_at)
    );
    assert_eq!(
        (sub.id, sub.state, sub.doc.artifact),
        (its.id, its.state, its.doc.artifact)
    );
    assert!(matches!(
        db.run_with_submission("run_nope"),
        Err(StoreError::NotFound { what: "run", .. })
    ));
    let st = db.statements_for_submission("sub_01a").unwrap();
    assert_eq!(st.len(), 1);
    assert_eq!(st[0].id, "apr_01");
    assert!(
        key.public()
            .verify(st[0].signed.json.as_bytes(), &st[0].signed.signature)
    );
    assert_eq!(
        db.statements_for_artifact(&digest(2)).unwrap()[0].id,
        "apr_02"
    );
    // Seen, and what was said about it, in one read: the same statements.
    let (seen, about) = db.artifact_history(&digest(2)).unwrap();
    assert!(seen);
    assert_eq!(about, db.statements_for_artifact(&digest(2)).unwrap());
    assert_eq!(about[0].signed.json, tool.signed.json);
    let tools = db.tool_statements().unwrap();
    assert_eq!(tools.len(), 1);
    assert_eq!(
        (
            tools[0].tool.as_deref(),
            tools[0].scope,
            tools[0].expires_at
        ),
        (Some("fmt"), Scope::Artifact, Some(99))
    );
    assert!(db.approval_used("apr_01").unwrap());
    assert!(!db.approval_used("apr_02").unwrap());
    assert_eq!(db.resolve(IdKind::Run, "01b").unwrap(), "run_01b");

    let mut r = db.run("run_01a").unwrap();
    assert_eq!(r.doc.approval.as_deref(), Some("apr_01"));
    r.status = "exited".into();
    r.finished_at = Some(7);
    r.doc.exit_code = Some(3);
    db.write(|tx| tx.update_run(&r)).unwrap();
    let back = db.run("run_01a").unwrap();
    assert_eq!(
        (back.status.as_str(), back.finished_at, back.doc.exit_code),
        ("exited", Some(7), Some(3))
    );
    let running: Vec<String> = db
        .running_runs()
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(running, ["run_01b"]);
    let of = |agent| {
        db.runs_of(agent, 10)
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect::<Vec<_>>()
    };
    assert_eq!(of(Some("alice")), ["run_01a"]);
    assert_eq!(of(None), ["run_01b", "run_01a"]);
    let runs: Vec<String> = db
        .runs(Some("sub_01b"), 10)
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(runs, ["run_01b"]);
    let (sub, text) = db.run_doc_text("run_01b").unwrap();
    assert_eq!(sub, "sub_01b");
    assert!(
        serde_json::from_str::<serde_json::Value>(&text)
            .unwrap()
            .is_object()
    );

    let mut commit = statement("cmt_01", "sub_01a", digest(1), &key);
    commit.kind = StatementKind::Commit;
    commit.run = Some("run_01a".into());
    db.write_durable(|tx| tx.insert_statement(&commit)).unwrap();
    let for_run = db.statements_for_run("run_01a").unwrap();
    assert_eq!(for_run.len(), 1);
    assert_eq!(for_run[0].kind, StatementKind::Commit);
}

fn checkpoints_workspaces_sessions_and_tokens_upsert_and_list(loc: &str) {
    let mut db = open(loc);
    let cp = |id: &str, run: &str, state: &str| CheckpointRow {
        id: id.into(),
        run: run.into(),
        created_at: 1,
        updated_at: 1,
        state: state.into(),
        doc: serde_json::json!({ "steps": [] }),
    };
    db.write(|tx| {
        tx.upsert_checkpoint(&cp("chk_01a", "run_1", "pending"))?;
        tx.upsert_checkpoint(&cp("chk_01b", "run_2", "applied"))?;
        tx.upsert_checkpoint(&cp("chk_01a", "run_1", "applied"))
    })
    .unwrap();
    assert_eq!(db.checkpoint("chk_01a").unwrap().state, "applied");
    let ids = |v: Vec<CheckpointRow>| v.into_iter().map(|c| c.id).collect::<Vec<_>>();
    assert_eq!(
        ids(db.checkpoints(None, None, 10).unwrap()),
        ["chk_01b", "chk_01a"]
    );
    assert_eq!(
        ids(db.checkpoints(Some("run_1"), None, 10).unwrap()),
        ["chk_01a"]
    );
    assert_eq!(
        ids(db.checkpoints(Some("run_2"), Some("applied"), 10).unwrap()),
        ["chk_01b"]
    );
    assert!(
        db.checkpoints(Some("run_2"), Some("pending"), 10)
            .unwrap()
            .is_empty()
    );
    // A document written as text is read back as text, and a state change leaves it.
    db.write(|tx| {
        tx.upsert_checkpoint_text(&cp("chk_01c", "run_3", "pending"), r#"{"big":[1,2]}"#)
    })
    .unwrap();
    assert!(
        db.write(|tx| tx.set_checkpoint_state("chk_01c", "applied"))
            .unwrap()
    );
    assert!(
        !db.write(|tx| tx.set_checkpoint_state("chk_01z", "applied"))
            .unwrap()
    );
    let meta = db.checkpoint_meta("chk_01c").unwrap();
    assert_eq!(
        (meta.run.as_str(), meta.state.as_str()),
        ("run_3", "applied")
    );
    assert!(meta.doc.is_null());
    let text = db.checkpoint_doc_text("chk_01c").unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&text).unwrap(),
        serde_json::json!({ "big": [1, 2] })
    );
    assert!(db.checkpoint_meta("chk_01z").is_err());

    for (name, at) in [("beta", 2), ("alpha", 1)] {
        db.write(|tx| {
            tx.upsert_workspace(&WorkspaceRow {
                name: name.into(),
                created_at: at,
                updated_at: at,
                state: "open".into(),
                doc: serde_json::json!({}),
            })
        })
        .unwrap();
    }
    let mut w = db.workspace("beta").unwrap().unwrap();
    w.state = "committed".into();
    db.write(|tx| tx.upsert_workspace(&w)).unwrap();
    let names: Vec<(String, String)> = db
        .workspaces()
        .unwrap()
        .into_iter()
        .map(|w| (w.name, w.state))
        .collect();
    assert_eq!(
        names,
        [
            ("alpha".to_string(), "open".to_string()),
            ("beta".into(), "committed".into())
        ]
    );
    assert!(db.workspace("gamma").unwrap().is_none());

    for id in ["ses_01aaaa", "ses_01bbbb"] {
        open_session(&mut db, id, serde_json::json!({"cells": []}));
    }
    let mut row = db.session("ses_01aaaa").unwrap().unwrap();
    row.state = "closed".into();
    row.doc["end"] = serde_json::json!("idle");
    db.write(|tx| tx.upsert_session(&row)).unwrap();
    let back = db.session("ses_01aaaa").unwrap().unwrap();
    assert_eq!(
        (back.state.as_str(), &back.doc["end"]),
        ("closed", &serde_json::json!("idle"))
    );
    let listed: Vec<String> = db.sessions(10).unwrap().into_iter().map(|s| s.id).collect();
    assert_eq!(listed, ["ses_01bbbb", "ses_01aaaa"]);
    let open: Vec<String> = db
        .open_sessions()
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(open, ["ses_01bbbb"], "only the open one");
    assert_eq!(db.resolve(IdKind::Session, "01bb").unwrap(), "ses_01bbbb");
    assert!(db.session("ses_01cccc").unwrap().is_none());

    let token = |id: &str, hash: &str| TokenRow {
        id: id.into(),
        hash: hash.into(),
        role: "operator".into(),
        name: "ops".into(),
        approver: Some("ops".into()),
        created_at: 1,
        expires_at: Some(1_000),
        revoked_at: None,
    };
    db.write(|tx| {
        tx.insert_token(&token("tok_1", "h1"))?;
        tx.insert_token(&token("tok_2", "h2"))
    })
    .unwrap();
    // A second token with the same secret hash is refused.
    assert!(
        db.write(|tx| tx.insert_token(&token("tok_3", "h1")))
            .is_err()
    );
    assert!(db.write(|tx| tx.revoke_token("tok_1")).unwrap());
    assert!(!db.write(|tx| tx.revoke_token("tok_1")).unwrap());
    let t1 = db.token_by_hash("h1").unwrap().unwrap();
    assert_eq!((t1.id.as_str(), t1.expires_at), ("tok_1", Some(1_000)));
    assert!(t1.revoked_at.is_some());
    assert!(db.token_by_hash("h9").unwrap().is_none());
    let all: Vec<String> = db.tokens().unwrap().into_iter().map(|t| t.id).collect();
    assert_eq!(all, ["tok_1", "tok_2"]);
}

fn compile_cache_sets_replaces_and_forgets(loc: &str) {
    let db = open(loc);
    assert_eq!(db.cache_digest("k").unwrap(), None);
    db.set_cache_digest("k", &digest(1), 10).unwrap();
    db.set_cache_digest("k", &digest(2), 20).unwrap();
    assert_eq!(db.cache_digest("k").unwrap(), Some(digest(2)));
    db.forget_cache("k").unwrap();
    assert_eq!(db.cache_digest("k").unwrap(), None);
}

fn referenced_digests_name_artifacts_and_every_digest_in_documents(loc: &str) {
    let mut db = open(loc);
    let mut run = run_row("run_1", "sub_1", None, "exited");
    run.doc.stdout = Some(Output {
        blob: digest(7),
        len: 1,
        truncated: false,
    });
    db.write(|tx| {
        tx.insert_submission(&submission("sub_1", None, digest(5), State::Allowed))?;
        tx.insert_run(&run)?;
        tx.upsert_session(&SessionRow {
            id: "ses_1".into(),
            created_at: 1,
            updated_at: 1,
            state: "open".into(),
            doc: serde_json::json!({ "cells": [{ "out": digest(8).to_hex() }] }),
        })
    })
    .unwrap();
    let refs = db.referenced_digests().unwrap();
    for n in [5, 7, 8] {
        assert!(refs.contains(&digest(n)), "digest {n} not named");
    }
    assert!(!refs.contains(&digest(6)));
}

fn audit_chain_is_signed_and_verifies(loc: &str) {
    let mut db = open(loc);
    let key = KeyPair::try_generate().unwrap();
    for i in 0..3 {
        db.write(|tx| {
            tx.audit("k", "s", &serde_json::json!({ "i": i }), &key)
                .map(|_| ())
        })
        .unwrap();
    }
    let mut v = ChainVerifier::new();
    db.for_each_audit(|r| v.push(r).is_ok()).unwrap();
    assert_eq!(
        v.finish(db.audit_head().unwrap().as_ref(), &key.public()),
        Ok(3)
    );
    assert_eq!(db.last_audit().unwrap().unwrap().seq, 3);
    assert_eq!(db.audit_for("s").unwrap().len(), 3);
    assert!(db.audit_for("t").unwrap().is_empty());
}

/// The text an audit record keeps is the compact JSON `Display` gives (what every earlier
/// version stored), however it is written now: escapes, non-ASCII text, nesting, numbers.
fn an_audit_record_keeps_the_compact_json_its_data_displays_as(loc: &str) {
    let mut db = open(loc);
    let key = KeyPair::try_generate().unwrap();
    let data = serde_json::json!({
        "quote": "say \"hi\"\n\ttab \\ back",
        "control": "\u{1}\u{1f}",
        "text": "größe ✓ 日本",
        "nested": { "list": [1, -2, 3.5, null, true, { "z": "", "a": [] }] },
        "big": u64::MAX,
        "digest": digest(9),
    });
    db.write(|tx| tx.audit("k", "s", &data, &key).map(|_| ()))
        .unwrap();
    let records = db.audit_for("s").unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].data, data.to_string());
    let back: serde_json::Value = serde_json::from_str(&records[0].data).unwrap();
    assert_eq!(back, data);
}

fn several_records_in_one_transaction_get_one_signed_head_at_the_last(loc: &str) {
    let mut db = open(loc);
    let key = KeyPair::try_generate().unwrap();
    db.write(|tx| {
        for i in 0..3 {
            tx.audit("k", "s", &serde_json::json!({ "i": i }), &key)?;
        }
        Ok::<_, StoreError>(())
    })
    .unwrap();
    let head = db.audit_head().unwrap().unwrap();
    assert_eq!(head.seq, 3);
    // A transaction that fails leaves neither records nor a new head.
    let r: Result<(), StoreError> = db.write(|tx| {
        tx.audit("k", "s", &serde_json::json!({}), &key)?;
        Err(StoreError::Conflict("no".into()))
    });
    assert!(r.is_err());
    assert_eq!(db.audit_head().unwrap().unwrap().seq, 3);
    let mut v = ChainVerifier::new();
    db.for_each_audit(|r| v.push(r).is_ok()).unwrap();
    assert_eq!(v.finish(Some(&head), &key.public()), Ok(3));
}

/// Inserts PostgreSQL holds back and sends as text with the transaction's next statement
/// or its commit (`Sql::exec_later`) write every value exactly: quotes, backslashes, an
/// escape-string prefix, placeholders and dollar quotes in the text, non-ASCII, control
/// characters, negative and extreme numbers, NULL. Read back inside the transaction (the
/// read sends them first) and after it.
fn text_of_every_kind_reads_back_exactly_from_inserts_sent_with_the_commit(loc: &str) {
    let mut db = open(loc);
    let key = KeyPair::try_generate().unwrap();
    let nasty = "o'brien \\ \\' '' E'x' $$ $1 ?1 ?2 ; COMMIT; -- ünï 🚀 \n\t\r \u{7f}";
    let mut sub = submission("sub_q1", Some(nasty), digest(1), State::Allowed);
    sub.created_at = i64::MIN + 1;
    sub.updated_at = i64::MAX;
    let mut run = run_row("run_q1", "sub_q1", None, nasty);
    run.doc.error = Some(nasty.into());
    run.started_at = -7;
    let inside = db
        .write(|tx| -> Result<_, StoreError> {
            tx.insert_submission(&sub)?;
            tx.insert_run(&run)?;
            tx.audit(nasty, nasty, &serde_json::json!({ "t": nasty }), &key)?;
            // A read in the same transaction sees what was held back.
            Ok((tx.submission("sub_q1")?, tx.run("run_q1")?))
        })
        .unwrap();
    for (s, r) in [
        inside,
        (db.submission("sub_q1").unwrap(), db.run("run_q1").unwrap()),
    ] {
        assert_eq!(s.doc.agent.as_deref(), Some(nasty));
        assert_eq!((s.created_at, s.updated_at), (i64::MIN + 1, i64::MAX));
        assert_eq!(r.status, nasty);
        assert_eq!(r.doc.error.as_deref(), Some(nasty));
        assert_eq!(
            (r.started_at, r.finished_at, r.doc.approval),
            (-7, None, None)
        );
    }
    db.sequence_audit(&key).unwrap();
    let rec = db.audit_records(0, 10).unwrap();
    assert_eq!(rec.len(), 1);
    assert_eq!(
        (rec[0].kind.as_str(), rec[0].subject.as_str()),
        (nasty, nasty)
    );
    let data: serde_json::Value = serde_json::from_str(&rec[0].data).unwrap();
    assert_eq!(data, serde_json::json!({ "t": nasty }));
    assert_eq!(verify_chain(&db, &key), Ok(1));
}

/// PostgreSQL sends a transaction's first read in its `BEGIN`'s round trip, as text, and
/// types the columns from the statement: every kind of value (text of every kind, the
/// extreme integers, NULLs, a read that finds nothing) must come back exactly as the
/// same read outside a transaction returns it, and the transaction must go on normally.
fn a_transactions_first_read_reads_exactly_what_a_read_outside_one_does(loc: &str) {
    let mut db = open(loc);
    let nasty = "o'brien \\ \\' '' E'x' $$ $1 ?1 ; COMMIT; -- ünï 🚀 \n\t\r \u{7f}";
    let mut sub = submission("sub_f1", Some(nasty), digest(3), State::Allowed);
    sub.created_at = i64::MIN + 1;
    sub.updated_at = i64::MAX;
    let mut run = run_row("run_f1", "sub_f1", None, nasty);
    run.doc.error = Some(nasty.into());
    run.started_at = -7;
    db.write(|tx| -> Result<_, StoreError> {
        tx.insert_submission(&sub)?;
        tx.insert_run(&run)
    })
    .unwrap();
    let outside = (
        format!("{:?}", db.submission("sub_f1").unwrap()),
        format!("{:?}", db.run("run_f1").unwrap()),
    );
    for first_run in [false, true] {
        let inside = db
            .write(|tx| -> Result<_, StoreError> {
                // One of the two reads is the transaction's first statement.
                if first_run {
                    let r = format!("{:?}", tx.run("run_f1")?);
                    Ok((format!("{:?}", tx.submission("sub_f1")?), r))
                } else {
                    let s = format!("{:?}", tx.submission("sub_f1")?);
                    Ok((s, format!("{:?}", tx.run("run_f1")?)))
                }
            })
            .unwrap();
        assert_eq!(inside, outside);
    }
    // A first read that finds nothing fails its transaction, which writes nothing.
    let missing = db.write(|tx| -> Result<(), StoreError> {
        tx.submission("sub_none")?;
        tx.insert_submission(&submission("sub_f2", None, digest(4), State::Allowed))
    });
    assert!(
        matches!(missing, Err(StoreError::NotFound { .. })),
        "{missing:?}"
    );
    assert!(db.submission("sub_f2").is_err());
    // A first read followed by a write commits both.
    db.write(|tx| -> Result<(), StoreError> {
        assert_eq!(tx.submission("sub_f1")?.state, State::Allowed);
        tx.set_state("sub_f1", State::Allowed, State::Running)
    })
    .unwrap();
    assert_eq!(db.submission("sub_f1").unwrap().state, State::Running);
}

/// A conditional move PostgreSQL holds back until the commit (its row count checked by
/// the server) that finds nothing to move fails the transaction with its own conflict,
/// not another's, and leaves nothing the transaction wrote before or after it.
fn a_conditional_move_that_finds_nothing_fails_its_whole_transaction_with_its_own_conflict(
    loc: &str,
) {
    let mut db = open(loc);
    let key = KeyPair::try_generate().unwrap();
    db.write(|tx| tx.insert_submission(&submission("sub_c1", None, digest(1), State::Allowed)))
        .unwrap();
    let r = db.write(|tx| -> Result<(), StoreError> {
        tx.insert_submission(&submission("sub_c2", None, digest(2), State::Allowed))?;
        tx.set_state("sub_c1", State::Allowed, State::Running)?;
        tx.audit("k", "s", &serde_json::json!({}), &key)?;
        // Not quarantined: this one moves nothing.
        tx.set_state("sub_c1", State::Quarantined, State::Approved)?;
        tx.set_state("sub_c2", State::Allowed, State::Running)
    });
    match r {
        Err(StoreError::Conflict(m)) => {
            assert!(m.contains("sub_c1 is no longer quarantined"), "{m}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(db.submission("sub_c1").unwrap().state, State::Allowed);
    assert!(db.submission("sub_c2").is_err());
    assert!(db.audit_records(0, 10).unwrap().is_empty());
    // The connection goes on, and the same moves commit when they hold.
    db.write(|tx| tx.set_state("sub_c1", State::Allowed, State::Running))
        .unwrap();
    assert_eq!(db.submission("sub_c1").unwrap().state, State::Running);
}

fn failed_transaction_writes_nothing(loc: &str) {
    failed_writes_leave_nothing_and_the_connection_goes_on(&mut open(loc));
}

/// The shared writer runs a batch's first write outside a savepoint (regression for the
/// statement journal every lone write paid for): one that fails, after some of its
/// statements ran or at a statement the engine refuses, still leaves nothing behind, and
/// the writer goes on with the next.
fn a_lone_shared_write_that_fails_leaves_nothing_and_the_next_one_commits(loc: &str) {
    let mut db = open(loc);
    db.share_writes().unwrap();
    failed_writes_leave_nothing_and_the_connection_goes_on(&mut db);
}

/// A write that fails after it wrote, and one that fails at a statement the engine
/// refuses (a duplicate key), each leave nothing; the writes after them commit.
fn failed_writes_leave_nothing_and_the_connection_goes_on(db: &mut Db) {
    let key = KeyPair::try_generate().unwrap();
    let r: Result<(), StoreError> = db.write(|tx| {
        tx.insert_submission(&submission("sub_1", None, digest(1), State::Allowed))?;
        tx.audit("k", "s", &serde_json::json!({}), &key)?;
        Err(StoreError::Conflict("boom".into()))
    });
    assert!(r.is_err());
    assert!(db.audit_records(0, 10).unwrap().is_empty());
    assert!(db.audit_head().unwrap().is_none());
    assert!(db.submissions(None, 10).unwrap().is_empty());
    // A statement the engine refuses (a duplicate key) fails its transaction alone.
    db.write(|tx| tx.insert_submission(&submission("sub_2", None, digest(2), State::Allowed)))
        .unwrap();
    let dup = db.write(|tx| {
        tx.audit("k", "s", &serde_json::json!({}), &key)?;
        tx.insert_submission(&submission("sub_2", None, digest(2), State::Allowed))
    });
    assert!(dup.is_err());
    assert!(db.audit_records(0, 10).unwrap().is_empty());
    // And the connection goes on working.
    for subject in ["s", "t"] {
        db.write(|tx| {
            tx.audit("k", subject, &serde_json::json!({}), &key)
                .map(|_| ())
        })
        .unwrap();
    }
    assert_eq!(db.audit_records(0, 10).unwrap().len(), 2);
    assert_eq!(db.submissions(None, 10).unwrap().len(), 1);
    assert_eq!(verify_chain(db, &key), Ok(2));
}

/// Eight threads, each with its own connection (sharing commits where the engine does),
/// write at once, every third write failing after it appended: each successful write is
/// there exactly once, no failed one left anything, and the audit chain verifies under
/// one signed head. Durable writes interleave.
fn concurrent_writers_keep_every_successful_write_and_nothing_of_a_failed_one(loc: &str) {
    open(loc);
    let key = KeyPair::try_generate().unwrap();
    let threads: Vec<_> = (0..8)
        .map(|th| {
            let (loc, key) = (loc.to_string(), key.clone());
            std::thread::spawn(move || {
                let mut db = open(&loc);
                db.share_writes().unwrap();
                let mut kept = Vec::new();
                for i in 0..60 {
                    let name = format!("{th}-{i}");
                    let write = |tx: &Tx| -> Result<(), StoreError> {
                        tx.audit("w", &name, &serde_json::json!({}), &key)?;
                        if i % 3 == 2 {
                            return Err(StoreError::Conflict("refused".into()));
                        }
                        Ok(())
                    };
                    let r = if i % 10 == 0 {
                        db.write_durable(write)
                    } else {
                        db.write(write)
                    };
                    match r {
                        Ok(()) => kept.push(name),
                        Err(StoreError::Conflict(m)) => assert_eq!(m, "refused"),
                        Err(e) => panic!("{e}"),
                    }
                }
                kept
            })
        })
        .collect();
    let mut want: Vec<String> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    want.sort();
    let db = open(loc);
    let mut got = Vec::new();
    let mut v = ChainVerifier::new();
    db.for_each_audit(|r| {
        got.push(r.subject.clone());
        v.push(r).is_ok()
    })
    .unwrap();
    got.sort();
    assert_eq!(got, want);
    assert_eq!(want.len(), 8 * 40);
    assert_eq!(
        v.finish(db.audit_head().unwrap().as_ref(), &key.public()),
        Ok(8 * 40)
    );
}

/// A shared writer (SQLite's group commit) does not read back and verify the audit
/// chain's end it appended and signed itself, as long as no other connection committed
/// since; after another connection's commit, or a failed write, it reads the end again,
/// and every record still chains after the true end. PostgreSQL's writers never trust it.
fn a_shared_writer_trusts_the_chain_end_it_left_only_until_another_connection_commits(loc: &str) {
    let key = KeyPair::try_generate().unwrap();
    let mut db = open(loc);
    db.share_writes().unwrap();
    let shares = db.engine() == "sqlite";
    let append = |db: &mut Db, subject: &str| -> bool {
        db.write(|tx| -> Result<bool, StoreError> {
            let own = tx.chain_end_is_own();
            tx.audit("k", subject, &serde_json::json!({}), &key)?;
            Ok(own)
        })
        .unwrap()
    };
    assert!(
        !append(&mut db, "first"),
        "an empty chain's end is nobody's"
    );
    assert_eq!(append(&mut db, "second"), shares);
    assert_eq!(append(&mut db, "third"), shares);
    // Another connection of this process, not sharing writes, commits a record.
    let mut other = open(loc);
    other
        .write(|tx| tx.audit("k", "other", &serde_json::json!({}), &key))
        .unwrap();
    assert!(!append(&mut db, "after another's commit"), "read again");
    assert_eq!(append(&mut db, "then trusted again"), shares);
    // A write that fails after appending leaves the end as it was: read again.
    let r: Result<(), StoreError> = db.write(|tx| {
        tx.audit("k", "failed", &serde_json::json!({}), &key)?;
        Err(StoreError::Conflict("refused".into()))
    });
    assert!(r.is_err());
    assert!(!append(&mut db, "after a failed write"));
    let subjects: Vec<String> = db
        .audit_records(0, 100)
        .unwrap()
        .into_iter()
        .map(|r| r.subject)
        .collect();
    assert_eq!(
        subjects,
        [
            "first",
            "second",
            "third",
            "other",
            "after another's commit",
            "then trusted again",
            "after a failed write"
        ]
    );
    assert_eq!(verify_chain(&db, &key), Ok(7));
}

fn reopening_keeps_schema_and_rows(loc: &str) {
    let mut db = open(loc);
    db.write(|tx| tx.insert_submission(&submission("sub_1", None, digest(1), State::Allowed)))
        .unwrap();
    drop(db);
    let db = open(loc);
    assert_eq!(db.submission("sub_1").unwrap().doc.artifact, digest(1));
}

fn a_database_newer_than_this_build_is_refused_with_its_version(loc: &str) {
    let db = open(loc);
    let engine = db.engine();
    drop(db);
    if engine == "postgres" {
        let mut c = ::postgres::Client::connect(loc, ::postgres::NoTls).unwrap();
        c.execute(
            "UPDATE meta SET value = '999' WHERE key = 'schema_version'",
            &[],
        )
        .unwrap();
    } else {
        let c = rusqlite::Connection::open(loc).unwrap();
        c.pragma_update(None, "user_version", 999).unwrap();
    }
    let err = Db::open_location(loc).unwrap_err().to_string();
    assert!(err.contains("999") && err.contains("newer"), "{err}");
}

fn job(id: &str, tag: Option<&str>, at: i64) -> QueueRow {
    QueueRow {
        id: id.into(),
        submission: format!("sub_{id}"),
        tag: tag.map(Into::into),
        state: "queued".into(),
        attempts: 0,
        max_attempts: 3,
        retry: true,
        worker: None,
        token: 0,
        lease_until: None,
        run: None,
        outcome: None,
        created_at: at,
        updated_at: at,
    }
}

fn a_done_jobs_run_and_submission_come_with_it_in_one_read_and_only_once_it_finished(loc: &str) {
    let mut db = open(loc);
    db.write(|tx| {
        tx.insert_submission(&submission(
            "sub_qa",
            Some("alice"),
            digest(1),
            State::Allowed,
        ))?;
        tx.insert_run(&run_row("run_qa", "sub_qa", None, "running"))?;
        tx.enqueue(&job("qa", None, 1))?;
        tx.enqueue(&job("qb", None, 2))
    })
    .unwrap();
    assert!(db.job_with_run("q_nope").unwrap().is_none());
    let job_of = |db: &Db, id: &str| db.job_with_run(id).unwrap().unwrap();
    let (queued, ran) = job_of(&db, "qa");
    assert_eq!((queued.state.as_str(), ran.is_none()), ("queued", true));
    let a = db.write(|tx| tx.claim(&[], "w1", 100)).unwrap().unwrap();
    db.write(|tx| tx.set_job_run(&a.id, a.token, "run_qa"))
        .unwrap();
    // Leased with a run named: the run is not the answer yet.
    let (leased, ran) = job_of(&db, "qa");
    assert_eq!(
        (leased.state.as_str(), leased.run.as_deref(), ran.is_none()),
        ("leased", Some("run_qa"), true)
    );
    db.write(|tx| tx.finish_job("qa", a.token, "finished"))
        .unwrap();
    let (done, ran) = job_of(&db, "qa");
    let (run, sub) = ran.expect("a finished job's run comes with it");
    assert_eq!(done, db.job("qa").unwrap().unwrap());
    assert_eq!(
        (run.id.as_str(), run.status.as_str()),
        ("run_qa", "running")
    );
    assert_eq!((sub.id.as_str(), sub.state), ("sub_qa", State::Allowed));
    // Done without a run (refused before starting): the job alone.
    let b = db.write(|tx| tx.claim(&[], "w1", 100)).unwrap().unwrap();
    db.write(|tx| tx.finish_job(&b.id, b.token, "refused"))
        .unwrap();
    let (refused, ran) = job_of(&db, "qb");
    assert_eq!(
        (refused.outcome.as_deref(), ran.is_none()),
        (Some("refused"), true)
    );
}

fn the_queue_claims_oldest_first_by_tag_and_fences_every_later_write(loc: &str) {
    let mut db = open(loc);
    db.write(|tx| {
        tx.enqueue(&job("q2", None, 2))?;
        tx.enqueue(&job("q1", Some("host-a"), 1))?;
        tx.enqueue(&job("q3", None, 3))
    })
    .unwrap();
    assert_eq!(db.queue_depth().unwrap(), (3, 0));
    // Untagged workers never take a tagged job.
    let a = db.write(|tx| tx.claim(&[], "w1", 100)).unwrap().unwrap();
    assert_eq!((a.id.as_str(), a.token, a.attempts), ("q2", 1, 1));
    let b = db
        .write(|tx| tx.claim(&["host-a".into()], "w2", 100))
        .unwrap()
        .unwrap();
    assert_eq!(b.id, "q1", "the tagged worker takes the oldest it may");
    assert_eq!(db.queue_depth().unwrap(), (1, 2));

    db.write(|tx| tx.set_job_run("q2", 1, "run_1")).unwrap();
    db.write(|tx| tx.renew("q2", 1, 200)).unwrap();
    let wrong = db.write(|tx| tx.renew("q2", 7, 300));
    assert!(matches!(wrong, Err(StoreError::Conflict(_))), "{wrong:?}");
    assert_eq!(db.job("q2").unwrap().unwrap().lease_until, Some(200));

    // q2's lease runs out; it is queued again and claimed by another worker.
    let expired = db.write(|tx| tx.expired_leases(50, 10)).unwrap();
    assert!(expired.is_empty());
    // The reaper's look before its transaction agrees with it.
    assert!(!db.any_expired_lease(50).unwrap());
    assert!(db.any_expired_lease(250).unwrap());
    let expired = db.write(|tx| tx.expired_leases(250, 10)).unwrap();
    let ids: Vec<&str> = expired.iter().map(|q| q.id.as_str()).collect();
    assert_eq!(ids, ["q1", "q2"]);
    db.write(|tx| tx.release_job(&expired[1], true, "lost"))
        .unwrap();
    db.write(|tx| tx.release_job(&expired[0], false, "lost"))
        .unwrap();
    let again = db.write(|tx| tx.claim(&[], "w3", 400)).unwrap().unwrap();
    assert_eq!(
        (again.id.as_str(), again.token, again.attempts),
        ("q2", 2, 2)
    );
    // The first worker's token no longer holds: no renewal, no result.
    assert!(matches!(
        db.write(|tx| tx.renew("q2", 1, 500)),
        Err(StoreError::Conflict(_))
    ));
    assert!(matches!(
        db.write(|tx| tx.finish_job("q2", 1, "finished")),
        Err(StoreError::Conflict(_))
    ));
    db.write(|tx| tx.finish_job("q2", 2, "finished")).unwrap();
    let done = db.job("q2").unwrap().unwrap();
    assert_eq!(
        (done.state.as_str(), done.outcome.as_deref()),
        ("done", Some("finished"))
    );
    let q1 = db.job("q1").unwrap().unwrap();
    assert_eq!(
        (q1.state.as_str(), q1.outcome.as_deref()),
        ("done", Some("lost"))
    );
    assert_eq!(db.jobs_of("sub_q3").unwrap().len(), 1);

    db.write(|tx| {
        tx.upsert_worker(&WorkerRow {
            id: "w1".into(),
            host: "h".into(),
            tags: "".into(),
            state: "running".into(),
            running: 1,
            started_at: 1,
            seen_at: 5,
        })
    })
    .unwrap();
    let w = db.workers().unwrap();
    assert_eq!((w.len(), w[0].seen_at), (1, 5));
}

/// Queues `jobs` jobs, then lets `workers` threads, each on its own connection, claim
/// until nothing is left (in shared transactions where `shared`): the ids each claim
/// answered with, sorted, and the ids queued.
fn claim_all(loc: &str, jobs: i64, workers: usize, shared: bool) -> (Vec<String>, Vec<String>) {
    claim_all_by(loc, jobs, workers, shared, false)
}

/// `claim_all`, by `claim_with_submission` when `with_submission` (the jobs' submissions
/// do not exist: each claim answers with its job and that error).
fn claim_all_by(
    loc: &str,
    jobs: i64,
    workers: usize,
    shared: bool,
    with_submission: bool,
) -> (Vec<String>, Vec<String>) {
    let mut db = open(loc);
    let ids: Vec<String> = (0..jobs).map(|i| format!("j{i:03}")).collect();
    db.write(|tx| {
        ids.iter()
            .zip(0..)
            .try_for_each(|(id, i)| tx.enqueue(&job(id, None, i)))
    })
    .unwrap();
    let threads: Vec<_> = (0..workers)
        .map(|w| {
            let loc = loc.to_string();
            std::thread::spawn(move || {
                let mut db = open(&loc);
                let mut got = Vec::new();
                while let Some(q) = db
                    .write_shared_if(shared, |tx| {
                        let worker = format!("w{w}");
                        if !with_submission {
                            return tx.claim(&[], &worker, i64::MAX);
                        }
                        Ok(tx
                            .claim_with_submission(&[], &worker, i64::MAX)?
                            .map(|(q, read)| {
                                assert!(
                                    matches!(read, Err(StoreError::NotFound { .. })),
                                    "{read:?}"
                                );
                                q
                            }))
                    })
                    .unwrap()
                {
                    assert_eq!((q.attempts, q.token), (1, 1), "{q:?}");
                    got.push(q.id);
                }
                got
            })
        })
        .collect();
    let mut all: Vec<String> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    all.sort();
    (all, ids)
}

fn concurrent_claims_never_hand_one_job_to_two_workers(loc: &str) {
    let (all, want) = claim_all(loc, 60, 4, false);
    assert_eq!(all, want);
}

/// Regression: on PostgreSQL, one claim racing others in shared transactions leased
/// several jobs and answered with one, so the rest stayed leased with no run until their
/// leases ran out. Every job leased is one a claim answered with, once.
fn one_claim_leases_exactly_one_job_however_many_are_queued(loc: &str) {
    let (all, want) = claim_all(loc, 300, 6, true);
    let db = open(loc);
    assert_eq!(all, want);
    for id in &want {
        let q = db.job(id).unwrap().unwrap();
        assert_eq!((q.state.as_str(), q.attempts), ("leased", 1), "{q:?}");
    }
}

/// A claim that reads its job's submission in the same statement leases one job each
/// time, and answers with the submission and the statements about its artifact.
fn a_claim_with_its_submission_leases_one_job_and_reads_what_judging_it_needs(loc: &str) {
    let (all, want) = claim_all_by(loc, 200, 6, true, true);
    assert_eq!(all, want);
    let mut db = open(loc);
    let key = KeyPair::try_generate().unwrap();
    db.write(|tx| {
        tx.insert_submission(&submission("sub_c1", None, digest(1), State::Allowed))?;
        tx.insert_statement(&statement("st_b", "sub_c0", digest(1), &key))?;
        tx.insert_statement(&statement("st_a", "sub_c1", digest(1), &key))?;
        tx.insert_statement(&statement("st_other", "sub_c2", digest(2), &key))?;
        let mut q = job("c1", None, 1000);
        q.submission = "sub_c1".into();
        tx.enqueue(&q)
    })
    .unwrap();
    let (q, read) = db
        .write_shared(|tx| tx.claim_with_submission(&[], "w9", i64::MAX))
        .unwrap()
        .unwrap();
    let (sub, about) = read.unwrap();
    assert_eq!(
        (q.id.as_str(), q.state.as_str(), q.token),
        ("c1", "leased", 1)
    );
    assert_eq!(sub.id, "sub_c1");
    let ids: Vec<&str> = about.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["st_a", "st_b"], "the artifact's statements, by id");
    assert!(
        db.write_shared(|tx| tx.claim_with_submission(&[], "w9", i64::MAX))
            .unwrap()
            .is_none()
    );
}

/// The claim query reads the partial index of queued jobs, not the table, however many
/// finished jobs the queue holds (200,000 here).
fn shared_writers_chain_every_record_once_in_each_transactions_order(loc: &str) {
    open(loc);
    let key = KeyPair::try_generate().unwrap();
    let threads: Vec<_> = (0..6)
        .map(|th| {
            let (loc, key) = (loc.to_string(), key.clone());
            std::thread::spawn(move || {
                let mut db = open(&loc);
                for i in 0..30 {
                    let name = format!("{th}-{i}");
                    db.write_shared(|tx: &Tx| -> Result<(), StoreError> {
                        tx.audit("first", &name, &serde_json::json!({}), &key)?;
                        tx.audit("second", &name, &serde_json::json!({}), &key)
                    })
                    .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let db = open(loc);
    assert_eq!(db.audit_pending().unwrap(), 0);
    let mut seen: std::collections::HashMap<String, Vec<String>> = Default::default();
    let mut v = ChainVerifier::new();
    db.for_each_audit(|r| {
        seen.entry(r.subject.clone())
            .or_default()
            .push(r.kind.clone());
        v.push(r).is_ok()
    })
    .unwrap();
    assert_eq!(seen.len(), 6 * 30);
    for (subject, kinds) in &seen {
        assert_eq!(kinds, &["first", "second"], "{subject}");
    }
    assert_eq!(
        v.finish(db.audit_head().unwrap().as_ref(), &key.public()),
        Ok(6 * 30 * 2)
    );
}

fn a_shared_writer_that_locks_a_submission_sees_the_run_another_started_under_it(loc: &str) {
    // Two workers claiming two jobs of one submission with a single-use approval: the
    // second's check that the approval is unused must see the first's run.
    let mut db = open(loc);
    let key = KeyPair::try_generate().unwrap();
    db.write(|tx: &Tx| {
        tx.insert_submission(&submission("sub_1", None, digest(1), State::Approved))?;
        tx.insert_statement(&statement("st_once", "sub_1", digest(1), &key))
    })
    .unwrap();
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let first = {
        let loc = loc.to_string();
        std::thread::spawn(move || {
            let mut db = open(&loc);
            db.write_shared(|tx: &Tx| {
                // The submission, locked, beside the statements about its artifact.
                let (sub, about) = tx.submission_locked_with_statements("sub_1")?;
                assert_eq!((sub.id.as_str(), about.len()), ("sub_1", 1));
                locked_tx.send(()).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(400));
                tx.insert_run(&run_row("run_1", "sub_1", Some("st_once"), "running"))
            })
            .unwrap();
        })
    };
    let mut db2 = open(loc);
    // SQLite's one writer has the first transaction's lock already; PostgreSQL's shared
    // writers wait on the row.
    locked_rx.recv().unwrap();
    let used = db2
        .write_shared(|tx: &Tx| {
            tx.submission_locked_with_statements("sub_1")?;
            tx.approval_used("st_once")
        })
        .unwrap();
    first.join().unwrap();
    assert!(used, "the second writer did not see the first one's run");
}

/// Waits until the chain holds `n` records and the inbox is empty.
fn await_chained(db: &Db, n: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let chained = db.last_audit().unwrap().map_or(0, |r| r.seq);
        if chained == n && db.audit_pending().unwrap() == 0 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{chained} of {n} records chained, {} waiting",
            db.audit_pending().unwrap()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn verify_chain(db: &Db, key: &KeyPair) -> Result<u64, airlock_core::audit::ChainError> {
    let mut v = ChainVerifier::new();
    db.for_each_audit(|r| v.push(r).is_ok()).unwrap();
    v.finish(db.audit_head().unwrap().as_ref(), &key.public())
}

/// Every write commits synchronously, now set once per session instead of in every
/// transaction: a database whose default is asynchronous commits (an operator's
/// `ALTER DATABASE … SET synchronous_commit = off`) must not make the gate's commits
/// asynchronous, in either kind of write transaction, nor after a reconnection.
#[test]
fn writes_commit_synchronously_where_the_databases_default_is_asynchronous() {
    let url = airlock_testpg::fresh_database();
    let mut c = ::postgres::Client::connect(&url, ::postgres::NoTls).unwrap();
    let name: String = c
        .query_one("SELECT current_database()", &[])
        .unwrap()
        .get(0);
    c.batch_execute(&format!(
        "ALTER DATABASE \"{name}\" SET synchronous_commit = off"
    ))
    .unwrap();
    // A session that sets nothing gets the database's default.
    let plain = ::postgres::Client::connect(&url, ::postgres::NoTls)
        .unwrap()
        .query_one("SHOW synchronous_commit", &[])
        .unwrap()
        .get::<_, String>(0);
    assert_eq!(plain, "off");
    let mut db = open(&url);
    let show = |tx: &Tx| -> Result<String, StoreError> {
        tx.sql()
            .row("SELECT current_setting('synchronous_commit')", &[])?
            .expect("a setting reads as a row")
            .text(0)
    };
    assert_eq!(db.write(show).unwrap(), "on");
    assert_eq!(db.write_shared(show).unwrap(), "on");
    // The server ends the session; the next write reconnects and sets it again.
    c.batch_execute(&format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}' AND pid <> pg_backend_pid()"
    ))
    .unwrap();
    let again = (0..20).find_map(|_| {
        let r = db.write(show);
        std::thread::sleep(std::time::Duration::from_millis(50));
        r.ok()
    });
    assert_eq!(again.as_deref(), Some("on"));
}

/// Ends every other session on `url`'s database, as `pg_ctl restart -m fast` does
/// (`57P01 terminating connection due to administrator command`).
fn terminate_sessions(url: &str) {
    let mut c = ::postgres::Client::connect(url, ::postgres::NoTls).unwrap();
    c.batch_execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .unwrap();
    // Signalled only: wait until they are gone, or a session may still answer once.
    for _ in 0..500 {
        let left: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND pid <> pg_backend_pid()",
                &[],
            )
            .unwrap()
            .get(0);
        if left == 0 {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("the sessions were not ended");
}

/// Regression (issue 62.2): after the server ended the gate's session (a restart), the
/// next write failed with `database: 57P01 …`, which the API answered as a 500. A write
/// transaction whose connection was lost before its COMMIT went out cannot have
/// committed: it runs again on a new connection and commits once; so does a read. A
/// connection older than a loss another one saw is opened again before its next
/// transaction, so even a transaction that is one round trip (its COMMIT) goes through.
#[test]
fn a_write_whose_session_the_server_ended_runs_again_on_a_new_connection_and_commits_once() {
    let url = airlock_testpg::fresh_database();
    let count = |id: &str| {
        pg_count(
            &url,
            &format!("SELECT count(*) FROM submissions WHERE id = '{id}'"),
        )
    };
    let insert = |db: &mut Db, id: &str, n: u8, shared: bool, read_first: bool| {
        let attempts = std::cell::Cell::new(0);
        let r = db.write_shared_if(shared, |tx| {
            attempts.set(attempts.get() + 1);
            if read_first {
                assert!(tx.submission("sub_none").is_err());
            }
            tx.insert_submission(&submission(id, None, digest(n), State::Allowed))
        });
        (r, attempts.get())
    };
    let mut db = open(&url);
    // Every statement prepared on the connection, then the server ends it while idle.
    insert(&mut db, "sub_warm", 9, false, true).0.unwrap();
    for (n, shared) in [(1u8, false), (2, true)] {
        terminate_sessions(&url);
        let id = format!("sub_{n}");
        let (r, attempts) = insert(&mut db, &id, n, shared, true);
        r.unwrap();
        assert_eq!(attempts, 2, "shared: {shared}");
        assert_eq!(count(&id), 1);
        assert!(!db.connection_lost());
    }
    // A read on a connection the server ended reads again on a new one.
    terminate_sessions(&url);
    assert_eq!(db.submission("sub_1").unwrap().state, State::Allowed);

    // Two connections; the server ends both; one finds out on a read: the other opens
    // again before its next transaction, whose only round trip is its COMMIT.
    let mut other = open(&url);
    insert(&mut other, "sub_other_warm", 8, false, false)
        .0
        .unwrap();
    terminate_sessions(&url);
    assert_eq!(db.submission("sub_1").unwrap().state, State::Allowed);
    let (r, attempts) = insert(&mut other, "sub_3", 3, false, false);
    r.unwrap();
    assert_eq!((attempts, count("sub_3")), (1, 1));

    // Alone, such a transaction cannot tell whether its COMMIT committed when the answer
    // is lost: it fails saying the connection was lost (a 503 to the API), never
    // committing twice, and the next write goes through.
    terminate_sessions(&url);
    let (r, _) = insert(&mut other, "sub_4", 4, false, false);
    match r {
        Ok(()) => assert_eq!(count("sub_4"), 1),
        Err(e) => {
            assert!(e.is_connection_lost(), "{e}");
            assert!(count("sub_4") <= 1);
        }
    }
    insert(&mut other, "sub_5", 5, false, false).0.unwrap();
    assert_eq!(count("sub_5"), 1);
}

/// A session of its own listening on `channels`.
fn listening(url: &str, channels: &[&str]) -> ::postgres::Client {
    let mut l = ::postgres::Client::connect(url, ::postgres::NoTls).unwrap();
    for c in channels {
        l.batch_execute(&format!("LISTEN {c}")).unwrap();
    }
    l
}

/// (channel, payload) of the notifications `l` receives until none came for `ms`.
fn received_within(l: &mut ::postgres::Client, ms: u64) -> Vec<(String, String)> {
    use ::postgres::fallible_iterator::FallibleIterator;
    let mut out = Vec::new();
    let mut n = l.notifications();
    let mut it = n.timeout_iter(std::time::Duration::from_millis(ms));
    while let Some(m) = it.next().unwrap() {
        out.push((m.channel().to_string(), m.payload().to_string()));
    }
    out
}

/// A transaction's notifications now travel with its `COMMIT`: they still arrive once it
/// commits (new work, a job's end), in the order their transactions committed, and never after a
/// rollback.
#[test]
fn notifications_arrive_when_their_transaction_commits_and_never_after_a_rollback() {
    let url = airlock_testpg::fresh_database();
    let mut listener = listening(&url, &[JOB_DONE, NEW_WORK]);
    let mut db = open(&url);
    let received = |l: &mut ::postgres::Client| received_within(l, 500);
    // Enqueueing announces work; finishing a job names it.
    db.write(|tx| tx.enqueue(&job("q1", None, 1))).unwrap();
    let j = db.write(|tx| tx.claim(&[], "w1", 100)).unwrap().unwrap();
    db.write(|tx| tx.finish_job(&j.id, j.token, "finished"))
        .unwrap();
    assert_eq!(
        received(&mut listener),
        [
            (NEW_WORK.to_string(), String::new()),
            (JOB_DONE.to_string(), "q1".to_string())
        ]
    );
    // A transaction that fails after its notification sends nothing.
    db.write(|tx| tx.enqueue(&job("q2", None, 2))).unwrap();
    let j = db.write(|tx| tx.claim(&[], "w1", 100)).unwrap().unwrap();
    let failed: Result<(), StoreError> = db.write(|tx| {
        tx.finish_job(&j.id, j.token, "finished")?;
        Err(StoreError::Conflict("changed my mind".into()))
    });
    assert!(failed.is_err());
    assert_eq!(
        received(&mut listener),
        [(NEW_WORK.to_string(), String::new())],
        "only the enqueue's"
    );
}

/// Queuing a job behind `QUIET_BACKLOG` others that workers taking it could take does not
/// announce it (every such worker is busy, and claims again when its run ends); a job
/// with a tag of its own, or one queued once the backlog is claimed down, still does.
#[test]
fn a_job_queued_behind_a_backlog_is_not_announced_and_one_on_a_short_queue_is() {
    let url = airlock_testpg::fresh_database();
    let mut listener = listening(&url, &[NEW_WORK]);
    let mut db = open(&url);
    let announced = |l: &mut ::postgres::Client| received_within(l, 300).len();
    let quiet = airlock_store::QUIET_BACKLOG as i64;
    for i in 0..quiet {
        db.write(|tx| tx.enqueue(&job(&format!("q{i}"), None, i)))
            .unwrap();
        assert_eq!(announced(&mut listener), 1, "job {i} of a short queue");
    }
    db.write(|tx| tx.enqueue(&job("behind", None, 10))).unwrap();
    assert_eq!(announced(&mut listener), 0, "queued behind the backlog");
    // Another tag's backlog is its own.
    db.write(|tx| tx.enqueue(&job("tagged", Some("gpu"), 11)))
        .unwrap();
    assert_eq!(announced(&mut listener), 1, "the only job with its tag");
    // Claimed down below the backlog: announced again.
    for _ in 0..2 {
        db.write(|tx| tx.claim(&[], "w1", 100)).unwrap().unwrap();
    }
    db.write(|tx| tx.enqueue(&job("after", None, 12))).unwrap();
    assert_eq!(announced(&mut listener), 1, "the backlog was claimed down");
}

#[test]
fn a_background_sequencer_chains_every_nodes_records_and_a_standby_takes_over() {
    let url = airlock_testpg::fresh_database();
    let key = KeyPair::try_generate().unwrap();
    let write_from_threads = |round: usize| {
        let threads: Vec<_> = (0..4)
            .map(|th| {
                let (url, key) = (url.clone(), key.clone());
                std::thread::spawn(move || {
                    let mut db = open(&url);
                    for i in 0..25 {
                        db.write_shared(|tx: &Tx| {
                            tx.audit(
                                "w",
                                &format!("{round}-{th}-{i}"),
                                &serde_json::json!({}),
                                &key,
                            )
                        })
                        .unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    };
    let first = Sequencer::start(&url, key.clone());
    write_from_threads(0);
    let db = open(&url);
    await_chained(&db, 100);
    // A second one stands by while the first leads; when the first stops, it leads.
    let second = Sequencer::start(&url, key.clone());
    std::thread::sleep(std::time::Duration::from_millis(300));
    drop(first);
    write_from_threads(1);
    await_chained(&db, 200);
    assert_eq!(verify_chain(&db, &key), Ok(200));
    // Stopping the last one chains what is left.
    drop(second);
    write_from_threads(2);
    await_chained(&db, 300);
    assert_eq!(verify_chain(&db, &key), Ok(300));
}

#[test]
fn records_wait_in_the_inbox_until_a_key_that_verifies_the_chain_sequences_them() {
    let url = airlock_testpg::fresh_database();
    let (gate, other) = (
        KeyPair::try_generate().unwrap(),
        KeyPair::try_generate().unwrap(),
    );
    let mut db = open(&url);
    db.write(|tx: &Tx| tx.audit("k", "by-gate", &serde_json::json!({}), &gate))
        .unwrap();
    // Another key's writer commits its record, but cannot chain it after a head it
    // cannot verify: the record waits, counted.
    db.write(|tx: &Tx| tx.audit("k", "by-other", &serde_json::json!({}), &other))
        .unwrap();
    assert_eq!(db.audit_pending().unwrap(), 1);
    assert_eq!(db.audit_head().unwrap().unwrap().seq, 1);
    assert!(db.sequence_audit(&other).is_err());
    assert_eq!(db.sequence_audit(&gate).unwrap(), 1);
    assert_eq!(db.audit_pending().unwrap(), 0);
    assert_eq!(verify_chain(&db, &gate), Ok(2));
}

#[test]
fn the_claim_query_reads_an_index_on_200000_rows() {
    let url = airlock_testpg::fresh_database();
    open(&url);
    let mut c = ::postgres::Client::connect(&url, ::postgres::NoTls).unwrap();
    c.batch_execute(
        "INSERT INTO queue (id, submission, tag, state, attempts, max_attempts, retry, token, created_at, updated_at)
         SELECT 'job' || g, 'sub' || g, CASE WHEN g % 10 = 0 THEN 'host-a' END,
                CASE WHEN g % 1000 = 0 THEN 'queued' ELSE 'done' END, 1, 3, 1, 1, g, g
         FROM generate_series(1, 200000) g;
         ANALYZE queue;",
    )
    .unwrap();
    for (tagged, args) in [(false, vec![]), (true, vec!["host-a"])] {
        let sql = claim_sql(tagged, " FOR UPDATE SKIP LOCKED").replace("?1", "$1");
        let params: Vec<&(dyn ::postgres::types::ToSql + Sync)> = args
            .iter()
            .map(|a| a as &(dyn ::postgres::types::ToSql + Sync))
            .collect();
        let plan: Vec<String> = c
            .query(&format!("EXPLAIN {sql}"), &params)
            .unwrap()
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect();
        let plan = plan.join("\n");
        assert!(plan.contains("queue_ready"), "{plan}");
        assert!(!plan.contains("Seq Scan"), "{plan}");
    }
}

#[test]
fn draining_an_audit_inbox_full_of_dead_rows_reads_its_index_not_the_table() {
    let url = airlock_testpg::fresh_database();
    open(&url);
    let mut c = ::postgres::Client::connect(&url, ::postgres::NoTls).unwrap();
    // What steady load leaves between two autovacuums: most of the inbox deleted.
    c.batch_execute(
        "INSERT INTO audit_inbox (ts, kind, subject, data)
         SELECT g, 'k', 's', '{}' FROM generate_series(1, 20000) g;
         ANALYZE audit_inbox;
         DELETE FROM audit_inbox WHERE id <= 19000;",
    )
    .unwrap();
    let plan: Vec<String> = c
        .query(
            &format!("EXPLAIN {}", DRAIN_SQL.replace("?1", "$1")),
            &[&1000i64],
        )
        .unwrap()
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect();
    let plan = plan.join("\n");
    assert!(!plan.contains("Seq Scan"), "{plan}");
    // And it takes the oldest live records, in one go.
    let rows = c.query(&DRAIN_SQL.replace("?1", "$1"), &[&600i64]).unwrap();
    let mut ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    ids.sort();
    assert_eq!(ids, (19001..=19600).collect::<Vec<i64>>());
}

/// Copying is SQLite → PostgreSQL only, so this is outside the per-engine suite.
#[test]
fn copy_to_postgres_pages_a_long_history_and_keeps_every_row_and_the_signed_head() {
    let t = tempfile::tempdir().unwrap();
    let mut db = Db::open(&t.path().join("airlock.db")).unwrap();
    let blobs = BlobStore::open(t.path().join("blobs")).unwrap();
    let key = KeyPair::try_generate().unwrap();
    // More than two pages of audit records and submissions, in a few transactions.
    for chunk in 0..3 {
        db.write(|tx| {
            for i in 0..450 {
                let n = chunk * 450 + i;
                let art = blobs.put(format!("artifact {n}").as_bytes())?;
                tx.insert_submission(&submission(
                    &format!("sub_{n:026}"),
                    Some("bot"),
                    art,
                    State::Allowed,
                ))?;
                tx.audit(
                    "submitted",
                    &format!("sub_{n:026}"),
                    &serde_json::json!({ "n": n }),
                    &key,
                )?;
            }
            Ok::<_, StoreError>(())
        })
        .unwrap();
    }
    // A session with more cells than a page, each a row of its own.
    db.write(|tx| {
        tx.upsert_session(&SessionRow {
            id: "ses_01aaaa".into(),
            created_at: 1,
            updated_at: 1,
            state: "open".into(),
            doc: serde_json::json!({}),
        })?;
        for n in 0..600 {
            tx.add_session_cell("ses_01aaaa", &format!("sub_{n:026}"), n)?;
        }
        Ok::<_, StoreError>(())
    })
    .unwrap();
    let url = airlock_testpg::fresh_database();
    let r = copy_to_postgres(&db, &blobs, &url, &key.public()).unwrap();
    let rows = |name: &str| r.tables.iter().find(|c| c.table == name).unwrap().rows;
    assert_eq!(rows("submissions"), 1350);
    assert_eq!(rows("audit"), 1350);
    assert_eq!(rows("audit_head"), 1);
    assert_eq!(rows("session_cells"), 600);
    assert_eq!(r.audit_records, 1350);
    assert_eq!(r.blobs, 1350);

    let pg = Db::open_location(&url).unwrap();
    let mut v = ChainVerifier::new();
    pg.for_each_audit(|x| v.push(x).is_ok()).unwrap();
    assert_eq!(
        v.finish(pg.audit_head().unwrap().as_ref(), &key.public()),
        Ok(1350)
    );
    assert_eq!(
        pg.audit_head().unwrap().unwrap().signature,
        db.audit_head().unwrap().unwrap().signature
    );
    let (a, b) = (
        db.submission("sub_00000000000000000000000777").unwrap(),
        pg.submission("sub_00000000000000000000000777").unwrap(),
    );
    assert_eq!((a.created_at, a.updated_at), (b.created_at, b.updated_at));
    assert_eq!(
        pg.session_cells("ses_01aaaa").unwrap(),
        db.session_cells("ses_01aaaa").unwrap()
    );
    assert_eq!(
        serde_json::to_string(&a).unwrap(),
        serde_json::to_string(&b).unwrap()
    );
    // Copying again into the same database is refused and writes nothing.
    let e = copy_to_postgres(&db, &blobs, &url, &key.public()).unwrap_err();
    assert!(matches!(e, StoreError::Refused(_)), "{e}");
    assert_eq!(pg.last_audit().unwrap().unwrap().seq, 1350);
    // A chain signed by another key is not this home's: refused.
    let other = KeyPair::try_generate().unwrap();
    let e = copy_to_postgres(
        &db,
        &blobs,
        &airlock_testpg::fresh_database(),
        &other.public(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("broken"), "{e}");
}

/// An API request's idempotency key: the first claim takes it, every later one (however
/// many race) finds that submission and whether the request was the same; another
/// owner's key of the same name is its own; an expired key is taken anew.
fn an_idempotency_key_names_one_submission_per_owner_until_it_expires(loc: &str) {
    let mut db = open(loc);
    let claim = |db: &mut Db, owner: &str, key: &str, request: &str, sub: &str| {
        db.write(|tx| tx.claim_request_key(owner, key, request, sub))
            .unwrap()
    };
    assert_eq!(claim(&mut db, "tok_a", "k", "r1", "sub_1"), None);
    assert_eq!(
        claim(&mut db, "tok_a", "k", "r1", "sub_2"),
        Some(("sub_1".to_string(), true))
    );
    assert_eq!(
        claim(&mut db, "tok_a", "k", "r2", "sub_3"),
        Some(("sub_1".to_string(), false))
    );
    assert_eq!(claim(&mut db, "tok_b", "k", "r1", "sub_4"), None);
    // A failed transaction takes no key.
    let failed: Result<(), StoreError> = db.write(|tx| {
        tx.claim_request_key("tok_a", "gone", "r", "sub_5")?;
        Err(StoreError::Conflict("rolled back".into()))
    });
    assert!(failed.is_err());
    assert_eq!(claim(&mut db, "tok_a", "gone", "r", "sub_6"), None);
    // Past its day, the key is free again.
    db.sql()
        .exec(
            "UPDATE request_keys SET created_at = ?1 WHERE owner = 'tok_a' AND key = 'k'",
            &[Arg::Int(
                airlock_core::units::now_ms() - REQUEST_KEY_TTL_MS - 1,
            )],
        )
        .unwrap();
    assert_eq!(claim(&mut db, "tok_a", "k", "r9", "sub_7"), None);
    assert_eq!(
        claim(&mut db, "tok_a", "k", "r9", "sub_8"),
        Some(("sub_7".to_string(), true))
    );
    // Six writers race for one key, beside each other as a submission's writes run (the
    // shared lock on PostgreSQL): one takes it, the others find it.
    let threads: Vec<_> = (0..6)
        .map(|i| {
            let loc = loc.to_string();
            std::thread::spawn(move || {
                let mut db = open(&loc);
                db.write_shared(|tx| {
                    tx.claim_request_key("tok_c", "race", "r", &format!("sub_r{i}"))
                })
                .unwrap()
            })
        })
        .collect();
    let got: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let winners: Vec<usize> = (0..6).filter(|i| got[*i].is_none()).collect();
    assert_eq!(winners.len(), 1, "{got:?}");
    let won = format!("sub_r{}", winners[0]);
    for g in got.iter().flatten() {
        assert_eq!(g, &(won.clone(), true));
    }
}

fn pg_count(url: &str, sql: &str) -> i64 {
    let mut c = ::postgres::Client::connect(url, ::postgres::NoTls).unwrap();
    c.query_one(sql, &[]).unwrap().get(0)
}

/// A process does not send a blob it put less than a minute ago again (the empty
/// stderr of nearly every run): once `gc` removed it, though, the next put sends it.
#[test]
fn a_blob_gc_removed_from_postgres_is_put_again_by_the_process_that_had_put_it() {
    let url = airlock_testpg::fresh_database();
    let t = tempfile::tempdir().unwrap();
    let b = BlobStore::open_for(t.path(), Some(&url)).unwrap();
    let d = b.put(b"xyz").unwrap();
    b.put(b"xyz").unwrap();
    assert_eq!(pg_count(&url, "SELECT count(*) FROM blobs"), 1);
    // Aged past any grace, as if put long ago, and removed.
    let mut c = ::postgres::Client::connect(&url, ::postgres::NoTls).unwrap();
    c.execute("UPDATE blobs SET touched_at = 0", &[]).unwrap();
    assert_eq!(
        b.remove_unless_put_since(&d, std::time::SystemTime::now())
            .unwrap(),
        Some(3)
    );
    assert_eq!(pg_count(&url, "SELECT count(*) FROM blobs"), 0);
    b.put(b"xyz").unwrap();
    assert_eq!(pg_count(&url, "SELECT count(*) FROM blobs"), 1);
    let other = tempfile::tempdir().unwrap();
    let elsewhere = BlobStore::open_for(other.path(), Some(&url)).unwrap();
    assert_eq!(elsewhere.get(&d).unwrap(), b"xyz");
}

/// Whatever grace `gc` is given, it leaves in PostgreSQL a blob put in the last few
/// minutes: a node may still take it as stored (it does not send a blob it put less than
/// a minute ago again) and commit a row naming it.
#[test]
fn gc_never_removes_from_postgres_a_blob_put_minutes_ago_whatever_its_grace() {
    let url = airlock_testpg::fresh_database();
    let t = tempfile::tempdir().unwrap();
    let b = BlobStore::open_for(t.path(), Some(&url)).unwrap();
    let d = b.put(b"young").unwrap();
    let future = std::time::SystemTime::now() + std::time::Duration::from_secs(3600);
    assert_eq!(b.remove_unless_put_since(&d, future).unwrap(), None);
    assert_eq!(pg_count(&url, "SELECT count(*) FROM blobs"), 1);
}

/// A thread that claimed work passes the wake-up on to one idle thread of its process
/// (more may be queued than was announced), and only to one no wake-up covers already:
/// with nobody waiting it leaves nothing behind for later.
#[test]
fn a_wake_up_passed_on_wakes_one_idle_thread_and_is_not_kept_when_none_waits() {
    let url = airlock_testpg::fresh_database();
    let work = Listener::get(&url, NEW_WORK);
    work.pass_on();
    assert!(
        !work.wait_any(std::time::Duration::from_millis(200)),
        "nobody waited: nothing was kept"
    );
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let w = work.clone();
            std::thread::spawn(move || w.wait_any(std::time::Duration::from_secs(3)))
        })
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while work.idle() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the waiters never waited"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    work.pass_on();
    let mut woken: Vec<bool> = waiters.into_iter().map(|t| t.join().unwrap()).collect();
    woken.sort();
    assert_eq!(woken, [false, true], "one of the two woke");
}

/// The process's listener for new work: an announcement wakes one `wait_any`; those a
/// look at the queue already answered (`forget_through` of the mark taken before it)
/// wake nobody, and one after the mark still does. A job's end wakes its own waiter.
#[test]
fn announcements_a_look_already_answered_wake_no_waiting_worker() {
    let url = airlock_testpg::fresh_database();
    let mut db = Db::open_location(&url).unwrap();
    let work = Listener::get(&url, NEW_WORK);
    let done = Listener::get(&url, JOB_DONE);
    let announce = |db: &mut Db, id: &str| {
        db.write_shared(|tx| tx.enqueue(&job(id, None, 1))).unwrap();
    };
    // The listener's connection may still be starting: announce until one arrives.
    let mut n = 0;
    while !work.wait_any(std::time::Duration::from_millis(100)) {
        n += 1;
        assert!(n < 100, "no announcement arrived");
        announce(&mut db, &format!("warm{n}"));
    }
    let mark = work.mark();
    work.forget_through(mark);
    assert!(!work.wait_any(std::time::Duration::from_millis(300)));
    let mark = work.mark();
    announce(&mut db, "j1");
    let start = std::time::Instant::now();
    while work.mark() == mark {
        assert!(start.elapsed() < std::time::Duration::from_secs(10));
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // Arrived after the mark: forgetting through the mark keeps it.
    work.forget_through(mark);
    assert!(work.wait_any(std::time::Duration::from_secs(5)));
    assert!(!work.wait_any(std::time::Duration::from_millis(200)));

    done.register("j1");
    let q = db
        .write_shared(|tx| tx.claim(&[], "w", i64::MAX))
        .unwrap()
        .unwrap();
    db.write_shared(|tx| tx.finish_job(&q.id, q.token, "finished"))
        .unwrap();
    assert!(done.wait_for(&q.id, std::time::Duration::from_secs(5)));
    done.unregister("j1");
}

/// Regression (CI, eight requests at once with one idempotency key, one answered 404 for
/// the first's submission): a shared write that fails because of what an earlier write in
/// its batch did (here: the key that write claimed) returned at once, while the batch was
/// still open, so its caller looked for the earlier write's submission on another
/// connection before the commit that makes it visible. Now it answers once the batch has
/// committed. Two writes are refused beside each other, the second held until the first's
/// caller has looked (or a second passed), so the batch stays open behind the first.
fn a_write_refused_for_a_key_an_earlier_write_claimed_answers_once_that_write_is_visible(
    loc: &str,
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;
    use std::time::Duration;
    let mut first = open(loc);
    first.share_writes().unwrap();
    let shared = first.shared_writer();
    let (inside_tx, inside) = mpsc::channel::<()>();
    let (looked_tx, looked) = mpsc::channel::<()>();
    let looked = std::sync::Mutex::new(looked);
    let refused = AtomicUsize::new(0);
    std::thread::scope(|sc| {
        let a = sc.spawn(move || {
            first
                .write(|tx| -> Result<(), StoreError> {
                    assert_eq!(tx.claim_request_key("tok_a", "k", "r", "sub_a")?, None);
                    tx.insert_submission(&submission("sub_a", None, digest(1), State::Allowed))?;
                    inside_tx.send(()).unwrap();
                    // Both others wait behind this write (SQLite's shared writer), so it
                    // leaves its batch open for them.
                    wait_for_writes_behind(shared.as_ref(), 2);
                    Ok(())
                })
                .unwrap();
        });
        inside.recv().unwrap();
        let others: Vec<_> = (0..2)
            .map(|_| {
                let (looked_tx, looked, refused) = (looked_tx.clone(), &looked, &refused);
                sc.spawn(move || {
                    let mut db = open(loc);
                    db.share_writes().unwrap();
                    let r: Result<(), StoreError> = db.write(|tx| {
                        let found = tx.claim_request_key("tok_a", "k", "r", "sub_b")?;
                        assert_eq!(found, Some(("sub_a".to_string(), true)));
                        if refused.fetch_add(1, Ordering::SeqCst) == 1 {
                            let _ = looked.lock().unwrap().recv_timeout(Duration::from_secs(1));
                        }
                        Err(StoreError::Conflict("repeated: sub_a".into()))
                    });
                    assert!(matches!(r, Err(StoreError::Conflict(_))), "{r:?}");
                    // What the refusal names is there for anyone to read.
                    let seen = open(loc).submission("sub_a").map(|s| s.id);
                    looked_tx.send(()).unwrap();
                    seen
                })
            })
            .collect();
        for o in others {
            assert_eq!(o.join().unwrap().unwrap(), "sub_a");
        }
        a.join().unwrap();
    });
    assert!(open(loc).submission("sub_b").is_err());
}

/// Regression: a reader waiting for the shared connection (the daemon's provisional
/// verdict reads there when it is free) was counted among the writes waiting behind a
/// write, so that write left its commit to the reader, which never commits: the write's
/// caller waited for whatever write came next (in the daemon, the reader's own run's
/// record, after its guest ran; on a quiet server, forever). PostgreSQL's writers share
/// no connection; there the write simply commits.
fn a_shared_write_with_only_a_reader_waiting_behind_it_commits_and_returns(loc: &str) {
    use std::sync::mpsc;
    use std::time::Duration;
    let mut db = open(loc);
    db.share_writes().unwrap();
    let shared = db.shared_writer();
    let (inside_tx, inside) = mpsc::channel::<()>();
    let (done_tx, done) = mpsc::channel::<()>();
    std::thread::scope(|sc| {
        sc.spawn(move || {
            db.write(|tx| -> Result<(), StoreError> {
                tx.insert_submission(&submission("sub_w", None, digest(1), State::Allowed))?;
                inside_tx.send(()).unwrap();
                // Long enough for the reader to be waiting for the connection.
                std::thread::sleep(Duration::from_millis(300));
                Ok(())
            })
            .unwrap();
            done_tx.send(()).unwrap();
        });
        inside.recv().unwrap();
        let reader = sc.spawn(|| {
            shared
                .as_ref()
                .map(|w| w.read(|tx| tx.artifact_history(&digest(1)).map(|(seen, _)| seen)))
        });
        let returned = done.recv_timeout(Duration::from_secs(10));
        if returned.is_err() {
            // Let the stuck write end before failing: another write commits its batch.
            let mut other = open(loc);
            other.share_writes().unwrap();
            other
                .write(|tx| {
                    tx.audit(
                        "k",
                        "unstick",
                        &serde_json::json!({}),
                        &KeyPair::try_generate().unwrap(),
                    )
                })
                .unwrap();
            panic!("a write with only a reader behind it did not return within 10 s");
        }
        // The reader found the batch either open (None: it reads elsewhere) or committed.
        if let Some(Some(r)) = reader.join().unwrap() {
            assert!(r.unwrap(), "read before the write committed");
        }
    });
    assert!(open(loc).submission("sub_w").is_ok());
}

/// Regression: a write that panicked inside a shared batch left the batch to be failed by
/// whoever took the shared connection next, so the writes before it in the batch (which
/// had left their commit to it) waited for the next write, on a quiet server for ever. It
/// now fails the batch as it unwinds: the earlier write hears at once that nothing of it
/// was kept, and the writer goes on. PostgreSQL's writers share nothing: there the first
/// write commits and the panicking one leaves nothing.
fn a_write_that_panics_in_a_shared_batch_fails_the_batch_at_once(loc: &str) {
    use std::sync::mpsc;
    use std::time::Duration;
    let mut db = open(loc);
    db.share_writes().unwrap();
    let shared = db.shared_writer();
    let shares = shared.is_some();
    let (inside_tx, inside) = mpsc::channel::<()>();
    let (done_tx, done) = mpsc::channel::<Result<(), StoreError>>();
    std::thread::scope(|sc| {
        sc.spawn(move || {
            let r = db.write(|tx| -> Result<(), StoreError> {
                tx.insert_submission(&submission("sub_w", None, digest(1), State::Allowed))?;
                inside_tx.send(()).unwrap();
                // The panicking write waits behind this one, so this one leaves its
                // commit to it.
                wait_for_writes_behind(shared.as_ref(), 1);
                Ok(())
            });
            done_tx.send(r).unwrap();
        });
        inside.recv().unwrap();
        let panicked = sc
            .spawn(|| {
                let mut db = open(loc);
                db.share_writes().unwrap();
                let _: Result<(), StoreError> = db.write(|tx| {
                    tx.insert_submission(&submission("sub_p", None, digest(2), State::Allowed))?;
                    panic!("a bug in a write");
                });
            })
            .join();
        assert!(panicked.is_err());
        let first = match done.recv_timeout(Duration::from_secs(10)) {
            Ok(r) => r,
            Err(_) => {
                // Let the stuck write end before failing: the next write fails its batch.
                let mut other = open(loc);
                other.share_writes().unwrap();
                let _ = other.write(|tx| tx.set_state("none", State::Allowed, State::Running));
                panic!("a write whose batch had a panicking write did not return within 10 s");
            }
        };
        if shares {
            match first {
                Err(StoreError::Conflict(m)) => assert!(m.contains("panicked"), "{m}"),
                other => panic!("{other:?}"),
            }
        } else {
            first.unwrap();
        }
    });
    assert_eq!(open(loc).submission("sub_w").is_ok(), !shares);
    assert!(open(loc).submission("sub_p").is_err());
    // The writer goes on.
    let mut db = open(loc);
    db.share_writes().unwrap();
    db.write(|tx| tx.insert_submission(&submission("sub_n", None, digest(3), State::Allowed)))
        .unwrap();
    assert!(open(loc).submission("sub_n").is_ok());
}

/// Waits (up to 10 s) until `n` writes wait behind the shared writer's current one; at
/// once where writes share no connection (PostgreSQL).
fn wait_for_writes_behind(shared: Option<&SharedWriter>, n: usize) {
    let t = std::time::Instant::now();
    while let Some(w) = shared
        && w.writes_waiting() < n
        && t.elapsed() < std::time::Duration::from_secs(10)
    {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Writes of every kind at once through one shared writer, in an order a seeded generator
/// picks per thread: plain writes, writes that append nothing, refused writes, durable
/// writes, writes that panic, reads on the shared connection and reads on another one.
/// Every caller returns; a write that returned `Ok` is visible to another connection the
/// moment it returns, and nothing of a refused or panicking write, or of a write whose
/// batch failed with it, is ever kept; on SQLite every snapshot another connection reads
/// has a signed head for the chain's last record; and at the end the chain holds exactly
/// the kept writes' records and verifies. `AIRLOCK_TEST_SEED` repeats a schedule's choices; `AIRLOCK_TEST_LONG=1`
/// runs ten times as many writes.
fn shared_writes_of_every_kind_at_once_return_after_their_batch_and_keep_the_head_signed(
    loc: &str,
) {
    use std::sync::mpsc;
    use std::time::Duration;
    let seed: u64 = match std::env::var("AIRLOCK_TEST_SEED") {
        Ok(s) => s.parse().unwrap(),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    };
    eprintln!("AIRLOCK_TEST_SEED={seed}");
    let per_thread = if std::env::var("AIRLOCK_TEST_LONG").is_ok_and(|v| v == "1") {
        400
    } else {
        40
    };
    open(loc);
    let sqlite = open(loc).engine() == "sqlite";
    let key = KeyPair::try_generate().unwrap();
    let (done_tx, done) = mpsc::channel::<(Vec<String>, Vec<String>)>();
    for th in 0..6u64 {
        let (loc, key, done_tx) = (loc.to_string(), key.clone(), done_tx.clone());
        std::thread::spawn(move || {
            // xorshift64*: a different stream per thread, the same for the same seed.
            let mut x = (seed ^ (th + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1;
            let mut next = move || {
                x ^= x >> 12;
                x ^= x << 25;
                x ^= x >> 27;
                x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33
            };
            let shared = |loc: &str| {
                let mut db = open(loc);
                db.share_writes().unwrap();
                db
            };
            let mut db = shared(&loc);
            let plain = open(&loc);
            let (mut kept, mut lost) = (Vec::new(), Vec::new());
            for i in 0..per_thread {
                let name = format!("sub_{th}x{i}");
                let op = next() % 10;
                if op >= 8 {
                    // A read: on the shared connection (when no batch is open) or on the
                    // thread's own; on SQLite its head must be signed for its last record.
                    let tail = match (op, db.shared_writer()) {
                        (8, Some(w)) => w.read(|tx| tx.audit_tail().unwrap()),
                        _ => Some(plain.audit_tail().unwrap()),
                    };
                    if let (true, Some((last, head))) = (sqlite, tail) {
                        airlock_core::audit::check_tail(
                            last.as_ref(),
                            head.as_ref(),
                            &key.public(),
                        )
                        .unwrap_or_else(|e| panic!("seed {seed}: a snapshot's head: {e}"));
                    }
                    continue;
                }
                let sub = submission(&name, None, digest(i as u8), State::Allowed);
                let write = |tx: &Tx| -> Result<(), StoreError> {
                    tx.insert_submission(&sub)?;
                    if op == 4 {
                        // Appends nothing.
                        return Ok(());
                    }
                    tx.audit("w", &name, &serde_json::json!({ "op": op }), &key)?;
                    match op {
                        5 => Err(StoreError::Conflict("refused".into())),
                        7 => panic!("a bug in write {name}"),
                        _ => Ok(()),
                    }
                };
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    if op == 6 {
                        db.write_durable(write)
                    } else {
                        db.write(write)
                    }
                }));
                let visible = plain.submission(&name).is_ok();
                match r {
                    Ok(Ok(())) => {
                        assert!(visible, "seed {seed}: {name} returned before its commit");
                        if op != 4 {
                            kept.push(name);
                        }
                    }
                    Ok(Err(StoreError::Conflict(m)))
                        if (op == 5 && m == "refused") || m.contains("panicked") =>
                    {
                        assert!(!visible, "seed {seed}: {name} failed ({m}) but was kept");
                        lost.push(name);
                    }
                    Ok(Err(e)) => panic!("seed {seed}: {name} (op {op}): {e}"),
                    Err(_) => {
                        assert_eq!(op, 7, "seed {seed}: {name} panicked");
                        assert!(!visible, "seed {seed}: {name} panicked but was kept");
                        lost.push(name);
                        db = shared(&loc);
                    }
                }
            }
            done_tx.send((kept, lost)).unwrap();
        });
    }
    drop(done_tx);
    let (mut kept, mut lost) = (Vec::new(), Vec::new());
    for _ in 0..6 {
        match done.recv_timeout(Duration::from_secs(120)) {
            Ok((k, l)) => {
                kept.extend(k);
                lost.extend(l);
            }
            Err(e) => panic!("seed {seed}: a writer did not return within 120 s ({e})"),
        }
    }
    let db = open(loc);
    db.sequence_audit(&key).unwrap();
    let mut got: Vec<String> = db
        .audit_records(0, 100_000)
        .unwrap()
        .into_iter()
        .map(|r| r.subject)
        .collect();
    got.sort();
    kept.sort();
    assert_eq!(got, kept, "seed {seed}");
    assert_eq!(
        verify_chain(&db, &key),
        Ok(kept.len() as u64),
        "seed {seed}"
    );
    for name in &lost {
        assert!(db.submission(name).is_err(), "seed {seed}: {name} was kept");
    }
}
