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
        description="A session's spans, built from its log as kerman.otel.export does (docs/tracing.md), "
        "folded and encoded by Kerman's core: OTLP/JSON to a file (or stdout), or OTLP protobuf sent to an "
        "OTLP/HTTP endpoint (headers from OTEL_EXPORTER_OTLP_HEADERS). Needs kerman[otel].",
    )
    sub.add_argument("store", help=store_help)
    sub.add_argument("id", help="the session id")
    sub.add_argument("-o", "--output", metavar="FILE", default="-", help="where the OTLP/JSON goes (default: stdout)")
    sub.add_argument("--endpoint", metavar="URL", help="send the spans to this OTLP/HTTP traces endpoint instead")
    sub.add_argument("--model", help="the model that served requests whose model the log does not record")
    sub.add_argument("--provider", help="its provider (openai, anthropic, google, ...)")
    sub.add_argument("--service-name", default="kerman", help="the resource's service.name (default: kerman)")
    sub.set_defaults(handler=_cmd_otel)


def _cmd_otel(args: argparse.Namespace) -> int:
    try:
        from ..otel import latest_conventions
        from ..otel._native import OtlpSender, headers_from_env, native_spans
    except ImportError as e:
        raise _Exit(2, f"kerman: {e}") from None
    header, events, _ = _read(args)
    # The core folds and encodes the spans (the same spans and ids as kerman.otel.export).
    spans = native_spans(
        header.get("id", args.id),
        model=args.model,
        provider=args.provider,
        latest=latest_conventions(),
        resource={"service.name": args.service_name},
    )
    spans.add(events)
    spans.finish()
    count = spans.pending
    if args.endpoint:
        body = spans.take("protobuf")
        if body is not None:
            sender = OtlpSender(args.endpoint, headers_from_env())
            try:
                sender(body)
            except Exception as e:
                raise _Exit(1, f"kerman: {args.endpoint} did not accept the {count} spans: {e}") from None
            finally:
                sender.close()
        _err(f"kerman: sent {count} spans to {args.endpoint}")
        return 0
    text = spans.take("json") or json.dumps({"resourceSpans": []})
    if args.output == "-":
        _out(text)
    else:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text + "\n")
        _err(f"kerman: wrote {count} spans to {args.output}")
    return 0
