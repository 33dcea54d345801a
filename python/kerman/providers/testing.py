"""A loopback HTTP server that speaks one vendor's wire protocol, so an agent (and these
providers) can be tested offline against the real SDKs.

>>> from kerman.providers.testing import FakeServer, Reply, ToolCall
>>> with FakeServer("openai-chat") as server:         # doctest: +SKIP
...     server.add(Reply(text=["Hel", "lo"]), Reply(tool_calls=[ToolCall("c1", "clock", "{}")]))
...     model = OpenAIChat("gpt-6.2-sol", base_url=server.url, api_key="test")

``server.url`` is the base URL to give the SDK; ``server.requests`` records every request
(method, path, headers, parsed JSON body). Each request takes the next scripted item:

* ``Reply(...)``: a model reply (text, reasoning, tool calls, usage, finish), rendered as the
  vendor's SSE stream when the request asks to stream and as its JSON body otherwise; it can
  also end early (``cut_after``: the connection drops mid-body; ``end_after``: the body ends
  cleanly but the stream never finishes), fail mid-stream (``error_after`` + ``error``) or
  stop and wait until the client disconnects (``hold_after``, or ``hold_headers`` before any
  byte of the response; ``server.disconnected`` is set when it does);
* ``HttpError(status, message, ...)``: the vendor's error body with that status and headers;
* ``Raw(status, headers, body)``: bytes as they are, or a list of SSE events (for wire-level
  tests);
* a callable ``fn(request) -> item``.

Once the script is empty, a request gets ``default`` (a ``FakeServer(..., default=Reply(...))``
answers every request alike), or a 500 saying the script is exhausted.

Protocols: ``"openai-chat"`` (``/v1/chat/completions``), ``"openai-responses"``
(``/v1/responses``), ``"anthropic"`` (``/v1/messages``), ``"gemini"``
(``/v1/models/{model}:generateContent`` and ``:streamGenerateContent?alt=sse``, ``/v1beta`` too). With
``api_key=`` set, a request with another key gets the vendor's 401, whose body quotes the key
it was sent (as some servers do), so tests can check that errors never show it. Only the
standard library is used; the server runs in a daemon thread on 127.0.0.1.
"""

from __future__ import annotations

import collections
import json
import socket
import threading
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Deque, Dict, Iterable, List, Optional, Sequence, Set, Tuple, Union
from urllib.parse import parse_qs, urlsplit

__all__ = ["FakeServer", "Reply", "ToolCall", "HttpError", "Raw", "Request", "PROTOCOLS"]

PROTOCOLS = ("openai-chat", "openai-responses", "anthropic", "gemini")
HOLD_TIMEOUT = 30.0  # seconds a held stream waits for the client before giving up


@dataclass
class ToolCall:
    """A tool call in a scripted reply; ``pieces`` is how many deltas its arguments stream in."""

    id: str
    name: str
    arguments: str = "{}"
    pieces: int = 2
    signature: Optional[str] = None  # gemini: a thought signature on this call's part


@dataclass
class HttpError:
    """An HTTP error in the vendor's shape. ``kind`` is its error type/code (defaults by status)."""

    status: int
    message: str = "error"
    kind: Optional[str] = None
    headers: Dict[str, str] = field(default_factory=dict)


@dataclass
class Reply:
    """A scripted model reply. ``text``/``reasoning``: a str (one delta) or a list of deltas.
    ``signature``: Anthropic's thinking signature, a Responses reasoning item's encrypted
    content, or a Gemini thought signature. ``usage`` uses Kerman's names (``input``,
    ``output``, ``cacheRead``, ``cacheWrite``, ``reasoning``) and is rendered the vendor's way."""

    text: Union[str, Sequence[str]] = ""
    reasoning: Union[str, Sequence[str]] = ""
    signature: Optional[str] = None
    redacted: Optional[str] = None  # anthropic: a redacted_thinking block's data
    tool_calls: Sequence[ToolCall] = ()
    usage: Optional[Dict[str, int]] = None
    finish: str = "stop"  # "stop" | "max-tokens" | a vendor reason as it is
    cut_after: Optional[int] = None
    end_after: Optional[int] = None
    hold_after: Optional[int] = None
    error_after: Optional[int] = None
    cut_after_text: Optional[int] = None  # cut / hold once this many text deltas were sent
    hold_after_text: Optional[int] = None
    hold_headers: bool = False  # wait for the client to disconnect before sending anything
    error: Optional[HttpError] = None
    headers: Dict[str, str] = field(default_factory=dict)


