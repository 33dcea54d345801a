"""Rich reprs (issue 15 part 2): every object a notebook shows has a readable plain ``repr`` and a
``_repr_html_`` that escapes what users, models and logs wrote and stays bounded however big the
object is. The HTML is parsed (``html.parser``) rather than searched, so "inert" means no element
came out of user text."""

from __future__ import annotations

import asyncio
import re
from html.parser import HTMLParser
from typing import Any, List, Tuple

import pytest

import kerman
from kerman import AgentLoop, AssistantMessage, InboxProjection, MemoryStore, ModelReply, ToolResultMessage, UserMessage
from kerman.models import ScriptedModel

HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>&amp;'


class Tags(HTMLParser):
    """The start tags of a document and its text."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: List[Tuple[str, List[Tuple[str, Any]]]] = []
        self.text: List[str] = []

    def handle_starttag(self, tag: str, attrs: List[Tuple[str, Any]]) -> None:
        self.tags.append((tag, attrs))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(html: str) -> Tags:
    tags = Tags()
    tags.feed(html)
    tags.close()
    return tags


def assert_inert(html: str) -> None:
    """No element or attribute came from HOSTILE, and its text reads back verbatim."""
    tags = parse(html)
    names = {tag for tag, _ in tags.tags}
    assert "script" not in names and "img" not in names
    assert not any(name.startswith("on") for _, attrs in tags.tags for name, _ in attrs)
    assert "<script>alert(" in "".join(tags.text)


def run_turn(texts: List[Any], prompt: str = "hi", tools: Tuple[kerman.Tool, ...] = ()) -> AgentLoop:
    loop = AgentLoop(ScriptedModel(texts), tools=tools)

    async def main() -> None:
        loop.followup(prompt)
        await loop.when_idle()

    asyncio.run(main())
    return loop


# ---- messages ---------------------------------------------------------------------------------


def test_message_reprs_name_role_text_and_tool_calls():
    call = {"type": "tool-call", "id": "c-1", "name": "add", "arguments": '{"a": 1}'}
    a = AssistantMessage([{"type": "text", "text": "adding"}, call], id="a-1")
    assert repr(a) == "AssistantMessage(id='a-1', text='adding', tool_calls=['add'])"
    assert repr(AssistantMessage([call], id="a-2")) == "AssistantMessage(id='a-2', content=[tool-call])"
    html = a._repr_html_()
    text = "".join(parse(html).text)
    assert "assistant" in text and "adding" in text and "add" in text and '{"a": 1}' in text
    tool = ToolResultMessage("c-1", "2", is_error=True, id="t-1")
    text = "".join(parse(tool._repr_html_()).text)
    assert "tool" in text and "c-1" in text and "error" in text and "2" in text
    plugin = UserMessage("x", source={"kind": "plugin", "plugin": "guard"}, id="p")
    assert "plugin: guard" in "".join(parse(plugin._repr_html_()).text)


@pytest.mark.parametrize(
    "make",
    [
        lambda: UserMessage(HOSTILE, id=HOSTILE),
        lambda: AssistantMessage(
            [{"type": "text", "text": HOSTILE}, {"type": "tool-call", "id": HOSTILE, "name": HOSTILE, "arguments": HOSTILE}]
        ),
        lambda: ToolResultMessage(HOSTILE, HOSTILE, id=HOSTILE),
        lambda: UserMessage(HOSTILE, source={"kind": HOSTILE, "plugin": HOSTILE}),
    ],
    ids=["user", "assistant", "tool-result", "source"],
)
def test_message_html_escapes_every_user_string(make):
    assert_inert(make()._repr_html_())


def test_a_huge_message_is_cut_with_a_note():
    m = UserMessage("x" * 1_000_000 + "END")
    html = m._repr_html_()
    assert len(html) < 10_000
    assert "END" not in html
    assert "998,003 more characters not shown" in html
    assert len(repr(m)) < 200


# ---- events, logs, iterators ----------------------------------------------------------------


def test_event_html_shows_seq_type_and_escaped_data():
    log = MemoryStore().create("s")
    ev = log.append("note/added", {"text": HOSTILE})
    assert repr(ev).startswith("Event(seq=0, type='note/added', data={'text':")
    html = ev._repr_html_()
    assert_inert(html)
    assert "note/added" in html and "seq" in html


def test_session_log_reprs_name_id_store_length_and_last_events(tmp_path):
    log = kerman.FileStore(tmp_path, durability="none").create("demo")
    log.append("note/added", {"n": 0})
    log.append("note/done", {"n": 1})
    assert repr(log) == f"<SessionLog id='demo' store=FileStore({str(tmp_path)!r}) len=2 last='note/done' open>"
    text = "".join(parse(log._repr_html_()).text)
    assert "demo" in text and "FileStore" in text and "note/added" in text and "note/done" in text
    log.close()
    assert repr(log).endswith(" closed>")
    memory = MemoryStore().create("m")
    assert repr(memory) == "<SessionLog id='m' store=MemoryStore len=0 open>"
    assert "no events yet" in memory._repr_html_()


def test_a_log_of_100k_events_shows_only_its_last_few():
    log = MemoryStore().create(HOSTILE)
    for i in range(100_000):
        log.append("note/added", {"i": i})
    log.append("note/last", {"text": HOSTILE})
    html = log._repr_html_()
    assert len(html) < 20_000
    assert_inert(html)
    rows = re.findall(r"<tr><td>(\d+)</td>", html)
    assert rows == ["99996", "99997", "99998", "99999", "100000"]
    assert "the last 5 of 100,001 events" in html


def test_an_event_iterator_shows_where_it_is_without_being_consumed():
    log = MemoryStore().create("s")
    for i in range(20):
        log.append("note/even" if i % 2 == 0 else "note/odd", {"i": i})
    it = log.events(start=2, types="note/even")
    assert repr(it) == "<EventIterator session='s' next=2 stop=20 types=['note/even']>"
    html = it._repr_html_()
    assert re.findall(r"<tr><td>(\d+)</td>", html) == ["2", "4", "6", "8", "10"]
    assert "4 more after them" in html
    assert [e.seq for e in it] == [2, 4, 6, 8, 10, 12, 14, 16, 18]  # displaying took nothing
    assert "exhausted" in it._repr_html_()
    assert repr(it) == "<EventIterator session='s' next=20 stop=20 types=['note/even']>"


def test_a_tail_has_a_readable_repr():
    log = MemoryStore().create("s")
    log.append("note/added", {})
    tail = log.tail(start=0)
    assert repr(tail) == "<LogTail session='s' next=0 live>"
    log.close()


# ---- inbox and projection -------------------------------------------------------------------


def test_inbox_and_projection_show_the_two_lists_as_a_queue():
    log = MemoryStore().create("q")
    inbox = kerman.Inbox(log)
    inbox.append("next-turn", UserMessage("first prompt", id="t1"))
    inbox.append("next-turn", UserMessage(HOSTILE, id="t2"))
    inbox.append("next-step", UserMessage("steer now", id="s1"))
    assert repr(inbox) == "<Inbox session='q' next_turn=2 next_step=1>"
    for obj in (inbox, InboxProjection.fold(log.splices())):
        html = obj._repr_html_()
        assert_inert(html)
        text = "".join(parse(html).text)
        assert "next step (steering, context) (1)" in text and "next turn (queued prompts) (2)" in text
        # oldest first, next-step before next-turn (the order a claim takes them)
        assert text.index("steer now") < text.index("first prompt") < text.index('<script>alert("x")')
    inbox.close()
    assert repr(inbox) == "<Inbox session='q' next_turn=2 next_step=1 closed>"


def test_a_long_queue_shows_its_head_and_counts_the_rest():
    inbox = kerman.Inbox(MemoryStore().create())
    for i in range(500):
        inbox.append("next-turn", f"prompt {i}")
    html = inbox._repr_html_()
    assert "prompt 19" in html and "prompt 20<" not in html and "480 more not shown" in html


# ---- AgentLoop --------------------------------------------------------------------------------


def test_agent_loop_reprs_show_status_turn_step_pending_tools_and_listeners():
    async def add(a: int, b: int) -> str:
        """Adds."""
        return str(a + b)

    call = {"type": "tool-call", "id": "c1", "name": "add", "arguments": '{"a": 1, "b": 2}'}
    loop = run_turn([ModelReply([call]), "three"], tools=(kerman.Tool("add", add),))
    loop.on("agent/status", lambda e: None)
    loop.pre_step(lambda step, next: next())
    loop.inject("context")
    assert repr(loop) == (f"<AgentLoop turn=1 status=idle pending=1 step=2 session={loop.log.id!r} tools=['add'] listeners=2>")
    text = "".join(parse(loop._repr_html_()).text)
    for part in ("status idle", "turn 1", "step 2", "0 next turn, 1 next step", "add", "pre_step ×1", "agent/status ×1"):
        assert part in text, part


def test_agent_loop_html_escapes_the_last_error():
    async def boom(request: kerman.ModelRequest) -> ModelReply:
        raise kerman.ModelError(HOSTILE)

    loop = AgentLoop(boom)

    async def main() -> None:
        loop.followup("x")
        await loop.when_idle()

    asyncio.run(main())
    assert loop.last_error is not None
    assert_inert(loop._repr_html_())
