"""Kerman's exception hierarchy.

Every error Kerman raises derives from :class:`KermanError`; families mirror the core's
subsystems. Exceptions raised by user code (observers, listeners, models, tools) are never
wrapped: they reach the caller unchanged.
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = [
    "KermanError",
    "InvalidMessageError",
    "InboxError",
    "DuplicateMessageError",
    "ProjectionError",
    "LogError",
    "NotJsonError",
    "ReentrantAppendError",
    "CorruptLogError",
    "UnsupportedFormatError",
    "SessionLockedError",
    "SessionNotFoundError",
    "SessionExistsError",
    "LogClosedError",
    "LogWriteError",
    "LeaseLostError",
    "LoopError",
    "TurnAborted",
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

    def __init__(self, message: str, path: Optional[str] = None, line: Optional[int] = None,
                 seq: Optional[int] = None) -> None:
        super().__init__(message)
        self.path = path
        self.line = line
        self.seq = seq


class UnsupportedFormatError(LogError):
    """A log written in a format version this build does not read."""

    def __init__(self, message: str, path: Optional[str] = None, found: Optional[int] = None,
                 supported: Optional[int] = None) -> None:
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


class LogClosedError(LogError):
    """The log was closed; nothing more can be appended."""


class LogWriteError(LogError, OSError):
    """A write or fsync failed. The log is poisoned until it is reopened and re-verified."""


class LeaseLostError(LogError):
    """Another owner took the session over (PostgresStore): this log's appends are fenced out
    by the newer lease epoch. The log is poisoned; reopen the session to continue."""


class LoopError(KermanError):
    """Misuse of an AgentLoop (wrong thread, no event loop, unknown turn...)."""


class TurnAborted(KermanError):
    """Raised by ``Signal.raise_if_aborted()``; ``reason`` is the cancel cause dict."""

    def __init__(self, reason: Any = None) -> None:
        super().__init__(f"turn aborted: {reason!r}")
        self.reason = reason


class ModelError(KermanError):
    """A model call failed. Models raise it; ``request_error`` listeners may retry."""

    def __init__(self, message: str, code: str = "UNKNOWN", status: Optional[int] = None,
                 retry_after_ms: Optional[int] = None, request_id: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.retry_after_ms = retry_after_ms
        self.request_id = request_id
