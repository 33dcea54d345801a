"""``kerman log list|show|tail|inbox|verify|repair``: reading a session's log, its inbox, and
repairing a damaged file on explicit confirmation."""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import json
import os
import shlex
import sys
from typing import Any, Callable, Iterable, Optional

from .. import Event, InboxProjection
from .._doubt import marks as doubt_marks
from ..errors import (
    CorruptLogError,
    KermanError,
    ProjectionError,
    SessionNotFoundError,
    UnsupportedFormatError,
)
from ._common import (
    _PLACEMENTS,
    _count,
    _err,
    _Exit,
    _follow,
    _is_dsn,
    _out,
    _parent_damage,
    _postgres,
    _progress,
    _repair_hint,
    _session_call,
    _session_file,
    _shown,
    _shown_id,
    _store,
    human_size,
)
from ._timeline import format_event, message_text, quote, source_tag, traceback_lines


def _read(args: argparse.Namespace) -> tuple[dict[str, Any], list[Event], dict[str, Any]]:
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
    _err(
        f"kerman: {args.id}: the file is damaged; showing the {_count(shown, 'record')} that verify "
        "(a lost seq is a gap); nothing was modified. Skipped:"
    )
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


def _print_events(
    args: argparse.Namespace,
    header: dict[str, Any],
    events: list[Event],
    total: int,
    info: dict[str, Any],
    marks: Optional[dict[int, str]] = None,
) -> None:
    """The events as a timeline (or JSON lines); ``marks`` (seq -> text, ``_doubt.marks``) are
    printed under their events: calls in doubt and outcome-unknown results."""
    if args.json:
        for event in events:
            _out(event.to_json())
    else:
        line = (
            f'session "{_shown_id(header.get("id", args.id))}"  created {_local_time(header.get("createdAt"))}  '
            f"format {header.get('version')}  {_count(total, 'event')}"
        )
        if len(events) != total:
            line += f" (showing {len(events)})"
        _out(line)
        parent = header.get("forkedFrom")
        if isinstance(parent, dict):
            cut = parent.get("seq")
            _out(f'forked from session "{_shown_id(str(parent.get("id")))}" at seq {cut} (events 0–{cut} are its)')
        t0 = events[0].time if events and args.relative else None
        for event in events:
            _out(format_event(event, t0=t0))
            # A failure recorded from a user exception: its traceback, under the event.
            for line in traceback_lines(event):
                _out(f"{'':7}| {line}")
            if marks and event.seq in marks:
                _out(f"{'':7}! {marks[event.seq]}")
    torn = info.get("torn_tail_bytes") or 0
    if torn:
        _err(f"kerman: note: {torn} bytes of torn tail at the end of the file are not shown (they will be truncated on next open)")


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
            status = (
                f"  {r['state']}"
                + (f" by {r['owner']}" if r["owner"] else "")
                + (f", {r['staged']} staged" if r["staged"] else "")
                + status
            )
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
    _print_events(args, header, selected, len(events), info, doubt_marks(events))
    return 0


def _cmd_tail(args: argparse.Namespace) -> int:
    if args.follow:
        if args.allow_damaged:
            raise _Exit(
                2,
                "kerman: --follow and --allow-damaged cannot be combined: a damaged file is not "
                f"followed; read it with --allow-damaged, or repair it first: {_repair_hint(args)}",
            )
        return _follow_tail(args)
    header, events, info = _read(args)
    keep = _type_filter(args.types)
    selected = [e for e in events if keep(e.type)]
    selected = selected[len(selected) - args.n :] if args.n else []
    _print_events(args, header, selected, len(events), info, doubt_marks(events))
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
        selected = selected[len(selected) - args.n :] if args.n else []
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
        raise _Exit(
            1,
            f"kerman: {error}\nkerman: the inbox cannot be rebuilt without the records that are lost; "
            f"the ones that verify are shown by: kerman log show {shlex.quote(args.store)} "
            f"{shlex.quote(args.id)} --allow-damaged",
        ) from None
    if args.json:
        _out(json.dumps([{"placement": p, "message": m.to_dict()} for p, m in items], ensure_ascii=False, separators=(",", ":")))
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
            _out(f"  {quote(message.id, None)[1:-1]}  {quote(message_text(message), None)}{source_tag(message.source)}")
    return 0


