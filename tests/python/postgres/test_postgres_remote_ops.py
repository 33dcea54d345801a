"""`PostgresStore.cancel`, `.replace`, `.remove` and `.requeue` (docs/distributed.md, "Operations
from any process"): a process that does not own a session cancels its turn, edits its queue and
sends again what a cancelled turn claimed but never read; the owner applies each operation in
order with the input staged around it and answers.

The owner is an `AgentLoop` over a log of its own `PostgresStore`; the requester is another
store (its own connections), called from a thread as a web handler would. Waits are on events
and log contents, each bounded by a deadline."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from conftest import fresh_schema_dsn, needs_postgres
from kerman import AgentLoop, ModelReply, PostgresStore, SessionNotFoundError, UserMessage, Worker
from kerman.models import EchoModel

pytestmark = needs_postgres

DEADLINE = 30.0


class GatedModel:
    """Replies with the entered text once `release` is set; `started` is set at each call."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.seen: list[str] = []

    async def __call__(self, request):
        self.seen.extend(m.text for m in request.entered)
        self.started.set()
        await self.release.wait()
        return ModelReply("\n".join(m.text for m in request.entered))


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, DEADLINE + 10))


async def until(predicate, what: str) -> None:
    async def poll():
        while not predicate():
            await asyncio.sleep(0.01)

    try:
        await asyncio.wait_for(poll(), DEADLINE)
    except asyncio.TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


def pending(loop) -> list[str]:
    return [m.text for m in loop.inbox.next_turn] + [m.text for m in loop.inbox.next_step]


def test_remove_and_replace_are_applied_by_the_owner_and_answered():
    dsn = fresh_schema_dsn()

    async def main():
        owner, web = PostgresStore(dsn), PostgresStore(dsn)
        log = owner.create("s")
        model = GatedModel()
        loop = AgentLoop(model, log=log)
        loop.followup("first")  # runs, held in the model
        await model.started.wait()
        a = web.enqueue("s", "keep me")
        b = web.enqueue("s", "drop me")
        c = web.enqueue("s", UserMessage([{"type": "text", "text": "x"}, {"type": "image", "url": "https://e.x/i.png"}]))
        await until(lambda: len(pending(loop)) == 3, "the staged messages to reach the owner")

        removed = await asyncio.to_thread(web.remove, "s", b.id)
        assert removed["applied"] is True and removed["op"] == "remove" and removed["message_id"] == b.id
        assert removed["removed"]["id"] == b.id
        replaced = await asyncio.to_thread(web.replace, "s", a.id, "kept, edited")
        assert replaced["applied"] is True and replaced["message"]["id"] == a.id
        assert [m.text for m in loop.inbox.next_turn][:1] == ["kept, edited"]
        # Answered after the owner's splice committed: a follower sees it.
        follower = web.follow("s")
        splices = [e.data for e in follower.events() if e.type == "agent/inbox/spliced"]
        assert any(m.get("id") == a.id and m["content"][0]["text"] == "kept, edited" for s in splices for m in s.get("inserted", []))
        follower.close()

        # Refusals, each with its reason.
        again = await asyncio.to_thread(web.remove, "s", b.id)
        assert again["applied"] is False and again["reason"] == "not-queued", again
        unknown = await asyncio.to_thread(web.replace, "s", "never-queued", "x")
        assert unknown["applied"] is False and unknown["reason"] == "message-not-found", unknown
        not_text = await asyncio.to_thread(web.replace, "s", c.id, "y")
        assert not_text["applied"] is False and not_text["reason"] == "not-text", not_text
        with pytest.raises(SessionNotFoundError):
            await asyncio.to_thread(web.remove, "no-such-session", "m")

        model.release.set()
        await until(lambda: loop.status == "idle" and not pending(loop), "the queue to run")
        assert "drop me" not in model.seen and "kept, edited" in model.seen
        await loop.aclose()
        log.close()

    run(main())


