"""Messages (SPEC 2.1, reference section 1): frozen, identified values."""

from __future__ import annotations

import asyncio
import copy
import json
import pickle
import time
import uuid

import pytest

import kerman
from kerman import AssistantMessage, InvalidMessageError, Message, ToolResultMessage, UserMessage


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def uuid7_ms(text: str) -> int:
    """The Unix-ms timestamp of a UUIDv7 (its first 48 bits)."""
    return uuid.UUID(text).int >> 80


# ---------------------------------------------------------------------------------------------
# Construction and defaults


def test_user_message_from_str_is_one_text_block_with_user_source():
    m = UserMessage("hello")
    assert m.role == "user"
    assert m.content == [{"type": "text", "text": "hello"}]
    assert m.source == {"kind": "user"}
    assert m.text == "hello"
    assert isinstance(m, Message)
    assert type(m) is UserMessage


def test_user_message_from_blocks_with_source_and_id():
    m = UserMessage([{"type": "text", "text": "x"}], source={"kind": "plugin", "plugin": "guard"}, id="m-1")
    assert m.id == "m-1"
    assert m.role == "user"
    assert m.content == [{"type": "text", "text": "x"}]
    assert m.source == {"kind": "plugin", "plugin": "guard"}


def test_user_message_empty_string_and_empty_list():
    assert UserMessage("").content == [{"type": "text", "text": ""}]
    empty = UserMessage([])
    assert empty.content == []
    assert empty.text == ""


def test_assistant_message_defaults_to_model_source():
    m = AssistantMessage("answer")
    assert m.role == "assistant"
    assert m.source == {"kind": "model"}
    assert m.content == [{"type": "text", "text": "answer"}]
    assert type(m) is AssistantMessage and isinstance(m, Message)


def test_assistant_message_keeps_a_full_model_source():
    src = {"kind": "model", "provider": "acme", "model": "m-1", "replayState": {"opaque": [1, 2]}}
    m = AssistantMessage("x", source=src)
    assert m.source == src


def test_assistant_message_requires_model_source_kind():
    with pytest.raises(InvalidMessageError) as exc:
        AssistantMessage("x", source={"kind": "user"})
    assert exc.value.field == "source.kind"


def test_assistant_message_tool_calls_are_the_tool_call_blocks():
    calls = [
        {"type": "tool-call", "id": "c1", "name": "read", "arguments": "{}"},
        {"type": "tool-call", "id": "c2", "name": "write", "arguments": '{"x":1}'},
    ]
    m = AssistantMessage([{"type": "text", "text": "let me"}, calls[0], {"type": "reasoning", "text": "r"}, calls[1]])
    assert m.tool_calls == calls
    got = m.tool_calls
    got[0]["name"] = "changed"
    assert m.tool_calls == calls


def test_tool_result_message_shape():
    m = ToolResultMessage("call-1", "done")
    assert m.role == "user"
    assert m.call_id == "call-1"
    assert m.is_error is False
    assert m.source == {"kind": "tool", "callId": "call-1"}
    assert m.content == [{"type": "tool-result", "toolCallId": "call-1", "content": [{"type": "text", "text": "done"}]}]
    assert type(m) is ToolResultMessage and isinstance(m, Message)


def test_tool_result_message_error_flag_and_block_content():
    m = ToolResultMessage("c", [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], is_error=True, id="t-1")
    assert m.id == "t-1"
    assert m.is_error is True
    [block] = m.content
    assert block["isError"] is True
    assert block["toolCallId"] == "c"
    assert block["content"] == [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]


def test_a_tool_results_text_is_the_text_of_what_the_tool_returned():
    # The text lives in the tool-result block's own content; `.text` reads it there.
    assert ToolResultMessage("c", "12:00").text == "12:00"
    m = ToolResultMessage(
        "c", [{"type": "text", "text": "a"}, {"type": "image", "ref": "i"}, {"type": "text", "text": "b"}], is_error=True, id="t-1"
    )
    assert m.text == "a\nb"
    assert ToolResultMessage("c", []).text == ""
    assert Message.from_dict(m.to_dict()).text == "a\nb"
    assert repr(ToolResultMessage("c-1", "r", id="t-1")) == "ToolResultMessage(id='t-1', call_id='c-1', text='r')"
    # Reading the text changes nothing that is logged.
    assert m.to_dict()["content"] == [
        {
            "type": "tool-result",
            "toolCallId": "c",
            "content": [{"type": "text", "text": "a"}, {"type": "image", "ref": "i"}, {"type": "text", "text": "b"}],
            "isError": True,
        }
    ]
    # A user message carrying a tool-result-shaped block is not a tool result.
    assert UserMessage([{"type": "tool-result", "toolCallId": "c", "content": [{"type": "text", "text": "x"}]}]).text == ""


