"""MemoryStore and FileStore (SPEC 2.2, 4.2, 4.8; reference 2.9-2.12 and cases PC-/J-/CR-)."""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

import kerman
from conftest import (
    compact,
    crc32c,
    encode_session_id,
    event_record,
    frame,
    header_record,
    read_raw_session,
    session_path,
    write_raw_session,
)
from kerman import (
    CorruptLogError,
    FileStore,
    MemoryStore,
    SessionExistsError,
    SessionLockedError,
    SessionNotFoundError,
    UnsupportedFormatError,
)

T0 = 1_767_225_600_000


def kerman_records(caplog, level):
    return [r for r in caplog.records if r.name == "kerman" and r.levelno == level]


def fill(log, n, start=0):
    return [log.append("x/e", {"i": i, "s": "é" * (i % 3)}) for i in range(start, start + n)]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


async def flushed(log):
    await log.flush()


# ---------------------------------------------------------------------------------------------
# create / open / list / exists / delete (both stores)


def test_create_none_mints_a_uuid7_id(store):
    a = store.create()
    b = store.create(None)
    try:
        for log in (a, b):
            u = uuid.UUID(log.id)
            assert str(u) == log.id and u.version == 7
            assert log.header["id"] == log.id
        assert a.id != b.id
    finally:
        a.close()
        b.close()


def test_create_with_an_id(store):
    log = store.create("my-session")
    try:
        assert log.id == "my-session"
        assert len(log) == 0
        assert store.exists("my-session")
    finally:
        log.close()


def test_create_existing_raises_session_exists(store):
    log = store.create("dup")
    try:
        with pytest.raises(SessionExistsError) as exc:
            store.create("dup")
        assert isinstance(exc.value, kerman.LogError)
    finally:
        log.close()
    with pytest.raises(SessionExistsError):
        store.create("dup")  # also once closed, even though it never held an event


def test_open_missing_raises_session_not_found(store):
    with pytest.raises(SessionNotFoundError) as exc:
        store.open("nope")
    assert isinstance(exc.value, LookupError)
    assert isinstance(exc.value, kerman.LogError)
    assert not store.exists("nope")


@pytest.mark.parametrize("op", ["create", "open", "exists", "delete"])
def test_empty_id_raises_value_error(store, op):
    with pytest.raises(ValueError):
        getattr(store, op)("")


def test_open_while_open_raises_session_locked(store):
    log = store.create("s")
    try:
        log.append("x/a", 1)
        with pytest.raises(SessionLockedError):
            store.open("s")
        assert log.append("x/a", 2).seq == 1  # the owner is unaffected
    finally:
        log.close()
    log = store.open("s")
    try:
        with pytest.raises(SessionLockedError):
            store.open("s")
    finally:
        log.close()


def test_closed_session_reopens_with_the_same_events(store):
    log = store.create("s")
    evs = fill(log, 5)
    header = log.header
    log.close()
    log = store.open("s")
    try:
        assert list(log.events()) == evs
        assert [e.to_json() for e in log.events()] == [e.to_json() for e in evs]
        assert log.header == header
        assert log.append("x/e", "next").seq == 5
    finally:
        log.close()


def test_memory_store_reopen_in_the_same_process():
    store = MemoryStore()
    log = store.create("m")
    ev = log.append("goal/change", {"goal": "x"})
    log.close()
    again = store.open("m")
    try:
        assert list(again.events()) == [ev]
        assert again.header == log.header
    finally:
        again.close()


def test_list_and_exists_agree_and_a_created_session_is_listed(store):
    """Deviation from reference PC-03 (a created-but-never-appended session is absent from
    `list()`): that was an artefact of the reference creating its files lazily. Here `list()`
    and `exists()` agree on every store, so a session is listed from `create` on, while its
    log is still open and after it closes, and not after `delete`."""
    empty = store.create("s-1")
    assert store.exists("s-1") and "s-1" in store.list()
    full = store.create("full")
    full.append("x/a", 1)
    assert store.list() == ["full", "s-1"]
    empty.close()
    full.close()
    assert store.list() == ["full", "s-1"]
    assert all(store.exists(i) for i in store.list())
    assert not store.exists("never") and "never" not in store.list()
    reopened = store.open("s-1")
    try:
        assert len(reopened) == 0
        assert store.list() == ["full", "s-1"]
    finally:
        reopened.close()
    store.delete("s-1")
    assert not store.exists("s-1") and store.list() == ["full"]


def test_list_is_sorted_and_complete(store):
    ids = ["b", "a", "c-3", "A", "z_9"]
    for i in ids:
        with store.create(i) as log:
            log.append("x/a", i)
    assert store.list() == sorted(ids)


def test_delete(store):
    with store.create("gone") as log:
        log.append("x/a", 1)
    store.delete("gone")
    assert not store.exists("gone")
    assert "gone" not in store.list()
    with pytest.raises(SessionNotFoundError):
        store.open("gone")
    with pytest.raises(SessionNotFoundError):
        store.delete("gone")
    log = store.create("gone")  # the id is free again
    try:
        assert len(log) == 0
    finally:
        log.close()


