"""`kerman.Worker` and `kerman worker` (issue 17, part 1) against a real server: workers are real
`kerman worker DSN --app worker_app:<factory>` processes (tests/python/postgres/worker_app.py),
each test in a fresh schema, so no other test's sessions are taken.

The parent synchronises on the children's stdout lines (`took`, `model`, `pre`) and on database
state, each wait bounded by a deadline; no sleep stands in for an event, and no assertion is on
a duration (the takeover time is measured by benches/python/pg_workers.py). Every test ends with
an audit of the tables and logs: each enqueued message inserted and entered exactly once, every
turn balanced."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, Iterable, List, Optional

import pytest

from conftest import fresh_schema_dsn, needs_postgres
from kerman import PostgresStore

pytestmark = needs_postgres

HERE = os.path.dirname(os.path.abspath(__file__))
DEADLINE = 60.0


class WorkerProc:
    """A `kerman worker` child; a thread collects its stdout lines."""

    def __init__(self, dsn: str, app: str = "echo", *args: str, env: Optional[Dict[str, str]] = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kerman", "worker", dsn, "--app", f"worker_app:{app}", *args],
            cwd=HERE,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.pid = self.proc.pid
        self.lines: List[str] = []
        self.err_lines: List[str] = []
        self.cond = threading.Condition()
        self.readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.lines), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.err_lines), daemon=True),
        ]
        for reader in self.readers:
            reader.start()
        # `kerman worker` says it is serving once its SIGTERM handler is installed.
        self.wait_line(lambda line: ": serving " in line, "the worker to start", self.err_lines)

    def _read(self, stream, lines: List[str]) -> None:
        for line in stream:
            with self.cond:
                lines.append(line.rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            lines.append("<eof>")
            self.cond.notify_all()

    def wait_line(self, pred: Callable[[str], bool], what: str, lines: Optional[List[str]] = None) -> str:
        lines = self.lines if lines is None else lines
        end = time.monotonic() + DEADLINE
        seen = 0
        with self.cond:
            while True:
                for line in lines[seen:]:
                    if pred(line):
                        return line
                seen = len(lines)
                if "<eof>" in lines:
                    raise AssertionError(f"worker {self.pid} exited before {what}:\n{self.stderr_text()}")
                left = end - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out waiting for {what}; lines: {self.lines}")
                self.cond.wait(left)

    def stderr_text(self) -> str:
        with self.cond:
            return "\n".join(self.err_lines)

    def signal(self, sig: int) -> int:
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=DEADLINE)
        for reader in self.readers:
            reader.join(DEADLINE)
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=DEADLINE)
        for reader in self.readers:
            reader.join(DEADLINE)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def workers():
    started: List[WorkerProc] = []

    def start(dsn: str, app: str = "echo", *args: str, env: Optional[Dict[str, str]] = None) -> WorkerProc:
        w = WorkerProc(dsn, app, *args, env=env)
        started.append(w)
        return w

    yield start
    for w in started:
        w.close()


def wait_until(check: Callable[[], bool], what: str) -> None:
    """Polls database state until `check()` holds, failing after the deadline."""
    end = time.monotonic() + DEADLINE
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def events(store: PostgresStore, sid: str) -> list:
    log = store.follow(sid)
    try:
        return list(log)
    finally:
        log.close()


def turn_ends(store: PostgresStore, sid: str) -> List[str]:
    return [e.data["reason"]["kind"] for e in events(store, sid) if e.type == "turn/end"]


def row(store: PostgresStore, sid: str) -> dict:
    """The session's `store.sessions()` row, with the `state` `kerman sessions` derives."""
    from kerman.cli._workers import _state

    (r,) = store.sessions(sid)
    r["state"] = _state(r)
    return r


