"""Inbox unit behaviour without a loop (reference 3, 4.1 and cases INB-* of 7.1; SPEC 2.3, 4.1).

AgentLoop-dependent cases (DEL-*, LOOP-*, ...) and the ``send``/``inject`` presets live with the
loop's tests; here every mutation goes through the Inbox methods directly.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import pytest

import kerman
from kerman import (
    DuplicateMessageError,
    Inbox,
    InboxProjection,
    InvalidMessageError,
    ProjectionError,
    ReentrantAppendError,
    UserMessage,
)

SPLICED = "agent/inbox/spliced"
TURN = "next-turn"
STEP = "next-step"


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def new_log():
    return kerman.MemoryStore().create()


def U(id: str, text: str | None = None, source: dict | None = None) -> UserMessage:
    return UserMessage(text if text is not None else f"text of {id}", source=source, id=id)


class Recorder:
    """Records the inbox callbacks, in one combined sequence."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def on_inserted(self, message):
        self.calls.append(("inserted", message))

    def on_discarded(self, message):
        self.calls.append(("discarded", message))

    def on_claimed(self, message, turn):
        self.calls.append(("claimed", message, turn))

    def kwargs(self) -> dict:
        return {
            "on_inserted": self.on_inserted,
            "on_discarded": self.on_discarded,
            "on_claimed": self.on_claimed,
        }

    def of(self, kind: str) -> list:
        return [c[1] for c in self.calls if c[0] == kind]


def new_inbox(log=None):
    log = log if log is not None else new_log()
    rec = Recorder()
    return Inbox(log, **rec.kwargs()), log, rec


def payloads(log, start: int = 0) -> list[dict]:
    return [ev.data for ev in log.splices(start)]


def ids(messages) -> list[str]:
    return [m.id for m in messages]


def md(m: UserMessage) -> dict:
    return m.to_dict()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), reflected polynomial 0x82F63B78."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def test_crc32c_helper_check_value():
    # The check value of the CRC-32C catalogue; guards the hand-written session files below.
    assert crc32c(b"123456789") == 0xE3069283


def record_line(obj: dict) -> str:
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    return f"{crc32c(text.encode()):08x} {text}\n"


def user_dict(id: str, text: str | None = None, source: dict | None = None) -> dict:
    return {
        "id": id,
        "role": "user",
        "content": [{"type": "text", "text": text if text is not None else f"text of {id}"}],
        "source": source if source is not None else {"kind": "user"},
    }


def splice_record(seq: int, data) -> dict:
    return {"type": SPLICED, "seq": seq, "time": 0, "data": data}


def write_session(root: Path, events: list[dict], session_id: str = "s", **header_extra) -> Path:
    """Writes a FileStore session file by hand (docs/format.md, version 1)."""
    header = {"type": "session", "version": 1, "id": session_id, "createdAt": 0, **header_extra}
    path = root / f"{session_id}.jsonl"
    path.write_text("".join(record_line(r) for r in [header, *events]), encoding="utf-8")
    return path


@pytest.fixture
def file_log(tmp_path):
    """Opens a hand-written session file; closes every log it opened."""
    opened = []

    def open_(events: list[dict], **header_extra):
        write_session(tmp_path, events, **header_extra)
        log = kerman.FileStore(str(tmp_path), durability="none").open("s")
        opened.append(log)
        return log

    yield open_
    for log in opened:
        log.close()


# --------------------------------------------------------------------------------------------
# INB-01 / corrupt persisted splices
# --------------------------------------------------------------------------------------------


def test_INB_01_replay_rejects_splice_beyond_empty_list(file_log):
    log = file_log([splice_record(0, {"target": TURN, "start": 1, "inserted": []})])
    assert len(log) == 1
    with pytest.raises(ProjectionError) as info:
        Inbox(log)
    assert info.value.seq == 0
    assert str(info.value).startswith("invalid persisted inbox splice at session seq 0")
    assert isinstance(info.value, kerman.KermanError)
    # Constructing the inbox appended nothing.
    assert len(log) == 1


A = user_dict("a")
B = user_dict("b")

# (events before the bad one, the bad splice's data, a fragment expected in the detail or None)
CORRUPT_CASES = {
    "start-beyond-len": ([], {"target": TURN, "start": 1, "inserted": [A]}, "invalid inbox splice"),
    "removed-beyond-len": (
        [{"target": TURN, "start": 0, "inserted": [A]}],
        {"target": TURN, "start": 0, "removedCount": 2, "inserted": [], "outcome": "canceled"},
        "invalid inbox splice",
    ),
    "start-plus-removed-beyond-len": (
        [{"target": STEP, "start": 0, "inserted": [A, B]}],
        {"target": STEP, "start": 1, "removedCount": 2, "inserted": []},
        "invalid inbox splice",
    ),
    "negative-start": ([], {"target": TURN, "start": -1, "inserted": [A]}, "invalid inbox splice"),
    "fractional-start": ([], {"target": TURN, "start": 0.5, "inserted": [A]}, "invalid inbox splice"),
    "negative-removed": (
        [{"target": TURN, "start": 0, "inserted": [A]}],
        {"target": TURN, "start": 0, "removedCount": -1, "inserted": []},
        "invalid inbox splice",
    ),
    "unsafe-integer-start": ([], {"target": TURN, "start": 2**53, "inserted": []}, "invalid inbox splice"),
    "string-start": ([], {"target": TURN, "start": "0", "inserted": [A]}, "invalid inbox splice"),
    "unknown-target": ([], {"target": "later", "start": 0, "inserted": [A]}, None),
    "missing-inserted": ([], {"target": TURN, "start": 0}, None),
    "data-not-object": ([], [1, 2], None),
    "duplicate-across-lists": (
        [{"target": TURN, "start": 0, "inserted": [A]}],
        {"target": STEP, "start": 0, "inserted": [user_dict("a", "again")]},
        'message "a" is already pending',
    ),
    "duplicate-inside-inserted": (
        [],
        {"target": STEP, "start": 0, "inserted": [B, user_dict("b", "twice")]},
        'message "b" is already pending',
    ),
    "inserted-assistant-message": (
        [],
        {
            "target": TURN,
            "start": 0,
            "inserted": [
                {
                    "id": "x",
                    "role": "assistant",
                    "content": [{"type": "text", "text": "x"}],
                    "source": {"kind": "model", "provider": "p", "model": "m"},
                }
            ],
        },
        None,
    ),
}


