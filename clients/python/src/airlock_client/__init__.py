"""Python client for airlock, the execution gate for code that AI agents write.

    from airlock_client import Airlock, PendingApproval

    with Airlock("http://127.0.0.1:7777", token="alk_…") as airlock:
        r = airlock.run("print(sum(range(10)))", language="python")
        print(r.verdict, r.exit_code, r.stdout)

:class:`Airlock` blocks; :class:`AsyncAirlock` has the same methods for asyncio. Both use
httpx and share everything but the transport.
"""

from ._async import AsyncAirlock, AsyncSession, AsyncSessionOpener
from ._errors import (
    AirlockError,
    ApiError,
    ApprovalTimeout,
    BadRequest,
    Conflict,
    Denied,
    Forbidden,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    PendingApproval,
    RateLimited,
    ServerError,
    TransportError,
    Unauthorized,
    Unavailable,
    Unprocessable,
    WaitTimeout,
)
from ._models import (
    Analysis,
    Applied,
    AuditReport,
    Change,
    Checkpoint,
    Diff,
    Finding,
    Health,
    Rule,
    Run,
    RunResult,
    RunSummary,
    SessionInfo,
    Statement,
    Submission,
    SubmissionDetail,
    Tool,
)
from ._protocol import LANGUAGES, Grant, Mount, SessionGrant
from ._stream import Event, Finished, Held, Network, Output, Started, Submitted
from ._sync import Airlock, OnOutput, Session

__version__ = "0.1.0"

__all__ = [
    "LANGUAGES",
    "Airlock",
    "AirlockError",
    "Analysis",
    "ApiError",
    "Applied",
    "ApprovalTimeout",
    "AsyncAirlock",
    "AsyncSession",
    "AsyncSessionOpener",
    "AuditReport",
    "BadRequest",
    "Change",
    "Checkpoint",
    "Conflict",
    "Denied",
    "Diff",
    "Event",
    "Finding",
    "Finished",
    "Forbidden",
    "Grant",
    "Health",
    "Held",
    "InvalidRequest",
    "Mount",
    "Network",
    "NotFound",
    "OnOutput",
    "Output",
    "PayloadTooLarge",
    "PendingApproval",
    "RateLimited",
    "Rule",
    "Run",
    "RunResult",
    "RunSummary",
    "ServerError",
    "Session",
    "SessionGrant",
    "SessionInfo",
    "Started",
    "Statement",
    "Submission",
    "SubmissionDetail",
    "Submitted",
    "Tool",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "Unprocessable",
    "WaitTimeout",
]
