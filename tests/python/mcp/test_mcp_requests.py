"""Resources, prompts, and the server's own requests (sampling, elicitation)."""

from __future__ import annotations

import asyncio
from typing import Any, List, Optional

from mcp_helpers import block, call, results, scripted, stdio, text, turn

import kerman
from kerman.mcp import Elicitation, MCPServerError


def test_resources_listed_read_and_sent_as_user_messages() -> None:
    async def main() -> None:
        server = stdio()
        model = scripted("thanks")
        loop = kerman.AgentLoop(model, tools=[server])
        listed = await server.list_resources()
        assert [str(r.uri) for r in listed] == ["memo://greeting"]
        message = await server.resource("memo://greeting")
        assert isinstance(message, kerman.UserMessage)
        assert message.text == "[resource memo://greeting (text/plain)]\nhello from a resource"
        loop.followup(message)
        await loop.when_idle()
        assert "hello from a resource" in model.requests[0].messages[-1].text
        await loop.aclose()

    asyncio.run(main())


def test_an_unknown_resource_raises_naming_the_server() -> None:
    async def main() -> None:
        server = stdio()
        try:
            await server.read_resource("memo://nothing")
        except MCPServerError as e:
            assert "'mcp_server.py'" in str(e)
        else:
            raise AssertionError("no error for an unknown resource")
        finally:
            await server.aclose()

    asyncio.run(main())


def test_prompts_listed_and_filled() -> None:
    async def main() -> None:
        server = stdio()
        prompts = await server.list_prompts()
        assert [p.name for p in prompts] == ["review"]
        [message] = await server.prompt("review", {"code": "x = 1"})
        assert isinstance(message, kerman.UserMessage)
        assert message.text == "Please review: x = 1"
        await server.aclose()

    asyncio.run(main())


def test_sampling_without_a_model_is_refused_clearly() -> None:
    async def main() -> None:
        loop = kerman.AgentLoop(scripted(call("ask_model", {"question": "6*7?"}), "done"), tools=[stdio()])
        await turn(loop)
        [event] = results(loop)
        assert block(event)["isError"] is True
        assert "sampling capability" in text(event)
        await loop.aclose()

    asyncio.run(main())


def test_sampling_answered_by_the_named_model() -> None:
    async def main() -> None:
        sampler = scripted("forty-two")
        server = stdio(sampling_model=sampler)
        loop = kerman.AgentLoop(scripted(call("ask_model", {"question": "6*7?"}), "done"), tools=[server])
        await turn(loop)
        assert text(results(loop)[0]) == "model said: forty-two"
        assert sampler.requests[0].messages[0].text == "6*7?"
        await loop.aclose()

    asyncio.run(main())


def test_elicitation_answered_by_on_elicit_or_declined() -> None:
    async def main() -> None:
        asked: List[Elicitation] = []

        async def on_elicit(request: Elicitation) -> Optional[dict[str, Any]]:
            asked.append(request)
            return {"ok": True, "note": "fine"}

        loop = kerman.AgentLoop(scripted(call("confirm", {"what": "deploy"}), "done"), tools=[stdio(on_elicit=on_elicit)])
        await turn(loop)
        assert text(results(loop)[0]) == "accept: ok=True note=fine"
        assert asked[0].message == "Go on with deploy?"
        assert asked[0].schema is not None and "ok" in asked[0].schema["properties"]
        await loop.aclose()

        loop = kerman.AgentLoop(scripted(call("confirm", {"what": "deploy"}), "done"), tools=[stdio()])
        await turn(loop)
        assert text(results(loop)[0]) == "decline"
        await loop.aclose()

    asyncio.run(main())


def test_sampling_answered_by_a_provider_over_its_vendors_wire() -> None:
    from kerman.providers import OpenAIChat
    from kerman.providers.testing import FakeServer, Reply

    async def main() -> None:
        with FakeServer("openai-chat") as vendor:
            vendor.add(Reply(text=["forty", "-two"]))
            sampler = OpenAIChat("gpt-6.2-sol", base_url=vendor.url, api_key="test")
            server = stdio(sampling_model=sampler)
            loop = kerman.AgentLoop(scripted(call("ask_model", {"question": "6*7?"}), "done"), tools=[server])
            await turn(loop)
            assert text(results(loop)[0]) == "model said: forty-two"
            [request] = vendor.requests
            assert request.body["messages"][-1]["content"] in ("6*7?", [{"type": "text", "text": "6*7?"}])
            await loop.aclose()
            await sampler.aclose()

    asyncio.run(main())