@pytest.mark.parametrize("case", sorted(CORRUPT_CASES))
def test_corrupt_persisted_splice_raises_projection_error_with_seq(file_log, case):
    before, bad, detail = CORRUPT_CASES[case]
    # A plugin event first, so the splice's seq differs from its index among the splices.
    events = [{"type": "goal/change", "seq": 0, "time": 0, "data": {"goal": "x"}}]
    for data in before:
        events.append(splice_record(len(events), data))
    bad_seq = len(events)
    events.append(splice_record(bad_seq, bad))
    log = file_log(events)
    assert len(log) == bad_seq + 1
    with pytest.raises(ProjectionError) as info:
        Inbox(log)
    assert info.value.seq == bad_seq
    text = str(info.value)
    assert text.startswith(f"invalid persisted inbox splice at session seq {bad_seq}")
    if detail is not None:
        assert detail in text
    # The pure fold validates exactly like the replay.
    with pytest.raises(ProjectionError) as folded:
        InboxProjection.fold(log.splices())
    assert folded.value.seq == bad_seq
    assert str(folded.value).startswith(f"invalid persisted inbox splice at session seq {bad_seq}")


def test_persisted_splice_extra_fields_and_outcome_do_not_change_effects(file_log):
    events = [
        splice_record(0, {"target": TURN, "start": 0, "inserted": [A, B], "future": {"x": 1}}),
        # A pure deletion (claim form) and an outcome-carrying one have the same list effect.
        splice_record(1, {"target": TURN, "start": 0, "removedCount": 1, "inserted": []}),
        splice_record(2, {"target": STEP, "start": 0, "inserted": [A]}),
        splice_record(3, {"target": STEP, "start": 0, "removedCount": 1, "inserted": [], "outcome": "canceled"}),
    ]
    log = file_log(events)
    inbox = Inbox(log)
    assert [md(m) for m in inbox.next_turn] == [B]
    assert inbox.next_step == ()


# --------------------------------------------------------------------------------------------
# INB-02 replace
# --------------------------------------------------------------------------------------------


def test_INB_02_replace_in_either_list_and_duplicate_refusal():
    inbox, log, rec = new_inbox()
    Q, S, R = U("q"), U("s"), U("r")
    inbox.append(TURN, Q)
    inbox.append(STEP, S)
    events_before = len(log)

    assert inbox.replace("missing", R) is False
    assert len(log) == events_before
    assert inbox.next_turn == (Q,) and inbox.next_step == (S,)

    assert inbox.replace(Q.id, R) is True
    S2 = S.with_content("edited")
    assert S2.id == S.id and S2 != S
    assert inbox.replace(S.id, S2) is True

    assert inbox.next_turn == (R,)
    assert inbox.next_step == (S2,)
    assert inbox.next_step[0].text == "edited"
    assert rec.of("discarded") == [Q, S]
    assert rec.of("inserted") == [Q, S, R, S2]
    # discarded(old) comes before inserted(new) for each replacement
    assert [c[0] for c in rec.calls] == ["inserted", "inserted", "discarded", "inserted", "discarded", "inserted"]

    n = len(log)
    with pytest.raises(DuplicateMessageError) as info:
        inbox.replace(S2.id, R)
    assert str(info.value) == f'message "{R.id}" is already pending'
    assert len(log) == n
    assert inbox.next_turn == (R,) and inbox.next_step == (S2,)
    assert len(rec.calls) == 6


@pytest.mark.parametrize("target", [TURN, STEP])
def test_replace_keeping_the_same_id_logs_one_canceled_replacement(target):
    inbox, log, rec = new_inbox()
    X, Y = U("x"), U("y")
    inbox.append(target, X)
    inbox.append(target, Y)
    Y2 = Y.with_content("new text")
    assert inbox.replace("y", Y2) is True
    assert payloads(log)[-1] == {
        "target": target,
        "start": 1,
        "removedCount": 1,
        "inserted": [md(Y2)],
        "outcome": "canceled",
    }
    lst = inbox.next_turn if target == TURN else inbox.next_step
    assert lst == (X, Y2)
    assert inbox.get("y") == Y2
    assert rec.calls[-2:] == [("discarded", Y), ("inserted", Y2)]


def test_replace_searches_next_turn_first():
    # Same id cannot be in both lists, so "first match" is about the list searched: replacing an
    # id that lives in next-step must splice next-step.
    inbox, log, _ = new_inbox()
    inbox.append(TURN, U("t"))
    inbox.append(STEP, U("s"))
    assert inbox.replace("s", U("s2")) is True
    assert payloads(log)[-1]["target"] == STEP
    assert ids(inbox.next_turn) == ["t"] and ids(inbox.next_step) == ["s2"]


# --------------------------------------------------------------------------------------------
# INB-04 clear
# --------------------------------------------------------------------------------------------


def test_INB_04_clear_cancels_next_step_then_next_turn():
    inbox, log, rec = new_inbox()
    T, S = U("t"), U("s")
    inbox.append(TURN, T)
    inbox.append(STEP, S)
    n = len(log)
    removed = inbox.clear()
    assert removed == [S, T]
    assert inbox.has_pending is False
    assert rec.of("discarded") == [S, T]
    assert payloads(log, n) == [
        {"target": STEP, "start": 0, "removedCount": 1, "inserted": [], "outcome": "canceled"},
        {"target": TURN, "start": 0, "removedCount": 1, "inserted": [], "outcome": "canceled"},
    ]
    assert len(log) == n + 2
    calls = len(rec.calls)
    assert inbox.clear() == []
    assert len(log) == n + 2
    assert len(rec.calls) == calls


def test_clear_returns_all_of_next_step_then_all_of_next_turn():
    inbox, log, rec = new_inbox()
    for i in range(3):
        inbox.append(TURN, U(f"t{i}"))
    for i in range(2):
        inbox.append(STEP, U(f"s{i}"))
    n = len(log)
    removed = inbox.clear()
    assert ids(removed) == ["s0", "s1", "t0", "t1", "t2"]
    assert ids(rec.of("discarded")) == ["s0", "s1", "t0", "t1", "t2"]
    assert payloads(log, n) == [
        {"target": STEP, "start": 0, "removedCount": 2, "inserted": [], "outcome": "canceled"},
        {"target": TURN, "start": 0, "removedCount": 3, "inserted": [], "outcome": "canceled"},
    ]
    assert len(inbox) == 0


