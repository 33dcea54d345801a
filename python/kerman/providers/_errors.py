"""How provider failures become Kerman's ``ModelError`` subclasses: the vendors' error bodies,
the SDKs' exceptions, the bodies a proxy sends instead of a stream, and the API key check. No
vendor SDK is imported here."""

from __future__ import annotations

import email.utils
import json
import math
import re
import time
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from .. import errors


def check_api_key(key: Any, where: str = "") -> None:
    """Refuses an API key with surrounding whitespace or control characters (a key read with
    ``open(...).read()`` ends with a newline): the HTTP client would refuse the header, which the
    SDK reports as a connection error, retried in vain. The message never shows the key."""
    if not isinstance(key, str) or not key:
        return
    problem = None
    if key != key.strip():
        edge = key[-1] if key[-1].isspace() else key[0]
        problem = f"{'ends' if key[-1].isspace() else 'starts'} with {edge!r}"
    else:
        for i, ch in enumerate(key):
            if ord(ch) < 0x20 or ord(ch) == 0x7F or ch.isspace():
                problem = f"contains {ch!r} at position {i}"
                break
    if problem is not None:
        origin = f" ({where})" if where else ""
        raise ValueError(
            f"the API key{origin} {problem}: strip it (open(path).read().strip()); the key is {len(key)} characters long and is not shown"
        )


# -- errors --------------------------------------------------------------------------------------

CONTEXT_PATTERNS = re.compile(
    r"context[ _-]?(length|window)|maximum context|prompt is too long|too many (input )?tokens|"
    r"exceeds? the maximum number of tokens|input token count.*exceed|context limit|"
    r"reduce the length of the messages|request too large",
    re.IGNORECASE,
)

BAD_KEY = re.compile(r"api[ _-]?key[^.]{0,40}(not valid|invalid)|API_KEY_INVALID|(invalid|incorrect) api[ _-]?key", re.IGNORECASE)


def retry_after_ms(headers: Any, now: Optional[float] = None) -> Optional[int]:
    """``retry-after-ms`` (milliseconds) or ``retry-after`` (seconds, or an HTTP date) as ms."""
    if headers is None:
        return None
    try:
        value = headers.get("retry-after-ms")
        if value is not None:
            ms = float(value)
            if math.isfinite(ms) and ms >= 0:
                return int(math.ceil(ms))
    except (TypeError, ValueError):
        pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        parsed = email.utils.parsedate_tz(str(value))
        if parsed is None:
            return None
        seconds = email.utils.mktime_tz(parsed) - (time.time() if now is None else now)
    if not math.isfinite(seconds):
        return None
    return max(0, int(math.ceil(seconds * 1000)))


def scrub(text: str, secrets: Sequence[str]) -> str:
    """``text`` with every secret (an API key) replaced by ``***``."""
    for secret in secrets:
        if secret and len(secret) >= 4 and secret in text:
            text = text.replace(secret, "***")
    return text


