"""The pure-Python baseline: Kerman's public API subset written the way a competent user would
write it without Kerman — asyncio, plain lists and dicts, ``json.dumps`` per event, UUIDv7 ids
from ``os.urandom``, a waterfall of closures, one writer thread per file-backed log.

It is the yardstick of ``bench.py`` (docs/performance.md), so it must stay honest: no sleeps,
no extra copies, the same events with the same payloads as Kerman. Where a competent user
would take a shortcut Kerman cannot (skip lossless-JSON checks beyond ``allow_nan=False``,
``zlib.crc32`` instead of CRC-32C, no cancellation plumbing in the loop, several tool calls
gathered rather than scheduled), the baseline takes it. The parity tests
(tests/python/parity/test_parity_*.py, ``--impl``) hold it to Kerman's behaviour on that subset.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Deque, Dict, Iterator, List, Optional, Sequence, Tuple, Union
from urllib.parse import quote

NEXT_TURN, NEXT_STEP, SPLICED = "next-turn", "next-step", "agent/inbox/spliced"
_log = logging.getLogger("baseline")
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def uuid7() -> str:
    """A time-ordered UUIDv7 string (48-bit ms timestamp, version, variant, 74 random bits)."""
    r = int.from_bytes(os.urandom(10), "big")
    h = "%032x" % ((time.time_ns() // 1_000_000) << 80 | 0x7 << 76 | (r >> 68) << 64 | 0b10 << 62 | r & (1 << 62) - 1)
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


# ---- messages ----------------------------------------------------------------------------------


class Message:
    """A message as a small slotted object; content and source are the caller's (not copied)."""

    __slots__ = ("id", "role", "content", "source")

    def __init__(self, role: str, content: Union[str, List[Dict[str, Any]]], source: Dict[str, Any], id: Optional[str] = None) -> None:
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        elif not isinstance(content, list):
            raise ValueError("content must be a str or a list of blocks")
        if id is not None and (not isinstance(id, str) or not id):
            raise ValueError("id must be a non-empty str")
        self.id = id or uuid7()
        self.role, self.content, self.source = role, content, source

    @property
    def text(self) -> str:
        return "\n".join(b["text"] for b in self.content if b.get("type") == "text")

    def to_dict(self) -> Dict[str, Any]:
        return {"id": self.id, "role": self.role, "content": self.content, "source": self.source}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Message) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]


def UserMessage(content: Union[str, List[Dict[str, Any]]], source: Optional[Dict[str, Any]] = None, id: Optional[str] = None) -> Message:
    return Message("user", content, source or {"kind": "user"}, id)


def AssistantMessage(content: List[Dict[str, Any]]) -> Message:
    return Message("assistant", content, {"kind": "model"})


def ToolResultMessage(call_id: str, text: str, is_error: bool = False) -> Message:
    block: Dict[str, Any] = {"type": "tool-result", "toolCallId": call_id, "content": [{"type": "text", "text": text}]}
    if is_error:
        block["isError"] = True
    return Message("user", [block], {"kind": "tool", "callId": call_id})


def message_from_dict(d: Dict[str, Any]) -> Message:
    return Message(d["role"], d["content"], d["source"], d["id"])


# ---- the session log ---------------------------------------------------------------------------


class Event:
    """A committed event: the record's compact JSON, with ``data`` decoded on first access."""

    __slots__ = ("seq", "time", "type", "json", "_data")

    def __init__(self, seq: int, when: int, type: str, text: str) -> None:
        self.seq, self.time, self.type, self.json, self._data = seq, when, type, text, None

    @property
    def data(self) -> Any:
        if self._data is None:
            self._data = json.loads(self.json)["data"]
        return self._data

    def to_json(self) -> str:
        return self.json


