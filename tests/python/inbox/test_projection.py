"""InboxProjection (reference 4.1/4.2, SPEC 2.4) and consumed_work (reference 4.4, CW-* of 7.8)."""

from __future__ import annotations

import random

import pytest

import kerman
from kerman import Inbox, InboxProjection, ProjectionError, UserMessage, consumed_work

SPLICED = "agent/inbox/spliced"
TURN = "next-turn"
STEP = "next-step"


def U(id: str, text: str | None = None, source: dict | None = None) -> UserMessage:
    return UserMessage(text if text is not None else f"text of {id}", source=source, id=id)


def user_dict(id: str, kind: str = "user", **source) -> dict:
    return {
        "id": id,
        "role": "user",
        "content": [{"type": "text", "text": f"text of {id}"}],
        "source": {"kind": kind, **source},
    }


def ids(messages) -> list[str]:
    return [m.id for m in messages]


class Stream:
    """Builds envelope dicts with consecutive seqs."""

    def __init__(self, start: int = 0) -> None:
        self.events: list[dict] = []
        self.seq = start

    def add(self, type: str, data, **extra) -> dict:
        ev = {"type": type, "seq": self.seq, "time": 1000 + self.seq, "data": data, **extra}
        self.seq += 1
        self.events.append(ev)
        return ev

    def splice(self, target, start, inserted=(), removed=0, outcome=None, **extra) -> dict:
        data = {"target": target, "start": start}
        if removed:
            data["removedCount"] = removed
        data["inserted"] = list(inserted)
        if outcome:
            data["outcome"] = outcome
        data.update(extra)
        return self.add(SPLICED, data)

    def insert(self, target="next-turn", *ids_, start=0) -> dict:
        return self.splice(target, start, [user_dict(i) for i in ids_])

    def claim(self, target="next-turn", count=1) -> dict:
        return self.splice(target, 0, removed=count)

    def cancel(self, target="next-turn", count=1, inserted=()) -> dict:
        return self.splice(target, 0, inserted, removed=count, outcome="canceled")

    def turn_start(self, turn):
        return self.add("turn/start", {"turn": turn})

    def step(self, turn, step=1):
        self.add("step/start", {"turn": turn, "step": step})
        self.add("user/message", user_dict(f"um-{self.seq}"), surfaceOp="append")
        return self.add("step/end", {"turn": turn, "step": step})

    def turn_end(self, turn, kind, **reason):
        return self.add("turn/end", {"turn": turn, "reason": {"kind": kind, **reason}})


def lists(p) -> tuple[list[dict], list[dict]]:
    return [m.to_dict() for m in p.next_turn], [m.to_dict() for m in p.next_step]


# --------------------------------------------------------------------------------------------
# InboxProjection
# --------------------------------------------------------------------------------------------


def test_new_projection_is_empty():
    p = InboxProjection()
    assert p.next_turn == () and p.next_step == ()
    assert p.items() == []
    assert len(p) == 0
    assert "InboxProjection" in repr(p)


def test_apply_event_and_apply_dict_agree_with_the_inbox():
    log = kerman.MemoryStore().create()
    inbox = Inbox(log)
    inbox.append(TURN, U("t1"))
    inbox.append(STEP, U("s1", source={"kind": "plugin", "plugin": ""}))
    inbox.append(TURN, U("t2"))
    inbox.replace("t1", U("t1b"))
    inbox.claim(STEP, 1)
    inbox.prepend(STEP, U("s2"))

    from_events = InboxProjection()
    from_dicts = InboxProjection()
    for ev in log.splices():
        assert isinstance(ev, kerman.Event)
        from_events.apply(ev)
        from_dicts.apply(ev.to_dict())
    assert from_events.next_turn == inbox.next_turn
    assert from_events.next_step == inbox.next_step
    assert lists(from_dicts) == lists(from_events)
    assert ids(from_dicts.next_turn) == ["t1b", "t2"]
    assert ids(from_dicts.next_step) == ["s2"]
    assert len(from_dicts) == 3
    assert all(isinstance(m, UserMessage) for m in from_dicts.next_turn + from_dicts.next_step)


