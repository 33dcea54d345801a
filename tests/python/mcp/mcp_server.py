"""A small MCP server for the kerman.mcp tests, written with the ``mcp`` package's server side.

``python mcp_server.py`` serves over stdio; ``python mcp_server.py http`` serves streamable
HTTP on a loopback port chosen by the system and prints that port on stdout once it listens.
Its tools cover what the tests look at: every content type, isError, progress, a call that
waits (for cancellation and timeouts), a crash, list changes, sampling and elicitation, plus a
resource and a prompt.
"""

from __future__ import annotations

import asyncio
import base64
import os
import sys
from typing import Annotated

from mcp.server.mcpserver import AcceptedElicitation, Context, Elicit, ElicitationResult, MCPServer, Resolve, Sample
from mcp.types import (
    AudioContent,
    CallToolResult,
    CreateMessageResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    SamplingMessage,
    TextContent,
    TextResourceContents,
    ToolAnnotations,
)
from pydantic import BaseModel

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n-pixel-").decode()
WAV = base64.b64encode(b"RIFF-wave-").decode()
MARKER = os.environ.get("KERMAN_MCP_MARKER")

server = MCPServer("kerman-test")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def add(a: int, b: int) -> str:
    """Adds two integers."""
    return str(a + b)


@server.tool(annotations=ToolAnnotations(idempotent_hint=True, destructive_hint=False))
def put(key: str, value: str) -> str:
    """Stores a value."""
    return f"stored {key}={value}"


@server.tool(annotations=ToolAnnotations(destructive_hint=True))
def wipe(what: str) -> str:
    """Deletes everything named ``what``."""
    return f"wiped {what}"


@server.tool()
def media() -> CallToolResult:
    """Returns one block of every content type."""
    return CallToolResult(
        content=[
            TextContent(text="hello"),
            ImageContent(data=PNG, mime_type="image/png"),
            AudioContent(data=WAV, mime_type="audio/wav"),
            EmbeddedResource(resource=TextResourceContents(uri="memo://one", text="embedded text", mime_type="text/plain")),
            ResourceLink(uri="memo://two", name="two", mime_type="text/plain"),
        ],
        structured_content={"answer": 42},
    )


@server.tool()
def fail(reason: str) -> CallToolResult:
    """Reports a failure as a tool error."""
    return CallToolResult(content=[TextContent(text=f"failed: {reason}")], is_error=True)


@server.tool()
async def slow(steps: int, ctx: Context) -> str:
    """Reports progress ``steps`` times, then waits until cancelled."""
    for i in range(steps):
        await ctx.report_progress(i + 1, steps, f"step {i + 1}")
    if MARKER:
        with open(MARKER, "a") as f:
            f.write("started\n")
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        if MARKER:
            with open(MARKER, "a") as f:
                f.write("cancelled\n")
        raise
    return "never"


@server.tool()
async def progress(steps: int, ctx: Context) -> str:
    """Reports progress ``steps`` times, then returns."""
    for i in range(steps):
        await ctx.report_progress(i + 1, steps, f"step {i + 1}")
    return f"done in {steps}"


@server.tool()
async def progress_same(steps: int, ctx: Context) -> str:
    """Reports progress ``steps`` times with one message, then returns."""
    for i in range(steps):
        await ctx.report_progress(i + 1, steps, "working")
    return f"done in {steps}"


@server.tool()
def crash() -> str:
    """Kills this server's process in the middle of the call."""
    os._exit(3)


@server.tool()
async def grow(ctx: Context) -> str:
    """Adds a tool named ``extra`` and tells the client its tool list changed."""

    def extra() -> str:
        """A tool added at run time."""
        return "extra ran"

    server.add_tool(extra)
    await ctx.notify_tools_changed()
    try:
        await ctx.session.send_tool_list_changed()
    except Exception:
        pass
    return "grown"


def _sample(question: str) -> Sample:
    return Sample([SamplingMessage(role="user", content=TextContent(text=question))], max_tokens=50)


@server.tool()
async def ask_model(question: str, answer: Annotated[CreateMessageResult, Resolve(_sample)]) -> str:
    """Asks the client's model (sampling)."""
    content = answer.content
    return f"model said: {getattr(content, 'text', content)}"


class Confirm(BaseModel):
    ok: bool
    note: str = ""


def _confirm(what: str) -> Elicit[Confirm]:
    return Elicit(f"Go on with {what}?", Confirm)


@server.tool()
async def confirm(what: str, answer: Annotated[ElicitationResult[Confirm], Resolve(_confirm)]) -> str:
    """Asks the person whether to go on (elicitation)."""
    if isinstance(answer, AcceptedElicitation):
        return f"accept: ok={answer.data.ok} note={answer.data.note}"
    return answer.action


@server.tool()
def whoami(ctx: Context) -> str:
    """The Authorization header of the request (HTTP only)."""
    headers = ctx.headers or {}
    return headers.get("authorization", "no authorization")


@server.resource("memo://greeting", mime_type="text/plain")
def greeting() -> str:
    """A greeting."""
    return "hello from a resource"


@server.prompt()
def review(code: str) -> str:
    """Asks for a review of ``code``."""
    return f"Please review: {code}"


def main(argv: list[str]) -> None:
    if len(argv) > 1 and argv[1] == "http":
        import socket

        import uvicorn

        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        app = server.streamable_http_app(host="127.0.0.1")
        config = uvicorn.Config(app, log_level="warning")
        srv = uvicorn.Server(config)

        async def serve() -> None:
            task = asyncio.create_task(srv.serve(sockets=[sock]))
            while not srv.started:  # uvicorn has no started event to await
                await asyncio.sleep(0.01)
            print(port, flush=True)
            await task

        asyncio.run(serve())
    else:
        server.run()


if __name__ == "__main__":
    main(sys.argv)
