"""Who holds a session in the web process.

With a ``FileStore`` (or ``MemoryStore``) the server owns its sessions: the first request for
one opens it and builds an ``AgentLoop`` from the model factory, and every request after that
uses the same loop (its inbox for queue edits, its log for the streams). A session another
process holds (``SessionLockedError``) is followed read-only instead, and each later request
tries again to own it, so it is owned once that process let go.

Sessions are not held forever: one nobody used for ``idle_after`` seconds (no open stream, its
loop idle) is closed by a sweeper and reopened by the next request for it; and no more than
``max_open`` are held, the least recently used idle one being closed first.

With a ``PostgresStore`` the workers own the sessions: the web process follows them
(``store.follow``, one follower per session shared by its streams), stages input
(``store.enqueue``) and hands queue edits, cancel and resend to the owner (``store.replace``,
``store.remove``, ``store.cancel``, ``store.requeue``), answering when the owner applied them
or refused.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Tuple

from .. import AgentLoop, PostgresStore, SessionLockedError, SessionLog, UserMessage, _continuation
from ..ui._base import JsonDict
from ._errors import ApiError
from ._feed import Feed
from ._fork import cut_before

__all__ = ["Session", "Sessions"]

log = logging.getLogger("kerman.web")

_TARGETS = {"followup": ("next-turn", True), "steer": ("next-step", True), "inject": ("next-step", False)}
# Injected context is not a prompt: a source of another kind than "user" makes every view (the
# queue's placement, the projections' kerman.context / data-context) call it context.
CONTEXT_SOURCE = {"kind": "context"}
# How long a queue edit, cancel or resend waits for the owner's answer (then it is withdrawn).
REMOTE_TIMEOUT = 10.0
# The owner's refusals that are not 409s.
_REFUSALS = {"message-not-found": 404, "timeout": 504}


@dataclass
class Session:
    """One session as the server holds it: its log, and its loop when this process owns it."""

    id: str
    log: SessionLog
    loop: Optional[AgentLoop] = None
    followed: bool = False
    owner_note: str = field(default="")
    feeds: JsonDict = field(default_factory=dict)
    locked: bool = False  # followed because another process held it: try again to own it
    used: float = field(default_factory=time.monotonic)
    streams: int = 0  # open event streams
    custom: Optional[Callable[..., Any]] = None  # the server's custom-event mapping

    def idle(self) -> bool:
        """Nothing would be lost by closing it now: no stream reads it, its loop runs no turn."""
        return self.streams == 0 and (self.loop is None or self.loop.status == "idle")

    def feed(self, protocol: str) -> Feed:
        """The shared stream of ``protocol`` over this session's log."""
        feed = self.feeds.get(protocol)
        if feed is None:
            feed = self.feeds[protocol] = Feed(self.log, protocol, self.id, self.custom)
        return feed

    def info(self) -> JsonDict:
        from ..ui._base import item

        if self.loop is not None:
            inbox = self.loop.inbox
            queue = [item("next-turn", m.to_dict()) for m in inbox.next_turn] + [item("next-step", m.to_dict()) for m in inbox.next_step]
            return {
                "id": self.id,
                "owned": True,
                "status": self.loop.status,
                "turn": self.loop.turn,
                "events": len(self.log),
                "queue": queue,
            }
        return {"id": self.id, "owned": False, "events": len(self.log)}


