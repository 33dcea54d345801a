"""What every ``kerman`` command shares: one-line output made safe for a terminal, stores opened
from a folder or a DSN (its password never shown), a session read, errors told in one line."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from typing import Any, Callable, Optional, TypeVar

from .. import Event, FileStore, PostgresStore
from ..errors import (
    CorruptLogError,
    KermanError,
    SessionNotFoundError,
)
from ._timeline import _escape

_T = TypeVar("_T")

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


def _count(n: object, noun: str) -> str:
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


def _shown_id(session_id: object) -> str:
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
        raise _Exit(
            2,
            f"kerman: {_shown(path)} is a PostgreSQL store; verify and repair work on FileStore "
            "folders (PostgreSQL checks every append in its own transaction)",
        )
    # FileStore creates a missing root; an inspection command must not.
    if not os.path.isdir(path):
        raise _Exit(2, f"kerman: no session store at {path}")
    return FileStore(path, durability="none")


def _follow(store: PostgresStore, session_id: str) -> tuple[dict[str, Any], list[Event]]:
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


def _repair_hint(args: argparse.Namespace, session_id: Optional[str] = None) -> str:
    return f"kerman log repair {shlex.quote(args.store)} {shlex.quote(session_id or args.id)}"


def _session_of_file(path: str) -> Optional[str]:
    """The session id a session file's name encodes (the inverse of ``_session_file``)."""
    name = os.path.basename(path)
    if not name.endswith(".jsonl"):
        return None
    stem, out, i = name[: -len(".jsonl")], bytearray(), 0
    while i < len(stem):
        if stem[i] == "~":
            out.append(int(stem[i + 1 : i + 3], 16))
            i += 3
        else:
            out += stem[i].encode()
            i += 1
    return out.decode("utf-8", "replace")


def _parent_damage(error: CorruptLogError, args: argparse.Namespace) -> Optional[str]:
    """For a fork that reads its first events through a corrupt parent's file: the parent's
    id (the damage is there, not in the fork's own file); else ``None``."""
    if not error.path or _is_dsn(args.store) or not getattr(args, "id", None):
        return None
    if os.path.abspath(error.path) == os.path.abspath(_session_file(args.store, args.id)):
        return None
    return _session_of_file(error.path)


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
        parent = _parent_damage(error, args)
        if parent is not None:
            return (
                f'{text}\nkerman: session "{_shown_id(args.id)}" reads its first events from session '
                f'"{_shown_id(parent)}", whose file is corrupt ({where}); nothing was modified. Repair that '
                f"session: {_repair_hint(args, parent)}"
            )
        if getattr(args, "log_command", None) == "repair":
            return f"{text}\nkerman: cannot repair {where}"
        text += (
            f"\nkerman: bad record in {where}; nothing was modified. To read the records that verify, "
            f"add --allow-damaged to show, tail or inbox; to repair the file (keeping every record that "
            f"verifies, and a full .corrupt copy), run: {_repair_hint(args)}"
        )
    return text


def _session_call(method: Callable[[str], _T], session_id: str) -> _T:
    """``method(session_id)``, with an id the store refuses reported as bad usage."""
    try:
        return method(session_id)
    except KermanError:
        raise
    except ValueError as error:  # only the id can be invalid here
        raise _Exit(2, f"kerman: {error}") from None


def positive(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value
