"""The native exporter's spans (folded and encoded as OTLP by the core, ``kerman.otel.encode``)
equal the SDK path's (``kerman.otel.export`` on a TracerProvider, encoded by OpenTelemetry's
own OTLP encoder), message for message and field by field, over recorded sessions: parallel
tool calls, retried and failed requests, a cancel mid-stream, a turn interrupted by a crash
and continued in another process, a decision wait, both convention versions."""

from __future__ import annotations

import asyncio
import json
import shutil
from typing import Any, Dict, List

import pytest

import kerman

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("opentelemetry.exporter.otlp.proto.common")

from google.protobuf.json_format import MessageToDict  # noqa: E402
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from kerman import otel  # noqa: E402
from kerman.otel._otlp import to_otlp_json  # noqa: E402
from otel_sessions import tools_session  # noqa: E402

USAGE = {"input": 100, "output": 10, "cacheRead": 60, "cacheWrite": 5, "reasoning": 2}
RESOURCE = Resource.create({"service.name": "parity", "deployment.environment": "test", "kerman.weights": (1, 2)})


def sdk_spans(log: Any, latest: bool, **names: Any) -> List[Any]:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    otel.export(log, provider, latest=latest, **names)
    return list(memory.get_finished_spans())


def span_fields(request: Any) -> List[Dict[str, Any]]:
    return [MessageToDict(s) for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]


def assert_same_spans(log: Any, **names: Any) -> List[Dict[str, Any]]:
    """Both convention versions: the native protobuf decodes to the SDK's request, span by span
    (names, ids, parents, kinds, times, attributes, status); the native OTLP/JSON is the SDK's."""
    for latest in (False, True):
        spans = sdk_spans(log, latest, **names)
        assert spans, "the session made no span"
        expected = encode_spans(spans)
        body = otel.encode(log, latest=latest, resource=RESOURCE, **names)
        assert isinstance(body, bytes)
        got = ExportTraceServiceRequest.FromString(body)
        assert span_fields(got) == span_fields(expected)  # a readable diff first
        assert got == expected
        assert json.loads(otel.encode(log, format="json", latest=latest, resource=RESOURCE, **names)) == to_otlp_json(spans)
    return span_fields(got)


async def three_tools(log: Any = None) -> kerman.AgentLoop:
    return await tools_session(USAGE, ("slow", "fast", "broken"), log=log)


def test_parallel_tools_and_a_failing_tool():
    async def main() -> None:
        loop = await three_tools()
        loop.followup("again")
        await loop.when_idle()
        spans = assert_same_spans(loop.log, model="gpt-4o", provider="openai")
        assert len(spans) == 2 * 6 and sum(s["name"] == "execute_tool broken" for s in spans) == 2
        # the defaults (no model, no provider) too
        assert_same_spans(loop.log)
        await loop.aclose()

    asyncio.run(main())


