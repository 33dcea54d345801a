"""What both projections share: reading an event, resume points, the queue mirror, iteration.

A projection is a fold: ``feed(event)`` updates the state derived from the log prefix and
returns the protocol events that this one log event gives (often none, sometimes several).
Nothing else goes into the output, so replaying the same log always gives the same output, and
resuming is folding the prefix without emitting it (``after=``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, AsyncIterable, AsyncIterator, Callable, Dict, Iterable, Iterator, Optional, Union

from .. import events
from .._core import Event, InboxProjection

__all__ = ["UiEvent", "ResumePoint", "parse_resume", "Projection", "QueueMirror", "project", "JsonDict"]

#: A protocol event or a log event in its JSON form.
JsonDict = Dict[str, Any]
EventLike = Union[Event, JsonDict]


@dataclass(frozen=True)
class UiEvent:
    """One protocol event, with the log event it came from.

    ``seq`` is that event's seq, ``index`` its place among the protocol events the log event
    gave (0-based), ``last`` whether it is the last of them. ``id`` is what SSE sends as
    ``id:``: the seq for the last (or only) one, ``"<seq>:<index>"`` for the ones before it, so
    a client cut off between two protocol events of one log event resumes exactly after the
    one it saw.
    """

    seq: int
    index: int
    last: bool
    data: JsonDict

    @property
    def id(self) -> str:
        return str(self.seq) if self.last else f"{self.seq}:{self.index}"


@dataclass(frozen=True)
class ResumePoint:
    """Where a client stopped: after protocol event ``index`` of log event ``seq``, or after all
    of that log event's protocol events when ``index`` is ``None``."""

    seq: int
    index: Optional[int] = None

    def skips(self, seq: int, index: int) -> bool:
        """Whether the protocol event (``seq``, ``index``) was already delivered."""
        if seq != self.seq:
            return seq < self.seq
        return self.index is None or index <= self.index


_RESUME = re.compile(r"(0|[1-9][0-9]{0,17})(?::(0|[1-9][0-9]{0,5}))?")


def parse_resume(value: Union[None, int, str, ResumePoint]) -> Optional[ResumePoint]:
    """A resume point from an SSE ``Last-Event-ID`` (``"12"`` or ``"12:1"``), a seq, or ``None``.

    Raises ``ValueError`` naming the value when it is neither.
    """
    if value is None or isinstance(value, ResumePoint):
        return value
    if isinstance(value, bool):
        raise ValueError(f"invalid resume point {value!r}: expected a seq or an event id such as '12' or '12:1'")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"invalid resume point {value!r}: a seq is 0 or more")
        return ResumePoint(value)
    if isinstance(value, str):
        match = _RESUME.fullmatch(value.strip())
        if match:
            index = match.group(2)
            return ResumePoint(int(match.group(1)), None if index is None else int(index))
    raise ValueError(f"invalid resume point {value!r}: expected a seq or an event id such as '12' or '12:1'")


def fields(event: EventLike) -> tuple[int, str, Any]:
    """(seq, type, data) of a ``kerman.Event`` or of its ``to_dict()`` form."""
    if isinstance(event, Event):
        return event.seq, event.type, event.data
    try:
        return event["seq"], event["type"], event.get("data")
    except (TypeError, KeyError):
        raise TypeError(f"expected a kerman.Event or an event dict with seq, type and data, got {event!r:.80}") from None


def payload(view: events.EventView) -> JsonDict:
    """A view's payload as stored, or an empty dict when it is not an object (what the
    protocols' pass-through events, such as a decision's, carry)."""
    data = view.data
    return data if isinstance(data, dict) else {}


def compaction_payload(view: events.ContextCompacted) -> JsonDict:
    """What a UI shows of a compaction: where it happened and what it replaced (the span, the
    strategy, the pins, the summary's text), without the replacement messages themselves."""
    out: JsonDict = {k: v for k, v in payload(view).items() if k not in ("messages", "native")}
    replacement = view.messages
    out["seq"] = view.seq
    out["revert"] = replacement is None
    texts = [
        b.get("text", "") for m in replacement or () for b in m.raw.get("content", ()) if isinstance(b, dict) and b.get("type") == "text"
    ]
    out["summary"] = "\n".join(texts) if texts else None
    return out


def request_payload(request: events.DecisionRequested) -> JsonDict:
    """A ``decision/requested`` payload as a client sees it: without ``gated``, the gate's
    verdicts on the step's other calls, which the log keeps for resuming the step (a client sees
    each of those calls through its own events, and a failed gate's reason is the server's)."""
    return {k: v for k, v in payload(request).items() if k != "gated"}


def budget_message(ending: events.Ending) -> str:
    """What a client shows for a ``budget`` ending (AG-UI's ``RUN_ERROR``, Vercel's ``error``)."""
    stop = ending.budget
    return "the turn's budget is spent" + (f": {stop.text()}" if stop is not None else "")


def public_reason(reason: Any) -> Any:
    """A ``turn/end`` reason as a client may see it: a failure's ``traceback`` (the server's
    stack) stays in the log."""
    if isinstance(reason, dict) and isinstance(reason.get("error"), dict) and "traceback" in reason["error"]:
        error = {k: v for k, v in reason["error"].items() if k != "traceback"}
        return {**reason, "error": error}
    return reason


def placement(target: str, message: events.MessageView) -> str:
    """Where a pending message shows: next-turn input is queued; next-step input is steering
    when a user sent it and context otherwise (as ``InboxProjection.items()`` says)."""
    if target == "next-turn":
        return "queued"
    return "steering" if message.source.kind == "user" else "context"


