"""The ``Tool`` a loop registers for each tool of an MCP server."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Dict, Optional, Union

from ..decisions import InputRequired
from ..tools import Tool, ToolContext, ToolResult

if TYPE_CHECKING:
    from ._server import MCPServer

__all__ = ["MCPTool", "effect_of", "is_destructive"]


def effect_of(annotations: Any) -> str:
    """The effect class of an MCP tool's annotations: ``readOnlyHint`` → ``"read"``,
    ``idempotentHint`` → ``"idempotent"``, anything else ``"write"``."""
    if annotations is not None and annotations.read_only_hint:
        return "read"
    if annotations is not None and annotations.idempotent_hint:
        return "idempotent"
    return "write"


def is_destructive(annotations: Any) -> bool:
    """Whether a tool may destroy something: the MCP defaults are a tool that is not read-only
    and destructive unless it says ``destructiveHint: false``."""
    if annotations is None:
        return True
    if annotations.read_only_hint:
        return False
    return annotations.destructive_hint is not False


class MCPTool(Tool):
    """A tool of an MCP server as the loop sees it: ``name`` is the prefixed name the model
    calls, ``remote_name`` the server's own; ``parameters`` is the server's input schema as it
    is; ``effect`` the class its annotations map to; ``annotations`` those annotations."""

    __slots__ = ("server", "remote_name", "annotations")

    def __init__(
        self,
        server: MCPServer,
        remote_name: str,
        name: str,
        description: str,
        schema: Dict[str, Any],
        effect: str,
        annotations: Dict[str, Any],
        *,
        needs_approval: bool = False,
        tasks: bool = False,
    ) -> None:
        # A call of a server that runs calls as tasks is reconciled after a crash: a logged
        # task id is polled (kerman.mcp._tasks.reconcile); without one the outcome is unknown.
        on_in_doubt: Any = self._reconcile if tasks else "fail"
        # The body is the server's own coroutine function, bound to this tool: the driver
        # resumes every frame of the call's await chain each time the call wakes (four times a
        # call over stdio), so a forwarding coroutine would be one frame more each time.
        body = functools.partial(server._call, self)
        super().__init__(name, body, description, None, True, needs_approval=needs_approval, effect=effect, on_in_doubt=on_in_doubt)
        # The server's schema goes to the model as it is: Tool's own check is for schemas
        # written in Python, and a server may use any JSON Schema keyword.
        self.parameters = dict(schema)
        self.server = server
        self.remote_name = remote_name
        self.annotations = annotations

    async def _reconcile(self, ctx: ToolContext) -> Union[ToolResult, InputRequired, None]:
        return await self.server._reconcile(self, ctx)

    def reconcile(self, args: Any, ctx: Any) -> Any:
        return self._reconcile(ctx)

    def spec(self) -> Dict[str, Any]:
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    def __repr__(self) -> str:
        return f"MCPTool({self.name!r}, server={self.server.name!r}, effect={self.effect!r})"

    def __getstate__(self) -> Optional[Dict[str, Any]]:  # pragma: no cover - not picklable
        raise TypeError("an MCPTool belongs to its server's connection and cannot be pickled")
