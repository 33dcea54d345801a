"""Parity, part 1: the inbox and the log on a memory store, run against Kerman and against the
benchmarks' pure-Python baseline (the ``api`` fixture, ``--impl``; see conftest.py).

This is what P1 and P2 time, so the baseline must do all of it: one ``agent/inbox/spliced`` per
list touched, with exactly these payloads and key order (SPEC 2.3, reference 3.2–3.6); the lists
after each operation; claim returning the batch in order; duplicate pending ids refused; no-ops
logging nothing. Expected values are written out from SPEC, the same for both implementations.
"""

from __future__ import annotations

import math

import pytest
from parity_helpers import SPLICED, STEP, TURN, UUID7, Minted, ids, msg, records, same, splices


def new(api, **callbacks):
    log = api.MemoryStore().create()
    return api.Inbox(log, **callbacks), log


def U(api, id, text=None, source=None):
    return api.UserMessage(text if text is not None else f"text {id}", source=source, id=id)


def test_target_constants(api):
    assert (api.NEXT_TURN, api.NEXT_STEP) == (TURN, STEP)


def test_append_logs_one_insertion_per_call_and_grows_the_list(api):
    inbox, log = new(api)
    a, b, s = U(api, "a"), U(api, "b"), U(api, "s", source={"kind": "plugin", "plugin": "guard"})
    assert inbox.append(TURN, a) == a
    assert ids(inbox.next_turn) == ["a"] and inbox.next_step == ()
    assert inbox.append(TURN, b) == b
    assert inbox.append(STEP, s) == s
    assert ids(inbox.next_turn) == ["a", "b"] and ids(inbox.next_step) == ["s"]
    same(
        splices(log),
        [
            {"target": TURN, "start": 0, "inserted": [msg("a", "text a")]},
            {"target": TURN, "start": 1, "inserted": [msg("b", "text b")]},
            {"target": STEP, "start": 0, "inserted": [msg("s", "text s", {"kind": "plugin", "plugin": "guard"})]},
        ],
    )
    assert len(inbox) == 3 and inbox.has_pending and "s" in inbox and "zz" not in inbox
    assert inbox.get("b") == b and inbox.get("zz") is None


def test_append_of_a_str_mints_a_uuid7_user_message(api):
    inbox, log = new(api)
    m = inbox.append(STEP, "hello")
    assert UUID7.fullmatch(m.id)
    assert (m.role, m.content, m.source, m.text) == ("user", [{"type": "text", "text": "hello"}], {"kind": "user"}, "hello")
    same(splices(log), [{"target": STEP, "start": 0, "inserted": [msg("<m1>", "hello")]}])  # <m1> is m.id


def test_prepend_inserts_at_the_head(api):
    inbox, log = new(api)
    inbox.append(STEP, U(api, "1"))
    assert inbox.prepend(STEP, U(api, "A")) == U(api, "A")
    assert ids(inbox.next_step) == ["A", "1"]
    same(splices(log, 1), [{"target": STEP, "start": 0, "inserted": [msg("A", "text A")]}])


@pytest.mark.parametrize("target", [TURN, STEP])
def test_remove_logs_a_canceled_removal(api, target):
    inbox, log = new(api)
    for k in "xyz":
        inbox.append(target, U(api, k))
    assert inbox.remove("y") is True
    same(splices(log, 3), [{"target": target, "start": 1, "removedCount": 1, "inserted": [], "outcome": "canceled"}])
    assert ids(inbox.next_turn if target == TURN else inbox.next_step) == ["x", "z"]
    assert "y" not in inbox and len(inbox) == 2


def test_removing_an_unknown_id_is_a_no_op_without_an_event(api):
    inbox, log = new(api)
    inbox.append(TURN, U(api, "a"))
    assert inbox.remove("nope") is False
    assert inbox.remove("a") is True
    assert inbox.remove("a") is False  # no longer pending
    assert len(log) == 2
    assert inbox.next_turn == () and not inbox.has_pending


def test_append_remove_pairs_reuse_one_id(api):
    """P1's shape: the same message appended and removed again and again."""
    inbox, log = new(api)
    m = U(api, "m-0", "Summarise the design note")
    for _ in range(3):
        inbox.append(TURN, m)
        assert inbox.remove(m.id) is True
    insert = {"target": TURN, "start": 0, "inserted": [msg("m-0", "Summarise the design note")]}
    remove = {"target": TURN, "start": 0, "removedCount": 1, "inserted": [], "outcome": "canceled"}
    same(splices(log), [insert, remove] * 3)
    assert len(inbox) == 0


