"""A kit for testing plugins: run ``pre_step`` listeners against a batch and ``before_tool``
gates against a call without a model, fake a ``next``, run insert transforms, and run whole
scripted turns (deciding the ones that wait for a person) and assert on their events.
Nothing here needs pytest; ``kerman.testing.pytest_plugin`` adds fixtures for it
(``pytest_plugins = ["kerman.testing.pytest_plugin"]``). See docs/plugins.md.

Everything runs on the real machinery: the waterfall is the loop's own ``Next``, transforms
run in a real ``Inbox`` over a memory log, and turns run in a real ``AgentLoop``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Awaitable, Callable, Dict, Generic, Iterable, List, Optional, Sequence, Tuple, TypeVar, Union, cast

from .. import _core
from .._core import AssistantMessage, Event, Inbox, MemoryStore, SessionLog, UserMessage
from ..decisions import Approve, Outcome, PendingDecision
from ..errors import ModelError
from ..events import DECISION_RESOLVED, TOOL_CALL, TOOL_RESULT, TURN_END, AssistantMessageEvent, Ending, TurnEnd, UserMessageEvent, views
from ..loop import AgentLoop
from ..models import ScriptedModel, ScriptItem
from ..types import (
    Decision,
    Enter,
    InsertTransform,
    ModelRequest,
    PreStep,
    PreStepListener,
    Reject,
    Signal,
    Target,
)
from ._gates import GateListener, gate_verdict, make_tool_call, run_gate

__all__ = [
    "make_pre_step",
    "run_pre_step",
    "decide",
    "FakeNext",
    "make_tool_call",
    "run_gate",
    "gate_verdict",
    "GateListener",
    "run_insert",
    "scripted_loop",
    "run_turn",
    "TurnResult",
    "Plugin",
]

T = TypeVar("T")
#: Result codes of calls whose tool did not run (``TurnResult.ran`` leaves them out).
_NOT_RUN = ("TOOL_DENIED", "GATE_ERROR", "ABORTED_BEFORE_DISPATCH")
#: A plugin is a function that registers its listeners, tools and transforms on a loop.
Plugin = Callable[[AgentLoop], object]
Batch = Iterable[Union[UserMessage, str]]


def _no_model(request: ModelRequest) -> Any:
    raise ModelError("kerman.testing: this loop has no model (it only runs pre_step listeners)")


def _messages(batch: Batch) -> List[UserMessage]:
    if isinstance(batch, (str, bytes)):
        raise TypeError("the batch must be a list of messages, not a str (wrap it: [text])")
    out = []
    for item in batch:
        if isinstance(item, str):
            out.append(UserMessage(item))
        elif isinstance(item, UserMessage):
            out.append(item)
        else:
            raise TypeError(f"a batch holds UserMessages or strs, got {type(item).__name__}")
    return out


def make_pre_step(
    batch: Batch, *, turn: int = 1, step: int = 1, loop: Optional[AgentLoop] = None, signal: Optional[Signal] = None
) -> PreStep:
    """The ``PreStep`` payload the loop would build for ``batch`` (``str`` items become user
    messages). Without ``loop``, ``step.loop`` is a fresh ``AgentLoop`` over a memory log whose
    model refuses to be called, so a listener may still ``step.loop.inject(...)`` or read
    ``step.loop.log``."""
    if loop is None:
        loop = AgentLoop(_no_model)
    return PreStep(loop=loop, messages=_messages(batch), turn=turn, step=step, signal=signal or Signal())


def _listeners(listeners: Union[AgentLoop, PreStepListener, Sequence[PreStepListener]]) -> List[Callable[..., Any]]:
    if isinstance(listeners, AgentLoop):
        return list(listeners._pre_step)
    if callable(listeners):
        return [listeners]
    out = list(listeners)
    for fn in out:
        if not callable(fn):
            raise TypeError(f"a pre_step listener must be callable, got {type(fn).__name__}")
    return out


def _decision(value: Any) -> Decision:
    """Reads a waterfall's result as the loop does: ``Enter`` / ``Reject`` or dicts of their
    shape; ``str`` items of an ``Enter`` become user messages."""
    kind = value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)
    if kind == "enter" and (isinstance(value, (dict, Enter))):
        raw = value.get("messages") if isinstance(value, dict) else value.messages
        if isinstance(raw, (list, tuple)) and all(isinstance(m, (str, UserMessage)) for m in raw):
            return Enter(_messages(raw))
    elif kind == "reject" and (isinstance(value, (dict, Reject))):
        reason = value.get("reason") if isinstance(value, dict) else value.reason
        if reason is None or isinstance(reason, str):
            return Reject(reason)
    raise TypeError(f"pre-step listener returned {value!r}; expected Enter or Reject")


async def run_pre_step(
    listeners: Union[AgentLoop, PreStepListener, Sequence[PreStepListener]],
    batch: Union[Batch, PreStep],
    *,
    turn: int = 1,
    step: int = 1,
    loop: Optional[AgentLoop] = None,
    signal: Optional[Signal] = None,
) -> Decision:
    """Runs a ``pre_step`` waterfall over ``batch`` and returns its decision, as the loop would
    read it (an ``Enter`` whose messages are all ``UserMessage``, or a ``Reject``).

    ``listeners`` is one listener, a list (run in that order), or an ``AgentLoop`` whose
    registered listeners run. ``batch`` is a list of messages or ``str``s, or a ``PreStep``
    you built. The waterfall is the loop's own (``next()`` twice pulls the next listener,
    not calling it vetoes, the default enters ``step.messages`` as they are then). A result
    the loop would refuse raises ``TypeError`` with the loop's message; an exception from a
    listener propagates."""
    chain = _listeners(listeners)
    if isinstance(batch, PreStep):
        payload = batch
    else:
        payload = make_pre_step(
            batch,
            turn=turn,
            step=step,
            signal=signal,
            loop=loop if loop is not None else listeners if isinstance(listeners, AgentLoop) else None,
        )

    def default() -> Enter:
        return Enter(payload.messages)

    return _decision(await _core.Next(chain, payload, default)())


def decide(
    listeners: Union[AgentLoop, PreStepListener, Sequence[PreStepListener]], batch: Union[Batch, PreStep], **kwargs: Any
) -> Decision:
    """:func:`run_pre_step` from synchronous code (``asyncio.run``): for a plain test function."""
    return asyncio.run(run_pre_step(listeners, batch, **kwargs))


class FakeNext(Generic[T]):
    """A ``next`` to call a listener with directly: ``await next()`` returns ``result`` (or
    calls it, when it is a zero-argument function, or raises it, when it is an exception).
    ``calls`` counts the calls. ``FakeNext.entering(step)`` returns what the pre-step default
    would: ``Enter(step.messages)`` as they are when it is called."""

    def __init__(self, result: Union[T, Callable[[], T], BaseException]) -> None:
        self._result = result
        self.calls = 0

    @staticmethod
    def entering(step: PreStep) -> FakeNext[Decision]:
        return FakeNext(lambda: Enter(step.messages))

    @staticmethod
    def approving() -> FakeNext[Approve]:
        """A ``before_tool`` ``next`` whose default runs the call: ``Approve()``."""
        return FakeNext(Approve())

    def __call__(self) -> Awaitable[T]:
        self.calls += 1
        return self._resolve()

    async def _resolve(self) -> T:
        result = self._result
        if isinstance(result, BaseException):
            raise result
        if callable(result):
            return result()
        return result

    def __repr__(self) -> str:
        return f"<FakeNext calls={self.calls} result={self._result!r}>"


def run_insert(
    transforms: Union[InsertTransform, Sequence[InsertTransform], AgentLoop], message: Union[UserMessage, str], target: Target = "next-turn"
) -> UserMessage:
    """Inserts ``message`` into a fresh ``Inbox`` (over a memory log) whose insert transforms
    are ``transforms`` (one, a list in order, or an ``AgentLoop``'s), and returns the message
    as stored. A refusal raises ``kerman.InsertRefusedError``, as the real inbox does."""
    if isinstance(transforms, AgentLoop):
        chain = list(transforms.inbox.transforms)
    elif callable(transforms):
        chain = [transforms]
    else:
        chain = list(transforms)
    log = MemoryStore().create()
    inbox = Inbox(log)
    try:
        for fn in chain:
            inbox.on_insert(fn)
        return inbox.append(target, message)
    finally:
        inbox.close()
        log.close()


def scripted_loop(
    replies: Iterable[ScriptItem] = (), *, plugins: Iterable[Plugin] = (), log: Optional[SessionLog] = None, **kwargs: Any
) -> AgentLoop:
    """An ``AgentLoop`` over a ``kerman.models.ScriptedModel(replies)`` (``loop`` keyword
    arguments pass through), with each plugin installed (``plugin(loop)``) in order."""
    loop = AgentLoop(ScriptedModel(replies), log=log, **kwargs)
    for plugin in plugins:
        plugin(loop)
    return loop


class TurnResult:
    """What :func:`run_turn` saw: the events the run appended, read back as the turn's facts."""

    def __init__(self, loop: AgentLoop, events: List[Event], requests: List[ModelRequest]) -> None:
        self.loop = loop
        self.events = events
        self.requests = requests
        #: The requests the run left waiting for a person (empty unless the loop is waiting).
        self.pending: List[PendingDecision] = loop.decisions if loop.status == "waiting" else []

    @property
    def waiting(self) -> bool:
        """Whether the run stopped at decisions: the turn waits for :meth:`decide`."""
        return bool(self.pending)

    @property
    def outcomes(self) -> List[str]:
        """The outcomes of the decisions this run applied (``decision/resolved``), in order:
        ``"approved"``, ``"denied"``, ``"edited"``, ``"answered"``, ``"expired"``, ``"cancelled"``."""
        return [str(e.data.get("outcome")) for e in self.of_type(DECISION_RESOLVED)]

    @property
    def ran(self) -> List[Tuple[str, Any]]:
        """The tool calls whose tool ran, as ``(name, arguments)`` with the arguments parsed: a
        denied, answered or failed-closed call is not here, an edited one has its edited
        arguments."""
        # A denied, answered or failed-closed call logs its tool/call too; its tool never ran.
        skipped = {
            (e.data.get("turn"), e.data.get("callId"))
            for e in self.loop.log.events(types=[DECISION_RESOLVED])
            if e.data.get("outcome") == "answered"
        }
        for e in self.of_type(TOOL_RESULT):
            code = (e.data.get("error") or {}).get("code")
            if code in _NOT_RUN:
                skipped.add((e.data.get("turn"), ((e.data.get("message") or {}).get("source") or {}).get("callId")))
        out = []
        for e in self.of_type(TOOL_CALL):
            if (e.data.get("turn"), e.data.get("callId")) in skipped:
                continue
            try:
                arguments = json.loads(e.data.get("arguments") or "null")
            except ValueError:
                arguments = e.data.get("arguments")
            out.append((str(e.data.get("name")), arguments))
        return out

    def assert_waiting(self, *names: str) -> List[PendingDecision]:
        """Asserts the run stopped at decisions for calls of these tools (in call order, when
        given); returns the pending requests."""
        got = [p.name for p in self.pending]
        if not got or (names and got != list(names)):
            raise AssertionError(
                f"waiting for decisions on {got!r}, expected "
                + (f"{list(names)!r}" if names else "some")
                + f" (loop status {self.loop.status!r}); events: {self.types}"
            )
        return self.pending

    async def decide(self, *outcomes: Outcome, by: Optional[str] = None) -> TurnResult:
        """Decides the requests the loop waits on, one outcome each (``Approve()``,
        ``Deny(reason)``, ``Edit(arguments)``, ``Answer(value)``) in the order of
        ``loop.decisions``, waits until the loop is idle (or waits again), and returns what
        that continuation appended."""
        loop = self.loop
        pending = loop.decisions if loop.status == "waiting" else []
        if not pending:
            raise AssertionError(f"nothing waits for a decision (loop status {loop.status!r})")
        if len(outcomes) != len(pending):
            raise TypeError(
                f"{len(pending)} request(s) wait ({', '.join(p.name for p in pending)}); "
                f"decide() takes one outcome each, got {len(outcomes)}"
            )

        def act() -> None:
            for request, outcome in zip(pending, outcomes, strict=True):
                loop.decide(request.decision_id, outcome, by=by)

        return await _run(loop, act)

    @property
    def types(self) -> List[str]:
        """The event types, in log order."""
        return [e.type for e in self.events]

    def of_type(self, *types: str) -> List[Event]:
        return [e for e in self.events if e.type in types]

    def _ending(self) -> Ending:
        ends = [v for v in views(self.events) if isinstance(v, TurnEnd)]
        if not ends:
            raise AssertionError(f"no turn ended in this run; events: {self.types}")
        return ends[-1].reason

    @property
    def ending(self) -> Dict[str, Any]:
        """The last ``turn/end``'s reason (``{"kind": "completed"}``, ``{"kind": "blocked", ...}``...)."""
        return self._ending().raw

    @property
    def kind(self) -> str:
        return str(self._ending().kind)

    @property
    def entered(self) -> List[UserMessage]:
        """The user messages that entered steps (``user/message`` events), in order."""
        return [cast(UserMessage, UserMessage.from_dict(v.message.raw)) for v in views(self.events) if isinstance(v, UserMessageEvent)]

    @property
    def replies(self) -> List[AssistantMessage]:
        """The assistant messages logged, in order."""
        return [
            cast(AssistantMessage, AssistantMessage.from_dict(v.message.raw))
            for v in views(self.events)
            if isinstance(v, AssistantMessageEvent)
        ]

    def assert_types(self, *types: str) -> None:
        """Asserts ``types`` occur in this order among the events (others may come between)."""
        it = iter(self.types)
        missing = [t for t in types if not any(t == seen for seen in it)]
        if missing:
            raise AssertionError(
                f"expected event types {list(types)} in order; {missing[0]!r} is missing after the ones before it. Events: {self.types}"
            )

    def assert_entered(self, *texts: str) -> None:
        """Asserts the texts of the entered user messages."""
        got = [m.text for m in self.entered]
        if got != list(texts):
            raise AssertionError(f"entered {got!r}, expected {list(texts)!r}")

    def assert_completed(self) -> None:
        if self.kind != "completed":
            raise AssertionError(f"the turn ended {self.ending!r}, expected completed")

    def assert_blocked(self, reason: Optional[str] = None) -> None:
        """Asserts the turn was rejected by a pre-step listener (with this ``reason``, if given)."""
        if self.kind != "blocked" or (reason is not None and self._ending().blocked_reason != reason):
            want = {"kind": "blocked"} if reason is None else {"kind": "blocked", "reason": reason}
            raise AssertionError(f"the turn ended {self.ending!r}, expected {want!r}")

    def assert_error(self, code: Optional[str] = None) -> Dict[str, Any]:
        """Asserts the turn failed (with this failure ``code``, if given); returns the failure."""
        error = self._ending().error
        if self.kind != "error" or error is None or (code is not None and error.code != code):
            raise AssertionError(f"the turn ended {self.ending!r}, expected an error" + (f" {code}" if code else ""))
        return error.raw

    def __repr__(self) -> str:
        return f"<TurnResult {len(self.events)} events, ended {self.ending if self.of_type(TURN_END) else None!r}>"


async def run_turn(
    loop: AgentLoop, prompt: Union[UserMessage, str], *, replies: Iterable[ScriptItem] = (), target: Target = "next-turn"
) -> TurnResult:
    """Sends ``prompt`` (``followup``, or ``steer`` for ``target="next-step"``), waits until the
    loop is idle (or waits for decisions: then ``result.decide(...)`` goes on), and returns what
    the run appended. ``replies`` are added to the script of a
    loop made by :func:`scripted_loop` first. An insert transform's refusal raises here, as
    from ``followup``."""
    model = loop._model
    extra = list(replies)
    if extra:
        if not isinstance(model, ScriptedModel):
            raise TypeError(f"replies= needs a loop over a ScriptedModel (kerman.testing.scripted_loop), not {model!r}")
        model.add(*extra)
    return await _run(loop, lambda: loop.send(prompt, target, True))


async def _run(loop: AgentLoop, act: Callable[[], object]) -> TurnResult:
    """``act()``, then waits until the loop is idle (or waiting): what that run appended."""
    model = loop._model
    seen = len(model.requests) if isinstance(model, ScriptedModel) else 0
    start = len(loop.log)
    act()
    await loop.when_idle()
    requests = model.requests[seen:] if isinstance(model, ScriptedModel) else []
    return TurnResult(loop, list(loop.log.events(start)), requests)
