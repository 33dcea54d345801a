"""benches/python/views.py runs and reports every reader (its figures are a benchmark, not a
test: docs/performance.md, "Reading views")."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "benches" / "python" / "views.py"


def test_views_bench_runs_every_reader() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--turns", "3", "--rounds", "1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].endswith(" events (3 turns), 1 rounds; ns per event"), lines
    assert [line.split("  ")[0] for line in lines[2:]] == [
        "log.events(view=True)",
        "view(e) for e in log.events()",
        "events.views(log.events())",
        "log.events() (Events, no view)",
    ]