def audit(store: PostgresStore, expected: Dict[str, Iterable[str]]) -> None:
    """Each message of `expected` (session -> message ids) was inserted by exactly one splice and
    entered as exactly one user/message; nothing else was; every turn and step is balanced; no
    message is left staged."""
    for sid, ids in expected.items():
        evs = events(store, sid)
        inserted = [m["id"] for e in evs if e.type == "agent/inbox/spliced" for m in e.data["inserted"]]
        entered = [e.data["id"] for e in evs if e.type == "user/message"]
        want = sorted(ids)
        # A requeue re-inserts a claimed message once: at most two insertions, exactly one entry.
        assert sorted(set(inserted)) == want, (sid, inserted)
        assert sorted(entered) == want, (sid, entered)
        kinds = [e.type for e in evs]
        assert kinds.count("turn/start") == kinds.count("turn/end"), (sid, kinds)
        assert kinds.count("step/start") == kinds.count("step/end"), (sid, kinds)
        assert row(store, sid)["staged"] == 0


def sessions(store: PostgresStore, n: int, prefix: str) -> List[str]:
    ids = [f"{prefix}-{i}" for i in range(n)]
    for sid in ids:
        store.create(sid).close()
    return ids


# ---- taking ------------------------------------------------------------------------------------


@pytest.mark.parametrize("event_loop", ["asyncio", "uvloop"])
def test_input_enqueued_for_unowned_sessions_is_taken_by_exactly_one_of_two_workers(workers, event_loop):
    if event_loop == "uvloop":
        pytest.importorskip("uvloop")
    dsn = fresh_schema_dsn()
    store = PostgresStore(dsn)
    ids = sessions(store, 12, "race")
    a = workers(dsn, "echo", "--lease-ttl", "5", "--idle-timeout", "30", "--event-loop", event_loop)
    b = workers(dsn, "echo", "--lease-ttl", "5", "--idle-timeout", "30", "--event-loop", event_loop)
    sent: Dict[str, List[str]] = {sid: [store.enqueue(sid, f"hello {sid}").id] for sid in ids}
    for sid in ids:
        wait_until(lambda sid=sid: turn_ends(store, sid) == ["completed"], f"the turn of {sid}")
    took = [line.split()[1] for w in (a, b) for line in w.lines if line.startswith("took ")]
    models = [line.split()[3] for w in (a, b) for line in w.lines if line.startswith("model ")]
    # Each session was taken once, by one worker, and each message reached the model once.
    assert sorted(took) == sorted(ids)
    assert sorted(models) == sorted(m for ms in sent.values() for m in ms)
    owners = {r["id"]: r["owner_name"] for r in store.sessions()}
    for sid in ids:
        taker = a if any(line == f"took {sid} {a.pid}" for line in a.lines) else b
        assert owners[sid] is not None and owners[sid].endswith(f":{taker.pid}")
    # Held while idle (idle_timeout 30): more input goes to the same owner, no second take.
    more = store.enqueue(ids[0], "again")
    sent[ids[0]].append(more.id)
    wait_until(lambda: turn_ends(store, ids[0]) == ["completed", "completed"], "the second turn")
    assert sorted(line.split()[1] for w in (a, b) for line in w.lines if line.startswith("took ")) == sorted(ids)
    for w in (a, b):
        assert w.signal(signal.SIGTERM) == 0, w.stderr_text()
    audit(store, sent)
    assert all(r["owner"] is None for r in store.sessions())


def test_an_idle_session_is_released_after_idle_timeout_and_taken_again_for_new_input(workers):
    dsn = fresh_schema_dsn()
    store = PostgresStore(dsn)
    (sid,) = sessions(store, 1, "idle")
    w = workers(dsn, "echo", "--idle-timeout", "0.2")
    first = store.enqueue(sid, "one")
    w.wait_line(lambda line: line.startswith(f"model {sid}"), "the first model call")
    wait_until(lambda: row(store, sid)["owner"] is None, "the idle release")
    # Released only after its turn ended, and with nothing left behind.
    assert turn_ends(store, sid) == ["completed"]
    assert row(store, sid)["staged"] == 0 and not row(store, sid)["runnable"]
    epoch = row(store, sid)["epoch"]
    took = lambda: [line.split()[1] for line in w.lines if line.startswith("took ")]  # noqa: E731
    # Not one take per message: a take let go before its inbox had read the staged input (an
    # idle timeout this short, on a loaded host) is repeated (docs/distributed.md, "Workers").
    taken_before = len(took())
    second = store.enqueue(sid, "two")
    w.wait_line(lambda line: line.startswith(f"model {sid}") and second.id in line, "the second model call")
    assert set(took()) == {sid} and len(took()) > taken_before, w.lines
    assert row(store, sid)["epoch"] > epoch  # a new take, under a new lease
    wait_until(lambda: row(store, sid)["owner"] is None, "the second idle release")
    assert w.signal(signal.SIGTERM) == 0
    audit(store, {sid: [first.id, second.id]})


