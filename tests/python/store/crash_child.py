"""Child program for the crash tests (tests/python/store/test_crash.py). Not a test module.

Usage: ``python crash_child.py <store-root> <durability> <session-id>``

Runs an ``AgentLoop`` over ``FileStore(root, durability=MODE).create(id)`` with a deterministic
scripted model (plain replies, tool calls, streamed replies, streamed tool calls, a model
failure now and then), a ``pre_step`` plugin that rejects some batches and suspends on others,
and feeds followups, steers, injects and an occasional ``cancel(keep_inbox=True)`` forever. It
never exits by itself: the parent SIGKILLs it.

Acknowledgements: after every completed ``await log.flush()`` it writes one line to stdout,

    a <n> <h>

where ``n`` is ``len(log)`` at the moment the flush was requested (so every seq < n is promised
by the flush) and ``h`` is a running CRC-32 over ``Event.to_json()`` of events ``0..n-1``
(computed by a log observer as events commit), so the parent can check that what was
acknowledged is what a reader saw. ``n`` is only written when it grew.

Commits: the observer also writes ``c <n>`` right after event ``n - 1`` commits in memory, so the
parent knows (a lower bound of) how many events existed when the kill landed, and can measure
how many appended-but-unacknowledged events a kill lost.
"""

from __future__ import annotations

import asyncio
import sys
import zlib

import kerman


def reply_for(index: int) -> object:
    """The model's reply to its ``index``-th request (deterministic)."""
    kind = index % 7
    if kind == 0:
        return kerman.ModelReply(f"plain reply {index}")
    if kind == 1:
        return kerman.ModelReply(
            [
                {"type": "text", "text": f"calling tools {index}"},
                {"type": "tool-call", "id": f"c{index}a", "name": "work", "arguments": '{"n": %d}' % index},
                {"type": "tool-call", "id": f"c{index}b", "name": "ctx", "arguments": "{}"},
            ]
        )
    if kind == 2:
        return [
            {"type": "reasoning-delta", "text": "thinking "},
            {"type": "text-delta", "text": f"streamed {index} "},
            {"type": "text-delta", "text": "part two"},
            {"type": "usage", "input": index, "output": 3},
            {"type": "finish", "reason": "stop"},
        ]
    if kind == 3:
        return [
            {"type": "text-delta", "text": f"streamed tools {index}"},
            {"type": "tool-call", "id": f"s{index}", "name": "work", "arguments": '{"n": %d}' % index},
            {"type": "finish", "reason": "stop"},
        ]
    if kind == 4:
        return kerman.ModelReply(f"long reply {index}", finish="max-tokens")
    if kind == 5 and index % 3 == 0:
        return kerman.ModelError(f"scripted failure {index}", code="SCRIPTED")
    return kerman.ModelReply(f"reply {index}", usage={"input": 1, "output": 1})


class Model:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self, request: kerman.ModelRequest) -> object:
        self.count += 1
        item = reply_for(self.count)
        if isinstance(item, BaseException):
            return self._fail(item)
        if isinstance(item, list):
            return self._stream(item)
        return self._reply(item)

    async def _fail(self, error: BaseException) -> kerman.ModelReply:
        raise error

    async def _reply(self, item: kerman.ModelReply) -> kerman.ModelReply:
        await asyncio.sleep(0)
        return item

    async def _stream(self, chunks: list):  # type: ignore[no-untyped-def]
        for chunk in chunks:
            await asyncio.sleep(0)
            yield dict(chunk)


async def main(root: str, durability: str, session_id: str) -> None:
    out = sys.stdout
    store = kerman.FileStore(root, durability=durability)
    log = store.create(session_id)

    hashes: list = []

    def observe(ev: kerman.Event) -> None:
        prev = hashes[-1] if hashes else 0
        hashes.append(zlib.crc32(ev.to_json().encode("utf-8"), prev))
        out.write(f"c {ev.seq + 1}\n")
        out.flush()

    log.subscribe(observe)
    loop = kerman.AgentLoop(Model(), log=log)

    @loop.tool
    async def work(args: dict, ctx: kerman.ToolContext) -> str:
        """Does some work."""
        await asyncio.sleep(0)
        return f"worked {args.get('n')}"

    @loop.tool
    async def ctx(args: dict, ctx: kerman.ToolContext) -> kerman.ToolResult:
        """Returns a result with an additional context."""
        return kerman.ToolResult("ok", additional_contexts=(f"context from {ctx.call_id}",))

    @loop.pre_step
    async def gate(step: kerman.PreStep, next):  # type: ignore[no-untyped-def]
        if any("please block" in m.text for m in step.messages):
            return kerman.Reject("blocked by the crash-test gate")
        if step.step % 2 == 0:
            # suspend between the claim and the entry, so kills land in that window too
            await log.flush()
        return await next()

    last = 0

    async def ack() -> None:
        nonlocal last
        n = len(log)
        await log.flush()
        if n > last:
            last = n
            out.write(f"a {n} {hashes[n - 1]}\n")
            out.flush()

    async def acker() -> None:
        while True:
            await ack()
            await asyncio.sleep(0)  # yield: flush may complete without suspending

    acker_task = asyncio.ensure_future(acker())
    i = 0
    while True:
        i += 1
        if i % 11 == 0:
            loop.followup(f"prompt {i}: please block this one")
        else:
            loop.followup(f"prompt {i}")
        if i % 3 == 0:
            loop.steer(f"steer {i}")
        if i % 5 == 0:
            loop.inject(f"inject {i}")
        await ack()
        if i % 13 == 0 and loop.status == "running":
            loop.cancel(keep_inbox=True)
        if i % 2 == 0:
            await loop.when_idle()
            loop.wake()  # after a blocked / failed / aborted turn the loop idles with input pending
        if acker_task.done():
            acker_task.result()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
