"""The kill matrix: a turn whose first step calls N tools with given properties runs in a child
process (``kill_child.py``) over a real ``FileStore`` or ``PostgresStore`` and is SIGKILLed right
after event ``k`` is durable; the session is then reopened in a new process, its pending
decisions are made (there, or from a third process through the store), and it is taken to the
end. The checks read the log independently of Kerman: the session file line by line (CRC-32C,
JSON, seq order, as docs/format.md writes it) or the ``kerman_events`` table through ``psql``,
and count executions through the tools' own side-effect file.

Use: describe the tools (:class:`ToolSpec`), take a :class:`Place` (where the session lives),
run :func:`reference` once to learn the turn's events without a kill, then
:func:`kill_and_recover` for each kill point, and check what it returns with
:func:`check_invariants` (or the single checks it is made of).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import signal
import subprocess
import sys
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from conftest import crc32c, fresh_schema_dsn, session_path

CHILD = Path(__file__).with_name("kill_child.py")
TIMEOUT = 90  # seconds for one child process


@dataclass(frozen=True)
class ToolSpec:
    """One tool of the step: the model calls it once, with ``arguments`` (the exact text).
    ``decision`` is what a person decides for a tool that needs approval (``approve``,
    ``edit`` with ``edit`` as the new arguments, or ``deny``); ``options`` are further keywords
    of ``loop.tool(...)``."""

    name: str
    arguments: str = '{"n": 1}'
    needs_approval: bool = False
    decision: Optional[str] = None
    edit: Optional[Dict[str, Any]] = None
    options: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.needs_approval and self.decision not in ("approve", "edit", "deny"):
            raise ValueError(f"tool {self.name!r} needs approval: decision must be approve, edit or deny, got {self.decision!r}")
        if (self.decision == "edit") != (self.edit is not None):
            raise ValueError(f"tool {self.name!r}: edit arguments go with decision='edit' only")


@dataclass
class Place:
    """Where a session lives: a file store's root or a PostgreSQL schema, the session id, and
    the tools' side-effect file."""

    store: str  # "file" or "postgres"
    session: str
    effects: Path
    root: Optional[Path] = None
    dsn: Optional[str] = None
    durability: str = "checkpoint"

    @classmethod
    def new(cls, store: str, tmp_path: Path, durability: str = "checkpoint", dsn: Optional[str] = None) -> Place:
        """A fresh session (and, for PostgreSQL, a fresh schema unless ``dsn`` names one)."""
        session = f"kill-{uuid.uuid4().hex[:12]}"
        # The tools' side-effect file lives here whatever the store (a PostgreSQL session makes
        # no folder of its own, and a child killed before any tool ran creates none either).
        tmp_path.mkdir(parents=True, exist_ok=True)
        effects = tmp_path / f"{session}.effects.jsonl"
        if store == "file":
            return cls(store, session, effects, root=tmp_path / "sessions", durability=durability)
        if store == "postgres":
            return cls(store, session, effects, dsn=dsn or fresh_schema_dsn())
        raise ValueError(f"store must be 'file' or 'postgres', got {store!r}")

    def spec(self, tools: Sequence[ToolSpec]) -> str:
        return json.dumps(
            {
                "store": self.store,
                "session": self.session,
                "effects": str(self.effects),
                "root": str(self.root) if self.root else None,
                "dsn": self.dsn,
                "durability": self.durability,
                "tools": [dataclasses.asdict(t) for t in tools],
            }
        )


# ---------------------------------------------------------------------------------------------
# The independent readers


