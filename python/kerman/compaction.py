"""Compaction: a logged, reversible view of a long history (docs/context.md, "Compaction").

``await loop.compact(strategy)`` appends one ``context/compacted`` record naming the span of
the log it replaces and what stands for it; the raw events stay, and the history every later
request sees substitutes the record's messages for the span. A :class:`Compactor` does it by
itself: before a request whose prompt nears the model's context window, and once (then the
request is retried) when the provider reports the context length exceeded.

Never compacted: the current step's batch (and everything after it), the instructions (not part
of the history), pinned messages (kept verbatim after the summary); a tool call and its results
are compacted together or not at all. A compaction that raises, or that a ``before_compaction``
listener vetoes, appends nothing.
"""

from __future__ import annotations

import inspect
import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Dict, List, Optional, Sequence, Tuple, Union

from ._core import AssistantMessage, Message, ToolResultMessage, UserMessage
from .errors import ModelError
from .events import ContextCompacted
from .hooks import ModelReply, ModelRequest, Retry
from .signal import Signal

if TYPE_CHECKING:
    from .hooks import Model, RequestFailure
    from .loop import AgentLoop

__all__ = [
    "Compaction",
    "Veto",
    "Strategy",
    "DropToolResults",
    "SlidingWindow",
    "Summarize",
    "Revert",
    "OpenAICompact",
    "Compactor",
    "BeforeCompactionListener",
    "compact",
]

log = logging.getLogger("kerman.compaction")

#: The text a dropped tool result is replaced with.
DROPPED = "[tool result dropped by compaction]"
#: What an LLM summary is asked for (the conversation so far is the request's messages).
SUMMARY_PROMPT = (
    "Summarise the conversation above for your own later use: the user's goals and requests, "
    "decisions made, facts and tool results still needed, and open tasks. Be concise and "
    "complete; write only the summary."
)
#: The head of the user message that carries an LLM summary in the history.
SUMMARY_HEAD = "Summary of the earlier conversation:\n"


@dataclass
class Compaction:
    """The ``before_compaction`` payload, and what the strategy fills in.

    ``messages``: the history messages the span holds (``spans``: the seqs each stands for);
    ``first``/``last``: the span; ``pinned``: seqs of messages kept verbatim (add with
    :meth:`pin`). After ``await next()`` (the strategy ran): ``replacement`` is what stands for
    the span (``None``: a revert), ``model``/``usage`` the summary request's, ``native`` a
    provider's own item. A listener may edit ``replacement`` (a summary) or return
    :class:`Veto`."""

    loop: AgentLoop
    strategy: Strategy
    reason: str
    first: int
    last: int
    messages: List[Message]
    spans: List[Tuple[int, int]]
    pinned: List[int] = field(default_factory=list)
    replacement: Optional[List[Message]] = None
    model: Optional[str] = None
    usage: Optional[Dict[str, Any]] = None
    native: Optional[Dict[str, Any]] = None
    turn: Optional[int] = None

    def pin(self, message: Union[Message, int]) -> None:
        """Keeps ``message`` (one of ``messages``, or its seq) verbatim. A tool call pins its
        results and a result its call."""
        if isinstance(message, int) and not isinstance(message, bool):
            seq = message
            if not self.first <= seq <= self.last:
                raise ValueError(f"seq {seq} is outside the span {self.first}..{self.last}")
        else:
            for m, (lo, hi) in zip(self.messages, self.spans, strict=True):
                if m is message or (isinstance(message, Message) and m.id == message.id):
                    if lo != hi:
                        raise ValueError(f"{message!r} is a compaction's replacement, not a logged message: it cannot be pinned")
                    seq = lo
                    break
            else:
                raise ValueError(f"{message!r} is not one of this compaction's messages")
        if seq not in self.pinned:
            self.pinned.append(seq)

    @property
    def unpinned(self) -> List[Message]:
        """The span's messages a strategy compacts (the pinned ones left out)."""
        pinned = set(self.pinned)
        return [m for m, (lo, hi) in zip(self.messages, self.spans, strict=True) if not (lo == hi and lo in pinned)]

    def __repr__(self) -> str:
        size = "revert" if self.replacement is None else f"{len(self.replacement)} messages"
        return (
            f"<Compaction {self.strategy!r} reason={self.reason!r} span={self.first}..{self.last} "
            f"({len(self.messages)} messages) pinned={self.pinned} -> {size}>"
        )


