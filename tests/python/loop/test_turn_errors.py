"""AgentLoop errors and recovery: failed turns, ``request_error`` listeners, failing appends,
throwing observers, and what ``agent/error`` reports.

Reference cases (``reference-behavior.md`` 7.6): ERR-*, each test named after its case id.
SPEC.md wins where they disagree; where a decision (SPEC 3, D1-D11) or a clarification (SPEC 4)
changes a reference case, the test checks the decided behaviour and says so. How a bug in user
code is reported (logger, live event, log) is in test_user_code_errors.py.

Every test drives its own event loop with ``asyncio.run`` and synchronises through
``asyncio.Event``/futures or ``threading.Event`` handshakes, never through sleeps.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

import kerman
from conftest import plain
from kerman import (
    AgentLoop,
    MemoryStore,
    ModelError,
    ModelReply,
    Retry,
)
from kerman.models import ScriptedModel
from loop.loop_helpers import BOUNDARIES, COMPLETED, USER, Live, aborted, boundaries, count, of_type, tool_calls, turn_ends, types_of

# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# 7.6 Errors and recovery (ERR-*)
# --------------------------------------------------------------------------------------------


def test_ERR_01_script_exhausted_reports_one_agent_error():
    async def main():
        loop = AgentLoop(ScriptedModel([]))
        live = Live(loop)
        loop.followup("go")
        await loop.when_idle()
        [error] = live.errors
        assert plain(error.error) == {"message": "script exhausted", "code": "UNKNOWN"}
        assert isinstance(error.exception, ModelError)
        assert error.turn == 1 and error.step == 1
        assert turn_ends(loop.log) == [{"kind": "error", "error": {"message": "script exhausted", "code": "UNKNOWN"}}]
        assert live.statuses == ["running", "idle"]

    asyncio.run(main())


def test_ERR_03_finish_error_keeps_every_failure_field():
    """Wire name ``retryAfterMs`` (SPEC 4.6) instead of ``providerRetryAfterMs``; extra keys of the
    finish chunk's error are kept."""

    async def main():
        failure = {
            "message": "overloaded",
            "code": "RATE_LIMITED",
            "status": 529,
            "retryAfterMs": 1500,
            "requestId": "req-7",
            "vendor": {"x": 1},
        }
        model = ScriptedModel([[{"type": "text-delta", "text": "par"}, {"type": "finish", "reason": "error", "error": failure}]])
        loop = AgentLoop(model)
        live = Live(loop)
        loop.followup("go")
        await loop.when_idle()
        assert turn_ends(loop.log) == [{"kind": "error", "error": failure}]
        [error] = live.errors
        assert (error.turn, error.step) == (1, 1)
        assert error.error == failure
        assert error.exception is None
        assert of_type(loop.log, "assistant/message") == []

    asyncio.run(main())


def test_ERR_04_a_provider_abort_finish_is_an_error_not_a_cancellation():
    """Kerman's finish reasons are stop|max-tokens|error; a provider-side abort is a finish with
    reason ``error`` and code ``ABORTED``: the turn ends ``error``, not ``aborted``."""

    async def main():
        failure = {"message": "provider aborted the stream", "code": "ABORTED"}
        model = ScriptedModel([[{"type": "finish", "reason": "error", "error": failure}]])
        loop = AgentLoop(model)
        signals: list = []

        @loop.turn_stopping
        def never(stop):
            signals.append(stop)

        @loop.pre_step
        async def pre(step, next):
            signals.append(step.signal)
            return await next()

        loop.followup("go")
        await loop.when_idle()
        assert turn_ends(loop.log) == [{"kind": "error", "error": failure}]
        assert not signals[0].aborted

    asyncio.run(main())


def test_ERR_05_a_throwing_turn_stopping_listener_fails_the_turn():
    async def main():
        model = ScriptedModel(["one", "two"])
        loop = AgentLoop(model)
        live = Live(loop)
        calls: list = []

        @loop.turn_stopping
        async def stopping(stop):
            calls.append(stop.turn)
            if len(calls) == 1:
                raise RuntimeError("stop hook broke")

        loop.followup("first")
        await loop.when_idle()
        assert turn_ends(loop.log) == [{"kind": "error", "error": {"message": "stop hook broke", "code": "UNKNOWN"}}]
        assert len(live.errors) == 1 and isinstance(live.errors[0].exception, RuntimeError)
        loop.followup("second")
        await loop.when_idle()
        assert turn_ends(loop.log)[-1] == COMPLETED

    asyncio.run(main())