def test_apply_ignores_other_event_types():
    s = Stream()
    s.insert(TURN, "a")
    s.turn_start(1)
    s.add("goal/change", {"goal": "x"})
    s.step(1)
    s.add(
        "assistant/message",
        {
            "turn": 1,
            "step": 1,
            "message": {
                "id": "am",
                "role": "assistant",
                "content": [{"type": "text", "text": "hi"}],
                "source": {"kind": "model", "provider": "p", "model": "m"},
            },
        },
        surfaceOp="append",
        sourceEventSeqs=[],
    )
    s.turn_end(1, "completed")
    s.insert(STEP, "b")
    p = InboxProjection()
    for ev in s.events:
        p.apply(ev)
    assert ids(p.next_turn) == ["a"]
    assert ids(p.next_step) == ["b"]
    # `fold` over the whole stream (not only the splices) gives the same
    assert lists(InboxProjection.fold(s.events)) == lists(p)


def test_fold_over_a_log_with_plugin_events_ignores_them():
    log = kerman.MemoryStore().create()
    inbox = Inbox(log)
    log.append("goal/change", {"goal": "g"})
    inbox.append(TURN, U("a"))
    log.append("session/title", {"title": "t"})
    inbox.append(STEP, U("b"))
    assert ids(InboxProjection.fold(log.events()).next_turn) == ["a"]
    assert lists(InboxProjection.fold(log.events())) == lists(InboxProjection.fold(log.splices()))
    assert lists(InboxProjection.fold(log)) == lists(InboxProjection.fold(log.splices()))


@pytest.mark.parametrize("seed", range(8))
def test_fold_equals_the_inbox_after_a_random_sequence(seed):
    rng = random.Random(seed)
    log = kerman.MemoryStore().create()
    inbox = Inbox(log)
    counter = 0
    for _ in range(120):
        op = rng.choice(["append", "prepend", "splice", "replace", "remove", "claim", "clear", "plugin"])
        target = rng.choice([TURN, STEP])
        pending = ids(inbox.next_turn) + ids(inbox.next_step)
        counter += 1
        fresh = U(f"m{counter}", source=rng.choice([None, {"kind": "plugin", "plugin": "p"}]))
        if op == "append":
            inbox.append(target, fresh)
        elif op == "prepend":
            inbox.prepend(target, fresh)
        elif op == "splice":
            inserted = [U(f"m{counter}-{j}") for j in range(rng.randrange(3))]
            inbox.splice(target, rng.randint(-4, 4), rng.randint(-1, 3), inserted)
        elif op == "replace" and pending:
            victim = rng.choice(pending)
            keep = rng.random() < 0.5
            inbox.replace(victim, U(victim, "rewritten") if keep else fresh)
        elif op == "remove" and pending:
            inbox.remove(rng.choice(pending))
        elif op == "claim":
            inbox.claim(target, rng.randrange(1, 50))
        elif op == "clear" and rng.random() < 0.1:
            inbox.clear()
        elif op == "plugin":
            log.append("note/x", {"n": counter})
        folded = InboxProjection.fold(log.splices())
        assert folded.next_turn == inbox.next_turn
        assert folded.next_step == inbox.next_step
    assert lists(InboxProjection.fold(ev.to_dict() for ev in log.events())) == lists(InboxProjection.fold(log.splices()))


def test_items_placements():
    s = Stream()
    s.splice(TURN, 0, [user_dict("t-user"), user_dict("t-plugin", "plugin", plugin="guard")])
    s.splice(
        STEP,
        0,
        [
            user_dict("s-user"),
            user_dict("s-plugin", "plugin", plugin=""),
            user_dict("s-instr", "agent-instructions", form="instructions", changes=[]),
            user_dict("s-user2"),
        ],
    )
    p = InboxProjection.fold(s.events)
    items = p.items()
    assert [(placement, m.id) for placement, m in items] == [
        ("queued", "t-user"),
        ("queued", "t-plugin"),
        ("steering", "s-user"),
        ("context", "s-plugin"),
        ("context", "s-instr"),
        ("steering", "s-user2"),
    ]
    assert all(isinstance(m, UserMessage) for _, m in items)
    assert items[4][1].source == {"kind": "agent-instructions", "form": "instructions", "changes": []}


