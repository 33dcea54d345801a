"""The usage ledger and the live OpenTelemetry exporter, measured.

    python3 benches/python/usage_otel.py [--events 100000] [--sessions 10] [--turns 100] [--reps 5]

* **live exporter**: P4-shaped turns (one tool call per turn, `bench.py`'s P4 model), turns per
  second without instrumentation and with ``kerman.otel.instrument(loop)`` on an SDK
  ``TracerProvider`` whose ``BatchSpanProcessor`` hands the spans to an exporter that drops
  them (the exporter's own I/O is the collector's business, on the processor's thread). Each
  instrumentation is flushed before the clock stops, so the span building is counted.
  Interleaved repetitions, the median of each; the overhead is the target of docs/tracing.md
  (at most 10% of P4).
* **kerman log usage**: a ``--events`` session written by ``gen_log.py`` (a streamed tool step
  and a streamed answer per 28-event turn), folded by ``kerman log usage STORE ID --json
  --no-prices`` in this process (reading the file included), and by ``ledger()`` over the
  events already read. The best of ``--reps``.

Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Sequence

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import kerman
from kerman import cli, otel
from kerman.usage import ledger

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_log  # noqa: E402


class Dropping(SpanExporter):
    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


TEXT = kerman.ModelReply("The last commit adds group commit to the writer thread.", usage={"input": 900, "output": 12, "cacheRead": 800})
CALL = kerman.ModelReply(
    [{"type": "tool-call", "id": "call-1", "name": "git_log", "arguments": '{"n": 1}'}], usage={"input": 850, "output": 20}
)


async def model(request: Any) -> Any:
    return CALL if request.step == 1 else TEXT


async def git_log(args: Dict[str, Any], ctx: Any) -> str:
    return "commit 4f1c2e: add group commit"


async def turns(sessions: int, count: int, instrumented: bool, burst: int = 50) -> float:
    exporter = Dropping()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    loops = []
    lives = []
    for _ in range(sessions):
        loop = kerman.AgentLoop(model)
        loop.tool(git_log)
        loops.append(loop)
        if instrumented:
            lives.append(otel.instrument(loop, provider))
    t0 = time.perf_counter_ns()
    for loop in loops:
        for _ in range(count // burst):
            for _ in range(burst):
                loop.followup("What changed in the last commit?")
            await loop.when_idle()
    for live in lives:
        live.flush()
    dt = time.perf_counter_ns() - t0
    for live in lives:
        live.close()
        assert live.errors == 0
    provider.shutdown()
    for loop in loops:
        assert loop.log[-1].data["reason"] == {"kind": "completed"}
        await loop.aclose()
    if instrumented:
        assert exporter.spans == sessions * (count // burst * burst) * 4, exporter.spans  # agent, 2 chat, 1 tool
    return sessions * (count // burst * burst) / (dt / 1e9)


def interleave(reps: int, a: Callable[[], float], b: Callable[[], float]) -> tuple[List[float], List[float]]:
    xs, ys = [], []
    for _ in range(reps):
        xs.append(a())
        ys.append(b())
    return xs, ys


def usage_over_file(events: int, reps: int) -> Dict[str, float]:
    with tempfile.TemporaryDirectory() as root:
        gen_log.write(os.path.join(root, "big.jsonl"), "big", events)
        cli_best = float("inf")
        for _ in range(reps):
            out = io.StringIO()
            t0 = time.perf_counter()
            with contextlib.redirect_stdout(out):
                assert cli.main(["log", "usage", root, "big", "--json", "--no-prices"]) == 0
            cli_best = min(cli_best, time.perf_counter() - t0)
        data = json.loads(out.getvalue())
        store = kerman.FileStore(root)
        with store.open("big") as log:
            read = list(log.events())
        fold_best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            book = ledger(read, pricer=None)
            fold_best = min(fold_best, time.perf_counter() - t0)
        assert book.session.requests == data["session"]["requests"] > 0
    return {"events": events, "cli_s": cli_best, "fold_s": fold_best, "requests": data["session"]["requests"]}


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--sessions", type=int, default=10)
    ap.add_argument("--turns", type=int, default=100)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    plain, live = interleave(
        args.reps,
        lambda: asyncio.run(turns(args.sessions, args.turns, False)),
        lambda: asyncio.run(turns(args.sessions, args.turns, True)),
    )
    p, q = statistics.median(plain), statistics.median(live)
    overhead = (1 / q - 1 / p) / (1 / p)
    usage = usage_over_file(args.events, args.reps)
    print(f"{'P4 turns/s, no instrumentation':48} {p:>12,.0f}")
    print(f"{'P4 turns/s, otel.instrument + BatchSpanProcessor':48} {q:>12,.0f}")
    print(f"{'live exporter cost per turn':48} {(1 / q - 1 / p) * 1e6:>10,.1f} µs ({overhead:+.1%} of P4's time per turn; target ≤ 10%)")
    print(f"{'kerman log usage, ' + format(usage['events'], ',') + ' events':48} {usage['cli_s']:>10.2f} s")
    print(f"{'ledger() over the events read':48} {usage['fold_s']:>10.2f} s ({usage['fold_s'] / usage['events'] * 1e6:.1f} µs/event)")
    print(json.dumps({"p4_plain": p, "p4_instrumented": q, "overhead": overhead, **usage}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
