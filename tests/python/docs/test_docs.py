"""The docs must run: every ```python block in README.md and docs/*.md is executed as written,
or is a marked fragment that at least compiles. The conventions are in docs/testing.md
("Python blocks in the docs"):

* ``<!-- doctest: WORDS -->`` on the line right before a fence. Words: ``fragment`` (only
  compiled), ``continue`` (runs after the previous block of the same file, in its namespace),
  ``postgres`` (needs the PostgreSQL test server: runs with ``KERMAN_PG_DSN`` naming a fresh
  schema, skips without it unless ``KERMAN_PG_REQUIRED=1``). Anything else is refused.
* A ```text block that is the next fence after a python block, in the same section (prose may
  come between), is the output that block prints (stdout and stderr, interleaved as a terminal
  shows them), compared line by line with UUIDs replaced by ``<id>``. A block without one must
  write nothing to stderr.

Each chain runs in a fresh subprocess (``docs_runner.py``) in an empty temporary folder, so no
block can leave files in the repository.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pytest
from docs_runner import compile_block

from conftest import PG_DSN, fresh_schema_dsn

ROOT = Path(__file__).resolve().parents[3]
RUNNER = Path(__file__).resolve().parent / "docs_runner.py"
SAFETY_NET = 100  # seconds: only so a hung block fails its test instead of blocking the run
MARKER = re.compile(r"^\s*<!--\s*doctest:(.*?)-->\s*$")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")
WORDS = {"fragment", "continue", "postgres"}
UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")


@dataclass
class Block:
    path: str  # relative to the repository root
    line: int  # the line of the opening fence (1-based)
    code: str
    words: frozenset = frozenset()
    output: Optional[str] = None  # the ```text block that follows, if any

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass
class Chain:
    blocks: List[Block] = field(default_factory=list)

    @property
    def where(self) -> str:
        return self.blocks[0].where

    @property
    def postgres(self) -> bool:
        return any("postgres" in b.words for b in self.blocks)


def extract(text: str, path: str) -> List[Block]:
    """Every ```python block of a Markdown text, with its marker words and expected output.
    Raises ``ValueError`` naming the file and line of anything the conventions do not allow."""
    lines = text.splitlines()
    blocks: List[Block] = []
    pending_words: Optional[frozenset] = None
    pending_line = 0
    last_python: Optional[Block] = None  # the python block a following ```text block belongs to
    i = 0
    while i < len(lines):
        raw = lines[i]
        marker = MARKER.match(raw)
        if marker:
            words = frozenset(marker.group(1).split())
            unknown = sorted(words - WORDS)
            if unknown or not words:
                raise ValueError(f"{path}:{i + 1}: unknown doctest marker {sorted(words) or '(empty)'}; known: {sorted(WORDS)}")
            if "fragment" in words and len(words) > 1:
                raise ValueError(f"{path}:{i + 1}: a fragment is only compiled; it cannot also be {sorted(words - {'fragment'})}")
            pending_words, pending_line = words, i + 1
            i += 1
            continue
        if raw.lstrip().startswith("<!--") and "doctest" in raw:
            raise ValueError(f"{path}:{i + 1}: malformed doctest marker (write <!-- doctest: WORDS --> on a line of its own)")
        fence = FENCE.match(raw)
        if not fence:
            if raw.lstrip().startswith("#"):
                last_python = None  # a heading: what follows belongs to another section
            if raw.strip():
                if pending_words is not None:
                    raise ValueError(f"{path}:{pending_line}: a doctest marker must be right before a ```python fence")
            i += 1
            continue
        indent, ticks, info = fence.groups()
        info_words = info.split()
        lang = info_words[0] if info_words else ""
        body: List[str] = []
        j = i + 1
        while j < len(lines) and not re.match(rf"^\s*{re.escape(ticks[0])}{{{len(ticks)},}}\s*$", lines[j]):
            line = lines[j]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            j += 1
        if j == len(lines):
            raise ValueError(f"{path}:{i + 1}: unclosed code fence")
        code = "\n".join(body) + "\n"
        if lang == "python":
            if len(info_words) > 1:
                raise ValueError(
                    f"{path}:{i + 1}: write markers as <!-- doctest: ... --> before the fence, not in the info string ({info!r})"
                )
            block = Block(path, i + 1, code, pending_words or frozenset())
            blocks.append(block)
            last_python = block
        else:
            if lang.lower() in {"py", "python3", "pycon", "py3"}:
                raise ValueError(f"{path}:{i + 1}: use ```python for Python blocks (found ```{lang})")
            if pending_words is not None:
                raise ValueError(f"{path}:{pending_line}: a doctest marker must be right before a ```python fence")
            if lang == "text" and last_python is not None:
                if "fragment" in last_python.words:
                    raise ValueError(f"{path}:{i + 1}: output shown for a fragment, which never runs")
                last_python.output = code
            last_python = None
        pending_words = None
        i = j + 1
    if pending_words is not None:
        raise ValueError(f"{path}:{pending_line}: a doctest marker must be right before a ```python fence")
    return blocks


