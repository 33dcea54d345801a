"""Errors as the API answers them: ``{"error": {"code": ..., "message": ...}}``, never a traceback."""

from __future__ import annotations

from typing import Any, Dict

from starlette.responses import JSONResponse

JsonDict = Dict[str, Any]

__all__ = ["ApiError", "error_response"]


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
