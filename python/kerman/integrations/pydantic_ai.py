"""Kerman as a pydantic-ai durable-execution engine: ``KermanDurability`` (docs/frameworks.md).

A pydantic-ai ``Agent`` with ``capabilities=[KermanDurability(store, session_id=...)]`` journals
each durable unit of its runs (model request, tool call, event handling, ...) in the Kerman
session ``session_id``: when a unit completes, its result is appended as one ``pydantic-ai/unit``
event. A run started again with the same session (after a crash, in a new process) returns the
logged results instead of running those units again, and runs the rest.

When a run waits for the disk. ``sync="effects"`` (the default with a ``FileStore`` or a
``MemoryStore``) waits only where an effect depends on it: the ``pydantic-ai/started`` marker of
a tool call that must not simply run again (a ``write``, or any tool whose policy in doubt is
not ``"retry"``) is flushed before the tool's body runs, which also makes every earlier append
durable (the log is written in order), and that call's result is flushed before the run goes
on; before the run returns (an output, a pause for approvals, or an error) one flush is
awaited. A model response and a read or idempotent tool's result are appended and not waited
for. A ``FileStore`` session is opened with ``SessionLog.write_through`` on, so each append is
in the session file when it returns: a killed process loses none of them, and its next attempt
requests no logged model response again. Only a crash of the machine (a power loss) before the
store's next sync can lose those appends, and then costs what a crash before them would have
cost: those model requests and reads made again; never a write run twice undetected, never an
output the caller was given. ``sync="units"`` (the default with a ``PostgresStore``, where an
append reaches the database a round trip later) flushes every unit's result before the run goes
on, so not even a power loss makes a logged model request again, at the price of a waited sync
per unit.

Built on pydantic-ai's public ``pydantic_ai.durable_exec`` surface only. Needs the extra
``kerman[pydantic-ai]`` (``pydantic-ai-slim``); ``import kerman`` does not import it.

Event types (namespaced plugin types, appended with ``SessionLog.append``; see
docs/frameworks.md for why they are not core types):

- ``pydantic-ai/run`` ``{run, agent, prompt}``: a run began (``run`` counts from 1 in the session);
- ``pydantic-ai/unit`` ``{unit, n, run, result}``: unit ``unit`` (its pydantic-ai invocation
  name), the ``n``-th of that name in the run (from 0), completed with ``result`` (JSON);
- ``pydantic-ai/run-end`` ``{run, output}``: the run returned (``output`` as JSON);
- ``pydantic-ai/started`` ``{unit, n, run}``: a tool call's body is about to run (for tools that
  must not simply run again; see ``pydantic_ai_effects``): found without a result on resume, the
  call is in doubt and follows the tool's effect class;
- ``pydantic-ai/raised`` ``{unit, n, run, error}``: that body raised (the call is over).

Also here: ``model(m)``, any pydantic-ai ``Model`` as a Kerman model (``pydantic_ai_model``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal, Union

from pydantic_core import to_jsonable_python

try:
    from pydantic_ai import Agent, DeferredToolRequests
    from pydantic_ai.durable_exec import (
        JSON_CODEC,
        BaseDurabilityCapability,
        DurabilityEngineSpec,
        DurableOperationId,
        JournalCallableOperationBackend,
        RoleBasedOperationConfig,
        ToolsetCallToolId,
    )
    from pydantic_ai.exceptions import UserError
    from pydantic_ai.messages import ModelMessagesTypeAdapter
    from pydantic_ai.tools import AgentDepsT, RunContext
    from pydantic_graph import End
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError("kerman.integrations.pydantic_ai needs pydantic-ai: pip install 'kerman[pydantic-ai]'") from error

import kerman
from kerman._core import decide_on_log
from kerman.decisions import outcome_of

from . import pydantic_ai_approvals as approvals
from .pydantic_ai_effects import InDoubtCall, ToolPolicy, check_effects, reconcile, resolve_policy
from .pydantic_ai_model import PydanticAIModel, kerman_tool, model, tool_definition
from .pydantic_ai_steering import Steering

__all__ = [
    "KermanDurability",
    "RUN",
    "UNIT",
    "RUN_END",
    "STARTED",
    "RAISED",
    "InDoubtCall",
    "model",
    "PydanticAIModel",
    "tool_definition",
    "kerman_tool",
]

RUN = "pydantic-ai/run"
UNIT = "pydantic-ai/unit"
RUN_END = "pydantic-ai/run-end"
STARTED = "pydantic-ai/started"
RAISED = "pydantic-ai/raised"

_Store = Union["kerman.FileStore", "kerman.MemoryStore", "kerman.PostgresStore"]

#: The values of ``KermanDurability(..., sync=)``: wait for the disk where an effect depends on
#: it, or after every unit.
SYNC_MODES = ("effects", "units")


class _Journal:
    """The journal of one run in the session: the results logged by earlier attempts of the run,
    and the occurrence counter of each unit name in this attempt."""

    def __init__(
        self,
        log: kerman.SessionLog,
        run: int,
        logged: dict[tuple[str, int], Any],
        *,
        flush: bool,
        every_unit: bool = False,
        started: set[tuple[str, int]] | None = None,
    ) -> None:
        self.log = log
        # Whether flushes keep anything (not on a MemoryStore), and whether every unit's result
        # waits for one (sync="units") or only a marked call's (sync="effects").
        self.flush = flush
        self.every_unit = every_unit
        self.run = run
        self.logged = logged
        self.started = started or set()
        self.counts: dict[str, int] = {}
        self.replayed = 0
        self.steering: Steering | None = None

    @property
    def caught_up(self) -> bool:
        """Whether this attempt has replayed every unit an earlier attempt logged (from here on
        it runs units of its own)."""
        return self.replayed >= len(self.logged)

    def take(self, name: str) -> int:
        """The occurrence of ``name`` in this attempt (taken before any await, so the order of
        units fixes it; tools run sequentially for that reason)."""
        n = self.counts.get(name, 0)
        self.counts[name] = n + 1
        return n

    async def record(self, name: str, n: int, result: Any, *, marked: bool = False) -> None:
        """The unit's result, appended; flushed before the run goes on when the call was
        ``marked`` started (a resume must not find it in doubt) or every unit waits."""
        self.log.append(UNIT, {"unit": name, "n": n, "run": self.run, "result": result})
        if self.flush and (marked or self.every_unit):
            await self.log.flush()
        self._logged()

    async def mark(self, name: str, n: int) -> None:
        """One durable append before a tool's body runs: a resume that finds it without a result
        knows the call is in doubt."""
        self.log.append(STARTED, {"unit": name, "n": n, "run": self.run})
        if self.flush:
            await self.log.flush()
        self._marked()

    def _logged(self) -> None:
        """Called after each unit's result is appended, and flushed where the run waits for it
        (the crash tests stop the process here)."""

    def _requested(self) -> None:
        """Called after a paused run's decision requests are durable, before its end (the crash
        tests stop the process here)."""

    def _marked(self) -> None:
        """Called after a started marker is durable, before the tool's body runs (the crash tests
        stop the process here: a call in doubt)."""


_JOURNAL: ContextVar[_Journal | None] = ContextVar("kerman_pydantic_ai_journal", default=None)


@dataclass
class _LastRun:
    """The session's last run as the log has it."""

    run: int = 0
    ended: bool = True
    start: dict[str, Any] | None = None
    units: dict[tuple[str, int], Any] | None = None
    started: set[tuple[str, int]] | None = None
    end: dict[str, Any] | None = None


