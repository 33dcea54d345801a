"""Helpers of the openai-agents session tests: an openai-agents ``Agent`` whose model is the
OpenAI Responses API of a loopback ``FakeServer`` (no network, tracing off)."""

from __future__ import annotations

from typing import Any

from agents import Agent, OpenAIResponsesModel, RunConfig, function_tool
from openai import AsyncOpenAI

from kerman.providers.testing import FakeServer

#: The run configuration every test run uses: tracing would export to OpenAI's servers.
CONFIG = RunConfig(tracing_disabled=True)


@function_tool
def clock(tz: str) -> str:
    """Returns the time in a time zone."""
    return f"12:00 {tz}"


def agent(server: FakeServer) -> tuple[Agent[Any], AsyncOpenAI]:
    """An agent with one tool, talking to ``server`` (an ``openai-responses`` FakeServer); close
    the client it returns."""
    client = AsyncOpenAI(base_url=server.url, api_key="sk-test", max_retries=0, timeout=10.0)
    model = OpenAIResponsesModel("fake-model", openai_client=client)
    return Agent(name="assistant", instructions="Be brief.", model=model, tools=[clock]), client
