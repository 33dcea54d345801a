"""Custom events (types Kerman does not write) in the UI streams: AG-UI ``CUSTOM`` and Vercel
``data-*`` by default, the ``custom=`` mapping hook renaming, transforming and dropping them.

The recorded ``custom`` log (record_logs.py) holds a plugin's ``progress/update`` appended while
text streams and from a tool, and an application's ``goal/change`` between turns; its goldens
are pinned by test_projections.py with the others.
"""

from __future__ import annotations

import asyncio

import pytest
from ui_helpers import check_agui_event, check_vercel_part, recorded

import kerman
from kerman.events import OtherEvent
from kerman.ui import AgUiProjection, Custom, VercelProjection, agui, default_custom, vercel

CUSTOM_TYPES = ("progress/update", "goal/change")


def _logged(events):
    return [(e.type, e.data) for e in events if e.type in CUSTOM_TYPES]


def test_the_recorded_log_holds_custom_events(tmp_path):
    events = recorded("custom", tmp_path)
    assert [t for t, _ in _logged(events)] == ["progress/update", "progress/update", "goal/change"]


def test_agui_shows_each_custom_event_as_custom_named_by_its_type(tmp_path):
    events = recorded("custom", tmp_path)
    outs = [u for u in agui(events) if u.data["type"] == "CUSTOM" and not u.data["name"].startswith("kerman.")]
    assert [(u.data["name"], u.data["value"]) for u in outs] == _logged(events)
    by_seq = {e.seq: e for e in events}
    for u in outs:
        assert by_seq[u.seq].type == u.data["name"]
        assert u.data["timestamp"] == by_seq[u.seq].time
        check_agui_event(u.data)


def test_vercel_shows_each_custom_event_as_a_data_part(tmp_path):
    events = recorded("custom", tmp_path)
    kerman_parts = {"data-queue", "data-prompt", "data-steering", "data-context", "data-decision"}
    outs = [u for u in vercel(events) if u.data["type"].startswith("data-") and u.data["type"] not in kerman_parts]
    assert [(u.data["type"], u.data["data"]) for u in outs] == [(f"data-{t}", d) for t, d in _logged(events)]
    for u in outs:
        assert set(u.data) == {"type", "data"}  # appended parts: no id, not transient
        check_vercel_part(u.data)


@pytest.mark.parametrize("protocol", ["agui", "vercel"])
def test_a_custom_event_leaves_the_open_text_part_open(protocol, tmp_path):
    events = recorded("custom", tmp_path)
    outs = [u.data for u in (agui(events) if protocol == "agui" else vercel(events))]
    kinds = [d["type"] for d in outs]
    custom = next(i for i, d in enumerate(outs) if d.get("name") == "progress/update" or d["type"] == "data-progress/update")
    content, end = ("TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END") if protocol == "agui" else ("text-delta", "text-end")
    assert kinds[custom - 1] == content and kinds[custom + 1] == content  # "Checking " | event | "the index."
    assert outs[custom - 1]["delta"] == "Checking " and outs[custom + 1]["delta"] == "the index."
    assert end not in kinds[custom - 1 : custom + 2]


def _progress_only(view: OtherEvent):
    if view.type != "progress/update":
        return None  # dropped
    return Custom("progress", {"percent": view.data["percent"]}, id="progress", transient=view.data["percent"] < 100)


def test_the_mapping_renames_transforms_and_drops(tmp_path):
    events = recorded("custom", tmp_path)
    got = [u.data for u in agui(events, custom=_progress_only) if u.data["type"] == "CUSTOM" and not u.data["name"].startswith("kerman.")]
    assert [(d["name"], d["value"]) for d in got] == [("progress", {"percent": 40}), ("progress", {"percent": 100})]
    for d in got:
        check_agui_event(d)
    parts = [u.data for u in vercel(events, custom=_progress_only) if u.data["type"] == "data-progress"]
    assert parts == [
        {"type": "data-progress", "id": "progress", "data": {"percent": 40}, "transient": True},
        {"type": "data-progress", "id": "progress", "data": {"percent": 100}},
    ]
    assert not [u for u in vercel(events, custom=_progress_only) if u.data["type"] == "data-goal/change"]


@pytest.mark.parametrize("protocol", ["agui", "vercel"])
def test_dropping_every_custom_event_gives_the_stream_without_them(protocol, tmp_path):
    events = recorded("custom", tmp_path)
    project = agui if protocol == "agui" else vercel
    without = [e for e in events if e.type not in CUSTOM_TYPES]
    assert [u.data for u in project(events, custom=lambda view: None)] == [u.data for u in project(without)]


@pytest.mark.parametrize("protocol", ["agui", "vercel"])
def test_the_default_mapping_given_explicitly_changes_nothing(protocol, tmp_path):
    events = recorded("custom", tmp_path)
    project = agui if protocol == "agui" else vercel
    assert list(project(events, custom=default_custom)) == list(project(events))


@pytest.mark.parametrize("make", [lambda hook: AgUiProjection("t", custom=hook), lambda hook: VercelProjection(custom=hook)])
def test_a_mapping_returning_something_else_is_a_type_error_naming_it(make, tmp_path):
    events = recorded("custom", tmp_path)

    def as_dict(view):
        return {"name": view.type}

    projection = make(as_dict)
    with pytest.raises(
        TypeError, match=r"custom event mapping .*as_dict returned \{'name': 'progress/update'\} for 'progress/update' \(seq \d+\)"
    ):
        for event in events:
            projection.feed(event)


def test_custom_rejects_a_bad_name_and_id():
    with pytest.raises(ValueError, match="non-empty name"):
        Custom("")
    with pytest.raises(TypeError, match="id is a str or None, got 3"):
        Custom("x", id=3)  # type: ignore[arg-type]
    assert repr(Custom("p", 1)) == "Custom(name='p', value=1, id=None, transient=False)"


def test_kerman_types_the_streams_do_not_show_stay_hidden():
    # log/damaged is Kerman's (written by repair): it is not a custom event
    event = {"type": "log/damaged", "seq": 0, "time": 1, "data": {"lost": []}}
    assert AgUiProjection().feed(event) == []
    assert VercelProjection().feed(event) == []


def test_a_plugin_event_reaches_a_live_agui_stream():
    """A plugin appends its event while the loop runs; a tail() follower sees it as CUSTOM."""

    async def main():
        loop = kerman.AgentLoop(kerman.models.EchoModel())

        def install(loop: kerman.AgentLoop) -> None:
            async def announce(step: kerman.PreStep, next: kerman.Next[kerman.Decision]) -> kerman.Decision:
                step.loop.log.append("audit/step", {"turn": step.turn, "step": step.step})
                return await next()

            loop.pre_step(announce)

        install(loop)
        seen = []

        async def follow():
            async for u in agui(loop.log.tail()):
                seen.append(u.data)

        follower = asyncio.create_task(follow())
        loop.followup("hello")
        await loop.when_idle()
        await loop.aclose()
        await follower
        return seen

    seen = asyncio.run(main())
    custom = [d for d in seen if d["type"] == "CUSTOM" and d["name"] == "audit/step"]
    assert [d["value"] for d in custom] == [{"turn": 1, "step": 1}]
    check_agui_event(custom[0])
