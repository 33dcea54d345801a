"""``loop.run(prompt)``: one call that sends a prompt, waits for the turn that took it, and
returns what the log says that turn did (``RunResult``), or raises ``RunError``.

Which turn is the run's is read from the loop, not guessed from "the next idle": the inbox's
claim names the turn that took the prompt (the loop's claim callback calls :meth:`Runs.claimed`
directly, without building the ``agent/inbox/claimed`` live event), and the log's ``turn/end``
of that turn ends the run, read once the loop claims input for a later turn or goes idle. One
claim hook per loop serves every run in flight, so concurrent runs each get their own turn's
answer.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, Generic, List, Optional, Tuple, TypeVar, Union

from ._core import Message, UserMessage
from .errors import KermanError
from .output import OutputSpec, text_of
from .usage import Totals, ledger
from .usage._prices import model_of

if TYPE_CHECKING:
    from .loop import AgentLoop

__all__ = ["RunResult", "RunError"]

T = TypeVar("T")

# Endings a run returns; every other one raises RunError.
RETURNED = ("completed", "max-tokens")


class RunResult(Generic[T]):
    """What ``loop.run()`` returns: the turn's final ``text`` (its last assistant message's
    text), ``output`` (the validated structured output with ``output_type``, else the text),
    ``usage`` (the turn's ``kerman.usage.Totals`` from the usage ledger: tokens by kind,
    requests, tool calls, cost; read from the log when first asked for), ``ending`` (the
    ``turn/end`` reason), ``messages`` (the turn's user, assistant and tool-result messages, in
    log order, read from the log when first asked for) and ``turn`` (its number)."""

    __slots__ = ("text", "output", "_usage", "ending", "turn", "session", "_log", "_span", "_messages")

    def __init__(
        self,
        text: str,
        output: T,
        usage: Union[Totals, Callable[[], Totals]],
        ending: Dict[str, Any],
        turn: int,
        log: Any,
        span: Optional[Tuple[int, Optional[int]]],
    ) -> None:
        self.text = text
        self.output = output
        self._usage = usage  # Totals, or how to read them (the ledger, priced, on first read)
        self.ending = ending
        self.turn = turn
        self.session: str = log.id
        self._log = log
        self._span = span
        self._messages: Optional[List[Message]] = None

    @property
    def usage(self) -> Totals:
        usage = self._usage
        if not isinstance(usage, Totals):
            usage = self._usage = usage()
        return usage

    @property
    def messages(self) -> List[Message]:
        if self._messages is None:
            found: List[Message] = []
            if self._span is not None:
                start, stop = self._span
                for event in self._log.events(start, stop, types=_MESSAGE_TYPES):
                    data = event.data
                    found.append(Message.from_dict(data if event.type == "user/message" else data["message"]))
            self._messages = found
        return self._messages

    def __repr__(self) -> str:
        text = self.text if len(self.text) <= 60 else self.text[:57] + "..."
        output = "" if self.output is self.text else f" output={self.output!r}"
        usage = f" tokens={self.usage.tokens}" if self.usage.requests else ""
        return f"<RunResult turn={self.turn} {self.ending.get('kind')} text={text!r}{output}{usage} session={self.session!r}>"


_MESSAGE_TYPES = ("user/message", "assistant/message", "tool/result")


class RunError(KermanError):
    """The turn of a ``loop.run()`` did not complete. ``ending`` is its ``turn/end`` reason
    (``{"kind": "error", "error": {...}}``, ``{"kind": "aborted", ...}``,
    ``{"kind": "blocked", ...}``, ``{"kind": "interrupted"}``), or ``{"kind": "discarded"}``
    when the prompt was discarded before any turn took it (``loop.cancel()``). ``failure`` is
    the error dict of a failed turn, ``code`` its code (``INVALID_OUTPUT``: the reply never
    matched the output type); ``result`` what the turn did, when it started."""

    def __init__(self, message: str, ending: Dict[str, Any], turn: Optional[int], result: Optional[RunResult[Any]] = None) -> None:
        super().__init__(message)
        self.ending = ending
        self.turn = turn
        self.result = result

    @property
    def kind(self) -> str:
        return str(self.ending.get("kind"))

    @property
    def failure(self) -> Optional[Dict[str, Any]]:
        error = self.ending.get("error")
        return error if isinstance(error, dict) else None

    @property
    def code(self) -> Optional[str]:
        failure = self.failure
        return None if failure is None else failure.get("code")


class _Run:
    """One ``run()`` in flight: its prompt's id, the turn that took it, how that turn ended."""

    __slots__ = ("message_id", "spec", "sent", "turn", "start", "end", "ending", "output", "future")

    def __init__(self, message_id: str, spec: Optional[OutputSpec], future: asyncio.Future[None], sent: int) -> None:
        self.message_id = message_id
        self.spec = spec
        self.sent = sent  # the log's length when the prompt was sent
        self.turn: Optional[int] = None
        self.start: Optional[int] = None
        self.end: Optional[int] = None
        self.ending: Optional[Dict[str, Any]] = None
        self.output: Any = None
        self.future = future


