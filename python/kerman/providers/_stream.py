"""What every streamed reply goes through on its way to the loop (surrogate pairs split across
deltas, the request's total deadline), and the helpers for it. No vendor SDK is imported here."""

from __future__ import annotations

import asyncio
import re
from typing import Any, AsyncIterator, Awaitable, Dict, Optional

from .. import errors


def deadline_error(provider: str, deadline: float) -> errors.ModelError:
    """The failure of a request that outlived its ``deadline`` (seconds): a timeout, retried as one."""
    return errors.ModelTimeoutError(
        f"{provider}: no complete reply within the deadline of {deadline:g} s", "TIMEOUT", status=None, retry_after_ms=None, request_id=None
    )


SURROGATE = re.compile("[\ud800-\udfff]")


def fix_surrogates(text: str) -> str:
    """``text`` with UTF-16 surrogate pairs (two JSON escapes, ``"\\ud83d\\ude00"``) joined into
    their character and every unpaired half replaced by U+FFFD: a str with a lone surrogate
    cannot be encoded as UTF-8, so it could not be logged."""
    if text.isascii() or SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


DELTAS = ("text-delta", "reasoning-delta")


async def guard_chunks(stream: AsyncIterator[Dict[str, Any]], provider: str, deadline: Optional[float]) -> AsyncIterator[Dict[str, Any]]:
    """What every streamed reply goes through on its way to the loop:

    * a delta that ends with the first half of a surrogate pair (a proxy that re-chunks by
      UTF-16 index splits ``"\\ud83d\\ude00"`` into two deltas) keeps that half back until the
      next delta of its kind brings the other half; a half that stays unpaired becomes U+FFFD;
    * with a ``deadline`` (seconds), the whole request, from sending it to the last chunk, must
      fit in it: the SDK's ``timeout`` bounds each read only, so a server that sends keep-alives
      would hold the turn forever. Only the provider's own steps count (the consumer's work
      between chunks runs outside the bound) and a late one fails ``TIMEOUT``."""
    held = ""
    held_kind = ""
    when = None if deadline is None else asyncio.get_running_loop().time() + deadline
    try:
        while True:
            try:
                if when is None:
                    chunk = await stream.__anext__()
                else:
                    chunk = await within(stream.__anext__(), when)
            except StopAsyncIteration:
                break
            except DeadlinePassed:
                raise deadline_error(provider, deadline or 0.0) from None
            kind = chunk.get("type")
            if kind in DELTAS:
                text = chunk.get("text") or ""
                if held:
                    if kind == held_kind:
                        text = held + text
                    else:
                        yield {"type": held_kind, "text": "\ufffd"}
                    held = ""
                if not text.isascii() and SURROGATE.search(text) is not None:
                    if "\ud800" <= text[-1] <= "\udbff":
                        held, held_kind, text = text[-1], kind, text[:-1]
                    text = fix_surrogates(text)
                    if not text:
                        continue
                    chunk = {"type": kind, "text": text}
                yield chunk
            else:
                if held:
                    yield {"type": held_kind, "text": "\ufffd"}
                    held = ""
                yield chunk
        if held:
            yield {"type": held_kind, "text": "\ufffd"}
    finally:
        close = getattr(stream, "aclose", None)
        if close is not None:
            await close()


class DeadlinePassed(Exception):
    """Raised by ``within`` (its own class: a ``TimeoutError`` from the SDK is not the deadline's)."""


async def within(awaitable: Awaitable[Any], when: float) -> Any:
    """``await awaitable`` on the caller's task, raising ``DeadlinePassed`` at the loop time
    ``when`` (as ``asyncio.timeout_at`` from Python 3.11 does; this works on 3.10 too)."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    fired = False

    def fire() -> None:
        nonlocal fired
        fired = True
        task.cancel()

    handle = loop.call_at(when, fire)
    try:
        return await awaitable
    except asyncio.CancelledError:
        if not fired:
            raise
        uncancel = getattr(task, "uncancel", None)
        if uncancel is not None:
            uncancel()
        raise DeadlinePassed from None
    finally:
        handle.cancel()
