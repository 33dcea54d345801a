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

A request has a deadline when the tool asked with one: ``ApprovalRequired(metadata=
{"kerman_expires_in": seconds})`` or ``{"kerman_expires_at": datetime | epoch seconds}``, read
as ``kerman.Ask`` reads them. Past it, a decision is refused ``expired`` (and the expiry logged),
and the next ``deferred()`` logs the expiry of what nobody decided in time before it reads the
resolutions. ``cancel(log)`` resolves a paused run's pending requests ``cancelled`` (a Kerman
loop's ``cancel()`` leaves them: they are not its turn's).
"""

from __future__ import annotations

import json
from typing import Any

import kerman
from kerman import events

__all__ = ["requester", "request", "requests", "results", "cancel", "EXPIRES_IN", "EXPIRES_AT"]

KIND = "pydantic-ai"
DENIED = "The tool call was denied."
# The keys of a deferred call's metadata that give its request a deadline.
EXPIRES_IN = "kerman_expires_in"
EXPIRES_AT = "kerman_expires_at"


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
    metadata = getattr(output, "metadata", None) or {}
    calls = [(c.tool_call_id, c.tool_name, c.args_as_json_str(), _deadline(c, metadata.get(c.tool_call_id))) for c in approvals]
    request_foreign_decisions(log, requester(run), calls)
    return True


def _deadline(call: Any, metadata: Any) -> int | None:
    """The deadline (epoch ms) ``call``'s metadata sets, if any, read as ``kerman.Ask`` reads it."""
    if not isinstance(metadata, dict) or (EXPIRES_IN not in metadata and EXPIRES_AT not in metadata):
        return None
    try:
        return kerman.Ask(expires_in=metadata.get(EXPIRES_IN), expires_at=metadata.get(EXPIRES_AT)).deadline_ms
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"KermanDurability: the deadline of tool call {call.tool_call_id!r} ({call.tool_name}) is not one: "
            f"{EXPIRES_IN}={metadata.get(EXPIRES_IN)!r}, {EXPIRES_AT}={metadata.get(EXPIRES_AT)!r} ({error})"
        ) from None


def cancel(log: kerman.SessionLog, run: int | None = None) -> int:
    """Resolves the pending requests of run ``run`` (of every run when ``None``) as ``cancelled``:
    one ``decision/resolved`` each, in a session this process holds (``durability.log``; with a
    ``FileStore``, one no other process has open). The next ``deferred()`` gives each such call a
    ``ToolDenied``. Returns how many were cancelled."""
    from kerman._core import cancel_foreign_decisions

    return cancel_foreign_decisions(log, None if run is None else requester(run))


def _resolutions(log: kerman.SessionLog) -> dict[str, events.DecisionResolved]:
    found: dict[str, events.DecisionResolved] = {}
    for view in log.events(types=[events.DecisionResolved.TYPE], view=True):
        if isinstance(view, events.DecisionResolved):
            found.setdefault(view.decision_id, view)
    return found


def results(log: kerman.SessionLog, run: int) -> Any:
    """The ``DeferredToolResults`` of run ``run``'s requests, once each is decided (or expired:
    those past their deadline are resolved ``expired`` first); a ``UserError`` naming the ones
    still pending otherwise."""
    from pydantic_ai import DeferredToolResults, ToolApproved, ToolDenied
    from pydantic_ai.exceptions import UserError

    from kerman._core import expire_decisions

    # What nobody decided by its deadline is expired now, logged as the loop's own are.
    expire_decisions(log)
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
