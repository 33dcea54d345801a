"""The payloads, decisions and results exchanged between the AgentLoop and user code, gathered
from where each lives: :mod:`kerman.hooks` (decisions, payloads, model request and reply,
listener types), :mod:`kerman.signal` and :mod:`kerman.tools`."""

from .hooks import (
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
    Target,
    TurnStopping,
)
from .signal import Signal
from .tools import Tool, ToolContext, ToolResult

__all__ = [
    "Signal",
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
    "ToolContext",
    "ToolResult",
    "Tool",
    "LiveEvent",
]