def test_ERR_07_before_request_model_error_is_not_offered_to_request_error():
    """``before_request`` replaces ``agent/request`` (D4)."""

    async def main():
        model = ScriptedModel(["never"])
        loop = AgentLoop(model)
        offered: list = []

        @loop.before_request
        async def middleware(request, next):
            raise ModelError("middleware refused", code="MIDDLEWARE")

        @loop.request_error
        async def recover(failure, next):
            offered.append(failure)
            return Retry()

        loop.followup("go")
        await loop.when_idle()
        assert offered == []
        assert model.requests == []
        assert turn_ends(loop.log) == [{"kind": "error", "error": {"message": "middleware refused", "code": "MIDDLEWARE"}}]

    asyncio.run(main())


def test_ERR_09_a_recovery_listener_that_cancels_and_retries():
    async def main():
        model = ScriptedModel([ModelError("flaky"), "never"])
        loop = AgentLoop(model)
        live = Live(loop)

        @loop.request_error
        async def recover(failure, next):
            loop.cancel()
            return Retry()

        loop.followup("go")
        await loop.when_idle()
        assert len(model.requests) == 1
        assert turn_ends(loop.log) == [aborted(USER)]
        assert live.errors == []
        assert of_type(loop.log, "assistant/message") == []

    asyncio.run(main())


def test_ERR_10_a_recovery_listener_that_throws_ends_the_turn_in_error():
    async def main():
        model = ScriptedModel([ModelError("flaky"), "never"])
        loop = AgentLoop(model)
        live = Live(loop)

        @loop.request_error
        async def recover(failure, next):
            raise RuntimeError("recovery broke")

        loop.followup("go")
        await loop.when_idle()
        assert len(model.requests) == 1
        [end] = turn_ends(loop.log)
        assert end["kind"] == "error"
        assert end["error"]["code"] == "UNKNOWN" and "recovery broke" in end["error"]["message"]
        assert len(live.errors) == 1

    asyncio.run(main())


def test_ERR_13_a_failed_turn_start_append_reports_and_keeps_the_prompt():
    """No pre-commit veto exists; the failing ``turn/start`` append is simulated by closing the log
    from the ``running`` status listener (just before ``turn/start``)."""

    async def main():
        log = MemoryStore().create()
        loop = AgentLoop(ScriptedModel(["never"]), log=log)
        live = Live(loop)

        @loop.on("agent/status")
        def close_log(event):
            if event.status == "running":
                log.close()

        p = loop.followup("go")
        await loop.when_idle()
        assert types_of(log) == ["agent/inbox/spliced"]
        assert loop.inbox.next_turn == (p,)
        [error] = live.errors
        assert error.turn == 0 and error.step == 0
        assert isinstance(error.exception, kerman.LogClosedError)
        assert error.error["code"] == "UNKNOWN"
        assert loop.status == "idle" and live.statuses == ["running", "idle"]
        assert loop.turn == 0

    asyncio.run(main())


def test_ERR_16_a_failed_turn_end_append_is_reported_once_and_the_loop_idles():
    """Simulated veto: a turn_stopping listener closes the log, so ``turn/end`` cannot commit."""

    async def main():
        log = MemoryStore().create()
        model = ScriptedModel(["answer", "more"])
        loop = AgentLoop(model, log=log)
        live = Live(loop)

        @loop.turn_stopping
        def close_log(stop):
            log.close()

        loop.followup("go")
        await loop.when_idle()
        assert types_of(log)[-1] == "step/end"
        [error] = live.errors
        assert isinstance(error.exception, kerman.LogClosedError)
        assert error.turn == 1
        assert loop.status == "idle" and live.statuses == ["running", "idle"]
        assert len(model.requests) == 1

    asyncio.run(main())


