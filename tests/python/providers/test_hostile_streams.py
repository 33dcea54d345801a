"""Streams a proxy or a broken server sends, through each vendor's SDK: deltas that split a
UTF-16 surrogate pair, malformed events, a 200 whose body is a JSON error or an HTML page, a
stream that ends without its stop reason, and API keys with whitespace around them."""

from __future__ import annotations

import json

import pytest
from provider_helpers import CLASSES, PROTOCOLS, asynctest, chunks, clock, done, failure, make, messages, run, turn_ends

from kerman.providers.testing import FakeServer, Raw, Reply, ToolCall

GRIN = "\U0001f600"  # 😀, "\ud83d\ude00" in UTF-16


@pytest.mark.parametrize("protocol", PROTOCOLS)
@asynctest
async def test_a_surrogate_pair_split_across_deltas_is_joined(protocol):
    # json.dumps writes a lone surrogate as its \\uXXXX escape: each delta is valid JSON, as a
    # proxy that re-chunks a stream by UTF-16 index sends it.
    with FakeServer(protocol) as server:
        server.add(Reply(reasoning=["think \ud83d", "\ude00 done"], text=["Hi \ud83d", "\ude00 there"]))
        model = make(protocol, server, retry=None)
        loop = await run(model, "go")
        assert messages(loop.log)[0]["message"]["content"] == [
            {"type": "reasoning", "text": f"think {GRIN} done"},
            {"type": "text", "text": f"Hi {GRIN} there"},
        ]
        deltas = [c["text"] for c in chunks(loop.log) if c["type"] == "text-delta"]
        assert "".join(deltas) == f"Hi {GRIN} there"
        await done(loop, model)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@asynctest
async def test_an_unpaired_surrogate_becomes_a_replacement_character(protocol):
    with FakeServer(protocol) as server:
        # A first half that never gets its second, and a second half with no first.
        server.add(Reply(text=["a\ud83d", "b\ude00c", "end\ud83d"]))
        model = make(protocol, server, retry=None)
        loop = await run(model, "go")
        assert messages(loop.log)[0]["message"]["content"] == [{"type": "text", "text": "a\ufffdb\ufffdcend\ufffd"}]
        assert turn_ends(loop.log)[-1]["kind"] == "completed"
        await done(loop, model)


@pytest.mark.parametrize("protocol", ["openai-chat", "openai-responses", "anthropic"])
@asynctest
async def test_a_surrogate_pair_split_across_tool_argument_deltas_is_joined(protocol):
    arguments = '{"q":"\ud83d\ude00"}'  # two code points for the emoji: the pieces split them
    with FakeServer(protocol) as server:
        server.add(Reply(tool_calls=[ToolCall("call_1", "clock", arguments, pieces=len(arguments))]), Reply(text="ok"))
        model = make(protocol, server, retry=None)
        loop = await run(model, "go", tools=[clock])
        [call] = [c for c in chunks(loop.log) if c["type"] == "tool-call"]
        assert json.loads(call["arguments"]) == {"q": GRIN}
        await done(loop, model)


def malformed(protocol):
    """A stream whose second event is not JSON."""
    if protocol == "anthropic":
        start = (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": "m",
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 1, "output_tokens": 1},
                },
            },
        )
        return Raw(headers={"content-type": "text/event-stream"}, body=[start, ("content_block_start", "{not json")])
    if protocol == "gemini":
        return Raw(headers={"content-type": "text/event-stream"}, body=["{not json"])
    return Raw(headers={"content-type": "text/event-stream"}, body=["{not json"])


@pytest.mark.parametrize("protocol", PROTOCOLS)
@asynctest
async def test_a_malformed_event_is_a_stream_interruption_on_every_protocol(protocol):
    with FakeServer(protocol) as server:
        server.add(malformed(protocol))
        model = make(protocol, server, retry=None)
        loop = await run(model, "go")
        error = failure(loop.log)
        assert error["code"] == "STREAM_INTERRUPTED", error
        assert error["message"].startswith(f"{protocol}: malformed event in the stream"), error["message"]
        await done(loop, model)


def json_error(protocol):
    if protocol == "gemini":  # Gemini's own error shape
        return {"error": {"code": 401, "message": "API key not valid. Please pass a valid API key.", "status": "UNAUTHENTICATED"}}
    return {"error": {"message": "Incorrect API key provided: sk-bad.", "type": "invalid_request_error", "code": "invalid_api_key"}}


@pytest.mark.parametrize("protocol", PROTOCOLS)
@asynctest
async def test_a_200_with_a_json_error_body_keeps_the_servers_message(protocol):
    body = json_error(protocol)
    with FakeServer(protocol) as server:
        server.add(Raw(headers={"content-type": "application/json"}, body=json.dumps(body)))
        model = make(protocol, server, retry=None)
        loop = await run(model, "go")
        error = failure(loop.log)
        assert error["code"] == "AUTHENTICATION_FAILED", error
        assert body["error"]["message"] in error["message"] and error["message"].startswith(protocol + ": ")
        assert len(server.requests) == 1
        await done(loop, model)


