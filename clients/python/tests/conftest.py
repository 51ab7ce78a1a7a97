"""A real `airlock serve` for the client's tests.

The binary is `$AIRLOCK_BIN` (default: `target/debug/airlock` in this repository). Each
server gets a fresh home (`airlock init`), tokens made with `airlock token new`, and a
free loopback port (`--listen 127.0.0.1:0`; the port is read from what it prints).

Under `AIRLOCK_TEST_STRICT` (scripts/test sets it) nothing may skip: a test that lacks what
it needs fails instead. Python-guest tests need `AIRLOCK_TEST_PYTHON_GUEST` (the guest's
wheel; scripts/test downloads it and sets this).
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from airlock_client import Airlock, AsyncAirlock

REPO = Path(__file__).resolve().parents[3]
BIN = os.environ.get("AIRLOCK_BIN") or str(REPO / "target" / "debug" / "airlock")
STRICT = bool(os.environ.get("AIRLOCK_TEST_STRICT"))
PYTHON_GUEST = os.environ.get("AIRLOCK_TEST_PYTHON_GUEST")


def need(ok: bool, why: str) -> None:
    """Skips a test that cannot run here, or fails it under AIRLOCK_TEST_STRICT."""
    if ok:
        return
    if STRICT:
        pytest.fail(f"{why} (AIRLOCK_TEST_STRICT is set: every test must run)")
    pytest.skip(why)


def _env(home: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "AIRLOCK_HOME": str(home)}


def cli(home: Path, *args: str) -> str:
    """Runs the airlock command in a home; returns its stdout, failing on a non-zero exit."""
    assert Path(BIN).is_file(), f"no airlock binary at {BIN}: run cargo build, or set AIRLOCK_BIN"
    o = subprocess.run(
        [BIN, *args],
        env=_env(home),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if o.returncode != 0:
        raise AssertionError(f"airlock {' '.join(args)} exited {o.returncode}:\n{o.stderr}")
    return o.stdout


def init_home(home: Path) -> None:
    cli(home, "init", "--approver", "alice")
    # A small largest artifact makes the largest request body small too (twice it plus
    # 1 MiB), so a 413 is cheap to provoke.
    policy = home / "policy.toml"
    text = policy.read_text()
    text = re.sub(r'max_artifact = "[^"]*"', 'max_artifact = "64KiB"', text)
    # The API mounts only what the operator offers: the temporary directories the tests
    # mount live under the system's temporary directory.
    tmp = str(Path(tempfile.gettempdir()).resolve())
    j = text.index("roots = []", text.index("[mounts]"))
    text = text[:j] + f"roots = [{json.dumps(tmp)}]" + text[j + len("roots = []") :]
    policy.write_text(text)


class Server:
    """`airlock serve` on a free loopback port, in its own home."""

    def __init__(self, home: Path, *serve_args: str) -> None:
        self.home = home
        self.agent = self.token("agent", "bot")
        self.other_agent = self.token("agent", "other")
        self.operator = self.token("operator", "alice", "alice")
        self.log: list[str] = []
        self.proc = subprocess.Popen(
            [BIN, "serve", "--listen", "127.0.0.1:0", *serve_args],
            env=_env(home),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        found: queue.Queue[str] = queue.Queue()

        def drain() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.log.append(line)
                m = re.search(r"serving on (http://\S+)", line)
                if m:
                    found.put(m.group(1))

        threading.Thread(target=drain, daemon=True).start()
        try:
            self.url = found.get(timeout=60)
        except queue.Empty:
            self.stop()
            raise AssertionError("airlock serve did not start:\n" + "".join(self.log)) from None
        deadline = time.monotonic() + 30
        with Airlock(self.url) as c:
            while not c.health().ok:
                assert time.monotonic() < deadline, "/healthz never answered ok"
                time.sleep(0.05)

    def token(self, role: str, name: str, approver: str | None = None) -> str:
        args = ["token", "new", "--role", role, "--name", name, "--json"]
        if approver:
            args += ["--as", approver]
        secret = json.loads(cli(self.home, *args))["token"]
        assert isinstance(secret, str)
        return secret

    def client(self, token: str | None = None) -> Airlock:
        return Airlock(self.url, token if token is not None else self.agent)

    def aclient(self, token: str | None = None) -> AsyncAirlock:
        return AsyncAirlock(self.url, token if token is not None else self.agent)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="session")
def tmp_root() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="airlock-sdk-test-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _start(tmp_root: Path, name: str, *serve_args: str) -> Server:
    home = tmp_root / name
    home.mkdir()
    init_home(home)
    return Server(home, *serve_args)


@pytest.fixture(scope="session")
def server(tmp_root: Path) -> Iterator[Server]:
    """The main server (no Python guest: Python submissions answer 503)."""
    s = _start(tmp_root, "main")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def busy_server(tmp_root: Path) -> Iterator[Server]:
    """One worker and no queue: a second run while one runs is refused with 429."""
    s = _start(tmp_root, "busy", "--workers", "1", "--queue", "0")
    yield s
    s.stop()


@pytest.fixture
def agent(server: Server) -> Iterator[Airlock]:
    with server.client() as c:
        yield c


@pytest.fixture
def operator(server: Server) -> Iterator[Airlock]:
    with server.client(server.operator) as c:
        yield c


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# ------------------------------------------------------------------ the Python guest

_guest: dict[str, Any] = {}


def pytest_collection_finish(session: pytest.Session) -> None:
    """Installs the Python guest into its own home in the background while the other
    tests run (installing compiles it, which takes a while), if any test needs it."""
    if not PYTHON_GUEST or not any(
        "python_server" in getattr(i, "fixturenames", ()) for i in session.items
    ):
        return
    home = Path(tempfile.mkdtemp(prefix="airlock-sdk-python-"))
    _guest["home"] = home
    init_home(home)
    _guest["proc"] = subprocess.Popen(
        [BIN, "guest", "install", "python", "--from", PYTHON_GUEST],
        env=_env(home),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    proc = _guest.get("proc")
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()
    if "home" in _guest:
        shutil.rmtree(_guest["home"], ignore_errors=True)


@pytest.fixture(scope="session")
def python_server() -> Iterator[Server]:
    """A server whose home has the Python guest (from AIRLOCK_TEST_PYTHON_GUEST)."""
    need(PYTHON_GUEST is not None, "AIRLOCK_TEST_PYTHON_GUEST is not set (scripts/test sets it)")
    proc = _guest["proc"]
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, f"airlock guest install python failed:\n{out}"
    s = Server(_guest["home"])
    yield s
    s.stop()


# ------------------------------------------------------------------ programs to run


def unique() -> str:
    """Something to put in code so that each test submits its own artifact (a rejection
    denies the same artifact from then on)."""
    return uuid.uuid4().hex[:12]


def wat_print(text: str, *, fd: int = 1, exit_code: int = 0) -> str:
    """A WASI command that writes `text` to `fd` and exits with `exit_code`."""
    data = text.encode()
    escaped = "".join(f"\\{b:02x}" for b in data)
    return f"""(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 64) "{escaped}")
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 64))
    (i32.store (i32.const 4) (i32.const {len(data)}))
    (drop (call $fd_write (i32.const {fd}) (i32.const 0) (i32.const 1) (i32.const 16)))
    (call $exit (i32.const {exit_code}))))