class Runs:
    """The runs in flight on one loop. While there is one, it listens to the inbox's claims and
    discards; with none, it costs nothing.

    It does not follow the log (a callback per logged event cost a one-turn run more than
    ``followup`` + ``when_idle`` pay in all). A turn's end is known without it: once a turn has
    ended, either the loop claims input for a later turn or its driver finishes and the loop
    goes idle (a turn waiting for decisions is neither). Either way the turns of runs that took
    their prompts before then have ended, and their ``turn/end`` is read from the log."""

    def __init__(self, loop: AgentLoop) -> None:
        self.loop = loop
        self.log = loop._log
        self.by_message: Dict[str, _Run] = {}
        self.by_turn: Dict[int, _Run] = {}
        # _gate opens the inbox's claim callback (it calls back only while the list is not
        # empty); the claims themselves reach claimed() below, not through the live event.
        listeners = loop._listeners
        self._claimed_listeners = listeners["agent/inbox/claimed"]
        self._discarded_listeners = listeners["agent/inbox/discarded"]
        self._claimed_listeners.append(_gate)
        self._discarded_listeners.append(self._discarded)
        self._listening = True

    # -- observing --

    def claimed(self, message_id: str, turn: int) -> None:
        """Turn ``turn`` claimed message ``message_id`` (the loop's claim callback)."""
        by_turn = self.by_turn
        if by_turn:
            # A claim for a later turn: the turns of earlier runs are over.
            for earlier in [r for r in by_turn.values() if r.turn is not None and r.turn < turn and r.ending is None]:
                self._ended(earlier)
        run = self.by_message.get(message_id)
        if run is not None and run.turn is None:
            run.turn = turn
            # The seq of the turn's turn/start: the claim's own splice is the log's last event
            # and the turn/start the one before it (the loop writes them so); else looked up.
            log = self.log
            at = len(log) - 2
            run.start = at if at >= run.sent and log[at].type == "turn/start" else self._start_of(run, turn)
            by_turn[turn] = run
            if run.spec is not None:
                self.loop._output_turns[turn] = run.spec

    def _discarded(self, live: Any) -> None:
        run = self.by_message.get(live.message.id)
        if run is not None and run.turn is None:
            self._finish(run, {"kind": "discarded"}, None, None)

    def _start_of(self, run: _Run, turn: int) -> Optional[int]:
        """The seq of turn ``turn``'s ``turn/start``: after the run's prompt was sent (its
        turn started after that), read by the log's own type filter."""
        for event in self.loop.log.events(run.sent, types="turn/start"):
            if event.data.get("turn") == turn:
                return int(event.seq)
        return None

    def _ended(self, run: _Run) -> bool:
        """Finishes ``run`` with its turn's ``turn/end``, read from the log (False: none yet):
        the log's last event when the loop went idle after it, else looked up."""
        log = self.log
        at = len(log) - 1
        if at >= 0:
            tail = log[at]
            if tail.type == "turn/end":
                data = tail.data
                if data.get("turn") == run.turn:  # what _end_with does, written out: every run passes here
                    last = self.loop._last_output
                    self._finish(run, data.get("reason") or {}, at, last[1] if last is not None and last[0] == run.turn else None)
                    return True
        for event in log.events(run.sent if run.start is None else run.start, types="turn/end"):
            if self._end_with(run, event):
                return True
        return False

    def _end_with(self, run: _Run, event: Any) -> bool:
        data = event.data
        if data.get("turn") != run.turn:
            return False
        last = self.loop._last_output
        self._finish(run, data.get("reason") or {}, event.seq, last[1] if last is not None and last[0] == run.turn else None)
        return True

    def idle(self) -> None:
        """The loop went idle (``AgentLoop._finish_driver``) while runs are in flight."""
        waiting = False
        for run in list(self.by_turn.values()):
            if run.ending is None:
                self._ended(run)
        for run in self.by_message.values():
            if run.ending is None:
                waiting = True
                break
        # An earlier turn failed or was blocked: the loop idles with input pending. A run waits
        # for its own prompt's turn, so it wakes the loop (after the driver has finished).
        event_loop = self.loop._event_loop
        if waiting and event_loop is not None:
            event_loop.call_soon(self._kick)

    def _kick(self) -> None:
        loop = self.loop
        if loop.status != "idle" or loop.closed:
            return
        for run in list(self.by_message.values()):
            if run.turn is not None and run.ending is None and not self._ended(run):
                # Its turn started and the loop went idle without a turn/end: fenced or closed.
                self._finish(run, {"kind": "stopped", "reason": "the loop stopped before the turn ended"}, None, None)
        if any(run.turn is None and run.message_id in loop.inbox for run in self.by_message.values()):
            loop.wake()

    def _finish(self, run: _Run, ending: Dict[str, Any], end: Optional[int], output: Any) -> None:
        if run.ending is not None:
            return
        run.ending = ending
        run.end = end
        run.output = output
        future = run.future
        event_loop = future.get_loop()
        if threading.get_ident() == self.loop._loop_thread:
            if not future.done():
                future.set_result(None)
        else:
            event_loop.call_soon_threadsafe(_settle, future)

    # -- one run --

    def drop(self, run: _Run) -> None:
        by_message = self.by_message
        by_message.pop(run.message_id, None)
        if run.turn is not None:
            self.by_turn.pop(run.turn, None)
            self.loop._output_turns.pop(run.turn, None)
        if not by_message:
            # No run left: the claim callback closes again, and no cycle is left behind (the
            # loop is freed by reference counting).
            if _gate in self._claimed_listeners:
                self._claimed_listeners.remove(_gate)
            discarded = self._discarded
            if discarded in self._discarded_listeners:
                self._discarded_listeners.remove(discarded)
            self._listening = False
            self.loop._runs_in_flight = None

    def result(self, run: _Run) -> RunResult[Any]:
        """The run's result, read from the log between its turn's start and end."""
        loop = self.loop
        log = self.log
        ending = run.ending or {}
        text = ""
        span = None
        usage: Union[Totals, Callable[[], Totals]]
        if run.start is not None:
            span = (run.start, run.end + 1 if run.end is not None else None)
            text = _final_text(log, span)
            # Read (and priced, as the loop's model prices) when first asked for: the ledger is
            # most of what a run costs.
            usage = functools.partial(_ledger_turn, log, span, run.turn or 0, loop._model)
        else:
            usage = Totals()
        spec = run.spec if run.spec is not None else loop._output_type
        output = run.output if spec is not None else text
        return RunResult(text, output, usage, ending, run.turn or 0, log, span)