class Veto:
    """What a ``before_compaction`` listener returns to refuse the compaction: nothing is
    appended."""

    __slots__ = ("reason",)

    def __init__(self, reason: Optional[str] = None) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"Veto({self.reason!r})"


#: ``async def f(compaction: Compaction, next) -> Compaction | Veto``.
BeforeCompactionListener = Callable[[Compaction, Callable[[], Awaitable[Any]]], Any]


class Strategy:
    """How a span is compacted. ``keep``: the messages at the end of the history never
    compacted; ``name`` is logged. A subclass fills ``compaction.replacement`` (and ``model``,
    ``usage``, ``native``) in :meth:`replace`."""

    name = "strategy"

    def __init__(self, keep: int = 4) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
            raise ValueError(f"keep must be an int >= 0, got {keep!r}")
        self.keep = keep

    async def replace(self, compaction: Compaction) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(keep={self.keep})"


class SlidingWindow(Strategy):
    """Drops the span: the history keeps its last ``keep`` messages (and the pinned ones)."""

    name = "sliding-window"

    async def replace(self, compaction: Compaction) -> None:
        compaction.replacement = []


class DropToolResults(Strategy):
    """Keeps every message of the span but replaces each tool result's content with a short
    note (the call stays, so the model knows it ran)."""

    name = "drop-tool-results"

    def __init__(self, keep: int = 4, note: str = DROPPED) -> None:
        super().__init__(keep)
        self.note = note

    async def replace(self, compaction: Compaction) -> None:
        out: List[Message] = []
        for m in compaction.unpinned:
            out.append(
                m.with_content([{"type": "tool-result", "toolCallId": m.call_id, "content": [{"type": "text", "text": self.note}]}])
                if isinstance(m, ToolResultMessage)
                else m
            )
        compaction.replacement = out


