"""The test server over streamable HTTP on a loopback port: tools, bearer tokens in headers,
content, list changes and close."""

from __future__ import annotations

import asyncio

import pytest
from mcp_helpers import block, call, http_url, results, scripted, text, tool_names, turn  # noqa: F401 (a fixture)

import kerman
from kerman.mcp import MCPServer


def test_tools_over_http_with_a_bearer_token(http_url: str) -> None:  # noqa: F811 - the fixture
    async def main() -> None:
        server = MCPServer.http(http_url, headers={"Authorization": "Bearer s3cret"}, prefix="h_")
        model = scripted(
            kerman.ModelReply(
                [
                    {"type": "tool-call", "id": "c1", "name": "h_whoami", "arguments": "{}"},
                    {"type": "tool-call", "id": "c2", "name": "h_media", "arguments": "{}"},
                    {"type": "tool-call", "id": "c3", "name": "h_fail", "arguments": '{"reason": "x"}'},
                ]
            ),
            "done",
        )
        loop = kerman.AgentLoop(model, tools=[server])
        await turn(loop)
        assert "h_add" in tool_names(model.requests[0])
        whoami, media, fail = results(loop)
        assert text(whoami) == "Bearer s3cret"
        assert [b["type"] for b in block(media)["content"]] == ["text", "image", "text", "text", "text"]
        assert block(fail)["isError"] is True
        await loop.aclose()
        assert not server.connected

    asyncio.run(main())


def test_list_changes_over_http(http_url: str) -> None:  # noqa: F811 - the fixture
    async def main() -> None:
        server = MCPServer.http(http_url)
        model = scripted(call("grow", {}), call("extra", {}, "c2"), "done")
        loop = kerman.AgentLoop(model, tools=[server])

        @loop.before_request(prepend=True)
        async def after_the_change(request, next):  # type: ignore[no-untyped-def]
            if request.step == 2:
                assert server._changed is not None
                await server._changed.wait()
            return await next()

        await turn(loop)
        assert [text(e) for e in results(loop)] == ["grown", "extra ran"]
        await loop.aclose()

    asyncio.run(main())


def test_http_url_is_checked() -> None:
    with pytest.raises(ValueError, match="'ftp://x'"):
        MCPServer.http("ftp://x")
