"""The ``kerman`` command line and the timeline formatter it shares with the demo."""

from __future__ import annotations

import datetime
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import types
from pathlib import Path
from typing import Any, Optional

import pytest

import kerman
from kerman import cli
from kerman.cli._timeline import format_event, summarize

# -- building session files --------------------------------------------------------------------


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), bit by bit."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def record(obj: Any) -> bytes:
    body = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
    return b"%08x " % crc32c(body) + body + b"\n"


SURFACE = {"user/message", "assistant/message", "tool/result"}


def write_session(root: Path, sid: str, events: list[dict[str, Any]], version: int = 1) -> Path:
    """A session file written by hand: events are ``{"type", "data", "sourceEventSeqs"?}``."""
    lines = [record({"type": "session", "version": version, "id": sid, "createdAt": 0})]
    for seq, event in enumerate(events):
        envelope: dict[str, Any] = {"type": event["type"], "seq": seq, "time": 1000 + 250 * seq, "data": event["data"]}
        if "sourceEventSeqs" in event:
            envelope["sourceEventSeqs"] = event["sourceEventSeqs"]
        if event["type"] in SURFACE:
            envelope["surfaceOp"] = "append"
        lines.append(record(envelope))
    path = root / f"{sid}.jsonl"
    path.write_bytes(b"".join(lines))
    return path


def user(text: str, mid: str, source: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    return {"id": mid, "role": "user", "content": [{"type": "text", "text": text}], "source": source or {"kind": "user"}}


ASSISTANT = {
    "id": "a-1",
    "role": "assistant",
    "content": [
        {"type": "text", "text": "Let me look"},
        {"type": "tool-call", "id": "c1", "name": "read", "arguments": '{"path":"a.txt"}'},
    ],
    "source": {"kind": "model"},
}
TOOL_RESULT = {
    "id": "t-1",
    "role": "user",
    "content": [{"type": "tool-result", "toolCallId": "c1", "content": [{"type": "text", "text": "no such file"}], "isError": True}],
    "source": {"kind": "tool", "callId": "c1"},
}


def turn(n: int, reason: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "turn/start", "data": {"turn": n}}, {"type": "turn/end", "data": {"turn": n, "reason": reason}}]


LOOP_EVENTS: list[dict[str, Any]] = [
    {"type": "agent/inbox/spliced", "data": {"target": "next-turn", "start": 0, "inserted": [user("hello world", "m-1")]}},
    {"type": "turn/start", "data": {"turn": 1}},
    {"type": "agent/inbox/spliced", "data": {"target": "next-turn", "start": 0, "removedCount": 1, "inserted": []}},
    {"type": "step/start", "data": {"turn": 1, "step": 1}},
    {"type": "user/message", "data": user("hello world", "m-1")},
    {"type": "assistant/chunk", "data": {"turn": 1, "step": 1, "chunk": {"type": "text-delta", "text": "Let me"}}},
    {"type": "assistant/message", "data": {"turn": 1, "step": 1, "message": ASSISTANT}, "sourceEventSeqs": [5]},
    {"type": "tool/call", "data": {"turn": 1, "step": 1, "callId": "c1", "name": "read", "arguments": '{"path":"a.txt"}'}},
    {
        "type": "tool/result",
        "data": {"turn": 1, "step": 1, "message": TOOL_RESULT, "error": {"name": "FileNotFoundError", "code": "TOOL_ERROR"}},
        "sourceEventSeqs": [7],
    },
    {"type": "step/end", "data": {"turn": 1, "step": 1}},
    {"type": "turn/end", "data": {"turn": 1, "reason": {"kind": "completed"}}},
    *turn(2, {"kind": "aborted", "reason": {"kind": "user"}}),
    *turn(3, {"kind": "blocked", "reason": "policy says no"}),
    *turn(4, {"kind": "error", "error": {"message": "rate limited", "code": "RATE_LIMIT"}}),
    *turn(5, {"kind": "interrupted"}),
    {"type": "user/message", "data": user("workspace: 3 files", "m-2", {"kind": "plugin", "plugin": "ws"})},
    {"type": "request/header", "data": {"options": {"model": "m", "temperature": 0}}},
    {"type": "goal/change", "data": {"goal": "ship it"}},
]

# The summary each LOOP_EVENTS entry must get, in order.
LOOP_SUMMARIES = [
    '+next-turn "hello world" (m-1)',
    "turn 1",
    "claim next-turn ×1",
    "turn 1 step 1",
    '"hello world"',
    'text-delta "Let me"',
    '"Let me look" → read({"path":"a.txt"})',
    'read({"path":"a.txt"}) #c1',
    '#c1 "no such file" error TOOL_ERROR',
    "turn 1 step 1",
    "turn 1 completed",
    "turn 2",
    "turn 2 aborted (user)",
    "turn 3",
    "turn 3 blocked: policy says no",
    "turn 4",
    "turn 4 error: rate limited [RATE_LIMIT]",
    "turn 5",
    "turn 5 interrupted",
    '"workspace: 3 files" [plugin:ws]',
    'options {"model":"m","temperature":0}',
    '{"goal":"ship it"}',
]