def read_log(place: Place) -> List[Dict[str, Any]]:
    """The session's events as records (dicts), read without Kerman: every line's CRC-32C and
    JSON checked, seqs consecutive from 0."""
    if place.store == "file":
        assert place.root is not None
        raw = session_path(place.root, place.session).read_bytes()
        lines = raw.split(b"\n")
        assert lines[-1] == b"", "the file ends inside a record"
        records = []
        for n, line in enumerate(lines[:-1], start=1):
            crc, _, text = line.partition(b" ")
            assert len(crc) == 8 and int(crc, 16) == crc32c(text), f"line {n}: checksum mismatch"
            records.append(json.loads(text))
        header, events = records[0], records[1:]
        assert header["type"] == "session" and header["id"] == place.session, header
    else:
        assert place.dsn is not None
        sql = f"SELECT record FROM kerman_events WHERE session_id = '{place.session}' ORDER BY seq"
        out = subprocess.run(["psql", place.dsn, "-XAtq", "-c", sql], check=True, capture_output=True, text=True, timeout=30)
        events = [json.loads(line) for line in out.stdout.splitlines() if line]
    assert [e["seq"] for e in events] == list(range(len(events))), "seqs are not 0, 1, 2, ..."
    return events


def read_effects(place: Place) -> List[Dict[str, Any]]:
    """Every line the tools and the model appended to the side-effect file."""
    if not place.effects.exists():
        return []
    return [json.loads(line) for line in place.effects.read_text().splitlines()]


