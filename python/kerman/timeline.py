"""Timeline lines for plugin event types: how ``kerman log show`` (and every timeline built on
``kerman.cli``) summarizes an event type that is not Kerman's own.

Kerman's own types have a summary each. A plugin's namespaced type (``myframework/handoff``)
shows as compact JSON unless the plugin registers a function that makes its payload one line:

    kerman.timeline.register("myframework/handoff", lambda data: f"{data['from']} → {data['to']}")

The function gets the event's payload (a ``dict``) and returns a short ``str``; the timeline
escapes control characters and falls back to compact JSON when the function raises. The types of
Kerman's integrations (``pydantic-ai/*``, ``openai-agents/*``) are registered here, without
importing those frameworks, so ``kerman log show`` summarizes them in any environment.

``kerman log show`` runs in a process of its own, which imports no plugin: a package reaches it
through the ``kerman.timeline`` entry point group, each entry naming a mapping of its types to
their summary functions (``[project.entry-points."kerman.timeline"] myframework =
"myframework.kerman:TIMELINE"``), loaded the first time a summary is looked up.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Dict, Mapping, Optional

__all__ = ["register", "summarizer"]

Summary = Callable[[Dict[str, Any]], str]

_REGISTRY: Dict[str, Summary] = {}
_BUILTINS_LOADED = False


def register(type: str, summarize: Summary) -> None:
    """Makes ``summarize(payload) -> str`` the timeline summary of events of ``type`` (a
    namespaced plugin type; Kerman's own types have theirs). Registering a type again replaces
    its function."""
    from . import events

    if not isinstance(type, str) or "/" not in type.strip("/"):
        raise ValueError(f"kerman.timeline.register: type must be a namespaced event type such as 'myframework/handoff', not {type!r}")
    if type in events.TYPES:
        raise ValueError(f"kerman.timeline.register: {type!r} is one of Kerman's own event types, which have their summary")
    if not callable(summarize):
        raise TypeError(f"kerman.timeline.register: summarize must be a function of the payload, not {summarize!r}")
    _REGISTRY[type] = summarize


def summarizer(type: str) -> Optional[Summary]:
    """The registered summary function of ``type``, or ``None``."""
    global _BUILTINS_LOADED
    if not _BUILTINS_LOADED:
        _BUILTINS_LOADED = True
        from .integrations import _timeline

        for name, fn in _timeline.SUMMARIES.items():
            _REGISTRY.setdefault(name, fn)
        _load_entry_points()
    return _REGISTRY.get(type)


def _load_entry_points() -> None:
    """The ``kerman.timeline`` entry points of installed packages; a broken one is skipped with
    a warning naming it (the timeline still prints, as JSON)."""
    from importlib.metadata import entry_points

    for entry in entry_points(group="kerman.timeline"):
        try:
            mapping = entry.load()
            if not isinstance(mapping, Mapping):
                raise TypeError(f"it names {mapping!r}, not a mapping of event types to functions")
            for name, fn in mapping.items():
                if name not in _REGISTRY:
                    register(name, fn)
        except Exception as error:
            warnings.warn(f"kerman.timeline: entry point {entry.name!r} ({entry.value}) skipped: {error}", stacklevel=2)
