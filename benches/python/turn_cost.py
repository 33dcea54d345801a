"""Instructions per loop turn, Kerman against the baseline, counted by callgrind.

Wall-clock ratios on a shared 2-core VM drift by tens of percent between runs; instruction
counts do not (callgrind counts the same for the same binary and input whatever else the
machine does). This runs the P3/P4 turn shapes under ``valgrind --tool=callgrind`` at two
sizes and reports the difference divided by the extra turns, so start-up and imports cancel
out. Use it for A/B comparisons of a change; the targets themselves are wall-clock ratios
(``bench.py``), which also pay for what instructions do not show (page faults, syscalls,
cache misses).

    python3 benches/python/turn_cost.py            # P3 (0, 1, 5 listeners) and P4
    python3 benches/python/turn_cost.py --turns 1000,3000 --only P4
    python3 benches/python/turn_cost.py --gate     # P4 with a gate: what gating adds to a tool turn

``--otel`` counts P4 without and with each live exporter of ``kerman.otel``: ``otel`` is
``instrument(loop, provider)`` on an SDK ``TracerProvider`` whose ``BatchSpanProcessor`` hands
the spans to an exporter that drops them; ``otel-encode`` the native exporter (the core folds
and encodes OTLP) with a ``send`` that drops the body; ``otel-post`` the native exporter
posting to a loopback OTLP/HTTP sink (``otlp_sink.py``, another process: its CPU is not
counted, the client's HTTP is). Every thread's instructions count (the instrumentation's and
the processor's), the spans are all built and handed over before the process ends, and it
prints the share of P4's instructions each exporter adds (the target of docs/tracing.md is
10%).

``--gate`` counts P4 four ways in one run: as it is, with an approving ``before_tool`` gate
(``return await next()``), with one that returns ``Approve()`` itself, and with a
``needs_approval`` predicate that returns ``False`` (no gate); it prints each one's
instructions per turn and what it adds as a share of P4's (the target of docs/decisions.md is
10%). The baseline has no gate, so it is not run.

Run as a child: ``turn_cost.py --child IMPL LISTENERS TOOL TURNS [GATE]`` runs one loop workload.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any, List

import _callgrind

HERE = os.path.dirname(os.path.abspath(__file__))

CASES = {"P3/0": (0, False), "P3/1": (1, False), "P3/5": (5, False), "P4": (0, True)}
# P4 gated (Kerman only): a before_tool listener that awaits next(), one that returns
# Approve() itself, and a needs_approval predicate (no listener); or traced live (``otel``).
GATES = ("none", "gate", "approve", "predicate")
OTEL = ("none", "otel", "otel-encode", "otel-post")


def child(impl: str, listeners: int, tool: bool, turns: int, gate: str = "none") -> None:
    """The P3/P4 workload of bench.py: sessions of 100 turns, prompts in bursts of 50."""
    if impl == "kerman":
        import kerman as mod
    else:
        sys.path.insert(0, HERE)
        import baseline as mod  # type: ignore[no-redef]
    text = mod.ModelReply("The last commit adds group commit to the writer thread.")
    call = mod.ModelReply([{"type": "tool-call", "id": "call-1", "name": "git_log", "arguments": '{"n": 1}'}])

    async def model(request: Any) -> Any:
        return call if tool and request.step == 1 else text

    async def git_log(args: Any, ctx: Any) -> str:
        return "commit 4f1c2e: add group commit"

    def passthrough() -> Any:
        # A new function each time: a listener is registered once per seam.
        async def listener(step: Any, next: Any) -> Any:
            return await next()

        return listener

    traced = None
    if gate == "otel":
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

        from kerman import otel

        class Dropping(SpanExporter):
            spans = 0

            def export(self, spans: Any) -> SpanExportResult:
                Dropping.spans += len(spans)
                return SpanExportResult.SUCCESS

        traced = TracerProvider()
        traced.add_span_processor(BatchSpanProcessor(Dropping()))

    native = None
    if gate in ("otel-encode", "otel-post"):
        from kerman import otel
        from kerman.otel._native import native_spans

        def native(loop: Any) -> Any:
            if gate == "otel-post":
                return otel.instrument(loop, endpoint=os.environ["KERMAN_BENCH_OTLP"])
            return otel.NativeInstrumentation(loop.log, native_spans(loop.log.id), lambda body: None)

    async def main() -> None:
        for _ in range(turns // 100):
            loop = mod.AgentLoop(model)
            live = otel.instrument(loop, traced) if traced is not None else native(loop) if native is not None else None
            if tool:
                if gate == "predicate":
                    loop.tool(needs_approval=lambda call: False)(git_log)
                else:
                    loop.tool(git_log)
            if gate == "gate":

                @loop.before_tool
                async def pass_on(call: Any, next: Any) -> Any:
                    return await next()

            elif gate == "approve":

                @loop.before_tool
                async def approve(call: Any, next: Any) -> Any:
                    return mod.Approve()

            for _ in range(listeners):
                loop.pre_step(passthrough())
            for _ in range(2):
                for _ in range(50):
                    loop.followup("What changed in the last commit?")
                await loop.when_idle()
            assert loop.turn == 100
            if live is not None:
                live.close()
                assert live.errors == 0 and live.exported == len(loop.log) - 1

    asyncio.run(main())
    if traced is not None:
        traced.shutdown()  # every span exported (dropped) before the count ends
        assert Dropping.spans == turns * 4, Dropping.spans


def main(argv: List[str]) -> None:
    if argv[:1] == ["--child"]:
        child(argv[1], int(argv[2]), argv[3] == "1", int(argv[4]), argv[5] if len(argv) > 5 else "none")
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", default="1000,3000", help="the two sizes, e.g. 1000,3000 (multiples of 100)")
    ap.add_argument("--only", help="comma-separated cases: " + ", ".join(CASES) + " (with --otel: " + ", ".join(OTEL) + ")")
    ap.add_argument("--gate", action="store_true", help="P4 plain, with approving gates and with a needs_approval predicate")
    ap.add_argument("--otel", action="store_true", help="P4 plain and with each live exporter (SDK, native encode, native post)")
    args = ap.parse_args(argv)
    _callgrind.require_valgrind()
    small, large = (int(n) for n in args.turns.split(","))
    if small % 100 or large % 100 or large <= small:
        raise SystemExit(f"--turns needs two increasing multiples of 100, got {args.turns!r}")
    if args.otel:
        ways = tuple(args.only.split(",")) if args.only else OTEL
        if "none" not in ways or not set(ways) <= set(OTEL):
            raise SystemExit(f"--otel --only takes none and some of {', '.join(OTEL[1:])}, got {args.only!r}")
        sys.path.insert(0, HERE)
        import otlp_sink

        with otlp_sink.serving() as url:
            os.environ["KERMAN_BENCH_OTLP"] = url
            gated(small, large, ways)
        return
    if args.gate:
        gated(small, large, GATES)
        return
    names = args.only.split(",") if args.only else list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise SystemExit(f"unknown case(s) {', '.join(unknown)}; expected some of {', '.join(CASES)}")
    print("| case | Kerman instr/turn | baseline instr/turn | ratio |\n|---|---|---|---|")
    for name in names:
        listeners, tool = CASES[name]
        per = {}
        for impl in ("kerman", "baseline"):
            print(f"  {name} {impl}: callgrind at {small} and {large} turns...", file=sys.stderr, flush=True)
            per[impl] = _callgrind.per_unit(__file__, ["--child", impl, listeners, int(tool)], small, large, ["none"])
        print(f"| {name} | {per['kerman']:,.0f} | {per['baseline']:,.0f} | {per['baseline'] / per['kerman']:.2f}× |", flush=True)


def gated(small: int, large: int, ways: Any = GATES) -> None:
    """``--gate``/``--otel``: P4's instructions per turn without and with gating (or tracing), in
    one run."""
    print("| P4 | Kerman instr/turn | added | share of P4 |\n|---|---|---|---|")
    plain = 0.0
    for gate in ways:
        print(f"  P4 {gate}: callgrind at {small} and {large} turns...", file=sys.stderr, flush=True)
        per = _callgrind.per_unit(__file__, ["--child", "kerman", 0, 1], small, large, [gate])
        if gate == "none":
            plain = per
            print(f"| as it is | {per:,.0f} | — | — |", flush=True)
        else:
            print(f"| {gate} | {per:,.0f} | {per - plain:+,.0f} | {(per - plain) / plain:.1%} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
