"""The effect-class kill matrix (issue 28): one turn whose step calls one tool of each effect
class and in-doubt policy runs in a child process (``effect_child.py``) over a real
``FileStore`` or ``PostgresStore`` and is SIGKILLed right after event ``k`` is durable, or inside
a tool's body (the call is then in doubt); an ``AgentLoop`` or a ``kerman.Worker`` in a new
process takes the session to the end. The checks read the log without Kerman
(``kill_harness.read_log``: CRC-checked file lines, or ``kerman_events`` through psql) and count
executions through the tools' side-effect file.

The checks: no ``write`` tool ran twice; a tool whose policy is not ``retry`` ran at most once;
every execution of one call had the same idempotency key, and different calls different keys;
a ``retry`` tool killed inside its body ran again with the same key and got its success; a
``fail`` tool killed so got ``TOOL_OUTCOME_UNKNOWN``; a ``reconcile`` tool killed so got what
its reconcile function found (nothing ran again); every call has exactly one ``tool/result``;
every turn ends once.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

from kill_harness import (
    Place,
    check_one_result_per_call,
    check_turns_end_once,
    error_code,
    is_error_result,
    proposed_calls,
    read_effects,
    read_log,
    results_by_call,
)

CHILD = Path(__file__).parent.parent / "effect_child.py"
TIMEOUT = 90  # seconds for one child process

# The "every entered input gets exactly one final answer" check: the recovering loop resumes
# with `resume="continue"` (a Worker does so by default), so a turn the kill interrupted is
# continued and its input answered (docs/durability.md#crashed-turns-are-answered).
CHECK_INPUTS_ANSWERED = True


@dataclass(frozen=True)
class EffectTool:
    """One tool of the step: its effect class and what becomes of a call of it in doubt
    (``fail``, ``retry``, or ``reconcile``: a function looking for the call's key in the
    side-effect file)."""

    name: str
    effect: str
    policy: str


#: One tool of each effect class and policy (``retry`` is refused for a ``write``).
TOOLS: Tuple[EffectTool, ...] = (
    EffectTool("look", "read", "fail"),
    EffectTool("fetch", "read", "retry"),
    EffectTool("peek", "read", "reconcile"),
    EffectTool("put", "idempotent", "fail"),
    EffectTool("upsert", "idempotent", "retry"),
    EffectTool("sync", "idempotent", "reconcile"),
    EffectTool("send", "write", "fail"),
    EffectTool("pay", "write", "reconcile"),
)


def child(place: Place, mode: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(CHILD), mode, place.spec(TOOLS), *args],  # type: ignore[arg-type]
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def reference(place: Place) -> List[Dict[str, Any]]:
    """The turn run to its end without a kill: its events."""
    done = child(place, "run", "-1")
    assert done.returncode == 0 and done.stdout.splitlines()[-1:] == ["done"], done.stderr[-4000:]
    return read_log(place)


@dataclass
class Outcome:
    kill: str
    at_kill: List[Dict[str, Any]]
    events: List[Dict[str, Any]]
    effects: List[Dict[str, Any]]
    effects_at_kill: int


def recover(place: Place, recoverer: str) -> None:
    """An ``AgentLoop`` (``loop``) or a ``kerman.Worker`` (``worker``, PostgreSQL) in a new
    process takes the session to the end."""
    mode = {"loop": "resume", "worker": "work"}[recoverer]
    done = child(place, mode)
    assert done.returncode == 0 and done.stdout.splitlines()[-1:] == ["done"], done.stderr[-4000:]


def kill_and_recover(place: Place, kill: str, recoverer: str) -> Outcome:
    """``kill``: an event seq (SIGKILL once it is durable) or ``body:TOOL``."""
    done = child(place, "run", kill)
    assert done.returncode == -signal.SIGKILL, f"expected a SIGKILL at {kill}, got {done.returncode}: {done.stderr[-4000:]}"
    at_kill = read_log(place)
    if not kill.startswith("body:"):
        assert len(at_kill) == int(kill) + 1, f"killed after event {kill}, but the log holds {len(at_kill)} events"
    effects_at_kill = len(read_effects(place))
    recover(place, recoverer)
    return Outcome(kill, at_kill, read_log(place), read_effects(place), effects_at_kill)


def runs_by_call(effects: Sequence[Dict[str, Any]]) -> Dict[Tuple[int, str], List[Dict[str, Any]]]:
    out: Dict[Tuple[int, str], List[Dict[str, Any]]] = {}
    for e in effects:
        if "tool" in e:
            out.setdefault((e["turn"], e["call"]), []).append(e)
    return out


def result_text(result: Dict[str, Any]) -> str:
    blocks = [b for b in result["data"]["message"]["content"] if b.get("type") == "tool-result"]
    return "".join(part.get("text", "") for b in blocks for part in b.get("content", []))


def check_executions(events: Sequence[Dict[str, Any]], effects: Sequence[Dict[str, Any]]) -> None:
    """No write ran twice, only a retry ran again and with the same key, keys differ between
    calls, and every success result is backed by an execution of its call."""
    spec = {t.name: t for t in TOOLS}
    runs = runs_by_call(effects)
    for (turn, call), rs in runs.items():
        tool = spec[rs[0]["tool"]]
        keys = {r["key"] for r in rs}
        assert len(keys) == 1, f"call {call} of turn {turn} ({tool.name}) ran with keys {keys}"
        if tool.effect == "write":
            assert len(rs) == 1, f"write tool {tool.name} (call {call}) ran {len(rs)}×"
        if tool.policy != "retry":
            assert len(rs) == 1, f"{tool.name} (on_in_doubt={tool.policy}, call {call}) ran {len(rs)}×"
    keys = Counter(rs[0]["key"] for rs in runs.values())
    assert all(n == 1 for n in keys.values()), f"two calls shared an idempotency key: {keys}"
    results = results_by_call(events)
    for turn, call, name, _ in proposed_calls(events):
        [result] = results[(turn, call)]
        if not is_error_result(result):
            text = result_text(result)
            assert text in (f"{name} ran", f"reconciled {name}"), f"call {call}: unexpected result {text!r}"
            assert runs.get((turn, call)), f"call {call} ({name}) has a success result but never ran"
            if text.startswith("reconciled"):
                assert spec[name].policy == "reconcile", f"call {call} ({name}) was reconciled under {spec[name].policy}"


def check_in_body_kill(outcome: Outcome) -> None:
    """The call whose body was killed: its policy decided its one result."""
    name = outcome.kill.partition(":")[2]
    tool = {t.name: t for t in TOOLS}[name]
    [(turn, call)] = [(t, c) for t, c, n, _ in proposed_calls(outcome.events) if n == name]
    runs = runs_by_call(outcome.effects)[(turn, call)]
    [result] = results_by_call(outcome.events)[(turn, call)]
    if tool.policy == "retry":
        assert len(runs) == 2 and runs[0]["key"] == runs[1]["key"], f"{name}: retried runs {runs}"
        assert not is_error_result(result) and result_text(result) == f"{name} ran", result
    elif tool.policy == "reconcile":
        assert len(runs) == 1, runs
        assert not is_error_result(result) and result_text(result) == f"reconciled {name}", result
    else:
        assert len(runs) == 1, runs
        assert error_code(result) == "TOOL_OUTCOME_UNKNOWN", result


def check_inputs_answered(events: Sequence[Dict[str, Any]]) -> None:
    """Every entered user message has exactly one final answer (an assistant message with no
    tool call after it and before the next user message), and the last turn ended once that
    answer was logged (:data:`CHECK_INPUTS_ANSWERED`)."""
    answers: List[int] = []
    for e in events:
        if e["type"] == "user/message":
            answers.append(0)
        elif e["type"] == "assistant/message" and answers:
            if not any(b.get("type") == "tool-call" for b in e["data"]["message"]["content"]):
                answers[-1] += 1
    assert answers and all(n == 1 for n in answers), f"final answers per input: {answers}"
    # The last turn completed, or a kill after its final answer was logged left it to the
    # closers (`interrupted`), with nothing to continue: the answer is there.
    ends = [e for e in events if e["type"] == "turn/end"]
    last = ends[-1]["data"]["reason"]["kind"]
    if last != "completed":
        start = max(e["seq"] for e in events if e["type"] == "turn/start")
        answered_in_it = any(
            e["seq"] > start
            and e["type"] == "assistant/message"
            and not any(b.get("type") == "tool-call" for b in e["data"]["message"]["content"])
            for e in events
        )
        assert last == "interrupted" and answered_in_it, ends[-1]


def check_invariants(outcome: Outcome) -> None:
    events = outcome.events
    assert events[: len(outcome.at_kill)] == outcome.at_kill, "recovery changed what the killed process had written"
    check_turns_end_once(events)
    check_one_result_per_call(events)
    check_executions(events, outcome.effects)
    if outcome.kill.startswith("body:"):
        check_in_body_kill(outcome)
    if CHECK_INPUTS_ANSWERED:
        check_inputs_answered(events)
