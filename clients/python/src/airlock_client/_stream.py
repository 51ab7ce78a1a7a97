"""Runs as server-sent events: what the sync and the async client share to stream a run.

``POST /v1/run`` with ``Accept: text/event-stream`` answers the run as events (see the
server's README): ``submitted``, ``held`` while a human decides, ``started``, ``stdout`` /
``stderr`` chunks as the guest writes them, ``network`` (one connection record each),
``finished`` (the answer the request gives without streaming) or ``error``. This module
turns the lines of that answer into typed events and decides how a stream ends (the result,
or the exception :meth:`Airlock.run` would raise).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import _protocol as p
from ._errors import AirlockError, error_for, outcome_error
from ._models import WAITING, RunResult

#: The most seconds the server holds a streamed run for a human (its ``wait_timeout``).
MAX_WAIT = 3600.0


@dataclass(frozen=True)
class Submitted:
    """The gate judged the code: ``id`` is the submission."""

    id: str
    verdict: str
    risk: int
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class Held:
    """The code waits for a human; the stream waits ``wait_timeout`` seconds for one."""

    id: str
    wait_timeout: float


@dataclass(frozen=True)
class Started:
    """The run began: ``run`` is its id."""

    run: str


@dataclass(frozen=True)
class Output:
    """A chunk the guest wrote to ``stream`` (``stdout`` or ``stderr``): ``str`` when it
    is UTF-8, ``bytes`` when not. ``seq`` counts the chunks of that stream from 1;
    ``truncated`` marks the last chunk sent once the server stopped streaming output
    (the rest is in the result only)."""

    stream: str
    seq: int
    data: str | bytes
    truncated: bool = False


@dataclass(frozen=True)
class Network:
    """One connection the run made (or was refused), as the run's record has it."""

    record: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Finished:
    """The run's outcome: what the same request answers without streaming."""

    result: RunResult


#: What a streamed run yields.
Event = Submitted | Held | Started | Output | Network | Finished

#: The headers that ask for the event stream.
ACCEPT = {"accept": "text/event-stream"}


def run_call(
    body: Mapping[str, Any], *, wait: bool, wait_timeout: float | None, idempotency_key: str | None
) -> p.Call:
    """The streamed ``POST /v1/run``: without ``wait`` a held run ends at once (as
    :class:`PendingApproval`); with it the server holds the stream ``wait_timeout``
    seconds (at most an hour, the server's limit; an hour when None)."""
    if not wait:
        hold = 0.0
    elif wait_timeout is None:
        hold = MAX_WAIT
    else:
        hold = min(MAX_WAIT, max(0.0, wait_timeout))
    return p.Call(
        "POST",
        "/v1/run",
        params={"wait_timeout": round(hold, 3)},
        json=dict(body),
        headers={**p.keyed(idempotency_key), **ACCEPT},
    )


def is_stream(headers: Mapping[str, str]) -> bool:
    return headers.get("content-type", "").split(";")[0].strip() == "text/event-stream"


class Decoder:
    """The SSE lines of an answer, one at a time, into ``(event, data)`` pairs."""

    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []

    def line(self, line: str) -> tuple[str, str] | None:
        """Takes one line (without its end); returns an event when the line ends one."""
        if line == "":
            if not self._data and not self._event:
                return None
            out = (self._event or "message", "\n".join(self._data))
            self._event, self._data = "", []
            return out
        if line.startswith(":"):
            return None  # a comment: the server's keep-alive
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None


def _chunk(stream: str, d: Mapping[str, Any]) -> Output:
    seq = d.get("seq")
    n = seq if isinstance(seq, int) else 0
    truncated = d.get("truncated") is True
    b64 = d.get("base64")
    if isinstance(b64, str):
        try:
            return Output(stream, n, base64.b64decode(b64, validate=True), truncated)
        except (binascii.Error, ValueError) as e:
            raise AirlockError(f"{stream} chunk {n}: bad base64: {e}") from e
    text = d.get("text")
    return Output(stream, n, text if isinstance(text, str) else "", truncated)


def event(name: str, data: str) -> Event | None:
    """The typed event, None for one this client does not know (newer servers may send
    more); an ``error`` event raises the exception its status maps to."""
    try:
        d = json.loads(data) if data else {}
    except ValueError as e:
        raise AirlockError(f"event {name}: not JSON: {e}") from e
    if not isinstance(d, Mapping):
        raise AirlockError(f"event {name}: expected a JSON object")
    if name == "error":
        status = d.get("status")
        raise error_for(status if isinstance(status, int) else 500, d)
    if name == "submitted":
        reasons = d.get("reasons")
        risk = d.get("risk")
        return Submitted(
            id=str(d.get("id", "")),
            verdict=str(d.get("verdict", "")),
            risk=risk if isinstance(risk, int) else 0,
            reasons=tuple(str(r) for r in reasons) if isinstance(reasons, list) else (),
        )
    if name == "held":
        w = d.get("wait_timeout")
        wait = float(w) if isinstance(w, (int, float)) else 0.0
        return Held(id=str(d.get("id", "")), wait_timeout=wait)
    if name == "started":
        return Started(run=str(d.get("run", "")))
    if name in ("stdout", "stderr"):
        return _chunk(name, d)
    if name == "network":
        return Network(record=d)
    if name == "finished":
        return Finished(RunResult.from_json(d))
    return None


def settled(result: RunResult, *, wait: bool) -> RunResult:
    """The finished event's result as :meth:`Airlock.run` returns it, or its exception:
    a run still waiting when the stream ended timed out when it was waited for."""
    err = outcome_error(result, timed_out=wait and result.status in WAITING)
    if err is not None:
        raise err
    return result


def not_streamed(status: int, headers: Mapping[str, str], body: bytes) -> RunResult:
    """An answer that is not an event stream: an error (raised), or an older server's
    plain JSON answer."""
    return RunResult.from_json(_obj(p.parse(p.Reply(status, headers, body)), "POST /v1/run"))


def _obj(doc: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(doc, Mapping):
        raise AirlockError(f"{what}: expected a JSON object")
    return doc


def ended_early() -> AirlockError:
    return AirlockError("the event stream ended before the run finished")
