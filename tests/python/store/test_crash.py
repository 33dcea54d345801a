"""Real crash tests: a child process (``crash_child.py``) runs an AgentLoop over a FileStore in
each durability mode and is SIGKILLed at moments chosen by event counts read from its
acknowledgement pipe (never by sleeping). After each kill the session is reopened and checked:

* every event acknowledged by a completed ``flush()`` is present and is byte-for-byte the event
  the child saw (a running CRC-32 over ``Event.to_json()`` is compared at every ack);
* the file has no damage other than a torn tail, and open leaves a balanced history (every
  turn/start has one turn/end, every step/start one step/end, every tool/call one tool/result);
* ``InboxProjection.fold(log.splices())`` succeeds and equals ``Inbox(log)``;
* ``consumed_work(events)`` runs and agrees with an independent fold (reference 4.4);
* every claimed message was entered later, or its turn ended interrupted/aborted/blocked/error;
  in the latter case ``requeue_claimed`` brings it back exactly once;
* a new AgentLoop over the reopened log runs one more turn to completion.

Profiles: 20 kills per mode by default, 200 with ``KERMAN_SLOW=1`` (split into chunks of 20 so
each test stays well under the per-test timeout). ``KERMAN_CRASH_STATS=<file>`` appends one JSON
line per kill (mode, highest ack, events committed in the child as far as it reported, events on
disk, torn tail, requeue) for docs/durability.md.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

import kerman
from conftest import DURABILITIES, read_raw_session, session_path

CHILD = Path(__file__).with_name("crash_child.py")
SLOW = os.environ.get("KERMAN_SLOW") == "1"
KILLS = 200 if SLOW else 20
CHUNK = 20
MAX_EVENTS = 400  # the highest kill point, in acknowledged events (keeps sessions small)

UNFINISHED = {"interrupted", "aborted", "blocked", "error"}


# ---------------------------------------------------------------------------------------------
# Running and killing the child


class ChildDied(AssertionError):
    pass


def parse(line: bytes, acks: List[Tuple[int, int]], commits: List[int]) -> int:
    """One child line: ``a <n> <hash>`` (an ack) or ``c <n>`` (n events committed in memory).
    Returns the ack's n, or 0 for a commit line."""
    parts = line.split()
    if parts[0] == b"a":
        acks.append((int(parts[1]), int(parts[2])))
        return int(parts[1])
    assert parts[0] == b"c", line
    commits.append(int(parts[1]))
    return 0


def run_and_kill(root: Path, mode: str, session_id: str, kill_at: int, errfile: Path) -> Tuple[List[Tuple[int, int]], int]:
    """Starts the child, reads acks until one reaches ``kill_at`` events, SIGKILLs it, and
    returns every ack it wrote (including those still in the pipe after the kill) and the
    highest committed event count it reported."""
    with open(errfile, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, str(CHILD), str(root), mode, session_id], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err
        )
    acks: List[Tuple[int, int]] = []
    commits: List[int] = [0]
    try:
        assert proc.stdout is not None
        while True:
            line = proc.stdout.readline()
            if not line:
                proc.wait()
                raise ChildDied(f"child exited ({proc.returncode}) before ack {kill_at}: " + errfile.read_text(errors="replace")[-4000:])
            if parse(line, acks, commits) >= kill_at:
                break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        for line in proc.stdout.read().splitlines():  # written before the kill landed
            if line.strip():
                parse(line, acks, commits)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL, proc.returncode
    return acks, max(commits)


# ---------------------------------------------------------------------------------------------
# Checks on the reopened log


def disk_state(path: Path) -> Tuple[int, bool]:
    """(valid event records before any damage, whether the file ends in a torn tail).
    Damage followed by a valid record (corruption) fails here."""
    lines = read_raw_session(path)
    assert lines and lines[0][0], "damaged header"
    good = 0
    bad_at: Optional[int] = None
    for i, (ok, rec, raw) in enumerate(lines[1:]):
        valid = ok and rec is not None and raw.endswith(b"\n") and rec.get("seq") == good
        if valid and bad_at is None:
            good += 1
        elif not valid and bad_at is None:
            bad_at = i
        elif bad_at is not None and ok and raw.endswith(b"\n"):
            raise AssertionError(f"corruption: valid record after an invalid one at line {bad_at + 2}")
    return good, bad_at is not None


def check_acks(events: List[kerman.Event], acks: List[Tuple[int, int]]) -> None:
    """Every acknowledged prefix is present and equals what the child saw."""
    top = max(n for n, _ in acks)
    assert len(events) >= top, f"acknowledged {top} events, only {len(events)} after reopen"
    running = 0
    hashes = []
    for ev in events[:top]:
        running = zlib.crc32(ev.to_json().encode("utf-8"), running)
        hashes.append(running)
    for n, h in acks:
        assert hashes[n - 1] == h, f"the acknowledged prefix of {n} events differs after reopen"


