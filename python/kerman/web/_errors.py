"""Errors as the API answers them: ``{"error": {"code": ..., "message": ...}}``, never a traceback."""

from __future__ import annotations

import re
from typing import Any, Dict, Sequence

from starlette.responses import JSONResponse

JsonDict = Dict[str, Any]

__all__ = ["ApiError", "error_response", "public"]

# an absolute path in a message (not a URL path: those follow a letter, a digit or a quote-less "/")
_PATH = re.compile(r"(?<![\w:/<>])/(?:[^\s'\"/]+/)*[^\s'\":,/]+")


class ApiError(Exception):
    """An answer other than success: HTTP ``status``, a stable ``code`` and a clear ``message``."""

    def __init__(self, status: int, code: str, message: str, headers: JsonDict | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers


def error_response(status: int, code: str, message: str, headers: JsonDict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


def public(message: str, roots: Sequence[str] = ()) -> str:
    """A library error's text as a client may see it: the server's paths left out (the store's
    directory becomes ``<store>``, any other absolute path ``<path>``)."""
    for root in sorted(roots, key=len, reverse=True):
        if root:
            message = message.replace(root.rstrip("/"), "<store>")
    return _PATH.sub("<path>", message)