@dataclass
class Raw:
    """A response as it is: ``body`` bytes (or str), or a list (any iterable: a generator can
    stream for as long as it likes) of SSE events, each a ``(event, data)`` pair, a str (the
    data of an unnamed event) or bytes (sent as they are, e.g. a ``b": keep-alive\\n\\n"``
    comment), sent chunk by chunk."""

    status: int = 200
    headers: Dict[str, str] = field(default_factory=dict)
    body: Union[bytes, str, Iterable[Any]] = b""


@dataclass
class Request:
    """One request the server received."""

    method: str
    path: str
    query: Dict[str, List[str]]
    headers: Dict[str, str]
    body: Any
    raw: bytes

    @property
    def stream(self) -> bool:
        if "streamGenerateContent" in self.path:
            return True
        return isinstance(self.body, dict) and bool(self.body.get("stream"))


Item = Union[Reply, HttpError, Raw, Callable[[Request], Any]]


def _pieces(value: Union[str, Sequence[str]]) -> List[str]:
    if isinstance(value, str):
        return [value] if value else []
    return [p for p in value]


def _split(text: str, n: int) -> List[str]:
    if n <= 1 or len(text) <= 1:
        return [text]
    size = max(1, -(-len(text) // n))
    return [text[i : i + size] for i in range(0, len(text), size)]


class FakeServer:
    """A loopback server for one protocol. Use as a context manager, or ``close()`` it."""

    def __init__(self, protocol: str, *, api_key: Optional[str] = None, model: str = "fake-model", default: Optional[Item] = None) -> None:
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
        self.protocol = protocol
        self.api_key = api_key
        self.model = model
        self.default = default  # what a request gets once the script is empty (else a 500)
        self.requests: List[Request] = []
        self.disconnected = threading.Event()
        self.received = threading.Event()  # set when a request arrives
        self.disconnects = 0
        self._script: Deque[Item] = collections.deque()
        self._lock = threading.Lock()
        self._held: Set[socket.socket] = set()
        self._closing = False
        self.hold_timeouts = 0
        self._ids = 0
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name=f"fake-{protocol}", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """The base URL to give the SDK."""
        root = f"http://127.0.0.1:{self.port}"
        return root + "/v1" if self.protocol.startswith("openai") else root

    def add(self, *items: Item) -> FakeServer:
        """Appends items to the script (one per request)."""
        with self._lock:
            self._script.extend(items)
        return self

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._script)

    def close(self) -> None:
        with self._lock:
            self._closing = True
            held = list(self._held)
        for conn in held:  # held streams end with the server
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> FakeServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<FakeServer {self.protocol} {self.url} requests={len(self.requests)} pending={self.pending}>"

    # -- internals --

    def _next(self, request: Request) -> Any:
        with self._lock:
            self._ids += 1
            item = self._script.popleft() if self._script else self.default
        if item is None:
            return HttpError(500, "fake server: script exhausted", kind="server_error")
        while callable(item) and not isinstance(item, (Reply, HttpError, Raw)):
            item = item(request)
        return item

    def _key_of(self, request: Request) -> Optional[str]:
        h = request.headers
        auth = h.get("authorization", "")
        bearer = auth[7:] if auth.lower().startswith("bearer ") else None
        if self.protocol.startswith("openai"):
            return bearer
        if self.protocol == "anthropic":
            return h.get("x-api-key") or bearer  # the SDK sends the key as a bearer token
        return h.get("x-goog-api-key") or next(iter(request.query.get("key") or ()), None)


# -- rendering -------------------------------------------------------------------------------------


def _usage_or_default(reply: Reply) -> Dict[str, int]:
    u = {"input": 10, "output": 5, "cacheRead": 0, "cacheWrite": 0, "reasoning": 0}
    if reply.usage:
        u.update(reply.usage)
    return u


def _finish(protocol: str, reply: Reply) -> str:
    f = reply.finish
    tools = bool(reply.tool_calls)
    if protocol == "openai-chat":
        return {"stop": "tool_calls" if tools else "stop", "max-tokens": "length"}.get(f, f)
    if protocol == "anthropic":
        return {"stop": "tool_use" if tools else "end_turn", "max-tokens": "max_tokens"}.get(f, f)
    if protocol == "gemini":
        return {"stop": "STOP", "max-tokens": "MAX_TOKENS"}.get(f, f)
    return f


def _error_kind(protocol: str, error: HttpError) -> str:
    if error.kind:
        return error.kind
    s = error.status
    if protocol == "anthropic":
        return {
            400: "invalid_request_error",
            401: "authentication_error",
            403: "permission_error",
            404: "not_found_error",
            413: "request_too_large",
            429: "rate_limit_error",
            529: "overloaded_error",
        }.get(s, "api_error")
    if protocol == "gemini":
        return {
            400: "INVALID_ARGUMENT",
            401: "UNAUTHENTICATED",
            403: "PERMISSION_DENIED",
            404: "NOT_FOUND",
            429: "RESOURCE_EXHAUSTED",
            503: "UNAVAILABLE",
            504: "DEADLINE_EXCEEDED",
        }.get(s, "INTERNAL")
    return {
        400: "invalid_request_error",
        401: "invalid_api_key",
        403: "permission_denied",
        404: "model_not_found",
        429: "rate_limit_exceeded",
    }.get(s, "server_error")


def _error_body(protocol: str, error: HttpError, request_id: str) -> Dict[str, Any]:
    kind = _error_kind(protocol, error)
    if protocol == "anthropic":
        return {"type": "error", "error": {"type": kind, "message": error.message}, "request_id": request_id}
    if protocol == "gemini":
        return {"error": {"code": error.status, "message": error.message, "status": kind}}
    type_ = "invalid_request_error" if error.status < 500 else "server_error"
    if error.status == 429:
        type_ = "requests"
    return {"error": {"message": error.message, "type": type_, "param": None, "code": kind}}


def _request_id_header(protocol: str) -> str:
    return {"anthropic": "request-id", "gemini": "x-request-id"}.get(protocol, "x-request-id")


def _chat_events(reply: Reply, request: Request, model: str) -> List[Tuple[Optional[str], Any]]:
    base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1700000000, "model": model}

    def chunk(delta: Dict[str, Any], finish: Optional[str] = None) -> Tuple[Optional[str], Any]:
        return None, dict(base, choices=[{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}])

    events: List[Tuple[Optional[str], Any]] = [chunk({"role": "assistant", "content": ""})]
    for piece in _pieces(reply.reasoning):
        events.append(chunk({"reasoning_content": piece}))
    for piece in _pieces(reply.text):
        events.append(chunk({"content": piece}))
    for i, call in enumerate(reply.tool_calls):
        events.append(
            chunk({"tool_calls": [{"index": i, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}]})
        )
        for piece in _split(call.arguments, call.pieces):
            events.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}))
    events.append(chunk({}, _finish("openai-chat", reply)))
    options = request.body.get("stream_options") if isinstance(request.body, dict) else None
    if isinstance(options, dict) and options.get("include_usage"):
        u = _usage_or_default(reply)
        events.append((None, dict(base, choices=[], usage=_chat_usage(u))))
    events.append((None, "[DONE]"))
    return events


