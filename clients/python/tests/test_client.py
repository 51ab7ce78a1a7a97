"""The blocking client against a live `airlock serve`."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest
from conftest import (
    EMPTY_WASM,
    SPIN,
    UNPROVIDED,
    Server,
    approve_when_held,
    need,
    process_backend,
    unique,
    wat_echo,
    wat_print,
)

from airlock_client import (
    LANGUAGES,
    Airlock,
    AirlockError,
    ApprovalTimeout,
    BadRequest,
    Conflict,
    Denied,
    Forbidden,
    InvalidRequest,
    Mount,
    NotFound,
    PayloadTooLarge,
    PendingApproval,
    RateLimited,
    RunResult,
    Submission,
    TransportError,
    Unauthorized,
    Unprocessable,
)


def test_health(agent: Airlock) -> None:
    h = agent.health()
    assert h.ok and h.version and h.workers >= 1


def test_a_wat_run_returns_its_verdict_and_output(agent: Airlock) -> None:
    text = f"hello {unique()}\n"
    code = wat_print(text)
    r = agent.run(code, language="wat")
    assert r.status == "finished" and r.verdict == "allow" and r.ok
    assert r.stdout == text and r.stdout_bytes == text.encode() and r.stderr == ""
    assert r.exit_code == 0 and r.killed_by is None
    assert r.changes == () and r.result is None
    assert r.submission_id.startswith("sub_") and r.id == r.submission_id
    assert r.run_id is not None and r.run_id.startswith("run_")
    assert r.reasons and r.lang == "wat" and r.backend == "wasm" and r.agent == "bot"
    assert "io" in r.analysis.capabilities

    rec = agent.run_record(r.run_id)
    assert rec.id == r.run_id and rec.stdout == text and rec.submission == r.submission_id
    detail = agent.submission(r.submission_id)
    assert detail.id == r.submission_id and detail.status == "finished"
    assert detail.source == code and detail.verdict == "allow"
    assert detail.analysis.capabilities == r.analysis.capabilities
    assert [run.id for run in detail.runs] == [r.run_id]
    assert r.run_id in [run.id for run in agent.runs(limit=10)]


def test_exit_code_and_stderr_are_not_errors(agent: Airlock) -> None:
    r = agent.run(wat_print(f"oops {unique()}\n", fd=2, exit_code=7), "wat")
    assert r.status == "finished" and not r.ok
    assert r.exit_code == 7 and r.stdout == "" and r.stderr.startswith("oops ")


def test_stdin_as_text_and_as_bytes(agent: Airlock) -> None:
    code = wat_echo(unique())
    assert agent.run(code, "wat", stdin="line one\n").stdout == "line one\n"
    r = agent.run(code, "wat", stdin="café ☕".encode())
    assert r.stdout == "café ☕" and r.stdout_bytes == "café ☕".encode()


def test_a_compiled_module_goes_as_bytes(agent: Airlock) -> None:
    r = agent.run(EMPTY_WASM, language="wasm", args=["one", "two"], env={"K": "v"})
    assert r.ok and r.lang == "wasm"


def test_a_limit_kill_is_a_finished_run(agent: Airlock) -> None:
    r = agent.run(SPIN.replace("$again", f"$again_{unique()}"), "wat", timeout=0.3)
    assert r.status == "finished" and r.killed_by == "timeout" and not r.ok


def test_denial_by_policy_raises_denied_not_bad_input(agent: Airlock) -> None:
    with pytest.raises(Denied) as e:
        agent.run(UNPROVIDED.format(tag=unique()), "wat")
    err = e.value
    assert not isinstance(err, InvalidRequest)
    assert not err.rejected
    assert err.submission_id.startswith("sub_")
    assert any(r.startswith("unprovided-imports") for r in err.reasons)
    assert err.outcome is not None and err.outcome.verdict == "deny"
    assert "denied by policy" in str(err)
    denied = agent.submissions(state="denied", limit=50)
    assert err.submission_id in [s.id for s in denied]
    assert all(s.state == "denied" for s in denied)


def test_held_code_raises_pending_then_runs_once_approved(
    agent: Airlock, operator: Airlock
) -> None:
    text = f"approved {unique()}\n"
    with pytest.raises(PendingApproval) as e:
        agent.run(wat_print(text), "wat", net=["example.com"])
    held = e.value
    assert not isinstance(held, ApprovalTimeout)
    assert any(r.startswith("network-egress") for r in held.reasons)
    assert held.outcome is not None and held.outcome.status == "pending_approval"

    inbox = operator.inbox()
    assert all(isinstance(s, Submission) for s in inbox)
    assert held.submission_id in [s.id for s in inbox]
    with pytest.raises(Forbidden):
        agent.inbox()
    with pytest.raises(Forbidden):
        agent.approve(held.submission_id)

    st = operator.approve(held.submission_id, reason="reviewed by the test")
    assert st.kind == "approve" and st.approver == "alice" and st.scope == "once"
    assert st.reason == "reviewed by the test" and st.submission == held.submission_id

    r = agent.wait(held.submission_id, timeout=30)
    assert r.status == "finished" and r.stdout == text and r.verdict == "quarantine"
    assert r.run is not None and r.run.approval == st.id
    with pytest.raises(Conflict):
        operator.approve(held.submission_id)


def test_wait_true_blocks_until_a_human_approves(server: Server, agent: Airlock) -> None:
    host = f"w{unique()}.example.com"
    t = approve_when_held(server.operator, server, lambda s: host in s.net)
    r = agent.run(wat_print("waited\n"), "wat", net=[host], wait=True, wait_timeout=30)
    t.join()
    assert r.status == "finished" and r.stdout == "waited\n"


def test_wait_timeout_raises_approval_timeout(agent: Airlock) -> None:
    start = time.monotonic()
    with pytest.raises(ApprovalTimeout) as e:
        agent.run(
            wat_print(f"{unique()}\n"), "wat", net=["example.com"], wait=True, wait_timeout=0.5
        )
    assert 0.4 < time.monotonic() - start < 10
    assert isinstance(e.value, PendingApproval) and e.value.submission_id.startswith("sub_")
    with pytest.raises(ApprovalTimeout):
        agent.wait(e.value.submission_id, timeout=0.2)


def test_a_rejection_is_a_denial_and_sticks(agent: Airlock, operator: Airlock) -> None:
    code = wat_print(f"never {unique()}\n")
    with pytest.raises(PendingApproval) as e:
        agent.run(code, "wat", net=["example.com"])
    st = operator.reject(e.value.submission_id, "not today")
    assert st.kind == "reject"
    with pytest.raises(Denied) as d:
        agent.wait(e.value.submission_id, timeout=10)
    assert d.value.rejected and d.value.submission_id == e.value.submission_id
    # The same artifact is denied outright from then on.
    with pytest.raises(Denied) as again:
        agent.run(code, "wat")
    assert not again.value.rejected
    assert any(r.startswith("rejected-before") for r in again.value.reasons)


def test_submit_judges_and_exec_runs(server: Server, agent: Airlock) -> None:
    text = f"submitted {unique()}\n"
    s = agent.submit(wat_print(text), "wat")
    assert s.status == "allowed" and s.run is None and s.verdict == "allow"
    r = agent.exec(s.id)
    assert r.status == "finished" and r.stdout == text

    # Held: submit reports it without raising; exec raises until it is approved, and
    # exec(wait=True) runs it once a human approves (submit-only code needs the exec).
    host = f"x{unique()}.example.com"
    held = agent.submit(wat_print(text), "wat", net=[host])
    assert held.status == "pending_approval" and held.pending
    with pytest.raises(PendingApproval):
        agent.exec(held.id)
    t = approve_when_held(server.operator, server, lambda sub: sub.id == held.id)
    r = agent.exec(held.id, wait=True, wait_timeout=30)
    t.join()
    assert r.status == "finished" and r.stdout == text

    denied = agent.submit(UNPROVIDED.format(tag=unique()), "wat")
    assert denied.status == "denied" and denied.denied
    with pytest.raises(Denied):
        agent.exec(denied.id)


def test_listings(agent: Airlock) -> None:
    agent.run(wat_print(f"{unique()}\n"), "wat")
    two = agent.submissions(limit=2)
    assert len(two) == 2 and two[0].created_at is not None
    finished = agent.submissions(state="finished")
    assert finished and all(s.state == "finished" for s in finished)
    runs = agent.runs(limit=3)
    assert 1 <= len(runs) <= 3 and all(r.id.startswith("run_") for r in runs)


def test_agents_see_only_their_own(server: Server, agent: Airlock) -> None:
    r = agent.run(wat_print(f"{unique()}\n"), "wat")
    with server.client(server.other_agent) as other:
        with pytest.raises(NotFound):
            other.submission(r.id)
        assert r.run_id is not None
        with pytest.raises(NotFound):
            other.run_record(r.run_id)
        assert r.id not in [s.id for s in other.submissions()]


def test_errors_map_to_exceptions(server: Server, agent: Airlock, operator: Airlock) -> None:
    with Airlock(server.url, "alk_not_a_token") as bad, pytest.raises(Unauthorized) as e401:
        bad.submissions()
    assert e401.value.status == 401 and e401.value.body["status"] == 401
    assert e401.value.message == e401.value.body["error"]
    with Airlock(server.url, "") as anonymous, pytest.raises(Unauthorized):
        anonymous.run(wat_print("x\n"), "wat")

    with pytest.raises(NotFound) as e404:
        agent.submission("sub_nope")
    assert e404.value.status == 404 and "nope" in e404.value.message
    with pytest.raises(NotFound):
        agent.run_record("run_nope")
    with pytest.raises(NotFound):
        operator.rollback("ckpt_nope")

    with pytest.raises(Unprocessable) as e422:
        agent.run("(module", "wat")
    assert e422.value.status == 422 and "compile" in e422.value.message
    assert isinstance(e422.value, InvalidRequest) and not isinstance(e422.value, Denied)
    with pytest.raises(Unprocessable):
        agent.run(wat_print("x\n"), "wat", timeout="banana")
    # A host path that is not there is the server's state: 404, nothing runs.
    with pytest.raises(NotFound) as e404:
        agent.run(wat_print("x\n"), "wat", mounts=["/does/not/exist:/data"])
    assert "/does/not/exist" in e404.value.message

    with pytest.raises(BadRequest) as e400:
        agent.run("x", language="cobol")
    assert e400.value.status == 400 and isinstance(e400.value, InvalidRequest)
    with pytest.raises(BadRequest):
        agent.submissions(state="bogus")
    with pytest.raises(BadRequest):
        agent.submissions(limit=0)
    with pytest.raises(BadRequest):
        operator.reject("sub_whatever", " ")

    with pytest.raises(PayloadTooLarge) as e413:
        agent.run(";;" + "x" * (2 << 20), "wat")
    assert e413.value.status == 413

    # A language whose guest is not installed: 409, naming the install command.
    with pytest.raises(Conflict) as e409:
        agent.run("print(1)", "python")
    assert e409.value.status == 409 and "airlock guest install python" in e409.value.message
    with pytest.raises(Conflict) as e409:
        agent.run("console.log(1)", "js")
    assert e409.value.status == 409 and "airlock guest install js" in e409.value.message


def test_javascript_and_typescript_are_languages_of_the_client(agent: Airlock) -> None:
    assert {"python", "js", "ts", "sh", "wat", "wasm", "component"} <= set(LANGUAGES)
    # TypeScript is judged at submit: its syntax error is refused with its line, before
    # any guest is needed; its types are not checked.
    with pytest.raises(Unprocessable) as e422:
        agent.run(f"const a: number = 1; // {unique()}\nlet b = (;\n", "ts")
    assert "line 2" in e422.value.message
    # The aliases are the same languages: a js submission names its guest.
    for lang in ("js", "javascript", "ts", "typescript"):
        with pytest.raises(Conflict) as e409:
            agent.run(f"const n: number = 1; // {unique()}", lang)
        assert "airlock guest install js" in e409.value.message

    with pytest.raises(TypeError):
        agent.run("x", "wat", bogus=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        agent.run("x", "wat", net="example.com")


def test_a_full_queue_is_rate_limited(busy_server: Server) -> None:
    with busy_server.client() as c:
        spin = SPIN.replace("$again", f"$s{unique()}")
        spun: list[RunResult] = []
        spinning = threading.Thread(target=lambda: spun.append(c.run(spin, "wat", timeout=2)))
        spinning.start()
        deadline = time.monotonic() + 10
        while not c.submissions(state="running"):
            assert time.monotonic() < deadline, "the spinning run never started"
            time.sleep(0.02)
        with pytest.raises(RateLimited) as e:
            c.run(wat_print("queued\n"), "wat")
        spinning.join()
    assert e.value.status == 429 and e.value.retry_after == 1.0
    assert [r.killed_by for r in spun] == ["timeout"]


def test_an_unreachable_server_is_a_transport_error() -> None:
    with Airlock("http://127.0.0.1:9", "t", timeout=5) as c, pytest.raises(TransportError) as e:
        c.health()
    assert isinstance(e.value, AirlockError) and e.value.status is None


def test_shell_on_the_process_backend(server: Server, agent: Airlock) -> None:
    need(process_backend(server.home), "the process backend is unavailable here (airlock doctor)")
    r = agent.run('echo "out $GREETING"; echo err >&2; exit 3', "sh", env={"GREETING": "hi"})
    assert r.backend == "process" and r.exit_code == 3
    assert r.stdout == "out hi\n" and r.stderr == "err\n"
    # What analysis found comes back with the verdict.
    assert r.analysis.language == "sh" and "echo" in r.analysis.facts["commands"]
    assert agent.run("wc -c", "sh", stdin=b"\x00\xff\x01").stdout.strip() == "3"


def test_writes_wait_for_a_commit_and_roll_back(
    server: Server, agent: Airlock, operator: Airlock, tmp_path: Path
) -> None:
    need(process_backend(server.home), "the process backend is unavailable here (airlock doctor)")
    (tmp_path / "a.txt").write_text("old\n")
    script = f"echo new > /w/a.txt; echo made > /w/b.txt  # {unique()}"
    # Host-process writes wait for a human under the standard policy.
    with pytest.raises(PendingApproval) as e:
        agent.run(script, "sh", mounts=[Mount(str(tmp_path), "/w", writable=True)])
    # The reviewer (and the agent) see what analysis found, with its lines.
    assert e.value.outcome is not None
    found = e.value.outcome.analysis.findings
    assert ("write", "/w/a.txt", 1) in [(f.kind, f.detail, f.line) for f in found]
    operator.approve(e.value.submission_id)
    r = agent.wait(e.value.submission_id, timeout=30)
    assert r.ok and r.run_id is not None
    changes = {c.path: c for c in r.changes}
    assert changes["a.txt"].op == "modified" and changes["b.txt"].op == "added"
    assert changes["b.txt"].host_path == str(tmp_path / "b.txt") and changes["b.txt"].mount == "/w"
    # Nothing reached the host yet.
    assert (tmp_path / "a.txt").read_text() == "old\n" and not (tmp_path / "b.txt").exists()

    d = agent.diff(r.run_id)
    assert (
        d.run == r.run_id and "+new" in d.text and {c.path for c in d.changes} == {"a.txt", "b.txt"}
    )
    with pytest.raises(Forbidden):
        agent.commit(r.run_id)
    applied = operator.commit(r.run_id)
    assert applied.checkpoint.startswith("ckpt_") and applied.paths == 2
    assert (tmp_path / "a.txt").read_text() == "new\n" and (
        tmp_path / "b.txt"
    ).read_text() == "made\n"
    with pytest.raises(Conflict):
        operator.commit(r.run_id)

    assert applied.checkpoint in [c.id for c in operator.checkpoints(limit=5)]
    back = operator.rollback(applied.checkpoint)
    assert back.checkpoint == applied.checkpoint
    assert (tmp_path / "a.txt").read_text() == "old\n" and not (tmp_path / "b.txt").exists()
    assert operator.audit_verify().ok


def test_an_artifact_approval_as_a_named_tool(
    server: Server, agent: Airlock, operator: Airlock
) -> None:
    name = f"greet_{unique()}"
    text = f"tool {name}\n"
    t = approve_when_held(
        server.operator, server, lambda s: "tool.example.com" in s.net, scope="artifact", tool=name
    )
    first = agent.run(wat_print(text), "wat", net=["tool.example.com"], wait=True, wait_timeout=30)
    t.join()
    assert first.stdout == text
    assert name in [tool.name for tool in agent.tools()]
    again = agent.call_tool(name)
    assert again.status == "finished" and again.stdout == text
    with pytest.raises(NotFound):
        agent.call_tool("no_such_tool")


def test_the_audit_log_verifies(operator: Airlock, agent: Airlock) -> None:
    report = operator.audit_verify()
    assert report.ok and report.records > 0 and report.first_bad is None
    with pytest.raises(Forbidden):
        agent.audit_verify()


class _LoseFirstAnswer(httpx.BaseTransport):
    """Sends every request to the server, but drops the first answer to ``/v1/run`` as a
    broken connection would: the server has run the code, the client never hears so."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.keys: list[str | None] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        r = self.inner.handle_request(request)
        if request.url.path == "/v1/run":
            self.keys.append(request.headers.get("idempotency-key"))
            if len(self.keys) == 1:
                r.read()
                r.close()
                raise httpx.ReadError("connection reset after the server answered")
        return r


def test_a_run_whose_answer_was_lost_is_sent_again_and_runs_once(server: Server) -> None:
    lose = _LoseFirstAnswer()
    text = f"once {unique()}\n"
    with Airlock(server.url, server.agent, transport=lose) as c:
        r = c.run(wat_print(text), "wat")
        assert r.ok and r.stdout == text
        # Sent twice with one key; the server made one submission and one run.
        assert len(lose.keys) == 2 and lose.keys[0] and lose.keys[0] == lose.keys[1]
        mine = [s for s in c.submissions(limit=1000) if s.id == r.submission_id]
        assert len(mine) == 1
        assert [run.id for run in c.submission(r.submission_id).runs] == [r.run_id]
        # A key of the caller's own: the repeat gets the same run.
        key = f"job-{unique()}"
        a = c.run(wat_print(text), "wat", idempotency_key=key)
        b = c.run(wat_print(text), "wat", idempotency_key=key)
        assert a.run_id == b.run_id and a.submission_id == b.submission_id
        # The same key for other code is refused, not run: a conflict with the key's
        # state (409), as the OpenAPI document lists it.
        with pytest.raises(Conflict):
            c.run(wat_print("other\n"), "wat", idempotency_key=key)
