"""Issue 11, item 4: ``log.events(types=...)`` and ``log.tail(types=...)`` take the same
patterns as ``kerman log show --types`` (``*`` any run of characters, ``?`` one character);
a pattern never silently matches nothing where the command line would match."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import List

import pytest

import kerman
from conftest import event_record, header_record, session_path, write_raw_session
from kerman import cli
from kerman.cli._log import _type_filter

SURFACE = {"assistant/message", "tool/result"}
TYPES = ["assistant/message", "assistant/chunk", "turn/start", "turn/end", "plugin/[x]", "plugin/x", "tool/result"]


def appended(root: Path, types: List[str]) -> kerman.SessionLog:
    """A log holding one event per type, loop-owned types included (as the loop writes them),
    read from a session file written by hand."""
    records = [
        event_record(
            seq, t, {"turn": 1} if t.startswith(("assistant/", "turn/", "tool/")) else {}, surface_op="append" if t in SURFACE else None
        )
        for seq, t in enumerate(types)
    ]
    write_raw_session(session_path(root, "s"), header_record("s"), records)
    return kerman.FileStore(root).follow("s")


@pytest.mark.parametrize(
    "pattern, expected",
    [
        ("assistant/*", ["assistant/message", "assistant/chunk"]),
        ("turn/*", ["turn/start", "turn/end"]),
        ("*/end", ["turn/end"]),
        ("t?rn/end", ["turn/end"]),
        ("plugin/[x]", ["plugin/[x]"]),
        ("*", TYPES),
        ("assistant", []),
    ],
)
def test_events_and_the_cli_match_the_same_types(tmp_path, pattern, expected):
    log = appended(tmp_path, TYPES)
    assert [e.type for e in log.events(types=pattern)] == expected
    assert [e.type for e in log.events(types=[pattern, "no/such"])] == expected
    keep = _type_filter([pattern])
    assert [t for t in TYPES if keep(t)] == expected


def test_tail_takes_patterns(tmp_path):
    log = appended(tmp_path, TYPES)

    async def main() -> List[str]:
        seen = []
        async for event in log.tail(types="turn/*"):
            seen.append(event.type)
            if len(seen) == 2:
                break
        return seen

    assert asyncio.run(main()) == ["turn/start", "turn/end"]


def test_exact_and_pattern_entries_together(tmp_path):
    log = appended(tmp_path, TYPES)
    assert [e.type for e in log.events(types=["tool/result", "assistant/*"])] == ["assistant/message", "assistant/chunk", "tool/result"]


def test_the_cli_show_filters_with_patterns(tmp_path, capsys):
    store = kerman.FileStore(str(tmp_path))
    with store.create("s") as log:
        for t in ("plugin/a", "plugin/b", "other/c"):
            log.append(t, {})
    assert cli.main(["log", "show", str(tmp_path), "s", "--types", "plugin/*"]) == 0
    out = capsys.readouterr().out
    assert "plugin/a" in out and "plugin/b" in out and "other/c" not in out