def _cmd_fork(args: argparse.Namespace) -> int:
    store = _postgres(args.store) if _is_dsn(args.store) else _store(args.store)
    child = _session_call(lambda sid: store.fork(sid, args.at, args.new_id, inbox=args.inbox), args.id)
    _out(child)
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
            _out(
                json.dumps(
                    {"ok": False, "error": "corrupt", "path": error.path, "line": error.line, "seq": error.seq, "message": str(error)},
                    ensure_ascii=False,
                    separators=(",", ":"),
                )
            )
        raise
    except UnsupportedFormatError as error:
        if args.json:
            _out(
                json.dumps(
                    {
                        "ok": False,
                        "error": "unsupported-format",
                        "path": error.path,
                        "found": error.found,
                        "supported": error.supported,
                        "message": str(error),
                    },
                    ensure_ascii=False,
                    separators=(",", ":"),
                )
            )
        raise
    if args.json:
        _out(json.dumps({"ok": True, **info}, ensure_ascii=False, separators=(",", ":")))
    else:
        _out(_verify_line(info))
    return 0


def _confirm(question: str, args: argparse.Namespace) -> bool:
    stdin = sys.stdin
    if stdin is None or not stdin.isatty():
        raise _Exit(
            1,
            f"kerman: not repairing: confirmation needs a terminal and stdin is not one; to repair anyway, run: {_repair_hint(args)} --yes",
        )
    sys.stdout.write(f"{question} [y/N] ")
    sys.stdout.flush()
    answer = stdin.readline()
    return answer.strip().lower() in ("y", "yes")


def _cmd_repair(args: argparse.Namespace) -> int:
    store = _store(args.store)
    if args.yes:
        # A fork whose parent's file is damaged: the repair is the parent's (its own file is
        # whole), and the error says so.
        try:
            _session_call(store.verify, args.id)
        except CorruptLogError as error:
            if _parent_damage(error, args) is not None:
                raise
        except KermanError:
            pass
    if not args.yes:
        _progress(args, "verifying")
        try:
            info = _session_call(store.verify, args.id)
        except CorruptLogError as error:
            if _parent_damage(error, args) is not None:
                raise
            _out(f"{error.path} is corrupt at line {error.line} (seq {error.seq}):\n  {error}")
            if error.line is not None and error.line <= 1:
                raise _Exit(1, "kerman: the header itself is damaged; repair cannot fix that") from None
            plan = _session_call(lambda sid: store.repair(sid, dry_run=True), args.id)
            _out(f"repair would keep the {_count(plan['kept_events'], 'record')} that verify, each at its seq, and set aside:")
            for line in _plan_lines(plan):
                _out(f"  {line}")
            _out(
                "after copying the whole file to a .corrupt backup next to it (the lines set aside also go, "
                "verbatim, to a .damaged file); each lost seq gets a log/damaged placeholder and a "
                "log/repaired record naming all of this is appended"
            )
        else:
            torn = info.get("torn_tail_bytes") or 0
            if not torn:
                _out(f"nothing to repair: {_verify_line(info)}")
                return 0
            _out(
                f"{info['path']} ends in a torn tail of {torn} bytes; repair would truncate it, "
                f"keeping {_count(info['events'], 'event')} (opening the session would do the same)"
            )
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
    _out(f"repaired: kept {kept} that verify, removed {human_size(removed)}{exact}; the log now holds {_count(result['events'], 'event')}:")
    for line in _plan_lines(result):
        _out(f"  {line}")
    _out(f"backup: {backup}")
    if result.get("quarantine"):
        _out(f"set aside: {result['quarantine']}")
    return 0
