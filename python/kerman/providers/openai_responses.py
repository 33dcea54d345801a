"""OpenAI's Responses API (``POST /v1/responses``) over the official ``openai`` SDK."""

from __future__ import annotations

from typing import Any, AsyncIterator, Dict, List, Optional

from .._core import AssistantMessage, ToolResultMessage
from ..hooks import ModelReply
from ..output import openai_schema
from ._base import (
    DEFAULT_RETRY,
    Blocks,
    ReplyBuilder,
    SdkClientProvider,
    classify,
    data_url,
    image_parts,
    require,
    sdk_client,
    tool_result_text,
    usage_chunk,
    usage_dict,
)

__all__ = ["OpenAIResponses"]


def _item_dict(item: Any) -> Dict[str, Any]:
    """A reasoning output item as the input item that sends it back."""
    data = item.model_dump(exclude_none=True, mode="json") if hasattr(item, "model_dump") else dict(item)
    data.pop("status", None)
    data.setdefault("summary", [])
    return data


class OpenAIResponses(SdkClientProvider):
    """A Kerman model over OpenAI's Responses API (stateless: every request carries the whole
    history as input items; ``previous_response_id`` is not used).

    The client is built as for :class:`OpenAIChat` (``max_retries=0``; ``client=`` /
    ``base_url=`` / ``api_key=`` / ``timeout=``). Other keyword arguments (``reasoning={"effort":
    "low", "summary": "auto"}``, ``max_output_tokens``, ``store``, ``include``...) go to
    ``client.responses.create``, and ``request.options`` over them.

    Reasoning models return reasoning items that the next request must carry back, together
    with the items that followed them. The provider keeps each item (id, summary and, with
    ``store=False``, its encrypted content: ``include=["reasoning.encrypted_content"]`` is then
    added for you) and sends the reply back item for item. A reply without reasoning is sent
    back as plain input (an assistant message and ``function_call`` items without ids).
    """

    protocol = "openai-responses"
    vendor = "openai"

    def __init__(
        self,
        model: str,
        *,
        client: Any = None,
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
        self._sdk = require("openai", "openai", type(self).__name__)
        client, owned = sdk_client(self._sdk.AsyncOpenAI, client, base_url, api_key, timeout)
        self._owns_client = owned
        self.client = client

    # -- request --

    def _convert(self, m: Any, blocks: Optional[Blocks], request: Any = None) -> List[Dict[str, Any]]:
        kind = type(m)
        if kind is ToolResultMessage:
            inner = m.content[0] if m.content else {}
            return [{"type": "function_call_output", "call_id": m.call_id, "output": tool_result_text(inner)}]
        content = m.content if blocks is None else blocks
        if kind is AssistantMessage:
            out: List[Dict[str, Any]] = []
            for b in content:
                t = b.get("type")
                opaque = b.get("openai") or {}
                if t == "text":
                    text = b.get("text") or ""
                    if opaque.get("id"):
                        item: Dict[str, Any] = {
                            "type": "message",
                            "role": "assistant",
                            "id": opaque["id"],
                            "status": "completed",
                            "content": [{"type": "output_text", "text": text, "annotations": []}],
                        }
                        if opaque.get("phase"):
                            item["phase"] = opaque["phase"]
                        out.append(item)
                    elif text:
                        out.append({"role": "assistant", "content": text})
                elif t == "tool-call":
                    call: Dict[str, Any] = {
                        "type": "function_call",
                        "call_id": b.get("id"),
                        "name": b.get("name"),
                        "arguments": b.get("arguments") or "{}",
                    }
                    if opaque.get("id"):
                        call["id"] = opaque["id"]
                        call["status"] = "completed"
                    out.append(call)
                elif t == "reasoning":
                    if opaque.get("item"):
                        out.append(opaque["item"])
            return out
        parts: List[Dict[str, Any]] = []
        images = False
        for b in content:
            t = b.get("type")
            if t == "text":
                parts.append({"type": "input_text", "text": b.get("text") or ""})
            elif t == "image":
                media, data, url = image_parts(b)
                parts.append({"type": "input_image", "image_url": url if url else data_url(media, data or ""), "detail": "auto"})
                images = True
        if not images:
            return [{"role": "user", "content": "\n".join(p["text"] for p in parts)}]
        return [{"role": "user", "content": parts}]

    def _extend(self, out: List[Any], wires: List[Any]) -> None:
        for items in wires:
            out.extend(items)

    def _build(self, request: Any) -> Dict[str, Any]:
        items = self._wire(request)
        kwargs = self._params_for(request)
        kwargs.setdefault("model", self.model)
        kwargs["input"] = items
        instructions = self._instructions_for(request)
        if instructions:
            kwargs.setdefault("instructions", instructions)
        tools = request.tools
        if tools:
            kwargs.setdefault(
                "tools",
                [
                    {
                        "type": "function",
                        "name": t["name"],
                        "description": t.get("description") or "",
                        "parameters": t.get("parameters") or {"type": "object", "properties": {}},
                        "strict": False,
                    }
                    for t in tools
                ],
            )
        if kwargs.get("store") is False:
            include = list(kwargs.get("include") or ())
            if "reasoning.encrypted_content" not in include:
                include.append("reasoning.encrypted_content")
            kwargs["include"] = include
        output = getattr(request, "output", None)
        if output:
            # Structured output: text.format (kept beside other text settings, e.g. verbosity).
            text = dict(kwargs.get("text") or {})
            schema, strict = openai_schema(output)
            text.setdefault("format", {"type": "json_schema", "name": output["name"], "schema": schema, "strict": strict})
            kwargs["text"] = text
        kwargs["stream"] = self.stream
        return kwargs

    # -- reply --

    @staticmethod
    def _usage(u: Any) -> Dict[str, Any]:
        inp = getattr(u, "input_tokens_details", None)
        out = getattr(u, "output_tokens_details", None)
        return usage_chunk(
            getattr(u, "input_tokens", 0),
            getattr(u, "output_tokens", 0),
            getattr(inp, "cached_tokens", None) if inp is not None else None,
            getattr(inp, "cache_write_tokens", None) if inp is not None else None,
            getattr(out, "reasoning_tokens", None) if out is not None else None,
        )

    @staticmethod
    def _finish(response: Any) -> Dict[str, Any]:
        details = getattr(response, "incomplete_details", None)
        reason = getattr(details, "reason", None) if details is not None else None
        status = getattr(response, "status", None)
        return {"type": "finish", "reason": "max-tokens" if reason == "max_output_tokens" else "stop", "providerReason": reason or status}

    def _failed(self, response: Any) -> Exception:
        error = getattr(response, "error", None)
        code = getattr(error, "code", None) if error is not None else None
        message = getattr(error, "message", None) if error is not None else None
        return classify(self.protocol, status=None, kind=code, message=message or "the response failed", secrets=self._secrets())

    async def _stream(self, request: Any, kwargs: Dict[str, Any]) -> AsyncIterator[Dict[str, Any]]:
        try:
            stream = await self.client.responses.create(**kwargs)
        except Exception as e:
            failure = self._failure(e)
            if failure is None:
                raise
            raise failure from None
        builder = ReplyBuilder()
        items: Dict[int, Dict[str, Any]] = {}  # output_index -> the builder's block
        calls: Dict[int, List[Any]] = {}  # output_index -> [item id, call id, name, [pieces]]
        parts: Dict[int, int] = {}  # output_index -> the reasoning summary part being streamed
        reasoning_seen = False
        final: Any = None
        try:
            async with stream:
                await self._check_stream(stream)
                async for event in stream:
                    kind = event.type
                    if kind == "response.output_text.delta" or kind == "response.refusal.delta":
                        out = builder.delta("text", event.delta)
                        if out is not None:
                            yield out
                    elif kind == "response.reasoning_summary_text.delta" or kind == "response.reasoning_text.delta":
                        index = getattr(event, "summary_index", getattr(event, "content_index", 0)) or 0
                        previous = parts.get(event.output_index)
                        parts[event.output_index] = index
                        if previous is not None and previous != index:
                            out = builder.delta("reasoning", "\n\n")
                            if out is not None:
                                yield out
                        out = builder.delta("reasoning", event.delta)
                        if out is not None:
                            yield out
                    elif kind == "response.function_call_arguments.delta":
                        slot = calls.get(event.output_index)
                        if slot is not None:
                            slot[3].append(event.delta)
                    elif kind == "response.output_item.added":
                        item = event.item
                        it = item.type
                        if it == "reasoning":
                            items[event.output_index] = builder.start("reasoning")
                            reasoning_seen = True
                        elif it == "message":
                            items[event.output_index] = builder.start("text")
                        elif it == "function_call":
                            calls[event.output_index] = [item.id, item.call_id, item.name, []]
                            builder.close()
                    elif kind == "response.output_item.done":
                        item = event.item
                        it = item.type
                        if it == "function_call":
                            slot = calls.pop(event.output_index, None)
                            arguments = item.arguments if item.arguments is not None else "".join(slot[3] if slot else ())
                            yield builder.tool_call(
                                item.call_id, item.name, arguments or "{}", **({"openai": {"id": item.id}} if item.id else {})
                            )
                        elif it == "reasoning":
                            block = items.get(event.output_index) or builder.start("reasoning")
                            builder.annotate("openai", block, item=_item_dict(item))
                            builder.close()
                        elif it == "message":
                            message_block = items.get(event.output_index)
                            if message_block is not None:
                                opaque: Dict[str, Any] = {"id": item.id}
                                if getattr(item, "phase", None):
                                    opaque["phase"] = item.phase
                                message_block.setdefault("openai", {}).update(opaque)
                                builder.close()
                    elif kind in ("response.completed", "response.incomplete"):
                        final = event.response
                    elif kind == "response.failed":
                        raise self._failed(event.response)
                    elif kind == "error":
                        raise classify(
                            self.protocol,
                            status=None,
                            kind=getattr(event, "code", None),
                            message=getattr(event, "message", "") or "stream error",
                            secrets=self._secrets(),
                        )
        except Exception as e:
            failure = self._failure(e, started=True)
            if failure is None:
                raise
            raise failure from None
        if final is None:
            raise classify(self.protocol, status=None, message="the stream ended before response.completed", interrupted=True)
        if not reasoning_seen and not any((b.get("openai") or {}).get("phase") for b in builder.blocks):
            builder.annotated = False  # plain items: no need to send ids back
        data = self._remember(builder)
        if data is not None:
            yield data
        if final.usage is not None:
            yield self._named(getattr(final, "model", None) or kwargs.get("model"), self._usage(final.usage))
        yield self._finish(final)

    async def _complete(self, request: Any, kwargs: Dict[str, Any]) -> ModelReply:
        try:
            response = await self.client.responses.create(**kwargs)
        except Exception as e:
            failure = self._failure(e, stream=False)
            if failure is None:
                raise
            raise failure from None
        bad = self._reply_failure(response, "output")
        if bad is not None:
            raise bad
        if getattr(response, "status", None) == "failed":
            raise self._failed(response)
        keep = any(item.type == "reasoning" or getattr(item, "phase", None) for item in response.output)
        blocks: Blocks = []
        for item in response.output:
            it = item.type
            if it == "reasoning":
                texts = [s.text for s in item.summary or ()] or [c.text for c in getattr(item, "content", None) or ()]
                blocks.append({"type": "reasoning", "text": "\n\n".join(texts), "openai": {"item": _item_dict(item)}})
            elif it == "message":
                text = "".join(getattr(c, "text", None) or getattr(c, "refusal", None) or "" for c in item.content)
                block: Dict[str, Any] = {"type": "text", "text": text}
                if keep:
                    block["openai"] = {"id": item.id, **({"phase": item.phase} if getattr(item, "phase", None) else {})}
                blocks.append(block)
            elif it == "function_call":
                call: Dict[str, Any] = {"type": "tool-call", "id": item.call_id, "name": item.name, "arguments": item.arguments or "{}"}
                if keep and item.id:
                    call["openai"] = {"id": item.id}
                blocks.append(call)
        answered = getattr(response, "model", None) or kwargs.get("model")
        usage = usage_dict(self._named(answered, self._usage(response.usage))) if response.usage is not None else None
        finish = self._finish(response)["reason"]
        return ModelReply(blocks, usage=usage, finish=finish)
