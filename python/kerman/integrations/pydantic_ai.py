"""Kerman as a pydantic-ai durable-execution engine: ``KermanDurability`` (docs/frameworks.md).

A pydantic-ai ``Agent`` with ``capabilities=[KermanDurability(store, session_id=...)]`` journals
each durable unit of its runs (model request, tool call, event handling, ...) in the Kerman
session ``session_id``: when a unit completes, its result is appended as one ``pydantic-ai/unit``
event and flushed. A run started again with the same session (after a crash, in a new process)
returns the logged results instead of running those units again, and runs the rest.

Built on pydantic-ai's public ``pydantic_ai.durable_exec`` surface only. Needs the extra
``kerman[pydantic-ai]`` (``pydantic-ai-slim``); ``import kerman`` does not import it.

Event types (namespaced plugin types, appended with ``SessionLog.append``; see
docs/frameworks.md for why they are not core types):

- ``pydantic-ai/run`` ``{run, agent, prompt}``: a run began (``run`` counts from 1 in the session);
- ``pydantic-ai/unit`` ``{unit, n, run, result}``: unit ``unit`` (its pydantic-ai invocation
  name), the ``n``-th of that name in the run (from 0), completed with ``result`` (JSON);
- ``pydantic-ai/run-end`` ``{run, output}``: the run returned (``output`` as JSON).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Union

from pydantic_core import to_jsonable_python

try:
    from pydantic_ai.durable_exec import (
        JSON_CODEC,
        BaseDurabilityCapability,
        DurabilityEngineSpec,
        DurableOperationId,
        JournalCallableOperationBackend,
        RoleBasedOperationConfig,
    )
    from pydantic_ai.exceptions import UserError
    from pydantic_ai.tools import AgentDepsT, RunContext
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError("kerman.integrations.pydantic_ai needs pydantic-ai: pip install 'kerman[pydantic-ai]'") from error

import kerman

from .pydantic_ai_model import PydanticAIModel, kerman_tool, model, tool_definition

__all__ = ["KermanDurability", "RUN", "UNIT", "RUN_END", "model", "PydanticAIModel", "tool_definition", "kerman_tool"]

RUN = "pydantic-ai/run"
UNIT = "pydantic-ai/unit"
RUN_END = "pydantic-ai/run-end"

_Store = Union["kerman.FileStore", "kerman.MemoryStore", "kerman.PostgresStore"]


class _Journal:
    """The journal of one run in the session: the results logged by earlier attempts of the run,
    and the occurrence counter of each unit name in this attempt."""

    def __init__(self, log: kerman.SessionLog, run: int, logged: dict[tuple[str, int], Any], *, flush: bool) -> None:
        self.log = log
        self.flush = flush
        self.run = run
        self.logged = logged
        self.counts: dict[str, int] = {}
        self.replayed = 0

    def take(self, name: str) -> int:
        """The occurrence of ``name`` in this attempt (taken before any await, so the order of
        units fixes it; tools run sequentially for that reason)."""
        n = self.counts.get(name, 0)
        self.counts[name] = n + 1
        return n

    async def record(self, name: str, n: int, result: Any) -> None:
        """One durable append: the unit's result, flushed before the run goes on."""
        self.log.append(UNIT, {"unit": name, "n": n, "run": self.run, "result": result})
        if self.flush:
            await self.log.flush()
        self._logged()

    def _logged(self) -> None:
        """Called after each unit's result is durable (the crash tests stop the process here)."""


_JOURNAL: ContextVar[_Journal | None] = ContextVar("kerman_pydantic_ai_journal", default=None)


def _runs(log: kerman.SessionLog) -> tuple[int, bool, dict[str, Any] | None, dict[tuple[str, int], Any]]:
    """``(last run, whether it ended, its start payload, its logged units)`` of the session."""
    run, ended, start = 0, True, None
    units: dict[tuple[str, int], Any] = {}
    for event in log.events(types=[RUN, UNIT, RUN_END]):
        data = event.data
        if not isinstance(data, dict):
            continue
        if event.type == RUN:
            run, ended, start, units = int(data["run"]), False, data, {}
        elif event.type == RUN_END and data.get("run") == run:
            ended = True
        elif event.type == UNIT and data.get("run") == run:
            units[(str(data["unit"]), int(data["n"]))] = data.get("result")
    return run, ended, start, units


def _jsonable(value: Any) -> Any:
    try:
        return to_jsonable_python(value)
    except Exception:  # an output pydantic cannot reduce: its repr still says what it was
        return repr(value)


