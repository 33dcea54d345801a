"""The native live exporter (``kerman.otel.instrument(loop, endpoint=...)``) against a loopback
OTLP/HTTP collector (``http.server``, decoding what it receives with opentelemetry-proto):
what it posts, its headers, retries on 503, and an endpoint that refuses or blocks, which
neither slows nor fails the loop; and which path ``instrument`` takes."""

from __future__ import annotations

import asyncio
import http.server
import socket
import threading
from typing import Any, Iterator, List, Tuple

import pytest

import kerman

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("opentelemetry.proto")

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402

from kerman import otel  # noqa: E402


class Collector:
    """A loopback OTLP/HTTP traces endpoint: answers each POST with the next of ``statuses``
    (then 200), after ``gate`` is set; keeps each body it accepted, decoded."""

    def __init__(self, statuses: Tuple[int, ...] = ()) -> None:
        self.statuses = list(statuses)
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.requests: List[Any] = []
        self.headers: List[Any] = []
        self.attempts = 0
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                collector.attempts += 1
                collector.entered.set()
                collector.gate.wait(30)
                status = collector.statuses.pop(0) if collector.statuses else 200
                if status == 200:
                    collector.requests.append(ExportTraceServiceRequest.FromString(body))
                    collector.headers.append(self.headers)
                self.send_response(status)
                if status == 503:
                    self.send_header("Retry-After", "0")
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def spans(self) -> List[Any]:
        return [s for r in self.requests for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]

    def close(self) -> None:
        self.gate.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector()
    yield c
    c.close()


async def tool_turns(loop: kerman.AgentLoop, turns: int) -> None:
    for n in range(turns):
        loop.followup(f"turn {n}")
        await loop.when_idle()


def p4_loop() -> kerman.AgentLoop:
    async def model(request: kerman.ModelRequest) -> Any:
        if request.step == 1:
            return kerman.ModelReply(
                [{"type": "tool-call", "id": "c1", "name": "clock", "arguments": "{}"}], usage={"input": 9, "output": 1}
            )
        return kerman.ModelReply("noon", usage={"input": 12, "output": 2})

    loop = kerman.AgentLoop(model)

    @loop.tool
    async def clock() -> str:
        """The time."""
        return "12:00"

    return loop


def test_the_spans_are_posted_as_otlp_protobuf_with_the_headers(collector: Collector) -> None:
    async def main() -> None:
        loop = p4_loop()
        live = otel.instrument(loop, endpoint=collector.url, headers={"x-api-key": "k1"}, resource={"service.name": "live"})
        assert isinstance(live, otel.NativeInstrumentation)
        await tool_turns(loop, 3)
        assert await asyncio.to_thread(live.flush, 10)
        live.close(10)
        assert live.errors == 0 and live.exported == len(loop.log) - 1
        got = sorted((s.name, s.span_id) for s in collector.spans())
        expected = ExportTraceServiceRequest.FromString(otel.encode(loop.log, resource={"service.name": "live"}))
        assert got == sorted((s.name, s.span_id) for rs in expected.resource_spans for ss in rs.scope_spans for s in ss.spans)
        assert len(got) == 3 * 4
        headers = collector.headers[0]
        assert headers["Content-Type"] == "application/x-protobuf" and headers["x-api-key"] == "k1"
        names = {
            a.value.string_value for r in collector.requests for a in r.resource_spans[0].resource.attributes if a.key == "service.name"
        }
        assert names == {"live"}
        assert "errors=0" in repr(live)
        await loop.aclose()

    asyncio.run(main())


def test_a_503_is_retried_and_the_spans_arrive_once() -> None:
    collector = Collector(statuses=(503, 503))
    try:

        async def main() -> None:
            loop = p4_loop()
            live = otel.instrument(loop, endpoint=collector.url)
            await tool_turns(loop, 1)
            assert await asyncio.to_thread(live.flush, 30)
            live.close(10)
            assert live.errors == 0 and collector.attempts == 3
            assert len(collector.spans()) == 4
            await loop.aclose()

        asyncio.run(main())
    finally:
        collector.close()


def test_an_endpoint_that_refuses_neither_fails_nor_slows_the_loop(caplog: Any) -> None:
    with socket.socket() as s:  # a port nobody listens on: connections are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def main() -> None:
        loop = p4_loop()
        live = otel.instrument(loop, endpoint=f"http://127.0.0.1:{port}/v1/traces", timeout=0.3)
        await tool_turns(loop, 2)
        assert loop.log[-1].data == {"turn": 2, "reason": {"kind": "completed"}}
        assert await asyncio.to_thread(live.flush, 30)
        live.close(10)
        assert live.errors >= 1
        await loop.aclose()

    asyncio.run(main())
    assert "kerman.otel" in caplog.text  # the first failure is logged


def test_a_blocked_endpoint_does_not_slow_the_loop_and_catches_up(collector: Collector) -> None:
    async def main() -> None:
        collector.gate.clear()
        loop = p4_loop()
        await tool_turns(loop, 1)  # before instrumenting: caught up from the log
        live = otel.instrument(loop, endpoint=collector.url)
        assert await asyncio.to_thread(collector.entered.wait, 10)  # the first post is stuck
        await tool_turns(loop, 2)  # the loop runs two turns meanwhile
        assert loop.turn == 3 and collector.requests == []
        collector.gate.set()
        assert await asyncio.to_thread(live.flush, 30)
        live.close(10)
        assert sum(s.name == "invoke_agent kerman" for s in collector.spans()) == 3 and live.errors == 0
        await loop.aclose()

    asyncio.run(main())


def test_which_path_instrument_takes(monkeypatch: Any, collector: Collector) -> None:
    async def main() -> None:
        loop = p4_loop()
        monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url.removesuffix("/v1/traces"))
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20t,x-b=2")
        live = otel.instrument(loop)  # no tracer_provider and an endpoint in the environment: native
        assert isinstance(live, otel.NativeInstrumentation) and live.send.endpoint == collector.url
        assert live.send.headers["authorization"] == "Bearer t"
        await tool_turns(loop, 1)
        assert await asyncio.to_thread(live.flush, 10)
        live.close(10)
        assert len(collector.spans()) == 4
        sdk = otel.instrument(loop, TracerProvider())  # a tracer_provider: the SDK path
        assert type(sdk) is otel.Instrumentation
        sdk.close(10)
        with pytest.raises(ValueError, match="not both"):
            otel.instrument(loop, TracerProvider(), otlp=True)
        with pytest.raises(ValueError, match="http"):
            otel.instrument(loop, endpoint="collector:4318")
        await loop.aclose()

    asyncio.run(main())
