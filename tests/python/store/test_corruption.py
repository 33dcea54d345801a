"""Damaged session files, case by case over realistic records (SPEC 2.2, 4.2; docs/format.md).

One session is logged by a real AgentLoop (two turns, a tool call, a streamed reply) and ends
with a crafted `tool/result` carrying `sourceEventSeqs` and a `replace` surfaceOp, so every
envelope field occurs in the records damaged here. Each case states its exact outcome:

* torn tail at line L: `verify` reports the bad bytes and leaves the file alone; `open` warns,
  cuts the file and ends in exactly the state of a file cut cleanly before line L (closers
  included), byte for byte;
* corruption at line L: `open` and `verify` raise `CorruptLogError(line=L, seq=L-2)` naming the
  next valid line and change nothing; `repair(dry_run=True)` names exactly the lines it would
  set aside and the seqs that are lost, and changes nothing; `repair` keeps a full `.corrupt`
  copy, puts the lines set aside verbatim in `.damaged`, and leaves exactly the original file
  with a `log/damaged` placeholder at each lost seq (every other record byte for byte at its
  seq) and a `log/repaired` record naming it all (docs/format.md, "Repairing corruption").

Deviation from SPEC 2.2 ("`kerman log repair` may truncate only on explicit request"), as issue
11 asks: repair still runs only on request and keeps the `.corrupt` copy, but it no longer
truncates at the damage; it keeps every later record that verifies.

test_stores.py keeps the simpler single cases (one flip per place, boundary cuts, seq gaps,
version checks); this file sweeps offsets and bits.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import compact, event_record, frame, header_record, read_raw_session, session_path, write_raw_session
from kerman import AgentLoop, CorruptLogError, FileStore, ModelReply
from kerman.models import ScriptedModel

SID = "real"


# ---------------------------------------------------------------------------------------------
# The session under test


async def _log_two_turns(store: FileStore) -> None:
    log = store.create(SID)
    model = ScriptedModel(
        [
            ModelReply(
                [{"type": "text", "text": "calling"}, {"type": "tool-call", "id": "c1", "name": "look", "arguments": '{"q": "é"}'}],
                usage={"input": 3},
            ),
            [{"type": "reasoning-delta", "text": "hm"}, {"type": "text-delta", "text": "done 😀"}, {"type": "finish", "reason": "stop"}],
            "second turn",
        ]
    )
    loop = AgentLoop(model, log=log)

    @loop.tool
    async def look(args, ctx):
        return "seen " + args["q"] + " *"  # "*" is one bit flip away from a newline

    loop.followup("hello")
    await loop.when_idle()
    loop.followup("again")
    await loop.when_idle()
    await loop.aclose()
    log.close()


@dataclass(frozen=True)
class Session:
    data: bytes
    spans: list  # (start, end) of each line; spans[0] is the header, line n is spans[n - 1]
    middle: int  # line of the first tool/result: several valid records follow it
    last: int  # line of the crafted last record

    def line(self, n: int) -> bytes:
        start, end = self.spans[n - 1]
        return self.data[start:end]


def _spans(data: bytes) -> list:
    spans, pos = [], 0
    while pos < len(data):
        end = data.find(b"\n", pos)
        end = len(data) if end < 0 else end + 1
        spans.append((pos, end))
        pos = end
    return spans


@pytest.fixture(scope="module")
def session(tmp_path_factory) -> Session:
    root = tmp_path_factory.mktemp("made")
    asyncio.run(asyncio.wait_for(_log_two_turns(FileStore(root, durability="none")), 60))
    data = session_path(root, SID).read_bytes()
    lines = [json.loads(data[s + 9 : e - 1]) for s, e in _spans(data)]
    seq = len(lines) - 1
    call = next(r for r in lines[1:] if r["type"] == "tool/call")
    result = next(r for r in lines[1:] if r["type"] == "tool/result")
    last = event_record(
        seq,
        "tool/result",
        {"turn": 2, "step": 1, "note": "crafted; ünïcode"},
        time=lines[-1]["time"],
        surface_op={"op": "replace", "start": 1, "end": 3},
        source_event_seqs=[call["seq"], result["seq"]],
    )
    data += frame(compact(last))
    s = Session(data, _spans(data), middle=result["seq"] + 2, last=seq + 2)
    assert s.last - s.middle > 2 and b'"sourceEventSeqs":' in s.line(s.middle)
    return s


@pytest.fixture
def scratch(tmp_path):
    """A folder for the damaged copies: on tmpfs when there is one, because every repair and
    every torn-tail open fsyncs, and a thousand fsyncs on a real disk take most of a minute."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    path = Path(tempfile.mkdtemp(prefix="kerman-corruption-", dir=shm))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Outcomes


