"""The benchmark script runs, and its pure-Python baseline is honest about the inbox.

No timing assertions here: benchmarks are programs (``make bench``), not tests.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, List, Tuple

import pytest

import kerman

BENCHES = Path(__file__).resolve().parents[3] / "benches" / "python"
sys.path.insert(0, str(BENCHES))

import baseline  # noqa: E402


@pytest.mark.timeout(300)
def test_quick_bench_prints_a_table(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCHES / "bench.py"), "--quick", "--only", "P1,P2", "--reps", "1", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| P")]
    assert [row.split("|")[1].strip() for row in rows] == ["P1", "P2"], done.stdout
    assert all(len(row.split("|")) == 10 for row in rows), done.stdout
    assert "machine:" in done.stdout
    assert not list(tmp_path.glob("run-*")), "the per-run work directory is removed"


UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


def _ops(inbox: Any, make: Callable[..., Any]) -> List[Tuple[str, Any]]:
    """One operation sequence covering every inbox method; returns what each call returned."""
    a, b, c, d, e = (make(f"text {k}", id=k) for k in "abcde")
    plugin = make([{"type": "text", "text": "ctx"}], source={"kind": "plugin", "plugin": "guard"}, id="p")
    out: List[Tuple[str, Any]] = []

    def ids(value: Any) -> Any:
        return [m.id for m in value] if isinstance(value, list) else getattr(value, "id", value)

    def call(name: str, *args: Any) -> None:
        try:
            out.append((name, ids(getattr(inbox, name)(*args))))
        except ValueError as exc:  # DuplicateMessageError in both
            out.append((name, f"raised {exc}"))

    call("append", "next-turn", a)
    call("append", "next-turn", "minted")
    call("prepend", "next-turn", b)
    call("append", "next-step", plugin)
    call("append", "next-turn", a)  # duplicate pending id
    call("splice", "next-turn", 1, 0, [c, d])
    call("splice", "next-turn", -1, 1, [])
    call("splice", "next-turn", 10, 5, [e])  # start clamps to len
    call("splice", "next-turn", -10, 0, [])  # no-op: no event
    call("splice", "next-step", 0, -3, [])  # negative delete count: no-op
    call("replace", "c", make("c rewritten", id="c"))
    call("replace", "d", make("d renamed", id="d2"))
    call("replace", "e", make("dup", id="a"))  # the new id is pending elsewhere
    call("replace", "zzz", make("nothing", id="y"))
    call("remove", "b")
    call("remove", "b")
    call("claim", "next-turn", 1)
    call("append", "next-step", b)
    call("claim", "next-step", 1)
    call("claim", "next-step", 1)  # nothing pending there: no event
    call("append", "next-step", c)
    call("clear")
    call("clear")
    call("append", "next-turn", a)
    return out


def _spliced(log: Any) -> Any:
    events = [json.loads(ev.to_json()) for ev in log.events()]
    assert {ev["type"] for ev in events} <= {"agent/inbox/spliced"}
    return _redact([ev["data"] for ev in events])


def _redact(value: Any) -> Any:
    return json.loads(UUID.sub("<minted>", json.dumps(value)))


def test_baseline_inbox_logs_the_same_splices_as_kerman() -> None:
    klog = kerman.MemoryStore().create()
    blog = baseline.MemoryStore().create()
    kinbox = kerman.Inbox(klog)
    binbox = baseline.Inbox(blog)
    kout = _ops(kinbox, kerman.UserMessage)
    bout = _ops(binbox, baseline.UserMessage)

    assert _redact(bout) == _redact(kout)
    assert _spliced(blog) == _spliced(klog)
    assert len(_spliced(klog)) > 15
    assert [m.id for m in binbox.next_turn] == [m.id for m in kinbox.next_turn]
    assert [m.id for m in binbox.next_step] == [m.id for m in kinbox.next_step]

    # Both replay their own log to the same lists (Kerman's log has at most one inbox).
    kinbox.close()
    assert [m.id for m in baseline.Inbox(blog).next_turn] == [m.id for m in kerman.Inbox(klog).next_turn]
