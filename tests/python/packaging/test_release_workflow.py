"""The release workflow as GitHub reads it (parsed YAML, not text): every platform of issue 15
builds, none may fail without stopping the release, and each native wheel is tested where it
was built. (Which Pythons it builds is test_packaging_metadata.py's.)"""

from __future__ import annotations

from typing import Any

import yaml
from packaging_helpers import ROOT

WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"


def workflow() -> dict[str, Any]:
    loaded = yaml.safe_load(WORKFLOW.read_text())
    assert isinstance(loaded, dict), f"{WORKFLOW} is not a YAML mapping"
    return loaded


def steps_running(job: dict[str, Any], needle: str) -> list[dict[str, Any]]:
    return [step for step in job["steps"] if needle in str(step.get("run", ""))]


def test_no_job_may_fail_without_failing_the_release() -> None:
    jobs = workflow()["jobs"]
    lenient = {name: job["continue-on-error"] for name, job in jobs.items() if "continue-on-error" in job}
    assert not lenient, f"jobs allowed to fail: {lenient}"
    assert set(jobs["publish"]["needs"]) == {"linux", "native", "sdist"}


def test_windows_x64_builds_the_msvc_target_and_tests_its_wheel() -> None:
    native = workflow()["jobs"]["native"]
    windows = [os for os in native["strategy"]["matrix"]["os"] if os["name"].startswith("windows")]
    assert [(os["runner"].startswith("windows-"), os["target"]) for os in windows] == [(True, "x64")], windows
    build = next(step for step in native["steps"] if str(step.get("uses", "")).startswith("PyO3/maturin-action"))
    # x64 on a Windows runner is maturin-action's x86_64-pc-windows-msvc; no other toolchain
    # (such as MinGW's -gnu) is asked for.
    assert build["with"]["target"] == "${{ matrix.os.target }}"
    assert "gnu" not in str(build["with"].get("args", "")), build["with"]
    (test,) = steps_running(native, "packaging_helpers.py")
    assert test.get("shell") == "bash" and "if" not in test, test
    assert ".venv-test/Scripts" in test["run"], "the Windows venv keeps its executables in Scripts/"
