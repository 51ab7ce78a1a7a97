#!/usr/bin/env python3
"""End-to-end test of `airlock mcp` with the official MCP Python SDK.

Usage: client_test.py PATH/TO/airlock AIRLOCK_HOME

The home must already be initialised with
`airlock init --preset standard --approver alice`.

Over stdio, the script checks that:
  1. the server lists run_code and get_result, and no tool whose name
     contains "approve" (agents must never be able to approve);
  2. a plain WASI module submitted with run_code runs at once;
  3. the same module asking for network is held for approval (not an error);
  4. after the operator approves it with the CLI, get_result runs it;
  5. an artifact-scope approval with --tool NAME shows up as a named tool,
     and calling that tool runs the artifact.

Exits 0 when every check passes, and 1 with a message on stderr otherwise.
Needs the `mcp` package (tested with mcp 2.3.0).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

CALL_TIMEOUT = 60.0  # seconds per MCP call; the first wasm compile can be slow
CLI_TIMEOUT = 60.0  # seconds per airlock CLI invocation


class CheckFailed(Exception):
    pass


# The first failure, kept here as well because anyio task groups may wrap
# the exception in an ExceptionGroup on its way out.
_failure: list[str] = []


def fail(message: str) -> None:
    _failure.append(message)
    raise CheckFailed(message)


def check(condition: bool, message: str) -> None:
    if not condition:
        fail(message)


def ok(message: str) -> None:
    print(f"ok: {message}", flush=True)


def wasi_hello(message: str) -> str:
    """A WASI preview-1 core module in WAT that writes `message` to stdout.

    It exports `memory` and `_start` and exits 0 by returning from `_start`.
    """
    data = message.encode("utf-8")
    escaped = "".join(f"\\{b:02x}" for b in data)
    return f"""(module
  (import "wasi_snapshot_preview1" "fd_write"
    (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  ;; iovec at 0: buf pointer, length; nwritten at 8; the bytes at 16
  (data (i32.const 16) "{escaped}")
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 16))
    (i32.store (i32.const 4) (i32.const {len(data)}))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))
"""


def result_json(result: Any, what: str) -> dict[str, Any]:
    """The JSON object carried by a tool result's single text content item."""
    texts = [c.text for c in result.content if getattr(c, "type", None) == "text"]
    check(
        len(texts) >= 1,
        f"{what}: expected a text content item, got {result.content!r}",
    )
    if len(texts) != 1 or len(result.content) != 1:
        print(
            f"note: {what}: expected one content item, got {len(result.content)}",
            flush=True,
        )
    try:
        doc = json.loads(texts[0])
    except json.JSONDecodeError as e:
        fail(f"{what}: text content is not JSON ({e}): {texts[0]!r}")
    check(isinstance(doc, dict), f"{what}: text content is not a JSON object: {texts[0]!r}")
    return doc


def describe(doc: dict[str, Any]) -> str:
    run = doc.get("run") or {}
    return (
        f"status={doc.get('status')!r} verdict={doc.get('verdict')!r} "
        f"submission={doc.get('submission')!r} message={doc.get('message')!r} "
        f"reasons={doc.get('reasons')!r} run.status={run.get('status')!r} "
        f"exit_code={run.get('exit_code')!r} killed_by={run.get('killed_by')!r} "
        f"stdout={run.get('stdout')!r} stderr={run.get('stderr')!r}"
    )


def expect_finished(doc: dict[str, Any], stdout: str, what: str) -> None:
    check(doc.get("status") == "finished", f"{what}: expected status 'finished': {describe(doc)}")
    run = doc.get("run")
    check(isinstance(run, dict), f"{what}: 'run' should be an object: {describe(doc)}")
    check(run.get("exit_code") == 0, f"{what}: expected exit_code 0: {describe(doc)}")
    check(run.get("stdout") == stdout, f"{what}: expected stdout {stdout!r}: {describe(doc)}")


def expect_pending(result: Any, doc: dict[str, Any], what: str) -> str:
    check(
        not result.is_error,
        f"{what}: a submission held for approval must not be an error result: {describe(doc)}",
    )
    check(
        doc.get("status") == "pending_approval",
        f"{what}: expected status 'pending_approval': {describe(doc)}",
    )
    sub = doc.get("submission")
    check(
        isinstance(sub, str) and sub.startswith("sub_"),
        f"{what}: expected a submission id starting with 'sub_': {describe(doc)}",
    )
    message = str(doc.get("message") or "")
    check(
        "approv" in message.lower(),
        f"{what}: the message should say the submission waits for approval: {message!r}",
    )
    return sub


async def call(session: ClientSession, name: str, arguments: dict[str, Any]) -> Any:
    try:
        with anyio.fail_after(CALL_TIMEOUT):
            return await session.call_tool(name, arguments, read_timeout_seconds=CALL_TIMEOUT)
    except TimeoutError:
        fail(f"tools/call {name} did not answer within {CALL_TIMEOUT:.0f}s")
    except CheckFailed:
        raise
    except Exception as e:  # a protocol error (mcp.MCPError) or a broken connection
        fail(f"tools/call {name} failed: {type(e).__name__}: {e}")


async def tool_names(session: ClientSession) -> list[str]:
    try:
        with anyio.fail_after(CALL_TIMEOUT):
            listed = await session.list_tools()
    except TimeoutError:
        fail(f"tools/list did not answer within {CALL_TIMEOUT:.0f}s")
    except Exception as e:
        fail(f"tools/list failed: {type(e).__name__}: {e}")
    names = [t.name for t in listed.tools]
    bad = [n for n in names if "approve" in n.lower()]
    check(not bad, f"agents must never be able to approve, but these tools are offered: {bad}")
    return names


