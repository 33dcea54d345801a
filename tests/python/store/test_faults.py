"""Injected write and fsync failures, at every point an agent loop's session reaches the disk.

A private ``kerman._core._FaultPlan`` makes the FileStore's writer thread fail one write
(nothing written, or a short write: part of the batch, then the error), one fsync, or the
directory's fsync that makes a new session's name durable with its first batch. Every batch is
synced when written, so closing a log syncs nothing more (an earlier failure still surfaces).
Batching is timing-dependent (group commit), so a point is named by the event whose batch fails:
failing "the batch that holds seq S" for every S of a fault-free run covers every write and sync
point any batching of that run can have.

Each faulty run checks what SPEC 2.2 promises: the flush barriers covering the failed batch
raise ``LogWriteError`` (and no barrier beyond it succeeds, so the loop never calls the model or
a tool body past a failed checkpoint); the log is poisoned; the loop reports the failure through
``agent/error``, goes idle and leaves no task running; and after close, reopening gives a
consistent log that holds every acknowledged event byte for byte (the checks of
``test_crash.py``). A plain log with one event per barrier makes the points deterministic, and
there each numbered write and sync fails in turn. See docs/durability.md for the counts.
"""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator, List, Optional, Tuple

import pytest
from test_crash import check_and_resume, disk_state

import kerman
from conftest import DURABILITIES, session_path
from kerman._core import _FaultPlan

CALLS = [{"type": "tool-call", "id": f"c{i}", "name": name, "arguments": "{}"} for i, name in ((1, "lookup"), (2, "slow"), (3, "last"))]


class Run:
    """What one scenario run saw: barriers with their outcome, acknowledged prefixes, the
    errors the loop reported, and the LogWriteError that stopped the scenario, if any."""

    def __init__(self, log: kerman.SessionLog) -> None:
        self.log = log
        self.barriers: List[Tuple[int, Optional[BaseException]]] = []
        self.acks: List[List[str]] = []
        self.reported: List[Tuple[Any, dict]] = []  # (exception, failure dict) of agent/error
        self.stopped: Optional[BaseException] = None
        self.tasks: List[asyncio.Task[Any]] = []  # every task the loop created

    def acknowledged(self, n: int) -> None:
        self.barriers.append((n, None))
        self.acks.append([e.to_json() for e in self.log.events(stop=n)])

    async def flush(self) -> None:
        n = len(self.log)
        try:
            await self.log.flush()
        except kerman.LogWriteError as exc:
            self.barriers.append((n, exc))
            raise
        self.acknowledged(n)


async def scenario(log: kerman.SessionLog, run: Run) -> kerman.AgentLoop:
    """Two turns: three tool calls two at a time (``slow`` runs until ``last`` starts, so a
    failure at ``last``'s barrier finds ``slow`` still running), steer/followup/replace from
    inside ``lookup``, a streamed reply, a second turn, then an inject and a remove; explicit
    barriers before every step and at the end. With checkpoint barriers (strict, checkpoint)
    the model and the tool bodies that run alone note what the loop's own barrier
    acknowledged."""
    checkpoints = log._checkpoints
    script = kerman.models.ScriptedModel(
        [
            kerman.ModelReply(CALLS),
            [{"type": "text-delta", "text": "done "}, {"type": "text-delta", "text": "with 1"}, {"type": "finish", "reason": "stop"}],
            "turn 2",
        ]
    )

    def model(request: Any) -> Any:
        if checkpoints:
            run.acknowledged(len(log))
        return script(request)

    async def lookup(args: Any, ctx: kerman.ToolContext) -> str:
        if checkpoints:
            run.acknowledged(len(log))
        loop.steer("steer from the tool")
        queued = loop.followup("second")
        loop.inbox.replace(queued.id, kerman.UserMessage("second, rewritten", id=queued.id))
        return "found"

    last_started = asyncio.Event()

    async def slow(args: Any, ctx: kerman.ToolContext) -> str:
        await last_started.wait()
        return "slow"

    async def last(args: Any, ctx: kerman.ToolContext) -> str:
        if checkpoints:
            run.acknowledged(len(log))
        last_started.set()
        return "last"

    tools = [kerman.Tool("lookup", lookup), kerman.Tool("slow", slow), kerman.Tool("last", last)]
    loop = kerman.AgentLoop(model, log=log, tools=tools, max_parallel_tool_calls=2)

    @loop.pre_step
    async def barrier(step: kerman.PreStep, next: Any) -> Any:
        await run.flush()
        return await next()

    loop.on("agent/error", lambda ev: run.reported.append((ev.exception, ev.error)))
    try:
        loop.inject("context")
        loop.followup("first")
        await loop.when_idle()
        await run.flush()
        dropped = loop.inject("dropped")
        loop.inbox.remove(dropped.id)
        await run.flush()
    except kerman.LogWriteError as exc:
        run.stopped = exc
    await loop.when_idle()
    return loop


