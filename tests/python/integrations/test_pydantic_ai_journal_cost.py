"""What KermanDurability asks of the store and of pydantic-ai per run: a new file session's first
sync starts with the run (not awaited), so the first waited flush does not also wait for the
session's folder; a later run, or a store that does not sync, gets no extra flush; with
``sync="effects"`` a run waits for the disk once before it returns, and around a marked tool
call, and with ``sync="units"`` after every unit; a run after one this capability ended reads
nothing back from the log, nor does the first run of a session that holds no event, and a new
run looks for no claims of its own; a claim point claims only when the inbox holds something;
the durable-operation backend pydantic-ai asks for at each model request is made once per name."""

from __future__ import annotations

import asyncio
from typing import Any, Literal, get_type_hints

import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent  # noqa: E402
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart  # noqa: E402
from pydantic_ai.models.function import AgentInfo, FunctionModel  # noqa: E402

import kerman  # noqa: E402
from kerman.integrations import pydantic_ai_steering as steering  # noqa: E402
from kerman.integrations.pydantic_ai import RAISED, RUN, RUN_END, STARTED, UNIT, KermanDurability  # noqa: E402


class _Noted:
    """A session log that notes the journal's appends, flushes and reads in order (the rest as
    the log)."""

    def __init__(self, log: kerman.SessionLog, calls: list[str]) -> None:
        self._log = log
        self._calls = calls

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)

    def __len__(self) -> int:
        return len(self._log)

    def append(self, type: str, data: Any = None) -> Any:
        self._calls.append(type)
        return self._log.append(type, data)

    def flush(self) -> Any:
        self._calls.append("flush")
        return self._log.flush()

    def events(self, *args: Any, **kwargs: Any) -> Any:
        self._calls.append("read")
        return self._log.events(*args, **kwargs)


class _NotedInbox:
    """A session inbox that notes the runs' claims (the rest as the inbox)."""

    def __init__(self, inbox: kerman.Inbox, calls: list[str]) -> None:
        self._inbox = inbox
        self._calls = calls

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inbox, name)

    def claim(self, *args: Any, **kwargs: Any) -> Any:
        self._calls.append("claim")
        return self._inbox.claim(*args, **kwargs)


def _noted(durability: KermanDurability[Any], calls: list[str]) -> None:
    """Notes in ``calls`` what the runs of ``durability`` do with its log and inbox."""
    log = durability.log
    durability._session.log = _Noted(log, calls)  # type: ignore[assignment]
    durability._session.inbox = _NotedInbox(durability.inbox, calls)  # type: ignore[assignment]


def _two_runs(store: Any, monkeypatch: pytest.MonkeyPatch, sync: str = "units") -> list[str]:
    """The appends, flushes, reads and model requests of two runs in a session the capability
    creates (``claims``: the steering's look for claims an earlier attempt of the run logged)."""
    calls: list[str] = []
    looked = steering.logged_claims

    def logged_claims(log: kerman.SessionLog, run: int) -> Any:
        calls.append("claims")
        return looked(log, run)

    monkeypatch.setattr(steering, "logged_claims", logged_claims)

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.append("model")
        return ModelResponse(parts=[TextPart("done")])

    durability = KermanDurability(store, session_id="s", sync=sync)  # type: ignore[arg-type]
    _noted(durability, calls)
    agent = Agent(FunctionModel(model), name="a", capabilities=[durability])
    assert asyncio.run(agent.run("hi")).output == "done"
    assert asyncio.run(agent.run("again")).output == "done"
    durability.close()
    return calls


def test_a_new_file_session_starts_its_first_sync_with_the_run_not_at_its_first_unit(tmp_path, monkeypatch):
    # The start's flush comes before the model request (not awaited); the second run's start
    # rides with its first unit's flush (nothing is left to create). Neither run reads the log:
    # the session was empty, then the second knows the first ended. Nothing was pending, so
    # neither claims.
    assert _two_runs(kerman.FileStore(tmp_path / "s"), monkeypatch) == [
        *[RUN, "flush", "model", UNIT, "flush", RUN_END],
        *[RUN, "model", UNIT, "flush", RUN_END],
    ]
    log = kerman.FileStore(tmp_path / "s").open("s")
    assert [e.type for e in log.events()] == [RUN, UNIT, RUN_END, RUN, UNIT, RUN_END]
    log.close()


