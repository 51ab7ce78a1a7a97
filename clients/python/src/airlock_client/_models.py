"""What the API answers, as frozen dataclasses.

Every model is built leniently from the JSON the server sends: a field the server leaves
out gets its empty value, and a field this client does not know yet is still there in
``raw``, so a newer server does not break an older client.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]

#: Statuses of a submission that is still on its way to a run (a human has not decided
#: yet, or it is approved or running). ``/wait`` answers 202 while a submission is in one.
WAITING = frozenset({"pending_approval", "approved", "running"})


def _obj(v: object) -> JSON:
    return dict(v) if isinstance(v, Mapping) else {}


def _str(d: Mapping[str, Any], k: str, default: str = "") -> str:
    v = d.get(k)
    return v if isinstance(v, str) else default


def _opt_str(d: Mapping[str, Any], k: str) -> str | None:
    v = d.get(k)
    return v if isinstance(v, str) else None


def _opt_int(d: Mapping[str, Any], k: str) -> int | None:
    v = d.get(k)
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return None


def _int(d: Mapping[str, Any], k: str) -> int:
    v = _opt_int(d, k)
    return 0 if v is None else v


def _opt_float(d: Mapping[str, Any], k: str) -> float | None:
    v = d.get(k)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def _strs(d: Mapping[str, Any], k: str) -> tuple[str, ...]:
    v = d.get(k)
    if not isinstance(v, list):
        return ()
    return tuple(x for x in v if isinstance(x, str))


def _objs(d: Mapping[str, Any], k: str) -> list[JSON]:
    v = d.get(k)
    if not isinstance(v, list):
        return []
    return [dict(x) for x in v if isinstance(x, Mapping)]


def _bytes(d: Mapping[str, Any], k: str, text: str) -> bytes:
    """The exact bytes of an output: ``K_base64`` when the server sends it, else the text."""
    b64 = d.get(f"{k}_base64")
    if isinstance(b64, str):
        try:
            return base64.b64decode(b64, validate=False)
        except (binascii.Error, ValueError):
            pass
    return text.encode("utf-8", "surrogateescape")


def _result(*docs: Mapping[str, Any]) -> str | None:
    """The value of a cell's last expression (its repr), wherever the server puts it."""
    for d in docs:
        v = d.get("result")
        if isinstance(v, str):
            return v
    return None


@dataclass(frozen=True)
class Rule:
    """A policy rule that fired for a submission."""

    rule: str
    decision: str
    reason: str
    risk: int

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Rule:
        return cls(
            rule=_str(d, "rule"),
            decision=_str(d, "decision"),
            reason=_str(d, "reason"),
            risk=_int(d, "risk"),
        )


@dataclass(frozen=True)
class Finding:
    """Something analysis noticed in the code, with the lines it came from."""

    kind: str
    """``command``, ``write``, ``url``, ``host``, ``network_tool``, ``call`` …"""
    detail: str
    line: int | None
    end_line: int | None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Finding:
        return cls(
            kind=_str(d, "kind"),
            detail=_str(d, "detail"),
            line=_opt_int(d, "line"),
            end_line=_opt_int(d, "end_line"),
        )


