"""SIGKILL at the event boundaries of a turn that waits for decisions (issue 27's kill matrix),
over a real FileStore and a real PostgresStore, with ``kill_harness.py``.

The turn's step calls three tools: in ``approve``, ``pay`` needs approval and is approved
between ``search`` and ``note``, which need none (they run while ``pay`` waits); in
``edit-deny``, ``pay`` is approved with other arguments and ``wipe`` is denied. The owning process is killed right after event ``k``
is durable, the session is reopened in a new process, pending requests are decided there
(``loop``) or from a third process through the store (``store``; over PostgreSQL also while a
``kerman.Worker`` owns the session: ``worker``), and the session is taken to the end. Then an
independent reader of the log and the tools' side-effect file check: no tool ran before its
approval or twice, the decided call ran with the decided arguments (digest bound), the denied
one never ran, one ``tool/result`` per call, one resolution per request at most, every turn
ends once, the model is never asked again for a step; once a request is logged the turn is
never closed by the crash closers, and exactly the calls that had not started at the kill (and
are to run) run after recovery; and the crash closers' codes.

Deviation from SPEC.md (the open-turn closers, reference 2.10), as issue 27 item 4 requires: a
log that ends inside a turn whose step has gate requests (waiting, or decided and unfinished) is
not closed on open; the step is taken up from the log instead (docs/decisions.md, "Across
processes and crashes").

The default run kills at a sample of boundaries; ``KERMAN_SLOW=1`` (``make test-slow``) at every
boundary of both turns, on both stores, with every decider.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple

import pytest

from conftest import PG_DSN
from kill_harness import (
    Outcome,
    Place,
    ToolSpec,
    check_answers_per_input,
    check_invariants,
    error_code,
    kill_and_recover,
    proposed_calls,
    reference,
    results_by_call,
)

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")

SLOW = os.environ.get("KERMAN_SLOW") == "1"
SCENARIOS: Dict[str, Tuple[ToolSpec, ...]] = {
    "approve": (
        ToolSpec("search", '{"q": "rates"}'),
        ToolSpec("pay", '{"amount": 900}', needs_approval=True, decision="approve"),
        ToolSpec("note", '{"text": "paid"}'),
    ),
    "edit-deny": (
        ToolSpec("search", '{"q": "rates"}'),
        ToolSpec("pay", '{"amount": 900}', needs_approval=True, decision="edit", edit={"amount": 500}),
        ToolSpec("wipe", '{"all": true}', needs_approval=True, decision="deny"),
    ),
}
STORES = ["file", "postgres"]


def after(kind: str, nth: int = 0, name: str = "") -> Callable[[List[dict]], int]:
    """A kill point: the seq of the ``nth`` event of type ``kind`` (about tool ``name``)."""

    def find(events: List[dict]) -> int:
        seqs = [e["seq"] for e in events if e["type"] == kind and (not name or e["data"].get("name") == name)]
        return seqs[nth]

    return find


POINTS: Dict[str, Callable[[List[dict]], int]] = {
    "proposed": after("assistant/message"),  # the model's calls logged, none gated yet
    "first-request": after("decision/requested"),  # edit-deny: one of the step's two requests
    "waiting": after("decision/requested", -1),  # the step waits
    "resolved": after("decision/resolved"),
    "first-call": after("tool/call"),  # search logged, running while pay waits
    "pay-call": after("tool/call", name="pay"),  # the decided call logged, its body not started
    "wipe-call": after("tool/call", name="wipe"),  # edit-deny: the denied call's tool/call logged
    "pay-result": after("tool/result", 1),
    "turn-end": after("turn/end"),
}

# The default run: a representative sample (scenario, store, decider, point).
SAMPLE = [
    ("approve", "file", "loop", "waiting"),
    ("approve", "file", "store", "waiting"),
    ("approve", "file", "loop", "resolved"),
    ("approve", "file", "loop", "first-call"),
    ("approve", "postgres", "store", "first-call"),
    ("approve", "file", "loop", "pay-call"),
    ("approve", "postgres", "store", "waiting"),
    ("approve", "postgres", "loop", "pay-call"),
    ("edit-deny", "file", "store", "first-request"),
    ("edit-deny", "file", "loop", "waiting"),
    ("edit-deny", "postgres", "store", "waiting"),
    ("edit-deny", "file", "loop", "proposed"),
    ("edit-deny", "file", "loop", "wipe-call"),
    ("edit-deny", "postgres", "loop", "wipe-call"),
    ("approve", "postgres", "worker", "waiting"),
    ("edit-deny", "postgres", "worker", "first-request"),
]

_references: Dict[Tuple[str, str], List[dict]] = {}


def reference_events(scenario: str, store: str, tmp_path: Path) -> List[dict]:
    """The scenario's events without a kill (once per scenario and store)."""
    key = (scenario, store)
    if key not in _references:
        _references[key] = reference(new_place(store, tmp_path / "reference"), SCENARIOS[scenario])
    return _references[key]


def new_place(store: str, tmp_path: Path) -> Place:
    if store == "postgres" and not PG_DSN:
        pytest.skip("KERMAN_PG_DSN is unset (run scripts/pg-test-server.sh)")
    tmp_path.mkdir(parents=True, exist_ok=True)
    return Place.new(store, tmp_path)


