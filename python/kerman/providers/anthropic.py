"""Anthropic's Messages API (``POST /v1/messages``) over the official ``anthropic`` SDK."""

from __future__ import annotations

import json
from typing import Any, AsyncIterator, Dict, List, Optional

from .._core import AssistantMessage, ToolResultMessage
from ..hooks import ModelReply
from ._base import (
    DEFAULT_RETRY,
    Blocks,
    ReplyBuilder,
    SdkClientProvider,
    classify,
    image_parts,
    merge_turns,
    parse_arguments,
    partial_usage,
    require,
    sdk_client,
    usage_chunk,
    usage_dict,
)

__all__ = ["Anthropic"]

MAX_TOKENS_REASONS = ("max_tokens", "model_context_window_exceeded")


def _image(block: Dict[str, Any]) -> Dict[str, Any]:
    media, data, url = image_parts(block)
    if url:
        return {"type": "image", "source": {"type": "url", "url": url}}
    return {"type": "image", "source": {"type": "base64", "media_type": media or "image/png", "data": data or ""}}


class Anthropic(SdkClientProvider):
    """A Kerman model over Anthropic's Messages API.

    ``Anthropic("claude-sonnet-5-5")`` builds an ``anthropic.AsyncAnthropic`` client from the
    environment (``ANTHROPIC_API_KEY``...) with ``max_retries=0`` (Kerman's ``request_error``
    seam decides about retries); pass ``client=`` to use your own, or ``base_url=`` /
    ``api_key=`` / ``timeout=``. ``max_tokens`` is required by the API (default 4096). Other
    keyword arguments (``thinking={"type": "enabled", "budget_tokens": 2048}``,
    ``stop_sequences``, ``extra_body``...) go to ``client.messages.create`` on every request,
    and ``request.options`` over them.

    Thinking blocks are kept signed: a streamed reply's signatures travel in a ``provider-data``
    chunk, a non-streamed reply's in ``block["anthropic"]["signature"]``, and the next request
    sends them back, so tool use with extended thinking works across steps and restarts.
    Reasoning blocks without a signature (an interrupted stream, another provider's) are left
    out of requests: the API refuses unsigned thinking.
    """

    protocol = "anthropic"
    vendor = "anthropic"

    def __init__(
        self,
        model: str,
        *,
        client: Any = None,
        max_tokens: int = 4096,
        instructions: Optional[str] = None,
        stream: bool = True,
        base_url: Optional[str] = None,
        api_key: Optional[str] = None,
        timeout: Optional[float] = None,
        cache_size: int = 10_000,
        retry: Any = DEFAULT_RETRY,
        deadline: Optional[float] = None,
        **params: Any,
    ) -> None:
        super().__init__(
            model, instructions=instructions, stream=stream, cache_size=cache_size, params=params, retry=retry, deadline=deadline
        )
        self._sdk = require("anthropic", "anthropic", type(self).__name__)
        client, owned = sdk_client(self._sdk.AsyncAnthropic, client, base_url, api_key, timeout)
        self._owns_client = owned
        self.client = client
        self.max_tokens = int(max_tokens)

    def _repr_extra(self) -> str:
        return f", max_tokens={self.max_tokens}" + super()._repr_extra()

    # -- request --

    def _convert(self, m: Any, blocks: Optional[Blocks], request: Any = None) -> Optional[Dict[str, Any]]:
        kind = type(m)
        if kind is ToolResultMessage:
            inner = m.content[0] if m.content else {}
            content = inner.get("content")
            wire: Dict[str, Any] = {"type": "tool_result", "tool_use_id": m.call_id}
            if isinstance(content, list) and any(b.get("type") == "image" for b in content):
                wire["content"] = [
                    {"type": "text", "text": b["text"]} if b.get("type") == "text" else _image(b)
                    for b in content
                    if b.get("type") == "image" or (b.get("type") == "text" and b.get("text"))
                ]
            else:
                wire["content"] = (
                    "\n".join(b.get("text") or "" for b in content or () if b.get("type") == "text")
                    if isinstance(content, list)
                    else str(content or "")
                )
            if m.is_error:
                wire["is_error"] = True
            return {"role": "user", "content": [wire]}
        content = m.content if blocks is None else blocks
        out: List[Dict[str, Any]] = []
        if kind is AssistantMessage:
            for b in content:
                t = b.get("type")
                if t == "text":
                    if b.get("text"):
                        out.append({"type": "text", "text": b["text"]})
                elif t == "tool-call":
                    out.append({"type": "tool_use", "id": b.get("id"), "name": b.get("name"), "input": parse_arguments(b.get("arguments"))})
                elif t == "reasoning":
                    opaque = b.get("anthropic") or {}
                    if opaque.get("redacted"):
                        out.append({"type": "redacted_thinking", "data": opaque["redacted"]})
                    elif opaque.get("signature"):
                        out.append({"type": "thinking", "thinking": b.get("text") or "", "signature": opaque["signature"]})
            return {"role": "assistant", "content": out} if out else None
        for b in content:
            t = b.get("type")
            if t == "text":
                if b.get("text"):
                    out.append({"type": "text", "text": b["text"]})
            elif t == "image":
                out.append(_image(b))
        return {"role": "user", "content": out} if out else None

    def _extend(self, out: List[Any], wires: List[Any]) -> None:
        merge_turns(out, wires, "content")  # parallel tool results go in one user turn

    def _build(self, request: Any) -> Dict[str, Any]:
        messages = self._wire(request)
        kwargs = self._params_for(request)
        kwargs.setdefault("model", self.model)
        kwargs.setdefault("max_tokens", self.max_tokens)
        kwargs["messages"] = messages
        instructions = self._instructions_for(request)
        if instructions:
            kwargs.setdefault("system", instructions)
        tools = request.tools
        if tools:
            kwargs.setdefault(
                "tools",
                [
                    {
                        "name": t["name"],
                        "description": t.get("description") or "",
                        "input_schema": t.get("parameters") or {"type": "object", "properties": {}},
                    }
                    for t in tools
                ],
            )
        output = getattr(request, "output", None)
        if output:
            # Structured output: output_config.format (kept beside other settings, e.g. effort).
            config = dict(kwargs.get("output_config") or {})
            config.setdefault("format", {"type": "json_schema", "schema": output["schema"]})
            kwargs["output_config"] = config
        kwargs["stream"] = self.stream
        return kwargs

    # -- reply --

    @staticmethod
    def _usage(start: Any, delta: Any) -> Dict[str, Any]:
        def pick(name: str) -> int:
            value = getattr(delta, name, None) if delta is not None else None
            if value is None and start is not None:
                value = getattr(start, name, None)
            return int(value or 0)

        read, written = pick("cache_read_input_tokens"), pick("cache_creation_input_tokens")
        details = getattr(delta, "output_tokens_details", None) or getattr(start, "output_tokens_details", None)
        thinking = getattr(details, "thinking_tokens", None) if details is not None else None
        return usage_chunk(pick("input_tokens") + read + written, pick("output_tokens"), read, written, thinking)

    async def _stream(self, request: Any, kwargs: Dict[str, Any]) -> AsyncIterator[Dict[str, Any]]:
        try:
            stream = await self.client.messages.create(**kwargs)
        except Exception as e:
            failure = self._failure(e)
            if failure is None:
                raise
            raise failure from None
        builder = ReplyBuilder()
        tools: Dict[int, List[Any]] = {}  # index -> [id, name, [json pieces]]
        blocks: Dict[int, Dict[str, Any]] = {}  # index -> the builder's block (text and thinking)
        start_usage: Any = None
        delta_usage: Any = None
        answered: Any = kwargs.get("model")
        stop: Optional[str] = None
        done = False
        try:
            async with stream:
                await self._check_stream(stream)
                async for event in stream:
                    kind = event.type
                    if kind == "content_block_delta":
                        d = event.delta
                        dk = d.type
                        if dk == "text_delta":
                            out = builder.delta("text", d.text)
                            if out is not None:
                                yield out
                        elif dk == "thinking_delta":
                            out = builder.delta("reasoning", d.thinking)
                            if out is not None:
                                yield out
                        elif dk == "input_json_delta":
                            slot = tools.get(event.index)
                            if slot is not None and d.partial_json:
                                slot[2].append(d.partial_json)
                        elif dk == "signature_delta":
                            block = blocks.get(event.index)
                            if block is not None:
                                opaque = block.get("anthropic") or {}
                                builder.annotate("anthropic", block, signature=(opaque.get("signature") or "") + d.signature)
                    elif kind == "content_block_start":
                        cb = event.content_block
                        ck = cb.type
                        if ck == "text":
                            blocks[event.index] = builder.start("text")
                            out = builder.delta("text", getattr(cb, "text", None))
                            if out is not None:
                                yield out
                        elif ck == "thinking":
                            block = blocks[event.index] = builder.start("reasoning")
                            out = builder.delta("reasoning", getattr(cb, "thinking", None))
                            if out is not None:
                                yield out
                            if getattr(cb, "signature", None):
                                builder.annotate("anthropic", block, signature=cb.signature)
                        elif ck == "redacted_thinking":
                            block = builder.start("reasoning")
                            builder.annotate("anthropic", block, redacted=cb.data)
                            builder.close()
                        elif ck == "tool_use":
                            initial = getattr(cb, "input", None)
                            tools[event.index] = [cb.id, cb.name, [json.dumps(initial)] if initial else []]
                            builder.close()
                    elif kind == "content_block_stop":
                        slot = tools.pop(event.index, None)
                        if slot is not None:
                            yield builder.tool_call(slot[0], slot[1], "".join(slot[2]) or "{}")
                        builder.close()
                    elif kind == "message_start":
                        start_usage = event.message.usage
                        answered = getattr(event.message, "model", None) or answered
                    elif kind == "message_delta":
                        if event.delta.stop_reason is not None:
                            stop = event.delta.stop_reason
                        delta_usage = event.usage
                    elif kind == "message_stop":
                        done = True
        except Exception as e:
            failure = self._failure(e, started=True)
            if start_usage is not None or delta_usage is not None:
                yield partial_usage(self._named(answered, self._usage(start_usage, delta_usage)))
            if failure is None:
                raise
            raise failure from None
        if not done:
            if start_usage is not None or delta_usage is not None:
                yield partial_usage(self._named(answered, self._usage(start_usage, delta_usage)))
            raise classify(self.protocol, status=None, message="the stream ended before message_stop", interrupted=True)
        if stop is None:  # as a Chat Completions stream that ends without a finish reason
            raise classify(
                self.protocol, status=None, message="the stream ended without a stop reason (no message_delta)", interrupted=True
            )
        data = self._remember(builder)
        if data is not None:
            yield data
        if start_usage is not None or delta_usage is not None:
            yield self._named(answered, self._usage(start_usage, delta_usage))
        yield {"type": "finish", "reason": "max-tokens" if stop in MAX_TOKENS_REASONS else "stop", "providerReason": stop}

    async def _complete(self, request: Any, kwargs: Dict[str, Any]) -> ModelReply:
        try:
            message = await self.client.messages.create(**kwargs)
        except Exception as e:
            failure = self._failure(e, stream=False)
            if failure is None:
                raise
            raise failure from None
        bad = self._reply_failure(message, "content")
        if bad is not None:
            raise bad
        blocks: Blocks = []
        for b in message.content:
            t = b.type
            if t == "text":
                blocks.append({"type": "text", "text": b.text})
            elif t == "thinking":
                blocks.append({"type": "reasoning", "text": b.thinking, "anthropic": {"signature": b.signature}})
            elif t == "redacted_thinking":
                blocks.append({"type": "reasoning", "text": "", "anthropic": {"redacted": b.data}})
            elif t == "tool_use":
                blocks.append({"type": "tool-call", "id": b.id, "name": b.name, "arguments": json.dumps(b.input)})
        usage = usage_dict(self._named(getattr(message, "model", None) or kwargs.get("model"), self._usage(message.usage, None)))
        return ModelReply(blocks, usage=usage, finish="max-tokens" if message.stop_reason in MAX_TOKENS_REASONS else "stop")
