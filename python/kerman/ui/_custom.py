"""Custom events: the event types plugins and applications append, as the UI streams show them.

An event whose type Kerman does not write (``kerman.events.OtherEvent``: ``goal/change``,
``progress/update``, ...) reaches AG-UI as a ``CUSTOM`` event and Vercel as a ``data-*`` part.
By default the name is the event type and the value its data, as stored. A mapping hook,
``custom=fn`` on ``agui``/``vercel`` and the projections, decides per event: it gets the event's
view and returns a ``Custom`` (renamed, transformed) or ``None`` (not shown).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from .. import events

__all__ = ["Custom", "CustomMapping", "default_custom", "mapped"]


@dataclass(frozen=True)
class Custom:
    """What a UI stream shows for one custom log event.

    ``name``: AG-UI's ``CUSTOM`` ``name``; the Vercel part's type is ``data-<name>``.
    ``value``: AG-UI's ``value`` and the Vercel part's ``data`` (JSON-ready).
    ``id`` (Vercel only): a part with the id of an earlier part of the same type replaces it in
    the client (a progress bar updated in place); ``None`` appends a new part.
    ``transient`` (Vercel only): the client sees the part but does not keep it in the message.
    """

    name: str
    value: Any = None
    id: Optional[str] = None
    transient: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a custom event needs a non-empty name (str), got {self.name!r}")
        if self.id is not None and not isinstance(self.id, str):
            raise TypeError(f"a custom event's id is a str or None, got {self.id!r}")
        if not isinstance(self.transient, bool):
            raise TypeError(f"a custom event's transient is a bool, got {self.transient!r}")


#: A mapping hook: the custom event's view to what the streams show, or ``None`` to drop it.
CustomMapping = Callable[[events.OtherEvent], Optional[Custom]]


def default_custom(view: events.OtherEvent) -> Custom:
    """The default mapping: the event type as the name, its data as the value."""
    return Custom(view.type, view.data)


def mapped(hook: Optional[CustomMapping], view: events.OtherEvent) -> Optional[Custom]:
    """What ``hook`` (the default when ``None``) makes of ``view``; a ``TypeError`` naming the
    hook when it returns anything but a ``Custom`` or ``None``."""
    if hook is None:
        return default_custom(view)
    out = hook(view)
    if out is None or isinstance(out, Custom):
        return out
    name = getattr(hook, "__qualname__", repr(hook))
    raise TypeError(
        f"custom event mapping {name} returned {out!r:.80} for {view.type!r} (seq {view.seq}); expected kerman.ui.Custom or None"
    )
