"""A guard: destructive prompts never reach the model, and API keys never reach the log.

* ``block_destructive`` is a ``pre_step`` listener: a batch with a destructive command is
  rejected (the turn ends ``blocked`` with the reason); anything else goes on down the
  waterfall.
* ``redact_keys`` is an insert transform: it runs before an insertion's splice is committed,
  so an API key in a prompt, a steer or a tool's context is replaced before anything is
  logged. A key in a message bound for next-step (context a tool or plugin produced) is refused
  instead: the caller gets ``kerman.InsertRefusedError`` and nothing is inserted.
"""

from __future__ import annotations

import re

import kerman

DESTRUCTIVE = [
    (re.compile(r"\brm\s+-[a-z]*r[a-z]*f|\brm\s+-[a-z]*f[a-z]*r", re.I), "recursive forced delete (rm -rf)"),
    (re.compile(r"\bdrop\s+(table|database)\b", re.I), "dropping a table or database"),
    (re.compile(r"\bgit\s+push\b.*--force\b"), "force-pushing"),
]

API_KEY = re.compile(r"\b(sk|pk|ghp)[-_][A-Za-z0-9_-]{8,}\b")
REDACTED = "[redacted key]"


async def block_destructive(step: kerman.PreStep, next: kerman.Next[kerman.Decision]) -> kerman.Decision:
    for message in step.messages:
        for pattern, what in DESTRUCTIVE:
            if pattern.search(message.text):
                return kerman.Reject(f"{what} needs a human: {message.text!r}")
    return await next()


def redact_keys(message: kerman.UserMessage, target: kerman.Target) -> kerman.UserMessage | kerman.Refuse:
    if not API_KEY.search(message.text):
        return message
    if target == "next-step" and message.source.get("kind") != "user":
        return kerman.Refuse("context must not carry an API key")
    content = [
        {**block, "text": API_KEY.sub(REDACTED, block["text"])} if block.get("type") == "text" else block for block in message.content
    ]
    return message.with_content(content)


def install(loop: kerman.AgentLoop) -> None:
    """Registers both, ahead of what is already registered."""
    loop.pre_step(block_destructive, prepend=True)
    loop.on_insert(redact_keys, prepend=True)
