"""Writes a realistic Kerman session file (format version 1) without going through Kerman.

    python3 benches/python/gen_log.py ROOT SESSION_ID EVENTS [--baseline-copy PATH]

One block is one turn the way the agent loop logs it: a prompt spliced into next-turn, the
turn start and claim, a step that streams six chunks and asks for a tool, the tool call and a
large result, a steering message, a second step that claims it and streams the answer, and the
turn end (28 records, about 690 bytes each on average). Blocks repeat with their own seqs,
times, turn numbers and message ids, so the file folds to a consistent inbox (empty) and turn
counter (the number of whole blocks).

Every line is ``<crc32c of the json, 8 lowercase hex> <compact json>\\n``. CRC-32C is not in the
standard library, and a byte-at-a-time loop over ~700 MB would take many minutes, so the
checksum uses the linearity of the CRC: a record is constant text with a few short variable
fields; the register after a constant segment of length L is ``Z_L(state) ^ C(segment)``,
where ``Z_L`` (running L zero bytes) is a linear map precomputed as four byte tables and
``C(segment)`` is the segment's checksum from a zero register. Only the variable bytes are
processed one at a time. ``--baseline-copy`` writes the same records with ``zlib.crc32``
framing for the pure-Python baseline store.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import zlib
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

POLY = 0x82F63B78
GEN_VERSION = 1  # bump when the content changes, so cached files are regenerated


def _table() -> List[int]:
    out = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ POLY if c & 1 else c >> 1
        out.append(c)
    return out


TABLE = _table()


def _raw(state: int, data: bytes) -> int:
    t = TABLE
    for b in data:
        state = t[(state ^ b) & 0xFF] ^ (state >> 8)
    return state


def crc32c(data: bytes) -> int:
    """Plain table-driven CRC-32C (for checks and short inputs)."""
    return _raw(0xFFFFFFFF, data) ^ 0xFFFFFFFF


_ZERO_MAPS: Dict[int, Tuple[List[int], ...]] = {}


def _zero_map(length: int) -> Tuple[List[int], ...]:
    """Four 256-entry tables giving the register after ``length`` zero bytes, by input byte."""
    if length not in _ZERO_MAPS:
        zeros = bytes(length)
        images = [_raw(1 << bit, zeros) for bit in range(32)]
        tables = []
        for k in range(4):
            tab = [0] * 256
            for v in range(1, 256):
                low = v & -v
                tab[v] = tab[v ^ low] ^ images[8 * k + low.bit_length() - 1]
            tables.append(tab)
        _ZERO_MAPS[length] = tuple(tables)
    return _ZERO_MAPS[length]


class _Const:
    """A constant segment of a record: its bytes and how it moves the CRC register."""

    __slots__ = ("data", "t0", "t1", "t2", "t3", "c")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.t0, self.t1, self.t2, self.t3 = _zero_map(len(data))
        self.c = _raw(0, data)

    def step(self, s: int) -> int:
        return self.t0[s & 0xFF] ^ self.t1[(s >> 8) & 0xFF] ^ self.t2[(s >> 16) & 0xFF] ^ self.t3[s >> 24] ^ self.c


# ---- the content of one block ------------------------------------------------------------------

WORDS = (
    "the of and to in is that for it as with was on be by this are or from at which an "
    "session log inbox turn step model tool claim durable append writer thread fsync batch "
    "prompt context result reply stream chunk message plugin guard rewrite steer inject "
    'résumé naïve façade "quoted" path/to/file.py line\tindent {json: [1, 2]} 42 3.14'
).split(" ")


def text(n: int, seed: int) -> str:
    """Deterministic English-ish text of about ``n`` characters, with escapes and non-ASCII."""
    out, size, x = [], 0, seed * 2654435761 % 2**32
    while size < n:
        x = (x * 1103515245 + 12345) % 2**31
        word = WORDS[x % len(WORDS)]
        out.append(word)
        size += len(word) + 1
        if x % 17 == 0:
            out.append("\n")
    return " ".join(out)[:n]


# Sentinels in the template, replaced per block. Integers: 777_0000_000 + k = seq of block
# line k; 888_0000_001 = turn; 888_0000_002 = time of the line. Strings: "~ID<k>~" = id k.
SEQ0, TURN, TIME = 7770000000, 8880000001, 8880000002


def _msg(id_key: int, role: str, content: List[Dict[str, Any]], source: Dict[str, Any]) -> Dict[str, Any]:
    return {"id": f"~ID{id_key}~", "role": role, "content": content, "source": source}


def block_template() -> List[Tuple[str, Dict[str, Any], Optional[List[int]], Optional[str]]]:
    """One turn as ``(type, data, sourceEventSeqs as block offsets, surfaceOp)`` records."""
    prompt = _msg(0, "user", [{"type": "text", "text": text(1200, 1)}], {"kind": "user"})
    steer = _msg(1, "user", [{"type": "text", "text": text(300, 2)}], {"kind": "user"})
    answer1 = text(1500, 3)
    answer2 = text(1800, 4)
    args = json.dumps({"path": "src/event_log/file/format.rs", "start": 100, "end": 180})
    call = {"type": "tool-call", "id": "~ID4~", "name": "read_file", "arguments": args}
    recs: List[Tuple[str, Dict[str, Any], Optional[List[int]], Optional[str]]] = []

    def add(kind: str, data: Dict[str, Any], seqs: Optional[List[int]] = None, op: Optional[str] = None) -> int:
        recs.append((kind, data, seqs, op))
        return len(recs) - 1

    def chunks(body: str, step: int) -> List[int]:
        n = len(body) // 6 + 1
        return [
            add("assistant/chunk", {"turn": TURN, "step": step, "chunk": {"type": "text-delta", "text": body[i : i + n]}})
            for i in range(0, len(body), n)
        ]

    add("agent/inbox/spliced", {"target": "next-turn", "start": 0, "inserted": [prompt]})
    add("turn/start", {"turn": TURN})
    add("agent/inbox/spliced", {"target": "next-turn", "start": 0, "removedCount": 1, "inserted": []})
    add("step/start", {"turn": TURN, "step": 1})
    add("user/message", prompt, None, "append")
    seqs = chunks(answer1, 1)
    seqs.append(add("assistant/chunk", {"turn": TURN, "step": 1, "chunk": dict(call)}))
    add(
        "assistant/message",
        {
            "turn": TURN,
            "step": 1,
            "message": _msg(2, "assistant", [{"type": "text", "text": answer1}, call], {"kind": "model"}),
            "usage": {"inputTokens": 5210, "outputTokens": 412},
        },
        seqs,
        "append",
    )
    call_at = add("tool/call", {"turn": TURN, "step": 1, "callId": "~ID4~", "name": "read_file", "arguments": args})
    add(
        "tool/result",
        {
            "turn": TURN,
            "step": 1,
            "message": _msg(
                3,
                "user",
                [{"type": "tool-result", "toolCallId": "~ID4~", "content": [{"type": "text", "text": text(6000, 5)}]}],
                {"kind": "tool", "callId": "~ID4~"},
            ),
        },
        [call_at],
        "append",
    )
    add("agent/inbox/spliced", {"target": "next-step", "start": 0, "inserted": [steer]})
    add("step/end", {"turn": TURN, "step": 1})
    add("agent/inbox/spliced", {"target": "next-step", "start": 0, "removedCount": 1, "inserted": []})
    add("step/start", {"turn": TURN, "step": 2})
    add("user/message", steer, None, "append")
    seqs = chunks(answer2, 2)
    add(
        "assistant/message",
        {
            "turn": TURN,
            "step": 2,
            "message": _msg(5, "assistant", [{"type": "text", "text": answer2}], {"kind": "model"}),
            "usage": {"inputTokens": 7730, "outputTokens": 505},
        },
        seqs,
        "append",
    )
    add("step/end", {"turn": TURN, "step": 2})
    add("turn/end", {"turn": TURN, "reason": {"kind": "completed"}})
    return recs


def record(kind: str, seq: Any, when: Any, data: Any, seqs: Optional[List[Any]], op: Optional[str]) -> Dict[str, Any]:
    out: Dict[str, Any] = {"type": kind, "seq": seq, "time": when, "data": data}
    if seqs is not None:
        out["sourceEventSeqs"] = seqs
    if op is not None:
        out["surfaceOp"] = op
    return out


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def block_records(block: int, first_seq: int, t0: int) -> List[Dict[str, Any]]:
    """The block's records as dicts, with every sentinel resolved (for P9 and for tests)."""
    out = []
    for line in _templates():
        body = b"".join(p.data if isinstance(p, _Const) else _value(p, block, first_seq, t0, line[1]) for p in line[0])
        out.append(json.loads(body))
    return out