def test_a_tool_results_text_reaches_the_model_and_the_logged_record_is_unchanged(tmp_path):
    seen = []

    async def model(request: kerman.ModelRequest) -> kerman.ModelReply:
        results = [m for m in request.messages if isinstance(m, ToolResultMessage)]
        if not results:
            return kerman.ModelReply([{"type": "tool-call", "id": "c1", "name": "clock", "arguments": "{}"}])
        seen.append(results[-1].text)
        return kerman.ModelReply("ok")

    async def main() -> str:
        log = kerman.FileStore(tmp_path, durability="none").create("s")
        loop = kerman.AgentLoop(model, log=log)

        @loop.tool
        async def clock(args, ctx):
            return "12:00"

        loop.followup("time?")
        await loop.when_idle()
        [result] = log.events(types="tool/result")
        await loop.aclose()
        log.close()
        return result.to_json()

    record = asyncio.run(main())
    assert seen == ["12:00"]
    # The tool/result record as the format writes it (docs/format.md), byte for byte.
    data = json.loads(record)["data"]
    message_id = data["message"]["id"]
    assert record.split(',"data":', 1)[1] == (
        '{"turn":1,"step":1,"message":{"id":"%s","role":"user","content":[{"type":"tool-result",'
        '"toolCallId":"c1","content":[{"type":"text","text":"12:00"}]}],"source":{"kind":"tool",'
        '"callId":"c1"}}},"sourceEventSeqs":[%d],"surfaceOp":"append"}' % (message_id, json.loads(record)["seq"] - 1)
    )


def test_user_message_cannot_claim_a_tool_source():
    with pytest.raises(InvalidMessageError) as exc:
        UserMessage("x", source={"kind": "tool", "callId": "c"})
    assert exc.value.field == "source.kind"


# ---------------------------------------------------------------------------------------------
# Ids


def test_minted_ids_are_uuid7_text():
    before = now_ms()
    msgs = [UserMessage("a"), AssistantMessage("b"), ToolResultMessage("c", "d"), UserMessage([])]
    after = now_ms()
    for m in msgs:
        u = uuid.UUID(m.id)
        assert str(u) == m.id  # canonical lowercase 8-4-4-4-12
        assert u.version == 7
        assert u.variant == uuid.RFC_4122
        assert before <= uuid7_ms(m.id) <= after


