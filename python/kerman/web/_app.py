"""The ASGI app: routes, authentication, bounded bodies, JSON errors, SSE streams."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import re
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Optional, Sequence
from urllib.parse import quote

import anyio
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from .. import DuplicateMessageError, InvalidMessageError, KermanError, LoopError, SessionExistsError, SessionNotFoundError, ui
from ..ui._base import JsonDict
from ._errors import ApiError, error_response
from ._sessions import Session, Sessions

__all__ = ["create_app"]

log = logging.getLogger("kerman.web")

STATIC = Path(__file__).parent / "static"
COOKIE = "kerman_token"
PROTOCOLS = ("agui", "vercel", "kerman")
DELIVERIES = ("followup", "steer", "inject")
# Session and message ids the API accepts: what URLs and file names carry without escaping
# (minted ids are UUIDv7 text, which fits).
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def _checked_id(value: str, what: str) -> str:
    if not _ID.fullmatch(value) or ".." in value:
        raise ApiError(400, f"invalid-{what}-id", f"invalid {what} id {value!r}: use 1 to 128 letters, digits, '_', '-' or '.', "
                                                  "starting with a letter or digit")
    return value


class _Guard:
    """Pure ASGI middleware: the bearer token (header or the page's cookie) on every route when
    one is set, and request bodies bounded by ``max_body`` bytes."""

    def __init__(self, app: ASGIApp, token: Optional[str], max_body: int) -> None:
        self.app = app
        self.token = token.encode() if token else None
        self.max_body = max_body

    def _authorised(self, scope: Scope) -> bool:
        if self.token is None:
            return True
        headers = dict(scope.get("headers") or ())
        given = headers.get(b"authorization", b"")
        if given[:7].lower() == b"bearer " and hmac.compare_digest(given[7:].strip(), self.token):
            return True
        for part in headers.get(b"cookie", b"").split(b";"):
            name, _, value = part.strip().partition(b"=")
            if name == COOKIE.encode() and hmac.compare_digest(value, self.token):
                return True
        return scope["path"] == "/" and self._query_token(scope)

    def _query_token(self, scope: Scope) -> bool:
        from urllib.parse import parse_qs

        values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token", [])
        return bool(values) and self.token is not None and hmac.compare_digest(values[0].encode(), self.token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not self._authorised(scope):
            response = error_response(401, "unauthorized", "this server needs its token: send 'Authorization: Bearer <token>', "
                                                           "or open the chat page as /?token=<token>",
                                      headers={"WWW-Authenticate": 'Bearer realm="kerman"'})
            await response(scope, receive, send)
            return
        length = dict(scope.get("headers") or ()).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            response = error_response(413, "body-too-large", f"the request body is larger than {self.max_body} bytes")
            await response(scope, receive, send)
            return
        seen = 0
        limit = self.max_body

        async def bounded() -> Any:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise ApiError(413, "body-too-large", f"the request body is larger than {limit} bytes")
            return message

        await self.app(scope, bounded, send)


async def _json_body(request: Request) -> JsonDict:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError as error:
        raise ApiError(400, "invalid-json", f"the request body is not JSON: {error}") from None
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


def create_app(store: Any, model: Optional[Callable[..., Any]] = None, *, token: Optional[str] = None,
               cors_origins: Sequence[str] = (), max_body: int = 64 * 1024, heartbeat: float = 15.0) -> Starlette:
    """The web app over ``store`` (docs/web.md).

    ``model`` is the model factory for sessions this process owns (a ``FileStore`` or a
    ``MemoryStore``): called with the session's log if it takes an argument, else with none; it
    returns a model (an ``AgentLoop`` is built around it) or an ``AgentLoop`` over that log.
    ``token``: when set, every route needs ``Authorization: Bearer <token>`` (or the cookie the
    chat page gets from ``/?token=<token>``). ``cors_origins``: origins allowed to call the API
    from a browser (none by default). ``max_body``: the largest request body, in bytes.
    ``heartbeat``: seconds between SSE comment lines on an idle stream.
    """
    sessions = Sessions(store, model)

    async def page(request: Request) -> Response:
        if token and "token" in request.query_params:  # trade the token in the URL for a cookie
            response: Response = RedirectResponse("/", status_code=303)
            response.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/")
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

    async def post_message(request: Request) -> JSONResponse:
        session = await session_of(request)
        body = await _json_body(request)
        _fields(body, ("text", "delivery", "id"))
        text = _text(body)
        delivery = body.get("delivery", "followup")
        if delivery not in DELIVERIES:
            raise ApiError(400, "invalid-delivery", f"'delivery' must be one of {', '.join(DELIVERIES)}, not {delivery!r}")
        message_id = body.get("id")
        if message_id is not None:
            if not isinstance(message_id, str):
                raise ApiError(400, "invalid-message-id", "'id' must be a string")
            _checked_id(message_id, "message")
        try:
            message = await sessions.send(session, text, delivery, message_id)
        except DuplicateMessageError as error:
            raise ApiError(409, "duplicate-message", str(error)) from None
        return JSONResponse({"id": message.id, "delivery": delivery}, status_code=201)

    def _gone(session: Session, message_id: str) -> ApiError:
        for event in session.log.splices():
            if any(m.get("id") == message_id for m in event.data.get("inserted", ())):
                return ApiError(409, "not-queued", f'message "{message_id}" is no longer queued in session "{session.id}": '
                                                   "it was claimed by a turn or removed")
        return ApiError(404, "message-not-found", f'no message "{message_id}" was queued in session "{session.id}"')

    async def edit_queued(request: Request) -> JSONResponse:
        session = await session_of(request)
        message_id = _checked_id(request.path_params["message_id"], "message")
        loop = sessions.owned_loop(session, "edit the queue")
        body = await _json_body(request)
        _fields(body, ("text",))
        text = _text(body)
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
        loop = sessions.owned_loop(session, "remove from the queue")
        if not loop.inbox.remove(message_id):
            raise _gone(session, message_id)
        return JSONResponse({"id": message_id, "removed": True})

    async def cancel(request: Request) -> JSONResponse:
        session = await session_of(request)
        loop = sessions.owned_loop(session, "cancel")
        body = await _json_body(request)
        _fields(body, ("keep_inbox",))
        keep = body.get("keep_inbox", False)
        if not isinstance(keep, bool):
            raise ApiError(400, "invalid-body", "'keep_inbox' must be true or false")
        running = loop.status == "running"
        loop.cancel("user", keep_inbox=keep)
        return JSONResponse({"cancelled": running, "keep_inbox": keep})

    async def requeue(request: Request) -> JSONResponse:
        """Sends again what turn ``turn`` claimed but never read (``AgentLoop.requeue_claimed``:
        claimed input never comes back by itself), and starts a turn for it when idle."""
        session = await session_of(request)
        loop = sessions.owned_loop(session, "requeue")
        body = await _json_body(request)
        _fields(body, ("turn",))
        turn = body.get("turn")
        if not isinstance(turn, int) or isinstance(turn, bool) or turn < 1:
            raise ApiError(400, "invalid-body", f"'turn' must be a turn number (an integer from 1), not {turn!r}")
        try:
            requeued = loop.requeue_claimed(turn)
        except LoopError as error:
            raise ApiError(409, "nothing-to-requeue", str(error)) from None
        loop.wake()
        return JSONResponse({"turn": turn, "requeued": [m.id for m in requeued]})

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
        return EventSourceResponse(_stream(session, protocol, after), ping=heartbeat, headers=headers,
                                   shutdown_event=_stopping(), shutdown_grace_period=2.0)

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
        async for chunk in session.feed(protocol).frames(after):
            yield chunk

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return error_response(exc.status, exc.code, exc.message, exc.headers)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = {404: "not-found", 405: "method-not-allowed"}.get(exc.status_code, "http-error")
        message = {404: f"no route {request.method} {request.url.path}",
                   405: f"{request.method} is not allowed on {request.url.path}"}.get(exc.status_code, str(exc.detail))
        return error_response(exc.status_code, code, message, dict(exc.headers or {}))

    async def kerman_error(request: Request, exc: Exception) -> Response:
        if isinstance(exc, SessionNotFoundError):
            return error_response(404, "session-not-found", str(exc))
        if isinstance(exc, InvalidMessageError):
            return error_response(400, "invalid-message", str(exc))
        log.warning("request %s %s failed: %s", request.method, request.url.path, exc)
        return error_response(409, "kerman-error", f"{type(exc).__name__}: {exc}")

    async def internal_error(request: Request, exc: Exception) -> Response:
        log.error("request %s %s failed", request.method, request.url.path, exc_info=exc)
        return error_response(500, "internal-error", "the server failed to answer this request; its log says why")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
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
        Route("/sessions/{session_id}/messages", post_message, methods=["POST"]),
        Route("/sessions/{session_id}/queue/{message_id}", edit_queued, methods=["PATCH"]),
        Route("/sessions/{session_id}/queue/{message_id}", remove_queued, methods=["DELETE"]),
        Route("/sessions/{session_id}/cancel", cancel, methods=["POST"]),
        Route("/sessions/{session_id}/requeue", requeue, methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    middleware = []
    if cors_origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["GET", "POST", "PATCH", "DELETE"],
                                     allow_headers=["Authorization", "Content-Type", "Last-Event-ID"]))
    middleware.append(Middleware(_Guard, token=token, max_body=max_body))
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan,
                    exception_handlers={ApiError: api_error, HTTPException: http_error, KermanError: kerman_error,
                                        Exception: internal_error})
    app.state.sessions = sessions
    return app