def make_store(tmp_path: Path, sid: str = "s1", prompts: int = 2) -> tuple[Path, list[kerman.UserMessage]]:
    """A FileStore folder with one session: ``prompts`` queued prompts, one steering, one context
    message, one removed prompt and a plugin event."""
    root = tmp_path / "store"
    store = kerman.FileStore(root, durability="none")
    with store.create(sid) as log:
        inbox = kerman.Inbox(log)
        queued = [inbox.append("next-turn", f"prompt {i}") for i in range(prompts)]
        inbox.append("next-step", "steer this way")
        inbox.append("next-step", kerman.UserMessage("context note", source={"kind": "plugin", "plugin": "ws"}))
        gone = inbox.append("next-turn", "stale prompt")
        inbox.remove(gone.id)
        log.append("goal/change", {"goal": "answer"})
    return root, queued


def session_file(root: Path, sid: str) -> Path:
    return root / f"{sid}.jsonl"


def corrupt_middle(path: Path) -> None:
    """Flips one byte inside the second event record (line 3), so valid records follow it."""
    data = bytearray(path.read_bytes())
    lines = data.split(b"\n")
    offset = len(lines[0]) + len(lines[1]) + 2 + 20  # inside line 3's JSON
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def tear_tail(path: Path) -> int:
    """Cuts the last record in the middle; returns how many bytes of it remain."""
    data = path.read_bytes()
    last_start = data.rstrip(b"\n").rfind(b"\n") + 1
    cut = last_start + (len(data) - last_start) // 2
    path.write_bytes(data[:cut])
    return cut - last_start


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_no_traceback(err: str) -> None:
    assert "Traceback" not in err


# -- timeline formatting -----------------------------------------------------------------------


def test_crc32c_matches_the_format_check_value() -> None:
    assert crc32c(b"123456789") == 0xE3069283


def test_summaries_of_every_core_event_type(tmp_path: Path) -> None:
    write_session(tmp_path, "s", LOOP_EVENTS)
    _, events, _ = kerman.FileStore(tmp_path, durability="none")._read("s")
    assert [summarize(e) for e in events] == LOOP_SUMMARIES
    # the wire dicts summarize the same way as the Event objects
    assert [summarize(e.to_dict()) for e in events] == LOOP_SUMMARIES


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"target": "next-step", "start": 0, "removedCount": 2, "inserted": [], "outcome": "canceled"}, "-next-step ×2 canceled"),
        ({"target": "next-turn", "start": 1, "removedCount": 1, "inserted": [], "outcome": "canceled"}, "-next-turn at 1 ×1 canceled"),
        (
            {"target": "next-turn", "start": 0, "removedCount": 1, "inserted": [user("new", "m-9")], "outcome": "canceled"},
            'replace next-turn ×1 → "new" (m-9) canceled',
        ),
        ({"target": "next-step", "start": 0, "inserted": [user("a", "x1"), user("b", "x2")]}, '+next-step "a" (x1), "b" (x2)'),
    ],
)
def test_splice_summaries(data: dict[str, Any], expected: str) -> None:
    assert summarize({"type": "agent/inbox/spliced", "seq": 0, "time": 0, "data": data}) == expected


def test_splice_summary_shortens_minted_ids(tmp_path: Path) -> None:
    log = kerman.MemoryStore().create("m")
    message = kerman.Inbox(log).append("next-turn", "hello world")
    assert summarize(log[0]) == f'+next-turn "hello world" (…{message.id[-6:]})'


def test_other_summaries() -> None:
    def s(kind: str, data: Any) -> str:
        return summarize({"type": kind, "seq": 0, "time": 0, "data": data})

    assert (
        s("turn/end", {"turn": 6, "reason": {"kind": "aborted", "reason": {"kind": "hook", "reason": "budget"}}})
        == "turn 6 aborted (hook: budget)"
    )
    assert s("turn/end", {"turn": 7, "reason": {"kind": "blocked"}}) == "turn 7 blocked"
    assert (
        s("turn/end", {"turn": 9, "reason": {"kind": "aborted", "reason": {"kind": "rollback"}}})
        == "turn 9 rolled back: aborted (rollback), out of the history from here"
    )
    assert s("turn/end", {"turn": 9, "reason": {"kind": "aborted", "reason": {"kind": "interrupt"}}}) == "turn 9 aborted (interrupt)"
    assert s("turn/end", {"turn": 8, "reason": {"kind": "max-tokens"}}) == "turn 8 max-tokens"
    assert (
        s(
            "assistant/message",
            {
                "turn": 1,
                "step": 1,
                "interrupted": True,
                "message": {"id": "a", "role": "assistant", "content": [{"type": "text", "text": "half"}]},
            },
        )
        == '"half" (interrupted)'
    )
    assert s("assistant/chunk", {"turn": 1, "step": 1, "chunk": {"type": "finish", "reason": "stop"}}) == "finish stop"
    assert s("user/message", user("x" * 100, "m")) == '"' + "x" * 59 + '…"'
    long_plugin = s("plugin/thing", {"blob": "y" * 200})
    assert long_plugin.startswith('{"blob":"yyy') and len(long_plugin) == 80 and long_plugin.endswith("…")


