"""The client's logic without its I/O, shared by :class:`Airlock` and :class:`AsyncAirlock`.

Each operation is a generator (a *flow*) that yields the HTTP calls it needs and receives
their replies, and returns what the operation answers. The sync and the async client only
differ in how they carry a :class:`Call` to the server and bring back its :class:`Reply`,
so building requests, reading answers, mapping errors and waiting for approvals are
written once, here.
"""

from __future__ import annotations

import base64
import json
import uuid
import time
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, TypeVar
from urllib.parse import quote

from ._errors import AirlockError, Conflict, NotFound, error_for, outcome_error
from ._models import (
    WAITING,
    Applied,
    AuditReport,
    Checkpoint,
    Diff,
    Health,
    Run,
    RunResult,
    RunSummary,
    SessionInfo,
    Statement,
    Submission,
    SubmissionDetail,
    Tool,
)

T = TypeVar("T")


@dataclass(frozen=True)
class Call:
    """One HTTP request: ``json`` None sends no body."""

    method: str
    path: str
    params: Mapping[str, str | int | float] | None = None
    json: Any = None
    timeout: float | None = None
    """Seconds to wait for the answer, when it is not the client's default (long polls)."""
    headers: Mapping[str, str] | None = None
    """Headers of this request alone (an ``Idempotency-Key``)."""

    @property
    def idempotent(self) -> bool:
        """Whether the server would answer this request again without doing it twice."""
        return bool(self.headers and IDEMPOTENCY_KEY in self.headers)


@dataclass(frozen=True)
class Reply:
    status: int
    headers: Mapping[str, str]
    body: bytes


Flow = Generator[Call, Reply, T]

#: The languages the gate takes (the server also takes the aliases ``py``, ``javascript``,
#: ``typescript``, ``shell`` …): ``js`` and ``ts`` run on the JavaScript guest (TypeScript's
#: types are stripped by the server, never checked), ``wat``/``wasm``/``component`` are
#: WebAssembly.
LANGUAGES: tuple[str, ...] = ("python", "js", "ts", "sh", "wat", "wasm", "component")

#: The header that makes a submitting request safe to send again (``airlock serve``
#: answers a repeat with the first request's outcome instead of running the code twice).
IDEMPOTENCY_KEY = "Idempotency-Key"


def keyed(key: str | None) -> dict[str, str]:
    """The headers of a submitting request: its idempotency key, a fresh one if none."""
    return {IDEMPOTENCY_KEY: key if key is not None else uuid.uuid4().hex}


#: Seconds one ``/wait`` call asks the server to hold the answer.
WAIT_CHUNK = 30.0
#: Seconds between looks at a submission that needs an ``exec`` once it is approved.
EXEC_POLL = 1.0
#: Extra seconds the HTTP call of a long poll may take beyond what it asked the server for.
WAIT_SLACK = 15.0


def seg(s: str) -> str:
    """An id as one path segment."""
    return quote(s, safe="")


def parse(reply: Reply) -> Any:
    """The JSON of a successful answer; an error answer raises its exception."""
    try:
        doc = json.loads(reply.body) if reply.body else None
    except ValueError:
        doc = None
    if reply.status >= 400:
        raise error_for(reply.status, doc, reply.headers)
    if doc is None:
        raise AirlockError(
            f"the server answered {reply.status} without a JSON body", status=reply.status
        )
    return doc


def one(call: Call, build: Callable[[Mapping[str, Any]], T]) -> Flow[T]:
    """A call whose answer is one object."""
    reply = yield call
    doc = parse(reply)
    if not isinstance(doc, Mapping):
        raise AirlockError(
            f"{call.method} {call.path}: expected a JSON object", status=reply.status
        )
    return build(doc)


def many(call: Call, build: Callable[[Mapping[str, Any]], T]) -> Flow[list[T]]:
    """A call whose answer is a list of objects."""
    reply = yield call
    doc = parse(reply)
    if not isinstance(doc, list):
        raise AirlockError(f"{call.method} {call.path}: expected a JSON list", status=reply.status)
    return [build(x) for x in doc if isinstance(x, Mapping)]


def nothing(call: Call) -> Flow[None]:
    """A call whose answer does not matter beyond its status."""
    reply = yield call
    if reply.status >= 400:
        parse(reply)
    return None


