"""``ModelRequest.tools``: the spec of each registered tool. For a plain ``Tool`` the loop builds
the dict ``Tool.spec`` returns without calling it (one Python call fewer per tool per request);
a subclass that overrides ``spec`` is called, as it always was."""

import asyncio
from typing import Any, Dict, List

import kerman


def _requested_tools(tools: List[kerman.Tool]) -> List[List[Dict[str, Any]]]:
    seen: List[List[Dict[str, Any]]] = []

    async def model(request: kerman.ModelRequest) -> kerman.ModelReply:
        seen.append(request.tools)
        return kerman.ModelReply("ok")

    async def main() -> None:
        loop = kerman.AgentLoop(model, tools=tools)
        loop.followup("go")
        await loop.when_idle()
        await loop.aclose()

    asyncio.run(main())
    return seen


async def _noop(args: Dict[str, Any], ctx: Any) -> str:
    return "done"


def test_a_plain_tools_spec_is_what_tool_spec_returns():
    tool = kerman.Tool("grep", _noop, description="Lines matching.", parameters={"type": "object", "required": ["p"]})
    [tools] = _requested_tools([tool])
    assert tools == [tool.spec()]
    assert tools[0]["parameters"] is tool.parameters  # the same object, as spec() gives it


def test_a_subclass_that_overrides_spec_is_called():
    class Described(kerman.Tool):
        calls = 0

        def spec(self) -> Dict[str, Any]:
            type(self).calls += 1
            return {**super().spec(), "strict": True}

    tool = Described("grep", _noop, description="Lines matching.")
    [tools] = _requested_tools([tool])
    assert tools == [{"name": "grep", "description": "Lines matching.", "parameters": {"type": "object", "properties": {}}, "strict": True}]
    assert Described.calls == 1
