"""A task that asks for input while it runs (the tasks extension's ``input_required`` status,
``docs/mcp.md#input-inside-a-task``), against ``mcp_task_server.py``'s ``ask`` tool (the ``mcp``
package's server side, over stdio, and streamable HTTP once; the task's body runs in a
detached worker process, so it outlives the client). ``tasks/get`` shows the task's ``inputRequests``; with
``durable_input=True`` they become a ``decision/requested`` of kind ``input`` naming the task,
and the answer goes to the same task with ``tasks/update``, in this process or in one that
took the session up after the client was killed; a denial cancels the task. Without
``durable_input``, ``on_elicit`` answers in the process."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

pytest.importorskip("mcp")
pytest.importorskip("jsonschema")

from task_helpers import (  # noqa: E402, F401 (task_url, tasks: fixtures)
    endings,
    events_of,
    idle_events,
    killed,
    lines,
    logged_task,
    model,
    one_turn,
    server,
    take_up,
    task_url,
    tasks,
    the_result,
)

import kerman  # noqa: E402
from kerman import Answer, Deny, FileStore  # noqa: E402
from kerman.mcp import Elicitation  # noqa: E402

CHILD = str(Path(__file__).with_name("task_input_child.py"))

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL, detached workers")


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_in_one_process_the_task_s_request_is_a_decision_and_the_answer_goes_to_the_same_task(
    transport: str,
    tasks: Path,  # noqa: F811 - the fixture
    request: Any,
) -> None:
    (tasks / "gate").touch()
    url = request.getfixturevalue("task_url") if transport == "http" else None

    async def main() -> List[Any]:
        loop = kerman.AgentLoop(model("ask"), tools=[server(str(tasks), url, durable_input=True)])
        loop.followup("go")
        await loop.when_idle()
        assert loop.status == "waiting"
        [pending] = loop.decisions
        assert pending.kind == "input" and pending.note == "Go ahead with a?"
        assert pending.schema is not None and pending.schema["properties"]["ok"]["type"] == "boolean"
        [request] = [e.data for e in loop.log.events() if e.type == "decision/requested"]
        assert request["payload"]["task"] == logged_task(list(loop.log.events()))
        assert lines(tasks, "updates") == []
        loop.decide(pending.decision_id, Answer({"ok": True}))
        return await idle_events(loop)

    events = asyncio.run(main())
    assert the_result(events) == "ask a: yes"
    assert lines(tasks, "runs") == ["a"]  # one task, answered: the call was not made again
    assert lines(tasks, "updates") == ["confirm-1"]
    assert endings(events) == ["completed"]


def test_a_task_that_asks_twice_is_two_decisions_one_after_the_other(tasks: Path) -> None:  # noqa: F811 - the fixture
    (tasks / "gate").touch()

    async def main() -> List[Any]:
        loop = kerman.AgentLoop(model("ask", '{"x": "b", "rounds": 2}'), tools=[server(str(tasks), durable_input=True)])
        loop.followup("go")
        for ok in (True, False):
            await loop.when_idle()
            [pending] = loop.decisions
            loop.decide(pending.decision_id, Answer({"ok": ok}))
        return await idle_events(loop)

    events = asyncio.run(main())
    assert the_result(events) == "ask b: yes no"
    tasks_of = {e.data["payload"]["task"] for e in events if e.type == "decision/requested"}
    assert tasks_of == {logged_task(events)}
    assert lines(tasks, "runs") == ["b"] and lines(tasks, "updates") == ["confirm-1", "confirm-2"]


@pytest.mark.parametrize("how", ["deny", "cancel"])
def test_a_denial_or_a_cancelled_turn_in_one_process_cancels_the_waiting_task(tasks: Path, how: str) -> None:  # noqa: F811 - the fixture
    (tasks / "gate").touch()

    async def main() -> List[Any]:
        loop = kerman.AgentLoop(model("ask"), tools=[server(str(tasks), durable_input=True)])
        loop.followup("go")
        await loop.when_idle()
        [pending] = loop.decisions
        if how == "deny":
            loop.decide(pending.decision_id, Deny("no"))
        else:
            loop.cancel()
        return await idle_events(loop)

    events = asyncio.run(main())
    task = logged_task(events)
    assert (tasks / f"cancel-{task}").exists()
    assert json.loads((tasks / f"task-{task}.json").read_text())["status"] == "cancelled"
    assert endings(events) == (["completed"] if how == "deny" else ["aborted"])
    assert lines(tasks, "updates") == []


def resumed(root: Path, folder: Path, answer: Optional[Any] = None) -> List[Any]:
    """Session ``s`` taken up in this process through a server with ``durable_input=True``
    keeping its tasks in ``folder``."""
    return take_up(root, model("ask"), server(str(folder), durable_input=True), answer)


def test_an_answer_from_another_process_reaches_the_task_after_the_client_was_killed(tmp_path: Path, tasks: Path) -> None:  # noqa: F811 - the fixture
    root = tmp_path / "store"
    (tasks / "gate").touch()
    seen = killed(CHILD, str(root), str(tasks), "asked")
    assert seen["status"] == "waiting" and len(seen["decisions"]) == 1
    before = events_of(root)
    [request] = [e.data for e in before if e.type == "decision/requested"]
    assert request["kind"] == "input" and request["payload"]["task"] == logged_task(before)
    assert json.loads((tasks / f"task-{logged_task(before)}.json").read_text())["status"] == "input_required"
    refused = FileStore(root).decide("s", seen["decisions"][0], Answer({"ok": "yes"}))
    assert refused["applied"] is False and refused["reason"] == "invalid"
    assert FileStore(root).decide("s", seen["decisions"][0], Answer({"ok": True}), by="ann")["applied"] is True

    events = resumed(root, tasks)
    assert the_result(events) == "ask a: yes"
    assert lines(tasks, "runs") == ["a"]  # the same task, answered: not a second one
    assert lines(tasks, "updates") == ["confirm-1"]
    assert endings(events) == ["completed"]


def test_a_denial_from_another_process_is_the_call_s_result_and_cancels_the_task(tmp_path: Path, tasks: Path) -> None:  # noqa: F811 - the fixture
    root = tmp_path / "store"
    (tasks / "gate").touch()
    seen = killed(CHILD, str(root), str(tasks), "asked")
    task = logged_task(events_of(root))
    assert FileStore(root).decide("s", seen["decisions"][0], Deny("not today"))["applied"] is True

    events = resumed(root, tasks)
    text = the_result(events)
    assert "denied" in text and "not today" in text
    assert (tasks / f"cancel-{task}").exists()  # tasks/cancel reached the server
    assert json.loads((tasks / f"task-{task}.json").read_text())["status"] == "cancelled"
    assert lines(tasks, "updates") == []
    assert endings(events) == ["completed"]


def test_a_task_that_asks_after_the_client_was_killed_asks_the_session_that_takes_it_up(tmp_path: Path, tasks: Path) -> None:  # noqa: F811 - the fixture
    root = tmp_path / "store"
    seen = killed(CHILD, str(root), str(tasks), "logged")  # no gate: the task has not asked yet
    assert [e.type for e in events_of(root) if e.type in ("tool/call", "tool/result", "decision/requested")] == ["tool/call"]
    (tasks / "gate").touch()

    events = resumed(root, tasks, Answer({"ok": False}))
    [request] = [e.data for e in events if e.type == "decision/requested"]
    assert request["kind"] == "input" and request["payload"]["task"] == seen["task"]
    assert the_result(events) == "ask a: no"
    assert lines(tasks, "runs") == ["a"] and lines(tasks, "updates") == ["confirm-1"]


@pytest.mark.parametrize("answer", [{"ok": True}, None])
def test_without_durable_input_on_elicit_answers_in_the_process(tasks: Path, answer: Optional[Dict[str, Any]]) -> None:  # noqa: F811 - the fixture
    (tasks / "gate").touch()
    asked: List[Elicitation] = []

    async def on_elicit(request: Elicitation) -> Optional[Dict[str, Any]]:
        asked.append(request)
        return answer

    events = one_turn(model("ask"), server(str(tasks), on_elicit=on_elicit))
    assert [(r.message, r.schema is not None) for r in asked] == [("Go ahead with a?", True)]
    assert the_result(events) == ("ask a: yes" if answer else "ask a: decline")
    assert not [e for e in events if e.type == "decision/requested"]
    assert lines(tasks, "updates") == ["confirm-1"]


@pytest.mark.parametrize("durable", [False, True])
def test_a_sampling_request_inside_a_task_is_answered_by_the_sampling_model_or_cancels_the_task(tasks: Path, durable: bool) -> None:  # noqa: F811 - the fixture
    (tasks / "gate").touch()
    asked: List[kerman.ModelRequest] = []

    async def sampler(request: kerman.ModelRequest) -> kerman.ModelReply:
        asked.append(request)
        return kerman.ModelReply("sure")

    mcp = server(str(tasks), sampling_model=sampler, durable_input=durable)
    events = one_turn(model("ask", '{"x": "a", "kind": "sampling"}'), mcp)
    task = logged_task(events)
    if durable:  # a person answers form elicitations only: the task is cancelled, and the model reads why
        assert "sampling/createMessage" in the_result(events) and "cancelled" in the_result(events)
        assert (tasks / f"cancel-{task}").exists() and asked == []
    else:
        assert the_result(events) == "ask a: sure"
        assert [r.messages[0].content[0]["text"] for r in asked] == ["Should a go ahead?"]
    assert not [e for e in events if e.type == "decision/requested"]
