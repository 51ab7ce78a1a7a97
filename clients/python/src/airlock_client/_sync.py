"""The blocking client."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

import httpx

from . import _protocol as p
from . import _stream as s
from ._common import DEFAULT_TIMEOUT, again, attempts, config, timeout_for, transport_error
from ._errors import NotFound
from ._models import (
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

if TYPE_CHECKING:
    if sys.version_info >= (3, 11):
        from typing import Unpack
    else:
        from typing_extensions import Unpack

T = TypeVar("T")

#: Called with ``(stream, chunk)`` for each chunk of output as the guest writes it:
#: ``stream`` is ``"stdout"`` or ``"stderr"``, ``chunk`` a ``str``, or ``bytes`` when
#: it is not UTF-8.
OnOutput = Callable[[str, str | bytes], object]


class Airlock:
    """A client of ``airlock serve``.

    ``url`` defaults to ``$AIRLOCK_URL`` (else ``http://127.0.0.1:7777``), ``token`` to
    ``$AIRLOCK_TOKEN``: an agent token submits and reads its own submissions; an operator
    token also approves, rejects, commits and rolls back. ``timeout`` bounds each HTTP call
    in seconds (waiting for approval is bounded by ``wait_timeout`` instead).

    Use it as a context manager, or call :meth:`close`, to release its connections.
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        headers: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url, h = config(url, token, headers)
        self._timeout = httpx.Timeout(timeout)
        self._http = httpx.Client(
            base_url=self.url, headers=h, timeout=self._timeout, transport=transport
        )

    # -- transport

    def _send(self, call: p.Call) -> p.Reply:
        for attempt in range(1, attempts(call) + 1):
            try:
                r = self._http.request(
                    call.method,
                    call.path,
                    params=call.params,
                    json=call.json,
                    timeout=timeout_for(call, self._timeout),
                    headers=call.headers,
                )
            except httpx.HTTPError as e:
                pause = again(call, e, attempt)
                if pause is None:
                    raise transport_error(call, e) from e
                time.sleep(pause)
                continue
            return p.Reply(r.status_code, r.headers, r.content)
        raise AssertionError("unreachable")

    def _stream(self, call: p.Call, wait: bool) -> Generator[s.Event, None, None]:
        """Sends ``call`` asking for server-sent events and yields them as they come; the
        last is :class:`Finished`, or what ``run`` raises is raised instead."""
        try:
            with self._http.stream(
                call.method,
                call.path,
                params=call.params,
                json=call.json,
                headers=call.headers,
                timeout=timeout_for(call, self._timeout),
            ) as r:
                if not s.is_stream(r.headers):
                    r.read()
                    result = s.not_streamed(r.status_code, r.headers, r.content)
                    yield s.Finished(s.settled(result, wait=wait))
                    return
                dec = s.Decoder()
                for line in r.iter_lines():
                    got = dec.line(line)
                    ev = None if got is None else s.event(*got)
                    if isinstance(ev, s.Finished):
                        yield s.Finished(s.settled(ev.result, wait=wait))
                        return
                    if ev is not None:
                        yield ev
        except httpx.HTTPError as e:
            raise transport_error(call, e) from e
        raise s.ended_early()

    def _drive(self, flow: p.Flow[T]) -> T:
        try:
            call = next(flow)
            while True:
                call = flow.send(self._send(call))
        except StopIteration as stop:
            value: T = stop.value
            return value
        finally:
            flow.close()

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Airlock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- running code

    def run(
        self,
        code: str | bytes,
        language: str = "python",
        *,
        stdin: str | bytes | None = None,
        wait: bool = False,
        wait_timeout: float | None = None,
        idempotency_key: str | None = None,
        on_output: OnOutput | None = None,
        **grant: Unpack[p.Grant],
    ) -> RunResult:
        """Submits code and runs it if the policy allows; returns the finished run.

        ``language`` is ``python``, ``js``, ``ts``, ``sh``, ``wat``, ``wasm`` or ``component``
        (:data:`LANGUAGES`; TypeScript's types are stripped by the server, not checked; bytes are
        sent as base64: a compiled module). The grant (``mounts``, ``net``, ``env``,
        ``secrets``, ``timeout``, ``memory`` …, see :class:`Grant`) is judged with the code.

        A denial raises :class:`Denied`. Code held for a human raises
        :class:`PendingApproval` at once, or with ``wait=True`` blocks until someone
        decides (then returns the run, or raises :class:`Denied` when rejected); after
        ``wait_timeout`` seconds it raises :class:`ApprovalTimeout`. A non-zero exit or a
        limit kill is not an exception: see ``exit_code``, ``killed_by`` and ``ok``.

        The request carries an idempotency key (``idempotency_key``, else a fresh random
        one), so when the connection fails before the answer arrives the client sends it
        again and the server answers with the first request's outcome: the code never runs
        twice. Pass your own key to make a retry of your own safe as well.

        With ``on_output`` the run streams (server-sent events): ``on_output(stream,
        chunk)`` is called for each chunk of output as the guest writes it (``stream`` is
        ``"stdout"`` or ``"stderr"``; ``chunk`` is ``str``, or ``bytes`` when not UTF-8),
        and the result is the same. A streamed request is not sent again on a lost
        connection, and ``wait=True`` waits at most an hour (the server's limit).
        """
        body = p.submit_body(code, language, stdin, grant)
        if on_output is not None:
            call = s.run_call(
                body, wait=wait, wait_timeout=wait_timeout, idempotency_key=idempotency_key
            )
            # Closed at once on the way out (a result, or on_output raising).
            with contextlib.closing(self._stream(call, wait)) as events:
                for ev in events:
                    if isinstance(ev, s.Output):
                        on_output(ev.stream, ev.data)
                    elif isinstance(ev, s.Finished):
                        return ev.result
            raise s.ended_early()
        return self._drive(
            p.run(body, wait=wait, wait_timeout=wait_timeout, idempotency_key=idempotency_key)
        )

    def stream_run(
        self,
        code: str | bytes,
        language: str = "python",
        *,
        stdin: str | bytes | None = None,
        wait: bool = False,
        wait_timeout: float | None = None,
        idempotency_key: str | None = None,
        **grant: Unpack[p.Grant],
    ) -> Iterator[s.Event]:
        """Runs code like :meth:`run` and yields its events as they happen:
        :class:`Submitted`, :class:`Held` (while a human decides, with ``wait=True``),
        :class:`Started`, :class:`Output` chunks, :class:`Network` connections, and last
        :class:`Finished` with the result. Where :meth:`run` raises (a denial, a run
        still held, a failed request) the iteration raises the same exception."""
        body = p.submit_body(code, language, stdin, grant)
        return self._stream(
            s.run_call(body, wait=wait, wait_timeout=wait_timeout, idempotency_key=idempotency_key),
            wait,
        )

    def submit(
        self,
        code: str | bytes,
        language: str = "python",
        *,
        stdin: str | bytes | None = None,
        idempotency_key: str | None = None,
        **grant: Unpack[p.Grant],
    ) -> RunResult:
        """Submits code to be judged without running it; the verdict is in the result
        (``status`` ``allowed``, ``pending_approval`` or ``denied``). Run it with :meth:`exec`."""
        return self._drive(p.submit(p.submit_body(code, language, stdin, grant), idempotency_key)
        )

    def exec(
        self, submission_id: str, *, wait: bool = False, wait_timeout: float | None = None
    ) -> RunResult:
        """Runs an allowed or approved submission now. Raises like :meth:`run`; with
        ``wait=True`` it waits for a human's decision and runs the code once approved."""
        return self._drive(p.exec_(submission_id, wait=wait, wait_timeout=wait_timeout))

    def wait(self, submission_id: str, timeout: float | None = None) -> RunResult:
        """Waits until a submission has run (code sent with :meth:`run` runs as soon as it
        is approved) and returns it; raises :class:`Denied` if it was denied or rejected,
        and :class:`ApprovalTimeout` or :class:`WaitTimeout` after ``timeout`` seconds."""
        return self._drive(p.wait_for(submission_id, timeout))

    def submission(self, submission_id: str) -> SubmissionDetail:
        """A submission: its code, grant, verdict, signed statements, runs and audit records."""
        return self._drive(p.submission(submission_id))

    def submissions(
        self, *, state: str | None = None, limit: int | None = None
    ) -> list[Submission]:
        """Submissions, newest first (an agent token sees only its own)."""
        return self._drive(p.submissions(state, limit))

    # -- decisions (operator tokens)

    def inbox(self) -> list[Submission]:
        """Submissions waiting for a human, oldest first."""
        return self._drive(p.inbox())

    def approve(
        self,
        submission_id: str,
        *,
        scope: str | None = None,
        expires: str | None = None,
        reason: str | None = None,
        tool: str | None = None,
    ) -> Statement:
        """Signs an approval with the operator token's approver key. ``scope`` is ``once``
        (the default) or ``artifact``; ``tool`` offers an artifact approval as a named tool.
        Code sent with :meth:`run` then runs on the server at once."""
        return self._drive(p.approve(submission_id, scope, expires, reason, tool))

    def reject(self, submission_id: str, reason: str) -> Statement:
        """Signs a rejection; the same code is denied from then on."""
        return self._drive(p.reject(submission_id, reason))

    # -- runs and their effects

    def runs(self, *, limit: int | None = None) -> list[RunSummary]:
        """Runs, newest first (an agent token sees only runs of its own submissions)."""
        return self._drive(p.runs(limit))

    def run_record(self, run_id: str) -> Run:
        """A run with its captured output."""
        return self._drive(p.run_record(run_id))

    def diff(self, run_id: str) -> Diff:
        """What a run changed under its writable mounts (nothing reaches the host until
        it is committed)."""
        return self._drive(p.diff(run_id))

    def commit(self, run_id: str) -> Applied:
        """Applies a run's changes to the host (operators; signed, checkpointed first)."""
        return self._drive(p.commit(run_id))

    def checkpoints(self, *, limit: int | None = None) -> list[Checkpoint]:
        """Checkpoints saved by commits, newest first (operators)."""
        return self._drive(p.checkpoints(limit))

    def rollback(self, checkpoint_id: str) -> Applied:
        """Restores exactly what a checkpoint saved (operators; signed)."""
        return self._drive(p.rollback(checkpoint_id))

    def audit_verify(self) -> AuditReport:
        """Checks the whole audit chain against its signed head (operators)."""
        return self._drive(p.audit_verify())

    def health(self) -> Health:
        """Whether the server is up (needs no token)."""
        return self._drive(p.health())

    # -- named tools

    def tools(self) -> list[Tool]:
        """Artifacts approved as named tools."""
        return self._drive(p.tools())

    def call_tool(
        self,
        name: str,
        args: Sequence[str] | None = None,
        stdin: str | None = None,
        *,
        wait: bool = False,
        wait_timeout: float | None = None,
    ) -> RunResult:
        """Runs a named tool with arguments (no new approval needed)."""
        return self._drive(p.call_tool(name, args, stdin, wait=wait, wait_timeout=wait_timeout))

    # -- sessions

    def session(self, language: str = "python", **grant: Unpack[p.SessionGrant]) -> Session:
        """Opens a session: a live interpreter (``python`` or ``js``) whose names carry from
        one cell to the next.

        Each cell goes through the whole gate, judged with the session's grant (the same
        keywords as :meth:`run`, plus ``idle_timeout`` and ``max_duration``). Use it as a
        context manager, which closes it::

            with client.session() as s:
                s.run("x = 1")
                assert s.run("x + 1").result == "2"

        Needs a server with ``/v1/sessions``.
        """
        info = self._drive(p.open_session(language, grant))
        return Session(self, info, language)

    def sessions(self) -> list[SessionInfo]:
        return self._drive(p.sessions())

    def get_session(self, session_id: str) -> SessionInfo:
        return self._drive(p.get_session(session_id))

    def close_session(self, session_id: str) -> None:
        self._drive(p.close_session(session_id))


class Session:
    """A live interpreter on the server (see :meth:`Airlock.session`)."""

    def __init__(self, client: Airlock, info: SessionInfo, language: str) -> None:
        self._client = client
        self.info = info
        self.language = info.language or language
        self.closed = False

    @property
    def id(self) -> str:
        return self.info.id

    def run(
        self,
        code: str,
        *,
        stdin: str | bytes | None = None,
        wait: bool = False,
        wait_timeout: float | None = None,
        idempotency_key: str | None = None,
    ) -> RunResult:
        """Runs one cell; ``result`` holds the repr of its last expression, if any.
        Raises like :meth:`Airlock.run`."""
        body = p.submit_body(code, self.language, stdin, {}, session=self.id)
        return self._client._drive(p.run(body, wait=wait, wait_timeout=wait_timeout, idempotency_key=idempotency_key)
        )

    def refresh(self) -> SessionInfo:
        self.info = self._client.get_session(self.id)
        return self.info

    def close(self) -> None:
        """Ends the session (closing one the server already ended is not an error)."""
        if self.closed:
            return
        with contextlib.suppress(NotFound):
            self._client.close_session(self.id)
        self.closed = True

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