def chains(blocks: Sequence[Block]) -> List[Chain]:
    """Runnable blocks grouped into chains: a ``continue`` block joins the chain of the block
    right before it, which must be runnable. Fragments belong to no chain."""
    out: List[Chain] = []
    previous: Optional[Block] = None
    for block in blocks:
        if "continue" in block.words:
            if previous is None or previous.path != block.path or "fragment" in previous.words:
                raise ValueError(f"{block.where}: 'continue' needs a runnable block right before it in the same file")
            out[-1].blocks.append(block)
        elif "fragment" not in block.words:
            out.append(Chain([block]))
        previous = block
    return out


def doc_files() -> List[Path]:
    return [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


def all_blocks() -> List[Block]:
    blocks: List[Block] = []
    for path in doc_files():
        blocks += extract(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    return blocks


def normalise(text: str) -> List[str]:
    lines = [UUID.sub("<id>", line).rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def run_chain(chain: Chain, cwd: Path, env: Optional[Dict[str, str]] = None) -> None:
    """Runs the chain in a subprocess; fails naming the file and line of the block that raised,
    wrote to stderr without showing it, or printed something other than its shown output."""
    spec = cwd.parent / f"{cwd.name}-blocks.json"
    result_path = cwd.parent / f"{cwd.name}-result.json"
    spec.write_text(json.dumps([{"path": b.path, "line": b.line, "code": b.code} for b in chain.blocks]), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-W", "error", str(RUNNER), str(spec), str(result_path)],
        cwd=cwd,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=SAFETY_NET,
        env=env,
        check=False,
    )
    assert result_path.exists(), f"{chain.where}: the runner died:\n{done.stdout}\n{done.stderr}"
    result = json.loads(result_path.read_text(encoding="utf-8"))
    if result["failed"] is not None:
        block = chain.blocks[result["failed"]]
        pytest.fail(f"{block.where}: the block raised\n{result['error']}{done.stderr}", pytrace=False)
    assert done.returncode == 0, f"{chain.where}: exit status {done.returncode}\n{done.stderr}"
    assert done.stderr == "", f"{chain.where}: the blocks wrote to stderr:\n{done.stderr}"
    for block, printed, warned in zip(chain.blocks, result["outputs"], result["errors"], strict=True):
        if block.output is None:
            assert warned == "", f"{block.where}: the block wrote to stderr and shows no output:\n{warned}"
        elif normalise(printed) != normalise(block.output):
            pytest.fail(
                f"{block.where}: printed output differs from the ```text block after it\n--- shown\n{block.output}--- printed\n{printed}",
                pytrace=False,
            )


BLOCKS = all_blocks()
CHAINS = chains(BLOCKS)


# -- the docs ----------------------------------------------------------------------------------


def test_the_docs_have_python_blocks_and_most_of_them_run() -> None:
    assert len(BLOCKS) >= 15
    runnable = [b for b in BLOCKS if "fragment" not in b.words]
    assert len(runnable) >= len(BLOCKS) - 3, [b.where for b in BLOCKS if "fragment" in b.words]
    assert BLOCKS[0].path == "README.md" and not BLOCKS[0].words and BLOCKS[0].output, (
        "the README quickstart runs on its own and shows what it prints"
    )


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.where)
def test_a_block_compiles(block: Block) -> None:
    # Fragments never run, so this is all that is checked of them.
    try:
        compile_block(block.path, block.line, block.code)
    except SyntaxError as e:
        pytest.fail(f"{block.where}: not valid Python: {e}", pytrace=False)


@pytest.mark.parametrize("chain", CHAINS, ids=lambda c: c.where + (f"+{len(c.blocks) - 1}" if len(c.blocks) > 1 else ""))
def test_a_block_runs_as_written(chain: Chain, tmp_path: Path) -> None:
    env = dict(os.environ)
    if chain.postgres:
        if not PG_DSN and os.environ.get("KERMAN_PG_REQUIRED") != "1":
            pytest.skip("KERMAN_PG_DSN is unset (run scripts/pg-test-server.sh)")
        env["KERMAN_PG_DSN"] = fresh_schema_dsn()
    work = tmp_path / "cwd"
    work.mkdir()
    run_chain(chain, work, env)


def test_the_quickstart_answers_with_the_tools_result() -> None:
    # The Quickstart's loop-level block (after the run() one), the one with the clock tool.
    quickstart = next(b for b in BLOCKS if b.path == "README.md" and "async def clock" in b.code)
    output = quickstart.output or ""
    assert "12:00" in output.splitlines()[-1], "the answer quotes what the clock tool returned"


# -- the extractor itself ------------------------------------------------------------------------


def test_unknown_or_misplaced_markers_are_refused() -> None:
    with pytest.raises(ValueError, match=r"x\.md:2: unknown doctest marker \['fragmnet'\]"):
        extract("text\n<!-- doctest: fragmnet -->\n```python\npass\n```\n", "x.md")
    with pytest.raises(ValueError, match=r"x\.md:1: a doctest marker must be right before"):
        extract("<!-- doctest: fragment -->\nprose\n```python\npass\n```\n", "x.md")
    with pytest.raises(ValueError, match=r"x\.md:1: a doctest marker must be right before"):
        extract("<!-- doctest: fragment -->\n```sh\nls\n```\n", "x.md")
    with pytest.raises(ValueError, match=r"x\.md:1: malformed doctest marker"):
        extract("<!-- doctest fragment -->\n```python\npass\n```\n", "x.md")
    with pytest.raises(ValueError, match=r"x\.md:1: use ```python"):
        extract("```py\npass\n```\n", "x.md")
    with pytest.raises(ValueError, match=r"x\.md:1: write markers as"):
        extract("```python fragment\npass\n```\n", "x.md")
    with pytest.raises(ValueError, match=r"x\.md:5: output shown for a fragment"):
        extract("<!-- doctest: fragment -->\n```python\npass\n```\n```text\nx\n```\n", "x.md")


def test_continue_needs_a_runnable_block_before_it() -> None:
    with pytest.raises(ValueError, match=r"x\.md:2: 'continue' needs a runnable block"):
        chains(extract("<!-- doctest: continue -->\n```python\npass\n```\n", "x.md"))
    with pytest.raises(ValueError, match=r"x\.md:7: 'continue' needs a runnable block"):
        chains(extract("<!-- doctest: fragment -->\n```python\npass\n```\n\n<!-- doctest: continue -->\n```python\npass\n```\n", "x.md"))
    text = "```python\na = 1\n```\n\n<!-- doctest: continue -->\n```python\nprint(a)\n```\n\n```text\n1\n```\n"
    [chain] = chains(extract(text, "x.md"))
    assert [b.line for b in chain.blocks] == [1, 6] and chain.blocks[1].output == "1\n"


def test_a_block_that_raises_fails_naming_its_file_and_line(tmp_path: Path) -> None:
    [chain] = chains(extract("# T\n\n```python\nx = 1\nraise RuntimeError('boom')\n```\n", "x.md"))
    (tmp_path / "cwd").mkdir()
    with pytest.raises(pytest.fail.Exception) as failed:
        run_chain(chain, tmp_path / "cwd")
    assert "x.md:3: the block raised" in str(failed.value)
    assert 'File "x.md", line 5' in str(failed.value) and "RuntimeError: boom" in str(failed.value)


def test_printed_output_is_checked_with_ids_normalised(tmp_path: Path) -> None:
    text = "```python\nimport kerman\nprint(kerman.UserMessage('hi').id, 2)\n```\n\n```text\n<id> 2\n```\n"
    [chain] = chains(extract(text, "x.md"))
    (tmp_path / "a").mkdir()
    run_chain(chain, tmp_path / "a")
    wrong = Chain([Block("x.md", 1, chain.blocks[0].code, output="<id> 3\n")])
    (tmp_path / "b").mkdir()
    with pytest.raises(pytest.fail.Exception, match=r"x\.md:1: printed output differs"):
        run_chain(wrong, tmp_path / "b")


def test_top_level_await_runs_on_one_event_loop_across_a_chain(tmp_path: Path) -> None:
    text = (
        "```python\nimport asyncio\nfirst = asyncio.get_running_loop()\nawait asyncio.sleep(0)\n```\n"
        "<!-- doctest: continue -->\n```python\nawait asyncio.sleep(0)\nprint(asyncio.get_running_loop() is first)\n```\n"
        "```text\nTrue\n```\n"
    )
    [chain] = chains(extract(text, "x.md"))
    (tmp_path / "cwd").mkdir()
    run_chain(chain, tmp_path / "cwd")


def test_invalid_python_in_a_fragment_is_caught() -> None:
    [block] = extract("<!-- doctest: fragment -->\n```python\nloop.cancel(cause='user', *, keep_inbox=False)\n```\n", "x.md")
    with pytest.raises(SyntaxError):
        compile_block(block.path, block.line, block.code)
