"""Forks (`store.fork`, issue 32 item 2; docs/context.md "Forks"): the child's events up to the
cut are the parent's, byte for byte as read through the log API; the parent is never changed
(file bytes and PostgreSQL rows compared); forks of forks, deleted before their parents; a cut at a turn end, inside a turn
(the crash closers close it when the child is first opened, a tool call in doubt included),
after a splice (the queue inherited or dropped); a child reopened in another process."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

import kerman
from conftest import fresh_schema_dsn, session_path
from kerman import AgentLoop, ModelReply, Tool
from kerman.models import ScriptedModel

STORES = ["memory", "file", "postgres"]
DSNS: dict = {}


def make_store(kind, tmp_path):
    if kind == "postgres":
        dsn = fresh_schema_dsn()  # skips without KERMAN_PG_DSN
        store = kerman.PostgresStore(dsn)
        DSNS[id(store)] = dsn
        return store
    return kerman.MemoryStore() if kind == "memory" else kerman.FileStore(tmp_path, durability="strict")


def records(log, stop=None):
    return [e.to_json() for e in log.events()][:stop]


def seq_of(log, type_, nth=0):
    return [e.seq for e in log.events() if e.type == type_][nth]


async def _flush(log):
    await asyncio.wait_for(log.flush(), 60)


async def _session(log):
    """Two turns (the first with a tool call), then a followup queued but not yet claimed."""

    def work(n: int = 0) -> str:
        return f"worked {n}"

    call = {"type": "tool-call", "id": "c1", "name": "work", "arguments": '{"n": 1}'}
    model = ScriptedModel([ModelReply([{"type": "text", "text": "calling"}, call]), "after the tool", "second"])
    loop = AgentLoop(model, log, tools=[Tool("work", work)])
    loop.followup("one")
    await loop.when_idle()
    loop.followup("two")
    await loop.when_idle()
    await asyncio.wait_for(log.flush(), 60)


def build(store, sid="p"):
    log = store.create(sid)
    asyncio.run(_session(log))
    # A message queued after the last turn: a splice and nothing else.
    inbox = kerman.Inbox(log)
    inbox.append("next-turn", "three")
    inbox.close()
    asyncio.run(_flush(log))
    return log


def parent_state(store, kind, tmp_path, sid="p"):
    if kind == "file":
        return session_path(tmp_path, sid).read_bytes()
    if kind == "postgres":
        sql = f"SELECT seq, time, type, record FROM kerman_events WHERE session_id = '{sid}' ORDER BY seq"
        out = subprocess.run(["psql", DSNS[id(store)], "-XAtq", "-c", sql], check=True, capture_output=True, text=True, timeout=30)
        assert out.stdout.count("\n") > 5
        return out.stdout
    with store.open(sid) as log:
        return records(log)


@pytest.mark.parametrize("kind", STORES)
def test_a_fork_at_every_boundary_sees_the_parent_up_to_the_cut_and_the_parent_is_unchanged(tmp_path, kind):
    store = make_store(kind, tmp_path)
    log = build(store)
    parent = records(log)
    log.close()
    before = parent_state(store, kind, tmp_path)
    cuts = {
        "turn-end": seq_of(log, "turn/end"),
        "step-start": seq_of(log, "step/start"),
        "tool-call": seq_of(log, "tool/call"),
        "splice": seq_of(log, "agent/inbox/spliced"),
        "last": len(parent) - 1,
        "first": 0,
    }
    for name, at in cuts.items():
        child = store.fork("p", at, f"c-{name}")
        assert child == f"c-{name}"
        with store.open(child) as c:
            assert records(c, at + 1) == parent[: at + 1], name
            assert c.header["forkedFrom"] == {"id": "p", "seq": at}
            turn_open = any(e.type == "turn/start" for e in c.events()) and c[at].type not in ("turn/end", "agent/inbox/spliced")
            if name in ("step-start", "tool-call"):
                assert turn_open
                closers = [e.type for e in c.events(at + 1)]
                assert closers[-1] == "turn/end", closers  # closed by the crash closers
        assert parent_state(store, kind, tmp_path) == before, name
    with store.open("c-tool-call") as c:
        # The call was started before the cut: its outcome is unknown in the child.
        result = next(e for e in c.events(cuts["tool-call"] + 1) if e.type == "tool/result")
        assert "TOOL_OUTCOME_UNKNOWN" in json.dumps(result.data)
    # The parent stays whole and openable.
    with store.open("p") as p:
        assert records(p) == parent


@pytest.mark.parametrize("kind", STORES)
def test_forks_of_forks_and_their_own_ways(tmp_path, kind):
    store = make_store(kind, tmp_path)
    log = build(store)
    parent = records(log)
    cut = seq_of(log, "turn/end")
    child = store.fork("p", cut)  # a minted UUIDv7 id
    assert store.exists(child) and child != "p"
    with store.open(child) as c:
        c.append("x/child", {"n": 1})
        asyncio.run(_flush(c))
        child_records = records(c)
    assert store.fork(child, cut + 1, "g") == "g"
    with store.open("g") as g:
        assert records(g) == child_records[: cut + 2]
        assert g[cut + 1].type == "x/child"
        assert g.header["forkedFrom"] == {"id": child, "seq": cut + 1}
    assert records(log) == parent  # the open parent is untouched
    log.append("x/parent", {"n": 2})
    asyncio.run(_flush(log))
    log.close()
    # A fork of an open parent reads what it committed; a parent goes only after its forks.
    with pytest.raises(kerman.SessionHasForksError) as refused:
        store.delete("p")
    assert refused.value.forks == [child]
    with pytest.raises(kerman.SessionHasForksError, match='its fork "g" read'):
        store.delete(child)
    with store.open(child) as c:
        assert records(c) == child_records
    for sid in ["g", child, "p"]:
        store.delete(sid)
    assert store.list() == []


@pytest.mark.parametrize("kind", STORES)
def test_the_inbox_at_the_cut_is_inherited_or_dropped(tmp_path, kind):
    store = make_store(kind, tmp_path)
    log = build(store)
    splice = [e.seq for e in log.events() if e.type == "agent/inbox/spliced"][-1]
    idle = [e.seq for e in log.events() if e.type == "turn/end"][-1]
    log.close()
    store.fork("p", splice, "keep")
    store.fork("p", splice, "drop", inbox="drop")
    with store.open("keep") as k:
        assert [m.text for m in kerman.Inbox(k).next_turn] == ["three"]
        assert len(k) == splice + 1
    with store.open("drop") as d:
        assert len(d) == splice + 2  # one splice clears the queue
        assert d[splice + 1].type == "agent/inbox/spliced"
        assert kerman.Inbox(d).next_turn == ()
    # An empty queue needs no splice.
    store.fork("p", idle, "empty-drop", inbox="drop")
    with store.open("empty-drop") as e:
        assert len(e) == idle + 1


@pytest.mark.parametrize("kind", STORES)
def test_bad_forks_are_refused_naming_the_value(tmp_path, kind):
    store = make_store(kind, tmp_path)
    with store.create("p") as log:
        log.append("x/a", {})
        asyncio.run(_flush(log))
    with pytest.raises(ValueError, match=r'at_seq 1 is past the end of session "p", which ends at seq 0'):
        store.fork("p", 1)
    with pytest.raises(ValueError, match='unknown inbox policy "keep"'):
        store.fork("p", 0, inbox="keep")
    with pytest.raises(kerman.SessionNotFoundError):
        store.fork("nope", 0)
    store.fork("p", 0, "c")
    with pytest.raises(kerman.SessionExistsError):
        store.fork("p", 0, "c")
    with pytest.raises(OverflowError):
        store.fork("p", -1)
    assert sorted(store.list()) == ["c", "p"]


CHILD = """
import sys, kerman
store = kerman.FileStore(sys.argv[1], durability="strict")
with store.open(sys.argv[2]) as log:
    print(len(log), log.header["forkedFrom"]["id"], log[len(log) - 1].to_json())
