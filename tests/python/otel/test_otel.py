"""kerman.otel: spans derived from the log, checked with the SDK's in-memory exporter: structure
and attributes, parenting under parallel tools, the same ids when a log is exported twice, one
trace across a crash and its continuation, and a live exporter that raises or blocks without
touching the loop."""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import threading
from typing import Any, Dict, List

import pytest

import kerman

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import StatusCode  # noqa: E402

from kerman import otel  # noqa: E402
from otel_sessions import calling, tools_session  # noqa: E402

USAGE = {"input": 100, "output": 10, "cacheRead": 60, "cacheWrite": 0, "reasoning": 2}


def provider_and_memory() -> Any:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return provider, memory


def tree(spans: List[Any]) -> Dict[str, Any]:
    return {s.name: s for s in spans}


def ids(spans: List[Any]) -> List[Any]:
    return sorted((s.name, s.context.trace_id, s.context.span_id, s.parent.span_id if s.parent else None) for s in spans)


def test_spans_follow_the_genai_conventions_and_parent_parallel_tools_under_the_turn():
    async def main() -> None:
        loop = await tools_session(USAGE)
        provider, memory = provider_and_memory()
        assert otel.export(loop.log, provider, model="gpt-4o", provider="openai", latest=False) == 1
        spans = memory.get_finished_spans()
        names = sorted(s.name for s in spans)
        assert names == ["chat gpt-4o", "chat gpt-4o", "execute_tool fast", "execute_tool slow", "invoke_agent kerman"]
        by = tree(spans)
        agent = by["invoke_agent kerman"]
        assert agent.parent is None and agent.attributes["gen_ai.operation.name"] == "invoke_agent"
        assert agent.attributes["gen_ai.conversation.id"] == loop.log.id and agent.attributes["kerman.turn.end"] == "completed"
        for s in spans:
            assert s.context.trace_id == agent.context.trace_id
            if s is not agent:  # every chat and tool span is the turn's child, parallel tools included
                assert s.parent.span_id == agent.context.span_id
        slow, fast = by["execute_tool slow"], by["execute_tool fast"]
        assert slow.attributes["gen_ai.tool.call.id"] == "c0" and fast.attributes["gen_ai.tool.name"] == "fast"
        assert slow.start_time <= fast.end_time and fast.start_time <= slow.end_time  # they overlapped
        chat = [s for s in spans if s.name.startswith("chat")][0]
        assert chat.attributes["gen_ai.operation.name"] == "chat" and chat.attributes["gen_ai.system"] == "openai"
        assert chat.attributes["gen_ai.usage.input_tokens"] == 100 and chat.attributes["gen_ai.usage.output_tokens"] == 10
        assert "gen_ai.usage.cache_read.input_tokens" not in chat.attributes
        assert chat.attributes["gen_ai.request.model"] == "gpt-4o"
        assert agent.start_time <= chat.start_time <= chat.end_time <= agent.end_time
        await loop.aclose()

    asyncio.run(main())


def test_the_latest_conventions_are_selected_by_the_opt_in_variable(monkeypatch):
    async def main() -> None:
        loop = await tools_session(USAGE)
        monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "http, gen_ai_latest_experimental")
        provider, memory = provider_and_memory()
        otel.export(loop.log, provider, provider="openai")
        chat = [s for s in memory.get_finished_spans() if s.name == "chat"][0]
        assert chat.attributes["gen_ai.provider.name"] == "openai" and "gen_ai.system" not in chat.attributes
        assert chat.attributes["gen_ai.usage.cache_read.input_tokens"] == 60
        monkeypatch.delenv("OTEL_SEMCONV_STABILITY_OPT_IN")
        assert not otel.latest_conventions()
        await loop.aclose()

    asyncio.run(main())


def test_exporting_twice_gives_identical_ids():
    async def main() -> None:
        loop = await tools_session(USAGE)
        first, second = provider_and_memory(), provider_and_memory()
        otel.export(loop.log, first[0])
        otel.export(loop.log, second[0])
        a, b = ids(first[1].get_finished_spans()), ids(second[1].get_finished_spans())
        assert a == b and len(a) == 5
        assert len({x[2] for x in a}) == 5  # every span its own id
        await loop.aclose()

    asyncio.run(main())


