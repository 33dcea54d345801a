"""The sdist `make wheels` built holds what a build needs (and no build output), and `pip
install` of it builds a Kerman that passes the public-API tests. Slow profile (`make
test-wheels`, which sets ``KERMAN_WHEEL_DIR``); skipped without it. The build needs Rust, as
it would for a user on a platform without a wheel."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest
from packaging_helpers import (
    WHEEL_DIR,
    current_python,
    installed_core,
    make_venv,
    run,
    run_public_api_tests,
    without_rust,
)

needs_sdist = pytest.mark.skipif(not WHEEL_DIR, reason="KERMAN_WHEEL_DIR is unset (make test-wheels builds and tests the sdist)")
NEEDED = [
    "pyproject.toml",
    "Cargo.toml",
    "Cargo.lock",
    "README.md",
    "src/lib.rs",
    "src/python/mod.rs",
    "python/kerman/__init__.py",
    "python/kerman/_core.pyi",
    "python/kerman/py.typed",
    "python/kerman/cli/__init__.py",
]


def the_sdist() -> Path:
    found = sorted(Path(WHEEL_DIR).glob("kerman-*.tar.gz"))
    assert len(found) == 1, f"expected one sdist in {WHEEL_DIR}, found {[p.name for p in found]}"
    return found[0]


@needs_sdist
def test_sdist_holds_the_sources_and_no_build_output() -> None:
    sdist = the_sdist()
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
    top = sdist.name[: -len(".tar.gz")]
    assert all(n == top or n.startswith(top + "/") for n in names), "entries outside one top folder"
    inside = {n[len(top) + 1 :] for n in names}
    missing = [n for n in NEEDED if n not in inside]
    assert not missing, f"{sdist.name} lacks {missing}"
    built = [n for n in inside if n.startswith(("target/", "dist/")) or n.endswith((".so", ".pyc")) or "__pycache__" in n]
    assert not built, f"{sdist.name} holds build output: {built[:10]}"


@needs_sdist
@pytest.mark.timeout(1800)  # a release build of the crate, then the tests
def test_sdist_builds_installs_and_passes(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    # Rust is needed here; the tests afterwards run without it like the wheels' do.
    env = dict(os.environ, PATH=f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("VIRTUAL_ENV", None)
    exe = make_venv(current_python(), venv, env)
    # The sdist's own build-system (maturin from the registry, in an isolated build env); the
    # cargo target directory of `make` is kept, so dependencies compiled before are reused.
    run(
        [str(exe), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-binary", "kerman", str(the_sdist())],
        env,
        timeout=1800,
    )
    clean = without_rust(venv)
    core = installed_core(exe, clean)
    assert venv in core.parents, f"kerman._core was imported from {core}, not from the venv"
    run_public_api_tests(exe, clean)
