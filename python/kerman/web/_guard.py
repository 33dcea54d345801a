"""The checks every request passes before a route sees it (pure ASGI middleware).

In order: the ``Host`` header names this server (an IP literal, ``localhost`` or a configured
name: a page whose DNS name was rebound to the server's address is refused); the token, when
one is set; a state-changing request, or any API request a browser sends from another site,
comes from this server's own origin or a configured one (``Origin``, ``Sec-Fetch-Site``); a
request body is ``application/json``, at most ``max_body`` bytes and arrives within
``body_timeout`` seconds; one client holds at most ``max_streams`` event streams.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from typing import Any, Optional, Sequence
from urllib.parse import unquote, unquote_plus, urlsplit

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ._errors import ApiError, error_response

__all__ = ["Guard", "cookie_name", "cookie_value"]

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


def cookie_name(scope: Scope) -> str:
    """The chat page's cookie, one per port: browsers send a host's cookies to all its ports, so a
    second server on another port must not overwrite (or be handed) this one's."""
    server = scope.get("server")
    return f"kerman_token_{server[1]}" if server and server[1] is not None else "kerman_token"


def cookie_value(token: str) -> str:
    """What the cookie holds: a digest of the token (hex, so any token fits a cookie unquoted,
    and the token itself is never handed to the other servers of the host)."""
    return hmac.new(token.encode(), b"kerman web chat cookie", hashlib.sha256).hexdigest()


