"""The tool calls a request body sends that carry no result, read the vendor's way (shared by
test_tool_exits_wire.py and its child, tool_exits_wire_child.py)."""

from __future__ import annotations

from typing import Any, Dict, List


def unanswered(protocol: str, body: Dict[str, Any]) -> List[str]:
    """The ids of the calls ``body`` (a request the vendor would get) asks about with no result
    after them: what OpenAI and Anthropic refuse with a 400."""
    asked: List[str] = []
    answered = set()
    if protocol == "openai-chat":
        for m in body["messages"]:
            asked += [c["id"] for c in m.get("tool_calls") or []]
            if m.get("role") == "tool":
                answered.add(m["tool_call_id"])
    elif protocol == "anthropic":
        for m in body["messages"]:
            for block in m["content"] if isinstance(m["content"], list) else []:
                if block["type"] == "tool_use":
                    asked.append(block["id"])
                elif block["type"] == "tool_result":
                    answered.add(block["tool_use_id"])
    elif protocol == "openai-responses":
        for item in body["input"]:
            if item.get("type") == "function_call":
                asked.append(item["call_id"])
            elif item.get("type") == "function_call_output":
                answered.add(item["call_id"])
    else:
        raise ValueError(f"no reader for {protocol!r}")
    assert asked, f"the request carries no tool call at all: {body}"
    return [call for call in asked if call not in answered]