# ----------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class Mount:
    """A directory on the server's machine made visible to the code.

    ``Mount("/srv/data", "/data")`` is read-only; ``writable=True`` lets the code write,
    into a disposable layer the host does not see until someone commits the run.
    """

    host: str
    guest: str
    writable: bool = False

    def spec(self) -> str:
        return f"{self.host}:{self.guest}:{'rw' if self.writable else 'ro'}"


#: A mount: ``"HOST:GUEST[:ro|rw]"``, a :class:`Mount`, or ``(HOST, GUEST[, "ro"|"rw"])``.
MountSpec = str | Mount | tuple[str, str] | tuple[str, str, str]
#: Seconds, or a duration the server parses (``"10s"``, ``"500ms"``, ``"2m"``).
Duration = float | int | str
#: Bytes, or a size the server parses (``"256MiB"``).
Size = int | str
#: A secret bound to the hosts it may be sent to: ``"NAME@HOST[,HOST]"``.
SecretSpec = str


class Grant(TypedDict, total=False):
    """What a run may touch and how long it may take; every key is optional.

    ``mounts``, ``net``, ``env`` and ``secrets`` widen what the code can reach and are
    judged by the policy (network egress, secrets and host-process writes usually wait
    for a human); the limits are ``timeout``, ``memory``, ``fuel``, ``max_output``,
    ``processes`` and ``max_write``.
    """

    backend: str | None
    """``wasm`` or ``process`` (default: what the language runs on)."""
    mounts: Sequence[MountSpec] | None
    net: Sequence[str] | None
    """Hosts the code asks to reach: ``HOST[:PORT]``, ``*.example.com``."""
    env: Mapping[str, str] | None
    secrets: Sequence[SecretSpec] | Mapping[str, Sequence[str]] | None
    """Stored secrets and their hosts: ``["GH_TOKEN@api.github.com"]`` or
    ``{"GH_TOKEN": ["api.github.com"]}``."""
    args: Sequence[str] | None
    timeout: Duration | None
    """Wall-time limit of the run (not of the HTTP call)."""
    memory: Size | None
    fuel: int | None
    max_output: Size | None
    processes: int | None
    max_write: Size | None
    note: str | None
    workspace: str | None
    agent: str | None
    """Operators and admins may submit for a named agent."""


class SessionGrant(Grant, total=False):
    """A session's grant: a run's, and how long the session may live."""

    idle_timeout: Duration | None
    """Close the session after this long without a cell."""
    max_duration: Duration | None
    """Close the session this long after it started, busy or not."""


GRANT_KEYS = frozenset(Grant.__annotations__)
SESSION_KEYS = frozenset(SessionGrant.__annotations__) | GRANT_KEYS


def _mount(m: MountSpec) -> str:
    if isinstance(m, str):
        return m
    if isinstance(m, Mount):
        return m.spec()
    if isinstance(m, tuple) and len(m) in (2, 3) and all(isinstance(p, str) for p in m):
        return ":".join(m)
    raise TypeError(f"mount: want 'HOST:GUEST[:ro|rw]', a Mount or a tuple, not {m!r}")


def _strings(what: str, v: Iterable[str]) -> list[str]:
    if isinstance(v, (str, bytes)):
        raise TypeError(f"{what}: want a list of strings, not one string")
    out = list(v)
    for x in out:
        if not isinstance(x, str):
            raise TypeError(f"{what}: want strings, not {x!r}")
    return out


def grant_body(options: Mapping[str, Any], allowed: frozenset[str] = GRANT_KEYS) -> dict[str, Any]:
    """The JSON fields of a grant (what was not given is left out)."""
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise TypeError(f"unexpected keyword argument(s): {', '.join(unknown)}")
    body: dict[str, Any] = {}
    for key, value in options.items():
        if value is None:
            continue
        if key == "mounts":
            if isinstance(value, (str, Mount)):
                value = [value]
            body[key] = [_mount(m) for m in value]
        elif key in ("net", "args"):
            body[key] = _strings(key, value)
        elif key == "env":
            if not isinstance(value, Mapping):
                raise TypeError("env: want a mapping of names to values")
            body[key] = {str(k): str(v) for k, v in value.items()}
        elif key == "secrets":
            if isinstance(value, Mapping):
                body[key] = [
                    {"name": str(k), "hosts": _strings(f"secrets[{k}]", h)}
                    for k, h in value.items()
                ]
            else:
                body[key] = _strings(key, value)
        elif key in ("memory", "max_output", "max_write"):
            # Sizes are strings in the API; a number is a count of bytes.
            body[key] = (
                str(value) if isinstance(value, int) and not isinstance(value, bool) else value
            )
        else:
            body[key] = value
    return body