def classify(
    provider: str,
    *,
    status: Optional[int],
    kind: Optional[str] = None,
    message: str = "",
    retry_after: Optional[int] = None,
    request_id: Optional[str] = None,
    timeout: bool = False,
    connection: bool = False,
    interrupted: bool = False,
    secrets: Sequence[str] = (),
) -> errors.ModelError:
    """The ``ModelError`` subclass for a provider failure. ``kind`` is the vendor's error type or
    code (``rate_limit_error``, ``insufficient_quota``, ``RESOURCE_EXHAUSTED``...)."""
    kind_l = (kind or "").lower()
    text = shorten(scrub(message or "", secrets).strip())
    where = f"{provider}: " + (f"HTTP {status} " if status else "") + (f"{kind}: " if kind else "")
    full = (where + text).strip().rstrip(":")
    args: Dict[str, Any] = {"status": status, "retry_after_ms": retry_after, "request_id": request_id}
    cls: type
    code: str
    if timeout or status == 408:
        cls, code = errors.ModelTimeoutError, "TIMEOUT"
    elif connection or interrupted:
        cls, code = errors.ModelConnectionError, "STREAM_INTERRUPTED" if interrupted else "CONNECTION_ERROR"
    elif "quota" in kind_l or kind_l in ("billing_error", "billing_not_active"):
        cls, code = errors.RateLimitError, "QUOTA_EXCEEDED"
    elif status == 429 or kind_l in ("rate_limit_error", "rate_limit_exceeded", "resource_exhausted", "too_many_requests"):
        cls, code = errors.RateLimitError, "RATE_LIMITED"
    elif status in (401, 403) or kind_l in (
        "authentication_error",
        "permission_error",
        "invalid_api_key",
        "unauthenticated",
        "permission_denied",
    ):
        cls = errors.AuthenticationError
        code = "PERMISSION_DENIED" if status == 403 or "permission" in kind_l else "AUTHENTICATION_FAILED"
    elif status in (400, None) and BAD_KEY.search(text):  # Gemini answers a bad key with 400 INVALID_ARGUMENT
        cls, code = errors.AuthenticationError, "AUTHENTICATION_FAILED"
    elif status in (503, 529) or kind_l in ("overloaded_error", "unavailable", "overloaded", "server_is_overloaded", "slow_down"):
        cls, code = errors.OverloadedError, "OVERLOADED"
    elif (status is not None and status >= 500) or kind_l in ("api_error", "server_error", "internal", "internal_error", "timeout_error"):
        cls, code = errors.ServerError, "SERVER_ERROR"
    elif status == 409:
        cls, code = errors.ServerError, "CONFLICT"
    elif (
        status == 413
        or kind_l in ("context_length_exceeded", "request_too_large", "string_above_max_length")
        or CONTEXT_PATTERNS.search(text)
    ):
        cls, code = errors.ContextLengthError, "CONTEXT_LENGTH_EXCEEDED"
    elif status == 404 or kind_l in ("not_found_error", "not_found", "model_not_found"):
        cls, code = errors.InvalidRequestError, "NOT_FOUND"
    elif status is not None and 400 <= status < 500:
        cls, code = errors.InvalidRequestError, "BAD_REQUEST"
    elif kind_l in ("invalid_request_error", "invalid_argument", "invalid_request", "failed_precondition"):
        cls, code = errors.InvalidRequestError, "BAD_REQUEST"
    else:
        cls, code = errors.ServerError, "SERVER_ERROR"
    return cls(full or f"{provider}: request failed", code, **args)


MESSAGE_LIMIT = 500  # characters of a server's message kept in a failure


