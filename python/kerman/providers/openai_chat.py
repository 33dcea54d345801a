"""OpenAI Chat Completions (``POST /v1/chat/completions``) over the official ``openai`` SDK, and
every server that speaks it (vLLM, Ollama, llama.cpp's server, LM Studio, OpenRouter, DeepSeek,
Groq...)."""

from __future__ import annotations

import importlib
from typing import Any, AsyncIterator, Dict, List, Optional, Sequence

from .._core import AssistantMessage, ToolResultMessage
from ..hooks import ModelReply
from ..output import openai_schema
from ._base import (
    DEFAULT_RETRY,
    Blocks,
    ReplyBuilder,
    SdkClientProvider,
    data_url,
    image_parts,
    mint_call_id,
    partial_usage,
    require,
    sdk_client,
    tool_result_text,
    usage_chunk,
    usage_dict,
)
from ._base import classify as _classify

__all__ = ["OpenAIChat"]


class OpenAIChat(SdkClientProvider):
    """A Kerman model over OpenAI's Chat Completions API.

    ``OpenAIChat("gpt-6.2-sol")`` builds an ``openai.AsyncOpenAI`` client from the environment
    (``OPENAI_API_KEY``, ``OPENAI_BASE_URL``...) with ``max_retries=0``: Kerman retries instead,
    with ``retry=`` (default ``kerman.providers.retry_policy()``, registered on each
    loop the provider serves; ``retry=None`` for none). ``deadline=`` (seconds) bounds each
    request in all. Both work so for every provider (docs/providers.md).
    Pass ``client=`` to use your own (its retry setting is then yours), or ``base_url=`` /
    ``api_key=`` / ``timeout=`` for the one built here. Other keyword arguments (``temperature``,
    ``reasoning_effort``, ``extra_body``...) go to ``client.chat.completions.create`` on every
    request, and ``request.options`` over them.

    Switches for OpenAI-compatible servers (docs/providers.md, "OpenAI-compatible servers"):

    * ``stream_usage=False``: do not send ``stream_options`` (servers that refuse it; the reply
      then has no usage unless the server sends it anyway);
    * ``max_tokens=N`` with ``max_tokens_field="max_tokens"`` for servers that predate
      ``max_completion_tokens`` (the default field);
    * ``parallel_tool_calls=False`` (or ``True``): sent only when set, since some servers reject
      the field;
    * ``reasoning_fields``: the delta fields read as reasoning (default ``reasoning_content``,
      then ``reasoning``); ``send_reasoning=True`` sends it back on assistant messages as
      ``reasoning_content`` (DeepSeek's thinking mode with tools wants it, most servers refuse it);
    * ``instructions_role="developer"`` to send instructions as a developer message (the
      default ``"system"`` is understood everywhere).
    """

    protocol = "openai-chat"
    vendor = "openai"
    opaque = False  # reasoning_content is plain text: nothing to keep beyond the message

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
        max_tokens: Optional[int] = None,
        max_tokens_field: str = "max_completion_tokens",
        stream_usage: bool = True,
        parallel_tool_calls: Optional[bool] = None,
        reasoning_fields: Sequence[str] = ("reasoning_content", "reasoning"),
        send_reasoning: bool = False,
        instructions_role: str = "system",
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
        if max_tokens_field not in ("max_completion_tokens", "max_tokens"):
            raise ValueError(f'max_tokens_field must be "max_completion_tokens" or "max_tokens", got {max_tokens_field!r}')
        if instructions_role not in ("system", "developer"):
            raise ValueError(f'instructions_role must be "system" or "developer", got {instructions_role!r}')
        self._owns_client = owned
        self.client = client
        self.max_tokens = max_tokens
        self.max_tokens_field = max_tokens_field
        self.stream_usage = bool(stream_usage)
        self.parallel_tool_calls = parallel_tool_calls
        self.reasoning_fields = tuple(reasoning_fields)
        self.send_reasoning = bool(send_reasoning)
        self.instructions_role = instructions_role
        try:
            schema = importlib.import_module("openai.types.chat.chat_completion_chunk").ChoiceDelta.model_fields
        except (ImportError, AttributeError):
            schema = {}
        # (field, in the SDK's schema?): fields outside it are read from the model's extras, as
        # a getattr that misses costs an exception per chunk.
        self._reasoning_reads = [(n, n in schema) for n in self.reasoning_fields]

    # -- request --

    def _convert(self, m: Any, blocks: Optional[Blocks], request: Any = None) -> Optional[Dict[str, Any]]:
        kind = type(m)
        if kind is ToolResultMessage:
            inner = m.content[0] if m.content else {}
            return {"role": "tool", "tool_call_id": m.call_id, "content": tool_result_text(inner)}
        content = m.content if blocks is None else blocks
        if kind is AssistantMessage:
            text: List[str] = []
            reasoning: List[str] = []
            calls: List[Dict[str, Any]] = []
            for b in content:
                t = b.get("type")
                if t == "text":
                    text.append(b.get("text") or "")
                elif t == "tool-call":
                    calls.append(
                        {
                            "id": b.get("id"),
                            "type": "function",
                            "function": {"name": b.get("name"), "arguments": b.get("arguments") or "{}"},
                        }
                    )
                elif t == "reasoning":
                    reasoning.append(b.get("text") or "")
            if not text and not calls:
                return None  # only reasoning (an interrupted reply): nothing the API would take
            wire: Dict[str, Any] = {"role": "assistant", "content": "".join(text) if text else None}
            if calls:
                wire["tool_calls"] = calls
            if self.send_reasoning and reasoning:
                wire["reasoning_content"] = "".join(reasoning)
            return wire
        parts: List[Dict[str, Any]] = []
        images = False
        for b in content:
            t = b.get("type")
            if t == "text":
                parts.append({"type": "text", "text": b.get("text") or ""})
            elif t == "image":
                media, data, url = image_parts(b)
                parts.append({"type": "image_url", "image_url": {"url": url if url else data_url(media, data or "")}})
                images = True
        if not images:
            return {"role": "user", "content": "\n".join(p["text"] for p in parts)}
        return {"role": "user", "content": parts}

    def _build(self, request: Any) -> Dict[str, Any]:
        messages = self._wire(request)
        instructions = self._instructions_for(request)
        if instructions:
            messages.insert(0, {"role": self.instructions_role, "content": instructions})
        kwargs = self._params_for(request)
        kwargs.setdefault("model", self.model)
        kwargs["messages"] = messages
        tools = request.tools
        if tools:
            kwargs.setdefault(
                "tools",
                [
                    {
                        "type": "function",
                        "function": {
                            "name": t["name"],
                            "description": t.get("description") or "",
                            "parameters": t.get("parameters") or {"type": "object", "properties": {}},
                        },
                    }
                    for t in tools
                ],
            )
            if self.parallel_tool_calls is not None:
                kwargs.setdefault("parallel_tool_calls", self.parallel_tool_calls)
        if self.max_tokens is not None:
            kwargs.setdefault(self.max_tokens_field, self.max_tokens)
        output = getattr(request, "output", None)
        if output:
            # Structured output: a json_schema response format (strict when the schema has a
            # strict form, which is then the one sent).
            schema, strict = openai_schema(output)
            kwargs.setdefault(
                "response_format", {"type": "json_schema", "json_schema": {"name": output["name"], "schema": schema, "strict": strict}}
            )
        kwargs["stream"] = self.stream
        if self.stream and self.stream_usage:
            kwargs.setdefault("stream_options", {"include_usage": True})
        return kwargs

    # -- reply --

    async def _stream(self, request: Any, kwargs: Dict[str, Any]) -> AsyncIterator[Dict[str, Any]]:
        try:
            stream = await self.client.chat.completions.create(**kwargs)
        except Exception as e:
            failure = self._failure(e)
            if failure is None:
                raise
            raise failure from None
        builder = ReplyBuilder()
        calls: List[List[Any]] = []  # [id, name, [argument pieces]] in the order they started
        by_index: Dict[int, List[Any]] = {}
        finish: Optional[str] = None
        usage: Any = None
        answered: Any = kwargs.get("model")
        reads = self._reasoning_reads
        try:
            async with stream:
                await self._check_stream(stream)
                async for chunk in stream:
                    answered = getattr(chunk, "model", None) or answered
                    if chunk.usage is not None:
                        usage = chunk.usage
                    choices = chunk.choices
                    if not choices:
                        continue
                    choice = choices[0]
                    delta = choice.delta
                    if delta is not None:
                        extra = getattr(delta, "__pydantic_extra__", None) or {}
                        for name, declared in reads:
                            reasoning = getattr(delta, name, None) if declared else extra.get(name)
                            if reasoning:
                                out = builder.delta("reasoning", reasoning)
                                if out is not None:
                                    yield out
                                break
                        if delta.content:
                            out = builder.delta("text", delta.content)
                            if out is not None:
                                yield out
                        if delta.tool_calls:
                            for tc in delta.tool_calls:
                                slot = by_index.get(tc.index)
                                if slot is None or (tc.id and slot[0] and tc.id != slot[0]):
                                    slot = [tc.id, None, []]
                                    by_index[tc.index] = slot
                                    calls.append(slot)
                                elif tc.id and not slot[0]:
                                    slot[0] = tc.id
                                fn = tc.function
                                if fn is not None:
                                    if fn.name and not slot[1]:  # some servers repeat it in every delta
                                        slot[1] = fn.name
                                    if fn.arguments:
                                        slot[2].append(fn.arguments)
                    if choice.finish_reason:
                        finish = choice.finish_reason
        except Exception as e:
            failure = self._failure(e, started=True)
            if usage is not None:
                yield partial_usage(self._named(answered, self._usage(usage)))
            if failure is None:
                raise
            raise failure from None
        if finish is None:
            if usage is not None:
                yield partial_usage(self._named(answered, self._usage(usage)))
            raise self._error_interrupted()
        builder.close()
        for call_id, name, pieces in calls:
            yield builder.tool_call(call_id or mint_call_id(), name or "", "".join(pieces))
        if usage is not None:
            yield self._named(answered, self._usage(usage))
        yield {"type": "finish", "reason": "max-tokens" if finish == "length" else "stop", "providerReason": finish}

    def _error_interrupted(self) -> Exception:
        return _classify(self.protocol, status=None, message="the stream ended before the reply finished", interrupted=True)

    @staticmethod
    def _usage(u: Any) -> Dict[str, Any]:
        prompt = getattr(u, "prompt_tokens_details", None)
        completion = getattr(u, "completion_tokens_details", None)
        cached = getattr(prompt, "cached_tokens", None) if prompt is not None else None
        if cached is None:
            cached = getattr(u, "prompt_cache_hit_tokens", None)  # DeepSeek
        written = getattr(prompt, "cache_write_tokens", None) if prompt is not None else None
        reasoning = getattr(completion, "reasoning_tokens", None) if completion is not None else None
        return usage_chunk(getattr(u, "prompt_tokens", 0), getattr(u, "completion_tokens", 0), cached, written, reasoning)

    async def _complete(self, request: Any, kwargs: Dict[str, Any]) -> ModelReply:
        try:
            response = await self.client.chat.completions.create(**kwargs)
        except Exception as e:
            failure = self._failure(e, stream=False)
            if failure is None:
                raise
            raise failure from None
        bad = self._reply_failure(response, "choices")
        if bad is not None:
            raise bad
        if not response.choices:
            raise self._error_interrupted()
        choice = response.choices[0]
        message = choice.message
        blocks: Blocks = []
        for name in self.reasoning_fields:
            reasoning = getattr(message, name, None)
            if reasoning:
                blocks.append({"type": "reasoning", "text": reasoning})
                break
        if message.content:
            blocks.append({"type": "text", "text": message.content})
        for call in message.tool_calls or ():
            fn = getattr(call, "function", None)
            blocks.append(
                {
                    "type": "tool-call",
                    "id": call.id or mint_call_id(),
                    "name": getattr(fn, "name", "") or "",
                    "arguments": getattr(fn, "arguments", "") or "",
                }
            )
        answered = getattr(response, "model", None) or kwargs.get("model")
        usage = usage_dict(self._named(answered, self._usage(response.usage))) if response.usage is not None else None
        return ModelReply(blocks, usage=usage, finish="max-tokens" if choice.finish_reason == "length" else "stop")