def test_replace_in_either_list_and_with_the_same_id(api):
    calls = []
    inbox, log = new(api, on_inserted=lambda m: calls.append(("inserted", m.id)), on_discarded=lambda m: calls.append(("discarded", m.id)))
    inbox.append(TURN, U(api, "t0"))
    inbox.append(TURN, U(api, "t1"))
    inbox.append(STEP, U(api, "s"))
    assert inbox.replace("t1", U(api, "r")) is True
    assert inbox.replace("s", U(api, "s", "edited")) is True
    assert inbox.replace("missing", U(api, "q")) is False
    same(
        splices(log, 3),
        [
            {"target": TURN, "start": 1, "removedCount": 1, "inserted": [msg("r", "text r")], "outcome": "canceled"},
            {"target": STEP, "start": 0, "removedCount": 1, "inserted": [msg("s", "edited")], "outcome": "canceled"},
        ],
    )
    assert ids(inbox.next_turn) == ["t0", "r"] and [m.text for m in inbox.next_step] == ["edited"]
    assert calls[3:] == [("discarded", "t1"), ("inserted", "r"), ("discarded", "s"), ("inserted", "s")]


@pytest.mark.parametrize(
    "start, delete, expect_start, expect_removed", [(-1, 1, 2, 1), (10, 5, 3, 0), (-10, 2, 0, 2), (1, -3, 1, 0), (1, 99, 1, 2)]
)
def test_splice_coordinates_follow_python_slice_semantics(api, start, delete, expect_start, expect_removed):
    inbox, log = new(api)
    base = [U(api, k) for k in "abc"]
    for m in base:
        inbox.append(TURN, m)
    removed = inbox.splice(TURN, start, delete, [U(api, "x")])
    assert removed == base[expect_start : expect_start + expect_removed]
    payload = {"target": TURN, "start": expect_start}
    if expect_removed:
        payload["removedCount"] = expect_removed
    payload["inserted"] = [msg("x", "text x")]
    if expect_removed:
        payload["outcome"] = "canceled"
    same(splices(log, 3), [payload])
    lst = list(base)
    lst[expect_start : expect_start + expect_removed] = [U(api, "x")]
    assert list(inbox.next_turn) == lst


def test_clear_removes_next_step_then_next_turn(api):
    inbox, log = new(api)
    for k in ("t0", "t1", "t2"):
        inbox.append(TURN, U(api, k))
    for k in ("s0", "s1"):
        inbox.append(STEP, U(api, k))
    assert ids(inbox.clear()) == ["s0", "s1", "t0", "t1", "t2"]
    same(
        splices(log, 5),
        [
            {"target": STEP, "start": 0, "removedCount": 2, "inserted": [], "outcome": "canceled"},
            {"target": TURN, "start": 0, "removedCount": 3, "inserted": [], "outcome": "canceled"},
        ],
    )
    assert inbox.next_turn == () and inbox.next_step == () and len(inbox) == 0
    assert inbox.clear() == [] and len(log) == 7


def test_claim_at_a_turn_boundary_takes_all_steps_then_the_head_prompt(api):
    claimed = []
    inbox, log = new(api, on_claimed=lambda m, turn: claimed.append((m.id, turn)))
    for k in ("s0", "s1"):
        inbox.append(STEP, U(api, k))
    for k in ("t0", "t1", "t2"):
        inbox.append(TURN, U(api, k))
    batch = inbox.claim(TURN, 4)
    assert ids(batch) == ["s0", "s1", "t0"]
    assert [m.text for m in batch] == ["text s0", "text s1", "text t0"]
    same(
        splices(log, 5),
        [
            {"target": STEP, "start": 0, "removedCount": 2, "inserted": []},
            {"target": TURN, "start": 0, "removedCount": 1, "inserted": []},
        ],
    )
    assert inbox.next_step == () and ids(inbox.next_turn) == ["t1", "t2"]
    assert claimed == [("s0", 4), ("s1", 4), ("t0", 4)]


def test_claim_of_next_step_takes_the_whole_batch_in_order_and_empties_it(api):
    """P2's shape: ten steering messages, one claim."""
    inbox, log = new(api)
    inbox.append(TURN, U(api, "p"))
    ten = [U(api, f"s-{i}", f"steering note {i}") for i in range(10)]
    for m in ten:
        inbox.append(STEP, m)
    assert inbox.claim(STEP, 2) == ten
    same(splices(log, 11), [{"target": STEP, "start": 0, "removedCount": 10, "inserted": []}])
    assert inbox.next_step == () and ids(inbox.next_turn) == ["p"]
    assert inbox.claim(STEP, 3) == [] and len(log) == 12  # empty: no event
    for m in ten:  # claimed ids are free again
        inbox.append(STEP, m)
    assert inbox.claim(STEP, 4) == ten


def test_claim_with_both_lists_empty_does_nothing(api):
    inbox, log = new(api)
    assert inbox.claim(TURN, 1) == [] and inbox.claim(STEP, 1) == []
    assert len(log) == 0


DUPLICATES = {
    "append-same-list": lambda api, ib: ib.append(TURN, U(api, "a", "again")),
    "append-other-list": lambda api, ib: ib.append(STEP, U(api, "a", "again")),
    "prepend-other-list": lambda api, ib: ib.prepend(STEP, U(api, "a", "again")),
    "replace-with-a-pending-id": lambda api, ib: ib.replace("s", U(api, "a", "again")),
}


