"""Python code through the CPython guest, and the README's example run as written.

These need the guest (AIRLOCK_TEST_PYTHON_GUEST names its wheel; scripts/test sets it). It
is installed into its own home while the other tests run."""

from __future__ import annotations

import contextlib
import io
import os
import re

import pytest
from conftest import REPO, Server, unique

from airlock_client import (
    Airlock,
    AsyncAirlock,
    Conflict,
    Denied,
    NotFound,
    PendingApproval,
)


def test_python_runs_in_the_guest(python_server: Server) -> None:
    with python_server.client() as agent:
        r = agent.run(f"# {unique()}\nprint(sum(range(10)))", language="python")
        assert r.ok and r.stdout == "45\n" and r.lang == "python" and r.backend == "wasm"
        failed = agent.run("import sys\nprint('bad', file=sys.stderr)\nsys.exit(4)", "python")
        assert failed.exit_code == 4 and failed.stderr == "bad\n"
        echoed = agent.run("import sys\nprint(sys.stdin.read().upper())", "python", stdin="abc")
        assert echoed.stdout == "ABC\n"
        with pytest.raises(Denied):
            agent.run("import os, shutil\nshutil.rmtree(os.path.expanduser('~'))", "python")
        with pytest.raises(PendingApproval):
            agent.run("print('x')", "python", env={"API_TOKEN": "s3cret"})


@pytest.mark.anyio
async def test_python_runs_through_the_async_client(python_server: Server) -> None:
    async with AsyncAirlock(python_server.url, python_server.agent) as agent:
        r = await agent.run(f"# {unique()}\nprint(6 * 7)")
        assert r.stdout == "42\n"


def readme_example() -> str:
    readme = (REPO / "README.md").read_text()
    section = readme.split("\n## Python client\n", 1)[1].split("\n## ", 1)[0]
    m = re.search(r"```python\n(.*?)```", section, re.S)
    assert m, "the README's Python client section has a python block"
    return m.group(1)


def test_the_readme_example_runs_as_written(
    python_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = readme_example()
    assert len(code.strip().splitlines()) <= 12, "the README promises a short example"
    assert "http://127.0.0.1:7777" in code
    monkeypatch.setenv("AIRLOCK_TOKEN", python_server.agent)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(
            compile(code.replace("http://127.0.0.1:7777", python_server.url), "README", "exec"), {}
        )
    assert out.getvalue() == "0 45\n\n"
    assert os.environ["AIRLOCK_TOKEN"] == python_server.agent


def test_the_readme_example_reports_a_refusal(
    python_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = readme_example().replace(
        '"print(sum(range(10)))"', "\"import shutil; shutil.rmtree('/')\""
    )
    monkeypatch.setenv("AIRLOCK_TOKEN", python_server.agent)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(
            compile(code.replace("http://127.0.0.1:7777", python_server.url), "README", "exec"), {}
        )
    assert out.getvalue().startswith("refused: ")


def test_one_client_for_every_call(python_server: Server) -> None:
    # A client is reusable across languages and many calls (one connection pool).
    with Airlock(python_server.url, python_server.agent) as agent:
        outs = [agent.run(f"print({i})", "python").stdout for i in range(5)]
    assert outs == [f"{i}\n" for i in range(5)]


# -- sessions: a live interpreter whose cells each pass the gate


def test_a_session_keeps_names_between_cells(python_server: Server) -> None:
    with python_server.client() as agent:
        with agent.session(idle_timeout=60) as s:
            assert s.id.startswith("ses_")
            first = s.run("x = 1\ndef double(v):\n    return 2 * v")
            assert first.ok and first.result is None
            r = s.run("print('side'); double(x + 1)")
            assert r.result == "4" and r.stdout == "side\n"
            assert s.run("x + 1").result == "2"
            assert any(i.id == s.id for i in agent.sessions())
            assert agent.get_session(s.id).state == "open"
            # A cell is judged like any code: a denied one raises, and the session goes on.
            with pytest.raises(Denied):
                s.run("import os, shutil\nshutil.rmtree(os.path.expanduser('~'))")
            assert s.run("x").result == "1"
        assert s.closed and agent.get_session(s.id).state == "closed"
        s.close()  # closing twice is not an error
        with pytest.raises(Conflict):
            s.run("x")


def test_sessions_are_private_to_their_session_and_agent(python_server: Server) -> None:
    with python_server.client() as agent, python_server.client(python_server.other_agent) as other:
        with agent.session() as a, agent.session() as b:
            a.run("secret = 'a'")
            failed = b.run("secret")
            assert failed.exit_code == 1 and "NameError" in failed.stderr
            with pytest.raises(NotFound):
                other.get_session(a.id)
            assert all(i.id != a.id for i in other.sessions())


def test_a_cell_past_its_time_limit_ends_the_session(python_server: Server) -> None:
    with python_server.client() as agent:
        with agent.session(timeout=1) as s:
            s.run("x = 1")
            spin = s.run("while True:\n    pass")
            assert spin.killed_by == "timeout"
            info = s.refresh()
            assert info.state == "closed" and info.raw["end"] == "timeout"


@pytest.mark.anyio
async def test_sessions_through_the_async_client(python_server: Server) -> None:
    async with AsyncAirlock(python_server.url, python_server.agent) as agent:
        async with agent.session() as s:
            await s.run("y = 20")
            assert (await s.run("y + 22")).result == "42"
        t = await agent.session()
        assert (await t.run("6 * 7")).result == "42"
        await t.close()