def test_delete_of_an_open_session_is_refused(store):
    log = store.create("busy")
    try:
        log.append("x/a", 1)
        with pytest.raises(SessionLockedError):
            store.delete("busy")
        assert store.exists("busy")
    finally:
        log.close()


def test_PC_05_events_start_returns_exactly_the_suffix(store, tmp_path):
    with store.create("s") as log:
        evs = fill(log, 8)
    log = store.open("s")
    try:
        files_before = _snapshot_dir(tmp_path)
        for k in range(0, 10):
            assert [e.to_json() for e in log.events(k)] == [e.to_json() for e in evs[k:]]
        assert _snapshot_dir(tmp_path) == files_before  # reading changes no storage
        assert len(log) == 8
    finally:
        log.close()


def _snapshot_dir(root: Path) -> dict:
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = Path(dirpath) / f
            out[str(p)] = p.read_bytes()
    return out


# ---------------------------------------------------------------------------------------------
# PC-01: round trip through a file


def test_PC_01_round_trip(file_store, store_root):
    log = file_store.create("rt")
    header = log.header
    evs = [
        log.append("goal/change", {"goal": "ship"}),
        log.append("x/unicode", {"s": "日本語 é 😀", "esc": '"\\\n\t\u0001'}),
        log.append("x/numbers", [0, -1, 2**63 - 1, 1.5, 1e-7, True, None]),
        log.append("request/context", {"provider": "p", "model": "m"}),
        log.append("x/empty", {}),
        log.append("x/keys", {"k\n\u2028": "v", "": [], "nested": {"b": 1, "a": 2}}),
    ]
    log.close()
    raw = read_raw_session(session_path(store_root, "rt"))
    assert [ok for ok, _, _ in raw] == [True] * 7
    assert [line[9:].rstrip(b"\n").decode() for _, _, line in raw[1:]] == [e.to_json() for e in evs]

    again = FileStore(store_root, durability="none").open("rt")
    try:
        assert again.header == header
        got = list(again.events())
        assert [e.to_json() for e in got] == [e.to_json() for e in evs]
        assert got == evs
        assert [e.data for e in got] == [e.data for e in evs]
    finally:
        again.close()


def test_large_record_round_trip(file_store, store_root):
    big = {"text": "x" * 1_000_000 + "é", "list": list(range(10_000))}
    with file_store.create("big") as log:
        ev = log.append("x/big", big)
        log.append("x/small", 1)
    again = file_store.open("big")
    try:
        assert again[0].to_json() == ev.to_json()
        assert again[0].data == big
        assert again[1].data == 1
    finally:
        again.close()


def test_header_and_records_have_valid_checksums(file_store, store_root):
    log = file_store.create("crc")
    fill(log, 3)
    log.close()
    raw = read_raw_session(session_path(store_root, "crc"))
    assert len(raw) == 4
    for ok, _rec, line in raw:
        assert ok, line
        assert line.endswith(b"\n")
        assert line[:8] == line[:8].lower()
        assert line[:8] == b"%08x" % crc32c(line[9:-1])
    ok, header, line = raw[0]
    assert header == {"type": "session", "version": 1, "id": "crc", "createdAt": log.header["createdAt"]}
    assert line[9:].startswith(b'{"type":"session","version":1,')
    assert [rec["seq"] for _, rec, _ in raw[1:]] == [0, 1, 2]


def test_header_is_written_at_create(file_store, store_root):
    log = file_store.create("h")
    try:
        raw = read_raw_session(session_path(store_root, "h"))
        assert len(raw) == 1 and raw[0][0]
        assert raw[0][1]["id"] == "h"
    finally:
        log.close()


# Windows has no mode bits: session files take the folder's inherited ACL (docs/durability.md).
@pytest.mark.skipif(sys.platform == "win32", reason="no POSIX mode bits on Windows")
def test_file_mode_is_0600(file_store, store_root):
    log = file_store.create("mode")
    path = session_path(store_root, "mode")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    log.append("x/a", 1)
    log.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


WEIRD_IDS = [
    "a/b",
    "../escape",
    "..",
    ".",
    "./x",
    "/abs/path",
    "x/../../y",
    "\x01\x02\x1f",
    "tab\tnew\nline\r",
    "del\x7f",
    "日本/é",
    "😀",
    "~",
    "~7E",
    "a.jsonl",
    ".hidden",
    " spaced out ",
    "-",
    "A~2Fb",
]


