"""kerman serve --custom MODULE:FUNCTION: the UI streams' custom-event mapping on the server.
With it, a plugin's record reaches AG-UI renamed and another is left out; without it, both
reach the stream under their types. A mapping that is not callable is refused at start."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from web_helpers import HERE, Server, Stream, run_finished, vercel_finished  # noqa: E402


def _customs(server: Server, protocol: str) -> list:
    with server.client() as client:
        session_id = f"s-{uuid.uuid4().hex[:12]}"
        assert client.post("/sessions", json={"id": session_id}).status_code == 201
        assert client.post(f"/sessions/{session_id}/messages", json={"text": "hi"}).status_code == 201
        stream = Stream(client, f"/sessions/{session_id}/events?protocol={protocol}")
        try:
            events = stream.until(run_finished if protocol == "agui" else vercel_finished)
        finally:
            stream.close()
    if protocol == "agui":
        return [(d["name"], d["value"]) for _, d in events if d["type"] == "CUSTOM"]
    return [(d["type"], d["data"]) for _, d in events if d["type"].startswith("data-myframework") or d["type"] == "data-handoff"]


def test_the_servers_mapping_renames_and_drops_plugin_records(tmp_path):
    with Server(str(tmp_path), "--model", "web_custom:factory", "--custom", "web_custom:handoffs_only") as server:
        assert _customs(server, "agui") == [("handoff", {"from": "triage", "to": "billing"})]
        assert _customs(server, "vercel") == [("data-handoff", {"from": "triage", "to": "billing"})]


def test_without_a_mapping_every_plugin_record_is_streamed_under_its_type(tmp_path):
    with Server(str(tmp_path), "--model", "web_custom:factory") as server:
        assert _customs(server, "agui") == [
            ("myframework/handoff", {"from": "triage", "to": "billing"}),
            ("myframework/trace", {"span": "s1"}),
        ]


def test_a_mapping_that_is_not_callable_is_refused(tmp_path):
    env = {"PYTHONPATH": str(HERE)}
    args = [sys.executable, "-m", "kerman", "serve", str(tmp_path), "--port", "0", "--model", "web_custom:factory"]
    done = subprocess.run([*args, "--custom", "web_custom:not_callable"], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2 and "--custom 'web_custom:not_callable' is not callable" in done.stderr