_clean_cuts: dict = {}
_counter = iter(range(1 << 30))


def _clean_cut(prefix: bytes, tmp_root: Path) -> tuple:
    """The file and events after opening a file that ends exactly at a record boundary: what a
    torn tail starting there must be repaired into (closers included)."""
    if prefix not in _clean_cuts:
        root = tmp_root / f"clean-{next(_counter)}"
        write_raw_session(session_path(root, SID), prefix)
        log = FileStore(root, durability="none").open(SID)
        events = [e.to_json() for e in log.events()]
        log.close()
        _clean_cuts[prefix] = (session_path(root, SID).read_bytes(), events)
    return _clean_cuts[prefix]


def _place(damaged: bytes, root: Path) -> Path:
    if root.exists():
        for child in root.iterdir():
            child.unlink()
    path = session_path(root, SID)
    write_raw_session(path, damaged)
    return path


def check_torn(damaged: bytes, line: int, root: Path, caplog) -> None:
    """`damaged` has a torn tail starting at `line` (everything from there is lost)."""
    path = _place(damaged, root)
    good = sum(e - s for s, e in _spans(damaged)[: line - 1])
    store = FileStore(root, durability="none")
    report = store.verify(SID)
    assert report == {"path": str(path), "events": line - 2, "size_bytes": len(damaged), "torn_tail_bytes": len(damaged) - good}
    assert path.read_bytes() == damaged, "verify modified the file"
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kerman"):
        log = store.open(SID)
    try:
        events = [e.to_json() for e in log.events()]
    finally:
        log.close()
    warnings = [r.getMessage() for r in caplog.records if r.name == "kerman"]
    assert warnings[:1] == [f'session "{SID}": truncated a torn tail of {len(damaged) - good} bytes from line {line}']
    want_file, want_events = _clean_cut(damaged[:good], root.parent)
    assert events == want_events
    assert path.read_bytes() == want_file


def _time(record_line: bytes) -> int:
    return json.loads(record_line[9:-1])["time"]


def expected_repair(s: Session, dropped: list, lost: list) -> bytes:
    """The repaired file of a damaged copy of `s` whose lines `dropped` are set aside and whose
    seqs `lost` are lost, without its final `log/repaired` record: every original record at its
    seq, byte for byte, and a placeholder at each lost seq."""
    out = s.line(1)
    for seq in range(len(s.spans) - 1):
        if seq not in lost:
            out += s.line(seq + 2)
            continue
        before = _time(s.line(lost[0] + 1)) if lost[0] > 0 else json.loads(s.line(1)[9:-1])["createdAt"]
        data = {
            "seqs": [lost[0], lost[-1]],
            "lines": [dropped[0], dropped[-1]] if dropped else None,
            "backup": f"{session_path('.', SID).name}.corrupt",
        }
        out += frame(compact(event_record(seq, "log/damaged", data, time=before)))
    return out