def test_kerman_worker_freezes_what_exists_at_start_out_of_the_collectors_sight(workers):
    """Modules and the app's imports (a vendor SDK is some 200,000 objects) live as long as the
    process: frozen, every full collection (a pause of every session) skips them."""
    dsn = fresh_schema_dsn()
    store = PostgresStore(dsn)
    (sid,) = sessions(store, 1, "frozen")
    w = workers(dsn, "frozen")
    sent = {sid: [store.enqueue(sid, "hello").id]}
    line = w.wait_line(lambda line: line.startswith("frozen "), "the factory's report")
    # More than kerman's own modules alone (thousands of objects), however the versions vary.
    assert int(line.split()[1]) > 1000, line
    wait_until(lambda: turn_ends(store, sid) == ["completed"], "the turn")
    assert w.signal(signal.SIGTERM) == 0
    audit(store, sent)


def test_input_staged_before_any_worker_starts_is_taken_at_start(workers):
    dsn = fresh_schema_dsn()
    store = PostgresStore(dsn)
    ids = sessions(store, 3, "early")
    sent = {sid: [store.enqueue(sid, "before").id] for sid in ids}
    assert all(r["state"] == "waiting" for r in _rows(store))
    w = workers(dsn, "built_async")
    for sid in ids:
        w.wait_line(lambda line, sid=sid: line.startswith(f"model {sid}"), f"the model call of {sid}")
        wait_until(lambda sid=sid: turn_ends(store, sid) == ["completed"], f"the turn of {sid}")
    assert w.signal(signal.SIGTERM) == 0
    audit(store, sent)


def _rows(store: PostgresStore) -> List[dict]:
    from kerman.cli._workers import session_rows

    return session_rows(store)


# ---- takeover ----------------------------------------------------------------------------------


def test_a_killed_workers_sessions_are_taken_over_with_crash_closers_and_claimed_input_requeued(workers):
    """Worker A dies (SIGKILL) holding two sessions in two states: one inside its model call (the
    message was entered: the turn is closed as interrupted, not run again) and one inside a
    pre_step after the claim (claimed, never entered: requeued by the taker, entered once). B
    takes both over once the leases expire, with no new input.

    One worker holds both, so no other worker runs until A is dead: a second one started while
    A's lease on the first session could lapse (a short TTL, a loaded host) would take that
    session over itself and answer it before B exists (as it did under load)."""
    dsn = fresh_schema_dsn()
    store = PostgresStore(dsn)
    in_model, in_pre = sessions(store, 2, "kill")
    # A's TTL is long enough that a starved A keeps its leases while alive; B waits it out.
    a = workers(dsn, "hang", "--lease-ttl", "5", env={"WORKER_APP_DELAY": "3600", "WORKER_APP_HANG": in_pre})
    entered = store.enqueue(in_model, "entered before the kill")
    claimed = store.enqueue(in_pre, "claimed, never entered")
    a.wait_line(lambda line: line.startswith(f"model {in_model}"), "A's model call")
    a.wait_line(lambda line: line.startswith(f"pre {in_pre}"), "A's pre_step")
    held = {sid: row(store, sid) for sid in (in_model, in_pre)}
    for sid in (in_model, in_pre):
        assert held[sid]["owner_name"].endswith(f":{a.pid}"), held[sid]
    assert sorted(line.split()[1] for line in a.lines if line.startswith("took ")) == sorted((in_model, in_pre)), a.lines
    a.proc.kill()
    a.proc.wait(timeout=DEADLINE)
    b = workers(dsn, "echo", "--lease-ttl", "1")
    for sid in (in_model, in_pre):
        b.wait_line(lambda line, sid=sid: line.startswith(f"took {sid}"), f"B's take of {sid}")
    b.wait_line(lambda line: line.startswith(f"model {in_pre}") and claimed.id in line, "the requeued message")
    wait_until(lambda: turn_ends(store, in_pre) == ["interrupted", "completed"], "the requeued turn")
    # The turn killed in its model call is answered by a continuation, which enters nothing
    # (docs/durability.md, "Crashed turns are answered").
    wait_until(lambda: turn_ends(store, in_model) == ["interrupted", "completed"], "the continuation")
    # The lease moved on (a new epoch fences the dead owner), and the model saw each message once.
    for sid in (in_model, in_pre):
        assert row(store, sid)["epoch"] > held[sid]["epoch"]
    assert [line.split()[3:] for line in b.lines if line.startswith(f"model {in_model}")] == [[]]
    assert b.signal(signal.SIGTERM) == 0
    audit(store, {in_model: [entered.id], in_pre: [claimed.id]})


