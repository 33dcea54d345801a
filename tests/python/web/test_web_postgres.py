"""kerman serve over a PostgresStore: the web process follows sessions and stages input while a
worker owns them (here an AgentLoop in the test process, with a store of its own). Queue edits
and cancel need the owner, so the web process refuses them with a clear message (issue 17 is
the worker runtime that will take them)."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from web_helpers import Server, Stream, run_finished

import kerman
from conftest import PG_DSN, needs_postgres
from kerman.models import EchoModel

pytestmark = needs_postgres
pytest.importorskip("starlette")


def test_follow_and_enqueue_while_a_worker_owns_the_session():
    session_id = f"web-{uuid.uuid4().hex[:10]}"
    with Server(PG_DSN) as server, server.client() as client:
        made = client.post("/sessions", json={"id": session_id})
        assert made.status_code == 201 and made.json()["owned"] is False
        assert session_id in [s["id"] for s in client.get("/sessions").json()["sessions"]]

        async def worker_and_ui():
            log = kerman.PostgresStore(PG_DSN).open(session_id)  # the worker takes the session the web created
            loop = kerman.AgentLoop(EchoModel(), log=log)
            try:
                def ui():
                    stream = Stream(client, f"/sessions/{session_id}/events")
                    try:
                        sent = client.post(f"/sessions/{session_id}/messages", json={"text": "hello from the web"})
                        assert sent.status_code == 201, sent.text
                        return sent.json()["id"], stream.until(run_finished)
                    finally:
                        stream.close()

                return await asyncio.wait_for(asyncio.to_thread(ui), 60)
            finally:
                await loop.aclose()
                log.close()

        message_id, events = asyncio.run(worker_and_ui())
        texts = [d["delta"] for _, d in events if d["type"] == "TEXT_MESSAGE_CONTENT"]
        assert texts == ["hello from the web", "hello from the web"]  # the prompt, then EchoModel's reply
        starts = [d for _, d in events if d["type"] == "TEXT_MESSAGE_START" and d["role"] == "user"]
        assert starts[0]["messageId"] == message_id
        for method, path, body in (("PATCH", f"/queue/{message_id}", {"text": "x"}), ("DELETE", f"/queue/{message_id}", None),
                                   ("POST", "/cancel", {})):
            response = client.request(method, f"/sessions/{session_id}{path}", content=None if body is None else json.dumps(body),
                                      headers={"Content-Type": "application/json"})
            assert response.status_code == 409, (method, path)
            assert response.json()["error"]["code"] == "not-owner"
            assert "PostgresStore" in response.json()["error"]["message"]
        missing = client.get("/sessions/no-such-web-session/events")
        assert missing.status_code == 404