def test_minted_ids_are_unique_and_time_ordered():
    ids = [UserMessage("x").id for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    stamps = [uuid7_ms(i) for i in ids]
    assert stamps == sorted(stamps)


def test_given_ids_are_opaque():
    for given in ["m-1", "legacy-message:s:3", "é ü/..", "x" * 500]:
        assert UserMessage("x", id=given).id == given


# ---------------------------------------------------------------------------------------------
# Immutability


@pytest.mark.parametrize("attr", ["id", "role", "content", "source", "text", "brand_new"])
def test_messages_are_frozen(attr):
    m = UserMessage("hi", id="m-1")
    with pytest.raises((AttributeError, TypeError)):
        setattr(m, attr, "changed")
    assert m.id == "m-1" and m.text == "hi"


def test_attributes_cannot_be_deleted():
    m = UserMessage("hi")
    with pytest.raises((AttributeError, TypeError)):
        del m.id
    assert m.text == "hi"


def test_content_and_source_are_fresh_copies():
    m = UserMessage([{"type": "text", "text": "a", "meta": {"k": [1]}}], source={"kind": "plugin", "plugin": "p"})
    c = m.content
    c[0]["text"] = "mutated"
    c[0]["meta"]["k"].append(2)
    c.append({"type": "text", "text": "extra"})
    s = m.source
    s["plugin"] = "other"
    s["added"] = True
    assert m.content == [{"type": "text", "text": "a", "meta": {"k": [1]}}]
    assert m.source == {"kind": "plugin", "plugin": "p"}
    assert m.text == "a"
    assert m.content is not m.content
    assert m.source is not m.source


def test_to_dict_is_a_fresh_copy():
    m = UserMessage("a", id="m")
    d = m.to_dict()
    d["content"][0]["text"] = "b"
    d["id"] = "other"
    assert m.to_dict() == {"id": "m", "role": "user", "content": [{"type": "text", "text": "a"}], "source": {"kind": "user"}}


def test_constructor_does_not_alias_its_arguments():
    blocks = [{"type": "text", "text": "a"}]
    source = {"kind": "plugin", "plugin": "p", "cfg": {"x": 1}}
    m = UserMessage(blocks, source=source)
    blocks[0]["text"] = "b"
    blocks.append({"type": "text", "text": "c"})
    source["cfg"]["x"] = 2
    assert m.content == [{"type": "text", "text": "a"}]
    assert m.source == {"kind": "plugin", "plugin": "p", "cfg": {"x": 1}}


def test_from_dict_does_not_alias_its_argument():
    d = {"id": "m", "role": "user", "content": [{"type": "text", "text": "a"}], "source": {"kind": "user"}}
    m = Message.from_dict(d)
    d["content"][0]["text"] = "b"
    assert m.text == "a"


# ---------------------------------------------------------------------------------------------
# text and with_content


def test_text_joins_text_blocks_with_newline():
    m = UserMessage(
        [
            {"type": "text", "text": "one"},
            {"type": "reasoning", "text": "hidden"},
            {"type": "image", "attachment": {"id": "img"}},
            {"type": "text", "text": "two"},
            {"type": "tool-call", "id": "c", "name": "n", "arguments": "{}"},
            {"type": "text", "text": ""},
            {"type": "text", "text": "three"},
        ]
    )
    assert m.text == "one\ntwo\n\nthree"


def test_text_without_text_blocks_is_empty():
    assert UserMessage([{"type": "reasoning", "text": "r"}]).text == ""


def test_with_content_keeps_id_source_and_class():
    m = UserMessage("old", source={"kind": "plugin", "plugin": "g"}, id="m-7")
    r = m.with_content("new")
    assert type(r) is UserMessage
    assert r.id == "m-7"
    assert r.source == {"kind": "plugin", "plugin": "g"}
    assert r.content == [{"type": "text", "text": "new"}]
    assert m.content == [{"type": "text", "text": "old"}]  # the original is unchanged
    assert r != m


def test_with_content_accepts_blocks_and_keeps_subclass():
    a = AssistantMessage("x", source={"kind": "model", "provider": "p", "model": "m"}, id="a-1")
    r = a.with_content([{"type": "text", "text": "y"}, {"type": "tool-call", "id": "c", "name": "n", "arguments": "{}"}])
    assert type(r) is AssistantMessage
    assert r.id == "a-1"
    assert r.source == a.source
    assert r.text == "y"


def test_with_content_validates():
    m = UserMessage("x")
    with pytest.raises(InvalidMessageError) as exc:
        m.with_content([{"type": "text", "text": 1}])
    assert exc.value.field == "content[0].text"


def test_with_same_content_is_equal():
    m = UserMessage("same", id="i")
    assert m.with_content("same") == m


# ---------------------------------------------------------------------------------------------
# Value semantics


def test_equality_is_by_value():
    a = UserMessage("x", id="i")
    b = UserMessage([{"type": "text", "text": "x"}], source={"kind": "user"}, id="i")
    assert a == b
    assert not (a != b)
    assert hash(a) == hash(b)
    assert a != UserMessage("x", id="j")
    assert a != UserMessage("y", id="i")
    assert a != UserMessage("x", id="i", source={"kind": "plugin", "plugin": ""})


def test_equality_and_hash_ignore_dict_key_order():
    a = UserMessage([{"type": "text", "text": "x", "meta": {"a": 1, "b": 2}}], source={"kind": "plugin", "plugin": "p", "z": 1}, id="i")
    b = UserMessage([{"meta": {"b": 2, "a": 1}, "text": "x", "type": "text"}], source={"z": 1, "plugin": "p", "kind": "plugin"}, id="i")
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b}) == 1
    assert {a: 1}[b] == 1


def test_list_order_matters():
    a = UserMessage([{"type": "text", "text": "1"}, {"type": "text", "text": "2"}], id="i")
    b = UserMessage([{"type": "text", "text": "2"}, {"type": "text", "text": "1"}], id="i")
    assert a != b