def test_items_follow_later_splices():
    p = InboxProjection()
    s = Stream()
    p.apply(s.insert(STEP, "a", "b"))
    p.apply(s.claim(STEP, 2))
    p.apply(s.insert(TURN, "c"))
    assert [(pl, m.id) for pl, m in p.items()] == [("queued", "c")]


def test_outcome_and_unknown_fields_do_not_change_list_effects():
    s1, s2 = Stream(), Stream()
    for s in (s1, s2):
        s.insert(TURN, "a", "b", "c")
    s1.splice(TURN, 1, removed=1, outcome="canceled", note="x")
    s2.splice(TURN, 1, removed=1)
    assert lists(InboxProjection.fold(s1.events)) == lists(InboxProjection.fold(s2.events))
    assert ids(InboxProjection.fold(s1.events).next_turn) == ["a", "c"]


BAD_SPLICES = {
    "start-beyond-len": {"target": TURN, "start": 3, "inserted": []},
    "removed-beyond-len": {"target": TURN, "start": 1, "removedCount": 2, "inserted": []},
    "removed-beyond-empty-step": {"target": STEP, "start": 0, "removedCount": 1, "inserted": []},
    "negative-start": {"target": TURN, "start": -1, "inserted": []},
    "fractional-removed": {"target": TURN, "start": 0, "removedCount": 0.5, "inserted": []},
    "bad-target": {"target": "next_turn", "start": 0, "inserted": []},
    "missing-target": {"start": 0, "inserted": []},
    "missing-start": {"target": TURN, "inserted": []},
    "inserted-not-list": {"target": TURN, "start": 0, "inserted": {"id": "x"}},
    "duplicate-other-list": {"target": STEP, "start": 0, "inserted": [user_dict("a")]},
    "duplicate-same-list": {"target": TURN, "start": 2, "inserted": [user_dict("b")]},
    "duplicate-within-inserted": {"target": STEP, "start": 0, "inserted": [user_dict("z"), user_dict("z")]},
    "inserted-not-a-message": {"target": TURN, "start": 0, "inserted": [{"text": "x"}]},
}


@pytest.mark.parametrize("case", sorted(BAD_SPLICES))
@pytest.mark.parametrize("as_event", [False, True], ids=["dict", "Event"])
def test_invalid_splice_raises_and_leaves_the_projection_unchanged(case, as_event, tmp_path):
    s = Stream(start=10)
    s.insert(TURN, "a", "b")
    p = InboxProjection.fold(s.events)
    before = lists(p), [(pl, m.id) for pl, m in p.items()]
    bad = s.add(SPLICED, BAD_SPLICES[case])
    bad_seq = bad["seq"]
    assert bad_seq == 11
    if as_event:
        # a real Event carrying the same payload, read back from a hand-written session file
        bad = _event_from_file(tmp_path, s.events)[-1]
        assert isinstance(bad, kerman.Event) and bad.seq == bad_seq
    with pytest.raises(ProjectionError) as info:
        p.apply(bad)
    assert info.value.seq == bad_seq
    assert str(info.value).startswith(f"invalid persisted inbox splice at session seq {bad_seq}")
    assert isinstance(info.value, kerman.KermanError)
    assert (lists(p), [(pl, m.id) for pl, m in p.items()]) == before
    # still usable afterwards
    p.apply(Stream(start=13).insert(STEP, "c"))
    assert ids(p.next_step) == ["c"] and ids(p.next_turn) == ["a", "b"]


def test_fold_raises_at_the_first_bad_splice():
    s = Stream()
    s.insert(TURN, "a")
    s.add("goal/change", {"goal": "x"})
    s.splice(TURN, 5, [])
    s.splice(TURN, 9, [])
    with pytest.raises(ProjectionError) as info:
        InboxProjection.fold(s.events)
    assert info.value.seq == 2


