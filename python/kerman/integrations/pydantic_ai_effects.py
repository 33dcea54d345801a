"""Effect classes for pydantic-ai tools under ``KermanDurability``: what a tool call whose body
started but whose result was never logged (the process died in between) becomes on resume.

Each tool has an effect class, as Kerman's own tools do (docs/durability.md, "Calls in doubt"):
``"read"`` (running it again changes nothing), ``"idempotent"`` (running it again with the same
key does it once) or ``"write"`` (the default: running it again may do it twice); and a policy
for a call in doubt: ``"retry"`` (run the body again; the default for ``read`` and
``idempotent``, refused for a ``write``), ``"fail"`` (the default for a ``write``: the model gets
a failed tool result saying the outcome is unknown, and the body does not run again) or a
function ``reconcile(call)`` that looks the outcome up (``None``: it did not happen, run the body
again; a value: the tool's result; raising ``ToolFailed`` / ``ModelRetry``: as the tool would).

A tool's class comes from ``KermanDurability(..., effects={"book": "write", "weather": "read"})``
(a name to an effect, or to ``(effect, on_in_doubt)``), else from the tool's pydantic-ai metadata
(``@agent.tool(metadata={"kerman_effect": "read", "kerman_on_in_doubt": "retry"})``), else it is a
``write`` that fails in doubt.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Union

__all__ = ["ToolPolicy", "InDoubtCall", "EFFECTS", "resolve_policy", "check_effects"]

EFFECTS = ("read", "idempotent", "write")
POLICIES = ("retry", "fail")

OnInDoubt = Union[str, Callable[["InDoubtCall"], Any]]


@dataclass(frozen=True)
class InDoubtCall:
    """A tool call found in doubt on resume, as a ``reconcile`` function gets it: the tool's
    name, its unit (pydantic-ai's invocation name) and occurrence ``n`` in run ``run`` of session
    ``session_id``. ``key`` is the same for every execution of this call, in any process
    (``kerman:<session>:<run>:<unit>:<n>``): pass it to an API that deduplicates writes, and look
    it up here."""

    tool: str
    unit: str
    n: int
    run: int
    session_id: str

    @property
    def key(self) -> str:
        return f"kerman:{self.session_id}:{self.run}:{self.unit}:{self.n}"


@dataclass(frozen=True)
class ToolPolicy:
    """One tool's effect class and in-doubt policy (the durable unit configuration of its calls)."""

    tool: str
    effect: str = "write"
    on_in_doubt: OnInDoubt = "fail"

    @property
    def needs_marker(self) -> bool:
        """Whether a call is marked started before its body runs: a call that would simply run
        again in doubt needs no marker, so reads cost no extra append."""
        return self.on_in_doubt != "retry"


def _policy(tool: str, effect: Any, on_in_doubt: Any, where: str) -> ToolPolicy:
    if effect not in EFFECTS:
        raise ValueError(f"KermanDurability: tool {tool!r}: effect must be one of {EFFECTS} ({where}), not {effect!r}")
    if on_in_doubt is None:
        on_in_doubt = "fail" if effect == "write" else "retry"
    elif not callable(on_in_doubt) and on_in_doubt not in POLICIES:
        raise ValueError(
            f"KermanDurability: tool {tool!r}: on_in_doubt must be 'retry', 'fail' or a function reconcile(call) "
            f"({where}), not {on_in_doubt!r}"
        )
    if on_in_doubt == "retry" and effect == "write":
        raise ValueError(
            f"KermanDurability: tool {tool!r} is a 'write': running it again in doubt may do it twice, so on_in_doubt='retry' "
            f"is refused ({where}); make it 'idempotent' (with call.key as its idempotency key) or give a reconcile function"
        )
    return ToolPolicy(tool, effect, on_in_doubt)


def check_effects(effects: Optional[Mapping[str, Any]]) -> Dict[str, ToolPolicy]:
    """The ``effects=`` argument as policies, each checked (a bad one named)."""
    if effects is None:
        return {}
    if not isinstance(effects, Mapping):
        raise TypeError(f"KermanDurability: effects must be a mapping of tool names to effects, not {effects!r}")
    out: Dict[str, ToolPolicy] = {}
    for tool, spec in effects.items():
        effect, on_in_doubt = _split(tool, spec)
        out[tool] = _policy(tool, effect, on_in_doubt, "in effects=")
    return out


def _split(tool: str, spec: Any) -> Tuple[Any, Any]:
    if isinstance(spec, str):
        return spec, None
    if isinstance(spec, tuple) and len(spec) == 2:
        return spec
    raise ValueError(f"KermanDurability: effects[{tool!r}] must be an effect or (effect, on_in_doubt), not {spec!r}")


def resolve_policy(effects: Mapping[str, ToolPolicy], tool: Any, tool_name: str) -> ToolPolicy:
    """The policy of tool ``tool_name``: from ``effects=``, else its metadata, else a write."""
    found = effects.get(tool_name)
    if found is not None:
        return found
    tool_def = getattr(tool, "tool_def", None)
    metadata = getattr(tool_def, "metadata", None) or {}
    if "kerman_effect" in metadata or "kerman_on_in_doubt" in metadata:
        return _policy(tool_name, metadata.get("kerman_effect", "write"), metadata.get("kerman_on_in_doubt"), "in its metadata")
    return ToolPolicy(tool_name)


def outcome_unknown(call: InDoubtCall) -> Dict[str, Any]:
    """The logged result of a call failed in doubt: pydantic-ai's journal form of ``ToolFailed``,
    which the model sees as a failed tool return."""
    message = (
        f"outcome unknown: the call to {call.tool!r} started but the process stopped before its result was "
        f"recorded; it may or may not have taken effect, and it was not run again"
    )
    return {"message": message, "kind": "tool_failed"}


async def reconcile(policy: ToolPolicy, call: InDoubtCall) -> Tuple[bool, Any]:
    """``(run the body again?, the logged result otherwise)`` for a call in doubt."""
    if policy.on_in_doubt == "retry":
        return True, None
    if policy.on_in_doubt == "fail":
        return False, outcome_unknown(call)
    from pydantic_ai.exceptions import ModelRetry, ToolFailed

    try:
        value = policy.on_in_doubt(call)  # type: ignore[operator]
        if inspect.isawaitable(value):
            value = await value
    except ToolFailed as e:
        return False, {"message": e.message, "kind": "tool_failed"}
    except ModelRetry as e:
        return False, {"message": e.message, "kind": "model_retry"}
    if value is None:
        return True, None
    from pydantic_core import to_jsonable_python

    return False, {"result": to_jsonable_python(value), "kind": "tool_return"}
