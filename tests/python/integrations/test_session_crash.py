"""A process appending to a KermanSession killed with SIGKILL in the middle of its appends: the
session opens again (a file's torn tail cut off; PostgreSQL's transaction never committed), every
batch ``add_items`` acknowledged is there, and no batch is there in part."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import kerman
from conftest import fresh_schema_dsn
from kerman.integrations.openai_agents import KermanSession

CHILD = Path(__file__).with_name("session_writer_child.py")
ACKED = 12  # batches acknowledged before the kill


def _kill_while_appending(kind: str, where: str) -> int:
    """Runs the writer until it acknowledged ACKED batches, kills it at once (it is appending
    the next one), and returns the last batch it acknowledged."""
    with subprocess.Popen([sys.executable, str(CHILD), kind, where, "s"], stdout=subprocess.PIPE, text=True) as child:
        try:
            last = -1
            assert child.stdout is not None
            while last < ACKED - 1:
                line = child.stdout.readline()
                assert line, f"the writer ended early (exit {child.wait()})"
                last = int(line)
            os.kill(child.pid, signal.SIGKILL)
            child.wait(timeout=30)
            assert child.returncode == -signal.SIGKILL
            for line in child.stdout:  # acknowledged after the last line read, before the kill
                last = int(line)
            return last
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()


def _check(items: list, acked: int) -> None:
    assert len(items) % 2 == 0, "a batch is there in part"
    batches = len(items) // 2
    assert batches >= acked + 1, f"{batches} batches read back, {acked + 1} were acknowledged"
    for n in range(batches):
        assert items[2 * n]["content"].startswith(f"{n} ") and items[2 * n + 1] == {"role": "assistant", "content": str(n)}


def test_a_file_session_killed_mid_append_opens_with_every_acknowledged_batch(tmp_path, caplog):
    """The kill lands while the writer appends; most kills still find whole records on disk (a
    write to the page cache is not cut by SIGKILL), so the test also leaves what a write cut
    short leaves: the first half of a record, without its newline, at the end of the file."""
    root = tmp_path / "sessions"
    acked = _kill_while_appending("file", str(root))
    path = root / "s.jsonl"
    last_line = path.read_bytes().rstrip(b"\n").rsplit(b"\n", 1)[-1]
    with path.open("ab") as file:
        file.write(last_line[: len(last_line) // 2])

    async def read():
        async with KermanSession(kerman.FileStore(root), "s") as session:
            return await session.get_items()

    with caplog.at_level(logging.WARNING, logger="kerman"):
        items = asyncio.run(read())
    assert any("torn" in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
    _check(items, acked)


def test_a_postgres_session_killed_mid_append_reads_with_every_acknowledged_batch():
    dsn = fresh_schema_dsn()
    acked = _kill_while_appending("postgres", dsn)

    async def read():
        with kerman.PostgresStore(dsn).follow("s") as log:  # the killed owner's lease has not lapsed
            return await KermanSession(log, "s").get_items()

    _check(asyncio.run(read()), acked)
