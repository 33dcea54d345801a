"""The distributed benchmark of issue 17 ("Scale, measured"): `kerman worker` processes serving
10,000 sessions of a PostgreSQL store while load generator processes enqueue at a fixed rate,
then a burst; a worker killed with SIGKILL inside a model call while the burst runs; an audit
of the tables at the end (every message entered once and answered once, no write tool run
twice); and the cost of LISTEN with thousands of channels on one connection.

Usage: ``KERMAN_PG_DSN=postgresql://… python benches/python/pg_workers.py [--workers 4]
[--sessions 10000] [--rate 500] [--seconds 20] [--burst 2000] [--json]`` (``make bench-workers``;
about 3 minutes with the defaults). Everything runs in a fresh database of that server (created
here, dropped at the end), so no other session is touched. Figures are from this one run; the
report says what each one measures. docs/distributed.md, "Workers, measured", records them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import urlparse

HERE = os.path.dirname(os.path.abspath(__file__))


def psql(dsn: str, sql: str) -> List[str]:
    out = subprocess.run(["psql", dsn, "-XAtq", "-c", sql], check=True, capture_output=True, text=True, timeout=300)
    return [line for line in out.stdout.splitlines() if line]


def pct(values: List[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def ms(ns: float) -> float:
    return ns / 1e6


class Proc:
    """A child whose stdout lines are collected by a thread (stderr to a file)."""

    def __init__(self, args: List[str], env: Optional[Dict[str, str]] = None) -> None:
        self.err = open(os.devnull, "w") if os.environ.get("BENCH_QUIET") else None
        self.proc = subprocess.Popen(
            args,
            cwd=HERE,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.pid = self.proc.pid
        self.lines: List[str] = []
        self.err_lines: List[str] = []
        self.cond = threading.Condition()
        for stream, lines in ((self.proc.stdout, self.lines), (self.proc.stderr, self.err_lines)):
            threading.Thread(target=self._read, args=(stream, lines), daemon=True).start()

    def _read(self, stream: Any, lines: List[str]) -> None:
        for line in stream:
            with self.cond:
                lines.append(line.rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            lines.append("<eof>")
            self.cond.notify_all()

    def wait_err(self, needle: str, timeout: float = 60.0) -> None:
        end = time.monotonic() + timeout
        with self.cond:
            while not any(needle in line for line in self.err_lines):
                if "<eof>" in self.err_lines or time.monotonic() > end:
                    raise SystemExit(f"child {self.pid} did not say {needle!r}:\n" + "\n".join(self.err_lines))
                self.cond.wait(0.5)

    def wait_eof(self, timeout: float = 600.0, last: str = "<eof>") -> None:
        end = time.monotonic() + timeout
        with self.cond:
            while last not in self.lines and "<eof>" not in self.lines:
                if time.monotonic() > end:
                    raise SystemExit(f"child {self.pid} did not finish")
                self.cond.wait(0.5)


def socket_bytes(pids: List[int], port: int) -> int:
    """Bytes sent + received so far on the TCP connections of `pids` to the server's `port`
    (tcp_info's counters, through `ss`): what the workers exchanged with PostgreSQL."""
    out = subprocess.run(
        ["ss", "-tinpH", "state", "established", f"( dport = :{port} )"], capture_output=True, text=True, check=True
    ).stdout
    total, owner = 0, None
    for line in out.splitlines():
        if "users:(" in line:
            found = re.search(r"pid=(\d+)", line)
            owner = int(found.group(1)) if found else None
        if owner in pids:
            for key in ("bytes_sent", "bytes_received"):
                found = re.search(key + r":(\d+)", line)
                if found:
                    total += int(found.group(1))
    return total


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (all its threads)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def server_pids(dsn: str) -> Dict[int, str]:
    """This database's backends, each by role: the generators' (`bench-gen`, named by their
    DSN), the workers' LISTEN connections (`kerman-listen-<pid>`) and their store connections."""
    rows = psql(dsn, "SELECT pid, application_name FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
    roles = {}
    for row in rows:
        pid, name = row.split("|", 1)
        roles[int(pid)] = "generators" if name == "bench-gen" else "worker_listen" if name.startswith("kerman-listen") else "worker_store"
    return roles


def db_stats(dsn: str) -> Tuple[int, Dict[str, int]]:
    """(transactions committed + rolled back in this database, table counters). Each of the
    store's statements outside an explicit transaction is one transaction; an enqueue is one
    transaction of four statements. The database is the run's own (nobody else's transactions
    count). The table counters are the scans of the store's tables (index and sequential) and
    the rows sequential scans read: what the statements cost the server, whatever the load."""
    psql(dsn, "SELECT pg_stat_force_next_flush()")
    (row,) = psql(dsn, "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()")
    tables: Dict[str, int] = {}
    for line in psql(
        dsn, "SELECT relname, seq_scan, seq_tup_read, coalesce(idx_scan, 0) FROM pg_stat_user_tables WHERE relname LIKE 'kerman%'"
    ):
        name, seq, seq_rows, idx = line.split("|")
        tables[f"{name}.scans"] = int(seq) + int(idx)
        tables[f"{name}.seq_rows"] = int(seq_rows)
    return int(row), tables


def log_offset(path: Optional[str]) -> int:
    return os.path.getsize(path) if path else 0


def statement_counts(path: str, start: int, end: int) -> Tuple[Counter, Dict[str, List[float]]]:
    """The statements the server logged (``log_statement = all``, set on the run's database
    only) between two offsets of its log, by kind (the first words of each statement), and
    the durations of those that took 10 ms or more (``log_min_duration_statement``)."""
    counts: Counter = Counter()
    slow: Dict[str, List[float]] = defaultdict(list)

    def kind(text: str) -> str:
        return re.sub(r"kerman_([ae])_[0-9a-f]{32}", r"kerman_\1_…", " ".join(text.split()))[:60]

    with open(path, "rb") as f:
        f.seek(start)
        text = f.read(end - start).decode("utf-8", "replace")
    last: Dict[str, str] = {}  # server pid -> its last statement (a duration line follows it)
    for line in text.splitlines():
        found = re.search(r"\[(\d+)\] LOG:  (?:execute [^:]+|statement): (.*)", line)
        if found:
            last[found.group(1)] = kind(found.group(2))
            counts[last[found.group(1)]] += 1
            continue
        found = re.search(r"\[(\d+)\] LOG:  duration: ([0-9.]+) ms", line)
        if found and found.group(1) in last:
            slow[last[found.group(1)]].append(float(found.group(2)))
    return counts, slow


# ---- the load generator (a child process) --------------------------------------------------------


def loadgen(args: argparse.Namespace) -> None:
    """Enqueues at `rate` per second for `seconds` (a `hot` share to a small set of sessions,
    which stay owned; the rest spread over all), then `burst` messages as fast as it can.
    Prints ``q <message-id> <session> <ns before> <ns after> <phase>`` per message."""
    import kerman

    # Named, so the benchmark tells its backends from the workers'.
    sep = "&" if "?" in args.dsn else "?"
    store = kerman.PostgresStore(f"{args.dsn}{sep}application_name=bench-gen")
    rng = random.Random(args.seed)
    # Its own generator, so the sessions chosen do not depend on the tool share.
    tools = random.Random(args.seed + 1000)
    hot = [f"b-{i}" for i in range(args.hot_sessions)]
    everyone = args.sessions
    out = sys.stdout

    def send(sid: str, phase: str) -> None:
        before = time.time_ns()
        message = store.enqueue(sid, "t" if tools.random() < args.tool_share else "x")
        after = time.time_ns()
        out.write(f"q {message.id} {sid} {before} {after} {phase}\n")

    start = time.monotonic()
    n = int(args.rate * args.seconds)
    for i in range(n):
        due = start + i / args.rate
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
        sid = rng.choice(hot) if rng.random() < args.hot_share else f"b-{rng.randrange(everyone)}"
        send(sid, "steady")
    out.flush()
    if args.block_file:
        # The first model call from here on blocks, in whichever worker makes it: the kill lands
        # inside a model call while the burst runs.
        open(args.block_file, "w").close()
    for _ in range(args.burst):
        send(f"b-{rng.randrange(args.hot_sessions, everyone)}", "burst")
    out.write("done\n")
    out.flush()
    # Until the benchmark has read its backend's CPU time (it closes stdin).
    sys.stdin.read()


# ---- LISTEN with many channels -------------------------------------------------------------------


def listen_cost(dsn: str, ids: List[str], counts: List[int], samples: int = 200) -> List[Dict[str, Any]]:
    """One owner store holds `n` sessions, each with an inbox (one LISTEN channel each, on the
    store's one LISTEN connection); another store enqueues to one of them at a time: enqueue
    called -> the message inserted by the owner's inbox (the enqueue's round trip included),
    p50/p99, per `n`."""
    import kerman

    rows = []
    for n in counts:
        owner = kerman.PostgresStore(dsn, lease_ttl=60.0)
        web = kerman.PostgresStore(dsn)
        logs, inboxes = [], []
        arrived = threading.Event()
        stamp: List[int] = []

        def inserted(_message: Any, arrived: threading.Event = arrived, stamp: List[int] = stamp) -> None:
            stamp.append(time.time_ns())
            arrived.set()

        t0 = time.monotonic()
        for sid in ids[:n]:
            log = owner.open(sid)
            inbox = kerman.Inbox(log, on_inserted=inserted)
            logs.append(log)
            inboxes.append(inbox)
        opened = time.monotonic() - t0
        rng = random.Random(n)
        latencies = []
        for _ in range(samples):
            arrived.clear()
            stamp.clear()
            sid = ids[rng.randrange(n)]
            sent = time.time_ns()
            web.enqueue(sid, "ping")
            if not arrived.wait(10):
                raise SystemExit(f"no insertion within 10 s with {n} channels")
            latencies.append(stamp[0] - sent)
        for inbox in inboxes:
            inbox.close()
        for log in logs:
            log.close()
        rows.append(
            {
                "channels": n,
                "open_s": round(opened, 2),
                "p50_ms": round(ms(pct(latencies, 50)), 2),
                "p99_ms": round(ms(pct(latencies, 99)), 2),
            }
        )
    return rows


# ---- the run ------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=500.0, help="enqueues per second, all generators together")
    parser.add_argument("--generators", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--burst", type=int, default=2000, help="messages per generator after the steady phase")
    parser.add_argument("--hot-sessions", type=int, default=200)
    parser.add_argument("--hot-share", type=float, default=0.5)
    parser.add_argument("--lease-ttl", type=float, default=2.0)
    parser.add_argument("--idle-timeout", type=float, default=10.0)
    parser.add_argument("--model-delay", type=float, default=0.005)
    parser.add_argument("--tool-share", type=float, default=0.1, help="share of messages whose turn calls the write tool")
    parser.add_argument("--listen-counts", default="1,1000,10000")
    parser.add_argument(
        "--statement-log",
        metavar="PATH",
        help="the server's log file: log every statement of the run's database "
        "(log_statement = all, on that database only) and report them per turn, by kind",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--loadgen", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dsn", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--block-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.loadgen:
        loadgen(args)
        return 0
    base = os.environ.get("KERMAN_PG_DSN")
    if not base:
        print("pg_workers: KERMAN_PG_DSN is unset; skipped (make pg-server prints one)", file=sys.stderr)
        return 0
    # A database of its own, so pg_stat_database counts this run's transactions only (other
    # processes using the server's other databases do not show up in them).
    name = f"kerman_bench_{uuid.uuid4().hex[:12]}"
    psql(base, f"CREATE DATABASE {name}")
    dsn = urlparse(base)._replace(path="/" + name).geturl()
    try:
        report = run(args, dsn)
    finally:
        psql(base, f"DROP DATABASE {name} WITH (FORCE)")
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    return 0 if report["audit"]["ok"] else 1


def run(args: argparse.Namespace, dsn: str) -> Dict[str, Any]:
    import kerman

    report: Dict[str, Any] = {
        "config": {
            k: getattr(args, k)
            for k in (
                "workers",
                "sessions",
                "rate",
                "generators",
                "seconds",
                "burst",
                "hot_sessions",
                "hot_share",
                "lease_ttl",
                "idle_timeout",
                "model_delay",
                "tool_share",
            )
        }
    }
    ids = [f"b-{i}" for i in range(args.sessions)]
    if args.statement_log:
        (database,) = psql(dsn, "SELECT current_database()")
        psql(dsn, f"ALTER DATABASE {database} SET log_statement = 'all'")
        psql(dsn, f"ALTER DATABASE {database} SET log_min_duration_statement = 10")
    t0 = time.monotonic()
    setup = kerman.PostgresStore(dsn)
    for sid in ids:
        setup.create(sid).close()
    report["setup_s"] = round(time.monotonic() - t0, 1)
    print(f"pg_workers: {args.sessions} sessions created in {report['setup_s']} s", file=sys.stderr)

    worker_cmd = [
        sys.executable,
        "-m",
        "kerman",
        "worker",
        dsn,
        "--app",
        "pg_workers_app:factory",
        "--max-sessions",
        str(args.sessions),
        "--idle-timeout",
        str(args.idle_timeout),
        "--lease-ttl",
        str(args.lease_ttl),
        "--grace",
        "10",
    ]
    scratch = tempfile.mkdtemp(prefix="kerman-bench-")
    try:
        return run_in(args, dsn, report, ids, setup, worker_cmd, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run_in(
    args: argparse.Namespace, dsn: str, report: Dict[str, Any], ids: List[str], setup: Any, worker_cmd: List[str], scratch: str
) -> Dict[str, Any]:
    block, effects = os.path.join(scratch, "block"), os.path.join(scratch, "effects")
    env = {"BENCH_MODEL_DELAY": str(args.model_delay), "BENCH_BLOCK_FILE": block, "BENCH_EFFECTS": effects}
    workers = [Proc(worker_cmd + ["--name", f"w{i}"], env) for i in range(args.workers)]
    for w in workers:
        w.wait_err(": serving ")
    port = urlparse(dsn).port or 5432
    pids = [w.pid for w in workers]
    x0, tables0 = db_stats(dsn)
    log0 = log_offset(args.statement_log)
    io0 = socket_bytes(pids, port)
    cpu0 = {p: cpu_seconds(p) for p in pids}
    gen_cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--loadgen",
        "--dsn",
        dsn,
        "--sessions",
        str(args.sessions),
        "--rate",
        str(args.rate / args.generators),
        "--seconds",
        str(args.seconds),
        "--burst",
        str(args.burst),
        "--hot-sessions",
        str(args.hot_sessions),
        "--hot-share",
        str(args.hot_share),
        "--tool-share",
        str(args.tool_share),
    ]
    started = time.time_ns()
    gens = [Proc(gen_cmd + ["--seed", str(i)] + (["--block-file", block] if i == 0 else [])) for i in range(args.generators)]
    # Mid-run: the connections this database has.
    time.sleep(args.seconds / 2)
    (conns,) = psql(dsn, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
    backends = server_pids(dsn)
    server0 = {p: cpu_seconds(p) for p in backends}  # from mid-run: the generators' come and go
    turns0 = len(collect(workers)[0])

    # kill -9 of one worker inside a model call while the burst runs: the first model call after
    # the burst began blocks (BENCH_BLOCK_FILE); its worker is killed then. Its sessions run
    # elsewhere once their leases lapse, the interrupted turns continued (Worker's default).
    victim, blocked = wait_blocked(workers, 120)
    victim_cpu = cpu_seconds(victim.pid)  # its last reading: a dead process has none
    victim.proc.kill()
    killed = time.time_ns()
    victim.proc.wait()
    burst_running = not all("done" in g.lines for g in gens)
    held = [r["id"] for r in setup.sessions() if r["owner_name"] == victim_name(workers, victim)]
    probe = {}
    for sid in held[:200]:
        probe[setup.enqueue(sid, "after the kill").id] = sid
    survivors = [w for w in workers if w is not victim]
    print(f"pg_workers: worker {victim.pid} killed inside a model call of session {blocked['session']}", file=sys.stderr)
    for g in gens:
        g.wait_eof(last="done")
    queued = {}
    for g in gens:
        for line in g.lines:
            if line.startswith("q "):
                _, mid, sid, before, after, phase = line.split()
                queued[mid] = (sid, int(before), int(after), phase)
    wait_for_models(workers, set(queued) | set(probe), 120)
    x1, tables1 = db_stats(dsn)
    log1 = log_offset(args.statement_log)
    io1 = socket_bytes(pids, port)
    worker_cpu = sum(cpu_seconds(p) - cpu0[p] for p in pids if p != victim.pid) + victim_cpu - cpu0[victim.pid]
    server_cpu = sum(cpu_seconds(p) - server0[p] for p in backends)
    by_role: Dict[str, float] = defaultdict(float)
    for p, role in backends.items():
        by_role[role] += cpu_seconds(p) - server0[p]
    for g in gens:
        assert g.proc.stdin is not None
        g.proc.stdin.close()
        g.proc.wait(60)
    models, takes = collect(workers)
    report["latency"] = latencies(queued, models, takes)
    gc_lines = [line.split() for w in workers for line in list(w.lines) if line.startswith("g ")]
    pauses = [float(g[3]) for g in gc_lines]
    report["gc_pauses"] = {
        "n_over_5ms": len(pauses),
        "max_ms": max(pauses, default=0.0),
        "total_ms": round(sum(pauses), 1),
        "by_generation": dict(sorted(Counter(int(g[1]) for g in gc_lines).items())),
    }
    steady = [models[m][0] for m, q in queued.items() if q[3] == "steady" and m in models]
    turns = len(models)
    span = (max(t for t, _ in models.values()) - started) / 1e9
    report["throughput"] = {
        "turns": turns,
        "seconds": round(span, 2),
        "turns_per_s": round(turns / span, 1),
        "steady_turns_per_s": round(len(steady) / ((max(steady) - min(steady)) / 1e9), 1) if len(steady) > 1 else None,
        "transactions_per_turn": round((x1 - x0) / turns, 2),
        "table_counters_per_turn": {k: round((tables1.get(k, 0) - v) / turns, 2) for k, v in sorted(tables0.items())},
        "worker_bytes_per_turn": round((io1 - io0) / turns),
        "connections": int(conns),
        "worker_cpu_ms_per_turn": round(worker_cpu * 1000 / turns, 2),
        "server_cpu_s_second_half": round(server_cpu, 1),
        # The server's CPU per turn served from mid-run on, by the role of its backends (those of
        # a generator that stopped before the end are counted until then).
        "server_cpu_ms_per_turn_second_half": {
            role: round(sec * 1000 / max(1, turns - turns0), 2) for role, sec in sorted(by_role.items())
        },
        "load_average_1m": round(os.getloadavg()[0], 1),
    }
    if args.statement_log:
        counts, slow = statement_counts(args.statement_log, log0, log1)
        report["statements_per_turn"] = {k: round(n / turns, 3) for k, n in counts.most_common()}
        report["statements_over_10ms"] = {
            k: {"n": len(v), "max_ms": max(v), "p50_ms": pct(v, 50)} for k, v in sorted(slow.items(), key=lambda kv: -len(kv[1]))
        }
        report["throughput"]["statements_per_turn"] = round(sum(counts.values()) / turns, 2)
    print(f"pg_workers: {turns} turns in {span:.1f} s", file=sys.stderr)

    after, _ = collect(survivors)
    took = [after[m][0] - killed for m in probe if m in after]
    report["takeover"] = {
        "sessions_held_by_killed_worker": len(held),
        "probed": len(probe),
        "lease_ttl_s": args.lease_ttl,
        "p50_s": round(pct(took, 50) / 1e9, 3) if took else None,
        "max_s": round(max(took) / 1e9, 3) if took else None,
    }
    queued.update({m: (sid, killed, killed, "takeover") for m, sid in probe.items()})
    wait_for_answers(dsn, set(queued), 120)
    answers = answers_per_message(dsn)
    # The burst runs until its last message reached a model: served after the kill, it was
    # still running when the worker died (whether or not the generators were still enqueuing).
    served_after = sum(1 for m, q in queued.items() if q[3] == "burst" and m in models and models[m][0] > killed)
    report["kill"] = {
        "in_model_call": True,
        "during_burst": burst_running or served_after > 0,
        "burst_still_enqueuing": burst_running,
        "burst_messages_served_after_the_kill": served_after,
        "session": blocked["session"],
        "messages_of_the_blocked_call": len(blocked["entered"]),
        "answered_once": sum(1 for m in blocked["entered"] if answers.get(m, 0) == 1),
    }
    print("pg_workers: kill and takeover measured", file=sys.stderr)

    for w in survivors:
        w.proc.send_signal(signal.SIGTERM)
    codes = [w.proc.wait(60) for w in survivors]
    report["drain_exit_codes"] = codes
    report["audit"] = audit(dsn, queued, effects)
    counts = [int(c) for c in args.listen_counts.split(",") if c and int(c) <= args.sessions]
    report["listen"] = listen_cost(dsn, ids, counts)
    return report


def victim_name(workers: List[Proc], victim: Proc) -> str:
    return f"w{workers.index(victim)}"


def wait_blocked(workers: List[Proc], timeout: float) -> Tuple[Proc, Dict[str, Any]]:
    """The worker whose model call blocked (its ``b`` line), and that call: its session and
    the message ids it entered (the ``m`` line the worker printed just before)."""
    end = time.monotonic() + timeout
    while True:
        for w in workers:
            with w.cond:
                lines = list(w.lines)
            for i, line in enumerate(lines):
                if line.startswith("b "):
                    entered = next((ln.split()[2:] for ln in reversed(lines[:i]) if ln.startswith("m ")), [])
                    return w, {"session": line.split()[2], "entered": entered}
        if time.monotonic() > end:
            raise SystemExit("pg_workers: no model call blocked: the burst reached no worker")
        time.sleep(0.05)  # pacing the poll of the workers' output


def wait_for_answers(dsn: str, ids: set, timeout: float) -> None:
    """Until every message of `ids` that was entered has a final answer (read from the tables),
    or `timeout` seconds."""
    end = time.monotonic() + timeout
    while True:
        answers = answers_per_message(dsn)
        missing = [m for m in ids if answers.get(m, 1) == 0]
        if not missing:
            return
        if time.monotonic() > end:
            print(f"pg_workers: {len(missing)} entered messages never answered", file=sys.stderr)
            return
        time.sleep(0.2)  # pacing the poll of the tables


def wait_for_models(workers: List[Proc], ids: set, timeout: float) -> None:
    end = time.monotonic() + timeout
    while True:
        seen = set()
        for w in workers:
            with w.cond:
                lines = list(w.lines)
            for line in lines:
                if line.startswith("m "):
                    seen.update(line.split()[2:])
        missing = ids - seen
        if not missing:
            return
        if time.monotonic() > end:
            print(f"pg_workers: {len(missing)} messages never reached a model", file=sys.stderr)
            return
        time.sleep(0.2)


def collect(workers: List[Proc]) -> Tuple[Dict[str, Tuple[int, int]], Dict[Tuple[int, str], List[int]]]:
    """message id -> (model call ns, worker pid); (pid, session) -> take times."""
    models: Dict[str, Tuple[int, int]] = {}
    takes: Dict[Tuple[int, str], List[int]] = defaultdict(list)
    for w in workers:
        with w.cond:
            lines = list(w.lines)
        for line in lines:
            if line.startswith("m "):
                parts = line.split()
                for mid in parts[2:]:
                    models.setdefault(mid, (int(parts[1]), w.pid))
            elif line.startswith("t "):
                _, sid, ns = line.split()
                takes[(w.pid, sid)].append(int(ns))
    return models, takes


def latencies(
    queued: Dict[str, Tuple[str, int, int, str]], models: Dict[str, Tuple[int, int]], takes: Dict[Tuple[int, str], List[int]]
) -> Dict[str, Any]:
    """enqueue returned -> model called, split by whether the session was owned when enqueued
    (no take of it between the enqueue and the model call) or unowned (taken for it)."""
    groups: Dict[str, List[int]] = defaultdict(list)
    for mid, (sid, before, after, phase) in queued.items():
        if mid not in models:
            continue
        at, pid = models[mid]
        took = [t for t in takes.get((pid, sid), []) if t <= at]
        owned = not took or max(took) < before
        groups[f"{phase}/{'owned' if owned else 'unowned'}"].append(at - after)
    return {
        k: {"n": len(v), "p50_ms": round(ms(pct(v, 50)), 2), "p99_ms": round(ms(pct(v, 99)), 2), "max_ms": round(ms(max(v)), 1)}
        for k, v in sorted(groups.items())
    }


def audit(dsn: str, queued: Dict[str, Any], effects: str) -> Dict[str, Any]:
    """From the tables alone: each enqueued message inserted by a splice and entered as exactly
    one user/message and answered exactly once; no other; every turn and step balanced; nothing
    left staged or owned. From the write tool's own file: no call of it ran twice, and every
    call with a result ran."""
    entered = Counter(psql(dsn, "SELECT record::json->'data'->>'id' FROM kerman_events WHERE type = 'user/message'"))
    inserted = Counter(
        psql(
            dsn,
            "SELECT m->>'id' FROM kerman_events, "
            "json_array_elements(record::json->'data'->'inserted') AS m "
            "WHERE type = 'agent/inbox/spliced'",
        )
    )
    unbalanced = psql(
        dsn,
        "SELECT session_id FROM kerman_events GROUP BY session_id HAVING "
        "count(*) FILTER (WHERE type = 'turn/start') <> count(*) FILTER (WHERE type = 'turn/end') "
        "OR count(*) FILTER (WHERE type = 'step/start') <> count(*) FILTER (WHERE type = 'step/end')",
    )
    answers = answers_per_message(dsn)
    (staged,) = psql(dsn, "SELECT count(*) FROM kerman_inbox_staged")
    (owned,) = psql(dsn, "SELECT count(*) FROM kerman_sessions WHERE owner IS NOT NULL AND expires_at > now()")
    want = set(queued)
    lost = [m for m in want if entered[m] == 0]
    duplicated = [m for m in want if entered[m] > 1]
    foreign = [m for m in entered if m not in want]
    requeued = sum(1 for m in want if inserted[m] > 1)
    unanswered = [m for m in want if entered[m] and answers.get(m, 0) == 0]
    answered_twice = [m for m in want if answers.get(m, 0) > 1]
    runs = Counter(open(effects).read().split()) if os.path.exists(effects) else Counter()
    calls = psql(
        dsn,
        "SELECT 'kerman:' || session_id || ':' || seq FROM kerman_events WHERE type = 'tool/call' "
        "AND record::json->'data'->>'name' = 'note'",
    )
    ran_twice = [k for k, n in runs.items() if n > 1]
    ran_without_call = [k for k in runs if k not in set(calls)]
    ok = (
        not lost
        and not duplicated
        and not foreign
        and not unbalanced
        and int(staged) == 0
        and not unanswered
        and not answered_twice
        and not ran_twice
        and not ran_without_call
    )
    return {
        "ok": ok,
        "messages": len(want),
        "entered_once": len(want) - len(lost) - len(duplicated),
        "answered_once": sum(1 for m in want if answers.get(m, 0) == 1),
        "unanswered": len(unanswered),
        "answered_twice": len(answered_twice),
        "write_tool_calls": len(calls),
        "write_tool_runs": sum(runs.values()),
        "write_tool_ran_twice": len(ran_twice),
        "write_tool_ran_without_its_call": len(ran_without_call),
        "continuations": int(
            psql(dsn, "SELECT count(*) FROM kerman_events WHERE type = 'turn/start' AND record::json->'data'->>'continues' IS NOT NULL")[0]
        ),
        "lost": len(lost),
        "duplicated": len(duplicated),
        "unknown_entered": len(foreign),
        "reinserted_by_requeue": requeued,
        "unbalanced_sessions": len(unbalanced),
        "left_staged": int(staged),
        "left_owned_by_live_lease": int(owned),
    }


def answers_per_message(dsn: str) -> Dict[str, int]:
    """From the tables alone: how many final answers each entered message got. A final answer
    (an ``assistant/message`` not cut short, asking for no tool, or a ``tool/result`` that
    concluded its turn) answers the messages its
    session entered since the previous one, in the same turn or in a continuation of it
    (``turn/start`` with ``continues``, docs/durability.md); one with nothing left to answer
    counts again for what it answered last."""
    rows = psql(
        dsn,
        "SELECT session_id, type, coalesce(record::json->'data'->>'id', ''), coalesce(record::json->'data'->>'turn', ''), "
        "coalesce(record::json->'data'->>'continues', ''), "
        "(type = 'assistant/message' AND coalesce(record::json->'data'->>'interrupted', 'false') <> 'true' AND NOT EXISTS "
        "(SELECT 1 FROM json_array_elements(record::json->'data'->'message'->'content') b WHERE b->>'type' = 'tool-call')) "
        "OR (type = 'tool/result' AND record::json->'data'->>'concludesTurn' = 'true') "
        "FROM kerman_events WHERE type IN ('turn/start', 'user/message', 'assistant/message', 'tool/result') ORDER BY session_id, seq",
    )
    counts: Dict[str, int] = {}
    session = None
    for row in rows:
        sid, kind, mid, turn, continues, final = row.split("|")
        if sid != session:
            session, current, chain, waiting, last = sid, 0, {}, [], {}
        if kind == "turn/start":
            current = int(turn)
            chain[current] = chain.get(int(continues), int(continues)) if continues else current
        elif kind == "user/message":
            counts[mid] = 0
            waiting.append((mid, chain.get(current, current)))
        elif final == "t":
            root = chain.get(current, current)
            mine = [m for m, r in waiting if r == root] or last.get(root, [])
            for m in mine:
                counts[m] += 1
            last[root] = mine
            waiting = [(m, r) for m, r in waiting if r != root]
    return counts


def print_report(r: Dict[str, Any]) -> None:
    c = r["config"]
    print(
        f"distributed benchmark: {c['workers']} workers, {c['sessions']} sessions, {c['generators']} generators "
        f"at {c['rate']}/s for {c['seconds']} s then {c['burst']} each as fast as possible; model delay "
        f"{c['model_delay'] * 1000:.0f} ms; lease_ttl {c['lease_ttl']} s; idle_timeout {c['idle_timeout']} s"
    )
    print(f"setup: {c['sessions']} sessions created in {r['setup_s']} s")
    print("enqueue returned -> model called:")
    for k, v in r["latency"].items():
        print(f"  {k:<18} n={v['n']:>6}  p50 {v['p50_ms']:>7.2f} ms  p99 {v['p99_ms']:>8.2f} ms  max {v['max_ms']:>8.1f} ms")
    g = r["gc_pauses"]
    print(
        f"garbage collections of 5 ms or more in the workers: {g['n_over_5ms']}, longest {g['max_ms']} ms, "
        f"{g['total_ms']} ms in all; by generation {g['by_generation']}"
    )
    t = r["throughput"]
    print(
        f"throughput: {t['turns']} turns in {t['seconds']} s = {t['turns_per_s']} turns/s overall, "
        f"steady phase {t['steady_turns_per_s']} turns/s; {t['transactions_per_turn']} transactions/turn; "
        f"{t['worker_bytes_per_turn']} bytes/turn between workers and server; {t['connections']} connections"
    )
    print("per turn, the store's tables: " + ", ".join(f"{k} {v}" for k, v in t["table_counters_per_turn"].items()))
    print(
        f"cpu: workers {t['worker_cpu_ms_per_turn']} ms/turn; server backends of this database "
        f"{t['server_cpu_s_second_half']} s from mid-run on; machine load average {t['load_average_1m']}"
    )
    print(
        "server CPU per turn from mid-run on, by backend: "
        + ", ".join(f"{role} {v} ms" for role, v in t["server_cpu_ms_per_turn_second_half"].items())
    )
    if "statements_per_turn" in r:
        print(f"statements per turn (server log): {t['statements_per_turn']}")
        for kind, n in r["statements_per_turn"].items():
            print(f"  {n:>7.3f}  {kind}")
        print("statements that took 10 ms or more:")
        for kind, v in r["statements_over_10ms"].items():
            print(f"  {v['n']:>6}  p50 {v['p50_ms']:>7.1f} ms  max {v['max_ms']:>7.1f} ms  {kind}")
    kill = r["kill"]
    print(
        f"kill -9 inside a model call ({'during the burst' if kill['during_burst'] else 'after the burst'}: "
        f"{kill['burst_messages_served_after_the_kill']} burst messages reached a model after it), "
        f"session {kill['session']}: its {kill['messages_of_the_blocked_call']} message(s) answered once: {kill['answered_once']}"
    )
    k = r["takeover"]
    print(
        f"takeover after kill -9: {k['probed']} of {k['sessions_held_by_killed_worker']} sessions probed, "
        f"p50 {k['p50_s']} s, max {k['max_s']} s (lease_ttl {k['lease_ttl_s']} s)"
    )
    print(f"drain exit codes: {r['drain_exit_codes']}")
    a = r["audit"]
    print(
        f"audit: {'OK' if a['ok'] else 'FAILED'}: {a['messages']} messages, {a['entered_once']} entered once, "
        f"{a['answered_once']} answered once ({a['unanswered']} unanswered, {a['answered_twice']} answered twice; "
        f"{a['continuations']} continuations of crashed turns), write tool: {a['write_tool_calls']} calls, "
        f"{a['write_tool_runs']} runs, {a['write_tool_ran_twice']} ran twice, "
        f"{a['lost']} lost, {a['duplicated']} duplicated, {a['unknown_entered']} unknown, "
        f"{a['reinserted_by_requeue']} re-inserted by requeue, {a['unbalanced_sessions']} unbalanced sessions, "
        f"{a['left_staged']} left staged"
    )
    print("LISTEN on one connection: enqueue called -> inserted by the owner's inbox")
    for row in r["listen"]:
        print(
            f"  {row['channels']:>6} channels  p50 {row['p50_ms']:>6.2f} ms  p99 {row['p99_ms']:>6.2f} ms  "
            f"(opening them took {row['open_s']} s)"
        )


if __name__ == "__main__":
    sys.exit(main())
