"""The ``kerman`` parser and ``main``: each command's arguments, and the dispatch to its handler."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Optional, Sequence

from .. import FORMAT_VERSION, __version__
from ..errors import (
    KermanError,
)
from . import _doubt, _otel, _usage
from ._common import _SECRETS, STORE_HELP, _describe_error, _err, _Exit, _out, _passwords, _shown, _shown_id, positive
from ._log import _cmd_fork, _cmd_inbox, _cmd_list, _cmd_repair, _cmd_show, _cmd_tail, _cmd_verify


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import main as demo_main

    return int(demo_main(args) or 0)


def _workers_command(name: str, args: argparse.Namespace) -> int:
    from . import _workers

    if name == "worker":
        return _workers.run_worker(args, _shown, _err)
    return _workers.run_sessions(args, _out, _err, _shown_id)


def _cmd_chat(args: argparse.Namespace) -> int:
    from .chat import ChatError, run

    try:
        return run(args)
    except ChatError as error:
        raise _Exit(2, f"kerman chat: {error}") from None


def _cmd_serve(args: argparse.Namespace) -> int:
    try:
        from ..web._serve import main as serve_main  # imports Starlette and uvicorn only when serving
    except ImportError as error:
        missing = (error.name or "").split(".")[0]
        if missing not in ("starlette", "sse_starlette", "uvicorn", "anyio"):
            raise
        raise _Exit(2, f"kerman: serve needs the web extra ({missing} is not installed): pip install 'kerman[web]'") from None
    return serve_main(args)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive, finite number of seconds: {text}")
    return value


def _add_serve(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = commands.add_parser(
        "serve",
        help="serve sessions over HTTP: SSE streams (AG-UI, Vercel AI SDK, kerman) and a web chat (needs kerman[web])",
        description="Serve a store's sessions over HTTP (docs/web.md).",
    )
    serve.add_argument("store", help=STORE_HELP)
    serve.add_argument(
        "--model",
        metavar="MODULE:FACTORY",
        help="what builds each session's model or AgentLoop (needed for a FileStore), e.g. kerman.models:EchoModel",
    )
    serve.add_argument(
        "--custom",
        metavar="MODULE:FUNCTION",
        help="the mapping of plugin event types to AG-UI CUSTOM events and Vercel data-* parts (default: every type as it is)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=_natural, default=8000, help="port (default 8000; 0 picks a free one)")
    serve.add_argument("--token", default=None, help="bearer token every request must carry (default: $KERMAN_TOKEN)")
    serve.add_argument(
        "--cors-origin", action="append", metavar="ORIGIN", help="allow browser calls from this origin (repeatable; none by default)"
    )
    serve.add_argument("--max-body", type=_natural, default=64 * 1024, metavar="BYTES", help="largest request body (default 65536)")
    serve.add_argument(
        "--heartbeat", type=float, default=15.0, metavar="SECONDS", help="seconds between heartbeats on an idle stream (default 15)"
    )
    serve.add_argument(
        "--allow-host",
        action="append",
        metavar="NAME",
        help="a host name this server answers to besides IP addresses and localhost (repeatable; requests naming another host are refused)",
    )
    serve.add_argument(
        "--header-timeout",
        type=_seconds,
        default=10.0,
        metavar="SECONDS",
        help="close a connection whose request headers are not all in by then (default 10)",
    )
    serve.add_argument(
        "--body-timeout",
        type=_seconds,
        default=30.0,
        metavar="SECONDS",
        help="answer 408 to a request whose body is not all in by then (default 30)",
    )
    serve.add_argument(
        "--max-connections",
        type=positive,
        default=None,
        metavar="N",
        help="open connections at most; more are refused (default 1000, fewer when descriptors are scarce)",
    )
    serve.add_argument(
        "--max-streams", type=positive, default=128, metavar="N", help="event streams one client address may hold open (default 128)"
    )
    serve.add_argument(
        "--idle-session",
        type=_seconds,
        default=300.0,
        metavar="SECONDS",
        help="close a session nobody used for this long; it reopens on the next request (default 300)",
    )
    serve.add_argument(
        "--max-sessions",
        type=positive,
        default=256,
        metavar="N",
        help="sessions held open at most; the least recently used idle one is closed first (default 256)",
    )
    serve.add_argument(
        "--log-level",
        default="warning",
        choices=("critical", "error", "warning", "info", "debug"),
        help="uvicorn's log level (default warning)",
    )
    serve.set_defaults(handler=_cmd_serve)


# -- parser ------------------------------------------------------------------------------------


def _natural(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more: {value}")
    return value


def _allow_damaged(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--allow-damaged",
        action="store_true",
        help="read a corrupt session file as far as its records verify, naming what is skipped on stderr (nothing is written)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kerman", description="Inspect Kerman session logs, chat with a model, run the demo.")
    parser.add_argument("--version", action="version", version=f"kerman {__version__} (session log format {FORMAT_VERSION})")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = commands.add_parser("demo", help="run the showcase: a scripted session in a fresh folder")
    demo.add_argument("--dir", metavar="PATH", default=None, help="folder to put the demo session in (default: a fresh temporary folder)")
    demo.set_defaults(handler=_cmd_demo)
    _add_serve(commands)

    from .chat import add_arguments as chat_arguments

    chat = commands.add_parser(
        "chat",
        help="chat with a model in the terminal, on a durable session (typing while it works steers it)",
        description="Chat with a model in the terminal on a durable file session. "
        "What you type while the agent works steers it; /help lists the commands.",
    )
    chat_arguments(chat)
    chat.set_defaults(handler=_cmd_chat)

    from ._workers import add_sessions_arguments, add_worker_arguments

    worker = commands.add_parser(
        "worker",
        help="serve the sessions of a PostgreSQL store (kerman.Worker)",
        description="Take sessions with waiting input and no live owner, run their AgentLoops, release them when idle; SIGTERM drains.",
    )
    add_worker_arguments(worker)
    worker.set_defaults(handler=lambda a: _workers_command("worker", a))
    sessions = commands.add_parser(
        "sessions",
        help="who owns which session of a PostgreSQL store; unpark",
        description="The sessions of a PostgreSQL store: owner, since when, lease expiry, staged input, parked (default command: list).",
    )
    add_sessions_arguments(sessions)
    sessions.set_defaults(handler=lambda a: _workers_command("sessions", a))

    log = commands.add_parser("log", help="inspect session logs (a FileStore folder or a PostgreSQL DSN), repair session files")
    log_commands = log.add_subparsers(dest="log_command", metavar="COMMAND", required=True)

    def session_command(
        name: str, help_text: str, handler: Callable[[argparse.Namespace], int], json_help: Optional[str], store_help: str = STORE_HELP
    ) -> argparse.ArgumentParser:
        sub = log_commands.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("store", help=store_help)
        sub.add_argument("id", help="the session id")
        if json_help:
            sub.add_argument("--json", action="store_true", help=json_help)
        sub.set_defaults(handler=handler)
        return sub

    listing = log_commands.add_parser("list", help="list the sessions in a store", description="list the sessions in a store")
    listing.add_argument("store", help=STORE_HELP)
    listing.add_argument("--json", action="store_true", help="print a JSON list of objects")
    listing.set_defaults(handler=_cmd_list)

    for name, help_text, handler in (
        ("show", "print a session's timeline", _cmd_show),
        ("tail", "print a session's last events", _cmd_tail),
    ):
        sub = session_command(name, help_text, handler, "one compact JSON event per line, exactly as stored")
        sub.add_argument(
            "--types", nargs="+", action="extend", metavar="TYPE", help="only these event types (glob patterns such as 'turn/*' allowed)"
        )
        sub.add_argument("--relative", action="store_true", help="times in seconds since the first event shown")
        _allow_damaged(sub)
        if name == "show":
            sub.add_argument("--from", dest="start", type=_natural, default=0, metavar="SEQ", help="start at this seq")
        else:
            sub.add_argument("-n", type=_natural, default=20, metavar="N", help="how many events (default 20)")
            sub.add_argument(
                "-f", "--follow", action="store_true", help="then print each new event as it is committed, until interrupted (Ctrl-C)"
            )

    _allow_damaged(
        session_command("inbox", "print the pending inbox rebuilt from the log", _cmd_inbox, "print a JSON list of {placement, message}")
    )
    _doubt.add_parsers(log_commands)
    fork = session_command(
        "fork",
        "make a new session whose events up to seq AT are this session's; print its id",
        _cmd_fork,
        None,
    )
    fork.add_argument("at", type=_natural, metavar="AT", help="the last seq the new session inherits")
    fork.add_argument("--id", dest="new_id", default=None, metavar="NEW", help="the new session's id (default: a fresh UUIDv7)")
    fork.add_argument(
        "--inbox",
        choices=("inherit", "drop"),
        default="inherit",
        help="the queue at the cut: keep it (default) or start empty (one logged splice clears it)",
    )
    session_command(
        "verify",
        "check every record without modifying the file",
        _cmd_verify,
        "print the result as a JSON object",
        "the session store folder",
    )
    repair = session_command(
        "repair",
        "cut off a torn tail, or repair a corrupt file keeping every record that verifies",
        _cmd_repair,
        None,
        "the session store folder",
    )
    repair.add_argument("--yes", action="store_true", help="repair without asking")
    _usage.add_parser(log_commands, STORE_HELP)
    _otel.add_parser(log_commands, STORE_HELP)
    return parser


def _quiet_stdout() -> None:
    """After a closed pipe: point stdout at /dev/null so the exit-time flush stays silent."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    except OSError:
        pass


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the command line; returns the exit status."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(errors="backslashreplace")
            except (ValueError, OSError):
                pass
    try:
        try:
            args = _parser().parse_args(argv)
        except SystemExit as stop:  # --help, --version, usage errors: argparse has printed them
            return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 2)
        _SECRETS[:] = _passwords(getattr(args, "store", None) or "")
        try:
            code = int(args.handler(args))
        except _Exit as stop:
            code = stop.code
            if stop.message:
                _err(stop.message)
        except KermanError as error:
            code = 1
            _err(_describe_error(error, args))
        except OSError as error:
            if isinstance(error, BrokenPipeError):
                raise
            code = 1
            _err(f"kerman: {error}")
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        _quiet_stdout()
        return 141
    except KeyboardInterrupt:
        return 130
