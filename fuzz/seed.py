"""Seeds fuzz/corpus/<target>/ from real session files.

    python fuzz/seed.py [SESSION.jsonl ...]

With no arguments it makes its own: the `kerman demo` session (followup, steer, inject,
rejecting and rewriting plugins, a tool, cancel, crash and resume) and a short AgentLoop
session with a streamed reply. Needs kerman installed. Files are named by content hash, as
libFuzzer names them, so running it twice adds nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CORPUS = Path(__file__).resolve().parent / "corpus"
sys.path.insert(0, str(CORPUS.parent.parent / "tests" / "python"))
from conftest import event_record, frame  # noqa: E402  (the test suite's record helpers)


def put(target: str, data: bytes) -> None:
    folder = CORPUS / target
    folder.mkdir(parents=True, exist_ok=True)
    (folder / hashlib.sha1(data).hexdigest()).write_bytes(data)


def compact(value) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()



def seed_from(path: Path) -> None:
    lines = path.read_bytes().splitlines(keepends=True)
    events = lines[1:]  # the record_reader target supplies its own header
    # Whole files make slow inputs; windows of a few records are enough to start from.
    for start in range(0, len(events), 6):
        window = events[start:start + 6]
        put("record_reader", b"".join(window))
        put("record_reader", b"".join(line[9:] for line in window))  # JSON lines, framed by the target
    splices = []
    for line in events:
        record = json.loads(line[9:])
        data = record["data"]
        if record["type"] == "agent/inbox/spliced":
            splices.append(data)
            put("splice_validator", compact(data))
        message = data.get("message", data) if isinstance(data, dict) else None
        if isinstance(message, dict) and {"id", "role", "content", "source"} <= message.keys():
            put("message_from_json", compact(message))
    if splices:
        put("splice_validator", compact(splices))  # a whole replay


async def _short_session(root: Path) -> Path:
    import kerman
    from kerman.models import ScriptedModel

    store = kerman.FileStore(root, durability="none")
    log = store.create("seed")
    model = ScriptedModel([
        kerman.ModelReply([{"type": "tool-call", "id": "c1", "name": "look", "arguments": "{}"}]),
        [{"type": "reasoning-delta", "text": "hm"}, {"type": "text-delta", "text": "ok é"},
         {"type": "finish", "reason": "stop"}],
    ])
    loop = kerman.AgentLoop(model, log=log)

    @loop.tool
    async def look(args, ctx):
        return kerman.ToolResult("seen", is_error=True)

    loop.followup("hello")
    loop.inject(kerman.UserMessage("ctx", source={"kind": "plugin", "plugin": "p"}))
    await loop.when_idle()
    await loop.aclose()
    log.close()
    return root / "seed.jsonl"


def main(paths: list) -> None:
    if not paths:
        tmp = Path(tempfile.mkdtemp(prefix="kerman-seed-"))
        subprocess.run([sys.executable, "-m", "kerman", "demo", "--dir", str(tmp / "demo")],
                       check=True, stdout=subprocess.DEVNULL)
        paths = sorted((tmp / "demo").glob("*.jsonl"))
        paths.append(asyncio.run(_short_session(tmp / "short")))
    for path in paths:
        seed_from(Path(path))
    # Envelope fields no loop writes today.
    replace = compact(event_record(0, "user/message", {}, time=1, source_event_seqs=[],
                                   surface_op={"op": "replace", "start": 0, "end": 1}))
    put("record_reader", frame(replace))
    put("record_reader", replace + b"\n")
    for target in ("record_reader", "splice_validator", "message_from_json"):
        print(target, len(list((CORPUS / target).iterdir())))


if __name__ == "__main__":
    main(sys.argv[1:])