class Log:
    """Append-only list of events with observers; a writer (file store) gets each record line."""

    def __init__(self, id: str, header: Dict[str, Any], events: Optional[List[Event]] = None, writer: Optional[_Writer] = None) -> None:
        self.id, self.header, self.closed = id, header, False
        self._events: List[Event] = events or []
        self._last_time = self._events[-1].time if self._events else 0
        self._observers: List[Callable[[Event], Any]] = []
        self._publishing = False
        self._writer = writer

    def __len__(self) -> int:
        return len(self._events)

    def __getitem__(self, seq: int) -> Event:
        return self._events[seq]

    def events(self, start: int = 0, stop: Optional[int] = None, types: Optional[Sequence[str]] = None) -> Iterator[Event]:
        events = self._events[start:stop]
        if types is None:
            return iter(events)
        wanted = {types} if isinstance(types, str) else set(types)
        return (e for e in events if e.type in wanted)

    def subscribe(self, callback: Callable[[Event], Any]) -> Callable[[], None]:
        self._observers.append(callback)
        return lambda: self._observers.remove(callback)

    def append(self, type: str, data: Any, source_event_seqs: Optional[List[int]] = None, surface_op: Optional[str] = None) -> Event:
        if self.closed:
            raise RuntimeError(f"session {self.id!r} is closed")
        if self._publishing:
            raise RuntimeError("session append cannot reenter while another append is being published")
        now = time.time_ns() // 1_000_000
        if now < self._last_time:
            now = self._last_time
        seq = len(self._events)
        record = {"type": type, "seq": seq, "time": now, "data": data}
        if source_event_seqs is not None:
            record["sourceEventSeqs"] = source_event_seqs
        if surface_op is not None:
            record["surfaceOp"] = surface_op
        text = _dumps(record)  # validates (allow_nan=False) and snapshots the data
        if self._writer is not None:
            self._writer.submit(text)
        event = Event(seq, now, type, text)
        self._events.append(event)
        self._last_time = now
        if self._observers:
            self._publishing = True
            try:
                for observer in list(self._observers):
                    try:
                        observer(event)
                    except Exception:
                        _log.exception("log observer failed")
            finally:
                self._publishing = False
        return event

    async def flush(self) -> None:
        if self._writer is not None:
            await self._writer.flush()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self._writer is not None:
                self._writer.close()