def documented_ids(session: str) -> Any:
    """docs/tracing.md's derivation, written here from the text: SHA-256 of ``kerman\\0{session}``
    as big-endian words k0..k3, each id a word xor the seq through SplitMix64's finaliser."""
    digest = hashlib.sha256(b"kerman\x00" + session.encode()).digest()
    k = [int.from_bytes(digest[i : i + 8], "big") for i in range(0, 32, 8)]
    mask = 2**64 - 1

    def mix(z: int) -> int:
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 & mask
        z = (z ^ (z >> 27)) * 0x94D049BB133111EB & mask
        return z ^ (z >> 31)

    return (lambda seq: mix(k[1] ^ seq) << 64 | mix(k[2] ^ seq)), (lambda seq: mix(k[0] ^ seq))


def test_ids_are_derived_from_the_session_and_the_seqs_as_documented():
    async def main() -> None:
        loop = await tools_session(USAGE)
        provider, memory = provider_and_memory()
        otel.export(loop.log, provider)
        trace_of, span_of = documented_ids(loop.log.id)
        seqs = {e.type: e.seq for e in loop.log.events(0, len(loop.log)) if e.type in ("turn/start", "assistant/message")}
        calls = {e.data["name"]: e.seq for e in loop.log.events(0, len(loop.log)) if e.type == "tool/call"}
        by = tree(memory.get_finished_spans())
        agent = by["invoke_agent kerman"].context
        assert (agent.trace_id, agent.span_id) == (trace_of(seqs["turn/start"]), span_of(seqs["turn/start"]))
        assert by["execute_tool slow"].context.span_id == span_of(calls["slow"])
        assert by["chat"].context.span_id == span_of(seqs["assistant/message"])  # the last request's
        assert (otel.trace_id_of("s", 7), otel.span_id_of("s", 7)) == (documented_ids("s")[0](7), documented_ids("s")[1](7))
        await loop.aclose()

    asyncio.run(main())


def test_a_crashed_turn_and_its_continuation_are_one_trace(tmp_path):
    async def main() -> None:
        alive = kerman.FileStore(str(tmp_path / "alive"), durability="none")
        streaming = asyncio.Event()
        never = asyncio.Event()

        async def hangs(request: Any) -> Any:
            yield {"type": "usage", **USAGE}
            yield {"type": "text-delta", "text": "par"}
            streaming.set()
            await never.wait()

        log = alive.create("s")
        loop = kerman.AgentLoop(hangs, log=log)
        loop.followup("go")
        await streaming.wait()  # set once the loop asked for the chunk after "par": both are logged
        await log.flush()  # on disk: what a crash would leave
        # The process "dies" here: what is on disk is what a crash leaves.
        (tmp_path / "dead").mkdir()
        for f in (tmp_path / "alive").iterdir():
            if f.suffix == ".jsonl":
                shutil.copy(f, tmp_path / "dead" / f.name)
        loop.cancel()
        await loop.aclose()
        log.close()

        store = kerman.FileStore(str(tmp_path / "dead"), durability="none")
        with store.open("s") as reopened:  # appends turn/end interrupted
            again = await tools_session(USAGE, log=reopened)
            await again.aclose()
            provider, memory = provider_and_memory()
            assert otel.export(reopened, provider) == 2
            spans = memory.get_finished_spans()
            agents = sorted((s for s in spans if s.name.startswith("invoke_agent")), key=lambda s: s.attributes["kerman.turn"])
            crashed, continued = agents
            assert crashed.attributes["kerman.turn.end"] == "interrupted" and crashed.status.status_code is StatusCode.ERROR
            assert {s.context.trace_id for s in spans} == {crashed.context.trace_id}  # one trace
            assert continued.parent.span_id == crashed.context.span_id
            [cut] = [s for s in spans if s.name == "chat" and s.parent.span_id == crashed.context.span_id]
            assert cut.attributes["kerman.request.outcome"] == "failed" and cut.attributes["gen_ai.usage.input_tokens"] == 100
            # and once more, from scratch: the same ids
            provider2, memory2 = provider_and_memory()
            otel.export(reopened, provider2)
            assert ids(memory2.get_finished_spans()) == ids(spans)

    asyncio.run(main())