def check_corrupt(s: Session, damaged: bytes, line: int, valid_after: int, root: Path, dropped: list, lost: list) -> None:
    """`damaged` (a damaged copy of `s`) is refused with the first invalid record at `line` and
    a valid one on `valid_after`; only `repair` changes the file, setting aside exactly the
    lines `dropped` (numbered as in `damaged`) and losing exactly the seqs `lost`."""
    path = _place(damaged, root)
    store = FileStore(root, durability="none")
    for attempt in (store.open, store.verify, store.open):  # a refusal leaves no lock behind
        with pytest.raises(CorruptLogError) as exc:
            attempt(SID)
        err = exc.value
        assert (err.line, err.seq, Path(err.path)) == (line, line - 2, path), attempt.__name__
        assert f"invalid record at line {line} (seq {line - 2})" in str(err)
        assert str(err).endswith(f"a valid record follows on line {valid_after}"), str(err)
        assert path.read_bytes() == damaged, f"{attempt.__name__} modified the file"
    spans = _spans(damaged)
    aside = [damaged[spans[n - 1][0] : spans[n - 1][1]] for n in dropped]
    want = expected_repair(s, dropped, lost)
    events = len(_spans(want)) - 1  # the marker comes after these
    plan = store.repair(SID, dry_run=True)
    assert path.read_bytes() == damaged and os.listdir(root) == [path.name], "a dry run wrote"
    assert [(d["line"], d["bytes"]) for d in plan["dropped"]] == [(n, len(b)) for n, b in zip(dropped, aside, strict=True)]
    assert {k: v for k, v in plan.items() if k != "dropped"} == {
        "kept_events": events - len(lost),
        "events": events + 1,
        "removed_bytes": sum(map(len, aside)),
        "lost_seqs": [[lost[0], lost[-1]]] if lost else [],
        "torn_tail_bytes": 0,
        "torn_tail_line": None,
        "backup": None,
        "quarantine": None,
    }
    report = store.repair(SID)
    assert report == {**plan, "backup": f"{path}.corrupt", "quarantine": f"{path}.damaged" if aside else None}
    assert Path(report["backup"]).read_bytes() == damaged
    assert (Path(report["quarantine"]).read_bytes() if aside else b"") == b"".join(aside)
    repaired = path.read_bytes()
    assert repaired.startswith(want), "the kept records or the placeholders differ"
    [(ok, marker, _)] = read_raw_session(path)[events + 1 :]
    assert ok, "the log/repaired record does not verify"
    assert marker["time"] >= _time(want.splitlines(keepends=True)[-1])
    assert {k: v for k, v in marker.items() if k != "time"} == {
        "type": "log/repaired",
        "seq": events,
        "data": {
            "backup": f"{path.name}.corrupt",
            "quarantine": f"{path.name}.damaged" if aside else None,
            "dropped": report["dropped"],
            "lostSeqs": report["lost_seqs"],
            "tornTailBytes": 0,
        },
    }
    verified = store.verify(SID)
    assert (verified["events"], verified["torn_tail_bytes"]) == (events + 1, 0)


@contextmanager
def case(label: str):
    """Names the offset or bit in a failure inside a sweep."""
    try:
        yield
    except AssertionError as e:
        raise AssertionError(f"{label}: {e}") from None
    except pytest.fail.Exception as e:
        pytest.fail(f"{label}: {e.msg}")


def _flip(data: bytes, offset: int, bit: int) -> bytes:
    b = bytearray(data)
    b[offset] ^= 1 << bit
    return bytes(b)


# ---------------------------------------------------------------------------------------------
# Truncation


def test_every_cut_inside_the_last_record_is_a_torn_tail(session, scratch, caplog):
    start, end = session.spans[session.last - 1]
    for cut in range(start + 1, end):  # a cut at `start` is a clean boundary (test_stores.py)
        with case(f"cut at {cut}"):
            check_torn(session.data[:cut], session.last, scratch / "s", caplog)


def test_every_cut_inside_a_middle_record_is_a_torn_tail(session, scratch, caplog):
    """The file ends inside a record: everything from that record on is the torn tail, and
    the open turn it leaves gets closers."""
    start, end = session.spans[session.middle - 1]
    for cut in range(start + 1, end):
        with case(f"cut at {cut}"):
            check_torn(session.data[:cut], session.middle, scratch / "s", caplog)


