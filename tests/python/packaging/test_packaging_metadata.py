"""What pip and the package index show of the installed Kerman: a classifier for each CPython
the release workflow builds a wheel for (and no other), project URLs, the changelog's entry
for this version, and ``kerman --version`` (the console script the metadata declares)."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from packaging_helpers import PUBLIC_API_TESTS, ROOT

import kerman

WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
PYTHON_CLASSIFIER = re.compile(r"^Programming Language :: Python :: 3\.(\d+)$")


def metadata() -> importlib.metadata.PackageMetadata:
    return importlib.metadata.metadata("kerman")


def classified_minors() -> list[int]:
    return sorted(int(m.group(1)) for c in metadata().get_all("Classifier") or [] if (m := PYTHON_CLASSIFIER.match(c)))


def test_version_is_the_distributions() -> None:
    assert kerman.__version__ == importlib.metadata.version("kerman")
    assert re.fullmatch(r"\d+\.\d+\.\d+([ab]|rc)?\d*", kerman.__version__), kerman.__version__


def test_a_classifier_for_each_python_from_requires_python_on() -> None:
    requires = metadata()["Requires-Python"]
    m = re.fullmatch(r">=\s*3\.(\d+)", requires or "")
    assert m, f"Requires-Python {requires!r} is not a plain lower bound"
    minors = classified_minors()
    assert minors, "no 'Programming Language :: Python :: 3.x' classifier"
    # Contiguous from the lower bound: every version in between is claimed, none below it.
    assert minors == list(range(int(m.group(1)), minors[-1] + 1)), minors
    assert f"3.{sys.version_info[1]}" in {f"3.{n}" for n in minors}, "the Python running the tests is not classified"


def test_release_workflow_builds_each_classified_python() -> None:
    text = WORKFLOW.read_text()
    wanted = {f"3.{n}" for n in classified_minors()}
    linux = re.search(r"^\s*LINUX_INTERPRETERS:\s*(.+)$", text, re.M)
    assert linux, "release.yml has no LINUX_INTERPRETERS"
    assert set(re.findall(r"python(3\.\d+)", linux.group(1))) == wanted, linux.group(1)
    native = re.search(r"^\s*python:\s*\[(.+)\]\s*$", text, re.M)
    assert native, "release.yml's native matrix has no python list"
    assert set(re.findall(r"3\.\d+", native.group(1))) == wanted, native.group(1)
    # Every version list the tests and checks of the workflow spell out.
    for listed in re.findall(r"((?:3\.1\d\s+){2,}3\.1\d)", text):
        assert set(listed.split()) == wanted, f"release.yml lists {listed!r}, classifiers say {sorted(wanted)}"


def test_release_workflow_tests_the_public_api_tests() -> None:
    text = WORKFLOW.read_text()
    assert text.count("tests/python/packaging/packaging_helpers.py") >= 3
    for path in PUBLIC_API_TESTS:
        assert (ROOT / path).exists(), f"{path} (a public-API test) does not exist"


def test_project_urls() -> None:
    urls = dict(entry.split(", ", 1) for entry in metadata().get_all("Project-URL") or [])
    assert set(urls) >= {"Homepage", "Documentation", "Repository", "Issues", "Changelog"}, urls
    for name, url in urls.items():
        assert url.startswith("https://"), (name, url)
    assert urls["Changelog"].endswith("/CHANGELOG.md")


def test_changelog_has_this_version() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(rf"^## \[?{re.escape(kerman.__version__)}\]?( |$)", text, re.M), (
        f"CHANGELOG.md has no '## {kerman.__version__}' section"
    )


def test_console_script_prints_the_version() -> None:
    script = Path(sysconfig.get_path("scripts")) / "kerman"
    if not script.exists():
        pytest.skip(f"no kerman script at {script} (kerman not installed into this interpreter's prefix)")
    done = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"kerman {kerman.__version__} (session log format {kerman.FORMAT_VERSION})\n"
    assert done.stderr == ""
