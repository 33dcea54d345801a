"""The runnable material a newcomer meets first: ``examples/*.py``, ``kerman demo`` and the
README quickstart. Each runs in a real subprocess (as a user would run it) and its output and
session files are checked."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import List

import pytest

import kerman

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"
EXPECTED_EXAMPLES = {"minimal_agent.py", "guard_plugin.py", "context_plugin.py", "ui_consumer.py"}
SAFETY_NET = 100  # seconds: only so a hung subprocess fails the test instead of blocking it


def run(args: List[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, encoding="utf-8", check=False, timeout=SAFETY_NET, env=env)


def run_example(name: str, tmp_path: Path) -> str:
    done = run([sys.executable, str(EXAMPLES / name)], tmp_path)
    assert done.returncode == 0, f"{name} failed:\n{done.stdout}\n{done.stderr}"
    assert done.stderr == "", done.stderr
    assert list(tmp_path.iterdir()) == [], "examples must not leave files behind"
    return done.stdout


def example_files() -> List[str]:
    return sorted(p.name for p in EXAMPLES.glob("*.py"))


# -- examples ----------------------------------------------------------------------------------


def test_the_expected_examples_exist() -> None:
    assert EXPECTED_EXAMPLES <= set(example_files())


@pytest.mark.parametrize("name", example_files())
def test_every_example_runs_and_is_documented(name: str, tmp_path: Path) -> None:
    source = (EXAMPLES / name).read_text(encoding="utf-8")
    tree = ast.parse(source)
    docstring = ast.get_docstring(tree)
    assert docstring and f"python examples/{name}" in docstring, "a module docstring saying how to run it"
    assert 'if __name__ == "__main__":' in source
    assert not re.search(r"\b(requests|httpx|urllib|aiohttp|socket)\b", source), "examples need no network"
    assert run_example(name, tmp_path).strip()


def test_minimal_agent_calls_its_tool_and_answers_with_the_result(tmp_path: Path) -> None:
    lines = run_example("minimal_agent.py", tmp_path).splitlines()
    assert lines == [
        "user       What is 19 + 23?",
        "assistant  Let me add those.",
        'tool call  add {"a": 19, "b": 23}',
        "tool       42",
        "assistant  The sum is 42.",
        "turn 1 ended: completed",
    ]


def test_guard_plugin_blocks_destructive_prompts_and_lets_the_others_through(tmp_path: Path) -> None:
    lines = run_example("guard_plugin.py", tmp_path).splitlines()
    assert len(lines) == 4
    assert lines[0] == "turn 1  completed  the model saw 'List the files in the build folder'"
    assert lines[1].startswith("turn 2  blocked    recursive forced delete (rm -rf) needs a human")
    assert lines[2].startswith("turn 3  blocked    dropping a table or database needs a human")
    assert lines[3] == "turn 4  completed  the model saw 'Show the disk usage of the build folder'"
    assert not any("the model saw" in line and ("rm -rf" in line or "DROP" in line) for line in lines)


def test_context_plugin_folds_the_notes_into_one_message_of_its_own(tmp_path: Path) -> None:
    out = run_example("context_plugin.py", tmp_path)
    assert out.splitlines() == [
        "queued quietly: 2 notes, loop idle",
        "turn 1: 2 message(s) entered",
        "  [user] Review my changes",
        "  [context] Workspace changes since your last message:",
        "            - src/loop.py changed",
        "            - README.md changed",
        "turn 2: 1 message(s) entered",
        "  [user] Thanks, anything else?",
    ]


def test_ui_consumer_mirrors_the_queue_and_ends_when_the_log_closes(tmp_path: Path) -> None:
    lines = run_example("ui_consumer.py", tmp_path).splitlines()
    assert lines[-1] == "log closed: the UI stops"
    # Turns in order, each started before it ended.
    boundaries = [line for line in lines if line.startswith("turn ")]
    assert boundaries == [f"turn {n} {what}" for n in (1, 2, 3) for what in ("started", "ended completed")]
    # The steer was shown as steering while turn 1 ran, and entered turn 1 at its second step.
    turn1 = lines[lines.index("turn 1 started") : lines.index("turn 1 ended completed")]
    assert any("steering:'Keep the plan short'" in line for line in turn1)
    assert [line for line in turn1 if "reply" in line] == [
        "  reply  \"answer to 'Plan the release'\"",
        "  reply  \"answer to 'Keep the plan short'\"",
    ]
    # Every queue change was printed, and the queue ends empty.
    queues = [line for line in lines if line.startswith("  queue")]
    assert queues[0] == "  queue  [queued:'Plan the release']"
    assert queues[-1] == "  queue  []"
    assert len(queues) == 8


# -- kerman demo -------------------------------------------------------------------------------


def console_script() -> str:
    candidate = Path(sysconfig.get_path("scripts")) / "kerman"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("kerman")
    assert found, "the kerman console script is not installed"
    return found


KEY_MOMENTS = [
    "followup",
    "steer",
    "list_files",  # the tool call
    "tool/result",
    "inject",
    "rewrites",
    "[plugin:context]",  # the rewritten batch in the timeline
    "blocked: destructive command (rm -rf)",
    "cancel(keep_inbox=True)",
    "aborted (user)",
    "(interrupted)",  # the partial streamed reply
    "SIGKILL",
    "turn 6 interrupted",
    "requeue_claimed",
    "requeued",
    "Timeline",
    "Final inbox",
]


def check_demo_session(folder: Path, out: str) -> None:
    assert sorted(p.name for p in folder.iterdir()) == ["demo.jsonl"]
    for moment in KEY_MOMENTS:
        assert moment in out, f"the demo output does not mention {moment!r}"
    with kerman.FileStore(folder, durability="none").open("demo") as log:
        ends = [e.data["reason"] for e in log.events(types="turn/end")]
        kinds = [r["kind"] for r in ends]
        assert kinds == ["completed", "completed", "completed", "blocked", "aborted", "interrupted", "completed"]
        assert ends[4]["reason"] == {"kind": "user"}
        assert any(e.data.get("interrupted") for e in log.events(types="assistant/message"))
        results = list(log.events(types="tool/result"))
        assert len(results) == 1 and "error" not in results[0].data
        # The prompt claimed by the killed turn was requeued and then entered by the last turn.
        emailed = [e for e in log.events(types="user/message") if "email" in kerman.Message.from_dict(e.data).text]
        [crash_end] = [e for e in log.events(types="turn/end") if e.data["reason"]["kind"] == "interrupted"]
        assert len(emailed) == 1 and emailed[0].seq > crash_end.seq
        inbox = kerman.Inbox(log)
        assert [m.text for m in inbox.next_step] == ["CI: the release pipeline is green"]
        assert inbox.next_turn == ()
    final = out[out.index("Final inbox") :]
    assert "CI: the release pipeline is green" in final


@pytest.mark.parametrize("how", ["console-script", "python-m"])
def test_demo_runs_the_whole_showcase(how: str, tmp_path: Path) -> None:
    folder = tmp_path / "demo"
    command = [console_script()] if how == "console-script" else [sys.executable, "-m", "kerman"]
    done = run(command + ["demo", "--dir", str(folder)], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == ""
    assert done.stdout.startswith(f"Kerman demo in {folder}")
    check_demo_session(folder, done.stdout)
    assert len(done.stdout.splitlines()) <= 100, "the demo output should stay readable"


def test_demo_defaults_to_a_fresh_temporary_folder(tmp_path: Path) -> None:
    env = dict(os.environ, TMPDIR=str(tmp_path))
    done = run([sys.executable, "-m", "kerman", "demo"], tmp_path, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    [folder] = [p for p in tmp_path.iterdir() if p.name.startswith("kerman-demo-")]
    assert str(folder) in done.stdout.splitlines()[0]
    check_demo_session(folder, done.stdout)


def test_demo_refuses_a_folder_that_is_not_empty(tmp_path: Path) -> None:
    folder = tmp_path / "busy"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")
    done = run([sys.executable, "-m", "kerman", "demo", "--dir", str(folder)], tmp_path)
    assert done.returncode == 2
    assert "not empty" in done.stderr and done.stdout == ""
    assert sorted(p.name for p in folder.iterdir()) == ["keep.txt"]


# -- README ------------------------------------------------------------------------------------


def first_python_block(markdown: str) -> str:
    match = re.search(r"^```python\n(.*?)^```", markdown, re.S | re.M)
    assert match, "README.md has no ```python block"
    return match.group(1)


def test_readme_quickstart_runs(tmp_path: Path) -> None:
    code = first_python_block((ROOT / "README.md").read_text(encoding="utf-8"))
    script = tmp_path / "quickstart.py"
    script.write_text(code, encoding="utf-8")
    done = run([sys.executable, str(script)], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == ""
    assert done.stdout.strip()
