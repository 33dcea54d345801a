"""A worker runs a fork that shares its parent's rows (issue 32): the take reads the fork's
events through its chain (`kerman_session_events`), the model sees the inherited history, and
`store.sessions()` reads the last ending from the parent when the fork has none of its own.
Helpers and the `workers` fixture are test_worker.py's."""

from __future__ import annotations

import signal

from test_worker import audit, events, row, turn_ends, wait_until, workers  # noqa: F401 (a fixture)

from conftest import fresh_schema_dsn, needs_postgres
from kerman import PostgresStore

pytestmark = needs_postgres


def test_a_worker_takes_a_fork_and_runs_it_over_the_inherited_history(workers):  # noqa: F811
    dsn = fresh_schema_dsn()
    store = PostgresStore(dsn)
    store.create("p").close()
    w = workers(dsn, "echo", "--lease-ttl", "5", "--idle-timeout", "1")
    first = store.enqueue("p", "hello parent").id
    wait_until(lambda: turn_ends(store, "p") == ["completed"], "the parent's turn")
    wait_until(lambda: row(store, "p")["owner"] is None, "the parent's release")
    parent = [e.to_json() for e in events(store, "p")]
    store.fork("p", len(parent) - 1, "c")
    # Nothing of its own yet: the last ending is the parent's, read through the chain.
    forked = row(store, "c")
    assert forked["events"] == len(parent) and forked["last_ending"] == "completed"
    second = store.enqueue("c", "hello fork").id
    wait_until(lambda: turn_ends(store, "c") == ["completed", "completed"], "the fork's turn")
    took = [line.split()[1] for line in w.lines if line.startswith("took ")]
    assert took.count("c") == 1
    child = [e.to_json() for e in events(store, "c")]
    assert child[: len(parent)] == parent
    assert [e.to_json() for e in events(store, "p")] == parent, "the parent is unchanged"
    assert w.signal(signal.SIGTERM) == 0, w.stderr_text()
    audit(store, {"p": [first], "c": [first, second]})