@pytest.mark.parametrize(
    "data",
    [
        None,
        5,
        "text",
        [1, 2],
        {"turn": {"nested": []}, "reason": 3},
        {"inserted": "not a list"},
        {"message": ["odd"]},
        {"chunk": None},
        {"header": 7},
        {"reason": {"kind": 9}},
    ],
)
@pytest.mark.parametrize(
    "kind",
    [
        "agent/inbox/spliced",
        "turn/start",
        "turn/end",
        "step/start",
        "user/message",
        "assistant/message",
        "assistant/chunk",
        "tool/call",
        "tool/result",
        "request/header",
        "plugin/x",
    ],
)
def test_summarize_never_raises_on_odd_data(kind: str, data: Any) -> None:
    text = summarize({"type": kind, "seq": 1, "time": "not a time", "data": data})
    assert isinstance(text, str) and text
    line = format_event({"type": kind, "seq": 1, "time": "not a time", "data": data})
    assert line.startswith("    1  ") and "\n" not in line


def test_summaries_escape_control_characters() -> None:
    text = summarize({"type": "user/message", "seq": 0, "time": 0, "data": user("red\x1b[31m\nnext\x9b", "m")})
    assert text == '"red\\x1b[31m\\nnext\\x9b"'
    line = format_event({"type": "evil/\x1b]0;x\x07", "seq": 0, "time": 0, "data": {"k": "\x1b"}})
    assert "\x1b" not in line and "\x07" not in line


def test_format_event_columns_and_clock() -> None:
    event = {"type": "turn/start", "seq": 7, "time": 1_700_000_000_123, "data": {"turn": 2}}
    clock = datetime.datetime.fromtimestamp(1_700_000_000.123).strftime("%H:%M:%S") + ".123"
    assert format_event(event) == f"    7  {clock}  turn/start           turn 2"
    assert format_event(event, t0=1_700_000_000_000) == "    7       +0.123s  turn/start           turn 2"


# -- log list ----------------------------------------------------------------------------------


def test_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, _ = make_store(tmp_path, "beta")
    store = kerman.FileStore(root, durability="none")
    with store.create("alpha") as log:
        log.append("goal/change", {"goal": "x"})
    code, out, err = run(capsys, "log", "list", str(root))
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert [line.split()[0] for line in lines] == ["alpha", "beta"]
    assert "1 event " in lines[0] and "7 events" in lines[1]
    assert lines[1].rstrip().endswith(cli.human_size(session_file(root, "beta").stat().st_size))

    code, out, _ = run(capsys, "log", "list", str(root), "--json")
    assert code == 0
    assert json.loads(out) == [
        {"id": "alpha", "events": 1, "size_bytes": session_file(root, "alpha").stat().st_size, "status": "ok"},
        {"id": "beta", "events": 7, "size_bytes": session_file(root, "beta").stat().st_size, "status": "ok"},
    ]


def test_list_marks_damaged_and_locked_sessions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, _ = make_store(tmp_path, "bad")
    store = kerman.FileStore(root, durability="none")
    for sid in ("torn", "busy"):
        with store.create(sid) as log:
            log.append("goal/change", {"goal": 1})
            log.append("goal/change", {"goal": 2})
    corrupt_middle(session_file(root, "bad"))
    tear_tail(session_file(root, "torn"))
    with store.open("busy"):  # an open session is read without its lock
        code, out, _ = run(capsys, "log", "list", str(root), "--json")
    assert code == 0
    status = {row["id"]: (row["status"], row["events"]) for row in json.loads(out)}
    assert status == {"bad": ("corrupt", None), "busy": ("ok", 2), "torn": ("torn-tail", 1)}


def test_list_of_an_empty_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "log", "list", str(tmp_path), "--json")
    assert (code, json.loads(out)) == (0, [])
    code, out, err = run(capsys, "log", "list", str(tmp_path))
    assert (code, out) == (0, "") and "no sessions" in err


