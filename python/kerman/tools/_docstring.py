"""A docstring read for a tool: its first paragraph (the description) and each parameter's
description, in the Google, NumPy and Sphinx styles."""

from __future__ import annotations

import inspect
import re
from typing import Dict, List, Optional

__all__ = ["Docstring", "parse_docstring"]


class Docstring:
    """What a docstring says: its first paragraph and each parameter's description."""

    __slots__ = ("summary", "params")

    def __init__(self, summary: str, params: Dict[str, str]) -> None:
        self.summary = summary
        self.params = params


_SECTIONS = (
    "args",
    "arguments",
    "parameters",
    "params",
    "keyword args",
    "keyword arguments",
    "other parameters",
    "attributes",
    "returns",
    "return",
    "yields",
    "yield",
    "raises",
    "raise",
    "examples",
    "example",
    "notes",
    "note",
    "see also",
    "warnings",
    "warning",
    "todo",
    "references",
)
_PARAM_SECTIONS = ("args", "arguments", "parameters", "params", "keyword args", "keyword arguments", "other parameters", "attributes")
_GOOGLE_HEADER = re.compile(r"^([A-Za-z][A-Za-z ]*?)\s*:\s*$")
_GOOGLE_ENTRY = re.compile(r"^\*{0,2}(\w+)\s*(?:\(([^)]*)\))?\s*:(.*)$")
_NUMPY_RULE = re.compile(r"^\s*-{3,}\s*$")
_NUMPY_ENTRY = re.compile(r"^\*{0,2}(\w+(?:\s*,\s*\*{0,2}\w+)*)\s*(?::.*)?$")
_SPHINX = re.compile(r"^:(?:param|parameter|arg|argument|key|keyword)\s+(?:[^:]+\s+)?\*{0,2}(\w+)\s*:(.*)$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _google_header(line: str) -> Optional[str]:
    m = _GOOGLE_HEADER.match(line.strip())
    return m.group(1).lower() if m and m.group(1).lower() in _SECTIONS else None


def _numpy_header(lines: List[str], i: int) -> Optional[str]:
    if i + 1 < len(lines) and lines[i].strip() and _NUMPY_RULE.match(lines[i + 1]):
        return lines[i].strip().lower()
    return None


def parse_docstring(doc: str) -> Docstring:
    """The first paragraph (its lines joined by spaces) and the parameter descriptions of a
    Google-style (``Args:``), NumPy-style (``Parameters`` over a rule of dashes) or Sphinx-style
    (``:param name:``) docstring."""
    lines = inspect.cleandoc(doc).splitlines() if doc else []
    summary: List[str] = []
    for i, line in enumerate(lines):
        if not line.strip() or _google_header(line) or _numpy_header(lines, i) or line.lstrip().startswith(":"):
            break
        summary.append(line.strip())
    params: Dict[str, str] = {}
    i = 0
    n = len(lines)
    while i < n:
        line = lines[i]
        numpy = _numpy_header(lines, i)
        if numpy is not None:
            base = _indent(line)
            i += 2
            name: Optional[List[str]] = None
            text: List[str] = []
            while i < n and _numpy_header(lines, i) is None and not _google_header(lines[i]):
                entry = lines[i]
                if entry.strip() and _indent(entry) <= base:
                    if name and numpy in _PARAM_SECTIONS:
                        _put(params, name, text)
                    m = _NUMPY_ENTRY.match(entry.strip())
                    name, text = ([s.strip().lstrip("*") for s in m.group(1).split(",")] if m else None), []
                elif name is not None:
                    text.append(entry.strip())
                i += 1
            if name and numpy in _PARAM_SECTIONS:
                _put(params, name, text)
            continue
        google = _google_header(line)
        if google is not None:
            base = _indent(line)
            i += 1
            entry_indent: Optional[int] = None
            name = None
            text = []
            while i < n and (not lines[i].strip() or _indent(lines[i]) > base):
                entry = lines[i]
                if entry.strip():
                    if entry_indent is None:
                        entry_indent = _indent(entry)
                    m = _GOOGLE_ENTRY.match(entry.strip()) if _indent(entry) <= entry_indent else None
                    if m:
                        if name and google in _PARAM_SECTIONS:
                            _put(params, name, text)
                        name, text = [m.group(1)], [m.group(3).strip()]
                    elif name is not None:
                        text.append(entry.strip())
                i += 1
            if name and google in _PARAM_SECTIONS:
                _put(params, name, text)
            continue
        m = _SPHINX.match(line.strip())
        if m:
            base = _indent(line)
            text = [m.group(2).strip()]
            i += 1
            while i < n and lines[i].strip() and _indent(lines[i]) > base and not lines[i].lstrip().startswith(":"):
                text.append(lines[i].strip())
                i += 1
            _put(params, [m.group(1)], text)
            continue
        i += 1
    return Docstring(" ".join(summary), params)


def _put(params: Dict[str, str], names: List[str], text: List[str]) -> None:
    description = " ".join(t for t in text if t)
    if description:
        for name in names:
            params.setdefault(name, description)
