"""The timeline's summaries of odd and edge-case payloads, pinned: ``timeline_golden.json`` holds,
for each payload, the summary and traceback lines ``kerman log show`` printed when it was
recorded, so a change to how the timeline reads events cannot change what it prints."""

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


def test_the_golden_covers_every_core_type_and_a_plugin_type() -> None:
    assert {c["type"] for c in GOLDEN} >= {"agent/inbox/spliced", "turn/start", "turn/end", "step/start", "step/end",
                                           "user/message", "assistant/message", "assistant/chunk", "tool/call",
                                           "tool/result", "request/header", "log/damaged", "log/repaired", "plugin/x"}