# ---- drain -------------------------------------------------------------------------------------


def test_a_worker_carries_on_when_the_server_ends_all_its_connections(workers):
    """What a server restart does to a worker: every connection of it (the store's pool and its
    LISTEN connection) is ended at once. Notifications sent while they are down are lost; the
    worker reconnects, LISTENs again and reads what was staged meanwhile, for the sessions it
    holds and for one nobody holds."""
    from conftest import psql

    dsn = fresh_schema_dsn()
    schema = dsn.rsplit("%3D", 1)[1]
    store = PostgresStore(dsn)
    held = sessions(store, 3, "held")
    (free,) = sessions(store, 1, "free")
    w = workers(dsn, "echo", "--idle-timeout", "600")
    sent = {sid: [store.enqueue(sid, "before").id] for sid in held}
    for sid in held:
        wait_until(lambda sid=sid: turn_ends(store, sid) == ["completed"], f"the first turn of {sid}")
    [owner] = psql(f"SELECT DISTINCT owner FROM {schema}.kerman_sessions WHERE owner IS NOT NULL")
    ended = psql(
        f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name IN ('kerman {owner}', 'kerman-listen-{w.pid}')"
    )
    assert len(ended) >= 2, ended  # at least the store's connection and the LISTEN one
    for sid in held:
        sent[sid].append(store.enqueue(sid, "after").id)
    sent[free] = [store.enqueue(free, "after").id]
    for sid in held:
        wait_until(lambda sid=sid: turn_ends(store, sid) == ["completed", "completed"], f"the second turn of {sid}")
    wait_until(lambda: turn_ends(store, free) == ["completed"], "the turn of the session nobody held")
    assert w.signal(signal.SIGTERM) == 0
    audit(store, sent)
    assert all(r["owner"] is None for r in store.sessions())


def test_sigterm_lets_a_short_turn_finish_then_releases_every_lease_and_exits_0(workers):
    dsn = fresh_schema_dsn()
    store = PostgresStore(dsn)
    busy, idle = sessions(store, 2, "drain")
    w = workers(dsn, "echo", "--grace", "30", "--idle-timeout", "300", env={"WORKER_APP_DELAY": "0.5"})
    sent = {idle: [store.enqueue(idle, "done early").id]}
    wait_until(lambda: turn_ends(store, idle) == ["completed"], "the idle session's turn")
    sent[busy] = [store.enqueue(busy, "finishes within the grace").id]
    w.wait_line(lambda line: line.startswith(f"model {busy}"), "the busy session's model call")
    assert {r["id"]: r["state"] for r in _rows(store)} == {busy: "owned", idle: "owned"}
    assert w.signal(signal.SIGTERM) == 0, w.stderr_text()
    assert turn_ends(store, busy) == ["completed"]
    assert all(r["owner"] is None and r["expires_at"] is None for r in store.sessions())
    audit(store, sent)


