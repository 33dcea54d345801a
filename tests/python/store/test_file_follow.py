"""Reading a running file session (issue 11, item 3): readers take no lock, `FileStore.follow`
grows live, and `kerman log tail --follow` prints events as another process appends them.

The writer is always another process (`WRITER` below) that holds the session open, appends
when told and reports each flushed length, so every wait here is on a condition (a line from
a process, an event in a tail) with a bounded deadline, never a sleep.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kerman
from conftest import compact, event_record, frame, header_record, session_path, write_raw_session
from kerman import FileStore, SessionLockedError
from kerman.errors import LogError

DEADLINE = 60  # seconds; only ever reached when something is broken

WRITER = textwrap.dedent(
    """
    import asyncio, sys
    import kerman
    store = kerman.FileStore(sys.argv[1], durability="strict")
    log = store.open(sys.argv[2])
    inbox = kerman.Inbox(log)

    async def flush():
        await log.flush()

    print("ready", len(log), flush=True)
    for line in sys.stdin:
        verb, _, arg = line.strip().partition(" ")
        if verb == "append":
            for _ in range(int(arg)):
                log.append("x/w", {"i": len(log)})
        elif verb == "steer":
            inbox.append("next-step", kerman.UserMessage(arg, id="m-" + arg))
        elif verb == "quit":
            break
        asyncio.run(flush())
        print("flushed", len(log), flush=True)
    log.close()
    print("closed", flush=True)
    """
)


class Writer:
    """A process holding session `sid` of `root` open."""

    def __init__(self, root: Path, sid: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(root), sid], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.expect("ready")

    def expect(self, word: str) -> int:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith(word):
            self.proc.kill()
            _, err = self.proc.communicate(timeout=DEADLINE)
            raise AssertionError(f"writer said {line!r}, expected {word!r}; stderr: {err}")
        return int(line.split()[1]) if line.split()[1:] else 0

    def tell(self, command: str) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.expect("flushed")

    def close(self) -> None:
        if self.proc.poll() is None:
            out, err = self.proc.communicate("quit\n", timeout=DEADLINE)
            assert self.proc.returncode == 0, err
            assert out.endswith("closed\n")


@pytest.fixture
def running(store_root):
    """Session "live" with 3 events, held open by a writer process."""
    store = FileStore(store_root, durability="none")
    with store.create("live") as log:
        for i in range(3):
            log.append("x/w", {"i": i})
    writer = Writer(store_root, "live")
    try:
        yield store, writer
    finally:
        if writer.proc.poll() is None:
            writer.proc.kill()
            writer.proc.communicate(timeout=DEADLINE)


async def _collect(log, start: int, until: int) -> list:
    """Events from `start` through the tail until the log holds `until` events."""
    seen = []

    async def run():
        async for event in log.tail(start=start):
            seen.append(event)
            if event.seq + 1 >= until:
                return

    await asyncio.wait_for(run(), DEADLINE)
    return seen


def test_a_running_session_reads_without_its_lock(running):
    store, writer = running
    assert writer.tell("append 2") == 5
    _, events, info = store._read("live")
    assert [e.data for e in events] == [{"i": i} for i in range(5)] and info["torn_tail_bytes"] == 0
    assert store.verify("live")["events"] == 5
    with pytest.raises(SessionLockedError) as exc:  # owning is still exclusive
        store.open("live")
    assert "this process" not in str(exc.value)
    writer.close()


def test_follow_grows_as_another_process_appends(running):
    store, writer = running
    follower = store.follow("live")
    try:
        assert len(follower) == 3 and follower.header["id"] == "live"
        assert writer.tell("append 4") == 7
        seen = asyncio.run(_collect(follower, 1, 7))
        assert [e.seq for e in seen] == list(range(1, 7))
        assert [e.to_json() for e in follower.events()] == [e.to_json() for e in store._read("live")[1]]
        writer.tell("steer hello")
        asyncio.run(_collect(follower, 7, 8))
        assert kerman.InboxProjection.fold(follower.splices()).next_step[0].id == "m-hello"
    finally:
        follower.close()
    writer.close()


def test_a_follower_refuses_to_write(running):
    store, writer = running
    follower = store.follow("live")
    try:
        with pytest.raises(LogError, match='session "live" is followed read-only here'):
            follower.append("x/mine", 1)
        with pytest.raises(LogError, match="read-only"):
            kerman.Inbox(follower).append("next-turn", "hi")
        assert len(follower) == 3
    finally:
        follower.close()
    assert writer.tell("append 1") == 4  # the owner never noticed
    writer.close()


def test_a_follower_tail_ends_when_the_session_is_deleted(running):
    store, writer = running
    follower = store.follow("live")
    writer.close()
    store.delete("live")

    async def drain():
        return [e.seq async for e in follower.tail()]

    assert asyncio.run(asyncio.wait_for(drain(), DEADLINE)) == [0, 1, 2]
    assert follower.closed


def test_an_incomplete_last_record_is_not_visible_until_complete(store_root):
    path = session_path(store_root, "t")
    records = [frame(compact(event_record(i, "x/w", {"i": i}))) for i in range(3)]
    data = write_raw_session(path, header_record("t"), [*records[:2], records[2][:15]])
    follower = FileStore(store_root, durability="none").follow("t")
    try:
        assert len(follower) == 2
        assert path.read_bytes() == data  # nothing repaired, nothing written
        with open(path, "ab") as f:
            f.write(records[2][15:])
        assert [e.seq for e in asyncio.run(_collect(follower, 2, 3))] == [2]
    finally:
        follower.close()


def test_a_corrupt_file_is_refused_by_follow(store_root):
    path = session_path(store_root, "c")
    bad = bytearray(frame(compact(event_record(0, "x/w", 0))))
    bad[20] ^= 1
    write_raw_session(path, header_record("c"), [bytes(bad), event_record(1, "x/w", 1)])
    with pytest.raises(kerman.CorruptLogError):
        FileStore(store_root, durability="none").follow("c")


# -- the command line, while the writer holds the session ------------------------------------


def _kerman(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kerman", *argv], capture_output=True, text=True, timeout=DEADLINE, check=False)


def test_cli_reads_a_running_session(running, store_root):
    store, writer = running
    writer.tell("steer look")
    for command in ("show", "tail", "inbox"):
        done = _kerman("log", command, str(store_root), "live", "--json")
        assert done.returncode == 0, done.stderr
        if command == "inbox":
            assert [i["message"]["id"] for i in json.loads(done.stdout)] == ["m-look"]
        else:
            assert [json.loads(line)["seq"] for line in done.stdout.splitlines()] == [0, 1, 2, 3]
    writer.close()


def test_cli_tail_follow_prints_events_as_they_come_and_exits_0_on_ctrl_c(running, store_root):
    store, writer = running
    proc = subprocess.Popen(
        [sys.executable, "-m", "kerman", "log", "tail", str(store_root), "live", "-n", "1", "--follow", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline())["seq"] == 2  # the last event, then live ones
        writer.tell("append 2")
        assert [json.loads(proc.stdout.readline())["data"] for _ in range(2)] == [{"i": 3}, {"i": 4}]
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=DEADLINE)
        assert (proc.returncode, out) == (0, ""), err
        assert "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=DEADLINE)
    writer.close()


# -- issue 11 item 1: a session this process still holds ---------------------------------------


def test_opening_a_session_this_process_holds_says_so_and_how_to_release_it(store):
    log = store.create("held")
    try:
        with pytest.raises(SessionLockedError) as exc:
            store.open("held")
        text = str(exc.value)
        if getattr(kerman, "PostgresStore", None) is not None and isinstance(store, kerman.PostgresStore):
            return  # a lease names no process; this bullet is about the memory and file stores
        assert text.startswith('session "held" is locked by a session log still open in this process')
        assert "log.close()" in text and "with store.open(id) as log:" in text and "gc.collect()" in text
    finally:
        log.close()
    store.open("held").close()  # released by close


def test_a_session_held_by_another_process_is_not_blamed_on_this_one(running):
    store, writer = running
    with pytest.raises(SessionLockedError) as exc:
        store.open("live")
    assert str(exc.value) == 'session "live" is locked: another process or handle has it open'
    writer.close()


def test_cli_tail_follow_of_a_postgres_session():
    """`--follow` takes a DSN too (a PostgresStore follower); the writer is this process."""
    from conftest import fresh_schema_dsn

    dsn = fresh_schema_dsn()
    store = kerman.PostgresStore(dsn)
    log = store.create("pg-live")

    async def append(i: int) -> None:
        log.append("x/w", {"i": i})
        await log.flush()

    asyncio.run(append(0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "kerman", "log", "tail", dsn, "pg-live", "--follow", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline())["data"] == {"i": 0}
        asyncio.run(append(1))
        assert json.loads(proc.stdout.readline())["data"] == {"i": 1}
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=DEADLINE)
        assert (proc.returncode, out) == (0, ""), err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=DEADLINE)
        log.close()


def test_cli_follow_and_allow_damaged_do_not_combine(store_root, capsys):
    from kerman import cli

    FileStore(store_root, durability="none").create("x").close()
    assert cli.main(["log", "tail", str(store_root), "x", "--follow", "--allow-damaged"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("kerman: --follow and --allow-damaged cannot be combined")


# -- a followed session replaced (issue 12, item 14) -------------------------------------------


def _records(n: int, tag: str) -> list:
    # Every record the same length, so a follower reading on at its old offset in a replaced
    # file lands exactly on a record boundary (the worst case: it would verify).
    return [event_record(i, "x/e", {"tag": tag, "i": f"{i:04d}"}) for i in range(n)]


def _until_end_or_spliced(follower, old: int) -> list:
    """The follower's seqs until its tail ends, or until it shows a seq it never had."""

    async def run():
        seen = []
        async for event in follower.tail():
            seen.append((event.seq, event.data["tag"]))
            if event.seq >= old:
                break
        return seen

    return asyncio.run(asyncio.wait_for(run(), DEADLINE))


