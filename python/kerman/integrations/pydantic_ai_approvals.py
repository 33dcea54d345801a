"""Deferred tool approvals under ``KermanDurability`` are Kerman decisions.

A pydantic-ai run whose tools need approval (``requires_approval=True``, ``ApprovalRequired``)
ends with a ``DeferredToolRequests`` output. Under ``KermanDurability`` each of its ``approvals``
becomes a ``decision/requested`` in the session (kind ``approval``, outside any turn, ``for`` the
run: ``{"kind": "pydantic-ai", "run": N}``), written by the core, and the run's
``pydantic-ai/run-end`` keeps the run's messages. A person decides each from any process
(``store.decide``, ``kerman serve``'s decision routes, the owner's ``decide``), as for Kerman's
own requests: one ``decision/resolved``. ``durability.deferred()`` then gives the next run what
pydantic-ai needs to go on, read from the session alone: ``message_history`` and
``deferred_tool_results`` built from the resolutions (approved → ``ToolApproved()``, edited →
``ToolApproved(override_args=...)``, denied → ``ToolDenied(reason)``, expired or cancelled →
``ToolDenied``).
"""

from __future__ import annotations

import json
from typing import Any

import kerman
from kerman import events

__all__ = ["requester", "request", "requests", "results"]

KIND = "pydantic-ai"
DENIED = "The tool call was denied."


def requester(run: int) -> dict[str, Any]:
    """The ``for`` of run ``run``'s requests."""
    return {"kind": KIND, "run": run}


def requests(log: kerman.SessionLog, run: int) -> list[events.DecisionRequested]:
    """The requests logged for run ``run``, in order."""
    want = requester(run)
    return [
        view
        for view in log.events(types=[events.DecisionRequested.TYPE], view=True)
        if isinstance(view, events.DecisionRequested) and view.requester == want
    ]


def request(log: kerman.SessionLog, run: int, output: Any) -> bool:
    """Asks a person about each call of ``output.approvals`` (a ``DeferredToolRequests``), once
    per run: a resumed run that pauses again finds its requests logged and asks nothing more.
    Whether it wrote any."""
    from kerman._core import request_foreign_decisions

    approvals = list(getattr(output, "approvals", None) or [])
    if not approvals or requests(log, run):
        return False
    calls = [(call.tool_call_id, call.tool_name, call.args_as_json_str()) for call in approvals]
    request_foreign_decisions(log, requester(run), calls)
    return True


def _resolutions(log: kerman.SessionLog) -> dict[str, events.DecisionResolved]:
    found: dict[str, events.DecisionResolved] = {}
    for view in log.events(types=[events.DecisionResolved.TYPE], view=True):
        if isinstance(view, events.DecisionResolved):
            found.setdefault(view.decision_id, view)
    return found


def results(log: kerman.SessionLog, run: int) -> Any:
    """The ``DeferredToolResults`` of run ``run``'s requests, once each is decided; a
    ``UserError`` naming the ones still pending otherwise."""
    from pydantic_ai import DeferredToolResults, ToolApproved, ToolDenied
    from pydantic_ai.exceptions import UserError

    asked = requests(log, run)
    resolved = _resolutions(log)
    pending = [f"{r.name} ({r.decision_id})" for r in asked if r.decision_id not in resolved]
    if pending:
        raise UserError(f"KermanDurability: run {run} waits for decisions on {', '.join(pending)}: decide them first (store.decide)")
    out = DeferredToolResults()
    for r in asked:
        decided = resolved[r.decision_id]
        if decided.outcome == "approved":
            out.approvals[r.call_id] = ToolApproved()
        elif decided.outcome == "edited" and decided.arguments is not None:
            out.approvals[r.call_id] = ToolApproved(override_args=json.loads(decided.arguments))
        elif decided.outcome == "denied":
            out.approvals[r.call_id] = ToolDenied(decided.reason or DENIED)
        else:  # expired, cancelled: nobody said yes
            out.approvals[r.call_id] = ToolDenied(f"The tool call was not approved ({decided.outcome}).")
        if decided.by:
            out.answered_by[r.call_id] = decided.by
    return out
