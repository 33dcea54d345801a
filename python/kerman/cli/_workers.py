"""``kerman worker`` and ``kerman sessions``: run a ``kerman.Worker`` from the command line, and
see (or unpark) the sessions of a PostgreSQL store. Registered by ``cli.py``; docs/cli.md."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import signal
import time
from typing import Any, Callable, Coroutine, Dict, List, Optional

from .._core import PostgresStore
from .._imports import load_object
from ..errors import SessionNotFoundError
from ._common import positive as _positive


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds >= 0, got {text!r}")
    return value


LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _log_level(text: str) -> int:
    """A logging level by name (any case): what the worker's log lines go out at least at."""
    if text.lower() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(LOG_LEVELS)}, got {text!r}")
    level: int = getattr(logging, text.upper())
    return level


def _pool_size(text: str) -> int:
    # The store's own bounds (PostgresStore(pool_size=...)), checked here so the error is a
    # usage error naming the flag.
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 64:
        raise argparse.ArgumentTypeError(f"expected a whole number from 1 to 64, got {text!r}")
    return value


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    """The store's connection options (docs/postgres.md, "Connections and PgBouncer")."""
    parser.add_argument(
        "--pool-size",
        type=_pool_size,
        default=4,
        metavar="N",
        help="connections the store may open for its requests, besides the LISTEN one (default 4)",
    )
    parser.add_argument(
        "--no-prepared-statements",
        dest="prepared_statements",
        action="store_false",
        help="send every statement unnamed: for a DSN that goes through PgBouncer's transaction pooling",
    )
    parser.add_argument(
        "--listen-dsn",
        default=None,
        metavar="DSN",
        help="a direct (or session-pooled) DSN for the LISTEN connection, when DSN goes through transaction pooling",
    )


def open_store(args: argparse.Namespace, **options: Any) -> PostgresStore:
    """The ``PostgresStore`` the flags of :func:`add_connection_arguments` describe."""
    return PostgresStore(
        args.store, pool_size=args.pool_size, prepared_statements=args.prepared_statements, listen_dsn=args.listen_dsn, **options
    )


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("store", metavar="DSN", help="the PostgreSQL store's DSN (postgresql://…)")
    add_connection_arguments(parser)
    parser.add_argument(
        "--app",
        required=True,
        metavar="MODULE:FACTORY",
        help="the factory building a session's AgentLoop: factory(log) -> AgentLoop, "
        "imported from MODULE (the current folder is on the path)",
    )
    parser.add_argument("--max-sessions", type=_positive, default=1000, metavar="N", help="sessions held at once (default 1000)")
    parser.add_argument(
        "--idle-timeout",
        type=_seconds,
        default=30.0,
        metavar="S",
        help="seconds an idle session is kept for more input before it is let go (default 30)",
    )
    parser.add_argument(
        "--lease-ttl",
        type=_seconds,
        default=30.0,
        metavar="S",
        help="seconds a lease lasts unrenewed: how soon a dead worker's sessions are taken over (default 30)",
    )
    parser.add_argument(
        "--grace",
        type=_seconds,
        default=30.0,
        metavar="S",
        help="on SIGTERM, seconds running turns may take to finish before they are cancelled (default 30)",
    )
    parser.add_argument(
        "--max-failures", type=_positive, default=3, metavar="N", help="park a session after this many consecutive failed turns (default 3)"
    )
    parser.add_argument("--name", default=None, help="the worker's name in `kerman sessions` (default host:pid)")
    parser.add_argument(
        "--log-level",
        type=_log_level,
        default=logging.INFO,
        metavar="LEVEL",
        help="the least level logged to stderr: debug, info (default: takeovers and calls in doubt), warning, error, critical",
    )
    parser.add_argument(
        "--event-loop",
        choices=("auto", "asyncio", "uvloop"),
        default="auto",
        help="the asyncio event loop: uvloop (needs the uvloop package), asyncio's own, or auto: uvloop if it is installed (default)",
    )


def event_loop_runner(choice: str) -> Callable[[Coroutine[Any, Any, None]], None]:
    """What runs the worker's coroutine: ``asyncio.run``, or ``uvloop.run`` (the same on uvloop's
    event loop, which costs the worker less CPU per turn: docs/distributed.md, "Workers,
    measured"). uvloop is optional: ``auto`` uses it when it is installed."""
    if choice == "asyncio":
        return asyncio.run
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ValueError("--event-loop uvloop: the uvloop package is not installed (pip install uvloop)") from None
        return asyncio.run
    run: Callable[[Coroutine[Any, Any, None]], None] = uvloop.run
    return run


