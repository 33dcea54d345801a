"""Google's Gemini API (``generateContent`` / ``streamGenerateContent``) over the official
``google-genai`` SDK."""

from __future__ import annotations

import base64
import binascii
import json
import os
from typing import Any, AsyncIterator, Dict, List, Optional

from .._core import AssistantMessage, ToolResultMessage
from ..hooks import ModelReply
from ._base import (
    DEFAULT_RETRY,
    Blocks,
    Provider,
    ReplyBuilder,
    _Bounded,
    classify,
    image_parts,
    merge_turns,
    mint_call_id,
    parse_arguments,
    partial_usage,
    require,
    tool_result_text,
    usage_chunk,
    usage_dict,
)
from ._errors import body_error, check_api_key, is_transport_error, malformed_stream, retry_after_ms, transport_error

__all__ = ["Gemini"]

# The value Gemini's docs give for a function call that has no thought signature of its own
# (history from another model): it tells the API not to validate one.
SKIP_SIGNATURE = b"skip_thought_signature_validator"


def _b64(data: Any) -> str:
    return base64.b64encode(data).decode("ascii") if isinstance(data, (bytes, bytearray)) else str(data)


def _unb64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return text.encode()


def _retry_delay_ms(details: Any) -> Optional[int]:
    """The ``google.rpc.RetryInfo`` delay (``"30s"``) of an error body, in ms."""
    error = details.get("error", details) if isinstance(details, dict) else None
    for item in (error or {}).get("details") or () if isinstance(error, dict) else ():
        if isinstance(item, dict) and str(item.get("@type", "")).endswith("RetryInfo"):
            delay = str(item.get("retryDelay", "")).strip()
            if delay.endswith("s"):
                try:
                    return int(float(delay[:-1]) * 1000)
                except ValueError:
                    return None
    return None


