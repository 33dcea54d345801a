#!/usr/bin/env python3
"""Checks what ``make wheels`` built: one manylinux wheel per expected CPython, each one that
``auditwheel`` finds consistent with the platform tag it claims, and the sdist.

    python3 scripts/check-wheels.py [--sdist] DIR AUDITWHEEL [3.10 3.11 ...]

``AUDITWHEEL`` is the ``auditwheel`` executable; the versions are the CPythons a wheel must
cover (a wheel tagged ``abi3`` covers every version from its own up); ``--sdist``: DIR must
hold the sdist too. Prints one line per wheel; exits 1 naming every problem.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import zipfile
from typing import List, Optional, Tuple

# name-version-pythontag-abitag-platformtag.whl (no build tag: maturin writes none)
WHEEL_NAME = re.compile(r"^kerman-(?P<version>[^-]+)-(?P<python>[^-]+)-(?P<abi>[^-]+)-(?P<platform>[^-]+)\.whl$")
MANYLINUX = re.compile(r"^manylinux_(\d+)_(\d+)_(\w+)$")
# Legacy aliases of the PEP 600 tags.
LEGACY = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


def glibc_of(tag: str) -> Optional[Tuple[int, int]]:
    """The glibc version a manylinux platform tag promises (``None`` for any other tag)."""
    m = MANYLINUX.match(tag)
    if m:
        return int(m.group(1)), int(m.group(2))
    for legacy, version in LEGACY.items():
        if tag.startswith(legacy + "_"):
            return version
    return None


def audited_tag(auditwheel: str, wheel: str) -> str:
    """The platform tag ``auditwheel show`` finds the wheel consistent with."""
    shown = subprocess.run([auditwheel, "show", wheel], capture_output=True, text=True)
    text = " ".join((shown.stdout + shown.stderr).split())
    m = re.search(r'consistent with the following platform tag: "([^"]+)"', text)
    if shown.returncode != 0 or not m:
        raise ValueError(f"auditwheel show failed (exit {shown.returncode}): {text[:400]}")
    return m.group(1)


def check_wheel(auditwheel: str, wheel: str) -> Tuple[List[str], List[str]]:
    """(problems, the CPython tags the wheel covers: ``cp311``, or ``cp310-abi3``)."""
    name = os.path.basename(wheel)
    m = WHEEL_NAME.match(name)
    if not m:
        return [f"{name}: not a kerman wheel name"], []
    problems = []
    claimed = m.group("platform").split(".")
    promised = [glibc_of(tag) for tag in claimed]
    if None in promised:
        problems.append(f"{name}: platform tag {m.group('platform')!r} is not manylinux")
    try:
        audited = audited_tag(auditwheel, wheel)
    except ValueError as e:
        return [f"{name}: {e}"], []
    needed = glibc_of(audited)
    if needed is None:
        problems.append(f"{name}: auditwheel finds it consistent only with {audited!r}")
    elif any(p is not None and p < needed for p in promised):
        problems.append(f"{name}: claims {m.group('platform')} but auditwheel needs {audited}")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    if not any(re.fullmatch(r"kerman/_core\..*so", n) for n in names):
        problems.append(f"{name}: no kerman/_core extension inside")
    for needed_file in ("kerman/__init__.py", "kerman/_core.pyi", "kerman/py.typed"):
        if needed_file not in names:
            problems.append(f"{name}: {needed_file} missing")
    print(f"{name}: auditwheel: consistent with {audited}")
    return problems, [m.group("python") + ("-abi3" if m.group("abi") == "abi3" else "")]


def covered(tags: List[str], version: str) -> bool:
    minor = int(version.split(".")[1])
    for tag in tags:
        m = re.fullmatch(r"cp3(\d+)(-abi3)?", tag)
        if m and (int(m.group(1)) == minor or (m.group(2) and int(m.group(1)) <= minor)):
            return True
    return False


def main(argv: List[str]) -> int:
    want_sdist = "--sdist" in argv
    argv = [a for a in argv if a != "--sdist"]
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    folder, auditwheel, versions = argv[0], argv[1], argv[2:]
    wheels = sorted(glob.glob(os.path.join(folder, "kerman-*.whl")))
    problems: List[str] = [] if wheels else [f"no wheel in {folder}"]
    tags: List[str] = []
    for wheel in wheels:
        found, covers = check_wheel(auditwheel, wheel)
        problems += found
        tags += covers
    problems += [f"no wheel for CPython {v} in {folder}" for v in versions if not covered(tags, v)]
    if want_sdist and not glob.glob(os.path.join(folder, "kerman-*.tar.gz")):
        problems.append(f"no sdist in {folder}")
    for problem in problems:
        print(f"check-wheels: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
