"""Gemini on the wire: the exact contents of a two-step tool turn (function responses named and
grouped in one user turn), thought signatures sent back on their parts (also after a restart),
the placeholder signature for calls from another model's history, calls without ids, thought
parts as reasoning, and a RetryInfo delay as ``retryAfterMs``."""

from __future__ import annotations

import base64

from provider_helpers import asynctest, chunks, clock, done, failure, make, messages, run

import kerman
from kerman.providers.testing import FakeServer, HttpError, Raw, Reply, ToolCall

P = "gemini"
SIG = base64.b64encode(b"thought-signature-1").decode()


def camel(value):
    if isinstance(value, dict):
        return {k.split("_")[0] + "".join(w.title() for w in k.split("_")[1:]): camel(v) for k, v in value.items()}
    if isinstance(value, list):
        return [camel(v) for v in value]
    return value


@asynctest
async def test_a_two_step_tool_turn_sends_the_contents_gemini_expects():
    with FakeServer(P) as server:
        server.add(
            Reply(
                text="Let me check.",
                tool_calls=[ToolCall("call_a", "clock", '{"tz": "UTC"}', signature=SIG), ToolCall("call_b", "clock", "{}")],
            ),
            Reply(text="Noon."),
        )
        model = make(P, server, instructions="Be brief.", temperature=0.5)
        loop = await run(model, "What time is it?", tools=[clock])
        second = camel(server.requests[1].body)
        assert second["contents"] == [
            {"role": "user", "parts": [{"text": "What time is it?"}]},
            {
                "role": "model",
                "parts": [
                    {"text": "Let me check."},
                    {"functionCall": {"id": "call_a", "name": "clock", "args": {"tz": "UTC"}}, "thoughtSignature": SIG},
                    {"functionCall": {"id": "call_b", "name": "clock", "args": {}}},
                ],
            },
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"id": "call_a", "name": "clock", "response": {"result": "12:00"}}},
                    {"functionResponse": {"id": "call_b", "name": "clock", "response": {"result": "12:00"}}},
                ],
            },
        ]
        assert second["systemInstruction"]["parts"] == [{"text": "Be brief."}]
        assert second["tools"] == [
            {
                "functionDeclarations": [
                    {"name": "clock", "description": "Returns the time.", "parametersJsonSchema": {"type": "object", "properties": {}}}
                ]
            }
        ]
        assert second["generationConfig"] == {"temperature": 0.5}
        assert server.requests[1].path.endswith("/models/fake-model:streamGenerateContent")
        assert server.requests[1].query == {"alt": ["sse"]}
        assert server.requests[1].headers["x-goog-api-key"]
        await done(loop, model)


@asynctest
async def test_thought_signatures_survive_a_restart(tmp_path):
    store = kerman.FileStore(tmp_path / "sessions")
    with FakeServer(P) as server:
        server.add(
            Reply(tool_calls=[ToolCall("call_a", "clock", "{}", signature=SIG)]), Reply(text="Noon.", signature=SIG), Reply(text="Bye.")
        )
        model = make(P, server)
        log = store.create("s")
        loop = await run(model, "time?", tools=[clock], log=log)
        await done(loop, model)
        log.close()
        fresh = make(P, server)
        with store.open("s") as log:
            loop = await run(fresh, "thanks", log=log)
            contents = camel(server.requests[2].body)["contents"]
            assert contents[1] == {
                "role": "model",
                "parts": [{"functionCall": {"id": "call_a", "name": "clock", "args": {}}, "thoughtSignature": SIG}],
            }
            assert contents[3] == {"role": "model", "parts": [{"text": "Noon.", "thoughtSignature": SIG}]}
            await done(loop, fresh)


@asynctest
async def test_calls_from_another_models_history_get_the_placeholder_signature():
    log = kerman.MemoryStore().create()
    earlier = kerman.models.ScriptedModel(
        [
            kerman.ModelReply(
                [
                    {"type": "tool-call", "id": "x1", "name": "clock", "arguments": "{}"},
                    {"type": "tool-call", "id": "x2", "name": "clock", "arguments": "{}"},
                ]
            ),
            "Noon.",
        ]
    )
    loop = await run(earlier, "time?", tools=[clock], log=log)
    await loop.aclose()
    skip = base64.b64encode(b"skip_thought_signature_validator").decode()
    for sign, expected in ((True, [skip, None]), (False, [None, None])):
        with FakeServer(P) as server:
            server.add(Reply(text="ok"))
            model = make(P, server, sign_unsigned_calls=sign)
            loop = await run(model, "again", log=log)
            parts = camel(server.requests[0].body)["contents"][1]["parts"]
            assert [p.get("thoughtSignature") for p in parts] == expected  # the first call of the step only
            await loop.aclose()


@asynctest
async def test_a_call_without_an_id_gets_one_that_is_not_sent_back():
    with FakeServer(P) as server:
        server.add(Reply(tool_calls=[ToolCall("", "clock", "{}")]), Reply(text="Noon."))
        model = make(P, server)
        loop = await run(model, "time?", tools=[clock])
        [call] = [c for c in chunks(loop.log) if c["type"] == "tool-call"]
        assert call["id"].startswith("kerman_")
        contents = camel(server.requests[1].body)["contents"]
        assert contents[1]["parts"][0]["functionCall"] == {"name": "clock", "args": {}}
        assert contents[2]["parts"] == [{"functionResponse": {"name": "clock", "response": {"result": "12:00"}}}]
        await done(loop, model)


@asynctest
async def test_thought_parts_are_reasoning():
    with FakeServer(P) as server:
        server.add(Reply(reasoning=["Thinking", " more."], text="Done.", usage={"input": 8, "output": 20, "cacheRead": 2, "reasoning": 12}))
        model = make(P, server, thinking_config={"include_thoughts": True})
        loop = await run(model, "go")
        assert messages(loop.log)[0]["message"]["content"] == [
            {"type": "reasoning", "text": "Thinking more."},
            {"type": "text", "text": "Done."},
        ]
        assert [c for c in chunks(loop.log) if c["type"] == "usage"] == [
            {
                "type": "usage",
                "input": 8,
                "output": 20,
                "cacheRead": 2,
                "cacheWrite": 0,
                "reasoning": 12,
                "model": "fake-model",
                "provider": "google",
            }
        ]
        assert camel(server.requests[0].body)["generationConfig"]["thinkingConfig"] == {"includeThoughts": True}
        await done(loop, model)


@asynctest
async def test_a_retry_info_delay_is_retry_after():
    body = {
        "error": {
            "code": 429,
            "message": "Resource has been exhausted (e.g. check quota).",
            "status": "RESOURCE_EXHAUSTED",
            "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "12s"}],
        }
    }
    with FakeServer(P) as server:
        import json

        server.add(Raw(status=429, headers={"content-type": "application/json"}, body=json.dumps(body)))
        model = make(P, server, retry=None)
        loop = await run(model, "go")
        error = failure(loop.log)
        assert (error["code"], error["status"], error["retryAfterMs"]) == ("RATE_LIMITED", 429, 12000)
        await done(loop, model)


@asynctest
async def test_an_error_chunk_mid_stream_is_classified():
    with FakeServer(P) as server:
        server.add(Reply(text=["a", "b"], error=HttpError(503, "The model is overloaded.", kind="UNAVAILABLE"), error_after=1))
        model = make(P, server, retry=None)
        loop = await run(model, "go")
        assert failure(loop.log)["code"] == "OVERLOADED"
        await done(loop, model)
