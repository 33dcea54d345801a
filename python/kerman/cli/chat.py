"""``kerman chat``: a terminal chat with a real model, on a durable file session.

What you type while the agent works steers it: the line is queued as next-step input and the
model sees it at the next step boundary (after the running tool calls, or at once when the turn
has ended). ``/followup TEXT`` queues a prompt for a turn of its own instead. The queue is
printed whenever it changes; ``/queue`` lists it, ``/drop ID`` removes an entry, ``/cancel``
stops the running turn (keeping the queue), ``/quit`` (or Ctrl-D) leaves. Everything is in the
session file: ``kerman chat --session ID`` resumes it, ``kerman log show`` prints it. A tool
call that waits for a decision (``--approve``, or a tool with ``needs_approval``) is asked at
the prompt (``_chat_decide``).

The output is read from the log itself (``log.tail()``), so what the terminal shows is what was
recorded, in the order it was recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import json
import logging
import os
import signal
import stat
import sys
import threading
from pathlib import Path
from typing import Any, Awaitable, Callable, Dict, Iterator, List, Optional, TextIO, Tuple

from .. import AgentLoop, FileStore, SessionLog
from .._imports import load_object
from ..errors import KermanError, SessionNotFoundError
from ..hooks import LiveEvent, Model
from ._chat_decide import ask_every_call
from ._chat_screen import Chat, _clean

__all__ = ["PROVIDERS", "add_arguments", "load_model", "run"]

#: ``--provider`` names and the classes of :mod:`kerman.providers` they build.
PROVIDERS = {
    "openai": "OpenAIChat",
    "openai-responses": "OpenAIResponses",
    "anthropic": "Anthropic",
    "gemini": "Gemini",
}

# The variables each SDK reads its key from; with --base-url and none of them set, a placeholder
# key is sent (local servers ignore it; one that checks answers 401, shown as the turn's error).
_KEY_VARS = {
    "openai": ("OPENAI_API_KEY",),
    "openai-responses": ("OPENAI_API_KEY",),
    "anthropic": ("ANTHROPIC_API_KEY",),
    "gemini": ("GEMINI_API_KEY", "GOOGLE_API_KEY"),
}
LOCAL_KEY = "kerman-local"


class ChatError(Exception):
    """A chat that cannot start: one line for the user (bad flags, a missing SDK or key)."""


def default_store() -> Path:
    """``$KERMAN_CHAT_DIR``, else ``$XDG_DATA_HOME/kerman/chat`` (``~/.local/share/kerman/chat``)."""
    if os.environ.get("KERMAN_CHAT_DIR"):
        return Path(os.environ["KERMAN_CHAT_DIR"])
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "kerman" / "chat"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``kerman chat``."""
    parser.add_argument(
        "--model",
        required=True,
        metavar="NAME|MODULE:FACTORY",
        help="the provider's model name (gpt-6.2-sol, claude-sonnet-5-5, gemini-3.8-flash, ...), or "
        "MODULE:FACTORY, a function returning any Kerman model (an importable module, or "
        "a .py file path); with --provider or --base-url, always a model name",
    )
    parser.add_argument(
        "--provider", choices=sorted(PROVIDERS), default=None, help="the wire protocol (default: openai); not used with MODULE:FACTORY"
    )
    parser.add_argument(
        "--base-url",
        metavar="URL",
        default=None,
        help="the server's base URL, for OpenAI-compatible servers (vLLM, Ollama, LM Studio...) and proxies",
    )
    parser.add_argument(
        "--api-key-env",
        metavar="VAR",
        default=None,
        help="read the API key from this environment variable (default: the SDK's own, e.g. OPENAI_API_KEY)",
    )
    parser.add_argument(
        "--session", metavar="ID", default=None, help="resume this session (or start one with this id); default: a new session"
    )
    parser.add_argument(
        "--store", metavar="PATH", default=None, help=f"the FileStore folder (default: $KERMAN_CHAT_DIR or {default_store()})"
    )
    parser.add_argument("--instructions", metavar="TEXT", default=None, help="the system prompt")
    parser.add_argument(
        "--tool",
        dest="tools",
        action="append",
        default=[],
        metavar="MODULE:FUNCTION",
        help="register a tool (a typed function, a kerman.Tool, or a kerman.mcp.MCPServer: its tools); repeatable",
    )
    parser.add_argument(
        "--approve",
        action="store_true",
        help="ask before every tool call runs: approve, deny or edit its arguments at the prompt "
        "(a kerman.Tool with needs_approval asks without it)",
    )
    parser.add_argument(
        "-o",
        "--option",
        dest="options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a request option, VALUE as JSON when it parses (-o temperature=0.2); repeatable",
    )
    parser.add_argument("--no-stream", action="store_true", help="ask for whole replies instead of a stream")
    parser.add_argument(
        "--usage", action="store_true", help="after each turn, show its tokens and cost (kerman.usage; prices need kerman[prices])"
    )
    parser.add_argument(
        "--no-retry", action="store_true", help="fail a turn at the first request error (default: kerman.providers.retry_policy())"
    )


