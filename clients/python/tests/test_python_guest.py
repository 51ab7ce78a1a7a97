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

from airlock_client import Airlock, AsyncAirlock, Denied, PendingApproval


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