@pytest.mark.parametrize("keep", [1, 9, -1])  # bytes of the record left; -1: all but its newline
def test_repair_of_a_torn_tail_cuts_it_without_a_backup(session, scratch, keep):
    """`repair` (unlike `open`) adds no closers and, with nothing corrupt, keeps no copy."""
    start, end = session.spans[session.middle - 1]
    path = _place(session.data[: start + keep % (end - start)], scratch)
    report = FileStore(scratch, durability="none").repair(SID)
    assert report == {
        "kept_events": session.middle - 2,
        "events": session.middle - 2,
        "removed_bytes": keep % (end - start),
        "dropped": [],
        "lost_seqs": [],
        "torn_tail_bytes": keep % (end - start),
        "torn_tail_line": session.middle,
        "backup": None,
        "quarantine": None,
    }
    assert path.read_bytes() == session.data[:start]
    assert os.listdir(scratch) == [path.name]


def test_a_middle_record_cut_short_is_corruption(session, scratch):
    """A record missing its end (or missing entirely) with the rest of the file intact: the
    stub swallows the next line, and the line after that is valid."""
    m = session.middle
    start, end = session.spans[m - 1]
    for cut in range(start, end):
        with case(f"record cut at {cut}"):
            # cut at its start, the record is gone whole: its seq is lost, no line is set aside
            dropped, lost = ([], [m - 2]) if cut == start else ([m], [m - 2, m - 1])
            check_corrupt(session, session.data[:cut] + session.data[end:], m, m + 1, scratch / "s", dropped, lost)


# ---------------------------------------------------------------------------------------------
# Zero-filled and garbage tails


def _zero(data: bytes, start: int, end: int) -> bytes:
    return data[:start] + bytes(end - start) + data[end:]


def _garbage(n: int, newlines: bool, seed: int) -> bytes:
    rnd = random.Random(seed)
    out = bytes(rnd.randrange(256) for _ in range(n))
    return out if newlines else out.replace(b"\n", b"x")


def _tail_cases(s: Session):
    """(id, damaged bytes, ("torn", line) | ("corrupt", line, valid_after, lines set aside, seqs lost))."""
    d, end = s.data, len(s.spans) + 1  # `end`: the line after the last record
    last_start, _ = s.spans[s.last - 1]
    prev_start, _ = s.spans[s.last - 2]
    mid_start, mid_end = s.spans[s.middle - 1]
    other = frame(compact(header_record("other"))) + frame(compact(event_record(0, "x/other", 1)))
    for n in (1, 8, 9, 512, 4096):
        yield f"zeros-{n}", d + bytes(n), ("torn", end)
    yield "zero-line", d + bytes(100) + b"\n", ("torn", end)
    yield "last-record-zeroed", _zero(d, last_start, len(d)), ("torn", s.last)
    yield "last-record-zeroed-but-newline", _zero(d, last_start, len(d) - 1), ("torn", s.last)
    yield "last-two-records-zeroed", _zero(d, prev_start, len(d)), ("torn", s.last - 1)
    # a block-sized hole after a half-written record, as a crash on some filesystems leaves
    half = last_start + (len(d) - last_start) // 2
    yield "half-record-then-zero-block", d[:half] + bytes(4096 - half % 4096), ("torn", s.last)
    for n in (1, 100, 4096):
        yield f"garbage-{n}", d + _garbage(n, False, n), ("torn", end)
        yield f"garbage-lines-{n}", d + _garbage(n, True, n) + b"\n", ("torn", end)
    yield "bad-checksum-line", d + b"00000000 " + s.line(s.last)[9:], ("torn", end)
    # a partial record with no newline swallows the complete one written after it
    yield "partial-then-whole", d + s.line(s.last)[:30] + s.line(s.last), ("torn", end)
    # ...but once terminated, any valid record after it, whatever its seq, means corruption
    # the repeated old record and the foreign one verify but do not continue the log: set aside
    yield "garbage-line-then-old-record", d + b"junk\n" + s.line(s.last), ("corrupt", end, end + 1, [end, end + 1], [])
    yield "another-session-appended", d + other, ("corrupt", end, end + 1, [end, end + 1], [])
    m = s.middle
    yield "middle-record-zeroed", _zero(d, mid_start, mid_end - 1), ("corrupt", m, m + 1, [m], [m - 2])
    # without its newline the zeroed record swallows the next one: two seqs in one line
    yield "middle-record-zeroed-with-newline", _zero(d, mid_start, mid_end), ("corrupt", m, m + 1, [m], [m - 2, m - 1])
    # an extra line costs no seq
    yield "garbage-inside", d[:mid_start] + b"garbage\n" + d[mid_start:], ("corrupt", m, m + 1, [m], [])