# -- building the model and the tools ----------------------------------------------------------


def _import(spec: str, what: str) -> Any:
    """``module:attr`` (or ``path/to/file.py:attr``) → the attribute."""
    try:
        return load_object(spec, what)
    except ValueError as error:
        raise ChatError(str(error)) from None


def _is_factory(spec: str) -> bool:
    """``pkg.module:name`` or ``path/file.py:name``, not a model name such as ``qwen3:8b``."""
    module, sep, attr = spec.rpartition(":")
    if not sep or not attr.isidentifier():
        return False
    return module.endswith(".py") or all(part.isidentifier() for part in module.split("."))


def load_model(args: argparse.Namespace) -> Any:
    """The model ``--model``/``--provider`` name: a provider instance, or a factory's result."""
    spec = args.model
    if args.provider is None and args.base_url is None and _is_factory(spec):
        factory = _import(spec, "--model")
        if not callable(factory):
            raise ChatError(f"--model {spec!r} is not callable")
        try:
            model = factory()
        except Exception as error:
            raise ChatError(f"--model {spec!r} raised {type(error).__name__}: {_clean(str(error))}") from error
        if not callable(model):
            raise ChatError(f"--model {spec!r} returned {type(model).__name__}, not a model (a callable)")
        return model
    from .. import providers

    provider = args.provider or "openai"
    cls = getattr(providers, PROVIDERS[provider])
    kwargs: Dict[str, Any] = {}
    if args.base_url:
        kwargs["base_url"] = args.base_url
        if not args.api_key_env and not any(os.environ.get(v) for v in _KEY_VARS[provider]):
            kwargs["api_key"] = LOCAL_KEY
    if args.api_key_env:
        key = os.environ.get(args.api_key_env)
        if not key:
            raise ChatError(f"--api-key-env {args.api_key_env}: that environment variable is not set")
        kwargs["api_key"] = key
    if args.no_stream:
        kwargs["stream"] = False
    try:
        return cls(spec, **kwargs)
    except ImportError as error:  # the vendor's SDK is an extra
        raise ChatError(str(error)) from error
    except Exception as error:  # e.g. the SDK refusing to start without a key
        raise ChatError(f"cannot build {cls.__name__}({spec!r}): {_clean(str(error))}") from error


def _options(pairs: List[str]) -> Dict[str, Any]:
    options: Dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ChatError(f"--option must be KEY=VALUE, got {pair!r}")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    return options


def _open(args: argparse.Namespace) -> Tuple[FileStore, SessionLog, bool]:
    """The session: opened when it exists (resumed), created otherwise."""
    root = Path(args.store) if args.store else default_store()
    root.mkdir(parents=True, exist_ok=True)
    store = FileStore(root)
    if args.session is not None and store.exists(args.session):
        return store, store.open(args.session), True
    return store, store.create(args.session), False


# -- reading the terminal without blocking the event loop ----------------------------------------


