"""Kerman: a durable agent loop built on one append-only session log.

The log is the single source of truth; the inbox and every projection are folds of it.
See ``docs/`` (https://github.com/kerman-project/kerman/tree/main/docs) for the model in full.
"""

# Private names only: whatever this module imports shows in dir(kerman).
import atexit as _atexit

from . import _core, errors, models, output
from . import events as events  # the typed views of the log: kerman.events.view(event)
from ._core import (
    FORMAT_VERSION,
    NEXT_STEP,
    NEXT_TURN,
    SPLICED,
    AssistantMessage,
    ConsumedWork,
    Event,
    FileStore,
    Inbox,
    InboxProjection,
    MemoryStore,
    Message,
    PostgresStore,
    SessionLog,
    ToolResultMessage,
    Transcript,
    UserMessage,
    __version__,
    consumed_work,
)
from ._run import RunError, RunResult
from .decisions import Answer, Approve, Ask, Deny, Edit, InputRequired, PendingDecision, ToolCall
from .errors import (
    BusyError,
    CorruptLogError,
    DecisionError,
    DuplicateMessageError,
    InboxError,
    InsertRefusedError,
    InvalidMessageError,
    InvalidToolArgumentsError,
    KermanError,
    LeaseLostError,
    LogClosedError,
    LogError,
    LogWriteError,
    LoopError,
    ModelError,
    NotJsonError,
    ProjectionError,
    ReentrantAppendError,
    SessionExistsError,
    SessionHasForksError,
    SessionLockedError,
    SessionNotFoundError,
    TurnAborted,
    UnsupportedFormatError,
)
from .loop import AgentLoop, TurnStillRunningWarning
from .output import OutputValidationError
from .types import (
    BeforeRequestListener,
    Decision,
    Enter,
    InsertTransform,
    LiveEvent,
    ModelReply,
    ModelRequest,
    Next,
    PreStep,
    PreStepListener,
    Refuse,
    Reject,
    RequestErrorListener,
    RequestFailure,
    Retry,
    Signal,
    Target,
    Tool,
    ToolContext,
    ToolResult,
    TurnStopping,
)
from .usage import Budget
from .worker import Worker

__all__ = [
    # the loop
    "AgentLoop",
    "RunResult",
    "Budget",
    "RunError",
    "OutputValidationError",
    "Enter",
    "Reject",
    "Retry",
    "Refuse",
    "Decision",
    "Next",
    "PreStepListener",
    "BeforeRequestListener",
    "RequestErrorListener",
    "InsertTransform",
    "Target",
    "PreStep",
    "ModelRequest",
    "ModelReply",
    "RequestFailure",
    "TurnStopping",
    "Signal",
    "Tool",
    "ToolContext",
    "ToolResult",
    "LiveEvent",
    "TurnStillRunningWarning",
    "models",
    "output",
    # decisions
    "ToolCall",
    "Approve",
    "Deny",
    "Edit",
    "Ask",
    "Answer",
    "InputRequired",
    "PendingDecision",
    "BusyError",
    "DecisionError",
    # messages
    "Message",
    "UserMessage",
    "AssistantMessage",
    "ToolResultMessage",
    # log and stores
    "Event",
    "SessionLog",
    "Transcript",
    "MemoryStore",
    "FileStore",
    "PostgresStore",
    "Worker",
    "FORMAT_VERSION",
    # inbox and projections
    "Inbox",
    "NEXT_TURN",
    "NEXT_STEP",
    "SPLICED",
    "InboxProjection",
    "ConsumedWork",
    "consumed_work",
    # errors
    "errors",
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
    "TurnAborted",
    "InvalidToolArgumentsError",
    "ModelError",
    "__version__",
]

# Before finalization: the core's writer and reply threads stop calling into Python, so a log
# dropped while the interpreter shuts down can join its writer (src/python/runtime/exit.rs).
_atexit.register(_core._at_exit)