def test_classes_are_distinguished():
    u = UserMessage([{"type": "text", "text": "x"}], id="i")
    a = AssistantMessage([{"type": "text", "text": "x"}], id="i")
    assert u != a


def test_message_is_not_equal_to_its_dict():
    m = UserMessage("x", id="i")
    assert m != m.to_dict()
    assert m != "x"


def test_messages_are_usable_in_sets():
    ms = {UserMessage("x", id="1"), UserMessage("x", id="1"), UserMessage("x", id="2")}
    assert len(ms) == 2


# ---------------------------------------------------------------------------------------------
# to_dict / from_dict


def test_to_dict_shape():
    m = UserMessage("hi", id="u")
    assert m.to_dict() == {"id": "u", "role": "user", "content": [{"type": "text", "text": "hi"}], "source": {"kind": "user"}}
    a = AssistantMessage("yo", id="a")
    assert a.to_dict() == {"id": "a", "role": "assistant", "content": [{"type": "text", "text": "yo"}], "source": {"kind": "model"}}


@pytest.mark.parametrize(
    "make",
    [
        lambda: UserMessage("hello", id="u-1"),
        lambda: UserMessage(
            [{"type": "text", "text": "x"}], source={"kind": "plugin", "plugin": "guard", "form": "notice", "summary": "s"}
        ),
        lambda: AssistantMessage(
            [{"type": "reasoning", "text": "think"}, {"type": "tool-call", "id": "c", "name": "n", "arguments": "{}"}],
            source={"kind": "model", "provider": "p", "model": "m"},
        ),
        lambda: ToolResultMessage("c-9", "out", is_error=True),
        lambda: ToolResultMessage("c-9", [{"type": "text", "text": "fine"}]),
    ],
    ids=["user", "plugin-user", "assistant", "tool-error", "tool"],
)
def test_to_dict_from_dict_round_trip(make):
    m = make()
    back = Message.from_dict(m.to_dict())
    assert type(back) is type(m)
    assert back.id == m.id
    assert back == m
    assert hash(back) == hash(m)
    assert back.to_dict() == m.to_dict()


def test_from_dict_classifies_by_role_and_source():
    base = {"id": "x", "content": []}
    assert type(Message.from_dict({**base, "role": "user", "source": {"kind": "user"}})) is UserMessage
    assert type(Message.from_dict({**base, "role": "assistant", "source": {"kind": "model"}})) is AssistantMessage
    tool = ToolResultMessage("c", "r", id="x").to_dict()
    assert type(Message.from_dict(tool)) is ToolResultMessage


def test_from_dict_keeps_id_instead_of_minting():
    m = Message.from_dict({"id": "keep-me", "role": "user", "content": [], "source": {"kind": "user"}})
    assert m.id == "keep-me"


def test_unknown_blocks_source_kinds_and_extra_fields_are_preserved_verbatim():
    content = [
        {"type": "widget", "payload": {"deep": [1, 2.5, None, True, {"s": "é😀"}]}, "n": -(2**63)},
        {"type": "text", "text": "t", "cacheControl": {"ttl": 300}},
        {"type": "image", "attachment": {"id": "att-1", "mime": "image/png"}},
        {"type": "tool-call", "id": "c", "name": "n", "arguments": '{"a": 1}', "providerMeta": {"x": 2**64 - 1}},
    ]
    source = {
        "kind": "agent-instructions",
        "form": "instructions",
        "baseline": None,
        "changes": [{"op": "add", "text": "be brief"}],
        "plugin": "",
    }
    m = UserMessage(content, source=source, id="v")
    assert m.content == content
    assert m.source == source
    back = Message.from_dict(m.to_dict())
    assert back.content == content and back.source == source
    again = pickle.loads(pickle.dumps(m))
    assert again.content == content and again.source == source
    # types survive: bools stay bools, floats stay floats, ints stay ints
    p = back.content[0]["payload"]["deep"]
    assert type(p[1]) is float and p[3] is True and type(p[0]) is int
    assert back.content[3]["providerMeta"]["x"] == 2**64 - 1


def test_key_order_is_preserved_verbatim():
    m = UserMessage([{"text": "x", "type": "text", "extra": {"z": 1, "a": 2}}], source={"z": 1, "kind": "plugin", "plugin": "p"})
    [block] = m.content
    assert list(block) == ["text", "type", "extra"]
    assert list(block["extra"]) == ["z", "a"]
    assert list(m.source) == ["z", "kind", "plugin"]


