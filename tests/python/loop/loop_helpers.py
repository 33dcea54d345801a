"""Helpers shared by the AgentLoop tests in this folder and runtime/test_asyncio.py: readers of
the events a turn logged, scripted models and live-event recorders."""

from __future__ import annotations

import asyncio
from typing import Any, Dict, List

import kerman
from conftest import plain
from kerman import (
    AgentLoop,
    ModelReply,
    UserMessage,
)

CancelledError = asyncio.CancelledError

USER = {"kind": "user"}
PARENT = {"kind": "parent"}
DISPOSED = {"kind": "disposed"}
COMPLETED = {"kind": "completed"}
BOUNDARIES = ("turn/start", "step/start", "step/end", "turn/end")


def aborted(cause: Dict[str, Any]) -> Dict[str, Any]:
    return {"kind": "aborted", "reason": cause}


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def types_of(log, start: int = 0) -> List[str]:
    return [e.type for e in log.events(start)]


def of_type(log, *types: str) -> list:
    return [e for e in log.events() if e.type in types]


def boundaries(log) -> List[str]:
    return [e.type for e in log.events() if e.type in BOUNDARIES]


def turn_ends(log) -> List[Dict[str, Any]]:
    """The turns' endings, without the report of a user exception (test_user_code_errors.py)."""
    return [plain(e.data["reason"]) for e in log.events() if e.type == "turn/end"]


def count(log, type_: str) -> int:
    return sum(1 for e in log.events() if e.type == type_)


def user_texts(log) -> List[str]:
    return [kerman.Message.from_dict(e.data).text for e in log.events() if e.type == "user/message"]


def texts(messages) -> List[str]:
    return [m.text for m in messages]


def canceled_splices(log) -> list:
    return [e.data for e in log.splices() if e.data.get("outcome") == "canceled"]


def tool_calls(*calls) -> ModelReply:
    """A reply with one tool-call block per ``(id, name)`` or ``(id, name, arguments)``."""
    return ModelReply([{"type": "tool-call", "id": c[0], "name": c[1], "arguments": c[2] if len(c) > 2 else "{}"} for c in calls])


def result_of(log, call_id: str):
    """The ``tool/result`` event for ``call_id`` (asserts there is exactly one)."""
    found = [e for e in log.events() if e.type == "tool/result" and e.data["message"]["content"][0]["toolCallId"] == call_id]
    assert len(found) == 1, f"expected one tool/result for {call_id}, got {len(found)}: {types_of(log)}"
    return found[0]


def result_text(event) -> str:
    block = event.data["message"]["content"][0]
    content = block["content"]
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content)


async def forever() -> None:
    """Awaits a future nobody resolves: only a cancellation gets out."""
    await asyncio.get_running_loop().create_future()


async def drain() -> None:
    """A barrier behind every callback already scheduled on the running loop (FIFO)."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    loop.call_soon(fut.set_result, None)
    await fut


class Live:
    """Records the live events of one AgentLoop."""

    def __init__(self, loop: AgentLoop) -> None:
        self.statuses: List[str] = []
        self.errors: list = []
        self.inserted: List[UserMessage] = []
        self.discarded: List[UserMessage] = []
        self.claimed: list = []
        loop.on("agent/status", lambda e: self.statuses.append(e.status))
        loop.on("agent/error", self.errors.append)
        loop.on("agent/inbox/inserted", lambda e: self.inserted.append(e.message))
        loop.on("agent/inbox/discarded", lambda e: self.discarded.append(e.message))
        loop.on("agent/inbox/claimed", lambda e: self.claimed.append((e.message, e.turn)))


class HangModel:
    """Hangs on the requests numbered in ``hang`` (1-based) until cancelled; answers the others
    with ``"reply <n>"``. Records requests and the CancelledErrors it saw."""

    def __init__(self, hang=(1,)) -> None:
        self.hang = set(hang)
        self.requests: list = []
        self.entered = asyncio.Event()
        self.cancelled = 0

    async def __call__(self, request):
        self.requests.append(request)
        n = len(self.requests)
        if n in self.hang:
            self.entered.set()
            try:
                await forever()
            except CancelledError:
                self.cancelled += 1
                raise
        return ModelReply(f"reply {n}")