class Summarize(Strategy):
    """An LLM summary: ``model`` (any Kerman model: a provider, a ``ScriptedModel``...) is
    called once with the span's messages, no tools and ``prompt`` as its instructions; its text
    becomes one user message standing for the span."""

    name = "summary"

    def __init__(self, model: Model, keep: int = 4, prompt: str = SUMMARY_PROMPT, options: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(keep)
        if not callable(model):
            raise TypeError(f"model must be callable (a Kerman model), got {type(model).__name__}")
        self.model = model
        self.prompt = prompt
        self.options = dict(options or {})

    async def replace(self, compaction: Compaction) -> None:
        messages = list(compaction.unpinned)
        request = ModelRequest(messages, [], dict(self.options), compaction.turn or 0, 0, Signal(), [], None, self.prompt)
        text, usage = await _call(self.model, request)
        if not text.strip():
            raise ModelError("the summary model returned no text")
        compaction.replacement = [UserMessage(SUMMARY_HEAD + text, source={"kind": "compaction"})]
        compaction.usage = usage
        name = self.options.get("model", getattr(self.model, "model", None))
        compaction.model = name if isinstance(name, str) else type(self.model).__name__

    def __repr__(self) -> str:
        return f"Summarize({self.model!r}, keep={self.keep})"


class Revert(Strategy):
    """Restores the span's own messages (pass the span: ``loop.compact(Revert(), first=,
    last=)``): every compaction inside it is undone from here on."""

    name = "revert"

    def __init__(self) -> None:
        super().__init__(0)

    async def replace(self, compaction: Compaction) -> None:
        compaction.replacement = None


class OpenAICompact(Strategy):
    """OpenAI's own compaction (the Responses API's ``responses.compact``), through ``provider``
    (a ``kerman.providers.OpenAIResponses``): the span's messages go to the API, and what it
    returns (the user messages and an encrypted ``compaction`` item) stands for the span as one
    assistant message of reasoning blocks carrying the items (``{"openai": {"item": ...}}``),
    which only ``OpenAIResponses`` sends (as the items, verbatim); the other providers leave
    them out. The items are also the record's ``native``."""

    name = "openai-compact"

    def __init__(self, provider: Any, keep: int = 4) -> None:
        super().__init__(keep)
        from .providers import OpenAIResponses

        if not isinstance(provider, OpenAIResponses):
            raise TypeError(f"OpenAICompact needs a kerman.providers.OpenAIResponses, got {type(provider).__name__}")
        self.provider = provider

    async def replace(self, compaction: Compaction) -> None:
        provider = self.provider
        items = [item for m in compaction.unpinned for item in provider._convert(m, None)]
        response = await provider.client.responses.compact(model=provider.model, input=items)
        output = [item.model_dump(exclude_none=True) for item in response.output]
        if not any(item.get("type") == "compaction" for item in output):
            raise ModelError("responses.compact returned no compaction item")
        blocks: List[Dict[str, Any]] = [{"type": "reasoning", "text": "", "openai": {"item": item}} for item in output]
        compaction.replacement = [AssistantMessage(blocks)]
        compaction.native = {"provider": "openai-responses", "items": output}
        compaction.model = provider.model
        usage = getattr(response, "usage", None)
        compaction.usage = {k: v for k, v in provider._usage(usage).items() if k != "type"} if usage is not None else None

    def __repr__(self) -> str:
        return f"OpenAICompact({self.provider!r}, keep={self.keep})"


async def _call(model: Any, request: ModelRequest) -> Tuple[str, Optional[Dict[str, Any]]]:
    """Calls a Kerman model once: its text and usage."""
    produced = model(request)
    if hasattr(produced, "__anext__"):
        text: List[str] = []
        usage: Optional[Dict[str, Any]] = None
        async for chunk in produced:
            kind = chunk.get("type")
            if kind == "text-delta":
                text.append(chunk.get("text") or "")
            elif kind == "usage":
                usage = dict(usage or {}, **{k: v for k, v in chunk.items() if k != "type"})
            elif kind == "finish" and chunk.get("reason", "stop") not in ("stop", "max-tokens"):
                raise ModelError(f"the summary model finished with reason {chunk.get('reason')!r}")
        return "".join(text), usage
    if inspect.isawaitable(produced):
        produced = await produced
    if isinstance(produced, str):
        return produced, None
    if isinstance(produced, ModelReply):
        return "".join(b.get("text", "") for b in produced.content if b.get("type") == "text"), produced.usage
    raise TypeError(f"the summary model returned {produced!r}; expected a ModelReply, a str or a stream")


# -- choosing the span ------------------------------------------------------------------------


def _is_call(m: Message) -> bool:
    return m.role == "assistant" and bool(getattr(m, "tool_calls", None))


def _end(history: Sequence[Message], end: int) -> int:
    """``end`` moved back so that no tool call is split from its results."""
    while (
        end > 0
        and end <= len(history)
        and ((end < len(history) and isinstance(history[end], ToolResultMessage)) or _is_call(history[end - 1]))
    ):
        end -= 1
    return end


def _sticky_pins(spans: Sequence[Tuple[int, int]], end: int) -> List[int]:
    """Seqs of messages an earlier compaction pinned: logged messages standing inside a span
    an earlier replacement covers."""
    pins, reach = [], -1
    for lo, hi in spans[:end]:
        if lo == hi and lo <= reach:
            pins.append(lo)
        if hi > lo:
            reach = max(reach, hi)
    return pins


def _pair_pins(compaction: Compaction) -> None:
    """A pinned call pins its results, a pinned result its call (pairs stay together)."""
    by_seq = {lo: m for m, (lo, hi) in zip(compaction.messages, compaction.spans, strict=True) if lo == hi}
    calls: Dict[str, int] = {}
    for seq, m in by_seq.items():
        if _is_call(m):
            for call in getattr(m, "tool_calls", []):
                calls[str(call.get("id"))] = seq
    pinned = set(compaction.pinned)
    for seq, m in by_seq.items():
        if isinstance(m, ToolResultMessage):
            call = calls.get(m.call_id)
            if call is not None and (seq in pinned) != (call in pinned):
                pinned.update((seq, call))
    if len(pinned) != len(compaction.pinned):
        # A call pinned through one result: its other results come too.
        for seq, m in by_seq.items():
            if isinstance(m, ToolResultMessage) and calls.get(m.call_id) in pinned:
                pinned.add(seq)
    compaction.pinned = sorted(pinned)


async def _waterfall(listeners: Sequence[Callable[..., Any]], payload: Any, default: Callable[[], Awaitable[Any]]) -> Any:
    async def run(i: int) -> Any:
        if i == len(listeners):
            return await default()
        result = listeners[i](payload, lambda: run(i + 1))
        return await result if inspect.isawaitable(result) else result

    return await run(0)


async def compact(
    loop: AgentLoop,
    strategy: Strategy,
    *,
    reason: str = "manual",
    protect: Sequence[Message] = (),
    first: Optional[int] = None,
    last: Optional[int] = None,
    pin: Sequence[Union[Message, int]] = (),
) -> Optional[ContextCompacted]:
    """Compacts ``loop``'s history with ``strategy`` (see ``AgentLoop.compact``); the record's
    view, or ``None`` when there was nothing to compact or a listener vetoed."""
    if not isinstance(strategy, Strategy):
        raise TypeError(f"strategy must be a kerman.compaction.Strategy, got {strategy!r}")
    spans = loop._core.history_spans()
    history = loop._core.history()
    if (first is None) != (last is None):
        raise ValueError("give both first and last, or neither")
    if first is not None and last is not None:
        if first < 0 or last < first or last >= len(loop.log):
            raise ValueError(f"the span {first}..{last} is not inside the log (seqs 0..{len(loop.log) - 1})")
        chosen = [i for i, (lo, hi) in enumerate(spans) if first <= lo and hi <= last]
        start, end = (chosen[0], chosen[-1] + 1) if chosen else (0, 0)
        if chosen and (_end(history, end) != end or isinstance(history[start], ToolResultMessage)):
            raise ValueError(f"the span {first}..{last} separates a tool call from its results: widen or narrow it to keep them together")
    else:
        ids = {m.id for m in protect}
        limit = next((i for i, m in enumerate(history) if m.id in ids), len(history))
        start, end = 0, _end(history, min(limit, len(history) - strategy.keep))
        if end <= 0:
            return None
        first, last = spans[0][0], max(hi for _, hi in spans[:end])
    turn = loop.turn if loop.status == "running" else None
    payload = Compaction(loop, strategy, reason, first, last, list(history[start:end]), list(spans[start:end]), turn=turn)
    payload.pinned = [s for s in _sticky_pins(spans, end) if first <= s <= last]
    for p in pin:
        payload.pin(p)

    async def run_strategy() -> Compaction:
        _pair_pins(payload)
        await strategy.replace(payload)
        return payload

    result = await _waterfall(loop._before_compaction, payload, run_strategy)
    if result is None or isinstance(result, Veto):
        log.info("compaction of %s..%s vetoed: %r", first, last, result)
        return None
    if not isinstance(result, Compaction):
        raise TypeError(f"before_compaction listener returned {result!r}; expected a Compaction or a Veto")
    _pair_pins(result)
    record: Dict[str, Any] = {
        "first": result.first,
        "last": result.last,
        "messages": None if result.replacement is None else [m.to_dict() for m in result.replacement],
        "pinned": result.pinned,
        "strategy": strategy.name,
        "reason": reason,
    }
    for key in ("model", "usage", "native", "turn"):
        value = getattr(result, key)
        if value is not None:
            record[key] = value
    seq = loop._core.compact(json.dumps(record, ensure_ascii=False, separators=(",", ":")))
    return ContextCompacted(loop.log[seq])


# -- triggers ----------------------------------------------------------------------------------


class Compactor:
    """Compacts by itself: before a request when the last logged usage (``input + output``
    of the latest reply since the last compaction) reaches ``threshold`` of
    ``context_window`` tokens, and once per step when the provider reports the context length
    exceeded (``CONTEXT_LENGTH_EXCEEDED``: compact, then the request is retried). Set it with
    ``AgentLoop(compaction=Compactor(...))``; ``await loop.compact()`` uses its strategy."""

    def __init__(
        self, strategy: Strategy, *, context_window: Optional[int] = None, threshold: float = 0.8, on_context_error: bool = True
    ) -> None:
        if not isinstance(strategy, Strategy):
            raise TypeError(f"strategy must be a kerman.compaction.Strategy, got {strategy!r}")
        if context_window is not None and (isinstance(context_window, bool) or not isinstance(context_window, int) or context_window < 1):
            raise ValueError(f"context_window must be an int >= 1 (tokens) or None, got {context_window!r}")
        if not (isinstance(threshold, (int, float)) and 0 < threshold <= 1):
            raise ValueError(f"threshold must be a fraction in (0, 1], got {threshold!r}")
        self.strategy = strategy
        self.context_window = context_window
        self.threshold = threshold
        self.on_context_error = on_context_error
        self._entered: List[Message] = []
        self._retried: set[Tuple[int, int]] = set()

    def __repr__(self) -> str:
        return f"Compactor({self.strategy!r}, context_window={self.context_window}, threshold={self.threshold})"

    def used(self, loop: AgentLoop) -> Optional[int]:
        """The tokens the latest reply since the last compaction reported (``None``: none)."""
        end = len(loop.log)
        while end > 0:
            start = max(0, end - 256)
            for event in reversed(list(loop.log.events(start, end, ("assistant/message", "context/compacted")))):
                if event.type == "context/compacted":
                    return None
                usage = event.data.get("usage") if isinstance(event.data, dict) else None
                if isinstance(usage, dict):
                    counts = [usage.get(k) for k in ("input", "output")]
                    return sum(c for c in counts if isinstance(c, int) and not isinstance(c, bool))
            end = start
        return None

    async def before_request(self, request: ModelRequest, next: Callable[[], Awaitable[ModelRequest]]) -> ModelRequest:
        loop = request.loop
        self._entered = list(request.entered)
        if loop is not None and self.context_window is not None:
            used = self.used(loop)
            if used is not None and used >= self.threshold * self.context_window:
                try:
                    done = await compact(loop, self.strategy, reason="threshold", protect=request.entered)
                except Exception:
                    # A failed compaction changes nothing: the request goes out as it was.
                    log.warning("compaction before turn %s step %s failed", request.turn, request.step, exc_info=True)
                    done = None
                if done is not None:
                    request.messages = list(loop._core.history())
        return await next()

    async def request_error(self, failure: RequestFailure, next: Callable[[], Awaitable[Optional[Retry]]]) -> Optional[Retry]:
        key = (failure.turn, failure.step)
        if not self.on_context_error or failure.failure.get("code") != "CONTEXT_LENGTH_EXCEEDED" or key in self._retried:
            return await next()
        self._retried.add(key)
        try:
            done = await compact(failure.loop, self.strategy, reason="context-length", protect=self._entered)
        except Exception:
            log.warning("compaction after a context-length error (turn %s step %s) failed", failure.turn, failure.step, exc_info=True)
            done = None
        if done is None:
            return await next()
        return Retry()

    def _attach(self, loop: AgentLoop) -> None:
        loop._before_request.insert(0, self.before_request)
        loop._request_error.insert(0, self.request_error)

    def _detach(self, loop: AgentLoop) -> None:
        for where, fn in ((loop._before_request, self.before_request), (loop._request_error, self.request_error)):
            if fn in where:
                where.remove(fn)
