"""Where a compaction shows: its typed view, ``kerman log show``, the ledger, the notebook repr.
The UI streams' goldens are tests/python/ui/golden/compaction.*."""

from __future__ import annotations

import asyncio
import io
from contextlib import redirect_stdout

import kerman
from kerman import events
from kerman.cli import main as cli_main
from kerman.compaction import Compactor, SlidingWindow, Summarize
from kerman.models import ScriptedModel
from kerman.usage import ledger


def compacted_session(store: kerman.MemoryStore | kerman.FileStore) -> None:
    async def main() -> None:
        model = ScriptedModel(["a0", "a1", "a2"])
        with store.create("s") as log:
            loop = kerman.AgentLoop(model, log, compaction=Compactor(SlidingWindow()))
            for text in ["q0", "q1"]:
                loop.followup(text)
                await loop.when_idle()
            summarizer = ScriptedModel([kerman.ModelReply("q0 and q1 asked", usage={"input": 30, "output": 4})])
            await loop.compact(Summarize(summarizer, options={"model": "small-model"}, keep=1))
            assert "compacted: events" in loop._repr_html_() and "Compactor(SlidingWindow(keep=4)" in loop._repr_html_()
            loop.followup("q2")
            await loop.when_idle()
            await loop.aclose()

    asyncio.run(main())


def test_the_view_names_every_field() -> None:
    store = kerman.MemoryStore()
    compacted_session(store)
    with store.open("s") as log:
        [record] = list(log.events(types="context/compacted", view=True))
        assert isinstance(record, events.ContextCompacted) and events.TYPES["context/compacted"] is events.ContextCompacted
        assert (record.strategy, record.reason, record.model, record.pinned, record.turn) == ("summary", "manual", "small-model", [], None)
        assert record.usage is not None and (record.usage.input, record.usage.output) == (30, 4)
        assert [m.role for m in record.messages or []] == ["user"] and record.native is None
        # The ledger counts the summary request, by its model, after the two turns' requests.
        book = ledger(log)
        kinds = [(r.kind, r.model) for r in book.requests]
        assert kinds[2] == ("compaction", "small-model") and [k for k, _ in kinds].count("reply") == 3
        assert book.to_dict()["requests"][2]["kind"] == "compaction" and "kind" not in book.to_dict()["requests"][0]


def test_log_show_says_what_was_replaced(tmp_path) -> None:
    store = kerman.FileStore(tmp_path)
    compacted_session(store)
    out = io.StringIO()
    with redirect_stdout(out):
        cli_main(["log", "show", str(tmp_path), "s"])
    [line] = [line for line in out.getvalue().splitlines() if "context/compacted" in line]
    assert "summary (manual)" in line and "→ 1 message" in line and "q0 and q1 asked" in line and "by small-model" in line
