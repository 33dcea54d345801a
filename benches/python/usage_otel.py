"""The usage ledger and the live OpenTelemetry exporter, measured.

    python3 benches/python/usage_otel.py [--events 100000] [--sessions 10] [--turns 100] [--reps 5]

* **live exporter**: P4-shaped turns (one tool call per turn, `bench.py`'s P4 model), turns per
  second without instrumentation, with ``kerman.otel.instrument(loop)`` on an SDK
  ``TracerProvider`` whose ``BatchSpanProcessor`` hands the spans to an exporter that drops
  them (``sdk``), with the native exporter whose ``send`` drops the OTLP body (``encode``),
  and with the native exporter posting to a loopback OTLP/HTTP sink in another process
  (``post``, ``otlp_sink.py``). Each instrumentation is flushed before the clock stops, so the
  span building is counted. Interleaved repetitions, the median of each; the overhead is the
  target of docs/tracing.md (at most 10% of P4).
* **kerman log otel**: the same session's spans built by ``otel.export`` on the SDK (an
  in-memory processor that keeps nothing) and by the core (``OtlpSpans.add`` + ``take``), over
  the events already read; the best of ``--reps``.
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
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter, SpanExportResult

import kerman
from kerman import cli, otel
from kerman.otel._native import native_spans
from kerman.usage import ledger

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_log  # noqa: E402
import otlp_sink  # noqa: E402


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


def instrumented(mode: str, loop: Any, provider: Any, url: str) -> Any:
    if mode == "sdk":
        return otel.instrument(loop, provider)
    if mode == "encode":
        return otel.NativeInstrumentation(loop.log, native_spans(loop.log.id), lambda body: None)
    return otel.instrument(loop, endpoint=url)


async def turns(sessions: int, count: int, mode: str, url: str = "", burst: int = 50) -> float:
    exporter = Dropping()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    loops = []
    lives = []
    for _ in range(sessions):
        loop = kerman.AgentLoop(model)
        loop.tool(git_log)
        loops.append(loop)
        if mode != "plain":
            lives.append(instrumented(mode, loop, provider, url))
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
        assert live.errors == 0 and live.exported == len(live.log) - 1
    provider.shutdown()
    for loop in loops:
        assert loop.log[-1].data["reason"] == {"kind": "completed"}
        await loop.aclose()
    if mode == "sdk":
        assert exporter.spans == sessions * (count // burst * burst) * 4, exporter.spans  # agent, 2 chat, 1 tool
    return sessions * (count // burst * burst) / (dt / 1e9)


def interleave(reps: int, *runs: Callable[[], float]) -> List[List[float]]:
    out: List[List[float]] = [[] for _ in runs]
    for _ in range(reps):
        for samples, run in zip(out, runs, strict=True):
            samples.append(run())
    return out


def otel_over_events(read: List[Any], session: str, reps: int) -> Dict[str, float]:
    """The spans of ``read`` by the SDK path (``otel.export``) and by the core, best of ``reps``."""

    class Log:
        id = session

        def events(self, view: bool = False) -> Any:
            return kerman.events.views(read) if view else iter(read)

    sdk_best = native_best = float("inf")
    for _ in range(reps):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(Dropping()))
        t0 = time.perf_counter()
        otel.export(Log(), provider)
        sdk_best = min(sdk_best, time.perf_counter() - t0)
        t0 = time.perf_counter()
        spans = native_spans(session)
        spans.add(read)
        spans.finish()
        body = spans.take()
        native_best = min(native_best, time.perf_counter() - t0)
        assert body is not None
    return {"otel_sdk_s": sdk_best, "otel_native_s": native_best}


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
        spans = otel_over_events(read, "big", reps)
    return {"events": events, "cli_s": cli_best, "fold_s": fold_best, "requests": data["session"]["requests"], **spans}


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--sessions", type=int, default=10)
    ap.add_argument("--turns", type=int, default=100)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    modes = ("plain", "sdk", "encode", "post")
    with otlp_sink.serving() as url:
        samples = interleave(args.reps, *(lambda m=m: asyncio.run(turns(args.sessions, args.turns, m, url)) for m in modes))
    rate = {m: statistics.median(x) for m, x in zip(modes, samples, strict=True)}
    p = rate["plain"]
    overhead = {m: (1 / rate[m] - 1 / p) / (1 / p) for m in modes[1:]}
    usage = usage_over_file(args.events, args.reps)
    label = {"sdk": "otel.instrument + BatchSpanProcessor", "encode": "native exporter, encode only", "post": "native exporter, posting"}
    print(f"{'P4 turns/s, no instrumentation':52} {p:>12,.0f}")
    for m in modes[1:]:
        print(f"{'P4 turns/s, ' + label[m]:52} {rate[m]:>12,.0f}   {(1 / rate[m] - 1 / p) * 1e6:>8,.1f} µs/turn ({overhead[m]:+.1%} of P4)")
    print(f"{'kerman log usage, ' + format(usage['events'], ',') + ' events':52} {usage['cli_s']:>10.2f} s")
    print(f"{'ledger() over the events read':52} {usage['fold_s']:>10.2f} s ({usage['fold_s'] / usage['events'] * 1e6:.1f} µs/event)")
    print(f"{'spans of those events, SDK (otel.export)':52} {usage['otel_sdk_s']:>10.2f} s")
    print(f"{'spans of those events, core (OtlpSpans)':52} {usage['otel_native_s']:>10.3f} s")
    print(
        json.dumps({"p4_plain": p, **{f"p4_{m}": rate[m] for m in modes[1:]}, **{f"overhead_{m}": overhead[m] for m in modes[1:]}, **usage})
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