HTML = (
    "<html><head><title>502 Bad Gateway</title><style>body { color: red }</style></head>"
    "<body><h1>502 Bad Gateway</h1>" + "<p>nginx</p>" * 5000 + "</body></html>"
)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@asynctest
async def test_a_200_with_an_html_page_is_a_server_error_quoting_its_title(protocol):
    with FakeServer(protocol) as server:
        server.add(Raw(headers={"content-type": "text/html; charset=utf-8"}, body=HTML))
        model = make(protocol, server, retry=None)
        loop = await run(model, "go")
        error = failure(loop.log)
        assert error["code"] == "SERVER_ERROR", error
        assert "502 Bad Gateway" in error["message"] and error["message"].startswith(protocol + ": ")
        assert len(error["message"]) < 600 and "nginx" not in error["message"]
        await done(loop, model)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@asynctest
async def test_a_non_streamed_request_answered_by_a_json_error_or_a_page_is_classified_too(protocol):
    body = json_error(protocol)
    with FakeServer(protocol) as server:
        server.add(
            Raw(headers={"content-type": "application/json"}, body=json.dumps(body)), Raw(headers={"content-type": "text/html"}, body=HTML)
        )
        model = make(protocol, server, retry=None, stream=False)
        loop = await run(model, "go")
        error = failure(loop.log)
        if protocol == "gemini":  # the SDK drops a body it does not know: only its absence shows
            assert error["code"] == "SERVER_ERROR" and "no candidates" in error["message"], error
        else:
            assert error["code"] == "AUTHENTICATION_FAILED" and body["error"]["message"] in error["message"], error
        await run(model, "again", loop=loop)
        error = failure(loop.log)
        assert error["code"] == "SERVER_ERROR" and error["message"].startswith(protocol + ": "), error
        if protocol != "gemini":
            assert "502 Bad Gateway" in error["message"]
        await done(loop, model)


@asynctest
async def test_a_stream_that_ends_without_its_stop_reason_is_interrupted_on_anthropic_as_on_openai():
    def event(name, **data):
        return (name, dict(type=name, **data))

    anthropic = Raw(
        headers={"content-type": "text/event-stream"},
        body=[
            event(
                "message_start",
                message={
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": "m",
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 5, "output_tokens": 1},
                },
            ),
            event("content_block_start", index=0, content_block={"type": "text", "text": ""}),
            event("content_block_delta", index=0, delta={"type": "text_delta", "text": "Half a rep"}),
            event("content_block_stop", index=0),
            event("message_stop"),
        ],
    )
    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    openai = Raw(
        headers={"content-type": "text/event-stream"},
        body=[dict(base, choices=[{"index": 0, "delta": {"content": "Half a rep"}, "finish_reason": None}]), "[DONE]"],
    )
    for protocol, stream in (("anthropic", anthropic), ("openai-chat", openai)):
        with FakeServer(protocol) as server:
            server.add(stream)
            model = make(protocol, server, retry=None)
            loop = await run(model, "go")
            assert failure(loop.log)["code"] == "STREAM_INTERRUPTED", protocol
            await done(loop, model)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(
    "key,problem",
    [
        ("sk-test-0123456789\n", "ends with '\\n'"),
        ("  sk-test-0123456789", "starts with ' '"),
        ("sk-test-01234\x0056789", "contains '\\x00' at position 13"),
    ],
)
def test_an_api_key_with_whitespace_or_control_characters_is_refused_when_the_provider_is_built(protocol, key, problem):
    with pytest.raises(ValueError) as caught:
        CLASSES[protocol]("fake-model", api_key=key, base_url="http://127.0.0.1:9")
    message = str(caught.value)
    assert problem in message and "API key" in message
    assert "0123456789" not in message and "01234" not in message


@pytest.mark.parametrize("protocol,variable", [("openai-chat", "OPENAI_API_KEY"), ("anthropic", "ANTHROPIC_API_KEY")])
# (google-genai strips the key it reads from GEMINI_API_KEY itself.)
def test_a_key_from_the_environment_is_checked_too(protocol, variable, monkeypatch):
    monkeypatch.setenv(variable, "sk-env-0123456789\r\n")
    with pytest.raises(ValueError, match="from the environment") as caught:
        CLASSES[protocol]("fake-model", base_url="http://127.0.0.1:9")
    assert "0123456789" not in str(caught.value)


def test_the_reply_builder_keeps_deltas_in_a_list_until_the_block_ends():
    # Linear, whatever the reply's length: a delta is appended to a list (no copy of the text
    # so far); the block's text is joined once, when the block ends or is read.
    from kerman.providers import ReplyBuilder

    builder = ReplyBuilder()
    for piece in ("a", "b", "c"):
        builder.delta("text", piece)
    assert builder._parts == ["a", "b", "c"] and builder._blocks == [{"type": "text", "text": ""}]
    builder.delta("reasoning", "r")
    assert builder._blocks[0] == {"type": "text", "text": "abc"} and builder._parts == ["r"]
    assert builder.blocks == [{"type": "text", "text": "abc"}, {"type": "reasoning", "text": "r"}]
