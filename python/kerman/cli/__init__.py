"""The ``kerman`` command line (also ``python -m kerman``).

``kerman log list|show|tail|inbox|verify|repair`` inspect session files without modifying them
(no lock, so a session an agent is running can be read; no torn-tail repair, no crash closers)
except ``repair``, which only acts on explicit confirmation. ``tail --follow`` follows a live
session until interrupted. ``list``, ``show``, ``tail`` and ``inbox`` also read a PostgreSQL
store, named by its DSN (``postgresql://…``), as a read-only follower (no lease). ``kerman demo`` runs the
showcase. Errors are one line on stderr, never a traceback: exit 2 for usage and a missing store,
1 for everything else that went wrong.
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import json
import os
import re
import shlex
import sys
from typing import Any, Callable, Iterable, Optional, Sequence

from .. import FORMAT_VERSION, FileStore, InboxProjection, __version__
from ._timeline import _escape, format_event, message_text, quote, source_tag, traceback_lines
from ..errors import (
    CorruptLogError,
    KermanError,
    ProjectionError,
    SessionNotFoundError,
    UnsupportedFormatError,
)

__all__ = ["main", "human_size"]

#: Files at least this large get a progress note on stderr before they are read.
LARGE_FILE_BYTES = 50 * 1000 * 1000

_PLACEMENTS = ("queued", "steering", "context")
STORE_HELP = "the session store: a FileStore folder, or a PostgreSQL DSN (postgresql://…)"
_SAFE_ID_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


class _Exit(Exception):
    """Ends a command with ``code`` after ``message`` (if any) went to stderr."""

    def __init__(self, code: int, message: Optional[str] = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def human_size(size: int) -> str:
    """``512 B``, ``1.1 kB``, ``700 MB``: decimal units, three significant digits."""
    value = float(size)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            if unit == "B":
                return f"{int(value)} B"
            return f"{value:.1f} {unit}" if value < 100 else f"{value:.0f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def _count(n: Any, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


# Control characters (C0 but newline and tab, DEL, C1) and Unicode bidi controls never reach
# the terminal raw, whatever carried them (an id, a path, an error text). Ids and texts are
# escaped where they are printed; this is the last line of defence, in a form that is also
# valid inside JSON strings (JSON output escapes C0 itself but leaves DEL, C1 and bidi raw).
_RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")

#: Passwords of the DSN being used, scrubbed from everything printed (set by ``main``).
_SECRETS: list[str] = []


def _terminal_safe(line: str) -> str:
    for secret in _SECRETS:
        line = line.replace(secret, "***")
    return _RAW_CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", line)


def _out(line: str = "") -> None:
    sys.stdout.write(_terminal_safe(line) + "\n")


def _err(line: str) -> None:
    sys.stderr.write(_terminal_safe(line) + "\n")
    sys.stderr.flush()


def _shown_id(session_id: Any) -> str:
    """A session id as text output shows it: control characters (newlines too) escaped."""
    return _escape(str(session_id))


# -- store and session access ------------------------------------------------------------------


def _session_file(root: str, session_id: str) -> str:
    """The file a session id maps to (docs/format.md, "Encoding session ids")."""
    name = "".join(chr(b) if b in _SAFE_ID_BYTES else f"~{b:02X}" for b in session_id.encode("utf-8", "replace"))
    return os.path.join(root, name + ".jsonl")


_URL_DSN = ("postgresql://", "postgres://")
# A key=value connection string starts with a keyword and "=" (libpq allows spaces around it).
_KV_DSN = re.compile(r"^\s*[A-Za-z_]+\s*=")
# A password keyword's value in a key=value DSN: quoted (with \\ and \' escapes) or up to a space.
_KV_PASSWORD = re.compile(r"(\b(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'?|\S*)", re.IGNORECASE)
# A password in a URL's query string.
_QUERY_PASSWORD = re.compile(r"([?&](?:ssl)?password=)([^&#]*)", re.IGNORECASE)


def _is_dsn(store: str) -> bool:
    """A PostgreSQL DSN, as a URL or as key=value pairs (an existing folder is always a folder)."""
    if store.startswith(_URL_DSN):
        return True
    return bool(_KV_DSN.match(store)) and not os.path.isdir(store)


def _split_url_userinfo(store: str) -> Optional[tuple[str, str, str]]:
    """``(scheme://, userinfo, @rest)`` of a URL DSN that has a userinfo part."""
    scheme, _, rest = store.partition("://")
    authority_end = len(rest)
    for stop in "?#":
        i = rest.find(stop)
        if i >= 0:
            authority_end = min(authority_end, i)
    at = rest.rfind("@", 0, authority_end)
    if at < 0:
        return None
    return scheme + "://", rest[:at], rest[at:]


def _passwords(store: str) -> list[str]:
    """Every password a DSN carries (as written), longest first, for scrubbing."""
    if not _is_dsn(store):
        return []
    found = []
    if store.startswith(_URL_DSN):
        parts = _split_url_userinfo(store)
        if parts and ":" in parts[1]:
            found.append(parts[1].split(":", 1)[1])
        found += [m.group(2) for m in _QUERY_PASSWORD.finditer(store)]
    else:
        for m in _KV_PASSWORD.finditer(store):
            value = m.group(2)
            found.append(value)
            if value.startswith("'"):
                found.append(re.sub(r"\\(.)", r"\1", value.strip("'")))
    return sorted({p for p in found if p}, key=len, reverse=True)


def _shown(store: str) -> str:
    """The store as messages name it: a DSN without its password (URL userinfo, URL query,
    key=value), as ``***``."""
    if not _is_dsn(store):
        return store
    if store.startswith(_URL_DSN):
        parts = _split_url_userinfo(store)
        if parts and ":" in parts[1]:
            store = parts[0] + parts[1].split(":", 1)[0] + ":***" + parts[2]
        return _QUERY_PASSWORD.sub(r"\1***", store)
    return _KV_PASSWORD.sub(r"\1***", store)


def _postgres(dsn: str) -> Any:
    store_cls = getattr(sys.modules["kerman"], "PostgresStore", None)
    if store_cls is None:
        raise _Exit(2, "kerman: this build of kerman has no PostgreSQL store")
    return store_cls(dsn)


def _store(path: str) -> FileStore:
    if _is_dsn(path):
        raise _Exit(2, f"kerman: {_shown(path)} is a PostgreSQL store; verify and repair work on FileStore "
                       "folders (PostgreSQL checks every append in its own transaction)")
    # FileStore creates a missing root; an inspection command must not.
    if not os.path.isdir(path):
        raise _Exit(2, f"kerman: no session store at {path}")
    return FileStore(path, durability="none")


def _follow(store: Any, session_id: str) -> tuple[dict[str, Any], list[Any]]:
    """The header and events of a PostgreSQL session, read by a follower that then stops."""
    log = _session_call(store.follow, session_id)
    try:
        return log.header, list(log.events())
    finally:
        log.close()


def _progress(args: argparse.Namespace, verb: str = "reading") -> None:
    """A note on stderr before a long read; stdout stays clean."""
    try:
        size = os.path.getsize(_session_file(args.store, args.id))
    except (OSError, ValueError):
        return
    if size >= LARGE_FILE_BYTES:
        _err(f"kerman: {verb} {human_size(size)}…")


def _repair_hint(args: argparse.Namespace) -> str:
    return f"kerman log repair {shlex.quote(args.store)} {shlex.quote(args.id)}"


def _describe_error(error: KermanError, args: argparse.Namespace) -> str:
    if isinstance(error, SessionNotFoundError):
        return f'kerman: session "{_shown_id(args.id)}" not found in {_shown(args.store)}'
    text = f"kerman: {error}"
    session_id = getattr(args, "id", None)
    if session_id and session_id != _shown_id(session_id):
        # Messages quote the id raw; show it escaped (a newline in it must not start a line).
        text = text.replace(session_id, _shown_id(session_id))
    if isinstance(error, CorruptLogError):
        where = f"{error.path}, line {error.line} (seq {error.seq})"
        if getattr(args, "log_command", None) == "repair":
            return f"{text}\nkerman: cannot repair {where}"
        text += (f"\nkerman: bad record in {where}; nothing was modified. To read the records that verify, "
                 f"add --allow-damaged to show, tail or inbox; to repair the file (keeping every record that "
                 f"verifies, and a full .corrupt copy), run: {_repair_hint(args)}")
    return text


def _session_call(method: Callable[[str], Any], session_id: str) -> Any:
    """``method(session_id)``, with an id the store refuses reported as bad usage."""
    try:
        return method(session_id)
    except KermanError:
        raise
    except ValueError as error:  # only the id can be invalid here
        raise _Exit(2, f"kerman: {error}") from None


def _read(args: argparse.Namespace) -> tuple[dict[str, Any], list[Any], dict[str, Any]]:
    if _is_dsn(args.store):
        header, events = _follow(_postgres(args.store), args.id)
        return header, events, {}
    store = _store(args.store)
    _progress(args)
    allow_damaged = bool(getattr(args, "allow_damaged", False))
    header, events, info = _session_call(lambda sid: store._read(sid, allow_damaged), args.id)
    if info.get("skipped"):
        _note_skipped(args, info["skipped"], len(events))
    return header, events, info


def _range(first: int, last: int) -> str:
    return f"{first}" if first == last else f"{first}–{last}"


def _plan_lines(report: dict[str, Any]) -> list[str]:
    """What a salvage leaves out, one line each: the lines set aside, the lost seqs, the torn tail."""
    lines = []
    for d in report["dropped"]:
        claims = f", claims seq {d['seq']}" if d["seq"] is not None else ""
        lines.append(f"line {d['line']} ({human_size(d['bytes'])}{claims}): {d['detail']}")
    for first, last in report["lost_seqs"]:
        lines.append(f"{'seq' if first == last else 'seqs'} {_range(first, last)} lost")
    if report["torn_tail_bytes"]:
        lines.append(f"torn tail from line {report['torn_tail_line']} ({human_size(report['torn_tail_bytes'])})")
    return lines


def _note_skipped(args: argparse.Namespace, report: dict[str, Any], shown: int) -> None:
    """With --allow-damaged: names on stderr what the output leaves out (stdout stays clean)."""
    _err(f"kerman: {args.id}: the file is damaged; showing the {_count(shown, 'record')} that verify "
         "(a lost seq is a gap); nothing was modified. Skipped:")
    for line in _plan_lines(report):
        _err(f"kerman:   {line}")
    _err(f"kerman: to repair it, run: {_repair_hint(args)}")


def _type_filter(patterns: Optional[Iterable[str]]) -> Callable[[str], bool]:
    """The filter of ``--types``: the language of ``log.events(types=...)`` (``*`` any run of
    characters, ``?`` one; ``[`` is an ordinary character there, so it is escaped here)."""
    wanted = [p.replace("[", "[[]") for item in patterns or () for p in item.split(",") if p]
    if not wanted:
        return lambda _type: True
    return lambda kind: any(fnmatch.fnmatchcase(kind, p) for p in wanted)


def _local_time(ms: Any) -> str:
    try:
        return datetime.datetime.fromtimestamp(ms / 1000).isoformat(sep=" ", timespec="seconds")
    except (TypeError, ValueError, OverflowError, OSError):
        return "?"


def _print_events(args: argparse.Namespace, header: dict[str, Any], events: list[Any], total: int,
                  info: dict[str, Any]) -> None:
    if args.json:
        for event in events:
            _out(event.to_json())
    else:
        line = (f'session "{_shown_id(header.get("id", args.id))}"  created {_local_time(header.get("createdAt"))}  '
                f'format {header.get("version")}  {_count(total, "event")}')
        if len(events) != total:
            line += f" (showing {len(events)})"
        _out(line)
        t0 = events[0].time if events and args.relative else None
        for event in events:
            _out(format_event(event, t0=t0))
            # A failure recorded from a user exception: its traceback, under the event.
            for line in traceback_lines(event):
                _out(f"{'':7}| {line}")
    torn = info.get("torn_tail_bytes") or 0
    if torn:
        _err(f"kerman: note: {torn} bytes of torn tail at the end of the file are not shown "
             "(they will be truncated on next open)")


# -- commands ----------------------------------------------------------------------------------


def _list_postgres(args: argparse.Namespace) -> list[dict[str, Any]]:
    from ._workers import session_rows

    store = _postgres(args.store)
    rows = []
    # Who owns what (kerman sessions): owner (a worker's name or owner id), state, staged input.
    owners = {r["id"]: r for r in session_rows(store)}
    ids = sorted(store.list())
    if len(ids) > 20 and not args.json:
        _err(f"kerman: reading {len(ids)} sessions…")
    for session_id in ids:
        row: dict[str, Any] = {"id": session_id, "events": None, "size_bytes": None, "status": "ok"}
        seen = owners.get(session_id)
        if seen is not None:
            row.update(state=seen["state"], owner=seen["owner_name"] or seen["owner"], staged=seen["staged"])
        try:
            row["events"] = len(_follow(store, session_id)[1])
        except SessionNotFoundError:  # deleted meanwhile
            continue
        except KermanError:
            row["status"] = "unreadable"
        rows.append(row)
    return rows


def _cmd_list(args: argparse.Namespace) -> int:
    rows = _list_postgres(args) if _is_dsn(args.store) else _list_files(args)
    if args.json:
        _out(json.dumps(rows, ensure_ascii=False, separators=(",", ":")))
        return 0
    if not rows:
        _err(f"kerman: no sessions in {_shown(args.store)}")
        return 0
    width = max(len(_shown_id(r["id"])) for r in rows)
    for r in rows:
        events = _count(r["events"], "event") if r["events"] is not None else "? events"
        size = human_size(r["size_bytes"]) if r["size_bytes"] is not None else ("—" if _is_dsn(args.store) else "?")
        status = "" if r["status"] == "ok" else f"  ({r['status']})"
        if "state" in r:  # a PostgreSQL store: who owns it
            status = f"  {r['state']}" + (f" by {r['owner']}" if r["owner"] else "") + \
                     (f", {r['staged']} staged" if r["staged"] else "") + status
        _out(f"{_shown_id(r['id']):<{width}}  {events:>12}  {size:>8}{status}")
    return 0


def _list_files(args: argparse.Namespace) -> list[dict[str, Any]]:
    store = _store(args.store)
    rows = []
    for session_id in sorted(store.list()):
        row: dict[str, Any] = {"id": session_id, "events": None, "size_bytes": None, "status": "ok"}
        try:
            row["size_bytes"] = os.path.getsize(_session_file(args.store, session_id))
        except OSError:
            pass
        try:
            info = store.verify(session_id)
            row["events"] = info["events"]
            row["size_bytes"] = info["size_bytes"]
            if info.get("torn_tail_bytes"):
                row["status"] = "torn-tail"
        except CorruptLogError:
            row["status"] = "corrupt"
        except UnsupportedFormatError:
            row["status"] = "unsupported-format"
        except SessionNotFoundError:  # deleted meanwhile
            continue
        except KermanError:  # an I/O error: reading takes no lock
            row["status"] = "unreadable"
        rows.append(row)
    return rows


def _cmd_show(args: argparse.Namespace) -> int:
    header, events, info = _read(args)
    keep = _type_filter(args.types)
    selected = [e for e in events if e.seq >= args.start and keep(e.type)]
    _print_events(args, header, selected, len(events), info)
    return 0


def _cmd_tail(args: argparse.Namespace) -> int:
    if args.follow:
        if args.allow_damaged:
            raise _Exit(2, "kerman: --follow and --allow-damaged cannot be combined: a damaged file is not "
                           f"followed; read it with --allow-damaged, or repair it first: {_repair_hint(args)}")
        return _follow_tail(args)
    header, events, info = _read(args)
    keep = _type_filter(args.types)
    selected = [e for e in events if keep(e.type)]
    selected = selected[len(selected) - args.n:] if args.n else []
    _print_events(args, header, selected, len(events), info)
    return 0


def _follow_tail(args: argparse.Namespace) -> int:
    """The last N events, then each new one as the session's owner commits it, until Ctrl-C
    (exit 0) or the follower stops (the session was deleted or repaired)."""
    import asyncio

    store = _postgres(args.store) if _is_dsn(args.store) else _store(args.store)
    log = _session_call(store.follow, args.id)
    keep = _type_filter(args.types)
    try:
        events = list(log.events())
        selected = [e for e in events if keep(e.type)]
        selected = selected[len(selected) - args.n:] if args.n else []
        _print_events(args, log.header, selected, len(events), {})
        sys.stdout.flush()
        t0 = selected[0].time if selected and args.relative else None

        async def follow() -> None:
            nonlocal t0
            async for event in log.tail(start=len(events)):
                if not keep(event.type):
                    continue
                if t0 is None and args.relative:
                    t0 = event.time
                _out(event.to_json() if args.json else format_event(event, t0=t0))
                sys.stdout.flush()

        try:
            asyncio.run(follow())
        except KeyboardInterrupt:
            return 0
        _err(f'kerman: stopped following session "{_shown_id(args.id)}": it was deleted, repaired or cut back')
        return 0
    finally:
        log.close()


def _cmd_inbox(args: argparse.Namespace) -> int:
    _, events, info = _read(args)
    try:
        items = InboxProjection.fold(events).items()
    except ProjectionError as error:
        if not info.get("skipped"):
            raise
        raise _Exit(1, f"kerman: {error}\nkerman: the inbox cannot be rebuilt without the records that are lost; "
                       f"the ones that verify are shown by: kerman log show {shlex.quote(args.store)} "
                       f"{shlex.quote(args.id)} --allow-damaged") from None
    if args.json:
        _out(json.dumps([{"placement": p, "message": m.to_dict()} for p, m in items],
                        ensure_ascii=False, separators=(",", ":")))
        return 0
    if not items:
        _out("inbox empty")
        return 0
    for placement in _PLACEMENTS + tuple(sorted({p for p, _ in items} - set(_PLACEMENTS))):
        group = [m for p, m in items if p == placement]
        if not group:
            continue
        _out(f"{placement} ({len(group)})")
        for message in group:
            _out(f"  {quote(message.id, None)[1:-1]}  {quote(message_text(message), None)}"
                 f"{source_tag(message.source)}")
    return 0


def _verify_line(info: dict[str, Any]) -> str:
    torn = info.get("torn_tail_bytes") or 0
    tail = f"{torn} bytes (will be truncated on next open)" if torn else "none"
    return f"ok: {_count(info['events'], 'event')}, {human_size(info['size_bytes'])}, torn tail: {tail}"


def _cmd_verify(args: argparse.Namespace) -> int:
    store = _store(args.store)
    _progress(args, "verifying")
    try:
        info = _session_call(store.verify, args.id)
    except CorruptLogError as error:
        if args.json:
            _out(json.dumps({"ok": False, "error": "corrupt", "path": error.path, "line": error.line,
                             "seq": error.seq, "message": str(error)}, ensure_ascii=False, separators=(",", ":")))
        raise
    except UnsupportedFormatError as error:
        if args.json:
            _out(json.dumps({"ok": False, "error": "unsupported-format", "path": error.path,
                             "found": error.found, "supported": error.supported, "message": str(error)},
                            ensure_ascii=False, separators=(",", ":")))
        raise
    if args.json:
        _out(json.dumps({"ok": True, **info}, ensure_ascii=False, separators=(",", ":")))
    else:
        _out(_verify_line(info))
    return 0


def _confirm(question: str, args: argparse.Namespace) -> bool:
    stdin = sys.stdin
    if stdin is None or not stdin.isatty():
        raise _Exit(1, "kerman: not repairing: confirmation needs a terminal and stdin is not one; "
                       f"to repair anyway, run: {_repair_hint(args)} --yes")
    sys.stdout.write(f"{question} [y/N] ")
    sys.stdout.flush()
    answer = stdin.readline()
    return answer.strip().lower() in ("y", "yes")


def _cmd_repair(args: argparse.Namespace) -> int:
    store = _store(args.store)
    if not args.yes:
        _progress(args, "verifying")
        try:
            info = _session_call(store.verify, args.id)
        except CorruptLogError as error:
            _out(f"{error.path} is corrupt at line {error.line} (seq {error.seq}):\n  {error}")
            if error.line is not None and error.line <= 1:
                raise _Exit(1, "kerman: the header itself is damaged; repair cannot fix that") from None
            plan = _session_call(lambda sid: store.repair(sid, dry_run=True), args.id)
            _out(f"repair would keep the {_count(plan['kept_events'], 'record')} that verify, each at its seq, "
                 "and set aside:")
            for line in _plan_lines(plan):
                _out(f"  {line}")
            _out("after copying the whole file to a .corrupt backup next to it (the lines set aside also go, "
                 "verbatim, to a .damaged file); each lost seq gets a log/damaged placeholder and a "
                 "log/repaired record naming all of this is appended")
        else:
            torn = info.get("torn_tail_bytes") or 0
            if not torn:
                _out(f"nothing to repair: {_verify_line(info)}")
                return 0
            _out(f"{info['path']} ends in a torn tail of {torn} bytes; repair would truncate it, "
                 f"keeping {_count(info['events'], 'event')} (opening the session would do the same)")
        if not _confirm("repair?", args):
            raise _Exit(1, "kerman: not repaired; nothing was changed")
    _progress(args, "repairing")
    result = _session_call(store.repair, args.id)
    removed = result.get("removed_bytes") or 0
    kept = _count(result["kept_events"], "event")
    if not removed:
        _out(f"nothing to repair: {kept} kept")
        return 0
    backup = result.get("backup")
    exact = f" ({removed} bytes)" if removed >= 1000 else ""
    if not backup:
        _out(f"repaired: kept {kept}, removed {human_size(removed)}{exact}")
        _out("backup: none (only a torn tail was removed)")
        return 0
    _out(f"repaired: kept {kept} that verify, removed {human_size(removed)}{exact}; "
         f"the log now holds {_count(result['events'], 'event')}:")
    for line in _plan_lines(result):
        _out(f"  {line}")
    _out(f"backup: {backup}")
    if result.get("quarantine"):
        _out(f"set aside: {result['quarantine']}")
    return 0


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


def _at_least_one(text: str) -> int:
    value = _natural(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more: {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive, finite number of seconds: {text}")
    return value


def _add_serve(commands: Any) -> None:
    serve = commands.add_parser("serve", help="serve sessions over HTTP: SSE streams (AG-UI, Vercel AI SDK, kerman) "
                                              "and a web chat (needs kerman[web])",
                                description="Serve a store's sessions over HTTP (docs/web.md).")
    serve.add_argument("store", help=STORE_HELP)
    serve.add_argument("--model", metavar="MODULE:FACTORY",
                       help="what builds each session's model or AgentLoop (needed for a FileStore), "
                            "e.g. kerman.models:EchoModel")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=_natural, default=8000, help="port (default 8000; 0 picks a free one)")
    serve.add_argument("--token", default=None, help="bearer token every request must carry (default: $KERMAN_TOKEN)")
    serve.add_argument("--cors-origin", action="append", metavar="ORIGIN",
                       help="allow browser calls from this origin (repeatable; none by default)")
    serve.add_argument("--max-body", type=_natural, default=64 * 1024, metavar="BYTES",
                       help="largest request body (default 65536)")
    serve.add_argument("--heartbeat", type=float, default=15.0, metavar="SECONDS",
                       help="seconds between heartbeats on an idle stream (default 15)")
    serve.add_argument("--allow-host", action="append", metavar="NAME",
                       help="a host name this server answers to besides IP addresses and localhost (repeatable; "
                            "requests naming another host are refused)")
    serve.add_argument("--header-timeout", type=_seconds, default=10.0, metavar="SECONDS",
                       help="close a connection whose request headers are not all in by then (default 10)")
    serve.add_argument("--body-timeout", type=_seconds, default=30.0, metavar="SECONDS",
                       help="answer 408 to a request whose body is not all in by then (default 30)")
    serve.add_argument("--max-connections", type=_at_least_one, default=None, metavar="N",
                       help="open connections at most; more are refused (default 1000, fewer when descriptors are scarce)")
    serve.add_argument("--max-streams", type=_at_least_one, default=128, metavar="N",
                       help="event streams one client address may hold open (default 128)")
    serve.add_argument("--idle-session", type=_seconds, default=300.0, metavar="SECONDS",
                       help="close a session nobody used for this long; it reopens on the next request (default 300)")
    serve.add_argument("--max-sessions", type=_at_least_one, default=256, metavar="N",
                       help="sessions held open at most; the least recently used idle one is closed first (default 256)")
    serve.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"),
                       help="uvicorn's log level (default warning)")
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
    sub.add_argument("--allow-damaged", action="store_true",
                     help="read a corrupt session file as far as its records verify, naming what is skipped "
                          "on stderr (nothing is written)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kerman", description="Inspect Kerman session logs, chat with a model, run the demo.")
    parser.add_argument("--version", action="version",
                        version=f"kerman {__version__} (session log format {FORMAT_VERSION})")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = commands.add_parser("demo", help="run the showcase: a scripted session in a fresh folder")
    demo.add_argument("--dir", metavar="PATH", default=None,
                      help="folder to put the demo session in (default: a fresh temporary folder)")
    demo.set_defaults(handler=_cmd_demo)
    _add_serve(commands)

    from .chat import add_arguments as chat_arguments

    chat = commands.add_parser("chat", help="chat with a model in the terminal, on a durable session "
                                            "(typing while it works steers it)",
                               description="Chat with a model in the terminal on a durable file session. "
                                           "What you type while the agent works steers it; /help lists the commands.")
    chat_arguments(chat)
    chat.set_defaults(handler=_cmd_chat)

    from ._workers import add_sessions_arguments, add_worker_arguments

    worker = commands.add_parser("worker", help="serve the sessions of a PostgreSQL store (kerman.Worker)",
                                 description="Take sessions with waiting input and no live owner, run their "
                                             "AgentLoops, release them when idle; SIGTERM drains.")
    add_worker_arguments(worker)
    worker.set_defaults(handler=lambda a: _workers_command("worker", a))
    sessions = commands.add_parser("sessions", help="who owns which session of a PostgreSQL store; unpark",
                                   description="The sessions of a PostgreSQL store: owner, since when, lease "
                                               "expiry, staged input, parked (default command: list).")
    add_sessions_arguments(sessions)
    sessions.set_defaults(handler=lambda a: _workers_command("sessions", a))

    log = commands.add_parser("log", help="inspect session logs (a FileStore folder or a PostgreSQL DSN), "
                                          "repair session files")
    log_commands = log.add_subparsers(dest="log_command", metavar="COMMAND", required=True)

    def session_command(name: str, help_text: str, handler: Callable[[argparse.Namespace], int],
                        json_help: Optional[str], store_help: str = STORE_HELP) -> argparse.ArgumentParser:
        sub = log_commands.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("store", help=store_help)
        sub.add_argument("id", help="the session id")
        if json_help:
            sub.add_argument("--json", action="store_true", help=json_help)
        sub.set_defaults(handler=handler)
        return sub

    listing = log_commands.add_parser("list", help="list the sessions in a store",
                                      description="list the sessions in a store")
    listing.add_argument("store", help=STORE_HELP)
    listing.add_argument("--json", action="store_true", help="print a JSON list of objects")
    listing.set_defaults(handler=_cmd_list)

    for name, help_text, handler in (("show", "print a session's timeline", _cmd_show),
                                     ("tail", "print a session's last events", _cmd_tail)):
        sub = session_command(name, help_text, handler,
                              "one compact JSON event per line, exactly as stored")
        sub.add_argument("--types", nargs="+", action="extend", metavar="TYPE",
                         help="only these event types (glob patterns such as 'turn/*' allowed)")
        sub.add_argument("--relative", action="store_true",
                         help="times in seconds since the first event shown")
        _allow_damaged(sub)
        if name == "show":
            sub.add_argument("--from", dest="start", type=_natural, default=0, metavar="SEQ",
                             help="start at this seq")
        else:
            sub.add_argument("-n", type=_natural, default=20, metavar="N",
                             help="how many events (default 20)")
            sub.add_argument("-f", "--follow", action="store_true",
                             help="then print each new event as it is committed, until interrupted (Ctrl-C)")

    _allow_damaged(session_command("inbox", "print the pending inbox rebuilt from the log", _cmd_inbox,
                                   "print a JSON list of {placement, message}"))
    session_command("verify", "check every record without modifying the file", _cmd_verify,
                    "print the result as a JSON object", "the session store folder")
    repair = session_command("repair", "cut off a torn tail, or repair a corrupt file keeping every record "
                             "that verifies", _cmd_repair, None,
                             "the session store folder")
    repair.add_argument("--yes", action="store_true", help="repair without asking")
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
