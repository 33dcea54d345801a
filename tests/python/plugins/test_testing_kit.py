"""``kerman.testing``: pre-step listeners run without a model, fakes for ``next``, insert
transforms in a real inbox, whole scripted turns, and the pytest plugin in a real pytest run."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, List

import pytest

import kerman
from kerman import testing


async def guard(step: kerman.PreStep, next: kerman.Next[kerman.Decision]) -> kerman.Decision:
    if any("rm -rf" in m.text for m in step.messages):
        return kerman.Reject("destructive")
    return await next()


async def shout(step: kerman.PreStep, next: kerman.Next[kerman.Decision]) -> kerman.Decision:
    decision = await next()
    if isinstance(decision, kerman.Enter):
        return kerman.Enter([m.with_content(m.text.upper()) for m in decision.messages])
    return decision


def test_one_listener_gets_the_batch_and_the_default_enters_it() -> None:
    decision = testing.decide(guard, ["hello", kerman.UserMessage("there", id="u2")])
    assert isinstance(decision, kerman.Enter)
    assert [m.text for m in decision.messages] == ["hello", "there"]
    assert all(isinstance(m, kerman.UserMessage) for m in decision.messages)
    assert decision.messages[1].id == "u2"
    rejected = testing.decide(guard, ["rm -rf /"])
    assert isinstance(rejected, kerman.Reject) and rejected.reason == "destructive"


def test_a_chain_runs_in_order_and_a_veto_skips_the_rest() -> None:
    decision = testing.decide([shout, guard], ["hi"])
    assert [m.text for m in decision.messages] == ["HI"]  # type: ignore[union-attr]
    assert isinstance(testing.decide([shout, guard], ["rm -rf /"]), kerman.Reject)


def test_the_waterfall_is_the_loops_next_called_twice_pulls_the_next_listener() -> None:
    calls: List[str] = []

    async def twice(step: kerman.PreStep, next: kerman.Next[kerman.Decision]) -> kerman.Decision:
        await next()
        return await next()

    async def second(step: kerman.PreStep, next: kerman.Next[kerman.Decision]) -> kerman.Decision:
        calls.append("second")
        return kerman.Reject("from second")

    decision = testing.decide([twice, second], ["x"])
    assert calls == ["second"]
    assert isinstance(decision, kerman.Enter)  # the second next() was the default


def test_the_listeners_of_a_loop_and_a_mutated_batch() -> None:
    loop = kerman.AgentLoop(kerman.models.EchoModel())

    @loop.pre_step
    async def drop_notes(step: kerman.PreStep, next: kerman.Next[kerman.Decision]) -> kerman.Decision:
        step.messages[:] = [m for m in step.messages if m.source.get("plugin") != "noise"]
        step.loop.inject("seen")
        return await next()

    batch = [kerman.UserMessage("keep"), kerman.UserMessage("noise", source={"kind": "plugin", "plugin": "noise"})]
    decision = asyncio.run(testing.run_pre_step(loop, batch, turn=3, step=2))
    assert [m.text for m in decision.messages] == ["keep"]  # type: ignore[union-attr]
    assert [m.text for m in loop.inbox.next_step] == ["seen"]  # step.loop was the loop given


def test_results_the_loop_would_refuse_raise_its_message() -> None:
    async def bad(step: kerman.PreStep, next: kerman.Next[kerman.Decision]) -> Any:
        return "enter please"

    with pytest.raises(TypeError, match=r"pre-step listener returned 'enter please'; expected Enter or Reject"):
        testing.decide(bad, ["x"])
    for value in ({"kind": "enter", "messages": ["a"]}, {"kind": "reject", "reason": "r"}):

        async def returns(step: kerman.PreStep, next: kerman.Next[kerman.Decision], value: Any = value) -> Any:
            return value

        assert testing.decide(returns, ["x"]).kind == value["kind"]
    with pytest.raises(TypeError, match="not a str"):
        testing.make_pre_step("text")


def test_a_listener_exception_propagates_and_the_payload_is_the_loops() -> None:
    async def boom(step: kerman.PreStep, next: kerman.Next[kerman.Decision]) -> kerman.Decision:
        raise LookupError("no policy")

    with pytest.raises(LookupError, match="no policy"):
        testing.decide(boom, ["x"])
    step = testing.make_pre_step(["a"], turn=4, step=5)
    assert (step.turn, step.step, step.signal.aborted, step.loop.status) == (4, 5, False, "idle")


def test_fake_next_returns_calls_or_raises_and_counts() -> None:
    step = testing.make_pre_step(["a", "b"])
    fake = testing.FakeNext.entering(step)
    decision = asyncio.run(shout(step, fake))
    assert [m.text for m in decision.messages] == ["A", "B"] and fake.calls == 1  # type: ignore[union-attr]
    assert asyncio.run(guard(testing.make_pre_step(["rm -rf /"]), fake)).kind == "reject" and fake.calls == 1
    failing: testing.FakeNext[kerman.Decision] = testing.FakeNext(RuntimeError("downstream"))
    with pytest.raises(RuntimeError, match="downstream"):
        asyncio.run(shout(step, failing))
    reject = kerman.Reject("fixed")
    fixed = testing.FakeNext(reject)
    assert asyncio.run(shout(step, fixed)) is reject and fixed.calls == 1


def test_run_insert_uses_a_real_inbox() -> None:
    def redact(message: kerman.UserMessage, target: str) -> Any:
        if target == "next-step" and "secret" in message.text:
            return kerman.Refuse("no secrets in context")
        return message.with_content(message.text.replace("secret", "***"))

    assert testing.run_insert(redact, "my secret").text == "my ***"
    with pytest.raises(kerman.InsertRefusedError, match="no secrets in context"):
        testing.run_insert([redact], "secret", target="next-step")
    loop = kerman.AgentLoop(kerman.models.EchoModel())
    loop.on_insert(redact)
    assert testing.run_insert(loop, "secret").text == "***"


def test_run_turn_collects_the_turns_events() -> None:
    async def main() -> None:
        loop = testing.scripted_loop(plugins=[lambda loop: loop.pre_step(guard), lambda loop: loop.pre_step(shout)])
        first = await testing.run_turn(loop, "hello", replies=["hi there"])
        first.assert_completed()
        first.assert_entered("HELLO")
        first.assert_types("turn/start", "user/message", "assistant/message", "turn/end")
        assert [m.text for m in first.replies] == ["hi there"]
        assert [r.entered[0].text for r in first.requests] == ["HELLO"]
        blocked = await testing.run_turn(loop, "rm -rf /")
        blocked.assert_blocked("destructive")
        assert blocked.requests == [] and blocked.entered == [] and blocked.events[0].seq == first.events[-1].seq + 1
        failed = await testing.run_turn(loop, "no reply scripted")
        assert failed.assert_error("UNKNOWN")["message"] == "script exhausted"
        await loop.aclose()

    asyncio.run(main())


def test_turn_assertions_say_what_happened() -> None:
    async def main() -> testing.TurnResult:
        loop = testing.scripted_loop(["ok"])
        result = await testing.run_turn(loop, "hi")
        await loop.aclose()
        return result

    result = asyncio.run(main())
    with pytest.raises(AssertionError, match=r"the turn ended \{'kind': 'completed'\}, expected \{'kind': 'blocked'\}"):
        result.assert_blocked()
    with pytest.raises(AssertionError, match=r"entered \['hi'\], expected \['bye'\]"):
        result.assert_entered("bye")
    with pytest.raises(AssertionError, match=r"'tool/call' is missing .* Events: \['agent/inbox/spliced', 'turn/start'"):
        result.assert_types("turn/start", "tool/call")
    with pytest.raises(AssertionError, match="expected an error"):
        result.assert_error()
    with pytest.raises(TypeError, match="replies= needs a loop over a ScriptedModel"):
        asyncio.run(testing.run_turn(kerman.AgentLoop(kerman.models.EchoModel()), "x", replies=["y"]))


def test_kerman_testing_imports_without_pytest() -> None:
    code = "import sys; sys.modules['pytest'] = None; import kerman.testing; print(sorted(kerman.testing.__all__))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "run_pre_step" in done.stdout
    code = "import sys; sys.modules['pytest'] = None; import kerman.testing.pytest_plugin"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode != 0 and "pytest" in done.stderr  # the plugin module alone needs pytest


def test_the_pytest_plugin_in_a_real_pytest_run(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["kerman.testing.pytest_plugin"]\n')
    (tmp_path / "test_plugin.py").write_text(
        textwrap.dedent("""
        import asyncio
        import kerman
        from kerman import testing

        def test_fixtures(kerman_loop, kerman_model, kerman_log, kerman_store):
            assert kerman_loop.log is kerman_log and kerman_log.id in kerman_store.list()

            @kerman_loop.pre_step
            async def tag(step, next):
                return kerman.Enter([m.with_content("tagged " + m.text) for m in step.messages])

            result = asyncio.run(testing.run_turn(kerman_loop, "hi", replies=["ok"]))
            result.assert_entered("tagged hi")
            assert kerman_model.requests[0].entered[0].text == "tagged hi"

        def test_each_test_gets_a_fresh_log(kerman_loop, kerman_log):
            assert len(kerman_log) == 0 and kerman_loop.turn == 0
    """)
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout


def test_turn_result_reads_the_ending_and_the_messages() -> None:
    async def main() -> testing.TurnResult:
        loop = testing.scripted_loop(["hi there"])
        result = await testing.run_turn(loop, "hello")
        await loop.aclose()
        return result

    result = asyncio.run(main())
    assert result.ending == {"kind": "completed"} and result.kind == "completed"
    assert [(type(m).__name__, m.text) for m in result.entered] == [("UserMessage", "hello")]
    assert [(type(m).__name__, m.text) for m in result.replies] == [("AssistantMessage", "hi there")]
    nothing = testing.TurnResult(result.loop, [e for e in result.events if e.type != "turn/end"], [])
    with pytest.raises(
        AssertionError,
        match=r"^no turn ended in this run; events: \['agent/inbox/spliced', "
        r"'turn/start', .*'assistant/message', 'step/end'\]$",
    ):
        assert nothing.ending is None  # raises before
