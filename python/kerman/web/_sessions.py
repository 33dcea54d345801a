"""Who holds a session in the web process.

With a ``FileStore`` (or ``MemoryStore``) the server owns its sessions: the first request for
one opens it and builds an ``AgentLoop`` from the model factory, and every request after that
uses the same loop (its inbox for queue edits, its log for the streams). A session another
process holds (``SessionLockedError``) is followed read-only instead.

With a ``PostgresStore`` the workers own the sessions: the web process follows them
(``store.follow``, one follower per session shared by its streams), stages input
(``store.enqueue``) and hands queue edits and cancel to the owner (``store.replace``,
``store.remove``, ``store.cancel``), answering when the owner applied them or refused.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .. import AgentLoop, PostgresStore, SessionLockedError, SessionLog, UserMessage
from ..ui._base import JsonDict
from ._errors import ApiError
from ._feed import Feed

__all__ = ["Session", "Sessions"]

log = logging.getLogger("kerman.web")

_TARGETS = {"followup": ("next-turn", True), "steer": ("next-step", True), "inject": ("next-step", False)}
# How long a queue edit or cancel waits for the owner's answer (then it is withdrawn).
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

    def feed(self, protocol: str) -> Feed:
        """The shared stream of ``protocol`` over this session's log."""
        feed = self.feeds.get(protocol)
        if feed is None:
            feed = self.feeds[protocol] = Feed(self.log, protocol, self.id)
        return feed

    def info(self) -> JsonDict:
        from ..ui._base import item

        if self.loop is not None:
            inbox = self.loop.inbox
            queue = [item("next-turn", m.to_dict()) for m in inbox.next_turn] + [item("next-step", m.to_dict()) for m in inbox.next_step]
            return {"id": self.id, "owned": True, "status": self.loop.status, "turn": self.loop.turn, "events": len(self.log),
                    "queue": queue}
        return {"id": self.id, "owned": False, "events": len(self.log)}


class Sessions:
    """The sessions of one store, opened on first use. All methods run on the server's event loop."""

    def __init__(self, store: Any, factory: Optional[Callable[..., Any]]) -> None:
        self.store = store
        self.factory = factory
        self.distributed = isinstance(store, PostgresStore)
        if not self.distributed and factory is None:
            raise ValueError("a model factory is needed to own sessions (kerman serve --model module:factory); "
                             "only a PostgresStore's web process runs without one")
        self._open: dict[str, Session] = {}
        self._lock = asyncio.Lock()

    # -- finding sessions ----------------------------------------------------------------------

    def list(self) -> list[str]:
        return sorted(self.store.list())

    async def create(self, session_id: Optional[str]) -> Session:
        async with self._lock:
            log_ = self.store.create(session_id)
            if self.distributed:  # the workers own it: let go at once
                log_.close()
                return await self._follow(log_.id)
            return self._own(log_)

    async def get(self, session_id: str) -> Session:
        session = self._open.get(session_id)
        if session is not None and not session.log.closed:
            return session
        async with self._lock:
            session = self._open.get(session_id)
            if session is not None and not session.log.closed:
                return session
            if not self.store.exists(session_id):
                raise ApiError(404, "session-not-found", f'no session "{session_id}" in this store')
            if self.distributed:
                return await self._follow(session_id)
            try:
                log_ = self.store.open(session_id)
            except SessionLockedError:
                session = await self._follow(session_id)
                session.owner_note = "another process holds this session; this server only follows it"
                return session
            return self._own(log_)

    async def _follow(self, session_id: str) -> Session:
        session = Session(session_id, self.store.follow(session_id), followed=True)
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
        session = Session(log_.id, log_, loop)
        self._open[log_.id] = session
        if loop.inbox.has_pending:
            log.info("session %r has pending input from before; it waits for the next message (loop.wake())", log_.id)
        return session

    def _build(self, log_: SessionLog) -> AgentLoop:
        factory = self.factory
        assert factory is not None
        try:
            wants_log = any(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                            for p in inspect.signature(factory).parameters.values())
        except (TypeError, ValueError):
            wants_log = False
        made = factory(log_) if wants_log else factory()
        if isinstance(made, AgentLoop):
            if made.log is not log_:
                raise RuntimeError("the model factory returned an AgentLoop over another log; build it with log=<the log it was given>")
            return made
        return AgentLoop(made, log=log_)

    # -- input ---------------------------------------------------------------------------------

    async def send(self, session: Session, text: str, delivery: str, message_id: Optional[str]) -> UserMessage:
        message = UserMessage(text, id=message_id) if message_id else UserMessage(text)
        if session.loop is not None:
            deliver: Callable[[UserMessage], UserMessage] = getattr(session.loop, delivery)
            return deliver(message)
        if not self.distributed:
            raise ApiError(409, "not-owner", f'session "{session.id}": {session.owner_note}')
        target, wakeup = _TARGETS[delivery]
        staged: UserMessage = await asyncio.to_thread(self.store.enqueue, session.id, message, target, wakeup)
        return staged

    @property
    def remote_ops(self) -> bool:
        """Whether queue edits and cancel of sessions this process does not own go to their
        owner through the store (a ``PostgresStore``)."""
        return self.distributed

    async def remote(self, session: Session, op: str, *args: Any, **kwargs: Any) -> JsonDict:
        """Stages ``op`` (``cancel``, ``replace`` or ``remove``) for the session's owner and waits
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
            raise ApiError(409, "not-owner", f'cannot {what} in session "{session.id}": {session.owner_note} '
                                             "(queue edits and cancel need the session's owner)")
        return session.loop

    def stop_streams(self) -> None:
        """Ends every open stream (the server is stopping), so each response completes cleanly."""
        for session in self._open.values():
            for feed in session.feeds.values():
                feed.stop()

    async def close(self) -> None:
        sessions, self._open = list(self._open.values()), {}
        for session in sessions:
            try:
                if session.loop is not None:
                    await session.loop.aclose()
                if not session.log.closed:
                    session.log.close()
                for feed in session.feeds.values():
                    feed.close()
            except Exception:  # shutting down: one bad session must not keep the others open
                log.exception("closing session %r", session.id)
