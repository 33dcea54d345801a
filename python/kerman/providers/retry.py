"""Retries and fallbacks for model failures: a ``request_error`` listener factory and a model
that tries a list of models in order."""

from __future__ import annotations

import asyncio
import inspect
import random
import weakref
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..errors import ModelError
from ..hooks import ModelReply, Retry

__all__ = ["retry_policy", "should_retry", "Fallback", "RETRY_ON", "FALLBACK_ON"]

#: Failure codes the default policy retries: waiting (or trying again) can fix them.
RETRY_ON: FrozenSet[str] = frozenset(
    {"RATE_LIMITED", "OVERLOADED", "SERVER_ERROR", "CONFLICT", "TIMEOUT", "CONNECTION_ERROR", "STREAM_INTERRUPTED"}
)

#: Failure codes on which a :class:`Fallback` moves to its next model: the retryable ones, an
#: exhausted quota and a context overflow (another model may have the budget or the window).
FALLBACK_ON: FrozenSet[str] = RETRY_ON | {"QUOTA_EXCEEDED", "CONTEXT_LENGTH_EXCEEDED"}


def should_retry(failure: Mapping[str, Any], retry_on: Iterable[str] = RETRY_ON) -> bool:
    """Whether a failure dict (``RequestFailure.failure``) has a retryable code."""
    return failure.get("code") in set(retry_on)


def retry_policy(
    *,
    max_attempts: int = 4,
    base_delay: float = 0.5,
    max_delay: float = 30.0,
    max_retry_after: float = 60.0,
    jitter: float = 0.5,
    retry_on: Iterable[str] = RETRY_ON,
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
) -> Callable[..., Awaitable[Any]]:
    """A ``request_error`` listener: ``loop.request_error(retry_policy())``.

    It first lets the listeners after it decide (``await next()``); when none asked for a
    retry, it retries a failure whose ``code`` is in ``retry_on`` up to ``max_attempts``
    requests per step in all (the first included), waiting before each retry:

    * the server's ``retry-after`` (``failure["retryAfterMs"]``) when it sent one, exactly;
      a ``retry-after`` longer than ``max_retry_after`` seconds is not waited for (the failure
      ends the turn, as an exhausted quota should);
    * otherwise ``base_delay * 2**(n-1)`` seconds for the n-th retry, capped at ``max_delay``,
      less a random part of up to ``jitter`` of it (so clients that failed together do not retry
      together).

    Authentication, invalid-request, not-found, quota and context-length failures are never
    retried by default. The wait is an ``asyncio.sleep`` in the listener, so cancelling the
    turn ends it at once. To change the policy, pass other arguments (``retry_on=RETRY_ON -
    {"TIMEOUT"}``), ``loop.remove_listener(policy)`` it, or write your own listener
    (``should_retry(failure.failure)`` is the test this one uses).
    """
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
    if base_delay < 0 or max_delay < 0 or max_retry_after < 0 or not 0 <= jitter <= 1:
        raise ValueError("delays must be >= 0 and jitter in [0, 1]")
    codes = frozenset(retry_on)
    # loop -> (turn, step, retries so far): one step's count, reset when the step changes.
    counts: weakref.WeakKeyDictionary[Any, Tuple[int, int, int]] = weakref.WeakKeyDictionary()

    async def retry_policy_listener(failure: Any, next: Callable[[], Awaitable[Any]]) -> Any:
        decision = await next()
        if decision is not None:
            return decision
        info = failure.failure
        if info.get("code") not in codes:
            return None
        turn, step = failure.turn, failure.step
        key = failure.loop
        previous = counts.get(key)
        retries = previous[2] if previous is not None and previous[:2] == (turn, step) else 0
        if retries + 1 >= max_attempts:
            counts.pop(key, None)
            return None
        after = info.get("retryAfterMs")
        if isinstance(after, (int, float)) and after >= 0:
            delay = after / 1000.0
            if delay > max_retry_after:
                counts.pop(key, None)
                return None
        else:
            delay = min(max_delay, base_delay * (2**retries))
            delay -= delay * jitter * random.random()
        counts[key] = (turn, step, retries + 1)
        if delay > 0:
            await sleep(delay)
        return Retry()

    retry_policy_listener.__qualname__ = f"retry_policy(max_attempts={max_attempts})"
    # Marks a policy: a provider's default policy steps aside for one the loop has (providers' ``retry=``).
    retry_policy_listener.kerman_retry_policy = True  # type: ignore[attr-defined]
    return retry_policy_listener