def test_sigterm_cancels_turns_past_the_grace_and_another_worker_runs_their_pending_input(workers):
    dsn = fresh_schema_dsn()
    store = PostgresStore(dsn)
    (sid,) = sessions(store, 1, "cancel")
    w = workers(dsn, "echo", "--grace", "0.2", env={"WORKER_APP_DELAY": "3600"})
    first = store.enqueue(sid, "runs forever")
    w.wait_line(lambda line: line.startswith(f"model {sid}"), "the model call")
    second = store.enqueue(sid, "waits for the next turn")
    wait_until(lambda: row(store, sid)["staged"] == 0, "the second message's claim")
    assert w.signal(signal.SIGTERM) == 0, w.stderr_text()
    assert turn_ends(store, sid) == ["aborted"]
    r = row(store, sid)
    assert r["owner"] is None and r["runnable"]  # pending input in the log, flagged for a worker
    other = workers(dsn, "echo")
    other.wait_line(lambda line: line.startswith(f"model {sid}") and second.id in line, "the pending turn")
    wait_until(lambda: turn_ends(store, sid) == ["aborted", "completed"], "the second turn")
    assert other.signal(signal.SIGTERM) == 0
    audit(store, {sid: [first.id, second.id]})


# ---- parking -----------------------------------------------------------------------------------


def test_a_session_whose_turns_keep_failing_is_parked_and_new_input_or_unpark_releases_it(workers, capsys):
    from kerman.cli import main

    dsn = fresh_schema_dsn()
    store = PostgresStore(dsn)
    sid, healthy = sessions(store, 2, "park")
    w = workers(dsn, "echo", "--max-failures", "2", "--idle-timeout", "30", env={"WORKER_APP_FAIL": "1"})
    sent = {sid: [store.enqueue(sid, "fails once").id]}
    wait_until(lambda: turn_ends(store, sid) == ["error"], "the first failed turn")
    assert row(store, sid)["status"] == "active"  # one failure: still held
    sent[sid].append(store.enqueue(sid, "fails twice").id)
    wait_until(lambda: row(store, sid)["status"] == "parked", "the park")
    r = row(store, sid)
    assert r["owner"] is None and r["status_detail"] == "2 consecutive failed turns"
    assert turn_ends(store, sid) == ["error", "error"]
    assert main(["sessions", dsn, "show", sid]) == 0
    out = capsys.readouterr().out
    assert "state:          parked" in out and "parked because: 2 consecutive failed turns" in out
    assert main(["sessions", dsn, "list", "--parked"]) == 0
    assert capsys.readouterr().out.split("\n")[1].split()[:2] == [sid, "parked"]
    # New input releases it for one more try: taken again, fails, parked again.
    sent[sid].append(store.enqueue(sid, "fails a third time").id)
    w.wait_line(lambda line: line.startswith(f"model {sid}") and sent[sid][-1] in line, "the try after the park")
    wait_until(lambda: turn_ends(store, sid) == ["error"] * 3 and row(store, sid)["status"] == "parked", "the second park")
    # unpark: active again, and not taken while it has nothing to run.
    assert main(["sessions", dsn, "unpark", sid]) == 0
    assert capsys.readouterr().out.strip() == f"unparked {sid}"
    assert row(store, sid)["status"] == "active" and row(store, sid)["status_detail"] is None
    assert main(["sessions", dsn, "unpark", sid]) == 1
    assert "is not parked" in capsys.readouterr().err
    assert main(["sessions", dsn, "unpark", "nobody"]) == 1
    # Another session is unaffected by the parking.
    sent[healthy] = [store.enqueue(healthy, "fails once, and is held").id]
    wait_until(lambda: turn_ends(store, healthy) == ["error"], "the healthy session's turn")
    assert row(store, healthy)["status"] == "active"
    assert [line.split()[1] for line in w.lines if line.startswith("took ")].count(sid) == 2
    assert w.signal(signal.SIGTERM) == 0
    audit(store, sent)


