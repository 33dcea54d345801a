"""Crashed turns are answered (docs/durability.md, "Crashed turns are answered").

``AgentLoop(resume=...)`` says what a loop does with a turn a crash interrupted: ``"close"``
(SPEC's behaviour: the store's closers ended it ``interrupted``, and that is all) or
``"continue"``: when that turn entered input and logged no final answer to it, the next run
begins with a *continuation*, a new turn (``turn/start {turn, continues}``) that claims nothing
and asks the model again over the history as logged; and input the interrupted turn claimed
but never entered is requeued. Whether a continuation is due is the Rust core's fold
(``src/agent_loop/continuation.rs``), from the log alone; this module holds the Python side's
few choices: the mode's names, its default limit, and who adopts ``"continue"`` by default.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from .errors import LoopError

if TYPE_CHECKING:
    from .loop import AgentLoop

RESUME_MODES = ("continue", "close")

# A loop continues a chain of crashed turns while it holds fewer than this many: the
# interrupted turn and the continuations of it that crashed too. The same count as a Worker's
# default max_failures, so a session whose continuations keep crashing stops being continued
# when a Worker parks it.
CONTINUE_LIMIT = 3


def check_resume(value: object) -> Optional[str]:
    """``None`` (not chosen) or a valid mode; anything else is refused, naming it."""
    if value is None or isinstance(value, str) and value in RESUME_MODES:
        return value
    raise ValueError(f'resume must be "continue" or "close", got {value!r}')


def apply(loop: AgentLoop, mode: str, limit: int = CONTINUE_LIMIT) -> None:
    """Sets ``loop``'s mode (and, for ``"continue"``, how many crashed turns in a row it continues)."""
    loop._core.continue_crashes = limit if mode == "continue" else 0
    loop._requeue_due = mode == "continue"


def adopt(loop: AgentLoop, limit: int = CONTINUE_LIMIT) -> None:
    """A ``Worker`` or ``kerman serve`` runs ``loop``: ``"continue"`` unless the loop chose."""
    if loop._resume_chosen != "close":
        apply(loop, "continue", limit)


def requeue_interrupted(loop: AgentLoop) -> int:
    """Input the last turn claimed and never entered comes back when a crash interrupted that
    turn (once: ``requeue_claimed`` refuses a second time); how many messages."""
    log = loop._log
    # Back from the end to the last turn's bound: usually the closers' turn/end is last.
    for seq in range(len(log) - 1, -1, -1):
        event = log[seq]
        if event.type == "turn/start":
            return 0
        if event.type == "turn/end":
            data = event.data
            reason = data.get("reason") if isinstance(data, dict) else None
            if not isinstance(reason, dict) or reason.get("kind") != "interrupted":
                return 0
            try:
                return len(loop.requeue_claimed(int(data["turn"])))
            except LoopError:
                return 0
    return 0


def take_up(loop: AgentLoop) -> bool:
    """``kerman serve`` opened ``loop``'s session: under ``"continue"``, crashed work goes on at
    once (what the interrupted turn claimed is requeued, a due continuation starts). True if a
    turn started."""
    if loop.resume != "continue":
        return False
    requeued = 0
    if loop._requeue_due:
        loop._requeue_due = False
        requeued = requeue_interrupted(loop)
    if requeued or loop._core.resumable:
        return loop.wake()
    return False
