"""``examples/notebook.ipynb`` on a real IPython kernel, driven by ``nbclient`` (issue 15 part 2):
Run All twice on one kernel gives rich reprs and no error or warning, the second run goes on with
the session the first left open; interrupting a cell that awaits the loop leaves the turn running
with a warning, ``loop.cancel()`` stops it, and the notebook's cells run again afterwards.

The kernel is this interpreter (a kernel spec written into a temporary ``JUPYTER_PATH``), so a
fresh CI venv needs nothing installed beyond the test extra. No network: the model is scripted."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List

import nbformat
import pytest
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell

NOTEBOOK = Path(__file__).resolve().parents[3] / "examples" / "notebook.ipynb"
KERNEL = "kerman-test"
SAFETY_NET = 60  # seconds per cell: only so a hung kernel fails the test instead of blocking it

# What each displaying cell of the example shows, by a line of its source.
SHOWS = {
    "log = store.open(": ("SessionLog", "notebook-demo", "FileStore"),
    "loop = kerman.AgentLoop(model, log=log)": ("AgentLoop", "add", "agent/status ×1"),
    "loop.followup(": ("Transcript", "What is 19 + 23?", "Let me add those.", "The sum is 42."),
    "loop.transcript()[-1]": ("assistant", "The sum is 42."),
    "log[-1]": ("Event", "turn/end"),
    'turns = log.events(types="turn/*")': ("EventIterator", "turn/start", "turn/end"),
    "loop.inbox": ("Inbox", "next step (steering, context) (1)", "Context: answer in one sentence."),
    "kerman.InboxProjection.fold": ("InboxProjection", "Context: answer in one sentence."),
}


@pytest.fixture
def kernel_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A kernel spec for this interpreter, and private IPython and Jupyter folders."""
    spec = tmp_path / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "Kerman tests", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    work = tmp_path / "work"
    work.mkdir()
    return work


def client_for(nb: Any, work: Path) -> NotebookClient:
    # allow_errors: an error stays an output of its cell, which the tests check (check_outputs).
    return NotebookClient(nb, kernel_name=KERNEL, timeout=SAFETY_NET, allow_errors=True, resources={"metadata": {"path": str(work)}})


async def run_cell(client: NotebookClient, source: str) -> List[Dict[str, Any]]:
    """Runs one more cell on the client's kernel; its outputs (errors stay outputs)."""
    cell = new_code_cell(source)
    client.nb.cells.append(cell)
    await client.async_execute_cell(cell, len(client.nb.cells) - 1, execution_count=None)
    client.nb.cells.pop()
    return list(cell.outputs)


async def run_all(client: NotebookClient, nb: Any) -> None:
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            cell.outputs = []
            await client.async_execute_cell(cell, index)


def printed(outputs: List[Dict[str, Any]], name: str = "stdout") -> str:
    return "".join(o["text"] for o in outputs if o["output_type"] == "stream" and o["name"] == name)


def code_cells(nb: Any) -> Iterator[Any]:
    return (cell for cell in nb.cells if cell.cell_type == "code")


def check_outputs(nb: Any) -> None:
    """No error, nothing on stderr (a warning would be there), and every displaying cell shows
    its object as HTML and as a readable plain repr."""
    for cell in code_cells(nb):
        for out in cell.outputs:
            assert out["output_type"] != "error", f"{cell.source!r} raised {out.get('ename')}: {out.get('evalue')}"
            assert not (out["output_type"] == "stream" and out["name"] == "stderr"), f"{cell.source!r}: {out['text']}"
        shown = [o for o in cell.outputs if o["output_type"] == "execute_result"]
        marks = [marks for line, marks in SHOWS.items() if line in cell.source]
        if not marks:
            continue
        assert len(shown) == 1, cell.source
        html, plain = shown[0]["data"]["text/html"], shown[0]["data"]["text/plain"]
        assert html.startswith('<div class="kerman">') and "<script" not in html
        assert "object at 0x" not in plain
        for mark in marks[0]:
            assert mark in html, (mark, cell.source)