def _chat_usage(u: Dict[str, int]) -> Dict[str, Any]:
    return {
        "prompt_tokens": u["input"],
        "completion_tokens": u["output"],
        "total_tokens": u["input"] + u["output"],
        "prompt_tokens_details": {"cached_tokens": u["cacheRead"], "cache_write_tokens": u["cacheWrite"]},
        "completion_tokens_details": {"reasoning_tokens": u["reasoning"]},
    }


def _chat_json(reply: Reply, request: Request, model: str) -> Dict[str, Any]:
    message: Dict[str, Any] = {"role": "assistant", "content": "".join(_pieces(reply.text)) or None}
    if reply.reasoning:
        message["reasoning_content"] = "".join(_pieces(reply.reasoning))
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in reply.tool_calls
        ]
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1700000000,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": _finish("openai-chat", reply), "logprobs": None}],
        "usage": _chat_usage(_usage_or_default(reply)),
    }


def _anthropic_blocks(reply: Reply) -> List[Dict[str, Any]]:
    blocks: List[Dict[str, Any]] = []
    if reply.reasoning or reply.signature:
        blocks.append({"type": "thinking", "thinking": "".join(_pieces(reply.reasoning)), "signature": reply.signature or ""})
    if reply.redacted:
        blocks.append({"type": "redacted_thinking", "data": reply.redacted})
    if reply.text:
        blocks.append({"type": "text", "text": "".join(_pieces(reply.text))})
    for c in reply.tool_calls:
        blocks.append({"type": "tool_use", "id": c.id, "name": c.name, "input": json.loads(c.arguments or "{}")})
    return blocks


