"""Each wheel `make wheels` built, installed into a fresh venv of its own Python with no Rust
toolchain reachable, passes the public-API tests; one wheel covers every CPython on this
machine. Slow profile: `make test-wheels` (also run by `make test-slow`) sets
``KERMAN_WHEEL_DIR``; without it these tests skip."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from packaging_helpers import (
    ROOT,
    WHEEL_DIR,
    find_pythons,
    installed_core,
    make_venv,
    python_for,
    run,
    run_public_api_tests,
    wheel_minor,
    without_rust,
)

needs_wheels = pytest.mark.skipif(not WHEEL_DIR, reason="KERMAN_WHEEL_DIR is unset (make test-wheels builds and tests the wheels)")
WHEELS = sorted(Path(WHEEL_DIR).glob("kerman-*.whl")) if WHEEL_DIR else []


@needs_wheels
def test_a_wheel_for_every_python_here() -> None:
    pythons = find_pythons()
    assert pythons, "scripts/find-pythons.py found no CPython 3.10-3.14"
    tags = [wheel_minor(w) for w in WHEELS]
    missing = [v for v in pythons if not any(m == int(v.split(".")[1]) or (abi3 and m <= int(v.split(".")[1])) for m, abi3 in tags)]
    assert not missing, f"no wheel in {WHEEL_DIR} for CPython {', '.join(missing)} (wheels: {[w.name for w in WHEELS]})"


@needs_wheels
@pytest.mark.timeout(900)  # a venv, two installs and about 1,300 tests
@pytest.mark.parametrize("wheel", WHEELS, ids=[w.name.split("-")[2] for w in WHEELS])
def test_wheel_installs_and_passes_without_rust(wheel: Path, tmp_path: Path) -> None:
    minor, abi3 = wheel_minor(wheel)
    python = python_for(minor) or (sys.executable if sys.version_info[1] == minor else None)
    assert python, f"no CPython 3.{minor} here for {wheel.name}"
    venv = tmp_path / "venv"
    env = without_rust(venv)
    for tool in ("cargo", "rustc"):
        assert shutil.which(tool, path=env["PATH"]) is None, f"{tool} is still reachable on {env['PATH']}"
    exe = make_venv(python, venv, env)
    # --no-index: pip may use nothing but this file, so a source build cannot stand in for it.
    run([str(exe), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-index", "--no-deps", str(wheel)], env)
    core = installed_core(exe, env)
    assert venv in core.parents, f"kerman._core was imported from {core}, not from the venv"
    assert (".abi3." if abi3 else f".cpython-3{minor}-") in core.name, core.name
    # The console script of the wheel's metadata, reporting the wheel's version.
    version = run([str(venv / "bin" / "kerman"), "--version"], env).stdout
    assert version.startswith(f"kerman {wheel.name.split('-')[1]} ("), version
    run_public_api_tests(exe, env)


def test_without_rust_hides_the_toolchain(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # A folder holding a cargo, as ~/.cargo/bin does, and variables that would point a build at one.
    fake = tmp_path / "cargo-bin"
    fake.mkdir()
    (fake / "cargo").write_text("#!/bin/sh\nexit 0\n")
    (fake / "cargo").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ.get('PATH', '')}")
    monkeypatch.setenv("CARGO_HOME", str(tmp_path))
    monkeypatch.setenv("RUSTUP_TOOLCHAIN", "stable")
    assert shutil.which("cargo") is not None
    env = without_rust(tmp_path / "venv")
    assert shutil.which("cargo", path=env["PATH"]) is None
    assert str(fake) not in env["PATH"].split(os.pathsep)
    assert env["PATH"].split(os.pathsep)[0] == str(tmp_path / "venv" / "bin")
    assert "CARGO_HOME" not in env and "RUSTUP_TOOLCHAIN" not in env


def test_find_pythons_asks_each_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    # Not a Python, and this one: only this one is found, under the version it reports.
    monkeypatch.setenv("KERMAN_PYTHONS", f"/bin/true {sys.executable}")
    found = find_pythons()
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        assert found == {}
    else:
        assert found == {f"3.{sys.version_info[1]}": sys.executable}


@needs_wheels
def test_check_wheels_refuses_a_tag_older_than_auditwheel_allows(tmp_path: Path) -> None:
    auditwheel = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "wheel-tools" / "bin" / "auditwheel"
    assert auditwheel.exists(), f"{auditwheel} missing (make wheels installs it)"
    wheel = WHEELS[0]
    # The same file claiming glibc 2.5 (manylinux1), which its glibc 2.17 symbols rule out.
    parts = wheel.name.split("-")
    claimed = tmp_path / "-".join(parts[:4] + ["manylinux_2_5_x86_64.manylinux1_x86_64.whl"])
    shutil.copy(wheel, claimed)
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "check-wheels.py"), str(tmp_path), str(auditwheel)], capture_output=True, text=True
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{claimed.name}: claims manylinux_2_5_x86_64.manylinux1_x86_64 but auditwheel needs manylinux_2_17_x86_64" in done.stderr