def check_balanced(events: List[kerman.Event]) -> None:
    turn: Optional[int] = None
    step: Optional[Tuple[int, int]] = None
    calls: Dict[str, int] = {}
    results: Dict[str, int] = {}
    for ev in events:
        t, d = ev.type, ev.data
        if t == "turn/start":
            assert turn is None, f"turn/start at {ev.seq} inside turn {turn}"
            turn = d["turn"]
        elif t == "turn/end":
            assert turn == d["turn"] and step is None, f"unbalanced turn/end at {ev.seq}"
            turn = None
        elif t == "step/start":
            assert turn == d["turn"] and step is None, f"unbalanced step/start at {ev.seq}"
            step = (d["turn"], d["step"])
        elif t == "step/end":
            assert step == (d["turn"], d["step"]), f"unbalanced step/end at {ev.seq}"
            step = None
        elif t == "tool/call":
            assert step == (d["turn"], d["step"]), f"tool/call outside its step at {ev.seq}"
            assert d["callId"] not in calls, f"duplicate tool/call {d['callId']}"
            calls[d["callId"]] = ev.seq
        elif t == "tool/result":
            assert step == (d["turn"], d["step"]), f"tool/result outside its step at {ev.seq}"
            [block] = [b for b in d["message"]["content"] if b.get("type") == "tool-result"]
            cid = block["toolCallId"]
            assert cid not in results, f"two tool/results for {cid}"
            results[cid] = ev.seq
    assert turn is None and step is None, "the log ends inside a turn after open"
    missing = set(calls) - set(results)
    assert not missing, f"tool/calls without tool/result: {sorted(missing)}"


def fold_consumed_work(events: List[kerman.Event]) -> Tuple[Optional[int], bool]:
    """Reference 4.4, written independently: (seq of end, dropped_unrun)."""
    open_turn = None
    stepped, claimed = set(), set()
    end, dropped = None, False
    for ev in events:
        d = ev.data
        if ev.type == "turn/start":
            open_turn = d["turn"]
        elif ev.type == "step/start":
            stepped.add(d["turn"])
        elif ev.type == "agent/inbox/spliced" and "removedCount" in d:
            if d.get("outcome") == "canceled":
                dropped = dropped or not d.get("inserted")
            elif open_turn is not None:
                claimed.add(open_turn)
        elif ev.type == "turn/end":
            t = d["turn"]
            if t in stepped or (t in claimed and d["reason"]["kind"] != "completed"):
                end, dropped = ev.seq, False
            open_turn = None
    return end, dropped


def claim_accounting(events: List[kerman.Event]) -> Dict[int, List[Tuple[str, str]]]:
    """Checks that every claimed message is explained; returns, per ended-unfinished turn, the
    (target, id) pairs it claimed that never appeared after the claim (what requeue returns)."""
    proj = kerman.InboxProjection()
    turn = None
    claims: List[Tuple[int, int, str, str]] = []  # (seq, turn, target, id)
    for ev in events:
        if ev.type == "turn/start":
            turn = ev.data["turn"]
        if ev.type == "agent/inbox/spliced":
            d = ev.data
            if d.get("removedCount") and "outcome" not in d and not d.get("inserted"):
                assert turn is not None, f"claim at {ev.seq} outside a turn"
                lst = proj.next_turn if d["target"] == "next-turn" else proj.next_step
                for m in lst[d["start"] : d["start"] + d["removedCount"]]:
                    claims.append((ev.seq, turn, d["target"], m.id))
        proj.apply(ev)
    entered: Dict[str, List[int]] = {}
    reinserted: Dict[str, List[int]] = {}
    ends: Dict[int, str] = {}
    for ev in events:
        if ev.type == "user/message":
            entered.setdefault(ev.data["id"], []).append(ev.seq)
        elif ev.type == "agent/inbox/spliced":
            for m in ev.data.get("inserted", ()):
                reinserted.setdefault(m["id"], []).append(ev.seq)
        elif ev.type == "turn/end":
            ends[ev.data["turn"]] = ev.data["reason"]["kind"]
    unentered: Dict[int, List[Tuple[str, str]]] = {}
    for seq, t, target, mid in claims:
        if any(s > seq for s in entered.get(mid, ())):
            continue
        kind = ends.get(t)
        assert kind in UNFINISHED, f"message {mid} claimed at seq {seq} by turn {t} (ended {kind!r}) was never entered"
        if not any(s > seq for s in reinserted.get(mid, ())):
            unentered.setdefault(t, []).append((target, mid))
    return unentered


