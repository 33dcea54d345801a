"""Helpers of the packaging tests: fresh venvs, an environment without Rust, and the public-API
tests a built wheel or sdist is checked with."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[3]

#: The quick suite's tests of the public API, run against each installed wheel and the sdist:
#: every test of these needs only pytest (and pytest-timeout, for the suite's `timeout` setting).
PUBLIC_API_TESTS = [
    "tests/python/message",
    "tests/python/log",
    "tests/python/inbox",
    "tests/python/loop",
    "tests/python/tools",
    "tests/python/store/test_stores.py",
    "tests/python/store/test_store_contract.py",
    "tests/python/cli/test_cli.py",
]
TEST_REQUIREMENTS = ["pytest>=8", "pytest-timeout>=2"]

#: Set by `make test-wheels` to the folder `make wheels` filled.
WHEEL_DIR = os.environ.get("KERMAN_WHEEL_DIR", "")
WHEEL_NAME = re.compile(r"^kerman-[^-]+-cp3(?P<minor>\d+)-(?P<abi>[^-]+)-[^-]+\.whl$")

# Variables that could point a build at a Rust toolchain (or at another Python's packages).
_DROPPED = ("CARGO", "RUSTUP", "RUSTC", "RUSTFLAGS", "RUSTDOC", "PYO3_", "MATURIN", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTEST_")
_RUST_TOOLS = ("cargo", "rustc", "rustup")


def find_pythons() -> Dict[str, str]:
    """``{"3.11": executable}``: scripts/find-pythons.py, the search `make wheels` used."""
    spec = importlib.util.spec_from_file_location("find_pythons", ROOT / "scripts" / "find-pythons.py")
    assert spec is not None and spec.loader is not None
    module: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.find()  # type: ignore[no-any-return]


def wheel_minor(wheel: Path) -> tuple[int, bool]:
    """(the CPython minor version of a wheel's tag, whether it is abi3)."""
    m = WHEEL_NAME.match(wheel.name)
    assert m, f"not a CPython kerman wheel: {wheel.name}"
    return int(m.group("minor")), m.group("abi") == "abi3"


def without_rust(venv: Optional[Path] = None) -> Dict[str, str]:
    """This process's environment with no Rust toolchain reachable: every PATH folder holding
    cargo, rustc or rustup dropped (~/.cargo/bin), no variable naming one; the venv's bin first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROPPED)}
    folders = [
        d
        for d in os.environ.get("PATH", "").split(os.pathsep)
        if d and not any(os.path.exists(os.path.join(d, tool)) for tool in _RUST_TOOLS)
    ]
    if venv is not None:
        folders.insert(0, str(venv / "bin"))
    env["PATH"] = os.pathsep.join(folders)
    return env


def run(argv: List[str], env: Dict[str, str], cwd: Path = ROOT, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """Runs ``argv``; a non-zero exit fails the test with the command's output."""
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout[-6000:]}\n{done.stderr[-6000:]}"
    return done


def make_venv(python: str, path: Path, env: Dict[str, str]) -> Path:
    """A fresh venv of ``python`` at ``path`` holding the test requirements; its interpreter."""
    run([python, "-m", "venv", str(path)], env)
    exe = path / "bin" / "python"
    run([str(exe), "-m", "pip", "install", "-q", "--disable-pip-version-check", *TEST_REQUIREMENTS], env)
    return exe


def installed_core(exe: Path, env: Dict[str, str]) -> Path:
    """The ``kerman._core`` extension that ``exe`` imports, asked from the repository root (so
    a ``kerman`` folder there would be found first, were there one)."""
    done = run([str(exe), "-c", "import kerman._core as c; print(c.__file__)"], env)
    return Path(done.stdout.strip())


def run_public_api_tests(exe: Path, env: Dict[str, str]) -> str:
    """The public-API tests under ``exe``; fails unless they pass. Returns pytest's summary."""
    done = run([str(exe), "-m", "pytest", "-q", "-p", "no:cacheprovider", *PUBLIC_API_TESTS], env)
    summary = done.stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) > 0 and "error" not in summary and "failed" not in summary, summary
    return summary


def python_for(minor: int) -> Optional[str]:
    return find_pythons().get(f"3.{minor}")


def current_python() -> str:
    """An interpreter of this Python's version that is not inside a venv."""
    found = python_for(sys.version_info[1])
    return found or getattr(sys, "_base_executable", sys.executable)


if __name__ == "__main__":
    # The release workflow runs these same tests: `pytest $(python packaging_helpers.py)`.
    print(" ".join(PUBLIC_API_TESTS))