def load_factory(spec: str) -> Callable[..., Any]:
    """``module:attr`` (``attr`` may be dotted) from the current folder or the path."""
    target = load_object(spec, "--app")
    if not callable(target):
        raise ValueError(f"--app {spec!r} is not callable (it must be factory(log) -> AgentLoop)")
    factory: Callable[..., Any] = target
    return factory


def _on_stop_signals(loop: asyncio.AbstractEventLoop, stop: Callable[[], None]) -> None:
    """SIGTERM and SIGINT call ``stop`` on the event loop. Where the loop cannot watch signals
    (Windows), Python's handler hands them to it instead (Ctrl-C; Windows sends no SIGTERM)."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop)
        except NotImplementedError:
            signal.signal(sig, lambda *_: loop.call_soon_threadsafe(stop))


def run_worker(args: argparse.Namespace, shown: Callable[[str], str], err: Callable[[str], None]) -> int:
    from ..worker import Worker

    try:
        factory = load_factory(args.app)
        run = event_loop_runner(args.event_loop)
    except (ImportError, ValueError) as e:
        err(f"kerman: {e}")
        return 2
    if not logging.getLogger().handlers:
        logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("kerman").setLevel(args.log_level)
    store = open_store(args, lease_ttl=args.lease_ttl)
    worker = Worker(
        store,
        factory,
        max_sessions=args.max_sessions,
        idle_timeout=args.idle_timeout,
        grace=args.grace,
        max_failures=args.max_failures,
        name=args.name,
    )

    # What exists now (modules, the app and its imports) lives as long as the process: out of
    # the collector's sight, each full collection, which pauses every session, has less to scan.
    gc.collect()
    gc.freeze()

    async def main() -> None:
        _on_stop_signals(asyncio.get_running_loop(), worker.stop)
        err(f"kerman worker {worker.name}: serving {shown(args.store)} (up to {args.max_sessions} sessions); SIGTERM drains")
        await worker.run()

    run(main())
    err(
        f"kerman worker {worker.name}: stopped; {worker.stats['taken']} taken, {worker.stats['released']} "
        f"released, {worker.stats['parked']} parked"
    )
    return 0


# -- kerman sessions -------------------------------------------------------------------------------


def add_sessions_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("store", metavar="DSN", help="the PostgreSQL store's DSN (postgresql://…)")
    add_connection_arguments(parser)
    actions = parser.add_subparsers(dest="sessions_command", metavar="COMMAND")
    listing = actions.add_parser("list", help="every session: owner, since when, lease expiry, staged input, status")
    listing.add_argument("--json", action="store_true", help="print a JSON list of objects")
    listing.add_argument("--parked", action="store_true", help="only parked sessions")
    listing.add_argument(
        "--attention",
        action="store_true",
        help="only sessions with interrupted or in-doubt work (the last turn interrupted, or left open with no live owner; "
        "parked ones too), with the number of calls in doubt of each",
    )
    show = actions.add_parser("show", help="one session's owner, lease, staged input and status")
    show.add_argument("id", help="the session id")
    show.add_argument("--json", action="store_true", help="print a JSON object")
    unpark = actions.add_parser("unpark", help="make a parked session active again (a worker takes it for its pending input)")
    unpark.add_argument("id", help="the session id")


def _ago(now: float, at: Optional[float]) -> str:
    if at is None:
        return "—"
    seconds = now - at
    return (
        f"{seconds:.0f}s ago"
        if seconds < 120
        else (f"{seconds / 60:.0f}m ago" if seconds < 7200 else time.strftime("%Y-%m-%d %H:%M", time.localtime(at)))
    )


def _expiry(now: float, at: Optional[float]) -> str:
    if at is None:
        return "—"
    left = at - now
    return f"in {left:.1f}s" if left >= 0 else f"expired {-left:.1f}s ago"


def _owner(row: Dict[str, Any]) -> str:
    if row["owner"] is None:
        return "—"
    return str(row["owner_name"] or row["owner"])


def _state(row: Dict[str, Any]) -> str:
    if row["status"] == "parked":
        return "parked"
    if row["owner"] is None:
        return "waiting" if row["staged"] or row["runnable"] else "free"
    return "owned" if row["expires_at"] is None or row["expires_at"] >= row["now"] else "expired"


def session_rows(store: PostgresStore) -> List[Dict[str, Any]]:
    """``store.sessions()`` with the derived ``state``: free, waiting (input, no owner), owned,
    expired (its owner stopped renewing: dead or stalled), parked."""
    rows: List[Dict[str, Any]] = store.sessions()
    for row in rows:
        row["state"] = _state(row)
    return rows


def _ending(row: Dict[str, Any]) -> str:
    """How the last turn ended; an open one with no live owner was interrupted (its next owner
    closes or resumes it)."""
    ending = row.get("last_ending")
    if ending is None:
        return "—"
    if ending == "open":
        return "running" if row["state"] == "owned" else "open (interrupted)"
    return str(ending)


def _may_need_attention(row: Dict[str, Any]) -> bool:
    """A turn that ended interrupted or is open with no live owner, or a parked session."""
    ending = row.get("last_ending")
    return row["status"] == "parked" or ending == "interrupted" or (ending == "open" and row["state"] != "owned")


def _with_doubt(store: PostgresStore, rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """``in_doubt`` for each row: the calls of its last turn with no result or an unknown
    outcome. Read by a follower (the whole log), so only for the rows that may need attention
    and only when asked (``show``, ``--attention``)."""
    from .._doubt import outcome_unknown, unanswered

    for row in rows:
        row["in_doubt"] = 0
        if not _may_need_attention(row):
            continue
        try:
            log = store.follow(row["id"])
        except SessionNotFoundError:
            continue
        try:
            starts = [e.seq for e in log.events(types="turn/start")]
            events = list(log.events(start=starts[-1])) if starts else []
        finally:
            log.close()
        row["in_doubt"] = len(unanswered(events)) + len(outcome_unknown(events))
    return rows


def run_sessions(args: argparse.Namespace, out: Callable[[str], None], err: Callable[[str], None], shown_id: Callable[[str], str]) -> int:
    store = open_store(args)
    command = args.sessions_command or "list"
    if command == "unpark":
        if store.unpark(args.id):
            out(f"unparked {shown_id(args.id)}")
            return 0
        err(f"kerman: session {shown_id(args.id)} is not parked")
        return 1
    if command == "show":
        try:
            (row,) = store.sessions(args.id)
        except SessionNotFoundError:
            err(f"kerman: no session {shown_id(args.id)}")
            return 1
        row["state"] = _state(row)
        _with_doubt(store, [row])
        if args.json:
            out(json.dumps(row, ensure_ascii=False, separators=(",", ":")))
            return 0
        now = row["now"]
        lines = [
            ("id", shown_id(row["id"])),
            ("state", row["state"]),
            ("owner", _owner(row)),
            ("owner id", row["owner"] or "—"),
            ("epoch", str(row["epoch"])),
            ("owned since", _ago(now, row["owned_since"])),
            ("lease expires", _expiry(now, row["expires_at"])),
            ("staged input", str(row["staged"])),
            ("runnable", "yes" if row["runnable"] else "no"),
            ("events", str(row["events"])),
            ("last ending", _ending(row)),
            ("in doubt", str(row["in_doubt"])),
        ]
        if row["status"] == "parked":
            lines.append(("parked because", row["status_detail"] or "—"))
        for key, value in lines:
            out(f"{key + ':':<16}{value}")
        return 0
    rows = session_rows(store)
    if getattr(args, "parked", False):
        rows = [r for r in rows if r["status"] == "parked"]
    attention = getattr(args, "attention", False)
    if attention:
        rows = _with_doubt(store, [r for r in rows if _may_need_attention(r)])
    if getattr(args, "json", False):
        out(json.dumps(rows, ensure_ascii=False, separators=(",", ":")))
        return 0
    if not rows:
        err("kerman: no sessions")
        return 0
    width = max(len("SESSION"), *(len(shown_id(r["id"])) for r in rows))
    owner_width = max(len("OWNER"), *(len(_owner(r)) for r in rows))
    ending_width = max(len("LAST ENDING"), *(len(_ending(r)) for r in rows))
    out(
        f"{'SESSION':<{width}}  {'STATE':<8}  {'OWNER':<{owner_width}}  {'SINCE':>9}  {'LEASE':>18}  {'STAGED':>6}  {'EVENTS':>7}  "
        f"{'LAST ENDING':<{ending_width}}" + (f"  {'IN DOUBT':>8}" if attention else "")
    )
    for r in rows:
        now = r["now"]
        since = _ago(now, r["owned_since"]) if r["owner"] else "—"
        line = (
            f"{shown_id(r['id']):<{width}}  {r['state']:<8}  {_owner(r):<{owner_width}}  {since:>9}  "
            f"{_expiry(now, r['expires_at']):>18}  {r['staged']:>6}  {r['events']:>7}  {_ending(r):<{ending_width}}"
        )
        if attention:
            line += f"  {r['in_doubt']:>8}"
        if r["status"] == "parked" and r["status_detail"]:
            line += f"  ({r['status_detail']})"
        out(line)
    counts: Dict[str, int] = {}
    for r in rows:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    err("kerman: " + ", ".join(f"{n} {state}" for state, n in sorted(counts.items())))
    return 0