@pytest.mark.parametrize("target", [TURN, STEP])
def test_clear_with_one_list_empty_logs_one_splice(target):
    inbox, log, _ = new_inbox()
    inbox.append(target, U("only"))
    n = len(log)
    assert ids(inbox.clear()) == ["only"]
    assert payloads(log, n) == [{"target": target, "start": 0, "removedCount": 1, "inserted": [], "outcome": "canceled"}]


# --------------------------------------------------------------------------------------------
# INB-05 insertion payloads
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["append", "prepend", "splice"])
@pytest.mark.parametrize("target", [TURN, STEP])
def test_INB_05_insertion_payload_has_no_removed_count_or_outcome(op, target):
    inbox, log, _ = new_inbox()
    inbox.append(target, U("first"))
    M = U("m", source={"kind": "plugin", "plugin": "guard", "extra": [1, {"k": None}]})
    n = len(log)
    if op == "splice":
        assert inbox.splice(target, 1, 0, [M]) == []
    else:
        assert getattr(inbox, op)(target, M) == M
    (data,) = payloads(log, n)
    assert list(data) == ["target", "start", "inserted"]
    assert data["target"] == target
    assert data["start"] == (0 if op == "prepend" else 1)
    assert len(data["inserted"]) == 1
    assert set(data["inserted"][0]) == {"content", "id", "role", "source"}
    assert data["inserted"][0] == md(M)


def test_INB_05_append_of_str_makes_a_user_message_and_logs_it_whole():
    inbox, log, rec = new_inbox()
    stored = inbox.append(TURN, "hello")
    assert isinstance(stored, UserMessage)
    assert stored.content == [{"type": "text", "text": "hello"}]
    assert stored.source == {"kind": "user"}
    assert stored.id
    assert inbox.next_turn == (stored,)
    assert payloads(log) == [{"target": TURN, "start": 0, "inserted": [md(stored)]}]
    assert rec.calls == [("inserted", stored)]


def test_payload_key_order_of_a_canceled_removal():
    inbox, log, _ = new_inbox()
    inbox.append(TURN, U("a"))
    inbox.remove("a")
    assert list(log.splices())[-1].to_json().count('"outcome":"canceled"') == 1
    assert list(payloads(log)[-1]) == ["target", "start", "removedCount", "inserted", "outcome"]
    # wire form, exactly as stored
    data_json = json.dumps(payloads(log)[-1], separators=(",", ":"))
    assert data_json in list(log.splices())[-1].to_json()


# --------------------------------------------------------------------------------------------
# INB-06 / INB-07 claim
# --------------------------------------------------------------------------------------------


def test_INB_06_claim_next_turn_takes_all_steps_then_the_head_prompt():
    inbox, log, rec = new_inbox()
    X, Y, P, Q = U("x"), U("y"), U("p"), U("q")
    inbox.append(STEP, X)
    inbox.append(STEP, Y)
    inbox.append(TURN, P)
    inbox.append(TURN, Q)
    calls = len(rec.calls)
    n = len(log)
    batch = inbox.claim(TURN, 7)
    assert batch == [X, Y, P]
    assert payloads(log, n) == [
        {"target": STEP, "start": 0, "removedCount": 2, "inserted": []},
        {"target": TURN, "start": 0, "removedCount": 1, "inserted": []},
    ]
    assert inbox.next_turn == (Q,)
    assert inbox.next_step == ()
    assert rec.calls[calls:] == [("claimed", X, 7), ("claimed", Y, 7), ("claimed", P, 7)]


def test_INB_07_claim_with_both_lists_empty_does_nothing():
    inbox, log, rec = new_inbox()
    assert inbox.claim(TURN, 1) == []
    assert inbox.claim(STEP, 1) == []
    assert len(log) == 0
    assert rec.calls == []


def test_claim_next_step_leaves_next_turn_alone():
    inbox, log, rec = new_inbox()
    P, S = U("p"), U("s")
    inbox.append(TURN, P)
    inbox.append(STEP, S)
    n = len(log)
    assert inbox.claim(STEP, 2) == [S]
    assert payloads(log, n) == [{"target": STEP, "start": 0, "removedCount": 1, "inserted": []}]
    assert inbox.next_turn == (P,)
    assert rec.calls[-1] == ("claimed", S, 2)
    # next-step now empty: claiming next-step again is a no-op even though next-turn is pending
    m = len(log)
    calls = len(rec.calls)
    assert inbox.claim(STEP, 3) == []
    assert len(log) == m and len(rec.calls) == calls


def test_claim_next_turn_with_empty_next_step_logs_only_the_head():
    inbox, log, rec = new_inbox()
    P, Q = U("p"), U("q")
    inbox.append(TURN, P)
    inbox.append(TURN, Q)
    n = len(log)
    assert inbox.claim(TURN, 1) == [P]
    assert payloads(log, n) == [{"target": TURN, "start": 0, "removedCount": 1, "inserted": []}]
    assert rec.calls[-1] == ("claimed", P, 1)
    assert not any(c[0] == "discarded" for c in rec.calls)


def test_claimed_callbacks_run_after_both_splices_are_logged_and_applied():
    log = new_log()
    seen = []

    def on_claimed(message, turn):
        seen.append((message.id, len(log), ids(inbox.next_step), ids(inbox.next_turn)))

    inbox = Inbox(log, on_claimed=on_claimed)
    inbox.append(STEP, U("s"))
    inbox.append(TURN, U("p"))
    inbox.append(TURN, U("q"))
    inbox.claim(TURN, 1)
    assert seen == [("s", 5, [], ["q"]), ("p", 5, [], ["q"])]


# --------------------------------------------------------------------------------------------
# INB-09 observers see pre-splice lists
# --------------------------------------------------------------------------------------------