class MemoryStore:
    def __init__(self) -> None:
        self._logs: Dict[str, Log] = {}

    def create(self, id: Optional[str] = None) -> Log:
        id = id or uuid7()
        if id in self._logs:
            raise ValueError(f"session {id!r} exists")
        log = self._logs[id] = Log(id, {"version": 1, "id": id, "createdAt": time.time_ns() // 1_000_000})
        return log

    def open(self, id: str) -> Log:
        return self._logs[id]


class _Writer:
    """One thread per log: writes whatever is pending with one ``write`` (group commit), then
    ``fdatasync``s it (``strict``: at once; ``batch``: within 50 ms or at a flush; ``none``:
    never). Flush futures complete on their event loop via one ``call_soon_threadsafe`` per batch."""

    def __init__(self, fd: int, durability: str) -> None:
        self._fd, self._durability = fd, durability
        self._pending: Deque[bytes] = deque()
        self._wake = threading.Event()
        self._flush_requested = threading.Event()
        self._lock = threading.Lock()
        self._submitted = 0  # lines handed over (caller side)
        self._durable = 0  # lines written and synced (writer side, under _lock)
        self._waiters: List[Tuple[int, asyncio.Future[None], asyncio.AbstractEventLoop]] = []
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="baseline-writer", daemon=True)
        self._thread.start()

    def submit(self, text: str) -> None:
        body = text.encode()
        self._pending.append(b"%08x %s\n" % (zlib.crc32(body), body))
        self._submitted += 1
        if self._durability in ("strict", "none"):
            self._wake.set()

    async def flush(self) -> None:
        target = self._submitted
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._durable >= target:
                return
            future = loop.create_future()
            self._waiters.append((target, future, loop))
        self._flush_requested.set()
        self._wake.set()
        await future

    def _run(self) -> None:
        written = 0
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._durability == "batch" and not self._closing:
                self._flush_requested.wait(0.05)
            self._flush_requested.clear()
            batch = []
            while self._pending:
                batch.append(self._pending.popleft())
            if batch:
                data = memoryview(b"".join(batch))
                while data:
                    data = data[os.write(self._fd, data) :]
                written += len(batch)
                if self._durability != "none":
                    os.fdatasync(self._fd)
            with self._lock:
                self._durable = written
                ready = [w for w in self._waiters if w[0] <= written]
                self._waiters = [w for w in self._waiters if w[0] > written]
            by_loop: Dict[asyncio.AbstractEventLoop, List[asyncio.Future[None]]] = {}
            for _, future, loop in ready:
                by_loop.setdefault(loop, []).append(future)
            for loop, futures in by_loop.items():
                loop.call_soon_threadsafe(_resolve, futures)
            if self._closing and not self._pending:
                os.close(self._fd)
                return

    def close(self) -> None:
        self._closing = True
        self._wake.set()
        self._thread.join()


def _resolve(futures: List[asyncio.Future[None]]) -> None:
    for future in futures:
        if not future.done():
            future.set_result(None)


class FileStore:
    """One ``<root>/<quoted id>.jsonl`` per session: ``<crc32 hex> <json>`` lines, header first."""

    def __init__(self, root: str, durability: str = "strict") -> None:
        if durability not in ("strict", "batch", "none"):
            raise ValueError(f"unknown durability {durability!r}")
        self.root, self.durability = root, durability
        os.makedirs(root, exist_ok=True)

    def _path(self, id: str) -> str:
        return os.path.join(self.root, quote(id, safe="") + ".jsonl")

    def create(self, id: Optional[str] = None) -> Log:
        id = id or uuid7()
        header = {"type": "session", "version": 1, "id": id, "createdAt": time.time_ns() // 1_000_000}
        body = _dumps(header).encode()
        fd = os.open(self._path(id), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        os.write(fd, b"%08x %s\n" % (zlib.crc32(body), body))
        os.fsync(fd)
        del header["type"]
        return Log(id, header, None, _Writer(fd, self.durability))

    def open(self, id: str) -> Log:
        """Verifies every line; cuts a torn tail, refuses corruption (a bad line with good ones after)."""
        path = self._path(id)
        events: List[Event] = []
        header: Optional[Dict[str, Any]] = None
        good, bad_line, loads, crc32 = 0, 0, json.loads, zlib.crc32
        with open(path, "rb") as f:
            for n, line in enumerate(f, 1):
                body, record = line[9:-1], None
                if line[-1:] == b"\n" and line[8:9] == b" " and line[:8] == b"%08x" % crc32(body):
                    try:
                        record = loads(body)
                    except ValueError:
                        pass
                if bad_line:
                    if record is not None:
                        raise ValueError(f"{path}: corrupt record on line {bad_line}")
                elif record is None or (header is not None and record.get("seq") != len(events)):
                    bad_line = n
                elif header is None:
                    header = record
                    del header["type"]
                else:
                    events.append(Event(record["seq"], record["time"], record["type"], body.decode()))
                if not bad_line:
                    good += len(line)
        if header is None:
            raise ValueError(f"{path}: no header")
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        if bad_line:
            os.ftruncate(fd, good)
        return Log(id, header, events, _Writer(fd, self.durability))


# ---- the inbox ---------------------------------------------------------------------------------


class DuplicateMessageError(ValueError):
    pass


class Inbox:
    """Two lists of user messages; every change is logged as one splice before the lists change."""

    def __init__(
        self,
        log: Log,
        on_inserted: Optional[Callable[[Message], Any]] = None,
        on_discarded: Optional[Callable[[Message], Any]] = None,
        on_claimed: Optional[Callable[[Message, int], Any]] = None,
    ) -> None:
        self.log = log
        self._lists: Dict[str, List[Message]] = {NEXT_TURN: [], NEXT_STEP: []}
        self._where: Dict[str, str] = {}  # pending id -> target
        self.on_inserted, self.on_discarded, self.on_claimed = on_inserted, on_discarded, on_claimed
        for event in log.events(types=SPLICED):
            try:
                self._replay(event.data)
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"invalid persisted inbox splice at session seq {event.seq}") from exc

    def _replay(self, d: Dict[str, Any]) -> None:
        items = self._lists[d["target"]]
        start, removed = d["start"], d.get("removedCount", 0)
        if not 0 <= start <= start + removed <= len(items):
            raise ValueError("invalid inbox splice")
        self._apply(d["target"], start, removed, [message_from_dict(m) for m in d["inserted"]])

    @property
    def next_turn(self) -> Tuple[Message, ...]:
        return tuple(self._lists[NEXT_TURN])

    @property
    def next_step(self) -> Tuple[Message, ...]:
        return tuple(self._lists[NEXT_STEP])

    @property
    def has_pending(self) -> bool:
        return bool(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, id: object) -> bool:
        return id in self._where

    @staticmethod
    def _message(message: Union[str, Message]) -> Message:
        if isinstance(message, str):
            return UserMessage(message)
        if not isinstance(message, Message) or message.role != "user":
            raise TypeError("expected a str or a user Message")
        return message

    def _target(self, target: str) -> List[Message]:
        try:
            return self._lists[target]
        except KeyError:
            raise ValueError(f'target must be "next-turn" or "next-step", got {target!r}') from None

    def append(self, target: str, message: Union[str, Message]) -> Message:
        items, m = self._target(target), self._message(message)
        if m.id in self._where:
            raise DuplicateMessageError(f'message "{m.id}" is already pending')
        self.log.append(SPLICED, {"target": target, "start": len(items), "inserted": [m.to_dict()]})
        items.append(m)
        self._where[m.id] = target
        if self.on_inserted:
            self.on_inserted(m)
        return m

    def prepend(self, target: str, message: Union[str, Message]) -> Message:
        self.splice(target, 0, 0, [message])
        return self._lists[target][0]

    def splice(self, target: str, start: int, delete_count: int, inserted: Sequence[Union[str, Message]] = ()) -> List[Message]:
        items = self._target(target)
        for name, value in (("start", start), ("delete_count", delete_count)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        new = [self._message(m) for m in inserted]
        n = len(items)
        start = max(n + start, 0) if start < 0 else min(start, n)
        count = max(0, min(delete_count, n - start))
        if not count and not new:
            return []
        leaving = {m.id for m in items[start : start + count]}
        seen = set()
        for m in new:
            if m.id in seen or (m.id in self._where and m.id not in leaving):
                raise DuplicateMessageError(f'message "{m.id}" is already pending')
            seen.add(m.id)
        return self._splice(target, start, count, new, True)

    def _splice(self, target: str, start: int, count: int, new: List[Message], ordinary: bool) -> List[Message]:
        payload: Dict[str, Any] = {"target": target, "start": start}
        if count:
            payload["removedCount"] = count
        payload["inserted"] = [m.to_dict() for m in new]
        if count and ordinary:
            payload["outcome"] = "canceled"
        self.log.append(SPLICED, payload)
        removed = self._apply(target, start, count, new)
        if ordinary and self.on_discarded:
            for m in removed:
                self.on_discarded(m)
        if self.on_inserted:
            for m in new:
                self.on_inserted(m)
        return removed

    def _apply(self, target: str, start: int, count: int, new: List[Message]) -> List[Message]:
        items = self._lists[target]
        removed = items[start : start + count]
        items[start : start + count] = new
        for m in removed:
            del self._where[m.id]
        for m in new:
            if m.id in self._where:
                raise DuplicateMessageError(f'message "{m.id}" is already pending')
            self._where[m.id] = target
        return removed

    def _locate(self, id: str) -> Optional[Tuple[str, int]]:
        target = self._where.get(id)
        if target is None:
            return None
        for i, m in enumerate(self._lists[target]):
            if m.id == id:
                return target, i
        return None

    def get(self, id: str) -> Optional[Message]:
        found = self._locate(id)
        return None if found is None else self._lists[found[0]][found[1]]

    def replace(self, message_id: str, new_message: Union[str, Message]) -> bool:
        found, m = self._locate(message_id), self._message(new_message)
        if found is None:
            return False
        if m.id != message_id and m.id in self._where:
            raise DuplicateMessageError(f'message "{m.id}" is already pending')
        self._splice(found[0], found[1], 1, [m], True)
        return True

    def remove(self, message_id: str) -> bool:
        found = self._locate(message_id)
        if found is None:
            return False
        self._splice(found[0], found[1], 1, [], True)
        return True

    def clear(self) -> List[Message]:
        out: List[Message] = []
        for target in (NEXT_STEP, NEXT_TURN):
            if self._lists[target]:
                out += self._splice(target, 0, len(self._lists[target]), [], True)
        return out

    def claim(self, target: str, turn: int) -> List[Message]:
        self._target(target)
        batch: List[Message] = []
        if self._lists[NEXT_STEP]:
            batch += self._splice(NEXT_STEP, 0, len(self._lists[NEXT_STEP]), [], False)
        if target == NEXT_TURN and self._lists[NEXT_TURN]:
            batch += self._splice(NEXT_TURN, 0, 1, [], False)
        if self.on_claimed:
            for m in batch:
                self.on_claimed(m, turn)
        return batch


# ---- the agent loop ----------------------------------------------------------------------------


@dataclass(slots=True)
class Enter:
    messages: List[Message]
    kind: ClassVar[str] = "enter"


@dataclass(slots=True)
class Reject:
    reason: Optional[str] = None
    kind: ClassVar[str] = "reject"


@dataclass(slots=True)
class PreStep:
    loop: AgentLoop
    messages: List[Message]
    turn: int
    step: int


@dataclass(slots=True)
class ModelRequest:
    messages: List[Message]
    tools: List[Dict[str, Any]]
    options: Dict[str, Any]
    turn: int
    step: int
    entered: List[Message]


class ModelReply:
    __slots__ = ("content", "usage", "finish")

    def __init__(self, content: Union[str, List[Dict[str, Any]]], usage: Optional[Dict[str, Any]] = None, finish: str = "stop") -> None:
        self.content = [{"type": "text", "text": content}] if isinstance(content, str) else content
        self.usage, self.finish = usage, finish


@dataclass(slots=True)
class Tool:
    name: str
    fn: Callable[..., Any]
    description: str = ""
    parameters: Optional[Dict[str, Any]] = None

    def __post_init__(self) -> None:
        if self.parameters is None:  # a tool without a schema takes an empty object
            self.parameters = {"type": "object", "properties": {}}

    def spec(self) -> Dict[str, Any]:
        return {"name": self.name, "description": self.description, "parameters": self.parameters}


class ToolContext:
    """What a tool body gets besides its arguments."""

    __slots__ = ("call_id", "turn", "step", "loop")

    def __init__(self, call_id: str, turn: int, step: int, loop: AgentLoop) -> None:
        self.call_id, self.turn, self.step, self.loop = call_id, turn, step, loop


class TurnFailure(Exception):
    """Ends the turn with this failure dict (instead of the generic ``UNKNOWN`` one)."""

    def __init__(self, failure: Dict[str, Any]) -> None:
        super().__init__(failure["message"])
        self.failure = failure


def waterfall(listeners: Sequence[Callable[..., Any]], payload: Any, default: Callable[[], Any]) -> Any:
    """``listener(payload, next)`` chain with one cursor per dispatch; returns a coroutine."""
    cursor = iter(list(listeners))

    async def next_() -> Any:
        listener = next(cursor, None)
        if listener is None:
            return default()
        result = listener(payload, next_)
        return await result if inspect.isawaitable(result) else result

    return next_()


class AgentLoop:
    """Claims input before every step, awaits one pre-step decision, calls the model, runs the
    tools; logs turn/step/message events exactly as Kerman does. Memory log by default."""

    def __init__(
        self,
        model: Callable[[ModelRequest], Any],
        log: Optional[Log] = None,
        tools: Sequence[Tool] = (),
        options: Optional[Dict[str, Any]] = None,
    ) -> None:
        self._model = model
        self.log = log if log is not None else MemoryStore().create()
        self.inbox = Inbox(self.log)
        self._tools = {t.name: t for t in tools}
        self._options = dict(options or {})
        self._pre_step: List[Callable[..., Any]] = []
        self._before_request: List[Callable[..., Any]] = []
        self.turn = 0
        for event in self.log.events(types="turn/start"):
            self.turn = event.data["turn"]
        self.status = "idle"
        self._task: Optional[asyncio.Task[None]] = None
        self._idle = asyncio.Event()
        self._idle.set()
        self._history: Optional[List[Message]] = None  # derived from the log on the first request
        self._last_options: Optional[Dict[str, Any]] = None

    def pre_step(self, fn: Callable[..., Any], prepend: bool = False) -> Callable[..., Any]:
        self._pre_step.insert(0, fn) if prepend else self._pre_step.append(fn)
        return fn

    def before_request(self, fn: Callable[..., Any], prepend: bool = False) -> Callable[..., Any]:
        self._before_request.insert(0, fn) if prepend else self._before_request.append(fn)
        return fn

    def tool(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        self._tools[fn.__name__] = Tool(fn.__name__, fn, (fn.__doc__ or "").strip())
        return fn

    def followup(self, message: Union[str, Message]) -> Message:
        return self.send(message, NEXT_TURN, True)

    def steer(self, message: Union[str, Message]) -> Message:
        return self.send(message, NEXT_STEP, True)

    def inject(self, message: Union[str, Message]) -> Message:
        return self.send(message, NEXT_STEP, False)

    def send(self, message: Union[str, Message], target: str, wakeup: bool = True) -> Message:
        stored = self.inbox.append(target, message)
        if wakeup and self.status == "idle":
            self._start()
        return stored

    def _start(self) -> None:
        self.status = "running"
        self._idle.clear()
        self._task = asyncio.get_running_loop().create_task(self._drive(self._begin_turn()))

    async def when_idle(self) -> None:
        await self._idle.wait()

    def _begin_turn(self) -> Tuple[int, List[Message]]:
        self.turn += 1
        self.log.append("turn/start", {"turn": self.turn})
        return self.turn, self.inbox.claim(NEXT_TURN, self.turn)

    async def _drive(self, prefix: Tuple[int, List[Message]]) -> None:
        try:
            while await self._run_turn(*prefix):
                prefix = self._begin_turn()
        except Exception:
            _log.exception("driver failed")
        finally:
            self._task = None
            self.status = "idle"
            self._idle.set()

    async def _run_turn(self, turn: int, batch: List[Message]) -> bool:
        """One turn; returns whether the driver should go on with the next one."""
        ending: Optional[Dict[str, Any]] = None
        stop, step, first = False, 0, True
        try:
            while True:
                if not first:
                    batch = self.inbox.claim(NEXT_STEP, turn)
                first = False
                payload = PreStep(self, batch, turn, step + 1)
                # The default decision runs inside this await, before `payload` changes (B023).
                decision = await waterfall(self._pre_step, payload, lambda: Enter(payload.messages))  # noqa: B023
                if not isinstance(decision, (Enter, Reject)):
                    raise TurnFailure(
                        {"message": f"pre-step listener returned {decision!r}; expected Enter or Reject", "code": "INVALID_DECISION"}
                    )
                if decision.kind == "reject":
                    ending = {"kind": "blocked"} if decision.reason is None else {"kind": "blocked", "reason": decision.reason}
                    stop = True
                    break
                entered = [m if isinstance(m, Message) else UserMessage(m) for m in decision.messages]
                if ending is not None and not entered:
                    break
                if step == 0 and not entered:
                    ending, stop = {"kind": "completed"}, True
                    break
                step += 1
                self.log.append("step/start", {"turn": turn, "step": step})
                try:
                    history = self._messages()
                    for m in entered:
                        self.log.append("user/message", m.to_dict(), None, "append")
                        history.append(m)
                    done = await self._run_step(turn, step, entered)
                finally:
                    self.log.append("step/end", {"turn": turn, "step": step})
                ending = {"kind": "completed"} if done else None
                if ending is not None and not self.inbox._lists[NEXT_STEP]:
                    break
        except Exception as exc:
            failure = exc.failure if isinstance(exc, TurnFailure) else {"message": str(exc) or type(exc).__name__, "code": "UNKNOWN"}
            ending, stop = {"kind": "error", "error": failure}, True
        finally:
            self.log.append("turn/end", {"turn": turn, "reason": ending})
        return not stop and self.inbox.has_pending

    def _messages(self) -> List[Message]:
        if self._history is None:
            self._history = []
            for e in self.log.events(types=("user/message", "assistant/message", "tool/result")):
                m = message_from_dict(e.data if e.type == "user/message" else e.data["message"])
                if m.content or m.role != "assistant":
                    self._history.append(m)
        return self._history

    async def _run_step(self, turn: int, step: int, entered: List[Message]) -> bool:
        """Request, reply, tools; returns True when the step completes the turn."""
        history = self._messages()
        request = ModelRequest(list(history), [t.spec() for t in self._tools.values()], dict(self._options), turn, step, entered)
        request = await waterfall(self._before_request, request, lambda: request)
        if request.options != self._last_options:
            self.log.append("request/header", {"options": request.options})
            self._last_options = request.options
        reply = await self._model(request)
        if isinstance(reply, str):
            reply = ModelReply(reply)
        message = AssistantMessage(reply.content)
        data: Dict[str, Any] = {"turn": turn, "step": step, "message": message.to_dict()}
        if reply.usage is not None:
            data["usage"] = reply.usage
        self.log.append("assistant/message", data, [], "append")
        if message.content:
            history.append(message)
        calls = [b for b in reply.content if b.get("type") == "tool-call"]
        if not calls:
            return True
        seqs = [
            self.log.append(
                "tool/call", {"turn": turn, "step": step, "callId": c["id"], "name": c["name"], "arguments": c.get("arguments", "")}
            ).seq
            for c in calls
        ]
        if len(calls) == 1:
            results = [await self._call_tool(calls[0], turn, step)]
        else:
            results = await asyncio.gather(*(self._call_tool(c, turn, step) for c in calls))
        for call, seq, (content, error) in zip(calls, seqs, results, strict=True):
            result = ToolResultMessage(call["id"], content, error is not None)
            data: Dict[str, Any] = {"turn": turn, "step": step, "message": result.to_dict()}
            if error is not None:
                data["error"] = error
            self.log.append("tool/result", data, [seq], "append")
            history.append(result)
        return False

    async def _call_tool(self, call: Dict[str, Any], turn: int, step: int) -> Tuple[str, Optional[Dict[str, str]]]:
        """Runs one call; returns the result text and, for an error result, its error dict."""
        tool = self._tools.get(call["name"])
        if tool is None:
            return f"unknown tool {call['name']!r}", {"name": "UnknownToolError", "code": "UNKNOWN_TOOL"}
        try:
            raw = call.get("arguments") or "{}"
            result = tool.fn(json.loads(raw) if isinstance(raw, str) else raw, ToolContext(call["id"], turn, step, self))
            if inspect.isawaitable(result):
                result = await result
            return str(result), None
        except Exception as exc:
            return str(exc) or type(exc).__name__, {"name": type(exc).__name__, "code": "TOOL_ERROR"}
