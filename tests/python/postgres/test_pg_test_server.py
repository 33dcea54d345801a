"""scripts/pg-test-server.sh and the Makefile: `make test` stops the test PostgreSQL server it
started itself (never one that was already running, nor one KERMAN_PG_DSN names), and
`make pg-stop` stops the server the script started, by its data folder and pid.

Each test runs the script on a private port and folder (a second throwaway cluster), never on
the shared test server.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Dict, Iterator

import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "pg-test-server.sh"
TIMEOUT = 120  # seconds for one script run (a cold start makes the cluster and its certificates)


def _bin() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not found:
        pytest.skip("PostgreSQL's server binaries are not installed (scripts/pg-test-server.sh installs them)")
    return found[-1].parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def private() -> Iterator[Dict[str, str]]:
    """The environment that points the script at a cluster of this test's own."""
    bin_dir = _bin()
    root = Path(tempfile.mkdtemp(prefix="kerman-pg-test-", dir="/tmp"))
    root.chmod(0o755)  # the server runs as the postgres user when we are root
    env = {**os.environ, "KERMAN_PG_PORT": str(_free_port()), "KERMAN_PG_ROOT": str(root / "pg")}
    env.pop("KERMAN_PG_DSN", None)
    try:
        yield env
    finally:
        data = root / "pg" / "data"
        if (data / "postmaster.pid").exists():  # this test's cluster only, by its folder
            as_pg = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []
            subprocess.run(
                [*as_pg, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"], capture_output=True, timeout=TIMEOUT
            )
        shutil.rmtree(root, ignore_errors=True)


def script(env: Dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=TIMEOUT)


def up(env: Dict[str, str]) -> bool:
    return (
        subprocess.run([str(_bin() / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", env["KERMAN_PG_PORT"]], timeout=TIMEOUT).returncode == 0
    )


def test_scoped_stops_the_server_it_started(private: Dict[str, str]) -> None:
    # What `make test` does: the command starts the server (as the test targets do) ...
    done = script(private, "scoped", "bash", str(SCRIPT))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"postgresql://postgres@127.0.0.1:{private['KERMAN_PG_PORT']}/postgres"
    # ... and it is stopped afterwards, since it was not running before.
    assert not up(private)
    assert "stopping the test PostgreSQL server" in done.stderr


def test_scoped_keeps_a_server_that_was_running_and_pg_stop_stops_it(private: Dict[str, str]) -> None:
    assert script(private, "start").returncode == 0
    assert up(private)
    done = script(private, "scoped", "true")
    assert done.returncode == 0, done.stderr
    assert up(private)
    # A DSN of the user's own: nothing of ours to stop.
    done = script({**private, "KERMAN_PG_DSN": "postgresql://somewhere/else"}, "scoped", "bash", str(SCRIPT))
    assert done.returncode == 0, done.stderr
    assert up(private)
    done = script(private, "stop")
    assert done.returncode == 0, done.stderr
    assert not up(private)
    assert script(private, "stop").returncode == 0  # stopping twice is fine


def test_scoped_keeps_the_command_s_exit_status(private: Dict[str, str]) -> None:
    done = script(private, "scoped", "bash", "-c", f"bash {SCRIPT} >/dev/null && exit 3")
    assert done.returncode == 3
    assert not up(private)


def test_stop_leaves_a_server_the_script_did_not_start(private: Dict[str, str]) -> None:
    assert script(private, "start").returncode == 0
    # The server in the folder now has another pid than the one the script recorded (someone
    # else restarted it): it is not ours to stop.
    marker = Path(private["KERMAN_PG_ROOT"]) / "started-by-script.pid"
    assert marker.read_text().strip()
    marker.write_text("1\n")
    done = script(private, "stop")
    assert done.returncode == 0
    assert up(private)
    assert "not started by this script" in done.stderr


def test_make_has_pg_stop_and_test_stops_what_it_started() -> None:
    makefile = (REPO / "Makefile").read_text()
    dry = subprocess.run(["make", "-n", "-C", str(REPO), "pg-stop"], capture_output=True, text=True, timeout=TIMEOUT)
    assert dry.returncode == 0 and "pg-test-server.sh stop" in dry.stdout, dry.stderr
    test_rule = makefile.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert "pg-test-server.sh scoped" in test_rule, test_rule