def test_ERR_17_a_log_that_fails_mid_step_still_gives_running_then_idle():
    """Simulated permanent veto: the model closes the log, so every later append fails."""

    async def main():
        log = MemoryStore().create()

        async def model(request):
            log.close()
            return ModelReply("lost")

        loop = AgentLoop(model, log=log)
        live = Live(loop)
        loop.followup("go")
        await loop.when_idle()
        assert live.statuses == ["running", "idle"]
        assert live.errors and all(isinstance(e.exception, kerman.LogClosedError) for e in live.errors)
        assert types_of(log)[-1] == "request/header"

    asyncio.run(main())


def test_ERR_18_throwing_observers_never_change_the_outcome(caplog):
    async def main():
        model = ScriptedModel(["one", ModelError("down"), "three"])
        loop = AgentLoop(model)
        live = Live(loop)

        def observer(event):
            if event.type in BOUNDARIES:
                raise RuntimeError(f"observer of {event.type} broke")

        loop.log.subscribe(observer)

        @loop.on("agent/error")
        def broken(event):
            raise RuntimeError("agent/error listener broke")

        loop.followup("first")
        await loop.when_idle()
        assert boundaries(loop.log) == ["turn/start", "step/start", "step/end", "turn/end"]
        assert turn_ends(loop.log) == [COMPLETED]
        assert live.errors == []

        loop.followup("second")  # the model fails: agent/error with a throwing listener
        await loop.when_idle()
        assert turn_ends(loop.log)[-1]["kind"] == "error"
        assert len(live.errors) == 1

        loop.followup("third")
        await loop.when_idle()
        assert turn_ends(loop.log)[-1] == COMPLETED
        assert count(loop.log, "turn/start") == count(loop.log, "turn/end") == 3
        assert count(loop.log, "step/start") == count(loop.log, "step/end") == 3

    with caplog.at_level(logging.CRITICAL, logger="kerman"):
        asyncio.run(main())


class _Boom(Exception):
    pass


class _RateLimited(ModelError):
    pass


@pytest.mark.parametrize(
    "exc,failure",
    [
        (_Boom("boom"), {"message": "boom", "code": "UNKNOWN"}),
        (
            _RateLimited("slow down", code="RATE_LIMITED", status=429, retry_after_ms=250),
            {"message": "slow down", "code": "RATE_LIMITED", "status": 429, "retryAfterMs": 250},
        ),
    ],
)
def test_a_failing_model_keeps_its_exception_type_in_agent_error(exc, failure):
    async def main():
        async def model(request):
            raise exc

        loop = AgentLoop(model)
        live = Live(loop)
        loop.followup("go")
        await loop.when_idle()
        [error] = live.errors
        assert error.exception is exc and type(error.exception) is type(exc)
        assert plain(error.error) == failure
        assert error.error["exceptionType"] == type(exc).__name__
        assert error.type == "agent/error" and error.loop is loop
        assert turn_ends(loop.log) == [{"kind": "error", "error": failure}]

    asyncio.run(main())


def test_agent_error_reports_the_turn_and_the_last_entered_step():
    async def main():
        model = ScriptedModel(["plain", tool_calls(("c1", "t")), "unused"])
        loop = AgentLoop(model)
        live = Live(loop)
        proposals: list = []

        @loop.tool
        async def t(args, ctx):
            return "x"

        @loop.pre_step
        async def pre(step, next):
            proposals.append((step.turn, step.step))
            if (step.turn, step.step) in ((2, 2), (3, 1)):
                raise RuntimeError(f"fail at {step.turn}.{step.step}")
            return await next()

        loop.followup("one")
        await loop.when_idle()
        loop.followup("two")  # step 1 calls a tool; the step-2 proposal fails
        await loop.when_idle()
        loop.followup("three")  # the first proposal fails
        await loop.when_idle()
        assert proposals == [(1, 1), (2, 1), (2, 2), (3, 1)]
        assert [(e.turn, e.step) for e in live.errors] == [(2, 1), (3, 0)]
        assert [plain(e.error) for e in live.errors] == [
            {"message": "fail at 2.2", "code": "UNKNOWN"},
            {"message": "fail at 3.1", "code": "UNKNOWN"},
        ]

    asyncio.run(main())