def test_weird_ids_stay_inside_the_root_and_round_trip(tmp_path):
    root = tmp_path / "root"
    store = FileStore(root, durability="none")
    for i, sid in enumerate(WEIRD_IDS):
        with store.create(sid) as log:
            log.append("x/id", {"id": sid, "i": i})
    # nothing was written outside the root, and the root holds exactly one flat file per id
    outside = [p for p in tmp_path.rglob("*") if root not in p.parents and p != root]
    assert outside == []
    files = sorted(os.listdir(root))
    assert len(files) == len(WEIRD_IDS)
    for f in files:
        assert (root / f).is_file()
        assert "/" not in f and not f.startswith(".")
    assert sorted(files) == sorted(encode_session_id(s) + ".jsonl" for s in WEIRD_IDS)
    assert sorted(store.list()) == sorted(WEIRD_IDS)
    for i, sid in enumerate(WEIRD_IDS):
        assert store.exists(sid)
        log = store.open(sid)
        try:
            assert log.id == sid
            assert log.header["id"] == sid
            assert [e.data for e in log.events()] == [{"id": sid, "i": i}]
        finally:
            log.close()


def test_nul_in_an_id_is_refused(file_store):
    with pytest.raises(ValueError):
        file_store.create("a\x00b")
    with pytest.raises(ValueError):
        file_store.open("a\x00b")


def test_overlong_id_is_refused(file_store, store_root):
    with pytest.raises(ValueError):
        file_store.create("x" * 1000)
    assert not store_root.exists() or os.listdir(store_root) == []


def test_foreign_files_are_not_listed(file_store, store_root):
    with file_store.create("real") as log:
        log.append("x/a", 1)
    (store_root / "notes.txt").write_text("hi")
    (store_root / "real.jsonl.corrupt").write_bytes(b"x")
    (store_root / ".hidden.jsonl").write_bytes(b"x")
    (store_root / "~41.jsonl").write_bytes(b"x")  # non-canonical spelling of "A"
    assert file_store.list() == ["real"]


# ---------------------------------------------------------------------------------------------
# Crash closers (PC-02, CR-01, CR-02)


def _assistant(calls):
    content = [{"type": "text", "text": "working"}] + [
        {"type": "tool-call", "id": cid, "name": name, "arguments": args} for cid, name, args in calls
    ]
    return {"id": "a-1", "role": "assistant", "content": content, "source": {"kind": "model", "provider": "p", "model": "m"}}


def _user(text="hi", mid="u-1"):
    return {"id": mid, "role": "user", "content": [{"type": "text", "text": text}], "source": {"kind": "user"}}


def _open_turn_records():
    """A turn that crashed while tool `c2` ran: `c1` never started, `c2` has a tool/call."""
    am = _assistant([("c1", "read", "{}"), ("c2", "write", '{"path":"x"}')])
    return [
        event_record(0, "turn/start", {"turn": 1}, T0),
        event_record(1, "step/start", {"turn": 1, "step": 1}, T0 + 1),
        event_record(2, "user/message", _user(), T0 + 2, surface_op="append"),
        event_record(3, "assistant/message", {"turn": 1, "step": 1, "message": am}, T0 + 3, surface_op="append", source_event_seqs=[]),
        event_record(4, "tool/call", {"turn": 1, "step": 1, "callId": "c2", "name": "write", "arguments": '{"path":"x"}'}, T0 + 7),
    ]


def test_PC_02_open_turn_gets_deterministic_closers(store_root):
    path = session_path(store_root, "crash")
    original = write_raw_session(path, header_record("crash"), _open_turn_records())
    store = FileStore(store_root, durability="none")
    log = store.open("crash")
    try:
        evs = list(log.events())
        assert [e.type for e in evs] == [
            "turn/start",
            "step/start",
            "user/message",
            "assistant/message",
            "tool/call",
            "tool/result",
            "tool/result",
            "step/end",
            "turn/end",
        ]
        assert [e.seq for e in evs] == list(range(9))
        not_started, unknown, step_end, turn_end = evs[5:]

        # c1: no tool/call was logged -> TOOL_NOT_STARTED
        assert not_started.data["turn"] == 1 and not_started.data["step"] == 1
        assert not_started.data["error"] == {"name": "ToolNotStartedError", "code": "TOOL_NOT_STARTED"}
        assert not_started.surface_op == "append"
        m1 = kerman.Message.from_dict(not_started.data["message"])
        assert type(m1) is kerman.ToolResultMessage
        assert m1.call_id == "c1" and m1.is_error
        assert m1.id == "interrupted-tool-result-c1-5"

        # c2: its tool/call (seq 4) was logged -> TOOL_OUTCOME_UNKNOWN citing it
        assert unknown.data["error"] == {"name": "ToolOutcomeUnknownError", "code": "TOOL_OUTCOME_UNKNOWN"}
        assert unknown.source_event_seqs == [4]
        assert unknown.surface_op == "append"
        m2 = kerman.Message.from_dict(unknown.data["message"])
        assert type(m2) is kerman.ToolResultMessage
        assert m2.call_id == "c2" and m2.is_error
        assert m2.id == "interrupted-tool-result-c2-6"
        [block] = m2.content
        assert "Do not retry blindly." in " ".join(b.get("text", "") for b in block["content"])

        assert step_end.data == {"turn": 1, "step": 1}
        assert turn_end.data == {"turn": 1, "reason": {"kind": "interrupted"}}
        # closers reuse the last real event's time
        assert [e.time for e in evs[5:]] == [T0 + 7] * 4
    finally:
        log.close()

    # the closers are ordinary committed records: appended after the original bytes, and a
    # second open adds nothing
    after = path.read_bytes()
    assert after.startswith(original)
    assert all(ok for ok, _, _ in read_raw_session(path))
    again = store.open("crash")
    try:
        assert len(again) == 9
        assert [e.to_json() for e in again.events()] == [e.to_json() for e in evs]
    finally:
        again.close()
    assert path.read_bytes() == after