@pytest.mark.parametrize("case", sorted(DUPLICATES))
def test_duplicate_pending_ids_are_refused_and_change_nothing(api, case):
    inbox, log = new(api)
    inbox.append(TURN, U(api, "a"))
    inbox.append(STEP, U(api, "s"))
    with pytest.raises(api.DuplicateMessageError) as info:
        DUPLICATES[case](api, inbox)
    assert isinstance(info.value, ValueError)
    assert str(info.value) == 'message "a" is already pending'
    assert len(log) == 2
    assert ids(inbox.next_turn) == ["a"] and ids(inbox.next_step) == ["s"]
    assert [m.text for m in inbox.next_turn] == ["text a"]


@pytest.mark.parametrize("target", ["next_turn", "", None])
def test_unknown_target_raises_value_error(api, target):
    inbox, log = new(api)
    with pytest.raises(ValueError):
        inbox.append(target, U(api, "x"))
    with pytest.raises(ValueError):
        inbox.claim(target, 1)
    assert len(log) == 0 and len(inbox) == 0


def test_a_second_inbox_over_the_log_replays_the_lists(api):
    inbox, log = new(api)
    for k in ("a", "b", "c"):
        inbox.append(TURN, U(api, k))
    inbox.append(STEP, U(api, "s"))
    inbox.remove("b")
    inbox.claim(STEP, 1)
    inbox.prepend(STEP, U(api, "s2"))
    if api.__name__ == "kerman":
        inbox.close()  # a log has at most one inbox
    again = api.Inbox(log)
    assert ids(again.next_turn) == ["a", "c"] and ids(again.next_step) == ["s2"]
    assert again.next_turn == inbox.next_turn
    assert len(log) == 7  # replay logs nothing


def test_a_message_that_is_not_json_is_refused_and_nothing_changes(api):
    inbox, log = new(api)
    with pytest.raises(ValueError):
        inbox.append(TURN, api.UserMessage("x", source={"kind": "plugin", "score": math.nan}, id="nan"))
    assert len(log) == 0 and "nan" not in inbox


@pytest.mark.baseline_shortcut("no lossless-JSON checks beyond allow_nan=False (json.dumps turns int keys into str)")
def test_a_message_with_a_non_str_key_is_refused(api):
    inbox, log = new(api)
    with pytest.raises(ValueError):
        inbox.append(TURN, api.UserMessage("x", source={"kind": "plugin", 1: "one"}, id="k"))
    assert len(log) == 0 and "k" not in inbox


# ---- the log --------------------------------------------------------------------------------


def test_log_seqs_are_contiguous_and_events_read_back_as_logged(api):
    inbox, log = new(api)
    for i in range(4):
        inbox.append(TURN if i % 2 else STEP, U(api, f"m{i}"))
    inbox.remove("m1")
    inbox.claim(TURN, 1)
    ev = log.append("goal/change", {"goal": "ship it", "why": ["fast", None, 1.5]})
    assert (ev.seq, ev.type, ev.data) == (7, "goal/change", {"goal": "ship it", "why": ["fast", None, 1.5]})
    assert len(log) == 8
    recs = records(log)  # checks seq contiguity and time order on the way
    assert [r["type"] for r in recs] == [SPLICED] * 7 + ["goal/change"]
    same(recs[-1], {"type": "goal/change", "seq": 7, "data": {"goal": "ship it", "why": ["fast", None, 1.5]}})
    assert [log[i].seq for i in range(len(log))] == list(range(8))
    assert all(log[i].data == r["data"] for i, r in enumerate(recs))
    assert [e.seq for e in log.events(2, 5)] == [2, 3, 4]
    assert [e.seq for e in log.events(types=["goal/change"])] == [7]


def test_log_observers_see_every_committed_event_in_order(api):
    inbox, log = new(api)
    seen = []
    log.subscribe(lambda ev: seen.append((ev.seq, ev.type, ids(inbox.next_turn), ids(inbox.next_step), len(inbox))))
    inbox.append(TURN, U(api, "a"))
    inbox.append(STEP, U(api, "b"))
    inbox.claim(TURN, 1)
    # committed before the lists change: the observer sees the lists of before the splice
    assert seen == [(0, SPLICED, [], [], 0), (1, SPLICED, ["a"], [], 1), (2, SPLICED, ["a"], ["b"], 2), (3, SPLICED, ["a"], [], 1)]


def test_minted_redaction_names_repeats_alike():
    m = Minted()
    a, b = "01a22b4f-c18d-7399-b5df-d18897837d8f", "01a22b4f-c18e-7344-8072-ea739632648f"
    assert m([a, {"id": b}, a, "plain"]) == ["<m1>", {"id": "<m2>"}, "<m1>", "plain"]