def _runs(log: kerman.SessionLog) -> _LastRun:
    """The session's last run: its number, whether it ended, its start payload, its logged
    units and the tool calls marked started."""
    last = _LastRun()
    for event in log.events(types=[RUN, UNIT, RUN_END, STARTED, RAISED]):
        data = event.data
        if not isinstance(data, dict):
            continue
        if event.type == RUN:
            last = _LastRun(int(data["run"]), False, data, {}, set())
        elif data.get("run") != last.run or last.units is None or last.started is None:
            continue
        elif event.type == RUN_END:
            last.ended = True
            last.end = data
        elif event.type == UNIT:
            last.units[(str(data["unit"]), int(data["n"]))] = data.get("result")
        elif event.type == STARTED:
            last.started.add((str(data["unit"]), int(data["n"])))
        elif event.type == RAISED:
            last.started.discard((str(data["unit"]), int(data["n"])))
    return last


def _jsonable(value: Any) -> Any:
    if type(value) is str:  # a prompt or an output of text, as it is (the common case)
        return value
    try:
        return to_jsonable_python(value)
    except Exception:  # an output pydantic cannot reduce: its repr still says what it was
        return repr(value)


class _Backend(JournalCallableOperationBackend[Any]):
    """Runs each unit's body once per session: a logged result is returned as it was logged; a
    tool call marked started without a result follows the tool's effect policy."""

    session_id = ""

    async def execute(
        self,
        *,
        operation_id: DurableOperationId,
        name: str,
        body: Callable[[], Awaitable[object]],
        cache_key: tuple[object, ...],
        config: Any,
    ) -> object:
        journal = _JOURNAL.get()
        if journal is None:  # a unit outside a run (nothing to journal it in)
            return await body()
        n = journal.take(name)
        key = (name, n)
        if key in journal.logged:
            journal.replayed += 1
            return journal.logged[key]
        policy = config if isinstance(config, ToolPolicy) and isinstance(operation_id, ToolsetCallToolId) else None
        if policy is not None and key in journal.started:
            call = InDoubtCall(policy.tool, name, n, journal.run, self.session_id)
            again, logged = await reconcile(policy, call)
            if not again:
                await journal.record(name, n, logged, marked=True)
                return logged
        if policy is None or not policy.needs_marker:
            result = await body()
        else:
            await journal.mark(name, n)
            try:
                result = await body()
            except Exception as error:
                # The body returned control: the call is over (failed), not in doubt.
                journal.log.append(RAISED, {"unit": name, "n": n, "run": journal.run, "error": repr(error)[:500]})
                raise
        await journal.record(name, n, result, marked=policy is not None and policy.needs_marker)
        return result


