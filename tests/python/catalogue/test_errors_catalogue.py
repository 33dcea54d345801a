"""The bad-input catalogue (issue 5): every row of docs/errors.md is pinned by one test here.

Rows are grouped like the document: messages, log and stores, inbox, loop, CLI. A test name
is cited in the document's "test" column (parametrised rows by their id). Behaviour that is a
crash, a silent acceptance of bad input or an unclear error is written as the correct
(SPEC-derived) behaviour and marked ``xfail(strict=True)`` with the defect in its reason; the
document lists the same rows under "Known defects".

Cases that could crash the interpreter (deep nesting, cycles) run in a child interpreter and
assert it ends normally with a Python exception, never a signal. The unreadable-file and
full-disk rows use real kernel behaviour: as root, a child runs without CAP_DAC_OVERRIDE /
CAP_DAC_READ_SEARCH (``setpriv``) so file modes apply, and a full disk is a 64 KiB tmpfs in a
private mount namespace (``unshare --mount``); where that is not possible they skip with the
reason. No test sleeps or measures time.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest

from conftest import event_record, header_record, plain, session_path, write_raw_session
from kerman import (
    AgentLoop,
    AssistantMessage,
    DuplicateMessageError,
    Enter,
    FileStore,
    Inbox,
    InboxProjection,
    InvalidMessageError,
    LogClosedError,
    MemoryStore,
    Message,
    ModelError,
    ModelReply,
    NotJsonError,
    ProjectionError,
    Reject,
    Retry,
    SessionExistsError,
    SessionLockedError,
    SessionNotFoundError,
    Tool,
    ToolResult,
    ToolResultMessage,
    UnsupportedFormatError,
    UserMessage,
)
from kerman.models import EchoModel, ScriptedModel

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


class Opaque:
    """An arbitrary object: not JSON."""


def nested_list(depth: int) -> list:
    """A list nested ``depth`` levels deep (``depth=1`` is ``[]``), built without recursion."""
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


def run_child(code: str, timeout: float = 100, prefix: Optional[List[str]] = None) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh interpreter (optionally under a ``prefix`` command)."""
    argv = list(prefix or []) + [sys.executable, "-c", textwrap.dedent(code)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def assert_child_raised(proc: subprocess.CompletedProcess, expected: str) -> None:
    """The child ended normally (no signal) after catching ``expected`` (printed as RAISED <name>)."""
    assert proc.returncode == 0, (
        f"child interpreter died with {'signal ' + str(-proc.returncode) if proc.returncode < 0 else 'exit ' + str(proc.returncode)}"
        f"; stdout={proc.stdout[-300:]!r} stderr={proc.stderr[-500:]!r}"
    )
    assert f"RAISED {expected}" in proc.stdout, proc.stdout[-500:]


# =============================================================================================
# Messages
# =============================================================================================

MALFORMED_MESSAGES: Dict[str, Tuple[Callable[[], Any], str, str]] = {
    # id: (construct, field, message start after "invalid message ")
    "empty-id": (lambda: UserMessage("x", id=""), "id", "id: must be a non-empty string"),
    "non-str-id": (lambda: UserMessage("x", id=5), "id", "id: expected a str, got int"),
    "wrong-role": (
        lambda: Message.from_dict({"id": "a", "role": "system", "content": [], "source": {"kind": "user"}}),
        "role",
        'role: expected "user" or "assistant", got "system"',
    ),
    "from-dict-not-object": (lambda: Message.from_dict([1]), "message", "message: expected an object, got list"),
    "from-dict-missing-id": (lambda: Message.from_dict({"role": "user", "content": [], "source": {"kind": "user"}}), "id", "id: missing"),
    "content-dict": (
        lambda: UserMessage({"type": "text", "text": "x"}),
        "content",
        "content: expected a str or a list of blocks, got dict",
    ),
    "content-int": (lambda: UserMessage(5), "content", "content: expected a str or a list of blocks, got int"),
    "content-tuple": (lambda: UserMessage(({"type": "text", "text": "x"},)), "content", "content: tuple is not lossless JSON (use a list)"),
    "from-dict-content-str": (
        lambda: Message.from_dict({"id": "a", "role": "user", "content": "x", "source": {"kind": "user"}}),
        "content",
        "content: expected a list, got string",
    ),
    "block-not-object": (lambda: UserMessage(["x"]), "content[0]", "content[0]: expected a content block object, got string"),
    "block-no-type": (lambda: UserMessage([{"text": "x"}]), "content[0].type", "content[0].type: missing"),
    "block-type-not-str": (lambda: UserMessage([{"type": 5}]), "content[0].type", "content[0].type: expected a non-empty string"),
    "text-not-str": (
        lambda: UserMessage([{"type": "text", "text": 5}]),
        "content[0].text",
        "content[0].text: expected a string, got number",
    ),
    "text-missing": (lambda: UserMessage([{"type": "text"}]), "content[0].text", "content[0].text: missing"),
    "reasoning-not-str": (
        lambda: AssistantMessage([{"type": "reasoning", "text": 5}]),
        "content[0].text",
        "content[0].text: expected a string, got number",
    ),
    "tool-call-id-not-str": (
        lambda: AssistantMessage([{"type": "tool-call", "id": 5, "name": "t", "arguments": "{}"}]),
        "content[0].id",
        "content[0].id: expected a string, got number",
    ),
    "nan": (lambda: UserMessage([{"type": "x", "n": float("nan")}]), "content[0].n", "content[0].n: NaN is not lossless JSON"),
    "inf": (lambda: UserMessage([{"type": "x", "n": float("inf")}]), "content[0].n", "content[0].n: inf is not lossless JSON"),
    "minus-inf": (lambda: UserMessage([{"type": "x", "n": float("-inf")}]), "content[0].n", "content[0].n: -inf is not lossless JSON"),
    "set": (lambda: UserMessage([{"type": "x", "n": {1}}]), "content[0].n", "content[0].n: set is not lossless JSON (use a list)"),
    "tuple": (lambda: UserMessage([{"type": "x", "n": (1, 2)}]), "content[0].n", "content[0].n: tuple is not lossless JSON (use a list)"),
    "object": (lambda: UserMessage([{"type": "x", "n": Opaque()}]), "content[0].n", "content[0].n: Opaque is not lossless JSON"),
    "bytes": (lambda: UserMessage([{"type": "x", "n": b"a"}]), "content[0].n", "content[0].n: bytes is not lossless JSON"),
    "str-subclass": (
        lambda: UserMessage([{"type": "x", "n": type("S", (str,), {})("a")}]),
        "content[0].n",
        "content[0].n: S is not lossless JSON",
    ),
    "non-str-key": (lambda: UserMessage([{"type": "x", 1: 2}]), "content[0]", "content[0]: key 1 of type int is not a str"),
    "huge-int": (
        lambda: UserMessage([{"type": "x", "n": 2**64}]),
        "content[0].n",
        "content[0].n: integer out of the 64-bit range is not lossless JSON",
    ),
    "huge-negative-int": (
        lambda: UserMessage([{"type": "x", "n": -(2**63) - 1}]),
        "content[0].n",
        "content[0].n: integer out of the 64-bit range is not lossless JSON",
    ),
    "surrogate-in-block": (
        lambda: UserMessage([{"type": "text", "text": "a\ud800"}]),
        "content[0].text",
        "content[0].text: string is not valid Unicode (lone surrogate)",
    ),
    "surrogate-in-key": (lambda: UserMessage([{"type": "x", "\udc00": 1}]), "content[0]", "content[0]: key is not valid Unicode"),
    "surrogate-in-source": (
        lambda: UserMessage("x", source={"kind": "plugin", "p": "\ud800"}),
        "source.p",
        "source.p: string is not valid Unicode (lone surrogate)",
    ),
    "surrogate-in-from-dict-id": (
        lambda: Message.from_dict({"id": "\ud800", "role": "user", "content": [], "source": {"kind": "user"}}),
        "id",
        "id: string is not valid Unicode (lone surrogate)",
    ),
    "source-not-dict": (lambda: UserMessage("x", source="user"), "source", "source: expected a dict, got str"),
    "source-no-kind": (lambda: UserMessage("x", source={}), "source.kind", "source.kind: missing"),
    "source-nan": (
        lambda: UserMessage("x", source={"kind": "plugin", "x": float("nan")}),
        "source.x",
        "source.x: NaN is not lossless JSON",
    ),
    "with-content-nan": (
        lambda: UserMessage("x").with_content([{"type": "x", "n": float("nan")}]),
        "content[0].n",
        "content[0].n: NaN is not lossless JSON",
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED_MESSAGES))
def test_message_malformed(case):
    construct, field, start = MALFORMED_MESSAGES[case]
    with pytest.raises(InvalidMessageError) as info:
        construct()
    assert isinstance(info.value, ValueError)
    assert info.value.field == field
    assert str(info.value).startswith("invalid message " + start), str(info.value)


def test_message_boundary_values_accepted():
    """The largest lossless values are accepted and come back unchanged."""
    content = [{"type": "x", "u": 2**64 - 1, "i": -(2**63), "f": 1e-320, "b": True, "n": None, "s": ""}]
    m = UserMessage(content)
    assert m.content == content
    assert Message.from_dict(m.to_dict()) == m


SURROGATE_SHORTHANDS: Dict[str, Callable[[], Any]] = {
    "content-str": lambda: UserMessage("\ud800"),
    "with-content-str": lambda: UserMessage("x").with_content("\ud800"),
    "id-argument": lambda: UserMessage("x", id="\ud800"),
}


@pytest.mark.parametrize("case", list(SURROGATE_SHORTHANDS))
def test_message_lone_surrogate_shorthand(case):
    with pytest.raises(InvalidMessageError) as info:
        SURROGATE_SHORTHANDS[case]()
    assert info.value.field in ("content[0].text", "id")


def _deep_child(kind: str, depth: int) -> str:
    """Child code: builds the value iteratively, feeds it to Kerman, prints RAISED <class>."""
    return f"""
        import kerman
        value = []
        for _ in range({depth} - 1):
            value = [value]
        try:
            {kind}
            print("ACCEPTED")
        except Exception as e:
            print("RAISED", type(e).__name__, str(e)[:200])
    """


def test_message_deeply_nested_content_subprocess():
    proc = run_child(_deep_child('kerman.UserMessage([{"type": "x", "v": value}])', 100_000))
    assert_child_raised(proc, "InvalidMessageError")


def test_message_cyclic_content_subprocess():
    proc = run_child("""
        import kerman
        a = []
        a.append(a)
        try:
            kerman.UserMessage([{"type": "x", "v": a}])
            print("ACCEPTED")
        except Exception as e:
            print("RAISED", type(e).__name__, str(e)[:200])
    """)
    assert_child_raised(proc, "InvalidMessageError")


def test_message_nested_beyond_decoder_limit_survives_or_is_refused(tmp_path):
    store = FileStore(tmp_path / "s", durability="none")
    log = store.create("deep")
    inbox = Inbox(log)
    message = None
    try:
        message = UserMessage([{"type": "x", "v": nested_list(125)}])
        inbox.append("next-turn", message)
    except InvalidMessageError:
        assert len(log) == 0  # refused up front: acceptable, nothing logged
        log.close()
        return
    log.close()
    log = store.open("deep")
    try:
        assert Inbox(log).next_turn == (message,)
    finally:
        log.close()


# =============================================================================================
# Session log: event data and types
# =============================================================================================

NOT_JSON_DATA: Dict[str, Tuple[Any, str]] = {
    "nan": ({"a": float("nan")}, "data.a: NaN is not lossless JSON"),
    "inf": (float("inf"), "data: inf is not lossless JSON"),
    "set": ({1, 2}, "data: set is not lossless JSON (use a list)"),
    "tuple": ((1, 2), "data: tuple is not lossless JSON (use a list)"),
    "object": (Opaque(), "data: Opaque is not lossless JSON"),
    "bytes": (b"a", "data: bytes is not lossless JSON"),
    "message-value": (UserMessage("x", id="m"), "data: UserMessage is not lossless JSON"),
    "non-str-key": ({1: 2}, "data: key 1 of type int is not a str"),
    "none-key": ({None: 2}, "data: key None of type NoneType is not a str"),
    "huge-int": (2**64, "data: integer out of the 64-bit range is not lossless JSON (use a string)"),
    "surrogate-value": ("\ud800", "data: string is not valid Unicode (lone surrogate)"),
    "surrogate-key": ({"\ud800": 1}, "data: key is not valid Unicode"),
}


@pytest.mark.parametrize("case", list(NOT_JSON_DATA))
def test_event_data_not_json(log, case):
    data, detail = NOT_JSON_DATA[case]
    log.append("goal/change", {"goal": "before"})
    with pytest.raises(NotJsonError) as info:
        log.append("plugin/x", data)
    assert isinstance(info.value, ValueError)
    assert str(info.value) == f'session event "plugin/x" carries non-JSON-serializable data: {detail}'
    assert len(log) == 1  # a failing append changes nothing


@pytest.mark.parametrize(
    "type_",
    [
        "turn/start",
        "turn/end",
        "step/start",
        "user/message",
        "assistant/message",
        "tool/result",
        "request/header",
        "agent/inbox/spliced",
        "output/validated",
    ],
)
def test_event_type_owned_by_loop(log, type_):
    with pytest.raises(ValueError, match=f'^event type "{type_}" is owned by the Inbox and the AgentLoop'):
        log.append(type_, {})
    assert len(log) == 0


@pytest.mark.parametrize(
    "type_, exc, start",
    [("", ValueError, 'invalid event type "": expected a non-empty string'), (5, TypeError, "event type must be a str, got int")],
    ids=["empty", "int"],
)
def test_event_type_invalid(log, type_, exc, start):
    with pytest.raises(exc) as info:
        log.append(type_, {})
    assert str(info.value).startswith(start)
    assert len(log) == 0


def test_event_type_nul(log):
    """One contract on every store (the `log` fixture runs on each): PostgreSQL text cannot
    hold NUL, so no store keeps it in an event type; NUL in the data is kept."""
    with pytest.raises(ValueError) as info:
        log.append("x/a\x00b", {})
    assert str(info.value) == (
        'cannot store this: event type "x/a\\0b" contains NUL (U+0000), which no store keeps (PostgreSQL text cannot hold it)'
    )
    assert len(log) == 0
    assert log.append("x/ok", {"t": "a\x00b"}).data == {"t": "a\x00b"}


def test_event_type_lone_surrogate(log):
    with pytest.raises(ValueError, match="Unicode|surrogate"):
        log.append("x/\ud800", {})


def test_append_to_closed_log(log):
    log.close()
    with pytest.raises(LogClosedError, match=r'^session ".*" is closed'):
        log.append("goal/change", {})


@pytest.mark.parametrize("depth", [100])
def test_event_data_nested_to_the_limit_roundtrips(tmp_path, depth):
    """The deepest event data accepted (``MAX_DEPTH`` = 100 levels; deeper is refused, see the
    next row) reads back, also after a reopen."""
    store = FileStore(tmp_path / "s", durability="none")
    value = nested_list(depth)
    with store.create("d") as log:
        assert log.append("plugin/deep", value).data == value
    with store.open("d") as log:
        assert log[0].data == value


@pytest.mark.parametrize("depth", [128, 1000])
def test_event_data_nested_beyond_decoder_limit_roundtrips_or_is_refused(tmp_path, depth):
    store = FileStore(tmp_path / "s", durability="none")
    value = nested_list(depth)
    log = store.create("d")
    try:
        event = log.append("plugin/deep", value)
    except NotJsonError:
        assert len(log) == 0
        log.close()
        return
    assert event.data == value
    log.close()
    with store.open("d") as log:
        assert log[0].data == value


def test_event_data_deeply_nested_subprocess():
    proc = run_child(_deep_child('kerman.MemoryStore().create().append("plugin/deep", value)', 100_000))
    assert_child_raised(proc, "NotJsonError")


def test_event_data_cyclic_subprocess():
    proc = run_child("""
        import kerman
        d = {}
        d["self"] = d
        try:
            kerman.MemoryStore().create().append("plugin/x", d)
            print("ACCEPTED")
        except Exception as e:
            print("RAISED", type(e).__name__, str(e)[:200])
    """)
    assert_child_raised(proc, "NotJsonError")


def test_event_data_50mb_string_roundtrips(tmp_path):
    """Very large payloads work: a 50 MB string survives append, a strict flush and a reopen."""
    big = "x" * (50 * 1024 * 1024)
    store = FileStore(tmp_path / "s", durability="strict")

    async def write() -> None:
        log = store.create("big")
        log.append("plugin/big", {"s": big})
        await log.flush()
        log.close()

    asyncio.run(write())
    with store.open("big") as log:
        assert log[0].data["s"] == big


def test_message_50mb_roundtrips_through_inbox(tmp_path):
    big = "y" * (50 * 1024 * 1024)
    store = FileStore(tmp_path / "s", durability="none")
    with store.create("big") as log:
        Inbox(log).append("next-turn", UserMessage(big, id="big"))
    with store.open("big") as log:
        assert Inbox(log).next_turn[0].text == big


# =============================================================================================
# Stores: session ids, ownership, format, permissions, full disk
# =============================================================================================

ESCAPING_IDS = ["../x", "/etc/passwd", "a/../../b", ".", "..", "~41", "a\nb", "..\\..\\win"]


@pytest.mark.parametrize("session_id", ESCAPING_IDS, ids=lambda s: repr(s))
def test_session_id_cannot_escape_root(tmp_path, session_id):
    root = tmp_path / "root"
    store = FileStore(root, durability="none")
    with store.create(session_id) as log:
        log.append("goal/change", {"goal": "x"})
    assert sorted(tmp_path.iterdir()) == [root]  # nothing written beside the root
    names = os.listdir(root)
    assert names == [session_path(root, session_id).name]
    assert "/" not in names[0] and not names[0].startswith(".")
    assert store.list() == [session_id]
    with store.open(session_id) as log:
        assert log.id == session_id and len(log) == 1


@pytest.mark.parametrize(
    "session_id, start",
    [
        ("a\0b", 'invalid session id: "a\\0b" contains NUL'),
        ("", "invalid session id: a session id must be a non-empty string"),
        ("é" * 40, 'invalid session id: "' + "é" * 40 + '" is too long'),
    ],
    ids=["nul", "empty", "too-long"],
)
@pytest.mark.parametrize("op", ["create", "open", "exists", "delete"])
def test_session_id_invalid(tmp_path, session_id, start, op):
    root = tmp_path / "root"
    store = FileStore(root, durability="none")
    with pytest.raises(ValueError) as info:
        getattr(store, op)(session_id)
    assert str(info.value).startswith(start), str(info.value)
    assert not root.exists() or os.listdir(root) == []


@pytest.mark.parametrize("session_id", ["a\0b", ""], ids=["nul", "empty"])
def test_session_id_invalid_memory(session_id):
    with pytest.raises(ValueError, match="^invalid session id"):
        MemoryStore().create(session_id)


@pytest.mark.parametrize("make", [MemoryStore, "file"])
def test_session_id_lone_surrogate(tmp_path, make):
    store = MemoryStore() if make is MemoryStore else FileStore(tmp_path / "r", durability="none")
    with pytest.raises(ValueError, match="invalid session id"):
        store.create("\ud800")


def test_session_create_existing_and_open_missing(store):
    store.create("s").close()
    with pytest.raises(SessionExistsError, match='^session "s" already exists'):
        store.create("s")
    with pytest.raises(SessionNotFoundError, match='^session "missing" not found'):
        store.open("missing")


def test_session_opened_twice_same_process(store):
    """Every store says that this process holds it, and how to release it (issue 11 item 1)
    or share it (issue 15: ``reuse=True``; a PostgresStore for a session this process holds
    through a store with the same DSN). A PostgreSQL lease held elsewhere names no process:
    ``test_reuse_hands_back_the_log_this_process_holds`` in postgres/."""
    here = (
        '^session "s" is locked by a session log still open in this process: close that log first '
        r"\(log.close\(\), or open it as `with store.open\(id\) as log:` so it closes itself; "
        r"a handle dropped but not yet garbage-collected is released by gc.collect\(\)\)"
    )
    # open (not delete) also names the way to share the open log (issue 15: a notebook re-run)
    reuse = r"; or take that same log back with store.open\(id, reuse=True\) \(a notebook cell that opens it running again\)$"
    log = store.create("s")
    try:
        with pytest.raises(SessionLockedError, match=here + reuse):
            store.open("s")
        if isinstance(store, FileStore):
            with pytest.raises(SessionLockedError, match=here + r"$"):
                store.delete("s")
    finally:
        log.close()
    store.open("s").close()  # released on close


def test_session_opened_twice_other_process(tmp_path):
    root = tmp_path / "root"
    store = FileStore(root, durability="none")
    child = f"""
        import kerman
        store = kerman.FileStore({str(root)!r}, durability="none")
        try:
            store.open("s")
            print("OPENED")
        except kerman.SessionLockedError as e:
            print("RAISED SessionLockedError", e)
    """
    log = store.create("s")  # this process owns the session while the child tries
    try:
        proc = run_child(child)
    finally:
        log.close()
    assert_child_raised(proc, "SessionLockedError")
    proc = run_child(child)  # released on close: the child may open it now
    assert proc.returncode == 0 and "OPENED" in proc.stdout, proc.stdout + proc.stderr


def test_newer_format_log(tmp_path):
    root = tmp_path / "root"
    path = session_path(root, "future")
    raw = write_raw_session(path, header_record("future", version=3), [event_record(0, "goal/change", {})])
    with pytest.raises(UnsupportedFormatError) as info:
        FileStore(root).open("future")
    err = info.value
    assert (err.found, err.supported, err.path) == (3, 2, str(path))
    assert str(err).startswith(f"session log {path} uses format version 3, but this kerman reads versions 1 and 2")
    assert path.read_bytes() == raw  # untouched
    with pytest.raises(UnsupportedFormatError):
        FileStore(root).verify("future")
    with pytest.raises(UnsupportedFormatError):
        FileStore(root).repair("future")
    assert path.read_bytes() == raw


def test_header_with_future_keys_is_read(tmp_path):
    root = tmp_path / "root"
    write_raw_session(session_path(root, "s"), header_record("s", futureKey=[1]), [event_record(0, "goal/change", {})])
    with FileStore(root).open("s") as log:
        assert log.header["futureKey"] == [1]


def _unreadable_prefix() -> Optional[List[str]]:
    """How to run a child for which file modes apply, or None (with the reason in a skip)."""
    if not IS_ROOT:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    prefix = [setpriv, "--inh-caps=-dac_override,-dac_read_search", "--bounding-set=-dac_override,-dac_read_search"]
    probe = subprocess.run(prefix + ["true"], capture_output=True)
    return prefix if probe.returncode == 0 else None


def _make_unreadable_store(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    store = FileStore(root, durability="none")
    for sid in ("good", "locked-out"):
        with store.create(sid) as log:
            log.append("goal/change", {"goal": sid})
    os.chmod(session_path(root, "locked-out"), 0o000)
    return root


def test_session_file_without_read_permission(tmp_path):
    prefix = _unreadable_prefix()
    if prefix is None:
        pytest.skip("running as root and cannot drop CAP_DAC_OVERRIDE (no setpriv): root bypasses file modes")
    root = _make_unreadable_store(tmp_path)
    proc = run_child(
        f"""
        import kerman
        store = kerman.FileStore({str(root)!r}, durability="none")
        for op in ("open", "verify"):
            try:
                getattr(store, op)("locked-out")
                print("ACCEPTED", op)
            except kerman.LogError as e:
                print("RAISED", type(e).__name__, op, e)
        print("GOOD", len(store.open("good")))
    """,
        prefix=prefix,
    )
    assert proc.returncode == 0, proc.stderr
    path = session_path(root, "locked-out")
    assert f"RAISED LogError open opening {path}: Permission denied (os error 13)" in proc.stdout, proc.stdout
    assert f"RAISED LogError verify opening {path}: Permission denied (os error 13)" in proc.stdout, proc.stdout
    assert "GOOD 1" in proc.stdout  # other sessions are unaffected


def test_unreadable_session_file_does_not_break_listing(tmp_path):
    prefix = _unreadable_prefix()
    if prefix is None:
        pytest.skip("running as root and cannot drop CAP_DAC_OVERRIDE (no setpriv): root bypasses file modes")
    root = _make_unreadable_store(tmp_path)
    proc = run_child(
        f"""
        import kerman
        try:
            print("LIST", sorted(kerman.FileStore({str(root)!r}).list()))
        except kerman.LogError as e:
            print("RAISED", type(e).__name__, e)
    """,
        prefix=prefix,
    )
    assert "LIST" in proc.stdout and "'good'" in proc.stdout, proc.stdout
    cli = subprocess.run(prefix + [sys.executable, "-m", "kerman", "log", "list", str(root)], capture_output=True, text=True, timeout=100)
    assert cli.returncode == 0 and "good" in cli.stdout, cli.stdout + cli.stderr


FULL_DISK_CHILD = """
    import asyncio, os, sys, kerman
    root, durability = sys.argv[1], sys.argv[2]

    async def main():
        store = kerman.FileStore(root, durability=durability)
        log = store.create("s")
        error = None
        for i in range(1000):  # 1000 x ~1 KB into 64 KiB: the disk fills
            try:
                log.append("plugin/pad", {"i": i, "pad": "p" * 1000})
                await log.flush()
            except kerman.LogWriteError as e:
                error = e
                break
        print("FIRST", type(error).__name__, isinstance(error, OSError), error)
        for what, call in (("append", lambda: log.append("plugin/x", 1)),):
            try:
                call()
                print("AFTER ok")
            except kerman.LogWriteError as e:
                print("AFTER LogWriteError")
        try:
            log.close()
        except kerman.LogWriteError:
            pass
        with store.open("s") as again:
            print("REOPENED", len(again), [e.data["i"] for e in again.events()] == list(range(len(again))))
        print("VERIFY", store.verify("s")["torn_tail_bytes"])

    asyncio.run(main())
"""


def _full_disk_prefix(mount_point: Path) -> Optional[List[str]]:
    unshare = shutil.which("unshare")
    if unshare is None or not IS_ROOT:
        return None
    probe = subprocess.run([unshare, "--mount", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {mount_point}"], capture_output=True)
    if probe.returncode != 0:
        return None
    return [unshare, "--mount", "sh", "-c", f'mount -t tmpfs -o size=64k tmpfs {mount_point} && exec "$@"', "sh"]


@pytest.mark.parametrize("durability", ["strict", "checkpoint", "none"])
def test_full_disk(tmp_path, durability):
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    prefix = _full_disk_prefix(mount_point)
    if prefix is None:
        pytest.skip("cannot mount a tiny tmpfs in a private mount namespace (needs root and unshare); a full disk is not simulated")
    argv = prefix + [sys.executable, "-c", textwrap.dedent(FULL_DISK_CHILD), str(mount_point / "root"), durability]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr[-800:]
    out = proc.stdout
    assert "FIRST LogWriteError True session log write failed: write failed: No space left on device (os error 28)" in out, out
    assert "AFTER LogWriteError" in out, out  # poisoned until reopened
    assert "REOPENED" in out and " True" in out.split("REOPENED", 1)[1].splitlines()[0], out
    assert "VERIFY 0" in out, out  # no partial record left behind


# =============================================================================================
# Inbox and projections
# =============================================================================================


@pytest.fixture
def inbox(memory_log):
    ib = Inbox(memory_log)
    ib.append("next-turn", UserMessage("a", id="a"))
    return ib


def _unchanged(inbox: Inbox, before: tuple, log_len: int) -> None:
    assert (inbox.next_turn, inbox.next_step) == before
    assert len(inbox.log) == log_len


@pytest.mark.parametrize("target", ["next_turn", "NEXT-TURN", "later", None, 1])
@pytest.mark.parametrize("op", ["append", "prepend", "splice", "claim"])
def test_inbox_wrong_target(inbox, op, target):
    before, n = (inbox.next_turn, inbox.next_step), len(inbox.log)
    call = {
        "append": lambda: inbox.append(target, "x"),
        "prepend": lambda: inbox.prepend(target, "x"),
        "splice": lambda: inbox.splice(target, 0, 0, ["x"]),
        "claim": lambda: inbox.claim(target, 1),
    }[op]
    with pytest.raises(ValueError) as info:
        call()
    assert str(info.value) == f'target must be "next-turn" or "next-step", got {target!r}'
    _unchanged(inbox, before, n)


@pytest.mark.parametrize(
    "start, delete_count, name, got",
    [
        (0.0, 0, "start", "float"),
        (True, 0, "start", "bool"),
        ("0", 0, "start", "str"),
        (None, 0, "start", "NoneType"),
        (0, 1.0, "delete_count", "float"),
        (0, False, "delete_count", "bool"),
    ],
    ids=["start-float", "start-bool", "start-str", "start-none", "delete-float", "delete-bool"],
)
def test_inbox_bad_coordinates(inbox, start, delete_count, name, got):
    before, n = (inbox.next_turn, inbox.next_step), len(inbox.log)
    with pytest.raises(TypeError, match=f"^{name} must be an int, got {got}$"):
        inbox.splice("next-turn", start, delete_count, ["x"])
    _unchanged(inbox, before, n)


def test_inbox_huge_coordinates_clamp(inbox):
    """Out-of-range ints are Python slice semantics, logged normalised (SPEC 4.1)."""
    inbox.splice("next-turn", 10**30, 0, [UserMessage("z", id="z")])
    assert inbox.log[-1].data["start"] == 1
    removed = inbox.splice("next-turn", -(10**30), 10**30)
    assert [m.id for m in removed] == ["a", "z"]
    assert inbox.log[-1].data == {"target": "next-turn", "start": 0, "removedCount": 2, "inserted": [], "outcome": "canceled"}


@pytest.mark.parametrize(
    "call, start",
    [
        (lambda ib: ib.splice("next-turn", 0, 0, "xy"), "inserted must be a sequence of messages, not a str"),
        (lambda ib: ib.splice("next-turn", 0, 0, [5]), "expected a str or a UserMessage, got int"),
        (lambda ib: ib.splice("next-turn", 0, 0, [{"type": "text", "text": "x"}]), "expected a str or a UserMessage, got dict"),
        (lambda ib: ib.append("next-turn", AssistantMessage("x")), "expected a str or a UserMessage, got AssistantMessage"),
        (lambda ib: ib.append("next-step", ToolResultMessage("c", "x")), "expected a str or a UserMessage, got ToolResultMessage"),
        (lambda ib: ib.append("next-turn", None), "expected a str or a UserMessage, got NoneType"),
        (lambda ib: ib.replace("a", 5), "expected a str or a UserMessage, got int"),
    ],
    ids=["inserted-str", "inserted-int", "inserted-dict", "assistant", "tool-result", "none", "replace-int"],
)
def test_inbox_not_a_user_message(inbox, call, start):
    before, n = (inbox.next_turn, inbox.next_step), len(inbox.log)
    with pytest.raises(TypeError, match="^" + start):
        call(inbox)
    _unchanged(inbox, before, n)


DUPLICATES: Dict[str, Tuple[Callable[[Inbox], Any], Callable[[Inbox], Any], str]] = {
    # id: (preparation, the failing call, the duplicate id)
    "same-list": (lambda ib: None, lambda ib: ib.append("next-turn", UserMessage("b", id="a")), "a"),
    "across-lists": (lambda ib: None, lambda ib: ib.prepend("next-step", UserMessage("b", id="a")), "a"),
    "within-one-batch": (
        lambda ib: None,
        lambda ib: ib.splice("next-step", 0, 0, [UserMessage("b", id="z"), UserMessage("c", id="z")]),
        "z",
    ),
    "replace-onto-other-pending": (
        lambda ib: ib.append("next-step", UserMessage("q", id="q")),
        lambda ib: ib.replace("a", UserMessage("n", id="q")),
        "q",
    ),
}


@pytest.mark.parametrize("case", list(DUPLICATES))
def test_inbox_duplicate_id(inbox, case):
    prepare, call, dup = DUPLICATES[case]
    prepare(inbox)
    before, n = (inbox.next_turn, inbox.next_step), len(inbox.log)
    with pytest.raises(DuplicateMessageError) as info:
        call(inbox)
    assert str(info.value) == f'message "{dup}" is already pending'
    assert isinstance(info.value, ValueError)
    _unchanged(inbox, before, n)


def test_inbox_same_id_after_claim_is_accepted(inbox):
    """Uniqueness holds only while pending (reference 3.2, 10.19)."""
    inbox.claim("next-turn", 1)
    inbox.append("next-turn", UserMessage("again", id="a"))
    assert [m.id for m in inbox.next_turn] == ["a"]


def test_inbox_lone_surrogate_str(inbox):
    with pytest.raises(InvalidMessageError):
        inbox.append("next-turn", "\ud800")


@pytest.mark.parametrize(
    "turn, exc", [("1", TypeError), (1.0, TypeError), (-1, OverflowError), (2**70, OverflowError)], ids=["str", "float", "negative", "huge"]
)
def test_inbox_claim_bad_turn(inbox, turn, exc):
    before, n = (inbox.next_turn, inbox.next_step), len(inbox.log)
    with pytest.raises(exc):
        inbox.claim("next-turn", turn)
    _unchanged(inbox, before, n)


def test_inbox_closed_log(memory_log):
    inbox = Inbox(memory_log)
    memory_log.close()
    with pytest.raises(LogClosedError):
        inbox.append("next-turn", "x")
    assert len(inbox) == 0


SPLICE = "agent/inbox/spliced"
_M = UserMessage("a", id="a").to_dict()
BAD_SPLICES: Dict[str, Tuple[Any, str]] = {
    "data-not-object": ([1], "invalid inbox splice: payload is not an object"),
    "bad-target": ({"target": "later", "start": 0, "inserted": [_M]}, 'invalid inbox splice: target must be "next-turn" or "next-step"'),
    "start-beyond-list": ({"target": "next-turn", "start": 3, "inserted": [_M]}, "invalid inbox splice"),
    "removed-beyond-list": ({"target": "next-turn", "start": 0, "removedCount": 2, "inserted": []}, "invalid inbox splice"),
    "negative-start": (
        {"target": "next-turn", "start": -1, "inserted": [_M]},
        "invalid inbox splice: start must be a non-negative integer",
    ),
    "bad-message": ({"target": "next-turn", "start": 0, "inserted": [{"id": ""}]}, "invalid inbox splice: inserted[0]: "),
    "assistant-message": (
        {"target": "next-turn", "start": 0, "inserted": [AssistantMessage("x").to_dict()]},
        "invalid inbox splice: inserted[0] is not a user message",
    ),
    "duplicate-id": ({"target": "next-turn", "start": 0, "inserted": [_M, _M]}, 'message "a" is already pending'),
}


@pytest.mark.parametrize("case", list(BAD_SPLICES))
def test_projection_bad_splice(case):
    data, detail = BAD_SPLICES[case]
    with pytest.raises(ProjectionError) as info:
        InboxProjection().apply({"type": SPLICE, "seq": 7, "time": 0, "data": data})
    assert info.value.seq == 7
    assert str(info.value).startswith("invalid persisted inbox splice at session seq 7: " + detail), str(info.value)


def test_projection_not_an_event():
    with pytest.raises(TypeError, match="^expected an Event or an event dict, got int"):
        InboxProjection().apply(5)


@pytest.mark.parametrize("case", ["bad-target", "duplicate-id"])
def test_inbox_replay_bad_persisted_splice(tmp_path, case):
    root = tmp_path / "root"
    good = {"target": "next-turn", "start": 0, "inserted": [UserMessage("b", id="b").to_dict()]}
    write_raw_session(
        session_path(root, "s"),
        header_record("s"),
        [event_record(0, SPLICE, good, surface_op=None), event_record(1, SPLICE, BAD_SPLICES[case][0])],
    )
    with FileStore(root).open("s") as log:
        with pytest.raises(ProjectionError) as info:
            Inbox(log)
        assert info.value.seq == 1
        assert str(info.value).startswith("invalid persisted inbox splice at session seq 1")


# =============================================================================================
# AgentLoop
# =============================================================================================


class Run:
    """One turn's outcome: the log's events and the agent/error live events."""

    def __init__(self, log: Any, errors: List[Any]) -> None:
        self.events = list(log.events())
        self.errors = errors

    def of(self, type_: str) -> List[Any]:
        return [e for e in self.events if e.type == type_]

    @property
    def end(self) -> dict:
        ends = self.of("turn/end")
        assert len(ends) == 1, [e.data for e in ends]
        return ends[0].data["reason"]


def run_turn(model: Any, setup: Optional[Callable[[AgentLoop], None]] = None, prompt: Any = "hi") -> Run:
    async def main() -> Run:
        loop = AgentLoop(model)
        errors: List[Any] = []
        loop.on("agent/error", errors.append)
        if setup is not None:
            setup(loop)
        loop.followup(prompt)
        await loop.when_idle()
        run = Run(loop.log, errors)
        await loop.aclose()
        return run

    return asyncio.run(main())


def assert_failed(run: Run, code: str, message_start: str, exception: Optional[type] = None) -> None:
    reason = run.end
    assert reason["kind"] == "error", reason
    assert reason["error"]["code"] == code, reason
    assert reason["error"]["message"].startswith(message_start), reason
    assert len(run.errors) == 1 and run.errors[0].error == reason["error"]
    if exception is None:
        assert run.errors[0].exception is None
    else:
        assert isinstance(run.errors[0].exception, exception)


def with_pre_step(result: Callable[[], Any]) -> Callable[[AgentLoop], None]:
    def setup(loop: AgentLoop) -> None:
        @loop.pre_step
        async def listener(step, next):
            return result()

    return setup


PRE_STEP_GARBAGE: Dict[str, Callable[[], Any]] = {
    "none": lambda: None,
    "str": lambda: "enter",
    "int": lambda: 5,
    "list": lambda: [],
    "object": lambda: Opaque(),
    "dict-unknown-kind": lambda: {"kind": "maybe"},
    "dict-no-kind": lambda: {"messages": []},
    "dict-enter-no-messages": lambda: {"kind": "enter"},
    "dict-enter-messages-str": lambda: {"kind": "enter", "messages": "hi"},
    "enter-int": lambda: Enter([5]),
    "enter-dict": lambda: Enter([{"type": "text", "text": "x"}]),
    "enter-assistant": lambda: Enter([AssistantMessage("x", id="as")]),
    "reject-int-reason": lambda: Reject(5),
    "dict-reject-int-reason": lambda: {"kind": "reject", "reason": 5},
    "retry": lambda: Retry(),
}


@pytest.mark.parametrize("case", list(PRE_STEP_GARBAGE))
def test_pre_step_garbage(case):
    value = PRE_STEP_GARBAGE[case]()
    run = run_turn(EchoModel(), with_pre_step(lambda: value))
    shown = repr(value) if not isinstance(value, Opaque) else "<"
    assert_failed(run, "INVALID_DECISION", f"pre-step listener returned {shown}")
    assert run.end["error"]["message"].endswith("; expected Enter or Reject")
    assert run.of("user/message") == [] and run.of("step/start") == []


def test_pre_step_enter_none_raises_in_listener():
    """``Enter(None)`` raises TypeError inside the listener: user code failing fails the turn."""
    run = run_turn(EchoModel(), with_pre_step(lambda: Enter(None)))
    assert_failed(run, "UNKNOWN", "'NoneType' object is not iterable", TypeError)


def test_pre_step_enter_with_a_str():
    try:
        decision = Enter("abc")
    except TypeError:
        return  # refused at construction: correct
    run = run_turn(EchoModel(), with_pre_step(lambda: decision))
    assert run.end["kind"] == "error" and run.of("user/message") == []


def test_pre_step_enter_duplicate_ids_logged_as_given():
    """Duplicate ids inside one Enter are entered as given (reference 10.19: durable
    ``user/message`` ids are not unique across the log)."""
    run = run_turn(EchoModel(), with_pre_step(lambda: Enter([UserMessage("a", id="d"), UserMessage("b", id="d")])))
    assert run.end == {"kind": "completed"}
    assert [e.data["id"] for e in run.of("user/message")] == ["d", "d"]


def test_pre_step_raises():
    def boom():
        raise RuntimeError("plugin broke")

    run = run_turn(EchoModel(), with_pre_step(boom))
    assert_failed(run, "UNKNOWN", "plugin broke", RuntimeError)


def with_before_request(result: Callable[[Any], Any]) -> Callable[[AgentLoop], None]:
    def setup(loop: AgentLoop) -> None:
        @loop.before_request
        async def listener(request, next):
            return result(request)

    return setup


@pytest.mark.parametrize("value", [None, "x", 5, {"messages": []}], ids=["none", "str", "int", "dict"])
def test_before_request_garbage(value):
    run = run_turn(EchoModel(), with_before_request(lambda r: value))
    assert_failed(run, "INVALID_REQUEST", f"before_request listener returned {value!r}; expected a ModelRequest")
    assert run.of("assistant/message") == []


@pytest.mark.parametrize("bad", [float("nan"), {1}], ids=["nan", "set"])
def test_before_request_options_not_json(bad):
    def mutate(request):
        request.options["temperature"] = bad
        return request

    run = run_turn(EchoModel(), with_before_request(mutate))
    assert run.end["kind"] == "error"
    assert "options" in run.end["error"]["message"] or "request/header" in run.end["error"]["message"]


@pytest.mark.parametrize("value", [None, 5, "retry", {"kind": "nope"}, Enter([])], ids=["none", "int", "str", "dict-unknown-kind", "enter"])
def test_request_error_garbage_means_no_retry(value):
    """Anything but ``Retry()`` / ``{"kind": "retry"}`` is "do not retry": the turn ends with the
    model's own failure and the listener's value is not reported (see errors.md, notes)."""

    def setup(loop: AgentLoop) -> None:
        @loop.request_error
        async def listener(failure, next):
            return value

    model = ScriptedModel([ModelError("flaky", code="E1"), "never reached"])
    run = run_turn(model, setup)
    assert_failed(run, "E1", "flaky", ModelError)
    assert len(model.requests) == 1


def _returning(value: Any) -> Callable[..., Any]:
    async def model(request):
        return value

    return model


def _streaming(*chunks: Any) -> Callable[..., Any]:
    async def model(request):
        for chunk in chunks:
            yield chunk

    return model


@pytest.mark.parametrize("value", [None, 5, {"content": "x"}, [{"type": "text", "text": "x"}]], ids=["none", "int", "dict", "list"])
def test_model_returns_garbage(value):
    run = run_turn(_returning(value))
    assert_failed(run, "INVALID_REPLY", f"model returned {value!r}; expected a ModelReply")
    assert run.of("assistant/message") == []


@pytest.mark.parametrize(
    "chunks, shown",
    [
        (({"type": "text-delta", "text": "a"}, 5), "5"),
        (("abc",), "'abc'"),
        (({"text": "a"},), "{'text': 'a'}"),
    ],
    ids=["non-dict-after-a-chunk", "str", "dict-without-type"],
)
def test_model_stream_yields_garbage(chunks, shown):
    run = run_turn(_streaming(*chunks))
    assert_failed(run, "INVALID_REPLY", f"model stream yielded {shown}; expected a chunk dict")
    assert run.of("assistant/message") == []
    # the good chunks before it stay logged, then the loop's failed finish ends the request
    *good, finish = [e.data["chunk"] for e in run.of("assistant/chunk")]
    assert len(good) == len(chunks) - 1
    assert (finish["type"], finish["reason"], finish["error"]["code"]) == ("finish", "error", "INVALID_REPLY")


@pytest.mark.parametrize("value", [None, 5], ids=["none", "int"])
def test_model_plain_function_returns_garbage(value):
    run = run_turn(lambda request: value)
    assert run.end["kind"] == "error" and run.end["error"]["code"] == "INVALID_REPLY"


@pytest.mark.parametrize(
    "reply, exc, start",
    [
        (ModelReply([5]), InvalidMessageError, "invalid message content[0]: expected a content block object, got number"),
        (
            ModelReply([{"type": "text", "text": "x", "n": float("nan")}]),
            InvalidMessageError,
            "invalid message content[0].n: NaN is not lossless JSON",
        ),
        (
            ModelReply("x", usage={"t": float("nan")}),
            NotJsonError,
            'session event "assistant/message" carries non-JSON-serializable data: data.usage.t: NaN is not lossless JSON',
        ),
    ],
    ids=["bad-block", "nan-content", "nan-usage"],
)
def test_model_reply_not_json(reply, exc, start):
    run = run_turn(_returning(reply))
    assert_failed(run, "UNKNOWN", start, exc)
    assert run.of("assistant/message") == []


def test_model_stream_chunk_not_json():
    run = run_turn(_streaming({"type": "usage", "t": float("nan")}))
    assert_failed(
        run,
        "UNKNOWN",
        'session event "assistant/chunk" carries non-JSON-serializable data: data.chunk.t: NaN is not lossless JSON',
        NotJsonError,
    )
    # the chunk was refused; the failed request is in the log by the loop's failed finish
    [finish] = [e.data["chunk"] for e in run.of("assistant/chunk")]
    assert (finish["type"], finish["reason"], finish["error"]["code"]) == ("finish", "error", "UNKNOWN")


def test_model_reply_dict_content():
    with pytest.raises(TypeError):
        ModelReply({"type": "text", "text": "x"})


def test_model_raises():
    async def model(request):
        raise ValueError("boom")

    run = run_turn(model)
    assert_failed(run, "UNKNOWN", "boom", ValueError)


def test_model_raises_model_error():
    run = run_turn(ScriptedModel([ModelError("rate limited", code="RATE_LIMIT", status=429)]))
    assert_failed(run, "RATE_LIMIT", "rate limited", ModelError)
    assert run.end["error"]["status"] == 429


def _tool_run(fn: Optional[Callable[..., Any]], arguments: str = "{}", name: str = "t") -> Run:
    call = {"type": "tool-call", "id": "c1", "name": name, "arguments": arguments}
    model = ScriptedModel([ModelReply([call]), "done"])

    def setup(loop: AgentLoop) -> None:
        if fn is not None:
            loop.tool(Tool("t", fn))

    return run_turn(model, setup)


def _tool_result(run: Run) -> Tuple[Optional[dict], str]:
    results = run.of("tool/result")
    assert len(results) == 1, [e.data for e in results]
    data = results[0].data
    block = data["message"]["content"][0]
    return data.get("error"), "".join(b.get("text", "") for b in block["content"])


def test_tool_raises():
    async def tool(args, ctx):
        raise RuntimeError("disk on fire")

    run = _tool_run(tool)
    error, text = _tool_result(run)
    assert (plain(error), text) == ({"name": "RuntimeError", "code": "TOOL_ERROR"}, "disk on fire")
    assert error["traceback"].endswith("RuntimeError: disk on fire\n")
    assert run.end == {"kind": "completed"}  # the turn continues: the model saw the error


def test_tool_unknown():
    run = _tool_run(None, name="nope")
    assert _tool_result(run) == ({"name": "UnknownToolError", "code": "UNKNOWN_TOOL"}, "unknown tool 'nope'")
    assert run.end == {"kind": "completed"}


@pytest.mark.parametrize("value, typename", [(None, "NoneType"), (5, "int"), ({"content": "x"}, "dict")], ids=["none", "int", "dict"])
def test_tool_returns_garbage(value, typename):
    async def tool(args, ctx):
        return value

    run = _tool_run(tool)
    assert _tool_result(run) == ({"name": "TypeError", "code": "TOOL_ERROR"}, f"tool 't' returned {typename}; expected str or ToolResult")
    assert run.end == {"kind": "completed"}


INVALID_TOOL_RESULTS: Dict[str, Callable[[], Any]] = {
    "nan-content": lambda: ToolResult([{"type": "text", "text": "x", "n": float("nan")}]),
    "bad-blocks": lambda: ToolResult([5]),
    "set-meta": lambda: ToolResult("x", meta={1, 2}),
    "surrogate-str": lambda: "\ud800",
}


@pytest.mark.parametrize("case", list(INVALID_TOOL_RESULTS))
def test_tool_returns_invalid_result(case):
    async def tool(args, ctx):
        return INVALID_TOOL_RESULTS[case]()

    run = _tool_run(tool)
    error, _ = _tool_result(run)
    assert error is not None and error["code"] == "TOOL_ERROR"
    assert run.end == {"kind": "completed"}


@pytest.mark.parametrize("arguments", ["{not json", '{"a": 1', "nul"], ids=["garbage", "unterminated", "bad-literal"])
def test_tool_invalid_arguments_json(arguments):
    seen: List[Any] = []

    async def tool(args, ctx):
        seen.append(args)
        return "ran"

    run = _tool_run(tool, arguments)
    error, text = _tool_result(run)
    assert error == {"name": "ValueError", "code": "INVALID_ARGUMENTS"}
    assert text.startswith("invalid tool arguments: ")
    assert seen == []  # the body never ran
    assert run.end == {"kind": "completed"}


@pytest.mark.parametrize("arguments", ['{"a": NaN}', '{"a": Infinity}'], ids=["nan", "infinity"])
def test_tool_arguments_non_standard_json(arguments):
    async def tool(args, ctx):
        return "ran"

    error, _ = _tool_result(_tool_run(tool, arguments))
    assert error == {"name": "ValueError", "code": "INVALID_ARGUMENTS"}


def test_tool_arguments_not_an_object_are_passed_through():
    """Valid JSON that is not an object reaches the tool as is (not validated)."""
    seen: List[Any] = []

    async def tool(args, ctx):
        seen.append(args)
        return "ran"

    _tool_run(tool, "[1, 2]")
    assert seen == [[1, 2]]


def test_tool_additional_contexts_str():
    with pytest.raises(TypeError):
        ToolResult("x", additional_contexts="abc")


def test_tool_additional_contexts_not_messages():
    async def tool(args, ctx):
        return ToolResult("x", additional_contexts=[5])

    run = _tool_run(tool)
    assert_failed(run, "UNKNOWN", "expected a str or a UserMessage, got int", TypeError)


# =============================================================================================
# CLI
# =============================================================================================


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kerman", *args], capture_output=True, text=True, timeout=100)


@pytest.fixture
def cli_store(tmp_path) -> Path:
    root = tmp_path / "root"
    with FileStore(root, durability="none").create("s") as log:
        log.append("goal/change", {"goal": "x"})
    return root


def test_cli_missing_store(tmp_path):
    proc = cli("log", "show", str(tmp_path / "nowhere"), "s")
    assert proc.returncode == 2 and proc.stderr == f"kerman: no session store at {tmp_path / 'nowhere'}\n"
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("session_id", ["missing", "../x", "/etc/passwd"])
def test_cli_unknown_session(cli_store, session_id):
    proc = cli("log", "show", str(cli_store), session_id)
    assert proc.returncode == 1
    assert proc.stderr == f'kerman: session "{session_id}" not found in {cli_store}\n'


def test_cli_invalid_session_id(cli_store):
    proc = cli("log", "show", str(cli_store), "")
    assert proc.returncode == 2
    assert proc.stderr == "kerman: invalid session id: a session id must be a non-empty string\n"


def test_cli_locked_session(cli_store):
    """Reading needs no lock (issue 11 item 3); only repair, which writes, is refused."""
    log = FileStore(cli_store).open("s")
    try:
        show = cli("log", "show", str(cli_store), "s")
        listing = cli("log", "list", str(cli_store))
        repair = cli("log", "repair", str(cli_store), "s", "--yes")
    finally:
        log.close()
    assert show.returncode == 0 and show.stderr == ""
    assert listing.returncode == 0 and "(" not in listing.stdout
    assert repair.returncode == 1
    assert repair.stderr == 'kerman: session "s" is locked: another process or handle has it open\n'


def test_cli_newer_format(tmp_path):
    root = tmp_path / "root"
    path = session_path(root, "future")
    write_raw_session(path, header_record("future", version=3), [event_record(0, "goal/change", {})])
    for args in (("show",), ("verify",), ("repair", "--yes")):
        proc = cli("log", args[0], str(root), "future", *args[1:])
        assert proc.returncode == 1
        assert proc.stderr.startswith(f"kerman: session log {path} uses format version 3, but this kerman reads versions 1 and 2")
    listing = cli("log", "list", str(root))
    assert listing.returncode == 0 and "(unsupported-format)" in listing.stdout


@pytest.mark.parametrize(
    "args, fragment",
    [
        (("log", "show", "{root}", "s", "--from", "abc"), "argument --from: not an integer"),
        (("log", "show", "{root}", "s", "--from", "-5"), "argument --from: must be 0 or more"),
        (("log", "tail", "{root}", "s", "-n", "-1"), "argument -n: must be 0 or more: -1"),
        (("log", "bogus"), "invalid choice: 'bogus'"),
        (("nope",), "invalid choice: 'nope'"),
    ],
    ids=["from-not-int", "from-negative", "tail-negative", "unknown-log-command", "unknown-command"],
)
def test_cli_usage_errors(cli_store, args, fragment):
    proc = cli(*[a.format(root=cli_store) for a in args])
    assert proc.returncode == 2 and fragment in proc.stderr and proc.stdout == ""
