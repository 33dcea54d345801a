"""Example Kerman plugins. Each module has an ``install(loop)`` that registers what it needs::

    from kerman_example_plugins import context, guard

    guard.install(loop)      # first: it sees every batch and every insertion before the others
    context.install(loop)
"""

from __future__ import annotations

from . import context, guard

__all__ = ["context", "guard"]
