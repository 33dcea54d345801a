"""A UI-style consumer: follows the session log and keeps its own view of the queue.

A UI (or a reconnecting client, or another process reading the same session) does not need the
loop's objects: ``log.tail()`` yields every committed event, then live ones as they commit, and
ends when the log closes. Folding the ``agent/inbox/spliced`` events into an
``InboxProjection`` gives exactly the loop's queue; here it is printed whenever it changes,
together with the turn boundaries and the replies.

The "user" queues three prompts in one go and steers the first turn while the model is still
thinking. The model is a deterministic stand-in that waits for a go-ahead on its first call, so
the steer lands mid-turn; it enters at the next step boundary.

Run it: ``python examples/ui_consumer.py``
"""

from __future__ import annotations

import asyncio

import kerman

FOLLOWED = (kerman.SPLICED, "turn/start", "turn/end", "assistant/message")


async def ui(log: kerman.SessionLog) -> None:
    """The consumer task: returns on its own once the log is closed."""
    queue = kerman.InboxProjection()
    async for event in log.tail(types=FOLLOWED):
        if event.type == kerman.SPLICED:
            queue.apply(event)
            items = ", ".join(f"{placement}:{message.text!r}" for placement, message in queue.items())
            print(f"  queue  [{items}]")
        elif event.type == "turn/start":
            print(f"turn {event.data['turn']} started")
        elif event.type == "turn/end":
            print(f"turn {event.data['turn']} ended {event.data['reason']['kind']}")
        else:
            print(f"  reply  {kerman.Message.from_dict(event.data['message']).text!r}")
    print("log closed: the UI stops")


async def main() -> None:
    go_ahead = asyncio.Event()
    thinking = asyncio.Event()

    async def model(request: kerman.ModelRequest) -> kerman.ModelReply:
        if not go_ahead.is_set():
            thinking.set()
            await go_ahead.wait()  # a slow first answer
        return kerman.ModelReply("answer to " + " + ".join(repr(m.text) for m in request.entered))

    loop = kerman.AgentLoop(model)  # a private memory log, closed by loop.aclose()
    consumer = asyncio.create_task(ui(loop.log))

    loop.followup("Plan the release")  # starts turn 1 at once
    loop.followup("Draft the changelog")  # queued behind it
    loop.followup("Tag the commit")
    await thinking.wait()
    loop.steer("Keep the plan short")  # enters turn 1 at its next step
    go_ahead.set()

    await loop.when_idle()  # all three turns have run
    await loop.aclose()  # closes the log, which ends the consumer's tail
    await consumer


if __name__ == "__main__":
    asyncio.run(main())