def _host_name(value: str) -> str:
    """``host[:port]`` → host, lower case, without the brackets of an IPv6 literal."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value[1:]
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class Guard:
    """See the module docstring. ``allowed_hosts``: host names (besides IP literals and
    ``localhost``) this server answers to; ``origins``: other origins allowed to call it."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: Optional[str],
        max_body: int,
        allowed_hosts: Sequence[str] = (),
        origins: Sequence[str] = (),
        body_timeout: float = 30.0,
        max_streams: int = 128,
    ) -> None:
        self.app = app
        self.token = token
        self.cookie = cookie_value(token).encode() if token else b""
        self.max_body = max_body
        self.hosts = {"localhost", *(h.lower().rstrip(".") for h in allowed_hosts)}
        self.origins = {o.rstrip("/").lower() for o in origins}
        self.body_timeout = body_timeout
        self.max_streams = max_streams
        self.streams: dict[str, int] = {}

    # -- the checks ------------------------------------------------------------------------------

    def _host_ok(self, host: Optional[bytes]) -> bool:
        if host is None:  # HTTP/1.0 without a Host: not a browser
            return True
        name = _host_name(host.decode("latin-1")).rstrip(".")
        return _is_ip(name) or name in self.hosts

    def _authorised(self, scope: Scope, headers: dict[bytes, bytes]) -> bool:
        if self.token is None:
            return True
        token = self.token.encode()
        given = headers.get(b"authorization", b"")
        if given[:7].lower() == b"bearer " and hmac.compare_digest(given[7:].strip(), token):
            return True
        name = cookie_name(scope).encode()
        for part in headers.get(b"cookie", b"").split(b";"):
            key, _, value = part.strip().partition(b"=")
            if key == name and hmac.compare_digest(value.strip(b'"'), self.cookie):
                return True
        return scope["path"] == "/" and self.query_token(scope)

    def query_token(self, scope: Scope) -> bool:
        """``/?token=``: a browser sends a pasted ``+`` as is, and ``+`` is also a space in a
        query; every reading of the value is tried."""
        if self.token is None:
            return False
        raw = scope.get("query_string", b"").decode("latin-1")
        for pair in raw.split("&"):
            key, _, value = pair.partition("=")
            if key == "token":
                readings = {value, unquote(value), unquote_plus(value)}
                return any(hmac.compare_digest(r.encode("utf-8", "surrogateescape"), self.token.encode()) for r in readings)
        return False

    def _same_origin(self, method: str, path: str, headers: dict[bytes, bytes]) -> Optional[str]:
        """Why a request a browser may have sent from another site is refused, or None."""
        origin = headers.get(b"origin")
        site = headers.get(b"sec-fetch-site", b"").decode("latin-1").lower()
        if origin is not None:
            text = origin.decode("latin-1").rstrip("/").lower()
            if text in self.origins:
                return None
            parts = urlsplit(text)
            host = headers.get(b"host", b"").decode("latin-1").lower()
            if parts.scheme in ("http", "https") and host and parts.netloc == host:
                return None
            if method in SAFE_METHODS and not path.startswith("/sessions"):
                return None
            return (
                f"requests from origin {origin.decode('latin-1')!r} are refused: only this server's own page "
                "(or an origin named with --cors-origin) may call it"
            )
        if site in ("", "same-origin") or (site == "none" and method in SAFE_METHODS):
            return None
        if method in SAFE_METHODS and not path.startswith("/sessions"):
            return None  # the page and its files may be opened from a link anywhere
        return f"a {site} request is refused: only this server's own page (or an origin named with --cors-origin) may call it"

    # -- the middleware --------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        method = scope["method"]
        refusal = self._refusal(scope, headers, method)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        client = (scope.get("client") or ("?",))[0]
        streaming = method == "GET" and scope["path"].startswith("/sessions/") and scope["path"].endswith("/events")
        if streaming:
            if self.streams.get(client, 0) >= self.max_streams:
                response = error_response(
                    429, "too-many-streams", f"this client already has {self.max_streams} event streams open; close one first"
                )
                await response(scope, receive, send)
                return
            self.streams[client] = self.streams.get(client, 0) + 1
        try:
            await self.app(scope, self._bounded(receive), send)
        finally:
            if streaming:
                left = self.streams[client] - 1
                if left:
                    self.streams[client] = left
                else:
                    del self.streams[client]

    def _refusal(self, scope: Scope, headers: dict[bytes, bytes], method: str) -> Any:
        if not self._host_ok(headers.get(b"host")):
            host = headers[b"host"].decode("latin-1")
            return error_response(
                421, "unknown-host", f"this server does not answer for host {host!r}; name it with --allow-host if it is this server's"
            )
        if not self._authorised(scope, headers):
            return error_response(
                401,
                "unauthorized",
                "this server needs its token: send 'Authorization: Bearer <token>', or open the chat page as /?token=<token>",
                headers={"WWW-Authenticate": 'Bearer realm="kerman"'},
            )
        why = self._same_origin(method, scope["path"], headers)
        if why is not None:
            return error_response(403, "cross-site", why)
        length = headers.get(b"content-length")
        has_body = (length is not None and length.strip() not in (b"", b"0")) or b"transfer-encoding" in headers
        if method not in SAFE_METHODS and has_body:
            kind = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
            if kind != b"application/json":
                shown = headers.get(b"content-type", b"").decode("latin-1") or "none"
                return error_response(415, "not-json", f"request bodies must be sent as 'Content-Type: application/json', not {shown!r}")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            return error_response(413, "body-too-large", f"the request body is larger than {self.max_body} bytes")
        return None

    def _bounded(self, receive: Receive) -> Receive:
        """``receive`` with the body bounded in size and in time (a client that announces a body
        and stops sending it gets 408)."""
        seen = 0
        done = False
        limit = self.max_body
        deadline = anyio.current_time() + self.body_timeout

        async def bounded() -> Message:
            nonlocal seen, done
            if done:  # the body is in: later reads wait for the disconnect, as long as it takes
                return await receive()
            with anyio.move_on_after(max(0.0, deadline - anyio.current_time())) as scope:
                message = await receive()
            if scope.cancel_called:
                raise ApiError(
                    408,
                    "body-timeout",
                    f"the request body did not arrive within {self.body_timeout:g} seconds",
                    headers={"Connection": "close"},
                )
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise ApiError(413, "body-too-large", f"the request body is larger than {limit} bytes")
                done = not message.get("more_body", False)
            else:
                done = True
            return message

        return bounded
