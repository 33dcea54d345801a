"""kerman serve over a PostgresStore: the web process follows sessions and stages input while a
worker owns them (here an AgentLoop in the test process, with a store of its own). Queue edits
and cancel go to the owner through the store (`store.replace`, `.remove`, `.cancel`) and are
answered when it applied them, or with its refusal."""

from __future__ import annotations

import asyncio
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
                        events = stream.until(run_finished)
                    finally:
                        stream.close()
                    message_id = sent.json()["id"]
                    # The message was claimed by the turn: the owner refuses edits, with the reason.
                    for method, path, body in (("PATCH", f"/queue/{message_id}", {"text": "x"}), ("DELETE", f"/queue/{message_id}", None)):
                        response = client.request(method, f"/sessions/{session_id}{path}", json=body)
                        assert response.status_code == 409, (method, path, response.text)
                        assert response.json()["error"]["code"] == "not-queued"
                        assert message_id in response.json()["error"]["message"]
                    cancelled = client.post(f"/sessions/{session_id}/cancel", json={})
                    assert cancelled.status_code == 200 and cancelled.json() == {"cancelled": False, "keep_inbox": False}
                    return message_id, events

                return await asyncio.wait_for(asyncio.to_thread(ui), 60)
            finally:
                await loop.aclose()
                log.close()

        message_id, events = asyncio.run(worker_and_ui())
        texts = [d["delta"] for _, d in events if d["type"] == "TEXT_MESSAGE_CONTENT"]
        assert texts == ["hello from the web", "hello from the web"]  # the prompt, then EchoModel's reply
        starts = [d for _, d in events if d["type"] == "TEXT_MESSAGE_START" and d["role"] == "user"]
        assert starts[0]["messageId"] == message_id
        missing = client.get("/sessions/no-such-web-session/events")
        assert missing.status_code == 404


def test_queue_edits_and_cancel_reach_the_owner():
    session_id = f"web-{uuid.uuid4().hex[:10]}"
    with Server(PG_DSN) as server, server.client() as client:
        assert client.post("/sessions", json={"id": session_id}).status_code == 201

        async def owner_and_ui():
            log = kerman.PostgresStore(PG_DSN).open(session_id)
            started, release = asyncio.Event(), asyncio.Event()

            async def model(request):
                started.set()
                await release.wait()
                return kerman.ModelReply("done")

            loop = kerman.AgentLoop(model, log=log)
            loop.followup("busy")
            await started.wait()
            try:

                def ui():
                    def post(text):
                        return client.post(f"/sessions/{session_id}/messages", json={"text": text}).json()["id"]

                    keep, drop = post("keep me"), post("drop me")
                    edited = client.patch(f"/sessions/{session_id}/queue/{keep}", json={"text": "kept, edited"})
                    assert edited.status_code == 200, edited.text
                    assert edited.json() == {"id": keep, "text": "kept, edited"}
                    removed = client.delete(f"/sessions/{session_id}/queue/{drop}")
                    assert removed.status_code == 200 and removed.json() == {"id": drop, "removed": True}, removed.text
                    again = client.delete(f"/sessions/{session_id}/queue/{drop}")
                    assert again.status_code == 409 and again.json()["error"]["code"] == "not-queued"
                    unknown = client.delete(f"/sessions/{session_id}/queue/never-queued")
                    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "message-not-found"
                    # Answered once applied: the owner's inbox already shows both changes.
                    assert [(m.id, m.text) for m in loop.inbox.next_turn] == [(keep, "kept, edited")]
                    cancelled = client.post(f"/sessions/{session_id}/cancel", json={"keep_inbox": True})
                    assert cancelled.status_code == 200 and cancelled.json() == {"cancelled": True, "keep_inbox": True}
                    return keep

                keep = await asyncio.wait_for(asyncio.to_thread(ui), 60)
                await asyncio.wait_for(loop.when_idle(), 60)
                ends = [e.data["reason"]["kind"] for e in log.events() if e.type == "turn/end"]
                assert ends == ["aborted"]
                assert [m.id for m in loop.inbox.next_turn] == [keep]  # kept by keep_inbox
            finally:
                release.set()
                await loop.aclose()
                log.close()

        asyncio.run(owner_and_ui())