def _event_from_file(root, events):
    """Writes `events` (padded with plugin events from seq 0) as a FileStore session file and
    returns them read back as Events."""
    import json

    def crc32c(data: bytes) -> int:
        crc = 0xFFFFFFFF
        for byte in data:
            crc ^= byte
            for _ in range(8):
                crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
        return crc ^ 0xFFFFFFFF

    header = {"type": "session", "version": 1, "id": "p", "createdAt": 0}
    lines = []
    for obj in [header, *events]:
        text = json.dumps(obj, separators=(",", ":"))
        lines.append(f"{crc32c(text.encode()):08x} {text}\n")
    # the session file needs seqs from 0: pad with plugin events up to the first seq
    first = events[0]["seq"]
    pad = []
    for seq in range(first):
        text = json.dumps({"type": "pad/x", "seq": seq, "time": 0, "data": {}}, separators=(",", ":"))
        pad.append(f"{crc32c(text.encode()):08x} {text}\n")
    (root / "p.jsonl").write_text(lines[0] + "".join(pad) + "".join(lines[1:]), encoding="utf-8")
    log = kerman.FileStore(str(root), durability="none").open("p")
    try:
        return list(log.events(start=first))
    finally:
        log.close()


# --------------------------------------------------------------------------------------------
# consumed_work (reference 4.4)
# --------------------------------------------------------------------------------------------


def test_CW_01_only_an_insertion():
    s = Stream()
    s.insert(TURN, "a")
    work = consumed_work(s.events)
    assert work.end is None
    assert work.dropped_unrun is False


def test_CW_02_stepped_turns_end_is_the_last():
    s = Stream()
    s.insert(TURN, "a", "b")
    s.turn_start(1)
    s.claim(TURN)
    s.step(1)
    s.turn_end(1, "completed")
    s.turn_start(2)
    s.claim(TURN)
    s.step(2)
    end2 = s.turn_end(2, "max-tokens")
    work = consumed_work(s.events)
    assert isinstance(work.end, kerman.Event)
    assert work.end.seq == end2["seq"]
    assert work.end.type == "turn/end"
    assert work.end.data == {"turn": 2, "reason": {"kind": "max-tokens"}}
    assert work.dropped_unrun is False


def _stepped_turn_one(s: Stream) -> dict:
    s.insert(TURN, "a")
    s.turn_start(1)
    s.claim(TURN)
    s.step(1)
    return s.turn_end(1, "completed")


@pytest.mark.parametrize(
    "case, reason",
    [
        ("CW_03", {"kind": "error", "error": {"message": "boom", "code": "UNKNOWN"}}),
        ("CW_04", {"kind": "aborted", "reason": {"kind": "user"}}),
        ("CW_06", {"kind": "blocked"}),
        ("interrupted", {"kind": "interrupted"}),
        ("unknown-kind", {"kind": "something-new"}),
    ],
)
def test_CW_03_04_06_claimed_turn_ending_without_a_step_accounts(case, reason):
    s = Stream()
    _stepped_turn_one(s)
    s.insert(TURN, "b")
    s.turn_start(2)
    s.claim(TURN)
    end2 = s.add("turn/end", {"turn": 2, "reason": reason})
    work = consumed_work(s.events)
    assert work.end is not None and work.end.seq == end2["seq"]
    assert work.end.data["reason"] == reason
    assert work.dropped_unrun is False


def test_CW_03_error():
    s = Stream()
    _stepped_turn_one(s)
    s.insert(TURN, "b")
    s.turn_start(2)
    s.claim(TURN)
    end2 = s.turn_end(2, "error", error={"message": "boom", "code": "UNKNOWN"})
    assert consumed_work(s.events).end.seq == end2["seq"]


def test_CW_04_aborted():
    s = Stream()
    _stepped_turn_one(s)
    s.insert(STEP, "b")
    s.turn_start(2)
    s.claim(STEP)
    end2 = s.turn_end(2, "aborted", reason={"kind": "user"})
    assert consumed_work(s.events).end.seq == end2["seq"]