def _code(exc: BaseException) -> Optional[str]:
    return getattr(exc, "code", None) if isinstance(exc, ModelError) else None


async def _drain(stream: AsyncIterator[Dict[str, Any]]) -> ModelReply:
    """A streamed reply as one ``ModelReply`` (for a Fallback whose first model does not stream)."""
    blocks: List[Dict[str, Any]] = []
    usage: Optional[Dict[str, Any]] = None
    finish = "stop"
    async for chunk in stream:
        kind = chunk.get("type")
        if kind in ("text-delta", "reasoning-delta"):
            block_type = "text" if kind == "text-delta" else "reasoning"
            if blocks and blocks[-1]["type"] == block_type and blocks[-1].get("_open"):
                blocks[-1]["text"] += chunk.get("text") or ""
            else:
                blocks.append({"type": block_type, "text": chunk.get("text") or "", "_open": True})
        elif kind == "tool-call":
            blocks.append(
                {"type": "tool-call", "id": chunk.get("id"), "name": chunk.get("name"), "arguments": chunk.get("arguments") or ""}
            )
        elif kind == "usage":
            usage = dict(usage or {}, **{k: v for k, v in chunk.items() if k != "type"})
        elif kind == "finish":
            reason = chunk.get("reason")
            if reason == "error":
                error = chunk.get("error") or {}
                raise ModelError(str(error.get("message") or "model finished with an error"), str(error.get("code") or "UNKNOWN"))
            finish = "max-tokens" if reason == "max-tokens" else "stop"
    for b in blocks:
        b.pop("_open", None)
    return ModelReply(blocks, usage=usage, finish=finish)


def _as_chunks(reply: Any) -> List[Dict[str, Any]]:
    """A ``ModelReply`` (or str) as stream chunks (for a streaming Fallback's non-streaming model),
    after the failed ``finish`` of each attempt it came after."""
    if isinstance(reply, str):
        reply = ModelReply(reply)
    chunks: List[Dict[str, Any]] = list(getattr(reply, "failed_attempts", ()))
    for b in reply.content:
        kind = b.get("type")
        if kind == "text":
            chunks.append({"type": "text-delta", "text": b.get("text") or ""})
        elif kind == "reasoning":
            chunks.append({"type": "reasoning-delta", "text": b.get("text") or ""})
        elif kind == "tool-call":
            chunks.append({"type": "tool-call", "id": b.get("id"), "name": b.get("name"), "arguments": b.get("arguments") or ""})
    if reply.usage:
        chunks.append(dict(reply.usage, type="usage"))
    chunks.append({"type": "finish", "reason": reply.finish})
    return chunks


def _with_failed(reply: Any, failed: List[Dict[str, Any]]) -> Any:
    """``reply`` (a ``ModelReply`` or str) carrying ``failed`` before its own failed attempts."""
    if not failed:
        return reply
    if isinstance(reply, str):
        return ModelReply(reply, failed_attempts=failed)
    if isinstance(reply, ModelReply):
        reply.failed_attempts = failed + list(reply.failed_attempts)
    return reply


def _failed_finish(exc: BaseException, model: Any) -> Dict[str, Any]:
    """The failed ``finish`` of a model a :class:`Fallback` tried, as the loop would log it for
    that failure (``error``: the failure dict), naming the model and its provider."""
    if isinstance(exc, ModelError):
        error: Dict[str, Any] = {"message": exc.message or type(exc).__name__, "code": exc.code}
        for key, value in (("status", exc.status), ("retryAfterMs", exc.retry_after_ms), ("requestId", exc.request_id)):
            if value is not None:
                error[key] = value
    else:
        error = {"message": f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__, "code": "UNKNOWN"}
    chunk: Dict[str, Any] = {"type": "finish", "reason": "error", "error": error}
    from ..usage._prices import model_of

    name, provider = model_of(model)
    if name is not None:
        chunk["model"] = name
    if provider is not None:
        chunk["provider"] = provider
    return chunk


