"""``kerman demo``'s transcript, pinned (``demo_transcript.txt``), with what differs between runs
masked: the folder, message ids and times."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kerman import cli

GOLDEN = Path(__file__).parent / "demo_transcript.txt"


def masked(text: str, folder: Path) -> str:
    text = text.replace(str(folder), "<DIR>")
    text = re.sub(r"\(…[0-9a-f]{6}\)", "(…ID)", text)
    return re.sub(r"[+-]\d+\.\d{3}s", "+T", text)


def test_the_demo_prints_its_transcript(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "demo"
    assert cli.main(["demo", "--dir", str(folder)]) == 0
    assert masked(capsys.readouterr().out, folder) == GOLDEN.read_text(encoding="utf-8")