async def resume_and_run(
    log: kerman.SessionLog, unentered: Dict[int, List[Tuple[str, str]]], completed_turn: Optional[int], ends: Dict[int, str]
) -> Optional[str]:
    """requeue_claimed on the last turn with something to requeue, then one more turn.
    Returns how that turn ended (None when nothing was requeued)."""
    loop = kerman.AgentLoop(kerman.models.EchoModel(), log=log)
    requeued = None
    if completed_turn is not None:
        with pytest.raises(kerman.LoopError):
            loop.requeue_claimed(completed_turn)
    if unentered:
        turn = max(unentered)
        # next-step first, each list in claim order
        expected = [mid for tg, mid in unentered[turn] if tg == "next-step"] + [mid for tg, mid in unentered[turn] if tg == "next-turn"]
        back = loop.requeue_claimed(turn)
        assert [m.id for m in back] == expected
        pending = [m.id for m in loop.inbox.next_step] + [m.id for m in loop.inbox.next_turn]
        for mid in expected:
            assert pending.count(mid) == 1, f"requeued {mid} pending {pending.count(mid)} times"
        with pytest.raises(kerman.LoopError):
            loop.requeue_claimed(turn)
        requeued = ends[turn]
    start = len(log)
    msg = loop.followup("after the crash")
    await loop.when_idle()
    new = list(log.events(start=start))
    assert any(e.type == "user/message" and e.data["id"] == msg.id for e in new)
    kinds = [e.data["reason"]["kind"] for e in new if e.type == "turn/end"]
    assert kinds and all(k == "completed" for k in kinds), kinds
    assert not loop.inbox.has_pending
    await loop.aclose()
    return requeued


async def check_and_resume(log: kerman.SessionLog, events: List[kerman.Event]) -> Optional[str]:
    """The checks every reopened session gets (here after a kill, in test_faults.py after a
    failed write): balanced turns and steps, the inbox projection equal to the live inbox, the
    consumed-work fold, every claimed message accounted for; then `resume_and_run`."""
    check_balanced(events)
    proj = kerman.InboxProjection.fold(log.splices())
    inbox = kerman.Inbox(log)
    assert [m.id for m in proj.next_turn] == [m.id for m in inbox.next_turn]
    assert [m.id for m in proj.next_step] == [m.id for m in inbox.next_step]
    assert list(proj.next_turn) == list(inbox.next_turn)
    assert list(proj.next_step) == list(inbox.next_step)
    inbox.close()  # a log has at most one inbox: the loop below takes it over

    work = kerman.consumed_work(events)
    end, dropped = fold_consumed_work(events)
    assert (work.end.seq if work.end is not None else None) == end
    assert work.dropped_unrun == dropped

    unentered = claim_accounting(events)
    completed = [e.data["turn"] for e in events if e.type == "turn/end" and e.data["reason"]["kind"] == "completed"]
    ends = {e.data["turn"]: e.data["reason"]["kind"] for e in events if e.type == "turn/end"}
    return await resume_and_run(log, unentered, completed[-1] if completed else None, ends)


def check_session(store_root: Path, mode: str, sid: str, acks: List[Tuple[int, int]], committed: int) -> dict:
    on_disk, torn = disk_state(session_path(store_root, sid))
    top = max(n for n, _ in acks)
    assert on_disk >= top, f"acknowledged {top} events, only {on_disk} valid on disk after the kill"
    log = kerman.FileStore(store_root, durability=mode).open(sid)
    try:
        events = list(log.events())
        assert len(events) >= on_disk
        check_acks(events, acks)
        closers = len(events) - on_disk
        requeued = asyncio.run(check_and_resume(log, events))
    finally:
        log.close()
    # the resumed session reopens cleanly with nothing left to close
    again = kerman.FileStore(store_root, durability=mode).open(sid)
    try:
        n = len(again)
        check_balanced(list(again.events()))
        assert len(again) == n
    finally:
        again.close()
    return {
        "mode": mode,
        "ack": top,
        "on_disk": on_disk,
        "beyond_ack": on_disk - top,
        "committed": committed,
        "lost": max(0, committed - on_disk),
        "torn": torn,
        "closers": closers,
        "requeued": requeued,
    }


# ---------------------------------------------------------------------------------------------


def chunks() -> List[Tuple[str, int]]:
    return [(mode, c) for mode in DURABILITIES for c in range((KILLS + CHUNK - 1) // CHUNK)]


@pytest.mark.parametrize("mode,chunk", chunks(), ids=[f"{m}-{c}" for m, c in chunks()])
def test_sigkill(tmp_path, mode, chunk):
    rng = random.Random(f"kerman-crash-{mode}-{chunk}")
    root = tmp_path / "sessions"
    count = min(CHUNK, KILLS - chunk * CHUNK)
    stats = []
    for i in range(count):
        sid = f"crash-{mode}-{chunk}-{i}"
        kill_at = rng.randint(1, MAX_EVENTS)
        acks, committed = run_and_kill(root, mode, sid, kill_at, tmp_path / f"{sid}.err")
        stats.append(check_session(root, mode, sid, acks, committed))
    out = os.environ.get("KERMAN_CRASH_STATS")
    if out:
        with open(out, "a", encoding="utf-8") as f:
            for s in stats:
                f.write(json.dumps(s) + "\n")
