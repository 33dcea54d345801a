"""A session file a crash cut before the session's first sync (part of its header, maybe zero
bytes after it): every reader takes it for the empty session `open` makes of it. `follow`
follows it and shows what the session gets once opened; `kerman log repair` writes its header
again (docs/format.md, "Writing")."""

from __future__ import annotations

import asyncio
from typing import Any, List

import kerman
from conftest import session_path

DEADLINE = 60  # seconds; only ever reached when something is broken


def _cut_creation(root: Any) -> bytes:
    store = kerman.FileStore(root, durability="strict")
    store.create("s").close()
    path = session_path(root, "s")
    cut = path.read_bytes()[:20] + bytes(16)
    path.write_bytes(cut)
    return cut


def test_a_follower_of_a_cut_creation_shows_the_session_once_it_is_opened(tmp_path: Any) -> None:
    _cut_creation(tmp_path)
    store = kerman.FileStore(tmp_path, durability="strict")
    follower = store.follow("s")
    try:
        assert (len(follower), follower.header["id"]) == (0, "s")

        async def write_and_follow() -> List[int]:
            with store.open("s") as log:
                for n in range(3):
                    log.append("x/y", {"n": n})
                await log.flush()
            seen: List[int] = []
            async for event in follower.tail():
                seen.append(event.data["n"])
                if len(seen) == 3:
                    break
            return seen

        assert asyncio.run(asyncio.wait_for(write_and_follow(), DEADLINE)) == [0, 1, 2]
    finally:
        follower.close()


def test_repair_of_a_cut_creation_writes_its_header_again(tmp_path: Any, capsys: Any) -> None:
    from kerman.cli import main

    cut = _cut_creation(tmp_path)
    store = kerman.FileStore(tmp_path, durability="strict")
    assert store.repair("s", dry_run=True)["torn_tail_bytes"] == len(cut)
    assert session_path(tmp_path, "s").read_bytes() == cut, "a dry run writes nothing"
    assert main(["log", "repair", str(tmp_path), "s", "--yes"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("repaired: kept 0 events, removed ") and "backup: none" in out
    info = store.verify("s")
    assert (info["events"], info["torn_tail_bytes"]) == (0, 0)
    assert main(["log", "repair", str(tmp_path), "s", "--yes"]) == 0
    assert capsys.readouterr().out.startswith("nothing to repair")
