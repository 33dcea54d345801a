"""``kerman serve``: the app on uvicorn, bound to loopback unless told otherwise."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from typing import Any, Callable, Optional

from .._imports import load_object
from ._limits import guarded_protocol, raise_descriptor_limit

__all__ = ["main", "load_factory"]


class UsageError(Exception):
    """A bad command line: exit 2 with this message."""


def load_factory(spec: str) -> Callable[..., Any]:
    """``module:attribute`` (dots allowed in both) → the callable it names."""
    try:
        value = load_object(spec, "--model")
    except ValueError as error:
        raise UsageError(str(error)) from None
    if not callable(value):
        raise UsageError(f"--model {spec!r} is not callable")
    factory: Callable[..., Any] = value
    return factory


def _load_custom(spec: str) -> Callable[..., Any]:
    """``--custom module:function``: the custom-event mapping of the UI streams."""
    try:
        value = load_object(spec, "--custom")
    except ValueError as error:
        raise UsageError(str(error)) from None
    if not callable(value):
        raise UsageError(f"--custom {spec!r} is not callable")
    mapping: Callable[..., Any] = value
    return mapping


def _store(spec: str) -> Any:
    import kerman

    if spec.startswith(("postgresql://", "postgres://")):
        return kerman.PostgresStore(spec)
    return kerman.FileStore(spec)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def _check_token(token: str) -> None:
    """Tokens are printable ASCII without spaces: what a header, a cookie digest and a pasted URL
    all carry the same way (hex, base64 and base64url all fit)."""
    bad = [c for c in token if not ("!" <= c <= "~")]
    if bad:
        raise UsageError(f"--token may hold printable ASCII characters other than space only, not {bad[0]!r}")


def _connections(wanted: Optional[int], descriptors: Optional[int], sessions: int) -> int:
    """The connection cap: ``wanted``, or 1000 when fewer descriptors leave room for it (each
    connection takes one, each open session of a file store one, and the process some)."""
    if wanted is not None:
        return wanted
    if descriptors is None:
        return 1000
    return max(16, min(1000, descriptors - sessions - 64))


def _loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def main(args: argparse.Namespace) -> int:
    """Runs until interrupted (SIGINT/SIGTERM); returns the exit status."""
    try:
        import uvicorn

        from . import create_app
    except ImportError as error:
        missing = (error.name or "").split(".")[0] or "a module"
        sys.stderr.write(f"kerman: serve needs the web extra ({missing} is not installed): pip install 'kerman[web]'\n")
        return 2
    token: Optional[str] = args.token or os.environ.get("KERMAN_TOKEN") or None
    try:
        factory = load_factory(args.model) if args.model else None
        custom = _load_custom(args.custom) if getattr(args, "custom", None) else None
        store = _store(args.store)
        if factory is None and not args.store.startswith(("postgresql://", "postgres://")):
            raise UsageError(
                "--model module:factory is needed: this server owns the sessions of a FileStore (e.g. --model kerman.models:EchoModel)"
            )
        if token is not None:
            _check_token(token)
        descriptors = raise_descriptor_limit()
        connections = _connections(args.max_connections, descriptors, args.max_sessions)
        app = create_app(
            store,
            factory,
            token=token,
            cors_origins=args.cors_origin or (),
            max_body=args.max_body,
            heartbeat=args.heartbeat,
            allowed_hosts=args.allow_host or (),
            body_timeout=args.body_timeout,
            max_streams=args.max_streams,
            idle_session=args.idle_session,
            max_sessions=args.max_sessions,
            custom=custom,
        )
        sock = _bind(args.host, args.port)
    except UsageError as error:
        sys.stderr.write(f"kerman: {error}\n")
        return 2
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    if not _loopback(args.host) and not token:
        sys.stderr.write(
            f"kerman: warning: listening on {args.host} without a token: anyone who can reach it can drive "
            "the sessions (set --token or KERMAN_TOKEN)\n"
        )
    if not _loopback(args.host) and not args.allow_host:
        sys.stderr.write(
            "kerman: note: requests are answered for IP addresses and localhost only; name the host names clients use with --allow-host\n"
        )
    sys.stderr.write(f"kerman: serving {args.store} on http://{shown}:{port}/\n")
    sys.stderr.flush()
    config = uvicorn.Config(
        app,
        log_level=args.log_level,
        lifespan="on",
        timeout_graceful_shutdown=5,
        access_log=False,
        http=guarded_protocol(args.header_timeout, connections),
    )
    server = uvicorn.Server(config)
    server.run(sockets=[sock])
    return 0
