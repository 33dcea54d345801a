"""kerman.timeline: plugin event types summarized on their timeline line (kerman log show)
instead of compact JSON: a registered function, the integrations' own types registered without
their frameworks, odd payloads and raising functions falling back to JSON, bad registrations
named."""

from __future__ import annotations

import pytest

import kerman
from kerman import timeline
from kerman.cli._timeline import format_event, summarize


def _log_with(*events: tuple[str, dict]) -> kerman.SessionLog:
    log = kerman.MemoryStore().create("s")
    for kind, data in events:
        log.append(kind, data)
    return log


def test_a_registered_plugin_type_gets_its_summary_and_others_stay_json():
    timeline.register("myframework/handoff", lambda d: f"{d['from']} → {d['to']}")
    log = _log_with(("myframework/handoff", {"from": "triage", "to": "billing"}), ("myframework/trace", {"span": "s1"}))
    handoff, trace = list(log.events())
    assert summarize(handoff) == "triage → billing"
    assert format_event(handoff).endswith("myframework/handoff  triage → billing")
    assert summarize(trace) == '{"span":"s1"}'


def test_a_summary_that_raises_or_returns_no_str_shows_the_payload_and_control_characters_are_escaped():
    timeline.register("myframework/broken", lambda d: d["missing"])
    timeline.register("myframework/number", lambda d: 42)  # type: ignore[arg-type,return-value]
    timeline.register("myframework/bell", lambda d: "ring\x07")
    log = _log_with(("myframework/broken", {"a": 1}), ("myframework/number", {"b": 2}), ("myframework/bell", {}))
    broken, number, bell = list(log.events())
    assert summarize(broken) == '{"a":1}'
    assert summarize(number) == '{"b":2}'
    assert summarize(bell) == "ring\\x07"


BOOK = "a__function_toolset__<agent>.call_tool:book"


def test_the_integrations_types_are_registered_without_their_frameworks():
    log = _log_with(
        ("openai-agents/items", {"session": "chat-1", "items": [{"role": "user", "content": "hi"}, {"type": "function_call"}]}),
        ("openai-agents/popped", {"session": "chat-1", "index": 1}),
        ("openai-agents/cleared", {"session": "chat-1", "count": 1}),
        ("pydantic-ai/raised", {"unit": BOOK, "n": 0, "run": 2, "error": "RuntimeError('down')"}),
        ("pydantic-ai/unit", {"unit": BOOK, "n": 1, "run": 2, "result": {"message": "outcome unknown", "kind": "tool_failed"}}),
    )
    lines = [summarize(e) for e in log.events()]
    assert lines == [
        'session "chat-1" +2: user, function_call',
        'session "chat-1" popped item 1',
        'session "chat-1" cleared 1 items',
        "run 2 tool book #0 raised \"RuntimeError('down')\"",
        'run 2 tool book #1 tool failed: "outcome unknown"',
    ]


def test_bad_registrations_are_named():
    with pytest.raises(ValueError, match="namespaced event type .* not 'handoff'"):
        timeline.register("handoff", str)
    with pytest.raises(ValueError, match="'turn/end' is one of Kerman's own event types"):
        timeline.register("turn/end", str)
    with pytest.raises(TypeError, match="summarize must be a function of the payload, not 'x'"):
        timeline.register("myframework/x", "x")  # type: ignore[arg-type]


def test_summarizer_looks_a_plugin_type_up_and_core_types_keep_their_own():
    (cleared,) = list(_log_with(("openai-agents/cleared", {"session": "c", "count": 3})).events())
    assert timeline.summarizer(cleared.type)(cleared.data) == summarize(cleared) == 'session "c" cleared 3 items'
    turn = {"seq": 0, "time": 0, "type": "turn/start", "data": {"turn": 1}}  # a core type, as stored
    assert timeline.summarizer("turn/start") is None and summarize(turn) == "turn 1"


def test_entry_points_register_their_types_and_a_broken_one_is_skipped_with_a_warning(monkeypatch):
    from importlib import metadata

    good = metadata.EntryPoint("good", "json:loads", "kerman.timeline")
    bad = metadata.EntryPoint("bad", "json:dumps", "kerman.timeline")
    monkeypatch.setattr(good.__class__, "load", lambda self: {"epframework/x": lambda d: "x!"} if self.name == "good" else "nope")
    monkeypatch.setattr(metadata, "entry_points", lambda group: [good, bad] if group == "kerman.timeline" else [])
    with pytest.warns(UserWarning, match="entry point 'bad' .* skipped: it names 'nope', not a mapping"):
        timeline._load_entry_points()
    assert timeline.summarizer("epframework/x")({}) == "x!"
