"""openai-agents sessions kept in a Kerman session log: ``KermanSession``.

``Runner.run(agent, input, session=KermanSession(store, "chat-1"))`` reads the conversation
from the log and appends what the run adds, in any Kerman store (memory, file, PostgreSQL).
The history is a fold of three event types of the plugin kind (``log.append``; not Kerman's
own, which its loop writes), each carrying the agents session id:

- ``openai-agents/items`` ``{session, items}``: one ``add_items`` call, in one append. A
  crash leaves the call's items all logged or none (a record is whole or a torn tail that the
  store cuts off on open); ``add_items`` returns once the store says the append is durable.
- ``openai-agents/popped`` ``{session, index}``: ``pop_item`` removed the last item (at
  ``index``).
- ``openai-agents/cleared`` ``{session, count}``: ``clear_session`` emptied the history.

Nothing is ever deleted from the log: a popped or cleared item stays where it was appended, so
``kerman log show`` and the UI streams (custom events) show what the agent was given and when.
"""

from __future__ import annotations

import copy
import threading
from typing import Any, List, Optional, Union

try:
    from agents.memory import SessionSettings
except ImportError as error:  # pragma: no cover - the extra is missing
    raise ImportError(
        f"kerman.integrations.openai_agents needs the openai-agents extra (pip install 'kerman[openai-agents]'): {error}",
        name=error.name,
    ) from error

from .._core import FileStore, MemoryStore, PostgresStore, SessionLog
from ..errors import SessionExistsError, SessionNotFoundError

__all__ = ["KermanSession", "ITEMS", "POPPED", "CLEARED"]

ITEMS = "openai-agents/items"
POPPED = "openai-agents/popped"
CLEARED = "openai-agents/cleared"
_TYPES = [ITEMS, POPPED, CLEARED]

Store = Union[MemoryStore, FileStore, PostgresStore]


def _open_or_create(store: Store, session_id: str) -> SessionLog:
    """The session's log: opened when it exists, else created (another process creating it
    first makes this an open)."""
    try:
        return store.open(session_id)
    except SessionNotFoundError:
        pass
    try:
        return store.create(session_id)
    except SessionExistsError:
        return store.open(session_id)


class KermanSession:
    """The openai-agents ``Session`` protocol over a Kerman session log.

    ``store_or_log`` is a store (the session ``session_id`` is opened, or created when it does
    not exist; the ``KermanSession`` owns that log: ``close()`` it, or use ``with``/``async
    with``) or an open ``SessionLog`` (used as it is and never closed here; ``session_id``
    defaults to its id, and another id keeps a history of its own inside that log).
    ``session_settings`` is openai-agents' ``SessionSettings`` (``limit``: the default number of
    latest items ``get_items`` returns).
    """

    session_settings: Optional[SessionSettings]

    def __init__(
        self,
        store_or_log: Union[Store, SessionLog],
        session_id: Optional[str] = None,
        *,
        session_settings: Optional[SessionSettings] = None,
    ) -> None:
        if isinstance(store_or_log, SessionLog):
            self._log = store_or_log
            self._owned = False
            self.session_id = store_or_log.id if session_id is None else session_id
        elif isinstance(store_or_log, (MemoryStore, FileStore, PostgresStore)):
            if session_id is None:
                raise TypeError("KermanSession over a store needs a session_id (the Kerman session to open or create)")
            self._log = _open_or_create(store_or_log, session_id)
            self._owned = True
            self.session_id = session_id
        else:
            raise TypeError(f"KermanSession takes a Kerman store or SessionLog, got {type(store_or_log).__name__}")
        if not isinstance(self.session_id, str) or not self.session_id:
            raise ValueError(f"session_id must be a non-empty str, got {self.session_id!r}")
        self.session_settings = session_settings
        self._lock = threading.Lock()  # one fold-then-append at a time (threads; coroutines never interleave inside)
        self._items: List[Any] = []
        self._read = 0  # the log's events before this seq are folded into _items

    @property
    def log(self) -> SessionLog:
        """The Kerman session log the history is kept in."""
        return self._log

    def _fold(self) -> List[Any]:
        """The history, after folding the events appended since the last call (by this object
        or another one over the same log)."""
        log = self._log
        end = len(log)
        if self._read < end:
            for event in log.events(start=self._read, stop=end, types=_TYPES):
                data = event.data
                if not isinstance(data, dict) or data.get("session") != self.session_id:
                    continue
                if event.type == ITEMS:
                    self._items.extend(data.get("items", ()))
                elif event.type == POPPED:
                    if self._items:
                        self._items.pop()
                else:
                    self._items.clear()
            self._read = end
        return self._items

    def _limit(self, limit: Optional[int]) -> Optional[int]:
        if limit is None and self.session_settings is not None:
            limit = self.session_settings.limit
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise ValueError(f"limit must be None or an int >= 0, got {limit!r}")
        return limit

    async def get_items(self, limit: Optional[int] = None) -> List[Any]:
        """The history in order; with ``limit`` (or ``session_settings.limit``), its latest
        ``limit`` items. The items are copies: changing them changes nothing stored."""
        limit = self._limit(limit)
        with self._lock:
            items = self._fold()
            chosen = items if limit is None else items[len(items) - limit :] if limit else []
            return copy.deepcopy(chosen)

    async def add_items(self, items: List[Any]) -> None:
        """Appends ``items`` (openai-agents input items, JSON values) in one log event, and
        returns once it is durable. Items that are not JSON raise ``kerman.NotJsonError``
        naming the bad field, and nothing is appended."""
        items = list(items)
        if not items:
            return
        with self._lock:
            self._fold()
            self._log.append(ITEMS, {"session": self.session_id, "items": items})
        await self._log.flush()

    async def pop_item(self) -> Optional[Any]:
        """Removes the latest item and returns it (``None`` when the history is empty)."""
        with self._lock:
            items = self._fold()
            if not items:
                return None
            last = copy.deepcopy(items[-1])
            self._log.append(POPPED, {"session": self.session_id, "index": len(items) - 1})
        await self._log.flush()
        return last

    async def clear_session(self) -> None:
        """Empties the history (the log keeps what was in it)."""
        with self._lock:
            count = len(self._fold())
            if count:
                self._log.append(CLEARED, {"session": self.session_id, "count": count})
        if count:
            await self._log.flush()

    def close(self) -> None:
        """Closes the log when this session opened it from a store."""
        if self._owned:
            self._log.close()

    async def aclose(self) -> None:
        if self._owned:
            await self._log.aclose()

    def __enter__(self) -> KermanSession:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    async def __aenter__(self) -> KermanSession:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        with self._lock:
            count = len(self._fold())
        return f"<KermanSession {self.session_id!r} log={self._log.id!r} items={count}>"