def executions(effects: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [e for e in effects if "tool" in e]


def digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def pending_requests(events: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The ``decision/requested`` data with no ``decision/resolved`` after it."""
    resolved = {e["data"]["decisionId"] for e in events if e["type"] == "decision/resolved"}
    return [e["data"] for e in events if e["type"] == "decision/requested" and e["data"]["decisionId"] not in resolved]


# ---------------------------------------------------------------------------------------------
# The processes


def child(place: Place, tools: Sequence[ToolSpec], mode: str, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, str(CHILD), mode, place.spec(tools), *args], capture_output=True, text=True, timeout=TIMEOUT)
    return done


def reference(place: Place, tools: Sequence[ToolSpec]) -> List[Dict[str, Any]]:
    """The turn run to its end without a kill, decided in its own process: its events."""
    done = child(place, tools, "run", "-1")
    assert done.returncode == 0 and done.stdout.splitlines()[-1:] == ["done"], done.stderr[-4000:]
    return read_log(place)


def kill_at(place: Place, tools: Sequence[ToolSpec], k: int) -> List[Dict[str, Any]]:
    """Runs the turn and SIGKILLs its process right after event ``k`` is durable; returns the
    events the dead process left (exactly ``k + 1``)."""
    done = child(place, tools, "run", str(k))
    assert done.returncode == -signal.SIGKILL, f"expected a SIGKILL after event {k}, got {done.returncode}: {done.stderr[-4000:]}"
    events = read_log(place)
    assert len(events) == k + 1, f"killed after event {k}, but the log holds {len(events)} events"
    return events


ROUNDS = 5  # request rounds one recovery may meet (a kill can cut a step's round of requests short)


def recover(place: Place, tools: Sequence[ToolSpec], decider: str) -> List[Dict[str, Any]]:
    """Reopens the session in a new process and takes it to the end; pending requests are
    decided by that process (``decider="loop"``) or by a third one through the store
    (``"store"``: ``FileStore.decide`` while nobody holds the session, the owner reopening it
    after each round; ``PostgresStore.decide`` while the owner waits), or, over PostgreSQL, by
    a third process while a ``kerman.Worker`` owns the session (``"worker"``). Returns the
    answers of the deciding process (store and worker only)."""
    answers: List[Dict[str, Any]] = []
    if decider == "loop":
        done = child(place, tools, "resume", "decide")
        assert done.returncode == 0 and done.stdout.splitlines()[-1:] == ["done"], done.stderr[-4000:]
        return answers
    assert decider in ("store", "worker"), decider
    if place.store == "file":
        assert decider == "store", "a Worker needs the PostgreSQL store"
        for _ in range(ROUNDS):
            for request in pending_requests(read_log(place)):
                answers.append(decide_elsewhere(place, tools, request))
            done = child(place, tools, "resume", "wake")
            assert done.returncode == 0, done.stderr[-4000:]
            if done.stdout.splitlines()[-1:] == ["done"] and not done.stdout.startswith("waiting"):
                return answers
        raise AssertionError(f"still waiting after {ROUNDS} rounds of decisions")
    # PostgreSQL: the owner (a loop, or a Worker) opens the session and waits; a third process
    # decides through the store.
    args = ["work"] if decider == "worker" else ["resume", place.spec(tools), "wait"]
    if decider == "worker":
        args.append(place.spec(tools))
    with subprocess.Popen([sys.executable, str(CHILD), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as owner:
        try:
            assert owner.stdout is not None and owner.stderr is not None
            for _ in range(ROUNDS):
                said = owner.stdout.readline().split()
                if said[:1] != ["waiting"]:
                    break
                by_id = {r["decisionId"]: r for r in pending_requests(read_log(place))}
                assert sorted(said[1:]) == sorted(by_id), (said, by_id)
                for decision_id in said[1:]:
                    answers.append(decide_elsewhere(place, tools, by_id[decision_id]))
            assert said == ["done"], (said, owner.stderr.read()[-4000:])
            assert owner.wait(timeout=TIMEOUT) == 0, owner.stderr.read()[-4000:]
        finally:
            if owner.poll() is None:
                owner.kill()
                owner.wait()
    return answers


def decide_elsewhere(place: Place, tools: Sequence[ToolSpec], request: Dict[str, Any]) -> Dict[str, Any]:
    done = child(place, tools, "decide", request["decisionId"], request["name"])
    assert done.returncode == 0, done.stderr[-4000:]
    answer = json.loads(done.stdout)
    assert answer.get("applied") is True and answer.get("duplicate") is False, answer
    return answer


@dataclass
class Outcome:
    """What one kill point left: the events at the kill and at the end, the side effects (the
    first ``effects_at_kill`` of them by the killed process), the store's answers."""

    k: int
    at_kill: List[Dict[str, Any]]
    events: List[Dict[str, Any]]
    effects: List[Dict[str, Any]]
    effects_at_kill: int
    answers: List[Dict[str, Any]]

    def ran_after_recovery(self) -> List[Dict[str, Any]]:
        """The tool executions of the processes that recovered the session."""
        return executions(self.effects[self.effects_at_kill :])


def kill_and_recover(place: Place, tools: Sequence[ToolSpec], k: int, decider: str) -> Outcome:
    at_kill = kill_at(place, tools, k)
    effects_at_kill = len(read_effects(place))
    answers = recover(place, tools, decider)
    return Outcome(k, at_kill, read_log(place), read_effects(place), effects_at_kill, answers)


# ---------------------------------------------------------------------------------------------
# The invariants, read from the log and the side-effect file


def check_turns_end_once(events: Sequence[Dict[str, Any]]) -> None:
    """Every turn that starts ends exactly once, and none is left open."""
    starts = Counter(e["data"]["turn"] for e in events if e["type"] == "turn/start")
    ends = Counter(e["data"]["turn"] for e in events if e["type"] == "turn/end")
    assert starts and all(n == 1 for n in starts.values()), f"turn/start per turn: {dict(starts)}"
    assert ends == starts, f"turn/end per turn {dict(ends)}, turn/start per turn {dict(starts)}"


def proposed_calls(events: Sequence[Dict[str, Any]]) -> List[Tuple[int, str, str, str]]:
    """(turn, call id, tool, arguments) of every tool call the model proposed, as logged."""
    out = []
    turn = None
    for e in events:
        if e["type"] == "turn/start":
            turn = e["data"]["turn"]
        elif e["type"] == "assistant/message":
            for block in e["data"]["message"]["content"]:
                if block.get("type") == "tool-call":
                    out.append((turn, block["id"], block["name"], block["arguments"]))
    return out


def results_by_call(events: Sequence[Dict[str, Any]]) -> Dict[Tuple[int, str], List[Dict[str, Any]]]:
    out: Dict[Tuple[int, str], List[Dict[str, Any]]] = {}
    turn = None
    for e in events:
        if e["type"] == "turn/start":
            turn = e["data"]["turn"]
        elif e["type"] == "tool/result":
            out.setdefault((turn, result_call_id(e)), []).append(e)
    return out


def result_call_id(result: Dict[str, Any]) -> str:
    """The call a ``tool/result`` answers: its message's source (``{"kind": "tool", "callId"}``)."""
    message = result["data"]["message"]
    [block] = [b for b in message["content"] if b.get("type") == "tool-result"]
    assert message["source"]["callId"] == block["toolCallId"], result
    return str(block["toolCallId"])


def check_one_result_per_call(events: Sequence[Dict[str, Any]]) -> None:
    """Every proposed call has exactly one ``tool/result``, and no result is for another call."""
    results = results_by_call(events)
    proposed = {(t, c) for t, c, _, _ in proposed_calls(events)}
    for key in proposed:
        assert len(results.get(key, [])) == 1, f"call {key}: {len(results.get(key, []))} tool/result events"
    assert set(results) <= proposed, f"results for calls nobody proposed: {set(results) - proposed}"


def check_resolved_at_most_once(events: Sequence[Dict[str, Any]]) -> None:
    requested = Counter(e["data"]["decisionId"] for e in events if e["type"] == "decision/requested")
    resolved = Counter(e["data"]["decisionId"] for e in events if e["type"] == "decision/resolved")
    assert all(n == 1 for n in requested.values()), f"a request logged twice: {dict(requested)}"
    assert all(n == 1 for n in resolved.values()), f"a request resolved twice: {dict(resolved)}"
    assert set(resolved) <= set(requested), f"resolutions of no request: {set(resolved) - set(requested)}"


def is_error_result(result: Dict[str, Any]) -> bool:
    data = result["data"]
    return bool(data.get("error")) or any(b.get("isError") for b in data["message"]["content"])


def error_code(result: Dict[str, Any]) -> Optional[str]:
    error = result["data"].get("error")
    return error.get("code") if isinstance(error, dict) else None


def check_executions(events: Sequence[Dict[str, Any]], effects: Sequence[Dict[str, Any]], tools: Sequence[ToolSpec]) -> None:
    """No call ran twice; a gated call ran only after an approving resolution was in the log,
    with exactly the arguments decided (the digest of what ``tool/call`` logged is the
    resolution's digest); a denied call never ran; a call whose result is a success ran exactly
    once, and every ungated call with a ``tool/call`` ran at most once."""
    spec = {t.name: t for t in tools}
    runs = executions(effects)
    per_call = Counter((r["turn"], r["call"]) for r in runs)
    assert all(n == 1 for n in per_call.values()), f"a call ran more than once: {dict(per_call)}"
    requested = {e["data"]["callId"]: e for e in events if e["type"] == "decision/requested"}
    resolved = {e["data"]["decisionId"]: e for e in events if e["type"] == "decision/resolved"}
    tool_calls = {e["data"]["callId"]: e for e in events if e["type"] == "tool/call"}
    for run in runs:
        t = spec[run["tool"]]
        call = tool_calls.get(run["call"])
        assert call is not None and call["seq"] < run["seen"], f"{run}: ran without its tool/call in the log before it"
        assert json.loads(call["data"]["arguments"]) == run["args"], f"{run}: ran with other arguments than tool/call logged"
        if not t.needs_approval:
            continue
        req = requested.get(run["call"])
        assert req is not None, f"{run}: a call that needs approval ran without a request"
        res = resolved.get(req["data"]["decisionId"])
        assert res is not None and res["seq"] < run["seen"], f"{run}: ran before its decision was in the log"
        assert res["data"]["outcome"] in ("approved", "edited"), f"{run}: ran although {res['data']['outcome']}"
        assert t.decision != "deny", f"{run}: a call the person denies ran"
        decided = t.edit if t.decision == "edit" else json.loads(t.arguments)
        assert run["args"] == decided, f"{run}: ran with {run['args']}, decided {decided}"
        assert res["data"]["digest"] == digest(call["data"]["arguments"]), f"{run}: the digest decided is not the one that ran"
    results = results_by_call(events)
    for turn, call_id, name, _ in proposed_calls(events):
        ok = [r for r in results.get((turn, call_id), []) if not is_error_result(r)]
        if ok:
            n = per_call[(turn, call_id)]
            assert n == 1, f"call {call_id} of turn {turn} has a success result but ran {n}×"
        if spec[name].decision == "deny":
            assert per_call[(turn, call_id)] == 0, f"denied call {call_id} ran"


def check_model_asked_once_per_step(effects: Sequence[Dict[str, Any]]) -> None:
    """The model is asked at most once per (turn, step): resume never asks it again."""
    asked = Counter((e["turn"], e["step"]) for e in effects if e.get("model"))
    assert all(n == 1 for n in asked.values()), f"model requests per (turn, step): {dict(asked)}"


def check_invariants(outcome: Outcome, tools: Sequence[ToolSpec]) -> None:
    events = outcome.events
    assert events[: len(outcome.at_kill)] == outcome.at_kill, "recovery changed what the killed process had written"
    check_turns_end_once(events)
    check_one_result_per_call(events)
    check_resolved_at_most_once(events)
    check_executions(events, outcome.effects, tools)
    check_model_asked_once_per_step(outcome.effects)
    assert not pending_requests(events), f"requests left pending: {pending_requests(events)}"


def is_final_answer(event: Dict[str, Any]) -> bool:
    """An ``assistant/message`` that answers: not cut short, asking for no tool; or a
    ``tool/result`` that concluded its turn (``concludesTurn``)."""
    if event["type"] == "tool/result":
        return event["data"].get("concludesTurn") is True
    if event["type"] != "assistant/message" or event["data"].get("interrupted"):
        return False
    return not any(b.get("type") == "tool-call" for b in event["data"]["message"]["content"])


def answers_per_input(events: Sequence[Dict[str, Any]]) -> Dict[str, int]:
    """How many final answers each entered input (``user/message``, by id) got, read from the
    records alone: a final answer answers the input entered since the previous one, and only
    in the turn that entered it or a continuation of that turn (``turn/start`` ``continues``,
    followed back through continuations of continuations). A final answer with no input to
    answer counts as a second answer for the input its turn (or the turn it continues) entered."""
    continues: Dict[int, int] = {}
    entered_in: Dict[str, int] = {}
    counts: Dict[str, int] = {}
    waiting: List[str] = []
    last_answered: Dict[int, List[str]] = {}
    turn = 0

    def root(t: int) -> int:
        while t in continues:
            t = continues[t]
        return t

    for e in events:
        if e["type"] == "turn/start":
            turn = e["data"]["turn"]
            if "continues" in e["data"]:
                continues[turn] = e["data"]["continues"]
        elif e["type"] == "user/message":
            entered_in[e["data"]["id"]] = turn
            counts[e["data"]["id"]] = 0
            waiting.append(e["data"]["id"])
        elif is_final_answer(e):
            mine = [m for m in waiting if root(entered_in[m]) == root(turn)]
            if not mine:
                mine = last_answered.get(root(turn), [])
            for m in mine:
                counts[m] += 1
            last_answered[root(turn)] = mine
            waiting = [m for m in waiting if m not in mine]
    return counts


def check_answers_per_input(events: Sequence[Dict[str, Any]]) -> None:
    """Every entered input has exactly one final answer."""
    counts = answers_per_input(events)
    assert counts and all(n == 1 for n in counts.values()), f"final answers per entered input: {counts}"
