"""The default pricer checked against genai-prices called directly, and `kerman log usage`."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal
from typing import Any

import pytest

import kerman
from kerman import cli
from kerman.usage import genai_prices_pricer, ledger

genai_prices = pytest.importorskip("genai_prices")

USAGE = {"input": 1000, "output": 50, "cacheRead": 600, "cacheWrite": 100, "reasoning": 10}


async def two_turns(log: Any = None) -> kerman.AgentLoop:
    async def model(request: Any) -> Any:
        return kerman.ModelReply([{"type": "text", "text": "hi"}], usage=USAGE)

    loop = kerman.AgentLoop(model, log=log)
    loop.followup("a")
    loop.followup("b")
    await loop.when_idle()
    return loop


def direct(model: str, provider: str) -> Decimal:
    # genai-prices counts the cached tokens inside input_tokens, as the vendors' prompt counts do
    usage = genai_prices.Usage(input_tokens=1000, cache_read_tokens=600, cache_write_tokens=100, output_tokens=50)
    return Decimal(genai_prices.calc_price(usage, model, provider_id=provider).total_price)


@pytest.mark.parametrize("model,provider", [("gpt-4o", "openai"), ("claude-sonnet-4-5", "anthropic"), ("gemini-2.5-flash", "google")])
def test_the_default_pricer_agrees_with_genai_prices(model, provider):
    async def main() -> None:
        loop = await two_turns()
        book = ledger(loop.log, model=model, provider=provider)  # the default pricer
        expected = direct(model, provider)
        assert expected > 0
        assert [r.cost for r in book.requests] == [expected, expected]
        assert book.session.cost == 2 * expected and book.turn(2).cost == expected
        assert ledger(loop.log, pricer=genai_prices_pricer(), model=model, provider=provider).session == book.session
        await loop.aclose()

    asyncio.run(main())


def test_an_unknown_model_or_none_at_all_has_no_price():
    async def main() -> None:
        loop = await two_turns()
        for book in (ledger(loop.log, model="no-such-model-anywhere"), ledger(loop.log)):
            assert [r.cost for r in book.requests] == [None, None]
            assert book.session.cost is None and book.session.unpriced == 2 and book.session.known_cost == 0
        await loop.aclose()

    asyncio.run(main())


def test_kerman_log_usage_prints_a_table_json_and_every_session(tmp_path, capsys):
    async def main() -> None:
        store = kerman.FileStore(str(tmp_path))
        for sid in ("s1", "s2"):
            with store.create(sid) as log:
                loop = await two_turns(log)
                await loop.aclose()

    asyncio.run(main())
    expected = direct("gpt-4o", "openai")
    assert cli.main(["log", "usage", str(tmp_path), "s1", "--model", "gpt-4o", "--provider", "openai"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["turn", "requests", "failed"]
    assert lines[1].split()[:6] == ["1", "1", "0", "300", "600", "100"]
    assert lines[-1].split()[0] == "session" and lines[-1].split()[-1] == f"${2 * expected:.4f}"
    assert cli.main(["log", "usage", str(tmp_path), "s1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["id"] == "s1" and data["session"]["requests"] == 2 and data["session"]["costUsd"] is None
    assert [r["outcome"] for r in data["requests"]] == ["completed", "completed"]
    assert cli.main(["log", "usage", str(tmp_path), "--json", "--model", "gpt-4o"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["id"], r["input"], Decimal(r["costUsd"])) for r in rows] == [("s1", 600, 2 * expected), ("s2", 600, 2 * expected)]
    assert cli.main(["log", "usage", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1].split()[:2] == ["total", "4"]