TAIL_IDS = [
    "zeros-1",
    "zeros-8",
    "zeros-9",
    "zeros-512",
    "zeros-4096",
    "zero-line",
    "last-record-zeroed",
    "last-record-zeroed-but-newline",
    "last-two-records-zeroed",
    "half-record-then-zero-block",
    "garbage-1",
    "garbage-lines-1",
    "garbage-100",
    "garbage-lines-100",
    "garbage-4096",
    "garbage-lines-4096",
    "bad-checksum-line",
    "partial-then-whole",
    "garbage-line-then-old-record",
    "another-session-appended",
    "middle-record-zeroed",
    "middle-record-zeroed-with-newline",
    "garbage-inside",
]


@pytest.mark.parametrize("name", TAIL_IDS)
def test_zero_and_garbage_damage(session, scratch, caplog, name):
    cases = {name: (damaged, outcome) for name, damaged, outcome in _tail_cases(session)}
    assert sorted(cases) == sorted(TAIL_IDS)
    damaged, outcome = cases[name]
    if outcome[0] == "torn":
        check_torn(damaged, outcome[1], scratch / "s", caplog)
    else:
        _, line, after, dropped, lost = outcome
        check_corrupt(session, damaged, line, after, scratch / "s", dropped, lost)


# ---------------------------------------------------------------------------------------------
# Single bit flips, field by field


def _fields(record: bytes) -> dict:
    """Byte ranges (within the line) of the checksum, the separator, each top-level
    `"key":value` member, the JSON punctuation around them, and the newline."""
    text = record[9:-1].decode("utf-8")
    offset = [9 + len(text[:i].encode("utf-8")) for i in range(len(text) + 1)]
    decoder = json.JSONDecoder()
    out = {"checksum": [range(0, 8)], "separator": [range(8, 9)], "newline": [range(len(record) - 1, len(record))]}
    punctuation, pos = [0], 1
    while text[pos - 1] != "}":
        key, colon = decoder.raw_decode(text, pos)
        _, end = decoder.raw_decode(text, colon + 1)
        out[key] = [range(offset[pos], offset[end])]
        punctuation.append(end)
        pos = end + 1
    out["punctuation"] = [range(offset[i], offset[i] + 1) for i in punctuation]
    return out


FIELDS = ["checksum", "separator", "type", "seq", "time", "data", "sourceEventSeqs", "surfaceOp", "punctuation", "newline"]


