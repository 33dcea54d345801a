"""FileStore logs across ``fork()`` (issue 12, item 9; docs/guide.md, "Processes and fork").

A forked child inherits its parent's open logs. Their writer threads do not exist in the child,
so every use of such a log there (append, flush) is a clear `kerman.LogError` naming the fork,
and closing or dropping it is a quiet no-op (never a Rust panic, never a hang). The session file
descriptor the child inherits is neutralised at fork, so the child never keeps the parent's
lock: once the owner dies, the session can be opened at once, even while the child lives.

Each scenario runs in a child interpreter with a bounded timeout (the failures being tested for
are hangs); synchronisation is by lines on pipes, never sleeps.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from kerman import FileStore, SessionLockedError

DEADLINE = 60  # seconds; only ever reached when something is broken

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")


def run_script(script: str, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert "panic" not in done.stderr.lower(), done.stderr
    return done


USE_IN_CHILD = """
    import asyncio, json, os, sys
    import kerman
    store = kerman.FileStore(sys.argv[1], durability=sys.argv[2])
    log = store.create("s")
    async def flush():
        await asyncio.wait_for(log.flush(), 10)
    log.append("x/e", {"i": 0})
    asyncio.run(flush())
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        out = {}
        try:
            log.append("x/e", {"i": 1})
            out["append"] = "accepted"
        except kerman.KermanError as e:
            out["append"] = [type(e).__name__, str(e)]
        try:
            asyncio.run(flush())
            out["flush"] = "completed"
        except asyncio.TimeoutError:
            out["flush"] = "hung"
        except kerman.KermanError as e:
            out["flush"] = [type(e).__name__, str(e)]
        out["len"] = len(log)
        try:
            log.close()
            out["close"] = "ok"
        except BaseException as e:
            out["close"] = [type(e).__name__, str(e)]
        os.write(w, json.dumps(out).encode())
        os.close(w)
        if sys.argv[3] == "exit":
            os._exit(0)
        # Otherwise an ordinary interpreter exit (atexit, finalizers), with a second log that
        # was never closed in the child.
        sys.exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        child = json.loads(f.read())
    _, status = os.waitpid(pid, 0)
    # The parent's log is unaffected by anything the child did.
    log.append("x/e", {"i": 2})
    asyncio.run(flush())
    log.close()
    with store.open("s") as again:
        parent = [e.data["i"] for e in again.events()]
    print(json.dumps({"child": child, "status": os.waitstatus_to_exitcode(status), "parent": parent}))
"""


@pytest.mark.parametrize("durability", ["strict", "checkpoint", "none"])
@pytest.mark.parametrize("ending", ["interpreter-exit", "exit"])
def test_a_child_using_its_parents_log_gets_a_clear_error(tmp_path, durability, ending):
    done = run_script(USE_IN_CHILD, str(tmp_path), durability, ending)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    child = result["child"]
    for op in ("append", "flush"):
        assert child[op][0] == "LogError", child
        assert "fork" in child[op][1] and '"s"' in child[op][1], child
    assert child["len"] == 1
    assert child["close"] == "ok"
    assert result["status"] == 0, done.stderr
    assert result["parent"] == [0, 2]


HOLD_AFTER_FORK = """
    import os, sys, time
    import kerman
    store = kerman.FileStore(sys.argv[1], durability="none")
    log = store.create("s")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        # The child lives on, holding whatever it inherited, until its stdin closes. It says
        # it runs (so the fork is complete) through a pipe: only the owner writes to stdout.
        os.close(r)
        os.write(w, b"x")
        os.close(w)
        sys.stdin.read()
        os._exit(0)
    os.close(w)
    assert os.read(r, 1) == b"x"
    print(os.getpid(), pid, flush=True)
    sys.stdin.read()
"""


def test_a_forked_child_does_not_keep_a_dead_owners_lock(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(HOLD_AFTER_FORK), str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    child_pid = None
    try:
        owner_pid, child_pid = map(int, proc.stdout.readline().split())
        store = FileStore(tmp_path, durability="none")
        with pytest.raises(SessionLockedError):
            store.open("s")
        os.kill(owner_pid, signal.SIGKILL)
        proc.wait(timeout=DEADLINE)
        # The owner is dead; the child it forked is still alive.
        os.kill(child_pid, 0)
        with store.open("s") as log:
            assert len(log) == 0
    finally:
        if child_pid is not None:
            try:
                os.kill(child_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=DEADLINE)
        proc.stdin.close()
        proc.stdout.close()
        proc.stderr.close()


def test_session_descriptors_are_close_on_exec(tmp_path):
    store = FileStore(tmp_path, durability="none")
    with store.create("s") as log, store.follow("s") as follower:
        if not os.path.isdir("/proc/self/fd"):
            pytest.skip("needs /proc/self/fd")
        target = os.stat(tmp_path / "s.jsonl")
        fds = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                st = os.stat(f"/proc/self/fd/{fd}")
            except OSError:  # the listing's own descriptor
                continue
            if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
                fds.append(int(fd))
        if not fds:
            pytest.skip("needs /proc/self/fd")
        assert len(fds) == 2  # the owner's and the follower's
        assert not any(os.get_inheritable(fd) for fd in fds)
        assert len(log) == len(follower) == 0


FOLLOW_IN_CHILD = """
    import json, os, sys
    import kerman
    store = kerman.FileStore(sys.argv[1], durability="none")
    with store.create("s") as log:
        log.append("x/e", {})
    follower = store.follow("s")
    pid = os.fork()
    if pid == 0:
        try:
            follower.append("x/e", {})
        except kerman.KermanError as e:
            print(type(e).__name__, flush=True)
        follower.close()
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    follower.close()
    print("status", os.waitstatus_to_exitcode(status), flush=True)
"""


def test_a_child_closing_its_parents_follower_does_not_hang(tmp_path):
    done = run_script(FOLLOW_IN_CHILD, str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["LogError", "status 0"]
