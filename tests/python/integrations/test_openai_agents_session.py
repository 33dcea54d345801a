"""kerman.integrations.openai_agents.KermanSession: openai-agents' Session protocol over a Kerman
session log, on every store (the ``store`` fixture: memory, file, PostgreSQL), and
``Runner.run`` keeping its history in it against a loopback OpenAI Responses server."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
from agents import Runner
from agents.memory import Session, SessionSettings
from session_helpers import CONFIG, agent

import kerman
from conftest import postgres_store_in_fresh_schema
from kerman.integrations.openai_agents import CLEARED, ITEMS, POPPED, KermanSession
from kerman.providers.testing import FakeServer, Reply, ToolCall


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def user(text):
    return {"role": "user", "content": text}


def said(text):
    return {"role": "assistant", "content": text}


def test_it_is_an_openai_agents_session(store):
    with KermanSession(store, "s1") as session:
        assert isinstance(session, Session)
        assert session.session_id == "s1" and session.log.id == "s1"
        assert session.session_settings is None


def test_every_method_of_the_protocol(store):
    async def main():
        with KermanSession(store, "s1") as session:
            assert await session.get_items() == []
            assert await session.pop_item() is None
            await session.add_items([user("a"), said("b")])
            await session.add_items([user("c")])
            await session.add_items([])  # nothing to add: nothing logged
            assert await session.get_items() == [user("a"), said("b"), user("c")]
            assert await session.get_items(limit=2) == [said("b"), user("c")]
            assert await session.get_items(limit=0) == []
            assert await session.get_items(limit=10) == [user("a"), said("b"), user("c")]
            assert await session.pop_item() == user("c")
            assert await session.get_items() == [user("a"), said("b")]
            await session.clear_session()
            assert await session.get_items() == []
            await session.clear_session()  # already empty: nothing logged
            await session.add_items([user("d")])
            assert await session.get_items() == [user("d")]
            return [(e.type, e.data) for e in session.log.events()]

    logged = run(main())
    assert logged == [
        (ITEMS, {"session": "s1", "items": [user("a"), said("b")]}),
        (ITEMS, {"session": "s1", "items": [user("c")]}),
        (POPPED, {"session": "s1", "index": 2}),
        (CLEARED, {"session": "s1", "count": 2}),
        (ITEMS, {"session": "s1", "items": [user("d")]}),
    ]


def test_the_history_is_read_back_from_the_store(store):
    async def main():
        async with KermanSession(store, "s1") as session:
            await session.add_items([user("a"), said("b"), user("c")])
            await session.pop_item()
        async with KermanSession(store, "s1") as again:  # opens the session the first created
            assert await again.get_items() == [user("a"), said("b")]
            return repr(again)

    assert run(main()) == "<KermanSession 's1' log='s1' items=2>"


def test_session_settings_limit_is_the_default_limit(memory_store):
    async def main():
        session = KermanSession(memory_store, "s1", session_settings=SessionSettings(limit=1))
        await session.add_items([user("a"), user("b")])
        assert await session.get_items() == [user("b")]
        assert await session.get_items(limit=2) == [user("a"), user("b")]
        with pytest.raises(ValueError, match="limit must be None or an int >= 0, got -1"):
            await session.get_items(limit=-1)

    run(main())


def test_sessions_over_one_log_keep_their_own_history_and_leave_it_open(memory_log):
    async def main():
        first, second = KermanSession(memory_log), KermanSession(memory_log, "other")
        assert first.session_id == memory_log.id
        await first.add_items([user("a")])
        await second.add_items([user("b")])
        await first.clear_session()
        assert await first.get_items() == [] and await second.get_items() == [user("b")]
        # a second object over the same session sees what the first appended
        assert await KermanSession(memory_log, "other").get_items() == [user("b")]
        first.close()
        assert not memory_log.closed

    run(main())


def test_items_are_copies(memory_store):
    async def main():
        session = KermanSession(memory_store, "s1")
        item = {"role": "user", "content": [{"type": "input_text", "text": "a"}]}
        await session.add_items([item])
        item["content"][0]["text"] = "changed by the caller"
        got = await session.get_items()
        got[0]["role"] = "changed by the reader"
        assert await session.get_items() == [{"role": "user", "content": [{"type": "input_text", "text": "a"}]}]

    run(main())


def test_items_that_are_not_json_append_nothing(memory_store):
    async def main():
        session = KermanSession(memory_store, "s1")
        await session.add_items([user("a")])
        with pytest.raises(kerman.NotJsonError):
            await session.add_items([user("b"), {"role": "user", "content": object()}])
        assert await session.get_items() == [user("a")]
        assert len(session.log) == 1

    run(main())


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="takes a Kerman store or SessionLog, got dict"):
        KermanSession({}, "s1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="needs a session_id"):
        KermanSession(kerman.MemoryStore())
    with pytest.raises(ValueError, match="session_id must be a non-empty str, got ''"):
        KermanSession(kerman.MemoryStore().create(), "")


@pytest.fixture(params=["file", "postgres"])
def durable_store(request, tmp_path):
    if request.param == "postgres":
        return postgres_store_in_fresh_schema()
    return kerman.FileStore(tmp_path / "sessions", durability="checkpoint")


def test_runner_run_keeps_its_history_in_kerman(durable_store):
    """Two runs of one agent over one KermanSession: the second request carries the first run's
    items (the prompt, the tool call, its output, the reply) read from the log, and a new
    KermanSession over the reopened session reads the same history."""

    async def main():
        with FakeServer("openai-responses") as server:
            server.add(
                Reply(tool_calls=[ToolCall("call_1", "clock", '{"tz":"UTC"}')]),
                Reply(text="It is noon."),
                Reply(text="You asked for the time."),
            )
            assistant, client = agent(server)
            try:
                async with KermanSession(durable_store, "chat-1") as session:
                    first = await Runner.run(assistant, "What time is it?", session=session, run_config=CONFIG)
                    second = await Runner.run(assistant, "What did I ask?", session=session, run_config=CONFIG)
                    history = await session.get_items()
            finally:
                await client.close()
            sent = server.requests[2].body["input"]
        async with KermanSession(durable_store, "chat-1") as reopened:
            assert await reopened.get_items() == history
            logged = [e.type for e in reopened.log.events()]
        return first.final_output, second.final_output, history, sent, logged

    first, second, history, sent, logged = run(main())
    assert (first, second) == ("It is noon.", "You asked for the time.")
    kinds = [item.get("type", item.get("role")) for item in history]
    assert kinds == ["user", "function_call", "function_call_output", "message", "user", "message"]
    assert history[0]["content"] == "What time is it?" and history[4]["content"] == "What did I ask?"
    assert history[2]["call_id"] == "call_1" and history[2]["output"] == "12:00 UTC"
    # the third request is the whole history as the log holds it, up to the new prompt
    assert [json.dumps(i, sort_keys=True) for i in sent] == [json.dumps(i, sort_keys=True) for i in history[:5]]
    assert set(logged) == {ITEMS}


def test_kerman_and_kerman_integrations_import_no_framework():
    code = "import sys, kerman, kerman.integrations; print(sorted(m for m in sys.modules if m.split('.')[0] in ('agents', 'pydantic_ai')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