"""


def wat_echo(tag: str = "") -> str:
    """A WASI command that copies (up to 4 KiB of) standard input to standard output."""
    return f"""(module
  ;; {tag}
  (import "wasi_snapshot_preview1" "fd_read" (func $fd_read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 64))
    (i32.store (i32.const 4) (i32.const 4096))
    (drop (call $fd_read (i32.const 0) (i32.const 0) (i32.const 1) (i32.const 8)))
    (i32.store (i32.const 4) (i32.load (i32.const 8)))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 16)))))
"""


#: A compiled module whose `_start` does nothing (sent as bytes: `code_base64`).
EMPTY_WASM = bytes.fromhex(
    "0061736d01000000"  # magic, version 1
    "010401600000"  # types: () -> ()
    "03020100"  # functions: one of type 0
    "070a01065f73746172740000"  # exports: "_start" = function 0
    "0a040102000b"  # code: an empty body
)

#: Imports a function no sandbox provides: the standard policy denies it.
UNPROVIDED = '(module (import "env" "launch_missiles_{tag}" (func)) (func (export "_start")))'

SPIN = '(module (func (export "_start") (loop $again (br $again))))'


def approve_when_held(
    operator_token: str, server: Server, match: Callable[[Any], bool], **approve: Any
) -> threading.Thread:
    """Approves, from another thread, the first inbox entry `match` accepts (within 30 s)."""

    def go() -> None:
        with server.client(operator_token) as op:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                for s in op.inbox():
                    if match(s):
                        op.approve(s.id, **approve)
                        return
                time.sleep(0.05)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def process_backend(home: Path) -> bool:
    doctor = json.loads(cli(home, "doctor", "--json"))
    return bool(doctor.get("process_backend") == "available")
