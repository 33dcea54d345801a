"""MCP tools through a real AgentLoop, against the test server over stdio: lazy start, the
schemas as the server wrote them, prefix and filter, effects and approvals, list changes, and
close with the loop."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from mcp_helpers import call, results, scripted, stdio, text, tool_names, turn

import kerman
from kerman.mcp import MCPServer, MCPTool


def test_tools_are_listed_lazily_called_and_closed_with_the_loop() -> None:
    async def main() -> None:
        server = stdio()
        model = scripted(call("add", {"a": 1, "b": 2}), "done")
        loop = kerman.AgentLoop(model, tools=[server])
        assert not server.connected and server.starts == 0  # nothing started before a request
        await turn(loop)
        assert server.connected and server.starts == 1
        assert text(results(loop)[0]) == "3"
        add = next(t for t in model.requests[0].tools if t["name"] == "add")
        # The input schema goes to the model as the server wrote it.
        assert add["parameters"]["title"] == "addArguments"
        assert add["parameters"]["required"] == ["a", "b"]
        assert add["description"] == "Adds two integers."
        await loop.aclose()
        assert not server.connected

    asyncio.run(main())


def test_add_tools_prefix_and_filter() -> None:
    async def main() -> None:
        server = stdio(prefix="m_", filter=["add", "put"])
        model = scripted(call("m_add", {"a": 20, "b": 22}), "done")
        loop = kerman.AgentLoop(model)

        @loop.tool
        async def local(x: int) -> str:
            """A local tool."""
            return str(x)

        loop.add_tools(server)
        await turn(loop)
        assert sorted(tool_names(model.requests[0])) == ["local", "m_add", "m_put"]
        assert text(results(loop)[0]) == "42"
        assert isinstance(loop.tools["m_add"], MCPTool) and loop.tools["m_add"].remote_name == "add"
        await loop.aclose()

    asyncio.run(main())


def test_a_filter_that_is_a_str_is_refused() -> None:
    with pytest.raises(TypeError, match="'add'"):
        stdio(filter="add")
    with pytest.raises(ValueError, match="-1"):
        stdio(timeout=-1)


def test_a_name_clash_with_a_local_tool_names_the_prefix_to_give() -> None:
    async def main() -> None:
        server = stdio()
        loop = kerman.AgentLoop(scripted("unused"), tools=[server])

        @loop.tool
        async def add(a: int, b: int) -> str:
            """A local add."""
            return "local"

        errors = []
        loop.on("agent/error", errors.append)
        await turn(loop)
        assert errors and "prefix=" in str(errors[0].error) and "'add'" in str(errors[0].error)
        await loop.aclose()

    asyncio.run(main())


def test_annotations_map_to_effects_and_destructive_tools_wait_for_approval() -> None:
    async def main() -> None:
        server = stdio(approve_destructive=True)
        model = scripted(
            kerman.ModelReply(
                [
                    {"type": "tool-call", "id": "c1", "name": "put", "arguments": '{"key": "k", "value": "v"}'},
                    {"type": "tool-call", "id": "c2", "name": "wipe", "arguments": '{"what": "all"}'},
                ]
            ),
            "done",
        )
        loop = kerman.AgentLoop(model, tools=[server])
        await turn(loop)
        tools = loop.tools
        assert (tools["add"].effect, tools["put"].effect, tools["wipe"].effect) == ("read", "idempotent", "write")
        assert not tools["add"].needs_approval and not tools["put"].needs_approval and tools["wipe"].needs_approval
        assert loop.status == "waiting"
        [pending] = loop.decisions
        assert pending.name == "wipe"
        loop.decide(pending.decision_id, kerman.Approve())
        await loop.when_idle()
        assert [text(e) for e in results(loop)] == ["stored k=v", "wiped all"]
        await loop.aclose()

    asyncio.run(main())


def test_the_tool_list_is_read_again_after_the_server_says_it_changed() -> None:
    async def main() -> None:
        server = stdio()
        model = scripted(call("grow", {}), call("extra", {}, "c2"), "done")
        loop = kerman.AgentLoop(model, tools=[server])

        @loop.before_request(prepend=True)  # runs before the server's own listener
        async def after_the_change(request, next):  # type: ignore[no-untyped-def]
            if request.step == 2:
                assert server._changed is not None
                await server._changed.wait()  # the notification, which may follow the result
            return await next()

        await turn(loop)
        assert "extra" not in tool_names(model.requests[0])
        assert "extra" in tool_names(model.requests[1])
        assert [text(e) for e in results(loop)] == ["grown", "extra ran"]
        await loop.aclose()

    asyncio.run(main())


def test_a_server_that_cannot_start_gives_a_clear_error() -> None:
    async def main() -> None:
        server = MCPServer.stdio("/nonexistent/kerman-mcp-server", name="ghost")
        loop = kerman.AgentLoop(scripted("unused"), tools=[server])
        errors = []
        loop.on("agent/error", errors.append)
        await turn(loop)
        assert errors and "'ghost'" in str(errors[0].error)
        await loop.aclose()

    asyncio.run(main())


def test_repr() -> None:
    server = stdio(prefix="m_")
    assert repr(server) == "<MCPServer 'mcp_server.py' stdio stopped unlisted prefix='m_'>"


def test_notebook_repr_shows_the_tools_once_listed() -> None:
    async def main() -> None:
        server = stdio(prefix="m_", filter=["add", "wipe"], timeout=5)
        before = server._repr_html_()
        assert "not listed yet" in before and "stopped" in before
        await server.list_tools()
        after = server._repr_html_()
        assert "<code>m_add</code>" in after and "read" in after and "<code>m_wipe</code>" in after and "write" in after
        assert "running" in after and "5.0 s" in after
        await server.aclose()

    asyncio.run(main())


def test_a_stdio_server_is_named_after_what_it_runs() -> None:
    assert MCPServer.stdio("npx", ["-y", "@org/server-files", "/data"]).name == "server-files"
    assert MCPServer.stdio("uvx", ["mcp-server-fetch"]).name == "mcp-server-fetch"
    assert MCPServer.stdio("/usr/bin/files-server").name == "files-server"
    assert MCPServer.stdio("files-server", name="files").name == "files"


def test_add_tools_takes_tools_and_refuses_anything_else() -> None:
    async def echo(args: Any, ctx: Any) -> str:
        return "x"

    loop = kerman.AgentLoop(scripted())
    loop.add_tools(kerman.Tool("a", echo), kerman.Tool("b", echo))
    assert sorted(loop.tools) == ["a", "b"]
    with pytest.raises(TypeError, match="got str"):
        loop.add_tools("c")  # type: ignore[arg-type]
    server = stdio()
    loop.add_tools(server)
    with pytest.raises(ValueError, match="already registered"):
        loop.add_tools(server)


def test_a_tool_s_body_is_the_server_s_call_with_no_coroutine_in_between() -> None:
    """The loop's driver resumes every frame of a call's await chain each time the call wakes
    (several times a call over stdio): the tool's body is the server's own call, bound to the
    tool, not a coroutine that forwards to it."""

    async def main() -> None:
        server = stdio()
        [add] = [t for t in await server.list_tools() if t.name == "add"]
        assert isinstance(add, MCPTool)
        assert add.fn.func == server._call and add.fn.args == (add,)  # type: ignore[attr-defined]
        body = add.fn({"a": 2, "b": 3}, None)
        try:
            assert body.cr_code is MCPServer._call.__code__  # the coroutine the driver awaits
        finally:
            body.close()
        await server.aclose()

    asyncio.run(main())
