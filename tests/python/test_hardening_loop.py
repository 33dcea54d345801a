"""Issue 12, the loop's part: deep tool-call arguments (item 6), one inbox per log (item 4),
duplicate tool-call ids with a crash (item 5), leaks of short-lived event loops and cancelled
tail waits (item 11). Each attack class is pinned with its neighbours; no test sleeps or
measures time."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import threading
import weakref
from typing import Any, Dict, List

import pytest

from conftest import read_raw_session, session_path, write_raw_session
from kerman import AgentLoop, FileStore, Inbox, InboxError, MemoryStore, ModelReply, Tool, ToolResult, UserMessage
from kerman.models import EchoModel, ScriptedModel

DEPTH = 100_000


def deep_array(depth: int) -> str:
    return "[" * depth + "]" * depth


def deep_object(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def run_calls(calls: List[Dict[str, Any]], tools: List[Tool]) -> List[Any]:
    """One turn: the model asks for ``calls``, then says "done"; returns the log's events."""
    return run_calls_with(ModelReply(calls), tools)


def results_of(events: List[Any]) -> List[Dict[str, Any]]:
    return [e.data for e in events if e.type == "tool/result"]


def end_of(events: List[Any]) -> Dict[str, Any]:
    ends = [e.data["reason"] for e in events if e.type == "turn/end"]
    assert len(ends) == 1, ends
    return ends[0]


# ---- item 6: deeply nested arguments ------------------------------------------------------

@pytest.mark.parametrize("arguments", [deep_array(DEPTH), deep_object(DEPTH), deep_array(5_000)],
                         ids=["array-100k", "object-100k", "array-5k"])
@pytest.mark.parametrize("calls", [1, 2], ids=["lone", "pool"])
def test_deep_arguments_are_invalid_arguments(arguments, calls):
    seen: List[Any] = []

    async def body(args, ctx):
        seen.append(args)
        return "ran"
    blocks = [{"type": "tool-call", "id": f"c{i}", "name": "t", "arguments": arguments} for i in range(calls)]
    events = run_calls(blocks, [Tool("t", body)])
    results = results_of(events)
    assert len(results) == calls
    for data in results:
        assert data["error"] == {"name": "ValueError", "code": "INVALID_ARGUMENTS"}
        text = data["message"]["content"][0]["content"][0]["text"]
        assert text.startswith("invalid tool arguments: nested too deeply"), text
    assert seen == []  # the body never ran
    assert end_of(events) == {"kind": "completed"}  # the turn continued: the model saw the error



