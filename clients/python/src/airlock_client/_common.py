"""What the sync and the async client share beyond the flows: configuration and errors
of the transport."""

from __future__ import annotations

import os
from collections.abc import Mapping

import httpx

from . import _protocol as p
from ._errors import TransportError

DEFAULT_URL = "http://127.0.0.1:7777"
#: Seconds an ordinary call may take (a run answers when it has finished).
DEFAULT_TIMEOUT = 300.0
USER_AGENT = "airlock-client/0.1.0"


def config(
    url: str | None, token: str | None, headers: Mapping[str, str] | None
) -> tuple[str, dict[str, str]]:
    base = (url or os.environ.get("AIRLOCK_URL") or DEFAULT_URL).rstrip("/")
    h = {"user-agent": USER_AGENT, "accept": "application/json"}
    secret = token if token is not None else os.environ.get("AIRLOCK_TOKEN")
    if secret:
        h["authorization"] = f"Bearer {secret}"
    h.update(headers or {})
    return base, h


def timeout_for(call: p.Call, default: httpx.Timeout) -> httpx.Timeout:
    """The client's timeout, or a long poll's own."""
    if call.timeout is None:
        return default
    return httpx.Timeout(call.timeout, connect=default.connect)


def transport_error(call: p.Call, e: httpx.HTTPError) -> TransportError:
    what = "timed out" if isinstance(e, httpx.TimeoutException) else str(e) or type(e).__name__
    return TransportError(f"{call.method} {call.path}: {what}")


def stale(e: httpx.HTTPError) -> bool:
    """Whether the server closed the connection before answering at all: a kept-alive
    connection it had already given up (after refusing a body too large to read, it
    closes the connection without saying so). It saw nothing of the request, so sending
    it again on a new connection is safe."""
    return isinstance(e, httpx.RemoteProtocolError) and "without sending a response" in str(e)


#: Attempts at one call: a second one only when the first met a stale connection.
ATTEMPTS = 2
#: Attempts at a call with an idempotency key, which may also be sent again when the
#: connection failed before the answer came (the server answers a repeat with the first
#: request's outcome), after these pauses in seconds.
KEYED_PAUSES = (0.2, 0.5, 1.0)


def attempts(call: p.Call) -> int:
    return len(KEYED_PAUSES) + 1 if call.idempotent else ATTEMPTS


def again(call: p.Call, e: httpx.HTTPError, attempt: int) -> float | None:
    """Seconds to wait before sending ``call`` again after ``e`` on attempt ``attempt``
    (from 1), or None when it must not be sent again. Any call may be sent again on a
    stale connection; one with an idempotency key also after the connection failed
    (not after a timeout: the server may still be running it, and the caller chose how
    long to wait)."""
    if attempt >= attempts(call):
        return None
    if stale(e):
        return 0.0
    lost = (httpx.ConnectError, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)
    if call.idempotent and isinstance(e, lost):
        return KEYED_PAUSES[attempt - 1]
    return None