def test_CW_05_turns_that_claimed_nothing_are_ignored():
    s = Stream()
    end1 = _stepped_turn_one(s)
    for turn, kind, extra in [
        (2, "aborted", {"reason": {"kind": "user"}}),
        (3, "error", {"error": {"message": "x", "code": "UNKNOWN"}}),
        (4, "blocked", {}),
    ]:
        s.turn_start(turn)
        s.turn_end(turn, kind, **extra)
    work = consumed_work(s.events)
    assert work.end is not None and work.end.seq == end1["seq"]
    assert work.end.data["turn"] == 1
    assert work.dropped_unrun is False


def test_CW_06_blocked():
    s = Stream()
    _stepped_turn_one(s)
    s.insert(TURN, "b")
    s.turn_start(2)
    s.claim(TURN)
    end2 = s.turn_end(2, "blocked")
    work = consumed_work(s.events)
    assert work.end.seq == end2["seq"]
    assert work.end.data == {"turn": 2, "reason": {"kind": "blocked"}}


def test_claimed_turn_completed_without_a_step_does_not_account():
    s = Stream()
    end1 = _stepped_turn_one(s)
    s.insert(TURN, "b")
    s.turn_start(2)
    s.claim(TURN)
    s.turn_end(2, "completed")
    assert consumed_work(s.events).end.seq == end1["seq"]


def test_CW_08_claim_with_no_open_turn_is_ignored():
    # an owned suffix starting mid-turn: the claim happens before any turn/start we see
    s = Stream(start=40)
    s.claim(TURN)
    s.turn_end(5, "error", error={"message": "x", "code": "UNKNOWN"})
    work = consumed_work(s.events)
    assert work.end is None
    assert work.dropped_unrun is False


def test_CW_09_canceled_removal_after_the_last_turn_is_a_drop():
    s = Stream()
    end1 = _stepped_turn_one(s)
    s.insert(TURN, "b")
    s.cancel(TURN)
    work = consumed_work(s.events)
    assert work.dropped_unrun is True
    assert work.end is not None and work.end.seq == end1["seq"]


def test_CW_09_drop_without_any_turn():
    s = Stream()
    s.insert(STEP, "b")
    s.cancel(STEP)
    work = consumed_work(s.events)
    assert work.dropped_unrun is True and work.end is None


def test_replacement_is_not_a_drop():
    s = Stream()
    s.insert(TURN, "b")
    s.cancel(TURN, inserted=[user_dict("b2")])
    work = consumed_work(s.events)
    assert work.dropped_unrun is False


def test_CW_11_drop_absorbed_by_a_later_stepped_turn():
    s = Stream()
    _stepped_turn_one(s)
    s.insert(TURN, "b")
    s.cancel(TURN)
    s.insert(TURN, "c")
    s.turn_start(2)
    s.claim(TURN)
    s.step(2)
    end2 = s.turn_end(2, "completed")
    work = consumed_work(s.events)
    assert work.dropped_unrun is False
    assert work.end.seq == end2["seq"]


def test_consumed_work_accepts_events_and_a_log():
    log = kerman.MemoryStore().create()
    inbox = Inbox(log)
    inbox.append(TURN, U("a"))
    assert consumed_work(log) == consumed_work(log.events())
    assert consumed_work(log).dropped_unrun is False
    inbox.replace("a", U("a2"))
    assert consumed_work(log.events()).dropped_unrun is False
    inbox.remove("a2")
    work = consumed_work(log)
    assert work.dropped_unrun is True and work.end is None
    assert consumed_work([ev.to_dict() for ev in log.events()]).dropped_unrun is True
    assert "ConsumedWork" in repr(work)


def test_consumed_work_end_is_the_turn_end_event():
    s = Stream()
    end1 = _stepped_turn_one(s)
    work = consumed_work(s.events)
    assert work.end.to_dict() == end1
    assert work == consumed_work(list(s.events))
    assert work != consumed_work(s.events[:-1])