def test_INB_09_log_observer_sees_pre_splice_lists():
    inbox, log, _ = new_inbox()
    seen = []

    def observer(ev):
        nt, ns = inbox.next_turn, inbox.next_step
        data = ev.data
        lst = nt if data["target"] == TURN else ns
        start, count = data["start"], data.get("removedCount", 0)
        # the removed messages can be rebuilt from the coordinates over the pre-splice lists
        seen.append((ev.seq, ids(nt), ids(ns), ids(lst[start : start + count])))

    log.subscribe(observer)
    inbox.append(TURN, U("a"))
    inbox.append(TURN, U("b"))
    inbox.append(STEP, U("s"))
    inbox.replace("b", U("b2"))
    inbox.remove("a")
    inbox.claim(TURN, 1)
    assert seen == [
        (0, [], [], []),
        (1, ["a"], [], []),
        (2, ["a", "b"], [], []),
        (3, ["a", "b"], ["s"], ["b"]),
        (4, ["a", "b2"], ["s"], ["a"]),
        (5, ["b2"], ["s"], ["s"]),
        (6, ["b2"], [], ["b2"]),
    ]
    assert inbox.has_pending is False


def test_INB_09_observer_cannot_mutate_the_inbox():
    """An observer runs before the lists change, so here clear() and claim() find nothing to
    do: like the reference (3.5 step 1), a no-op appends nothing and so is not reentrant.
    The insertion is refused."""
    inbox, log, rec = new_inbox()
    errors = []
    results = []

    def observer(ev):
        for attempt in (
            lambda: inbox.append(STEP, U("from-observer")),
            lambda: inbox.clear(),
            lambda: inbox.claim(TURN, 9),
        ):
            try:
                results.append(attempt())
            except ReentrantAppendError as e:
                errors.append(e)

    log.subscribe(observer)
    inbox.append(TURN, U("a"))
    assert len(errors) == 1
    assert results == [[], []]
    assert all(isinstance(e, kerman.LogError) for e in errors)
    assert len(log) == 1
    assert ids(inbox.next_turn) == ["a"] and inbox.next_step == ()
    assert rec.calls == [("inserted", U("a"))]


def test_INB_09_observer_reentrancy_error_is_contained_and_logged(caplog):
    inbox, log, rec = new_inbox()

    def observer(ev):
        inbox.append(STEP, U(f"echo-{ev.seq}"))

    log.subscribe(observer)
    with caplog.at_level(logging.ERROR, logger="kerman"):
        stored = inbox.append(TURN, U("a"))
    assert stored == U("a")
    assert len(log) == 1
    assert ids(inbox.next_turn) == ["a"] and inbox.next_step == ()
    records = [r for r in caplog.records if r.name == "kerman"]
    assert records, "the contained ReentrantAppendError must be logged on the kerman logger"
    assert any("reenter" in r.getMessage() or "Reentrant" in r.getMessage() for r in records)


def test_live_callbacks_run_after_the_lists_change_and_may_mutate_the_inbox():
    log = new_log()
    seen = []

    def on_inserted(message):
        seen.append((message.id, len(log), message.id in inbox))
        if message.id == "a":
            inbox.append(STEP, U("follow-up"))

    inbox = Inbox(log, on_inserted=on_inserted)
    inbox.append(TURN, U("a"))
    assert seen == [("a", 1, True), ("follow-up", 2, True)]
    assert ids(inbox.next_step) == ["follow-up"]
    assert [p["target"] for p in payloads(log)] == [TURN, STEP]


@pytest.mark.parametrize("which", ["on_inserted", "on_discarded", "on_claimed"])
def test_failing_callback_is_contained_and_logged(caplog, which):
    log = new_log()
    calls = []

    def boom(message, *rest):
        calls.append(message.id)
        raise RuntimeError(f"callback failed for {message.id}")

    inbox = Inbox(log, **{which: boom})
    with caplog.at_level(logging.ERROR, logger="kerman"):
        inbox.append(TURN, U("a"))
        inbox.append(STEP, U("b"))
        inbox.append(STEP, U("c"))
        if which == "on_discarded":
            assert ids(inbox.clear()) == ["b", "c", "a"]
        elif which == "on_claimed":
            assert ids(inbox.claim(TURN, 1)) == ["b", "c", "a"]
    expected = ["a", "b", "c"] if which == "on_inserted" else ["b", "c", "a"]
    assert calls == expected
    assert inbox.has_pending is (which == "on_inserted")
    messages = [r.getMessage() for r in caplog.records if r.name == "kerman"]
    for id_ in expected:
        assert any(f"callback failed for {id_}" in text for text in messages)


# --------------------------------------------------------------------------------------------
# INB-10 non-JSON and non-user messages
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"content": [{"type": "text", "text": float("nan")}]}, "content"),
        ({"content": [{"type": "text", "text": float("inf")}]}, "content"),
        ({"content": [{"type": "text", "text": "x", "tags": {1, 2}}]}, "content"),
        ({"content": [{"type": "text", 1: "x"}]}, "content"),
        ({"content": [{"type": "text", "text": object()}]}, "content"),
        ({"content": "x", "source": {"kind": "plugin", "plugin": "p", "w": float("-inf")}}, "source"),
    ],
)
def test_INB_10_non_json_message_cannot_be_constructed(kwargs, field):
    with pytest.raises(InvalidMessageError) as info:
        UserMessage(**kwargs)
    assert isinstance(info.value, ValueError)
    assert field in str(info.value)


def _non_user_values():
    return [
        kerman.AssistantMessage("hi"),
        kerman.ToolResultMessage("call-1", "output"),
        42,
        None,
        {"id": "d", "role": "user", "content": [], "source": {"kind": "user"}},
        b"bytes",
    ]


@pytest.mark.parametrize("bad", _non_user_values(), ids=lambda v: type(v).__name__)
@pytest.mark.parametrize("op", ["append", "prepend", "splice", "splice-mixed", "replace"])
def test_INB_10_inserting_a_non_user_message_raises_type_error(op, bad):
    inbox, log, rec = new_inbox()
    inbox.append(TURN, U("keep"))
    n, calls = len(log), len(rec.calls)
    with pytest.raises(TypeError):
        if op == "append":
            inbox.append(STEP, bad)
        elif op == "prepend":
            inbox.prepend(TURN, bad)
        elif op == "splice":
            inbox.splice(TURN, 0, 1, [bad])
        elif op == "splice-mixed":
            inbox.splice(STEP, 0, 0, [U("good"), bad])
        else:
            inbox.replace("keep", bad)
    assert len(log) == n
    assert len(rec.calls) == calls
    assert ids(inbox.next_turn) == ["keep"] and inbox.next_step == ()


