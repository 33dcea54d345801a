"""What a long streamed reply costs a provider, per reply size: the CPU time of folding the
SDK's events of one reply into chunks (``provider._stream`` and the chunk guard every stream goes
through), for replies of 64 kB and 512 kB of text in 16-character deltas. The ratio of the two
shows how the cost grows: about 8 when it is linear in the reply's length (8x the text), about
64 if each delta copied the text so far.

Run in a process of its own (``make bench`` runs it). The SDK's events are recorded once from a
real stream served by a ``FakeServer`` in a child process, then replayed without the SDK, so
only the provider's own work is timed (``time.thread_time_ns``, best of a few runs).
``--quick`` runs once per size (a smoke test); ``--json`` prints the rows as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))

from providers_cost import PROTOCOLS, _Client, history, make, request, sdk_request  # noqa: E402

DELTA = "0123456789abcde "  # 16 characters
SIZES_KB = (64, 512)


def serve(protocol: str, conn: Any) -> None:
    from kerman.providers.testing import FakeServer, Reply

    with FakeServer(protocol) as server:
        conn.send(server.url)
        while True:
            kb = conn.recv()
            if kb is None:
                return
            server.add(Reply(text=[DELTA] * (kb * 1024 // len(DELTA))))
            conn.send("ok")


async def measure(protocol: str, url: str, conn: Any, kb: int, runs: int) -> Dict[str, Any]:
    from kerman.providers._stream import guard_chunks

    provider = make(protocol, url)
    client = provider.client
    req = request(history(1, "long"))
    kwargs = provider._build(req)
    conn.send(kb)
    conn.recv()
    events = await sdk_request(protocol, client, dict(kwargs))
    best = None
    text = 0
    try:
        provider.client = _Client(events)
        for _ in range(runs):
            text = 0
            t0 = time.thread_time_ns()
            async for chunk in guard_chunks(provider._stream(req, kwargs), provider.protocol, None):
                if chunk["type"] == "text-delta":
                    text += len(chunk["text"])
            took = time.thread_time_ns() - t0
            best = took if best is None else min(best, took)
    finally:
        provider.client = client
        await provider.aclose()
    assert best is not None
    return {"protocol": protocol, "kb": kb, "events": len(events), "text": text, "fold_ms": best / 1e6}


def run_protocol(protocol: str, quick: bool) -> Dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=serve, args=(protocol, child), daemon=True)
    proc.start()
    try:
        url = parent.recv()
        rows = [asyncio.run(measure(protocol, url, parent, kb, 1 if quick else 5)) for kb in SIZES_KB]
    finally:
        parent.send(None)
        proc.join(timeout=30)
        if proc.is_alive():
            proc.terminate()
    small, large = rows
    return {
        "protocol": protocol,
        "fold_ms_64kb": small["fold_ms"],
        "fold_ms_512kb": large["fold_ms"],
        "ratio": large["fold_ms"] / small["fold_ms"],
        "events_512kb": large["events"],
        "text_512kb": large["text"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one run per size (smoke test)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--only", default="", help="comma-separated protocols")
    args = ap.parse_args()
    try:
        import anthropic  # noqa: F401
        import google.genai  # noqa: F401
        import openai  # noqa: F401
    except ImportError as e:
        print(f"SKIPPED providers_long_reply: {e.name} is not installed (pip install 'kerman[openai,anthropic,gemini]')")
        return 0
    protocols = [p for p in PROTOCOLS if not args.only or p in args.only.split(",")]
    rows: List[Dict[str, Any]] = [run_protocol(p, args.quick) for p in protocols]
    if args.json:
        print(json.dumps(rows))
        return 0
    print("providers_long_reply: CPU to fold one streamed reply, by its size (best of 5; ~8 is linear, ~64 quadratic)")
    print("| protocol | 64 kB ms | 512 kB ms | 512 kB / 64 kB |")
    print("|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['protocol']} | {r['fold_ms_64kb']:.1f} | {r['fold_ms_512kb']:.1f} | {r['ratio']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
