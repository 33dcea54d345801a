"""Model-based test: the Inbox against two plain Python lists (reference 3.2-3.5, SPEC 2.3/4.1).

Every rule predicts, from the model alone, the return value, the logged payloads (normalised
coordinates, key order), the callbacks and whether a DuplicateMessageError is due; invariants
check that the lists, a fold of the log and a fresh replay all agree with the model.
"""

from __future__ import annotations

import warnings

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import kerman
from kerman import DuplicateMessageError, Inbox, InboxProjection, UserMessage

# On a failure, Hypothesis' pytest plugin imports this module (black, libcst) while building its
# report; in some environments that import emits a DeprecationWarning, which the suite's
# "warnings are errors" setting turns into a pytest INTERNALERROR that aborts the whole run.
# Importing it here, with warnings silenced, keeps a failure of this test an ordinary failure.
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    try:
        import hypothesis.extra._patching  # noqa: F401
    except Exception:  # pragma: no cover - optional dependencies missing
        pass

TURN = "next-turn"
STEP = "next-step"

targets = st.sampled_from([TURN, STEP])
# small coordinates most of the time, arbitrary (huge, negative) ones sometimes
coords = st.one_of(st.integers(-5, 5), st.integers())
texts = st.sampled_from(["a", "b", "hello", ""])
sources = st.sampled_from([None, {"kind": "plugin", "plugin": ""}, {"kind": "plugin", "plugin": "g", "x": [1]}])
# None: a fresh id; an int: reuse an id used before (pending or not)
id_choices = st.one_of(st.none(), st.none(), st.integers(0, 1000))
message_specs = st.tuples(id_choices, texts, sources)


def normalise(length: int, start: int, delete: int) -> tuple[int, int]:
    """Python slice semantics (SPEC 4.1), written independently of Kerman."""
    s = max(length + start, 0) if start < 0 else min(start, length)
    return s, min(max(delete, 0), length - s)


class InboxMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.log = kerman.MemoryStore().create()
        self.calls: list[tuple] = []
        self.inbox = self.attach()
        self.model: dict[str, list[UserMessage]] = {TURN: [], STEP: []}
        self.expected_calls: list[tuple] = []
        self.expected_payloads: list[dict] = []
        self.used_ids: list[str] = []
        self.counter = 0

    def attach(self) -> Inbox:
        return Inbox(
            self.log,
            on_inserted=lambda m: self.calls.append(("inserted", m)),
            on_discarded=lambda m: self.calls.append(("discarded", m)),
            on_claimed=lambda m, turn: self.calls.append(("claimed", m, turn)),
        )

    # ---------------------------------------------------------------------------------------
    # model helpers

    def message(self, spec) -> UserMessage:
        choice, text, source = spec
        if choice is None or not self.used_ids:
            self.counter += 1
            mid = f"m{self.counter}"
        else:
            mid = self.used_ids[choice % len(self.used_ids)]
        if mid not in self.used_ids:
            self.used_ids.append(mid)
        return UserMessage(f"{mid}:{text}", source=source, id=mid)

    def pending_ids(self) -> list[str]:
        return [m.id for m in self.model[TURN] + self.model[STEP]]

    def duplicates(self, target: str, start: int, removed: int, inserted: list[UserMessage]) -> set[str]:
        candidate = dict(self.model)
        lst = list(candidate[target])
        lst[start : start + removed] = inserted
        candidate[target] = lst
        seen: set[str] = set()
        dups: set[str] = set()
        for m in candidate[TURN] + candidate[STEP]:
            if m.id in seen:
                dups.add(m.id)
            seen.add(m.id)
        return dups

    def expect_splice(self, target, start, removed, inserted, canceled=True):
        """Applies a normalised splice to the model; returns the removed messages."""
        lst = self.model[target]
        out = lst[start : start + removed]
        lst[start : start + removed] = inserted
        data = {"target": target, "start": start}
        if removed:
            data["removedCount"] = removed
        data["inserted"] = [m.to_dict() for m in inserted]
        if canceled and removed:
            data["outcome"] = "canceled"
        self.expected_payloads.append(data)
        if canceled:
            self.expected_calls += [("discarded", m) for m in out]
        self.expected_calls += [("inserted", m) for m in inserted]
        return out

    def run_mutation(self, target, start, removed, inserted, call):
        """Runs `call` expecting either a DuplicateMessageError, a no-op or the given splice."""
        n = len(self.log)
        if not removed and not inserted:
            result = call()
            assert len(self.log) == n
            return result, []
        dups = self.duplicates(target, start, removed, inserted)
        if dups:
            try:
                call()
            except DuplicateMessageError as e:
                text = str(e)
                assert any(text == f'message "{d}" is already pending' for d in dups), (text, dups)
            else:
                raise AssertionError(f"expected DuplicateMessageError for {sorted(dups)}")
            assert len(self.log) == n
            return None, None
        result = call()
        out = self.expect_splice(target, start, removed, inserted)
        assert len(self.log) == n + 1
        return result, out

    def locate(self, mid: str):
        for target in (TURN, STEP):
            for i, m in enumerate(self.model[target]):
                if m.id == mid:
                    return target, i
        return None

    def pick_id(self, choice: int) -> str:
        pool = self.used_ids + ["never-used"]
        return pool[choice % len(pool)]

    # ---------------------------------------------------------------------------------------
    # rules

    @rule(which=targets, spec=message_specs)
    def append(self, which, spec):
        target = which
        m = self.message(spec)
        start = len(self.model[target])
        result, _ = self.run_mutation(target, start, 0, [m], lambda: self.inbox.append(target, m))
        if result is not None:
            assert result == m

    @rule(which=targets, spec=message_specs)
    def prepend(self, which, spec):
        target = which
        m = self.message(spec)
        result, _ = self.run_mutation(target, 0, 0, [m], lambda: self.inbox.prepend(target, m))
        if result is not None:
            assert result == m

    @rule(which=targets, start=coords, delete=coords, specs=st.lists(message_specs, max_size=3))
    def splice(self, which, start, delete, specs):
        target = which
        inserted = [self.message(s) for s in specs]
        s, d = normalise(len(self.model[target]), start, delete)
        result, out = self.run_mutation(target, s, d, inserted, lambda: self.inbox.splice(target, start, delete, inserted))
        if out is not None:
            assert result == out

    @rule(choice=st.integers(0, 1000), spec=message_specs, keep_id=st.booleans())
    def replace(self, choice, spec, keep_id):
        mid = self.pick_id(choice)
        new = self.message(spec)
        if keep_id:
            new = UserMessage(f"{mid}:rewritten", id=mid)
        where = self.locate(mid)
        call = lambda: self.inbox.replace(mid, new)  # noqa: E731
        if where is None:
            n = len(self.log)
            assert call() is False
            assert len(self.log) == n
            return
        target, i = where
        result, out = self.run_mutation(target, i, 1, [new], call)
        if out is not None:
            assert result is True

    @rule(choice=st.integers(0, 1000))
    def remove(self, choice):
        mid = self.pick_id(choice)
        where = self.locate(mid)
        n = len(self.log)
        result = self.inbox.remove(mid)
        if where is None:
            assert result is False
            assert len(self.log) == n
            return
        target, i = where
        self.expect_splice(target, i, 1, [])
        assert result is True

    @precondition(lambda self: len(self.model[TURN]) + len(self.model[STEP]) < 30)
    @rule()
    def clear(self):
        expected = []
        for target in (STEP, TURN):
            if self.model[target]:
                expected += self.expect_splice(target, 0, len(self.model[target]), [])
        assert self.inbox.clear() == expected

    @rule(which=targets, turn=st.integers(0, 2**40))
    def claim(self, which, turn):
        target = which
        batch = []
        if self.model[STEP]:
            batch += self.expect_splice(STEP, 0, len(self.model[STEP]), [], canceled=False)
        if target == TURN and self.model[TURN]:
            batch += self.expect_splice(TURN, 0, 1, [], canceled=False)
        self.expected_calls += [("claimed", m, turn) for m in batch]
        assert self.inbox.claim(target, turn) == batch

    # ---------------------------------------------------------------------------------------
    # invariants

    @invariant()
    def lists_match_the_model(self):
        assert list(self.inbox.next_turn) == self.model[TURN]
        assert list(self.inbox.next_step) == self.model[STEP]
        assert len(self.inbox) == len(self.model[TURN]) + len(self.model[STEP])
        assert self.inbox.has_pending == bool(self.model[TURN] or self.model[STEP])
        pending = self.pending_ids()
        assert len(pending) == len(set(pending))
        for mid in pending:
            assert mid in self.inbox
        for mid in self.used_ids:
            if mid not in pending:
                assert mid not in self.inbox and self.inbox.get(mid) is None

    @invariant()
    def log_matches_the_model(self):
        assert [ev.data for ev in self.log.splices()] == self.expected_payloads
        for ev, expected in zip(self.log.splices(), self.expected_payloads, strict=True):
            assert list(ev.data) == list(expected), "payload key order"

    @invariant()
    def fold_of_the_log_matches(self):
        folded = InboxProjection.fold(self.log.splices())
        assert list(folded.next_turn) == self.model[TURN]
        assert list(folded.next_step) == self.model[STEP]

    @invariant()
    def replay_matches(self):
        # A log has at most one inbox: the live one gives way to its replay, which carries on.
        self.inbox.close()
        self.inbox = replayed = self.attach()
        assert list(replayed.next_turn) == self.model[TURN]
        assert list(replayed.next_step) == self.model[STEP]

    @invariant()
    def callbacks_match(self):
        assert self.calls == self.expected_calls


InboxMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    database=None,
)
TestInboxModel = InboxMachine.TestCase
