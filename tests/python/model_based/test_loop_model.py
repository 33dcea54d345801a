"""Model-based test: the AgentLoop under random interleavings of input, edits, cancels and resumes.

Each example draws a list of operations (followup, steer, inject, inbox.remove/replace of a
pending message, cancel(), cancel(keep_inbox=True), wake(), requeue_claimed(), a scheduling
point, ``await loop.when_idle()`` and "resume": aclose the loop, reopen the session from a
MemoryStore or a FileStore and build a new AgentLoop over it) and runs the whole list inside
one ``asyncio.run``. The model, the tool and the pre_step listener draw their behaviour from
the same Hypothesis data: the model replies with text or calls a registered (or unknown) tool;
the pre_step listener passes through, rejects, or enters a subset/reordering of the batch (or
nothing); and model, tool and listener may run the same operations from inside a running turn.

The "scheduling point" operation is ``await asyncio.sleep(0)`` a random number of times: it is
a random interleaving point, not a synchronisation; every wait for a result is an await on the
loop (``when_idle``, ``aclose``).

Invariants (SPEC 2.3, 2.5, D7, D9, 4.3, 4.4), checked against the log after every resume and at
the end of every example (after ``when_idle``):

* seqs are contiguous; turn/step boundaries are balanced and numbered (every turn/start has
  exactly one turn/end, steps nested in turns, no step content outside a step, no claim outside
  a turn);
* every inserted message instance ends exactly once: still pending, discarded (a canceled
  splice removed it) or claimed (a pure-deletion splice removed it); the live
  inserted/discarded/claimed events agree with the log;
* a step's ``user/message``s are exactly what the pre_step decision entered, each one claimed at
  that step's boundary, each claim used at most once;
* ``InboxProjection.fold(log.splices())`` equals ``loop.inbox``; pending ids are unique; a resume
  keeps pending input (D7) unless ``discard_pending``; ``loop.turn`` is the last turn/start;
* the status is ``"idle"`` after ``when_idle``, and idle with next-turn input pending only after
  a turn that stops the driver (blocked, aborted, no step entered) or a non-waking insertion
  (requeue, resume) — reference 10.7;
* a waking call on an idle loop has committed ``turn/start`` and is ``running`` when it returns
  (4.3); ``wake()`` with nothing pending is ``False``; ``cancel()`` empties the inbox at once and
  ``cancel(keep_inbox=True)`` leaves it unchanged;
* ``requeue_claimed(turn)`` on a finished turn returns exactly the claims not seen again (step
  list first, then turn list, claim order), puts them back at the heads, never duplicates a
  pending id, and a second call raises ``LoopError``.
"""

from __future__ import annotations

import asyncio
import tempfile
import warnings
from collections import Counter
from typing import Dict, List, Optional, Tuple

from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import kerman
from kerman import (
    AgentLoop,
    DuplicateMessageError,
    Enter,
    FileStore,
    InboxProjection,
    LoopError,
    MemoryStore,
    ModelReply,
    Reject,
    UserMessage,
)

# See test_inbox_model.py: keep a Hypothesis failure report from tripping "warnings are errors".
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    try:
        import hypothesis.extra._patching  # noqa: F401
    except Exception:  # pragma: no cover - optional dependencies missing
        pass

TURN = "next-turn"
STEP = "next-step"

# operations the test body may run; the in-turn subset leaves out the ones that await the loop
TOP_OPS = [
    "followup",
    "followup",
    "followup",
    "steer",
    "steer",
    "inject",
    "remove",
    "replace",
    "cancel",
    "cancel_keep",
    "wake",
    "tick",
    "tick",
    "idle",
    "resume",
    "requeue",
]
IN_TURN_OPS = ["followup", "steer", "inject", "remove", "replace", "cancel", "cancel_keep", "wake", "requeue"]
DECISIONS = st.sampled_from(["pass", "pass", "pass", "reject", "enter", "enter", "enter_empty"])
IN_TURN_BUDGET = 10  # operations run from inside model/tool/listener per example
TOOL_CALL_BUDGET = 6  # tool-call replies per example (each one costs another request)