# A message of one text block (a str, or [{"type": "text", "text": ...}] with its keys in that
# order, as ModelReply makes it) is written as JSON text at once and parsed only when read; the
# cases below pin that it is indistinguishable from one built from its blocks.

ONE_BLOCK = [("user", UserMessage), ("assistant", AssistantMessage)]


@pytest.mark.parametrize("role,cls", ONE_BLOCK)
@pytest.mark.parametrize("text", ["", "hi", 'quote " backslash \\ \n\t\x01 \u2028 \U0001f600'])
def test_one_text_block_messages_match_the_general_path(role, cls, text):
    log = kerman.MemoryStore().create()
    shorthand = cls(text, id="m-1")
    listed = cls([{"type": "text", "text": text}], id="m-1")
    # from_dict never takes the shortcut: the general path, for reference.
    general = Message.from_dict(
        {"id": "m-1", "role": role, "content": [{"type": "text", "text": text}], "source": {"kind": "user" if role == "user" else "model"}}
    )
    assert type(general) is cls
    for m in (shorthand, listed):
        assert m == general and hash(m) == hash(general)
        assert m.to_dict() == general.to_dict()
        assert list(m.to_dict()) == ["id", "role", "content", "source"]
        assert m.content == [{"type": "text", "text": text}] and m.text == text
        assert m.source == {"kind": "user" if role == "user" else "model"}
        assert repr(m) == repr(general)
    for m in (shorthand, listed, general):
        log.append("x/message", {"m": m.to_dict()})
    texts = [e.to_json().split('"data":', 1)[1] for e in log]
    assert texts[0] == texts[1] == texts[2]


@pytest.mark.parametrize("role,cls", ONE_BLOCK)
def test_a_text_block_with_other_key_order_or_fields_keeps_them(role, cls):
    swapped = cls([{"text": "x", "type": "text"}], id="m-1")
    assert list(swapped.content[0]) == ["text", "type"]
    extra = cls([{"type": "text", "text": "x", "cache": True}], id="m-1")
    assert extra.content == [{"type": "text", "text": "x", "cache": True}]
    assert swapped != extra


@pytest.mark.parametrize("role,cls", ONE_BLOCK)
def test_one_text_block_messages_validate_like_the_general_path(role, cls):
    with pytest.raises(InvalidMessageError) as err:
        cls("bad \ud800 surrogate")
    assert err.value.field == "content[0].text"
    with pytest.raises(InvalidMessageError) as err:
        cls([{"type": "text", "text": "x"}], id="")
    assert err.value.field == "id"
    with pytest.raises(InvalidMessageError) as err:
        cls([{"type": "text", "text": 3}])
    assert err.value.field == "content[0].text"


async def _logged_reply(content):
    seen = []

    async def model(request):
        seen.append(list(request.messages))
        return kerman.ModelReply(content)

    loop = kerman.AgentLoop(model)
    loop.followup("hi")
    await loop.when_idle()
    loop.followup("again")
    await loop.when_idle()
    first = next(iter(loop.log.events(types="assistant/message")))
    # The second request's history holds the first reply as the loop kept it.
    return first.data["message"], seen[1][1]


def test_a_str_reply_logs_and_keeps_the_same_message_as_its_blocks():
    import asyncio

    said, kept = asyncio.run(_logged_reply("The answer."))
    # Keys in the other order: the general path (the logged block keeps that order).
    said_blocks, kept_blocks = asyncio.run(_logged_reply([{"text": "The answer.", "type": "text"}]))
    assert list(said_blocks["content"][0]) == ["text", "type"]
    assert list(said) == list(said_blocks) == ["id", "role", "content", "source"]
    assert said["content"] == said_blocks["content"] == [{"type": "text", "text": "The answer."}]
    assert said["source"] == said_blocks["source"] == {"kind": "model"}
    for message, logged in ((kept, said), (kept_blocks, said_blocks)):
        assert type(message) is AssistantMessage and message.to_dict() == logged


def test_plugin_source_with_empty_plugin_name_is_kept():
    m = UserMessage("x", source={"kind": "plugin", "plugin": ""})
    assert m.source == {"kind": "plugin", "plugin": ""}


# ---------------------------------------------------------------------------------------------
# Validation: InvalidMessageError naming the field


