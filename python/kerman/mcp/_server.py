"""``MCPServer``: an MCP server's tools, resources and prompts, through the ``mcp`` package's
client.

The connection lives in an asyncio task of its own (the runner): the ``mcp`` client is an anyio
context manager whose task group must be entered and left by one task, while it is used from
the loop's driver (the first request needs the tool list), from tool calls and from
``aclose``. The runner enters the client, publishes it, and waits to be told to stop; a
connection that breaks (a server process that died) ends the runner, and the next use starts a
new one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Dict, List, Mapping, Optional, Sequence, Union
from urllib.parse import urlsplit

from .._core import AssistantMessage, UserMessage
from ..decisions import InputRequired
from ..tools import Tool, ToolContext, ToolResult
from . import _input, _progress, _task_input, _tasks
from ._adapter import MCPTool, effect_of, is_destructive
from ._content import content_of, resource_blocks, result_meta
from ._transport import HttpTarget, OwnedHttp, describe, is_broken, server_stderr
from ._types import Elicitation, ElicitFn, Filter, MCPServerError, Progress, ProgressFn, check_filter, positive, require_mcp

if TYPE_CHECKING:
    from ..loop import AgentLoop

__all__ = ["MCPServer"]

logger = logging.getLogger("kerman.mcp")

# JSON-RPC error codes the mcp package raises for a broken connection and a timed-out request.
_CONNECTION_CLOSED = -32000
_REQUEST_TIMEOUT = -32001


class MCPServer:
    """An MCP server whose tools a loop offers its model: ``AgentLoop(tools=[server])`` or
    ``loop.add_tools(server)``. Build one with :meth:`stdio` or :meth:`http`.

    The server is started when a loop first needs its tool list (the first model request) and
    closed with the loop (``aclose``). A connection that breaks during a call (the server's
    process died) gives that call an error result naming what happened; the next use starts the
    server again. The tool list is read again after the server says it changed.

    ``prefix`` is put before every tool name the model sees; ``filter`` (a collection of the
    server's tool names, or a predicate on them) chooses which tools are offered. ``timeout``
    bounds each call (seconds; the call gets an error result and the server a cancellation),
    ``connect_timeout`` the start. ``approve_destructive=True`` makes every call of a tool the
    server does not declare read-only or non-destructive wait for a person's decision
    (``docs/decisions.md``). ``sampling_model`` is a Kerman model (a provider, or any
    ``async def model(request)``) that answers the server's sampling requests; without it they
    are refused. ``on_elicit`` answers the server's requests for input (``async def
    f(Elicitation) -> dict | None``; ``None`` declines); without it they are declined.
    ``durable_input=True`` makes them durable decisions instead (``docs/mcp.md``): the call's
    input-required result is logged as a request for a person, and once answered the call is
    made again with the answer and the server's state token, also from another process; a
    task's request for input is logged the same way, and the answer goes to that task.
    ``on_progress`` gets each :class:`Progress` notification of a running call; the session log
    keeps them, coalesced, as ``tool/progress`` records (docs/mcp.md, "Progress").
    ``tasks=True`` (the default) declares the tasks extension: a server may answer a call with a
    task, whose id is logged before the call waits for it, so that a session resumed after the
    client process died polls the task instead of declaring the call in doubt (docs/mcp.md,
    "Long-running tasks").
    """

    def __init__(
        self,
        target: Any,
        *,
        name: str,
        prefix: str = "",
        filter: Filter = None,
        timeout: Optional[float] = None,
        connect_timeout: float = 30.0,
        approve_destructive: bool = False,
        sampling_model: Any = None,
        on_elicit: Optional[ElicitFn] = None,
        on_progress: Optional[ProgressFn] = None,
        durable_input: bool = False,
        tasks: bool = True,
    ) -> None:
        require_mcp()
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
        if sampling_model is not None and not callable(sampling_model):
            raise TypeError(f"sampling_model must be a model (callable), got {type(sampling_model).__name__}")
        if on_elicit is not None and not callable(on_elicit):
            raise TypeError(f"on_elicit must be callable, got {type(on_elicit).__name__}")
        if on_progress is not None and not callable(on_progress):
            raise TypeError(f"on_progress must be callable, got {type(on_progress).__name__}")
        self._target = target
        self.name = name
        self.prefix = prefix
        self._filter = check_filter(filter)
        self.timeout = positive("timeout", timeout)
        self.connect_timeout = positive("connect_timeout", connect_timeout)
        self.approve_destructive = bool(approve_destructive)
        self.sampling_model = sampling_model
        self.on_elicit = on_elicit
        self.on_progress = on_progress
        self.durable_input = bool(durable_input)
        self.tasks = bool(tasks)
        self._client: Any = None
        self._runner: Optional[asyncio.Task[None]] = None
        self._stop: Optional[asyncio.Event] = None
        self._lock: Optional[asyncio.Lock] = None
        self._tools: Optional[List[MCPTool]] = None  # None: not listed yet, or stale
        self._loops: List[AgentLoop] = []
        self._changed: Optional[asyncio.Event] = None  # set on each tools/list_changed
        self._bound: Optional[asyncio.AbstractEventLoop] = None  # the event loop of the above
        self.starts = 0  # how many times the server was started (a restart adds one)
        self._clock: Callable[[], float] = time.monotonic  # of the progress log's coalescing (tests replace it)

    # ---- construction -------------------------------------------------------------------

    @classmethod
    def stdio(
        cls,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[Union[str, os.PathLike[str]]] = None,
        name: Optional[str] = None,
        **options: Any,
    ) -> MCPServer:
        """A server run as a subprocess (``command`` with ``args``), spoken to over its stdin
        and stdout. ``env`` is added to a minimal default environment; ``cwd`` is its working
        folder. ``options`` are those of :class:`MCPServer`."""
        mcp = require_mcp()
        if not isinstance(command, str) or not command:
            raise ValueError(f"command must be a non-empty str, got {command!r}")
        if isinstance(args, str):
            raise TypeError(f"args must be a sequence of str, not a str ({args!r}); wrap it in a list")
        params = mcp.StdioServerParameters(
            command=command, args=[str(a) for a in args], env=dict(env) if env is not None else None, cwd=cwd
        )
        # The script or package the command runs (python server.py, npx -y @org/server-x
        # /data, uvx mcp-server-fetch), else the command itself.
        named = [str(a) for a in args if not str(a).startswith("-")]
        default = os.path.basename(named[0].rstrip("/")) if named else os.path.basename(command)
        return cls(params, name=name or default, **options)

    @classmethod
    def http(
        cls,
        url: str,
        *,
        headers: Optional[Mapping[str, str]] = None,
        auth: Any = None,
        name: Optional[str] = None,
        **options: Any,
    ) -> MCPServer:
        """A server at ``url`` over streamable HTTP. ``headers`` go with every request (a
        bearer token: ``{"Authorization": "Bearer ..."}``); ``auth`` is an ``httpx2.Auth``, such
        as the ``mcp`` package's ``OAuthClientProvider`` for OAuth. ``options`` are those of
        :class:`MCPServer`."""
        require_mcp()
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"url must be an http(s) URL, got {url!r}")
        target = HttpTarget(url, dict(headers or {}), auth)
        return cls(target, name=name or parts.netloc, **options)

    def __repr__(self) -> str:
        state = "running" if self.connected else "stopped"
        transport = "http" if isinstance(self._target, HttpTarget) else "stdio"
        listed = "unlisted" if self._tools is None else f"{len(self._tools)} tools"
        prefix = f" prefix={self.prefix!r}" if self.prefix else ""
        return f"<MCPServer {self.name!r} {transport} {state} {listed}{prefix}>"

    def _repr_html_(self) -> str:
        from .._html import mcp_server

        return mcp_server(self)

    @property
    def connected(self) -> bool:
        """Whether the server is running (started, and not stopped or broken)."""
        return self._client is not None and self._runner is not None and not self._runner.done()

    # ---- the connection -----------------------------------------------------------------

    def _make_client(self) -> Any:
        mcp = require_mcp()
        target = self._target
        if isinstance(target, HttpTarget):
            from mcp.client.streamable_http import streamable_http_client
            from mcp.shared._httpx_utils import create_mcp_http_client

            http = create_mcp_http_client(headers=target.headers or None, auth=target.auth)
            target = OwnedHttp(http, streamable_http_client(target.url, http_client=http))
        else:
            from mcp.client.stdio import stdio_client

            target = stdio_client(target, errlog=server_stderr())
        return mcp.Client(
            target,
            cache=None,  # the list is read again on list_changed; no stale answer may be served
            message_handler=self._on_message,
            sampling_callback=self._on_sampling if self.sampling_model is not None else None,
            elicitation_callback=self._on_elicitation,
            extensions=[_tasks.extension()] if self.tasks else None,
        )

    async def _connect(self) -> Any:
        """The running client, started if needed."""
        if self.connected:
            return self._client
        here = asyncio.get_running_loop()
        if self._lock is None or self._bound is not here:
            # A server used again under another event loop (a second asyncio.run, a notebook
            # cell): its primitives and any connection belong to the first one.
            self._bound = here
            self._lock = asyncio.Lock()
            self._changed = asyncio.Event()
            self._client = None
            self._runner = None
        async with self._lock:
            if self.connected:
                return self._client
            self._client = None
            ready: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            self._stop = asyncio.Event()
            self._runner = asyncio.ensure_future(self._run(ready, self._stop))
            try:
                client = await asyncio.wait_for(asyncio.shield(ready), self.connect_timeout)
            except BaseException as e:
                self._stop.set()
                if isinstance(e, asyncio.TimeoutError):
                    raise MCPServerError(f"MCP server {self.name!r} did not start within {self.connect_timeout}s") from None
                if isinstance(e, Exception) and not isinstance(e, MCPServerError):
                    raise MCPServerError(f"MCP server {self.name!r} could not be started: {describe(e)}") from e
                raise
            self.starts += 1
            self._tools = None
            return client

    async def _run(self, ready: asyncio.Future[Any], stop: asyncio.Event) -> None:
        client = None
        try:
            async with self._make_client() as client:
                listener = asyncio.ensure_future(self._listen(client))
                self._client = client
                ready.set_result(client)
                try:
                    await stop.wait()
                finally:
                    listener.cancel()
                    await asyncio.gather(listener, return_exceptions=True)
        except BaseException as e:  # noqa: BLE001 - the runner's end is reported, never raised
            if not ready.done():
                ready.set_exception(e if isinstance(e, Exception) else MCPServerError(f"MCP server {self.name!r} stopped while starting"))
            elif not stop.is_set() and not isinstance(e, asyncio.CancelledError):
                logger.warning("MCP server %r stopped: %s", self.name, describe(e))
        finally:
            if self._client is client:
                self._client = None

    async def _listen(self, client: Any) -> None:
        """On 2026-07-28 connections list changes come on a ``subscriptions/listen`` stream;
        earlier ones send ``notifications/tools/list_changed`` (``_on_message``)."""
        try:
            async with client.listen(tools_list_changed=True) as subscription:
                async for _event in subscription:
                    self._list_changed()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # an older protocol, or a server without subscriptions
            logger.debug("MCP server %r: no list-change subscription (%s)", self.name, describe(e))

    async def _on_message(self, message: Any) -> None:
        if getattr(message, "method", None) == "notifications/tools/list_changed":
            self._list_changed()

    def _list_changed(self) -> None:
        self._tools = None
        if self._changed is not None:
            self._changed.set()

    def _drop(self, client: Any) -> None:
        """The connection ``client`` broke: its runner stops; the next use starts again."""
        if self._client is client:
            self._client = None
        if self._stop is not None:
            self._stop.set()

    async def aclose(self) -> None:
        """Stops the server (its process, or its HTTP session). It starts again if used."""
        runner, stop = self._runner, self._stop
        self._client = None
        self._tools = None
        if stop is not None:
            stop.set()
        if runner is not None and not runner.done():
            await asyncio.gather(runner, return_exceptions=True)

    # ---- tools --------------------------------------------------------------------------

    async def list_tools(self) -> List[Tool]:
        """The tools this server offers a loop (prefixed and filtered), starting it if needed."""
        return list(await self._listed())

    async def _listed(self) -> List[MCPTool]:
        client = await self._connect()
        if self._tools is not None:
            return self._tools
        if self._changed is not None:
            self._changed.clear()
        listed = []
        cursor = None
        while True:
            page = await client.list_tools(cursor=cursor)
            listed.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        tasks = self.tasks and _offers_tasks(client)
        tools = [self._adapt(t, tasks) for t in listed if self._filter(t.name)]
        if self._client is client:
            self._tools = tools
        return tools

    def _adapt(self, spec: Any, tasks: bool = False) -> MCPTool:
        annotations = spec.annotations
        needs = self.approve_destructive and is_destructive(annotations)
        return MCPTool(
            self,
            spec.name,
            self.prefix + spec.name,
            spec.description or "",
            spec.input_schema,
            effect_of(annotations),
            annotations.model_dump(by_alias=True, exclude_none=True) if annotations is not None else {},
            needs_approval=needs,
            tasks=tasks,
        )

    async def _call(self, tool: MCPTool, args: Dict[str, Any], ctx: ToolContext) -> Union[ToolResult, InputRequired]:
        if self.connected:
            client = self._client
        else:
            try:
                client = await self._connect()
            except MCPServerError as e:
                return ToolResult(str(e), is_error=True, meta=result_meta(self.name, tool.remote_name, None, ()))
        progress: List[Dict[str, Any]] = []
        # The coalescing of the progress log, made at the call's first notification.
        coalescer: List[_progress.Coalescer] = []

        async def on_progress(value: float, total: Optional[float], message: Optional[str]) -> None:
            progress.append({"progress": value, "total": total, "message": message})
            if not coalescer:
                coalescer.append(_progress.Coalescer(self._clock))
            if coalescer[0].admit(value, total, message):
                _progress.record(ctx, value, total, message)
            logger.info("MCP %s/%s (call %s): progress %s/%s %s", self.name, tool.remote_name, ctx.call_id, value, total, message or "")
            if self.on_progress is not None:
                update = Progress(self.name, tool.remote_name, ctx.call_id, value, total, message)
                try:
                    out = self.on_progress(update)
                    if asyncio.iscoroutine(out):
                        await out
                except Exception:
                    logger.exception("MCP server %r: on_progress raised", self.name)

        def failed(text: str) -> ToolResult:
            return ToolResult(
                f"MCP server {self.name!r}, tool {tool.remote_name!r}: {text}",
                is_error=True,
                meta=result_meta(self.name, tool.remote_name, None, progress),
            )

        # A task's resolver (the claim the mcp client calls) finds the call here.
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        call = _tasks.Call(ctx, on_progress, deadline, None if self.durable_input else self._answer_task)
        current = _tasks.CURRENT.set(call)
        try:
            task = _task_input.task_of(ctx.input) if self.durable_input else None
            if task is not None and ctx.input is not None:
                # The person's answer to a task's request for input: it goes to that task.
                result = await _task_input.answer(client.session, task, ctx.input, call)
            elif self.durable_input:
                result = await _input.call(client, tool.remote_name, args, ctx, self.timeout, on_progress)
                if _tasks.is_task(result):
                    result = await _tasks.follow(client.session, result, call)
            else:
                result = await client.call_tool(tool.remote_name, args, read_timeout_seconds=self.timeout, progress_callback=on_progress)
        except _mcp_error() as e:
            if e.code == _CONNECTION_CLOSED:
                self._drop(client)
                stopped = f"the server stopped during the call ({e.error.message})"
                return failed(f"{stopped}; it will be started again for the next call")
            if e.code == _REQUEST_TIMEOUT:
                return failed(f"no result within the server's timeout of {self.timeout}s; the call was cancelled")
            return failed(f"the server refused the call: {e.error.message}")
        except (OSError, EOFError) as e:
            self._drop(client)
            return failed(f"the connection failed during the call ({describe(e)}); it will be started again for the next call")
        except Exception as e:
            if is_broken(e):
                self._drop(client)
                return failed(f"the connection broke during the call ({describe(e)}); it will be started again for the next call")
            raise
        finally:
            _tasks.CURRENT.reset(current)
        if isinstance(result, InputRequired):  # a task asked: it waits for the person's answer
            return result
        if getattr(result, "result_type", None) == "input_required":
            asked = _input.input_required(result)
            return failed(asked) if isinstance(asked, str) else asked
        return ToolResult(
            content_of(result.content, result.structured_content),
            is_error=bool(result.is_error),
            meta=result_meta(self.name, tool.remote_name, result, progress),
        )

    async def _reconcile(self, tool: MCPTool, ctx: ToolContext) -> Union[ToolResult, InputRequired, None]:
        """A call in doubt after a restart (its tool's reconcile function): the task logged
        for it is polled for its result (or its request for input); ``None`` when no task was
        logged (the call stays in doubt, and fails as unknown)."""
        try:
            result = await _tasks.reconcile(self, tool, ctx)
        except MCPServerError as e:
            logger.warning("MCP call %s: its task cannot be polled (%s); its outcome is unknown", ctx.call_id, e)
            return None
        if result is None or isinstance(result, InputRequired):
            return result
        return ToolResult(
            content_of(result.content, result.structured_content),
            is_error=bool(result.is_error),
            meta=result_meta(self.name, tool.remote_name, result, ()),
        )

    # ---- resources and prompts ----------------------------------------------------------

    async def list_resources(self) -> List[Any]:
        """The server's resources (``mcp.types.Resource``: ``uri``, ``name``, ``mimeType`` ...)."""
        client = await self._connect()
        return await self._every_page(client.list_resources, "resources")

    async def _every_page(self, list_page: Callable[..., Awaitable[Any]], field: str) -> List[Any]:
        """Every item of a paginated list (``field`` of each page), following ``next_cursor``."""
        out: List[Any] = []
        cursor = None
        while True:
            page = await _checked(self, list_page(cursor=cursor))
            out.extend(getattr(page, field))
            cursor = page.next_cursor
            if not cursor:
                return out

    async def read_resource(self, uri: str) -> List[Dict[str, Any]]:
        """The content of resource ``uri`` as Kerman blocks (text, and images)."""
        client = await self._connect()
        return resource_blocks(await _checked(self, client.read_resource(uri)))

    async def resource(self, uri: str) -> UserMessage:
        """Resource ``uri`` as a ``UserMessage`` (``loop.followup(await server.resource(uri))``)."""
        return UserMessage(await self.read_resource(uri), source={"kind": "context", "mcp": {"server": self.name, "resource": uri}})

    async def list_prompts(self) -> List[Any]:
        """The server's prompts (``mcp.types.Prompt``: ``name``, ``description``, ``arguments``)."""
        client = await self._connect()
        return await self._every_page(client.list_prompts, "prompts")

    async def prompt(self, name: str, arguments: Optional[Mapping[str, str]] = None) -> List[Union[UserMessage, AssistantMessage]]:
        """Prompt ``name`` filled with ``arguments``, as messages: a user message per user
        turn of the prompt (send it with ``loop.followup``), an ``AssistantMessage`` per
        assistant turn."""
        client = await self._connect()
        result = await _checked(self, client.get_prompt(name, dict(arguments or {})))
        from ._content import block_of

        source = {"kind": "user", "mcp": {"server": self.name, "prompt": name}}
        messages: List[Union[UserMessage, AssistantMessage]] = []
        for m in result.messages:
            block = block_of(m.content)
            if m.role == "assistant":
                messages.append(AssistantMessage([block]))
            else:
                messages.append(UserMessage([block], source=source))
        return messages

    # ---- requests from the server -------------------------------------------------------

    async def _on_sampling(self, context: Any, params: Any) -> Any:
        from ._sampling import answer

        return await answer(self, params)

    async def _on_elicitation(self, context: Any, params: Any) -> Any:
        import mcp.types as types

        if self.on_elicit is None:
            return types.ElicitResult(action="decline")
        request = Elicitation(self.name, params.message, getattr(params, "requested_schema", None), getattr(params, "url", None))
        try:
            answer = await self.on_elicit(request)
        except Exception as e:
            logger.exception("MCP server %r: on_elicit raised", self.name)
            return types.ErrorData(code=types.INTERNAL_ERROR, message=f"the client's on_elicit failed: {describe(e)}")
        if answer is None:
            return types.ElicitResult(action="decline")
        return types.ElicitResult(action="accept", content=dict(answer))

    def _task_answerer(self) -> Optional[_tasks.Answerer]:
        """What answers a task's requests for input: a person through a durable decision
        (``None``) with ``durable_input``, else :meth:`_answer_task` in this process."""
        return None if self.durable_input else self._answer_task

    async def _answer_task(self, requests: Dict[str, Any]) -> Union[Dict[str, Any], str]:
        """A task's ``inputRequests`` answered as the same requests made during a call are
        (``on_elicit``, ``sampling_model``): the ``inputResponses``, or why one cannot be."""
        import mcp.types as types
        from pydantic import TypeAdapter, ValidationError

        responses: Dict[str, Any] = {}
        for key, wire in requests.items():
            try:
                # Any: the union's static type differs between mcp releases; isinstance narrows it below.
                request: Any = TypeAdapter(types.InputRequest).validate_python(wire)
            except ValidationError:
                return f"request {key!r} is not one the client can answer"
            if isinstance(request, types.ElicitRequest):
                response = await self._on_elicitation(None, request.params)
            elif isinstance(request, types.CreateMessageRequest) and self.sampling_model is not None:
                response = await self._on_sampling(None, request.params)
            else:
                return f"the server asked for {request.method!r} ({key!r}), which this client does not answer"
            if isinstance(response, types.ErrorData):
                return f"{key!r}: {response.message}"
            responses[key] = response.model_dump(mode="json", by_alias=True, exclude_none=True)
        return responses

    # ---- the loops this server serves ---------------------------------------------------

    def _kerman_attach(self, loop: AgentLoop) -> None:
        """Called by ``AgentLoop(tools=[...])`` and ``loop.add_tools``: the loop's first model
        request (and each one after a list change) lists this server's tools."""
        if loop in self._loops:
            raise ValueError(f"{self!r} is already registered on this loop")
        self._loops.append(loop)
        registered: Dict[str, MCPTool] = {}
        # The listing the loop's tool table was last brought in line with: while the server
        # serves that same list (connected, no list change since), a request needs nothing.
        synced: List[Optional[List[MCPTool]]] = [None]

        async def sync_tools(request: Any, next: Any) -> Any:
            current = self._tools
            if current is None or current is not synced[0] or not self.connected:
                tools = await self._listed()
                if any(registered.get(t.name) is not t for t in tools) or len(tools) != len(registered):
                    _replace(loop, registered, tools)
                    request.tools = [t.spec() for t in loop._tools.values()]
                synced[0] = tools
            return await next()

        sync_tools.__qualname__ = f"MCPServer({self.name!r}).sync_tools"
        loop.before_request(sync_tools, prepend=True)

        async def before_resume() -> None:
            # A step taken up from the log (a call in doubt, a call that waited for input)
            # runs its calls before any model request lists the tools.
            tools = await self._listed()
            if any(registered.get(t.name) is not t for t in tools) or len(tools) != len(registered):
                _replace(loop, registered, tools)
            synced[0] = tools
            # A task whose request for input was declined: the call's result is the denial,
            # so the task, still waiting on the server, is cancelled.
            if not self.durable_input:  # only a person's decision leaves a task unanswered
                return
            for task in _task_input.abandoned(loop.log.events(types=_task_input.ABANDONED_TYPES), registered):
                if self._client is not None:
                    await _tasks.cancel(self._client.session, task)

        loop._resume_preparers.append(before_resume)

    async def _kerman_detach(self, loop: AgentLoop) -> None:
        """Called by ``loop.aclose()``: the server stops once no loop uses it."""
        if loop in self._loops:
            self._loops.remove(loop)
        if not self._loops:
            await self.aclose()


_MCP_ERROR: List[Any] = []


def _mcp_error() -> Any:
    """``mcp.MCPError``, imported once (the ``mcp`` package is an optional extra)."""
    if not _MCP_ERROR:
        from mcp import MCPError

        _MCP_ERROR.append(MCPError)
    return _MCP_ERROR[0]


def _offers_tasks(client: Any) -> bool:
    """Whether the server declares the tasks extension (its tools' calls may become tasks)."""
    capabilities = getattr(client, "server_capabilities", None)
    extensions = getattr(capabilities, "extensions", None) or {}
    return _tasks.IDENTIFIER in extensions


def _replace(loop: AgentLoop, registered: Dict[str, MCPTool], tools: List[MCPTool]) -> None:
    """Puts ``tools`` in the loop's tool table in place of the ones registered before."""
    table = loop._tools
    for name, old in list(registered.items()):
        if table.get(name) is old:
            del table[name]
    registered.clear()
    for tool in tools:
        if tool.name in table:
            raise ValueError(
                f"MCP server {tool.server.name!r} offers a tool named {tool.name!r}, and the loop already has one "
                f"of that name: give the server a prefix= (MCPServer.stdio(..., prefix='x_'))"
            )
        loop._add_tool(tool)
        registered[tool.name] = tool


async def _checked(server: MCPServer, awaitable: Awaitable[Any]) -> Any:
    from mcp import MCPError

    try:
        return await awaitable
    except MCPError as e:
        raise MCPServerError(f"MCP server {server.name!r}: {e.error.message}") from e
