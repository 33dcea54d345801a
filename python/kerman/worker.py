"""``kerman.Worker``: serves the sessions of a PostgreSQL store from one process.

A worker takes sessions that have input waiting and no live owner (or whose owner died), runs
each one's ``AgentLoop`` until it is idle, and lets it go after ``idle_timeout`` without input,
so the next input can go to any worker. Sessions whose turns keep failing are parked. ``stop()``
(SIGTERM under ``kerman worker``) drains: no more takes, running turns finish or are cancelled
within ``grace``, every lease is released. docs/distributed.md, "Workers", has the model.

The SQL (the take query with ``FOR UPDATE SKIP LOCKED``, park, the ``kerman_takeable``
channel) is in the Rust core (``src/event_log/postgres/sql.rs``); this module is the asyncio
runtime around it: one task per session on the caller's event loop. Every store call here is
an awaitable completed by the store's reply thread, so the event loop never waits on I/O.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import socket
from typing import Any, Awaitable, Callable, Dict, List, Optional, Union

from . import _continuation, _core, _doubt, events
from .errors import LoopError
from .loop import AgentLoop

__all__ = ["Worker"]

logger = logging.getLogger("kerman.worker")

Factory = Callable[[_core.SessionLog], Union[AgentLoop, Awaitable[AgentLoop]]]

# Turn endings that count as a failed turn for parking: the turn raised, or its process died
# inside it (a session that kills its worker must not take every worker down in turn).
FAILED_ENDINGS = ("error", "interrupted")


def _ending(event: _core.Event) -> str:
    view = events.view(event)
    return (view.reason.kind or "") if isinstance(view, events.TurnEnd) else ""


def _seconds(name: str, value: Any, *, zero: bool = False) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or value != value
        or value in (float("inf"), float("-inf"))
        or value < 0
        or (value == 0 and not zero)
    ):
        bound = ">= 0" if zero else "> 0"
        raise ValueError(f"{name} must be a finite number of seconds {bound}, got {value!r}")
    return float(value)


class _Session:
    """One taken session: its log, lease epoch and loop, and what its task waits on."""

    __slots__ = (
        "log",
        "epoch",
        "agent",
        "failures",
        "ended",
        "seen",
        "nudge",
        "fenced",
        "task",
        "leaving",
        "building",
        "expired",
        "closers",
        "taken_len",
    )

    def __init__(self, log: _core.SessionLog, epoch: int, closers: int) -> None:
        self.log = log
        self.epoch = epoch
        self.agent: Optional[AgentLoop] = None
        self.failures = 0
        # Turns that ended while this worker held the session (the take's crash closers end
        # one): parking waits for one, so a parked session given new input gets one more try.
        self.ended = 1 if closers else 0
        self.seen = 0  # events already counted for failures
        self.nudge: Optional[asyncio.Future[None]] = None
        self.fenced = False
        self.task: Optional[asyncio.Task[None]] = None
        # Being let go: a notification naming it (its release left input) is for a new take.
        self.leaving = False
        self.building = False  # an async factory is building its loop
        self.expired = False  # ... and was cancelled at the end of the drain's grace period
        # The take's crash closers are the last `closers` of the first `taken_len` events (the
        # loop's inbox may append staged input before the takeover is logged).
        self.closers = closers
        self.taken_len = len(log)

    def poke(self) -> None:
        """Wakes the session's task from its wait (a turn started, a stop, a fence)."""
        nudge = self.nudge
        if nudge is not None and not nudge.done():
            nudge.set_result(None)


