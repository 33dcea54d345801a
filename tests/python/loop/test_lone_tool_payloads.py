"""A step's lone tool call is run by the Rust driver itself (src/python/driver/tool.rs), not by
``kerman._tools``. These tests pin what that path must keep from the Python one: the exact
JSON text of ``tool/call`` and ``tool/result`` (compared with what ``log.append`` writes for
the same payloads), and the outcomes it hands to ``_tools`` for wording (sync tools,
non-coroutine awaitables, ``ToolResult`` extras, invalid arguments and results). Cancellation
is pinned by test_lone_tool_cancellation.py.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
from typing import Any, Dict, List

import pytest

import kerman
from kerman import AgentLoop, ModelReply, ToolResult, ToolResultMessage
from kerman.models import ScriptedModel


def call(call_id: str = "c1", name: str = "work", arguments: str = "{}") -> ModelReply:
    return ModelReply([{"type": "tool-call", "id": call_id, "name": name, "arguments": arguments}])


def results(log: Any) -> List[Any]:
    return [e for e in log.events() if e.type == "tool/result"]


def run(replies: List[Any], fn: Any, name: str = "work", log: Any = None) -> AgentLoop:
    async def main() -> AgentLoop:
        loop = AgentLoop(ScriptedModel(replies), log=log)
        loop.tool(fn, name=name)
        loop.followup("go")
        await loop.when_idle()
        return loop

    return asyncio.run(main())


async def flushed(log: Any) -> None:
    await log.flush()


def data_texts(folder: str) -> Dict[str, List[str]]:
    """The raw JSON text of each event's data in the one session file under ``folder``, by type."""
    [name] = [n for n in os.listdir(folder) if n.endswith(".jsonl")]
    out: Dict[str, List[str]] = {}
    decoder = json.JSONDecoder()
    with open(os.path.join(folder, name), encoding="utf-8") as f:
        for line in f:
            record = line.split(" ", 1)[1]
            kind = json.loads(record)["type"]
            start = record.find('"data":')
            if start < 0:
                continue
            start += len('"data":')
            _, end = decoder.raw_decode(record, start)
            out.setdefault(kind, []).append(record[start:end])
    return out


def test_lone_call_events_are_byte_identical_to_what_the_python_path_writes(tmp_path):
    call_id = 'c"1 \u00e9\\'
    name = "w\u00f6rk"
    arguments = json.dumps({"s": 'a\x00\n"\u00e9\U0001f600', "n": [1, 2.5, None, True]})
    text = 'line1\nline2\t\x01 \u00e9 \U0001f600 "q" \\ \u2028'

    async def work(args: Dict[str, Any], ctx: Any) -> str:
        assert args == {"s": 'a\x00\n"\u00e9\U0001f600', "n": [1, 2.5, None, True]}
        return text

    real = tmp_path / "real"
    loop = run([call(call_id, name, arguments), "done"], work, name=name, log=kerman.FileStore(real, durability="none").create())
    [result] = results(loop.log)
    asyncio.run(flushed(loop.log))

    # The same payloads appended through the public API (as plugin types), in a log of their own.
    ref = tmp_path / "ref"
    ref_log = kerman.FileStore(ref, durability="none").create()
    ref_log.append("ref/call", {"turn": 1, "step": 1, "callId": call_id, "name": name, "arguments": arguments})
    message = ToolResultMessage(call_id, text, is_error=False, id=result.data["message"]["id"])
    ref_log.append("ref/result", {"turn": 1, "step": 1, "message": message.to_dict()})
    asyncio.run(flushed(ref_log))

    got, want = data_texts(str(real)), data_texts(str(ref))
    assert got["tool/call"] == want["ref/call"]
    assert got["tool/result"] == want["ref/result"]
    assert loop.log[-1].data["reason"] == {"kind": "completed"}
    loop.log.close()
    ref_log.close()


def test_a_sync_tool_runs_in_a_copy_of_the_context():
    var: contextvars.ContextVar[str] = contextvars.ContextVar("kerman_lone_var", default="unset")
    seen: List[str] = []

    def work(args: Dict[str, Any], ctx: Any) -> str:
        var.set("set by the tool")
        return "ok"

    class Model:
        def __init__(self) -> None:
            self.n = 0

        async def __call__(self, request: Any) -> Any:
            seen.append(var.get())
            self.n += 1
            return call() if self.n == 1 else ModelReply("done")

    async def main() -> AgentLoop:
        loop = AgentLoop(Model())
        loop.tool(work)
        loop.followup("go")
        await loop.when_idle()
        return loop

    loop = asyncio.run(main())
    assert seen == ["unset", "unset"]
    [result] = results(loop.log)
    assert result.data["message"]["content"][0]["content"] == [{"type": "text", "text": "ok"}]


def test_a_tool_returning_a_future_is_awaited():
    async def main() -> AgentLoop:
        loop = AgentLoop(ScriptedModel([call(), "done"]))

        def work(args: Dict[str, Any], ctx: Any) -> Any:
            future = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_soon(future.set_result, ToolResult("from a future", meta={"k": 1}))
            return future

        loop.tool(work)
        loop.followup("go")
        await loop.when_idle()
        return loop

    loop = asyncio.run(main())
    [result] = results(loop.log)
    assert result.data["meta"] == {"k": 1}
    assert result.data["message"]["content"][0]["content"] == [{"type": "text", "text": "from a future"}]
    assert loop.log[-1].data["reason"] == {"kind": "completed"}


