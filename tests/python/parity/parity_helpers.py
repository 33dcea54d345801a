"""Helpers of the parity tests (test_parity*.py): observations that read the same on Kerman and
on the pure-Python baseline, through the API subset both implement (``to_json``, ``events``,
``to_dict``), so one expected value serves both implementations."""

from __future__ import annotations

import asyncio
import functools
import json
import re
from typing import Any, Callable, Dict, List

from conftest import plain

TURN, STEP, SPLICED = "next-turn", "next-step", "agent/inbox/spliced"
UUID7 = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


def asynctest(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Runs an ``async def`` test in a fresh event loop (pytest-asyncio is not installed)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return asyncio.run(fn(*args, **kwargs))

    return wrapper


def same(actual: Any, expected: Any) -> None:
    """Equal, and with every dict's keys in the same order (the wire form is ordered)."""
    assert actual == expected
    assert json.dumps(actual) == json.dumps(expected), "same values, different key order"


class Minted:
    """Replaces minted UUIDv7 ids with ``<m1>``, ``<m2>``... by first appearance, so a snapshot
    can say "the same minted id" without knowing it (and checks that it is UUIDv7 text)."""

    def __init__(self) -> None:
        self.names: Dict[str, str] = {}

    def __call__(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: self(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self(v) for v in value]
        if isinstance(value, str) and UUID7.fullmatch(value):
            return self.names.setdefault(value, f"<m{len(self.names) + 1}>")
        return value


def records(log: Any, start: int = 0, minted: Any = None) -> List[Dict[str, Any]]:
    """Every event from ``start`` as its wire record without ``time``, minted ids redacted,
    and without Kerman's report of a user exception (``conftest.plain``: the baseline records
    none). Checks on the way that seqs are contiguous and times non-decreasing."""
    minted = minted or Minted()
    out, last = [], 0
    for i, event in enumerate(log.events(start), start):
        record = json.loads(event.to_json())
        assert record["seq"] == event.seq == i, "seqs are contiguous from 0"
        assert record["time"] >= last, "event time is non-decreasing"
        last = record.pop("time")
        out.append(minted(plain(record)))
    return out


def splices(log: Any, start: int = 0) -> List[Dict[str, Any]]:
    """The payloads of the splice events from ``start`` (every event there must be one)."""
    recs = records(log, start)
    assert {r["type"] for r in recs} <= {SPLICED}
    return [r["data"] for r in recs]


def types(log: Any) -> List[str]:
    return [e.type for e in log.events()]


def ids(messages: Any) -> List[str]:
    return [m.id for m in messages]


def msg(id: str, text: str, source: Any = None) -> Dict[str, Any]:
    """A user message as logged."""
    return {"id": id, "role": "user", "content": [{"type": "text", "text": text}], "source": source or {"kind": "user"}}


def amsg(id: str, content: Any) -> Dict[str, Any]:
    """An assistant message as logged."""
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    return {"id": id, "role": "assistant", "content": content, "source": {"kind": "model"}}


def tool_msg(id: str, call_id: str, text: str, is_error: bool = False) -> Dict[str, Any]:
    """A tool-result message as logged."""
    block: Dict[str, Any] = {"type": "tool-result", "toolCallId": call_id, "content": [{"type": "text", "text": text}]}
    if is_error:
        block["isError"] = True
    return {"id": id, "role": "user", "content": [block], "source": {"kind": "tool", "callId": call_id}}


# ---- the loop -------------------------------------------------------------------------------

CLAIM_TURN = {"target": TURN, "start": 0, "removedCount": 1, "inserted": []}


def scripted(api: Any, *replies: Any) -> Any:
    """An ``async def model(request)`` answering from ``replies`` in order (a str, a content
    list, or a function of the request); ``model.requests`` snapshots what each request held."""
    queue = list(replies)

    async def model(request: Any) -> Any:
        model.requests.append(
            {
                "turn": request.turn,
                "step": request.step,
                "messages": [m.to_dict() for m in request.messages],
                "entered": ids(request.entered),
            }
        )
        reply = queue.pop(0)
        reply = reply(request) if callable(reply) else reply
        return reply if isinstance(reply, api.ModelReply) else api.ModelReply(reply)

    model.requests = []
    return model


def call(call_id: str, name: str, args: Any = None) -> Dict[str, Any]:
    return {"type": "tool-call", "id": call_id, "name": name, "arguments": json.dumps(args or {})}


def turn_ends(log: Any) -> List[Any]:
    """The ``turn/end`` payloads, without Kerman's report of a user exception (the baseline
    records none)."""
    return [plain(e.data) for e in log.events(types=["turn/end"])]


def user_texts(log: Any) -> List[str]:
    return [e.data["content"][0]["text"] for e in log.events(types=["user/message"])]