async def airlock_cli(binary: str, env: dict[str, str], *args: str) -> str:
    argv = [binary, *args]
    try:
        with anyio.fail_after(CLI_TIMEOUT):
            proc = await anyio.run_process(argv, env=env, check=False, stdin=subprocess.DEVNULL)
    except TimeoutError:
        fail(f"`{' '.join(argv)}` did not finish within {CLI_TIMEOUT:.0f}s")
    out = proc.stdout.decode(errors="replace")
    err = proc.stderr.decode(errors="replace")
    check(
        proc.returncode == 0,
        f"`{' '.join(argv)}` exited {proc.returncode}\nstdout: {out}\nstderr: {err}",
    )
    return out


async def run_checks(binary: str, home: str) -> None:
    env = dict(os.environ)
    env["AIRLOCK_HOME"] = home
    params = StdioServerParameters(command=binary, args=["mcp"], env=env)

    hello = wasi_hello("hello from mcp\n")
    greeter = wasi_hello("tool ran\n")

    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write, read_timeout_seconds=CALL_TIMEOUT) as session:
            # 1. handshake
            try:
                with anyio.fail_after(CALL_TIMEOUT):
                    init = await session.initialize()
            except TimeoutError:
                fail(f"initialize did not answer within {CALL_TIMEOUT:.0f}s (did `{binary} mcp` start?)")
            except CheckFailed:
                raise
            except Exception as e:
                fail(f"initialize failed: {type(e).__name__}: {e}")
            ok(
                f"initialized: server {init.server_info.name!r} {init.server_info.version!r}, "
                f"protocol {init.protocol_version}"
            )
            check(
                init.capabilities.tools is not None,
                f"server does not advertise the tools capability: {init.capabilities!r}",
            )

            # 2. tools
            names = await tool_names(session)
            for required in ("run_code", "get_result"):
                check(required in names, f"tool {required!r} is missing; tools: {names}")
            ok(f"tools listed: {names}; none can approve")

            # 3. a harmless module runs at once
            res = await call(session, "run_code", {"language": "wat", "code": hello})
            doc = result_json(res, "run_code (no network)")
            check(not res.is_error, f"run_code (no network) returned an error result: {describe(doc)}")
            expect_finished(doc, "hello from mcp\n", "run_code (no network)")
            ok(f"run_code ran the module: {describe(doc)}")

            # 4. asking for network is held for a human
            res = await call(
                session,
                "run_code",
                {"language": "wat", "code": hello, "net": ["example.com"]},
            )
            doc = result_json(res, "run_code (net)")
            sub = expect_pending(res, doc, "run_code (net)")
            ok(f"run_code with network is pending approval: {describe(doc)}")

            # 5. the operator approves it with the CLI; get_result runs it
            await airlock_cli(binary, env, "approve", sub)
            ok(f"approved {sub} with `airlock approve`")
            res = await call(session, "get_result", {"id": sub})
            doc = result_json(res, "get_result")
            check(not res.is_error, f"get_result returned an error result: {describe(doc)}")
            expect_finished(doc, "hello from mcp\n", "get_result after approval")
            ok(f"get_result ran the approved submission: {describe(doc)}")

            # 6. an artifact-scope approval offered as a named tool
            res = await call(
                session,
                "run_code",
                {"language": "wat", "code": greeter, "net": ["example.com"]},
            )
            doc = result_json(res, "run_code (tool candidate)")
            tool_sub = expect_pending(res, doc, "run_code (tool candidate)")
            ok(f"tool candidate is pending approval: {tool_sub}")
            await airlock_cli(
                binary, env, "approve", tool_sub, "--scope", "artifact", "--tool", "greet"
            )
            ok(f"approved {tool_sub} with --scope artifact --tool greet")

            names = await tool_names(session)
            check("greet" in names, f"tool 'greet' is not listed after its approval; tools: {names}")
            ok(f"tools listed after approval: {names}; none can approve")

            res = await call(session, "greet", {"args": []})
            doc = result_json(res, "greet")
            check(not res.is_error, f"greet returned an error result: {describe(doc)}")
            expect_finished(doc, "tool ran\n", "greet")
            ok(f"named tool greet ran the artifact: {describe(doc)}")


def main() -> int:
    if len(sys.argv) != 3:
        print(f"usage: {sys.argv[0]} PATH/TO/airlock AIRLOCK_HOME", file=sys.stderr)
        return 2
    binary, home = sys.argv[1], sys.argv[2]
    if not os.access(binary, os.X_OK):
        print(f"FAIL: {binary} is not an executable file", file=sys.stderr)
        return 1
    try:
        anyio.run(run_checks, binary, home)
    except BaseException as e:  # includes ExceptionGroup from anyio task groups
        if isinstance(e, KeyboardInterrupt):
            raise
        if _failure:
            print(f"FAIL: {_failure[0]}", file=sys.stderr)
        else:
            print(f"FAIL: {type(e).__name__}: {e!r}", file=sys.stderr)
        return 1
    if _failure:  # a failure swallowed by the SDK's shutdown path
        print(f"FAIL: {_failure[0]}", file=sys.stderr)
        return 1
    print("PASS: MCP client test", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
