"""Models that ship with Kerman: deterministic ones for tests, examples and the demo."""

from __future__ import annotations

from collections import deque
from typing import Any, AsyncIterator, Deque, Dict, Iterable, List, Union

from .errors import ModelError
from .hooks import ModelReply, ModelRequest

__all__ = ["ScriptedModel", "EchoModel"]

ScriptItem = Union[ModelReply, str, List[Dict[str, Any]], BaseException]


class ScriptedModel:
    """Replies from a script, one item per request: a :class:`ModelReply`, a ``str``, a list
    of chunk dicts (streamed) or an exception instance (raised). Raises
    ``ModelError("script exhausted")`` when empty. ``requests`` records every request."""

    def __init__(self, replies: Iterable[ScriptItem] = ()) -> None:
        self._script: Deque[ScriptItem] = deque(replies)
        self.requests: List[ModelRequest] = []

    def add(self, *items: ScriptItem) -> None:
        """Appends items to the script."""
        self._script.extend(items)

    def __call__(self, request: ModelRequest) -> Any:
        self.requests.append(request)
        if not self._script:
            return self._fail(ModelError("script exhausted"))
        item = self._script.popleft()
        if isinstance(item, BaseException):
            return self._fail(item)
        if isinstance(item, list):
            return self._stream(item)
        return self._reply(item)

    async def _fail(self, error: BaseException) -> ModelReply:
        raise error

    async def _reply(self, item: Union[ModelReply, str]) -> ModelReply:
        return item if isinstance(item, ModelReply) else ModelReply(item)

    async def _stream(self, chunks: List[Dict[str, Any]]) -> AsyncIterator[Dict[str, Any]]:
        for chunk in chunks:
            yield dict(chunk)

    def __repr__(self) -> str:
        return f"<ScriptedModel remaining={len(self._script)} requests={len(self.requests)}>"


class EchoModel:
    """Replies with the text of the step's entered user messages, joined by newlines."""

    async def __call__(self, request: ModelRequest) -> ModelReply:
        return ModelReply("\n".join(m.text for m in request.entered))

    def __repr__(self) -> str:
        return "EchoModel()"