def test_a_factory_that_fails_parks_the_session_with_its_error(workers):
    dsn = fresh_schema_dsn()
    store = PostgresStore(dsn)
    (sid,) = sessions(store, 1, "broken")
    w = workers(dsn, "broken")
    store.enqueue(sid, "cannot run")
    wait_until(lambda: row(store, sid)["status"] == "parked", "the park")
    assert "factory failed: RuntimeError('the factory cannot build this session')" == row(store, sid)["status_detail"]
    # Staged input is kept (still staged: nothing took it), and the sweep leaves it parked.
    assert row(store, sid)["staged"] == 1
    assert w.signal(signal.SIGTERM) == 0
    assert [line.split()[1] for line in w.lines if line.startswith("took ")] == [sid]


# ---- the API -----------------------------------------------------------------------------------


def test_worker_arguments_are_checked_and_named_in_errors():
    import kerman

    dsn = fresh_schema_dsn()
    store = PostgresStore(dsn, lease_ttl=5.0)

    def factory(log):
        return kerman.AgentLoop(kerman.models.EchoModel(), log=log)

    for kwargs, message in (
        ({"max_sessions": 0}, "max_sessions must be an int >= 1, got 0"),
        ({"max_failures": True}, "max_failures must be an int >= 1, got True"),
        ({"idle_timeout": -1}, "idle_timeout must be a finite number of seconds >= 0, got -1"),
        ({"grace": float("nan")}, "grace must be a finite number of seconds >= 0, got nan"),
        ({"sweep_interval": 0}, "sweep_interval must be a finite number of seconds > 0, got 0"),
        ({"lease_ttl": 30.0}, "lease_ttl=30.0 differs from the store's lease_ttl=5.0"),
        ({"name": ""}, "name must be a non-empty str, got ''"),
    ):
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            kerman.Worker(store, factory, **kwargs)
    with pytest.raises(TypeError, match="factory must be callable"):
        kerman.Worker(store, "app:factory")
    with pytest.raises(TypeError, match="store must be a kerman.PostgresStore or a DSN, got MemoryStore"):
        kerman.Worker(kerman.MemoryStore(), factory)
    worker = kerman.Worker(dsn, factory, lease_ttl=2.5, name="w-1", idle_timeout=0)
    assert worker.lease_ttl == 2.5 and worker.name == "w-1" and worker.sessions == []
    assert repr(worker) == "<Worker 'w-1' idle sessions=0/1000 idle_timeout=0.0 lease_ttl=2.5 grace=30.0>"


def test_a_worker_runs_once_and_stop_before_run_returns_at_once():
    import asyncio

    import kerman

    dsn = fresh_schema_dsn()
    worker = kerman.Worker(dsn, lambda log: kerman.AgentLoop(kerman.models.EchoModel(), log=log))

    async def scenario() -> None:
        worker.stop()  # before run(): run() drains at once
        await asyncio.wait_for(worker.run(), DEADLINE)
        with pytest.raises(kerman.LoopError, match="this Worker is running or has run"):
            await worker.run()

    asyncio.run(scenario())