def _anthropic_usage(u: Dict[str, int]) -> Dict[str, Any]:
    return {
        "input_tokens": u["input"] - u["cacheRead"] - u["cacheWrite"],
        "cache_read_input_tokens": u["cacheRead"],
        "cache_creation_input_tokens": u["cacheWrite"],
        "output_tokens": u["output"],
    }


def _anthropic_events(reply: Reply, request: Request, model: str) -> List[Tuple[Optional[str], Any]]:
    u = _usage_or_default(reply)
    start_usage = _anthropic_usage(u)
    start_usage["output_tokens"] = 1
    events: List[Tuple[Optional[str], Any]] = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_fake",
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": start_usage,
                },
            },
        ),
        ("ping", {"type": "ping"}),
    ]
    index = 0

    def block(start: Dict[str, Any], deltas: List[Dict[str, Any]]) -> None:
        nonlocal index
        events.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": start}))
        for d in deltas:
            events.append(("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d}))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        index += 1

    if reply.reasoning or reply.signature:
        deltas = [{"type": "thinking_delta", "thinking": p} for p in _pieces(reply.reasoning)]
        if reply.signature:
            deltas.append({"type": "signature_delta", "signature": reply.signature})
        block({"type": "thinking", "thinking": "", "signature": ""}, deltas)
    if reply.redacted:
        block({"type": "redacted_thinking", "data": reply.redacted}, [])
    if reply.text:
        block({"type": "text", "text": ""}, [{"type": "text_delta", "text": p} for p in _pieces(reply.text)])
    for c in reply.tool_calls:
        block(
            {"type": "tool_use", "id": c.id, "name": c.name, "input": {}},
            [{"type": "input_json_delta", "partial_json": p} for p in _split(c.arguments, c.pieces)],
        )
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": _finish("anthropic", reply), "stop_sequence": None},
                "usage": dict(
                    {"output_tokens": u["output"]},
                    **({"output_tokens_details": {"thinking_tokens": u["reasoning"]}} if u["reasoning"] else {}),
                ),
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def _anthropic_json(reply: Reply, request: Request, model: str) -> Dict[str, Any]:
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": _anthropic_blocks(reply),
        "stop_reason": _finish("anthropic", reply),
        "stop_sequence": None,
        "usage": _anthropic_usage(_usage_or_default(reply)),
    }


def _responses_output(reply: Reply) -> List[Dict[str, Any]]:
    out: List[Dict[str, Any]] = []
    if reply.reasoning or reply.signature:
        item: Dict[str, Any] = {
            "type": "reasoning",
            "id": "rs_fake1",
            "status": "completed",
            "summary": [{"type": "summary_text", "text": "".join(_pieces(reply.reasoning))}] if reply.reasoning else [],
        }
        if reply.signature:
            item["encrypted_content"] = reply.signature
        out.append(item)
    if reply.text:
        out.append(
            {
                "type": "message",
                "id": "msg_fake1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "".join(_pieces(reply.text)), "annotations": []}],
            }
        )
    for i, c in enumerate(reply.tool_calls):
        out.append(
            {"type": "function_call", "id": f"fc_fake{i}", "call_id": c.id, "name": c.name, "arguments": c.arguments, "status": "completed"}
        )
    return out


def _responses_usage(u: Dict[str, int]) -> Dict[str, Any]:
    return {
        "input_tokens": u["input"],
        "input_tokens_details": {"cached_tokens": u["cacheRead"], "cache_write_tokens": u["cacheWrite"]},
        "output_tokens": u["output"],
        "output_tokens_details": {"reasoning_tokens": u["reasoning"]},
        "total_tokens": u["input"] + u["output"],
    }


def _responses_object(
    reply: Reply, model: str, status: str, output: List[Dict[str, Any]], usage: Optional[Dict[str, Any]]
) -> Dict[str, Any]:
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": "resp_fake",
        "object": "response",
        "created_at": 1700000000,
        "model": model,
        "status": status,
        "output": output,
        "usage": usage,
        "error": None,
        "incomplete_details": incomplete,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }


def _responses_events(reply: Reply, request: Request, model: str) -> List[Tuple[Optional[str], Any]]:
    events: List[Tuple[Optional[str], Any]] = []

    def ev(kind: str, **data: Any) -> None:
        events.append((kind, dict(type=kind, sequence_number=len(events), **data)))

    ev("response.created", response=_responses_object(reply, model, "in_progress", [], None))
    ev("response.in_progress", response=_responses_object(reply, model, "in_progress", [], None))
    output = _responses_output(reply)
    for n, item in enumerate(output):
        kind = item["type"]
        if kind == "reasoning":
            ev("response.output_item.added", output_index=n, item=dict(item, summary=[], encrypted_content=None, status="in_progress"))
            if reply.reasoning:
                ev(
                    "response.reasoning_summary_part.added",
                    item_id=item["id"],
                    output_index=n,
                    summary_index=0,
                    part={"type": "summary_text", "text": ""},
                )
                for p in _pieces(reply.reasoning):
                    ev("response.reasoning_summary_text.delta", item_id=item["id"], output_index=n, summary_index=0, delta=p)
                text = "".join(_pieces(reply.reasoning))
                ev("response.reasoning_summary_text.done", item_id=item["id"], output_index=n, summary_index=0, text=text)
                ev(
                    "response.reasoning_summary_part.done",
                    item_id=item["id"],
                    output_index=n,
                    summary_index=0,
                    part={"type": "summary_text", "text": text},
                )
        elif kind == "message":
            ev("response.output_item.added", output_index=n, item=dict(item, content=[], status="in_progress"))
            ev(
                "response.content_part.added",
                item_id=item["id"],
                output_index=n,
                content_index=0,
                part={"type": "output_text", "text": "", "annotations": []},
            )
            for p in _pieces(reply.text):
                ev("response.output_text.delta", item_id=item["id"], output_index=n, content_index=0, delta=p, logprobs=[])
            ev(
                "response.output_text.done",
                item_id=item["id"],
                output_index=n,
                content_index=0,
                text=item["content"][0]["text"],
                logprobs=[],
            )
            ev("response.content_part.done", item_id=item["id"], output_index=n, content_index=0, part=item["content"][0])
        else:
            call = reply.tool_calls[int(item["id"][len("fc_fake") :])]
            ev("response.output_item.added", output_index=n, item=dict(item, arguments="", status="in_progress"))
            for p in _split(call.arguments, call.pieces):
                ev("response.function_call_arguments.delta", item_id=item["id"], output_index=n, delta=p)
            ev("response.function_call_arguments.done", item_id=item["id"], output_index=n, arguments=call.arguments, name=call.name)
        ev("response.output_item.done", output_index=n, item=item)
    usage = _responses_usage(_usage_or_default(reply))
    if reply.finish == "max-tokens":
        ev("response.incomplete", response=_responses_object(reply, model, "incomplete", output, usage))
    else:
        ev("response.completed", response=_responses_object(reply, model, "completed", output, usage))
    return events


