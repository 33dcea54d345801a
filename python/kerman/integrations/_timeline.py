"""Timeline summaries of the integrations' event types (``kerman.timeline``), written against
their payloads only: no framework is imported."""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, List

__all__ = ["SUMMARIES"]

TEXT = 60


def _short(value: Any, limit: int = TEXT) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    return json.dumps(text, ensure_ascii=False) if isinstance(value, str) else text


def _unit(name: Any) -> str:
    """pydantic-ai's invocation name without its agent prefix: ``model.request``,
    ``call_tool:book``."""
    text = str(name)
    if ".call_tool:" in text:
        return "tool " + text.rsplit(".call_tool:", 1)[1]
    return text.rsplit("__", 1)[-1]


def _parts(result: Any) -> str:
    """A model response's parts in a few words: its text, its tool calls."""
    parts = result.get("parts") if isinstance(result, dict) else None
    if not isinstance(parts, list):
        return _short(result)
    out: List[str] = []
    for p in parts:
        if not isinstance(p, dict):
            continue
        kind = p.get("part_kind")
        if kind == "text":
            out.append(_short(p.get("content", ""), 40))
        elif kind == "tool-call":
            out.append(f"{p.get('tool_name')}({_short(p.get('args', ''), 40)})")
        elif kind:
            out.append(str(kind))
    return ", ".join(out) or "(no parts)"


def _tool_result(result: Any) -> str:
    if isinstance(result, dict):
        kind = result.get("kind")
        if kind == "tool_return":
            return "→ " + _short(result.get("result"))
        if kind in ("tool_failed", "model_retry"):
            return f"{kind.replace('_', ' ')}: " + _short(result.get("message", ""))
        if kind:
            return str(kind).replace("_", " ")
    return "→ " + _short(result)


def _pai_run(d: Dict[str, Any]) -> str:
    return f"run {d.get('run')} agent {_short(d.get('agent'))} prompt {_short(d.get('prompt'))}"


def _pai_unit(d: Dict[str, Any]) -> str:
    unit = _unit(d.get("unit"))
    head = f"run {d.get('run')} {unit} #{d.get('n')}"
    if unit.startswith("tool "):
        return f"{head} {_tool_result(d.get('result'))}"
    if unit.endswith("model.request"):
        return f"{head} {_parts(d.get('result'))}"
    return head


def _pai_started(d: Dict[str, Any]) -> str:
    return f"run {d.get('run')} {_unit(d.get('unit'))} #{d.get('n')} started"


def _pai_raised(d: Dict[str, Any]) -> str:
    return f"run {d.get('run')} {_unit(d.get('unit'))} #{d.get('n')} raised {_short(d.get('error'))}"


def _pai_run_end(d: Dict[str, Any]) -> str:
    return f"run {d.get('run')} output {_short(d.get('output'))}"


def _item_kind(item: Any) -> str:
    if isinstance(item, dict):
        return str(item.get("type") or item.get("role") or "?")
    return "?"


def _oa_items(d: Dict[str, Any]) -> str:
    found = d.get("items")
    items: List[Any] = found if isinstance(found, list) else []
    return f"session {_short(d.get('session'))} +{len(items)}: " + ", ".join(_item_kind(i) for i in items)


def _oa_popped(d: Dict[str, Any]) -> str:
    return f"session {_short(d.get('session'))} popped item {d.get('index')}"


def _oa_cleared(d: Dict[str, Any]) -> str:
    return f"session {_short(d.get('session'))} cleared {d.get('count')} items"


SUMMARIES: Dict[str, Callable[[Dict[str, Any]], str]] = {
    "pydantic-ai/run": _pai_run,
    "pydantic-ai/unit": _pai_unit,
    "pydantic-ai/started": _pai_started,
    "pydantic-ai/raised": _pai_raised,
    "pydantic-ai/run-end": _pai_run_end,
    "openai-agents/items": _oa_items,
    "openai-agents/popped": _oa_popped,
    "openai-agents/cleared": _oa_cleared,
}