def test_invalid_message_error_is_a_value_error():
    assert issubclass(InvalidMessageError, ValueError)
    assert issubclass(InvalidMessageError, kerman.KermanError)
    assert kerman.errors.InvalidMessageError is InvalidMessageError


class Opaque:
    pass


NAN = float("nan")
INF = float("inf")

CONSTRUCTOR_CASES = [
    ("empty-id", lambda: UserMessage("x", id=""), "id"),
    ("int-id", lambda: UserMessage("x", id=3), "id"),
    ("bytes-id", lambda: UserMessage("x", id=b"m"), "id"),
    ("assistant-empty-id", lambda: AssistantMessage("x", id=""), "id"),
    ("tool-empty-id", lambda: ToolResultMessage("c", "x", id=""), "id"),
    ("content-int", lambda: UserMessage(5), "content"),
    ("content-dict", lambda: UserMessage({"type": "text", "text": "x"}), "content"),
    ("content-tuple", lambda: UserMessage(({"type": "text", "text": "x"},)), "content"),
    ("content-none", lambda: UserMessage(None), "content"),
    ("text-int", lambda: UserMessage([{"type": "text", "text": 1}]), "content[0].text"),
    ("text-missing", lambda: UserMessage([{"type": "text"}]), "content[0].text"),
    ("second-block-text-int", lambda: UserMessage([{"type": "text", "text": "ok"}, {"type": "text", "text": 2}]), "content[1].text"),
    ("reasoning-text-list", lambda: UserMessage([{"type": "reasoning", "text": ["x"]}]), "content[0].text"),
    ("block-not-dict", lambda: UserMessage(["x"]), "content[0]"),
    ("block-type-missing", lambda: UserMessage([{"text": "x"}]), "content[0].type"),
    ("block-type-int", lambda: UserMessage([{"type": 3}]), "content[0].type"),
    ("tool-call-no-arguments", lambda: AssistantMessage([{"type": "tool-call", "id": "c", "name": "n"}]), "content[0].arguments"),
    (
        "tool-call-dict-arguments",
        lambda: AssistantMessage([{"type": "tool-call", "id": "c", "name": "n", "arguments": {}}]),
        "content[0].arguments",
    ),
    ("tool-result-content-str", lambda: UserMessage([{"type": "tool-result", "toolCallId": "c", "content": "x"}]), "content[0].content"),
    (
        "nested-tool-result-text",
        lambda: UserMessage([{"type": "tool-result", "toolCallId": "c", "content": [{"type": "text", "text": None}]}]),
        "content[0].content[0].text",
    ),
    ("nan-text", lambda: UserMessage([{"type": "text", "text": NAN}]), "content[0].text"),
    ("nan-extra", lambda: UserMessage([{"type": "text", "text": "x", "score": NAN}]), "content[0].score"),
    ("inf-extra", lambda: UserMessage([{"type": "x", "v": INF}]), "content[0].v"),
    ("neg-inf-source", lambda: UserMessage("x", source={"kind": "plugin", "plugin": "p", "w": -INF}), "source.w"),
    ("non-str-key-content", lambda: UserMessage([{"type": "x", 1: "a"}]), "content[0]"),
    ("non-str-key-source", lambda: UserMessage("x", source={"kind": "user", 1: 2}), "source"),
    ("set-in-content", lambda: UserMessage([{"type": "x", "s": {1, 2}}]), "content[0].s"),
    ("tuple-in-source", lambda: UserMessage("x", source={"kind": "plugin", "plugin": "p", "t": (1, 2)}), "source.t"),
    ("object-in-content", lambda: UserMessage([{"type": "x", "o": Opaque()}]), "content[0].o"),
    ("object-as-block", lambda: UserMessage([Opaque()]), "content[0]"),
    ("source-not-dict", lambda: UserMessage("x", source=["user"]), "source"),
    ("source-no-kind", lambda: UserMessage("x", source={"plugin": "p"}), "source.kind"),
    ("source-empty-kind", lambda: UserMessage("x", source={"kind": ""}), "source.kind"),
]


@pytest.mark.parametrize("make, field", [c[1:] for c in CONSTRUCTOR_CASES], ids=[c[0] for c in CONSTRUCTOR_CASES])
def test_malformed_messages_raise_invalid_message_error_naming_the_field(make, field):
    with pytest.raises(InvalidMessageError) as exc:
        make()
    assert isinstance(exc.value, ValueError)
    assert exc.value.field == field
    assert field in str(exc.value)


