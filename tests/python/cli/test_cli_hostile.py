"""The CLI against hostile input (issue 12, item 13): a DSN in every form never has its password
echoed, and session ids carrying terminal escape sequences never reach the terminal raw, in
any command's output (text or JSON, stdout or stderr)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import kerman
from kerman import cli
from kerman.cli._common import _shown

PASSWORD = "s3cret-pw"

# Every DSN form libpq and tokio-postgres accept, each pointing at a port nothing listens on.
DSNS = [
    f"postgresql://u:{PASSWORD}@127.0.0.1:1/db",
    f"postgres://u:{PASSWORD}@127.0.0.1:1/db",
    f"postgresql://u:{PASSWORD}@127.0.0.1:1",
    f"postgresql://u:{PASSWORD}@127.0.0.1:1/db?sslmode=disable",
    f"postgresql://u@127.0.0.1:1/db?password={PASSWORD}",
    f"postgresql://u@127.0.0.1:1/db?sslmode=disable&password={PASSWORD}&connect_timeout=1",
    f"postgresql://u:{PASSWORD}@127.0.0.1:1,127.0.0.1:2/db",
    f"host=127.0.0.1 port=1 user=u password={PASSWORD} dbname=db",
    f"password={PASSWORD} host=127.0.0.1 port=1",
    f"host=127.0.0.1 port=1 password = {PASSWORD}",
    f"host=127.0.0.1 port=1 password='{PASSWORD} with space'",
    f"host=127.0.0.1 port=1 password='it\\'s-{PASSWORD}'",
    f"dbname=db password={PASSWORD}",
]

COMMANDS = [
    ["list"],
    ["list", "--json"],
    ["show", "s"],
    ["tail", "s"],
    ["tail", "s", "--follow"],
    ["inbox", "s"],
    ["verify", "s"],
    ["repair", "s", "--yes"],
]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: "-".join(c))
@pytest.mark.parametrize("dsn", DSNS)
def test_no_command_echoes_a_password(capsys, dsn, command):
    code, out, err = run(capsys, "log", command[0], dsn, *command[1:])
    assert code in (1, 2), (out, err)
    assert PASSWORD not in out + err
    assert "with space" not in out + err
    assert "Traceback" not in err
    assert err.strip(), "a failure says why"


@pytest.mark.parametrize("dsn", DSNS)
def test_a_key_value_dsn_is_a_postgresql_store_not_a_folder(capsys, dsn):
    _, _, err = run(capsys, "log", "list", dsn)
    assert "no session store at" not in err, err


def test_an_existing_folder_is_a_folder_even_if_it_looks_like_a_dsn(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("host=x").mkdir()
    with kerman.FileStore("host=x", durability="none").create("s"):
        pass
    code, out, _ = run(capsys, "log", "list", "host=x")
    assert code == 0 and out.startswith("s ")


# -- escape-laden session ids -------------------------------------------------------------------

HOSTILE_IDS = [
    "a\x1b[2J\x1b[31mred",  # ESC sequences: clear screen, colour
    "b\x9b31mcsi",  # the 8-bit CSI (C1)
    "c\rover",  # carriage return: overwrites the line
    "d\x07bell\x08back",  # BEL, backspace
    "e\x1b]0;title\x07",  # OSC: sets the window title
    "f\nnewline",
    "g\x7fdel",
]

RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def assert_terminal_safe(text: str) -> None:
    """Only printable characters, newlines (between lines) and tabs reach the terminal."""
    bad = RAW.findall(text)
    assert not bad, (bad, text)


@pytest.fixture
def hostile_store(tmp_path):
    store = kerman.FileStore(tmp_path, durability="none")
    for sid in HOSTILE_IDS:
        with store.create(sid) as log:
            log.append("x/e", {"i": 1})
            inbox = kerman.Inbox(log)
            inbox.append("next-turn", kerman.UserMessage("hi", id=sid))
    return tmp_path


@pytest.mark.parametrize("sid", HOSTILE_IDS)
@pytest.mark.parametrize(
    "command",
    [
        ["show"],
        ["show", "--json"],
        ["tail"],
        ["tail", "--json"],
        ["inbox"],
        ["inbox", "--json"],
        ["verify"],
        ["verify", "--json"],
        ["repair", "--yes"],
    ],
    ids=lambda c: "-".join(c),
)
def test_every_command_escapes_ids(capsys, hostile_store, sid, command):
    code, out, err = run(capsys, "log", command[0], str(hostile_store), sid, *command[1:])
    assert code == 0, err
    assert_terminal_safe(out.replace("\n", "") if "--json" in command else out)
    assert_terminal_safe(err)
    if "--json" in command and command[0] != "verify":
        for line in out.splitlines():
            json.loads(line)  # still JSON, with the same values


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_list_escapes_ids(capsys, hostile_store, json_flag):
    code, out, err = run(capsys, "log", "list", str(hostile_store), *json_flag)
    assert code == 0, err
    assert_terminal_safe(out.replace("\n", "") if json_flag else out)
    if json_flag:
        assert sorted(r["id"] for r in json.loads(out)) == sorted(HOSTILE_IDS)
    else:
        assert len(out.splitlines()) == len(HOSTILE_IDS)


@pytest.mark.parametrize("sid", HOSTILE_IDS)
@pytest.mark.parametrize("command", ["show", "tail", "inbox", "verify", "repair"])
def test_errors_escape_ids(capsys, tmp_path, sid, command):
    kerman.FileStore(tmp_path, durability="none")
    code, out, err = run(capsys, "log", command, str(tmp_path), sid)
    assert code == 1 and "not found" in err
    assert_terminal_safe(out)
    assert_terminal_safe(err)


@pytest.mark.parametrize("sid", HOSTILE_IDS)
def test_locked_and_invalid_errors_escape_ids(capsys, tmp_path, sid):
    store = kerman.FileStore(tmp_path, durability="none")
    with store.create(sid):
        code, out, err = run(capsys, "log", "repair", str(tmp_path), sid, "--yes")
    assert code == 1 and "locked" in err
    assert_terminal_safe(err)
    code, out, err = run(capsys, "log", "show", str(tmp_path), sid + "\x00")
    assert code == 2
    assert_terminal_safe(err)


@pytest.mark.parametrize("dsn", DSNS)
def test_shown_dsn_keeps_the_host_and_drops_the_password(dsn):
    shown = _shown(dsn)
    assert PASSWORD not in shown and "with space" not in shown
    assert ("127.0.0.1" in shown or "127.0.0.1" not in dsn) and "***" in shown
