"""SIGKILL at the event boundaries of a turn that waits for decisions (issue 27's kill matrix),
over a real FileStore and a real PostgresStore, with ``kill_harness.py``.

The turn's step calls three tools: in ``approve``, ``pay`` needs approval and is approved
between ``search`` and ``note``, which need none; in ``edit-deny``, ``pay`` is approved with
other arguments and ``wipe`` is denied. The owning process is killed right after event ``k``
is durable, the session is reopened in a new process, pending requests are decided there
(``loop``) or from a third process through the store (``store``), and the session is taken to
the end. Then an independent reader of the log and the tools' side-effect file check: no tool
ran before its approval or twice, the decided call ran with the decided arguments (digest
bound), the denied one never ran, one ``tool/result`` per call, one resolution per request at
most, every turn ends once, the model is never asked again for a step.

The default run kills at a sample of boundaries; ``KERMAN_SLOW=1`` (``make test-slow``) at every
boundary of both turns, on both stores, with both deciders.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import pytest

from conftest import PG_DSN
from kill_harness import Place, ToolSpec, check_invariants, executions, kill_and_recover, reference

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
    "pay-call": after("tool/call", name="pay"),  # the decided call logged, its body not started
    "pay-result": after("tool/result", 1),
    "turn-end": after("turn/end"),
}

# The default run: a representative sample (scenario, store, decider, point).
SAMPLE = [
    ("approve", "file", "loop", "waiting"),
    ("approve", "file", "store", "waiting"),
    ("approve", "file", "loop", "resolved"),
    ("approve", "file", "loop", "pay-call"),
    ("approve", "postgres", "store", "waiting"),
    ("approve", "postgres", "loop", "pay-call"),
    ("edit-deny", "file", "store", "first-request"),
    ("edit-deny", "file", "loop", "waiting"),
    ("edit-deny", "postgres", "store", "waiting"),
    ("edit-deny", "file", "loop", "proposed"),
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
    ref = reference_events(scenario, store, tmp_path)
    ran = {r["tool"] for r in executions(outcome.effects)}
    # Killed at or after the step's last request and before pay's tool/call, the decided call
    # must run exactly once after recovery; killed after its tool/call (its body not started)
    # its result is the crash closer's and it never runs.
    waiting = POINTS["waiting"](ref)
    pay_call = POINTS["pay-call"](ref)
    if waiting <= k < pay_call:
        assert "pay" in ran, f"killed after event {k}: pay was decided but never ran"
    if k < POINTS["proposed"](ref):
        assert not ran, f"killed after event {k}, before any proposal: {ran} ran"


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


CHUNKS = 4


@pytest.mark.skipif(not SLOW, reason="every boundary: KERMAN_SLOW=1 (make test-slow)")
@pytest.mark.parametrize("chunk", range(CHUNKS))
@pytest.mark.parametrize("decider", ["loop", "store"])
@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.timeout(900)
def test_killed_at_every_boundary(scenario: str, store: str, decider: str, chunk: int, tmp_path: Path) -> None:
    ref = reference_events(scenario, store, tmp_path)
    for k in range(chunk, len(ref), CHUNKS):
        run_point(scenario, store, decider, k, tmp_path)