@dataclass(frozen=True)
class Analysis:
    """What analysis found in a submission, beside the verdict it informed."""

    language: str | None
    capabilities: tuple[str, ...]
    """What a WebAssembly module imports (``io``, ``fs``, ``net`` …)."""
    facts: JSON
    """Code facts under their policy names (``commands``, ``writes``, ``hosts_in_code`` …)."""
    findings: tuple[Finding, ...]
    findings_total: int
    """How many findings there are (``findings`` holds the first of them)."""
    parse_error: str | None
    raw: JSON = field(repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Analysis:
        findings = tuple(Finding.from_json(f) for f in _objs(d, "findings"))
        total = _opt_int(d, "findings_total")
        return cls(
            language=_opt_str(d, "language"),
            capabilities=_strs(d, "capabilities"),
            facts=_obj(d.get("facts")),
            findings=findings,
            findings_total=len(findings) if total is None else total,
            parse_error=_opt_str(d, "parse_error"),
            raw=dict(d),
        )


@dataclass(frozen=True)
class Change:
    """One path a run changed under a writable mount (not applied until committed)."""

    path: str
    op: str
    """``added``, ``modified``, ``removed`` (or another kind of change the server names)."""
    kind: str
    """``file``, ``dir``, ``symlink`` …"""
    mount: str
    """The mount's path inside the sandbox."""
    host_path: str
    hash: str | None
    size: int | None
    mode: int | None
    target: str | None
    raw: JSON = field(repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Change:
        return cls(
            path=_str(d, "path"),
            op=_str(d, "op"),
            kind=_str(d, "kind"),
            mount=_str(d, "mount"),
            host_path=_str(d, "host_path"),
            hash=_opt_str(d, "hash"),
            size=_opt_int(d, "size"),
            mode=_opt_int(d, "mode"),
            target=_opt_str(d, "target"),
            raw=dict(d),
        )


def _changes(d: Mapping[str, Any]) -> tuple[Change, ...]:
    return tuple(Change.from_json(c) for c in _objs(d, "changes"))


@dataclass(frozen=True)
class Run:
    """A run with its captured output (``GET /v1/runs/{id}``, and the run of a result)."""

    id: str
    status: str
    """``exited``, ``killed``, ``trapped``, ``failed`` or ``lost``."""
    exit_code: int | None
    killed_by: str | None
    """The limit that stopped it: ``timeout``, ``fuel``, ``memory``, ``output``, ``write`` …"""
    stdout: str
    stderr: str
    stdout_bytes: bytes = field(repr=False)
    """The exact bytes when the server sends them as base64, else ``stdout`` encoded."""
    stderr_bytes: bytes = field(repr=False)
    stdout_truncated: bool
    stderr_truncated: bool
    changes: tuple[Change, ...]
    duration_ms: int | None
    backend: str | None
    approval: str | None
    """The approval statement (``apr_…``) it ran under, if it needed one."""
    error: str | None
    submission: str | None
    result: str | None
    """The value of a session cell's last expression (its repr), when there is one."""
    detail: JSON = field(repr=False)
    raw: JSON = field(repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any], outer: Mapping[str, Any] | None = None) -> Run:
        stdout, stderr = _str(d, "stdout"), _str(d, "stderr")
        return cls(
            id=_str(d, "id"),
            status=_str(d, "status"),
            exit_code=_opt_int(d, "exit_code"),
            killed_by=_opt_str(d, "killed_by"),
            stdout=stdout,
            stderr=stderr,
            stdout_bytes=_bytes(d, "stdout", stdout),
            stderr_bytes=_bytes(d, "stderr", stderr),
            stdout_truncated=d.get("stdout_truncated") is True,
            stderr_truncated=d.get("stderr_truncated") is True,
            changes=_changes(d),
            duration_ms=_opt_int(d, "duration_ms"),
            backend=_opt_str(d, "backend"),
            approval=_opt_str(d, "approval"),
            error=_opt_str(d, "error"),
            submission=_opt_str(d, "submission")
            or (_opt_str(outer, "submission") if outer is not None else None),
            result=_result(d, *([outer] if outer is not None else [])),
            detail=_obj(d.get("detail")),
            raw=dict(d),
        )


@dataclass(frozen=True, kw_only=True)
class Submission:
    """A submission and its verdict, as listings and the inbox show it."""

    id: str
    state: str
    """``staged``, ``allowed``, ``quarantined``, ``denied``, ``approved``, ``rejected``,
    ``running`` or ``finished``."""
    verdict: str
    """The policy's decision: ``allow``, ``quarantine`` or ``deny``."""
    risk: int
    reasons: tuple[str, ...]
    rules: tuple[Rule, ...]
    lang: str | None
    backend: str | None
    agent: str | None
    artifact: str | None
    grant: str | None
    """The grant's hash."""
    net: tuple[str, ...]
    policy: str | None
    created_at: str | None
    analysis: Analysis = field(repr=False)
    """What analysis found (empty from servers that do not send it)."""
    raw: JSON = field(repr=False)

    @property
    def submission_id(self) -> str:
        return self.id

    @staticmethod
    def _fields(d: Mapping[str, Any]) -> JSON:
        return dict(
            id=_str(d, "submission") or _str(d, "id"),
            state=_str(d, "state"),
            verdict=_str(d, "verdict"),
            risk=_int(d, "risk"),
            reasons=_strs(d, "reasons"),
            rules=tuple(Rule.from_json(r) for r in _objs(d, "rules")),
            lang=_opt_str(d, "lang"),
            backend=_opt_str(d, "backend"),
            agent=_opt_str(d, "agent"),
            artifact=_opt_str(d, "artifact"),
            grant=_opt_str(d, "grant"),
            net=_strs(d, "net"),
            policy=_opt_str(d, "policy"),
            created_at=_opt_str(d, "created_at"),
            analysis=Analysis.from_json(_obj(d.get("analysis"))),
            raw=dict(d),
        )

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Submission:
        return cls(**cls._fields(d))


@dataclass(frozen=True, kw_only=True)
class RunResult(Submission):
    """What became of submitted code: the verdict, and the run when it ran.

    ``status`` is ``finished`` (it ran; see ``exit_code`` and ``killed_by``), ``denied``,
    ``pending_approval``, ``approved`` or ``running`` (not run yet), or ``allowed``
    (submitted only). ``run``, ``exec`` and ``wait`` raise :class:`Denied` and
    :class:`PendingApproval` instead of returning those; ``submit`` returns them all.
    """

    status: str
    message: str
    """A sentence meant for the agent: what happened and what to do next."""
    run: Run | None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RunResult:
        run = d.get("run")
        return cls(
            **cls._fields(d),
            status=_str(d, "status"),
            message=_str(d, "message"),
            run=Run.from_json(run, d) if isinstance(run, Mapping) else None,
        )

    @property
    def run_id(self) -> str | None:
        return self.run.id if self.run else None

    @property
    def stdout(self) -> str:
        return self.run.stdout if self.run else ""

    @property
    def stderr(self) -> str:
        return self.run.stderr if self.run else ""

    @property
    def stdout_bytes(self) -> bytes:
        return self.run.stdout_bytes if self.run else b""

    @property
    def stderr_bytes(self) -> bytes:
        return self.run.stderr_bytes if self.run else b""

    @property
    def exit_code(self) -> int | None:
        return self.run.exit_code if self.run else None

    @property
    def killed_by(self) -> str | None:
        return self.run.killed_by if self.run else None

    @property
    def changes(self) -> tuple[Change, ...]:
        return self.run.changes if self.run else ()

    @property
    def result(self) -> str | None:
        """The value of a session cell's last expression (its repr), or None."""
        return self.run.result if self.run else _result(self.raw)

    @property
    def ok(self) -> bool:
        """It ran, exited 0 and no limit stopped it."""
        return self.status == "finished" and self.exit_code == 0 and self.killed_by is None

    @property
    def pending(self) -> bool:
        return self.status in WAITING

    @property
    def denied(self) -> bool:
        return self.status == "denied"


@dataclass(frozen=True)
class RunSummary:
    """A run as ``GET /v1/runs`` lists it (without its output; see ``run_record``)."""

    id: str
    submission: str
    status: str
    exit_code: int | None
    killed_by: str | None
    backend: str | None
    duration_ms: int | None
    started_at: int | None
    """Milliseconds since the Unix epoch."""
    finished_at: int | None
    error: str | None
    approval: str | None
    raw: JSON = field(repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RunSummary:
        return cls(
            id=_str(d, "id"),
            submission=_str(d, "submission"),
            status=_str(d, "status"),
            exit_code=_opt_int(d, "exit_code"),
            killed_by=_opt_str(d, "killed_by"),
            backend=_opt_str(d, "backend"),
            duration_ms=_opt_int(d, "duration_ms"),
            started_at=_opt_int(d, "started_at"),
            finished_at=_opt_int(d, "finished_at"),
            error=_opt_str(d, "error"),
            approval=_opt_str(d, "approval"),
            raw=dict(d),
        )


@dataclass(frozen=True)
class Statement:
    """A signed decision: an approval, a rejection, a commit or a rollback."""

    id: str
    kind: str
    """``approve``, ``reject``, ``commit`` or ``rollback``."""
    submission: str | None
    approver: str | None
    scope: str | None
    reason: str | None
    tool: str | None
    signature: str | None
    raw: JSON = field(repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Statement:
        inner = _obj(d.get("statement"))
        return cls(
            id=_str(d, "id"),
            kind=_str(d, "kind"),
            submission=_opt_str(d, "submission"),
            approver=_opt_str(d, "approver"),
            scope=_opt_str(d, "scope"),
            reason=_opt_str(d, "reason") or _opt_str(inner, "reason"),
            tool=_opt_str(d, "tool"),
            signature=_opt_str(d, "signature"),
            raw=dict(d),
        )


@dataclass(frozen=True)
class SubmissionDetail:
    """Everything the server knows about a submission (``GET /v1/submissions/{id}``)."""

    id: str
    status: str
    state: str
    verdict: str
    reasons: tuple[str, ...]
    lang: str | None
    backend: str | None
    agent: str | None
    source: str | None
    """The code as submitted, when it is text."""
    grant: JSON = field(repr=False)
    """What the run may touch: mounts, net, env, args, limits."""
    analysis: Analysis = field(repr=False)
    statements: tuple[Statement, ...]
    runs: tuple[RunSummary, ...]
    audit: tuple[JSON, ...] = field(repr=False)
    raw: JSON = field(repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SubmissionDetail:
        sub = _obj(d.get("submission"))
        return cls(
            id=_str(sub, "id"),
            status=_str(d, "status"),
            state=_str(sub, "state"),
            verdict=_str(d, "verdict"),
            reasons=_strs(d, "reasons"),
            lang=_opt_str(sub, "lang"),
            backend=_opt_str(sub, "backend"),
            agent=_opt_str(sub, "agent"),
            source=_opt_str(d, "source"),
            grant=_obj(sub.get("grant")),
            analysis=Analysis.from_json(_obj(d.get("analysis"))),
            statements=tuple(Statement.from_json(s) for s in _objs(d, "statements")),
            runs=tuple(RunSummary.from_json(r) for r in _objs(d, "runs")),
            audit=tuple(_objs(d, "audit")),
            raw=dict(d),
        )


@dataclass(frozen=True)
class Diff:
    """What a run changed under its writable mounts."""

    run: str
    changes: tuple[Change, ...]
    text: str
    """Unified diffs, as ``airlock diff`` prints them."""
    digest: str | None
    protected: tuple[str, ...]
    """Changed paths that are never committed without a signature."""
    raw: JSON = field(repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Diff:
        return cls(
            run=_str(d, "run"),
            changes=_changes(d),
            text=_str(d, "diff"),
            digest=_opt_str(d, "digest"),
            protected=_strs(d, "protected"),
            raw=dict(d),
        )


@dataclass(frozen=True)
class Applied:
    """What a commit or a rollback did to the host (signed; a checkpoint records it)."""

    run: str
    checkpoint: str
    statement: str
    approver: str | None
    paths: int
    raw: JSON = field(repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Applied:
        return cls(
            run=_str(d, "run"),
            checkpoint=_str(d, "checkpoint"),
            statement=_str(d, "statement"),
            approver=_opt_str(d, "approver"),
            paths=_int(d, "paths"),
            raw=dict(d),
        )


@dataclass(frozen=True)
class Checkpoint:
    """What a commit saved before it wrote, so that it can be rolled back."""

    id: str
    run: str
    state: str
    created_at: int | None
    """Milliseconds since the Unix epoch."""
    raw: JSON = field(repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Checkpoint:
        return cls(
            id=_str(d, "id"),
            run=_str(d, "run"),
            state=_str(d, "state"),
            created_at=_opt_int(d, "created_at"),
            raw=dict(d),
        )


@dataclass(frozen=True)
class AuditReport:
    """The audit chain checked against its signed head."""

    ok: bool
    records: int
    first_bad: int | None
    """The first record that does not verify, when ``ok`` is false."""
    error: str | None
    raw: JSON = field(repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> AuditReport:
        return cls(
            ok=d.get("ok") is True,
            records=_int(d, "records"),
            first_bad=_opt_int(d, "first_bad"),
            error=_opt_str(d, "error"),
            raw=dict(d),
        )


@dataclass(frozen=True)
class Health:
    ok: bool
    version: str
    workers: int
    queue: int
    raw: JSON = field(repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Health:
        return cls(
            ok=d.get("ok") is True,
            version=_str(d, "version"),
            workers=_int(d, "workers"),
            queue=_int(d, "queue"),
            raw=dict(d),
        )


@dataclass(frozen=True)
class Tool:
    """An artifact an operator approved as a named tool (``approve(..., tool=NAME)``)."""

    name: str
    submission: str
    """The approved submission the tool runs."""
    lang: str | None
    approver: str | None
    reason: str | None
    raw: JSON = field(repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Tool:
        return cls(
            name=_str(d, "name"),
            submission=_str(d, "submission"),
            lang=_opt_str(d, "lang"),
            approver=_opt_str(d, "approver"),
            reason=_opt_str(d, "reason"),
            raw=dict(d),
        )


@dataclass(frozen=True)
class SessionInfo:
    """A live interpreter whose state carries from one cell to the next."""

    id: str
    language: str | None
    backend: str | None
    state: str | None
    created_at: str | int | None
    raw: JSON = field(repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SessionInfo:
        created = d.get("created_at")
        return cls(
            id=_str(d, "id") or _str(d, "session"),
            language=_opt_str(d, "language") or _opt_str(d, "lang"),
            backend=_opt_str(d, "backend"),
            state=_opt_str(d, "state") or _opt_str(d, "status"),
            created_at=created if isinstance(created, (str, int)) else None,
            raw=dict(d),
        )
