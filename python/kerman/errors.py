"""Kerman's exception hierarchy.

Every error Kerman raises derives from :class:`KermanError`; families mirror the core's
subsystems. Exceptions raised by user code (observers, listeners, models, tools) are never
wrapped: they reach the caller unchanged.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

__all__ = [
    "KermanError",
    "InvalidMessageError",
    "InboxError",
    "DuplicateMessageError",
    "InsertRefusedError",
    "ProjectionError",
    "LogError",
    "NotJsonError",
    "ReentrantAppendError",
    "CorruptLogError",
    "UnsupportedFormatError",
    "SessionLockedError",
    "SessionNotFoundError",
    "SessionExistsError",
    "SessionHasForksError",
    "LogClosedError",
    "LogWriteError",
    "LeaseLostError",
    "LoopError",
    "DecisionError",
    "BusyError",
    "TurnAborted",
    "InvalidToolArgumentsError",
    "ModelError",
]


class KermanError(Exception):
    """Base class of every error Kerman raises."""


class InvalidMessageError(KermanError, ValueError):
    """A message of the wrong shape, or whose content or source is not lossless JSON.

    ``field`` names the offending part, e.g. ``"content[0].text"``.
    """

    def __init__(self, message: str, field: Optional[str] = None) -> None:
        super().__init__(message)
        self.field = field


class InboxError(KermanError):
    """An inbox mutation that cannot be applied."""


class DuplicateMessageError(InboxError, ValueError):
    """The inserted message's id is already pending: ``message "<id>" is already pending``."""

    def __init__(self, message: str, message_id: Optional[str] = None) -> None:
        super().__init__(message)
        self.message_id = message_id


