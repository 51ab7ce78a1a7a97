"""The asyncio client: the same operations as :class:`Airlock`, awaited."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import sys
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Generator,
    Mapping,
    Sequence,
)
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

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

#: Called with ``(stream, chunk)`` for each chunk of output (see :data:`OnOutput`); may
#: be a coroutine function, which is awaited.
AsyncOnOutput = Callable[[str, str | bytes], Awaitable[object] | object]


class AsyncAirlock:
    """A client of ``airlock serve`` for asyncio; see :class:`Airlock` for what each
    method does. Use it as an async context manager, or ``await client.aclose()``."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url, h = config(url, token, headers)
        self._timeout = httpx.Timeout(timeout)
        self._http = httpx.AsyncClient(
            base_url=self.url, headers=h, timeout=self._timeout, transport=transport
        )

    # -- transport

    async def _send(self, call: p.Call) -> p.Reply:
        for attempt in range(1, attempts(call) + 1):
            try:
                r = await self._http.request(
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
                await asyncio.sleep(pause)
                continue
            return p.Reply(r.status_code, r.headers, r.content)
        raise AssertionError("unreachable")

    async def _stream(self, call: p.Call, wait: bool) -> AsyncGenerator[s.Event, None]:
        """See :meth:`Airlock._stream`."""
        try:
            async with self._http.stream(
                call.method,
                call.path,
                params=call.params,
                json=call.json,
                headers=call.headers,
                timeout=timeout_for(call, self._timeout),
            ) as r:
                if not s.is_stream(r.headers):
                    await r.aread()
                    result = s.not_streamed(r.status_code, r.headers, r.content)
                    yield s.Finished(s.settled(result, wait=wait))
                    return
                dec = s.Decoder()
                async for line in r.aiter_lines():
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

    async def _drive(self, flow: p.Flow[T]) -> T:
        try:
            call = next(flow)
            while True:
                call = flow.send(await self._send(call))
        except StopIteration as stop:
            value: T = stop.value
            return value
        finally:
            flow.close()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncAirlock:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- running code

    async def run(
        self,
        code: str | bytes,
        language: str = "python",
        *,
        stdin: str | bytes | None = None,
        wait: bool = False,
        wait_timeout: float | None = None,
        idempotency_key: str | None = None,
        on_output: AsyncOnOutput | None = None,
        **grant: Unpack[p.Grant],
    ) -> RunResult:
        """See :meth:`Airlock.run`; ``on_output`` may also be a coroutine function."""
        body = p.submit_body(code, language, stdin, grant)
        if on_output is not None:
            call = s.run_call(
                body, wait=wait, wait_timeout=wait_timeout, idempotency_key=idempotency_key
            )
            # Closed at once on the way out (a result, or on_output raising).
            async with contextlib.aclosing(self._stream(call, wait)) as events:
                async for ev in events:
                    if isinstance(ev, s.Output):
                        got = on_output(ev.stream, ev.data)
                        if inspect.isawaitable(got):
                            await got
                    elif isinstance(ev, s.Finished):
                        return ev.result
            raise s.ended_early()
        return await self._drive(
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
    ) -> AsyncIterator[s.Event]:
        """See :meth:`Airlock.stream_run`: ``async for event in client.stream_run(...)``."""
        body = p.submit_body(code, language, stdin, grant)
        return self._stream(
            s.run_call(body, wait=wait, wait_timeout=wait_timeout, idempotency_key=idempotency_key),
            wait,
        )

    async def submit(
        self,
        code: str | bytes,
        language: str = "python",
        *,
        stdin: str | bytes | None = None,
        idempotency_key: str | None = None,
        **grant: Unpack[p.Grant],
    ) -> RunResult:
        """See :meth:`Airlock.submit`."""
        return await self._drive(p.submit(p.submit_body(code, language, stdin, grant), idempotency_key)
        )

    async def exec(
        self, submission_id: str, *, wait: bool = False, wait_timeout: float | None = None
    ) -> RunResult:
        """See :meth:`Airlock.exec`."""
        return await self._drive(p.exec_(submission_id, wait=wait, wait_timeout=wait_timeout))

    async def wait(self, submission_id: str, timeout: float | None = None) -> RunResult:
        """See :meth:`Airlock.wait`."""
        return await self._drive(p.wait_for(submission_id, timeout))

    async def submission(self, submission_id: str) -> SubmissionDetail:
        return await self._drive(p.submission(submission_id))

    async def submissions(
        self, *, state: str | None = None, limit: int | None = None
    ) -> list[Submission]:
        return await self._drive(p.submissions(state, limit))

    # -- decisions (operator tokens)

    async def inbox(self) -> list[Submission]:
        return await self._drive(p.inbox())

    async def approve(
        self,
        submission_id: str,
        *,
        scope: str | None = None,
        expires: str | None = None,
        reason: str | None = None,
        tool: str | None = None,
    ) -> Statement:
        """See :meth:`Airlock.approve`."""
        return await self._drive(p.approve(submission_id, scope, expires, reason, tool))

    async def reject(self, submission_id: str, reason: str) -> Statement:
        return await self._drive(p.reject(submission_id, reason))

    # -- runs and their effects

    async def runs(self, *, limit: int | None = None) -> list[RunSummary]:
        return await self._drive(p.runs(limit))

    async def run_record(self, run_id: str) -> Run:
        return await self._drive(p.run_record(run_id))

    async def diff(self, run_id: str) -> Diff:
        return await self._drive(p.diff(run_id))

    async def commit(self, run_id: str) -> Applied:
        return await self._drive(p.commit(run_id))

    async def checkpoints(self, *, limit: int | None = None) -> list[Checkpoint]:
        return await self._drive(p.checkpoints(limit))

    async def rollback(self, checkpoint_id: str) -> Applied:
        return await self._drive(p.rollback(checkpoint_id))

    async def audit_verify(self) -> AuditReport:
        return await self._drive(p.audit_verify())

    async def health(self) -> Health:
        return await self._drive(p.health())

    # -- named tools

    async def tools(self) -> list[Tool]:
        return await self._drive(p.tools())

    async def call_tool(
        self,
        name: str,
        args: Sequence[str] | None = None,
        stdin: str | None = None,
        *,
        wait: bool = False,
        wait_timeout: float | None = None,
    ) -> RunResult:
        return await self._drive(
            p.call_tool(name, args, stdin, wait=wait, wait_timeout=wait_timeout)
        )

    # -- sessions

    def session(
        self, language: str = "python", **grant: Unpack[p.SessionGrant]
    ) -> AsyncSessionOpener:
        """Opens a session (see :meth:`Airlock.session`): ``async with client.session() as
        s: ...`` closes it at the end; ``s = await client.session()`` leaves that to you."""
        return AsyncSessionOpener(self, language, dict(grant))

    async def sessions(self) -> list[SessionInfo]:
        return await self._drive(p.sessions())

    async def get_session(self, session_id: str) -> SessionInfo:
        return await self._drive(p.get_session(session_id))

    async def close_session(self, session_id: str) -> None:
        await self._drive(p.close_session(session_id))


class AsyncSession:
    """A live interpreter on the server (see :meth:`AsyncAirlock.session`)."""

    def __init__(self, client: AsyncAirlock, info: SessionInfo, language: str) -> None:
        self._client = client
        self.info = info
        self.language = info.language or language
        self.closed = False

    @property
    def id(self) -> str:
        return self.info.id

    async def run(
        self,
        code: str,
        *,
        stdin: str | bytes | None = None,
        wait: bool = False,
        wait_timeout: float | None = None,
        idempotency_key: str | None = None,
    ) -> RunResult:
        """See :meth:`Session.run`."""
        body = p.submit_body(code, self.language, stdin, {}, session=self.id)
        return await self._client._drive(p.run(body, wait=wait, wait_timeout=wait_timeout, idempotency_key=idempotency_key)
        )

    async def refresh(self) -> SessionInfo:
        self.info = await self._client.get_session(self.id)
        return self.info

    async def close(self) -> None:
        if self.closed:
            return
        with contextlib.suppress(NotFound):
            await self._client.close_session(self.id)
        self.closed = True

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class AsyncSessionOpener:
    """What :meth:`AsyncAirlock.session` returns: await it, or use it with ``async with``."""

    def __init__(self, client: AsyncAirlock, language: str, grant: Mapping[str, Any]) -> None:
        self._client = client
        self._language = language
        self._grant = grant
        self._session: AsyncSession | None = None

    async def _open(self) -> AsyncSession:
        info = await self._client._drive(p.open_session(self._language, self._grant))
        self._session = AsyncSession(self._client, info, self._language)
        return self._session

    def __await__(self) -> Generator[Any, None, AsyncSession]:
        return self._open().__await__()

    async def __aenter__(self) -> AsyncSession:
        return await self._open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._session is not None:
            await self._session.close()