class Gemini(Provider):
    """A Kerman model over the Gemini API.

    ``Gemini("gemini-3.8-flash")`` builds a ``google.genai.Client`` from the environment
    (``GEMINI_API_KEY`` or ``GOOGLE_API_KEY``) with ``HttpRetryOptions(attempts=1)``: no SDK
    retries, Kerman's ``request_error`` seam decides. Pass ``client=`` to use your own, or
    ``api_key=`` / ``base_url=`` / ``timeout=`` (seconds) for the one built here. Other keyword
    arguments are ``GenerateContentConfig`` fields (``temperature``, ``max_output_tokens``,
    ``thinking_config={"include_thoughts": True}``...), with ``request.options`` over them;
    automatic function calling is turned off (Kerman runs the tools).

    Thought signatures are kept on the parts they came with and sent back. A function call
    without one (history from another model) is sent with the placeholder signature Gemini's
    docs give for that case, unless ``sign_unsigned_calls=False``. Function calls without an id
    get a ``kerman_…`` id for the loop, which is not sent back.
    """

    protocol = "gemini"
    vendor = "gemini"

    def __init__(
        self,
        model: str,
        *,
        client: Any = None,
        instructions: Optional[str] = None,
        stream: bool = True,
        api_key: Optional[str] = None,
        base_url: Optional[str] = None,
        timeout: Optional[float] = None,
        sign_unsigned_calls: bool = True,
        cache_size: int = 10_000,
        retry: Any = DEFAULT_RETRY,
        deadline: Optional[float] = None,
        **params: Any,
    ) -> None:
        super().__init__(
            model, instructions=instructions, stream=stream, cache_size=cache_size, params=params, retry=retry, deadline=deadline
        )
        self._genai = require("google.genai", "gemini", type(self).__name__)
        self._errors = require("google.genai.errors", "gemini", type(self).__name__)
        types = require("google.genai.types", "gemini", type(self).__name__)
        check_api_key(api_key)
        self._api_key = api_key
        owned = client is None
        if client is None:
            http: Dict[str, Any] = {"retry_options": types.HttpRetryOptions(attempts=1)}
            if base_url is not None:
                http["base_url"] = base_url
            if timeout is not None:
                http["timeout"] = int(timeout * 1000)
            options: Dict[str, Any] = {"http_options": types.HttpOptions(**http)}
            if api_key is not None:
                options["api_key"] = api_key
            client = self._genai.Client(**options)
        elif base_url is not None or api_key is not None or timeout is not None:
            raise TypeError("pass api_key/base_url/timeout to your client, or no client")
        check_api_key(getattr(getattr(client, "_api_client", None), "api_key", None), "" if api_key is not None else "from the environment")
        self._owns_client = owned
        self.client = client
        self.sign_unsigned_calls = bool(sign_unsigned_calls)
        self._names = _Bounded(65_536)  # tool-call id -> name (a function response must name its function)

    async def _close_client(self) -> None:
        await self.client.aio.aclose()

    def _repr_extra(self) -> str:
        api = getattr(self.client, "_api_client", None)
        http = getattr(api, "_http_options", None)
        base = getattr(http, "base_url", None)
        return f", base_url={base!r}" if base else ""

    def _secrets(self) -> List[str]:
        keys = [
            self._api_key,
            os.environ.get("GEMINI_API_KEY"),
            os.environ.get("GOOGLE_API_KEY"),
            getattr(getattr(self.client, "_api_client", None), "api_key", None),
        ]
        return [k for k in keys if isinstance(k, str) and k]

    # -- request --

    def _name_of(self, call_id: str, request: Any) -> str:
        name = self._names.get(call_id)
        if name is not None:
            return name  # type: ignore[no-any-return]
        for m in reversed(request.messages):
            if type(m) is AssistantMessage:
                for call in m.tool_calls:
                    if call.get("id") == call_id:
                        return str(call.get("name") or "")
        return ""

    def _convert(self, m: Any, blocks: Optional[Blocks], request: Any) -> Optional[Dict[str, Any]]:
        kind = type(m)
        if kind is ToolResultMessage:
            inner = m.content[0] if m.content else {}
            text = tool_result_text(inner)
            response: Dict[str, Any] = {
                "name": self._name_of(m.call_id, request),
                "response": {"error": text} if m.is_error else {"result": text},
            }
            if not m.call_id.startswith("kerman_"):
                response["id"] = m.call_id
            return {"role": "user", "parts": [{"function_response": response}]}
        content = m.content if blocks is None else blocks
        parts: List[Dict[str, Any]] = []
        if kind is AssistantMessage:
            signed_call = False
            for b in content:
                t = b.get("type")
                signature = (b.get("gemini") or {}).get("signature")
                if t == "text":
                    part: Dict[str, Any] = {"text": b.get("text") or ""}
                    if signature:
                        part["thought_signature"] = _unb64(signature)
                    elif not part["text"]:
                        continue
                    parts.append(part)
                elif t == "reasoning":
                    if signature:
                        parts.append({"text": b.get("text") or "", "thought": True, "thought_signature": _unb64(signature)})
                elif t == "tool-call":
                    call_id = str(b.get("id") or "")
                    self._names.put(call_id, b.get("name") or "")
                    call: Dict[str, Any] = {"name": b.get("name"), "args": parse_arguments(b.get("arguments"))}
                    if call_id and not call_id.startswith("kerman_"):
                        call["id"] = call_id
                    part = {"function_call": call}
                    if signature:
                        part["thought_signature"] = _unb64(signature)
                        signed_call = True
                    elif self.sign_unsigned_calls and not signed_call:
                        part["thought_signature"] = SKIP_SIGNATURE
                        signed_call = True
                    parts.append(part)
            return {"role": "model", "parts": parts} if parts else None
        for b in content:
            t = b.get("type")
            if t == "text":
                if b.get("text"):
                    parts.append({"text": b["text"]})
            elif t == "image":
                media, data, url = image_parts(b)
                if url:
                    parts.append({"file_data": {"file_uri": url, "mime_type": media or "image/png"}})
                else:
                    parts.append({"inline_data": {"mime_type": media or "image/png", "data": base64.b64decode(data or "")}})
        return {"role": "user", "parts": parts} if parts else None

    def _extend(self, out: List[Any], wires: List[Any]) -> None:
        merge_turns(out, wires, "parts")

    def _build(self, request: Any) -> Dict[str, Any]:
        contents = self._wire(request)
        config = self._params_for(request)
        model = config.pop("model", self.model)
        instructions = self._instructions_for(request)
        if instructions:
            config.setdefault("system_instruction", instructions)
        tools = request.tools
        if tools:
            config.setdefault(
                "tools",
                [
                    {
                        "function_declarations": [
                            {
                                "name": t["name"],
                                "description": t.get("description") or "",
                                "parameters_json_schema": t.get("parameters") or {"type": "object", "properties": {}},
                            }
                            for t in tools
                        ]
                    }
                ],
            )
        config.setdefault("automatic_function_calling", {"disable": True})
        output = getattr(request, "output", None)
        if output:
            # Structured output: a JSON reply with the schema as given.
            config.setdefault("response_mime_type", "application/json")
            config.setdefault("response_json_schema", output["schema"])
        return {"model": model, "contents": contents, "config": config}

    # -- reply --

    def _error(self, exc: BaseException, started: bool = False) -> Exception:
        if isinstance(exc, self._errors.APIError):
            status = exc.code if isinstance(exc.code, int) else None
            response = getattr(exc, "response", None)
            headers = getattr(response, "headers", None)
            retry = retry_after_ms(headers) if headers is not None else None
            if retry is None:
                retry = _retry_delay_ms(exc.details)
            request_id = headers.get("x-request-id") if headers is not None else None
            return classify(
                self.protocol,
                status=status,
                kind=exc.status,
                message=exc.message or str(exc),
                retry_after=retry,
                request_id=request_id,
                secrets=self._secrets(),
            )
        if isinstance(exc, self._errors.UnknownApiResponseError):
            # The SDK could not parse a piece of the stream as JSON: an HTML page (a gateway's)
            # or a garbled event. Its message quotes what it got.
            raw = str(exc).partition("Raw response: ")[2]
            if raw.lstrip()[:1] == "<":
                return body_error(self.protocol, None, "text/html", raw, self._secrets())
            return malformed_stream(self.protocol, exc, self._secrets())
        return transport_error(self.protocol, exc, self._secrets(), started)

    def _is_sdk_error(self, exc: BaseException) -> bool:
        # The SDK lets httpx errors through.
        return isinstance(exc, (self._errors.APIError, self._errors.UnknownApiResponseError)) or is_transport_error(exc)

    @staticmethod
    def _usage(u: Any) -> Dict[str, Any]:
        thoughts = getattr(u, "thoughts_token_count", None) or 0
        return usage_chunk(
            getattr(u, "prompt_token_count", 0),
            (getattr(u, "candidates_token_count", None) or 0) + thoughts,
            getattr(u, "cached_content_token_count", None),
            None,
            thoughts,
        )

    @staticmethod
    def _reason(reason: Any) -> Optional[str]:
        if reason is None:
            return None
        return str(getattr(reason, "value", reason))

    def _fold_parts(self, builder: ReplyBuilder, parts: Any) -> List[Dict[str, Any]]:
        """Feeds one response's parts to the builder; returns the chunks to yield."""
        out: List[Dict[str, Any]] = []
        for part in parts or ():
            signature = getattr(part, "thought_signature", None)
            call = getattr(part, "function_call", None)
            if call is not None:
                call_id = getattr(call, "id", None) or mint_call_id()
                annotation = {"gemini": {"signature": _b64(signature)}} if signature else {}
                out.append(builder.tool_call(call_id, call.name or "", _json(call.args or {}), **annotation))
                continue
            text = getattr(part, "text", None)
            if text is None:
                continue
            kind = "reasoning" if getattr(part, "thought", None) else "text"
            if not text:
                if signature:
                    block = builder.start(kind)
                    builder.annotate("gemini", block, signature=_b64(signature))
                    builder.close()
                continue
            chunk = builder.delta(kind, text)
            if chunk is not None:
                out.append(chunk)
            if signature:
                builder.annotate("gemini", signature=_b64(signature))
                builder.close()  # the signature ends this part: later text is a new part
        return out

    async def _stream(self, request: Any, kwargs: Dict[str, Any]) -> AsyncIterator[Dict[str, Any]]:
        try:
            stream = await self.client.aio.models.generate_content_stream(**kwargs)
        except Exception as e:
            if self._is_sdk_error(e):
                raise self._error(e) from None
            raise
        builder = ReplyBuilder()
        reason: Optional[str] = None
        usage: Any = None
        answered: Any = kwargs.get("model")
        started = False  # the SDK reports an HTTP error status at the first read
        try:
            async for response in stream:
                started = True
                answered = getattr(response, "model_version", None) or answered
                if response.usage_metadata is not None:
                    usage = response.usage_metadata
                candidates = response.candidates
                if not candidates:
                    continue
                candidate = candidates[0]
                content = candidate.content
                if content is not None:
                    for chunk in self._fold_parts(builder, content.parts):
                        yield chunk
                if candidate.finish_reason is not None:
                    reason = self._reason(candidate.finish_reason)
        except Exception as e:
            if usage is not None:
                yield partial_usage(self._named(answered, self._usage(usage)))
            if self._is_sdk_error(e):
                raise self._error(e, started=started) from None
            raise
        finally:
            await stream.aclose()  # releases the connection when the turn is cancelled
        if reason is None:
            if usage is not None:
                yield partial_usage(self._named(answered, self._usage(usage)))
            raise classify(self.protocol, status=None, message="the stream ended before a finish reason", interrupted=True)
        data = self._remember(builder)
        if data is not None:
            yield data
        if usage is not None:
            yield self._named(answered, self._usage(usage))
        yield {"type": "finish", "reason": "max-tokens" if reason == "MAX_TOKENS" else "stop", "providerReason": reason}

    async def _complete(self, request: Any, kwargs: Dict[str, Any]) -> ModelReply:
        try:
            response = await self.client.aio.models.generate_content(**kwargs)
        except Exception as e:
            if self._is_sdk_error(e):
                raise self._error(e) from None
            if isinstance(e, json.JSONDecodeError):  # a page where the reply should be
                raise classify(self.protocol, status=None, message=f"the reply is not valid JSON: {e}", secrets=self._secrets()) from None
            raise
        if not response.candidates and response.prompt_feedback is None and response.usage_metadata is None:
            # Nothing of a Gemini reply: the SDK read a JSON body it does not know (a proxy's error).
            raise classify(
                self.protocol, status=None, message="the reply has no candidates, usage or prompt feedback", secrets=self._secrets()
            )
        builder = ReplyBuilder()
        reason = None
        if response.candidates:
            candidate = response.candidates[0]
            if candidate.content is not None:
                self._fold_parts(builder, candidate.content.parts)
            reason = self._reason(candidate.finish_reason)
        answered = getattr(response, "model_version", None) or kwargs.get("model")
        usage = usage_dict(self._named(answered, self._usage(response.usage_metadata))) if response.usage_metadata is not None else None
        return ModelReply(builder.blocks, usage=usage, finish="max-tokens" if reason == "MAX_TOKENS" else "stop")


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
