"""The providers' own cost per request, as a ratio to the vendor SDK's own cost for the same
request (target: at most 0.25x for histories of 10 and 1,000 messages).

Run in a process of its own (``make bench`` runs it; or ``python3 benches/python/providers_cost.py``).
For each wire protocol and history size it makes requests against a ``FakeServer`` in a child
process (so the server's work is not on this process's clock) and measures, in CPU time of this
thread (``time.thread_time_ns``), medians over many requests:

* **build**: ``provider._build(request)``, the SDK call's arguments from the history, as in a
  running session: the request has N messages, the previous request of the same loop had the
  first N-2 (each step adds an assistant reply and a tool result), so the provider reuses that
  request's wire list and converts the two new messages;
* **first**: the same build by a provider that has seen none of the messages (the first
  request after a restart: every message converted once), reported apart, not in the ratio;
* **fold**: the provider's stream handling (``provider._stream``) fed the SDK's own event
  objects, recorded from a real stream of the same request and replayed without the SDK, so
  only the provider's work is timed;
* **SDK**: the SDK alone doing the same request: ``create(**kwargs)`` with the arguments the
  provider built, and reading the stream to its end over loopback HTTP.

The ratio is (build + fold) / SDK. The reply is a typical streamed one: 20 text deltas, one
tool call in 3 pieces, usage. ``--quick`` runs few requests (a smoke test); ``--json`` prints
the rows as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
import time
from typing import Any, Dict, List

PROTOCOLS = ("openai-chat", "openai-responses", "anthropic", "gemini")
SIZES = (10, 1000)
TARGET = 0.25


def serve(protocol: str, conn: Any) -> None:
    from kerman.providers.testing import FakeServer, Reply, ToolCall

    call = ToolCall("call_1", "lookup", '{"query": "weather in Paris"}', pieces=3)
    reply = Reply(
        text=[f"word{i} " for i in range(20)],
        tool_calls=[call],
        usage={"input": 1200, "output": 60, "cacheRead": 1000, "cacheWrite": 0, "reasoning": 0},
    )
    with FakeServer(protocol, default=reply) as server:
        conn.send(server.url)
        conn.recv()  # until told to stop


def history(n: int, tag: str) -> List[Any]:
    """N messages: a user prompt, then (assistant text + tool call, tool result, user) rounds."""
    import kerman

    out: List[Any] = [kerman.UserMessage(f"Plan a trip to Paris ({tag}).")]
    i = 0
    while len(out) < n:
        call = f"call_{tag}_{i}"
        out.append(
            kerman.AssistantMessage(
                [
                    {"type": "text", "text": f"Looking up item {i} of the plan for you now."},
                    {"type": "tool-call", "id": call, "name": "lookup", "arguments": json.dumps({"query": f"item {i}"})},
                ]
            )
        )
        if len(out) < n:
            out.append(kerman.ToolResultMessage(call, f"Result {i}: sunny, 21 degrees, light wind from the west."))
        if len(out) < n:
            out.append(kerman.UserMessage(f"Thanks. Now item {i + 1}, please."))
        i += 1
    return out[:n]


def request(messages: List[Any]) -> Any:
    import kerman

    tools = [
        {
            "name": "lookup",
            "description": "Looks something up.",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        }
    ]
    return kerman.ModelRequest(messages=messages, tools=tools, options={}, turn=1, step=1, signal=kerman.Signal())


class _Replay:
    """A recorded SDK stream replayed without the SDK: what ``provider._stream`` reads."""

    def __init__(self, events: List[Any]) -> None:
        self.events = events

    async def __aenter__(self) -> _Replay:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        return None

    def __aiter__(self) -> Any:
        return self._gen()

    async def _gen(self) -> Any:
        for e in self.events:
            yield e

    async def aclose(self) -> None:
        return None


class _Client:
    """Stands in for the SDK client in the fold measurement: every create call returns the replay."""

    def __init__(self, events: List[Any]) -> None:
        self.replay = _Replay(events)
        self.chat = self.responses = self.messages = self.completions = self.models = self.aio = self

    async def create(self, **kwargs: Any) -> _Replay:
        return self.replay

    async def generate_content_stream(self, **kwargs: Any) -> Any:
        return self.replay._gen()  # google-genai returns an async generator


def sdk_call(protocol: str, client: Any, kwargs: Dict[str, Any]) -> Any:
    if protocol == "openai-chat":
        return client.chat.completions.create(**kwargs)
    if protocol == "openai-responses":
        return client.responses.create(**kwargs)
    if protocol == "anthropic":
        return client.messages.create(**kwargs)
    return client.aio.models.generate_content_stream(**kwargs)


async def sdk_request(protocol: str, client: Any, kwargs: Dict[str, Any]) -> List[Any]:
    stream = await sdk_call(protocol, client, kwargs)
    events = []
    if protocol == "gemini":
        async for e in stream:
            events.append(e)
    else:
        async with stream:
            async for e in stream:
                events.append(e)
    return events


def make(protocol: str, url: str) -> Any:
    from kerman.providers import Anthropic, Gemini, OpenAIChat, OpenAIResponses

    cls = {"openai-chat": OpenAIChat, "openai-responses": OpenAIResponses, "anthropic": Anthropic, "gemini": Gemini}[protocol]
    return cls("bench-model", base_url=url, api_key="bench-key", timeout=60)


async def measure(protocol: str, url: str, n: int, iterations: int) -> Dict[str, Any]:
    provider = make(protocol, url)
    client = provider.client
    base = history(n - 2, "base")
    provider._build(request(base))  # the history so far is cached, as in a running session
    builds: List[int] = []
    folds: List[int] = []
    sdks: List[int] = []
    clock = time.thread_time_ns
    for i in range(iterations):
        fresh = history(3, f"new{i}")[1:]  # an assistant reply and its tool result, new to the provider
        req = request(base + fresh)
        provider._build(request(base))  # the previous request: the history before these two
        t0 = clock()
        kwargs = provider._build(req)
        t1 = clock()
        events = await sdk_request(protocol, client, dict(kwargs))
        t2 = clock()
        provider.client = _Client(events)
        try:
            t3 = clock()
            async for _ in provider._stream(req, kwargs):
                pass
            t4 = clock()
        finally:
            provider.client = client
        builds.append(t1 - t0)
        sdks.append(t2 - t1)
        folds.append(t4 - t3)
        for m in fresh:  # keep the cache at the base history: the next request's two are new again
            provider._young.pop(m.id, None)
            provider._old.pop(m.id, None)
    firsts: List[int] = []
    for _ in range(max(3, iterations // 10)):
        cold = make(protocol, url)
        t0 = clock()
        cold._build(request(base + fresh))
        firsts.append(clock() - t0)
        await cold.aclose()
    await provider.aclose()
    build, fold, sdk, first = (statistics.median(x) / 1000 for x in (builds, folds, sdks, firsts))
    return {
        "protocol": protocol,
        "messages": n,
        "build_us": build,
        "fold_us": fold,
        "adapter_us": build + fold,
        "sdk_us": sdk,
        "ratio": (build + fold) / sdk,
        "first_build_us": first,
        "requests": iterations,
        "events": len(events),
    }


def run_protocol(protocol: str, quick: bool) -> List[Dict[str, Any]]:
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=serve, args=(protocol, child), daemon=True)
    proc.start()
    try:
        url = parent.recv()
        rows = []
        for n in SIZES:
            iterations = (5 if quick else 300) if n <= 10 else (3 if quick else 40)
            rows.append(asyncio.run(measure(protocol, url, n, iterations)))
        return rows
    finally:
        parent.send("stop")
        proc.join(timeout=30)
        if proc.is_alive():
            proc.terminate()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a few requests only (smoke test)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--only", default="", help="comma-separated protocols")
    args = ap.parse_args()
    try:
        import anthropic  # noqa: F401
        import google.genai  # noqa: F401
        import openai  # noqa: F401
    except ImportError as e:
        print(f"SKIPPED providers_cost: {e.name} is not installed (pip install 'kerman[openai,anthropic,gemini]')")
        return 0
    protocols = [p for p in PROTOCOLS if not args.only or p in args.only.split(",")]
    rows = [row for p in protocols for row in run_protocol(p, args.quick)]
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"providers_cost: the adapter's own CPU per request vs the SDK's for the same request (median, target <= {TARGET}x)")
    print("| protocol | messages | build µs | fold µs | adapter µs | SDK µs | ratio | target | first build µs |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|")
    for r in rows:
        ok = "met" if r["ratio"] <= TARGET else "MISSED"
        print(
            f"| {r['protocol']} | {r['messages']} | {r['build_us']:.1f} | {r['fold_us']:.1f} | {r['adapter_us']:.1f} | "
            f"{r['sdk_us']:.0f} | {r['ratio']:.3f} | {ok} | {r['first_build_us']:.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
