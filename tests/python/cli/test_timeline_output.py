"""``kerman log show`` summarises ``output/validated`` (a turn's structured output) as its
turn, step and compact JSON value."""

from __future__ import annotations

from pathlib import Path

from kerman.cli._timeline import summarize

LOG = Path(__file__).resolve().parents[1] / "ui" / "logs" / "structured_output.jsonl"


def test_output_validated_shows_turn_step_and_value() -> None:
    event = {"type": "output/validated", "seq": 18, "time": 0, "data": {"turn": 1, "step": 2, "output": {"answer": 6}}}
    assert summarize(event) == 'turn 1 step 2 {"answer":6}'


def test_the_recorded_session_shows_its_output(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    from kerman.cli import main

    (tmp_path / LOG.name).write_bytes(LOG.read_bytes())
    assert main(["log", "show", str(tmp_path), "structured_output", "--types", "output/validated"]) in (0, None)
    assert 'output/validated     turn 1 step 2 {"answer":6}' in capsys.readouterr().out
