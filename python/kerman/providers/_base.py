"""What every provider shares: the lazy SDK import, the per-message conversion cache, the
opaque-state store (signed thinking, encrypted reasoning, thought signatures), the usage shape,
and the error classification. No vendor SDK is imported here."""

from __future__ import annotations

import asyncio
import importlib
import json
import math
import uuid
import weakref
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from .._core import AssistantMessage
from ..events import ASSISTANT_MESSAGE, AssistantChunk, FinishChunk, ProviderDataChunk, UsageChunk, view
from ._errors import (  # noqa: F401 (the providers and kerman.providers import them from here)
    BAD_KEY,
    CONTEXT_PATTERNS,
    MESSAGE_LIMIT,
    body_error,
    check_api_key,
    classify,
    error_fields,
    http_status_error,
    is_transport_error,
    malformed_stream,
    retry_after_ms,
    scrub,
    shorten,
    transport_error,
    unexpected_body,
)
from ._stream import DeadlinePassed, deadline_error, fix_surrogates, guard_chunks, within
from .retry import retry_policy

__all__ = ["Provider", "usage_chunk", "classify"]

# Provider-data chunks: the opaque parts of a streamed reply (see ``Provider`` below).
PROVIDER_DATA = "provider-data"

Blocks = List[Dict[str, Any]]


def require(module: str, extra: str, who: str) -> Any:
    """Imports a vendor SDK on first use, or says which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"kerman.providers.{who} needs the {module.split('.')[0]!r} package: "
            f"pip install 'kerman[{extra}]' (or pip install {extra_package(extra)})"
        ) from e


def sdk_client(
    factory: Callable[..., Any], client: Any, base_url: Optional[str], api_key: Optional[str], timeout: Optional[float]
) -> Tuple[Any, bool]:
    """The client a provider talks through, and whether it built it: ``client`` as given (then
    ``base_url``/``api_key``/``timeout`` belong to it), or ``factory(...)`` with the SDK's own
    retries off, so that the loop's ``request_error`` seam decides (the provider's ``retry=``)."""
    if client is not None:
        if base_url is not None or api_key is not None or timeout is not None:
            raise TypeError("pass base_url/api_key/timeout to your client, or no client")
        check_api_key(getattr(client, "api_key", None))
        return client, False
    check_api_key(api_key)
    options: Dict[str, Any] = {"max_retries": 0}
    for name, value in (("base_url", base_url), ("api_key", api_key), ("timeout", timeout)):
        if value is not None:
            options[name] = value
    client = factory(**options)
    check_api_key(getattr(client, "api_key", None), "from the environment")  # OPENAI_API_KEY...
    return client, True


def extra_package(extra: str) -> str:
    return {"openai": "openai", "anthropic": "anthropic", "gemini": "google-genai"}[extra]


# -- the content key: what the loop assembles from a stream's chunks ----------------------------


def content_key(blocks: Iterable[Mapping[str, Any]]) -> Tuple[Any, ...]:
    """The visible content as the loop's assembler builds it from the chunks a stream yields:
    adjacent text (or reasoning) blocks merged, empty ones dropped, tool calls as they are. A
    stream's annotated blocks and the message the loop logged for it have the same key."""
    key: List[Any] = []
    last = None
    for b in blocks:
        kind = b.get("type")
        if kind == "text" or kind == "reasoning":
            text = b.get("text") or ""
            if not text:
                continue
            if last == kind:
                key[-1] = (kind, key[-1][1] + text)
            else:
                key.append((kind, text))
                last = kind
        elif kind == "tool-call":
            key.append(("tool-call", b.get("id"), b.get("name"), b.get("arguments")))
            last = None
    return tuple(key)