def test_closers_are_logged_as_a_warning(store_root, caplog):
    write_raw_session(session_path(store_root, "w"), header_record("w"), _open_turn_records())
    with caplog.at_level(logging.WARNING, logger="kerman"):
        log = FileStore(store_root).open("w")
    log.close()
    assert kerman_records(caplog, logging.WARNING)


def test_CR_01_crash_after_request_header(store_root):
    spliced_in = {"target": "next-turn", "start": 0, "inserted": [_user("go", "u-9")]}
    claimed = {"target": "next-turn", "start": 0, "removedCount": 1, "inserted": []}
    records = [
        event_record(0, "agent/inbox/spliced", spliced_in, T0),
        event_record(1, "turn/start", {"turn": 1}, T0 + 1),
        event_record(2, "agent/inbox/spliced", claimed, T0 + 1),
        event_record(3, "step/start", {"turn": 1, "step": 1}, T0 + 2),
        event_record(4, "user/message", _user("go", "u-9"), T0 + 2, surface_op="append"),
        event_record(5, "request/header", {"options": {"temperature": 0}}, T0 + 3),
        event_record(6, "request/context", {"provider": "p", "model": "m"}, T0 + 3),
    ]
    write_raw_session(session_path(store_root, "cr1"), header_record("cr1"), records)
    log = FileStore(store_root).open("cr1")
    try:
        assert [e.type for e in log.events()] == [
            "agent/inbox/spliced",
            "turn/start",
            "agent/inbox/spliced",
            "step/start",
            "user/message",
            "request/header",
            "request/context",
            "step/end",
            "turn/end",
        ]
        assert log[-2].data == {"turn": 1, "step": 1}
        assert log[-1].data == {"turn": 1, "reason": {"kind": "interrupted"}}
        assert log[-1].time == log[-2].time == T0 + 3
        # the inbox replays to empty: the claim consumed the prompt
        assert kerman.Inbox(log).has_pending is False
    finally:
        log.close()


def test_open_turn_without_a_step_gets_only_turn_end(store_root):
    records = [
        event_record(0, "turn/start", {"turn": 1}, T0),
        event_record(1, "step/start", {"turn": 1, "step": 1}, T0),
        event_record(2, "step/end", {"turn": 1, "step": 1}, T0 + 1),
        event_record(3, "turn/end", {"turn": 1, "reason": {"kind": "completed"}}, T0 + 2),
        event_record(4, "turn/start", {"turn": 2}, T0 + 5),
        event_record(5, "goal/change", {"goal": "x"}, T0 + 6),
    ]
    write_raw_session(session_path(store_root, "t2"), header_record("t2"), records)
    log = FileStore(store_root).open("t2")
    try:
        assert len(log) == 7
        assert log[6].type == "turn/end"
        assert log[6].data == {"turn": 2, "reason": {"kind": "interrupted"}}
        assert log[6].time == T0 + 6
    finally:
        log.close()


def test_finished_tool_calls_get_no_closer(store_root):
    am = _assistant([("c1", "read", "{}")])
    result = kerman.ToolResultMessage("c1", "ok", id="r-1").to_dict()
    records = [
        event_record(0, "turn/start", {"turn": 1}, T0),
        event_record(1, "step/start", {"turn": 1, "step": 1}, T0),
        event_record(2, "assistant/message", {"turn": 1, "step": 1, "message": am}, T0, surface_op="append", source_event_seqs=[]),
        event_record(3, "tool/call", {"turn": 1, "step": 1, "callId": "c1", "name": "read", "arguments": "{}"}, T0),
        event_record(4, "tool/result", {"turn": 1, "step": 1, "message": result}, T0 + 1, surface_op="append", source_event_seqs=[3]),
    ]
    write_raw_session(session_path(store_root, "fin"), header_record("fin"), records)
    log = FileStore(store_root).open("fin")
    try:
        assert [e.type for e in log.events(5)] == ["step/end", "turn/end"]
    finally:
        log.close()


