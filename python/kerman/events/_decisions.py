"""The views of the decision events (docs/decisions.md): a call waiting for a person, and how
it was resolved; and of ``output/validated``, a turn's structured output (docs/loop.md)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from ._types import _Step
from ._values import _int, _str

__all__ = ["DecisionRequested", "DecisionResolved", "OutputValidated"]


class DecisionRequested(_Step):
    """``decision/requested {turn, step, decisionId, callId, index, name, arguments, digest,
    kind, note?, schema?, expiresAt?, last?, gated?, for?}``: call ``index`` of the step waits for a
    person (``for``: a framework's call, outside any turn)."""

    __slots__ = ()
    TYPE = "decision/requested"

    @property
    def decision_id(self) -> str:
        return _str(self._field("decisionId")) or ""

    @property
    def call_id(self) -> str:
        return _str(self._field("callId")) or ""

    @property
    def index(self) -> int:
        """The call's position among the step's calls."""
        return _int(self._field("index")) or 0

    @property
    def name(self) -> str:
        return _str(self._field("name")) or ""

    @property
    def arguments(self) -> str:
        """The call's exact arguments (JSON text)."""
        return _str(self._field("arguments")) or ""

    @property
    def digest(self) -> str:
        """``sha256:<hex>`` of ``arguments``."""
        return _str(self._field("digest")) or ""

    @property
    def kind(self) -> str:
        """``"approval"`` or ``"answer"``."""
        return _str(self._field("kind")) or "approval"

    @property
    def note(self) -> Optional[str]:
        return _str(self._field("note"))

    @property
    def schema(self) -> Any:
        return self._field("schema")

    @property
    def expires_at(self) -> Optional[int]:
        """Epoch milliseconds, or ``None``."""
        return _int(self._field("expiresAt"))

    @property
    def last(self) -> bool:
        """True on the final request written before the step stops to wait for its decisions."""
        return self._field("last") is True

    @property
    def call_seq(self) -> Optional[int]:
        """The seq of the call's ``tool/call`` when the request is about a call that started
        (``kind`` ``in-doubt`` or ``input``); ``None`` for a request of the gate or a budget's."""
        return _int(self._field("callSeq"))

    @property
    def options(self) -> List[str]:
        """What a request about a started call offers (``run-again``, ``record-result``,
        ``record-failure``; ``answer``, ``decline``); ``[]`` for the gate's."""
        value = self._field("options")
        return [o for o in value if isinstance(o, str)] if isinstance(value, list) else []

    @property
    def payload(self) -> Any:
        """An ``input`` request's opaque data for the call made again (an MCP server's input
        requests and state token), or ``None``."""
        return self._field("payload")

    @property
    def gated(self) -> List[Dict[str, Any]]:
        """On the ``last`` request: the gate's verdicts on the step's calls that asked no one,
        ``{index, callId, verdict: "run"|"edit"|"deny"|"failed", arguments?, digest?,
        reason?}`` each (``arguments``: an edit's; ``digest``: of what runs; ``reason``: a
        denial's, or why the gate failed). The step resumes with them (``[]`` elsewhere)."""
        value = self._field("gated")
        return [dict(g) for g in value if isinstance(g, dict)] if isinstance(value, list) else []

    @property
    def requester(self) -> Optional[Dict[str, Any]]:
        """``for``: who asked, when the call is a loop's other than Kerman's (a framework's
        deferred tool call under ``KermanDurability``: ``{"kind": "pydantic-ai", "run": 2}``;
        ``turn`` and ``step`` are then 0); ``None`` for Kerman's own requests."""
        value = self._field("for")
        return dict(value) if isinstance(value, dict) else None


class DecisionResolved(_Step):
    """``decision/resolved {turn, step, decisionId, callId, outcome, by?, key?, digest?,
    arguments?, reason?, value?}``: how a request was resolved (``approved``, ``denied``,
    ``edited``, ``answered``, ``expired``, ``cancelled``)."""

    __slots__ = ()
    TYPE = "decision/resolved"

    @property
    def decision_id(self) -> str:
        return _str(self._field("decisionId")) or ""

    @property
    def call_id(self) -> str:
        return _str(self._field("callId")) or ""

    @property
    def outcome(self) -> str:
        return _str(self._field("outcome")) or ""

    @property
    def by(self) -> Optional[str]:
        return _str(self._field("by"))

    @property
    def key(self) -> Optional[str]:
        return _str(self._field("key"))

    @property
    def digest(self) -> Optional[str]:
        """``sha256:<hex>`` of the arguments that will run (approved, edited)."""
        return _str(self._field("digest"))

    @property
    def arguments(self) -> Optional[str]:
        """The edited arguments (JSON text), for ``edited``."""
        return _str(self._field("arguments"))

    @property
    def reason(self) -> Optional[str]:
        return _str(self._field("reason"))

    @property
    def value(self) -> Any:
        """An answer's value, for ``answered``."""
        return self._field("value")


class OutputValidated(_Step):
    """``output/validated {turn, step, output}``: the turn's final reply (of step ``step``)
    validated against its output type; ``output`` is the value as JSON (``RunResult.output``
    is it typed)."""

    __slots__ = ()
    TYPE = "output/validated"

    @property
    def output(self) -> Any:
        return self._field("output")