def test_resend_of_a_prompt_cancelled_before_it_was_read_reaches_the_owner():
    """The web chat's resend (`POST /sessions/{id}/requeue`) of a session another process owns:
    handed to the owner (`store.requeue`), which sends the prompt again and runs it."""
    session_id = f"web-{uuid.uuid4().hex[:10]}"
    with Server(PG_DSN) as server, server.client() as client:
        assert client.post("/sessions", json={"id": session_id}).status_code == 201

        async def owner_and_ui():
            log = kerman.PostgresStore(PG_DSN).open(session_id)
            loop = kerman.AgentLoop(EchoModel(), log=log)
            claimed = asyncio.Event()
            event_loop = asyncio.get_running_loop()

            @loop.pre_step
            async def approval(step, next):
                if step.turn == 1:  # holds the first turn after its claim, before it is read
                    claimed.set()
                    await asyncio.Event().wait()
                return await next()

            try:

                def ui():
                    sent = client.post(f"/sessions/{session_id}/messages", json={"text": "deploy to staging"})
                    assert sent.status_code == 201, sent.text
                    asyncio.run_coroutine_threadsafe(asyncio.wait_for(claimed.wait(), 60), event_loop).result()
                    cancelled = client.post(f"/sessions/{session_id}/cancel", json={"keep_inbox": True})
                    assert cancelled.json() == {"cancelled": True, "keep_inbox": True}, cancelled.text
                    asyncio.run_coroutine_threadsafe(asyncio.wait_for(loop.when_idle(), 60), event_loop).result()
                    resent = client.post(f"/sessions/{session_id}/requeue", json={"turn": 1})
                    assert resent.status_code == 200, resent.text
                    assert resent.json() == {"turn": 1, "requeued": [sent.json()["id"]]}
                    again = client.post(f"/sessions/{session_id}/requeue", json={"turn": 1})
                    assert again.status_code == 409 and again.json()["error"]["code"] == "nothing-to-requeue", again.text
                    assert "turn 1" in again.json()["error"]["message"]
                    bad = client.post(f"/sessions/{session_id}/requeue", json={"turn": "1"})
                    assert bad.status_code == 400, bad.text
                    return sent.json()["id"]

                message_id = await asyncio.wait_for(asyncio.to_thread(ui), 60)
                # The owner ran it by itself (the web process cannot wake it).
                deadline = event_loop.time() + 60
                while not (loop.status == "idle" and sum(e.type == "turn/end" for e in log.events()) == 2):
                    assert event_loop.time() < deadline, "timed out waiting for the resent prompt's turn"
                    await asyncio.sleep(0.02)
                entered = [e.data["id"] for e in log.events() if e.type == "user/message"]
                assert entered == [message_id]
                assert [e.data["reason"]["kind"] for e in log.events() if e.type == "turn/end"] == ["aborted", "completed"]
            finally:
                await loop.aclose()
                log.close()

        asyncio.run(owner_and_ui())


def test_on_busy_needs_the_owner_except_enqueue():
    """The web process of a PostgresStore only stages input: "enqueue" is staged, the other
    policies (which cancel or refuse against the running turn) are refused before staging."""
    session_id = f"web-{uuid.uuid4().hex[:10]}"
    with Server(PG_DSN) as server, server.client() as client:
        assert client.post("/sessions", json={"id": session_id}).status_code == 201
        for policy in ("reject", "interrupt", "rollback"):
            refused = client.post(f"/sessions/{session_id}/messages", json={"text": "x", "on_busy": policy})
            assert refused.status_code == 409 and refused.json()["error"]["code"] == "not-owner"
            assert repr(policy) in refused.json()["error"]["message"]
        staged = client.post(f"/sessions/{session_id}/messages", json={"text": "queued", "on_busy": "enqueue"})
        assert staged.status_code == 201 and staged.json()["delivery"] == "followup", staged.text