class InsertRefusedError(InboxError):
    """An insert transform refused a message (it returned ``kerman.Refuse(reason)``): nothing
    was inserted, and the inbox and the log are as they were. ``.transform`` is the
    transform's name, ``.reason`` its reason, ``.message_id`` the refused message's id and
    ``.target`` the list it was going to."""

    def __init__(
        self,
        message: str,
        transform: Optional[str] = None,
        reason: Optional[str] = None,
        message_id: Optional[str] = None,
        target: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.transform = transform
        self.reason = reason
        self.message_id = message_id
        self.target = target


class ProjectionError(KermanError):
    """A persisted inbox splice that cannot be replayed; ``seq`` is where."""

    def __init__(self, message: str, seq: Optional[int] = None) -> None:
        super().__init__(message)
        self.seq = seq


class LogError(KermanError):
    """A session log or store failure."""


class NotJsonError(LogError, ValueError):
    """Event data that is not lossless JSON (NaN, sets, tuples, objects, non-str keys...)."""


class ReentrantAppendError(LogError):
    """An append from inside an observer of the same log."""


class CorruptLogError(LogError):
    """An invalid record followed by valid ones: committed data is damaged. Nothing was modified.

    ``path`` is the file, ``line`` the 1-based line (the header is line 1) and ``seq`` the seq
    expected there. ``kerman log repair`` repairs it, keeping every record that verifies at its
    seq (docs/format.md, "Repairing corruption") and a ``.corrupt`` copy.
    """

    def __init__(self, message: str, path: Optional[str] = None, line: Optional[int] = None, seq: Optional[int] = None) -> None:
        super().__init__(message)
        self.path = path
        self.line = line
        self.seq = seq


class UnsupportedFormatError(LogError):
    """A log written in a format version this build does not read."""

    def __init__(self, message: str, path: Optional[str] = None, found: Optional[int] = None, supported: Optional[int] = None) -> None:
        super().__init__(message)
        self.path = path
        self.found = found
        self.supported = supported


class SessionLockedError(LogError):
    """Another process or handle owns the session."""


class SessionNotFoundError(LogError, LookupError):
    """No session with that id."""


class SessionExistsError(LogError):
    """``create()`` of an id that already exists."""


class SessionHasForksError(LogError):
    """``delete()`` of a session that forks read their first events from (docs/context.md,
    "Forks"): delete them first. ``forks`` names them, sorted."""

    def __init__(self, message: str, forks: Optional[list[str]] = None) -> None:
        super().__init__(message)
        self.forks = list(forks or [])


class LogClosedError(LogError):
    """The log was closed; nothing more can be appended."""


class LogWriteError(LogError, OSError):
    """A write or fsync failed. The log is poisoned until it is reopened and re-verified."""


class LeaseLostError(LogError):
    """Another owner took the session over (PostgresStore): this log's appends are fenced out
    by the newer lease epoch. The log is poisoned; reopen the session to continue."""


class LoopError(KermanError):
    """Misuse of an AgentLoop (wrong thread, no event loop, unknown turn...)."""


class BusyError(LoopError):
    """A followup sent with ``on_busy="reject"`` while a turn was running (or waiting for
    decisions): nothing was queued. ``session_id`` and ``turn`` name the session and its
    running turn."""

    def __init__(self, message: str, session_id: Optional[str] = None, turn: Optional[int] = None) -> None:
        super().__init__(message)
        self.session_id = session_id
        self.turn = turn


class DecisionError(LoopError):
    """``loop.decide`` refused a decision; ``reason`` says why: ``"unknown"`` (no such request),
    ``"resolved"`` (decided already, with another key), ``"expired"`` (its deadline passed) or
    ``"invalid"`` (the decision does not answer the request: an answer to an approval, say)."""

    def __init__(self, message: str, reason: str = "invalid") -> None:
        super().__init__(message)
        self.reason = reason


class TurnAborted(KermanError):
    """Raised by ``Signal.raise_if_aborted()``; ``reason`` is the cancel cause dict."""

    def __init__(self, reason: Any = None) -> None:
        super().__init__(f"turn aborted: {reason!r}")
        self.reason = reason


class InvalidToolArgumentsError(KermanError, ValueError):
    """A tool call's arguments do not fit the tool's parameters. A typed tool raises it before
    its body runs; like arguments that are not JSON, the model gets an error result
    ``invalid tool arguments: …`` with ``error {"name": "ValueError", "code":
    "INVALID_ARGUMENTS"}``, and nothing is reported as a bug (the model's mistake, not
    yours). A legacy ``(args, ctx)`` tool may raise it too."""


class ModelError(KermanError):
    """A model call failed. Models raise it; ``request_error`` listeners may retry.

    ``failed_attempts``: when a model made several requests for one call (a non-streaming
    ``Fallback``), the failed ``finish`` chunk of each that failed, this failure's own included
    (``ModelReply.failed_attempts`` has the shape). The loop logs them, each a request of its
    own, and then no failed ``finish`` of its own for this failure."""

    #: Empty: the loop ends the failed request with a failed ``finish`` chunk of its own.
    failed_attempts: Sequence[Dict[str, Any]] = ()

    def __init__(
        self,
        message: str,
        code: str = "UNKNOWN",
        status: Optional[int] = None,
        retry_after_ms: Optional[int] = None,
        request_id: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.retry_after_ms = retry_after_ms
        self.request_id = request_id


# -- model provider failures (kerman.providers) ---------------------------------------------------
# Each is a ModelError, so the loop routes it to the ``request_error`` waterfall like any other
# model failure. ``code`` says what happened in one word the retry policy reads; the class is for
# ``except`` clauses. docs/providers.md ("Errors and retries") has the table.


class RateLimitError(ModelError):
    """HTTP 429: too many requests (``RATE_LIMITED``) or an exhausted quota (``QUOTA_EXCEEDED``,
    which waiting does not fix). ``retry_after_ms`` is the server's ``retry-after``, if sent."""

    def __init__(
        self,
        message: str,
        code: str = "RATE_LIMITED",
        status: Optional[int] = None,
        retry_after_ms: Optional[int] = None,
        request_id: Optional[str] = None,
    ) -> None:
        super().__init__(message, code, status, retry_after_ms, request_id)


class ServerError(ModelError):
    """The provider failed on its side: HTTP 5xx (``SERVER_ERROR``), 409 (``CONFLICT``), or an
    error event in the stream that names a server fault."""

    def __init__(
        self,
        message: str,
        code: str = "SERVER_ERROR",
        status: Optional[int] = None,
        retry_after_ms: Optional[int] = None,
        request_id: Optional[str] = None,
    ) -> None:
        super().__init__(message, code, status, retry_after_ms, request_id)


class OverloadedError(ServerError):
    """The provider is overloaded (HTTP 503 or 529, or an ``overloaded_error`` event): ``OVERLOADED``."""

    def __init__(
        self,
        message: str,
        code: str = "OVERLOADED",
        status: Optional[int] = None,
        retry_after_ms: Optional[int] = None,
        request_id: Optional[str] = None,
    ) -> None:
        super().__init__(message, code, status, retry_after_ms, request_id)


class ModelTimeoutError(ModelError):
    """The request timed out (the client's timeout, or HTTP 408): ``TIMEOUT``."""

    def __init__(
        self,
        message: str,
        code: str = "TIMEOUT",
        status: Optional[int] = None,
        retry_after_ms: Optional[int] = None,
        request_id: Optional[str] = None,
    ) -> None:
        super().__init__(message, code, status, retry_after_ms, request_id)


class ModelConnectionError(ModelError):
    """No answer could be read: the connection failed (``CONNECTION_ERROR``), or the stream ended
    before the reply did (``STREAM_INTERRUPTED``)."""

    def __init__(
        self,
        message: str,
        code: str = "CONNECTION_ERROR",
        status: Optional[int] = None,
        retry_after_ms: Optional[int] = None,
        request_id: Optional[str] = None,
    ) -> None:
        super().__init__(message, code, status, retry_after_ms, request_id)


class ContextLengthError(ModelError):
    """The request does not fit the model's context window: ``CONTEXT_LENGTH_EXCEEDED``."""

    def __init__(
        self,
        message: str,
        code: str = "CONTEXT_LENGTH_EXCEEDED",
        status: Optional[int] = None,
        retry_after_ms: Optional[int] = None,
        request_id: Optional[str] = None,
    ) -> None:
        super().__init__(message, code, status, retry_after_ms, request_id)


class AuthenticationError(ModelError):
    """HTTP 401 (``AUTHENTICATION_FAILED``: a missing or wrong key) or 403 (``PERMISSION_DENIED``).
    The message never contains the key."""

    def __init__(
        self,
        message: str,
        code: str = "AUTHENTICATION_FAILED",
        status: Optional[int] = None,
        retry_after_ms: Optional[int] = None,
        request_id: Optional[str] = None,
    ) -> None:
        super().__init__(message, code, status, retry_after_ms, request_id)


class InvalidRequestError(ModelError):
    """The provider refused the request as written: HTTP 400/422 (``BAD_REQUEST``), 404
    (``NOT_FOUND``, e.g. an unknown model). Sending it again does not help."""

    def __init__(
        self,
        message: str,
        code: str = "BAD_REQUEST",
        status: Optional[int] = None,
        retry_after_ms: Optional[int] = None,
        request_id: Optional[str] = None,
    ) -> None:
        super().__init__(message, code, status, retry_after_ms, request_id)


__all__ += [
    "RateLimitError",
    "ServerError",
    "OverloadedError",
    "ModelTimeoutError",
    "ModelConnectionError",
    "ContextLengthError",
    "AuthenticationError",
    "InvalidRequestError",
]
