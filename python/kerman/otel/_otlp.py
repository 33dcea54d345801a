"""Spans as OTLP: JSON for a file (OTLP/JSON, ids in hex) or sent to an OTLP/HTTP endpoint, both
through OpenTelemetry's own encoder and exporter (``opentelemetry-exporter-otlp-proto-http``)."""

from __future__ import annotations

import base64
from typing import Any, Dict, List, Sequence

__all__ = ["to_otlp_json", "send"]

_IDS = ("traceId", "spanId", "parentSpanId")


def _require() -> Any:
    try:
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    except ImportError as e:
        raise ImportError("OTLP output needs the OTLP exporter: pip install opentelemetry-exporter-otlp-proto-http") from e
    return encode_spans


def _hex_ids(node: Any) -> None:
    # Protobuf's JSON mapping writes bytes as base64; OTLP/JSON wants trace and span ids in hex.
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _IDS and isinstance(value, str):
                node[key] = base64.b64decode(value).hex()
            else:
                _hex_ids(value)
    elif isinstance(node, list):
        for item in node:
            _hex_ids(item)


def to_otlp_json(spans: Sequence[Any]) -> Dict[str, Any]:
    """``spans`` (the SDK's finished spans) as an OTLP/JSON ``ExportTraceServiceRequest``."""
    encode_spans = _require()
    from google.protobuf.json_format import MessageToDict  # type: ignore[import-untyped]

    data: Dict[str, Any] = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    _hex_ids(data)
    return data


def send(spans: List[Any], endpoint: str) -> bool:
    """Sends ``spans`` to an OTLP/HTTP ``endpoint`` (``.../v1/traces``); whether it accepted them."""
    _require()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    exporter = OTLPSpanExporter(endpoint=endpoint)
    try:
        return exporter.export(spans) is SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()  # type: ignore[no-untyped-call]