def item(target: str, message: Union[JsonDict, events.MessageView]) -> JsonDict:
    """A queue entry as both protocols show it."""
    view = message if isinstance(message, events.MessageView) else events.message(message)
    return {"id": view.id, "placement": placement(target, view), "text": view.text, "message": view.raw}


class QueueMirror:
    """The pending inbox as JSON-ready lists, kept by folding splices.

    Each splice is validated by a ``kerman.InboxProjection`` first (a bad one raises
    ``ProjectionError`` with its seq, as replay does), then applied to the two lists here.
    It also remembers where each claimed message was claimed from, so the ``user/message``
    that enters it can say whether it is a prompt, steering or context, and which claimed
    messages no step read before their turn ended (``unread``).
    """

    def __init__(self) -> None:
        self._check = InboxProjection()
        self.lists: dict[str, list[JsonDict]] = {"next-turn": [], "next-step": []}
        self.claimed: dict[str, str] = {}
        self.undecided: dict[str, JsonDict] = {}  # claimed rows no pre-step decision took yet
        self.unread: set[str] = set()  # ids shown as read by no turn, until inserted again

    def state(self) -> JsonDict:
        return {"nextTurn": list(self.lists["next-turn"]), "nextStep": list(self.lists["next-step"])}

    def apply(self, event: Union[EventLike, events.InboxSpliced]) -> tuple[str, int, list[JsonDict], list[JsonDict]]:
        """Applies one splice; returns (target, start, removed items, inserted items)."""
        splice = event if isinstance(event, events.InboxSpliced) else events.InboxSpliced(event)
        self._check.apply(splice.event)  # type: ignore[arg-type]  # a Mapping the view accepted: the check takes its dict
        target = splice.target
        start = splice.start
        count = splice.removed_count
        rows = self.lists[target]
        removed = rows[start : start + count]
        inserted = [item(target, m) for m in splice.inserted]
        rows[start : start + count] = inserted
        if splice.is_claim:  # a claim: the messages go on into the turn
            for row in removed:
                self.claimed[row["id"]] = row["placement"]
                self.undecided[row["id"]] = row
        for row in inserted:
            self.claimed.pop(row["id"], None)
            self.undecided.pop(row["id"], None)
        return target, start, removed, inserted

    def step_started(self) -> None:
        """A step started: the pre-step decision took what was claimed for it."""
        self.undecided.clear()

    def take_unread(self) -> list[JsonDict]:
        """At a turn's end: what it claimed and no step read (cancelled before the decision,
        rejected), in claim order. Claimed input never returns by itself; ``requeue_claimed``
        inserts it again."""
        rows = list(self.undecided.values())
        self.undecided.clear()
        for row in rows:
            self.claimed.pop(row["id"], None)
            self.unread.add(row["id"])
        return rows

    def requeued(self, inserted: list[JsonDict]) -> list[str]:
        """The ids of ``inserted`` that were unread (sent again)."""
        if not self.unread:  # the common case: nothing was left unread
            return []
        again = [row["id"] for row in inserted if row["id"] in self.unread]
        self.unread.difference_update(again)
        return again

    def entered(self, message_id: str, step: Optional[int]) -> str:
        """What an entered user message was: ``prompt``, ``steering`` or ``context``."""
        was = self.claimed.pop(message_id, None)
        if was == "queued":
            return "prompt"
        if was is not None:
            return was
        return "prompt" if step in (None, 1) else "context"  # a pre_step listener's own message


class Projection:
    """Base of the two projections: ``feed(event) -> list[JsonDict]``."""

    def feed(self, event: EventLike) -> list[JsonDict]:  # pragma: no cover - abstract
        raise NotImplementedError


_new = object.__new__


def _ui_event(seq: int, index: int, last: bool, data: JsonDict) -> UiEvent:
    """``UiEvent(seq, index, last, data)``, filled as its generated ``__init__`` fills it but
    without four ``object.__setattr__`` calls: one is made per protocol event, and that
    ``__init__`` cost more than folding the log event (docs/performance.md, "The UI
    projections and the typed views")."""
    event = _new(UiEvent)
    fields = event.__dict__
    fields["seq"] = seq
    fields["index"] = index
    fields["last"] = last
    fields["data"] = data
    return event


def _numbered(seq: int, outs: list[JsonDict], after: Optional[ResumePoint]) -> Iterator[UiEvent]:
    last = len(outs) - 1
    for index, out in enumerate(outs):
        if after is None or not after.skips(seq, index):
            yield _ui_event(seq, index, index == last, out)


def _seq(event: EventLike) -> int:
    return event.seq if event.__class__ is Event else fields(event)[0]


def _sync(projection: Projection, events: Iterable[EventLike], after: Optional[ResumePoint]) -> Iterator[UiEvent]:
    for event in events:
        outs = projection.feed(event)
        if outs:
            yield from _numbered(_seq(event), outs, after)


async def _async(projection: Projection, events: AsyncIterable[EventLike], after: Optional[ResumePoint]) -> AsyncIterator[UiEvent]:
    async for event in events:
        outs = projection.feed(event)
        if outs:
            for out in _numbered(_seq(event), outs, after):
                yield out


def project(make: Callable[[], Projection], events: Any, after: Any) -> Any:
    """Runs a fresh projection over ``events``: an iterator for an iterable, an async iterator
    for an async iterable (``log.tail()``)."""
    point = parse_resume(after)
    if hasattr(events, "__aiter__"):
        return _async(make(), events, point)
    if hasattr(events, "__iter__"):
        return _sync(make(), events, point)
    raise TypeError(f"expected an iterable or async iterable of events (log.events(), log.tail()), got {type(events).__name__}")