def shorten(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """A server's message fit for a log line: whitespace runs as one space, cut to ``limit``
    characters with an ellipsis (an HTML error page or a stack trace can be megabytes)."""
    if len(text) > limit or "\n" in text or "  " in text:
        text = " ".join(text.split())
    if len(text) > limit:
        text = text[: limit - 1].rstrip() + "…"
    return text


TAG = re.compile(r"<(script|style)\b.*?</\1\s*>|<[^>]*>", re.IGNORECASE | re.DOTALL)
TITLE = re.compile(r"<title[^>]*>(.*?)</title\s*>", re.IGNORECASE | re.DOTALL)


def body_error(
    provider: str, status: Optional[int], content_type: str, body: str, secrets: Sequence[str] = (), expected: str = "an event stream"
) -> errors.ModelError:
    """The failure for a response that is not what was asked for (a ``200`` whose body is a
    JSON error, as proxies and OpenAI-compatible servers answer a bad key, or an HTML page
    from a gateway): a vendor-shaped JSON error is classified by its type and message; any
    other body is a ``SERVER_ERROR`` quoting the page's title or its text."""
    text = body.strip()
    parsed: Any = None
    if text[:1] in ("{", "["):
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
    if isinstance(parsed, list) and parsed and isinstance(parsed[0], Mapping):
        parsed = parsed[0]  # Gemini's REST errors come as a one-item list
    if isinstance(parsed, Mapping) and ("error" in parsed or "message" in parsed):
        kind, message = error_fields(parsed)
        inner = parsed.get("error")
        code = inner.get("code") if isinstance(inner, Mapping) else None
        if isinstance(code, int) and 400 <= code < 600:
            status = code  # Gemini's {"error": {"code": 401, "status": "UNAUTHENTICATED"}}
        return classify(provider, status=status, kind=kind, message=message or text, secrets=secrets)
    title = TITLE.search(text)
    if title is not None and title.group(1).strip():
        excerpt = title.group(1)
    else:
        excerpt = TAG.sub(" ", text) if "<" in text else text
    what = content_type.split(";")[0].strip() or "no content type"
    return classify(
        provider,
        status=None,
        kind=None,
        secrets=secrets,
        message=f"the server answered {what} instead of {expected}: {shorten(excerpt, 200) or '(empty)'}",
    )


def malformed_stream(provider: str, exc: BaseException, secrets: Sequence[str] = ()) -> errors.ModelError:
    """An event the SDK could not parse (a proxy's garbled stream): the stream is unusable from
    there on, as if it had dropped, so it is ``STREAM_INTERRUPTED`` (retried, as a dropped
    stream is)."""
    return classify(provider, status=None, message=f"malformed event in the stream: {exc}", interrupted=True, secrets=secrets)


BODY_LIMIT = 65536  # bytes of an unexpected response body read to report it


async def unexpected_body(provider: str, response: Any, secrets: Sequence[str]) -> Optional[errors.ModelError]:
    """For an httpx response to a streaming request: the failure to raise when the server did
    not answer with an event stream but with JSON or an HTML page (read up to ``BODY_LIMIT``
    bytes), else ``None``. A ``text/plain`` body is left to the SSE reader: some servers label
    their streams so."""
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    content_type = str(headers.get("content-type") or "").lower()
    if not (content_type.startswith("application/json") or content_type.startswith("text/html")):
        return None
    data = bytearray()
    try:
        async for piece in response.aiter_bytes():
            data += piece
            if len(data) >= BODY_LIMIT:
                break
    except Exception:
        pass  # report what arrived
    status = getattr(response, "status_code", None)
    return body_error(
        provider,
        status if isinstance(status, int) and status >= 400 else None,
        content_type,
        bytes(data[:BODY_LIMIT]).decode("utf-8", "replace"),
        secrets,
    )


def http_status_error(provider: str, exc: BaseException, secrets: Sequence[str], started: bool = False) -> errors.ModelError:
    """An SDK's status/connection/timeout exception (openai- and anthropic-style SDKs share the
    shape: ``status_code``, ``response.headers``, ``body``, ``request_id``). ``started``: the
    stream had begun, so a dropped connection is ``STREAM_INTERRUPTED``."""
    names = {c.__name__ for c in type(exc).__mro__}
    status = getattr(exc, "status_code", None)
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None) if response is not None else None
    body = getattr(exc, "body", None)
    kind, message = error_fields(body)
    if not message:
        message = getattr(exc, "message", None) or str(exc)
    return classify(
        provider,
        status=status if isinstance(status, int) and status >= 400 else None,
        kind=kind,
        message=message,
        retry_after=retry_after_ms(headers),
        request_id=getattr(exc, "request_id", None),
        timeout="APITimeoutError" in names,
        connection="APIConnectionError" in names and "APITimeoutError" not in names and not started,
        interrupted="APIConnectionError" in names and "APITimeoutError" not in names and started,
        secrets=secrets,
    )


def is_transport_error(exc: BaseException) -> bool:
    """An httpx / httpx2 transport failure (a dropped connection, a read timeout) that an SDK let
    through unwrapped (some do, mid-stream)."""
    for c in type(exc).__mro__:
        if c.__name__ in ("TransportError", "TimeoutException") and c.__module__.split(".")[0] in ("httpx", "httpx2", "httpcore"):
            return True
    return False


def transport_error(provider: str, exc: BaseException, secrets: Sequence[str], started: bool) -> errors.ModelError:
    timeout = any(c.__name__ == "TimeoutException" for c in type(exc).__mro__)
    return classify(
        provider,
        status=None,
        message=str(exc) or type(exc).__name__,
        timeout=timeout,
        connection=not timeout and not started,
        interrupted=not timeout and started,
        secrets=secrets,
    )


def error_fields(body: Any) -> Tuple[Optional[str], str]:
    """(kind, message) of a vendor error body: ``{"error": {"type"|"code"|"status", "message"}}``,
    the ``error`` dict itself, or a string."""
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        if isinstance(inner, Mapping):
            kind = inner.get("code") or inner.get("type") or inner.get("status")
            if isinstance(kind, int):
                kind = inner.get("status") or inner.get("type")
            message = inner.get("message") or ""
            return (str(kind) if kind else None), str(message)
        if isinstance(inner, str):
            return None, inner
    if isinstance(body, str):
        return None, body
    return None, ""
