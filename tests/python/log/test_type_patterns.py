"""Issue 11, item 4: ``log.events(types=...)`` and ``log.tail(types=...)`` take the same
patterns as ``kerman log show --types`` (``*`` any run of characters, ``?`` one character);
a pattern never silently matches nothing where the command line would match."""

from __future__ import annotations

import asyncio
from typing import List

import pytest

import kerman
from kerman import cli
from kerman.cli._log import _type_filter

TYPES = ["assistant/message", "assistant/chunk", "turn/start", "turn/end", "plugin/[x]", "plugin/x", "tool/result"]


def appended(types: List[str]) -> kerman.SessionLog:
    """A file-free log holding one plugin event per type (loop-owned types are appended as the
    loop would)."""
    log = kerman.MemoryStore().create("s")
    for t in types:
        if t.startswith(("assistant/", "turn/", "tool/")):
            log._append_owned(t, {"turn": 1})
        else:
            log.append(t, {})
    return log


@pytest.mark.parametrize("pattern, expected", [
    ("assistant/*", ["assistant/message", "assistant/chunk"]),
    ("turn/*", ["turn/start", "turn/end"]),
    ("*/end", ["turn/end"]),
    ("t?rn/end", ["turn/end"]),
    ("plugin/[x]", ["plugin/[x]"]),
    ("*", TYPES),
    ("assistant", []),
])
def test_events_and_the_cli_match_the_same_types(pattern, expected):
    log = appended(TYPES)
    assert [e.type for e in log.events(types=pattern)] == expected
    assert [e.type for e in log.events(types=[pattern, "no/such"])] == expected
    keep = _type_filter([pattern])
    assert [t for t in TYPES if keep(t)] == expected


def test_tail_takes_patterns():
    log = appended(TYPES)

    async def main() -> List[str]:
        seen = []
        async for event in log.tail(types="turn/*"):
            seen.append(event.type)
            if len(seen) == 2:
                break
        return seen

    assert asyncio.run(main()) == ["turn/start", "turn/end"]


def test_exact_and_pattern_entries_together():
    log = appended(TYPES)
    assert [e.type for e in log.events(types=["tool/result", "assistant/*"])] == \
        ["assistant/message", "assistant/chunk", "tool/result"]


def test_the_cli_show_filters_with_patterns(tmp_path, capsys):
    store = kerman.FileStore(str(tmp_path))
    with store.create("s") as log:
        for t in ("plugin/a", "plugin/b", "other/c"):
            log.append(t, {})
    assert cli.main(["log", "show", str(tmp_path), "s", "--types", "plugin/*"]) == 0
    out = capsys.readouterr().out
    assert "plugin/a" in out and "plugin/b" in out and "other/c" not in out