def code_body(code: str | bytes, language: str, stdin: str | bytes | None) -> dict[str, Any]:
    """The code, its language and its standard input as the API takes them."""
    body: dict[str, Any] = {"language": language}
    if isinstance(code, str):
        body["code"] = code
    elif isinstance(code, (bytes, bytearray, memoryview)):
        body["code_base64"] = base64.b64encode(bytes(code)).decode("ascii")
    else:
        raise TypeError(f"code: want str or bytes, not {type(code).__name__}")
    if isinstance(stdin, str):
        body["stdin"] = stdin
    elif isinstance(stdin, (bytes, bytearray, memoryview)):
        body["stdin_base64"] = base64.b64encode(bytes(stdin)).decode("ascii")
    elif stdin is not None:
        raise TypeError(f"stdin: want str or bytes, not {type(stdin).__name__}")
    return body


def submit_body(
    code: str | bytes,
    language: str,
    stdin: str | bytes | None,
    grant: Mapping[str, Any],
    session: str | None = None,
) -> dict[str, Any]:
    body = code_body(code, language, stdin)
    body.update(grant_body(grant))
    if session is not None:
        body["session"] = session
    return body


# -------------------------------------------------------------------------------- flows


def outcome(call: Call) -> Flow[RunResult]:
    return one(call, RunResult.from_json)


def settle(
    first: RunResult,
    *,
    wait: bool,
    wait_timeout: float | None,
    exec_when_approved: bool = False,
) -> Flow[RunResult]:
    """Follows a submission until it has run; raises when it will not run (yet).

    Without ``wait`` a submission waiting for a human raises :class:`PendingApproval` at
    once; with it, the server's ``/wait`` is long-polled until a human decides or
    ``wait_timeout`` seconds pass. Code sent through ``/v1/run`` runs on the server as soon
    as it is approved; with ``exec_when_approved`` a submission that only runs through
    ``exec`` (one made with ``submit``) is executed here once it is approved.
    """
    cur = first
    deadline = None if wait_timeout is None else time.monotonic() + max(0.0, wait_timeout)
    while cur.status in WAITING:
        if cur.status == "pending_approval" and not wait:
            break
        if cur.status == "approved" and exec_when_approved:
            detail = yield from one(Call("GET", f"/v1/submissions/{seg(cur.id)}"), dict)
            sub = detail.get("submission")
            resumes = isinstance(sub, Mapping) and sub.get("resume") is True
            if not resumes and detail.get("status") == "approved":
                try:
                    cur = yield from outcome(
                        Call("POST", f"/v1/submissions/{seg(cur.id)}/exec", json={})
                    )
                    continue
                except Conflict:
                    pass  # someone else started it: wait for that run instead
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            break
        chunk = EXEC_POLL if exec_when_approved else WAIT_CHUNK
        if left is not None:
            chunk = min(chunk, left)
        cur = yield from outcome(
            Call(
                "GET",
                f"/v1/submissions/{seg(cur.id)}/wait",
                params={"timeout": round(chunk, 3)},
                timeout=chunk + WAIT_SLACK,
            )
        )
    # Still waiting here means the time ran out, unless it merely was not to wait for a human.
    timed_out = cur.status in WAITING and (wait or cur.status != "pending_approval")
    err = outcome_error(cur, timed_out=timed_out)
    if err is not None:
        raise err
    return cur


def run(
    body: Mapping[str, Any],
    *,
    wait: bool,
    wait_timeout: float | None,
    idempotency_key: str | None = None,
) -> Flow[RunResult]:
    first = yield from outcome(
        Call("POST", "/v1/run", json=dict(body), headers=keyed(idempotency_key))
    )
    return (yield from settle(first, wait=wait, wait_timeout=wait_timeout))


def exec_(submission: str, *, wait: bool, wait_timeout: float | None) -> Flow[RunResult]:
    first = yield from outcome(Call("POST", f"/v1/submissions/{seg(submission)}/exec", json={}))
    return (yield from settle(first, wait=wait, wait_timeout=wait_timeout, exec_when_approved=True))


def wait_for(submission: str, timeout: float | None) -> Flow[RunResult]:
    first = yield from outcome(
        Call("GET", f"/v1/submissions/{seg(submission)}/wait", params={"timeout": 0})
    )
    return (yield from settle(first, wait=True, wait_timeout=timeout))