# ---- the fast writer ---------------------------------------------------------------------------

_SENTINEL = re.compile(rb"777\d{7}|888000000[12]|~ID\d~")
Part = Union[_Const, bytes]
_TEMPLATES: List[Tuple[List[Part], int]] = []


def _templates() -> List[Tuple[List[Part], int]]:
    """Each template line as constant segments and sentinel tokens, with its block offset."""
    if not _TEMPLATES:
        for k, (kind, data, seqs, op) in enumerate(block_template()):
            rec = record(kind, SEQ0 + k, TIME, data, None if seqs is None else [SEQ0 + s for s in seqs], op)
            body = compact(rec).encode()
            parts: List[Part] = []
            pos = 0
            for m in _SENTINEL.finditer(body):
                if m.start() > pos:
                    parts.append(_Const(body[pos : m.start()]))
                parts.append(m.group())
                pos = m.end()
            parts.append(_Const(body[pos:]))
            _TEMPLATES.append((parts, k))
    return _TEMPLATES


def _value(token: bytes, block: int, first_seq: int, t0: int, offset: int) -> bytes:
    if token.startswith(b"777"):
        return b"%d" % (first_seq + int(token) - SEQ0)
    if token == b"8880000001":
        return b"%d" % (block + 1)
    if token == b"8880000002":
        return b"%d" % (t0 + (first_seq + offset) * 3)
    return b"01a22000-%04x-7%03x-8000-%012x" % (block >> 28, int(token[3:-1]), block)


