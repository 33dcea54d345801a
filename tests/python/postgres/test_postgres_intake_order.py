"""Input one producer enqueues enters the session's owner in the order the producer's `enqueue`
calls returned, whatever the owner's `pool_size`, for both lists (`next-turn`, `next-step`) and
both owners (an `AgentLoop` over a PostgresStore log, a `kerman.Worker`), whoever produces it:
another process (pg_child.py's `producer`), another store of the same process, or the owner's
own store. "Enters" is the order of the `agent/inbox/spliced` events inserting the messages.

A property (Hypothesis, a bounded number of examples) over pool sizes, producers, targets and
wakeups; each example is a fresh session in this test's own schema. Waits are on log state
with a deadline; nothing is timed."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
import warnings
from dataclasses import dataclass
from typing import Callable, Iterator, List

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import kerman
from conftest import fresh_schema_dsn, needs_postgres
from kerman import AgentLoop, PostgresStore
from kerman.models import EchoModel

pytestmark = needs_postgres

# As in model_based/test_inbox_model.py: on a failure Hypothesis' plugin imports this module,
# whose DeprecationWarning the suite's "warnings are errors" would turn into an INTERNALERROR.
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    try:
        import hypothesis.extra._patching  # noqa: F401
    except Exception:  # pragma: no cover - optional dependencies missing
        pass

CHILD = os.path.join(os.path.dirname(__file__), "pg_child.py")
DEADLINE = 30.0
PRODUCERS = ("another-process", "same-process", "owner-store")


@dataclass(frozen=True)
class Case:
    pool: int
    producer: str
    targets: List[str]
    wakeup: bool
    settle: int  # how many messages go first, and enter, before the rest are enqueued at once


cases = st.builds(
    Case,
    pool=st.sampled_from([1, 2, 3, 4, 8]),
    producer=st.sampled_from(PRODUCERS),
    targets=st.lists(st.sampled_from(["next-turn", "next-step"]), min_size=2, max_size=14),
    wakeup=st.booleans(),
    settle=st.integers(0, 2),
)

PROPERTY = settings(
    max_examples=25, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)


class Producer:
    """The other process: one `pg_child.py producer` child for the whole module."""

    def __init__(self, dsn: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, CHILD, "producer", dsn, "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def enqueue(self, id: str, wakeup: bool, targets: List[str]) -> List[str]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{id} {int(wakeup)} {','.join(targets)}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()  # the child answers or exits (EOF): never waits forever
        assert line.startswith("q "), f"the producer child said {line!r} (exit code {self.proc.poll()})"
        return line.split()[1:]

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        code = self.proc.wait(timeout=DEADLINE)
        self.proc.stdout.close()
        assert code == 0


@dataclass
class Env:
    dsn: str
    child: Producer
    local: PostgresStore  # another store of this process

    def produce(self, owner: PostgresStore, id: str, case: Case, targets: List[str]) -> List[str]:
        """Enqueues one message per target, back to back, from `case.producer`: their ids."""
        if not targets:
            return []
        if case.producer == "another-process":
            return self.child.enqueue(id, case.wakeup, targets)
        store = owner if case.producer == "owner-store" else self.local
        return [store.enqueue(id, f"m{i}", target=t, wakeup=case.wakeup).id for i, t in enumerate(targets)]

    async def send(self, owner: PostgresStore, id: str, case: Case, log) -> List[str]:
        """Every message of `case`: the first `case.settle` ones, until they entered `log` (the
        owner listens by then), then the rest at once (the first of them may be staged before
        the owner listens: its first read takes them, notifications bring the others)."""
        first = await asyncio.to_thread(self.produce, owner, id, case, case.targets[: case.settle])
        await until(lambda: set(first) <= set(inserted_ids(log)), "the first messages to enter")
        return first + await asyncio.to_thread(self.produce, owner, id, case, case.targets[case.settle :])


@pytest.fixture
def env() -> Iterator[Env]:
    dsn = fresh_schema_dsn()
    local = PostgresStore(dsn)  # migrates the schema before the child connects
    child = Producer(dsn)
    yield Env(dsn, child, local)
    child.close()


def inserted_ids(log) -> List[str]:
    return [m["id"] for e in log.events(types="agent/inbox/spliced") for m in e.data["inserted"]]


async def until(check: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + DEADLINE
    while not check():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def entered_in_order(log, sent: List[str]) -> None:
    entered = [i for i in inserted_ids(log) if i in set(sent)]
    assert entered == sent, f"entered as {[sent.index(i) for i in entered]}"


@given(case=cases)
@PROPERTY
def test_an_agent_loop_enters_one_producers_input_in_enqueue_order(env: Env, case: Case) -> None:
    note(repr(case))

    async def scenario() -> None:
        owner = PostgresStore(env.dsn, pool_size=case.pool)
        log = owner.create(f"loop-{uuid.uuid4()}")
        loop = AgentLoop(EchoModel(), log=log)
        sent = await env.send(owner, log.id, case, log)
        await until(lambda: set(sent) <= set(inserted_ids(log)), "every message to enter")
        await loop.aclose()
        await log.flush()
        log.close()
        entered_in_order(log, sent)

    asyncio.run(asyncio.wait_for(scenario(), DEADLINE + 10))


@given(case=cases)
@settings(PROPERTY, max_examples=40)  # a worker's turns spread its requests: more tries to catch a misorder
def test_a_worker_enters_one_producers_input_in_enqueue_order(env: Env, case: Case) -> None:
    note(repr(case))

    async def scenario() -> None:
        owner = PostgresStore(env.dsn, pool_size=case.pool)
        id = f"worker-{uuid.uuid4()}"
        env.local.create(id).close()  # nobody owns it: the first message makes it takeable
        worker = kerman.Worker(
            owner, lambda log: AgentLoop(EchoModel(), log=log), idle_timeout=60.0, sweep_interval=60.0, name=f"w-{case.pool}"
        )
        serving = asyncio.ensure_future(worker.run())
        follower = env.local.follow(id)
        sent = await env.send(owner, id, case, follower)
        await until(lambda: set(sent) <= set(inserted_ids(follower)), "every message to enter")
        worker.stop()
        await serving
        follower.close()
        entered_in_order(env.local.follow(id), sent)

    asyncio.run(asyncio.wait_for(scenario(), DEADLINE + 10))