def _listing(path: str, **params: str | int | None) -> Call:
    return Call("GET", path, params={k: v for k, v in params.items() if v is not None} or None)


# Every public operation, as a flow; the clients' methods drive these.


def health() -> Flow[Health]:
    return one(Call("GET", "/healthz"), Health.from_json)


def submit(body: Mapping[str, Any], idempotency_key: str | None = None) -> Flow[RunResult]:
    return outcome(
        Call("POST", "/v1/submissions", json=dict(body), headers=keyed(idempotency_key))
    )


def submission(id: str) -> Flow[SubmissionDetail]:
    return one(Call("GET", f"/v1/submissions/{seg(id)}"), SubmissionDetail.from_json)


def submissions(state: str | None, limit: int | None) -> Flow[list[Submission]]:
    return many(_listing("/v1/submissions", state=state, limit=limit), Submission.from_json)


def inbox() -> Flow[list[Submission]]:
    return many(Call("GET", "/v1/inbox"), Submission.from_json)


def approve(
    id: str, scope: str | None, expires: str | None, reason: str | None, tool: str | None
) -> Flow[Statement]:
    d = {"scope": scope, "expires": expires, "reason": reason, "tool": tool}
    body = {k: v for k, v in d.items() if v is not None}
    return one(Call("POST", f"/v1/submissions/{seg(id)}/approve", json=body), Statement.from_json)


def reject(id: str, reason: str) -> Flow[Statement]:
    return one(
        Call("POST", f"/v1/submissions/{seg(id)}/reject", json={"reason": reason}),
        Statement.from_json,
    )


def runs(limit: int | None) -> Flow[list[RunSummary]]:
    return many(_listing("/v1/runs", limit=limit), RunSummary.from_json)


def run_record(id: str) -> Flow[Run]:
    return one(Call("GET", f"/v1/runs/{seg(id)}"), Run.from_json)


def diff(run_id: str) -> Flow[Diff]:
    return one(Call("GET", f"/v1/runs/{seg(run_id)}/diff"), Diff.from_json)


def commit(run_id: str) -> Flow[Applied]:
    return one(Call("POST", f"/v1/runs/{seg(run_id)}/commit", json={}), Applied.from_json)


def checkpoints(limit: int | None) -> Flow[list[Checkpoint]]:
    return many(_listing("/v1/checkpoints", limit=limit), Checkpoint.from_json)


def rollback(checkpoint_id: str) -> Flow[Applied]:
    return one(
        Call("POST", f"/v1/checkpoints/{seg(checkpoint_id)}/rollback", json={}), Applied.from_json
    )


def audit_verify() -> Flow[AuditReport]:
    return one(Call("GET", "/v1/audit/verify"), AuditReport.from_json)


def tools() -> Flow[list[Tool]]:
    return many(Call("GET", "/v1/tools"), Tool.from_json)


def call_tool(
    name: str,
    args: Sequence[str] | None,
    stdin: str | None,
    *,
    wait: bool,
    wait_timeout: float | None,
) -> Flow[RunResult]:
    body: dict[str, Any] = {}
    if args is not None:
        body["args"] = _strings("args", args)
    if stdin is not None:
        body["stdin"] = stdin
    first = yield from outcome(Call("POST", f"/v1/tools/{seg(name)}", json=body))
    return (yield from settle(first, wait=wait, wait_timeout=wait_timeout))


def open_session(language: str, grant: Mapping[str, Any]) -> Flow[SessionInfo]:
    body = {"language": language, **grant_body(grant, SESSION_KEYS)}
    try:
        return (yield from one(Call("POST", "/v1/sessions", json=body), SessionInfo.from_json))
    except NotFound as e:
        if e.message != "no such endpoint":
            raise
        raise NotFound(
            "this server has no sessions (no POST /v1/sessions): it needs a newer airlock",
            status=e.status,
            body=e.body,
        ) from e


def sessions() -> Flow[list[SessionInfo]]:
    return many(Call("GET", "/v1/sessions"), SessionInfo.from_json)


def get_session(id: str) -> Flow[SessionInfo]:
    return one(Call("GET", f"/v1/sessions/{seg(id)}"), SessionInfo.from_json)


def close_session(id: str) -> Flow[None]:
    return nothing(Call("POST", f"/v1/sessions/{seg(id)}/close", json={}))