def test_a_lone_tool_result_can_conclude_the_turn():
    async def work(args: Dict[str, Any], ctx: Any) -> ToolResult:
        return ToolResult("final", concludes_turn=True)

    loop = run([call(), "never asked"], work)
    [result] = results(loop.log)
    assert "error" not in result.data
    assert [e.type for e in loop.log.events()].count("assistant/message") == 1
    assert loop.log[-1].data["reason"] == {"kind": "completed"}


def test_contexts_a_lone_tool_stages_enter_at_the_next_step():
    async def work(args: Dict[str, Any], ctx: Any) -> ToolResult:
        return ToolResult("staged", concludes_turn=True, additional_contexts=["note"])

    loop = run([call(), "after the note"], work)
    [result] = results(loop.log)
    entered = [e.data for e in loop.log.events() if e.type == "user/message"]
    assert entered[-1]["content"] == [{"type": "text", "text": "note"}]
    assert entered[-1]["source"] == {"kind": "plugin", "plugin": "tool:work"}
    # Staged input keeps the turn going: the model is asked again.
    assert [e.type for e in loop.log.events()].count("assistant/message") == 2


@pytest.mark.parametrize(
    "arguments, text",
    [
        ("not json", "invalid tool arguments: Expecting value: line 1 column 1 (char 0)"),
        ('{"x": NaN}', "invalid tool arguments: NaN is not valid JSON"),
    ],
)
def test_invalid_arguments_give_the_python_wording(arguments, text):
    ran: List[str] = []

    async def work(args: Dict[str, Any], ctx: Any) -> str:
        ran.append("ran")
        return "ok"

    loop = run([call(arguments=arguments), "done"], work)
    [result] = results(loop.log)
    assert ran == []
    assert result.data["error"] == {"name": "ValueError", "code": "INVALID_ARGUMENTS"}
    assert result.data["message"]["content"][0]["content"] == [{"type": "text", "text": text}]
    assert result.data["message"]["content"][0]["isError"] is True


@pytest.mark.parametrize(
    "value, text, name",
    [
        (42, "tool 'work' returned int; expected str or ToolResult", "TypeError"),
        (ToolResult("x", meta={1, 2}), None, "NotJsonError"),
    ],
)
def test_unusable_results_are_error_results(value, text, name):
    async def work(args: Dict[str, Any], ctx: Any) -> Any:
        return value

    loop = run([call(), "done"], work)
    [result] = results(loop.log)
    assert result.data["error"]["name"] == name
    assert result.data["error"]["code"] == "TOOL_ERROR"
    [block] = result.data["message"]["content"][0]["content"]
    if text is not None:
        assert block["text"] == text
    else:
        assert block["text"].startswith("tool 'work' returned an invalid result: ")
    assert loop.log[-1].data["reason"] == {"kind": "completed"}


def test_a_str_subclass_result_is_worded_by_the_python_path():
    """Only an exact str is committed by the driver; a subclass goes to ``_tools._commit``,
    whose message constructor refuses it, as it always has."""

    class Text(str):
        pass

    async def work(args: Dict[str, Any], ctx: Any) -> str:
        return Text("sub")

    loop = run([call(), "done"], work)
    [result] = results(loop.log)
    assert result.data["error"] == {"name": "InvalidMessageError", "code": "TOOL_ERROR"}


def test_a_base_exception_from_the_body_ends_the_turn_and_resets_the_flag():
    class Stop(BaseException):
        pass

    async def work(args: Dict[str, Any], ctx: Any) -> str:
        raise Stop()

    async def main() -> AgentLoop:
        loop = AgentLoop(ScriptedModel([call(), "never asked"]))
        loop.tool(work)
        loop.followup("go")
        try:
            await loop.when_idle()
        except Stop:
            pass
        await asyncio.sleep(0)
        return loop

    loop = asyncio.run(main())
    assert loop._in_user is False
    # Every call gets its result, whatever its body raised (the exception then ends the turn).
    [result] = results(loop.log)
    assert result.data["error"]["name"] == "Stop" and result.data["error"]["code"] == "TOOL_ERROR"


def typed(value: Any) -> Any:
    """``value`` with every scalar's type spelled out and dict order kept, so an int that
    arrives as a float (or a reordered dict) compares unequal."""
    if isinstance(value, dict):
        return ("dict", [(k, typed(v)) for k, v in value.items()])
    if isinstance(value, list):
        return ("list", [typed(v) for v in value])
    return (type(value).__name__, repr(value))


@pytest.mark.parametrize(
    "arguments",
    [
        '{"a": 1, "b": 2, "a": 3}',
        '{"zero": -0, "negzero": -0.0, "exp": 1e2, "half": 1.5, "tiny": 5e-324, "round": 0.1}',
        '{"big": 12345678901234567890123, "u64": 18446744073709551615, "i64": -9223372036854775808,'
        ' "past": 18446744073709551616, "neg": -9223372036854775809}',
        '{"inf": 1E400, "huge": 1e300}',
        '{"pair": "\\ud83d\\ude00", "lone": "\\ud800", "esc": "\\n\\t\\"\\\\\\/", "raw": "\u00e9\U0001f600"}',
        '{"nested": [true, false, null, [], {}, [[{"x": [1]}]]]}',
        ' \t\n [1, "x"] \r\n',
        '"just a string"',
        "12",
        "[" * 200 + "]" * 200,
    ],
)
def test_arguments_decode_exactly_as_python_json_does(arguments):
    seen: List[Any] = []

    async def work(args: Dict[str, Any], ctx: Any) -> str:
        seen.append(args)
        return "ok"

    loop = run([call(arguments=arguments), "done"], work)
    want = json.JSONDecoder(parse_constant=lambda name: None).decode(arguments)
    assert [typed(a) for a in seen] == [typed(want)]
    assert "error" not in results(loop.log)[0].data