class Flaky:
    """Streams: the first attempt fails after partial usage, the second before any chunk, then
    a reply cut at max-tokens."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, request: Any) -> Any:
        self.calls += 1
        if self.calls == 1:
            yield {"type": "text-delta", "text": "par"}
            yield {"type": "usage", "input": 40, "output": 3, "partial": True, "model": "m-1", "provider": "acme"}
            raise kerman.ModelError("stream cut", code="STREAM_CUT")
        if self.calls == 2:
            raise kerman.ModelError("rate limited", code="RATE_LIMITED", status=429)
        yield {"type": "text-delta", "text": "long"}
        yield {"type": "usage", **USAGE, "model": "m-2"}
        yield {"type": "finish", "reason": "max-tokens"}


def test_retried_and_failed_requests():
    async def main() -> None:
        loop = kerman.AgentLoop(Flaky())

        async def retry_all(failure: Any, next: Any) -> Any:
            return kerman.Retry()

        loop.request_error(retry_all)
        loop.followup("go")
        await loop.when_idle()
        spans = assert_same_spans(loop.log, provider="fallback")
        outcomes = [s["attributes"] for s in spans if s["name"].startswith("chat")]
        assert len(outcomes) == 3
        await loop.aclose()

    asyncio.run(main())


def test_a_turn_that_failed_and_one_cancelled_mid_stream():
    async def main() -> None:
        streaming = asyncio.Event()

        async def model(request: Any) -> Any:
            if request.turn == 1:
                raise RuntimeError("boom")
            yield {"type": "usage", **USAGE}
            yield {"type": "text-delta", "text": "half"}
            streaming.set()
            await asyncio.Event().wait()

        loop = kerman.AgentLoop(model)
        loop.followup("one")
        await loop.when_idle()
        loop.followup("two")
        await streaming.wait()
        loop.cancel()
        await loop.when_idle()
        spans = assert_same_spans(loop.log, model="m")
        assert sum(s["status"].get("code") == "STATUS_CODE_ERROR" for s in spans) >= 2
        await loop.aclose()

    asyncio.run(main())


def test_a_cancel_before_the_first_chunk_and_a_failed_finish_naming_its_model():
    """The ledger's rules the core fold mirrors: the loop's ``cancelled`` finish is an
    interrupted request; a failed finish naming a model (a ``Fallback``'s) is that model's."""

    async def main() -> None:
        waiting = asyncio.Event()

        async def model(request: Any) -> Any:
            if request.turn == 1:
                yield {"type": "finish", "reason": "error", "error": {"message": "429"}, "model": "first", "provider": "openai"}
                yield {"type": "usage", **USAGE, "model": "second"}
                yield {"type": "text-delta", "text": "ok"}
                yield {"type": "finish", "reason": "stop"}
                return
            waiting.set()
            await asyncio.Event().wait()
            yield {"type": "text-delta", "text": "never"}

        loop = kerman.AgentLoop(model)
        loop.followup("one")
        await loop.when_idle()
        loop.followup("two")
        await waiting.wait()
        loop.cancel()
        await loop.when_idle()
        spans = assert_same_spans(loop.log, model="m")
        chats = [s for s in spans if s["name"].startswith("chat")]
        assert [s["name"] for s in chats] == ["chat first", "chat second", "chat m"]
        outcome = [a for a in chats[2]["attributes"] if a["key"] == "kerman.request.outcome"]
        assert outcome[0]["value"]["stringValue"] == "interrupted"
        await loop.aclose()

    asyncio.run(main())


def test_a_crashed_turn_continued_in_another_process(tmp_path):
    async def main() -> None:
        alive = kerman.FileStore(str(tmp_path / "alive"), durability="none")
        streaming = asyncio.Event()

        async def hangs(request: Any) -> Any:
            yield {"type": "usage", **USAGE}
            yield {"type": "text-delta", "text": "par"}
            streaming.set()
            await asyncio.Event().wait()

        log = alive.create("s")
        loop = kerman.AgentLoop(hangs, log=log)
        loop.followup("go")
        await streaming.wait()
        await log.flush()
        (tmp_path / "dead").mkdir()
        for f in (tmp_path / "alive").iterdir():
            if f.suffix == ".jsonl":
                shutil.copy(f, tmp_path / "dead" / f.name)
        loop.cancel()
        await loop.aclose()
        log.close()
        store = kerman.FileStore(str(tmp_path / "dead"), durability="none")
        with store.open("s") as reopened:  # the closers end turn 1 interrupted
            again = await three_tools(reopened)
            await again.aclose()
            spans = assert_same_spans(reopened)
            agents = [s for s in spans if s["name"].startswith("invoke_agent")]
            assert len(agents) == 2 and agents[1]["parentSpanId"] == agents[0]["spanId"]
            assert len({s["traceId"] for s in spans}) == 1

    asyncio.run(main())


def test_a_turn_that_waited_for_a_decision():
    async def main() -> None:
        async def model(request: Any) -> Any:
            if request.step == 1:
                return kerman.ModelReply([{"type": "tool-call", "id": "p1", "name": "pay", "arguments": '{"amount": 5}'}], usage=USAGE)
            return kerman.ModelReply("paid", usage=USAGE)

        loop = kerman.AgentLoop(model)

        @loop.tool(needs_approval=True)
        async def pay(amount: int) -> str:
            """Pays."""
            return "paid"

        loop.followup("pay")
        await loop.when_idle()
        [pending] = loop.decisions
        assert otel.encode(loop.log) is not None  # the first request's span; the turn is open
        loop.decide(pending.decision_id, kerman.Approve())
        await loop.when_idle()
        spans = assert_same_spans(loop.log)
        assert [s["name"] for s in spans].count("invoke_agent kerman") == 1
        await loop.aclose()

    asyncio.run(main())


def test_a_batch_at_a_time_gives_the_spans_of_one_pass():
    """Live, the core reads the log in batches: cut anywhere, the spans are those of one pass."""

    async def main() -> None:
        loop = await three_tools()
        whole = otel.encode(loop.log)
        from kerman.otel._native import native_spans

        spans = native_spans(loop.log.id, resource=None)
        bodies = []
        for stop in range(1, len(loop.log) + 1):
            assert spans.read(loop.log, stop) == stop
            bodies.append(spans.take())
        joined = [s for b in bodies if b is not None for s in span_fields(ExportTraceServiceRequest.FromString(b))]
        assert joined == span_fields(ExportTraceServiceRequest.FromString(whole))
        assert spans.take() is None and spans.pending == 0
        with pytest.raises(ValueError, match="'xml'"):
            spans.take("xml")
        await loop.aclose()

    asyncio.run(main())


def test_the_bench_workload_runs_with_the_native_exporter():
    """``turn_cost.py --otel``'s native child (encode only): every event folded, no error."""
    import os
    import subprocess
    import sys

    bench = os.path.join(os.path.dirname(__file__), "..", "..", "..", "benches", "python", "turn_cost.py")
    subprocess.run([sys.executable, bench, "--child", "kerman", "0", "1", "100", "otel-encode"], check=True, timeout=120)


def test_the_default_resource_follows_the_environment(monkeypatch):
    from kerman.otel._native import resource_attributes

    for name in ("first", "second"):
        monkeypatch.setenv("OTEL_SERVICE_NAME", name)
        monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", f"deployment.environment={name}-env")
        assert dict(resource_attributes()) == dict(Resource.create().attributes)
        assert dict(resource_attributes())["service.name"] == name
