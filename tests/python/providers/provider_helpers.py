"""Helpers shared by the provider tests: a provider pointed at a FakeServer, a turn runner, log
readers, and waits on the server's thread without sleeps."""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Callable, Dict, List, Optional

import kerman
from kerman.providers import Anthropic, Gemini, OpenAIChat, OpenAIResponses
from kerman.providers.testing import FakeServer

PROTOCOLS = ("openai-chat", "openai-responses", "anthropic", "gemini")
KEY = "sk-test-0123456789-SECRET"
TIMEOUT = 10.0  # seconds: the SDK client's timeout, so a hung request fails its test
CLASSES = {"openai-chat": OpenAIChat, "openai-responses": OpenAIResponses, "anthropic": Anthropic, "gemini": Gemini}


OPENED: List[Any] = []  # providers made by make() in the running test, closed when it ends


def asynctest(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Runs an ``async def`` test in a fresh event loop (pytest-asyncio is not installed), then
    closes every provider ``make`` built, also when the test failed (an open client's sockets
    would otherwise warn in a later test)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        async def main() -> Any:
            try:
                return await fn(*args, **kwargs)
            finally:
                while OPENED:
                    await OPENED.pop().aclose()

        return asyncio.run(main())

    return wrapper


def make(protocol: str, server: FakeServer, *, key: str = KEY, **kwargs: Any) -> Any:
    """The provider for ``protocol`` talking to ``server`` (a client it builds itself)."""
    model = kwargs.pop("model", "fake-model")
    kwargs.setdefault("timeout", TIMEOUT)
    provider = CLASSES[protocol](model, base_url=server.url, api_key=key, **kwargs)
    OPENED.append(provider)
    return provider


async def run(model: Any, *prompts: Any, tools: Any = (), loop: Optional[kerman.AgentLoop] = None, log: Any = None) -> kerman.AgentLoop:
    """Runs one turn per prompt (``tools``: functions registered with ``loop.tool``) and returns
    the loop, still open (``await done(loop)`` closes it)."""
    if loop is None:
        loop = kerman.AgentLoop(model, log=log)
        for fn in tools:
            loop.tool(fn)
    for prompt in prompts:
        loop.followup(prompt)
    await loop.when_idle()
    return loop


async def done(loop: kerman.AgentLoop, model: Any = None) -> None:
    await loop.aclose()
    if model is not None:
        await model.aclose()


def of_type(log: Any, *types: str) -> List[Any]:
    return [e for e in log.events() if e.type in types]


def chunks(log: Any) -> List[Dict[str, Any]]:
    return [e.data["chunk"] for e in log.events() if e.type == "assistant/chunk"]


def messages(log: Any) -> List[Dict[str, Any]]:
    return [e.data for e in log.events() if e.type == "assistant/message"]


def turn_ends(log: Any) -> List[Dict[str, Any]]:
    return [e.data["reason"] for e in log.events() if e.type == "turn/end"]


def failure(log: Any) -> Dict[str, Any]:
    """The failure dict the last turn ended with (asserts it ended with an error)."""
    reason = turn_ends(log)[-1]
    assert reason["kind"] == "error", reason
    return reason["error"]


async def wait_thread_event(event: Any, timeout: float = TIMEOUT) -> bool:
    """Waits for a ``threading.Event`` (set by the server's thread) without blocking the loop."""
    return await asyncio.to_thread(event.wait, timeout)


async def clock(args: Dict[str, Any], ctx: Any) -> str:
    """Returns the time."""
    return "12:00"
