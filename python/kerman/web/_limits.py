"""What uvicorn leaves open, closed for ``kerman serve``: a deadline for a request's line and
headers, a cap on open connections, and the soft descriptor limit raised at start.

uvicorn closes an idle kept-alive connection (``timeout_keep_alive``) but starts no timer
before a request's headers are in, so a client that sends half a header holds its descriptor
forever; and it counts connections only once a request arrives. The protocol class below is
uvicorn's own (httptools when installed, else h11) with those two checks added.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from typing import Any, Optional

__all__ = ["ABORT", "guarded_protocol", "raise_descriptor_limit", "descriptor_limit"]

ABORT = "kerman.abort"  # the scope key of the connection's abort(), under this protocol

_BUSY = json.dumps(
    {"error": {"code": "too-many-connections", "message": "the server holds as many connections as it may; try again shortly"}}
).encode()
_REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
    b"retry-after: 1\r\ncontent-length: " + str(len(_BUSY)).encode() + b"\r\n\r\n" + _BUSY
)
_TOO_SLOW = b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"


def _base_protocol() -> type:
    # uvicorn's own choice: httptools when it is installed, h11 otherwise.
    if importlib.util.find_spec("httptools") is not None:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        return HttpToolsProtocol
    from uvicorn.protocols.http.h11_impl import H11Protocol

    return H11Protocol


def guarded_protocol(header_timeout: float, max_connections: int) -> type:
    """uvicorn's HTTP protocol class, closing a connection whose request line and headers are
    not all in ``header_timeout`` seconds after it opened (or after its previous response), and
    refusing (503, closed at once) a connection beyond ``max_connections``."""
    base: Any = _base_protocol()

    class Guarded(base):  # type: ignore[misc]
        _deadline: Optional[asyncio.TimerHandle] = None
        _refused = False
        _partial = False

        def connection_made(self, transport: Any) -> None:
            if len(self.server_state.connections) >= max_connections:
                self._refused = True
                transport.write(_REFUSED)
                transport.close()
                return
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Optional[Exception]) -> None:
            self._disarm()
            if not self._refused:
                super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            cycle = self.cycle
            self._partial = True
            super().data_received(data)
            if self.cycle is not cycle:  # a request's headers are in
                self._disarm()
                # how the app drops a reader it gave up (its send waits; a close would wait too)
                self.cycle.scope[ABORT] = self.transport.abort

        def on_response_complete(self) -> None:
            cycle = self.cycle
            super().on_response_complete()
            if self.cycle is cycle and not self.transport.is_closing():  # waiting for the next request
                self._partial = False
                self._arm()

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(header_timeout, self._too_slow, self.cycle)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _too_slow(self, cycle: Any) -> None:
            self._deadline = None
            if self.cycle is cycle and not self.transport.is_closing():
                if self._partial:
                    self.transport.write(_TOO_SLOW)
                self.transport.close()

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
    return Guarded


def descriptor_limit() -> Optional[int]:
    """The soft limit on open descriptors, or None where there is none to read."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on POSIX
        return None
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def raise_descriptor_limit() -> Optional[int]:
    """Raises the soft limit on open descriptors to the hard one (the usual soft default, 1024,
    is what a few hundred idle clients exhaust); returns the soft limit now in force."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on POSIX
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for target in (hard,) if hard != resource.RLIM_INFINITY else (1 << 20, 1 << 16):
        if soft != resource.RLIM_INFINITY and target > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                break
            except (ValueError, OSError):
                continue
    return descriptor_limit()