def test_cancel_aborts_the_running_turn_and_keeps_or_discards_the_queue():
    dsn = fresh_schema_dsn()

    async def main():
        owner, web = PostgresStore(dsn), PostgresStore(dsn)
        log = owner.create("s")
        model = GatedModel()
        loop = AgentLoop(model, log=log)
        loop.followup("long one")
        await model.started.wait()
        web.enqueue("s", "queued")
        await until(lambda: pending(loop) == ["queued"], "the staged message")

        out = await asyncio.to_thread(web.cancel, "s", keep_inbox=True)
        assert out["applied"] is True and out["cancelled"] is True and out["discarded"] == [], out
        # The aborted turn ends; the kept message then waits (a cancel starts nothing).
        await until(lambda: any(e.type == "turn/end" and e.data["reason"]["kind"] == "aborted" for e in log.events()), "the aborted turn")
        assert pending(loop) == ["queued"]

        out = await asyncio.to_thread(web.cancel, "s")  # idle: nothing to cancel, the queue is discarded
        assert out["applied"] is True and out["cancelled"] is False and len(out["discarded"]) == 1, out
        assert pending(loop) == []
        await loop.aclose()
        log.close()

    run(main())


def test_an_operation_is_applied_in_order_with_the_input_staged_around_it():
    """One producer: enqueue m1, cancel (discarding the queue), enqueue m2, remove m2, enqueue m3
    — the owner applies them in that order whatever its delivery batches: m1 discarded, m2
    inserted then removed, m3 pending."""
    dsn = fresh_schema_dsn()

    async def main():
        owner, web = PostgresStore(dsn), PostgresStore(dsn)
        log = owner.create("s")
        model = GatedModel()
        loop = AgentLoop(model, log=log)
        loop.followup("hold")
        await model.started.wait()

        def producer():
            m1 = web.enqueue("s", "m1")
            out1 = web.cancel("s", keep_inbox=False)
            # Not waking: a waking message after a cancel starts the next turn, which would claim it.
            m2 = web.enqueue("s", "m2", wakeup=False)
            out2 = web.remove("s", m2.id)
            m3 = web.enqueue("s", "m3", wakeup=False)
            return m1, out1, m2, out2, m3

        m1, out1, m2, out2, m3 = await asyncio.to_thread(producer)
        assert out1["discarded"] == [m1.id], out1
        assert out2["applied"] is True and out2["message_id"] == m2.id, out2
        await until(lambda: [m.id for m in loop.inbox.next_turn] == [m3.id], "m3 to be the only pending message")
        model.release.set()
        await loop.aclose()
        log.close()

    run(main())


def test_an_operation_for_a_session_nobody_owns_times_out_and_is_withdrawn():
    dsn = fresh_schema_dsn()
    web = PostgresStore(dsn)
    web.create("s").close()
    out = web.remove("s", "m", timeout=0.3)
    assert out["applied"] is False and out["reason"] == "timeout", out
    # Withdrawn: nothing is left staged for a later owner.
    assert web.sessions("s")[0]["staged"] == 0


def claim_gated(model) -> tuple:
    """An AgentLoop factory whose pre_step listener holds turn 1 after its claim and before the
    model reads the input (as an approval plugin would); `claimed` is set when it holds."""
    claimed = asyncio.Event()

    def factory(log) -> AgentLoop:
        loop = AgentLoop(model, log=log)

        @loop.pre_step
        async def approval(step, next):
            if step.turn == 1:
                claimed.set()
                await asyncio.Event().wait()  # until cancelled
            return await next()

        return loop

    return factory, claimed


def user_texts(log) -> list[str]:
    return [e.data["content"][0]["text"] for e in log.events() if e.type == "user/message"]