class Fallback:
    """A model that tries ``models`` in order: when one fails with a code in ``on`` (default
    :data:`FALLBACK_ON`) before it produced any output, the next one gets the same request.
    A failure after output began (a stream cut mid-reply) is raised as it is: its chunks are
    already logged, and mixing two models' text in one message would be wrong; a
    ``retry_policy`` then re-issues the request, starting from the first model again.

    When every model failed, the last failure is raised, with the earlier ones in its
    ``fallback_errors`` attribute. Each model that failed before any output is in the log as a
    request of its own, by its failed ``finish`` chunk naming the model (``model``,
    ``provider``): streaming, the fallback yields it before it moves on or raises; not
    streaming, the reply (``ModelReply.failed_attempts``) or the exception that ends the call
    (``failed_attempts``) carries them, and the loop logs them before it (docs/usage.md). Use one
    ``stream`` setting for all models: a non-streaming
    model behind a streaming first one is replayed as chunks (which drops the opaque state a
    non-streamed reply keeps in its blocks), and a streaming one behind a non-streaming first
    one is read to the end before the reply is returned.

    ``Fallback([OpenAIChat("gpt-6.2-sol"), Anthropic("claude-sonnet-5-5")])``.
    """

    def __init__(self, models: Sequence[Callable[[Any], Any]], *, on: Iterable[str] = FALLBACK_ON) -> None:
        models = list(models)
        if not models:
            raise ValueError("Fallback needs at least one model")
        for m in models:
            if not callable(m):
                raise TypeError(f"Fallback: {m!r} is not a model (not callable)")
        self.models = models
        self.on = frozenset(on)

    def __repr__(self) -> str:
        return f"Fallback({self.models!r})"

    def _falls_back(self, exc: BaseException) -> bool:
        return _code(exc) in self.on

    def __call__(self, request: Any) -> Any:
        first = self.models[0](request)
        if hasattr(first, "__anext__"):
            return self._stream(request, first)
        return self._complete(request, first)

    async def _complete(self, request: Any, first: Any) -> Any:
        errors: List[BaseException] = []
        # The failed finish of each model tried that failed (docs/usage.md): the reply, or what
        # ends the call, carries them to the loop, which logs each as a request of its own.
        failed: List[Dict[str, Any]] = []
        result = first
        try:
            for index, model in enumerate(self.models):
                if index > 0:
                    result = model(request)  # raising here, it made no request: none is added
                try:
                    if hasattr(result, "__anext__"):
                        reply = await _drain(result)
                    else:
                        reply = await result if inspect.isawaitable(result) else result
                except ModelError as e:
                    failed.extend(e.failed_attempts or [_failed_finish(e, model)])
                    if not self._falls_back(e) or index == len(self.models) - 1:
                        e.fallback_errors = errors  # type: ignore[attr-defined]
                        raise
                    errors.append(e)
                    continue
                return _with_failed(reply, failed)
        except BaseException as e:
            # The last failure (its own attempt listed), a cancellation, or a model that raised
            # before its request: the attempts that failed are logged before it.
            if failed:
                e.failed_attempts = failed  # type: ignore[attr-defined]
            raise
        raise AssertionError("unreachable")

    async def _stream(self, request: Any, first: Any) -> AsyncIterator[Dict[str, Any]]:
        errors: List[BaseException] = []
        result = first
        for index in range(len(self.models)):
            if index > 0:
                try:
                    result = self.models[index](request)
                except Exception as e:
                    # Nothing of its request was made: the stream holds no attempt of it.
                    e.fallback_errors = errors  # type: ignore[attr-defined]
                    raise
            started = False
            try:
                if hasattr(result, "__anext__"):
                    try:
                        async for chunk in result:
                            started = True
                            yield chunk
                    finally:
                        close = getattr(result, "aclose", None)
                        if close is not None:
                            await close()
                else:
                    reply = await result if inspect.isawaitable(result) else result
                    for chunk in _as_chunks(reply):
                        started = True
                        yield chunk
                return
            except Exception as e:
                if started:  # its chunks are the attempt: the loop ends it
                    e.fallback_errors = errors  # type: ignore[attr-defined]
                    raise
                # Each model tried is a request of its own (docs/usage.md): its failed finish,
                # naming it, ends it in the log before the next model's chunks or the failure.
                for finish in getattr(e, "failed_attempts", None) or [_failed_finish(e, self.models[index])]:
                    yield finish
                if not self._falls_back(e) or index == len(self.models) - 1:
                    e.fallback_errors = errors  # type: ignore[attr-defined]
                    raise
                errors.append(e)
