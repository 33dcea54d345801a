"""SIGKILL at the event boundaries of a turn whose step calls one tool of each effect class and
in-doubt policy, and inside each tool's body, over a real FileStore and a real PostgresStore,
recovered by an ``AgentLoop`` or a ``kerman.Worker``; and a lease stolen by SIGSTOP. The checks
are ``effect_harness.py``'s, read from the log and the side-effect file without Kerman.

The default run takes a sample of kill points (under a minute); ``KERMAN_SLOW=1`` every event
boundary and every body, on both stores, with both recoverers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from effect_harness import (
    CHILD,
    TIMEOUT,
    TOOLS,
    check_executions,
    check_invariants,
    kill_and_recover,
    reference,
    runs_by_call,
)

from conftest import PG_DSN
from kill_harness import Place, check_one_result_per_call, check_turns_end_once, error_code, proposed_calls, read_log, results_by_call

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL, SIGSTOP")

SLOW = os.environ.get("KERMAN_SLOW") == "1"
STORES = ["file", "postgres"]
_REFERENCE: Dict[str, int] = {}


def place_for(store: str, tmp_path: Path) -> Place:
    if store == "postgres" and not PG_DSN:
        pytest.skip("KERMAN_PG_DSN is unset")
    return Place.new(store, tmp_path)


def events_in_turn(store: str, tmp_path: Path) -> int:
    """How many events the turn writes without a kill (learnt once per store)."""
    if store not in _REFERENCE:
        _REFERENCE[store] = len(reference(place_for(store, tmp_path / "reference")))
    return _REFERENCE[store]


def cases() -> List[Tuple[str, str, str]]:
    """(store, recoverer, kill): ``body:TOOL``, or ``event:K`` (K from the end when negative)."""
    if SLOW:
        out = [(s, r, f"body:{t.name}") for s in STORES for r in ("loop", "worker") for t in TOOLS if (s, r) != ("file", "worker")]
        return out + [(s, r, "every-event") for s in STORES for r in ("loop", "worker") if (s, r) != ("file", "worker")]
    return [
        ("file", "loop", "body:fetch"),  # read, retry
        ("file", "loop", "body:upsert"),  # idempotent, retry
        ("file", "loop", "body:send"),  # write, fail
        ("file", "loop", "body:pay"),  # write, reconcile
        ("file", "loop", "body:peek"),  # read, reconcile
        ("file", "loop", "event:3"),
        ("file", "loop", "event:-4"),
        ("postgres", "worker", "body:upsert"),
        ("postgres", "worker", "body:send"),
        ("postgres", "worker", "body:sync"),  # idempotent, reconcile
        ("postgres", "loop", "body:look"),  # read, fail
        ("postgres", "worker", "event:-6"),
    ]


@pytest.mark.parametrize("store,recoverer,kill", cases())
def test_kill_then_recover(tmp_path: Path, store: str, recoverer: str, kill: str) -> None:
    if kill.startswith("body:"):
        check_invariants(kill_and_recover(place_for(store, tmp_path), kill, recoverer))
        return
    n = events_in_turn(store, tmp_path)
    points = range(n) if kill == "every-event" else [int(kill.partition(":")[2]) % n]
    for k in points:
        place = place_for(store, tmp_path / f"k{k}")
        check_invariants(kill_and_recover(place, str(k), recoverer))


@pytest.mark.parametrize("stopped", ["upsert", "send"])
def test_a_lease_stolen_by_sigstop(tmp_path: Path, stopped: str) -> None:
    """The owner is stopped inside a tool's body until its lease lapses and a Worker has taken
    the session over and finished the turn; continued, it must not write into the session."""
    place = place_for("postgres", tmp_path)
    tools = place.spec(TOOLS)  # type: ignore[arg-type]
    with subprocess.Popen(
        [sys.executable, str(CHILD), "run", tools, f"stop:{stopped}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as owner:
        try:
            assert owner.stdout is not None
            assert owner.stdout.readline().strip() == "IN_BODY"
            os.kill(owner.pid, signal.SIGSTOP)
            worker = subprocess.run([sys.executable, str(CHILD), "work", tools], capture_output=True, text=True, timeout=TIMEOUT)
            assert worker.returncode == 0 and worker.stdout.splitlines()[-1:] == ["done"], worker.stderr[-4000:]
            after_takeover = read_log(place)
            os.kill(owner.pid, signal.SIGCONT)
            out, err = owner.communicate(timeout=TIMEOUT)
        finally:
            if owner.poll() is None:
                os.kill(owner.pid, signal.SIGCONT)
                owner.kill()
                owner.wait()
    assert out.strip() == "fenced", (out, err[-4000:])
    events = read_log(place)
    # The stopped owner, continued, wrote nothing: its appends were fenced out.
    assert events == after_takeover
    check_turns_end_once(events)
    check_one_result_per_call(events)
    from kill_harness import read_effects

    effects = read_effects(place)
    check_executions(events, effects)
    [(turn, call)] = [(t, c) for t, c, n, _ in proposed_calls(events) if n == stopped]
    runs = runs_by_call(effects)[(turn, call)]
    [result] = results_by_call(events)[(turn, call)]
    if stopped == "upsert":  # idempotent, retry: the new owner ran it again, with the same key
        assert len(runs) == 2 and runs[0]["key"] == runs[1]["key"] and runs[0]["pid"] != runs[1]["pid"]
        assert "error" not in result["data"]
    else:  # write, fail: it never ran again; its outcome is unknown
        assert len(runs) == 1
        assert error_code(result) == "TOOL_OUTCOME_UNKNOWN"
