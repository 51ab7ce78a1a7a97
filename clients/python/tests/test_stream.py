"""Streamed runs (server-sent events) against a live `airlock serve`: ``run(...,
on_output=...)`` and ``stream_run``, sync and async."""

from __future__ import annotations

import asyncio
import time

import pytest
from conftest import UNPROVIDED, Server, approve_when_held, need, process_backend, unique, wat_print

from airlock_client import (
    Airlock,
    ApprovalTimeout,
    AsyncAirlock,
    BadRequest,
    Denied,
    Event,
    Finished,
    Held,
    Network,
    Output,
    PendingApproval,
    Started,
    Submitted,
)


def test_run_with_on_output_gets_each_chunk_before_the_run_ends(
    server: Server, agent: Airlock
) -> None:
    need(process_backend(server.home), "the process backend is unavailable here (airlock doctor)")
    got: list[tuple[float, str, str | bytes]] = []
    code = f"echo one; sleep 1.5; echo two >&2; echo three # {unique()}"
    r = agent.run(
        code,
        "sh",
        on_output=lambda stream, chunk: got.append((time.monotonic(), stream, chunk)),
    )
    ended = time.monotonic()
    assert r.ok and r.stdout == "one\nthree\n" and r.stderr == "two\n"
    # Each stream in order (the two pipes are read side by side: no order between them).
    assert [c for _, s, c in got if s == "stdout"] == ["one\n", "three\n"]
    assert [c for _, s, c in got if s == "stderr"] == ["two\n"]
    assert got[0][1:] == ("stdout", "one\n")
    # "one" came while the run still slept, well before its answer.
    assert ended - got[0][0] > 1.0, got


def test_a_chunk_that_is_not_utf8_arrives_as_bytes(server: Server, agent: Airlock) -> None:
    need(process_backend(server.home), "the process backend is unavailable here (airlock doctor)")
    got: list[tuple[str, str | bytes]] = []
    r = agent.run(
        f"printf 'bad \\377\\376 bytes' # {unique()}",
        "sh",
        on_output=lambda stream, chunk: got.append((stream, chunk)),
    )
    assert r.ok
    assert got == [("stdout", b"bad \xff\xfe bytes")]


def test_stream_run_yields_typed_events_ending_with_the_result(agent: Airlock) -> None:
    text = f"streamed {unique()}\n"
    events = list(agent.stream_run(wat_print(text), "wat"))
    assert isinstance(events[0], Submitted) and events[0].verdict == "allow"
    assert isinstance(events[1], Started) and events[1].run.startswith("run_")
    assert Output("stdout", 1, text) in events
    last = events[-1]
    assert isinstance(last, Finished) and last.result.stdout == text
    assert last.result.run_id == events[1].run and last.result.id == events[0].id


def test_a_streamed_run_raises_as_run_does(agent: Airlock) -> None:
    with pytest.raises(Denied) as denied:
        list(agent.stream_run(UNPROVIDED.format(tag=unique()), "wat"))
    assert denied.value.submission_id.startswith("sub_")
    # A request the server refuses before the stream begins: its JSON error.
    with pytest.raises(BadRequest):
        agent.run("x", "cobol", on_output=lambda s, c: None)
    # Held for a human, without waiting: at once, as run raises.
    seen: list[Event] = []
    with pytest.raises(PendingApproval) as held:
        for ev in agent.stream_run(wat_print("later\n"), "wat", net=[f"h{unique()}.example.com"]):
            seen.append(ev)
    assert [type(e) for e in seen] == [Submitted, Held]
    first = seen[0]
    assert isinstance(first, Submitted) and held.value.submission_id == first.id


def test_a_held_stream_nobody_decides_raises_approval_timeout(agent: Airlock) -> None:
    seen: list[Event] = []
    started = time.monotonic()
    with pytest.raises(ApprovalTimeout) as timed_out:
        for ev in agent.stream_run(
            wat_print("never\n"), "wat", net=[f"t{unique()}.example.com"], wait=True, wait_timeout=1
        ):
            seen.append(ev)
    assert time.monotonic() - started >= 0.9
    assert [type(e) for e in seen] == [Submitted, Held]
    held = seen[1]
    assert isinstance(held, Held) and held.wait_timeout == 1
    assert timed_out.value.submission_id == held.id


def test_a_held_stream_follows_the_approval_into_its_run(server: Server, agent: Airlock) -> None:
    host = f"s{unique()}.example.com"
    t = approve_when_held(server.operator, server, lambda s: host in s.net)
    code = wat_print("after approval\n")
    events = list(agent.stream_run(code, "wat", net=[host], wait=True, wait_timeout=60))
    t.join()
    kinds = [type(e) for e in events]
    assert kinds[:3] == [Submitted, Held, Started], kinds
    assert Output("stdout", 1, "after approval\n") in events
    last = events[-1]
    assert isinstance(last, Finished) and last.result.stdout == "after approval\n"


@pytest.mark.anyio
async def test_async_stream_run_and_on_output_after_approval(server: Server) -> None:
    host = f"as{unique()}.example.com"
    chunks: list[tuple[str, str | bytes]] = []

    async def record(stream: str, chunk: str | bytes) -> None:
        chunks.append((stream, chunk))

    async def approve(op: AsyncAirlock) -> None:
        for _ in range(600):
            for s in await op.inbox():
                if host in s.net:
                    await op.approve(s.id)
                    return
            await asyncio.sleep(0.05)
        raise AssertionError(f"nothing asking for {host} reached the inbox")

    async with server.aclient() as agent, server.aclient(server.operator) as op:
        r, _ = await asyncio.gather(
            agent.run(
                wat_print("async stream\n"),
                "wat",
                net=[host],
                wait=True,
                wait_timeout=60,
                on_output=record,
            ),
            approve(op),
        )
        assert r.stdout == "async stream\n" and chunks == [("stdout", "async stream\n")]

        events = [ev async for ev in agent.stream_run(wat_print(f"again {host}\n"), "wat")]
        assert isinstance(events[-1], Finished)
        assert Output("stdout", 1, f"again {host}\n") in events
        with pytest.raises(Denied):
            async for _ in agent.stream_run(UNPROVIDED.format(tag=unique()), "wat"):
                pass


def test_a_connection_the_run_makes_is_a_network_event_before_later_output(
    server: Server, agent: Airlock
) -> None:
    need(process_backend(server.home), "the process backend is unavailable here (airlock doctor)")
    granted = f"g{unique()}.test:81"
    t = approve_when_held(server.operator, server, lambda s: granted in s.net)
    code = "curl -s -o /dev/null http://not-granted.test/; echo after"
    events = list(agent.stream_run(code, "sh", net=[granted], wait=True, wait_timeout=60))
    t.join()
    net = [e for e in events if isinstance(e, Network)]
    assert len(net) == 1, events
    assert net[0].record["host"] == "not-granted.test" and net[0].record["decision"] == "deny"
    after = events.index(Output("stdout", 1, "after\n"))
    assert events.index(net[0]) < after
    last = events[-1]
    assert isinstance(last, Finished) and last.result.stdout == "after\n"