def test_a_notification_takes_the_session_it_names_not_every_takeable_one():
    """Each worker hears every `kerman_takeable` notification: it takes the session the payload
    names, by primary key, rather than scanning for every takeable session (the sweep does
    that). A session made takeable without a notification is left for the sweep."""
    import asyncio

    import kerman
    from conftest import psql

    dsn = fresh_schema_dsn()
    schema = dsn.rsplit("%3D", 1)[1]
    store = PostgresStore(dsn)
    for sid in ("first", "named", "silent"):
        store.create(sid).close()
    worker = kerman.Worker(
        PostgresStore(dsn, lease_ttl=30.0),
        lambda log: kerman.AgentLoop(kerman.models.EchoModel(), log=log),
        sweep_interval=3600.0,
        idle_timeout=60.0,
        name="w",
    )

    async def until(check: Callable[[], bool], what: str) -> None:
        end = time.monotonic() + DEADLINE
        while not check():
            assert time.monotonic() < end, f"timed out waiting for {what}"
            await asyncio.sleep(0.02)

    async def scenario() -> None:
        serving = asyncio.ensure_future(worker.run())
        # Taken once the worker's first take (a scan) has run: nothing is left for a scan now.
        store.enqueue("first", "hello")
        await until(lambda: turn_ends(store, "first") == ["completed"], "the first session's turn")
        # "silent" gets input nobody announces: enqueued while another store holds it (only the
        # owner's channel hears of it), then freed behind that store's back, so its release
        # (conditional on its epoch) matches nothing and notifies nobody.
        holder = PostgresStore(dsn, lease_ttl=30.0)
        held = holder.open("silent")
        store.enqueue("silent", "nobody announced me")
        psql(f"UPDATE {schema}.kerman_sessions SET owner = NULL, expires_at = NULL, epoch = epoch + 1 WHERE id = 'silent'")
        held.close()
        store.enqueue("named", "hello")
        await until(lambda: turn_ends(store, "named") == ["completed"], "the named session's turn")
        silent = row(store, "silent")
        assert (silent["owner"], silent["staged"], silent["state"]) == (None, 1, "waiting"), silent
        assert worker.stats["taken"] == 2 and sorted(worker.sessions) == ["first", "named"]
        worker.stop()
        await asyncio.wait_for(serving, DEADLINE)

    asyncio.run(scenario())
    # A scan finds it: the first take of another worker.
    sweeper = kerman.Worker(
        PostgresStore(dsn, lease_ttl=30.0), lambda log: kerman.AgentLoop(kerman.models.EchoModel(), log=log), name="sweeper"
    )

    async def sweep() -> None:
        serving = asyncio.ensure_future(sweeper.run())
        end = time.monotonic() + DEADLINE
        while turn_ends(store, "silent") != ["completed"]:
            assert time.monotonic() < end, "the sweep never took the silent session"
            await asyncio.sleep(0.02)
        sweeper.stop()
        await asyncio.wait_for(serving, DEADLINE)

    asyncio.run(sweep())
    assert row(store, "silent")["staged"] == 0


def test_a_released_session_leaves_no_cyclic_garbage():
    """A worker releases thousands of sessions an hour: each must be freed by reference counting
    as it is let go (its loop, its log and what they hold), not left for a full collection,
    which pauses every session of the worker for a time that grows with what it holds."""
    import asyncio
    import gc

    import kerman

    dsn = fresh_schema_dsn()
    store = PostgresStore(dsn)
    ids = sessions(store, 5, "gc")
    worker = kerman.Worker(PostgresStore(dsn), lambda log: kerman.AgentLoop(kerman.models.EchoModel(), log=log), idle_timeout=0.2, name="w")

    async def scenario() -> None:
        serving = asyncio.ensure_future(worker.run())
        gc.collect()
        # No automatic collection meanwhile: whatever forms cycles is still there at the end,
        # where the collection saves (rather than frees) it for the assertion.
        gc.disable()
        try:
            for sid in ids:
                sent[sid] = [store.enqueue(sid, "hello").id]
            end = time.monotonic() + DEADLINE
            while any(turn_ends(store, sid) != ["completed"] for sid in ids) or worker.sessions:
                assert time.monotonic() < end, f"timed out waiting for the turns and releases: {worker.stats}"
                await asyncio.sleep(0.02)
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            kinds = sorted({type(o).__name__ for o in gc.garbage})
            assert not gc.garbage, f"{len(gc.garbage)} objects in cycles after the releases: {kinds}"
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
        worker.stop()
        await asyncio.wait_for(serving, DEADLINE)

    sent: Dict[str, List[str]] = {}
    asyncio.run(scenario())
    audit(store, sent)


def test_a_factory_that_hangs_is_bounded_by_the_grace_period_of_the_drain():
    """An async factory that never finishes (a hung connection in it, say) must not hold the
    drain after SIGTERM, nor the session's lease, which the worker renews while it holds it:
    at the end of the grace period the factory is cancelled and the lease released, with the
    input still staged for another worker."""
    import asyncio

    import kerman

    dsn = fresh_schema_dsn()
    store = PostgresStore(dsn)
    (sid,) = sessions(store, 1, "hang")
    building = asyncio.Event()
    cancelled: List[bool] = []

    async def factory(log):
        building.set()
        try:
            await asyncio.Event().wait()  # never set
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    worker = kerman.Worker(PostgresStore(dsn), factory, grace=0.3, name="w")

    async def scenario() -> None:
        serving = asyncio.ensure_future(worker.run())
        store.enqueue(sid, "hello")
        await asyncio.wait_for(building.wait(), DEADLINE)
        assert row(store, sid)["owner"] is not None
        worker.stop()
        # Bounded well below DEADLINE: the grace is 0.3 s.
        await asyncio.wait_for(serving, 20.0)

    asyncio.run(scenario())
    assert cancelled == [True]
    r = row(store, sid)
    assert r["owner"] is None and r["staged"] == 1, r
    assert worker.stats["released"] == 1


