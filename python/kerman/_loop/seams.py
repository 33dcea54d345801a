"""``AgentLoop``'s registration: the seams' waterfalls, live-event listeners, insert transforms,
tools and tool sources, compaction."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Union, cast, overload

from .. import _dispatch
from .. import compaction as _compaction
from ..compaction import Compactor, Strategy
from ..tools import Tool
from .state import _F, LIVE_EVENTS, _LoopState

if TYPE_CHECKING:
    from ..loop import AgentLoop, ToolSource


class _Seams(_LoopState):
    # ---- registration -----------------------------------------------------------------------

    def _decorator(self, listeners: List[Callable[..., Any]], fn: Optional[Callable[..., Any]], prepend: bool, where: str) -> Any:
        if fn is None:
            return lambda f: self._decorator(listeners, f, prepend, where)
        _dispatch.register(listeners, fn, prepend, where)
        return fn

    @overload
    def pre_step(self, fn: _F, *, prepend: bool = False) -> _F: ...
    @overload
    def pre_step(self, fn: None = None, *, prepend: bool = False) -> Callable[[_F], _F]: ...
    def pre_step(self, fn: Optional[Callable[..., Any]] = None, *, prepend: bool = False) -> Any:
        """Waterfall before every step: ``async def f(step: PreStep, next) -> Enter | Reject``."""
        return self._decorator(self._pre_step, fn, prepend, "pre_step")

    @overload
    def before_request(self, fn: _F, *, prepend: bool = False) -> _F: ...
    @overload
    def before_request(self, fn: None = None, *, prepend: bool = False) -> Callable[[_F], _F]: ...
    def before_request(self, fn: Optional[Callable[..., Any]] = None, *, prepend: bool = False) -> Any:
        """Waterfall before every model request: ``async def f(request, next) -> ModelRequest``."""
        return self._decorator(self._before_request, fn, prepend, "before_request")

    @overload
    def request_error(self, fn: _F, *, prepend: bool = False) -> _F: ...
    @overload
    def request_error(self, fn: None = None, *, prepend: bool = False) -> Callable[[_F], _F]: ...
    def request_error(self, fn: Optional[Callable[..., Any]] = None, *, prepend: bool = False) -> Any:
        """Waterfall on a model failure: ``async def f(failure, next) -> Retry | None``."""
        return self._decorator(self._request_error, fn, prepend, "request_error")

    @overload
    def before_compaction(self, fn: _F, *, prepend: bool = False) -> _F: ...
    @overload
    def before_compaction(self, fn: None = None, *, prepend: bool = False) -> Callable[[_F], _F]: ...
    def before_compaction(self, fn: Optional[Callable[..., Any]] = None, *, prepend: bool = False) -> Any:
        """Waterfall before every compaction: ``async def f(compaction: Compaction, next) ->
        Compaction | Veto``; ``await next()`` runs the strategy (docs/context.md)."""
        return self._decorator(self._before_compaction, fn, prepend, "before_compaction")

    @property
    def history(self) -> List[Any]:
        """The derived history the next request starts from (user, assistant and tool-result
        messages in log order, with every compaction applied), as a new list."""
        return list(self._core.history())

    @property
    def compaction(self) -> Optional[Compactor]:
        """The :class:`~kerman.compaction.Compactor` that compacts by itself (``None``: only
        ``await loop.compact(strategy)`` does)."""
        return self._compactor

    @compaction.setter
    def compaction(self, value: Optional[Compactor]) -> None:
        if value is not None and not isinstance(value, Compactor):
            raise TypeError(f"compaction must be a kerman.compaction.Compactor or None, got {value!r}")
        if self._compactor is not None:
            self._compactor._detach(cast("AgentLoop", self))
        self._compactor = value
        if value is not None:
            value._attach(cast("AgentLoop", self))

    async def compact(
        self,
        strategy: Optional[Strategy] = None,
        *,
        first: Optional[int] = None,
        last: Optional[int] = None,
        pin: Sequence[Any] = (),
    ) -> Optional[Any]:
        """Compacts the history now (docs/context.md, "Compaction"): ``strategy`` (default: the
        ``compaction`` Compactor's) replaces the oldest messages but its ``keep`` last, or the
        span ``first..last`` (seqs) when given; ``pin`` keeps messages verbatim. Returns the
        ``context/compacted`` record's view (``kerman.events.ContextCompacted``), or ``None``
        when there was nothing to compact or a ``before_compaction`` listener vetoed. A strategy
        that raises appends nothing."""
        self._check_fenced()
        if strategy is None:
            if self._compactor is None:
                raise ValueError("no strategy: pass one (loop.compact(SlidingWindow())) or set loop.compaction")
            strategy = self._compactor.strategy
        return await _compaction.compact(cast("AgentLoop", self), strategy, first=first, last=last, pin=pin)

    @overload
    def turn_stopping(self, fn: _F, *, prepend: bool = False) -> _F: ...
    @overload
    def turn_stopping(self, fn: None = None, *, prepend: bool = False) -> Callable[[_F], _F]: ...
    def turn_stopping(self, fn: Optional[Callable[..., Any]] = None, *, prepend: bool = False) -> Any:
        """Serial, when a turn is about to end: ``async def f(stop: TurnStopping) -> None``."""
        return self._decorator(self._turn_stopping, fn, prepend, "turn_stopping")

    @overload
    def on_insert(self, fn: _F, *, prepend: bool = False) -> _F: ...
    @overload
    def on_insert(self, fn: None = None, *, prepend: bool = False) -> Callable[[_F], _F]: ...
    def on_insert(self, fn: Optional[Callable[..., Any]] = None, *, prepend: bool = False) -> Any:
        """Registers an insert transform on the loop's inbox: ``def f(message: UserMessage,
        target: str) -> UserMessage | Refuse``, run (sync) on every new message before its
        splice is committed: ``followup``/``steer``/``inject``/``send``, the inbox's own
        mutations and tool contexts (docs/plugins.md)."""
        if fn is None:
            return lambda f: self.on_insert(f, prepend=prepend)
        return self._inbox.on_insert(fn, prepend=prepend)

    @overload
    def on(self, event: str, fn: _F, *, prepend: bool = False) -> _F: ...
    @overload
    def on(self, event: str, fn: None = None, *, prepend: bool = False) -> Callable[[_F], _F]: ...
    def on(self, event: str, fn: Optional[Callable[..., Any]] = None, *, prepend: bool = False) -> Any:
        """Registers a live-event listener (sync or async; failures are logged)."""
        if event not in self._listeners:
            raise ValueError(f"unknown live event {event!r}; expected one of {', '.join(LIVE_EVENTS)}")
        return self._decorator(self._listeners[event], fn, prepend, repr(event))

    def remove_listener(self, fn: Callable[..., Any]) -> bool:
        """Removes ``fn`` from every seam it is registered on; False if it was nowhere."""
        found = False
        for listeners in [
            *self._listeners.values(),
            self._pre_step,
            self._before_request,
            self._request_error,
            self._turn_stopping,
            self._before_tool,
            self._before_compaction,
        ]:
            while fn in listeners:
                listeners.remove(fn)
                found = True
        self._regate()
        while self._inbox.remove_transform(fn):
            found = True
        return found

    @overload
    def before_tool(self, fn: _F, *, prepend: bool = False) -> _F: ...
    @overload
    def before_tool(self, fn: None = None, *, prepend: bool = False) -> Callable[[_F], _F]: ...
    def before_tool(self, fn: Optional[Callable[..., Any]] = None, *, prepend: bool = False) -> Any:
        """Waterfall before every tool call runs: ``async def gate(call: ToolCall, next) ->
        Approve | Deny | Edit | Ask`` (``await next()`` gives the default: ``Ask()`` for a tool
        that needs approval, else ``Approve()``). A gate that raises or returns anything else
        keeps the call from running (``docs/decisions.md``)."""
        if fn is None:
            return lambda f: self.before_tool(f, prepend=prepend)
        out = self._decorator(self._before_tool, fn, prepend, "before_tool")
        self._regate()
        return out

    def _regate(self) -> None:
        """Calls are gated while a gate is registered or a tool needs approval."""
        self._core.gated = bool(self._before_tool) or any(t.needs_approval is not False for t in self._tools.values())

    def tool(
        self,
        fn: Any = None,
        *,
        name: Optional[str] = None,
        description: Optional[str] = None,
        parameters: Optional[Dict[str, Any]] = None,
        parallel: bool = True,
        needs_approval: Union[bool, Callable[[Any], bool]] = False,
        effect: str = "write",
        on_in_doubt: Union[str, Callable[..., Any]] = "fail",
    ) -> Any:
        """Registers a tool: ``@loop.tool``, ``@loop.tool(name=..., parallel=False)`` or
        ``loop.tool(Tool(...))``. Returns what it was given. A typed function
        (``async def search(query: str, limit: int = 10, *, ctx)``) gets its schema from its
        signature and its description from its docstring's first paragraph; a function of the
        ``(args, ctx)`` form gets the whole docstring (see :class:`Tool`)."""
        if isinstance(fn, Tool):
            self._add_tool(fn)
            return fn
        if fn is None:
            return lambda f: self.tool(
                f,
                name=name,
                description=description,
                parameters=parameters,
                parallel=parallel,
                needs_approval=needs_approval,
                effect=effect,
                on_in_doubt=on_in_doubt,
            )
        tool = Tool(
            name or fn.__name__,
            fn,
            description,
            parameters,
            parallel,
            needs_approval=needs_approval,
            effect=effect,
            on_in_doubt=on_in_doubt,
        )
        if description is None and not tool.typed:  # the (args, ctx) form: the whole docstring
            # cleandoc: Python 3.13 strips docstring indentation itself; every version gives the same text.
            tool.description = inspect.cleandoc(fn.__doc__ or "").strip()
        self._add_tool(tool)
        return fn

    def add_tools(self, *tools: Union[Tool, ToolSource]) -> None:
        """Registers tools: ``Tool`` objects, and tool sources such as a
        ``kerman.mcp.MCPServer`` (whose tools are listed when a model request first needs
        them, and whose connection ``aclose()`` closes)."""
        for tool in tools:
            self._add_any(tool)

    def _add_any(self, tool: Union[Tool, ToolSource]) -> None:
        attach = getattr(tool, "_kerman_attach", None)
        if attach is None or isinstance(tool, Tool):
            self._add_tool(tool)  # type: ignore[arg-type]
            return
        attach(self)
        self._sources.append(tool)

    def _add_tool(self, tool: Tool) -> None:
        if not isinstance(tool, Tool):
            raise TypeError(f"expected a kerman.Tool or a tool source (kerman.mcp.MCPServer), got {type(tool).__name__}")
        if tool.name in self._tools:
            raise ValueError(f"a tool named {tool.name!r} is already registered")
        self._tools[tool.name] = tool
        if tool.needs_approval is not False and hasattr(self, "_core"):
            self._core.gated = True