@contextlib.asynccontextmanager
async def _lines(stream: TextIO) -> Any:
    """An ``asyncio.Queue`` of typed lines (``None`` at end of input).

    A pipe, socket or terminal is read by the event loop itself; anything else (a regular
    file, ``/dev/null``: descriptors epoll refuses) by a daemon thread, which never keeps the
    process alive at exit.
    """
    queue: asyncio.Queue[Optional[str]] = asyncio.Queue()
    event_loop = asyncio.get_running_loop()
    transport = None
    task = None
    fd = flags = None
    try:
        import fcntl

        fd = stream.fileno()
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(fd)):
            raise OSError("not a pipe, socket or terminal")
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        # A duplicate descriptor: closing the transport must not close the caller's stdin.
        pipe = os.fdopen(os.dup(fd), "rb", buffering=0)
        reader = asyncio.StreamReader()
        try:
            transport, _ = await event_loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
        except BaseException:
            pipe.close()
            raise

        async def pump() -> None:
            while True:
                raw = await reader.readline()
                if not raw:
                    await queue.put(None)
                    return
                await queue.put(raw.decode("utf-8", "replace"))

        task = event_loop.create_task(pump())
    except (ImportError, ValueError, OSError, NotImplementedError, AttributeError):
        flags = None

        def read() -> None:
            for line in iter(stream.readline, ""):
                event_loop.call_soon_threadsafe(queue.put_nowait, line)
            event_loop.call_soon_threadsafe(queue.put_nowait, None)

        threading.Thread(target=read, name="kerman-chat-stdin", daemon=True).start()
    try:
        yield queue
    finally:
        if task is not None:
            task.cancel()
        if transport is not None:
            transport.close()
        if flags is not None and fd is not None:
            # The pipe transport made the terminal non-blocking; the shell gets it back as it was.
            with contextlib.suppress(OSError):
                import fcntl

                fcntl.fcntl(fd, fcntl.F_SETFL, flags)


# -- the command --------------------------------------------------------------------------------


async def _chat(args: argparse.Namespace, stdin: TextIO, out: TextIO) -> int:
    options = _options(args.options)
    model = load_model(args)
    try:
        await _session(args, model, options, stdin, out)
    finally:
        closer = getattr(model, "aclose", None)
        if closer is not None and inspect.iscoroutinefunction(closer):
            await closer()
    return 0


async def _session(args: argparse.Namespace, model: Model, options: Dict[str, Any], stdin: TextIO, out: TextIO) -> None:
    store, log, resumed = _open(args)
    with _log_to_file(store.root / "chat.log"):
        try:
            await _converse(args, model, options, store, log, resumed, stdin, out)
        finally:
            await log.aclose()


@contextlib.contextmanager
def _log_to_file(path: Path) -> Iterator[None]:
    """Kerman's log records (a failed turn's traceback, say) go to ``path``, not the screen: the
    chat shows each failure once, as a line, from the session log."""
    logger = logging.getLogger("kerman")
    handler = logging.FileHandler(path, encoding="utf-8", delay=True)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    saved = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = saved
        handler.close()


async def _no_retry(failure: object, next: Callable[[], Any]) -> None:
    """``--no-retry``: decides "no retry" without asking the listeners after it."""
    return None