"""


def test_a_file_child_reopens_in_another_process(tmp_path):
    store = kerman.FileStore(tmp_path, durability="strict")
    log = build(store)
    cut = seq_of(log, "turn/end")
    expected = log[cut].to_json()
    log.close()
    store.fork("p", cut, "c")
    out = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), "c"], capture_output=True, text=True, check=True).stdout
    assert out.split(" ", 2) == [str(cut + 1), "p", expected + "\n"]
    assert store.verify("c")["events"] == cut + 1


def test_kerman_log_fork_prints_the_new_id_and_show_names_the_parent(tmp_path, capsys):
    from kerman.cli import main

    store = kerman.FileStore(tmp_path, durability="strict")
    log = build(store)
    splice = [e.seq for e in log.events() if e.type == "agent/inbox/spliced"][-1]
    log.close()
    assert main(["log", "fork", str(tmp_path), "p", str(splice), "--id", "c", "--inbox", "drop"]) == 0
    assert capsys.readouterr().out == "c\n"
    with store.open("c") as c:
        assert len(c) == splice + 2 and kerman.Inbox(c).next_turn == ()
    assert main(["log", "show", str(tmp_path), "c"]) == 0
    assert f'forked from session "p" at seq {splice} (events 0–{splice} are its)' in capsys.readouterr().out.splitlines()[1]
    assert main(["log", "fork", str(tmp_path), "p", "999"]) == 2
    assert 'at_seq 999 is past the end of session "p"' in capsys.readouterr().err
