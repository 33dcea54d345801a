"""A tool the model may call."""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional, Union

from ._check import check_parameters
from ._typed import typed_tool

__all__ = ["Tool"]

_EFFECTS = ("read", "idempotent", "write")
_POLICIES = ("fail", "retry", "ask")


class Tool:
    """A tool the model may call. ``parallel=False`` makes it a barrier: it runs alone.

    ``fn`` is either a **typed** function, whose parameters are the arguments
    (``async def search(query: str, limit: int = 10, *, ctx: ToolContext) -> str``): the JSON
    Schema is inferred from its signature and docstring, and each call's arguments are checked
    and converted before the body runs; or the **(args, ctx)** form,
    ``async def fn(args: dict, ctx: ToolContext) -> str | ToolResult``, which gets the arguments
    dict as it came. ``parameters``, when given, must be a JSON Schema with ``"type": "object"``
    (``ValueError`` otherwise); it replaces the inferred schema of a typed function.
    ``description=None`` is the docstring's first paragraph for a typed function, ``""`` for the
    (args, ctx) form (``AgentLoop.tool`` gives that form the whole docstring).
    ``needs_approval=True`` (or a predicate ``f(call: ToolCall) -> bool``) makes each call (each
    one the predicate is true of) wait for a person's decision before it runs
    (``docs/decisions.md``).

    ``effect`` says what running it does: ``"read"`` (nothing), ``"idempotent"`` (a write that
    the call's ``ctx.idempotency_key`` makes happen once however often it runs) or ``"write"``
    (the default). ``on_in_doubt`` says what becomes of a call *in doubt* (its ``tool/call`` is
    logged, its result is not: the process died mid-call): ``"fail"`` (the default: the model
    gets a ``TOOL_OUTCOME_UNKNOWN`` error result), ``"retry"`` (run it again with the same key;
    ``read`` and ``idempotent`` tools only), ``"ask"`` (a person decides), or a function
    ``reconcile(ctx) -> str | ToolResult | None`` that looks at the outside world (``None``:
    fail). Both are written into each call's ``tool/call`` record (``docs/durability.md``)."""

    __slots__ = ("name", "fn", "description", "parameters", "parallel", "needs_approval", "effect", "on_in_doubt", "_typed")

    def __init__(
        self,
        name: str,
        fn: Callable[..., Any],
        description: Optional[str] = None,
        parameters: Optional[Mapping[str, Any]] = None,
        parallel: bool = True,
        *,
        needs_approval: Union[bool, Callable[[Any], bool]] = False,
        effect: str = "write",
        on_in_doubt: Union[str, Callable[..., Any]] = "fail",
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a tool name must be a non-empty str, got {name!r}")
        if not callable(fn):
            raise TypeError(f"tool {name!r}: fn must be callable")
        typed = typed_tool(name, fn)
        if parameters is not None:
            check_parameters(name, parameters, typed)
        if not isinstance(needs_approval, bool) and not callable(needs_approval):
            raise TypeError(f"tool {name!r}: needs_approval must be a bool or a callable, got {type(needs_approval).__name__}")
        if effect not in _EFFECTS:
            raise ValueError(f"tool {name!r}: effect must be 'read', 'idempotent' or 'write', got {effect!r}")
        if not callable(on_in_doubt) and on_in_doubt not in _POLICIES:
            raise ValueError(f"tool {name!r}: on_in_doubt must be 'fail', 'retry', 'ask' or a reconcile function, got {on_in_doubt!r}")
        if on_in_doubt == "retry" and effect == "write":
            raise ValueError(
                f"tool {name!r}: on_in_doubt='retry' needs effect='read' or 'idempotent' "
                "(running a write again may do it twice); use 'fail', 'ask' or a reconcile function"
            )
        self.name = name
        self.parallel = parallel
        self.effect = effect
        self.on_in_doubt = on_in_doubt
        self.needs_approval = needs_approval
        self._typed = typed
        if typed is None:
            self.fn = fn
            self.description = description if description is not None else ""
            self.parameters = dict(parameters) if parameters is not None else {"type": "object", "properties": {}}
        else:
            # The loop calls fn(args, ctx): the adapter checks the arguments, then calls the
            # function with keywords (it is the adapter's __wrapped__).
            self.fn = typed.adapter
            self.description = description if description is not None else typed.description
            self.parameters = dict(parameters) if parameters is not None else typed.schema

    @property
    def typed(self) -> bool:
        """Whether ``fn`` is a typed function (its arguments checked before it runs)."""
        return self._typed is not None

    def reconcile(self, args: Any, ctx: Any) -> Any:
        """What the loop runs instead of ``fn(args, ctx)`` for a call in doubt of a tool whose
        ``on_in_doubt`` is a reconcile function: ``on_in_doubt(ctx)`` (``None`` from it: the
        outcome stays unknown)."""
        if not callable(self.on_in_doubt):
            raise TypeError(f"tool {self.name!r} has no reconcile function (on_in_doubt={self.on_in_doubt!r})")
        return self.on_in_doubt(ctx)

    def spec(self) -> Dict[str, Any]:
        """The JSON spec a model sees. (The loop builds the same dict natively for a plain
        ``Tool``; a subclass that overrides ``spec`` is called.)"""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    def __repr__(self) -> str:
        # The defaults (write, fail) are left out, as in the log.
        tail = f"parallel={self.parallel}"
        if self.effect != "write":
            tail += f", effect={self.effect!r}"
        if callable(self.on_in_doubt):
            tail += f", on_in_doubt={getattr(self.on_in_doubt, '__qualname__', 'reconcile')}"
        elif self.on_in_doubt != "fail":
            tail += f", on_in_doubt={self.on_in_doubt!r}"
        if self._typed is not None:
            return f"Tool({self.name!r}, typed({self._typed.shape()}), {tail})"
        return f"Tool({self.name!r}, {tail})"