class Run:
    """One example: the loop, its session, and what the test observed."""

    def __init__(self, data: st.DataObject, root: Optional[str]) -> None:
        self.data = data
        self.store = FileStore(root, durability="none") if root else MemoryStore()
        self.log = self.store.create()
        self.log_id = self.log.id
        self.counter = 0
        self.used_ids: List[str] = []
        self.in_turn_budget = IN_TURN_BUDGET
        self.tool_budget = TOOL_CALL_BUDGET
        self.call_counter = 0
        self.live: Dict[str, Counter] = {"inserted": Counter(), "discarded": Counter(), "claimed": Counter()}
        # (loop generation, turn, step) -> ids the pre_step listener entered
        self.decisions: Dict[Tuple[int, int, int], List[str]] = {}
        self.generation = 0
        self.resume_points: List[int] = []  # log lengths at which each new loop instance took over
        # log lengths at which input became pending without a wake (requeue, resume)
        self.unwoken_at: List[int] = []
        self.trace: List[str] = []
        self.loop = self.make_loop()

    # ------------------------------------------------------------------------------------
    # the loop and its plug-ins

    def make_loop(self) -> AgentLoop:
        self.generation += 1
        gen = self.generation
        loop = AgentLoop(self.model, self.log)

        @loop.tool
        async def t(args, ctx):
            """A tool that may act on the loop while it runs."""
            await self.maybe_in_turn("tool")
            return "ok"

        @loop.pre_step
        async def decide(step, next):
            await self.maybe_in_turn("pre_step")
            kind = self.data.draw(DECISIONS, label="decision")
            batch = list(step.messages)
            if kind == "pass":
                decision = await next()
            elif kind == "reject":
                self.trace.append(f"  pre_step t{step.turn}s{step.step} Reject")
                return Reject(self.data.draw(st.sampled_from([None, "no"]), label="reason"))
            elif kind == "enter_empty":
                decision = Enter([])
            else:
                chosen = self.data.draw(st.permutations(batch), label="order")
                keep = self.data.draw(st.integers(0, len(chosen)), label="keep")
                decision = Enter(chosen[:keep])
            entered = [m.id for m in decision.messages]
            self.trace.append(f"  pre_step t{step.turn}s{step.step} batch={[m.id for m in batch]} enter={entered}")
            self.decisions[(gen, step.turn, step.step)] = entered
            return decision

        @loop.turn_stopping
        async def stopping(stop):
            await self.maybe_in_turn("turn_stopping")

        for kind in ("inserted", "discarded", "claimed"):
            loop.on(f"agent/inbox/{kind}", lambda e, kind=kind: self.live[kind].update([e.message.id]))
        return loop

    async def model(self, request) -> ModelReply:
        await self.maybe_in_turn("model")
        call = self.tool_budget > 0 and self.data.draw(st.integers(0, 2), label="tool call?") > 0
        if not call:
            return ModelReply("r")
        self.tool_budget -= 1
        self.call_counter += 1
        name = self.data.draw(st.sampled_from(["t", "t", "missing"]), label="tool")
        return ModelReply([{"type": "tool-call", "id": f"c{self.call_counter}", "name": name, "arguments": "{}"}])

    async def maybe_in_turn(self, where: str) -> None:
        """Runs a few drawn operations from inside the turn, and may suspend between them so
        that the test body's next operations (resume, cancel, when_idle...) land mid-turn."""
        while self.in_turn_budget > 0 and self.data.draw(st.booleans(), label=f"act in {where}?"):
            self.in_turn_budget -= 1
            if self.data.draw(st.integers(0, 2), label=f"suspend in {where}?") == 0:
                self.trace.append(f"  [{where}] suspends")
                await asyncio.sleep(0)  # a scheduling point, not a synchronisation
                continue
            op = self.data.draw(st.sampled_from(IN_TURN_OPS), label=f"op in {where}")
            self.trace.append(f"  [{where}] {op}")
            self.run_sync_op(op)

    # ------------------------------------------------------------------------------------
    # operations

    def new_message(self) -> UserMessage:
        pending = {m.id for m in self.pending()}
        reusable = [i for i in self.used_ids if i not in pending]
        if reusable and self.data.draw(st.integers(0, 4), label="reuse id?") == 0:
            mid = self.data.draw(st.sampled_from(reusable), label="reused id")
        else:
            self.counter += 1
            mid = f"u{self.counter}"
            self.used_ids.append(mid)
        return UserMessage(mid, id=mid)

    def pending(self) -> List[UserMessage]:
        return list(self.loop.inbox.next_turn) + list(self.loop.inbox.next_step)

    def finished_turns(self) -> List[int]:
        return [e.data["turn"] for e in self.log.events(types=["turn/end"])]

    def run_sync_op(self, op: str, top: bool = False) -> None:
        loop = self.loop
        idle = loop.status == "idle"
        if op in ("followup", "steer", "inject"):
            m = self.new_message()
            self.trace[-1] += f" {m.id}"
            n = len(self.log)
            try:
                getattr(loop, op)(m)
            except DuplicateMessageError:  # a reused id that is pending already
                assert m.id in {x.id for x in self.pending()}
                assert len(self.log) == n
                return
            if top and idle and op != "inject":
                # SPEC 4.3: a waking call on an idle loop has started the turn when it returns
                assert loop.status == "running"
                assert any(e.type == "turn/start" for e in self.log.events(n)), "no turn/start"
        elif op in ("remove", "replace"):
            pending = self.pending()
            if not pending:
                return
            victim = self.data.draw(st.sampled_from(pending), label="victim")
            self.trace[-1] += f" {victim.id}"
            if op == "remove":
                assert loop.inbox.remove(victim.id) is True
            else:
                same = self.data.draw(st.booleans(), label="same id?")
                new = victim.with_content("rewritten") if same else self.new_message()
                try:
                    assert loop.inbox.replace(victim.id, new) is True
                except DuplicateMessageError:  # a reused id that is pending already
                    assert new.id in {m.id for m in self.pending()} and new.id != victim.id
        elif op == "cancel":
            loop.cancel()
            assert self.pending() == [], "cancel() left input pending"
        elif op == "cancel_keep":
            before = self.pending()
            loop.cancel(keep_inbox=True)
            assert self.pending() == before, "cancel(keep_inbox=True) changed the inbox"
        elif op == "wake":
            pending = bool(self.pending())
            woke = loop.wake()
            if not pending:
                assert woke is False
            elif top and idle:
                assert woke is True and loop.status == "running"
        elif op == "requeue":
            turns = self.finished_turns()
            if turns:
                self.check_requeue(self.data.draw(st.sampled_from(turns), label="requeue turn"))
        else:  # pragma: no cover
            raise AssertionError(op)

    async def run_op(self, op: str) -> None:
        self.trace.append(op)
        if op == "tick":
            for _ in range(self.data.draw(st.integers(1, 6), label="ticks")):
                await asyncio.sleep(0)  # a random interleaving point, not a synchronisation
        elif op == "idle":
            await self.loop.when_idle()
            assert self.loop.status == "idle"
            self.check_log()
            self.check_not_stalled()
        else:
            self.run_sync_op(op, top=True)

    # ------------------------------------------------------------------------------------
    # requeue_claimed (D9)

    def expected_requeue(self, turn: int) -> List[UserMessage]:
        events = list(self.log.events())
        current = None
        claims: List[Tuple[int, str, UserMessage]] = []  # (seq, list, message)
        lists: Dict[str, List[UserMessage]] = {TURN: [], STEP: []}
        for ev in events:
            if ev.type == "turn/start":
                current = ev.data["turn"]
            elif ev.type == "agent/inbox/spliced":
                d = ev.data
                lst = lists[d["target"]]
                removed = lst[d["start"] : d["start"] + d.get("removedCount", 0)]
                lst[d["start"] : d["start"] + d.get("removedCount", 0)] = [kerman.Message.from_dict(m) for m in d["inserted"]]
                if current == turn and d.get("outcome") != "canceled":
                    claims += [(ev.seq, d["target"], m) for m in removed]
            elif ev.type == "turn/end":
                current = None
        left = []
        for seq, target, m in claims:
            seen = False
            for ev in events[seq + 1 :]:
                if ev.type == "user/message" and ev.data["id"] == m.id:
                    seen = True
                if ev.type == "agent/inbox/spliced" and any(x["id"] == m.id for x in ev.data["inserted"]):
                    seen = True
            if not seen:
                left.append((target, m))
        return [m for t, m in left if t == STEP] + [m for t, m in left if t == TURN]

    def check_requeue(self, turn: int) -> None:
        expected = self.expected_requeue(turn)
        before = (list(self.loop.inbox.next_turn), list(self.loop.inbox.next_step))
        n = len(self.log)
        try:
            got = self.loop.requeue_claimed(turn)
        except LoopError:
            assert expected == [], f"requeue_claimed({turn}) raised, expected {[m.id for m in expected]}"
            assert len(self.log) == n
            return
        self.trace[-1] += f" t{turn} -> {[m.id for m in got]}"
        self.unwoken_at.append(n)
        assert got == expected
        steps = [m for m in expected if any(m.id == x.id for x in self.claimed_from(turn, STEP))]
        turns = [m for m in expected if m not in steps]
        assert list(self.loop.inbox.next_step) == steps + before[1]
        assert list(self.loop.inbox.next_turn) == turns + before[0]
        ids = [m.id for m in self.pending()]
        assert len(ids) == len(set(ids)), f"duplicate pending ids after requeue: {ids}"
        m2 = len(self.log)
        try:
            self.loop.requeue_claimed(turn)
        except LoopError:
            pass
        else:
            raise AssertionError(f"second requeue_claimed({turn}) did not raise")
        assert len(self.log) == m2

    def claimed_from(self, turn: int, target: str) -> List[UserMessage]:
        out = []
        current = None
        lists: Dict[str, List[dict]] = {TURN: [], STEP: []}
        for ev in self.log.events():
            if ev.type == "turn/start":
                current = ev.data["turn"]
            elif ev.type == "turn/end":
                current = None
            elif ev.type == "agent/inbox/spliced":
                d = ev.data
                lst = lists[d["target"]]
                s, r = d["start"], d.get("removedCount", 0)
                removed = lst[s : s + r]
                lst[s : s + r] = d["inserted"]
                if current == turn and d.get("outcome") != "canceled" and d["target"] == target:
                    out += [kerman.Message.from_dict(m) for m in removed]
        return out

    # ------------------------------------------------------------------------------------
    # invariants over the whole log

    def check_log(self) -> None:
        events = list(self.log.events())
        assert [e.seq for e in events] == list(range(len(self.log))), "seqs are not contiguous"

        lists: Dict[str, List[dict]] = {TURN: [], STEP: []}
        ends: Counter = Counter()  # how inserted instances ended
        inserted: Counter = Counter()
        discarded: Counter = Counter()
        claimed: Counter = Counter()
        turn = None  # the open turn
        last_turn = 0
        step = None  # the open step
        last_step = 0
        claimed_at_boundary: List[str] = []
        step_batch: Optional[List[str]] = None
        entered_per_step: Dict[Tuple[int, int], List[str]] = {}
        generation = 1  # which loop instance wrote this part of the log (resumes re-register)
        gen_of_step: Dict[Tuple[int, int], int] = {}
        resume_seqs = self.resume_points
        for ev in events:
            while generation <= len(resume_seqs) and ev.seq >= resume_seqs[generation - 1]:
                generation += 1
            d = ev.data
            if ev.type == "turn/start":
                assert turn is None, f"turn/start at {ev.seq} inside turn {turn}"
                assert d["turn"] == last_turn + 1, f"turn numbers jump at {ev.seq}"
                turn = last_turn = d["turn"]
                last_step = 0
                claimed_at_boundary = []
            elif ev.type == "turn/end":
                assert turn == d["turn"] and step is None, f"unbalanced turn/end at {ev.seq}"
                turn = None
            elif ev.type == "step/start":
                assert turn == d["turn"] and step is None, f"step/start outside a turn at {ev.seq}"
                assert d["step"] == last_step + 1
                step = last_step = d["step"]
                step_batch = claimed_at_boundary
                claimed_at_boundary = []
                entered_per_step[(turn, step)] = []
                gen_of_step[(turn, step)] = generation
            elif ev.type == "step/end":
                assert turn == d["turn"] and step == d["step"], f"unbalanced step/end at {ev.seq}"
                step = None
            elif ev.type in ("user/message", "assistant/message", "assistant/chunk", "tool/call", "tool/result"):
                assert step is not None, f"{ev.type} outside a step at {ev.seq}"
                if ev.type == "user/message":
                    assert step_batch is not None and d["id"] in step_batch, (
                        f"user/message {d['id']} at {ev.seq} was not claimed at this step's boundary"
                    )
                    step_batch.remove(d["id"])  # each claim enters at most once
                    entered_per_step[(turn, step)].append(d["id"])
            elif ev.type == "agent/inbox/spliced":
                lst = lists[d["target"]]
                s, r = d["start"], d.get("removedCount", 0)
                removed = lst[s : s + r]
                assert len(removed) == r
                lst[s : s + r] = d["inserted"]
                inserted.update(m["id"] for m in d["inserted"])
                if d.get("outcome") == "canceled":
                    discarded.update(m["id"] for m in removed)
                    ends.update("discarded" for _ in removed)
                elif removed:
                    assert not d["inserted"], f"claim splice at {ev.seq} is not a pure deletion"
                    assert turn is not None and step is None, f"claim at {ev.seq} outside a turn boundary"
                    claimed.update(m["id"] for m in removed)
                    claimed_at_boundary += [m["id"] for m in removed]
                    ends.update("claimed" for _ in removed)
                ids = [m["id"] for m in lists[TURN] + lists[STEP]]
                assert len(ids) == len(set(ids)), f"duplicate pending ids after {ev.seq}"
        assert turn is None and step is None, "a turn is still open while the loop is idle"

        # every inserted instance ended exactly once
        pending = len(lists[TURN]) + len(lists[STEP])
        assert sum(inserted.values()) == ends["discarded"] + ends["claimed"] + pending
        # the live events agree with the log
        assert self.live["inserted"] == inserted, (self.live["inserted"], inserted)
        assert self.live["discarded"] == discarded, (self.live["discarded"], discarded)
        assert self.live["claimed"] == claimed, (self.live["claimed"], claimed)
        # a claim enters at most once overall
        entered = Counter(e.data["id"] for e in events if e.type == "user/message")
        for mid, n in entered.items():
            assert n <= claimed[mid], f"{mid} entered {n} times but claimed {claimed[mid]} times"
        # each step entered exactly what its pre_step decision said
        for (t, s), ids in entered_per_step.items():
            key = (gen_of_step[(t, s)], t, s)
            assert key in self.decisions, f"step {t}.{s} ran without a recorded pre_step decision"
            assert ids == self.decisions[key], f"step {t}.{s} entered {ids}, decision {self.decisions[key]}"
        # the fold and the live inbox agree with the walk
        fold = InboxProjection.fold(self.log.splices())
        assert list(fold.next_turn) == list(self.loop.inbox.next_turn)
        assert list(fold.next_step) == list(self.loop.inbox.next_step)
        assert [m.to_dict() for m in self.loop.inbox.next_turn] == lists[TURN]
        assert [m.to_dict() for m in self.loop.inbox.next_step] == lists[STEP]

    def check_not_stalled(self) -> None:
        """Idle with next-turn input pending is only allowed after a turn that stops the driver
        (blocked, aborted, error, interrupted, or no step entered: reference 10.7), or when the
        input became pending without a wake (requeue_claimed, resume) after that turn ended."""
        if not self.loop.inbox.next_turn:
            return
        events = list(self.log.events())
        ends = [e for e in events if e.type == "turn/end"]
        if any(seq >= (ends[-1].seq if ends else 0) for seq in self.unwoken_at):
            return
        assert ends, "next-turn input pending but no turn ever ran"
        last = ends[-1]
        had_step = any(e.type == "step/start" and e.data["turn"] == last.data["turn"] for e in events)
        assert not had_step or last.data["reason"]["kind"] not in ("completed", "max-tokens"), (
            f"idle with next-turn input {[m.id for m in self.loop.inbox.next_turn]} after turn "
            f"{last.data['turn']} ended {last.data['reason']}"
        )

    async def main(self, ops: List[str]) -> None:
        try:
            for op in ops:
                if op == "resume":
                    # events from here on are written by the next loop instance
                    await self.resume()
                else:
                    await self.run_op(op)
            self.trace.append("idle (end)")
            await self.loop.when_idle()
            assert self.loop.status == "idle"
            self.check_log()
            self.check_not_stalled()
            for turn in self.finished_turns():
                self.trace.append("requeue (end)")
                self.check_requeue(turn)
                self.check_log()
        finally:
            await self.loop.aclose()
            await self.log.aclose()

    async def resume(self) -> None:
        self.trace.append("resume")
        discard = self.data.draw(st.booleans(), label="discard_pending")
        self.trace[-1] += f" discard_pending={discard}"
        await self.loop.aclose(discard_pending=discard)
        assert self.loop.status == "idle"
        kept = ([] if discard else list(self.loop.inbox.next_turn), [] if discard else list(self.loop.inbox.next_step))
        self.check_log()
        await self.log.aclose()
        self.log = self.store.open(self.log_id)
        self.resume_points.append(len(self.log))
        self.unwoken_at.append(len(self.log))
        self.loop = self.make_loop()
        assert (list(self.loop.inbox.next_turn), list(self.loop.inbox.next_step)) == kept
        starts = [e.data["turn"] for e in self.log.events(types=["turn/start"])]
        assert self.loop.turn == (starts[-1] if starts else 0)
        assert self.loop.status == "idle"
        self.check_log()


@settings(
    max_examples=100,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data(), file_store=st.booleans(), ops=st.lists(st.sampled_from(TOP_OPS), min_size=4, max_size=30))
def test_loop_model(data, file_store, ops):
    with tempfile.TemporaryDirectory() as root:
        run = Run(data, root if file_store else None)
        try:
            asyncio.run(run.main(ops))
        finally:
            note("operations (indented: from inside the turn):\n" + "\n".join(run.trace))