# What a turn logs after its final assistant message, before its turn/end.
_AFTER_FINAL = ("step/end", "output/validated")


def _final_text(log: Any, span: Tuple[int, Optional[int]]) -> str:
    """The text of the span's last assistant message: found walking back from the turn's end
    over what follows the final reply (a step's end, the validated output), else looked up."""
    start, stop = span
    if stop is not None:
        at = stop - 2  # the event before the turn/end
        while at >= start:
            event = log[at]
            kind = event.type
            if kind == "assistant/message":
                return text_of(event.data["message"])
            if kind not in _AFTER_FINAL:
                break
            at -= 1
    text = ""
    for event in log.events(start, stop, types="assistant/message"):
        text = text_of(event.data["message"])
    return text


def _gate(_live: Any) -> None:
    """The listener that keeps the inbox's claim callback open while runs are in flight."""


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _ledger_turn(log: Any, span: Tuple[int, Optional[int]], turn: int, loop_model: Any) -> Totals:
    """The turn's totals from the usage ledger (``kerman.usage.ledger``) over the turn's events,
    priced as the ledger prices a loop (genai-prices when installed, the loop's model)."""
    model, provider = model_of(loop_model)
    return ledger(log.events(span[0], span[1]), model=model, provider=provider).turn(turn)


def error_of(result: RunResult[Any]) -> RunError:
    """The ``RunError`` of a run whose turn did not complete."""
    ending = result.ending
    kind = ending.get("kind")
    turn = result.turn or None
    where = f"turn {turn}" if turn else "the run's prompt"
    if kind == "error":
        error = ending.get("error") or {}
        text = f"{where} failed: {error.get('message')} [{error.get('code')}]"
    elif kind == "aborted":
        cause = ending.get("reason") or {}
        text = f"{where} was cancelled (cause {cause.get('kind')!r})"
    elif kind == "blocked":
        text = f"{where} was rejected by a pre-step decision" + (f": {ending['reason']}" if ending.get("reason") else "")
    elif kind == "budget":
        text = (
            f"{where} stopped: its budget is spent ({ending.get('limit')} {ending.get('spent')} of {ending.get('max')} "
            f"per {ending.get('per')}, at the {ending.get('at')})"
        )
    elif kind == "discarded":
        text = f"{where} was discarded from the inbox (loop.cancel()) before a turn took it"
    else:
        text = f"{where} ended {kind!r}" + (f": {ending['reason']}" if isinstance(ending.get("reason"), str) else "")
    return RunError(text, ending, turn, result if turn else None)