def test_with_sync_effects_a_new_file_session_waits_once_a_run_for_its_end(tmp_path, monkeypatch):
    # The start's flush is not awaited; each run's one waited flush is its end's, which carries
    # its unit (and, in the second run, its start).
    assert _two_runs(kerman.FileStore(tmp_path / "s"), monkeypatch, "effects") == [
        *[RUN, "flush", "model", UNIT, RUN_END, "flush"],
        *[RUN, "model", UNIT, RUN_END, "flush"],
    ]


@pytest.mark.parametrize("sync", ["units", "effects"])
@pytest.mark.parametrize("store", ["none", "memory"])
def test_a_store_that_does_not_sync_gets_no_flush_at_the_start(tmp_path, monkeypatch, store, sync):
    # `none` never syncs (so owes no folder sync); a MemoryStore's flush keeps nothing.
    made = kerman.FileStore(tmp_path / "s", durability="none") if store == "none" else kerman.MemoryStore()
    if store == "memory":
        unit, end = [UNIT], [RUN_END]
    elif sync == "units":
        unit, end = [UNIT, "flush"], [RUN_END]
    else:
        unit, end = [UNIT], [RUN_END, "flush"]
    assert _two_runs(made, monkeypatch, sync) == [RUN, "model", *unit, *end, RUN, "model", *unit, *end]


def _one_tool_run(tmp_path: Any, effect: str, sync: str | None, *, fails: bool = False) -> list[str]:
    """The appends and flushes (and the model's and the tool's bodies) of a run in a file
    session that exists already: one model request asking for tool ``act`` of effect class
    ``effect``, the call, a last model request (or the run raising from the tool)."""
    calls: list[str] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.append("model")
        if not any(isinstance(p, ToolReturnPart) for m in messages for p in getattr(m, "parts", [])):
            return ModelResponse(parts=[ToolCallPart("act", {})])
        return ModelResponse(parts=[TextPart("done")])

    store = kerman.FileStore(tmp_path / "s")
    store.create("s").close()
    options = {} if sync is None else {"sync": sync}
    durability = KermanDurability(store, session_id="s", effects={"act": effect}, **options)
    _noted(durability, calls)
    agent = Agent(FunctionModel(model), name="a", capabilities=[durability])

    @agent.tool_plain
    def act() -> str:
        calls.append("tool")
        if fails:
            raise RuntimeError("the tool failed")
        return "acted"

    calls.clear()
    if fails:
        with pytest.raises(RuntimeError):
            asyncio.run(agent.run("go"))
    else:
        assert asyncio.run(agent.run("go")).output == "done"
    durability.close()
    return calls


@pytest.mark.parametrize("effect", ["read", "idempotent"])
def test_a_run_with_a_read_waits_for_the_disk_once_before_it_returns(tmp_path, effect):
    # Three units, none an effect to guard: their results are appended, and the run's end is
    # flushed with them all before the run returns.
    assert (
        _one_tool_run(tmp_path, effect, "effects")
        == _one_tool_run(tmp_path / "default", effect, None)
        == [*[RUN, "model", UNIT, "tool", UNIT, "model", UNIT, RUN_END, "flush"]]
    )


def test_a_run_with_a_write_waits_before_its_body_after_its_result_and_before_it_returns(tmp_path):
    # The marker's flush makes the model response that asked for the call durable too (the log
    # is written in order); the result's flush keeps the call out of doubt.
    assert (
        _one_tool_run(tmp_path, "write", "effects")
        == _one_tool_run(tmp_path / "default", "write", None)
        == [*[RUN, "model", UNIT, STARTED, "flush", "tool", UNIT, "flush", "model", UNIT, RUN_END, "flush"]]
    )


@pytest.mark.parametrize("effect", ["read", "write"])
def test_sync_units_waits_after_every_unit_and_not_for_the_end(tmp_path, effect):
    marked = [STARTED, "flush"] if effect == "write" else []
    assert _one_tool_run(tmp_path, effect, "units") == [
        *[RUN, "model", UNIT, "flush", *marked, "tool", UNIT, "flush", "model", UNIT, "flush", RUN_END],
    ]