class _Backend(JournalCallableOperationBackend[None]):
    """Runs each unit's body once per session: a logged result is returned as it was logged."""

    async def execute(
        self,
        *,
        operation_id: DurableOperationId,
        name: str,
        body: Callable[[], Awaitable[object]],
        cache_key: tuple[object, ...],
        config: None,
    ) -> object:
        journal = _JOURNAL.get()
        if journal is None:  # a unit outside a run (nothing to journal it in)
            return await body()
        n = journal.take(name)
        key = (name, n)
        if key in journal.logged:
            journal.replayed += 1
            return journal.logged[key]
        result = await body()
        await journal.record(name, n, result)
        return result


@dataclass
class _Session:
    """The session shared by the capability and its bound copies (one open log per capability)."""

    store: Any
    session_id: str
    log: kerman.SessionLog | None = None

    def open(self) -> kerman.SessionLog:
        if self.log is None or self.log.closed:
            if self.store.exists(self.session_id):
                self.log = self.store.open(self.session_id)
            else:
                self.log = self.store.create(self.session_id)
        return self.log


class KermanDurability(BaseDurabilityCapability[AgentDepsT]):
    """A pydantic-ai capability that journals an agent's runs in a Kerman session.

    ``KermanDurability(store, session_id="s")`` with a ``kerman.FileStore``, ``MemoryStore`` or
    ``PostgresStore``: every durable unit's result is appended to session ``s`` when it
    completes. A run of the agent resumes the session's last run if that run has no
    ``pydantic-ai/run-end`` (it was interrupted), returning its logged results instead of
    requesting or executing those units again; otherwise it starts a new run in the session.
    A unit that started but logged no result runs again (see docs/frameworks.md).

    The capability opens the session on the first run and keeps it open; ``close()`` closes it.
    """

    engine_spec = DurabilityEngineSpec(
        engine_name="Kerman",
        durable_unit_noun="unit",
        durable_container_noun="run",
        codec=JSON_CODEC,
        wrapped_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        toolset_lifecycles={"function": "enter-always", "mcp": "enter-in-durable-unit", "dynamic": "enter-never"},
        journal_discovery=False,
        # Units are keyed by name and occurrence: tool calls in a fixed order keep the keys stable.
        sequential_tools_in_durable_context=True,
    )

    def __init__(self, store: _Store, *, session_id: str, name: str | None = None) -> None:
        if not isinstance(session_id, str) or not session_id:
            raise ValueError(f"KermanDurability: session_id must be a non-empty string, not {session_id!r}")
        if not hasattr(store, "exists") or not hasattr(store, "create"):
            raise TypeError(f"KermanDurability: store must be a Kerman store (FileStore, MemoryStore, PostgresStore), not {store!r}")
        super().__init__(name=name)
        self._session = _Session(store, session_id)

    def __repr__(self) -> str:
        return f"KermanDurability(session_id={self._session.session_id!r}, name={self.name or None!r})"

    @property
    def session_id(self) -> str:
        """The Kerman session the runs are journalled in."""
        return self._session.session_id

    @property
    def log(self) -> kerman.SessionLog:
        """The session's log (opened, or created, on first use)."""
        return self._session.open()

    def close(self) -> None:
        """Close the session's log (the next run opens it again)."""
        if self._session.log is not None:
            self._session.log.close()
            self._session.log = None

    @property
    def in_durable_context(self) -> bool:
        # Every run of an agent holding this capability is durable: wrap_run opens its journal.
        return True

    def get_durable_operation_backend(self) -> _Backend:
        return _Backend(
            agent_name=self.name,
            default_model_id=self.default_model_id,
            config=RoleBasedOperationConfig(model=None, event=None, capability=None, tool=None),
        )

    async def wrap_run(self, ctx: RunContext[AgentDepsT], *, handler: Any) -> Any:
        if _JOURNAL.get() is not None:
            raise UserError("KermanDurability: a run inside a journalled run (a nested agent) needs a session of its own")
        log = self._session.open()
        run, ended, start, units = _runs(log)
        prompt = _jsonable(ctx.prompt)
        if ended:
            run, units = run + 1, {}
            log.append(RUN, {"run": run, "agent": self.name, "prompt": prompt})
        elif start is not None and start.get("prompt") != prompt:
            raise UserError(
                f"KermanDurability: session {self.session_id!r} holds run {run}, interrupted, started with prompt "
                f"{start.get('prompt')!r}; resume it with the same prompt, not {prompt!r}, or start anew in another session"
            )
        # A MemoryStore's flush promises nothing a crash would keep: its log dies with the process.
        journal = _Journal(log, run, units, flush=not isinstance(self._session.store, kerman.MemoryStore))
        token = _JOURNAL.set(journal)
        try:
            result = await super().wrap_run(ctx, handler=handler)
        finally:
            _JOURNAL.reset(token)
        log.append(RUN_END, {"run": run, "output": _jsonable(getattr(result, "output", None))})
        if journal.flush:
            await log.flush()
        return result
