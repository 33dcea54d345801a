"""A tool the model may call."""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional, Union

from ._check import check_parameters
from ._typed import typed_tool

__all__ = ["Tool"]


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
    (``docs/decisions.md``)."""

    __slots__ = ("name", "fn", "description", "parameters", "parallel", "needs_approval", "_typed")

    def __init__(
        self,
        name: str,
        fn: Callable[..., Any],
        description: Optional[str] = None,
        parameters: Optional[Mapping[str, Any]] = None,
        parallel: bool = True,
        *,
        needs_approval: Union[bool, Callable[[Any], bool]] = False,
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
        self.name = name
        self.parallel = parallel
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

    def spec(self) -> Dict[str, Any]:
        """The JSON spec a model sees. (The loop builds the same dict natively for a plain
        ``Tool``; a subclass that overrides ``spec`` is called.)"""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    def __repr__(self) -> str:
        if self._typed is not None:
            return f"Tool({self.name!r}, typed({self._typed.shape()}), parallel={self.parallel})"
        return f"Tool({self.name!r}, parallel={self.parallel})"