@pytest.mark.parametrize("argv", [["list"], ["show", "s1"], ["tail", "s1"], ["inbox", "s1"], ["verify", "s1"], ["repair", "s1", "--yes"]])
def test_a_missing_store_is_exit_2_and_not_created(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    missing = tmp_path / "nowhere"
    code, out, err = run(capsys, "log", argv[0], str(missing), *argv[1:])
    assert code == 2 and out == ""
    assert err == f"kerman: no session store at {missing}\n"
    assert not missing.exists()


# -- log show / tail ---------------------------------------------------------------------------


def test_show_prints_a_header_and_one_line_per_event(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_session(tmp_path, "s", LOOP_EVENTS)
    code, out, err = run(capsys, "log", "show", str(tmp_path), "s")
    assert code == 0 and err == ""
    lines = out.splitlines()
    created = datetime.datetime.fromtimestamp(0).isoformat(sep=" ", timespec="seconds")
    assert lines[0] == f'session "s"  created {created}  format 1  {len(LOOP_EVENTS)} events'
    _, events, _ = kerman.FileStore(tmp_path, durability="none")._read("s")
    assert lines[1:] == [format_event(e) for e in events]
    assert [line.split(None, 3)[3] for line in lines[1:]] == LOOP_SUMMARIES


def test_show_filters_by_type_and_seq(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_session(tmp_path, "s", LOOP_EVENTS)
    code, out, _ = run(capsys, "log", "show", str(tmp_path), "s", "--types", "turn/*", "goal/change", "--from", "12")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].endswith(f"{len(LOOP_EVENTS)} events (showing 8)")
    assert [int(line.split()[0]) for line in lines[1:]] == [12, 13, 14, 15, 16, 17, 18, 21]
    code, out, _ = run(capsys, "log", "show", str(tmp_path), "s", "--types", "step/start,step/end", "--relative")
    assert [line.split()[:2] for line in out.splitlines()[1:]] == [["3", "+0.000s"], ["9", "+1.500s"]]


def test_show_json_is_exactly_the_stored_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_session(tmp_path, "s", LOOP_EVENTS)
    code, out, err = run(capsys, "log", "show", str(tmp_path), "s", "--json")
    assert code == 0 and err == ""
    stored = [line.split(b" ", 1)[1].decode() for line in path.read_bytes().splitlines()[1:]]
    assert out.splitlines() == stored
    code, out, _ = run(capsys, "log", "show", str(tmp_path), "s", "--json", "--types", "tool/call")
    assert [json.loads(line)["seq"] for line in out.splitlines()] == [7]


def test_tail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "store"
    with kerman.FileStore(root, durability="none").create("t") as log:
        for i in range(30):
            log.append("goal/change", {"goal": i})
    code, out, _ = run(capsys, "log", "tail", str(root), "t")
    lines = out.splitlines()
    assert code == 0 and lines[0].endswith("30 events (showing 20)")
    assert [int(line.split()[0]) for line in lines[1:]] == list(range(10, 30))
    code, out, _ = run(capsys, "log", "tail", str(root), "t", "-n", "3", "--json")
    assert [json.loads(line)["data"] for line in out.splitlines()] == [{"goal": 27}, {"goal": 28}, {"goal": 29}]
    code, out, _ = run(capsys, "log", "tail", str(root), "t", "-n", "0", "--json")
    assert (code, out) == (0, "")


def test_show_of_a_torn_tail_shows_the_valid_events_and_leaves_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, _ = make_store(tmp_path)
    path = session_file(root, "s1")
    tear_tail(path)
    before = path.read_bytes()
    code, out, err = run(capsys, "log", "show", str(root), "s1", "--json")
    assert code == 0
    assert [json.loads(line)["seq"] for line in out.splitlines()] == list(range(6))
    assert "torn tail" in err
    assert path.read_bytes() == before


# -- log inbox ---------------------------------------------------------------------------------


def test_inbox_groups_pending_messages(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, queued = make_store(tmp_path)
    code, out, err = run(capsys, "log", "inbox", str(root), "s1")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == "queued (2)"
    assert lines[1] == f'  {queued[0].id}  "prompt 0"'
    assert lines[2] == f'  {queued[1].id}  "prompt 1"'
    assert lines[3] == "steering (1)" and lines[4].endswith('"steer this way"')
    assert lines[5] == "context (1)" and lines[6].endswith('"context note" [plugin:ws]')
    assert "stale" not in out


def test_inbox_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, queued = make_store(tmp_path)
    code, out, _ = run(capsys, "log", "inbox", str(root), "s1", "--json")
    assert code == 0
    items = json.loads(out)
    assert [i["placement"] for i in items] == ["queued", "queued", "steering", "context"]
    assert items[0]["message"] == queued[0].to_dict()
    assert items[3]["message"]["source"] == {"kind": "plugin", "plugin": "ws"}


def test_inbox_empty(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_session(tmp_path, "s", LOOP_EVENTS)  # the only prompt was claimed
    assert run(capsys, "log", "inbox", str(tmp_path), "s") == (0, "inbox empty\n", "")
    assert run(capsys, "log", "inbox", str(tmp_path), "s", "--json") == (0, "[]\n", "")


def test_inbox_with_an_invalid_splice_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_session(
        tmp_path,
        "s",
        [
            {"type": "agent/inbox/spliced", "data": {"target": "next-turn", "start": 0, "inserted": [user("a", "m")]}},
            {"type": "agent/inbox/spliced", "data": {"target": "next-turn", "start": 0, "inserted": [user("b", "m")]}},
        ],
    )
    code, out, err = run(capsys, "log", "inbox", str(tmp_path), "s")
    assert code == 1 and out == ""
    assert "seq 1" in err
    assert_no_traceback(err)


# -- log verify --------------------------------------------------------------------------------


def test_verify_ok(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, _ = make_store(tmp_path)
    size = session_file(root, "s1").stat().st_size
    assert run(capsys, "log", "verify", str(root), "s1") == (0, f"ok: 7 events, {cli.human_size(size)}, torn tail: none\n", "")
    code, out, _ = run(capsys, "log", "verify", str(root), "s1", "--json")
    assert code == 0
    assert json.loads(out) == {"ok": True, "path": str(session_file(root, "s1")), "events": 7, "size_bytes": size, "torn_tail_bytes": 0}


def test_verify_reports_a_torn_tail_without_touching_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, _ = make_store(tmp_path)
    path = session_file(root, "s1")
    torn = tear_tail(path)
    before = path.read_bytes()
    code, out, _ = run(capsys, "log", "verify", str(root), "s1")
    assert code == 0
    assert out == (f"ok: 6 events, {cli.human_size(len(before))}, torn tail: {torn} bytes (will be truncated on next open)\n")
    assert path.read_bytes() == before


def test_verify_a_corrupt_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, _ = make_store(tmp_path)
    path = session_file(root, "s1")
    corrupt_middle(path)
    before = path.read_bytes()
    code, out, err = run(capsys, "log", "verify", str(root), "s1")
    assert code == 1 and out == ""
    assert str(path) in err and "line 3" in err and "seq 1" in err
    assert f"kerman log repair {root} s1" in err
    assert_no_traceback(err)
    assert path.read_bytes() == before

    code, out, err = run(capsys, "log", "verify", str(root), "s1", "--json")
    assert code == 1
    report = json.loads(out)
    assert (report["ok"], report["error"], report["path"], report["line"], report["seq"]) == (False, "corrupt", str(path), 3, 1)


@pytest.mark.parametrize("command", ["show", "tail", "inbox"])
def test_reading_commands_refuse_a_corrupt_log(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    root, _ = make_store(tmp_path)
    corrupt_middle(session_file(root, "s1"))
    code, out, err = run(capsys, "log", command, str(root), "s1")
    assert code == 1 and out == ""
    assert "line 3" in err and "kerman log repair" in err
    assert_no_traceback(err)


@pytest.mark.parametrize("command", ["show", "tail", "inbox", "verify", "repair"])
def test_an_unsupported_format_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    write_session(tmp_path, "s", LOOP_EVENTS[:2], version=3)
    extra = ["--yes"] if command == "repair" else []
    code, out, err = run(capsys, "log", command, str(tmp_path), "s", *extra)
    assert code == 1 and out == ""
    assert err.startswith("kerman: ") and "s.jsonl" in err and "version 3" in err
    assert_no_traceback(err)


@pytest.mark.parametrize("command", ["show", "tail", "inbox", "verify"])
def test_reading_commands_read_a_session_that_is_open(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    """Readers take no lock (issue 11 item 3): they see what is committed so far."""
    root, _ = make_store(tmp_path)
    alone = run(capsys, "log", command, str(root), "s1", "--json")
    with kerman.FileStore(root, durability="none").open("s1"):
        assert run(capsys, "log", command, str(root), "s1", "--json") == alone
    assert alone[0] == 0 and alone[1]


def test_repair_of_an_open_session_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, _ = make_store(tmp_path)
    with kerman.FileStore(root, durability="none").open("s1"):
        code, out, err = run(capsys, "log", "repair", str(root), "s1", "--yes")
    assert code == 1 and out == ""
    assert err.startswith('kerman: session "s1" is locked by a session log still open in this process')
    assert_no_traceback(err)


@pytest.mark.parametrize("command", ["show", "tail", "inbox", "verify", "repair"])
def test_an_unknown_session(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    root, _ = make_store(tmp_path)
    code, out, err = run(capsys, "log", command, str(root), "nope")
    assert (code, out, err) == (1, "", f'kerman: session "nope" not found in {root}\n')


def test_an_invalid_session_id_is_bad_usage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "log", "show", str(tmp_path), "")
    assert code == 2 and out == "" and "session id" in err
    assert_no_traceback(err)


# -- log repair --------------------------------------------------------------------------------


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_repair_without_yes_refuses_when_stdin_is_not_a_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, _ = make_store(tmp_path)
    path = session_file(root, "s1")
    corrupt_middle(path)
    before = path.read_bytes()
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    code, out, err = run(capsys, "log", "repair", str(root), "s1")
    assert code == 1
    assert "line 3" in out and ".corrupt" in out  # the plan was explained
    assert "--yes" in err and "terminal" in err
    assert path.read_bytes() == before
    assert not Path(str(path) + ".corrupt").exists()


def test_repair_asks_on_a_terminal(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    root, _ = make_store(tmp_path)
    path = session_file(root, "s1")
    corrupt_middle(path)
    before = path.read_bytes()

    monkeypatch.setattr(sys, "stdin", _Terminal("n\n"))
    code, out, err = run(capsys, "log", "repair", str(root), "s1")
    assert code == 1 and "[y/N]" in out and "nothing was changed" in err
    assert path.read_bytes() == before

    monkeypatch.setattr(sys, "stdin", _Terminal("y\n"))
    code, out, err = run(capsys, "log", "repair", str(root), "s1")
    assert code == 0, err
    assert "kept 6 events that verify," in out and f"backup: {path}.corrupt" in out
    assert "  seq 1 lost\n" in out and f"set aside: {path}.damaged" in out
    assert Path(f"{path}.corrupt").read_bytes() == before
    # 6 kept, a placeholder at seq 1, the log/repaired record
    assert kerman.FileStore(root, durability="none").verify("s1")["events"] == 8


def test_repair_yes_on_a_corrupt_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, _ = make_store(tmp_path)
    path = session_file(root, "s1")
    corrupt_middle(path)
    before = path.read_bytes()
    code, out, err = run(capsys, "log", "repair", str(root), "s1", "--yes")
    assert code == 0 and err == ""
    removed = len(Path(f"{path}.damaged").read_bytes())
    lines = before.splitlines(keepends=True)
    assert removed == len(lines[2]) > 0  # only line 3 is set aside
    assert out == (
        f"repaired: kept 6 events that verify, removed {cli.human_size(removed)}; the log now holds 8 events:\n"
        f"  line 3 ({cli.human_size(removed)}, claims seq 1): {_checksum_detail(lines[2])}\n"
        f"  seq 1 lost\n"
        f"backup: {path}.corrupt\nset aside: {path}.damaged\n"
    )
    assert run(capsys, "log", "verify", str(root), "s1")[0] == 0
    _, out, _ = run(capsys, "log", "show", str(root), "s1", "--types", "log/*")
    assert [line.split(None, 3)[2:] for line in out.splitlines()[1:]] == [
        ["log/damaged", "lost (seq 1; line 3 of s1.jsonl.corrupt)"],
        ["log/repaired", "1 line set aside, seq 1 lost; backup s1.jsonl.corrupt"],
    ]


def _checksum_detail(line: bytes) -> str:
    return f"checksum mismatch (stored {line[:8].decode()}, computed {crc32c(line[9:-1]):08x})"


@pytest.mark.parametrize("command", ["show", "tail", "inbox"])
def test_allow_damaged_reads_what_verifies_and_names_what_it_skips(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    root, _ = make_store(tmp_path)
    path = session_file(root, "s1")
    corrupt_middle(path)
    before = path.read_bytes()
    code, out, err = run(capsys, "log", command, str(root), "s1", "--json", "--allow-damaged")
    line = before.splitlines(keepends=True)[2]
    assert err.startswith(
        "kerman: s1: the file is damaged; showing the 6 records that verify (a lost seq is a gap); "
        "nothing was modified. Skipped:\n"
        f"kerman:   line 3 ({cli.human_size(len(line))}, claims seq 1): {_checksum_detail(line)}\n"
        "kerman:   seq 1 lost\n"
        f"kerman: to repair it, run: kerman log repair {root} s1\n"
    )
    if command == "inbox":
        # seq 1 inserted "prompt 1": the later splices no longer fit, and it says so
        assert (code, out) == (1, "")
        assert err.endswith(
            "kerman: invalid persisted inbox splice at session seq 4: invalid inbox splice\n"
            "kerman: the inbox cannot be rebuilt without the records that are lost; the ones "
            f"that verify are shown by: kerman log show {root} s1 --allow-damaged\n"
        )
    else:
        assert code == 0 and err.count("\n") == 4
        assert [json.loads(x)["seq"] for x in out.splitlines()] == [0, 2, 3, 4, 5, 6]
    assert path.read_bytes() == before and sorted(os.listdir(root)) == ["s1.jsonl"]


def test_repair_yes_on_a_torn_tail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, _ = make_store(tmp_path)
    path = session_file(root, "s1")
    torn = tear_tail(path)
    code, out, _ = run(capsys, "log", "repair", str(root), "s1", "--yes")
    assert code == 0
    assert out == f"repaired: kept 6 events, removed {torn} B\nbackup: none (only a torn tail was removed)\n"
    assert kerman.FileStore(root, durability="none").verify("s1")["torn_tail_bytes"] == 0


def test_repair_of_a_healthy_log_changes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, _ = make_store(tmp_path)
    path = session_file(root, "s1")
    before = path.read_bytes()
    code, out, _ = run(capsys, "log", "repair", str(root), "s1")  # no prompt needed
    assert code == 0 and out.startswith("nothing to repair: ok: 7 events")
    assert path.read_bytes() == before
    assert run(capsys, "log", "repair", str(root), "s1", "--yes")[:2] == (0, "nothing to repair: 7 events kept\n")


# -- progress, pipes, usage --------------------------------------------------------------------


def test_large_files_get_a_progress_note_on_stderr_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, _ = make_store(tmp_path)
    size = session_file(root, "s1").stat().st_size
    code, out, err = run(capsys, "log", "show", str(root), "s1", "--json")
    assert code == 0 and err == ""
    monkeypatch.setattr(cli._common, "LARGE_FILE_BYTES", size)
    code, out, err = run(capsys, "log", "show", str(root), "s1", "--json")
    assert code == 0 and err == f"kerman: reading {cli.human_size(size)}…\n"
    assert all(json.loads(line)["type"] for line in out.splitlines())
    code, out, err = run(capsys, "log", "verify", str(root), "s1")
    assert code == 0 and out.startswith("ok:") and "verifying" in err


def test_human_size() -> None:
    assert [cli.human_size(n) for n in (0, 999, 1000, 1049, 123_456, 700_000_000, 5 * 10**12)] == [
        "0 B",
        "999 B",
        "1.0 kB",
        "1.0 kB",
        "123 kB",
        "700 MB",
        "5.0 TB",
    ]


def test_a_closed_stdout_is_quiet(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    class ClosedPipe(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    root, _ = make_store(tmp_path)
    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert cli.main(["log", "show", str(root), "s1"]) == 141
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "argv",
    [[], ["log"], ["log", "show", "store"], ["log", "tail", "a", "b", "-n", "-1"], ["log", "show", "a", "b", "--from", "x"], ["nonsense"]],
)
def test_bad_usage_is_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and "usage:" in err


@pytest.mark.parametrize("value", ["0", "65", "two"])
def test_kerman_worker_refuses_a_bad_pool_size_naming_it(capsys: pytest.CaptureFixture[str], value: str) -> None:
    code, out, err = run(capsys, "worker", "postgresql://nowhere/db", "--app", "m:f", "--pool-size", value)
    assert code == 2 and out == "" and f"--pool-size: expected a whole number from 1 to 64, got {value!r}" in err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--version")
    assert code == 0 and out == f"kerman {kerman.__version__} (session log format {kerman.FORMAT_VERSION})\n"


# -- demo --------------------------------------------------------------------------------------


def test_demo_dispatches_with_the_parsed_namespace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    fake = types.ModuleType("kerman.cli.demo")
    fake.main = lambda args: seen.append(args) or 7  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "kerman.cli.demo", fake)
    assert cli.main(["demo", "--dir", str(tmp_path)]) == 7
    assert seen[0].dir == str(tmp_path)
    assert cli.main(["demo"]) == 7
    assert seen[1].dir is None


@pytest.mark.skipif(importlib.util.find_spec("kerman.cli.demo") is None, reason="kerman.demo is not installed")
def test_demo_runs_in_the_given_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "demo"
    code = cli.main(["demo", "--dir", str(folder)])
    out = capsys.readouterr().out
    assert code == 0 and str(folder) in out
    sessions = kerman.FileStore(folder, durability="none").list()
    assert sessions
    assert run(capsys, "log", "verify", str(folder), sessions[0])[0] == 0


# -- real processes ----------------------------------------------------------------------------


def _console_script() -> str:
    candidate = Path(sysconfig.get_path("scripts")) / "kerman"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("kerman")
    assert found, "the kerman console script is not installed"
    return found


def test_python_dash_m_kerman(tmp_path: Path) -> None:
    write_session(tmp_path, "s", LOOP_EVENTS)
    done = subprocess.run(
        [sys.executable, "-m", "kerman", "log", "show", str(tmp_path), "s"], capture_output=True, text=True, encoding="utf-8", check=False
    )
    assert done.returncode == 0, done.stderr
    assert [line.split(None, 3)[3] for line in done.stdout.splitlines()[1:]] == LOOP_SUMMARIES
    done = subprocess.run(
        [sys.executable, "-m", "kerman", "log", "verify", str(tmp_path), "nope"], capture_output=True, text=True, check=False
    )
    assert (done.returncode, done.stdout, done.stderr) == (1, "", f'kerman: session "nope" not found in {tmp_path}\n')


def test_console_script(tmp_path: Path) -> None:
    root, _ = make_store(tmp_path)
    corrupt_middle(session_file(root, "s1"))
    done = subprocess.run(
        [_console_script(), "log", "verify", str(root), "s1"], capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL
    )
    assert done.returncode == 1 and done.stdout == ""
    assert "line 3" in done.stderr and "kerman log repair" in done.stderr
    assert_no_traceback(done.stderr)
    done = subprocess.run([_console_script(), "log", "list", str(root), "--json"], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and json.loads(done.stdout)[0]["status"] == "corrupt"


def test_piping_into_a_closed_reader_is_quiet(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with kerman.FileStore(root, durability="none").create("big") as log:
        for i in range(20_000):  # about 2 MB of timeline: far more than a pipe buffers
            log.append("goal/change", {"goal": f"goal number {i} " + "x" * 40})
    proc = subprocess.Popen(
        [sys.executable, "-m", "kerman", "log", "show", str(root), "big"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read()
    proc.stderr.close()
    code = proc.wait()
    assert first.startswith(b'session "big"')
    assert err == b""
    assert code == 141


# -- a PostgreSQL store, named by its DSN --------------------------------------------------------


def _pg_session(store: Any) -> tuple[Any, list[str]]:
    """A session with one completed turn and one pending context message, left open (the
    owner holds it while the CLI reads); the log and its events' JSON."""
    import asyncio

    log = store.create("cli-pg")

    async def main() -> None:
        async def model(request: Any) -> kerman.ModelReply:
            return kerman.ModelReply("hello there")

        loop = kerman.AgentLoop(model, log=log)
        loop.followup("hi")
        await loop.when_idle()
        loop.inject(kerman.UserMessage("use metric units", id="ctx-1"))
        await log.flush()

    asyncio.run(main())
    events = [e.to_json() for e in log.events()]
    return log, events


def test_postgres_store_by_dsn(capsys: pytest.CaptureFixture[str]) -> None:
    from conftest import fresh_schema_dsn

    dsn = fresh_schema_dsn()
    store = kerman.PostgresStore(dsn)
    log, events = _pg_session(store)
    sid = log.id

    code, out, _ = run(capsys, "log", "show", dsn, sid, "--json")
    assert code == 0 and out.splitlines() == events
    code, out, _ = run(capsys, "log", "tail", dsn, sid, "-n", "2", "--json")
    assert code == 0 and out.splitlines() == events[-2:]
    code, out, _ = run(capsys, "log", "show", dsn, sid, "--types", "turn/*")
    assert code == 0 and "turn/start" in out and "turn/end" in out and "user/message" not in out
    code, out, _ = run(capsys, "log", "inbox", dsn, sid, "--json")
    assert code == 0
    [item] = json.loads(out)
    assert item["placement"] == "steering" and item["message"]["id"] == "ctx-1"
    code, out, _ = run(capsys, "log", "list", dsn, "--json")
    # Who owns it, as `kerman sessions` shows (owner: a worker's name, else the owner id).
    assert code == 0 and json.loads(out) == [
        {"id": sid, "events": len(events), "size_bytes": None, "status": "ok", "state": "owned", "owner": store.owner, "staged": 0}
    ]
    code, out, _ = run(capsys, "log", "list", dsn)
    assert code == 0 and out.split() == [sid, str(len(events)), "events", "—", "owned", "by", store.owner]
    # The follower took no lease: the owner's log is still the owner's.
    log.append("cli/after", {})
    log.close()


def test_postgres_store_errors_name_the_store_without_its_password(capsys: pytest.CaptureFixture[str]) -> None:
    from conftest import fresh_schema_dsn

    dsn = fresh_schema_dsn()
    scheme, rest = dsn.split("://", 1)
    user, host = rest.split("@", 1) if "@" in rest.split("/", 1)[0] else ("postgres", rest)
    # The test server trusts local connections, so the password is sent and ignored.
    with_password = f"{scheme}://{user.split(':')[0]}:s3cret@{host}"
    code, _, err = run(capsys, "log", "show", with_password, "missing")
    assert code == 1 and 'session "missing" not found in postgresql://' in err and "s3cret" not in err
    code, _, err = run(capsys, "log", "verify", with_password, "missing")
    assert code == 2 and "verify and repair work on FileStore folders" in err and "s3cret" not in err
    code, _, err = run(capsys, "log", "list", with_password)
    assert code == 0 and "no sessions in" in err and "s3cret" not in err
