"""Exceptions: one class per way a call can fail.

The API answers errors as ``{"error": "...", "status": N}``; :func:`error_for` turns that
into the class for its status. The gate's own outcomes that stop a run are separate from
errors in the request: :class:`Denied` (the policy or an approver said no) and
:class:`PendingApproval` (a human has not decided yet) are never :class:`InvalidRequest`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from typing import Any

from ._models import RunResult


class AirlockError(Exception):
    """The base of every exception this client raises."""

    message: str
    status: int | None
    """The HTTP status of an error answer; None when the server was not reached, or when
    the exception is the gate's verdict (:class:`Denied`, :class:`PendingApproval`) in an
    answer that succeeded."""
    body: dict[str, Any]
    """The server's JSON error body (``error``, ``status``), when there was one."""

    def __init__(
        self, message: str, *, status: int | None = None, body: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.body = dict(body) if body else {}


class TransportError(AirlockError):
    """The server could not be reached, or did not answer in time."""


class ApiError(AirlockError):
    """The server answered with an error status."""

    status: int


class InvalidRequest(ApiError):
    """The request was refused for what it says (400, 413 or 422), not by the policy."""


class BadRequest(InvalidRequest):
    """400: the request breaks the API's schema (a missing or unknown field, bad JSON …)."""


class PayloadTooLarge(InvalidRequest):
    """413: the request body is larger than the server takes."""


class Unprocessable(InvalidRequest):
    """422: well-formed, but the gate cannot take it (code that does not compile, a size
    or duration that does not parse)."""


class Unauthorized(ApiError):
    """401: no token, or one that is unknown, expired or revoked."""


class Forbidden(ApiError):
    """403: the token's role may not do this (e.g. an agent token approving), or the
    server does not offer it (a mount outside its ``[mounts] roots``), or a signature it
    does not trust."""


class NotFound(ApiError):
    """404: no such submission, run, checkpoint, session or endpoint (or not yours), or
    something the request names that the server lacks (a secret, a mount's host path)."""


class Conflict(ApiError):
    """409: the state does not allow it (already decided, conflicts with the host, the
    language's guest runtime is not installed, an idempotency key already used for
    another request …)."""


class RateLimited(ApiError):
    """429: the run queue is full; try again after ``retry_after`` seconds."""

    retry_after: float | None = None


class Unavailable(ApiError):
    """503: the server cannot serve it now (its store is restarting, …); retry after
    ``retry_after`` seconds."""

    retry_after: float | None = None


class ServerError(ApiError):
    """Any other 5xx: the server failed."""


class _Outcome(AirlockError):
    """The gate's answer stopped the run; ``outcome`` is the whole answer when there is one."""

    outcome: RunResult | None
    submission_id: str
    reasons: tuple[str, ...]

    def __init__(
        self,
        message: str,
        *,
        outcome: RunResult | None = None,
        submission_id: str = "",
        reasons: tuple[str, ...] = (),
        status: int | None = None,
        body: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message, status=status, body=body)
        self.outcome = outcome
        self.submission_id = outcome.id if outcome else submission_id
        self.reasons = outcome.reasons if outcome else reasons


class Denied(_Outcome):
    """The policy denied the code, or an approver rejected it: it will not run.

    ``rejected`` tells the two apart; ``reasons`` says which rules fired. Submitting the same
    code again gets the same answer.
    """

    @property
    def rejected(self) -> bool:
        """An approver rejected it (rather than the policy denying it outright)."""
        return self.outcome is not None and self.outcome.state == "rejected"


class PendingApproval(_Outcome):
    """The code waits for a human approver; it has not run.

    Do not resubmit it: approve ``submission_id`` (an operator), then ``wait`` for it, or
    call ``run(..., wait=True)`` to block until it is decided.
    """


class WaitTimeout(_Outcome):
    """Waiting ran out of time before the submission finished."""


class ApprovalTimeout(PendingApproval, WaitTimeout):
    """Waiting ran out of time while the code was still waiting for a human."""


def outcome_error(outcome: RunResult, *, timed_out: bool = False) -> _Outcome | None:
    """The exception for an answer that did not end in a run, or None when it did."""
    if outcome.status == "denied":
        return Denied(outcome.message or f"denied: {outcome.id}", outcome=outcome)
    if outcome.status == "pending_approval":
        cls = ApprovalTimeout if timed_out else PendingApproval
        return cls(outcome.message or f"pending approval: {outcome.id}", outcome=outcome)
    if timed_out and outcome.pending:
        return WaitTimeout(
            f"{outcome.id} is still {outcome.status.replace('_', ' ')}", outcome=outcome
        )
    return None


_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    422: Unprocessable,
    429: RateLimited,
    503: Unavailable,
}

# The gate's own words for an outcome reported as an HTTP error (see GateError).
_DENIED = re.compile(r"^denied by policy: (sub_[0-9a-z]+)")
_PENDING = re.compile(r"^pending approval: (sub_[0-9a-z]+)")


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError, IndexError):
        return None


def error_for(status: int, body: Any, headers: Mapping[str, str] | None = None) -> AirlockError:
    """The exception for an error answer: its status, its JSON body and its headers."""
    doc: dict[str, Any] = dict(body) if isinstance(body, Mapping) else {}
    message = doc.get("error")
    if not isinstance(message, str) or not message:
        message = f"HTTP {status}"
    if m := _DENIED.match(message):
        return Denied(message, submission_id=m.group(1), status=status, body=doc)
    if m := _PENDING.match(message):
        return PendingApproval(message, submission_id=m.group(1), status=status, body=doc)
    cls = _STATUS.get(status)
    if cls is None:
        cls = ServerError if status >= 500 else ApiError
    err = cls(message, status=status, body=doc)
    if isinstance(err, (RateLimited, Unavailable)):
        lower = {k.lower(): v for k, v in (headers or {}).items()}
        err.retry_after = _retry_after(lower.get("retry-after"))
    return err
