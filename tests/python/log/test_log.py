"""SessionLog (SPEC 2.2, 4.7; reference 2.1-2.4, 2.8) on MemoryStore and FileStore."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time

import pytest

import kerman
from conftest import compact, event_record, header_record, session_path, write_raw_session
from kerman import Event, LogClosedError, NotJsonError, ReentrantAppendError


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def kerman_errors(caplog):
    return [r for r in caplog.records if r.name == "kerman" and r.levelno >= logging.ERROR]


# ---------------------------------------------------------------------------------------------
# append, len, indexing


def test_append_returns_the_committed_event(log):
    assert len(log) == 0
    before = now_ms()
    ev = log.append("goal/change", {"goal": "x"})
    after = now_ms()
    assert isinstance(ev, Event)
    assert ev.seq == 0
    assert ev.type == "goal/change"
    assert ev.data == {"goal": "x"}
    assert type(ev.time) is int
    assert before <= ev.time <= after
    assert len(log) == 1
    assert log[0] == ev


def test_seq_is_the_previous_length(log):
    for i in range(25):
        assert len(log) == i
        ev = log.append("x/n", i)
        assert ev.seq == i
    assert len(log) == 25
    assert [e.data for e in log.events()] == list(range(25))


def test_times_are_non_decreasing_epoch_ms(log):
    before = now_ms()
    times = [log.append("x/t", i).time for i in range(200)]
    after = now_ms()
    assert times == sorted(times)
    assert before <= times[0] and times[-1] <= after


def test_indexing_and_negative_indexes(log):
    evs = [log.append("x/i", i) for i in range(5)]
    assert log[0] == evs[0]
    assert log[4] == evs[4]
    assert log[-1] == evs[4]
    assert log[-5] == evs[0]
    with pytest.raises(IndexError):
        log[5]
    with pytest.raises(IndexError):
        log[-6]


def test_indexing_an_empty_log(log):
    with pytest.raises(IndexError):
        log[0]
    with pytest.raises(IndexError):
        log[-1]


def test_iteration_yields_every_event_in_order(log):
    evs = [log.append("x/i", i) for i in range(4)]
    assert list(log) == evs


def test_log_id_and_header(store):
    log = store.create("sess-1")
    try:
        assert log.id == "sess-1"
        h = log.header
        assert h["id"] == "sess-1"
        assert h["version"] == 1 and kerman.FORMAT_VERSION == 2  # version 2 is for shared forks
        assert type(h["createdAt"]) is int
        h["id"] = "changed"  # a fresh dict
        assert log.header["id"] == "sess-1"
    finally:
        log.close()


@pytest.mark.parametrize(
    "data",
    [
        None,
        True,
        False,
        0,
        -1,
        2**63 - 1,
        -(2**63),
        1.5,
        -0.25,
        1e300,
        "",
        'é😀\n"\\',
        [],
        {},
        {"nested": [1, {"a": None, "b": [True, 2.5, "s"]}], "unicode": "日本"},
    ],
    ids=lambda d: repr(d)[:30],
)
def test_json_data_round_trips(log, data):
    ev = log.append("x/data", data)
    assert ev.data == data
    assert log[ev.seq].data == data
    assert type(log[ev.seq].data) is type(data)
    assert json.loads(ev.to_json())["data"] == data


def test_data_key_order_is_preserved(log):
    ev = log.append("x/order", {"b": 1, "a": {"z": 1, "y": 2}, "c": None})
    assert list(ev.data) == ["b", "a", "c"]
    assert list(ev.data["a"]) == ["z", "y"]
    assert ev.to_json().endswith('"data":{"b":1,"a":{"z":1,"y":2},"c":null}}')


def test_data_is_a_snapshot_of_the_argument(log):
    payload = {"list": [1, 2]}
    ev = log.append("x/snap", payload)
    payload["list"].append(3)
    payload["new"] = 1
    assert ev.data == {"list": [1, 2]}
    assert log[0].data == {"list": [1, 2]}


# ---------------------------------------------------------------------------------------------
# events(), splices()


def test_events_start_stop_types(log):
    for i in range(10):
        log.append("x/even" if i % 2 == 0 else "x/odd", i)
    assert [e.seq for e in log.events()] == list(range(10))
    assert [e.seq for e in log.events(3)] == list(range(3, 10))
    assert [e.seq for e in log.events(start=3, stop=6)] == [3, 4, 5]
    assert [e.seq for e in log.events(stop=100)] == list(range(10))
    assert list(log.events(start=10)) == []
    assert list(log.events(start=50)) == []
    assert list(log.events(start=5, stop=5)) == []
    assert [e.seq for e in log.events(types="x/odd")] == [1, 3, 5, 7, 9]
    assert [e.seq for e in log.events(types=["x/even"])] == [0, 2, 4, 6, 8]
    assert [e.seq for e in log.events(2, 7, types=("x/even", "x/odd"))] == [2, 3, 4, 5, 6]
    assert list(log.events(types=["nope/x"])) == []


def test_events_is_a_snapshot(log):
    for i in range(3):
        log.append("x/a", i)
    it = log.events()
    log.append("x/a", 3)
    assert [e.seq for e in it] == [0, 1, 2]
    assert len(log) == 4


def test_partially_consumed_events_iterator_does_not_grow(log):
    for i in range(3):
        log.append("x/a", i)
    it = iter(log.events())
    first = next(it)
    log.append("x/a", 3)
    log.append("x/a", 4)
    assert [first.seq] + [e.seq for e in it] == [0, 1, 2]


def test_splices_yields_only_inbox_splices(log):
    log.append("x/before", 0)
    inbox = kerman.Inbox(log)
    inbox.append(kerman.NEXT_TURN, kerman.UserMessage("a", id="a"))
    log.append("x/between", 1)
    inbox.append(kerman.NEXT_STEP, kerman.UserMessage("b", id="b"))
    splices = list(log.splices())
    assert [e.type for e in splices] == [kerman.SPLICED, kerman.SPLICED] == ["agent/inbox/spliced"] * 2
    assert [e.seq for e in splices] == [1, 3]
    assert [e.seq for e in log.splices(2)] == [3]
    assert list(log.splices(4)) == []


def test_splices_of_a_log_without_splices_is_empty(log):
    log.append("x/a", 1)
    assert list(log.splices()) == []


# ---------------------------------------------------------------------------------------------
# Event values


def test_event_fields_and_wire_form(log):
    ev = log.append("goal/change", {"goal": "x", "n": [1, 2]})
    assert ev.surface_op is None
    assert ev.source_event_seqs is None
    d = ev.to_dict()
    assert d == {"type": "goal/change", "seq": 0, "time": ev.time, "data": {"goal": "x", "n": [1, 2]}}
    assert list(d) == ["type", "seq", "time", "data"]
    assert ev.to_json() == compact(d)
    assert json.loads(ev.to_json()) == d


def test_event_data_is_cached(log):
    ev = log.append("x/a", {"k": [1]})
    assert ev.data is ev.data


def test_event_equality_and_hash(log):
    a = log.append("x/a", {"k": 1})
    b = log.append("x/a", {"k": 1})
    assert log[0] == a
    assert hash(log[0]) == hash(a)
    assert a != b  # different seq
    assert a != a.to_dict()
    assert len({a, log[0], b}) == 2


def test_event_is_frozen(log):
    ev = log.append("x/a", 1)
    for attr in ("seq", "time", "type", "data"):
        with pytest.raises((AttributeError, TypeError)):
            setattr(ev, attr, 0)
    assert ev.seq == 0 and ev.data == 1


def test_event_repr_names_seq_and_type(log):
    ev = log.append("goal/change", {"goal": "x"})
    r = repr(ev)
    assert "seq=0" in r and "goal/change" in r


def test_surface_fields_use_camel_case_on_the_wire(store_root):
    """Surface events cannot be appended publicly; read them from a crafted file."""
    um = kerman.UserMessage("hi", id="u1").to_dict()
    am = kerman.AssistantMessage("yo", id="a1").to_dict()
    write_raw_session(
        session_path(store_root, "s"),
        header_record("s"),
        [
            event_record(0, "user/message", um, surface_op="append"),
            event_record(1, "assistant/message", {"turn": 1, "step": 1, "message": am}, surface_op="append", source_event_seqs=[]),
            event_record(2, "user/message", um, surface_op={"op": "replace", "start": 0, "end": 1}, source_event_seqs=[0]),
        ],
    )
    log = kerman.FileStore(store_root).open("s")
    try:
        u, a, r = log.events()
        assert u.surface_op == "append" and u.source_event_seqs is None
        assert a.surface_op == "append" and a.source_event_seqs == []
        assert r.surface_op == {"op": "replace", "start": 0, "end": 1}
        assert r.source_event_seqs == [0]
        d = r.to_dict()
        assert d["surfaceOp"] == {"op": "replace", "start": 0, "end": 1}
        assert d["sourceEventSeqs"] == [0]
        assert "surface_op" not in d and "source_event_seqs" not in d
        assert list(d) == ["type", "seq", "time", "data", "sourceEventSeqs", "surfaceOp"]
        assert u.data == um
        assert kerman.Message.from_dict(u.data) == kerman.UserMessage("hi", id="u1")
    finally:
        log.close()


# ---------------------------------------------------------------------------------------------
# Reserved and free event types (SPEC 4.7)

RESERVED = [
    "turn/start",
    "turn/end",
    "step/start",
    "step/end",
    "user/message",
    "assistant/message",
    "assistant/chunk",
    "tool/call",
    "tool/result",
    "request/header",
    "agent/inbox/spliced",
]


@pytest.mark.parametrize("event_type", RESERVED)
def test_reserved_types_cannot_be_appended(log, event_type):
    seen = []
    log.subscribe(seen.append)
    with pytest.raises(ValueError) as exc:
        log.append(event_type, {"turn": 1})
    assert event_type in str(exc.value)
    assert len(log) == 0
    assert seen == []


FREE = [
    "request/context",
    "goal/change",
    "todo/write",
    "session/title",
    "llm/retry",
    "my-plugin/thing",
    "turns/start",
    "tools/call",
    "user/note",
    "agent/inbox/other",
    "plain",
]


@pytest.mark.parametrize("event_type", FREE)
def test_plugin_types_can_be_appended(log, event_type):
    ev = log.append(event_type, {"v": 1})
    assert ev.type == event_type
    assert log[0].type == event_type


def test_plugin_types_survive_a_reopen(store):
    log = store.create("s")
    for t in FREE:
        log.append(t, {"t": t})
    log.close()
    log = store.open("s")
    try:
        assert [(e.type, e.data) for e in log.events()] == [(t, {"t": t}) for t in FREE]
    finally:
        log.close()


def test_empty_type_is_refused(log):
    with pytest.raises(ValueError):
        log.append("", {})
    assert len(log) == 0


def test_non_str_type_is_refused(log):
    with pytest.raises(TypeError):
        log.append(3, {})
    assert len(log) == 0


# ---------------------------------------------------------------------------------------------
# Lossless JSON


class Opaque:
    pass


NOT_JSON = [
    float("nan"),
    float("inf"),
    float("-inf"),
    {1: "a"},
    {("t",): 1},
    {"a": {1, 2}},
    {1, 2},
    frozenset([1]),
    (1, 2),
    {"a": (1,)},
    Opaque(),
    {"a": [1, {"b": float("nan")}]},
    b"bytes",
    "\ud800",
    {"a": Opaque()},
]


@pytest.mark.parametrize("data", NOT_JSON, ids=lambda d: type(d).__name__ + ":" + repr(d)[:20])
def test_non_json_data_raises_not_json_error_and_appends_nothing(log, data):
    log.append("x/ok", 1)
    seen = []
    log.subscribe(seen.append)
    with pytest.raises(NotJsonError) as exc:
        log.append("x/bad", data)
    assert isinstance(exc.value, ValueError)
    assert isinstance(exc.value, kerman.LogError)
    assert "x/bad" in str(exc.value)
    assert len(log) == 1
    assert seen == []
    assert log.append("x/next", 2).seq == 1


# ---------------------------------------------------------------------------------------------
# Observers


def test_observer_runs_synchronously_after_commit_in_seq_order(log):
    calls = []

    def observer(ev):
        # committed before the observer runs
        calls.append((ev.seq, len(log), log[ev.seq] == ev))

    log.subscribe(observer)
    returned = []
    for i in range(5):
        returned.append(log.append("x/o", i))
        assert len(calls) == i + 1  # already called when append returns
    assert calls == [(i, i + 1, True) for i in range(5)]


def test_observers_run_in_registration_order(log):
    order = []
    log.subscribe(lambda ev: order.append(("a", ev.seq)))
    log.subscribe(lambda ev: order.append(("b", ev.seq)))
    log.append("x/o", 0)
    log.append("x/o", 1)
    assert order == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]


def test_observer_receives_the_committed_event(log):
    got = []
    log.subscribe(got.append)
    ev = log.append("x/o", {"a": 1})
    assert got == [ev]
    assert got[0].data == {"a": 1}


def test_observer_exceptions_are_contained_and_logged(log, caplog):
    after = []

    def bad(ev):
        raise RuntimeError("observer boom")

    log.subscribe(bad)
    log.subscribe(after.append)
    with caplog.at_level(logging.ERROR, logger="kerman"):
        ev = log.append("x/o", 1)
        ev2 = log.append("x/o", 2)
    assert ev.seq == 0 and ev2.seq == 1
    assert len(log) == 2
    assert [e.seq for e in after] == [0, 1]  # later observers still run
    errors = kerman_errors(caplog)
    assert len(errors) == 2
    for rec in errors:
        text = rec.getMessage() + (str(rec.exc_info[1]) if rec.exc_info else "")
        assert "observer boom" in text


def test_observer_append_raises_reentrant_append_error(log):
    caught = []

    def observer(ev):
        try:
            log.append("x/inner", ev.seq)
        except Exception as exc:  # noqa: BLE001 - we record what was raised
            caught.append(exc)

    log.subscribe(observer)
    ev = log.append("x/outer", 0)
    assert ev.seq == 0
    assert len(caught) == 1
    assert isinstance(caught[0], ReentrantAppendError)
    assert isinstance(caught[0], kerman.LogError)
    assert [e.type for e in log.events()] == ["x/outer"]


def test_uncaught_reentrant_append_is_contained_and_logged(log, caplog):
    def observer(ev):
        log.append("x/inner", ev.seq)

    log.subscribe(observer)
    with caplog.at_level(logging.ERROR, logger="kerman"):
        ev = log.append("x/outer", 0)
    assert ev.seq == 0
    assert [e.type for e in log.events()] == ["x/outer"]
    errors = kerman_errors(caplog)
    assert len(errors) == 1
    rec = errors[0]
    assert (
        (rec.exc_info and isinstance(rec.exc_info[1], ReentrantAppendError))
        or "ReentrantAppendError" in rec.getMessage()
        or "reenter" in rec.getMessage()
    )
    # the log keeps working
    assert log.append("x/after", 1).seq == 1


def test_observer_may_append_to_another_log(store):
    a = store.create("a")
    b = store.create("b")
    try:
        a.subscribe(lambda ev: b.append("mirror/x", ev.seq))
        a.append("x/a", 0)
        a.append("x/a", 1)
        assert [e.data for e in b.events()] == [0, 1]
    finally:
        a.close()
        b.close()


def test_unsubscribe(log):
    seen = []
    unsub = log.subscribe(seen.append)
    log.append("x/u", 0)
    assert callable(unsub)
    assert unsub() is True
    log.append("x/u", 1)
    assert [e.seq for e in seen] == [0]
    assert unsub() is False


def test_unsubscribe_one_of_two(log):
    a, b = [], []
    unsub_a = log.subscribe(a.append)
    log.subscribe(b.append)
    unsub_a()
    log.append("x/u", 0)
    assert a == [] and len(b) == 1


def test_subscribe_requires_a_callable(log):
    with pytest.raises(TypeError):
        log.subscribe(42)


# ---------------------------------------------------------------------------------------------
# tail()


def test_tail_yields_history_then_live_events_and_ends_on_close(log):
    for i in range(3):
        log.append("x/h", i)

    async def main():
        caught_up = asyncio.Event()
        got = []

        async def reader():
            async for ev in log.tail():
                got.append(ev)
                if ev.seq == 2:
                    caught_up.set()

        async def writer():
            await caught_up.wait()
            log.append("x/live", 3)
            log.append("x/live", 4)
            await log.flush()
            log.close()

        await asyncio.wait_for(asyncio.gather(reader(), writer()), 30)
        return got

    got = asyncio.run(main())
    assert [e.seq for e in got] == [0, 1, 2, 3, 4]
    assert [e.type for e in got] == ["x/h"] * 3 + ["x/live"] * 2


def test_tail_wakes_for_appends_from_another_thread(log):
    log.append("x/h", 0)

    async def main():
        caught_up = threading.Event()
        got = []

        def writer():
            caught_up.wait(30)
            for i in range(1, 4):
                log.append("x/thread", i)
            log.close()

        async def reader():
            async for ev in log.tail():
                got.append(ev.seq)
                if ev.seq == 0:
                    caught_up.set()

        t = threading.Thread(target=writer)
        t.start()
        try:
            await asyncio.wait_for(reader(), 30)
        finally:
            caught_up.set()
            t.join()
        return got

    assert asyncio.run(main()) == [0, 1, 2, 3]


def test_tail_with_start_and_types(log):
    for i in range(6):
        log.append("x/a" if i % 2 == 0 else "x/b", i)

    async def main():
        got = []
        seen_history = asyncio.Event()

        async def reader():
            async for ev in log.tail(start=2, types=["x/a"]):
                got.append(ev.seq)
                if ev.seq == 4:
                    seen_history.set()

        async def writer():
            await seen_history.wait()
            log.append("x/b", 6)
            log.append("x/a", 7)
            log.close()

        await asyncio.wait_for(asyncio.gather(reader(), writer()), 30)
        return got

    assert asyncio.run(main()) == [2, 4, 7]


def test_tail_types_as_a_single_string(log):
    log.append("x/a", 0)
    log.append("x/b", 1)
    log.close()

    async def main():
        return [ev.seq async for ev in log.tail(types="x/b")]

    assert asyncio.run(main()) == [1]


def test_tail_of_a_closed_log_yields_history_and_ends(log):
    for i in range(3):
        log.append("x/h", i)
    log.close()

    async def main():
        return [ev.seq async for ev in log.tail()]

    assert asyncio.run(asyncio.wait_for(main(), 30)) == [0, 1, 2]


def test_several_tails_see_the_same_events(log):
    async def main():
        ready = [asyncio.Event(), asyncio.Event()]

        async def reader(i):
            out = []
            ready[i].set()
            async for ev in log.tail():
                out.append(ev.seq)
            return out

        tasks = [asyncio.create_task(reader(i)) for i in range(2)]
        for r in ready:
            await r.wait()
        for i in range(5):
            log.append("x/m", i)
        log.close()
        return await asyncio.wait_for(asyncio.gather(*tasks), 30)

    assert asyncio.run(main()) == [[0, 1, 2, 3, 4]] * 2


def test_tail_consumer_may_stop_early(log):
    for i in range(5):
        log.append("x/h", i)

    async def main():
        got = []
        async for ev in log.tail():
            got.append(ev.seq)
            if ev.seq == 1:
                break
        return got

    assert asyncio.run(asyncio.wait_for(main(), 30)) == [0, 1]
    assert log.append("x/h", 5).seq == 5  # the log is unaffected


def test_cancelled_tail_leaves_the_log_usable(log):
    async def main():
        waiting = asyncio.Event()
        got = []

        async def reader():
            async for ev in log.tail():
                got.append(ev.seq)
                waiting.set()

        log.append("x/h", 0)
        task = asyncio.create_task(reader())
        await waiting.wait()  # the reader is now parked waiting for live events
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return got

    assert asyncio.run(asyncio.wait_for(main(), 30)) == [0]
    # appends after the reader (and its event loop) are gone must not fail
    assert log.append("x/h", 1).seq == 1
    assert log.append("x/h", 2).seq == 2


# ---------------------------------------------------------------------------------------------
# flush, close, context managers


def test_flush_is_awaitable(log):
    log.append("x/f", 1)

    async def main():
        await log.flush()
        log.append("x/f", 2)
        await log.flush()
        await log.flush()

    asyncio.run(asyncio.wait_for(main(), 30))
    assert len(log) == 2


def test_flush_of_an_empty_log(log):
    async def main():
        await log.flush()

    asyncio.run(asyncio.wait_for(main(), 30))
    assert len(log) == 0


def test_flush_outside_an_event_loop_raises(log):
    with pytest.raises(RuntimeError):
        log.flush()


def test_close_is_idempotent_and_append_after_close_raises(store):
    log = store.create()
    log.append("x/c", 0)
    assert log.closed is False
    log.close()
    assert log.closed is True
    log.close()
    assert log.closed is True
    with pytest.raises(LogClosedError) as exc:
        log.append("x/c", 1)
    assert isinstance(exc.value, kerman.LogError)
    assert len(log) == 1


def test_committed_events_remain_readable_after_close(store):
    log = store.create()
    ev = log.append("x/c", {"a": 1})
    log.close()
    assert len(log) == 1
    assert log[0] == ev
    assert list(log.events()) == [ev]


def test_aclose(store):
    log = store.create()
    log.append("x/c", 0)

    async def main():
        await log.aclose()
        await log.aclose()

    asyncio.run(asyncio.wait_for(main(), 30))
    assert log.closed
    with pytest.raises(LogClosedError):
        log.append("x/c", 1)


def test_with_statement_closes(store):
    with store.create() as log:
        assert not log.closed
        log.append("x/w", 0)
    assert log.closed
    with pytest.raises(LogClosedError):
        log.append("x/w", 1)


def test_with_statement_closes_and_propagates_errors(store):
    with pytest.raises(KeyError):
        with store.create() as log:
            log.append("x/w", 0)
            raise KeyError("inner")
    assert log.closed


def test_async_with_closes(store):
    async def main():
        async with store.create() as log:
            assert not log.closed
            log.append("x/w", 0)
        return log

    log = asyncio.run(asyncio.wait_for(main(), 30))
    assert log.closed
    with pytest.raises(LogClosedError):
        log.append("x/w", 1)


def test_async_with_closes_and_propagates_errors(store):
    holder = {}

    async def main():
        async with store.create() as log:
            holder["log"] = log
            raise KeyError("inner")

    with pytest.raises(KeyError):
        asyncio.run(asyncio.wait_for(main(), 30))
    assert holder["log"].closed


def test_reopen_after_close_sees_the_events(store):
    log = store.create("s")
    log.append("x/r", 0)
    log.close()
    log2 = store.open("s")
    try:
        assert [e.data for e in log2.events()] == [0]
        assert log2.append("x/r", 1).seq == 1
    finally:
        log2.close()


# ---------------------------------------------------------------------------------------------
# Threads


def test_appends_from_several_threads_get_unique_contiguous_seqs(log):
    threads_n, per_thread = 8, 150
    observed = []
    log.subscribe(lambda ev: observed.append(ev.seq))
    start = threading.Barrier(threads_n)
    returned = [[] for _ in range(threads_n)]
    errors = []

    def work(t):
        try:
            start.wait(30)
            for n in range(per_thread):
                returned[t].append(log.append("x/thread", {"t": t, "n": n}).seq)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(threads_n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    total = threads_n * per_thread
    assert len(log) == total
    all_seqs = sorted(s for r in returned for s in r)
    assert all_seqs == list(range(total))
    assert observed == list(range(total))  # observers see seq order
    events = list(log.events())
    assert [e.seq for e in events] == list(range(total))
    times = [e.time for e in events]
    assert times == sorted(times)
    for t in range(threads_n):
        mine = [e.data["n"] for e in events if e.data["t"] == t]
        assert mine == list(range(per_thread))  # each thread's appends keep their order
        assert [log[s].data for s in returned[t]] == [{"t": t, "n": n} for n in range(per_thread)]
