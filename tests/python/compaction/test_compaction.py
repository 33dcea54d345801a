"""Compaction (docs/context.md, "Compaction"): what the model receives after a compaction, over
recorded sessions, request by request; pins, the current batch and tool pairs preserved; a
failed or vetoed compaction appends nothing; reverts and re-runs; the triggers.

Every test drives its own event loop with ``asyncio.run``; the models are ``ScriptedModel``s,
which record each request they get.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, List

import pytest

import kerman
from kerman import AgentLoop, ModelError, ModelReply
from kerman.compaction import Compaction, Compactor, DropToolResults, Revert, SlidingWindow, Summarize, Veto
from kerman.errors import ContextLengthError
from kerman.events import ContextCompacted
from kerman.models import ScriptedModel


def texts(messages: List[Any]) -> List[str]:
    return [m.text if m.role != "user" or not isinstance(m, kerman.ToolResultMessage) else f"result:{m.text}" for m in messages]


def call(call_id: str, name: str = "lookup") -> ModelReply:
    return ModelReply([{"type": "tool-call", "id": call_id, "name": name, "arguments": json.dumps({"q": call_id})}])


async def session(turns: int, model: ScriptedModel, **kwargs: Any) -> AgentLoop:
    """A loop after ``turns`` turns "q<i>" -> "a<i>" (the model scripted with the replies)."""
    model.add(*[f"a{i}" for i in range(turns)])
    loop = AgentLoop(model, **kwargs)
    for i in range(turns):
        loop.followup(f"q{i}")
        await loop.when_idle()
    return loop


def compacted(loop: AgentLoop) -> List[ContextCompacted]:
    return list(loop.log.events(types="context/compacted", view=True))  # type: ignore[arg-type]


def test_a_sliding_window_leaves_the_last_messages_in_the_next_request() -> None:
    async def main() -> None:
        model = ScriptedModel()
        loop = await session(10, model)
        before = len(loop.log)
        record = await loop.compact(SlidingWindow(keep=2))
        assert isinstance(record, ContextCompacted) and record.seq == before
        assert (record.strategy, record.reason, record.messages, record.pinned) == ("sliding-window", "manual", [], [])
        # The span: every message but the last two (q9, a9), as seqs of the raw events.
        seqs = [e.seq for e in loop.log.events(types=("user/message", "assistant/message"))]
        assert (record.first, record.last) == (seqs[0], seqs[-3])
        model.add("a10")
        loop.followup("q10")
        await loop.when_idle()
        assert texts(model.requests[-1].messages) == ["q9", "a9", "q10"]
        # The raw events stay.
        assert len(list(loop.log.events(types="user/message"))) == 11
        await loop.aclose()

    asyncio.run(main())


def test_an_llm_summary_keeps_pins_verbatim_after_it_and_the_listener_edits_it() -> None:
    async def main() -> None:
        model = ScriptedModel()
        loop = await session(6, model)
        summarizer = ScriptedModel(["they talked about q0..q4"])
        seen: List[Compaction] = []

        @loop.before_compaction
        async def pin_and_edit(compaction: Compaction, next: Any) -> Any:
            compaction.pin(next_message(compaction, "q2"))
            done = await next()
            done.replacement = [kerman.UserMessage(done.replacement[0].text + " (edited)")]
            seen.append(done)
            return done

        record = await loop.compact(Summarize(summarizer, keep=2))
        assert record is not None and record.strategy == "summary" and record.model == "ScriptedModel"
        # The summary request: the span without the pinned message, no tools, the prompt.
        [asked] = summarizer.requests
        assert texts(asked.messages) == ["q0", "a0", "q1", "a1", "a2", "q3", "a3", "q4", "a4"]
        assert asked.tools == [] and "Summarise" in (asked.instructions or "")
        model.add("a6")
        loop.followup("q6")
        await loop.when_idle()
        summary, *rest = model.requests[-1].messages
        assert summary.text == "Summary of the earlier conversation:\nthey talked about q0..q4 (edited)"
        assert texts(rest) == ["q2", "q5", "a5", "q6"]
        assert record.pinned == [seen[0].spans[[m.text for m in seen[0].messages].index("q2")][0]]
        # The pin sticks: a later compaction of a wider span keeps it too.
        loop.remove_listener(pin_and_edit)
        await loop.compact(SlidingWindow(keep=1))
        model.add("a7")
        loop.followup("q7")
        await loop.when_idle()
        assert texts(model.requests[-1].messages) == ["q2", "a6", "q7"]
        await loop.aclose()

    asyncio.run(main())


def next_message(compaction: Compaction, text: str) -> kerman.Message:
    return next(m for m in compaction.messages if m.text == text)


def test_a_tool_call_and_its_results_are_compacted_together() -> None:
    async def main() -> None:
        model = ScriptedModel([call("c1"), "done"])
        loop = AgentLoop(model)
        loop.tool(lookup)
        loop.followup("look")
        await loop.when_idle()
        # History: look, call(c1), result(c1), done. keep=2 would split the pair: the span stops
        # before the call.
        record = await loop.compact(SlidingWindow(keep=2))
        assert record is not None
        model.add("ok")
        loop.followup("again")
        await loop.when_idle()
        # An explicit span that would split the pair is refused, appending nothing.
        seqs = [e.seq for e in loop.log.events(types=("user/message", "assistant/message", "tool/result"))]
        length = len(loop.log)
        with pytest.raises(ValueError, match="separates a tool call from its results"):
            await loop.compact(SlidingWindow(), first=seqs[0], last=seqs[1])
        assert len(loop.log) == length
        roles = [(m.role, type(m).__name__) for m in model.requests[-1].messages]
        assert roles == [
            ("assistant", "AssistantMessage"),
            ("user", "ToolResultMessage"),
            ("assistant", "AssistantMessage"),
            ("user", "UserMessage"),
        ]
        # Dropping tool results keeps the pair and its place, with the result's text replaced.
        record = await loop.compact(DropToolResults(keep=2))
        model.add("fine")
        loop.followup("more")
        await loop.when_idle()
        result = next(m for m in model.requests[-1].messages if isinstance(m, kerman.ToolResultMessage))
        assert result.text == "[tool result dropped by compaction]" and result.call_id == "c1"
        await loop.aclose()

    asyncio.run(main())


async def lookup(q: str) -> str:
    return f"found {q}"


def test_the_current_batch_is_never_compacted_by_the_threshold_trigger() -> None:
    async def main() -> None:
        model = ScriptedModel([ModelReply("a0", usage={"input": 70, "output": 20})])
        loop = AgentLoop(model, compaction=Compactor(SlidingWindow(keep=0), context_window=100, threshold=0.8))
        loop.followup("q0")
        await loop.when_idle()
        assert compacted(loop) == []  # no usage logged before the first request
        model.add(ModelReply("a1", usage={"input": 10, "output": 5}))
        loop.followup("q1")
        await loop.when_idle()
        # 90 >= 0.8 * 100: compacted before the request, keeping the step's batch (q1).
        [record] = compacted(loop)
        assert record.reason == "threshold" and texts(model.requests[-1].messages) == ["q1"]
        # The usage since the compaction (15) is under the threshold: no second compaction.
        model.add("a2")
        loop.followup("q2")
        await loop.when_idle()
        assert len(compacted(loop)) == 1 and texts(model.requests[-1].messages) == ["q1", "a1", "q2"]
        await loop.aclose()

    asyncio.run(main())


def test_a_failed_or_vetoed_compaction_changes_nothing() -> None:
    async def main() -> None:
        model = ScriptedModel()
        loop = await session(4, model)
        history = [m.text for m in loop.history]
        length = len(loop.log)
        with pytest.raises(ModelError, match="summary down"):
            await loop.compact(Summarize(ScriptedModel([ModelError("summary down")])))
        assert len(loop.log) == length and [m.text for m in loop.history] == history

        @loop.before_compaction
        async def veto(compaction: Compaction, next: Any) -> Veto:
            return Veto("not now")

        assert await loop.compact(SlidingWindow(keep=0)) is None
        assert len(loop.log) == length and compacted(loop) == []
        loop.remove_listener(veto)
        # A span that does not exist is refused naming it.
        with pytest.raises(ValueError, match="the span 3..999"):
            await loop.compact(SlidingWindow(), first=3, last=999)
        assert len(loop.log) == length
        await loop.aclose()

    asyncio.run(main())


def test_a_compaction_is_reversible_and_re_runs_with_another_strategy() -> None:
    async def main() -> None:
        store = kerman.MemoryStore()
        log = store.create("s")
        model = ScriptedModel()
        loop = await session(5, model, log=log)
        original = [m.to_dict() for m in loop.history]
        first = await loop.compact(Summarize(ScriptedModel(["S1"]), keep=2))
        assert first is not None
        # Re-run over the same span with another strategy: it supersedes the first.
        second = await loop.compact(SlidingWindow(), first=first.first, last=first.last)
        assert second is not None and [m.text for m in loop.history] == ["q4", "a4"]
        # Revert: the raw messages come back, exactly.
        await loop.compact(Revert(), first=first.first, last=first.last)
        assert [m.to_dict() for m in loop.history] == original
        # A session reopened folds the same history from the log.
        await loop.compact(SlidingWindow(keep=2))
        now = [m.to_dict() for m in loop.history]
        await loop.aclose()
        log.close()
        with store.open("s") as again:
            reopened = AgentLoop(ScriptedModel(["x"]), again)
            assert [m.to_dict() for m in reopened.history] == now
            await reopened.aclose()

    asyncio.run(main())


def test_a_context_length_error_compacts_and_retries_once() -> None:
    async def main() -> None:
        model = ScriptedModel()
        loop = await session(3, model, compaction=Compactor(SlidingWindow(keep=0)))
        model.add(ContextLengthError("too long"), "fits now")
        loop.followup("q3")
        await loop.when_idle()
        [record] = compacted(loop)
        assert record.reason == "context-length"
        assert texts(model.requests[-1].messages) == ["q3"]
        assert [e.data for e in loop.log.events(types="turn/end")][-1]["reason"] == {"kind": "completed"}
        # A second overflow in the same step is not retried again: the turn fails.
        model.add(ContextLengthError("still"), ContextLengthError("still"))
        loop.followup("q4")
        await loop.when_idle()
        ends = [e.data for e in loop.log.events(types="turn/end")]
        assert ends[-1]["reason"]["kind"] == "error" and len(compacted(loop)) == 2
        await loop.aclose()

    asyncio.run(main())
