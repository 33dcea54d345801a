"""Helpers of the kerman.mcp tests: the test server (``mcp_server.py``) over stdio, and over
streamable HTTP on a loopback port (``http_url``: a subprocess started and stopped here, by its
pid); turns through a real ``AgentLoop`` whose scripted model calls MCP tools, and readers of
what the loop logged. (Not a conftest.py: the suite's top conftest is imported by name.)"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

import kerman
from kerman.models import ScriptedModel

pytest.importorskip("mcp")

from kerman.mcp import MCPServer  # noqa: E402 - once the mcp package is known to be there

SERVER = str(Path(__file__).resolve().parent / "mcp_server.py")


def stdio(**options: Any) -> MCPServer:
    """The test server as a subprocess."""
    return MCPServer.stdio(sys.executable, [SERVER], **options)


def call(name: str, arguments: Dict[str, Any], call_id: str = "c1") -> kerman.ModelReply:
    """A model reply that calls tool ``name`` once."""
    return kerman.ModelReply([{"type": "tool-call", "id": call_id, "name": name, "arguments": json.dumps(arguments)}])


def results(loop: kerman.AgentLoop) -> List[Any]:
    """The ``tool/result`` events of the loop's log, in order."""
    return [e for e in loop.log.events() if e.type == "tool/result"]


def block(event: Any) -> Dict[str, Any]:
    """The tool-result block of a ``tool/result`` event."""
    return event.data["message"]["content"][0]  # type: ignore[no-any-return]


def text(event: Any) -> str:
    content = block(event)["content"]
    return content if isinstance(content, str) else "\n".join(b.get("text", "") for b in content)


def tool_names(request: Any) -> List[str]:
    return [t["name"] for t in request.tools]


async def turn(loop: kerman.AgentLoop, prompt: str = "go") -> None:
    loop.followup(prompt)
    await loop.when_idle()


def scripted(*replies: Any) -> ScriptedModel:
    return ScriptedModel(list(replies))


@contextlib.contextmanager
def serving_http(script: str, env: Optional[Dict[str, str]] = None) -> Iterator[str]:
    """Runs the MCP server `script` over streamable HTTP on loopback; yields its URL."""
    proc = subprocess.Popen([sys.executable, script, "http"], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        port = proc.stdout.readline().strip()  # printed once uvicorn listens
        assert port.isdigit(), f"the HTTP server {script} did not start (printed {port!r})"
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.fixture
def http_url() -> Iterator[str]:
    with serving_http(SERVER) as url:
        yield url