def test_closed_turn_gets_no_closers(store_root):
    records = [
        event_record(0, "turn/start", {"turn": 1}, T0),
        event_record(1, "turn/end", {"turn": 1, "reason": {"kind": "blocked"}}, T0),
        event_record(2, "goal/change", {}, T0),
    ]
    path = session_path(store_root, "closed")
    original = write_raw_session(path, header_record("closed"), records)
    log = FileStore(store_root).open("closed")
    try:
        assert len(log) == 3
    finally:
        log.close()
    assert path.read_bytes() == original


def test_torn_tail_inside_an_open_turn_is_cut_then_closed(store_root):
    records = _open_turn_records()
    good = [frame(compact(r)) for r in records[:4]]
    torn = frame(compact(records[4]))[:-10]  # the tool/call record never fully reached the disk
    path = session_path(store_root, "tc")
    write_raw_session(path, header_record("tc"), good + [torn])
    log = FileStore(store_root).open("tc")
    try:
        types = [e.type for e in log.events()]
        # both calls are now unstarted
        assert types == [
            "turn/start",
            "step/start",
            "user/message",
            "assistant/message",
            "tool/result",
            "tool/result",
            "step/end",
            "turn/end",
        ]
        assert [e.data["error"]["code"] for e in log.events(4, 6)] == ["TOOL_NOT_STARTED"] * 2
        assert log[-1].time == T0 + 3
    finally:
        log.close()


# ---------------------------------------------------------------------------------------------
# Torn tails and corruption (SPEC 4.2)


def _make_session(store_root, sid="s", n=5):
    store = FileStore(store_root, durability="none")
    with store.create(sid) as log:
        log.append("x/e", {"i": 0})
        for i in range(1, n - 1):
            log.append("x/e", {"i": i, "pad": "é" * i})
        log.append("x/last", {"text": "日本語 é 😀 the end"})
        evs = list(log.events())
    return session_path(store_root, sid), evs


def test_truncate_at_every_offset_of_the_last_record(tmp_path, caplog):
    src_root = tmp_path / "src"
    path, evs = _make_session(src_root, "t", n=4)
    data = path.read_bytes()
    last_start = data.rstrip(b"\n").rfind(b"\n") + 1
    last_len = len(data) - last_start
    assert last_len > 40
    for keep in range(1, last_len):  # every cut strictly inside the last line (even just its "\n")
        root = tmp_path / f"cut{keep}"
        root.mkdir()
        target = session_path(root, "t")
        target.write_bytes(data[: last_start + keep])
        os.chmod(target, 0o600)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="kerman"):
            log = FileStore(root, durability="none").open("t")
        try:
            assert len(log) == 3, keep
            assert [e.to_json() for e in log.events()] == [e.to_json() for e in evs[:3]]
            assert target.read_bytes() == data[:last_start], keep
            assert kerman_records(caplog, logging.WARNING), f"no torn-tail warning at cut {keep}"
            ev = log.append("x/after", keep)
            assert ev.seq == 3
        finally:
            log.close()
        after = target.read_bytes()
        assert after.startswith(data[:last_start])
        raw = read_raw_session(target)
        assert all(ok for ok, _, _ in raw)
        assert [rec["seq"] for _, rec, _ in raw[1:]] == [0, 1, 2, 3]


def test_cut_exactly_at_a_record_boundary_is_clean(tmp_path, caplog):
    path, evs = _make_session(tmp_path / "r", "t", n=4)
    data = path.read_bytes()
    last_start = data.rstrip(b"\n").rfind(b"\n") + 1
    path.write_bytes(data[:last_start])
    with caplog.at_level(logging.WARNING, logger="kerman"):
        log = FileStore(tmp_path / "r").open("t")
    try:
        assert len(log) == 3
        assert kerman_records(caplog, logging.WARNING) == []
    finally:
        log.close()


def _line_spans(data: bytes):
    spans, pos = [], 0
    while pos < len(data):
        end = data.index(b"\n", pos) + 1
        spans.append((pos, end))
        pos = end
    return spans


def _flip(data: bytes, offset: int) -> bytes:
    b = bytearray(data)
    b[offset] ^= 0x01
    return bytes(b)


