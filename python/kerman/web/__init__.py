"""``kerman.web``: an ASGI app over a store, for UIs (extra ``kerman[web]``: Starlette, uvicorn,
sse-starlette).

``create_app(store, model)`` gives the app; ``kerman serve STORE --model module:factory`` runs it
with uvicorn. Routes, protocols, resuming and security are described in docs/web.md.
"""

from __future__ import annotations

try:
    from ._app import create_app
except ImportError as error:  # pragma: no cover - depends on the installed extras
    if error.name in ("starlette", "sse_starlette") or (error.name or "").startswith(("starlette.", "sse_starlette.")):
        raise ImportError(f"kerman.web needs the web extra (pip install 'kerman[web]'): {error}", name=error.name) from error
    raise

__all__ = ["create_app"]
