"""Threads and event loops around AgentLoops (SPEC 2.3 "all methods are thread-safe", 4.3).

* Python threads insert, remove and replace inbox messages while a loop runs: every message
  ends exactly once (claimed into a step and entered, removed, replaced, or still pending), as
  the log records it and as each thread's return values say; nothing internal leaks.
* Many loops on one event loop, over one memory store and over one file store.
* A loop per thread, each on its own event loop, sharing one store.
* ``cancel()`` and ``wake()`` from other threads, alone and racing with followups.

Synchronisation is by joins, ``threading.Event`` and futures resolved through
``call_soon_threadsafe``, never by sleeping; a hang is caught by the suite's pytest-timeout.
"""

from __future__ import annotations

import asyncio
import logging
import random
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Dict, List, Set, Tuple

import pytest

import kerman
from store.test_crash import check_balanced, claim_accounting


@pytest.fixture(autouse=True)
def nothing_contained(caplog: pytest.LogCaptureFixture) -> Any:
    """Internal errors must not hide in the logger either (listener and driver failures are
    contained and logged there)."""
    yield
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not logged, logged


@pytest.fixture
def switch_often() -> Any:
    """Hands the GIL over every microsecond instead of every 5 ms, so threads interleave inside
    the binding's calls, where lock-order bugs with the GIL hide."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


THREADS = 4
OPS = 60  # per thread


def fates(events: List[kerman.Event]) -> Dict[str, List[str]]:
    """What the log says happened to each message id, in order: ``inserted``, ``claimed``
    (with ``entered`` when a ``user/message`` carries it), ``removed`` or ``replaced``."""
    lists: Dict[str, List[str]] = {kerman.NEXT_TURN: [], kerman.NEXT_STEP: []}
    out: Dict[str, List[str]] = {}
    for ev in events:
        d = ev.data
        if ev.type == "user/message":
            out.setdefault(d["id"], []).append("entered")
        if ev.type != "agent/inbox/spliced":
            continue
        items = lists[d["target"]]
        start, n = d["start"], d.get("removedCount", 0)
        gone = items[start : start + n]
        inserted = [m["id"] for m in d["inserted"]]
        items[start : start + n] = inserted
        fate = "claimed" if d.get("outcome") != "canceled" else ("replaced" if inserted else "removed")
        for mid in gone:
            out.setdefault(mid, []).append(fate)
        for mid in inserted:
            out.setdefault(mid, []).append("inserted")
    return out


class Pacer:
    """Lets a thread wait until the loop has ended a step or a turn, so thread traffic
    interleaves with turns instead of finishing before the first one. Only threads wait for
    the loop, never the reverse: a running loop always ends its turn (the model only yields),
    and an idle one is woken first when input is pending (``inject()`` does not wake)."""

    def __init__(self, loop: kerman.AgentLoop) -> None:
        self.loop = loop
        self.cond = threading.Condition()
        self.progress = 0  # step/end and turn/end events
        self.changes = 0  # agent/status events
        loop.log.subscribe(self._event)
        loop.on("agent/status", self._status)

    def _event(self, ev: kerman.Event) -> None:
        if ev.type in ("step/end", "turn/end"):
            with self.cond:
                self.progress += 1
                self.cond.notify_all()

    def _status(self, ev: Any) -> None:
        with self.cond:
            self.changes += 1
            self.cond.notify_all()

    def mark(self) -> int:
        with self.cond:
            return self.progress

    def wait_beyond(self, mark: int) -> None:
        with self.cond:
            if self.progress > mark:
                return
            changes, idle = self.changes, self.loop.status == "idle"
        if idle and not self.loop.wake():
            return  # idle with nothing pending: no progress to wait for
        with self.cond:
            self.cond.wait_for(lambda: self.progress > mark or self.changes > changes)


class Traffic:
    """One thread's inbox traffic: followup/steer/inject of fresh ids, and remove/replace of
    its own earlier ones. Records what every call returned and any exception."""

    def __init__(self, loop: kerman.AgentLoop, pacer: Pacer, name: str, seed: int) -> None:
        self.loop, self.pacer, self.name, self.rng = loop, pacer, name, random.Random(seed)
        self.sent: List[str] = []
        self.removed: Set[str] = set()
        self.not_removed: Set[str] = set()
        self.replaced: Dict[str, str] = {}
        self.errors: List[BaseException] = []
        self.thread = threading.Thread(target=self.run, name=name)

    def run(self) -> None:
        try:
            mark = self.pacer.mark()
            for k in range(OPS):
                if k % 3 == 2:
                    self.pacer.wait_beyond(mark)
                    mark = self.pacer.mark()
                mid = f"{self.name}-{k}"
                roll = self.rng.random()
                if roll < 0.05:
                    self.loop.log.append("test/note", {"from": self.name, "k": k})
                elif roll < 0.15 and self.sent:
                    old = self.rng.choice(self.sent)
                    (self.removed if self.loop.inbox.remove(old) else self.not_removed).add(old)
                elif roll < 0.3 and self.sent:
                    old = self.rng.choice(self.sent)
                    if self.loop.inbox.replace(old, kerman.UserMessage(f"replaces {old}", id=mid)):
                        self.replaced[old] = mid
                        self.sent.append(mid)
                else:
                    send = self.rng.choice([self.loop.followup, self.loop.steer, self.loop.inject])
                    stored = send(kerman.UserMessage(f"from {self.name}", id=mid))
                    assert stored.id == mid
                    self.sent.append(mid)
        except BaseException as exc:  # anything at all is a failure, reported by the test
            self.errors.append(exc)


async def joined(threads: List[threading.Thread]) -> None:
    """Joins threads without blocking the event loop. The executor's completion reaches the
    loop after every call_soon_threadsafe the threads made, so their wakes have run."""
    running = asyncio.get_running_loop()
    for t in threads:
        await running.run_in_executor(None, t.join)


async def drained(loop: kerman.AgentLoop) -> None:
    """Waits until idle, waking for input a stopped driver left (inject() never wakes)."""
    for _ in range(1000):
        await loop.when_idle()
        if not loop.inbox.has_pending:
            return
        loop.wake()
    raise AssertionError("the inbox never drained")


def echo_with_tools() -> Callable[..., Any]:
    """Replies with the entered texts; every third request of a turn's first step calls a tool,
    so turns have several steps and step boundaries to claim at."""
    calls = [0]

    async def model(request: Any) -> kerman.ModelReply:
        await asyncio.sleep(0)  # yield, so other threads' wakes interleave with the turn
        calls[0] += 1
        if request.step == 1 and calls[0] % 3 == 0:
            call = {"type": "tool-call", "id": f"call-{calls[0]}", "name": "noop", "arguments": "{}"}
            return kerman.ModelReply([call])
        return kerman.ModelReply(" ".join(m.text for m in request.entered) or "ok")

    return model


async def noop(args: Any, ctx: kerman.ToolContext) -> str:
    await asyncio.sleep(0)
    return "done"


def make_store(kind: str, tmp_path: Path) -> Any:
    if kind == "memory":
        return kerman.MemoryStore()
    return kerman.FileStore(tmp_path / "sessions", durability=kind.split("-", 1)[1])


STORES = ["memory", "file-strict", "file-checkpoint"]


@pytest.mark.parametrize("kind", STORES)
def test_threads_mutate_the_inbox_while_the_loop_runs(tmp_path: Path, kind: str, switch_often: Any) -> None:
    store = make_store(kind, tmp_path)
    log = store.create("threads")
    observed: List[int] = []
    log.subscribe(lambda ev: observed.append(ev.seq))  # Python runs while appends serialise

    async def main() -> Tuple[kerman.AgentLoop, List[Traffic]]:
        loop = kerman.AgentLoop(echo_with_tools(), log=log, tools=[kerman.Tool("noop", noop)])
        pacer = Pacer(loop)
        traffic = [Traffic(loop, pacer, f"t{i}", seed=i) for i in range(THREADS)]
        for t in traffic:
            t.thread.start()
        await joined([t.thread for t in traffic])
        await drained(loop)
        return loop, traffic

    loop, traffic = asyncio.run(main())
    for t in traffic:
        assert not t.errors, (t.name, t.errors)
    events = list(log.events())
    assert observed == list(range(len(events)))
    check_balanced(events)
    assert all(e.data["reason"]["kind"] == "completed" for e in events if e.type == "turn/end")

    seen = fates(events)
    pending = {m.id for m in loop.inbox.next_turn + loop.inbox.next_step}
    assert not pending
    replaced = {old for t in traffic for old in t.replaced}
    removed = {mid for t in traffic for mid in t.removed}
    for t in traffic:
        assert len(t.sent) == len(set(t.sent))
        for mid in t.sent:
            end = seen.get(mid, [])
            assert end[0] == "inserted" and end.count("inserted") == 1, (mid, end)
            rest = end[1:]
            if mid in removed:
                assert rest == ["removed"], (mid, end)
            elif mid in replaced:
                assert rest == ["replaced"], (mid, end)
            else:  # claimed into a step and entered there, exactly once
                assert rest == ["claimed", "entered"], (mid, end)
    # The log's removals and replacements are exactly those the threads were told succeeded.
    assert {mid for mid, end in seen.items() if "removed" in end} == removed
    assert {mid for mid, end in seen.items() if "replaced" in end} == replaced
    # The inbox a fresh replay builds is the live one.
    assert kerman.InboxProjection.fold(log.splices()).next_turn == loop.inbox.next_turn == ()
    log.close()


@pytest.mark.parametrize("kind", STORES)
def test_many_loops_on_one_event_loop(tmp_path: Path, kind: str) -> None:
    store = make_store(kind, tmp_path)
    n_loops, prompts = 50, 3

    async def main() -> List[kerman.AgentLoop]:
        loops = [kerman.AgentLoop(echo_with_tools(), log=store.create(f"s{i}"), tools=[kerman.Tool("noop", noop)]) for i in range(n_loops)]
        for i, loop in enumerate(loops):
            loop.inject(kerman.UserMessage("context", id=f"s{i}-ctx"))
            for k in range(prompts):
                loop.followup(kerman.UserMessage(f"prompt {k}", id=f"s{i}-p{k}"))
        await asyncio.gather(*(loop.when_idle() for loop in loops))
        for loop in loops:
            await loop.aclose()
        return loops

    loops = asyncio.run(main())
    for i, loop in enumerate(loops):
        events = list(loop.log.events())
        check_balanced(events)
        ends = [e.data["reason"]["kind"] for e in events if e.type == "turn/end"]
        assert ends == ["completed"] * prompts, (i, ends)
        entered = [e.data["id"] for e in events if e.type == "user/message"]
        assert entered == [f"s{i}-ctx", f"s{i}-p0", f"s{i}-p1", f"s{i}-p2"]
        assert not loop.inbox.has_pending
        written = [e.to_json() for e in events]
        loop.log.close()
        if kind != "memory":
            with store.open(f"s{i}") as again:
                assert [e.to_json() for e in again.events()] == written


@pytest.mark.parametrize("kind", STORES)
def test_a_loop_per_thread_sharing_a_store(tmp_path: Path, kind: str, switch_often: Any) -> None:
    store = make_store(kind, tmp_path)
    results: Dict[int, List[str]] = {}
    errors: List[BaseException] = []

    async def worker(i: int) -> List[str]:
        log = store.create(f"w{i}")
        loop = kerman.AgentLoop(echo_with_tools(), log=log, tools=[kerman.Tool("noop", noop)])
        for k in range(5):
            loop.followup(kerman.UserMessage(f"p{k}", id=f"w{i}-{k}"))
            loop.steer(kerman.UserMessage(f"s{k}", id=f"w{i}-s{k}"))
        await drained(loop)
        await log.flush()
        events = list(log.events())
        check_balanced(events)
        log.close()
        return [e.to_json() for e in events]

    def thread(i: int) -> None:
        try:
            results[i] = asyncio.run(worker(i))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=thread, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sorted(results) == list(range(8))
    for i, written in results.items():
        with store.open(f"w{i}") as again:
            assert [e.to_json() for e in again.events()] == written
            entered = {e.data["id"] for e in again.events() if e.type == "user/message"}
            assert entered == {f"w{i}-{k}" for k in range(5)} | {f"w{i}-s{k}" for k in range(5)}


def test_cancel_from_another_thread() -> None:
    started = threading.Event()
    call = {"type": "tool-call", "id": "c1", "name": "slow", "arguments": "{}"}

    async def slow(args: Any, ctx: kerman.ToolContext) -> str:
        started.set()
        await ctx.signal.wait()  # cancel() throws CancelledError into it
        return "not reached"

    async def main() -> kerman.AgentLoop:
        loop = kerman.AgentLoop(kerman.models.ScriptedModel([kerman.ModelReply([call])]), tools=[kerman.Tool("slow", slow)])

        def canceller() -> None:
            started.wait()
            loop.inject(kerman.UserMessage("kept", id="kept"))
            loop.cancel({"kind": "hook", "reason": "from a thread"}, keep_inbox=True)

        t = threading.Thread(target=canceller)
        t.start()
        loop.followup(kerman.UserMessage("go", id="go"))
        await joined([t])
        await loop.when_idle()
        assert [m.id for m in loop.inbox.next_step] == ["kept"]
        # Idle now: a plain cancel from a thread discards what is pending.
        t = threading.Thread(target=loop.cancel)
        t.start()
        await joined([t])
        assert not loop.inbox.has_pending
        return loop

    loop = asyncio.run(main())
    events = list(loop.log.events())
    check_balanced(events)
    [end] = [e.data["reason"] for e in events if e.type == "turn/end"]
    assert end == {"kind": "aborted", "reason": {"kind": "hook", "reason": "from a thread"}}
    [result] = [e.data for e in events if e.type == "tool/result"]
    assert result["error"]["code"] == "ABORTED_DURING_DISPATCH"
    assert fates(events)["kept"] == ["inserted", "removed"]


def test_wake_from_another_thread() -> None:
    async def main() -> Tuple[kerman.AgentLoop, List[bool]]:
        loop = kerman.AgentLoop(kerman.models.EchoModel())
        woke: List[bool] = []

        def waker() -> None:
            woke.append(loop.wake())  # nothing pending
            loop.inject(kerman.UserMessage("context", id="ctx"))
            woke.append(loop.wake())

        t = threading.Thread(target=waker)
        t.start()
        await joined([t])
        await loop.when_idle()
        return loop, woke

    loop, woke = asyncio.run(main())
    assert woke == [False, True]
    events = list(loop.log.events())
    assert [e.data["reason"]["kind"] for e in events if e.type == "turn/end"] == ["completed"]
    assert [e.data["id"] for e in events if e.type == "user/message"] == ["ctx"]
    assert [e.data["message"]["content"][0]["text"] for e in events if e.type == "assistant/message"] == ["context"]


@pytest.mark.parametrize("keep_inbox", [True, False], ids=["keep", "discard"])
@pytest.mark.parametrize("kind", ["memory", "file-checkpoint"])
def test_cancel_and_wake_race_with_followups(tmp_path: Path, kind: str, keep_inbox: bool, switch_often: Any) -> None:
    """Threads send, wake and cancel at once: each message is inserted once and then either
    claimed once or (cancel without ``keep_inbox``) discarded once; a claimed message that was
    never entered belongs to an aborted turn (SPEC D9: it does not come back by itself)."""
    store = make_store(kind, tmp_path)
    log = store.create("race")
    barrier = threading.Barrier(THREADS)

    def racer(loop: kerman.AgentLoop, pacer: Pacer, i: int, errors: List[BaseException]) -> None:
        try:
            barrier.wait()
            mark = pacer.mark()
            for k in range(OPS // 2):
                if k % 4 == 3:
                    pacer.wait_beyond(mark)
                    mark = pacer.mark()
                loop.followup(kerman.UserMessage(f"r{i}-{k}", id=f"r{i}-{k}"))
                if k % 5 == i % 5:
                    loop.cancel({"kind": "hook", "reason": f"r{i}"}, keep_inbox=keep_inbox)
                if k % 7 == 0:
                    loop.wake()
        except BaseException as exc:
            errors.append(exc)

    async def main() -> Tuple[kerman.AgentLoop, List[BaseException]]:
        loop = kerman.AgentLoop(echo_with_tools(), log=log, tools=[kerman.Tool("noop", noop)])
        errors: List[BaseException] = []
        pacer = Pacer(loop)
        threads = [threading.Thread(target=racer, args=(loop, pacer, i, errors)) for i in range(THREADS)]
        for t in threads:
            t.start()
        await joined(threads)
        await drained(loop)
        return loop, errors

    loop, errors = asyncio.run(main())
    assert not errors, errors
    events = list(log.events())
    check_balanced(events)
    ends = {e.data["turn"]: e.data["reason"]["kind"] for e in events if e.type == "turn/end"}
    assert set(ends.values()) <= {"completed", "aborted"}
    seen = fates(events)
    assert set(seen) == {f"r{i}-{k}" for i in range(THREADS) for k in range(OPS // 2)}
    claim_accounting(events)  # every claimed message was entered, or its turn ended unfinished
    ways = [["inserted", "claimed", "entered"], ["inserted", "claimed"]]
    if not keep_inbox:
        ways.append(["inserted", "removed"])
    for mid, end in seen.items():
        assert end in ways, (mid, end)
    assert not loop.inbox.has_pending
    log.close()


def test_delivery_from_a_thread_running_its_own_event_loop() -> None:
    """SPEC 4.3: from another thread, insert at once and schedule the wake on the bound loop,
    whether or not that thread runs an event loop of its own."""

    async def main() -> Tuple[kerman.AgentLoop, List[Any]]:
        loop = kerman.AgentLoop(kerman.models.EchoModel())
        results: List[Any] = []

        async def elsewhere() -> None:
            results.append(loop.followup(kerman.UserMessage("hello", id="hi")).id)
            results.append(loop.steer(kerman.UserMessage("steer", id="st")).id)
            results.append(loop.wake())

        def other() -> None:
            try:
                asyncio.run(elsewhere())
            except BaseException as exc:
                results.append(exc)

        t = threading.Thread(target=other)
        t.start()
        # Joined without yielding: the bound loop runs none of the scheduled wakes before the
        # thread's three calls are done. (Awaiting the join let a fast turn claim both
        # messages first, and `wake()` then rightly found nothing pending: False.)
        t.join()
        await drained(loop)
        return loop, results

    loop, results = asyncio.run(main())
    assert results == ["hi", "st", True]
    events = list(loop.log.events())
    assert sorted(e.data["id"] for e in events if e.type == "user/message") == ["hi", "st"]
    assert all(e.data["reason"]["kind"] == "completed" for e in events if e.type == "turn/end")


def test_a_waking_call_after_the_event_loop_closed_inserts_nothing() -> None:
    """A waking call that cannot schedule its wake raises LoopError before inserting, so a
    caller that sees the error can retry without queueing the message twice."""
    loop = asyncio.run(bound_loop())  # its event loop is closed once asyncio.run returns
    errors: List[BaseException] = []

    def late() -> None:
        for send in (loop.followup, loop.steer):
            try:
                send("late")
            except kerman.LoopError as exc:
                errors.append(exc)

    t = threading.Thread(target=late)
    t.start()
    t.join()
    assert len(errors) == 2 and all("closed" in str(e) for e in errors), errors
    with pytest.raises(kerman.LoopError, match="closed"):
        loop.followup("from the loop's own thread, no event loop running")
    with pytest.raises(kerman.LoopError, match="closed"):
        loop.inject("pending")  # inserted: inject does not wake
        loop.wake()
    assert [m.text for m in loop.inbox.next_step] == ["pending"]
    assert not loop.inbox.next_turn and len(loop.log) == 1


async def bound_loop() -> kerman.AgentLoop:
    return kerman.AgentLoop(kerman.models.EchoModel())


@pytest.mark.parametrize("op", ["append", "prepend", "splice", "replace"])
def test_a_message_claimed_before_its_insertion_returns_is_the_queued_object(op: str) -> None:
    """Another thread may claim a message as soon as it is pending, before the inserting call
    has returned (here: while its ``on_inserted`` callback runs); the claim still hands back
    the object that was queued, not a fresh copy."""
    announced, claimed = threading.Event(), threading.Event()
    queued = kerman.UserMessage("queued", id="q")

    def on_inserted(message: kerman.UserMessage) -> None:
        if message.id == "q":
            announced.set()
            claimed.wait()

    inbox = kerman.Inbox(kerman.MemoryStore().create(), on_inserted=on_inserted)
    inbox.append(kerman.NEXT_STEP, kerman.UserMessage("old", id="old"))
    returned: List[Any] = []
    insert = {
        "append": lambda: returned.append(inbox.append(kerman.NEXT_STEP, queued)),
        "prepend": lambda: returned.append(inbox.prepend(kerman.NEXT_STEP, queued)),
        "splice": lambda: returned.append(inbox.splice(kerman.NEXT_STEP, 0, 0, [queued])),
        "replace": lambda: returned.append(inbox.replace("old", queued)),
    }[op]
    t = threading.Thread(target=insert)
    t.start()
    announced.wait()
    batch = inbox.claim(kerman.NEXT_STEP, 1)
    claimed.set()
    t.join()
    assert any(m is queued for m in batch), batch
    assert returned and returned[0] in (queued, [], True)