def lines(events: int, session_id: str, created_at: int) -> Iterator[Tuple[bytes, int]]:
    """Yields ``(json bytes, crc32c)`` per line, header first, ``events`` event records."""
    header = compact({"type": "session", "version": 1, "id": session_id, "createdAt": created_at}).encode()
    yield header, crc32c(header)
    templates = _templates()
    per_block = len(templates)
    t = TABLE
    block = 0
    seq = 0
    while seq < events:
        for parts, offset in templates[: min(per_block, events - seq)]:
            s = 0xFFFFFFFF
            out = []
            for p in parts:
                if isinstance(p, _Const):
                    s = p.t0[s & 0xFF] ^ p.t1[(s >> 8) & 0xFF] ^ p.t2[(s >> 16) & 0xFF] ^ p.t3[s >> 24] ^ p.c
                    out.append(p.data)
                else:
                    v = _value(p, block, seq, created_at, offset)
                    for b in v:
                        s = t[(s ^ b) & 0xFF] ^ (s >> 8)
                    out.append(v)
            yield b"".join(out), s ^ 0xFFFFFFFF
        block += 1
        seq += per_block
    # A partial last block would leave the inbox or a turn open; callers ask for whole blocks
    # (see whole_blocks) when they want a clean fold.


def whole_blocks(events: int) -> int:
    """The largest event count <= ``events`` made of whole blocks (at least one block)."""
    per = len(_templates())
    return max(per, events // per * per)


def write(path: str, session_id: str, events: int, baseline_copy: Optional[str] = None, created_at: int = 1767225600000) -> int:
    """Writes the session file (and optionally the zlib-framed copy); returns its size."""
    tmp = path + ".part"
    btmp = baseline_copy + ".part" if baseline_copy else None
    size = 0
    with open(tmp, "wb") as out:
        bout = open(btmp, "wb") if btmp else None
        try:
            buf: List[bytes] = []
            bbuf: List[bytes] = []
            pending = 0
            for body, crc in lines(events, session_id, created_at):
                buf.append(b"%08x %s\n" % (crc, body))
                if bout is not None:
                    bbuf.append(b"%08x %s\n" % (zlib.crc32(body), body))
                pending += len(body) + 10
                if pending > 1 << 23:
                    out.write(b"".join(buf))
                    if bout is not None:
                        bout.write(b"".join(bbuf))
                    size += pending
                    buf, bbuf, pending = [], [], 0
            out.write(b"".join(buf))
            if bout is not None:
                bout.write(b"".join(bbuf))
            size += pending
        finally:
            if bout is not None:
                bout.close()
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    if baseline_copy and btmp:
        os.chmod(btmp, 0o600)
        os.replace(btmp, baseline_copy)
    return size


def main(argv: List[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root")
    ap.add_argument("session_id", help="an id made of [A-Za-z0-9_-] (the file name is <id>.jsonl)")
    ap.add_argument("events", type=int)
    ap.add_argument("--baseline-copy", help="also write the zlib.crc32-framed copy here")
    args = ap.parse_args(argv)
    if not re.fullmatch(r"[A-Za-z0-9_-]+", args.session_id):
        ap.error("use an id of [A-Za-z0-9_-] so the file name needs no encoding")
    os.makedirs(args.root, exist_ok=True)
    started = time.perf_counter()
    size = write(os.path.join(args.root, args.session_id + ".jsonl"), args.session_id, args.events, args.baseline_copy)
    print(f"{args.events} events, {size / 1e6:.1f} MB in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