def test_input_sent_while_a_step_waits_for_a_decision_leaves_the_worker_responsive():
    """A turn whose step waits for a decision holds the session's input for after it. Input
    that arrives meanwhile (a user typing while an approval is pending) must not make the
    worker's session task spin: it once went round its loop without awaiting anything for as
    long as the step waited, blocking the event loop and with it every session of the worker
    (a decision, which resumes the step on that event loop, could not land either).

    The message arrives while the model is called (held until the test has seen it in the log),
    so it is pending when the step starts waiting. The worker's event loop runs in a thread, so
    a blocked loop fails the probe instead of hanging the test."""
    import asyncio
    import json

    import kerman
    from kerman.decisions import pending

    dsn = fresh_schema_dsn()
    store = PostgresStore(dsn)
    (sid,) = sessions(store, 1, "waits")
    in_model, go_on = threading.Event(), threading.Event()
    paid: List[int] = []

    async def model(request):
        if request.step > 1:
            yield {"type": "text-delta", "text": "done"}
            return
        text = request.entered[-1].text if request.entered else ""
        if not text.startswith("pay "):
            yield {"type": "text-delta", "text": f"echo: {text}"}
            return
        in_model.set()
        assert await asyncio.to_thread(go_on.wait, DEADLINE), "the test never let the model reply"
        yield {"type": "tool-call", "id": "call-1", "name": "pay", "arguments": json.dumps({"amount": int(text.split()[1])})}

    def factory(log):
        loop = kerman.AgentLoop(model, log=log)

        @loop.tool(needs_approval=True)
        async def pay(amount: int) -> str:
            """Pays."""
            paid.append(amount)
            return "paid"

        return loop

    worker = kerman.Worker(PostgresStore(dsn), factory, idle_timeout=60.0, name="w")
    running: List[asyncio.AbstractEventLoop] = []
    started = threading.Event()

    async def serve() -> None:
        running.append(asyncio.get_running_loop())
        started.set()
        await worker.run()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    assert started.wait(DEADLINE)
    (event_loop,) = running
    follower = store.follow(sid)
    blocked = False
    try:
        first = store.enqueue(sid, "pay 3")
        assert in_model.wait(DEADLINE), "the worker never called the model"
        second = store.enqueue(sid, "and after that")
        inserted = lambda: [m["id"] for e in follower.events() if e.type == "agent/inbox/spliced" for m in e.data["inserted"]]  # noqa: E731
        wait_until(lambda: second.id in inserted(), "the owner's inbox to take the second message")
        go_on.set()
        wait_until(lambda: pending(follower), "the step to ask")
        [request] = pending(follower)
        # The worker's event loop still runs its tasks while the step waits.
        probe = asyncio.run_coroutine_threadsafe(asyncio.sleep(0), event_loop)
        try:
            probe.result(DEADLINE)
        except TimeoutError:
            blocked = True  # nothing stops a loop that never awaits: its thread is left to the exit
            raise AssertionError("the worker's event loop is blocked while the step waits for its decision") from None
        answer = store.decide(sid, request.decision_id, kerman.Approve(), key="k")
        assert answer["applied"] is True, answer
        wait_until(lambda: turn_ends(store, sid) == ["completed", "completed"], "the paid turn, then the second message's")
        assert paid == [3]
    finally:
        worker.stop()
        if not blocked:
            thread.join(DEADLINE)
        follower.close()
    assert not thread.is_alive()
    audit(store, {sid: [first.id, second.id]})
