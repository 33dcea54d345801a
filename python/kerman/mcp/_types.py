"""The small types of ``kerman.mcp``: its error, what ``on_progress`` and ``on_elicit`` get,
and the checks of ``MCPServer``'s options."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Collection, Dict, Optional, Union

__all__ = ["MCPServerError", "Progress", "Elicitation", "Filter", "ProgressFn", "ElicitFn", "require_mcp", "check_filter", "positive"]


class MCPServerError(Exception):
    """An MCP server could not be started or answered a request with an error (the message
    names the server)."""


@dataclass(frozen=True)
class Progress:
    """One progress notification of a running MCP tool call (``on_progress=``)."""

    server: str
    tool: str
    call_id: str
    progress: float
    total: Optional[float]
    message: Optional[str]


@dataclass(frozen=True)
class Elicitation:
    """A server's request for input during a call (``on_elicit=``): ``message`` for the
    person, ``schema`` the JSON Schema of the answer (form mode), ``url`` the page to open
    (URL mode)."""

    server: str
    message: str
    schema: Optional[Dict[str, Any]]
    url: Optional[str]


Filter = Union[Callable[[str], bool], Collection[str], None]
ProgressFn = Callable[[Progress], Any]
ElicitFn = Callable[[Elicitation], Awaitable[Optional[Dict[str, Any]]]]


def require_mcp() -> Any:
    try:
        import mcp
    except ImportError as e:  # pragma: no cover - the extra is installed in the tests
        raise ImportError('kerman.mcp needs the mcp package: pip install "kerman[mcp]"') from e
    return mcp


def check_filter(filter: Filter) -> Callable[[str], bool]:
    if filter is None:
        return lambda _name: True
    if callable(filter):
        return filter
    if isinstance(filter, str):
        raise TypeError(f"filter must be a callable or a collection of tool names, not a str ({filter!r}); wrap it in a list")
    names = frozenset(filter)
    return lambda name: name in names


def positive(name: str, value: Optional[float]) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"{name} must be a number of seconds > 0 or None, got {value!r}")
    return float(value)