@pytest.mark.parametrize(
    "op",
    [
        lambda ib: ib.append(TURN, U("b")),
        lambda ib: ib.prepend(STEP, U("b")),
        lambda ib: ib.splice(TURN, 0, 1, [U("b")]),
        lambda ib: ib.replace("a", U("b")),
        lambda ib: ib.remove("a"),
        lambda ib: ib.clear(),
        lambda ib: ib.claim(TURN, 1),
    ],
    ids=["append", "prepend", "splice", "replace", "remove", "clear", "claim"],
)
def test_failed_durable_append_changes_nothing(op):
    # Reference 3.5 step 3: when the log refuses the splice, the lists stay as they were and
    # nothing is announced.
    inbox, log, rec = new_inbox()
    inbox.append(TURN, U("a"))
    inbox.append(STEP, U("s"))
    log.close()
    calls = list(rec.calls)
    with pytest.raises(kerman.LogError):
        op(inbox)
    assert len(log) == 2
    assert ids(inbox.next_turn) == ["a"] and ids(inbox.next_step) == ["s"]
    assert rec.calls == calls


# --------------------------------------------------------------------------------------------
# INB-11 / INB-12
# --------------------------------------------------------------------------------------------


def test_INB_11_empty_plugin_name_is_stored_verbatim(tmp_path):
    store = kerman.FileStore(str(tmp_path), durability="none")
    log = store.create("s")
    inbox = Inbox(log)
    M = UserMessage("ctx", source={"kind": "plugin", "plugin": ""})
    inbox.append(STEP, M)
    assert payloads(log)[0]["inserted"][0]["source"] == {"kind": "plugin", "plugin": ""}
    assert inbox.next_step[0].source == {"kind": "plugin", "plugin": ""}
    log.close()
    reopened = store.open("s")
    try:
        again = Inbox(reopened)
        assert again.next_step == (M,)
        assert again.next_step[0].source == {"kind": "plugin", "plugin": ""}
    finally:
        reopened.close()


def test_INB_12_fork_child_ignores_splices_before_seed_length(file_log):
    events = [
        # inherited from the parent: an insertion of "a" and one that would be invalid here
        splice_record(0, {"target": TURN, "start": 0, "inserted": [A]}),
        splice_record(1, {"target": STEP, "start": 5, "removedCount": 3, "inserted": [B]}),
        # the child's own: inserting "a" again is fine because seq 0 is not folded
        splice_record(2, {"target": TURN, "start": 0, "inserted": [user_dict("a", "child")]}),
    ]
    log = file_log(events, seedLength=2)
    assert log.header.get("seedLength") == 2
    inbox = Inbox(log)
    assert [md(m) for m in inbox.next_turn] == [user_dict("a", "child")]
    assert inbox.next_step == ()
    # the child keeps working on top of that state
    inbox.append(STEP, U("b"))
    assert ids(inbox.next_step) == ["b"]
    inbox.close()
    assert ids(Inbox(log).next_step) == ["b"]


def test_INB_12_splices_at_or_after_seed_length_are_validated(file_log):
    events = [
        splice_record(0, {"target": TURN, "start": 0, "inserted": [A]}),
        splice_record(1, {"target": TURN, "start": 1, "inserted": [B]}),
    ]
    # seq 1 is the child's own splice: start 1 on the child's empty list is invalid
    log = file_log(events, seedLength=1)
    with pytest.raises(ProjectionError) as info:
        Inbox(log)
    assert info.value.seq == 1


# --------------------------------------------------------------------------------------------
# canonical payloads (reference 3.3, with SPEC 4.1 coordinates)
# --------------------------------------------------------------------------------------------


def test_canonical_append_on_list_of_two():
    inbox, log, _ = new_inbox()
    inbox.append(TURN, U("1"))
    inbox.append(TURN, U("2"))
    A_ = U("A")
    inbox.append(TURN, A_)
    assert payloads(log)[-1] == {"target": TURN, "start": 2, "inserted": [md(A_)]}


def test_canonical_prepend_next_step():
    inbox, log, _ = new_inbox()
    inbox.append(STEP, U("1"))
    A_ = U("A")
    inbox.prepend(STEP, A_)
    assert payloads(log)[-1] == {"target": STEP, "start": 0, "inserted": [md(A_)]}
    assert ids(inbox.next_step) == ["A", "1"]


@pytest.mark.parametrize("target", [TURN, STEP])
def test_canonical_replace(target):
    inbox, log, _ = new_inbox()
    for i in range(3):
        inbox.append(target, U(f"{target}-{i}"))
    Y = U("Y")
    assert inbox.replace(f"{target}-1", Y) is True
    assert payloads(log)[-1] == {
        "target": target,
        "start": 1,
        "removedCount": 1,
        "inserted": [md(Y)],
        "outcome": "canceled",
    }


@pytest.mark.parametrize("target", [TURN, STEP])
def test_canonical_remove(target):
    inbox, log, rec = new_inbox()
    for i in range(3):
        inbox.append(target, U(f"{target}-{i}"))
    assert inbox.remove(f"{target}-2") is True
    assert payloads(log)[-1] == {
        "target": target,
        "start": 2,
        "removedCount": 1,
        "inserted": [],
        "outcome": "canceled",
    }
    assert rec.calls[-1] == ("discarded", U(f"{target}-2"))


def test_canonical_claim_with_two_step_and_three_turn_items():
    inbox, log, _ = new_inbox()
    for i in range(2):
        inbox.append(STEP, U(f"s{i}"))
    for i in range(3):
        inbox.append(TURN, U(f"t{i}"))
    n = len(log)
    assert ids(inbox.claim(TURN, 4)) == ["s0", "s1", "t0"]
    assert payloads(log, n) == [
        {"target": STEP, "start": 0, "removedCount": 2, "inserted": []},
        {"target": TURN, "start": 0, "removedCount": 1, "inserted": []},
    ]