def _valid_dict(**over):
    d = {"id": "m", "role": "user", "content": [{"type": "text", "text": "x"}], "source": {"kind": "user"}}
    d.update(over)
    return d


FROM_DICT_CASES = [
    ("empty-id", _valid_dict(id=""), "id"),
    ("int-id", _valid_dict(id=7), "id"),
    ("missing-id", {k: v for k, v in _valid_dict().items() if k != "id"}, "id"),
    ("role-system", _valid_dict(role="system"), "role"),
    ("role-tool", _valid_dict(role="tool"), "role"),
    ("role-int", _valid_dict(role=1), "role"),
    ("content-str", _valid_dict(content="hello"), "content"),
    ("content-dict", _valid_dict(content={"type": "text", "text": "x"}), "content"),
    ("content-nan", _valid_dict(content=[{"type": "text", "text": NAN}]), "content[0].text"),
    ("content-text-int", _valid_dict(content=[{"type": "text", "text": 5}]), "content[0].text"),
    ("source-str", _valid_dict(source="user"), "source"),
    ("source-set", _valid_dict(source={"kind": "user", "tags": {"a"}}), "source.tags"),
    ("assistant-user-source", _valid_dict(role="assistant", source={"kind": "user"}), "source.kind"),
]


@pytest.mark.parametrize("data, field", [c[1:] for c in FROM_DICT_CASES], ids=[c[0] for c in FROM_DICT_CASES])
def test_from_dict_rejects_malformed_input(data, field):
    with pytest.raises(InvalidMessageError) as exc:
        Message.from_dict(data)
    assert exc.value.field == field


def test_from_dict_of_a_non_dict():
    for bad in (["id"], "message", 3, None):
        with pytest.raises(InvalidMessageError):
            Message.from_dict(bad)


def test_tool_result_dict_with_mismatched_call_id_is_rejected():
    d = ToolResultMessage("c1", "x", id="t").to_dict()
    d["source"]["callId"] = "c2"
    with pytest.raises(InvalidMessageError) as exc:
        Message.from_dict(d)
    assert exc.value.field == "content[0].toolCallId"


# ---------------------------------------------------------------------------------------------
# Pickle, copy, repr


@pytest.mark.parametrize(
    "m",
    [
        UserMessage("hi", id="u"),
        UserMessage([{"type": "custom", "x": [1, {"y": None}]}], source={"kind": "plugin", "plugin": "p"}),
        AssistantMessage(
            [{"type": "tool-call", "id": "c", "name": "n", "arguments": "{}"}], source={"kind": "model", "provider": "p", "model": "m"}
        ),
        ToolResultMessage("c", "r", is_error=True),
    ],
    ids=["user", "plugin", "assistant", "tool"],
)
def test_pickle_round_trip(m):
    for proto in range(2, pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(m, protocol=proto))
        assert type(back) is type(m)
        assert back == m
        assert back.id == m.id
        assert back.to_dict() == m.to_dict()


def test_copy_and_deepcopy_are_equal():
    m = UserMessage("x", source={"kind": "plugin", "plugin": "p"})
    assert copy.copy(m) == m
    assert copy.deepcopy(m) == m
    assert type(copy.deepcopy(m)) is UserMessage


def test_repr_of_a_user_message():
    assert repr(UserMessage("hi", id="m-1")) == "UserMessage(id='m-1', text='hi')"


def test_repr_uses_python_quoting():
    r = repr(UserMessage("it's", id="a'b"))
    assert r == "UserMessage(id=" + repr("a'b") + ", text=" + repr("it's") + ")"


def test_repr_of_other_kinds_names_class_and_id():
    a = AssistantMessage("ok", id="a-1")
    assert repr(a) == "AssistantMessage(id='a-1', text='ok')"
    t = ToolResultMessage("c-1", "r", id="t-1")
    assert repr(t).startswith("ToolResultMessage(id='t-1'")
    assert "call_id='c-1'" in repr(t)


def test_repr_shows_a_non_user_source():
    r = repr(UserMessage("x", source={"kind": "plugin", "plugin": "guard"}, id="p"))
    assert r.startswith("UserMessage(id='p', text='x'")
    assert "'plugin': 'guard'" in r


def test_repr_shortens_long_text():
    r = repr(UserMessage("x" * 1000, id="i"))
    assert len(r) < 200
    assert r.startswith("UserMessage(id='i', text='xxx")