def _claim_point(ctx: Any) -> _Journal | None:
    """At a claim point of a journalled run, after pydantic-ai's own queue is moved into the
    inbox: the run's journal when the point has messages to deliver (``_steer``), ``None`` when
    it has none (the point is passed, counted, without a claim) or the run is not journalled."""
    journal = _JOURNAL.get()
    if journal is None or journal.steering is None:
        return None
    journal.steering.adopt(ctx)
    return None if journal.steering.passes(caught_up=journal.caught_up) else journal


async def _steer(ctx: Any, journal: _Journal, *, at_end: bool) -> None:
    """Delivers the messages of a claim point that has some (``_claim_point``) into the run."""
    assert journal.steering is not None
    for message in await journal.steering.take(caught_up=journal.caught_up, at_end=at_end):
        ctx.enqueue(message.text)


def _sync_in_background(log: kerman.SessionLog) -> None:
    """Starts the first sync of a session just created, not awaited: its file, its folder and
    the run's start become durable while the run prepares its first unit, whose flush then
    waits for one more sync of the file alone rather than for the folder's too. A failed sync
    fails that flush (the log is poisoned), so nothing is acknowledged that is not durable."""
    log.flush().add_done_callback(_retrieved)


def _retrieved(future: Any) -> None:
    # The outcome is read so that asyncio does not report it as never retrieved: the unit's
    # flush raises the same error.
    if not future.cancelled():
        future.exception()


def _remote_decide(log: kerman.SessionLog) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Applies a decision another process staged (``PostgresStore.decide``) to a request of this
    session, on the store's thread: the core decides it on the log (this process owns it)."""

    def decide(args: dict[str, Any]) -> dict[str, Any]:
        decision_id = args.get("decision_id")
        try:
            return decide_on_log(log, str(decision_id), outcome_of(args.get("outcome")), by=args.get("by"), key=args.get("key"))
        except Exception as error:  # a bad staged row is refused, not raised on the store's thread
            return {"applied": False, "op": "decide", "decision_id": decision_id, "reason": "invalid", "detail": str(error)}

    return decide