def _responses_json(reply: Reply, request: Request, model: str) -> Dict[str, Any]:
    status = "incomplete" if reply.finish == "max-tokens" else "completed"
    return _responses_object(reply, model, status, _responses_output(reply), _responses_usage(_usage_or_default(reply)))


def _gemini_usage(u: Dict[str, int]) -> Dict[str, Any]:
    usage = {
        "promptTokenCount": u["input"],
        "candidatesTokenCount": u["output"] - u["reasoning"],
        "totalTokenCount": u["input"] + u["output"],
    }
    if u["cacheRead"]:
        usage["cachedContentTokenCount"] = u["cacheRead"]
    if u["reasoning"]:
        usage["thoughtsTokenCount"] = u["reasoning"]
    return usage


def _gemini_parts(reply: Reply) -> List[List[Dict[str, Any]]]:
    """The parts of each streamed chunk (one list per chunk)."""
    chunks: List[List[Dict[str, Any]]] = []
    for p in _pieces(reply.reasoning):
        chunks.append([{"text": p, "thought": True}])
    text = _pieces(reply.text)
    for p in text:
        chunks.append([{"text": p}])
    if reply.tool_calls:
        parts = []
        for c in reply.tool_calls:
            call: Dict[str, Any] = {"name": c.name, "args": json.loads(c.arguments or "{}")}
            if c.id:
                call["id"] = c.id
            part: Dict[str, Any] = {"functionCall": call}
            if c.signature:
                part["thoughtSignature"] = c.signature
            parts.append(part)
        if reply.signature and "thoughtSignature" not in parts[0]:
            parts[0]["thoughtSignature"] = reply.signature
        chunks.append(parts)
    elif reply.signature:
        if text:
            chunks[-1][-1]["thoughtSignature"] = reply.signature
        else:
            chunks.append([{"text": "", "thoughtSignature": reply.signature}])
    return chunks


def _gemini_events(reply: Reply, request: Request, model: str) -> List[Tuple[Optional[str], Any]]:
    chunks = _gemini_parts(reply) or [[{"text": ""}]]
    u = _usage_or_default(reply)
    events: List[Tuple[Optional[str], Any]] = []
    for i, parts in enumerate(chunks):
        last = i == len(chunks) - 1
        candidate: Dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        body: Dict[str, Any] = {"candidates": [candidate], "modelVersion": model, "responseId": "fake-response"}
        if last:
            candidate["finishReason"] = _finish("gemini", reply)
            body["usageMetadata"] = _gemini_usage(u)
        else:
            body["usageMetadata"] = {"promptTokenCount": u["input"], "totalTokenCount": u["input"]}
        events.append((None, body))
    return events


def _gemini_json(reply: Reply, request: Request, model: str) -> Dict[str, Any]:
    parts = [p for chunk in _gemini_parts(reply) for p in chunk]
    merged: List[Dict[str, Any]] = []
    for p in parts:  # adjacent text parts of one kind arrive as one part when not streamed
        if (
            merged
            and "text" in p
            and "text" in merged[-1]
            and p.get("thought") == merged[-1].get("thought")
            and "thoughtSignature" not in merged[-1]
        ):
            merged[-1] = dict(merged[-1], text=merged[-1]["text"] + p["text"], **{k: v for k, v in p.items() if k != "text"})
        else:
            merged.append(dict(p))
    return {
        "candidates": [{"content": {"role": "model", "parts": merged}, "finishReason": _finish("gemini", reply), "index": 0}],
        "usageMetadata": _gemini_usage(_usage_or_default(reply)),
        "modelVersion": model,
        "responseId": "fake-response",
    }


