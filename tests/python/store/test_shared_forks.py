"""Forks that share their parent's records (issue 32, docs/context.md "Forks"): the file child
is its header and its own events (format version 2), the PostgreSQL child its session row and
its own rows; both read the parent's up to the cut. The parent may go on appending, is never
changed, and is deleted only after its forks; a broken parent is named by every reader."""

from __future__ import annotations

import asyncio
import json
import subprocess

import pytest

import kerman
from conftest import fresh_schema_dsn, session_path
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


def records(log):
    return [e.to_json() for e in log.events()]


async def _turns(log, texts, replies):
    loop = kerman.AgentLoop(ScriptedModel(replies), log)
    for text in texts:
        loop.followup(text)
        await loop.when_idle()
    await loop.aclose()
    await asyncio.wait_for(log.flush(), 60)


async def _flush(log):
    await asyncio.wait_for(log.flush(), 60)


def run_turns(log, texts):
    asyncio.run(_turns(log, texts, [f"re: {t}" for t in texts]))


def psql(store, sql):
    out = subprocess.run(["psql", DSNS[id(store)], "-XAtq", "-c", sql], check=True, capture_output=True, text=True, timeout=30)
    return out.stdout


@pytest.mark.parametrize("kind", STORES)
def test_a_parent_appended_to_after_the_fork_leaves_the_child_as_it_was(tmp_path, kind):
    store = make_store(kind, tmp_path)
    parent = store.create("p")
    run_turns(parent, ["one", "two"])
    cut = len(parent) - 1
    inherited = records(parent)
    if kind == "file":
        before = session_path(tmp_path, "p").read_bytes()
    store.fork("p", cut, "c")
    # The parent goes on in this process while the child is opened and runs its own turn.
    run_turns(parent, ["three"])
    with store.open("c") as child:
        assert records(child) == inherited
        run_turns(child, ["other"])
        texts = [kerman.Message.from_dict(e.data).text for e in child.events() if e.type == "user/message"]
        assert texts == ["one", "two", "other"]
        assert child[cut + 1].type == "agent/inbox/spliced"
    assert records(parent)[: cut + 1] == inherited
    assert [kerman.Message.from_dict(e.data).text for e in parent.events() if e.type == "user/message"] == ["one", "two", "three"]
    parent.close()
    if kind == "file":
        # The parent's file only grew: every byte it held at the fork is still there.
        assert session_path(tmp_path, "p").read_bytes()[: len(before)] == before
        child_file = session_path(tmp_path, "c").read_text().splitlines()
        header = json.loads(child_file[0][9:])
        assert header["version"] == 2 and header["forkedFrom"] == {"id": "p", "seq": cut}
        assert json.loads(child_file[1][9:])["seq"] == cut + 1, "the child's file holds only its own events"
    if kind == "postgres":
        assert psql(store, "SELECT min(seq) FROM kerman_events WHERE session_id = 'c'").strip() == str(cut + 1)


@pytest.mark.parametrize("kind", STORES)
def test_a_parent_is_deleted_only_after_its_forks(tmp_path, kind):
    store = make_store(kind, tmp_path)
    with store.create("p") as log:
        run_turns(log, ["one"])
    store.fork("p", 0, "b")
    store.fork("p", 1, "a")
    with pytest.raises(kerman.SessionHasForksError) as refused:
        store.delete("p")
    assert refused.value.forks == ["a", "b"]
    assert str(refused.value) == 'session "p" cannot be deleted: its forks "a", "b" read their first events from it; delete them first'
    assert isinstance(refused.value, kerman.LogError)
    store.delete("a")
    with pytest.raises(kerman.SessionHasForksError, match='its fork "b" read'):
        store.delete("p")
    store.delete("b")
    store.delete("p")
    assert store.list() == []


def test_a_file_fork_costs_one_header_line_and_every_reader_sees_the_whole_log(tmp_path, capsys):
    from kerman.cli import main

    store = kerman.FileStore(tmp_path, durability="strict")
    with store.create("p") as log:
        run_turns(log, ["one", "two", "three"])
        parent = records(log)
    cut = len(parent) - 3
    store.fork("p", cut, "c")
    assert len(session_path(tmp_path, "c").read_text().splitlines()) == 1
    # verify, the tools' read, a follower: the inherited events and the child's.
    assert store.verify("c")["events"] == cut + 1
    header, events, _ = store._read("c")
    assert [e.to_json() for e in events] == parent[: cut + 1] and header["forkedFrom"]["id"] == "p"
    follower = store.follow("c")
    assert records(follower) == parent[: cut + 1]
    follower.close()
    assert main(["log", "list", str(tmp_path), "--json"]) == 0
    listed = {row["id"]: row for row in json.loads(capsys.readouterr().out)}
    assert listed["c"]["events"] == cut + 1 and listed["c"]["status"] == "ok"
    assert main(["log", "verify", str(tmp_path), "c"]) == 0
    assert capsys.readouterr().out.startswith(f"ok: {cut + 1} events")
    assert main(["log", "show", str(tmp_path), "c", "--json"]) == 0
    assert capsys.readouterr().out.splitlines() == parent[: cut + 1]