class Sessions:
    """The sessions of one store, opened on first use. All methods run on the server's event loop."""

    def __init__(
        self,
        store: Any,
        factory: Optional[Callable[..., Any]],
        *,
        idle_after: float = 300.0,
        max_open: int = 256,
        grace: float = 35.0,
        custom: Optional[Callable[..., Any]] = None,
    ) -> None:
        self.store = store
        self.custom = custom
        self.idle_after = idle_after
        self.max_open = max_open
        # a request may hold a session it got for as long as its body takes to arrive: the cap
        # closes none used more recently than this
        self.grace = min(grace, idle_after)
        self._sweeper: Optional[asyncio.Task[None]] = None
        self.factory = factory
        self.distributed = isinstance(store, PostgresStore)
        if not self.distributed and factory is None:
            raise ValueError(
                "a model factory is needed to own sessions (kerman serve --model module:factory); "
                "only a PostgresStore's web process runs without one"
            )
        self._open: dict[str, Session] = {}
        self._lock = asyncio.Lock()

    # -- finding sessions ----------------------------------------------------------------------

    def list(self) -> list[str]:
        return sorted(self.store.list())

    async def create(self, session_id: Optional[str]) -> Session:
        async with self._lock:
            await self._make_room()
            log_ = self.store.create(session_id)
            if self.distributed:  # the workers own it: let go at once
                log_.close()
                return await self._follow(log_.id)
            return self._own(log_)

    async def get(self, session_id: str) -> Session:
        session = self._open.get(session_id)
        if session is not None and not session.log.closed and not session.locked:
            session.used = time.monotonic()
            return session
        async with self._lock:
            session = self._open.get(session_id)
            if session is not None and not session.log.closed:
                if session.locked:
                    session = self._own_again(session)
                session.used = time.monotonic()
                return session
            if not self.store.exists(session_id):
                raise ApiError(404, "session-not-found", f'no session "{session_id}" in this store')
            await self._make_room()
            if self.distributed:
                return await self._follow(session_id)
            try:
                log_ = self.store.open(session_id)
            except SessionLockedError:
                session = await self._follow(session_id)
                session.owner_note = "another process holds this session; this server only follows it"
                session.locked = True
                return session
            return self._own(log_)

    def _own_again(self, followed: Session) -> Session:
        """The session another process held, owned if that process let go (else still followed)."""
        try:
            log_ = self.store.open(followed.id)
        except SessionLockedError:
            return followed
        owned = self._own(log_)
        for feed in followed.feeds.values():  # its streams end; clients resume on the owned log
            feed.stop()
            feed.close()
        followed.log.close()
        log.info("session %r: the process that held it let go; this server owns it now", followed.id)
        return owned

    # -- closing idle sessions -----------------------------------------------------------------

    def start(self) -> None:
        """Starts the sweeper that closes idle sessions (on the running event loop)."""
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def _sweep(self) -> None:
        every = max(0.05, min(self.idle_after / 4, 30.0))
        while True:
            await asyncio.sleep(every)
            try:
                async with self._lock:
                    now = time.monotonic()
                    for session in [s for s in self._open.values() if now - s.used >= self.idle_after and s.idle()]:
                        await self._evict(session)
            except Exception:  # the sweeper must outlive one session's failure to close
                log.exception("closing idle sessions")

    async def _make_room(self) -> None:
        """Before opening another session (the lock held): close the least recently used idle ones
        beyond ``max_open``; refuse when every one is busy."""
        if len(self._open) < self.max_open:
            return
        now = time.monotonic()
        for session in sorted(self._open.values(), key=lambda s: s.used):
            if len(self._open) < self.max_open:
                return
            if now - session.used >= self.grace and session.idle():
                await self._evict(session)
        if len(self._open) >= self.max_open:
            raise ApiError(
                503,
                "too-many-sessions",
                f"this server holds {self.max_open} sessions, all in use; try again when one is idle",
                headers={"Retry-After": "5"},
            )

    async def _evict(self, session: Session) -> None:
        if self._open.get(session.id) is session:
            del self._open[session.id]
        await self._close(session)

    @staticmethod
    async def _close(session: Session) -> None:
        try:
            if session.loop is not None:
                await session.loop.aclose()
            if not session.log.closed:
                session.log.close()
            for feed in session.feeds.values():
                feed.close()
        except Exception:  # one bad session must not keep the others open
            log.exception("closing session %r", session.id)

    async def _follow(self, session_id: str) -> Session:
        session = Session(session_id, self.store.follow(session_id), followed=True, custom=self.custom)
        if self.distributed:
            session.owner_note = "with a PostgresStore the workers own the sessions; this server follows and enqueues"
        self._open[session_id] = session
        return session

    def _own(self, log_: SessionLog) -> Session:
        try:
            loop = self._build(log_)
        except BaseException:
            log_.close()
            raise
        session = Session(log_.id, log_, loop, custom=self.custom)
        self._open[log_.id] = session
        # Crashed turns are answered: "continue" unless the factory's loop chose, at once.
        _continuation.adopt(loop)
        if _continuation.take_up(loop):
            log.info("session %r: a turn a crash interrupted is taken up (docs/durability.md)", log_.id)
        elif loop.inbox.has_pending:
            log.info("session %r has pending input from before; it waits for the next message (loop.wake())", log_.id)
        return session

    def _build(self, log_: SessionLog) -> AgentLoop:
        factory = self.factory
        assert factory is not None
        try:
            wants_log = any(
                p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                for p in inspect.signature(factory).parameters.values()
            )
        except (TypeError, ValueError):
            wants_log = False
        made = factory(log_) if wants_log else factory()
        if isinstance(made, AgentLoop):
            if made.log is not log_:
                raise RuntimeError("the model factory returned an AgentLoop over another log; build it with log=<the log it was given>")
            return made
        return AgentLoop(made, log=log_)

    # -- input ---------------------------------------------------------------------------------

    async def send(
        self, session: Session, text: str, delivery: str, message_id: Optional[str], on_busy: Optional[str] = None
    ) -> UserMessage:
        source = CONTEXT_SOURCE if delivery == "inject" else None
        message = UserMessage(text, source=source, id=message_id) if message_id else UserMessage(text, source=source)
        if session.loop is not None and on_busy is not None:
            return session.loop.followup(message, on_busy=on_busy)  # type: ignore[arg-type]
        if on_busy not in (None, "enqueue"):
            # The policy needs the running turn's owner; a staged row cannot cancel it.
            raise ApiError(
                409, "not-owner", f'session "{session.id}": on_busy={on_busy!r} needs the session\'s owner ({session.owner_note})'
            )
        if session.loop is not None:
            deliver: Callable[[UserMessage], UserMessage] = getattr(session.loop, delivery)
            return deliver(message)
        if not self.distributed:
            raise ApiError(409, "not-owner", f'session "{session.id}": {session.owner_note}')
        target, wakeup = _TARGETS[delivery]
        staged: UserMessage = await asyncio.to_thread(self.store.enqueue, session.id, message, target, wakeup)
        return staged

    async def fork(self, session: Session, message_id: str, text: str) -> Tuple[Session, int, UserMessage]:
        """Forks ``session`` just before user message ``message_id`` was claimed, with the queue
        at the cut dropped, and sends ``text`` to the fork as a followup: the fork, the cut and
        the sent message."""
        cut = cut_before(session.log, session.id, message_id)
        child_id: str = await asyncio.to_thread(self.store.fork, session.id, cut, None, inbox="drop")
        child = await self.get(child_id)
        message = await self.send(child, text, "followup", None)
        return child, cut, message

    @property
    def remote_ops(self) -> bool:
        """Whether queue edits, cancel and resend of sessions this process does not own go to their
        owner through the store (a ``PostgresStore``)."""
        return self.distributed

    async def remote(self, session: Session, op: str, *args: Any, **kwargs: Any) -> JsonDict:
        """Stages ``op`` (``cancel``, ``replace``, ``remove`` or ``requeue``) for the session's owner and waits
        for its answer (on a thread: the store's call blocks); a refusal is an ``ApiError``."""
        outcome: JsonDict = await asyncio.to_thread(getattr(self.store, op), session.id, *args, timeout=REMOTE_TIMEOUT, **kwargs)
        if outcome.get("applied"):
            return outcome
        reason = str(outcome.get("reason", "refused"))
        detail = str(outcome.get("detail", ""))
        status = _REFUSALS.get(reason, 409)
        code = "owner-timeout" if reason == "timeout" else reason
        raise ApiError(status, code, f'session "{session.id}": {detail}' if detail else f'session "{session.id}": {op} refused ({reason})')

    def owned_loop(self, session: Session, what: str) -> AgentLoop:
        if session.loop is None:
            raise ApiError(
                409,
                "not-owner",
                f'cannot {what} in session "{session.id}": {session.owner_note} (queue edits, cancel and resend need the session\'s owner)',
            )
        return session.loop

    def stop_streams(self) -> None:
        """Ends every open stream (the server is stopping), so each response completes cleanly."""
        for session in self._open.values():
            for feed in session.feeds.values():
                feed.stop()

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        sessions, self._open = list(self._open.values()), {}
        for session in sessions:
            await self._close(session)