def run_point(scenario: str, store: str, decider: str, k: int, tmp_path: Path) -> None:
    tools = SCENARIOS[scenario]
    place = new_place(store, tmp_path / f"k{k}")
    outcome = kill_and_recover(place, tools, k, decider)
    check_invariants(outcome, tools)
    if decider == "worker" and any(e["type"] == "user/message" for e in outcome.events):
        # A Worker answers crashed turns (resume="continue"): every entered input has exactly
        # one final answer, however the kill cut the turn (docs/durability.md).
        check_answers_per_input(outcome.events)
    if [e["data"]["reason"]["kind"] for e in outcome.events if e["type"] == "turn/end"][0] == "interrupted":
        check_closers(outcome, tools)
    ref = reference_events(scenario, store, tmp_path)
    after = {r["tool"] for r in outcome.ran_after_recovery()}
    # Killed once a request of the step is logged, the turn stays open (the crash closers never
    # close a step that waits for decisions, docs/decisions.md) and the step is taken up from
    # the log: exactly the calls that are to run (not denied) and had not started at the kill
    # run after recovery (a round the kill cut short is gated again for the calls it had not
    # asked about yet); a call that started and has no result follows its in-doubt policy
    # (here fail: its outcome is unknown) and never runs again. Killed between the model's
    # reply and its requests, the crash closers end the turn and nothing runs after recovery.
    started = {e["data"]["name"] for e in outcome.at_kill if e["type"] == "tool/call"}
    if k >= POINTS["first-request"](ref):
        expected = {t.name for t in tools if t.decision != "deny" and t.name not in started}
        assert after == expected, f"killed after event {k}: {sorted(after)} ran after recovery, expected {sorted(expected)}"
        # Until its step ends, the step that asked is taken up, not closed (a kill after its
        # step/end is an ordinary crash between steps).
        step_ended = any(e["type"] == "step/end" and e["seq"] > POINTS["first-request"](ref) for e in outcome.at_kill)
        first_end = [e["data"]["reason"]["kind"] for e in outcome.events if e["type"] == "turn/end"][0]
        assert step_ended or first_end == "completed", f"killed after event {k}: the waiting turn ended {first_end}"
    elif k >= POINTS["proposed"](ref):
        assert not after, f"killed after event {k}: {after} ran after the crash closed the turn"


def check_closers(outcome: Outcome, tools: Sequence[ToolSpec]) -> None:
    """A call whose result the crash closers wrote (after the kill, in a turn that ended
    interrupted) says what is known of it: denied by a person, it was denied (it never ran,
    whatever its tool/call says); with its tool/call logged, its outcome is unknown; without,
    it was not started."""
    decided = {t.name: t.decision for t in tools}
    logged = {e["data"]["callId"] for e in outcome.at_kill if e["type"] == "tool/call"}
    for (turn, call_id), results in results_by_call(outcome.events).items():
        [result] = results
        if result["seq"] <= outcome.k or turn != 1:
            continue
        name = next(name for t, c, name, _ in proposed_calls(outcome.events) if (t, c) == (turn, call_id))
        if decided[name] == "deny" and any(e["type"] == "decision/resolved" and e["data"]["callId"] == call_id for e in outcome.at_kill):
            expected = "TOOL_DENIED"
        elif call_id in logged:
            expected = "TOOL_OUTCOME_UNKNOWN"
        else:
            expected = "TOOL_NOT_STARTED"
        assert error_code(result) == expected, f"killed after event {outcome.k}: {name} closed with {error_code(result)}, not {expected}"


def test_the_reference_turn_is_the_same_on_both_stores(tmp_path: Path) -> None:
    for scenario in SCENARIOS:
        file_types = [e["type"] for e in reference_events(scenario, "file", tmp_path / scenario)]
        assert file_types.count("decision/requested") == sum(t.needs_approval for t in SCENARIOS[scenario])
        assert file_types[-1] == "turn/end"
        if PG_DSN:
            assert [e["type"] for e in reference_events(scenario, "postgres", tmp_path / scenario)] == file_types


@pytest.mark.parametrize("scenario,store,decider,point", SAMPLE, ids=["-".join(s) for s in SAMPLE])
@pytest.mark.timeout(300)
def test_killed_at_a_boundary_then_decided_and_resumed(scenario: str, store: str, decider: str, point: str, tmp_path: Path) -> None:
    k = POINTS[point](reference_events(scenario, store, tmp_path))
    run_point(scenario, store, decider, k, tmp_path)


@pytest.mark.timeout(300)
def test_a_worker_takes_up_a_step_whose_decisions_were_all_in_when_its_owner_died(tmp_path: Path) -> None:
    k = POINTS["resolved"](reference_events("approve", "postgres", tmp_path))
    run_point("approve", "postgres", "worker", k, tmp_path)


CHUNKS = 4


@pytest.mark.skipif(not SLOW, reason="every boundary: KERMAN_SLOW=1 (make test-slow)")
@pytest.mark.parametrize("chunk", range(CHUNKS))
@pytest.mark.parametrize("decider", ["loop", "store", "worker"])
@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.timeout(900)
def test_killed_at_every_boundary(scenario: str, store: str, decider: str, chunk: int, tmp_path: Path) -> None:
    if decider == "worker" and store != "postgres":
        pytest.skip("a Worker runs over PostgreSQL")
    ref = reference_events(scenario, store, tmp_path)
    for k in range(chunk, len(ref), CHUNKS):
        run_point(scenario, store, decider, k, tmp_path)
