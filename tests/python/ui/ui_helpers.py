"""Helpers of the projection tests: the recorded logs, the goldens, and the checks a client
of each protocol relies on (AG-UI models, the Vercel part shapes, JSON Patch)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import kerman

HERE = Path(__file__).parent
LOGS = sorted(p.stem for p in (HERE / "logs").glob("*.jsonl"))


def recorded(name: str, tmp_path: Path) -> list[kerman.Event]:
    """The events of a recorded log, read through a FileStore follower (nothing is written)."""
    root = Path(tempfile.mkdtemp(prefix=f"store-{name}-", dir=tmp_path))
    shutil.copy(HERE / "logs" / f"{name}.jsonl", root / f"{name}.jsonl")
    log = kerman.FileStore(root, durability="none").follow(name)
    try:
        return list(log.events())
    finally:
        log.close()


def lines(outputs: list) -> list[str]:
    return [json.dumps({"id": u.id, "event": u.data}, ensure_ascii=False, sort_keys=True) for u in outputs]


# The Vercel AI SDK's UI message stream parts (protocol v1), from its documentation: required
# and optional keys of each part type; no other key is allowed (the SDK's schema is strict).
VERCEL_PARTS: dict[str, tuple[set[str], set[str]]] = {
    "start": (set(), {"messageId", "messageMetadata"}),
    "finish": (set(), {"finishReason", "messageMetadata"}),
    "abort": (set(), {"reason"}),
    "error": ({"errorText"}, set()),
    "start-step": (set(), set()),
    "finish-step": (set(), set()),
    "text-start": ({"id"}, {"providerMetadata"}),
    "text-delta": ({"id", "delta"}, {"providerMetadata"}),
    "text-end": ({"id"}, {"providerMetadata"}),
    "reasoning-start": ({"id"}, {"providerMetadata"}),
    "reasoning-delta": ({"id", "delta"}, {"providerMetadata"}),
    "reasoning-end": ({"id"}, {"providerMetadata"}),
    "tool-input-start": ({"toolCallId", "toolName"}, {"providerExecuted", "dynamic", "title"}),
    "tool-input-delta": ({"toolCallId", "inputTextDelta"}, set()),
    "tool-input-available": ({"toolCallId", "toolName", "input"}, {"providerExecuted", "dynamic", "title"}),
    "tool-input-error": ({"toolCallId", "toolName", "input", "errorText"}, {"providerExecuted", "dynamic", "title"}),
    "tool-output-available": ({"toolCallId", "output"}, {"providerExecuted", "dynamic", "preliminary"}),
    "tool-output-error": ({"toolCallId", "errorText"}, {"providerExecuted", "dynamic"}),
    "tool-approval-request": ({"approvalId", "toolCallId"}, set()),  # AI SDK 6
    "tool-output-denied": ({"toolCallId"}, set()),  # AI SDK 6
}
FINISH_REASONS = {"stop", "length", "content-filter", "tool-calls", "error", "other"}


def check_vercel_part(part: dict) -> None:
    kind = part.get("type")
    assert isinstance(kind, str), part
    if kind.startswith("data-"):
        required, optional = {"data"}, {"id", "transient"}
    else:
        assert kind in VERCEL_PARTS, f"not a UI message stream part: {part}"
        required, optional = VERCEL_PARTS[kind]
    keys = set(part) - {"type"}
    assert required <= keys, f"{kind} lacks {required - keys}: {part}"
    assert keys <= required | optional, f"{kind} has unknown keys {keys - required - optional}: {part}"
    for key in ("id", "delta", "errorText", "toolCallId", "toolName", "messageId", "reason", "approvalId"):
        if key in part:
            assert isinstance(part[key], str), (key, part)
    if kind == "finish" and "finishReason" in part:
        assert part["finishReason"] in FINISH_REASONS, part
    if "transient" in part:
        assert isinstance(part["transient"], bool)


def check_agui_event(data: dict) -> None:
    """Validates one AG-UI event with the ag-ui-protocol package's models: it parses as the
    event its type names, carries no field the model does not know, and serialises back to
    exactly itself."""
    from ag_ui.core import Event
    from pydantic import TypeAdapter

    adapter = TypeAdapter(Event)
    model = adapter.validate_python(data)
    assert model.type.value == data["type"]
    assert not model.model_extra, f"fields the AG-UI model does not know: {model.model_extra} in {data}"
    assert adapter.dump_python(model, mode="json", by_alias=True) == data


def json_patch(doc: Any, ops: list[dict]) -> Any:
    """A small RFC 6902 applier for add and remove (what STATE_DELTA uses here)."""
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = doc
        for key in parts[:-1]:
            parent = parent[int(key)] if isinstance(parent, list) else parent[key]
        last = parts[-1]
        if op["op"] == "add":
            if isinstance(parent, list):
                index = len(parent) if last == "-" else int(last)
                assert 0 <= index <= len(parent), op
                parent.insert(index, op["value"])
            else:
                parent[last] = op["value"]
        elif op["op"] == "remove":
            if isinstance(parent, list):
                del parent[int(last)]
            else:
                del parent[last]
        else:
            raise AssertionError(f"unexpected op {op}")
    return doc
