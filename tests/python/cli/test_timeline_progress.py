"""``kerman log show`` summarises ``tool/progress`` as the call, how far (of what total, as a
percentage) and its message; the recorded ``tool_progress`` session shows its lines."""

from __future__ import annotations

from pathlib import Path

from kerman.cli._timeline import summarize

LOG = Path(__file__).resolve().parents[1] / "ui" / "logs" / "tool_progress.jsonl"


def _event(data: dict) -> dict:
    return {"type": "tool/progress", "seq": 7, "time": 0, "data": {"turn": 1, "step": 1, **data}}


def test_progress_shows_call_amount_share_and_message() -> None:
    assert summarize(_event({"callId": "c1", "progress": 1, "total": 4, "message": "step 1"})) == '#c1 1/4 (25%) "step 1"'
    assert summarize(_event({"callId": "c1", "progress": 2.5})) == "#c1 2.5"
    assert summarize(_event({"callId": "c1", "progress": 3, "total": 0})) == "#c1 3/0"


def test_the_recorded_session_shows_its_progress(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    from kerman.cli import main

    (tmp_path / LOG.name).write_bytes(LOG.read_bytes())
    assert main(["log", "show", str(tmp_path), "tool_progress", "--types", "tool/progress"]) in (0, None)
    out = capsys.readouterr().out
    assert 'tool/progress        #c1 1/2 (50%) "step 1"' in out
    assert 'tool/progress        #c1 2/2 (100%) "step 2"' in out