def test_run_all_twice_on_one_kernel(kernel_env: Path) -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert [line for line in SHOWS if not any(line in c.source for c in code_cells(nb))] == []
    client = client_for(nb, kernel_env)

    async def main() -> None:
        async with client.async_setup_kernel():
            await run_all(client, nb)
            check_outputs(nb)
            assert printed(await run_cell(client, "first = (log, loop)\nprint(loop.turn, len(log.transcript()))")) == "1 4\n"
            await run_all(client, nb)  # Run All again, same kernel
            check_outputs(nb)
            probe = "print(log is first[0], first[1].closed, loop.closed, loop.turn, [m.text for m in log.transcript()][4:6])"
            # The same log, the first loop gave way, and turn 2 entered the context left queued.
            assert printed(await run_cell(client, probe)) == "True True False 2 ['Context: answer in one sentence.', 'What is 19 + 23?']\n"

    asyncio.run(main())
    assert (kernel_env / "sessions" / "notebook-demo.jsonl").exists()


INTERRUPTED = """
import asyncio

async def slow_model(request):
    # streams until cancelled, as a long answer from a real model would; it runs only once the
    # cell below is suspended in its await, so "waiting" means the interrupt lands there
    # (printed before the await, it could land while the kernel itself was busy, and be lost)
    print("waiting", flush=True)
    for _ in range(1_000_000):
        await asyncio.sleep(0.01)
        yield {"type": "text-delta", "text": "."}

slow = kerman.AgentLoop(slow_model, log=log)
slow.followup("write a long essay")
await slow.when_idle()
"""


def test_interrupting_a_cell_that_awaits_the_loop(kernel_env: Path) -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = client_for(nb, kernel_env)

    async def main() -> None:
        async with client.async_setup_kernel():
            await run_all(client, nb)
            kc = client.kc
            assert kc is not None and client.km is not None
            msg_id = kc.execute(INTERRUPTED)
            outputs: List[Dict[str, Any]] = []
            interrupted = False
            while True:
                msg = await kc.get_iopub_msg(timeout=SAFETY_NET)
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                kind, content = msg["msg_type"], msg["content"]
                # Once, on the model's own line: the warning the interrupt causes also says
                # "waiting" (on stderr), and a second SIGINT landing after the cell has ended
                # would abort the kernel's handler before its reply.
                if kind == "stream" and content["name"] == "stdout" and "waiting" in content["text"] and not interrupted:
                    interrupted = True
                    await client.km.interrupt_kernel()
                if kind in ("stream", "error"):
                    outputs.append({"output_type": kind, **content})
                if kind == "status" and content["execution_state"] == "idle":
                    break
            assert interrupted, "the cell never said it was waiting"
            reply = await kc.get_shell_msg(timeout=SAFETY_NET)
            assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "CancelledError"
            warning = printed(outputs, "stderr")
            assert "TurnStillRunningWarning" in warning and "its turn 2 is still running in the background" in warning
            assert "loop.cancel() stops it" in warning
            # The turn goes on in the background, and re-creating a loop over the log says why it cannot.
            assert printed(await run_cell(client, "print(slow.status, slow.turn)")) == "running 2\n"
            refused = await run_cell(client, "kerman.AgentLoop(model, log=log)")
            errors = [o for o in refused if o["output_type"] == "error"]
            assert [e["ename"] for e in errors] == ["LoopError"]
            assert "already has an AgentLoop running turn 2" in errors[0]["evalue"] and "cancel()" in errors[0]["evalue"]
            stopped = await run_cell(
                client, "slow.cancel()\nawait slow.when_idle()\nprint(slow.status, list(log.events(types='turn/end'))[-1].data['reason'])"
            )
            assert printed(stopped) == "idle {'kind': 'aborted', 'reason': {'kind': 'user'}}\n"
            # The notebook runs again from the top on the same kernel.
            await run_all(client, nb)
            check_outputs(nb)
            assert printed(await run_cell(client, "print(slow.closed, loop.turn)")) == "True 3\n"

    asyncio.run(main())
