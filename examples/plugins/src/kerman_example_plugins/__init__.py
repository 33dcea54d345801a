"""Example Kerman plugins. Each module has an ``install(loop)`` that registers what it needs::

from kerman_example_plugins import approvals, context, guard

guard.install(loop)      # first: it sees every batch and every insertion before the others
context.install(loop)
approvals.install(loop)  # a before_tool gate: asks, denies or edits tool calls
"""

from __future__ import annotations

from . import approvals, context, guard

__all__ = ["approvals", "context", "guard"]