RENDER = {
    "openai-chat": (_chat_events, _chat_json),
    "openai-responses": (_responses_events, _responses_json),
    "anthropic": (_anthropic_events, _anthropic_json),
    "gemini": (_gemini_events, _gemini_json),
}

PATHS: Dict[str, Callable[[str], bool]] = {
    "openai-chat": lambda p: p == "/v1/chat/completions",
    "openai-responses": lambda p: p in ("/v1/responses", "/v1/responses/compact"),
    "anthropic": lambda p: p == "/v1/messages",
    "gemini": lambda p: (
        p.startswith(("/v1beta/models/", "/v1/models/")) and (p.endswith(":generateContent") or p.endswith(":streamGenerateContent"))
    ),
}


def _stream_error_event(protocol: str, error: HttpError, request_id: str) -> Tuple[Optional[str], Any]:
    kind = _error_kind(protocol, error)
    if protocol == "anthropic":
        return "error", {"type": "error", "error": {"type": kind, "message": error.message}, "request_id": request_id}
    if protocol == "openai-responses":
        return "response.failed", {
            "type": "response.failed",
            "sequence_number": 999,
            "response": {
                "id": "resp_fake",
                "object": "response",
                "created_at": 1700000000,
                "model": "fake",
                "status": "failed",
                "output": [],
                "error": {"code": kind, "message": error.message},
                "incomplete_details": None,
                "parallel_tool_calls": True,
                "tool_choice": "auto",
                "tools": [],
            },
        }
    if protocol == "gemini":
        return None, {"error": {"code": error.status, "message": error.message, "status": kind}}
    return None, {"error": {"message": error.message, "type": "server_error", "param": None, "code": kind}}


def _is_text(protocol: str, event: Tuple[Optional[str], Any]) -> bool:
    """Whether a rendered event carries visible text (for ``cut_after_text``/``hold_after_text``)."""
    name, data = event
    if not isinstance(data, dict):
        return False
    if protocol == "openai-chat":
        return any((c.get("delta") or {}).get("content") for c in data.get("choices") or ())
    if protocol == "openai-responses":
        return name == "response.output_text.delta"
    if protocol == "anthropic":
        return name == "content_block_delta" and data["delta"].get("type") == "text_delta"
    return any("text" in p and not p.get("thought") and p["text"] for c in data.get("candidates") or () for p in c["content"]["parts"])


def _at_text(protocol: str, events: List[Tuple[Optional[str], Any]], n: Optional[int]) -> Optional[int]:
    """The index of the event right after the n-th text event."""
    if n is None:
        return None
    seen = 0
    for i, event in enumerate(events):
        if seen >= n:
            return i
        if _is_text(protocol, event):
            seen += 1
    return len(events)


def _sse(event: Optional[str], data: Any) -> bytes:
    if isinstance(data, bytes):
        return data  # sent as it is: a keep-alive comment, a hand-made frame
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return (head + f"data: {text}\n\n").encode()


