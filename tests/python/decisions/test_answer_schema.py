"""An answer is checked against the schema its request asked for (docs/decisions.md,
"Deciding"): ``loop.decide``, ``FileStore.decide`` and ``PostgresStore.decide`` (applied by the
owner) refuse a value the schema does not accept, naming the problem, and append nothing; a
value it accepts is the call's result. (The HTTP route: tests/python/web/test_web_answers.py.)"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Dict, List

import pytest

from conftest import fresh_schema_dsn, needs_postgres
from kerman import AgentLoop, Answer, Ask, DecisionError, FileStore, ModelReply, PostgresStore
from kerman.decisions import check_answer

SCHEMA: Dict[str, Any] = {
    "type": "object",
    "properties": {"colour": {"enum": ["red", "blue"]}, "count": {"type": "integer", "minimum": 1}},
    "required": ["colour"],
    "additionalProperties": False,
}


def build(log: Any = None, schema: Any = SCHEMA) -> AgentLoop:
    async def model(request: Any) -> Any:
        if request.step == 1:
            return ModelReply([{"type": "tool-call", "id": "c1", "name": "choose", "arguments": "{}"}])
        return ModelReply("done")

    loop = AgentLoop(model, log=log)

    @loop.tool
    async def choose() -> str:
        """Asks the user to choose."""
        raise AssertionError("an answered call does not run")

    @loop.before_tool
    async def gate(call: Any, next: Any) -> Any:
        return Ask(note="which colour?", schema=schema)

    return loop


def resolved(log: Any) -> List[Dict[str, Any]]:
    return [e.data for e in log.events() if e.type == "decision/resolved"]


def result_text(log: Any) -> str:
    [result] = [e.data for e in log.events() if e.type == "tool/result"]
    text: str = result["message"]["content"][0]["content"][0]["text"]
    return text


def test_check_answer_names_the_problem_and_where() -> None:
    check_answer("d1", SCHEMA, {"colour": "red", "count": 2})
    with pytest.raises(DecisionError) as bad:
        check_answer("d1", SCHEMA, {"colour": "green"})
    assert bad.value.reason == "invalid"
    assert "'green' is not one of ['red', 'blue']" in str(bad.value) and "$.colour" in str(bad.value), bad.value
    assert "'d1'" in str(bad.value)
    with pytest.raises(DecisionError, match=r"'count' is a required property|0 is less than the minimum of 1"):
        check_answer("d1", {"required": ["count"], "properties": {"count": {"minimum": 1}}}, {"count": 0})
    with pytest.raises(DecisionError, match="not valid JSON Schema"):
        check_answer("d1", {"type": "no-such-type"}, 1)
    # A schema that accepts anything (an empty one) takes any JSON value.
    for value in (None, 1, "x", [1, {"a": None}]):
        check_answer("d1", {}, value)


def test_loop_decide_refuses_an_answer_that_does_not_match_and_accepts_one_that_does() -> None:
    async def main() -> None:
        loop = build()
        loop.followup("go")
        await loop.when_idle()
        [request] = loop.decisions
        for bad, problem in (
            ({"colour": "green"}, "is not one of"),
            ({"count": 2}, "'colour' is a required property"),
            ({"colour": "red", "extra": 1}, "Additional properties are not allowed"),
            ("red", "is not of type 'object'"),
        ):
            with pytest.raises(DecisionError) as refused:
                loop.decide(request.decision_id, Answer(bad))
            assert refused.value.reason == "invalid" and problem in str(refused.value), refused.value
        assert resolved(loop.log) == [] and loop.status == "waiting"
        assert loop.decide(request.decision_id, Answer({"colour": "blue", "count": 3}))
        await loop.when_idle()
        assert loop.status == "idle"
        assert result_text(loop.log) == '{"colour":"blue","count":3}'
        # Refusals of another kind still name their own reason, not the schema.
        with pytest.raises(DecisionError) as late:
            loop.decide(request.decision_id, Answer({"colour": "green"}))
        assert late.value.reason == "resolved"

    asyncio.run(main())


def test_an_empty_schema_accepts_any_answer() -> None:
    async def main() -> None:
        loop = build(schema={})
        loop.followup("go")
        await loop.when_idle()
        loop.decide(loop.decisions[0].decision_id, Answer([1, "two", None]))
        await loop.when_idle()
        assert result_text(loop.log) == '[1,"two",null]'

    asyncio.run(main())


def test_file_store_decide_refuses_an_answer_that_does_not_match(tmp_path: Path) -> None:
    store = FileStore(tmp_path, durability="none")

    async def ask() -> str:
        log = store.create("s")
        loop = build(log)
        loop.followup("go")
        await loop.when_idle()
        decision_id = loop.decisions[0].decision_id
        await loop.aclose()
        log.close()
        return decision_id

    decision_id = asyncio.run(ask())
    refused = store.decide("s", decision_id, Answer({"colour": "green"}), key="k1")
    assert (refused["applied"], refused["reason"]) == (False, "invalid"), refused
    assert "is not one of" in refused["detail"] and "$.colour" in refused["detail"], refused
    applied = store.decide("s", decision_id, Answer({"colour": "red"}), key="k2")
    assert applied == {"applied": True, "op": "decide", "decision_id": decision_id, "duplicate": False}, applied
    log = store.follow("s")
    try:
        [only] = resolved(log)
        assert (only["outcome"], only["value"], only["key"]) == ("answered", {"colour": "red"}, "k2")
    finally:
        log.close()


@needs_postgres
def test_postgres_store_decide_is_refused_by_the_owner_naming_the_problem() -> None:
    dsn = fresh_schema_dsn()

    async def main() -> None:
        log = PostgresStore(dsn).create("s")
        loop = build(log)
        loop.followup("go")
        await asyncio.wait_for(loop.when_idle(), 30)
        [request] = loop.decisions
        elsewhere = PostgresStore(dsn)
        refused = await asyncio.to_thread(elsewhere.decide, "s", request.decision_id, Answer({"colour": 7}), timeout=20.0)
        assert (refused["applied"], refused["reason"]) == (False, "invalid"), refused
        assert "7 is not one of" in refused["detail"], refused
        assert resolved(log) == [] and loop.status == "waiting"
        applied = await asyncio.to_thread(elsewhere.decide, "s", request.decision_id, Answer({"colour": "red"}), timeout=20.0)
        assert applied["applied"] is True, applied
        await asyncio.wait_for(loop.when_idle(), 30)
        if loop.status != "idle":
            await asyncio.wait_for(loop.when_idle(), 30)
        assert result_text(log) == '{"colour":"red"}'
        await loop.aclose()
        log.close()

    asyncio.run(main())