def test_a_run_that_raises_waits_for_the_disk_once_before_the_error_reaches_the_caller(tmp_path):
    # The read's failure is no unit of the run (pydantic-ai raises it): what was appended is
    # flushed before the error propagates; a write that raised logs that it did.
    assert _one_tool_run(tmp_path, "read", "effects", fails=True) == [RUN, "model", UNIT, "tool", "flush"]
    assert _one_tool_run(tmp_path / "w", "write", "effects", fails=True) == [
        *[RUN, "model", UNIT, STARTED, "flush", "tool", RAISED, "flush"],
    ]


def test_sync_is_checked_and_shown(tmp_path):
    with pytest.raises(ValueError, match='sync must be "effects" or "units", not \'unit\''):
        KermanDurability(kerman.MemoryStore(), session_id="s", sync="unit")
    # The default waits where an effect depends on it (a FileStore session is written through,
    # so a kill costs no model request either).
    assert KermanDurability(kerman.MemoryStore(), session_id="s").sync == "effects"
    assert KermanDurability(kerman.FileStore(str(tmp_path)), session_id="s").sync == "effects"
    assert repr(KermanDurability(kerman.MemoryStore(), session_id="s", sync="units")).endswith("sync='units')")
    # Typed as the parameter is: a checker knows the two values.
    assert get_type_hints(KermanDurability.sync.fget)["return"] == Literal["effects", "units"]


def test_a_run_after_something_else_was_appended_reads_the_log_again(tmp_path, monkeypatch):
    # An enqueue between the runs (any append) means the log may hold more than the run's end.
    calls: list[str] = []
    durability = KermanDurability(kerman.MemoryStore(), session_id="s")
    _noted(durability, calls)
    agent = Agent(FunctionModel(lambda m, i: ModelResponse(parts=[TextPart("done")])), name="a", capabilities=[durability])
    asyncio.run(agent.run("hi"))
    durability.enqueue("later", priority="when_idle")
    calls.clear()
    asyncio.run(agent.run("again"))
    assert calls[:2] == ["read", RUN]
    durability.close()


def test_a_claim_point_claims_only_when_the_inbox_holds_something():
    # The session holds the enqueue, so the run reads it. The prompt waiting for the agent's end
    # makes the points before it claim (the inbox is not empty; next-step is, so the first claim
    # takes nothing); it continues the run, whose last request and end find the inbox empty and
    # claim nothing.
    calls: list[str] = []
    durability = KermanDurability(kerman.MemoryStore(), session_id="s")
    _noted(durability, calls)

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.append("model")
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(FunctionModel(model), name="a", capabilities=[durability])
    durability.enqueue("and then?", priority="when_idle")
    assert asyncio.run(agent.run("hi")).output == "done"
    assert calls == ["read", RUN, "claim", "model", UNIT, "claim", "model", UNIT, RUN_END]
    claims = [e.data.get("by") for e in durability.log.events(types=[steering.SPLICED]) if "by" in e.data]
    assert claims == [steering.claimant(1, 1)]
    durability.close()


def test_the_backend_is_made_once_per_name_it_carries():
    durability = KermanDurability(kerman.MemoryStore(), session_id="s")
    agent = Agent(FunctionModel(lambda m, i: ModelResponse(parts=[TextPart("done")])), name="a", capabilities=[durability])
    bound = KermanDurability.from_agent(agent)
    assert bound is not None and bound is not durability
    backend = bound.get_durable_operation_backend()
    assert bound.get_durable_operation_backend() is backend
    # The bound copy carries the agent's name; the unbound one makes its own backend.
    assert durability.get_durable_operation_backend() is not backend
    assert asyncio.run(agent.run("hi")).output == "done"
    assert bound.get_durable_operation_backend() is backend
    durability.close()


def test_the_node_hooks_of_the_base_change_nothing():
    # KermanDurability's node hooks return what they were given rather than await the base's
    # hooks, which do nothing more: this fails if a pydantic-ai release makes them do something.
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.durable_exec import BaseDurabilityCapability

    assert BaseDurabilityCapability.before_node_run is AbstractCapability.before_node_run
    assert BaseDurabilityCapability.after_node_run is AbstractCapability.after_node_run
    durability = KermanDurability(kerman.MemoryStore(), session_id="s")
    node, result = object(), object()
    assert asyncio.run(AbstractCapability.before_node_run(durability, None, node=node)) is node  # type: ignore[arg-type]
    assert asyncio.run(AbstractCapability.after_node_run(durability, None, node=node, result=result)) is result  # type: ignore[arg-type]
