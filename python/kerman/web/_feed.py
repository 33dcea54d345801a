"""One projection per session and protocol, shared by every stream of it.

A stream's output depends only on the log and where it resumes, so the server computes each
protocol's output once per session (one ``tail()``, one projection, each event encoded as SSE
once) and every connection reads the same list of frames from its resume point on. A hundred
followers of a session cost one projection and a hundred socket writes per event, not a
hundred projections; a client that fell behind gets everything it missed in one write.

The frames are kept while the session is open in this process (they are the log's projection,
about its size); a stream that resumes finds its place by bisecting them.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import logging
from typing import AsyncIterator, Optional

from sse_starlette import ServerSentEvent

from .. import SessionLog
from ..ui import AgUiProjection, CustomMapping, ResumePoint, VercelProjection

__all__ = ["Feed"]

log = logging.getLogger("kerman.web")

PIECE = 64 * 1024  # bytes a stream writes at once (one larger frame goes whole)


def _frame(data: str, event_id: Optional[str]) -> bytes:
    return ServerSentEvent(data=data, id=event_id).encode()


class Feed:
    """The SSE frames of one protocol over one session's log, growing as the log does."""

    def __init__(self, session_log: SessionLog, protocol: str, thread_id: str, custom: Optional[CustomMapping] = None) -> None:
        self.protocol = protocol
        self._custom = custom  # the custom-event mapping of the AG-UI and Vercel projections
        self._keys: list[tuple[int, int]] = []  # (seq, index) of each frame, in order
        self._frames: list[bytes] = []
        self._changed = asyncio.Event()
        self.done = False
        self._stopped = False
        self._task = asyncio.get_running_loop().create_task(self._run(session_log, thread_id))

    async def _run(self, session_log: SessionLog, thread_id: str) -> None:
        try:
            if self.protocol == "kerman":
                async for event in session_log.tail(start=0):
                    self._add([((event.seq, 0), _frame(event.to_json(), str(event.seq)))])
                return
            custom = self._custom
            projection = AgUiProjection(thread_id, custom=custom) if self.protocol == "agui" else VercelProjection(custom=custom)
            async for event in session_log.tail(start=0):
                outs = projection.feed(event)
                if outs:
                    last = len(outs) - 1
                    self._add(
                        [
                            (
                                (event.seq, i),
                                _frame(
                                    json.dumps(out, ensure_ascii=False, separators=(",", ":")),
                                    str(event.seq) if i == last else f"{event.seq}:{i}",
                                ),
                            )
                            for i, out in enumerate(outs)
                        ]
                    )
        except Exception:  # a projection error (a bad splice): the stream ends rather than lies
            log.exception("the %s stream of session %r stopped", self.protocol, thread_id)
        finally:
            if self.protocol == "vercel":
                self._add([((1 << 62, 0), _frame("[DONE]", None))])
            self.done = True
            self._wake()

    def _add(self, frames: list[tuple[tuple[int, int], bytes]]) -> None:
        for key, frame in frames:
            self._keys.append(key)
            self._frames.append(frame)
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _start(self, after: Optional[ResumePoint]) -> int:
        if after is None:
            return 0
        if after.index is None:  # after everything of that seq
            return bisect.bisect_left(self._keys, (after.seq + 1, 0))
        return bisect.bisect_right(self._keys, (after.seq, after.index))

    async def frames(self, after: Optional[ResumePoint]) -> AsyncIterator[bytes]:
        """Everything after ``after`` (as bytes ready for the wire), then each frame as it comes;
        ends when the log does."""
        # a resume point past what the feed holds yet waits for it to be reached
        while not (self.done or self._stopped) and after is not None and (not self._keys or self._keys[-1] < (after.seq, after.index or 0)):
            await self._changed.wait()
        i = self._start(after)
        frames = self._frames
        while True:
            if i < len(frames):
                # in pieces of about PIECE bytes: the server's send waits while the client does
                # not read, so a stalled client holds one piece, not a copy of the backlog
                end, size = i, 0
                while end < len(frames) and (size == 0 or size + len(frames[end]) <= PIECE):
                    size += len(frames[end])
                    end += 1
                yield frames[i] if end == i + 1 else b"".join(frames[i:end])
                i = end
            elif self.done or self._stopped:
                return
            else:
                await self._changed.wait()

    def stop(self) -> None:
        """Ends every stream of this feed (the server is stopping); the feed itself goes on."""
        self._stopped = True
        self._wake()

    def close(self) -> None:
        self._task.cancel()
