"""Issue 11, item 2: a bug in user code never fails silently.

An exception from user code (the model, a tool, a pre-step listener) that ends or alters a turn
is reported three ways: on the ``kerman`` logger with its traceback, on the ``agent/error`` live
event (``.exception``, ``.traceback``, ``.function``), and durably in the log (the ``turn/end``
failure or the ``tool/result`` error carries the exception type, its traceback text and the
user function), so ``kerman log show`` explains a failed turn after the fact.
``loop.last_error`` is the last such report.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, List

import pytest

import kerman
from kerman import cli


def run_turn(loop: kerman.AgentLoop, prompt: str = "go") -> None:
    async def main() -> None:
        loop.followup(prompt)
        await loop.when_idle()

    asyncio.run(main())


def names(function: str, name: str) -> bool:
    """Whether ``function`` (a report's ``function``) names the local function ``name``: its
    qualified name on Python 3.11+, its bare name on 3.10 (no ``co_qualname``)."""
    return function == name or function.endswith(f".<locals>.{name}")


def kerman_errors(caplog: pytest.LogCaptureFixture) -> List[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "kerman" and r.levelno >= logging.ERROR]


async def typo_model(request: kerman.ModelRequest) -> kerman.ModelReply:
    return kerman.ModelReply(undefined_name)  # type: ignore[name-defined]  # noqa: F821


def test_a_failing_model_is_logged_with_its_traceback(caplog):
    loop = kerman.AgentLoop(typo_model)
    run_turn(loop)
    records = kerman_errors(caplog)
    assert len(records) == 1
    record = records[0]
    assert record.exc_info is not None and record.exc_info[0] is NameError
    assert "turn 1" in record.getMessage() and "typo_model" in record.getMessage()
    assert "undefined_name" in record.getMessage()


def test_a_failing_model_is_on_the_live_event_and_last_error():
    seen: List[Any] = []
    loop = kerman.AgentLoop(typo_model)
    loop.on("agent/error", seen.append)
    assert loop.last_error is None
    run_turn(loop)
    assert len(seen) == 1
    event = seen[0]
    assert isinstance(event.exception, NameError)
    assert event.function == "typo_model"
    assert "NameError: name 'undefined_name' is not defined" in event.traceback
    assert "in typo_model" in event.traceback
    assert loop.last_error is event


def test_a_failing_model_is_recorded_durably(tmp_path):
    store = kerman.FileStore(str(tmp_path))
    with store.create("s") as log:
        loop = kerman.AgentLoop(typo_model, log=log)
        run_turn(loop)
    with store.open("s") as log:
        end = list(log.events(types="turn/end"))[-1]
    error = end.data["reason"]["error"]
    assert end.data["reason"]["kind"] == "error"
    assert error["code"] == "UNKNOWN"
    assert error["message"] == "name 'undefined_name' is not defined"
    assert error["exceptionType"] == "NameError"
    assert error["function"] == "typo_model"
    assert "in typo_model" in error["traceback"]
    assert error["traceback"].rstrip().endswith("NameError: name 'undefined_name' is not defined")


def test_kerman_log_show_explains_a_failed_turn(tmp_path, capsys):
    store = kerman.FileStore(str(tmp_path))
    with store.create("s") as log:
        run_turn(kerman.AgentLoop(typo_model, log=log))
    assert cli.main(["log", "show", str(tmp_path), "s"]) == 0
    out = capsys.readouterr().out
    assert "turn/end" in out
    assert "NameError" in out
    assert "in typo_model" in out
    assert "NameError: name 'undefined_name' is not defined" in out


def test_a_tool_with_the_wrong_signature_is_reported_and_the_turn_goes_on(caplog):
    """Beyond SPEC 4.6, where ``agent/error`` reports a turn that ends with an error: issue 11
    asks that a tool's exception, which the model gets and the turn survives, be reported on
    ``agent/error`` too (``.error["code"]`` is ``TOOL_ERROR``)."""
    calls = {"n": 0}

    async def model(request: kerman.ModelRequest) -> kerman.ModelReply:
        calls["n"] += 1
        if calls["n"] == 1:
            return kerman.ModelReply([{"type": "tool-call", "id": "c1", "name": "clock", "arguments": "{}"}])
        return kerman.ModelReply("done")

    seen: List[Any] = []
    loop = kerman.AgentLoop(model)

    @loop.tool
    async def clock(args: Any) -> str:  # the context parameter is missing
        "The time."
        return "12:00"

    loop.on("agent/error", seen.append)
    run_turn(loop)
    ends = [e.data["reason"]["kind"] for e in loop.log.events(types="turn/end")]
    assert ends == ["completed"]
    result = list(loop.log.events(types="tool/result"))[0]
    error = result.data["error"]
    assert error["name"] == "TypeError" and error["code"] == "TOOL_ERROR"
    assert names(error["function"], "clock")
    assert "TypeError" in error["traceback"]
    assert len(seen) == 1 and isinstance(seen[0].exception, TypeError)
    assert seen[0].error["code"] == "TOOL_ERROR" and seen[0].function == error["function"]
    assert loop.last_error is seen[0]
    records = kerman_errors(caplog)
    assert len(records) == 1 and records[0].exc_info[0] is TypeError
    assert "tool 'clock'" in records[0].getMessage()


def test_tools_run_in_parallel_report_each_failure(caplog):
    calls = {"n": 0}

    async def model(request: kerman.ModelRequest) -> kerman.ModelReply:
        calls["n"] += 1
        if calls["n"] == 1:
            return kerman.ModelReply(
                [
                    {"type": "tool-call", "id": "a", "name": "boom", "arguments": "{}"},
                    {"type": "tool-call", "id": "b", "name": "boom", "arguments": "{}"},
                ]
            )
        return kerman.ModelReply("done")

    loop = kerman.AgentLoop(model)

    @loop.tool
    async def boom(args: Any, ctx: Any) -> str:
        "Fails."
        raise RuntimeError("kaput")

    run_turn(loop)
    errors = [e.data["error"] for e in loop.log.events(types="tool/result")]
    assert [e["name"] for e in errors] == ["RuntimeError", "RuntimeError"]
    assert all("kaput" in e["traceback"] and names(e["function"], "boom") for e in errors)
    assert len(kerman_errors(caplog)) == 2


WRONG_RESULTS = {
    "int": (lambda: 42, "tool 'bad' returned int; expected str or ToolResult"),
    "dict": (lambda: {"answer": 42}, "tool 'bad' returned dict; expected str or ToolResult"),
    "none": (lambda: None, "tool 'bad' returned NoneType; expected str or ToolResult"),
    "nan-content": (lambda: kerman.ToolResult([{"type": "text", "text": "x", "n": float("nan")}]), None),
}


@pytest.mark.parametrize("calls", [1, 2], ids=["lone", "several"])
@pytest.mark.parametrize("case", list(WRONG_RESULTS))
def test_a_tool_returning_what_is_not_a_result_is_reported_as_a_tool_bug(case, calls, caplog):
    value, text = WRONG_RESULTS[case]
    replies = [
        kerman.ModelReply([{"type": "tool-call", "id": f"c{i}", "name": "bad", "arguments": "{}"} for i in range(calls)]),
        kerman.ModelReply("done"),
    ]

    async def model(request: kerman.ModelRequest) -> kerman.ModelReply:
        return replies.pop(0)

    seen: List[Any] = []
    loop = kerman.AgentLoop(model)

    @loop.tool
    async def bad(args: Any, ctx: Any) -> Any:
        "Returns the wrong thing."
        return value()

    loop.on("agent/error", seen.append)
    run_turn(loop)
    assert [e.data["reason"]["kind"] for e in loop.log.events(types="turn/end")] == ["completed"]
    results = list(loop.log.events(types="tool/result"))
    assert [r.data["error"]["code"] for r in results] == ["TOOL_ERROR"] * calls
    # Reported as a raising tool is: agent/error, last_error, the logger, once per call.
    assert len(seen) == calls and loop.last_error is seen[-1]
    for i, event in enumerate(seen):
        assert event.exception is None and event.turn == 1 and event.step == 1
        assert event.error["code"] == "TOOL_ERROR" and event.error["tool"] == "bad" and event.error["callId"] == f"c{i}"
        message = results[i].data["message"]["content"][0]["content"][0]["text"]
        assert event.error["message"] == message
        if text is not None:
            assert message == text and event.error["name"] == "TypeError"
    records = kerman_errors(caplog)
    assert len(records) == calls
    assert all("tool 'bad' (call 'c" in r.getMessage() and "returned" in r.getMessage() for r in records)


def test_a_failing_pre_step_listener_is_reported(caplog):
    loop = kerman.AgentLoop(lambda request: kerman.ModelReply("hi"))

    @loop.pre_step
    async def guard(step: Any, next: Any) -> Any:
        raise KeyError("missing")

    run_turn(loop)
    assert loop.last_error is not None
    assert isinstance(loop.last_error.exception, KeyError)
    assert names(loop.last_error.function, "guard")
    end = list(loop.log.events(types="turn/end"))[-1]
    assert end.data["reason"]["error"]["exceptionType"] == "KeyError"
    assert len(kerman_errors(caplog)) == 1


def test_a_failing_live_listener_is_logged_with_its_traceback(caplog):
    loop = kerman.AgentLoop(lambda request: kerman.ModelReply("hi"))

    def listener(event: Any) -> None:
        raise ValueError("listener bug")

    loop.on("agent/status", listener)
    run_turn(loop)
    records = [r for r in kerman_errors(caplog) if r.exc_info and r.exc_info[0] is ValueError]
    assert records, "the listener's exception was not logged"
    assert all("listener bug" in r.getMessage() for r in records)


def test_a_deliberate_model_error_is_recorded_without_a_user_traceback():
    """A ModelError is the model's way to say the request failed: its failure keeps the code
    it gave, and is reported (logged, last_error) like any other error."""

    async def model(request: kerman.ModelRequest) -> kerman.ModelReply:
        raise kerman.ModelError("rate limited", code="RATE_LIMITED", status=429)

    loop = kerman.AgentLoop(model)
    run_turn(loop)
    error = list(loop.log.events(types="turn/end"))[-1].data["reason"]["error"]
    assert error["code"] == "RATE_LIMITED" and error["status"] == 429
    assert error["exceptionType"] == "ModelError"
    assert loop.last_error is not None and loop.last_error.error["code"] == "RATE_LIMITED"
    json.dumps(error)  # all of it is JSON


def test_a_listener_registered_twice_is_refused():
    """Issue 11, item 4: registering the same listener twice used to run it twice, silently.
    SPEC and the reference are silent; the decision: a listener is registered once per seam,
    and a second registration raises, naming it (a silent single registration would hide a
    plugin set up twice)."""
    loop = kerman.AgentLoop(lambda request: kerman.ModelReply("hi"))

    def status(event: Any) -> None:
        pass

    async def guard(step: Any, next: Any) -> Any:
        return await next()

    loop.on("agent/status", status)
    with pytest.raises(ValueError, match=r"status is already registered on 'agent/status'"):
        loop.on("agent/status", status)
    loop.on("agent/error", status)  # another seam: fine
    loop.pre_step(guard)
    with pytest.raises(ValueError, match="guard is already registered on pre_step"):
        loop.pre_step(guard)
    seen: List[str] = []
    loop.on("agent/status", lambda e: seen.append(e.status))
    run_turn(loop)
    assert seen == ["running", "idle"]
    assert loop.remove_listener(status)
    loop.on("agent/status", status)  # registered again after removal