async def run(loop: AgentLoop, prompt: Any, *, output_type: Any = None) -> RunResult[Any]:
    """Sends ``prompt`` as a followup, waits for the turn that takes it (not merely the next
    idle: steering and other runs may go on meanwhile) and returns its
    :class:`~kerman.RunResult`. ``output_type`` (a pydantic model, dataclass, TypedDict or
    JSON-schema dict) is this turn's structured output, over the loop's ``output_type``.

    A turn that ends ``completed`` or ``max-tokens`` returns; any other ending raises
    :class:`~kerman.RunError` (failed, incl. ``INVALID_OUTPUT``; cancelled; rejected by a
    ``pre_step`` decision; a prompt discarded by ``cancel()`` before its turn). Cancelling
    the task that awaits ``run()`` withdraws the prompt, or cancels its turn if one took it.

    (``AgentLoop.run`` is this function itself, so that a run awaits no second coroutine.)"""
    if isinstance(prompt, str):
        prompt = UserMessage(prompt)
    elif not isinstance(prompt, UserMessage):
        raise TypeError(f"prompt must be a str or a UserMessage, got {type(prompt).__name__}")
    if output_type is None:
        spec = None
    else:
        spec = output_type if isinstance(output_type, OutputSpec) else OutputSpec(output_type)
        loop._install_output()
    runs = loop._runs_in_flight
    if runs is None:
        runs = loop._runs_in_flight = Runs(loop)
    # Registered before the prompt is sent: on an idle loop, followup() claims it at once.
    record = _Run(prompt.id, spec, asyncio.get_running_loop().create_future(), len(runs.log))
    runs.by_message[record.message_id] = record
    try:
        try:
            stored = loop.followup(prompt)
        except BaseException:
            runs.drop(record)
            raise
        if stored.id != record.message_id:  # an insert transform gave it another id
            runs.by_message.pop(record.message_id, None)
            record.message_id = stored.id
            runs.by_message[stored.id] = record
        try:
            await record.future
        except asyncio.CancelledError:
            _withdraw(loop, record)
            raise
        result = runs.result(record)
    finally:
        runs.drop(record)
    if result.ending.get("kind") not in RETURNED:
        raise error_of(result)
    return result


def _withdraw(loop: AgentLoop, record: _Run) -> None:
    """The task awaiting a run was cancelled: its prompt leaves the inbox if no turn took it
    yet, else its turn is cancelled (the queue is kept: other prompts are not this run's)."""
    if record.ending is not None:
        return
    if record.turn is None:
        loop.inbox.remove(record.message_id)
    elif loop.turn == record.turn and loop.status != "idle":
        loop.cancel("user", keep_inbox=True)