def test_canonical_splice_negative_start():
    inbox, log, rec = new_inbox()
    A_, B_ = U("A"), U("B")
    inbox.append(TURN, A_)
    inbox.append(TURN, B_)
    assert inbox.splice(TURN, -1, 1, []) == [B_]
    assert payloads(log)[-1] == {
        "target": TURN,
        "start": 1,
        "removedCount": 1,
        "inserted": [],
        "outcome": "canceled",
    }
    assert rec.calls[-1] == ("discarded", B_)


def test_canonical_splice_insert_two_on_empty():
    inbox, log, rec = new_inbox()
    A_, B_ = U("A"), U("B")
    assert inbox.splice(TURN, 0, 0, [A_, B_]) == []
    assert payloads(log) == [{"target": TURN, "start": 0, "inserted": [md(A_), md(B_)]}]
    assert rec.calls == [("inserted", A_), ("inserted", B_)]
    assert inbox.next_turn == (A_, B_)


def test_splice_inserted_defaults_to_nothing_and_accepts_none_and_iterables():
    inbox, log, _ = new_inbox()
    inbox.splice(TURN, 0, 0, (m for m in [U("a"), "plain text"]))
    assert ids(inbox.next_turn)[0] == "a"
    assert inbox.next_turn[1].text == "plain text"
    assert inbox.splice(TURN, 0, 1) == [U("a")]
    assert inbox.splice(TURN, 5, 0, None) == []
    assert len(log) == 2


def _expected_norm(length: int, start: int, delete: int) -> tuple[int, int]:
    # Written independently of Kerman: Python slice semantics (SPEC 4.1).
    if start < 0:
        s = max(length + start, 0)
    else:
        s = min(start, length)
    d = min(max(delete, 0), length - s)
    return s, d


COORDS = [
    (0, 0),
    (0, 1),
    (0, 3),
    (0, 99),
    (1, 1),
    (1, 2),
    (2, 5),
    (3, 0),
    (3, 1),
    (4, 0),
    (99, 99),
    (-1, 0),
    (-1, 1),
    (-1, 5),
    (-2, 1),
    (-3, 3),
    (-4, 1),
    (-99, 2),
    (1, -1),
    (2, -99),
    (-1, -1),
    (10**30, 1),
    (-(10**30), 1),
    (1, 10**30),
    (0, -(10**30)),
    (2**63, 2**63),
    (-(2**63) - 1, 2**64),
    (2**63 - 1, 1),
    (-(2**63), 2),
]


@pytest.mark.parametrize("start, delete", COORDS)
def test_splice_coordinates_follow_python_slice_semantics(start, delete):
    inbox, log, rec = new_inbox()
    base = [U("a"), U("b"), U("c")]
    for m in base:
        inbox.append(TURN, m)
    X = U("x")
    n = len(log)
    removed = inbox.splice(TURN, start, delete, [X])
    s, d = _expected_norm(3, start, delete)
    assert removed == base[s : s + d]
    expected_data = {"target": TURN, "start": s}
    if d:
        expected_data["removedCount"] = d
    expected_data["inserted"] = [md(X)]
    if d:
        expected_data["outcome"] = "canceled"
    assert payloads(log, n) == [expected_data]
    assert list(payloads(log, n)[0]) == list(expected_data)
    assert list(inbox.next_turn) == base[:s] + [X] + base[s + d :]
    assert rec.calls[3:] == [("discarded", m) for m in base[s : s + d]] + [("inserted", X)]
    # the same list built with Python's own slice assignment
    model = list(base)
    model[s : s + d] = [X]
    assert list(inbox.next_turn) == model


@pytest.mark.parametrize("start, delete", COORDS)
def test_splice_deleting_without_inserting(start, delete):
    inbox, log, rec = new_inbox()
    base = [U("a"), U("b"), U("c")]
    for m in base:
        inbox.splice(STEP, 99, 0, [m])
    n = len(log)
    removed = inbox.splice(STEP, start, delete)
    s, d = _expected_norm(3, start, delete)
    assert removed == base[s : s + d]
    if d == 0:
        assert len(log) == n, "a splice that removes and inserts nothing must not log"
        assert len(rec.calls) == 3
    else:
        assert payloads(log, n) == [{"target": STEP, "start": s, "removedCount": d, "inserted": [], "outcome": "canceled"}]
    assert list(inbox.next_step) == base[:s] + base[s + d :]


@pytest.mark.parametrize("bad", [True, False, 1.0, 0.0, float("nan"), float("inf"), "1", None, 1j])
@pytest.mark.parametrize("which", ["start", "delete_count"])
def test_splice_coordinates_must_be_ints(which, bad):
    inbox, log, rec = new_inbox()
    inbox.append(TURN, U("a"))
    n = len(log)
    args = {"start": 0, "delete_count": 0}
    args[which] = bad
    with pytest.raises(TypeError):
        inbox.splice(TURN, args["start"], args["delete_count"], [U("b")])
    assert len(log) == n
    assert ids(inbox.next_turn) == ["a"]
    assert rec.calls == [("inserted", U("a"))]


# --------------------------------------------------------------------------------------------
# no-ops
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "op",
    [
        lambda ib: ib.splice(TURN, 0, 0, []),
        lambda ib: ib.splice(TURN, 0, 0),
        lambda ib: ib.splice(STEP, 0, 5),
        lambda ib: ib.splice(TURN, 9, 9),
        lambda ib: ib.splice(TURN, -9, -9, ()),
        lambda ib: ib.remove("missing"),
        lambda ib: ib.replace("missing", U("new")),
        lambda ib: ib.claim(STEP, 1),
    ],
    ids=[
        "splice-empty",
        "splice-default",
        "splice-delete-from-empty",
        "splice-past-end",
        "splice-negative",
        "remove-missing",
        "replace-missing",
        "claim-step-empty",
    ],
)
def test_no_op_logs_nothing_and_notifies_nothing(op):
    inbox, log, rec = new_inbox()
    inbox.append(TURN, U("t"))
    n = len(log)
    result = op(inbox)
    assert result in ([], False)
    assert len(log) == n
    assert rec.calls == [("inserted", U("t"))]
    assert ids(inbox.next_turn) == ["t"] and inbox.next_step == ()
    assert "new" not in inbox