@dataclass
class _Session:
    """The session shared by the capability and its bound copies (one open log per capability)."""

    store: Any
    session_id: str
    log: kerman.SessionLog | None = None
    inbox: kerman.Inbox | None = None
    # Created here in a FileStore that syncs, and not synced since: the file and its folder
    # become durable with the session's first sync (docs/format.md "Creation").
    unsynced: bool = False
    # (the log's length, run) right after this capability ended run `run`: while the log holds
    # nothing more, that run is the session's last and it ended, without reading the log again.
    ended: tuple[int, int] | None = None

    def last_run(self, log: kerman.SessionLog) -> _LastRun:
        length = len(log)
        if self.ended is not None and self.ended[0] == length:
            return _LastRun(self.ended[1])
        if length == 0:  # a new session (or one holding nothing): no run to look for
            return _LastRun()
        return _runs(log)

    def open(self) -> kerman.SessionLog:
        if self.log is None or self.log.closed:
            if self.store.exists(self.session_id):
                self.log = self.store.open(self.session_id)
            else:
                self.log = self.store.create(self.session_id)
                self.unsynced = isinstance(self.store, kerman.FileStore) and self.store.durability != "none"
            if isinstance(self.store, kerman.FileStore):
                # Each append in the file when it returns: a kill loses none of the units not
                # waited for (sync="effects") nor the run's end.
                self.log.write_through = True
            # The run's pending messages: this log's one inbox (which also takes what other
            # processes stage for the session, with a PostgresStore, decisions included).
            self.inbox = kerman.Inbox(self.log, _on_remote_decide=_remote_decide(self.log))
        return self.log

    def close(self) -> None:
        self.ended = None
        if self.inbox is not None:
            self.inbox.close()
            self.inbox = None
        if self.log is not None:
            self.log.close()
            self.log = None