def _handler(server: FakeServer) -> type:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def do_GET(self) -> None:
            self._handle()

        def do_POST(self) -> None:
            self._handle()

        def _handle(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = None
            split = urlsplit(self.path)
            request = Request(self.command, split.path, parse_qs(split.query), {k.lower(): v for k, v in self.headers.items()}, body, raw)
            server.requests.append(request)
            server.received.set()
            request_id = f"req_fake_{len(server.requests)}"
            if not PATHS[server.protocol](split.path):
                self._json(404, _error_body(server.protocol, HttpError(404, f"no route {split.path}"), request_id), {})
                return
            if server.api_key is not None:
                sent = server._key_of(request)
                if sent != server.api_key:
                    error = HttpError(401, f"Incorrect API key provided: {sent}.")
                    if server.protocol == "gemini":
                        error = HttpError(400, f"API key not valid: {sent}. Please pass a valid API key.", kind="INVALID_ARGUMENT")
                    self._json(
                        error.status, _error_body(server.protocol, error, request_id), {_request_id_header(server.protocol): request_id}
                    )
                    return
            item = server._next(request)
            headers = {_request_id_header(server.protocol): request_id}
            if isinstance(item, HttpError):
                headers.update(item.headers)
                self._json(item.status, _error_body(server.protocol, item, request_id), headers)
            elif isinstance(item, Raw):
                headers.update(item.headers)
                if not isinstance(item.body, (bytes, str)):
                    self._events(item.status, ((e if isinstance(e, tuple) else (None, e)) for e in item.body), headers, None)
                else:
                    data = item.body.encode() if isinstance(item.body, str) else item.body
                    self._send(item.status, data, headers)
            elif isinstance(item, Reply) and item.hold_headers:
                self._hold()
            elif isinstance(item, Reply):
                headers.update(item.headers)
                stream, whole = RENDER[server.protocol]
                if request.stream:
                    events = stream(item, request, server.model)
                    if item.error is not None:
                        at = len(events) if item.error_after is None else item.error_after
                        events = events[:at] + [_stream_error_event(server.protocol, item.error, request_id)]
                    cut = _at_text(server.protocol, events, item.cut_after_text)
                    hold = _at_text(server.protocol, events, item.hold_after_text)
                    if cut is not None or hold is not None:
                        item = replace(
                            item,
                            cut_after=cut if cut is not None else item.cut_after,
                            hold_after=hold if hold is not None else item.hold_after,
                        )
                    self._events(200, events, headers, item)
                else:
                    self._json(200, whole(item, request, server.model), headers)
            else:
                raise TypeError(f"FakeServer: cannot send {item!r}")

        def _send(self, status: int, data: bytes, headers: Dict[str, str], content_type: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("content-type", headers.pop("content-type", content_type))
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()

        def _json(self, status: int, body: Any, headers: Dict[str, str]) -> None:
            self._send(status, json.dumps(body).encode(), dict(headers))

        def _events(
            self, status: int, events: Iterable[Tuple[Optional[str], Any]], headers: Dict[str, str], reply: Optional[Reply]
        ) -> None:
            self.send_response(status)
            self.send_header("content-type", "text/event-stream")
            self.send_header("cache-control", "no-cache")
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for n, (event, data) in enumerate(events):
                if reply is not None:
                    if reply.cut_after is not None and n >= reply.cut_after:
                        self._cut()
                        return
                    if reply.end_after is not None and n >= reply.end_after:
                        break
                    if reply.hold_after is not None and n >= reply.hold_after:
                        self._hold()
                        return
                payload = _sse(event, data)
                try:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
                    self.wfile.flush()
                except OSError:
                    self._disconnected()
                    return
            # A Reply's events are a list (only a Raw body may be any iterable).
            if reply is not None and reply.hold_after is not None and isinstance(events, list) and reply.hold_after >= len(events):
                self._hold()
                return
            try:
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:
                self._disconnected()

        def _cut(self) -> None:
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

        def _hold(self) -> None:
            """Waits until the client closes the connection (a cancelled stream): EOF sets
            ``server.disconnected``; ``HOLD_TIMEOUT`` without it counts in ``server.hold_timeouts``."""
            self.close_connection = True
            conn = self.connection
            conn.settimeout(HOLD_TIMEOUT)
            with server._lock:
                server._held.add(conn)
            try:
                while True:
                    if conn.recv(1024) == b"":
                        break
            except TimeoutError:
                server.hold_timeouts += 1
                return
            except OSError:
                pass
            finally:
                with server._lock:
                    server._held.discard(conn)
            if not server._closing:
                self._disconnected()

        def _disconnected(self) -> None:
            self.close_connection = True
            server.disconnects += 1
            server.disconnected.set()

    return Handler