async def faulty_run(root: Path, mode: str, plan: _FaultPlan) -> Tuple[Run, kerman.AgentLoop, List[str]]:
    log = kerman.FileStore(root, durability=mode, _faults=plan).create("s")
    run = Run(log)
    running = asyncio.get_running_loop()

    def factory(event_loop: Any, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        task = asyncio.Task(coro, loop=event_loop, **kwargs)
        run.tasks.append(task)
        return task

    running.set_task_factory(factory)
    try:
        loop = await scenario(log, run)
    finally:
        running.set_task_factory(None)
    return run, loop, [e.to_json() for e in log.events()]


def count(root: Path, mode: str) -> Tuple[int, _FaultPlan]:
    """A fault-free run: the number of events, and the plan that counted the points."""
    plan = _FaultPlan()
    run, loop, events = asyncio.run(faulty_run(root / "count", mode, plan))
    assert run.stopped is None and not run.reported, (run.stopped, run.reported)
    loop.log.close()
    assert plan.writes >= 1 and plan.fired is None
    return len(events), plan


async def check_failed(root: Path, mode: str, plan: _FaultPlan, seq: Optional[int], cut_back: bool = False) -> None:
    """One run with ``plan`` armed at event ``seq`` (``None``: the final fsync at close)."""
    run, loop, committed = await faulty_run(root, mode, plan)
    log = loop.log
    at_close = seq is None
    if at_close:
        assert plan.fired is None and run.stopped is None and not run.reported
        first = len(committed)
    else:
        fired = plan.fired
        assert fired is not None, f"the fault never fired: {plan!r} seq={seq} of {len(committed)}"
        first = fired["first_seq"]
        assert first <= seq < first + fired["events"]

    # No barrier beyond the failed batch succeeds; those that cover it fail.
    for n, outcome in run.barriers:
        if n > first:
            assert isinstance(outcome, kerman.LogWriteError), (n, first, outcome)
    # The loop reports the write failure as a failed turn, and nothing else leaks.
    for exc, failure in run.reported:
        assert isinstance(exc, kerman.LogWriteError), repr(exc)
        assert failure["message"].startswith("session log write failed: "), failure
    assert loop.status == "idle"
    # No tool call is left running once the loop is idle, and no task's failure went unseen
    # (asyncio's flag for "Task exception was never retrieved").
    assert asyncio.all_tasks() == {asyncio.current_task()}
    for task in run.tasks:
        assert task.done() and not task._log_traceback, task

    if not at_close:
        seen = [e for _, e in run.barriers if e is not None] + [e for e, _ in run.reported] + [run.stopped]
        assert any(isinstance(e, kerman.LogWriteError) for e in seen), "the failure never surfaced"
        # Poisoned: appends, barriers and inbox mutations raise, and change nothing.
        n, pending = len(log), (loop.inbox.next_turn, loop.inbox.next_step)
        with pytest.raises(kerman.LogWriteError):
            log.append("test/after", {})
        with pytest.raises(kerman.LogWriteError):
            await log.flush()
        with pytest.raises(kerman.LogWriteError):
            loop.followup("after the failure")
        assert len(log) == n and (loop.inbox.next_turn, loop.inbox.next_step) == pending
        with pytest.raises(kerman.LogWriteError):  # its final flush tells the caller
            await loop.aclose()
        assert loop.status == "idle" and not log.closed
    with pytest.raises(kerman.LogWriteError):
        log.close()
    assert plan.fired is not None

    # Reopen without faults: a prefix of what was committed, then closers.
    path = session_path(root, "s")
    on_disk, torn = disk_state(path)
    if cut_back:  # unacknowledged records of the short write may survive, whole or torn
        assert on_disk >= first
    else:
        assert not torn and on_disk == first
    store = kerman.FileStore(root, durability=mode)
    reopened = store.open("s")
    try:
        events = list(reopened.events())
        assert [e.to_json() for e in events[:on_disk]] == committed[:on_disk]
        for ack in run.acks:
            assert [e.to_json() for e in events[: len(ack)]] == ack
        await check_and_resume(reopened, events)
    finally:
        reopened.close()


# ---------------------------------------------------------------------------------------------


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    """A folder on tmpfs when there is one: every failure here is injected, so a real disk's
    fsync latency would only slow the hundreds of runs down."""
    if not os.access("/dev/shm", os.W_OK):
        yield tmp_path
        return
    path = Path(tempfile.mkdtemp(prefix="kerman-faults-", dir="/dev/shm"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# Bytes of the failing batch that reach the file before the error: part of the first record,
# a record or two, everything but the last byte (clamped).
SHORT = (1, 200, 10**9)


def plans(mode: str, seq: int) -> Iterator[Tuple[str, _FaultPlan, bool]]:
    """Every way the batch holding ``seq`` can fail: (name, plan, whether the cleanup fails)."""
    yield "write", _FaultPlan("write", seq=seq), False
    for i, short in enumerate(SHORT):
        cut_back = (seq + i) % 2 == 1  # half of the short writes also fail to cut the file back
        yield f"short{short}", _FaultPlan("write", seq=seq, short=short, cut_back=cut_back), cut_back
    if mode != "none":
        yield "sync", _FaultPlan("sync", seq=seq), False


@pytest.mark.parametrize("mode", DURABILITIES)
def test_every_failure_point_of_a_loop(root: Path, mode: str) -> None:
    events, counted = count(root, mode)
    # The fault-free run's points: writes of contiguous batches covering every event once.
    starts = [first for first, _, _ in counted.batches]
    assert starts[0] == 0 and sum(n for _, n, _ in counted.batches) == events
    assert all(a + n == b for (a, n, _), b in zip(counted.batches, starts[1:], strict=False))
    assert counted.syncs == (0 if mode == "none" else counted.writes)  # none at close
    assert counted.dir_syncs == (0 if mode == "none" else 1)  # the new session's name, once

    async def every_point() -> int:
        runs = 0
        for seq in range(events):
            for name, plan, cut_back in plans(mode, seq):
                await check_failed(root / f"{name}-{seq}", mode, plan, seq, cut_back)
                runs += 1
        if mode != "none":
            # The directory's sync, with the first batch: that batch's barriers fail.
            await check_failed(root / "dir", mode, _FaultPlan("sync-dir", nth=1), counted.batches[0][0])
            runs += 1
        return runs

    assert asyncio.run(every_point()) == events * (5 if mode != "none" else 4) + (mode != "none")


EVENTS = 5


async def one_by_one(where: Path, mode: str, plan: _FaultPlan) -> Tuple[kerman.SessionLog, List[Optional[BaseException]]]:
    """Appends EVENTS events, awaiting a barrier after each: the outcome of each append+flush."""
    log = kerman.FileStore(where, durability=mode, _faults=plan).create("n")
    outcomes: List[Optional[BaseException]] = []
    for i in range(EVENTS):
        try:
            log.append("test/n", {"i": i})
            await log.flush()
            outcomes.append(None)
        except kerman.LogWriteError as exc:
            outcomes.append(exc)
    return log, outcomes


@pytest.mark.parametrize("mode", DURABILITIES)
def test_every_nth_write_and_sync_of_a_log(root: Path, mode: str) -> None:
    """One event per barrier makes the points deterministic: write and sync k carry event k-1
    (the first sync also syncs the directory), and closing syncs nothing more. Fails each by its
    number, with ENOSPC or EIO."""
    counted = _FaultPlan()
    log, outcomes = asyncio.run(one_by_one(root / "count", mode, counted))
    log.close()
    assert outcomes == [None] * EVENTS
    assert [(first, n) for first, n, _ in counted.batches] == [(i, 1) for i in range(EVENTS)]
    assert counted.writes == EVENTS
    assert counted.syncs == (0 if mode == "none" else EVENTS)
    assert counted.dir_syncs == (0 if mode == "none" else 1)

    points = [("write", k, None) for k in range(1, counted.writes + 1)]
    points += [("write", k, 10) for k in range(1, counted.writes + 1)]
    points += [("sync", k, None) for k in range(1, counted.syncs + 1)]
    points += [("sync-dir", k, None) for k in range(1, counted.dir_syncs + 1)]
    for op, k, short in points:
        code = errno.ENOSPC if k % 2 else errno.EIO
        plan = _FaultPlan(op, nth=k, short=short, errno=code)
        where = root / f"{op}-{k}-{short}"
        log, outcomes = asyncio.run(one_by_one(where, mode, plan))
        assert outcomes[: k - 1] == [None] * (k - 1)
        failed = outcomes[k - 1]
        assert isinstance(failed, kerman.LogWriteError) and os.strerror(code) in str(failed)
        # Poisoned: every later append is refused.
        assert all(isinstance(o, kerman.LogWriteError) for o in outcomes[k:])
        assert len(log) == k
        with pytest.raises(kerman.LogWriteError):
            log.close()
        kept = k - 1
        assert plan.fired == {"op": op, "nth": k, "first_seq": k - 1, "events": 1}
        reopened = kerman.FileStore(where, durability=mode).open("n")
        assert [e.data for e in reopened.events()] == [{"i": i} for i in range(kept)]
        reopened.close()


def test_close_syncs_nothing_more_but_reports_an_earlier_failure(root: Path) -> None:
    """Every batch of a synced mode was synced when written: closing adds no sync. A session
    closed with nothing appended is synced by close (its creation), whose failure it reports;
    so does a close after a failed sync nobody awaited."""
    for mode in ("strict", "checkpoint", "batch"):
        counted = _FaultPlan()
        log, _ = asyncio.run(one_by_one(root / f"{mode}-count", mode, counted))
        before = (counted.writes, counted.syncs, counted.dir_syncs)
        log.close()
        assert (counted.writes, counted.syncs, counted.dir_syncs) == before == (EVENTS, EVENTS, 1), mode

        empty = _FaultPlan()
        kerman.FileStore(root / f"{mode}-empty", durability=mode, _faults=empty).create("e").close()
        assert (empty.writes, empty.syncs, empty.dir_syncs) == (0, 1, 1), mode
        failing = _FaultPlan("sync", at_close=True, errno=errno.EIO)
        log = kerman.FileStore(root / f"{mode}-fail", durability=mode, _faults=failing).create("e")
        with pytest.raises(kerman.LogWriteError, match=os.strerror(errno.EIO)):
            log.close()
        with kerman.FileStore(root / f"{mode}-fail", durability=mode).open("e") as reopened:
            assert len(reopened) == 0, mode  # the header alone: a valid empty session

    async def unawaited() -> kerman.SessionLog:
        log = kerman.FileStore(root / "unawaited", durability="batch", _faults=_FaultPlan("sync", nth=2)).create("u")
        log.append("test/n", {"i": 0})
        await log.flush()
        log.append("test/n", {"i": 1})  # its batch's sync fails; nobody waits for it but close
        return log

    log = asyncio.run(unawaited())
    with pytest.raises(kerman.LogWriteError, match="fsync failed"):
        log.close()


def test_fault_plan_arguments() -> None:
    for bad in [
        dict(op="read", nth=1),
        dict(op="write"),
        dict(op="write", nth=1, seq=2),
        dict(op="write", nth=0),
        dict(op="write", at_close=True),
        dict(op="sync", nth=1, short=3),
        dict(op="sync-dir", nth=1, short=3),
        dict(nth=1),
    ]:
        with pytest.raises(ValueError):
            _FaultPlan(**bad)
    plan = _FaultPlan()
    assert (plan.writes, plan.syncs, plan.dir_syncs, plan.batches, plan.fired) == (0, 0, 0, [], None)


def test_a_wake_on_a_poisoned_log_reports_the_failure_and_starts_nothing(tmp_path: Path) -> None:
    # The first write fails: the pending message's splice poisons the log. The wake's
    # turn/start is refused: reported once as agent/error, the loop stays idle, and wake()
    # says no turn started (it used to return True).
    log = kerman.FileStore(tmp_path, durability="strict", _faults=_FaultPlan("write", seq=0)).create("s")

    async def scenario() -> None:
        loop = kerman.AgentLoop(kerman.models.EchoModel(), log=log)
        errors: List[Any] = []
        loop.on("agent/error", errors.append)
        loop.inject("pending")
        with pytest.raises(kerman.LogWriteError):
            await log.flush()
        assert loop.wake() is False
        assert loop.status == "idle" and loop.turn == 0
        assert [type(e.exception) for e in errors] == [kerman.LogWriteError]
        await loop.when_idle()

    asyncio.run(scenario())
    with pytest.raises(kerman.LogWriteError):
        log.close()


# ---- creation under a descriptor limit -----------------------------------------------------------

CREATE_CHILD = r"""
import errno, json, os, resource, sys
import kerman

root, id = sys.argv[1], sys.argv[2]
store = kerman.FileStore(root, durability="strict")
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 256), hard))
held = []
try:
    while True:
        held.append(os.open(os.devnull, os.O_RDONLY))
except OSError as exc:
    assert exc.errno == errno.EMFILE, exc
# Exactly one descriptor free: the header's temporary file takes it, so whatever needs another
# one afterwards (the directory, held open from before the link until the first sync) fails
# with EMFILE.
os.close(held.pop())
try:
    store.create(id).close()
    first = None
except kerman.LogError as exc:
    first = f"{type(exc).__name__}: {exc}"
for fd in held:
    os.close(fd)
after = {"exists": store.exists(id), "listed": store.list(), "files": sorted(os.listdir(root))}
try:
    log = store.create(id)
    log.append("plugin/x", {"n": 1})
    log.close()
    retry = "created"
except kerman.LogError as exc:
    retry = f"{type(exc).__name__}: {exc}"
print(json.dumps({"first": first, "after": after, "retry": retry}))
"""


@pytest.mark.skipif(os.name != "posix", reason="a descriptor limit (RLIMIT_NOFILE) and a directory sync are POSIX")
def test_a_create_that_fails_after_the_link_leaves_no_session_and_a_retry_creates_it(tmp_path):
    """Creation is atomic: when the last step that can fail (opening the directory for its
    sync at the first flush, here out of descriptors) fails, `create` raises and the session
    does not exist, so the same create again succeeds
    rather than finding the session it said it did not create."""
    import json
    import subprocess
    import sys

    root = tmp_path / "sessions"
    out = subprocess.run([sys.executable, "-c", CREATE_CHILD, str(root), "s-1"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["first"] is not None and "Too many open files" in seen["first"], seen
    assert seen["first"].startswith("LogError: opening directory"), seen
    assert seen["after"] == {"exists": False, "listed": [], "files": []}, seen
    assert seen["retry"] == "created", seen
    log = kerman.FileStore(root).open("s-1")
    assert [e.data for e in log.events(types="plugin/x")] == [{"n": 1}]
    log.close()
