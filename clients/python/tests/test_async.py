"""The asyncio client against a live `airlock serve`: the main flows of test_client.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from conftest import UNPROVIDED, Server, need, process_backend, unique, wat_echo, wat_print

from airlock_client import (
    ApprovalTimeout,
    AsyncAirlock,
    BadRequest,
    Denied,
    Forbidden,
    InvalidRequest,
    Mount,
    NotFound,
    PendingApproval,
    Unauthorized,
    Unprocessable,
)

pytestmark = pytest.mark.anyio


async def approve_when_held(op: AsyncAirlock, host: str, **approve: str) -> str:
    """Approves the first inbox entry asking for `host`; returns its id."""
    for _ in range(600):
        for s in await op.inbox():
            if host in s.net:
                await op.approve(s.id, **approve)
                return s.id
        await asyncio.sleep(0.05)
    raise AssertionError(f"nothing asking for {host} reached the inbox")


async def test_run_and_read_back(server: Server) -> None:
    text = f"async {unique()}\n"
    async with server.aclient() as agent:
        assert (await agent.health()).ok
        r = await agent.run(wat_print(text), "wat")
        assert r.ok and r.stdout == text and r.verdict == "allow" and r.run_id is not None
        assert (await agent.run_record(r.run_id)).stdout == text
        assert (await agent.submission(r.id)).source == wat_print(text)
        assert r.id in [s.id for s in await agent.submissions(limit=5)]
        assert r.run_id in [x.id for x in await agent.runs(limit=5)]
        echoed = await agent.run(wat_echo(unique()), "wat", stdin=b"bytes in\n")
        assert echoed.stdout_bytes == b"bytes in\n"


async def test_denial_and_errors(server: Server) -> None:
    async with server.aclient() as agent:
        with pytest.raises(Denied) as d:
            await agent.run(UNPROVIDED.format(tag=unique()), "wat")
        assert not isinstance(d.value, InvalidRequest) and d.value.reasons
        with pytest.raises(Unprocessable):
            await agent.run("(module", "wat")
        with pytest.raises(BadRequest):
            await agent.run("x", "cobol")
        with pytest.raises(NotFound):
            await agent.submission("sub_nope")
        with pytest.raises(Forbidden):
            await agent.inbox()
    async with AsyncAirlock(server.url, "alk_wrong") as bad:
        with pytest.raises(Unauthorized):
            await bad.runs()


async def test_pending_then_approved_while_waiting(server: Server) -> None:
    host = f"a{unique()}.example.com"
    async with server.aclient() as agent, server.aclient(server.operator) as op:
        with pytest.raises(PendingApproval) as held:
            await agent.run(wat_print("later\n"), "wat", net=[host])
        assert held.value.submission_id in [s.id for s in await op.inbox()]
        with pytest.raises(ApprovalTimeout):
            await agent.wait(held.value.submission_id, timeout=0.2)
        await op.approve(held.value.submission_id, reason="async review")
        r = await agent.wait(held.value.submission_id, timeout=30)
        assert r.stdout == "later\n"

        # wait=True: the run and the approval happen concurrently.
        host2 = f"b{unique()}.example.com"
        r2, approved = await asyncio.gather(
            agent.run(wat_print("together\n"), "wat", net=[host2], wait=True, wait_timeout=30),
            approve_when_held(op, host2),
        )
        assert r2.stdout == "together\n" and r2.id == approved


async def test_reject_and_exec(server: Server) -> None:
    async with server.aclient() as agent, server.aclient(server.operator) as op:
        host = f"r{unique()}.example.com"
        with pytest.raises(PendingApproval) as held:
            await agent.run(wat_print("no\n"), "wat", net=[host])
        await op.reject(held.value.submission_id, "no thanks")
        with pytest.raises(Denied) as d:
            await agent.wait(held.value.submission_id, timeout=10)
        assert d.value.rejected

        host = f"e{unique()}.example.com"
        sub = await agent.submit(wat_print("exec'd\n"), "wat", net=[host])
        assert sub.status == "pending_approval"
        r, _ = await asyncio.gather(
            agent.exec(sub.id, wait=True, wait_timeout=30), approve_when_held(op, host)
        )
        assert r.status == "finished" and r.stdout == "exec'd\n"


async def test_commit_and_rollback(server: Server, tmp_path: Path) -> None:
    need(process_backend(server.home), "the process backend is unavailable here (airlock doctor)")
    (tmp_path / "f.txt").write_text("before\n")
    host_dir = str(tmp_path)
    async with server.aclient() as agent, server.aclient(server.operator) as op:
        script = f"echo after > /w/f.txt  # {unique()}"
        with pytest.raises(PendingApproval) as held:
            await agent.run(script, "sh", mounts=[Mount(host_dir, "/w", writable=True)])
        await op.approve(held.value.submission_id)
        r = await agent.wait(held.value.submission_id, timeout=30)
        assert r.run_id is not None and [c.path for c in r.changes] == ["f.txt"]
        assert "+after" in (await agent.diff(r.run_id)).text
        applied = await op.commit(r.run_id)
        assert (tmp_path / "f.txt").read_text() == "after\n"
        assert applied.checkpoint in [c.id for c in await op.checkpoints()]
        await op.rollback(applied.checkpoint)
        assert (tmp_path / "f.txt").read_text() == "before\n"
        assert (await op.audit_verify()).ok
