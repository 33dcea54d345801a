"""Hostile entries in a FileStore (issue 12, items 10 and 12): a FIFO, a link to a device, a
symlink to a file elsewhere, a dangling symlink, a directory, under a session's file name.

Every entry point that reads or writes a session file (`open`, `read`/`verify`, `follow`,
`delete`, `repair`, the CLI) must refuse what is not a regular file, naming the problem, never
block, never read without bound and never write through a link. Each attack runs in a child
process with a bounded timeout, because the failure being tested for is a hang.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kerman
from conftest import session_path

DEADLINE = 60  # seconds; only ever reached when something is broken

PROBE = textwrap.dedent(
    """
    import json, sys
    import kerman
    store = kerman.FileStore(sys.argv[1], durability="none")
    sid, op = sys.argv[2], sys.argv[3]
    try:
        if op == "open":
            with store.open(sid) as log:
                result = len(log)
        elif op == "verify":
            result = store.verify(sid)["events"]
        elif op == "follow":
            with store.follow(sid) as log:
                result = len(log)
        elif op == "delete":
            result = store.delete(sid)
        elif op == "repair":
            result = store.repair(sid)["events"]
        elif op == "exists":
            result = [store.exists(sid), sid in store.list()]
        print(json.dumps({"ok": result}))
    except kerman.KermanError as e:
        print(json.dumps({"error": type(e).__name__, "message": str(e)}))
    """
)

OPS = ["open", "verify", "follow", "delete", "repair"]


def probe(root: Path, sid: str, op: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(root), sid, op],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def make_fifo(path: Path, elsewhere: Path) -> str:
    os.mkfifo(path)
    return "a FIFO"


def make_device_link(path: Path, elsewhere: Path) -> str:
    path.symlink_to("/dev/zero")
    return "symbolic link"


def make_outside_link(path: Path, elsewhere: Path) -> str:
    path.symlink_to(elsewhere)
    return "symbolic link"


def make_dangling_link(path: Path, elsewhere: Path) -> str:
    path.symlink_to(elsewhere.parent / "missing.jsonl")
    return "symbolic link"


def make_directory(path: Path, elsewhere: Path) -> str:
    path.mkdir()
    return "a directory"


def make_device(path: Path, elsewhere: Path) -> str:
    try:
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero's numbers
    except PermissionError:
        pytest.skip("creating a device node needs privileges")
    return "a character device"


ATTACKS = {
    "fifo": make_fifo,
    "device-link": make_device_link,
    "outside-link": make_outside_link,
    "dangling-link": make_dangling_link,
    "directory": make_directory,
    "device": make_device,
}


@pytest.fixture
def victim(tmp_path):
    """A valid session file outside the store, which a link may point to."""
    outside = tmp_path / "outside"
    outside.mkdir()
    other = kerman.FileStore(outside, durability="none")
    with other.create("victim") as log:
        log.append("x/e", {"i": 0})
    path = session_path(outside, "victim")
    with open(path, "ab") as f:
        f.write(b"torn")  # a torn tail an open through a link would cut off
    return path


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_a_session_name_that_is_not_a_regular_file_is_refused(tmp_path, victim, attack, op):
    root = tmp_path / "store"
    root.mkdir()
    before = victim.read_bytes()
    kind = ATTACKS[attack](session_path(root, "s"), victim)
    answer = probe(root, "s", op)
    assert answer.get("error") == "LogError", answer
    assert "not a regular file" in answer["message"] and kind in answer["message"], answer
    assert str(session_path(root, "s")) in answer["message"], answer
    # Nothing was written through a link, and the entry itself is still there.
    assert victim.read_bytes() == before
    assert os.path.lexists(session_path(root, "s"))


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_exists_agrees_with_list_for_every_entry_kind(tmp_path, victim, attack):
    root = tmp_path / "store"
    root.mkdir()
    ATTACKS[attack](session_path(root, "s"), victim)
    assert probe(root, "s", "exists") == {"ok": [True, True]}
    assert probe(root, "absent", "exists") == {"ok": [False, False]}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_cli_refuses_without_blocking(tmp_path, victim, attack):
    root = tmp_path / "store"
    root.mkdir()
    kind = ATTACKS[attack](session_path(root, "s"), victim)
    for argv in (["verify", "s"], ["show", "s"], ["tail", "s"], ["inbox", "s"], ["list"]):
        done = subprocess.run(
            [sys.executable, "-m", "kerman", "log", argv[0], str(root), *argv[1:]],
            capture_output=True,
            text=True,
            timeout=DEADLINE,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        if argv[0] == "list":
            assert done.returncode == 0, done.stderr
            assert "(unreadable)" in done.stdout, done.stdout
        else:
            assert done.returncode == 1, (argv, done.stdout, done.stderr)
            assert "not a regular file" in done.stderr and kind in done.stderr, done.stderr


def test_store_directory_is_private_whatever_the_umask(tmp_path):
    script = textwrap.dedent(
        """
        import os, sys
        import kerman
        os.umask(0)
        kerman.FileStore(os.path.join(sys.argv[1], "a", "b"))
        """
    )
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True, timeout=DEADLINE)
    assert stat.S_IMODE((tmp_path / "a" / "b").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o700


def test_an_existing_store_directory_keeps_its_mode(tmp_path):
    root = tmp_path / "shared"
    root.mkdir()
    root.chmod(0o750)
    kerman.FileStore(root)
    assert stat.S_IMODE(root.stat().st_mode) == 0o750
