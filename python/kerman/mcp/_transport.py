"""How ``MCPServer`` reaches a server: the streamable HTTP target and its HTTP client, where a
stdio server's stderr goes, and how a broken connection is told from other failures."""

from __future__ import annotations

import subprocess
import sys
from typing import Any, Dict, Optional, Sequence

__all__ = ["HttpTarget", "OwnedHttp", "server_stderr", "describe", "is_broken"]


class HttpTarget:
    __slots__ = ("url", "headers", "auth")

    def __init__(self, url: str, headers: Dict[str, str], auth: Any) -> None:
        self.url = url
        self.headers = headers
        self.auth = auth


class OwnedHttp:
    """A streamable HTTP transport whose HTTP client is closed with it (the ``mcp`` package
    leaves a client it was given open)."""

    def __init__(self, http: Any, transport: Any) -> None:
        self._http = http
        self._transport = transport

    async def __aenter__(self) -> Any:
        await self._http.__aenter__()
        try:
            return await self._transport.__aenter__()
        except BaseException:
            await self._http.__aexit__(None, None, None)
            raise

    async def __aexit__(self, *exc: Any) -> Any:
        try:
            return await self._transport.__aexit__(*exc)
        finally:
            await self._http.__aexit__(None, None, None)


def _members(e: BaseException) -> Optional[Sequence[BaseException]]:
    """The exceptions of an exception group (anyio raises them; Python 3.10 has no builtin)."""
    members = getattr(e, "exceptions", None)
    return members if isinstance(members, (tuple, list)) else None


def server_stderr() -> Any:
    """Where a stdio server's stderr goes: this process's stderr when it is a file (in a
    notebook, or under ``contextlib.redirect_stderr``, ``sys.stderr`` is not: then the
    original one)."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            if stream is not None:
                stream.fileno()
                return stream
        except (AttributeError, OSError, ValueError):
            continue
    return subprocess.DEVNULL


def describe(e: BaseException) -> str:
    members = _members(e)
    if members:
        return "; ".join(describe(x) for x in members)
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def is_broken(e: BaseException) -> bool:
    import anyio

    kinds = (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream)
    members = _members(e)
    if members:
        return any(is_broken(x) for x in members)
    return isinstance(e, kinds)