class ReplyBuilder:
    """Builds a reply from a vendor's stream: each ``delta`` returns the chunk to yield (``None``
    for an empty delta, which would change nothing), and the builder keeps the vendor's blocks
    unmerged, with their opaque annotations (``annotate``), for the next request.

    The open block's text is kept as a list of deltas, joined once when the block ends (or
    ``blocks`` is read): appending each delta to a str would copy the whole text every time,
    quadratic in the reply's length."""

    __slots__ = ("_blocks", "_open", "_parts", "annotated")

    def __init__(self) -> None:
        self._blocks: Blocks = []
        self._open: Optional[Dict[str, Any]] = None
        self._parts: List[str] = []
        self.annotated = False

    @property
    def blocks(self) -> Blocks:
        self._seal()
        return self._blocks

    def _seal(self) -> None:
        """Joins the open block's deltas into its ``text`` (it stays open)."""
        parts = self._parts
        if parts:
            block = self._open
            assert block is not None
            if block["text"]:
                parts.insert(0, block["text"])
            block["text"] = fix_surrogates("".join(parts))
            parts.clear()

    def start(self, kind: str) -> Dict[str, Any]:
        """Starts a new text or reasoning block (a vendor block boundary)."""
        self._seal()
        block = {"type": kind, "text": ""}
        self._blocks.append(block)
        self._open = block
        return block

    def delta(self, kind: str, text: Optional[str]) -> Optional[Dict[str, Any]]:
        if not text:
            return None
        block = self._open
        if block is None or block["type"] != kind:
            self.start(kind)
        self._parts.append(text)
        return {"type": "text-delta" if kind == "text" else "reasoning-delta", "text": text}

    def annotate(self, vendor: str, block: Optional[Dict[str, Any]] = None, **fields: Any) -> None:
        """Sets opaque fields (``block[vendor][name]``) on ``block`` (default: the open one)."""
        target = block if block is not None else self._open
        if target is None:
            target = self.start("reasoning")
        target.setdefault(vendor, {}).update(fields)
        self.annotated = True

    def tool_call(self, id: str, name: str, arguments: str, **annotation: Any) -> Dict[str, Any]:
        self._seal()
        arguments = fix_surrogates(arguments)
        block: Dict[str, Any] = {"type": "tool-call", "id": id, "name": name, "arguments": arguments}
        if annotation:
            block.update(annotation)
            self.annotated = True
        self._blocks.append(block)
        self._open = None
        return {"type": "tool-call", "id": id, "name": name, "arguments": arguments}

    def close(self) -> None:
        """Ends the open block: the next delta starts a new one."""
        self._seal()
        self._open = None


def mint_call_id() -> str:
    """An id for a tool call the vendor sent without one (Gemini never gets it back; a Chat
    Completions server gets it in the call and its result, which is all they need to match)."""
    return "kerman_" + uuid.uuid4().hex[:24]


# -- usage ---------------------------------------------------------------------------------------


def usage_chunk(
    input: Optional[int],
    output: Optional[int],
    cache_read: Optional[int] = None,
    cache_write: Optional[int] = None,
    reasoning: Optional[int] = None,
) -> Dict[str, Any]:
    """The one usage shape every provider reports (docs/providers.md, "Usage"): ``input`` counts
    every prompt token, cached ones included; ``output`` every generated token, reasoning
    included; ``cacheRead``/``cacheWrite`` the prompt tokens read from / written to the
    provider's cache; ``reasoning`` the output tokens spent thinking. Unreported counts are 0."""
    return {
        "type": "usage",
        "input": int(input or 0),
        "output": int(output or 0),
        "cacheRead": int(cache_read or 0),
        "cacheWrite": int(cache_write or 0),
        "reasoning": int(reasoning or 0),
    }


#: A protocol -> the provider id ``genai-prices`` knows it by (logged with each request's usage).
PROVIDER_IDS = {"openai-chat": "openai", "openai-responses": "openai", "anthropic": "anthropic", "gemini": "google"}


def partial_usage(chunk: Dict[str, Any]) -> Dict[str, Any]:
    """A usage chunk marked ``partial``: what the stream reported before it stopped (failed or
    cut). The provider yields it just before it raises, so the loop logs it with the request's
    other chunks and the usage ledger counts it (docs/usage.md)."""
    return dict(chunk, partial=True)


