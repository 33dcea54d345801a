"""The timeline's summaries of edge-case and odd payloads, pinned: ``timeline_golden.json`` holds,
for each payload, the summary and traceback lines ``kerman log show`` prints, so a change to how
the timeline reads events cannot change what it prints unseen.

The entries were recorded before the timeline read through ``kerman.events``; those it prints
the same way since are plain. The ones marked ``malformed`` hold payloads no Kerman writer
produces (a field the core always writes absent, or of another JSON type, in a core type): the
timeline shows them as their view reads them, or as the stored JSON when the view cannot read
them (``turn/start {}`` is ``{}``, no longer ``turn None``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kerman.cli._timeline import format_event, summarize, traceback_lines

GOLDEN = json.loads((Path(__file__).parent / "timeline_golden.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("case", GOLDEN, ids=lambda c: f"{c['type']}:{json.dumps(c['data'])[:40]}")
def test_summary_and_traceback_as_recorded(case: dict[str, Any]) -> None:
    event = {"type": case["type"], "seq": 1, "time": 0, "data": case["data"]}
    assert summarize(event) == case["summary"]
    assert traceback_lines(event) == case["traceback"]
    assert format_event(event, t0=0).endswith("  " + case["summary"])


def test_what_kerman_writes_is_most_of_the_golden() -> None:
    assert sum(1 for c in GOLDEN if not c.get("malformed")) >= 150


def test_the_golden_covers_every_core_type_and_a_plugin_type() -> None:
    assert {c["type"] for c in GOLDEN} >= {
        "agent/inbox/spliced",
        "turn/start",
        "turn/end",
        "step/start",
        "step/end",
        "user/message",
        "assistant/message",
        "assistant/chunk",
        "tool/call",
        "tool/result",
        "request/header",
        "log/damaged",
        "log/repaired",
        "plugin/x",
    }