async def _converse(
    args: argparse.Namespace,
    model: Model,
    options: Dict[str, Any],
    store: FileStore,
    log: SessionLog,
    resumed: bool,
    stdin: TextIO,
    out: TextIO,
) -> None:
    kwargs: Dict[str, Any] = {"options": options}
    if args.instructions is not None:
        kwargs["instructions"] = args.instructions
    loop = AgentLoop(model, log, **kwargs)
    for spec in args.tools:
        tool = _import(spec, "--tool")
        if hasattr(tool, "_kerman_attach"):  # a tool source: a kerman.mcp.MCPServer
            loop.add_tools(tool)
        else:
            loop.tool(tool)
    if args.approve:
        loop.before_tool(ask_every_call)
    chat = Chat(loop, out, resumed, echo=_isatty(stdin))
    if args.usage:
        chat.track_usage()
    if not args.no_retry:
        from ..providers.retry import retry_policy

        loop.request_error(retry_policy())
        loop.request_error(chat.on_request_error, prepend=True)
    else:
        loop.request_error(_no_retry, prepend=True)  # before any policy, a provider's default included
    idle = asyncio.Event()  # set while nothing runs: idle, or waiting for decisions

    def on_status(event: LiveEvent) -> None:
        if event.status == "running":
            idle.clear()
        else:
            idle.set()
        if event.status == "waiting":
            # Asked once the listener returned: the loop finishes its run first.
            asyncio.get_running_loop().call_soon(chat.waiting)

    loop.on("agent/status", on_status)
    chat.banner(log, model, store)
    chat.seen = len(log) - 1  # the banner covered what came before; catch_up starts after it
    renderer = asyncio.get_running_loop().create_task(chat.render(len(log)))
    interrupts = _interrupts(chat)
    if loop.status == "waiting":  # a resumed session whose turn waits for decisions
        chat.waiting()
    else:
        chat.prompt()

    async def until_idle() -> None:
        # Not when_idle(): cancelling that wait would warn that a turn is left running.
        while not chat.quit.is_set() and loop.status == "running":
            idle.clear()
            await _first(idle.wait(), chat.quit.wait())

    try:
        async with _lines(stdin) as lines:
            while not chat.quit.is_set():
                line = await _next_line(lines, chat.quit)
                if line is None:
                    break  # end of input: let the work finish, then leave
                chat.handle(line)
                if not chat.echo:
                    # Input that is not a terminal (a pipe, a file) was written before any
                    # reply: each line waits for the reply to the one before, so a script's
                    # lines are prompts of their own and its /quit comes after the last reply.
                    await until_idle()
            # End of input: the work goes on until the loop is idle (or Ctrl-C, /quit).
            await until_idle()
    finally:
        interrupts()
        if loop.status == "waiting":
            chat.line("  (the turn waits for decisions; kerman chat --session asks them again)", dim=True)
        elif loop.status != "idle":
            chat.line("  (stopping the running turn; queued input stays for --session)", dim=True)
        await loop.aclose()
        renderer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renderer
        chat.catch_up()
    chat.line(
        f"session {log.id} saved · resume: kerman chat --session {log.id}" + (f" --store {args.store}" if args.store else ""), dim=True
    )


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


async def _next_line(lines: asyncio.Queue[Optional[str]], quit: asyncio.Event) -> Optional[str]:
    getter = asyncio.ensure_future(lines.get())
    stopper = asyncio.ensure_future(quit.wait())
    done, pending = await asyncio.wait({getter, stopper}, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    return getter.result() if getter in done else None


async def _first(*aws: Awaitable[object]) -> None:
    tasks = [asyncio.ensure_future(a) for a in aws]
    _, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()


def _interrupts(chat: Chat) -> Callable[[], None]:
    """Ctrl-C cancels the running turn; at idle (or pressed again while cancelling) it quits."""
    event_loop = asyncio.get_running_loop()

    def on_interrupt() -> None:
        if chat.loop.status in ("running", "waiting") and not chat.cancelling:
            chat.cancel()
            chat.line("  [cancelling; Ctrl-C again to quit]", dim=True)
        else:
            chat.quit.set()

    try:
        event_loop.add_signal_handler(signal.SIGINT, on_interrupt)
    except (NotImplementedError, RuntimeError, ValueError):  # Windows, or not the main thread
        return lambda: None

    def restore() -> None:
        event_loop.remove_signal_handler(signal.SIGINT)

    return restore


def run(args: argparse.Namespace, stdin: Optional[TextIO] = None, out: Optional[TextIO] = None) -> int:
    """``kerman chat``: returns the exit status. Raises :class:`ChatError` for a chat that cannot start."""
    try:
        return asyncio.run(_chat(args, stdin or sys.stdin, out or sys.stdout))
    except SessionNotFoundError as error:
        raise ChatError(str(error)) from error
    except KermanError:
        raise
