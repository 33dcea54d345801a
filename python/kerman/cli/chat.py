"""``kerman chat``: a terminal chat with a real model, on a durable file session.

What you type while the agent works steers it: the line is queued as next-step input and the
model sees it at the next step boundary (after the running tool calls, or at once when the turn
has ended). ``/followup TEXT`` queues a prompt for a turn of its own instead. The queue is
printed whenever it changes; ``/queue`` lists it, ``/drop ID`` removes an entry, ``/cancel``
stops the running turn (keeping the queue), ``/quit`` (or Ctrl-D) leaves. Everything is in the
session file: ``kerman chat --session ID`` resumes it, ``kerman log show`` prints it.

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
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, TextIO, Tuple

from .. import AgentLoop, FileStore, Retry, SessionLog
from .._imports import load_object
from ..errors import KermanError, SessionNotFoundError
from ._timeline import message_text, terminal_text

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

_HELP = """commands:
  TEXT              while the agent works: steer it (seen at the next step); else: a new turn
  /followup TEXT    queue TEXT as a prompt for its own turn, after the running one
  /queue            list the queued input with its ids
  /drop ID          remove queued input (ID as /queue shows it, or the full message id)
  /clear            remove all queued input
  /cancel           stop the running turn; queued input stays queued
  /run              start a turn for input queued before (e.g. from a resumed session)
  /resend [TURN]    send again what a turn claimed but never read (a prompt cancelled before
                    the agent read it); default: the last such turn
  /help             this list
  /quit             leave (also Ctrl-D); the session stays on disk for --session"""


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
    parser.add_argument("--model", required=True, metavar="NAME|MODULE:FACTORY",
                        help="the provider's model name (gpt-6.2-sol, claude-sonnet-5-5, gemini-3.8-flash, ...), or "
                             "MODULE:FACTORY, a function returning any Kerman model (an importable module, or "
                             "a .py file path); with --provider or --base-url, always a model name")
    parser.add_argument("--provider", choices=sorted(PROVIDERS), default=None,
                        help="the wire protocol (default: openai); not used with MODULE:FACTORY")
    parser.add_argument("--base-url", metavar="URL", default=None,
                        help="the server's base URL, for OpenAI-compatible servers (vLLM, Ollama, LM Studio...) "
                             "and proxies")
    parser.add_argument("--api-key-env", metavar="VAR", default=None,
                        help="read the API key from this environment variable (default: the SDK's own, "
                             "e.g. OPENAI_API_KEY)")
    parser.add_argument("--session", metavar="ID", default=None,
                        help="resume this session (or start one with this id); default: a new session")
    parser.add_argument("--store", metavar="PATH", default=None,
                        help=f"the FileStore folder (default: $KERMAN_CHAT_DIR or {default_store()})")
    parser.add_argument("--instructions", metavar="TEXT", default=None, help="the system prompt")
    parser.add_argument("--tool", dest="tools", action="append", default=[], metavar="MODULE:FUNCTION",
                        help="register a tool (a typed function, or a kerman.Tool); repeatable")
    parser.add_argument("-o", "--option", dest="options", action="append", default=[], metavar="KEY=VALUE",
                        help="a request option, VALUE as JSON when it parses (-o temperature=0.2); repeatable")
    parser.add_argument("--no-stream", action="store_true", help="ask for whole replies instead of a stream")
    parser.add_argument("--no-retry", action="store_true",
                        help="fail a turn at the first request error (default: kerman.providers.retry_policy())")


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


def _clean(text: str) -> str:
    # Terminal control characters and bidi controls in anything printed (model output, ids,
    # tool names, errors) are shown escaped, never obeyed: a model, a tool result it quotes or
    # another program's queued input must not move the cursor, clear or retitle the terminal,
    # or reorder what it shows.
    return terminal_text(text)


def _open(args: argparse.Namespace) -> Tuple[FileStore, SessionLog, bool]:
    """The session: opened when it exists (resumed), created otherwise."""
    root = Path(args.store) if args.store else default_store()
    root.mkdir(parents=True, exist_ok=True)
    store = FileStore(root)
    if args.session is not None and store.exists(args.session):
        return store, store.open(args.session), True
    return store, store.create(args.session), False


# -- the terminal --------------------------------------------------------------------------------


class _Style:
    """ANSI styles when the output is a terminal (and NO_COLOR is unset); plain text otherwise."""

    def __init__(self, out: TextIO) -> None:
        tty = hasattr(out, "isatty") and out.isatty()
        self.on = bool(tty) and not os.environ.get("NO_COLOR")

    def dim(self, text: str) -> str:
        return f"\x1b[2m{text}\x1b[0m" if self.on else text

    def bold(self, text: str) -> str:
        return f"\x1b[1m{text}\x1b[0m" if self.on else text


def _tag(message_id: str) -> str:
    """The short id ``/queue`` shows: the last 6 characters (a UUIDv7's start is its timestamp)."""
    return message_id[-6:]


def _one_line(text: str, limit: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class Chat:
    """One chat: the loop, the terminal renderer (a reader of ``log.tail()``) and the commands."""

    def __init__(self, loop: AgentLoop, out: TextIO, resumed: bool, echo: bool = True) -> None:
        self.loop = loop
        self.echo = echo  # whether the input is a terminal, which echoes each line and its newline
        self.out = out
        self.style = _Style(out)
        self.resumed = resumed
        self.quit = asyncio.Event()
        self.typed: set[str] = set()  # ids of prompts the user typed at idle (already on screen)
        self.column = 0  # characters on the current line of streamed text
        self.streamed = False  # whether this step's reply arrived as chunks
        self.queue_shown: Tuple[str, ...] = ()
        self.step = 0  # the step being shown: input entering at step 1 is a prompt, later a steer
        self.cancelling = False
        self.seen = -1  # the last seq shown

    # -- output --

    def write(self, text: str, dim: bool = False, bold: bool = False) -> None:
        """Every print of the chat goes through here: ``text`` is escaped (``_clean``), then
        styled."""
        if not text:
            return
        shown = _clean(text)
        self.column = 0 if shown.endswith("\n") else self.column + len(shown)
        if dim:
            shown = self.style.dim(shown)
        if bold:
            shown = self.style.bold(shown)
        self.out.write(shown)
        self.out.flush()

    def line(self, text: str, dim: bool = False) -> None:
        """A line of its own (ending any streamed text first)."""
        if self.column:
            self.write("\n")
        self.write(text, dim=dim)
        self.write("\n")

    def prompt(self) -> None:
        if self.echo:
            self.write("> ", bold=True)

    # -- the renderer: the log, event by event --

    async def render(self, start: int) -> None:
        async for event in self.loop.log.tail(start=start):
            self.seen = event.seq
            self.show(event.type, event.data)

    def catch_up(self) -> None:
        """Shows what the renderer has not reached yet (at exit, after the loop closed)."""
        for event in self.loop.log.events(start=self.seen + 1):
            self.seen = event.seq
            self.show(event.type, event.data)

    def show(self, kind: str, data: Mapping[str, Any]) -> None:
        if kind == "assistant/chunk":
            chunk = data.get("chunk") or {}
            if chunk.get("type") == "text-delta":
                self.streamed = True
                self.write(str(chunk.get("text", "")))
            elif chunk.get("type") == "reasoning-delta":
                self.streamed = True
                self.write(str(chunk.get("text", "")), dim=True)
        elif kind == "assistant/message":
            message = data.get("message") or {}
            if not self.streamed:
                text = message_text(message)
                if text:
                    self.write(text)
            for block in message.get("content") or []:
                if isinstance(block, Mapping) and block.get("type") == "tool-call":
                    self.line(f"  ⚙ {_one_line(str(block.get('name')))}({_one_line(str(block.get('arguments')), 60)})", dim=True)
            if data.get("interrupted"):
                self.line("  (interrupted)", dim=True)
            self.streamed = False
        elif kind == "tool/result":
            text = message_text(data.get("message") or {})
            error = data.get("error")
            mark = "✗" if error else "↳"
            self.line(f"  {mark} {_one_line(text, 80)}", dim=True)
        elif kind == "user/message":
            if data.get("id") in self.typed:
                self.typed.discard(data.get("id"))
            else:
                source = (data.get("source") or {}).get("kind", "user")
                label = ("prompt" if self.step <= 1 else "steer") if source == "user" else _one_line(str(source), 20)
                self.line(f"  » {label}: {_one_line(message_text(data))}", dim=True)
        elif kind == "step/start":
            self.step = data.get("step") or 0
        elif kind == "turn/end":
            self.cancelling = False
            self.turn_ended(data)
        elif kind == "agent/inbox/spliced":
            self.queue_changed()

    def turn_ended(self, data: Mapping[str, Any]) -> None:
        reason = data.get("reason") or {}
        what = reason.get("kind")
        if what == "completed":
            note = ""
        elif what == "aborted":
            note = "cancelled"
        elif what == "error":
            error = reason.get("error") or {}
            note = f"error: {_one_line(str(error.get('message', '')), 200)} [{_one_line(str(error.get('code', 'UNKNOWN')), 40)}]"
        else:
            note = _one_line(json.dumps(reason, default=str))
        if note:
            self.line(f"  [turn {data.get('turn')} {note}]", dim=True)
        elif self.column:
            self.write("\n")
        if what != "completed":  # a completed turn read its input
            self.show_unread(data.get("turn"))
        if not self.loop.inbox.has_pending:
            self.prompt()
        elif what != "completed":  # a completed turn's queue runs on; a stopped one waits
            self.line(f"  {self.queue_summary()} kept; Enter (or /run) runs it, /clear drops it", dim=True)
            self.prompt()

    def unread(self) -> List[Dict[str, Any]]:
        """What ended turns claimed and never read (``Transcript.unread()``)."""
        return self.loop.log.transcript().unread()

    def show_unread(self, turn: Any = None) -> None:
        """Input claimed and never read (cancelled before the agent read it) is not queued any
        more and not in the conversation: said here, with the command that sends it again."""
        for item in self.unread():
            if turn is None or item["turn"] == turn:
                kind = str((item["ending"] or {}).get("kind"))
                what = {"aborted": "cancelled", "blocked": "rejected"}.get(kind, f"turn {_one_line(kind, 20)}")
                self.line(f"  {what} before it was read: {_one_line(item['message'].text or '', 80)}"
                          f" — /resend {item['turn']} sends it again", dim=True)

    def resend(self, wanted: str) -> None:
        turns = sorted({item["turn"] for item in self.unread()})
        if wanted and not wanted.isdigit():
            self.line("usage: /resend [TURN]")
            return
        turn = int(wanted) if wanted else (turns[-1] if turns else None)
        if turn is None or turn not in turns:
            self.line("  nothing to resend: no turn left input unread"
                      if turn is None else f"  turn {turn} left nothing unread", dim=True)
            return
        requeued = self.loop.requeue_claimed(turn)
        self.line(f"  sent again: {', '.join(_one_line(m.text or '', 40) for m in requeued)}", dim=True)
        if self.loop.status == "idle":
            self.loop.wake()

    def queue_changed(self) -> None:
        ids = tuple(m.id for m in self.loop.inbox.next_turn + self.loop.inbox.next_step)
        if ids == self.queue_shown:
            return
        # Shown when it grows (input was queued); a queue that empties as the loop takes its
        # input is announced by the user/message lines instead.
        grew = any(i not in self.queue_shown for i in ids)
        self.queue_shown = ids
        if grew:
            self.line("  " + self.queue_summary(), dim=True)

    def queue_summary(self) -> str:
        inbox = self.loop.inbox
        items = [("next turn", m) for m in inbox.next_turn] + [("next step", m) for m in inbox.next_step]
        if not items:
            return "queue: empty"
        shown = ", ".join(f"#{_tag(m.id)} {_one_line(m.text or '', 30)!s}" for _, m in items[:3])
        more = f" (+{len(items) - 3} more)" if len(items) > 3 else ""
        return f"queue ({len(items)}): {shown}{more} — /queue, /drop ID"

    # -- input --

    def handle(self, line: str) -> None:
        """One typed line."""
        if self.echo:
            self.column = 0  # the terminal's echo of the Enter key ended the line
        text = line.strip()
        if not text:
            if self.loop.status == "idle" and self.loop.inbox.has_pending:
                self.loop.wake()
            elif self.loop.status == "idle":
                self.prompt()
            return
        if text.startswith("/"):
            self.command(text)
            return
        if self.loop.status == "idle":
            self.typed.add(self.loop.followup(text).id)
        else:
            self.loop.steer(text)

    def command(self, text: str) -> None:
        name, _, rest = text.partition(" ")
        rest = rest.strip()
        if name in ("/quit", "/exit"):
            self.quit.set()
        elif name == "/help":
            self.line(_HELP)
        elif name == "/queue":
            self.line(self.queue_listing())
        elif name == "/drop":
            self.drop(rest)
        elif name == "/clear":
            dropped = self.loop.inbox.clear()
            self.line(f"  removed {len(dropped)} queued message{'s' if len(dropped) != 1 else ''}", dim=True)
        elif name == "/cancel":
            if self.loop.status == "idle":
                self.line("  nothing is running", dim=True)
            else:
                self.cancel()
        elif name == "/followup":
            if not rest:
                self.line("usage: /followup TEXT")
            else:
                message = self.loop.followup(rest)
                if self.loop.status == "idle":
                    self.typed.add(message.id)
        elif name == "/resend":
            self.resend(rest)
        elif name == "/run":
            if not self.loop.wake():
                self.line("  nothing to run" if not self.loop.inbox.has_pending else "  already running", dim=True)
        else:
            self.line(f"unknown command {_one_line(name, 30)!r}; /help lists them")
        if self.loop.status == "idle" and not self.quit.is_set():
            self.prompt()

    async def on_request_error(self, failure: Any, next: Callable[[], Any]) -> Any:
        """First in the ``request_error`` waterfall: says on screen when the policy retries."""
        decision = await next()
        if isinstance(decision, Retry):
            f = failure.failure
            self.line(f"  [retrying: {_one_line(str(f.get('message', '')), 120)}]", dim=True)
        return decision

    def cancel(self) -> None:
        self.cancelling = True
        self.loop.cancel("user", keep_inbox=True)

    def queue_listing(self) -> str:
        inbox = self.loop.inbox
        rows = [f"  #{_tag(m.id)}  next turn  {_one_line(m.text or '', 70)}" for m in inbox.next_turn]
        rows += [f"  #{_tag(m.id)}  next step  {_one_line(m.text or '', 70)}" for m in inbox.next_step]
        return "\n".join(rows) if rows else "  queue: empty"

    def drop(self, wanted: str) -> None:
        wanted = wanted.lstrip("#")
        if not wanted:
            self.line("usage: /drop ID (as /queue shows it)")
            return
        inbox = self.loop.inbox
        # The id as typed, or as shown (escaped: an id holding control characters).
        matches = [m for m in inbox.next_turn + inbox.next_step
                   if m.id == wanted or m.id.endswith(wanted) or _clean(m.id).endswith(wanted)]
        if not matches:
            self.line(f"  no queued message #{_one_line(wanted, 40)} (it may have been delivered already); /queue lists them")
        elif len(matches) > 1:
            self.line(f"  #{_one_line(wanted, 40)} matches {len(matches)} messages; give more of the id")
        elif inbox.remove(matches[0].id):
            self.line(f"  removed #{_tag(matches[0].id)} {_one_line(matches[0].text or '', 60)}", dim=True)
        else:  # taken by the loop between the listing and the removal
            self.line(f"  #{_tag(matches[0].id)} was delivered before it could be removed")

    def banner(self, log: SessionLog, model: Any, store: FileStore) -> None:
        if self.resumed:
            history = _recent(log)
            self.line(f"resumed session {log.id} ({len(log)} events)", dim=True)
            for role, text in history:
                self.line(f"  {role}: {_one_line(text, 100)}", dim=True)
        else:
            self.line(f"session {log.id}", dim=True)
        self.line(f"model {_one_line(repr(model), 100)} · store {store.root} · /help for commands", dim=True)
        if self.resumed:
            self.show_unread()
        pending = self.loop.inbox
        if pending.has_pending:
            self.line("  " + self.queue_summary() + "; press Enter (or /run) to run it", dim=True)
            self.line(self.queue_listing())
            self.queue_shown = tuple(m.id for m in pending.next_turn + pending.next_step)


def _recent(log: SessionLog, count: int = 4) -> List[Tuple[str, str]]:
    """The last ``count`` user and assistant texts, for a resumed session's banner."""
    found: List[Tuple[str, str]] = []
    for event in reversed(list(log.events(types=["user/message", "assistant/message"]))):
        data = event.data
        message = data.get("message") if event.type == "assistant/message" else data
        text = message_text(message or {})
        if text:
            found.append(("you" if event.type == "user/message" else "agent", text))
        if len(found) >= count:
            break
    return list(reversed(found))


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


async def _session(args: argparse.Namespace, model: Any, options: Dict[str, Any], stdin: TextIO, out: TextIO) -> None:
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


async def _no_retry(failure: Any, next: Callable[[], Any]) -> None:
    """``--no-retry``: decides "no retry" without asking the listeners after it."""
    return None


async def _converse(args: argparse.Namespace, model: Any, options: Dict[str, Any], store: FileStore,
                    log: SessionLog, resumed: bool, stdin: TextIO, out: TextIO) -> None:
    kwargs: Dict[str, Any] = {"options": options}
    if args.instructions is not None:
        kwargs["instructions"] = args.instructions
    loop = AgentLoop(model, log, **kwargs)
    for spec in args.tools:
        loop.tool(_import(spec, "--tool"))
    chat = Chat(loop, out, resumed, echo=_isatty(stdin))
    if not args.no_retry:
        from ..providers.retry import retry_policy

        loop.request_error(retry_policy())
        loop.request_error(chat.on_request_error, prepend=True)
    else:
        loop.request_error(_no_retry, prepend=True)  # before any policy, a provider's default included
    idle = asyncio.Event()

    def on_status(event: Any) -> None:
        if event.status == "idle":
            idle.set()
        else:
            idle.clear()

    loop.on("agent/status", on_status)
    chat.banner(log, model, store)
    renderer = asyncio.get_running_loop().create_task(chat.render(len(log)))
    interrupts = _interrupts(chat)
    chat.prompt()

    async def until_idle() -> None:
        # Not when_idle(): cancelling that wait would warn that a turn is left running.
        while not chat.quit.is_set() and loop.status != "idle":
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
        if loop.status != "idle":
            chat.line("  (stopping the running turn; queued input stays for --session)", dim=True)
        await loop.aclose()
        renderer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renderer
        chat.catch_up()
    chat.line(f"session {log.id} saved · resume: kerman chat --session {log.id}"
              + (f" --store {args.store}" if args.store else ""), dim=True)


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


async def _first(*aws: Any) -> None:
    tasks = [asyncio.ensure_future(a) for a in aws]
    _, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()


def _interrupts(chat: Chat) -> Callable[[], None]:
    """Ctrl-C cancels the running turn; at idle (or pressed again while cancelling) it quits."""
    event_loop = asyncio.get_running_loop()

    def on_interrupt() -> None:
        if chat.loop.status == "running" and not chat.cancelling:
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