def test_remove_and_replace_of_a_missing_id_return_false():
    inbox, log, _ = new_inbox()
    assert inbox.remove("nope") is False
    assert inbox.replace("nope", U("x")) is False
    assert len(log) == 0
    assert "x" not in inbox


# --------------------------------------------------------------------------------------------
# duplicates and id reuse
# --------------------------------------------------------------------------------------------


DUP_OPS = {
    "append-same-list": lambda ib: ib.append(TURN, U("a", "again")),
    "append-other-list": lambda ib: ib.append(STEP, U("a", "again")),
    "prepend-other-list": lambda ib: ib.prepend(STEP, U("a", "again")),
    "splice-insert": lambda ib: ib.splice(STEP, 0, 1, [U("a", "again")]),
    "splice-twice-in-inserted": lambda ib: ib.splice(TURN, 0, 0, [U("c"), U("c", "twice")]),
    "splice-replace-then-twice": lambda ib: ib.splice(TURN, 0, 1, [U("a", "1"), U("a", "2")]),
    "replace-other-with-pending-id": lambda ib: ib.replace("s", U("a", "again")),
    "replace-with-id-in-other-list": lambda ib: ib.replace("a", U("s", "again")),
}


@pytest.mark.parametrize("case", sorted(DUP_OPS))
def test_duplicate_pending_id_is_refused(case):
    inbox, log, rec = new_inbox()
    inbox.append(TURN, U("a"))
    inbox.append(STEP, U("s"))
    n, calls = len(log), list(rec.calls)
    with pytest.raises(DuplicateMessageError) as info:
        DUP_OPS[case](inbox)
    dup = {"splice-twice-in-inserted": "c", "replace-with-id-in-other-list": "s"}.get(case, "a")
    assert str(info.value) == f'message "{dup}" is already pending'
    assert isinstance(info.value, kerman.InboxError)
    assert isinstance(info.value, kerman.KermanError)
    assert len(log) == n
    assert rec.calls == calls
    assert inbox.next_turn == (U("a"),) and inbox.next_step == (U("s"),)


@pytest.mark.parametrize("target", [TURN, STEP])
def test_duplicate_error_names_the_first_repeated_id_of_the_reference_walk(target):
    # Reference 3.4: walk the candidate lists (for next-turn: candidate next-turn then current
    # next-step; for next-step: current next-turn then candidate next-step) and report the FIRST
    # repeated id. Here O is pending in the other list and T in `target`; [O', T'] is inserted at
    # the head of `target`.
    inbox, log, _ = new_inbox()
    other = STEP if target == TURN else TURN
    inbox.append(target, U("t"))
    inbox.append(other, U("o"))
    n = len(log)
    with pytest.raises(DuplicateMessageError) as info:
        inbox.splice(target, 0, 0, [U("o", "dup of other"), U("t", "dup of this")])
    if target == TURN:
        # walk: o', t', t (repeat: t) ... o
        assert str(info.value) == 'message "t" is already pending'
    else:
        # walk: o (next-turn), o' (repeat: o)
        assert str(info.value) == 'message "o" is already pending'
    assert len(log) == n


def test_same_splice_may_remove_and_reinsert_an_id():
    inbox, log, rec = new_inbox()
    inbox.append(TURN, U("a"))
    A2 = U("a", "edited")
    assert inbox.splice(TURN, 0, 1, [A2]) == [U("a")]
    assert inbox.next_turn == (A2,)
    assert rec.calls[-2:] == [("discarded", U("a")), ("inserted", A2)]


@pytest.mark.parametrize(
    "retire",
    [
        lambda ib: ib.claim(TURN, 1),
        lambda ib: ib.remove("a"),
        lambda ib: ib.clear(),
        lambda ib: ib.replace("a", U("b")),
        lambda ib: ib.splice(TURN, 0, 1),
    ],
    ids=["claimed", "removed", "cleared", "replaced", "spliced-out"],
)
def test_id_may_be_sent_again_once_it_is_no_longer_pending(retire):
    inbox, log, _ = new_inbox()
    inbox.append(TURN, U("a"))
    retire(inbox)
    assert "a" not in inbox
    again = U("a", "second time")
    inbox.append(STEP, again)
    assert inbox.get("a") == again
    assert [m.to_dict() for m in InboxProjection.fold(log.splices()).next_step] == [again.to_dict()]
    inbox.close()
    assert Inbox(log).get("a") == again


# --------------------------------------------------------------------------------------------
# targets and accessors
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["next_turn", "NEXT-TURN", "", "next-turn ", "later", None, 1, b"next-turn"])
@pytest.mark.parametrize("op", ["append", "prepend", "splice", "claim"])
def test_invalid_target_raises_value_error_naming_it(op, target):
    inbox, log, rec = new_inbox()
    inbox.append(TURN, U("a"))
    with pytest.raises(ValueError) as info:
        if op == "append":
            inbox.append(target, U("x"))
        elif op == "prepend":
            inbox.prepend(target, U("x"))
        elif op == "splice":
            inbox.splice(target, 0, 1, [U("x")])
        else:
            inbox.claim(target, 1)
    assert repr(target) in str(info.value) or (isinstance(target, str) and target and target in str(info.value))
    assert len(log) == 1
    assert rec.calls == [("inserted", U("a"))]


def test_target_constants():
    assert kerman.NEXT_TURN == "next-turn"
    assert kerman.NEXT_STEP == "next-step"


def test_accessors():
    inbox, log, _ = new_inbox()
    assert len(inbox) == 0
    assert inbox.has_pending is False
    assert inbox.next_turn == () and inbox.next_step == ()
    assert inbox.get("a") is None
    assert "a" not in inbox
    assert inbox.log.id == log.id

    T1, T2, S1 = U("t1"), U("t2"), U("s1")
    inbox.append(TURN, T1)
    inbox.append(TURN, T2)
    inbox.append(STEP, S1)

    assert isinstance(inbox.next_turn, tuple) and isinstance(inbox.next_step, tuple)
    assert inbox.next_turn == (T1, T2)
    assert inbox.next_step == (S1,)
    assert all(isinstance(m, UserMessage) for m in inbox.next_turn + inbox.next_step)
    assert len(inbox) == 3
    assert inbox.has_pending is True
    assert "t2" in inbox and "s1" in inbox and "x" not in inbox
    assert 5 not in inbox and None not in inbox
    assert inbox.get("s1") == S1
    assert inbox.get("t1") == T1
    assert inbox.get("missing") is None

    r = repr(inbox)
    assert "Inbox" in r
    assert "2" in r and "1" in r

    inbox.claim(TURN, 1)
    assert len(inbox) == 1 and inbox.has_pending is True
    assert inbox.next_turn == (T2,)
    inbox.claim(TURN, 2)
    assert len(inbox) == 0 and inbox.has_pending is False
    assert "Inbox" in repr(inbox)


