"""Instructions (the system prompt): `AgentLoop(instructions=)`, `loop.instructions`,
`request.instructions`, and what the log records of them (`agent/instructions`, the
`instructions` key of `request/header`).

An extension of SPEC 4.7, which issue 14 asks for: `agent/instructions` joins the loop-owned
types that `log.append` refuses, and `request/header` is also logged when the request's
instructions differ from the last header's (it carries them as `instructions`). A loop without
instructions logs exactly what SPEC 4.7 says."""

from __future__ import annotations

import asyncio
from typing import Any, List, Optional

import pytest

import kerman
from kerman import AgentLoop, ModelReply
from loop.loop_helpers import of_type, turn_ends


class Recorder:
    """A model that records the instructions of every request."""

    def __init__(self) -> None:
        self.seen: List[Optional[str]] = []

    async def __call__(self, request: kerman.ModelRequest) -> ModelReply:
        self.seen.append(request.instructions)
        return ModelReply("ok")


def recorded(log) -> List[Any]:
    return [(e.type, e.data.get("instructions", "<absent>")) for e in log if e.type in ("agent/instructions", "request/header")]


async def turns(loop: AgentLoop, *prompts: str) -> None:
    for prompt in prompts:
        loop.followup(prompt)
        await loop.when_idle()


def test_requests_carry_the_instructions_and_the_log_records_them_once():
    model = Recorder()

    async def main() -> AgentLoop:
        loop = AgentLoop(model, instructions="Be brief.")
        await turns(loop, "a", "b")
        return loop

    loop = asyncio.run(main())
    assert model.seen == ["Be brief.", "Be brief."]
    # Configured once, and the header of the loop's first request; unchanged after that.
    assert recorded(loop.log) == [("agent/instructions", "Be brief."), ("request/header", "Be brief.")]
    assert loop.instructions == "Be brief."
    # agent/instructions comes right before the header it applies to.
    types = [e.type for e in loop.log]
    assert types.index("agent/instructions") + 1 == types.index("request/header")


def test_without_instructions_nothing_is_recorded_and_the_header_has_no_key():
    model = Recorder()

    async def main() -> AgentLoop:
        loop = AgentLoop(model)
        await turns(loop, "a")
        return loop

    loop = asyncio.run(main())
    assert model.seen == [None]
    assert recorded(loop.log) == [("request/header", "<absent>")]
    assert of_type(loop.log, "request/header")[0].data == {"options": {}}


def test_changing_them_records_the_new_ones_before_the_next_request():
    model = Recorder()

    async def main() -> AgentLoop:
        loop = AgentLoop(model, instructions="one")
        await turns(loop, "a")
        loop.instructions = "two"
        await turns(loop, "b")
        loop.instructions = None
        await turns(loop, "c")
        return loop

    loop = asyncio.run(main())
    assert model.seen == ["one", "two", None]
    assert recorded(loop.log) == [
        ("agent/instructions", "one"),
        ("request/header", "one"),
        ("agent/instructions", "two"),
        ("request/header", "two"),
        ("agent/instructions", None),
        ("request/header", "<absent>"),
    ]


def test_a_before_request_listener_changes_one_request_and_the_header_says_so():
    model = Recorder()

    async def main() -> AgentLoop:
        loop = AgentLoop(model, instructions="base")

        @loop.before_request
        async def dated(request, next):
            request.instructions = f"{request.instructions} (turn {request.turn})"
            return await next()

        await turns(loop, "a", "b")
        return loop

    loop = asyncio.run(main())
    # Each request starts from the configured instructions: the listener's change does not
    # accumulate, and only the configured ones are recorded as the loop's.
    assert model.seen == ["base (turn 1)", "base (turn 2)"]
    assert loop.instructions == "base"
    assert recorded(loop.log) == [
        ("agent/instructions", "base"),
        ("request/header", "base (turn 1)"),
        ("request/header", "base (turn 2)"),
    ]


def test_a_resumed_loop_sends_the_recorded_instructions(file_store):
    first, second, third = Recorder(), Recorder(), Recorder()

    async def run(model: Recorder, **kwargs: Any) -> AgentLoop:
        loop = AgentLoop(model, log=file_store.open("s") if file_store.exists("s") else file_store.create("s"), **kwargs)
        await turns(loop, "x")
        await loop.aclose()
        loop.log.close()
        return loop

    asyncio.run(run(first, instructions="Use metric units."))
    resumed = asyncio.run(run(second))
    assert second.seen == ["Use metric units."]
    assert resumed.instructions == "Use metric units."
    # Resuming records nothing new; the new loop's first request logs its header again.
    assert recorded(resumed.log)[-2:] == [("request/header", "Use metric units."), ("request/header", "Use metric units.")]
    assert [t for t, _ in recorded(resumed.log)].count("agent/instructions") == 1
    # instructions=None clears them, and that is recorded.
    cleared = asyncio.run(run(third, instructions=None))
    assert third.seen == [None]
    assert recorded(cleared.log)[-2:] == [("agent/instructions", None), ("request/header", "<absent>")]


@pytest.mark.parametrize("bad", [5, b"bytes", ["a"]], ids=["int", "bytes", "list"])
def test_instructions_that_are_not_a_str_are_refused(bad):
    async def model(request):
        return ModelReply("ok")

    with pytest.raises(TypeError, match=f"instructions must be a str or None, got {type(bad).__name__}"):
        AgentLoop(model, instructions=bad)
    loop = AgentLoop(model)
    with pytest.raises(TypeError, match="instructions must be a str or None"):
        loop.instructions = bad
    assert loop.instructions is None


def test_a_listener_setting_bad_instructions_fails_the_turn_invalid_request():
    model = Recorder()

    async def main() -> AgentLoop:
        loop = AgentLoop(model, instructions="fine")

        @loop.before_request
        async def broken(request, next):
            request.instructions = 42
            return await next()

        await turns(loop, "a")
        return loop

    loop = asyncio.run(main())
    assert model.seen == []
    (end,) = turn_ends(loop.log)
    assert end["kind"] == "error"
    assert end["error"]["code"] == "INVALID_REQUEST"
    assert end["error"]["message"] == "request.instructions must be a str or None, got int"


def test_agent_instructions_cannot_be_appended_by_hand():
    log = kerman.MemoryStore().create()
    with pytest.raises(ValueError, match="agent/instructions"):
        log.append("agent/instructions", {"instructions": "forged"})
