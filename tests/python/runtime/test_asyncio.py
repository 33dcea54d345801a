"""AgentLoop and asyncio (SPEC 4.3): task groups around the loop, uvloop, followup, steer, cancel
and wake from other threads, and contextvars seen downstream.

Every test drives its own event loop with ``asyncio.run`` and synchronises through
``asyncio.Event``/futures or ``threading.Event`` handshakes, never through sleeps.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
import threading
from typing import Any, Dict

import pytest

from kerman import (
    NEXT_TURN,
    AgentLoop,
    LoopError,
    ModelReply,
)
from kerman.models import ScriptedModel
from loop.loop_helpers import (
    COMPLETED,
    PARENT,
    USER,
    CancelledError,
    HangModel,
    aborted,
    count,
    forever,
    result_of,
    result_text,
    texts,
    tool_calls,
    turn_ends,
    types_of,
    user_texts,
)

# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _in_thread(fn):
    """Runs ``fn`` in another thread while the event loop's thread blocks; returns its value."""
    out: Dict[str, Any] = {}
    done = threading.Event()

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:
            out["error"] = e
        finally:
            done.set()

    threading.Thread(target=run).start()
    done.wait()
    if "error" in out:
        raise out["error"]
    return out.get("value")


# --------------------------------------------------------------------------------------------
# asyncio integration (SPEC 4.3)
# --------------------------------------------------------------------------------------------


@pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.TaskGroup needs Python 3.11")
def test_task_group_user_code_alongside_the_loop_and_cancelled_inside_a_tool():
    async def main():
        model = ScriptedModel([tool_calls(("c1", "fan_out")), "summary", tool_calls(("c2", "fan_out"))])
        loop = AgentLoop(model)
        side = asyncio.Event()
        children = asyncio.Event()
        sub_cancelled: list = []
        runs: list = []

        @loop.tool
        async def fan_out(args, ctx):
            runs.append(ctx.call_id)

            async def sub(i):
                if len(runs) == 1:
                    return i * 2
                children.set()
                try:
                    await forever()
                except CancelledError:
                    sub_cancelled.append(i)
                    raise

            async with asyncio.TaskGroup() as tg:
                tasks = [tg.create_task(sub(i)) for i in range(3)]
            return ",".join(str(t.result()) for t in tasks)

        async with asyncio.TaskGroup() as outer:
            outer.create_task(side.wait())
            loop.followup("fan out")
            await loop.when_idle()
            assert result_text(result_of(loop.log, "c1")) == "0,2,4"
            assert turn_ends(loop.log) == [COMPLETED]

            loop.followup("again")
            await children.wait()
            loop.cancel()
            await loop.when_idle()
            side.set()
        assert sorted(sub_cancelled) == [0, 1, 2]
        assert result_of(loop.log, "c2").data["error"] == {"name": "CancelledError", "code": "ABORTED_DURING_DISPATCH"}
        assert turn_ends(loop.log) == [COMPLETED, aborted(USER)]

    asyncio.run(main())


def test_under_uvloop():
    uvloop = pytest.importorskip("uvloop")

    async def main():
        assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
        model = HangModel(hang={2})
        loop = AgentLoop(model)
        loop.followup("first")
        await loop.when_idle()
        loop.followup("second")
        await model.entered.wait()
        loop.cancel()
        await loop.when_idle()
        assert model.cancelled == 1
        assert turn_ends(loop.log) == [COMPLETED, aborted(USER)]

        claimed = asyncio.Event()
        loop.on("agent/inbox/claimed", lambda e: claimed.set() if e.message.text == "from thread" else None)
        _in_thread(lambda: loop.followup("from thread"))
        await claimed.wait()  # the wake ran on the loop
        await loop.when_idle()
        assert user_texts(loop.log)[-1] == "from thread"
        assert turn_ends(loop.log)[-1] == COMPLETED

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())


