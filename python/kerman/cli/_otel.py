"""``kerman log otel STORE ID``: a session's spans (kerman.otel) as OTLP/JSON, to a file or stdout,
or sent to an OTLP/HTTP endpoint."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ._common import _err, _Exit, _out
from ._log import _read


def add_parser(log_commands: Any, store_help: str) -> None:
    sub = log_commands.add_parser(
        "otel",
        help="export a session's OpenTelemetry spans (OTLP/JSON, or to an OTLP endpoint)",
        description="A session's spans, built from its log as kerman.otel.export does (docs/tracing.md): "
        "OTLP/JSON to a file (or stdout), or sent to an OTLP/HTTP endpoint. Needs kerman[otel].",
    )
    sub.add_argument("store", help=store_help)
    sub.add_argument("id", help="the session id")
    sub.add_argument("-o", "--output", metavar="FILE", default="-", help="where the OTLP/JSON goes (default: stdout)")
    sub.add_argument("--endpoint", metavar="URL", help="send the spans to this OTLP/HTTP traces endpoint instead")
    sub.add_argument("--model", help="the model that served requests whose model the log does not record")
    sub.add_argument("--provider", help="its provider (openai, anthropic, google, ...)")
    sub.add_argument("--service-name", default="kerman", help="the resource's service.name (default: kerman)")
    sub.set_defaults(handler=_cmd_otel)


class _Events:
    """A session read by the CLI, shaped as export() reads a log."""

    def __init__(self, session_id: str, events: Any) -> None:
        self.id = session_id
        self._events = events

    def events(self, view: bool = False) -> Any:
        from .. import events as ev

        return ev.views(self._events) if view else iter(self._events)


def _cmd_otel(args: argparse.Namespace) -> int:
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        from .. import otel
        from ..otel._otlp import send, to_otlp_json
    except ImportError as e:
        raise _Exit(2, f"kerman: {e}") from None
    header, events, _ = _read(args)
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": args.service_name}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    otel.export(_Events(header.get("id", args.id), events), provider, model=args.model, provider=args.provider)
    spans = list(memory.get_finished_spans())
    try:
        if args.endpoint:
            if not send(spans, args.endpoint):
                raise _Exit(1, f"kerman: {args.endpoint} did not accept the {len(spans)} spans")
            _err(f"kerman: sent {len(spans)} spans to {args.endpoint}")
            return 0
        text = json.dumps(to_otlp_json(spans), ensure_ascii=False, separators=(",", ":"))
    except ImportError as e:
        raise _Exit(2, f"kerman: {e}") from None
    if args.output == "-":
        _out(text)
    else:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text + "\n")
        _err(f"kerman: wrote {len(spans)} spans to {args.output}")
    return 0