class Worker:
    """Runs the sessions of a ``PostgresStore`` that have input and no live owner.

    ``store``: a ``PostgresStore`` (its ``lease_ttl`` is the worker's) or a DSN (then the worker
    makes one with ``lease_ttl``, default 30 s). ``factory(log)`` builds the ``AgentLoop`` of a
    taken session over ``log`` (model, tools, listeners); it may be async. ``max_sessions``
    bounds the sessions held at once; ``idle_timeout`` (seconds) is how long an idle session
    is kept for more input before its lease is released (a session whose turn waits for
    decisions is kept until its status changes); ``grace`` (seconds) is how long
    ``stop()`` lets running turns finish before cancelling them; a session whose last
    ``max_failures`` turns failed (ended ``error``, or ``interrupted`` by a dead worker) is
    parked. ``sweep_interval`` (seconds) is how often the worker looks for takeable sessions
    without being told; it also looks right after the next lease held by another owner
    expires (a dead owner's lease lapses without a notification). ``name`` is shown as the owner
    in ``kerman sessions`` (default ``host:pid``).

    ``stats`` counts the sessions ``taken``, ``released`` and ``parked``, the messages
    ``requeued`` and the turns ``cancelled`` by a drain.

    Input a turn claimed but never entered is requeued (``AgentLoop.requeue_claimed``) when
    that turn was interrupted by a crash (found at take) or cancelled by this worker's drain;
    never for turns a plugin blocked or someone else cancelled. The loops resume with
    ``"continue"`` unless the factory's loop chose ``AgentLoop(resume="close")``: a taken
    session whose last turn a crash interrupted with its input unanswered runs a continuation
    first (docs/durability.md, "Crashed turns are answered"); ``max_failures`` crashed turns in
    a row park it instead.
    """

    def __init__(
        self,
        store: Any,
        factory: Factory,
        *,
        max_sessions: int = 1000,
        idle_timeout: float = 30.0,
        lease_ttl: Optional[float] = None,
        grace: float = 30.0,
        max_failures: int = 3,
        sweep_interval: float = 1.0,
        name: Optional[str] = None,
        take_batch: int = 64,
    ) -> None:
        store_cls = _core.PostgresStore
        if not callable(factory):
            raise TypeError(f"factory must be callable (factory(log) -> AgentLoop), got {type(factory).__name__}")
        for label, value in (("max_sessions", max_sessions), ("max_failures", max_failures), ("take_batch", take_batch)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{label} must be an int >= 1, got {value!r}")
        self._idle_timeout = _seconds("idle_timeout", idle_timeout, zero=True)
        self._grace = _seconds("grace", grace, zero=True)
        self._sweep_interval = _seconds("sweep_interval", sweep_interval)
        if isinstance(store, str):
            store = store_cls(store, lease_ttl=30.0 if lease_ttl is None else _seconds("lease_ttl", lease_ttl))
        elif not isinstance(store, store_cls):
            raise TypeError(f"store must be a kerman.PostgresStore or a DSN, got {type(store).__name__}")
        elif lease_ttl is not None and _seconds("lease_ttl", lease_ttl) != store.lease_ttl:
            raise ValueError(
                f"lease_ttl={lease_ttl!r} differs from the store's lease_ttl={store.lease_ttl!r}: "
                "the store renews the leases (PostgresStore(dsn, lease_ttl=...))"
            )
        if name is not None and (not isinstance(name, str) or not name):
            raise ValueError(f"name must be a non-empty str, got {name!r}")
        self._store = store
        self._factory = factory
        self._max_sessions = max_sessions
        self._max_failures = max_failures
        self._take_batch = take_batch
        self._name = name or f"{socket.gethostname()}:{os.getpid()}"
        self._sessions: Dict[str, _Session] = {}
        self._event_loop: Optional[asyncio.AbstractEventLoop] = None
        self._wanted: Optional[asyncio.Event] = None
        self._stopping = False
        self._deadline = 0.0
        self._done = False
        self._expiry_at: Optional[float] = None
        self._swept = True  # the next take is a sweep's: it reads the next expiry
        # What the next take looks at: every candidate (a sweep, a re-LISTEN, room again), or
        # only the sessions notifications named since the last take (by primary key).
        self._scan = True
        self._named: Dict[str, None] = {}
        self._rearmed: Optional[asyncio.Future[None]] = None
        self.stats: Dict[str, int] = {"taken": 0, "released": 0, "parked": 0, "requeued": 0, "cancelled": 0}

    # ---- properties -------------------------------------------------------------------------

    @property
    def store(self) -> Any:
        return self._store

    @property
    def name(self) -> str:
        return self._name

    @property
    def sessions(self) -> List[str]:
        """Ids of the sessions this worker holds now."""
        return list(self._sessions)

    @property
    def lease_ttl(self) -> float:
        return float(self._store.lease_ttl)

    def __repr__(self) -> str:
        state = "stopping" if self._stopping else ("running" if self._event_loop is not None else "idle")
        return (
            f"<Worker {self._name!r} {state} sessions={len(self._sessions)}/{self._max_sessions} "
            f"idle_timeout={self._idle_timeout} lease_ttl={self.lease_ttl} grace={self._grace}>"
        )

    # ---- running ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Serves sessions until ``stop()``; then drains (see the class) and returns."""
        if self._event_loop is not None or self._done:
            raise LoopError("this Worker is running or has run; make a new one")
        self._event_loop = asyncio.get_running_loop()
        self._wanted = asyncio.Event()
        self._wanted.set()  # a first take at once: input may be waiting already
        helpers = [asyncio.ensure_future(self._listen()), asyncio.ensure_future(self._sweep())]
        try:
            while True:
                await self._wanted.wait()
                self._wanted.clear()
                if self._stopping:
                    break
                swept, self._swept = self._swept, False
                scan, self._scan = self._scan or swept, False
                named, self._named = self._named, {}
                await self._take(swept, scan, named)
        finally:
            for helper in helpers:
                helper.cancel()
            self._stopping = True
            if not self._deadline:
                self._deadline = self._event_loop.time() + self._grace
            await self._drain()
            self._done = True

    def stop(self) -> None:
        """Stops taking sessions and drains (``run()`` then returns). Safe from a signal handler
        or another thread; idempotent."""
        loop = self._event_loop
        if loop is None:
            self._stopping = True
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._stop()
        else:
            loop.call_soon_threadsafe(self._stop)

    def _stop(self) -> None:
        if self._stopping:
            return
        assert self._event_loop is not None and self._wanted is not None
        logger.info("worker %s stopping: %d session(s) to release within %.1f s", self._name, len(self._sessions), self._grace)
        self._stopping = True
        self._deadline = self._event_loop.time() + self._grace
        self._wanted.set()
        for session in self._sessions.values():
            session.poke()

    async def _listen(self) -> None:
        """Wakes the take loop on each ``kerman_takeable`` notification (or re-LISTEN), with the
        sessions they named (all of those that arrived together go into one take)."""
        assert self._wanted is not None
        while True:
            ids = await self._store._takeable()
            if ids is None:
                self._scan = True
            else:
                # Held here already (a notification racing our own take): nothing to take.
                for sid in ids:
                    if not self._holds(sid):
                        self._named[sid] = None
                if not self._named and not self._scan:
                    continue
            self._wanted.set()

    async def _sweep(self) -> None:
        """Looks again every ``sweep_interval``, and right after the next lease held by another
        owner expires: a dead owner's lease lapses without a notification (and notifications
        can be lost)."""
        assert self._wanted is not None and self._event_loop is not None
        while True:
            delay = self._sweep_interval
            if self._expiry_at is not None:
                delay = max(0.0, min(delay, self._expiry_at - self._event_loop.time()))
            rearmed = self._rearmed = self._event_loop.create_future()
            await asyncio.wait((rearmed,), timeout=delay)
            if not rearmed.done():
                self._expiry_at = None
                self._swept = True
                self._scan = True
                self._wanted.set()

    def _rearm(self, expiry: Optional[float]) -> None:
        """A take reported when another owner's lease next expires: the sweep waits for that."""
        assert self._event_loop is not None
        # A little after, so the lease has expired by the server's clock too.
        self._expiry_at = None if expiry is None else self._event_loop.time() + expiry + 0.005
        if self._rearmed is not None and not self._rearmed.done():
            self._rearmed.set_result(None)

    async def _take(self, swept: bool, scan: bool, named: Dict[str, None]) -> None:
        """Takes the sessions notifications named (by primary key, a batch per statement), and
        when scanning, any takeable ones while takes come back full. Only a sweep (or the first
        take) asks for the next expiry: every worker hears each notification, so those takes
        are kept to one statement."""
        expiry = swept
        ids = [sid for sid in named if not self._holds(sid)]
        while not self._stopping and (ids or scan):
            room = self._max_sessions - len(self._sessions)
            if room <= 0:
                self._scan = True  # the named ones wait for room (taken by the take then)
                return
            limit = min(room, self._take_batch)
            batch: Optional[List[str]] = None
            if ids and not scan:
                batch, ids = ids[:limit], ids[limit:]
            try:
                taken, next_expiry = await self._store._take(limit, self._name, expiry, batch)
            except Exception:
                # The store reconnects by itself; the next sweep tries again.
                logger.exception("worker %s: taking sessions failed", self._name)
                return
            if expiry:
                self._rearm(next_expiry)
                expiry = False
            for log, epoch, closers in taken:
                self._start(log, epoch, closers)
            if batch is None and len(taken) < limit:
                return

    def _holds(self, sid: str) -> bool:
        session = self._sessions.get(sid)
        return session is not None and not session.leaving

    def _start(self, log: _core.SessionLog, epoch: int, closers: int) -> None:
        session = _Session(log, epoch, closers)
        self._sessions[log.id] = session
        self.stats["taken"] += 1
        session.task = asyncio.ensure_future(self._serve(session))

    async def _drain(self) -> None:
        tasks = [s.task for s in self._sessions.values() if s.task is not None]
        if not tasks:
            return
        assert self._event_loop is not None
        # A running turn is cancelled by its session's task at the deadline (_until_idle); an
        # async factory still running then is cancelled here: it would hold the drain, and the
        # lease it renews, for as long as it hangs.
        timer = self._event_loop.call_at(self._deadline, self._expire_builds)
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            timer.cancel()

    def _expire_builds(self) -> None:
        for session in self._sessions.values():
            if session.building and session.task is not None and not session.task.done():
                session.expired = True
                session.task.cancel()

    # ---- one session ------------------------------------------------------------------------

    async def _serve(self, session: _Session) -> None:
        log = session.log
        try:
            try:
                agent = self._factory(log)
                if inspect.isawaitable(agent):
                    session.building = True
                    try:
                        agent = await agent
                    except asyncio.CancelledError:
                        if not session.expired:
                            raise
                        # The drain's grace period ran out while an async factory still ran
                        # (see _drain): the session goes back, its lease released.
                        logger.warning(
                            "worker %s: the factory of session %r did not finish within the grace period; releasing the session",
                            self._name,
                            log.id,
                        )
                        await self._release(session)
                        return
                    finally:
                        session.building = False
                if not isinstance(agent, AgentLoop):
                    raise TypeError(f"factory(log) must return an AgentLoop, got {type(agent).__name__}")
                if agent.log is not log:
                    raise ValueError("factory(log) must build the AgentLoop over the log it was given")
                # Crashed turns are answered: "continue" unless the factory's loop chose.
                _continuation.adopt(agent, self._max_failures)
            except Exception as exc:
                logger.exception("worker %s: factory failed for session %r; parking it", self._name, log.id)
                await self._park(session, f"factory failed: {exc!r}", runnable=True)
                return
            session.agent = agent
            await self._run(session)
        except Exception:
            logger.exception("worker %s: session %r failed; releasing it", self._name, log.id)
            if not log.closed:
                await self._release(session)
        finally:
            full = len(self._sessions) >= self._max_sessions
            if self._sessions.get(log.id) is session:
                self._sessions.pop(log.id)
            # The session, its task and its loop's listeners (closures over the session) refer
            # to each other: unlinked, a released session is freed by reference counting at
            # once instead of waiting, with its loop and log, for a full garbage collection
            # (each of which pauses every session of the worker).
            session.agent = None
            session.task = None
            if full and self._wanted is not None:
                self._scan = True
                self._wanted.set()  # room again: input may have waited for it

    async def _run(self, session: _Session) -> None:
        agent = session.agent
        assert agent is not None
        session.failures = self._count_failures(session, 0, at_take=True)

        def on_status(event: Any) -> None:
            # Every change ends the session's wait: a turn starting or a held step resuming
            # ("running"), and a waiting turn ended without running again ("idle": a resolve
            # answered its request), which the wait below would otherwise never hear of.
            session.poke()

        def on_error(event: Any) -> None:
            error = event.error if isinstance(event.error, dict) else {}
            if error.get("code") == "FENCED":
                session.fenced = True
                session.poke()

        agent.on("agent/status", on_status)
        agent.on("agent/error", on_error)
        self._log_takeover(session)
        self._requeue_interrupted(session)
        while True:
            # Input is pending, or the last turn crashed with calls in doubt that a resume
            # settles (docs/durability.md#calls-in-doubt), or its waiting step has calls that
            # need no decision and have no result yet (docs/decisions.md#waiting).
            resumable = agent.inbox.has_pending or agent._core.resumable
            startable = agent.status == "idle" and resumable or agent.status == "waiting" and agent._core.resumable
            if startable and not self._stopping and not session.fenced:
                if not agent.wake() and agent.status == "idle":
                    # The log refused turn/start (reported as agent/error): let another try.
                    logger.warning("worker %s: session %r has input but no turn starts; releasing it", self._name, session.log.id)
                    break
            if agent.status == "running":
                await self._until_idle(session)
            session.failures = self._count_failures(session, session.failures)
            if session.fenced:
                await self._let_go_fenced(session)
                return
            if session.failures >= self._max_failures and session.ended:
                detail = f"{session.failures} consecutive failed turns"
                await self._park(session, detail, runnable=agent.inbox.has_pending)
                return
            if self._stopping:
                break
            waiting = agent.status == "waiting"
            # Input pending behind a step that waits for decisions waits for that turn: going
            # round again would not start it, and this loop must await between its rounds.
            if agent.inbox.has_pending and not waiting:
                continue
            # Idle: keep the session for more input, until the idle timeout. Waiting: hold it
            # until its status changes (a decision, a cancel, an expiry, a resolve) or a stop.
            poked = await self._wait(session, None if waiting else self._idle_timeout)
            if not poked and agent.status == "idle" and not agent.inbox.has_pending:
                break
        await self._release(session)

    async def _wait(self, session: _Session, timeout: Optional[float]) -> bool:
        """Waits for a poke (a turn starting, a stop, a fence) or ``timeout``; True if poked."""
        assert self._event_loop is not None
        nudge = self._event_loop.create_future()
        session.nudge = nudge
        try:
            if self._stopping or session.fenced or (session.agent is not None and session.agent.status == "running"):
                return True
            await asyncio.wait((nudge,), timeout=timeout)
            return nudge.done()
        finally:
            session.nudge = None

    async def _until_idle(self, session: _Session) -> None:
        """Waits for the running turns to end; once stopping, for at most the rest of the grace
        period, then cancels them (pending input kept) and requeues what they claimed."""
        agent = session.agent
        assert agent is not None and self._event_loop is not None
        # Never cancelled while the turn runs (a fenced loop goes idle by itself): the wait is
        # only ever left once the loop is idle.
        idle = asyncio.ensure_future(agent.when_idle())
        try:
            while not idle.done():
                if not self._stopping:
                    session.nudge = self._event_loop.create_future()
                    await asyncio.wait((idle, session.nudge), return_when=asyncio.FIRST_COMPLETED)
                    session.nudge = None
                    continue
                remaining = self._deadline - self._event_loop.time()
                if remaining > 0:
                    await asyncio.wait((idle,), timeout=remaining)
                if idle.done():
                    break
                turn = agent.turn
                agent.cancel("disposed", keep_inbox=True)
                self.stats["cancelled"] += 1
                await idle
                self._requeue(session, turn)
        finally:
            if not idle.done():
                idle.cancel()

    def _count_failures(self, session: _Session, failures: int, at_take: bool = False) -> int:
        """Consecutive failed turns, from the turn ends appended since the last count (at the
        take: the whole log, as left by earlier owners)."""
        log = session.log
        end = len(log)
        for event in log.events(session.seen, types=events.TURN_END):
            failures = failures + 1 if _ending(event) in FAILED_ENDINGS else 0
            if not at_take:
                session.ended += 1
        session.seen = end
        return failures

    def _log_takeover(self, session: _Session) -> None:
        """An INFO line for a session its last owner left inside a turn: the calls in doubt
        found and the policy each gets (docs/durability.md#calls-in-doubt)."""
        agent = session.agent
        assert agent is not None
        open_calls = agent.in_doubt
        if not session.closers and not open_calls:
            return
        taken = list(session.log.events(start=session.taken_len - session.closers, stop=session.taken_len)) if session.closers else []
        # The closers cite the calls they fail: read those calls' records for their policies.
        cited = {s for e in taken for s in (e.source_event_seqs or [])}
        calls = [e for s in sorted(cited) for e in session.log.events(start=s, stop=s + 1)]
        line = _doubt.takeover(calls + taken, len(taken), open_calls)
        if line is not None:
            logger.info("worker %s: took over session %r: %s", self._name, session.log.id, line)

    def _requeue_interrupted(self, session: _Session) -> None:
        """The claimed-but-unentered policy at take: input the crashed turn claimed comes back."""
        ends = list(session.log.events(types=events.TURN_END))
        if ends and _ending(ends[-1]) == "interrupted":
            self._requeue(session, events.TurnEnd(ends[-1]).turn)

    def _requeue(self, session: _Session, turn: Any) -> None:
        agent = session.agent
        if agent is None or not isinstance(turn, int) or turn < 1:
            return
        try:
            requeued = agent.requeue_claimed(turn)
        except LoopError:
            return  # nothing claimed and unentered, or requeued already
        self.stats["requeued"] += len(requeued)
        logger.info(
            "worker %s: session %r: requeued %d message(s) turn %d claimed but never entered",
            self._name,
            session.log.id,
            len(requeued),
            turn,
        )

    # ---- letting go -------------------------------------------------------------------------

    async def _close_agent(self, session: _Session) -> bool:
        """Closes the loop (its inbox stops taking staged input); True if input is pending."""
        agent = session.agent
        if agent is None:
            return False
        try:
            await agent.aclose()
        except Exception:
            logger.exception("worker %s: closing the loop of session %r failed", self._name, session.log.id)
        try:
            return bool(agent.inbox.has_pending)
        except Exception:
            return False

    async def _release(self, session: _Session) -> None:
        """Flushes and releases the lease; input left pending in the log is flagged for the next
        worker (a release with input still staged announces itself)."""
        session.leaving = True
        pending = await self._close_agent(session)
        try:
            await session.log.aclose()
        except Exception:
            logger.exception(
                "worker %s: releasing session %r failed (its lease lapses after %.1f s)", self._name, session.log.id, self.lease_ttl
            )
            return
        self.stats["released"] += 1
        if pending:
            try:
                await self._store._mark_runnable(session.log.id)
            except Exception:
                logger.exception("worker %s: flagging session %r failed", self._name, session.log.id)

    async def _park(self, session: _Session, detail: str, runnable: bool) -> None:
        session.leaving = True
        pending = await self._close_agent(session) or runnable
        log = session.log
        try:
            await log.flush()
            parked = await self._store._park(log.id, session.epoch, detail, pending)
        except Exception:
            logger.exception("worker %s: parking session %r failed; releasing it", self._name, log.id)
            parked = False
        if parked:
            self.stats["parked"] += 1
            logger.warning("worker %s: parked session %r: %s", self._name, log.id, detail)
        try:
            await log.aclose()
        except Exception:
            logger.exception("worker %s: closing parked session %r failed", self._name, log.id)

    async def _let_go_fenced(self, session: _Session) -> None:
        """Another owner took the session over: nothing of ours may be written or released."""
        logger.warning("worker %s: session %r was taken over by another owner", self._name, session.log.id)
        session.leaving = True
        await self._close_agent(session)
        try:
            await session.log.aclose()
        except Exception:
            pass  # the log is poisoned by the fence; its release is conditional on our epoch