class KermanDurability(BaseDurabilityCapability[AgentDepsT]):
    """A pydantic-ai capability that journals an agent's runs in a Kerman session.

    ``KermanDurability(store, session_id="s")`` with a ``kerman.FileStore``, ``MemoryStore`` or
    ``PostgresStore``: every durable unit's result is appended to session ``s`` when it
    completes. A run of the agent resumes the session's last run if that run has no
    ``pydantic-ai/run-end`` (it was interrupted), returning its logged results instead of
    requesting or executing those units again; otherwise it starts a new run in the session.
    A unit that started but logged no result runs again (see docs/frameworks.md).

    ``sync="effects"`` waits for the disk only before and after a tool call marked started (a
    ``write``, or a tool that is not simply run again in doubt) and once before the run returns;
    ``sync="units"`` after every unit's result too. The default is ``"effects"`` with a
    ``FileStore`` (whose session is written through: a killed process loses no append) or a
    ``MemoryStore``, and ``"units"`` with a ``PostgresStore``. See the module's docstring.

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

    def __init__(
        self,
        store: _Store,
        *,
        session_id: str,
        name: str | None = None,
        effects: dict[str, Any] | None = None,
        sync: Literal["effects", "units"] | None = None,
    ) -> None:
        if not isinstance(session_id, str) or not session_id:
            raise ValueError(f"KermanDurability: session_id must be a non-empty string, not {session_id!r}")
        if sync is None:
            # A PostgreSQL append reaches the database a round trip after `append` returns, so a
            # kill can lose it: there every unit is waited for.
            sync = "units" if isinstance(store, kerman.PostgresStore) else "effects"
        if sync not in SYNC_MODES:
            raise ValueError(f'KermanDurability: sync must be "effects" or "units", not {sync!r}')
        self._sync: Literal["effects", "units"] = sync
        if not hasattr(store, "exists") or not hasattr(store, "create"):
            raise TypeError(f"KermanDurability: store must be a Kerman store (FileStore, MemoryStore, PostgresStore), not {store!r}")
        self._effects = check_effects(effects)
        self._backend: tuple[tuple[str | None, str | None], _Backend] | None = None
        super().__init__(name=name)
        self._session = _Session(store, session_id)

    def __repr__(self) -> str:
        return f"KermanDurability(session_id={self._session.session_id!r}, name={self.name or None!r}, sync={self._sync!r})"

    @property
    def session_id(self) -> str:
        """The Kerman session the runs are journalled in."""
        return self._session.session_id

    @property
    def sync(self) -> Literal["effects", "units"]:
        """When a run waits for the disk: ``"effects"`` or ``"units"`` (see the class)."""
        return self._sync

    @property
    def log(self) -> kerman.SessionLog:
        """The session's log (opened, or created, on first use)."""
        return self._session.open()

    def pending_prompt(self) -> Any:
        """The prompt of the session's interrupted run (its last ``pydantic-ai/run`` without a
        ``pydantic-ai/run-end``), as logged; ``None`` when no run is interrupted. A process
        that restarts after a crash resumes it with ``agent.run(durability.pending_prompt())``."""
        last = _runs(self._session.open())
        if last.ended or last.start is None:
            return None
        return last.start.get("prompt")

    @property
    def inbox(self) -> kerman.Inbox:
        """The session's inbox: the runs' pending messages (opened with the log)."""
        self._session.open()
        assert self._session.inbox is not None
        return self._session.inbox

    def enqueue(self, content: str | kerman.UserMessage, *, priority: str = "asap") -> kerman.UserMessage:
        """Puts ``content`` in the session's inbox for the running run (or the next one): one
        ``agent/inbox/spliced`` append, durable once ``await durability.log.flush()`` returns.
        ``priority="asap"`` (the ``next-step`` list) is delivered before the run's next model
        request; ``"when_idle"`` (``next-turn``) when the agent would otherwise end, one prompt
        per continuation. Thread-safe, like ``AgentRun.enqueue``. Returns the stored message
        (its ``id`` names it in the log and the UI streams)."""
        if priority not in ("asap", "when_idle"):
            raise ValueError(f'KermanDurability.enqueue: priority must be "asap" or "when_idle", not {priority!r}')
        return self.inbox.append("next-step" if priority == "asap" else "next-turn", content)

    def deferred(self) -> dict[str, Any] | None:
        """What continues the session's last run if it paused for approvals, read from the
        session alone: ``{"message_history": ..., "deferred_tool_results": ...}`` for
        ``agent.run(**durability.deferred())``, the results built from the decisions on its
        requests (docs/frameworks.md). ``None`` when the last run did not pause; a
        ``UserError`` naming the requests still pending when some are not decided."""
        log = self._session.open()
        # The session's last run-end; a later run without one is its continuation, interrupted.
        end = None
        for event in log.events(types=[RUN_END]):
            end = event.data if isinstance(event.data, dict) else None
        if end is None or end.get("messages") is None:
            return None
        return {
            "message_history": ModelMessagesTypeAdapter.validate_python(end["messages"]),
            "deferred_tool_results": approvals.results(log, int(end["run"])),
        }

    def close(self) -> None:
        """Close the session's inbox and log (the next run opens them again)."""
        self._session.close()

    @property
    def in_durable_context(self) -> bool:
        # Every run of an agent holding this capability is durable: wrap_run opens its journal.
        return True

    def get_durable_operation_backend(self) -> _Backend:
        # pydantic-ai asks at binding, at each run and at each model request; the backend holds
        # nothing per call, so one is made per name it carries (binding copies this capability,
        # attribute included, before renaming the copy: the key tells the copies apart).
        key = (self.name, self.default_model_id)
        made = self._backend
        if made is not None and made[0] == key:
            return made[1]
        effects = self._effects

        def tool_policy(operation_id: Any, tool: Any, tool_name: str) -> ToolPolicy:
            return resolve_policy(effects, tool, tool_name)

        backend = _Backend(
            agent_name=self.name,
            default_model_id=self.default_model_id,
            config=RoleBasedOperationConfig(model=None, event=None, capability=None, tool=None, resolve_tool=tool_policy),
        )
        backend.session_id = self.session_id
        self._backend = (key, backend)
        return backend

    async def before_node_run(self, ctx: RunContext[AgentDepsT], *, node: Any) -> Any:
        # A claim point before each model request: before the request's node runs, so what is
        # claimed (and what waits in pydantic-ai's own queue, moved to the inbox first) goes into
        # the request pydantic-ai prepares next, placed by pydantic-ai itself.
        if Agent.is_model_request_node(node) and (journal := _claim_point(ctx)) is not None:
            await _steer(ctx, journal, at_end=False)
        # The base's hook returns the node as it is (test_the_node_hooks_of_the_base_change_nothing):
        # returned here without awaiting it, as pydantic-ai calls this hook before every node.
        return node

    async def after_node_run(self, ctx: RunContext[AgentDepsT], *, node: Any, result: Any) -> Any:
        # A claim point when the agent would end (not when it pauses for deferred tools): what
        # is pending continues the run, as pydantic-ai's own queue does.
        if (
            isinstance(result, End)
            and not isinstance(getattr(result.data, "output", None), DeferredToolRequests)
            and (journal := _claim_point(ctx)) is not None
        ):
            await _steer(ctx, journal, at_end=True)
        return result  # as the base's hook does (see before_node_run)

    async def wrap_run(self, ctx: RunContext[AgentDepsT], *, handler: Any) -> Any:
        if _JOURNAL.get() is not None:
            raise UserError("KermanDurability: a run inside a journalled run (a nested agent) needs a session of its own")
        log = self._session.open()
        last = self._session.last_run(log)
        run, start, units, started = last.run, last.start, last.units or {}, last.started or set()
        prompt = _jsonable(ctx.prompt)
        if last.ended:
            run, units, started = run + 1, {}, set()
            log.append(RUN, {"run": run, "agent": self.name, "prompt": prompt})
            if self._session.unsynced:
                self._session.unsynced = False
                _sync_in_background(log)
        elif start is not None and start.get("prompt") != prompt:
            raise UserError(
                f"KermanDurability: session {self.session_id!r} holds run {run}, interrupted, started with prompt "
                f"{start.get('prompt')!r}; resume it with the same prompt, not {prompt!r}, or start anew in another session"
            )
        # A MemoryStore's flush promises nothing a crash would keep: its log dies with the process.
        flush = not isinstance(self._session.store, kerman.MemoryStore)
        journal = _Journal(log, run, units, flush=flush, every_unit=self._sync == "units", started=started)
        assert self._session.inbox is not None
        journal.steering = Steering(self._session.inbox, run, resumed=not last.ended)
        token = _JOURNAL.set(journal)
        try:
            result = await super().wrap_run(ctx, handler=handler)
        except Exception:
            # The caller gets the error only once what the run appended is durable (with
            # sync="units" every unit already is): a run started again finds its units.
            if flush and not journal.every_unit:
                await log.flush()
            raise
        finally:
            _JOURNAL.reset(token)
        output = getattr(result, "output", None)
        end: dict[str, Any] = {"run": run, "output": _jsonable(output)}
        paused = isinstance(output, DeferredToolRequests) and bool(output.approvals)
        if paused:
            # Decisions first: a crash before the run's end resumes the run, which pauses again
            # and finds its requests logged. The messages let the next run go on from the log.
            if approvals.request(log, run, output):
                if journal.flush:
                    await log.flush()
                journal._requested()
            end["messages"] = ModelMessagesTypeAdapter.dump_python(result.all_messages(), mode="json")
        log.append(RUN_END, end)
        self._session.ended = (len(log), run)
        # The run's one waited sync with sync="effects": the units not waited for and the end
        # together, so the output returned rests on nothing a crash could take back. With
        # sync="units" it is not awaited unless the run paused (its end carries the messages
        # that continue it, read from any process): every unit is durable already, so a run
        # whose end a crash lost is finished from the log alone (docs/frameworks.md).
        if journal.flush and (paused or not journal.every_unit):
            await log.flush()
        if paused and isinstance(self._session.store, kerman.FileStore):
            # A file session has one process at a time: let go, so store.decide (or kerman serve)
            # in another process can take it. The next run opens it again.
            self._session.close()
        return result
