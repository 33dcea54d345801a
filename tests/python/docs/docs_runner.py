"""Runs Python blocks extracted from the docs, for ``test_docs.py``: one subprocess per chain.

``python docs_runner.py BLOCKS.json RESULT.json``. ``BLOCKS.json`` is a list of
``{"path", "line", "code"}`` (``line``: the line of the opening fence). The blocks run in
order in one namespace (``__name__ == "__main__"``), as in the asyncio REPL
(``python -m asyncio``): a block with top-level ``await`` runs on one event loop kept for the
whole chain; any other block runs as a plain script would. Each block's output is captured on
its own: stdout and stderr interleaved as a terminal shows them (``outputs``), and stderr alone
(``errors``: a warning on the ``kerman`` logger, say). ``RESULT.json`` gets ``{"outputs",
"errors", "failed": index or null, "error": traceback}``; the exit status is 1 when a block
raised. Tracebacks name the Markdown file and line.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import inspect
import io
import json
import linecache
import sys
import traceback
from typing import Any, Dict, List, Optional


class _Tee(io.StringIO):
    """stderr during a block: written to the block's output as well as kept apart."""

    def __init__(self, output: io.StringIO) -> None:
        super().__init__()
        self.output = output

    def write(self, text: str) -> int:
        self.output.write(text)
        return super().write(text)


def compile_block(path: str, line: int, code: str) -> Any:
    """The block as a code object whose line numbers are those of the Markdown file."""
    padded = "\n" * line + code
    # Tracebacks show the block's lines (linecache is what traceback reads them from).
    linecache.cache[path] = (len(padded), None, padded.splitlines(keepends=True), path)
    return compile(padded, path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)


def main(blocks_path: str, result_path: str) -> int:
    with open(blocks_path, encoding="utf-8") as f:
        blocks: List[Dict[str, Any]] = json.load(f)
    namespace: Dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
    outputs: List[str] = []
    errors: List[str] = []
    failed: Optional[int] = None
    error = ""
    loop: Optional[asyncio.AbstractEventLoop] = None
    try:
        for index, block in enumerate(blocks):
            out = io.StringIO()
            err = _Tee(out)
            try:
                code = compile_block(block["path"], block["line"], block["code"])
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    if code.co_flags & inspect.CO_COROUTINE:
                        if loop is None:
                            loop = asyncio.new_event_loop()
                        loop.run_until_complete(eval(code, namespace))
                    else:
                        exec(code, namespace)
            except BaseException:  # noqa: B036 - reported, whatever the block raised
                failed, error = index, traceback.format_exc()
                outputs.append(out.getvalue())
                errors.append(err.getvalue())
                break
            outputs.append(out.getvalue())
            errors.append(err.getvalue())
    finally:
        if loop is not None:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
    with open(result_path, "w", encoding="utf-8") as f:
        json.dump({"outputs": outputs, "errors": errors, "failed": failed, "error": error}, f)
    return 0 if failed is None else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
