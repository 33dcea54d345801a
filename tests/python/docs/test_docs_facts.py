"""The README and docs/ state what is true now: no development history (issue numbers, rounds,
passes, "the build before ..."), install instructions that work today, and model names the
installed vendor SDKs know."""

from __future__ import annotations

import re
from pathlib import Path
from typing import List, Set, Tuple

import pytest

REPO = Path(__file__).resolve().parents[3]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# Phrases that date a passage instead of describing what it measures or does.
HISTORY = re.compile(
    r"\bissue \d+|\bissue's\b|\b(first|second|third|fourth|last|this|P4) (round|pass)\b(?! trip)|\bearlier passes\b"
    r"|\bshared machine\b|\bbefore the pool\b|\b(old|new|previous) build\b|\bthis build's\b|\blast session\b"
    r"|\bused to\b|\bother agents\b",
    re.IGNORECASE,
)


def _hits(pattern: re.Pattern[str]) -> List[Tuple[str, int, str]]:
    found = []
    for page in PAGES:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for match in pattern.finditer(line):
                found.append((page.name, number, match.group(0)))
    return found


def test_no_development_history_in_the_docs() -> None:
    assert _hits(HISTORY) == []


def test_the_readme_says_how_to_install_today() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    install = readme.split("## Install", 1)[1].split("\n## ", 1)[0]
    assert "Releases ship wheels" not in install
    assert "not on PyPI" in install
    assert "make wheels" in install and "--find-links dist/wheels" in install
    assert "Rust" in install  # building from source needs it


def _known_models() -> Set[str]:
    """Model names the installed SDKs list (OpenAI's and Anthropic's model literals)."""
    import typing

    known: Set[str] = set()
    openai_models = pytest.importorskip("openai.types.shared.chat_model")
    known |= set(typing.get_args(openai_models.ChatModel))
    anthropic_models = pytest.importorskip("anthropic.types.model")
    for arg in typing.get_args(anthropic_models.Model):
        known |= {a for a in typing.get_args(arg) if isinstance(a, str)}
    return known


MODEL_NAME = re.compile(r"\b(gpt-[0-9][0-9a-z.\-]*|claude-[a-z]+-[0-9][0-9a-z\-]*)\b")


def test_model_names_in_the_readme_and_cli_docs_are_current() -> None:
    known = _known_models()
    pages = [REPO / "README.md", REPO / "docs" / "cli.md"]
    used = {m.group(0) for page in pages for m in MODEL_NAME.finditer(page.read_text(encoding="utf-8"))}
    assert used, "no model name found"
    assert used <= known, sorted(used - known)
    # The newest families the SDKs list: no example still names a model two generations back.
    assert not {name for name in used if re.match(r"gpt-4|claude-[a-z]+-4", name)}, used
