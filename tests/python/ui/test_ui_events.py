"""What the iterators yield: ``UiEvent`` values as the dataclass's own constructor makes them
(equal, frozen, copyable, picklable), one per protocol event, numbered within their log event."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
from ui_helpers import recorded

from kerman.ui import UiEvent, agui, vercel


@pytest.mark.parametrize("project", [lambda events: agui(events, thread_id="t"), vercel], ids=["agui", "vercel"])
def test_iterators_yield_plain_ui_events(project, tmp_path):
    got = list(project(recorded("tools", tmp_path)))
    assert got
    for u in got:
        assert type(u) is UiEvent
        made = UiEvent(u.seq, u.index, u.last, u.data)
        assert u == made and repr(u) == repr(made) and vars(u) == vars(made)
        assert pickle.loads(pickle.dumps(u)) == made and dataclasses.asdict(u) == dataclasses.asdict(made)
        assert dataclasses.replace(u, index=u.index + 1).index == u.index + 1
        with pytest.raises(dataclasses.FrozenInstanceError):
            u.seq = 0  # type: ignore[misc]
    # numbered within each log event: 0, 1, ... with the last one flagged, and ids to resume after
    by_seq: dict[int, list[UiEvent]] = {}
    for u in got:
        by_seq.setdefault(u.seq, []).append(u)
    for seq, outs in by_seq.items():
        assert [u.index for u in outs] == list(range(len(outs)))
        assert [u.last for u in outs] == [False] * (len(outs) - 1) + [True]
        assert outs[-1].id == str(seq) and all(u.id == f"{seq}:{u.index}" for u in outs[:-1])
