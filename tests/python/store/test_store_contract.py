"""The Store contract on what a store keeps (issue 12, item 3; `src/event_log/store.rs`,
docs/guide.md "What a store keeps"): every store either keeps an event exactly or refuses it
at append time, before its seq is assigned, naming the problem. One contract for NUL (U+0000)
in all three stores: an event type holding NUL is refused by every store (PostgreSQL `text`
cannot hold it, so none keeps it, and a session can move between stores); NUL in event data
and in messages (texts, keys, ids, content) is kept exactly by every store, through a reopen
(and, for files, a verify and a follower). A file written before the refusal with such a type
still reads."""

from __future__ import annotations

import asyncio

import pytest

import kerman
from conftest import event_record, header_record, postgres_store_in_fresh_schema, session_path, write_raw_session

NUL_TYPES = ["a\x00b", "\x00", "x/\x00/y"]
NUL_DATA = [
    {"t": "x\x00y"},
    {"k\x00": 1},
    ["\x00", {"\x00": "\x00"}],
    "\x00",
    {"literal": "\\u0000"},  # the six characters, not a NUL: must stay text
]
STORES = ["memory", "file", "postgres"]


def make_store(kind, tmp_path):
    if kind == "postgres":
        return postgres_store_in_fresh_schema()  # skips without KERMAN_PG_DSN
    return kerman.MemoryStore() if kind == "memory" else kerman.FileStore(tmp_path, durability="strict")


async def _flush(log):
    await asyncio.wait_for(log.flush(), 60)


@pytest.mark.parametrize("kind", STORES)
def test_nul_in_an_event_type_is_refused_by_every_store_naming_the_type(tmp_path, kind):
    store = make_store(kind, tmp_path)
    with store.create("s") as log:
        before = log.append("x/before", {"n": 1})
        for t in NUL_TYPES:
            with pytest.raises(ValueError) as info:
                log.append(t, {"n": 2})
            shown = t.replace("\x00", "\\0")  # as the message quotes it: "a\0b"
            assert str(info.value) == (
                f'cannot store this: event type "{shown}" contains NUL (U+0000), which no store keeps (PostgreSQL text cannot hold it)'
            )
        after = log.append("x/after", {"n": 4})
        assert after.seq == before.seq + 1  # the refusals took no seq, and poisoned nothing
        asyncio.run(_flush(log))
    with store.open("s") as log:
        assert [(e.type, e.data) for e in log.events()] == [("x/before", {"n": 1}), ("x/after", {"n": 4})]


@pytest.mark.parametrize("kind", STORES)
def test_nul_in_data_is_kept_exactly_by_every_store(tmp_path, kind):
    store = make_store(kind, tmp_path)
    appended = []
    with store.create("s") as log:
        for d in NUL_DATA:
            appended.append(log.append("x/\u2400", d).to_dict())
        appended.append(log.append("x/after", {"ok": True}).to_dict())  # the log is not poisoned
        asyncio.run(_flush(log))
        assert [e.to_dict() for e in log.events()] == appended
    with store.open("s") as log:
        assert [e.to_dict() for e in log.events()] == appended
        assert [e.seq for e in log.events()] == list(range(len(appended)))
    if kind == "file":
        assert store.verify("s")["events"] == len(appended)
        assert b"\x00" not in session_path(tmp_path, "s").read_bytes()  # escaped as \u0000
    if kind != "memory":
        with store.follow("s") as follower:
            assert [e.to_dict() for e in follower.events()] == appended


@pytest.mark.parametrize("kind", STORES)
def test_nul_in_messages_is_kept_exactly(tmp_path, kind):
    store = make_store(kind, tmp_path)
    message = kerman.UserMessage([{"type": "text", "text": "hi\x00there"}], id="m\x00", source={"kind": "plugin", "plugin": "p\x00"})
    with store.create("s") as log:
        kerman.Inbox(log).append("next-turn", message)
        asyncio.run(_flush(log))
    with store.open("s") as log:
        inbox = kerman.Inbox(log)
        assert inbox.next_turn == (message,)
        assert inbox.get("m\x00").text == "hi\x00there"


def test_a_file_written_with_a_nul_type_before_the_refusal_still_reads(tmp_path):
    """Reading is unchanged: only new appends are refused, so older files keep opening."""
    write_raw_session(session_path(tmp_path, "s"), header_record("s"), [event_record(0, "a\x00b", {"n": 1})])
    store = kerman.FileStore(tmp_path, durability="strict")
    assert store.verify("s")["events"] == 1
    with store.open("s") as log:
        assert [(e.type, e.data) for e in log.events()] == [("a\x00b", {"n": 1})]
        log.append("x/after", {"n": 2})
        asyncio.run(_flush(log))
    with store.open("s") as log:
        assert [e.type for e in log.events()] == ["a\x00b", "x/after"]


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