def test_returned_tuples_are_snapshots():
    inbox, _, _ = new_inbox()
    inbox.append(TURN, U("a"))
    snap = inbox.next_turn
    inbox.append(TURN, U("b"))
    assert ids(snap) == ["a"]
    assert ids(inbox.next_turn) == ["a", "b"]


def test_has_pending_with_only_next_step():
    inbox, _, _ = new_inbox()
    inbox.append(STEP, U("s"))
    assert inbox.has_pending is True and len(inbox) == 1


# --------------------------------------------------------------------------------------------
# replay
# --------------------------------------------------------------------------------------------


def _exercise(inbox):
    inbox.append(TURN, U("t1"))
    inbox.append(TURN, U("t2", source={"kind": "plugin", "plugin": "p", "x": [1, 2.5, None]}))
    inbox.prepend(TURN, U("t0"))
    inbox.append(STEP, U("s1"))
    inbox.append(STEP, U("s2"))
    inbox.replace("t1", U("t1", "edited"))
    inbox.remove("s2")
    inbox.claim(STEP, 1)
    inbox.append(STEP, U("s3"))
    inbox.splice(TURN, -1, 1, [U("t3"), U("t4")])


def test_a_new_inbox_over_the_same_log_replays_the_lists_silently():
    inbox, log, _ = new_inbox()
    _exercise(inbox)
    inbox.close()  # a log has at most one inbox (test_one_inbox_per_log.py)
    again, _, rec = new_inbox(log)
    assert again.next_turn == inbox.next_turn
    assert again.next_step == inbox.next_step
    assert [m.to_dict() for m in again.next_turn] == [m.to_dict() for m in inbox.next_turn]
    assert ids(again.next_turn) == ["t0", "t1", "t3", "t4"]
    assert ids(again.next_step) == ["s3"]
    assert again.next_turn[1].text == "edited"
    assert rec.calls == [], "replay emits no notifications"
    n = len(log)
    again.close()
    Inbox(log)
    assert len(log) == n, "replay appends nothing"


def test_reopened_file_session_replays_the_lists(tmp_path):
    store = kerman.FileStore(str(tmp_path), durability="none")
    log = store.create("sess")
    inbox = Inbox(log)
    _exercise(inbox)
    expected_turn = [m.to_dict() for m in inbox.next_turn]
    expected_step = [m.to_dict() for m in inbox.next_step]
    log.close()

    reopened = kerman.FileStore(str(tmp_path), durability="none").open("sess")
    try:
        again = Inbox(reopened)
        assert [m.to_dict() for m in again.next_turn] == expected_turn
        assert [m.to_dict() for m in again.next_step] == expected_step
        # keeps working: new mutations continue the same log
        again.append(STEP, U("after-reopen"))
        again.close()
        assert ids(Inbox(reopened).next_step) == ["s3", "after-reopen"]
    finally:
        reopened.close()


# --------------------------------------------------------------------------------------------
# thread safety
# --------------------------------------------------------------------------------------------


def test_concurrent_mutations_match_a_replay_of_the_log():
    log = new_log()
    counts = {"inserted": 0, "discarded": 0, "claimed": 0}
    counts_lock = threading.Lock()

    def counter(kind):
        def cb(message, *rest):
            with counts_lock:
                counts[kind] += 1

        return cb

    observed = []
    log.subscribe(lambda ev: observed.append(ev.seq))
    inbox = Inbox(log, on_inserted=counter("inserted"), on_discarded=counter("discarded"), on_claimed=counter("claimed"))
    threads_n, rounds = 8, 60
    barrier = threading.Barrier(threads_n)
    failures = []
    dup_errors = []

    def worker(k: int):
        try:
            barrier.wait()
            for i in range(rounds):
                target = TURN if (i + k) % 2 else STEP
                inbox.append(target, U(f"w{k}-{i}"))
                if i % 3 == 0:
                    inbox.prepend(STEP, U(f"p{k}-{i}"))
                if i % 4 == 1:
                    inbox.remove(f"w{k}-{i - 1}")
                if i % 5 == 2:
                    inbox.replace(f"w{k}-{i}", U(f"r{k}-{i}"))
                if i % 7 == 3:
                    inbox.claim(TURN if k % 2 else STEP, i)
                if i % 11 == 4:
                    inbox.splice(TURN, -2, 1, [U(f"x{k}-{i}")])
                try:
                    inbox.append(TURN, U("shared", f"from {k}"))
                except DuplicateMessageError as e:
                    dup_errors.append(str(e))
                else:
                    inbox.remove("shared") if i % 2 else None
        except BaseException as e:  # pragma: no cover - reported below
            failures.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert all(e == 'message "shared" is already pending' for e in dup_errors)

    folded = InboxProjection.fold(log.splices())
    assert folded.next_turn == inbox.next_turn
    assert folded.next_step == inbox.next_step
    inbox.close()
    replayed = Inbox(log)
    assert replayed.next_turn == inbox.next_turn
    assert replayed.next_step == inbox.next_step
    all_ids = ids(inbox.next_turn) + ids(inbox.next_step)
    assert len(all_ids) == len(set(all_ids))
    assert observed == list(range(len(log)))
    # every logged insertion was announced once, every canceled removal once
    inserted = sum(len(ev.data["inserted"]) for ev in log.splices())
    canceled = sum(ev.data.get("removedCount", 0) for ev in log.splices() if ev.data.get("outcome") == "canceled")
    claimed = sum(ev.data.get("removedCount", 0) for ev in log.splices() if "outcome" not in ev.data)
    assert counts == {"inserted": inserted, "discarded": canceled, "claimed": claimed}
    assert inserted - canceled - claimed == len(inbox)
