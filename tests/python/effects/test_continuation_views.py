"""A continuation's ``turn/start {turn, continues}`` where a user looks: the typed view, the
AG-UI and Vercel streams, and ``kerman log show`` (docs/durability.md, "Crashed turns are
answered"). An ordinary ``turn/start`` shows nothing new (the UI goldens hold that)."""

from __future__ import annotations

from typing import Any, Dict, List

from kerman import events
from kerman.cli._timeline import summarize
from kerman.ui import AgUiProjection, VercelProjection


def record(seq: int, type: str, data: Dict[str, Any]) -> Dict[str, Any]:
    return {"type": type, "seq": seq, "time": 1000 + seq, "data": data}


CONTINUATION = [
    record(0, "turn/start", {"turn": 2, "continues": 1}),
    record(1, "step/start", {"turn": 2, "step": 1}),
    record(
        2,
        "assistant/message",
        {"turn": 2, "step": 1, "message": {"id": "m", "role": "assistant", "content": [{"type": "text", "text": "hi"}]}},
    ),
    record(3, "step/end", {"turn": 2, "step": 1}),
    record(4, "turn/end", {"turn": 2, "reason": {"kind": "completed"}}),
]


def feed(projection: Any, records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [part for r in records for part in projection.feed(r)]


def test_the_typed_view_names_the_interrupted_turn() -> None:
    view = events.view(CONTINUATION[0])
    assert isinstance(view, events.TurnStart) and (view.turn, view.continues) == (2, 1)
    assert events.view(record(0, "turn/start", {"turn": 1})).continues is None
    assert events.view(record(0, "turn/start", {"turn": 1, "continues": "x"})).continues is None


def test_ag_ui_tells_a_continuation_after_its_run_started() -> None:
    out = feed(AgUiProjection("s"), CONTINUATION)
    assert [e["type"] for e in out[:2]] == ["RUN_STARTED", "CUSTOM"]
    assert (out[1]["name"], out[1]["value"]) == ("kerman.continues", {"turn": 2, "continues": 1})
    plain = feed(AgUiProjection("s"), [record(0, "turn/start", {"turn": 2})])
    assert [e["type"] for e in plain] == ["RUN_STARTED"]


def test_vercel_tells_a_continuation_after_its_start() -> None:
    out = feed(VercelProjection(), CONTINUATION)
    assert out[:2] == [
        {"type": "start", "messageId": "turn-2"},
        {"type": "data-continues", "id": "continues-2", "data": {"turn": 2, "continues": 1}},
    ]
    assert feed(VercelProjection(), [record(0, "turn/start", {"turn": 2})]) == [{"type": "start", "messageId": "turn-2"}]


def test_log_show_says_which_turn_is_continued() -> None:
    assert summarize(CONTINUATION[0]) == "turn 2 continues turn 1"
    assert summarize(record(0, "turn/start", {"turn": 2})) == "turn 2"