def test_requeue_brings_back_a_prompt_cancelled_before_it_was_read_and_the_owner_runs_it():
    dsn = fresh_schema_dsn()

    async def main():
        owner, web = PostgresStore(dsn), PostgresStore(dsn)
        log = owner.create("s")
        factory, claimed = claim_gated(EchoModel())
        loop = factory(log)
        sent = web.enqueue("s", "deploy to staging")
        await asyncio.wait_for(claimed.wait(), DEADLINE)
        out = await asyncio.to_thread(web.cancel, "s", keep_inbox=True)
        assert out["applied"] is True and out["cancelled"] is True, out
        await asyncio.wait_for(loop.when_idle(), DEADLINE)
        [unread] = loop.transcript().unread()
        assert unread["message"].id == sent.id and not pending(loop)

        out = await asyncio.to_thread(web.requeue, "s", 1)
        assert out == {"applied": True, "op": "requeue", "turn": 1, "requeued": [sent.id]}, out
        # The owner wakes by itself and runs it: nobody here calls loop.wake().
        await until(lambda: user_texts(log) == ["deploy to staging"] and loop.status == "idle", "the resent prompt's turn")
        await asyncio.wait_for(loop.when_idle(), DEADLINE)
        assert loop.transcript().unread() == []
        assert [e.data["reason"]["kind"] for e in log.events() if e.type == "turn/end"] == ["aborted", "completed"]

        # Refusals, each with its reason; the requester's argument is checked before staging.
        again = await asyncio.to_thread(web.requeue, "s", 1)
        assert again["applied"] is False and again["reason"] == "nothing-to-requeue", again
        assert "turn 1" in again["detail"], again
        never = await asyncio.to_thread(web.requeue, "s", 9)
        assert never["reason"] == "nothing-to-requeue" and "9" in never["detail"], never
        for bad in (0, -1, True, "1"):
            with pytest.raises((TypeError, ValueError, OverflowError), match="turn"):
                web.requeue("s", bad)
        with pytest.raises(SessionNotFoundError):
            await asyncio.to_thread(web.requeue, "no-such-session", 1)
        await loop.aclose()
        log.close()

    run(main())


def test_requeue_of_a_session_nobody_owns_makes_a_worker_take_it_and_run_the_prompt():
    dsn = fresh_schema_dsn()

    async def main():
        web = PostgresStore(dsn)
        model = EchoModel()
        factory, claimed = claim_gated(model)
        log = PostgresStore(dsn).create("s")
        loop = factory(log)
        sent = web.enqueue("s", "run me later")
        await asyncio.wait_for(claimed.wait(), DEADLINE)
        loop.cancel(keep_inbox=True)
        await loop.aclose()
        log.close()  # released: nobody owns the session, nothing is pending

        # A worker that does not gate (turn 2 is the requeued prompt's): it takes the session for
        # the staged requeue, applies it, and runs what came back.
        worker = Worker(PostgresStore(dsn), lambda log: AgentLoop(model, log=log), idle_timeout=60.0)
        serving = asyncio.ensure_future(worker.run())
        try:
            out = await asyncio.to_thread(web.requeue, "s", 1)
            assert out["applied"] is True and out["requeued"] == [sent.id], out

            def ran() -> bool:
                follower = web.follow("s")
                try:
                    return user_texts(follower) == ["run me later"] and any(
                        e.type == "turn/end" and e.data["reason"]["kind"] == "completed" for e in follower.events()
                    )
                finally:
                    follower.close()

            await until(ran, "the worker to run the resent prompt")
        finally:
            worker.stop()
            await asyncio.wait_for(serving, DEADLINE)

    run(main())


OWNER = textwrap.dedent("""
    import asyncio, sys
    from kerman import AgentLoop, PostgresStore, ModelReply

    async def model(request):
        await asyncio.Event().wait()

    async def main():
        log = PostgresStore(sys.argv[1], lease_ttl=1.0).open("s")
        loop = AgentLoop(model, log=log)
        loop.inbox.close()   # takes no staged input: an operation staged now waits
        print("ready", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
""")


def test_an_operation_staged_while_the_owner_dies_is_applied_by_the_next_owner():
    dsn = fresh_schema_dsn()
    web = PostgresStore(dsn)
    web.create("s").close()
    m = web.enqueue("s", "queued")
    child = subprocess.Popen([sys.executable, "-c", OWNER, dsn], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"

        async def main():
            # Staged while the child owns the session without applying anything, then the child
            # is killed: the next owner (after the lease lapses) applies it and answers.
            pending_op = asyncio.create_task(asyncio.to_thread(web.remove, "s", m.id, timeout=DEADLINE))
            await until(lambda: web.sessions("s")[0]["staged"] == 2, "the operation to be staged")
            os.kill(child.pid, signal.SIGKILL)
            child.wait(timeout=DEADLINE)
            log = None
            while log is None:
                try:
                    log = PostgresStore(dsn).open("s")
                except Exception:  # still held until the dead owner's lease lapses
                    await asyncio.sleep(0.1)
            loop = AgentLoop(GatedModel(), log=log)
            out = await asyncio.wait_for(pending_op, DEADLINE)
            assert out["applied"] is True and out["message_id"] == m.id, out
            assert loop.inbox.get(m.id) is None
            await loop.aclose()
            log.close()

        run(main())
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
