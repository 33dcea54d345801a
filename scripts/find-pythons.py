#!/usr/bin/env python3
"""The CPython interpreters on this machine that Kerman ships wheels for: one per minor version
from 3.10 to 3.14, GIL builds only (a free-threaded build needs a wheel of its own).

    python3 scripts/find-pythons.py            # "3.11 /root/.pyenv/versions/3.11.7/bin/python3" lines
    python3 scripts/find-pythons.py --paths    # the executables alone, one a line

``KERMAN_PYTHONS`` (executables separated by spaces) replaces the search. Otherwise the
candidates are pyenv's builds (``$PYENV_ROOT/versions/3.1x.y``, the newest patch release of
each minor) and ``python3.1x`` on ``PATH``; each is asked for its own version, so a shim or a
link naming one version but running another is placed by what it runs. Used by
``scripts/build-wheels.sh`` (``make wheels``) and ``tests/python/packaging/``.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
from typing import Dict, List, Optional, Tuple

MINORS = range(10, 15)
_PROBE = "import sys, sysconfig; print(sys.implementation.name, *sys.version_info[:2], sysconfig.get_config_var('Py_GIL_DISABLED') or 0)"


def probe(executable: str) -> Optional[Tuple[int, int]]:
    """``(major, minor)`` if ``executable`` runs a GIL build of CPython, else ``None``."""
    try:
        out = subprocess.run([executable, "-c", _PROBE], capture_output=True, text=True, timeout=30, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    if len(out) != 4 or out[0] != "cpython" or out[3] != "0":
        return None
    return int(out[1]), int(out[2])


def _patch_key(path: str) -> Tuple[int, ...]:
    version = os.path.basename(os.path.dirname(os.path.dirname(path)))
    return tuple(int(n) for n in re.findall(r"\d+", version))


def candidates() -> List[str]:
    override = os.environ.get("KERMAN_PYTHONS", "").split()
    if override:
        return override
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    found: List[str] = []
    for minor in MINORS:
        # Release builds only (3.12.1, not 3.12-dev or 3.13.0t): newest patch first.
        builds = [
            p
            for p in glob.glob(os.path.join(root, "versions", f"3.{minor}.*", "bin", "python3"))
            if re.fullmatch(rf"3\.{minor}\.\d+", os.path.basename(os.path.dirname(os.path.dirname(p))))
        ]
        found.extend(sorted(builds, key=_patch_key, reverse=True))
        on_path = shutil.which(f"python3.{minor}")
        if on_path:
            found.append(on_path)
    return found


def find() -> Dict[str, str]:
    """``{"3.11": executable, ...}``, in version order; the first candidate of a version wins."""
    pythons: Dict[str, str] = {}
    for executable in candidates():
        version = probe(executable)
        if version is None or version[0] != 3 or version[1] not in MINORS:
            continue
        pythons.setdefault(f"{version[0]}.{version[1]}", executable)
    return dict(sorted(pythons.items(), key=lambda kv: int(kv[0].split(".")[1])))


def main(argv: List[str]) -> int:
    pythons = find()
    if not pythons:
        print("find-pythons: no CPython 3.10-3.14 found (set KERMAN_PYTHONS to their executables)", file=sys.stderr)
        return 1
    for version, executable in pythons.items():
        print(executable if "--paths" in argv else f"{version} {executable}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