def test_a_follower_of_a_deleted_and_recreated_session_ends_without_splicing(store_root):
    store = FileStore(store_root, durability="none")
    write_raw_session(session_path(store_root, "s"), header_record("s", created_at=1_767_225_600_000), _records(10, "old"))
    follower = store.follow("s")
    try:
        header = follower.header
        store.delete("s")
        write_raw_session(session_path(store_root, "s"), header_record("s", created_at=1_767_225_699_999), _records(15, "new"))
        assert _until_end_or_spliced(follower, 10) == [(i, "old") for i in range(10)]
        assert follower.closed and follower.header == header
    finally:
        follower.close()


@pytest.mark.parametrize("header", ["new-header", "same-header"])
def test_a_follower_of_a_session_rewritten_in_place_ends_without_splicing(store_root, header):
    """The same file (same inode) overwritten with another session (`cp new s.jsonl` does
    this): the follower must notice from the bytes it has shown, not just the file's identity."""
    store = FileStore(store_root, durability="none")
    path = session_path(store_root, "s")
    write_raw_session(path, header_record("s", created_at=1_767_225_600_000), _records(10, "old"))
    follower = store.follow("s")
    try:
        inode = path.stat().st_ino
        created = 1_767_225_699_999 if header == "new-header" else 1_767_225_600_000
        replacement = store_root / "replacement"
        data = write_raw_session(replacement, header_record("s", created_at=created), _records(15, "neW"))
        with open(path, "r+b") as f:  # in place: no truncation, one write
            f.write(data)
        assert path.stat().st_ino == inode
        assert _until_end_or_spliced(follower, 10) == [(i, "old") for i in range(10)]
        assert follower.closed
    finally:
        follower.close()