def test_followup_from_another_thread_inserts_at_once_and_wakes_on_the_loop():
    async def main():
        called = asyncio.Event()
        threads: Dict[str, set] = {"model": set(), "listener": set()}

        async def model(request):
            threads["model"].add(threading.get_ident())
            called.set()
            return ModelReply("ok")

        loop = AgentLoop(model)
        loop.on("agent/inbox/inserted", lambda e: threads["listener"].add(threading.get_ident()))
        loop_thread = threading.get_ident()
        seen: Dict[str, Any] = {}
        done = threading.Event()

        def worker():
            try:
                m = loop.followup("from thread")
                seen["pending"] = m in loop.inbox.next_turn
                seen["status"] = loop.status
                seen["types"] = types_of(loop.log)
            except BaseException as e:  # pragma: no cover - reported below
                seen["error"] = e
            finally:
                done.set()

        threading.Thread(target=worker).start()
        done.wait()  # the event loop is blocked: the wake can only be pending
        assert "error" not in seen, seen.get("error")
        assert seen == {"pending": True, "status": "idle", "types": ["agent/inbox/spliced"]}
        await called.wait()
        await loop.when_idle()
        assert turn_ends(loop.log) == [COMPLETED]
        assert threads["model"] == {loop_thread}
        assert threads["listener"] == {loop_thread}

    asyncio.run(main())


def test_steer_and_cancel_from_another_thread():
    async def main():
        release = asyncio.Event()
        called = [asyncio.Event() for _ in range(3)]
        requests: list = []

        async def model(request):
            requests.append(request)
            called[len(requests) - 1].set()
            if len(requests) == 1:
                await release.wait()
            if len(requests) == 3:
                await forever()
            return ModelReply(f"reply {len(requests)}")

        loop = AgentLoop(model)
        loop.followup("go")
        await called[0].wait()
        pending = _in_thread(lambda: (loop.steer("steering"), loop.inbox.next_step)[1])
        assert texts(pending) == ["steering"]  # inserted at once, from the thread
        release.set()
        await loop.when_idle()
        assert [(r.step, texts(r.entered)) for r in requests] == [(1, ["go"]), (2, ["steering"])]

        loop.followup("hang")
        await called[2].wait()
        signal = requests[2].signal
        aborted_in_thread = _in_thread(lambda: (loop.cancel("parent"), signal.aborted)[1])
        assert aborted_in_thread is False  # scheduled onto the loop, not applied from the thread
        await loop.when_idle()
        assert signal.reason == PARENT
        assert turn_ends(loop.log) == [COMPLETED, aborted(PARENT)]

    asyncio.run(main())


def test_a_thread_wake_before_the_loop_was_ever_bound_raises_before_inserting():
    loop = AgentLoop(ScriptedModel(["ok"]))  # constructed with no running event loop: unbound

    async def main():
        errors: list = []

        def worker():
            for call in (lambda: loop.followup("early"), lambda: loop.steer("early"), loop.wake):
                try:
                    call()
                except LoopError as e:
                    errors.append(e)

        loop.inject("context")  # non-waking: allowed, makes wake() have work
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        assert len(errors) == 3
        assert texts(loop.inbox.next_step) == ["context"] and loop.inbox.next_turn == ()
        assert types_of(loop.log) == ["agent/inbox/spliced"]
        loop.followup("bound now")  # binds to this loop
        await loop.when_idle()
        assert user_texts(loop.log) == ["context", "bound now"]

    asyncio.run(main())


def test_waking_with_no_event_loop_at_all_raises_loop_error():
    loop = AgentLoop(ScriptedModel(["ok"]))
    with pytest.raises(LoopError, match="async"):
        loop.followup("x")
    with pytest.raises(LoopError):
        loop.steer("x")
    with pytest.raises(LoopError):
        loop.send("x", NEXT_TURN, True)
    assert len(loop.log) == 0 and not loop.inbox.has_pending
    loop.inject("context")  # non-waking delivery needs no event loop
    assert len(loop.log) == 1
    with pytest.raises(LoopError):
        loop.wake()
    assert loop.status == "idle" and count(loop.log, "turn/start") == 0


def test_contextvars_set_before_next_are_seen_downstream():
    var: contextvars.ContextVar[str] = contextvars.ContextVar("kerman_test_var", default="unset")

    async def main():
        loop = AgentLoop(ScriptedModel(["ok"]))
        seen: list = []

        @loop.pre_step
        async def outer(step, next):
            var.set("from outer")
            return await next()

        @loop.pre_step
        async def inner(step, next):
            seen.append(var.get())
            return await next()

        loop.followup("go")
        await loop.when_idle()
        assert seen == ["from outer"]
        assert turn_ends(loop.log) == [COMPLETED]

    asyncio.run(main())