def usage_dict(chunk: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    if chunk is None:
        return None
    return {k: v for k, v in chunk.items() if k != "type"}


# -- the opaque-state store -----------------------------------------------------------------------


def merge_turns(out: List[Dict[str, Any]], wires: List[Any], field: str) -> None:
    """Appends per-message turns (``{"role", field: [...]}`` or ``None``) to ``out``, merging a
    turn into the one before it when both have the same role (parallel tool results go in one
    user turn). A merged turn is a new dict: the ones in ``out`` are shared with the cache."""
    last = out[-1]["role"] if out else None
    owned = False
    for wire in wires:
        if wire is None:
            continue
        role = wire["role"]
        if role == last:
            if not owned:
                out[-1] = {"role": role, field: list(out[-1][field])}
                owned = True
            out[-1][field].extend(wire[field])
        else:
            out.append(wire)
            last = role
            owned = False


class _Bounded(dict):  # type: ignore[type-arg]
    """A dict that forgets its oldest entries past ``limit``."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def put(self, key: Any, value: Any) -> None:
        self[key] = value
        if len(self) > self.limit:
            for old in list(self)[: max(1, self.limit // 4)]:
                del self[old]


class _LogIndex:
    """The provider-data of one session's log, read once (after a resume, say): message id →
    (annotated blocks, the message's content key)."""

    __slots__ = ("scanned", "natives")

    def __init__(self) -> None:
        self.scanned = 0
        self.natives: Dict[str, Tuple[Blocks, Tuple[Any, ...]]] = {}

    def update(self, log: Any, protocol: str) -> None:
        end = len(log)
        if end <= self.scanned:
            return
        for reply in log.events(start=self.scanned, stop=end, types=ASSISTANT_MESSAGE, view=True):
            seqs = reply.source_event_seqs
            if not seqs:
                continue
            for seq in reversed(seqs):  # provider-data comes right before usage/finish
                cited = view(log[seq])
                chunk = cited.chunk if isinstance(cited, AssistantChunk) else None
                if isinstance(chunk, ProviderDataChunk):
                    content = chunk.content
                    if chunk.provider == protocol and content is not None:
                        message = reply.message
                        self.natives[message.id] = (content, content_key(b.raw for b in message.content))
                    break
                if not isinstance(chunk, (UsageChunk, FinishChunk)):
                    break
        self.scanned = end


# -- retries by default ----------------------------------------------------------------------------

DEFAULT_RETRY: Any = type("DefaultRetry", (), {"__repr__": lambda self: "retry_policy()"})()

# The loops a provider's retry policy was offered to: one default policy per loop, whichever of
# its providers (the models of a Fallback, say) served it first.
_RETRY_ATTACHED: weakref.WeakSet[Any] = weakref.WeakSet()


def attach_retry(loop: Any, policy: Callable[..., Any]) -> None:
    """Registers a provider's retry policy on ``loop`` (once per loop) as a ``request_error``
    listener that steps aside when the loop has a retry policy of its own
    (``loop.request_error(retry_policy(...))``, by hand, before or after): that one decides."""
    if loop is None or loop in _RETRY_ATTACHED or not hasattr(loop, "request_error"):
        return
    _RETRY_ATTACHED.add(loop)

    async def provider_retry(failure: Any, next: Callable[[], Awaitable[Any]]) -> Any:
        listeners = getattr(failure.loop, "_request_error", ())
        if any(fn is not provider_retry and getattr(fn, "kerman_retry_policy", False) for fn in listeners):
            return await next()
        return await policy(failure, next)

    provider_retry.kerman_provider_retry = True  # type: ignore[attr-defined]
    loop.request_error(provider_retry)


# -- the base class --------------------------------------------------------------------------------


class Provider:
    """Base of every provider: a Kerman model (``model(request)``) over one wire protocol.

    ``retry``: a ``request_error`` listener registered on each loop the provider serves (default
    ``retry_policy()``; ``None`` for none; see ``attach_retry``). ``deadline``: seconds a whole
    request may take (``None``: no bound but the SDK's per-read ``timeout``).

    Subclasses implement ``_convert(message, blocks, request)`` (one history message to its wire form,
    cached per message), ``_build(request)`` (the SDK call's keyword arguments) and
    ``_stream(request, kwargs)`` / ``_complete(request, kwargs)``.

    **Opaque state.** Some providers return state that must be sent back verbatim on the next
    request (Anthropic's signed thinking, Responses reasoning items, Gemini thought signatures).
    A non-streamed reply keeps it in its blocks (``block["anthropic"]["signature"]``...). A
    streamed reply cannot (the loop assembles a streamed message from text deltas), so the
    provider yields one ``provider-data`` chunk with the reply's annotated blocks just before its
    ``usage`` and ``finish``: it is logged with the other chunks (so it survives a restart) and
    ignored by the assembler. The next request finds it by the message's content (in memory) or
    by the message's ``source_event_seqs`` in ``request.loop.log`` (after a resume).
    """

    protocol = "provider"
    vendor = "provider"  # the key of a block's opaque fields
    opaque = True  # whether replies can carry opaque state (else assistant messages skip the lookup)

    def __init__(
        self,
        model: str,
        *,
        instructions: Optional[str] = None,
        stream: bool = True,
        cache_size: int = 10_000,
        params: Optional[Dict[str, Any]] = None,
        retry: Any = DEFAULT_RETRY,
        deadline: Optional[float] = None,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be a non-empty str, got {model!r}")
        if retry is DEFAULT_RETRY:
            retry = retry_policy()
        elif retry is not None and not callable(retry):
            raise TypeError(f"retry must be a request_error listener (retry_policy(...)) or None, got {retry!r}")
        if deadline is not None and (
            isinstance(deadline, bool) or not isinstance(deadline, (int, float)) or not math.isfinite(deadline) or deadline <= 0
        ):
            raise ValueError(f"deadline must be a finite number of seconds > 0 or None, got {deadline!r}")
        self.retry = retry
        self.deadline = None if deadline is None else float(deadline)
        if instructions is not None and not isinstance(instructions, str):
            raise TypeError(f"instructions must be a str or None, got {type(instructions).__name__}")
        self.model = model
        self.instructions = instructions
        self.stream = bool(stream)
        self.params: Dict[str, Any] = dict(params or {})
        self._limit = max(16, int(cache_size))
        self._young: Dict[str, Tuple[Any, Any]] = {}
        self._old: Dict[str, Tuple[Any, Any]] = {}
        self._natives = _Bounded(1024)
        self._logs = _Bounded(256)
        self._prefixes = _Bounded(64)  # loop -> (its last request's messages, their wire list)

    # -- the model interface --

    def __call__(self, request: Any) -> Any:
        if self.retry is not None:
            attach_retry(getattr(request, "loop", None), self.retry)
        kwargs = self._build(request)
        if self.stream:
            return guard_chunks(self._stream(request, kwargs), self.protocol, self.deadline)
        if self.deadline is None:
            return self._complete(request, kwargs)
        return self._complete_within(request, kwargs, self.deadline)

    async def _complete_within(self, request: Any, kwargs: Dict[str, Any], deadline: float) -> Any:
        try:
            return await within(self._complete(request, kwargs), asyncio.get_running_loop().time() + deadline)
        except DeadlinePassed:
            raise deadline_error(self.protocol, deadline) from None

    def _build(self, request: Any) -> Dict[str, Any]:
        raise NotImplementedError

    def _stream(self, request: Any, kwargs: Dict[str, Any]) -> AsyncIterator[Dict[str, Any]]:
        raise NotImplementedError

    async def _complete(self, request: Any, kwargs: Dict[str, Any]) -> Any:
        raise NotImplementedError

    # -- request pieces --

    def _instructions_for(self, request: Any) -> Optional[str]:
        instructions = getattr(request, "instructions", None)
        return self.instructions if instructions is None else instructions

    def _params_for(self, request: Any) -> Dict[str, Any]:
        """Constructor params, then the request's options over them."""
        options = getattr(request, "options", None)
        if options:
            merged = dict(self.params)
            merged.update(options)
            return merged
        return dict(self.params)

    def _wire(self, request: Any) -> List[Any]:
        """The wire list (messages, input items, contents) of the whole history.

        A session's next request carries the previous one's messages plus a few new ones, so
        when this request's messages start with the last request's (of the same loop; compared
        as lists, which is a pointer comparison per message for the same objects), the last
        wire list is reused and only the new messages are added. Anything else is built from
        the per-message cache."""
        messages = request.messages
        key = id(getattr(request, "loop", None))
        prev = self._prefixes.get(key)
        if prev is not None:
            old_messages, old_out = prev
            k = len(old_messages)
            if len(messages) >= k and messages[:k] == old_messages:
                out: List[Any] = old_out[:]
                self._extend(out, self._history(messages[k:], request))
                self._prefixes.put(key, (list(messages), out[:]))
                return out
        out = []
        self._extend(out, self._history(messages, request))
        self._prefixes.put(key, (list(messages), out[:]))
        return out

    def _extend(self, out: List[Any], wires: List[Any]) -> None:
        """Adds the wire forms of new messages to ``out`` (which holds those before them; its
        entries are shared with earlier requests, so one is replaced, never changed). A message
        whose wire form is ``None`` is left out."""
        out.extend(w for w in wires if w is not None)

    def _history(self, messages: Sequence[Any], request: Any) -> List[Any]:
        """The wire form of every message, each converted once (cached by id; a message with the
        same id but other content is converted again)."""
        young = self._young
        get = young.get
        out: List[Any] = []
        append = out.append
        for m in messages:
            entry = get(m.id)
            if entry is None or (entry[0] is not m and entry[0] != m):
                entry = self._miss(m, request)
            append(entry[1])
        return out

    def _miss(self, m: Any, request: Any) -> Tuple[Any, Any]:
        key = m.id
        entry = self._old.pop(key, None)
        if entry is None or (entry[0] is not m and entry[0] != m):
            blocks = self._native(m, request) if self.opaque and type(m) is AssistantMessage else None
            entry = (m, self._convert(m, blocks, request))
        young = self._young
        young[key] = entry
        if len(young) > self._limit:
            self._old = young
            self._young = {}
            self._young[key] = entry
        return entry

    def _convert(self, message: Any, blocks: Optional[Blocks], request: Any) -> Any:
        """One message's wire form; ``blocks`` are an assistant message's annotated blocks when
        a stream left opaque state for it (else ``message.content`` is used)."""
        raise NotImplementedError

    def _remember(self, builder: ReplyBuilder) -> Optional[Dict[str, Any]]:
        """At the end of a stream: the provider-data chunk to yield, if the reply has opaque state."""
        if not builder.annotated:
            return None
        blocks = builder.blocks
        self._natives.put(content_key(blocks), blocks)
        return {"type": PROVIDER_DATA, "provider": self.protocol, "content": blocks}

    def _native(self, m: Any, request: Any) -> Optional[Blocks]:
        content = m.content
        vendor = self.vendor
        if any(vendor in b for b in content):
            return list(content)  # a non-streamed reply keeps its opaque state in its blocks
        key = content_key(content)
        found = self._natives.get(key)
        if found is not None:
            return found  # type: ignore[no-any-return]
        loop = getattr(request, "loop", None)
        log = getattr(loop, "log", None) if loop is not None else None
        if log is None:
            return None
        try:
            index = self._logs.get(log.id)
            if index is None:
                index = _LogIndex()
                self._logs.put(log.id, index)
            index.update(log, self.protocol)
        except Exception:  # a closed or foreign log: convert without the opaque state
            return None
        hit = index.natives.get(m.id)
        if hit is not None and hit[1] == key:
            return hit[0]
        return None

    async def aclose(self) -> None:
        """Closes the SDK client if this provider built it (one passed as ``client=`` stays
        yours to close)."""
        if self._owns_client:
            await self._close_client()

    async def _close_client(self) -> None:
        close = getattr(self.client, "close", None)
        if close is not None:
            await close()

    # -- helpers for subclasses --

    _owns_client = False
    client: Any = None

    def _secrets(self) -> List[str]:
        return []

    def _named(self, answered: Any, usage: Dict[str, Any]) -> Dict[str, Any]:
        """``usage`` with the model that answered (the vendor's name for it when the reply gave
        one, else the one asked for) and the provider (genai-prices' id for the protocol), so
        the usage ledger prices the request from the log alone (docs/usage.md)."""
        out = dict(usage, model=answered if isinstance(answered, str) and answered else self.model)
        provider = PROVIDER_IDS.get(self.protocol)
        if provider is not None:
            out["provider"] = provider
        return out

    def __repr__(self) -> str:
        extra = self._repr_extra()
        return f"{type(self).__name__}({self.model!r}{extra})"

    def _repr_extra(self) -> str:
        return ""


class SdkClientProvider(Provider):
    """A provider over an SDK of the OpenAI/Anthropic family: one ``Async…`` client with
    ``api_key`` and ``base_url``, whose HTTP failures are ``APIStatusError`` /
    ``APIConnectionError``. The key, the ``repr`` and the error reading are the same for all."""

    _sdk: Any = None

    def _secrets(self) -> List[str]:
        key = getattr(self.client, "api_key", None)
        return [key] if isinstance(key, str) else []

    def _repr_extra(self) -> str:
        return f", base_url={safe_url(getattr(self.client, 'base_url', '?'))!r}"

    def _failure(self, exc: BaseException, started: bool = False, stream: bool = True) -> Optional[Exception]:
        """The Kerman failure for an exception out of the SDK, or ``None`` (not the SDK's: it is
        raised as it is)."""
        if isinstance(exc, self._sdk.APIError) or is_transport_error(exc):
            return self._error(exc, started)
        if isinstance(exc, json.JSONDecodeError):
            if stream:
                return malformed_stream(self.protocol, exc, self._secrets())
            return classify(self.protocol, status=None, message=f"the reply is not valid JSON: {exc}", secrets=self._secrets())
        return None

    def _reply_failure(self, response: Any, field: str) -> Optional[Exception]:
        """For a non-streamed reply: the failure when it is not the vendor's reply object but a
        page (the SDK returns a non-JSON body as a str) or a JSON error body (then the reply's
        ``field``, ``choices`` say, is missing)."""
        if isinstance(response, (str, bytes)):
            text = response.decode("utf-8", "replace") if isinstance(response, bytes) else response
            kind = "text/html" if text.lstrip()[:1] == "<" else "text/plain"
            return body_error(self.protocol, None, kind, text, self._secrets(), expected="a JSON reply")
        if getattr(response, field, None) is not None:
            return None
        try:
            data = response.model_dump(mode="json", exclude_none=True)
        except Exception:
            data = {}
        return body_error(self.protocol, None, "application/json", json.dumps(data), self._secrets(), expected="a reply")

    async def _check_stream(self, stream: Any) -> None:
        """Raises the failure a non-stream answer to a streaming request means (see ``unexpected_body``)."""
        bad = await unexpected_body(self.protocol, getattr(stream, "response", None), self._secrets())
        if bad is not None:
            raise bad

    def _error(self, exc: BaseException, started: bool = False) -> Exception:
        sdk = self._sdk
        if is_transport_error(exc):
            return transport_error(self.protocol, exc, self._secrets(), started)
        if isinstance(exc, (sdk.APIStatusError, sdk.APIConnectionError)):
            return http_status_error(self.protocol, exc, self._secrets(), started)
        kind, message = error_fields(getattr(exc, "body", None))
        return classify(self.protocol, status=None, kind=kind, message=message or str(exc), secrets=self._secrets())


def safe_url(url: Any) -> str:
    """``url`` without credentials in its authority (``https://user:key@host`` → ``https://host``)."""
    text = str(url)
    scheme, sep, rest = text.partition("://")
    if sep and "@" in rest.split("/", 1)[0]:
        rest = rest.split("@", 1)[1]
    return scheme + sep + rest


def tool_result_text(block: Mapping[str, Any]) -> str:
    """The text of a tool-result block's inner content (images dropped)."""
    inner = block.get("content")
    if isinstance(inner, str):
        return inner
    parts = []
    for b in inner or ():
        if isinstance(b, Mapping) and b.get("type") == "text":
            parts.append(b.get("text") or "")
    return "\n".join(parts)


def image_parts(block: Mapping[str, Any]) -> Tuple[Optional[str], Optional[str], Optional[str]]:
    """(media type, base64 data, url) of a Kerman image block:
    ``{"type": "image", "mediaType": "image/png", "data": "<base64>"}`` or ``{"type": "image", "url": "..."}``."""
    media = block.get("mediaType") or block.get("media_type")
    data = block.get("data")
    url = block.get("url")
    if isinstance(url, str) and url.startswith("data:") and data is None:
        header, _, payload = url.partition(",")
        media = media or header[5:].split(";")[0]
        return media, payload, None
    return media, data, url


def data_url(media: Optional[str], data: str) -> str:
    return f"data:{media or 'image/png'};base64,{data}"


def parse_arguments(arguments: Any) -> Any:
    """A tool call's ``arguments`` string as the JSON object some wire formats want."""
    if isinstance(arguments, (dict, list)):
        return arguments
    if not arguments:
        return {}
    try:
        return json.loads(arguments)
    except ValueError:
        return {"_raw": arguments}
