"""The Store contract on what a store keeps (issue 12, item 3; `src/event_log/store.rs`,
docs/guide.md "What a store keeps"): every store either keeps an event exactly or refuses it
at append time, before its seq is assigned, naming the problem. The memory and file stores can
keep everything that is lossless JSON, NUL included (in types, keys, texts, message ids and
content); these tests pin that they do, through a reopen, a verify and a follower.
(The PostgreSQL store cannot keep NUL; its refusal is tested with that store.)"""

from __future__ import annotations

import asyncio

import pytest

import kerman
from conftest import session_path

NUL_TYPES = ["a\x00b", "\x00", "x/\x00/y"]
NUL_DATA = [
    {"t": "x\x00y"},
    {"k\x00": 1},
    ["\x00", {"\x00": "\x00"}],
    "\x00",
    {"literal": "\\u0000"},  # the six characters, not a NUL: must stay text
]


def make_store(kind, tmp_path):
    return kerman.MemoryStore() if kind == "memory" else kerman.FileStore(tmp_path, durability="strict")


async def _flush(log):
    await asyncio.wait_for(log.flush(), 60)


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_nul_in_types_and_data_is_kept_exactly(tmp_path, kind):
    store = make_store(kind, tmp_path)
    appended = []
    with store.create("s") as log:
        for t in NUL_TYPES:
            for d in NUL_DATA:
                appended.append(log.append(t, d).to_dict())
        appended.append(log.append("x/after", {"ok": True}).to_dict())  # the log is not poisoned
        asyncio.run(_flush(log))
        assert [e.to_dict() for e in log.events()] == appended
    with store.open("s") as log:
        assert [e.to_dict() for e in log.events()] == appended
        assert [e.seq for e in log.events()] == list(range(len(appended)))
    if kind == "file":
        assert store.verify("s")["events"] == len(appended)
        assert b"\x00" not in session_path(tmp_path, "s").read_bytes()  # escaped as \u0000
        with store.follow("s") as follower:
            assert [e.to_dict() for e in follower.events()] == appended


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_nul_in_messages_is_kept_exactly(tmp_path, kind):
    store = make_store(kind, tmp_path)
    message = kerman.UserMessage([{"type": "text", "text": "hi\x00there"}], id="m\x00",
                                 source={"kind": "plugin", "plugin": "p\x00"})
    with store.create("s") as log:
        kerman.Inbox(log).append("next-turn", message)
        asyncio.run(_flush(log))
    with store.open("s") as log:
        inbox = kerman.Inbox(log)
        assert inbox.next_turn == (message,)
        assert inbox.get("m\x00").text == "hi\x00there"


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_a_refused_append_assigns_no_seq_and_leaves_queued_events(tmp_path, kind):
    """What every store refuses (here: data that is not lossless JSON) is refused at append,
    before the seq is assigned; the events appended before it are unaffected."""
    store = make_store(kind, tmp_path)
    with store.create("s") as log:
        log.append("x/a", 1)
        with pytest.raises(kerman.NotJsonError):
            log.append("x/b", {"v": float("nan")})
        assert log.append("x/c", 3).seq == 1
        asyncio.run(_flush(log))
    with store.open("s") as log:
        assert [(e.seq, e.type) for e in log.events()] == [(0, "x/a"), (1, "x/c")]
