"""The native exporter: spans folded from the log and encoded as OTLP in the core
(``kerman._core.OtlpSpans``), posted to an OTLP/HTTP endpoint by a thread of its own. No
Python object is made per event or per span: the thread makes one call per batch, which reads
the log's committed events in Rust with the interpreter lock released, and one POST."""

from __future__ import annotations

import http.client
import logging
import os
import random
import threading
import time
import urllib.parse
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .. import __version__
from .._core import OtlpSpans

__all__ = ["OtlpSender", "resource_attributes", "native_spans", "endpoint_from_env", "headers_from_env", "DEFAULT_ENDPOINT"]

_logger = logging.getLogger("kerman")

#: Where OTLP/HTTP traces go when neither the arguments nor the environment say.
DEFAULT_ENDPOINT = "http://localhost:4318/v1/traces"
# The statuses the OTLP/HTTP specification calls retryable.
RETRYABLE = frozenset({429, 502, 503, 504})


def resource_attributes(resource: Any = None) -> List[Tuple[str, Any]]:
    """The resource's attributes as pairs: ``resource`` an SDK ``Resource``, a mapping (merged
    over ``Resource.create()``'s), or ``None`` for ``Resource.create()`` (which reads
    ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``)."""
    from opentelemetry.sdk.resources import Resource

    if resource is None:
        return list(_default_resource())
    if isinstance(resource, Mapping):
        resource = Resource.create(dict(resource))
    elif not isinstance(resource, Resource):
        raise TypeError(f"resource must be an opentelemetry Resource, a mapping or None, got {resource!r}")
    return list(resource.attributes.items())


# The variables Resource.create() reads; with the process id, the key of its cached result.
_RESOURCE_VARIABLES = ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_EXPERIMENTAL_RESOURCE_DETECTORS")
_default: Tuple[Any, Tuple[Tuple[str, Any], ...]] = (None, ())


def _default_resource() -> Tuple[Tuple[str, Any], ...]:
    """``Resource.create()``'s attributes, computed once per process and environment: it runs
    its detectors on a thread pool of its own, which costs as much as the spans of several
    turns, and a live exporter is started for every session."""
    global _default
    from opentelemetry.sdk.resources import Resource

    key = (os.getpid(), *(os.environ.get(name) for name in _RESOURCE_VARIABLES))
    cached_key, attributes = _default
    if cached_key != key:
        attributes = tuple(Resource.create().attributes.items())
        _default = (key, attributes)
    return attributes


def native_spans(
    session: str,
    *,
    agent_name: str = "kerman",
    model: Optional[str] = None,
    provider: Optional[str] = None,
    latest: bool = False,
    resource: Any = None,
) -> OtlpSpans:
    """The core's span fold for ``session``, with the resource's attributes and the
    ``kerman.otel`` scope at Kerman's version."""
    return OtlpSpans(
        session,
        agent_name=agent_name,
        model=model,
        provider=provider,
        latest=latest,
        resource=resource_attributes(resource),
        scope_version=__version__,
    )


def endpoint_from_env() -> Optional[str]:
    """The traces endpoint the environment names: ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` as it
    is, else ``OTEL_EXPORTER_OTLP_ENDPOINT`` + ``/v1/traces`` (``None``: neither is set)."""
    traces = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if traces:
        return traces
    base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    return base.rstrip("/") + "/v1/traces" if base else None


def headers_from_env() -> Dict[str, str]:
    """``OTEL_EXPORTER_OTLP_TRACES_HEADERS`` (else ``OTEL_EXPORTER_OTLP_HEADERS``): ``k=v``
    pairs separated by commas, values percent-encoded."""
    text = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") or os.environ.get("OTEL_EXPORTER_OTLP_HEADERS") or ""
    headers: Dict[str, str] = {}
    for pair in text.split(","):
        key, sep, value = pair.partition("=")
        if sep and key.strip():
            headers[urllib.parse.unquote(key.strip())] = urllib.parse.unquote(value.strip())
    return headers


class OtlpSender:
    """Posts OTLP protobuf bodies to ``endpoint`` (``Content-Type: application/x-protobuf``)
    over one kept-alive connection, retrying a 429, 502, 503 or 504 (and a connection that
    failed) with exponential backoff and jitter, honouring ``Retry-After``, until ``timeout``
    seconds have passed since the first attempt. ``__call__`` raises when the body was not
    accepted; ``stop()`` ends a wait. Used from one thread at a time."""

    def __init__(self, endpoint: str, headers: Optional[Mapping[str, str]] = None, timeout: float = 10.0) -> None:
        url = urllib.parse.urlsplit(endpoint)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"endpoint must be an http:// or https:// URL, got {endpoint!r}")
        if not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.endpoint = endpoint
        self.headers = {"Content-Type": "application/x-protobuf", **dict(headers or {})}
        self.timeout = timeout
        self.sent = 0
        self._url = url
        self._path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        self._connection: Optional[http.client.HTTPConnection] = None
        self._stopped = threading.Event()

    def stop(self) -> None:
        self._stopped.set()

    def _post(self, body: bytes, timeout: float) -> Tuple[int, Optional[str]]:
        connection = self._connection
        if connection is None:
            kind = http.client.HTTPSConnection if self._url.scheme == "https" else http.client.HTTPConnection
            connection = self._connection = kind(self._url.hostname or "", self._url.port, timeout=timeout)
        connection.timeout = timeout
        try:
            connection.request("POST", self._path, body, self.headers)
            response = connection.getresponse()
            response.read()
        except BaseException:
            self.close()
            raise
        if response.will_close:
            self.close()
        return response.status, response.getheader("Retry-After")

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()

    def __call__(self, body: bytes) -> None:
        deadline = time.monotonic() + self.timeout
        delay = 0.5
        while True:
            wait: Optional[float] = None
            try:
                status, after = self._post(body, max(deadline - time.monotonic(), 0.001))
            except (OSError, http.client.HTTPException) as e:
                error: Exception = e
            else:
                if 200 <= status < 300:
                    self.sent += 1
                    return
                error = OSError(f"{self.endpoint} answered HTTP {status}")
                if status not in RETRYABLE:
                    raise error
                wait = _retry_after(after)
            if wait is None:
                wait = delay * random.uniform(0.8, 1.2)
            left = deadline - time.monotonic()
            if left <= 0 or self._stopped.wait(min(wait, left)):
                raise error
            delay = min(delay * 2, 8.0)

    def __repr__(self) -> str:
        return f"OtlpSender({self.endpoint!r}, timeout={self.timeout!r})"


def _retry_after(value: Optional[str]) -> Optional[float]:
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None  # an HTTP date: the backoff's own delay
