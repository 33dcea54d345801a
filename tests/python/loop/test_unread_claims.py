"""A prompt cancelled between its claim and its entry is never hidden: claimed input does not
come back by itself (SPEC D9), but the transcript lists it as read by no turn
(``Transcript.unread()``) until ``requeue_claimed`` sends it again."""

from __future__ import annotations

import asyncio
from typing import Any, List

import kerman
from kerman import AgentLoop
from kerman.models import EchoModel


def gated_loop(log: Any = None) -> tuple:
    """A loop whose pre_step listener waits (as an approval plugin would) until released."""
    loop = AgentLoop(EchoModel(), log=log)
    claimed = asyncio.Event()
    release = asyncio.Event()

    @loop.pre_step
    async def approval(step, next):
        if step.turn == 1:
            claimed.set()
            await release.wait()
        return await next()

    return loop, claimed, release


def texts(unread: List[dict]) -> List[str]:
    return [u["message"].text for u in unread]


def test_a_prompt_cancelled_before_it_was_read_is_in_the_transcript_until_resent():
    async def main() -> AgentLoop:
        loop, claimed, _ = gated_loop()
        loop.followup("deploy to staging")
        await asyncio.wait_for(claimed.wait(), 10)
        loop.cancel(keep_inbox=True)
        await loop.when_idle()

        # Not pending (the claim rule), not a message of the conversation, but not hidden.
        assert not loop.inbox.has_pending and [m.text for m in loop.transcript()] == []
        [unread] = loop.transcript().unread()
        assert unread["turn"] == 1 and unread["target"] == "next-turn"
        assert unread["message"].text == "deploy to staging"
        assert unread["ending"] == {"kind": "aborted", "reason": {"kind": "user"}}
        assert unread["seq"] < loop.transcript().endings[0]["seq"]

        # One call sends it again; from then on it is no longer unread, and it runs.
        [requeued] = loop.requeue_claimed(1)
        assert requeued.id == unread["message"].id
        assert loop.transcript().unread() == []
        assert loop.wake()
        await loop.when_idle()
        assert [m.text for m in loop.transcript()] == ["deploy to staging", "deploy to staging"]
        assert loop.transcript().unread() == []
        return loop

    asyncio.run(main())


def test_unread_input_survives_a_reopen(tmp_path):
    store = kerman.FileStore(tmp_path)

    async def main() -> None:
        log = store.create("s")
        loop, claimed, _ = gated_loop(log)
        loop.followup("first")
        loop.followup("second")  # still queued: not claimed, so not unread
        await asyncio.wait_for(claimed.wait(), 10)
        loop.steer("a steer")
        loop.cancel(keep_inbox=True)
        await loop.when_idle()
        await loop.aclose()
        await log.aclose()

    asyncio.run(main())
    with store.open("s") as log:
        unread = log.transcript().unread()
        assert texts(unread) == ["first"]
        assert [m.text for m in log.transcript()] == []


def test_a_rejected_batch_is_listed_with_its_blocked_ending():
    async def main() -> None:
        loop = AgentLoop(EchoModel())

        @loop.pre_step
        async def refuse(step, next):
            return kerman.Reject("not now")

        loop.followup("hello")
        await loop.when_idle()
        [unread] = loop.transcript().unread()
        assert unread["message"].text == "hello" and unread["ending"]["kind"] == "blocked"

    asyncio.run(main())


def test_a_batch_the_pre_step_decision_rewrote_was_read():
    async def main() -> None:
        loop = AgentLoop(EchoModel())

        @loop.pre_step
        async def rewrite(step, next):
            return kerman.Enter([kerman.UserMessage(" / ".join(m.text for m in step.messages).upper())])

        loop.followup("hello")
        await loop.when_idle()
        assert [m.text for m in loop.transcript()] == ["HELLO", "HELLO"]
        assert loop.transcript().unread() == []

    asyncio.run(main())


def test_steering_claimed_at_a_later_step_and_cancelled_before_it_was_read():
    async def model(request):
        if request.step == 1:
            return kerman.ModelReply([{"type": "tool-call", "id": "c1", "name": "ask", "arguments": "{}"}])
        return kerman.ModelReply("done")

    async def main() -> None:
        loop = AgentLoop(model)
        claimed = asyncio.Event()

        @loop.pre_step
        async def gate(step, next):
            if step.step == 2:
                claimed.set()
                await asyncio.Event().wait()  # until cancelled
            return await next()

        @loop.tool
        async def ask(args, ctx):
            loop.steer("use the blue one")
            return "asked"

        loop.followup("paint it")
        await asyncio.wait_for(claimed.wait(), 10)
        loop.cancel(keep_inbox=True)
        await loop.when_idle()
        [unread] = loop.transcript().unread()
        assert unread["message"].text == "use the blue one" and unread["target"] == "next-step"
        assert unread["ending"]["kind"] == "aborted"
        assert [m.text for m in loop.requeue_claimed(1)] == ["use the blue one"]

    asyncio.run(main())
