"""The ASGI app: routes, JSON errors, SSE streams (the checks before the routes are _guard.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Optional, Sequence
from urllib.parse import quote

import anyio
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .. import BusyError, DuplicateMessageError, InvalidMessageError, KermanError, LoopError, SessionExistsError, SessionNotFoundError, ui
from .._busy import POLICIES
from ..events import InboxSpliced
from ..ui._base import JsonDict
from . import _decisions
from ._errors import ApiError, error_response, public
from ._guard import Guard, cookie_name, cookie_value
from ._limits import ABORT
from ._sessions import Session, Sessions
from ._usage import usage_of

__all__ = ["create_app"]

try:
    from sse_starlette.sse import SendTimeoutError as _SEND_TIMEOUT
except ImportError:  # pragma: no cover - older sse-starlette raises a plain TimeoutError
    _SEND_TIMEOUT = TimeoutError  # type: ignore[misc, assignment]

log = logging.getLogger("kerman.web")

STATIC = Path(__file__).parent / "static"
PROTOCOLS = ("agui", "vercel", "kerman")
DELIVERIES = ("followup", "steer", "inject")
ON_BUSY = POLICIES
# Session and message ids the API accepts: what URLs and file names carry without escaping
# (minted ids are UUIDv7 text, which fits).
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


class _Events(EventSourceResponse):
    """An SSE response whose reader, when it takes nothing for ``send_timeout`` seconds, is
    given up quietly (its connection closes; a browser's EventSource reconnects and resumes)."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        except _SEND_TIMEOUT:
            log.info("gave up an SSE reader of %s that took nothing for %s s", scope.get("path"), self.send_timeout)
            abort = scope.get(ABORT)
            if abort is not None:  # under kerman serve: drop the connection and what it buffers
                abort()
                await asyncio.sleep(0)  # the server learns of the loss before the response ends


def _checked_id(value: str, what: str) -> str:
    if not _ID.fullmatch(value) or ".." in value:
        raise ApiError(
            400,
            f"invalid-{what}-id",
            f"invalid {what} id {value!r}: use 1 to 128 letters, digits, '_', '-' or '.', starting with a letter or digit",
        )
    return value


async def _json_body(request: Request) -> JsonDict:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError as error:
        raise ApiError(400, "invalid-json", f"the request body is not JSON: {error}") from None
    except RecursionError:
        raise ApiError(400, "invalid-json", "the request body is not JSON this server reads: it is nested too deeply") from None
    if not isinstance(body, dict):
        raise ApiError(400, "invalid-body", f"the request body must be a JSON object, not {type(body).__name__}")
    return body


def _fields(body: JsonDict, allowed: Sequence[str]) -> None:
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise ApiError(400, "invalid-body", f"unknown field(s) {', '.join(map(repr, unknown))}; expected {', '.join(allowed)}")


def _text(body: JsonDict) -> str:
    text = body.get("text")
    if not isinstance(text, str) or not text.strip():
        raise ApiError(400, "invalid-text", "'text' must be a non-empty string")
    return text


def create_app(
    store: Any,
    model: Optional[Callable[..., Any]] = None,
    *,
    token: Optional[str] = None,
    cors_origins: Sequence[str] = (),
    max_body: int = 64 * 1024,
    heartbeat: float = 15.0,
    allowed_hosts: Sequence[str] = (),
    body_timeout: float = 30.0,
    send_timeout: float = 60.0,
    max_streams: int = 128,
    idle_session: float = 300.0,
    max_sessions: int = 256,
    custom: Optional[Callable[..., Any]] = None,
) -> Starlette:
    """The web app over ``store`` (docs/web.md).

    ``model`` is the model factory for sessions this process owns (a ``FileStore`` or a
    ``MemoryStore``): called with the session's log if it takes an argument, else with none; it
    returns a model (an ``AgentLoop`` is built around it) or an ``AgentLoop`` over that log.
    ``token``: when set, every route needs ``Authorization: Bearer <token>`` (or the cookie the
    chat page gets from ``/?token=<token>``). ``cors_origins``: origins allowed to call the API
    from a browser (none by default). ``allowed_hosts``: host names the app answers to besides IP
    addresses and ``localhost``. ``max_body``: the largest request body, in bytes;
    ``body_timeout``: seconds for it to arrive. ``heartbeat``: seconds between SSE comment lines
    on an idle stream; ``send_timeout``: seconds a stream waits for a client to take a piece
    before it gives the client up; ``max_streams``: open streams per client address.
    ``idle_session``: seconds after which an unused, idle session is closed; ``max_sessions``:
    sessions held open at most. ``custom``: the mapping of plugin event types to AG-UI ``CUSTOM``
    events and Vercel ``data-*`` parts (``kerman.ui.default_custom`` when ``None``; docs/web.md).
    """
    if custom is not None and not callable(custom):
        raise TypeError(f"create_app: custom must be a function of an event returning a kerman.ui.Custom or None, not {custom!r}")
    sessions = Sessions(store, model, idle_after=idle_session, max_open=max_sessions, grace=body_timeout + 5.0, custom=custom)
    roots = [str(store.root)] if hasattr(store, "root") else []

    async def page(request: Request) -> Response:
        if token and "token" in request.query_params:  # trade the token in the URL for a cookie
            response: Response = RedirectResponse("/", status_code=303)
            response.set_cookie(cookie_name(request.scope), cookie_value(token), httponly=True, samesite="strict", path="/")
            return response
        return FileResponse(STATIC / "index.html", headers={**_PAGE_HEADERS, "Cache-Control": "no-store"})

    async def list_sessions(request: Request) -> JSONResponse:
        return JSONResponse({"sessions": [{"id": i} for i in sessions.list()]})

    async def create_session(request: Request) -> JSONResponse:
        body = await _json_body(request)
        _fields(body, ("id",))
        session_id = body.get("id")
        if session_id is not None:
            if not isinstance(session_id, str):
                raise ApiError(400, "invalid-session-id", "'id' must be a string")
            _checked_id(session_id, "session")
        try:
            session = await sessions.create(session_id)
        except SessionExistsError:
            raise ApiError(409, "session-exists", f'session "{session_id}" already exists') from None
        return JSONResponse(session.info(), status_code=201, headers={"Location": f"/sessions/{quote(session.id)}"})

    async def session_of(request: Request) -> Session:
        return await sessions.get(_checked_id(request.path_params["session_id"], "session"))

    async def show_session(request: Request) -> JSONResponse:
        return JSONResponse((await session_of(request)).info())

    async def show_usage(request: Request) -> JSONResponse:
        session = await session_of(request)
        # A fold of the whole log: off the event loop, so a long session does not stall streams.
        return JSONResponse(await run_in_threadpool(usage_of, session.loop or session.log))

    async def post_message(request: Request) -> JSONResponse:
        session = await session_of(request)
        body = await _json_body(request)
        _fields(body, ("text", "delivery", "id", "on_busy"))
        text = _text(body)
        delivery = body.get("delivery", "followup")
        if delivery not in DELIVERIES:
            raise ApiError(400, "invalid-delivery", f"'delivery' must be one of {', '.join(DELIVERIES)}, not {delivery!r}")
        on_busy = body.get("on_busy")
        if on_busy is not None:
            if on_busy not in ON_BUSY:
                raise ApiError(400, "invalid-on-busy", f"'on_busy' must be one of {', '.join(ON_BUSY)}, not {on_busy!r}")
            if delivery != "followup":
                raise ApiError(400, "invalid-on-busy", f"'on_busy' applies to a followup, not to {delivery!r}")
        message_id = body.get("id")
        if message_id is not None:
            if not isinstance(message_id, str):
                raise ApiError(400, "invalid-message-id", "'id' must be a string")
            _checked_id(message_id, "message")
        try:
            message = await sessions.send(session, text, delivery, message_id, on_busy)
        except DuplicateMessageError as error:
            raise ApiError(409, "duplicate-message", str(error)) from None
        except BusyError as error:
            raise ApiError(409, "busy", str(error)) from None
        return JSONResponse({"id": message.id, "delivery": delivery}, status_code=201)

    async def fork_at(request: Request) -> JSONResponse:
        session = await session_of(request)
        body = await _json_body(request)
        _fields(body, ("message_id", "text"))
        text = _text(body)
        message_id = body.get("message_id")
        if not isinstance(message_id, str):
            raise ApiError(400, "invalid-message-id", "'message_id' must be a string: the user message to edit")
        _checked_id(message_id, "message")
        child, cut, message = await sessions.fork(session, message_id, text)
        return JSONResponse(
            {"id": child.id, "forkedFrom": {"id": session.id, "seq": cut}, "message": message.id},
            status_code=201,
            headers={"Location": f"/sessions/{quote(child.id)}"},
        )

    def _gone(session: Session, message_id: str) -> ApiError:
        for event in session.log.splices():
            if any(m.id == message_id for m in InboxSpliced(event).inserted):
                return ApiError(
                    409,
                    "not-queued",
                    f'message "{message_id}" is no longer queued in session "{session.id}": it was claimed by a turn or removed',
                )
        return ApiError(404, "message-not-found", f'no message "{message_id}" was queued in session "{session.id}"')

    async def edit_queued(request: Request) -> JSONResponse:
        session = await session_of(request)
        message_id = _checked_id(request.path_params["message_id"], "message")
        body = await _json_body(request)
        _fields(body, ("text",))
        text = _text(body)
        if session.loop is None and sessions.remote_ops:
            await sessions.remote(session, "replace", message_id, text)
            return JSONResponse({"id": message_id, "text": text})
        loop = sessions.owned_loop(session, "edit the queue")
        message = loop.inbox.get(message_id)
        if message is None:
            raise _gone(session, message_id)
        if any(block.get("type") != "text" for block in message.content):
            raise ApiError(409, "not-text", f'message "{message_id}" holds more than text; only text messages can be edited')
        if not loop.inbox.replace(message_id, message.with_content(text)):
            raise _gone(session, message_id)
        return JSONResponse({"id": message_id, "text": text})

    async def remove_queued(request: Request) -> JSONResponse:
        session = await session_of(request)
        message_id = _checked_id(request.path_params["message_id"], "message")
        if session.loop is None and sessions.remote_ops:
            await sessions.remote(session, "remove", message_id)
            return JSONResponse({"id": message_id, "removed": True})
        loop = sessions.owned_loop(session, "remove from the queue")
        if not loop.inbox.remove(message_id):
            raise _gone(session, message_id)
        return JSONResponse({"id": message_id, "removed": True})

    async def cancel(request: Request) -> JSONResponse:
        session = await session_of(request)
        body = await _json_body(request)
        _fields(body, ("keep_inbox",))
        keep = body.get("keep_inbox", False)
        if not isinstance(keep, bool):
            raise ApiError(400, "invalid-body", "'keep_inbox' must be true or false")
        if session.loop is None and sessions.remote_ops:
            outcome = await sessions.remote(session, "cancel", "user", keep_inbox=keep)
            return JSONResponse({"cancelled": bool(outcome.get("cancelled")), "keep_inbox": keep})
        loop = sessions.owned_loop(session, "cancel")
        running = loop.status == "running"
        loop.cancel("user", keep_inbox=keep)
        return JSONResponse({"cancelled": running, "keep_inbox": keep})

    async def requeue(request: Request) -> JSONResponse:
        """Sends again what turn ``turn`` claimed but never read (``AgentLoop.requeue_claimed``:
        claimed input never comes back by itself), and starts a turn for it when idle; over a
        PostgresStore the owning process does (``store.requeue``)."""
        session = await session_of(request)
        body = await _json_body(request)
        _fields(body, ("turn",))
        turn = body.get("turn")
        if not isinstance(turn, int) or isinstance(turn, bool) or turn < 1:
            raise ApiError(400, "invalid-body", f"'turn' must be a turn number (an integer from 1), not {turn!r}")
        if session.loop is None and sessions.remote_ops:
            outcome = await sessions.remote(session, "requeue", turn)
            return JSONResponse({"turn": turn, "requeued": list(outcome.get("requeued", []))})
        loop = sessions.owned_loop(session, "requeue")
        try:
            requeued = loop.requeue_claimed(turn)
        except LoopError as error:
            raise ApiError(409, "nothing-to-requeue", str(error)) from None
        loop.wake()
        return JSONResponse({"turn": turn, "requeued": [m.id for m in requeued]})

    async def list_decisions(request: Request) -> JSONResponse:
        """The requests the session's waiting turn puts to a person (docs/decisions.md)."""
        session = await session_of(request)
        return JSONResponse({"decisions": _decisions.listed(sessions, session)})

    async def decide(request: Request) -> JSONResponse:
        """Decides a pending request: by the loop here, or through the store by the session's
        owner (``store.decide``); idempotent by ``key``."""
        session = await session_of(request)
        decision_id = _checked_id(request.path_params["decision_id"], "decision")
        body = await _json_body(request)
        _fields(body, _decisions.FIELDS)
        return JSONResponse(await _decisions.decide(sessions, session, decision_id, body))

    async def events(request: Request) -> Response:
        session = await session_of(request)
        protocol = request.query_params.get("protocol", "agui")
        if protocol not in PROTOCOLS:
            raise ApiError(400, "invalid-protocol", f"'protocol' must be one of {', '.join(PROTOCOLS)}, not {protocol!r}")
        resume = request.headers.get("last-event-id") or request.query_params.get("after")
        try:
            after = ui.parse_resume(resume) if resume else None
        except ValueError as error:
            raise ApiError(400, "invalid-last-event-id", str(error)) from None
        if protocol == "kerman" and after is not None and after.index is not None:
            raise ApiError(400, "invalid-last-event-id", f"the kerman protocol's event ids are seqs, not {resume!r}")
        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        if protocol == "vercel":
            headers["x-vercel-ai-ui-message-stream"] = "v1"
        # on shutdown sse-starlette sets the shared event, the watcher ends every stream, and each
        # response completes within the grace period instead of being cut
        return _Events(
            _stream(session, protocol, after),
            ping=heartbeat,
            headers=headers,
            shutdown_event=_stopping(),
            shutdown_grace_period=2.0,
            send_timeout=send_timeout,
        )

    stopping: list[Any] = []  # the shared shutdown event, then its watcher task

    def _stopping() -> anyio.Event:
        if not stopping:
            stopping.append(anyio.Event())

            async def watch() -> None:
                await stopping[0].wait()
                sessions.stop_streams()

            stopping.append(asyncio.get_running_loop().create_task(watch()))
        event: anyio.Event = stopping[0]
        return event

    async def _stream(session: Session, protocol: str, after: Optional[ui.ResumePoint]) -> AsyncIterator[bytes]:
        session.streams += 1
        try:
            async for chunk in session.feed(protocol).frames(after):
                yield chunk
        finally:
            session.streams -= 1
            session.used = time.monotonic()  # idle from the moment its last reader left

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return error_response(exc.status, exc.code, exc.message, exc.headers)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = {404: "not-found", 405: "method-not-allowed"}.get(exc.status_code, "http-error")
        message = {404: f"no route {request.method} {request.url.path}", 405: f"{request.method} is not allowed on {request.url.path}"}.get(
            exc.status_code, str(exc.detail)
        )
        return error_response(exc.status_code, code, message, dict(exc.headers or {}))

    async def kerman_error(request: Request, exc: Exception) -> Response:
        if isinstance(exc, SessionNotFoundError):
            return error_response(404, "session-not-found", public(str(exc), roots))
        if isinstance(exc, InvalidMessageError):
            return error_response(400, "invalid-message", public(str(exc), roots))
        log.warning("request %s %s failed: %s", request.method, request.url.path, exc)
        return error_response(409, "kerman-error", public(f"{type(exc).__name__}: {exc}", roots))

    async def internal_error(request: Request, exc: Exception) -> Response:
        log.error("request %s %s failed", request.method, request.url.path, exc_info=exc)
        return error_response(500, "internal-error", "the server failed to answer this request; its log says why")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        sessions.start()
        try:
            yield
        finally:
            await sessions.close()

    routes = [
        Route("/", page, methods=["GET"]),
        Route("/sessions", list_sessions, methods=["GET"]),
        Route("/sessions", create_session, methods=["POST"]),
        Route("/sessions/{session_id}", show_session, methods=["GET"]),
        Route("/sessions/{session_id}/events", events, methods=["GET"]),
        Route("/sessions/{session_id}/usage", show_usage, methods=["GET"]),
        Route("/sessions/{session_id}/messages", post_message, methods=["POST"]),
        Route("/sessions/{session_id}/fork", fork_at, methods=["POST"]),
        Route("/sessions/{session_id}/queue/{message_id}", edit_queued, methods=["PATCH"]),
        Route("/sessions/{session_id}/queue/{message_id}", remove_queued, methods=["DELETE"]),
        Route("/sessions/{session_id}/cancel", cancel, methods=["POST"]),
        Route("/sessions/{session_id}/requeue", requeue, methods=["POST"]),
        Route("/sessions/{session_id}/decisions", list_decisions, methods=["GET"]),
        Route("/sessions/{session_id}/decisions/{decision_id}", decide, methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    middleware = []
    if cors_origins:
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=list(cors_origins),
                allow_methods=["GET", "POST", "PATCH", "DELETE"],
                allow_headers=["Authorization", "Content-Type", "Last-Event-ID"],
            )
        )
    middleware.append(
        Middleware(
            Guard,
            token=token,
            max_body=max_body,
            allowed_hosts=allowed_hosts,
            origins=cors_origins,
            body_timeout=body_timeout,
            max_streams=max_streams,
        )
    )
    app = Starlette(
        routes=routes,
        middleware=middleware,
        lifespan=lifespan,
        exception_handlers={ApiError: api_error, HTTPException: http_error, KermanError: kerman_error, Exception: internal_error},
    )
    app.state.sessions = sessions
    return app
