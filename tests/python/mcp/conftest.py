"""Fixtures of the kerman.mcp tests: the test server (``mcp_server.py``) over stdio, and over
streamable HTTP on a loopback port (a subprocess started and stopped here, by its pid)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

pytest.importorskip("mcp")

SERVER = str(Path(__file__).resolve().parent / "mcp_server.py")


@pytest.fixture
def http_url() -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, SERVER, "http"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = proc.stdout.readline().strip()  # printed once uvicorn listens
        assert port.isdigit(), f"the HTTP test server did not start (printed {port!r})"
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
