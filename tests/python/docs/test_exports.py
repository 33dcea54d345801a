"""The export surface, pinned: ``kerman.__all__`` is the literal list below (a name added to or
taken from the package is a deliberate change of this file), every name in it exists, and every
public attribute of ``kerman`` that is not a submodule is in it. The modules whose names moved
into rooms (``kerman.types``, ``kerman.chat``, ``kerman.demo``, ``kerman.cli``) still give every
name they gave, as the very objects of the rooms that hold them now."""

import importlib
import types
from typing import Dict, List

import pytest

import kerman

KERMAN_ALL = [
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
    "Message",
    "UserMessage",
    "AssistantMessage",
    "ToolResultMessage",
    "Event",
    "SessionLog",
    "Transcript",
    "MemoryStore",
    "FileStore",
    "PostgresStore",
    "Worker",
    "FORMAT_VERSION",
    "Inbox",
    "NEXT_TURN",
    "NEXT_STEP",
    "SPLICED",
    "InboxProjection",
    "ConsumedWork",
    "consumed_work",
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

# Each module's __all__, and the room each name lives in now.
HOOKS = [
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
    "LiveEvent",
]
MODULES: Dict[str, List[str]] = {
    "kerman.hooks": HOOKS + ["Model"],
    "kerman.signal": ["Signal"],
    "kerman.tools": ["Tool", "ToolContext", "ToolResult"],
    "kerman.types": [
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
    ],
    "kerman.cli": ["main", "human_size"],
    "kerman.chat": ["PROVIDERS", "add_arguments", "load_model", "run"],
    "kerman.cli.chat": ["PROVIDERS", "add_arguments", "load_model", "run"],
    "kerman.demo": ["main"],
    "kerman.usage": [
        "Budget",
        "ledger",
        "Ledger",
        "Request",
        "Totals",
        "Fold",
        "Pricer",
        "genai_prices_pricer",
        "default_pricer",
        "summary_line",
    ],
    "kerman.otel": [
        "export",
        "encode",
        "instrument",
        "Instrumentation",
        "NativeInstrumentation",
        "OtlpSender",
        "SpanBuilder",
        "trace_id_of",
        "span_id_of",
        "latest_conventions",
        "LATEST",
    ],
}
HOME = {name: "kerman.hooks" for name in HOOKS} | {
    "Signal": "kerman.signal",
    "Tool": "kerman.tools",
    "ToolContext": "kerman.tools",
    "ToolResult": "kerman.tools",
}
MOVED = {"kerman.chat": "kerman.cli.chat", "kerman.demo": "kerman.cli.demo"}


def test_all_is_the_pinned_list() -> None:
    assert kerman.__all__ == KERMAN_ALL


def test_every_name_in_all_exists() -> None:
    missing = [name for name in kerman.__all__ if not hasattr(kerman, name)]
    assert missing == []


def test_every_public_attribute_is_in_all() -> None:
    public = {name for name in dir(kerman) if not name.startswith("_") and not isinstance(getattr(kerman, name), types.ModuleType)}
    assert sorted(public - set(kerman.__all__)) == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_modules_names_are_pinned_and_exist(module: str) -> None:
    mod = importlib.import_module(module)
    assert list(mod.__all__) == MODULES[module]
    assert [name for name in mod.__all__ if not hasattr(mod, name)] == []


@pytest.mark.parametrize("name", sorted(HOME))
def test_a_name_is_one_object_wherever_it_is_imported_from(name: str) -> None:
    home = getattr(importlib.import_module(HOME[name]), name)
    assert getattr(kerman, name) is home
    assert getattr(importlib.import_module("kerman.types"), name) is home


@pytest.mark.parametrize("module", sorted(MOVED))
def test_a_moved_modules_names_are_its_rooms(module: str) -> None:
    old, new = importlib.import_module(module), importlib.import_module(MOVED[module])
    assert [getattr(old, name) is getattr(new, name) for name in old.__all__] == [True] * len(old.__all__)