def test_a_broken_file_parent_is_named_and_repair_points_at_it(tmp_path, capsys):
    from kerman.cli import main

    store = kerman.FileStore(tmp_path, durability="strict")
    with store.create("p") as log:
        run_turns(log, ["one", "two"])
    store.fork("p", 5, "c")
    path = session_path(tmp_path, "p")
    original = path.read_bytes()
    lines = original.splitlines(keepends=True)
    # Corruption below the cut is the parent's: named in its file, repaired there.
    damaged = lines[:3] + [lines[3].replace(b'"seq":2', b'"seq":9')] + lines[4:]
    path.write_bytes(b"".join(damaged))
    with pytest.raises(kerman.CorruptLogError) as corrupt:
        store.open("c")
    assert corrupt.value.path == str(path) and corrupt.value.seq == 2
    assert main(["log", "repair", str(tmp_path), "c", "--yes"]) == 1
    err = capsys.readouterr().err
    assert 'session "c" reads its first events from session "p", whose file is corrupt' in err
    assert f"kerman log repair {tmp_path} p" in err
    # Cut back below the cut, or gone: every reader says so, naming the parent.
    path.write_bytes(b"".join(lines[:4]))
    with pytest.raises(kerman.LogError, match=r'is a fork of session "p" at seq 5 .* it now ends at seq 2, before the cut'):
        store.open("c")
    path.unlink()
    with pytest.raises(kerman.LogError, match="the parent does not exist"):
        store.verify("c")
    assert main(["log", "show", str(tmp_path), "c"]) == 1
    assert 'is a fork of session "p" at seq 5' in capsys.readouterr().err
    path.write_bytes(original)
    assert store.verify("c")["events"] == 6


def test_a_postgres_fork_refuses_enqueueing_a_message_its_inherited_log_holds():
    store = make_store("postgres", None)
    with store.create("p") as log:
        inbox = kerman.Inbox(log)
        queued = inbox.append("next-turn", "queued before the cut")
        inbox.close()
        asyncio.run(_flush(log))
        cut = len(log) - 1
    store.fork("p", cut, "c")
    with pytest.raises(kerman.DuplicateMessageError):
        store.enqueue("c", queued)
    # A message of its own is staged as for any session.
    store.enqueue("c", "a new one")
    with store.open("c") as child:
        assert [m.text for m in kerman.Inbox(child).next_turn][0] == "queued before the cut"


async def _tool_turn(log):
    def work(n: int = 0) -> str:
        return f"worked {n}"

    call = {"type": "tool-call", "id": "c9", "name": "work", "arguments": '{"n": 9}'}
    model = ScriptedModel([kerman.ModelReply([{"type": "text", "text": "calling"}, call]), "done"])
    loop = kerman.AgentLoop(model, log, tools=[kerman.Tool("work", work)])
    loop.followup("use the tool")
    await loop.when_idle()
    await loop.aclose()
    await asyncio.wait_for(log.flush(), 60)


def state(store, kind, tmp_path, sid):
    if kind == "file":
        return session_path(tmp_path, sid).read_bytes()
    if kind == "postgres":
        return psql(store, f"SELECT seq, time, type, record FROM kerman_events WHERE session_id = '{sid}' ORDER BY seq")
    with store.open(sid) as log:
        return records(log)


@pytest.mark.parametrize("kind", STORES)
def test_a_fork_of_a_fork_at_every_boundary_reads_its_chain_and_changes_neither(tmp_path, kind):
    store = make_store(kind, tmp_path)
    with store.create("p") as log:
        run_turns(log, ["one", "two"])
        first_turn_end = [e.seq for e in log.events() if e.type == "turn/end"][0]
        cut = len(log) - 1
    store.fork("p", cut, "c")
    with store.open("c") as log:
        asyncio.run(_tool_turn(log))
        child = records(log)
        seqs = {e.type: e.seq for e in log.events(cut + 1)}
    before = {sid: state(store, kind, tmp_path, sid) for sid in ("p", "c")}
    boundaries = {
        "first": 0,  # in the grandparent's records
        "parent-turn-end": first_turn_end,
        "at-the-cut": cut,
        "splice": seqs["agent/inbox/spliced"],  # the child's own records from here
        "tool-call": seqs["tool/call"],
        "tool-result": seqs["tool/result"],
        "last": len(child) - 1,
    }
    for name, at in boundaries.items():
        grandchild = store.fork("c", at, f"g-{name}")
        with store.open(grandchild) as g:
            assert records(g)[: at + 1] == child[: at + 1], name
            assert g.header["forkedFrom"] == {"id": "c", "seq": at}
            if name == "tool-call":  # started before the cut, its outcome unknown here
                result = next(e for e in g.events(at + 1) if e.type == "tool/result")
                assert "TOOL_OUTCOME_UNKNOWN" in json.dumps(result.data)
            run_turns(g, [f"after {name}"])
            assert g[len(g) - 1].type == "turn/end"
    assert {sid: state(store, kind, tmp_path, sid) for sid in ("p", "c")} == before