def deep_value(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


def test_deep_values_elsewhere_in_a_turn_give_clear_errors():
    """The neighbours of deep arguments: a deep tool result is an error result (the turn goes
    on), deep request options and deep reply content fail the turn with a clear error; none is
    a RecursionError or a crash."""
    async def deep_result(args, ctx):
        return ToolResult([{"type": "text", "text": "x", "v": deep_value(DEPTH)}])
    events = run_calls([call("c1")], [Tool("t", deep_result)])
    [result] = results_of(events)
    assert result["error"]["code"] == "TOOL_ERROR"
    assert "nested deeper than 100 levels" in result["message"]["content"][0]["content"][0]["text"]
    assert end_of(events) == {"kind": "completed"}

    async def deep_options(request, next):
        request.options = {"v": deep_value(DEPTH)}
        return request

    async def main() -> List[Any]:
        loop = AgentLoop(EchoModel())
        loop.before_request(deep_options)
        loop.followup("hi")
        await loop.when_idle()
        events = list(loop.log.events())
        await loop.aclose()
        return events
    reason = end_of(asyncio.run(main()))
    assert reason["error"]["code"] == "INVALID_REQUEST", reason
    assert reason["error"]["message"].startswith("request options are not lossless JSON"), reason

    reply = ModelReply([{"type": "tool-call", "id": "c1", "name": "t", "arguments": deep_value(DEPTH)}])
    reason = end_of(run_calls_with(reply, [Tool("t", lambda args, ctx: "ran")]))
    assert reason["kind"] == "error" and "nested deeper than 100 levels" in reason["error"]["message"], reason

# ---- item 4: a log has at most one inbox --------------------------------------------------

def test_a_second_inbox_over_one_log_is_refused():
    log = MemoryStore().create()
    first = Inbox(log)
    first.append("next-turn", UserMessage("a", id="a"))
    with pytest.raises(InboxError, match=f'session "{log.id}" already has an inbox'):
        Inbox(log)
    with pytest.raises(InboxError, match="already has an inbox"):
        AgentLoop(EchoModel(), log=log)
    # Nothing was written by the refused ones; the first still works.
    first.append("next-turn", UserMessage("b", id="b"))
    assert [m.id for m in first.next_turn] == ["a", "b"]
    first.close()
    assert first.closed
    with pytest.raises(InboxError, match="was closed"):
        first.append("next-turn", "c")
    second = Inbox(log)
    assert [m.id for m in second.next_turn] == ["a", "b"]
    log.close()


def test_a_dropped_inbox_gives_the_log_up():
    log = MemoryStore().create()
    Inbox(log).append("next-turn", UserMessage("a", id="a"))  # dropped at once
    inbox = Inbox(log)
    assert [m.id for m in inbox.next_turn] == ["a"]
    del inbox
    Inbox(log)
    log.close()


def test_two_loops_over_one_log_are_refused_and_the_closed_one_gives_way(tmp_path):
    store = FileStore(tmp_path)
    log = store.create("s")

    async def main() -> None:
        first = AgentLoop(EchoModel(), log=log)
        with pytest.raises(InboxError, match="already has an inbox"):
            AgentLoop(EchoModel(), log=log)
        first.followup("one")
        await first.when_idle()
        await first.aclose()
        first.cancel()  # nothing pending: a no-op, not refused by the closed inbox
        second = AgentLoop(EchoModel(), log=log)  # the closed loop's inbox gave way
        second.followup("two")
        await second.when_idle()
        await second.aclose()

    asyncio.run(main())
    log.close()
    with store.open("s") as again:  # the log replays
        Inbox(again)
        assert [e.data["turn"] for e in again.events(types="turn/start")] == [1, 2]


def test_a_notebook_recreating_its_loop_after_dropping_the_old_one():
    """A dropped AgentLoop is garbage in a cycle (its callbacks refer to it): the next Inbox
    over the log collects it rather than being refused."""
    log = MemoryStore().create()

    async def main() -> None:
        loop = AgentLoop(EchoModel(), log=log)
        loop.followup("one")
        await loop.when_idle()
        ref = weakref.ref(loop)
        del loop
        loop = AgentLoop(EchoModel(), log=log)
        assert ref() is None
        loop.followup("two")
        await loop.when_idle()
        await loop.aclose()

    gc.disable()  # the cycle is only collected on demand
    try:
        asyncio.run(main())
    finally:
        gc.enable()
    assert len(list(log.events(types="turn/end"))) == 2
    log.close()


# ---- item 11: short-lived event loops and cancelled waits leak nothing --------------------

def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors through /proc")


def loop_factories() -> List[Any]:
    factories: List[Any] = [asyncio.new_event_loop]
    try:
        import uvloop
        factories.append(uvloop.new_event_loop)
    except ImportError:
        pass
    return factories


def run_short_lived(factory: Any, coro_fn: Any, rounds: int) -> List[Any]:
    """Runs ``coro_fn(i)`` on ``rounds`` fresh loops, each closed after; weak references to them."""
    refs = []
    for i in range(rounds):
        loop = factory()
        try:
            loop.run_until_complete(coro_fn(i))
        finally:
            loop.close()
        refs.append(weakref.ref(loop))
        del loop
    return refs


@needs_proc
@pytest.mark.parametrize("factory", loop_factories(), ids=lambda f: f.__module__.split(".")[0])
def test_a_completion_delivered_to_a_closed_loop_is_dropped(factory):
    """A wait completed from another thread after its loop closed (as a flush that finishes
    after the loop ended): the loop, its future and its drain's pipe all go."""
    log = MemoryStore().create()
    run_short_lived(factory, lambda i: asyncio.sleep(0), 1)  # warm up
    gc.collect()
    before = open_fds()

    async def leave_a_wait(i: int) -> None:
        assert not log._grown(len(log)).done()

    def append() -> None:
        log.append("x/event", {})

    refs = []
    for _ in range(20):
        refs += run_short_lived(factory, leave_a_wait, 1)
        thread = threading.Thread(target=append)  # delivers on a thread that is not the loop's
        thread.start()
        thread.join()
    gc.collect()
    assert [r for r in refs if r() is not None] == []
    assert open_fds() == before
    log.close()


@needs_proc
@pytest.mark.parametrize("factory", loop_factories(), ids=lambda f: f.__module__.split(".")[0])
def test_loops_ending_with_a_flush_pending_leak_nothing(tmp_path, factory):
    store = FileStore(tmp_path, durability="strict")
    run_short_lived(factory, lambda i: asyncio.sleep(0), 1)
    gc.collect()
    before = open_fds()
    log = store.create("s")

    async def flush_and_leave(i: int) -> None:
        log.append("x/event", {"i": i})
        log.flush()  # not awaited: the loop ends with it pending (or just delivered)

    refs = run_short_lived(factory, flush_and_leave, 50)
    log.close()  # every flush completed
    gc.collect()
    assert [r for r in refs if r() is not None] == []
    assert open_fds() == before


@needs_proc
@pytest.mark.parametrize("factory", loop_factories(), ids=lambda f: f.__module__.split(".")[0])
def test_a_tail_wait_cancelled_in_another_loop_is_dropped(factory):
    log = MemoryStore().create()
    log.append("x/event", {})
    run_short_lived(factory, lambda i: asyncio.sleep(0), 1)
    gc.collect()
    before = open_fds()

    async def time_out(i: int) -> None:
        tail = log.tail(start=len(log))
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(tail.__anext__(), 0.01)  # nothing is appended: it times out
        await tail.aclose()

    refs = run_short_lived(factory, time_out, 20)
    gc.collect()
    assert log._waiting() == 0
    assert [r for r in refs if r() is not None] == []
    assert open_fds() == before
    log.close()


def test_cancelled_tail_waits_are_dropped_at_once():
    """Within one loop: a cancelled wait is given up when cancelled, not kept (with its future)
    until the next append."""
    log = MemoryStore().create()

    async def main() -> None:
        refs = []
        for _ in range(1000):
            future = log._grown(len(log))
            future.cancel()
            refs.append(weakref.ref(future))
            del future
        await asyncio.sleep(0)  # the done callbacks run
        assert log._waiting() == 0
        gc.collect()
        assert [r for r in refs if r() is not None] == []
        # A wait that is not cancelled is still woken.
        waiting = log._grown(len(log))
        log.append("x/event", {})
        await waiting
        tails = [asyncio.ensure_future(log.tail(start=len(log)).__anext__()) for _ in range(100)]
        await asyncio.sleep(0)
        assert log._waiting() == 100
        for task in tails:
            task.cancel()
        await asyncio.gather(*tails, return_exceptions=True)
        assert log._waiting() == 0

    asyncio.run(main())
    log.close()


# ---- item 5: duplicate tool-call ids ------------------------------------------------------

def call(id: str, name: str = "t", arguments: str = "{}") -> Dict[str, Any]:
    return {"type": "tool-call", "id": id, "name": name, "arguments": arguments}


@pytest.mark.parametrize("streamed", [False, True], ids=["reply", "stream"])
@pytest.mark.parametrize("ids", [["c1", "c1"], ["a", "c1", "b", "c1"]], ids=["pair", "among-others"])
def test_a_reply_repeating_a_call_id_is_invalid(streamed, ids):
    """SPEC and the reference are silent on repeated call ids; the decision (issue 12, item 5):
    refused as ``INVALID_REPLY``, naming the id, before anything is logged, rather than renamed,
    so the history stays what the model said."""
    ran: List[Any] = []

    async def body(args, ctx):
        ran.append(ctx.call_id)
        return "ran"
    reply: Any = [call(i) for i in ids] + [{"type": "finish", "reason": "stop"}] if streamed else ModelReply([call(i) for i in ids])
    events = run_calls_with(reply, [Tool("t", body)])
    reason = end_of(events)
    assert reason["kind"] == "error" and reason["error"]["code"] == "INVALID_REPLY", reason
    assert reason["error"]["message"] == ('model reply has two tool calls with id "c1"; '
                                          "tool-call ids must be unique within a reply")
    # Nothing of the reply is a request: no assistant message, no call, no result.
    assert [e.type for e in events if e.type in ("assistant/message", "tool/call", "tool/result")] == []
    assert ran == []


def test_calls_with_distinct_ids_still_run():
    events = run_calls([call("c1"), call("c2")], [Tool("t", lambda args, ctx: "ran")])
    assert [r["message"]["source"]["callId"] for r in results_of(events)] == ["c1", "c2"]
    assert end_of(events) == {"kind": "completed"}


def run_calls_with(reply: Any, tools: List[Tool]) -> List[Any]:
    """One turn: the model gives ``reply``, then says "done"; returns the log's events."""
    async def main() -> List[Any]:
        loop = AgentLoop(ScriptedModel([reply, "done"]), tools=tools)
        loop.followup("hi")
        await loop.when_idle()
        events = list(loop.log.events())
        await loop.aclose()
        return events
    return asyncio.run(main())


def _crashed_with_repeated_ids(tmp_path: Any, cut_after: str) -> Any:
    """A real session with calls c1, c2 (and a result each), rewritten as if the model had
    named both c1 and the process died (``"call"``: both calls logged, the second without its
    result; ``"message"``: right after the assistant message)."""
    store = FileStore(tmp_path)
    log = store.create("s")

    async def main() -> None:
        loop = AgentLoop(ScriptedModel([ModelReply([call("c1"), call("c2")]), "done"]), log=log,
                         tools=[Tool("t", lambda args, ctx: "ran")])
        loop.followup("hi")
        await loop.when_idle()
        await loop.aclose()
    asyncio.run(main())
    log.close()
    path = session_path(tmp_path, "s")
    records = [rec for _, rec, _ in read_raw_session(path)]
    header, events = records[0], records[1:]
    kinds = [e["type"] for e in events]
    if cut_after == "call":
        end = [i for i, k in enumerate(kinds) if k == "tool/result"][1]  # before the second result
    else:
        end = kinds.index("assistant/message") + 1
    kept = json.loads(json.dumps(events[:end]).replace('"c2"', '"c1"'))
    write_raw_session(path, header, kept)
    return store


@pytest.mark.parametrize("cut_after", ["call", "message"])
def test_closers_answer_every_call_of_a_repeated_id(tmp_path, cut_after):
    store = _crashed_with_repeated_ids(tmp_path, cut_after)
    with store.open("s") as log:
        events = list(log.events())
    message = next(e for e in events if e.type == "assistant/message")
    requested = [b["id"] for b in message.data["message"]["content"] if b["type"] == "tool-call"]
    assert requested == ["c1", "c1"]
    results = [e.data for e in events if e.type == "tool/result"]
    assert len(results) == 2  # exactly one per requested call
    codes = [r.get("error", {}).get("code") for r in results]
    if cut_after == "call":
        # The first call's own result, then the second call (started) gets its closer.
        assert codes == [None, "TOOL_OUTCOME_UNKNOWN"]
        calls = [e.seq for e in events if e.type == "tool/call"]
        assert [e.source_event_seqs for e in events if e.type == "tool/result"][1] == [calls[1]]
    else:
        assert codes == ["TOOL_NOT_STARTED", "TOOL_NOT_STARTED"]
    assert [e.type for e in events][-2:] == ["step/end", "turn/end"]
