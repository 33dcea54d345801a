"""Type-checked (mypy --strict) against the installed stubs; also executed by the test."""

from __future__ import annotations

import asyncio

import kerman


async def main() -> list[str]:
    store = kerman.MemoryStore()
    log: kerman.SessionLog = store.create("typed")
    inbox = kerman.Inbox(log, on_claimed=lambda m, turn: None)
    stored: kerman.UserMessage = inbox.append("next-turn", "hello")
    inbox.append("next-step", kerman.UserMessage("ctx", source={"kind": "plugin", "plugin": "p"}))
    batch: list[kerman.UserMessage] = inbox.claim("next-turn", 1)
    event: kerman.Event = log.append("goal/change", {"goal": stored.text})
    await log.flush()
    seen = [e.type for e in log.events(types=["goal/change"])]
    projection = kerman.InboxProjection.fold(log.splices())
    placements = [placement for placement, _ in projection.items()]
    work = kerman.consumed_work(log.events())
    log.close()
    failed = await failing_turn()
    return [m.text for m in batch] + seen + placements + [str(event.seq), str(work.dropped_unrun), failed]


async def failing_turn() -> str:
    async def model(request: kerman.ModelRequest) -> kerman.ModelReply:
        raise RuntimeError("typed failure")

    async with kerman.AgentLoop(model) as loop:
        loop.followup("go")
        await loop.when_idle()
        error = loop.last_error
        assert error is not None
        return f"{type(error.exception).__name__}: {error.error['message']}"


if __name__ == "__main__":
    print(asyncio.run(main()))