class Raising(SpanExporter):
    def __init__(self) -> None:
        self.calls = 0

    def export(self, spans: Any) -> SpanExportResult:
        self.calls += 1
        raise RuntimeError("collector down")

    def shutdown(self) -> None:
        pass


class Blocking(SpanExporter):
    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.spans: List[Any] = []

    def export(self, spans: Any) -> SpanExportResult:
        self.entered.set()
        self.release.wait()
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def test_a_live_exporter_that_raises_does_not_touch_the_loop():
    async def main() -> None:
        exporter = Raising()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        loop = kerman.AgentLoop(calling(USAGE))

        @loop.tool
        async def slow() -> str:
            """x"""
            return "slow"

        @loop.tool
        async def fast() -> str:
            """y"""
            return "fast"

        live = otel.instrument(loop, provider)
        loop.followup("go")
        await loop.when_idle()
        assert loop.log[-1].data["reason"] == {"kind": "completed"}
        assert live.flush(10)
        live.close(10)
        assert exporter.calls == 5  # every span was offered; the SDK's processor caught each failure
        await loop.aclose()

    asyncio.run(main())


def test_a_builder_that_raises_is_counted_not_propagated(monkeypatch):
    async def main() -> None:
        provider, memory = provider_and_memory()
        loop = kerman.AgentLoop(calling(USAGE))
        live = otel.instrument(loop, provider)

        def boom(view: Any) -> None:
            raise ValueError("bad span")

        monkeypatch.setattr(live.builder, "add", boom)
        loop.followup("go")  # no tools registered: the calls fail as unknown tools, the turn goes on
        await loop.when_idle()
        assert live.flush(10) and live.errors == len(loop.log)
        live.close(10)
        await loop.aclose()

    asyncio.run(main())


def test_a_blocked_exporter_does_not_slow_the_loop_and_catches_up():
    async def main() -> None:
        exporter = Blocking()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        loop = await tools_session(USAGE)  # turn 1, before instrumenting: caught up from the log
        live = otel.instrument(loop, provider)
        await asyncio.to_thread(exporter.entered.wait, 10)  # the exporter is stuck in its first export
        loop.followup("again")
        await loop.when_idle()  # the loop runs a whole turn while the exporter is blocked
        assert loop.log[-1].data == {"turn": 2, "reason": {"kind": "completed"}}
        assert exporter.spans == []
        exporter.release.set()
        assert await asyncio.to_thread(live.flush, 10)
        live.close(10)
        assert sorted(s.name for s in exporter.spans).count("invoke_agent kerman") == 2
        await loop.aclose()

    asyncio.run(main())


def test_kerman_log_otel_writes_otlp_json_and_sends_to_an_endpoint(tmp_path, capsys):
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    import http.server
    import json

    from kerman import cli

    async def main() -> None:
        store = kerman.FileStore(str(tmp_path))
        with store.create("s") as log:
            loop = await tools_session(USAGE, log=log)
            await loop.aclose()
            provider, memory = provider_and_memory()
            otel.export(log, provider)
            return ids(memory.get_finished_spans())

    expected = asyncio.run(main())
    out = tmp_path / "spans.json"
    assert cli.main(["log", "otel", str(tmp_path), "s", "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    [resource] = data["resourceSpans"]
    assert {"key": "service.name", "value": {"stringValue": "kerman"}} in resource["resource"]["attributes"]
    spans = [s for scope in resource["scopeSpans"] for s in scope["spans"]]
    got = sorted(
        (s["name"], int(s["traceId"], 16), int(s["spanId"], 16), int(s["parentSpanId"], 16) if s.get("parentSpanId") else None)
        for s in spans
    )
    assert got == expected  # the ids kerman.otel.export derives, in hex as OTLP/JSON writes them

    received: List[bytes] = []

    class Collector(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=server.handle_request)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
        assert cli.main(["log", "otel", str(tmp_path), "s", "--endpoint", url]) == 0
    finally:
        thread.join(10)
        server.server_close()
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest.FromString(received[0])
    assert sorted(s.name for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans) == sorted(e[0] for e in expected)
    assert "sent 5 spans" in capsys.readouterr().err