def _flips(ranges: list, record: bytes):
    """Every bit of every byte in the ranges; for long ranges (data), every bit of a spread of
    bytes plus every non-ASCII byte and every byte one flip away from a newline."""
    for r in ranges:
        offsets = (
            set(r)
            if len(r) <= 64
            else {i for i in r if (i - r.start) % 13 == 0 or i == r.stop - 1 or record[i] >= 0x80 or bin(record[i] ^ 0x0A).count("1") == 1}
        )
        for i in sorted(offsets):
            for bit in range(8):
                yield i, bit


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("which", ["middle", "last"])
def test_single_bit_flip(session, scratch, caplog, which, field):
    """A CRC-32C catches every single-bit error, and a flip that makes or breaks a newline only
    moves line boundaries, so every flip in the last record is a torn tail and every flip in a
    record with two more after it is corruption at that record."""
    line = session.middle if which == "middle" else session.last
    start, _ = session.spans[line - 1]
    record = session.line(line)
    ranges = _fields(record)[field]
    flips = list(_flips(ranges, record))
    assert flips
    if (which, field) == ("middle", "data"):  # the case below must be exercised
        assert any(record[i] ^ (1 << bit) == 0x0A for i, bit in flips)
    for i, bit in flips:
        damaged = _flip(session.data, start + i, bit)
        with case(f"bit {bit} of byte {i} ({record[i : i + 1]!r}) of line {line}"):
            if which == "last":
                check_torn(damaged, line, scratch / "s", caplog)
                continue
            # the next record is on the next line, unless the flip split this one in two (two
            # lines set aside for its seq) or joined it with the next (one line, two seqs)
            split, joined = record[i] ^ (1 << bit) == 0x0A, record[i] == 0x0A
            dropped = [line, line + 1] if split else [line]
            lost = [line - 2, line - 1] if joined else [line - 2]
            check_corrupt(session, damaged, line, line + 2 if split else line + 1, scratch / "s", dropped, lost)


def test_newline_flip_before_the_last_record_is_a_torn_tail(session, scratch, caplog):
    """Joined with the last record, the damaged record has nothing valid after it: both are
    lost, which is the documented rule (docs/format.md), not an accident."""
    _, end = session.spans[session.last - 2]
    for bit in range(8):
        with case(f"bit {bit}"):
            check_torn(_flip(session.data, end - 1, bit), session.last - 1, scratch / "s", caplog)


@pytest.mark.parametrize("bits", ["low", "high"])
def test_every_header_bit_flip_is_refused_and_never_repaired(session, scratch, bits):
    """Header damage leaves nothing to keep: open, verify and repair all refuse."""
    _, end = session.spans[0]
    root = scratch / "s"
    for i in range(end):
        for bit in range(4) if bits == "low" else range(4, 8):
            damaged = _flip(session.data, i, bit)
            path = _place(damaged, root)
            store = FileStore(root, durability="none")
            for attempt in (store.open, store.verify, store.repair):
                with pytest.raises(CorruptLogError) as exc:
                    attempt(SID)
                assert (exc.value.line, exc.value.seq) == (1, 0), (i, bit, attempt.__name__)
            assert path.read_bytes() == damaged, (i, bit)
            assert os.listdir(root) == [path.name], "repair left a backup of a bad header"


def test_one_flipped_bit_in_the_middle_of_64_events_loses_one_record(tmp_path, capsys):
    """Issue 11 item 5, as reported: one bit flipped in the middle of a 64-event file used to
    make `repair` keep only the 19 records before it. Now it keeps the other 63, each at its
    seq, and `show --allow-damaged` reads them without writing anything."""
    from kerman import cli

    store = FileStore(tmp_path, durability="none")
    with store.create("big") as log:
        for i in range(64):
            log.append("x/e", {"i": i})
    path = session_path(tmp_path, "big")
    start, _ = _spans(path.read_bytes())[19 + 1]  # seq 19
    damaged = _flip(path.read_bytes(), start + 30, 2)
    path.write_bytes(damaged)
    assert cli.main(["log", "show", str(tmp_path), "big", "--json"]) == 1
    capsys.readouterr()
    assert cli.main(["log", "show", str(tmp_path), "big", "--json", "--allow-damaged"]) == 0
    shown = [json.loads(line)["data"]["i"] for line in capsys.readouterr().out.splitlines()]
    assert shown == [i for i in range(64) if i != 19] and path.read_bytes() == damaged
    report = store.repair("big")
    assert (report["kept_events"], report["lost_seqs"], [d["line"] for d in report["dropped"]]) == (63, [[19, 19]], [21])
    with store.open("big") as log:
        assert [e.data.get("i") for e in log.events()][:64] == [*range(19), None, *range(20, 64)]
        assert [log[19].type, log[64].type, len(log)] == ["log/damaged", "log/repaired", 65]