@pytest.mark.parametrize("seq", [0, 1, 2, 3])
def test_bit_flip_in_a_middle_record_is_corruption(store_root, seq):
    path, evs = _make_session(store_root, "c", n=5)
    data = path.read_bytes()
    spans = _line_spans(data)
    start, end = spans[seq + 1]  # line seq+2 (1-based) is spans[seq+1]
    damaged = _flip(data, start + 9 + (end - start - 9) // 2)  # inside the JSON
    path.write_bytes(damaged)
    store = FileStore(store_root, durability="none")
    for _ in range(2):  # refusing does not leave the session locked
        with pytest.raises(CorruptLogError) as exc:
            store.open("c")
        err = exc.value
        assert isinstance(err, kerman.LogError)
        assert not isinstance(err, UnsupportedFormatError)
        assert err.line == seq + 2
        assert err.seq == seq
        assert Path(err.path) == path
        assert path.read_bytes() == damaged  # nothing modified
    with pytest.raises(CorruptLogError) as exc:
        store.verify("c")
    assert exc.value.line == seq + 2
    assert path.read_bytes() == damaged


def test_bit_flip_in_the_checksum_is_corruption(store_root):
    path, _ = _make_session(store_root, "c", n=4)
    data = path.read_bytes()
    start, _ = _line_spans(data)[2]  # seq 1
    damaged = _flip(data, start + 3)
    path.write_bytes(damaged)
    with pytest.raises(CorruptLogError) as exc:
        FileStore(store_root).open("c")
    assert (exc.value.line, exc.value.seq) == (3, 1)
    assert path.read_bytes() == damaged


def test_bit_flip_in_the_last_record_is_a_torn_tail(store_root, caplog):
    path, evs = _make_session(store_root, "c", n=5)
    data = path.read_bytes()
    start, end = _line_spans(data)[-1]
    path.write_bytes(_flip(data, start + 20))
    with caplog.at_level(logging.WARNING, logger="kerman"):
        log = FileStore(store_root).open("c")
    try:
        assert [e.to_json() for e in log.events()] == [e.to_json() for e in evs[:-1]]
        assert path.read_bytes() == data[:start]
        assert kerman_records(caplog, logging.WARNING)
        assert log.append("x/again", 1).seq == len(evs) - 1
    finally:
        log.close()


def test_seq_gap_followed_by_valid_records_is_corruption(store_root):
    recs = [event_record(0, "x/a", 0), event_record(2, "x/a", 2), event_record(3, "x/a", 3)]
    path = session_path(store_root, "gap")
    original = write_raw_session(path, header_record("gap"), recs)
    with pytest.raises(CorruptLogError) as exc:
        FileStore(store_root).open("gap")
    assert (exc.value.line, exc.value.seq) == (3, 1)
    assert path.read_bytes() == original


def test_bad_envelope_followed_by_a_valid_record_is_corruption(store_root):
    recs = [
        event_record(0, "x/a", 0),
        event_record(1, "x/a", 1, surface_op="append"),  # surfaceOp on a non-surface type
        event_record(2, "x/a", 2),
    ]
    path = session_path(store_root, "env")
    original = write_raw_session(path, header_record("env"), recs)
    with pytest.raises(CorruptLogError) as exc:
        FileStore(store_root).open("env")
    assert (exc.value.line, exc.value.seq) == (3, 1)
    assert path.read_bytes() == original


def test_repeated_last_seq_is_a_torn_tail(store_root):
    recs = [event_record(0, "x/a", 0), event_record(1, "x/a", 1), event_record(1, "x/a", "dup")]
    path = session_path(store_root, "dup")
    data = write_raw_session(path, header_record("dup"), recs)
    log = FileStore(store_root).open("dup")
    try:
        assert [e.data for e in log.events()] == [0, 1]
    finally:
        log.close()
    assert path.read_bytes() == data[: _line_spans(data)[-1][0]]


def test_damaged_header_is_corruption_at_line_1(store_root):
    path, _ = _make_session(store_root, "h", n=3)
    data = path.read_bytes()
    damaged = _flip(data, 30)
    path.write_bytes(damaged)
    with pytest.raises(CorruptLogError) as exc:
        FileStore(store_root).open("h")
    assert (exc.value.line, exc.value.seq) == (1, 0)
    assert path.read_bytes() == damaged


def test_an_empty_file_is_a_creation_a_crash_lost_and_opens_as_an_empty_session(store_root, caplog):
    """A session becomes durable with its first sync (docs/format.md "Writing"): a power loss
    before it can leave its file empty (or holding part of its header). That is never a torn
    session: `read` shows it empty without touching it, `open` writes the header again."""
    path = session_path(store_root, "empty")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    assert FileStore(store_root).verify("empty")["events"] == 0 and path.read_bytes() == b""
    with caplog.at_level("WARNING", logger="kerman"), FileStore(store_root).open("empty") as log:
        assert len(log) == 0 and log.header["id"] == "empty"
        log.append("x/a", {})
    assert [r.getMessage() for r in caplog.records] == [
        'session "empty": its creation never reached the disk (a crash before its first sync left 0 bytes of its header);'
        " created it again, empty"
    ]
    with FileStore(store_root).open("empty") as log:
        assert [e.type for e in log.events()] == ["x/a"]


def test_header_naming_another_session_is_corruption(store_root):
    path = session_path(store_root, "mine")
    original = write_raw_session(path, header_record("theirs"), [event_record(0, "x/a", 0)])
    with pytest.raises(CorruptLogError) as exc:
        FileStore(store_root).open("mine")
    assert exc.value.line == 1
    assert path.read_bytes() == original


def test_extra_header_keys_are_kept(store_root):
    write_raw_session(session_path(store_root, "hx"), header_record("hx", cwd="/work", origin="subagent"), [event_record(0, "x/a", 0)])
    log = FileStore(store_root).open("hx")
    try:
        assert log.header == {"version": 1, "id": "hx", "createdAt": T0, "cwd": "/work", "origin": "subagent"}
    finally:
        log.close()


def test_time_stays_non_decreasing_after_reopen(store_root):
    future = 4_102_444_800_000  # 2100-01-01: later than the wall clock
    write_raw_session(session_path(store_root, "ft"), header_record("ft"), [event_record(0, "x/a", 0, time=future)])
    log = FileStore(store_root).open("ft")
    try:
        ev = log.append("x/a", 1)
        assert ev.time >= future
        assert log.append("x/a", 2).time >= ev.time
    finally:
        log.close()


def test_J_03_future_version_is_unsupported(store_root):
    path = session_path(store_root, "future")
    original = write_raw_session(
        path,
        # structurally foreign too: no createdAt, unknown keys, and a garbage record after it
        {"type": "session", "version": 3, "id": "future", "compression": "zstd", "layout": {"v": 3}},
        [b"not a v1 record at all\n", event_record(0, "x/a", 0)],
    )
    store = FileStore(store_root)
    with pytest.raises(UnsupportedFormatError) as exc:
        store.open("future")
    err = exc.value
    assert not isinstance(err, CorruptLogError)
    assert isinstance(err, kerman.LogError)
    assert err.found == 3 and err.supported == 2
    assert Path(err.path) == path
    text = str(err)
    assert "3" in text and "1 and 2" in text
    assert str(path) in text
    assert path.read_bytes() == original
    with pytest.raises(UnsupportedFormatError):
        store.verify("future")
    with pytest.raises(UnsupportedFormatError):
        store.repair("future")
    assert path.read_bytes() == original


def test_older_version_is_unsupported(store_root):
    path = session_path(store_root, "old")
    write_raw_session(path, header_record("old", version=0), [event_record(0, "x/a", 0)])
    with pytest.raises(UnsupportedFormatError) as exc:
        FileStore(store_root).open("old")
    assert exc.value.found == 0 and exc.value.supported == 2
    assert "0" in str(exc.value) and "1 and 2" in str(exc.value)


def test_verify_reports_a_torn_tail_without_modifying_the_file(store_root):
    path, evs = _make_session(store_root, "v", n=4)
    data = path.read_bytes()
    torn = data[:-7]
    path.write_bytes(torn)
    store = FileStore(store_root)
    report = store.verify("v")
    assert report["torn_tail_bytes"] == len(torn) - data.rstrip(b"\n").rfind(b"\n") - 1
    assert report["events"] == 3
    assert report["size_bytes"] == len(torn)
    assert Path(report["path"]) == path
    assert path.read_bytes() == torn
    log = store.open("v")  # open repairs it
    log.close()
    assert store.verify("v")["torn_tail_bytes"] == 0


def test_verify_of_a_clean_session(store_root):
    path, evs = _make_session(store_root, "v", n=4)
    report = FileStore(store_root).verify("v")
    assert report["events"] == 4
    assert report["torn_tail_bytes"] == 0
    assert report["size_bytes"] == path.stat().st_size


def test_repair_keeps_a_corrupt_copy_and_then_opens(store_root):
    path, evs = _make_session(store_root, "r", n=5)
    data = path.read_bytes()
    spans = _line_spans(data)
    start, end = spans[3]  # seq 2
    damaged = _flip(data, start + 15)
    path.write_bytes(damaged)
    store = FileStore(store_root)
    with pytest.raises(CorruptLogError):
        store.open("r")
    report = store.repair("r")
    backup = Path(report["backup"])
    assert backup.read_bytes() == damaged
    assert backup.parent == path.parent and backup.name.startswith(path.name + ".corrupt")
    assert Path(report["quarantine"]).read_bytes() == damaged[start:end]
    # every record that verifies is kept at its seq; seq 2 holds a placeholder
    assert (report["kept_events"], report["events"], report["lost_seqs"]) == (4, 6, [[2, 2]])
    assert report["removed_bytes"] == end - start
    log = store.open("r")
    try:
        kept = [e.to_json() for e in log.events()]
        assert kept[:2] + kept[3:5] == [e.to_json() for e in evs[:2] + evs[3:]]
        assert (log[2].type, log[2].data) == ("log/damaged", {"seqs": [2, 2], "lines": [4, 4], "backup": "r.jsonl.corrupt"})
        assert log[5].type == "log/repaired" and log[5].data["lostSeqs"] == [[2, 2]]
        assert log.append("x/new", 1).seq == 6
    finally:
        log.close()
    assert store.list() == ["r"]  # the backup and the quarantine are not sessions


def test_J_02_committed_lines_are_never_rewritten(file_store, store_root):
    path = session_path(store_root, "j2")
    log = file_store.create("j2")
    fill(log, 3)
    log.close()
    first = path.read_bytes()
    log = file_store.open("j2")
    fill(log, 2, start=3)
    log.close()
    second = path.read_bytes()
    assert second.startswith(first) and len(second) > len(first)
    log = file_store.open("j2")
    log.close()
    assert path.read_bytes() == second  # a reopen of a clean log writes nothing
    # after a torn tail only the tail is cut: the committed prefix survives byte for byte
    path.write_bytes(second + b'0badc0de {"type":"x/e","se')
    log = file_store.open("j2")
    log.append("x/e", "after-repair")
    log.close()
    third = path.read_bytes()
    assert third.startswith(second)
    assert [rec["seq"] for _, rec, _ in read_raw_session(path)[1:]] == list(range(6))


# ---------------------------------------------------------------------------------------------
# Durability modes


def test_every_durability_mode_flushes_everything(durable_file_store, store_root, durability):
    assert durable_file_store.durability == durability
    path = session_path(store_root, "d")
    log = durable_file_store.create("d")

    async def main():
        evs = [log.append("x/d", {"i": i}) for i in range(50)]
        await log.flush()
        return evs

    try:
        evs = run(main())
        # a fresh reader of the bytes sees every event, framed and checksummed
        raw = read_raw_session(path)
        assert all(ok for ok, _, _ in raw)
        assert [line[9:-1].decode() for _, _, line in raw[1:]] == [e.to_json() for e in evs]
        more = [log.append("x/d", {"i": i}) for i in range(50, 60)]
        run(flushed(log))
        raw = read_raw_session(path)
        assert len(raw) == 61
    finally:
        log.close()
    reader = FileStore(store_root, durability=durability).open("d")
    try:
        assert [e.to_json() for e in reader.events()] == [e.to_json() for e in evs + more]
    finally:
        reader.close()


def test_close_flushes_in_every_mode(durable_file_store, store_root):
    log = durable_file_store.create("c")
    evs = fill(log, 20)
    log.close()
    raw = read_raw_session(session_path(store_root, "c"))
    assert [line[9:-1].decode() for _, _, line in raw[1:]] == [e.to_json() for e in evs]


def test_flush_barriers_from_several_tasks(durable_file_store, store_root):
    log = durable_file_store.create("b")

    async def writer(k):
        for i in range(10):
            log.append("x/b", {"k": k, "i": i})
            await log.flush()

    async def main():
        await asyncio.gather(*(writer(k) for k in range(5)))

    try:
        run(main())
        raw = read_raw_session(session_path(store_root, "b"))
        assert len(raw) == 51
        assert [rec["seq"] for _, rec, _ in raw[1:]] == list(range(50))
    finally:
        log.close()


def test_default_durability_is_checkpoint(store_root):
    assert FileStore(store_root).durability == "checkpoint"


@pytest.mark.parametrize("name", ["fast", "", "STRICT", "fsync"])
def test_invalid_durability_name_is_a_value_error(store_root, name):
    with pytest.raises(ValueError) as exc:
        FileStore(store_root, durability=name)
    assert repr(name) in str(exc.value) or f'"{name}"' in str(exc.value)


# ---------------------------------------------------------------------------------------------
# Locking across processes

CHILD = textwrap.dedent(
    """
    import sys
    import kerman
    store = kerman.FileStore(sys.argv[1], durability="strict")
    log = store.open(sys.argv[2])
    log.append("child/was-here", {"pid": 1})
    print("ready", flush=True)
    sys.stdin.readline()
    log.close()
    print("closed", flush=True)
    """
)


def test_lock_across_processes(store_root, tmp_path):
    store = FileStore(store_root, durability="none")
    with store.create("shared") as log:
        log.append("x/parent", 0)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(store_root), "shared"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        text=True,
    )
    try:
        line = child.stdout.readline()
        assert line == "ready\n", child.stderr.read() if not line else line
        with pytest.raises(SessionLockedError):
            store.open("shared")
        with pytest.raises(SessionLockedError):
            store.delete("shared")
        # reading takes no lock; the child's append may still be on its way to the file
        assert store.verify("shared")["events"] in (1, 2)
        with pytest.raises(SessionExistsError):
            store.create("shared")
        out, err = child.communicate("go\n", timeout=60)
        assert child.returncode == 0, err
        assert out == "closed\n"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    log = store.open("shared")
    try:
        assert [e.type for e in log.events()] == ["x/parent", "child/was-here"]
    finally:
        log.close()


def test_lock_is_released_when_the_owner_process_dies(store_root, tmp_path):
    store = FileStore(store_root, durability="none")
    with store.create("k") as log:
        log.append("x/parent", 0)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(store_root), "k"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
        text=True,
    )
    try:
        assert child.stdout.readline() == "ready\n"
        with pytest.raises(SessionLockedError):
            store.open("k")
    finally:
        child.kill()
        child.wait()
        child.stdin.close()
        child.stdout.close()
    log = store.open("k")
    try:
        assert log[0].type == "x/parent"
        # whatever the killed child managed to write, the file is consistent
        assert all(ok for ok, _, _ in read_raw_session(session_path(store_root, "k")))
    finally:
        log.close()
